"""A real container runtime for the node tests: containerd with its own directories.

The session's containerd, its pods, shims, mounts, bridge and CNI state are
all removed afterwards, also when a test fails.
"""

from __future__ import annotations

import asyncio
import os
import subprocess

import pytest

from kubeplane.node import cni
from kubeplane.node.containerd import ManagedContainerd
from kubeplane.node.images import build_busybox_image, build_pause_image, import_archive

from nodetest import BUSYBOX, PAUSE


def _unique_bridge_and_cidr() -> tuple[str, str]:
    """A bridge name and a /24 no other bridge on this host routes (tests may run side by side)."""
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    start = os.getpid() % 200
    for i in range(200):
        n = (start + i) % 200 + 20
        if f"10.250.{n}." not in routes:
            return f"kpt{os.getpid()}"[:15], f"10.250.{n}.0/24"
    raise RuntimeError("no free 10.250.x.0/24 for the test bridge")


@pytest.fixture(scope="session")
def image_archives(tmp_path_factory):
    d = tmp_path_factory.mktemp("images")
    busybox, pause = str(d / "busybox.tar"), str(d / "pause.tar")
    build_busybox_image(busybox, BUSYBOX)
    build_pause_image(pause, PAUSE)
    return {"busybox": busybox, "pause": pause, "dir": str(d)}


@pytest.fixture(scope="session")
def containerd(tmp_path_factory, image_archives):
    base = tmp_path_factory.mktemp("containerd")
    ctd = ManagedContainerd(str(base), sandbox_image=PAUSE)
    bridge, cidr = _unique_bridge_and_cidr()
    cni.write_conflist(ctd.paths.cni_conf_dir,
                       cni.bridge_conflist(cidr, bridge=bridge, ipam_dir=ctd.paths.cni_state_dir))
    ctd.bridge, ctd.pod_cidr = bridge, cidr
    try:
        asyncio.run(ctd.start())
        for archive in (image_archives["busybox"], image_archives["pause"]):
            asyncio.run(import_archive(ctd.address, archive))
        yield ctd
    finally:
        asyncio.run(ctd.stop())
        ctd.remove()
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)
