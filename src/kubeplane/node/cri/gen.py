"""Regenerate the CRI v1 Python modules from upstream's api.proto.

    python -m kubeplane.node.cri.gen PATH/TO/cri-api/pkg/apis/runtime/v1/api.proto

Needs grpcio-tools (a development tool, not a dependency). The file is
registered as ``kubeplane/node/cri/api.proto`` so that its name cannot clash
with another ``api.proto`` in the process's descriptor pool.
"""

from __future__ import annotations

import pathlib
import shutil
import sys
import tempfile

HERE = pathlib.Path(__file__).parent


def generate(proto: pathlib.Path) -> None:
    from grpc_tools import protoc  # type: ignore[import-not-found]

    with tempfile.TemporaryDirectory() as tmp:
        rel = pathlib.Path("kubeplane/node/cri/api.proto")
        (pathlib.Path(tmp) / rel).parent.mkdir(parents=True)
        shutil.copy(proto, pathlib.Path(tmp) / rel)
        rc = protoc.main(["protoc", f"-I{tmp}", f"--python_out={tmp}", f"--grpc_python_out={tmp}",
                          str(pathlib.Path(tmp) / rel)])
        if rc != 0:
            raise SystemExit(f"protoc failed with exit code {rc}")
        for name in ("api_pb2.py", "api_pb2_grpc.py"):
            shutil.copy(pathlib.Path(tmp) / rel.parent / name, HERE / name)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    generate(pathlib.Path(sys.argv[1]))
