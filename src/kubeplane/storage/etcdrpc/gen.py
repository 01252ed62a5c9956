"""Regenerate the etcd v3 API modules from ``rpc.proto`` next to this file.

    python -m kubeplane.storage.etcdrpc.gen

Needs grpcio-tools (a development tool, not a dependency). The file is
registered as ``kubeplane/storage/etcdrpc/rpc.proto`` so that its name cannot
clash with another ``rpc.proto`` in the process's descriptor pool.
"""

from __future__ import annotations

import pathlib
import shutil
import tempfile

HERE = pathlib.Path(__file__).parent


def generate() -> None:
    from grpc_tools import protoc  # type: ignore[import-not-found]

    with tempfile.TemporaryDirectory() as tmp:
        rel = pathlib.Path("kubeplane/storage/etcdrpc/rpc.proto")
        (pathlib.Path(tmp) / rel).parent.mkdir(parents=True)
        shutil.copy(HERE / "rpc.proto", pathlib.Path(tmp) / rel)
        rc = protoc.main(["protoc", f"-I{tmp}", f"--python_out={tmp}", f"--grpc_python_out={tmp}",
                          str(pathlib.Path(tmp) / rel)])
        if rc != 0:
            raise SystemExit(f"protoc failed with exit code {rc}")
        for name in ("rpc_pb2.py", "rpc_pb2_grpc.py"):
            shutil.copy(pathlib.Path(tmp) / rel.parent / name, HERE / name)


if __name__ == "__main__":
    generate()
