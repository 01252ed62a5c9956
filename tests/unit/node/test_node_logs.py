"""Container log rotation (upstream's container log manager), against a
runtime that reopens logs as containerd does: a new file under the old name."""

from __future__ import annotations

import gzip
import os
from types import SimpleNamespace

import grpc
import pytest

from kubeplane.node.cri.client import CRIError, pb
from kubeplane.node.logs import ContainerLogManager, rotated_logs


class Runtime:
    def __init__(self, path, *, reopen_fails=False):
        self.path = path
        self.reopen_fails = reopen_fails
        self.reopened = 0
        self.state = pb.CONTAINER_RUNNING

    def write(self, n: int, tag: str) -> None:
        with open(self.path, "ab") as f:
            f.write(f"2026-01-01T00:00:00Z stdout F {tag}".encode().ljust(n - 1, b"x") + b"\n")

    async def runtime(self, method, request, timeout=None):
        if method == "ListContainers":
            return SimpleNamespace(containers=[SimpleNamespace(id="c1")] if self.state == pb.CONTAINER_RUNNING else [])
        if method == "ContainerStatus":
            return SimpleNamespace(status=SimpleNamespace(state=self.state, log_path=self.path))
        if method == "ReopenContainerLog":
            if self.reopen_fails:
                raise CRIError(method, grpc.StatusCode.UNKNOWN, "container is not running")
            self.reopened += 1
            open(self.path, "ab").close()
            return SimpleNamespace()
        raise AssertionError(method)


class Clock:
    def __init__(self):
        self.t = 1_800_000_000.0

    def __call__(self):
        self.t += 1
        return self.t


@pytest.fixture
def log_path(tmp_path):
    d = tmp_path / "pod" / "main"
    d.mkdir(parents=True)
    return str(d / "0.log")


async def test_a_small_log_is_left_alone(log_path):
    rt = Runtime(log_path)
    rt.write(100, "a")
    m = ContainerLogManager(rt, max_size=1024, max_files=3, clock=Clock())
    assert await m.rotate_running() == []
    assert os.listdir(os.path.dirname(log_path)) == ["0.log"]


async def test_rotation_keeps_max_files_compresses_all_but_the_newest(log_path):
    rt = Runtime(log_path)
    m = ContainerLogManager(rt, max_size=1024, max_files=3, clock=Clock())
    for i in range(5):
        rt.write(2000, f"round-{i}")
        assert await m.rotate_running() == ["c1"]
    assert rt.reopened == 5
    rotated = rotated_logs(log_path)
    # the current log, the newest rotated one as it was, the one before compressed: three files
    assert len(rotated) == 2 and sorted(os.listdir(os.path.dirname(log_path))) == sorted(
        ["0.log"] + [os.path.basename(p) for p in rotated])
    assert rotated[0].endswith(".gz") and not rotated[1].endswith(".gz")
    assert b"round-4" in open(rotated[1], "rb").read()
    assert b"round-3" in gzip.open(rotated[0]).read()
    assert os.path.getsize(log_path) == 0


async def test_a_refused_reopen_puts_the_log_back(log_path):
    rt = Runtime(log_path, reopen_fails=True)
    rt.write(2000, "kept")
    m = ContainerLogManager(rt, max_size=1024, max_files=2, clock=Clock())
    assert await m.rotate_running() == []
    assert os.listdir(os.path.dirname(log_path)) == ["0.log"]
    assert b"kept" in open(log_path, "rb").read()


async def test_stopped_containers_and_stale_temporary_files(log_path):
    rt = Runtime(log_path)
    rt.write(2000, "a")
    open(log_path + ".20260101-000000.gz.tmp", "wb").close()   # a compression cut short
    m = ContainerLogManager(rt, max_size=1024, max_files=2, clock=Clock())
    rt.state = pb.CONTAINER_EXITED
    assert await m.rotate_running() == []
    rt.state = pb.CONTAINER_RUNNING
    assert await m.rotate_running() == ["c1"]
    assert not [n for n in os.listdir(os.path.dirname(log_path)) if n.endswith(".tmp")]
    # max_files=2: the current log and the newest rotated one
    rt.write(2000, "b")
    await m.rotate_running()
    assert len(rotated_logs(log_path)) == 1


def test_limits_are_checked():
    with pytest.raises(ValueError, match="at least 2"):
        ContainerLogManager(None, max_files=1)
    with pytest.raises(ValueError, match="positive"):
        ContainerLogManager(None, max_size=0)


def test_rotated_files_sort_by_time_then_by_their_count_within_a_second(log_path):
    d = os.path.dirname(log_path)
    for n in ["0.log.20260101-000001.1", "0.log.20260101-000001.gz", "0.log.20260101-000000.2.gz",
              "0.log.20260101-000001.10", "0.log.20260101-000001.2.gz", "1.log.20250101-000000", "0.log"]:
        open(os.path.join(d, n), "w").close()
    assert [os.path.basename(p) for p in rotated_logs(log_path)] == [
        "0.log.20260101-000000.2.gz", "0.log.20260101-000001.gz", "0.log.20260101-000001.1",
        "0.log.20260101-000001.2.gz", "0.log.20260101-000001.10"]


async def test_rotations_within_one_second_keep_their_order(log_path):
    rt = Runtime(log_path)
    m = ContainerLogManager(rt, max_size=1, max_files=3, clock=lambda: 1_800_000_000.0)
    for i in range(6):
        rt.write(100, f"round-{i}")
        assert await m.rotate_running() == ["c1"]
    rotated = rotated_logs(log_path)
    assert len(rotated) == 2 and rotated[0].endswith(".gz") and not rotated[1].endswith(".gz")
    assert b"round-5" in open(rotated[1], "rb").read() and b"round-4" in gzip.open(rotated[0]).read()
