"""A containerd that the node agent starts and owns.

Everything lives under one directory (config, root, state, socket, log, the
CNI configuration and the pods' network-namespace mounts), so several nodes
run side by side on one host and :meth:`ManagedContainerd.stop` can remove
all of it: pod sandboxes (which runs CNI DEL), the daemon, the shims it
left, and every mount under its directories. With ``--cri-socket`` the
agent uses a running containerd instead and owns none of this.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

from kubeplane.node.cri.client import CRIClient, CRIError, pb

log = logging.getLogger(__name__)

CNI_BIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin", "/usr/libexec/cni")
DISABLED_PLUGINS = (
    "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing",
)
#: how much of the end of containerd's log ``tail_log`` reads
TAIL_LOG_BYTES = 64 * 1024


def find_cni_bin_dir() -> str:
    for d in CNI_BIN_DIRS:
        if os.path.isfile(os.path.join(d, "bridge")):
            return d
    raise FileNotFoundError("CNI plugins not found (looked in %s): install containernetworking-plugins"
                            % ", ".join(CNI_BIN_DIRS))


def can_lower_oom_score_adj() -> bool:
    """Whether a child may set a negative oom_score_adj (some sandboxes forbid it)."""
    r = subprocess.run(["/bin/sh", "-c", "echo -998 > /proc/self/oom_score_adj"],
                       capture_output=True)
    return r.returncode == 0


def _toml_str(s: str) -> str:
    return json.dumps(s)


@dataclass
class ContainerdPaths:
    base: str

    @property
    def config(self) -> str:
        return os.path.join(self.base, "config.toml")

    @property
    def root(self) -> str:
        return os.path.join(self.base, "root")

    @property
    def state(self) -> str:
        return os.path.join(self.base, "state")

    @property
    def socket(self) -> str:
        return os.path.join(self.base, "containerd.sock")

    @property
    def log(self) -> str:
        return os.path.join(self.base, "containerd.log")

    @property
    def cni_conf_dir(self) -> str:
        return os.path.join(self.base, "cni", "net.d")

    @property
    def cni_state_dir(self) -> str:
        return os.path.join(self.base, "cni", "networks")


class ManagedContainerd:
    """containerd with its own directories under ``base``."""

    def __init__(self, base: str, *, sandbox_image: str, cni_bin_dir: str | None = None,
                 binary: str = "containerd", stream_address: str = "127.0.0.1",
                 restrict_oom_score_adj: bool | None = None, log_level: str = "warn"):
        self.paths = ContainerdPaths(os.path.abspath(base))
        self.sandbox_image = sandbox_image
        self.cni_bin_dir = cni_bin_dir or find_cni_bin_dir()
        self.binary = binary
        self.stream_address = stream_address
        self.restrict_oom_score_adj = (not can_lower_oom_score_adj()
                                       if restrict_oom_score_adj is None else restrict_oom_score_adj)
        self.log_level = log_level
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return self.paths.socket

    @property
    def endpoint(self) -> str:
        return "unix://" + self.paths.socket

    def config_toml(self) -> str:
        p = self.paths
        disabled = ", ".join(_toml_str(x) for x in DISABLED_PLUGINS)
        return f"""version = 2
root = {_toml_str(p.root)}
state = {_toml_str(p.state)}
disabled_plugins = [{disabled}]

[grpc]
  address = {_toml_str(p.socket)}

[debug]
  level = {_toml_str(self.log_level)}

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = {_toml_str(self.stream_address)}
  stream_server_port = "0"
  enable_selinux = false
  sandbox_image = {_toml_str(self.sandbox_image)}
  restrict_oom_score_adj = {str(self.restrict_oom_score_adj).lower()}
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = {_toml_str(self.cni_bin_dir)}
    conf_dir = {_toml_str(p.cni_conf_dir)}
    max_conf_num = 1
"""

    async def start(self, timeout: float = 30.0) -> None:
        p = self.paths
        for d in (p.base, p.root, p.state, p.cni_conf_dir, p.cni_state_dir):
            os.makedirs(d, exist_ok=True)
        with open(p.config, "w") as f:
            f.write(self.config_toml())
        if os.path.exists(p.socket):
            os.unlink(p.socket)
        logf = open(p.log, "ab")
        try:
            self.proc = subprocess.Popen([self.binary, "--config", p.config], stdout=logf,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        finally:
            logf.close()
        deadline = time.monotonic() + timeout
        async with CRIClient(self.endpoint, timeout=2.0) as cri:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"containerd exited with {self.proc.returncode}: "
                                       f"{self.tail_log()}")
                if os.path.exists(p.socket):
                    try:
                        await cri.version()
                        return
                    except CRIError:
                        pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"containerd did not answer within {timeout:g}s: {self.tail_log()}")
                await asyncio.sleep(0.05)

    def tail_log(self, lines: int = 5) -> str:
        """The last ``lines`` lines of the daemon's log, from at most its last 64 KiB."""
        try:
            with open(self.paths.log, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                start = max(0, size - TAIL_LOG_BYTES)
                f.seek(start)
                data = f.read(TAIL_LOG_BYTES)
        except OSError:
            return ""
        found = data.splitlines()
        if start and found:
            found = found[1:]  # the first line read is (likely) cut
        return b" | ".join(found[-lines:]).decode(errors="replace")

    async def remove_all_pods(self) -> None:
        """Stop and remove every pod sandbox (the CNI DEL of each included)."""
        if not os.path.exists(self.paths.socket):
            return
        async with CRIClient(self.endpoint, timeout=30.0) as cri:
            try:
                sandboxes = (await cri.runtime("ListPodSandbox", pb.ListPodSandboxRequest())).items
            except CRIError as e:
                log.warning("listing sandboxes of %s: %s", self.paths.socket, e)
                return
            for s in sandboxes:
                for method, req in (("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=s.id)),
                                    ("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=s.id))):
                    try:
                        await cri.runtime(method, req)
                    except CRIError as e:
                        log.warning("%s %s: %s", method, s.id[:12], e)

    async def stop(self, *, remove_pods: bool = True, timeout: float = 10.0) -> None:
        """Stop the daemon; with ``remove_pods`` also every pod, shim and mount it made."""
        if remove_pods and self.proc is not None and self.proc.poll() is None:
            await self.remove_all_pods()
        if self.proc is not None:
            await terminate(self.proc, timeout)
        if remove_pods:
            kill_shims(self.paths.socket)
            unmount_under(self.paths.base)

    def remove(self) -> None:
        """Delete the directory (after :meth:`stop`)."""
        unmount_under(self.paths.base)
        shutil.rmtree(self.paths.base, ignore_errors=True)


async def terminate(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM ``proc`` if it still runs; SIGKILL it after ``timeout`` seconds; reap it."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(asyncio.to_thread(proc.wait), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await asyncio.to_thread(proc.wait)


def shims() -> list[tuple[int, list[bytes]]]:
    """The containerd runc shims running on this host, with their command lines
    (``-namespace NS -id ID -address SOCKET``; a pod's shim has its sandbox's id)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2"):
            out.append((int(pid), argv))
    return out


def kill_shims(address: str) -> int:
    """SIGKILL the containerd shims (and so their containers) serving ``address``:
    a containerd socket, or a directory below which such sockets are. The shims are
    found by their command line, so also once the socket or the directory is gone."""
    key = os.path.abspath(address).encode()
    killed = 0
    for pid, argv in shims():
        if any(a == key or a.startswith(key + b"/") for a in argv[1:]):
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed


def unmount_under(base: str) -> int:
    """Lazily unmount every mount point at or below ``base``, deepest first."""
    base = os.path.abspath(base)
    points = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                mp = line.split()[4].replace("\\040", " ")
                if mp == base or mp.startswith(base + "/"):
                    points.append(mp)
    except OSError:
        return 0
    n = 0
    for mp in sorted(set(points), key=len, reverse=True):
        if subprocess.run(["umount", "-l", mp], capture_output=True).returncode == 0:
            n += 1
    return n
