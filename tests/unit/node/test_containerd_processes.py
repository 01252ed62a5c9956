"""Stopping what a node's containerd leaves: its shims, found by their command
line once the socket and its directory are gone, and a daemon that ignores SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from kubeplane.node.containerd import kill_shims, terminate

_SLEEP = "import time\nwhile True: time.sleep(1)"


def _fake_shim(tmp_path, address: str) -> subprocess.Popen:
    """A process whose command line is a runc shim's serving ``address``."""
    name = str(tmp_path / "bin" / "containerd-shim-runc-v2")
    return subprocess.Popen([name, "-c", _SLEEP, "-namespace", "k8s.io", "-address", address],
                            executable=sys.executable)


def _wait_cmdline(proc: subprocess.Popen, word: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
                if word.encode() in f.read():
                    return
        except OSError:
            pass
        time.sleep(0.02)
    raise AssertionError(f"process {proc.pid} never showed {word}")


def test_kill_shims_by_socket_or_directory_once_gone(tmp_path):
    gone = tmp_path / "node" / "containerd"          # never created: as after containerd stopped
    mine = _fake_shim(tmp_path, str(gone / "state" / "containerd.sock"))
    also_mine = _fake_shim(tmp_path, str(gone / "other.sock"))
    neighbour = _fake_shim(tmp_path, str(tmp_path / "node-other" / "containerd.sock"))
    prefix = _fake_shim(tmp_path, str(tmp_path / "node" / "containerd2" / "containerd.sock"))
    procs = [mine, also_mine, neighbour, prefix]
    try:
        for p in procs:
            _wait_cmdline(p, "-address")
        assert not os.path.exists(gone)
        assert kill_shims(str(gone / "other.sock")) == 1
        assert also_mine.wait(10) == -signal.SIGKILL
        # a directory: every shim whose socket was below it, not a sibling sharing its prefix
        assert kill_shims(str(tmp_path / "node" / "containerd")) == 1
        assert mine.wait(10) == -signal.SIGKILL
        assert neighbour.poll() is None and prefix.poll() is None
        assert kill_shims(str(gone)) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


async def test_terminate_then_kill(tmp_path):
    polite = subprocess.Popen([sys.executable, "-c", _SLEEP])
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal\nsignal.signal(signal.SIGTERM, "
                                 "signal.SIG_IGN)\nprint('ready', flush=True)\n" + _SLEEP],
                                stdout=subprocess.PIPE)
    try:
        assert stubborn.stdout.readline() == b"ready\n"
        await terminate(polite, 10)
        assert polite.returncode == -signal.SIGTERM
        started = time.monotonic()
        await terminate(stubborn, 0.3)
        assert stubborn.returncode == -signal.SIGKILL and time.monotonic() - started < 10
        await terminate(stubborn, 0.3)          # already reaped: nothing to do
        assert stubborn.returncode == -signal.SIGKILL
    finally:
        for p in (polite, stubborn):
            if p.poll() is None:
                p.kill()
            p.wait()
        stubborn.stdout.close()
