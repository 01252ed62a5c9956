"""Image archives: import them into the runtime, and build small ones.

A node imports every archive in its images directory at start and whenever
one appears there, as k3s does with its agent/images directory; ``kubeplane
images import`` does the same by hand. Both OCI image layout tars and
``docker save`` tars are accepted: containerd's importer reads either.

No registry may be needed to try a node, so :func:`build_busybox_image`
writes an OCI image layout tar whose one layer is a statically linked
busybox with a link per applet (``sh``, ``httpd``, ``nc``, ``tar``...);
:func:`build_pause_image` makes a sandbox ("pause") image from the same
binary. Builds are reproducible: the same busybox gives the same digests.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass, field

#: containerd's namespace for CRI-managed images and containers
CRI_NAMESPACE = "k8s.io"
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.zst", ".tzst")
BUSYBOX_PATHS = ("/usr/bin/busybox", "/bin/busybox")
DEFAULT_PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: a pause process: sleeps until SIGTERM/SIGINT, and reaps what it waits for
PAUSE_SCRIPT = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"


class ImageError(Exception):
    pass


def find_busybox() -> str:
    """The host's busybox binary; it must be statically linked to work in an image."""
    for p in BUSYBOX_PATHS:
        if os.path.isfile(p):
            return p
    found = shutil.which("busybox")
    if found:
        return found
    raise ImageError("busybox not found: install busybox-static to build test images")


@dataclass
class ImageConfig:
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    env: list[str] = field(default_factory=lambda: [DEFAULT_PATH_ENV])
    working_dir: str = ""
    user: str = ""
    exposed_ports: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)


def _tar_info(name: str, *, mode: int = 0o644, kind: bytes = tarfile.REGTYPE, size: int = 0,
              linkname: str = "") -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type, ti.mode, ti.size, ti.linkname = kind, mode, size, linkname
    ti.mtime = 0
    ti.uname = ti.gname = "root"
    return ti


def _busybox_layer(busybox: str, extra_files: dict[str, bytes] | None) -> bytes:
    applets = subprocess.run([busybox, "--list-full"], capture_output=True, text=True,
                             check=True).stdout.split()
    data = open(busybox, "rb").read()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for d in ("bin", "sbin", "usr", "usr/bin", "usr/sbin", "etc", "root", "var", "var/www",
                  "proc", "sys", "dev", "run"):
            t.addfile(_tar_info(d, mode=0o755, kind=tarfile.DIRTYPE))
        t.addfile(_tar_info("tmp", mode=0o1777, kind=tarfile.DIRTYPE))
        t.addfile(_tar_info("bin/busybox", mode=0o755, size=len(data)), io.BytesIO(data))
        for a in sorted(set(applets)):
            if a != "bin/busybox" and a.count("/") <= 2:
                t.addfile(_tar_info(a, mode=0o777, kind=tarfile.SYMTYPE, linkname="/bin/busybox"))
        files = {
            "etc/passwd": b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
            "etc/group": b"root:x:0:\nnobody:x:65534:\n",
            **(extra_files or {}),
        }
        for name, content in sorted(files.items()):
            t.addfile(_tar_info(name, size=len(content)), io.BytesIO(content))
    return buf.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    blobs[f"blobs/sha256/{digest}"] = data
    return {"digest": f"sha256:{digest}", "size": len(data)}


def write_oci_archive(path: str, ref: str, layers: list[bytes], config: ImageConfig,
                      *, arch: str = "amd64") -> str:
    """Write an OCI image layout tar of uncompressed ``layers``; returns the manifest digest."""
    blobs: dict[str, bytes] = {}
    layer_descs, diff_ids = [], []
    for raw in layers:
        diff_ids.append("sha256:" + hashlib.sha256(raw).hexdigest())
        layer_descs.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                            **_blob(blobs, gzip.compress(raw, mtime=0))})
    cfg: dict = {"Env": config.env}
    if config.entrypoint is not None:
        cfg["Entrypoint"] = config.entrypoint
    if config.cmd is not None:
        cfg["Cmd"] = config.cmd
    if config.working_dir:
        cfg["WorkingDir"] = config.working_dir
    if config.user:
        cfg["User"] = config.user
    if config.exposed_ports:
        cfg["ExposedPorts"] = {p: {} for p in config.exposed_ports}
    if config.labels:
        cfg["Labels"] = config.labels
    image_config = {"architecture": arch, "os": "linux", "config": cfg,
                    "rootfs": {"type": "layers", "diff_ids": diff_ids}}
    config_desc = _blob(blobs, json.dumps(image_config, sort_keys=True).encode())
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
                "layers": layer_descs}
    manifest_desc = _blob(blobs, json.dumps(manifest, sort_keys=True).encode())
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", **manifest_desc,
        "annotations": {"io.containerd.image.name": ref,
                        "org.opencontainers.image.ref.name": ref.rpartition(":")[2]}}]}
    entries = {"oci-layout": b'{"imageLayoutVersion":"1.0.0"}', "index.json": json.dumps(index).encode(),
               **blobs}
    tmp = path + ".part"
    with tarfile.open(tmp, "w") as t:
        t.addfile(_tar_info("blobs", mode=0o755, kind=tarfile.DIRTYPE))
        t.addfile(_tar_info("blobs/sha256", mode=0o755, kind=tarfile.DIRTYPE))
        for name, data in entries.items():
            t.addfile(_tar_info(name, size=len(data)), io.BytesIO(data))
    os.replace(tmp, path)
    return manifest_desc["digest"]


def build_busybox_image(path: str, ref: str = "kubeplane.local/busybox:latest", *,
                        config: ImageConfig | None = None,
                        extra_files: dict[str, bytes] | None = None,
                        busybox: str | None = None) -> str:
    """An image of a static busybox (``/bin/sh`` and every applet); returns its manifest digest."""
    layer = _busybox_layer(busybox or find_busybox(), extra_files)
    return write_oci_archive(path, ref, [layer], config or ImageConfig(cmd=["sh"]))


def build_pause_image(path: str, ref: str = "kubeplane.local/pause:3.10", *,
                      busybox: str | None = None) -> str:
    """A sandbox image: a busybox shell that waits for SIGTERM."""
    return build_busybox_image(path, ref, busybox=busybox,
                               config=ImageConfig(entrypoint=["/bin/sh", "-c", PAUSE_SCRIPT]))


def is_archive(name: str) -> bool:
    return name.endswith(ARCHIVE_SUFFIXES) and not name.startswith(".")


async def import_archive(address: str, path: str, *, namespace: str = CRI_NAMESPACE,
                         ctr: str = "ctr", timeout: float = 600.0) -> list[str]:
    """Import an image archive into containerd at ``address``; returns the image names imported.

    containerd has no CRI call for this; its own client ``ctr`` does it
    (``ctr images import``); in the CRI namespace the CRI plugin then sees and
    manages the images.
    """
    proc = await asyncio.create_subprocess_exec(
        ctr, "--address", address, "--namespace", namespace, "images", "import", path,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except BaseException as e:
        # a timeout, and also a cancellation (the agent stopping): ctr must not
        # outlive the import it was started for
        if proc.returncode is None:
            try:
                proc.kill()
            except ProcessLookupError:
                pass
            await asyncio.shield(proc.wait())
        if isinstance(e, asyncio.TimeoutError):
            raise ImageError(f"importing {path}: timed out after {timeout:g}s") from None
        raise
    if proc.returncode != 0:
        msg = (err or out).decode(errors="replace").strip().splitlines()
        raise ImageError(f"importing {path}: {msg[-1] if msg else f'ctr exited {proc.returncode}'}")
    names = []
    for line in out.decode(errors="replace").splitlines():
        # "unpacking docker.io/library/busybox:1 (sha256:...)...done"
        if line.startswith("unpacking "):
            names.append(line[len("unpacking "):].split(" (", 1)[0])
    return names
