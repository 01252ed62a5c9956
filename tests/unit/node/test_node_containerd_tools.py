"""The node's handling of containerd's files and its ``ctr`` client: the log tail
read for error messages, image imports that end with the agent."""

from __future__ import annotations

import asyncio
import builtins
import os
import signal
import time

import pytest

from kubeplane.node import containerd as ctd_mod
from kubeplane.node.containerd import TAIL_LOG_BYTES, ManagedContainerd
from kubeplane.node.images import ImageError, import_archive


def _managed(tmp_path) -> ManagedContainerd:
    return ManagedContainerd(str(tmp_path), sandbox_image="pause", cni_bin_dir=str(tmp_path),
                             restrict_oom_score_adj=False)


def test_tail_log_reads_only_the_end(tmp_path, monkeypatch):
    ctd = _managed(tmp_path)
    line = b"time=x level=info msg=" + b"y" * 100 + b"\n"
    with open(ctd.paths.log, "wb") as f:
        for _ in range(20 * 1024 * 1024 // len(line)):
            f.write(line)
        f.write(b"one\ntwo\nthree\n")
    read = []

    class Counting:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def seek(self, *a):
            return self.f.seek(*a)

        def read(self, n=-1):
            data = self.f.read(n)
            read.append(len(data))
            return data

    monkeypatch.setattr(ctd_mod, "open", lambda *a, **kw: Counting(builtins.open(*a, **kw)),
                        raising=False)
    assert ctd.tail_log(3) == "one | two | three"
    assert sum(read) <= TAIL_LOG_BYTES
    # the first line of the block read is cut: never returned even when asked for much
    got = ctd.tail_log(10_000).split(" | ")
    assert got[-3:] == ["one", "two", "three"]
    assert all(g == line.rstrip(b"\n").decode() for g in got[:-3])
    assert len(got) < TAIL_LOG_BYTES // len(line) + 4


def test_tail_log_small_and_missing(tmp_path):
    ctd = _managed(tmp_path)
    assert ctd.tail_log() == ""
    with open(ctd.paths.log, "wb") as f:
        f.write(b"a\nb\n")
    assert ctd.tail_log() == "a | b"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def _fake_ctr(tmp_path) -> tuple[str, str]:
    pidfile = str(tmp_path / "ctr.pid")
    script = tmp_path / "ctr"
    script.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 60\n")
    script.chmod(0o755)
    return str(script), pidfile


async def _wait_pid(pidfile: str) -> int:
    for _ in range(200):
        if os.path.exists(pidfile) and open(pidfile).read().strip():
            return int(open(pidfile).read())
        await asyncio.sleep(0.02)
    raise AssertionError("the fake ctr did not start")


def _kill(pidfile: str) -> None:
    try:
        os.kill(int(open(pidfile).read()), signal.SIGKILL)
    except (OSError, ValueError):
        pass


def test_import_cancelled_kills_ctr(tmp_path):
    ctr, pidfile = _fake_ctr(tmp_path)

    async def main():
        task = asyncio.create_task(import_archive("sock", "img.tar", ctr=ctr))
        pid = await _wait_pid(pidfile)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return pid

    try:
        pid = asyncio.run(main())
        # killed and reaped before the cancellation finished
        assert not _alive(pid)
    finally:
        _kill(pidfile)


def test_import_timeout_kills_ctr(tmp_path):
    ctr, pidfile = _fake_ctr(tmp_path)
    try:
        t0 = time.monotonic()
        with pytest.raises(ImageError, match="timed out after 0.5s"):
            asyncio.run(import_archive("sock", "img.tar", ctr=ctr, timeout=0.5))
        assert time.monotonic() - t0 < 10
        assert not _alive(int(open(pidfile).read()))
    finally:
        _kill(pidfile)
