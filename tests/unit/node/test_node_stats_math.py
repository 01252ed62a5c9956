"""The node's usage read from cgroup and /proc files, and CPU rates from samples."""

from __future__ import annotations

import datetime as _dt
import os

import pytest

from kubeplane.api.quantity import parse_quantity
from kubeplane.node.stats import ContainerSample, HostStats, Sample, StatsProvider, format_cpu, format_memory
from kubeplane.api.usage import parse_report

S = 10**9


def _write(path, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def test_cgroup_v1_root(tmp_path):
    cg = tmp_path / "cg"
    _write(cg / "cpuacct" / "cpuacct.usage", "123456789\n")
    _write(cg / "memory" / "memory.usage_in_bytes", "1000000\n")
    _write(cg / "memory" / "memory.stat", "cache 10\ninactive_file 5\ntotal_inactive_file 400000\n")
    host = HostStats(cgroup_root=str(cg), proc_root=str(tmp_path / "noproc"))
    assert host.cpu_nanoseconds() == (123456789, "cgroup")
    assert host.memory_working_set() == (600000, "cgroup")


def test_cgroup_v1_joint_cpu_mount(tmp_path):
    cg = tmp_path / "cg"
    _write(cg / "cpu,cpuacct" / "cpuacct.usage", "42\n")
    _write(tmp_path / "proc" / "meminfo", "MemTotal: 1000 kB\nMemFree: 400 kB\nInactive(file): 100 kB\n")
    host = HostStats(cgroup_root=str(cg), proc_root=str(tmp_path / "proc"))
    assert host.cpu_nanoseconds() == (42, "cgroup")
    assert host.memory_working_set() == (500 * 1024, "proc")


def test_cgroup_v2_root_cpu(tmp_path):
    cg = tmp_path / "cg"
    _write(cg / "cpu.stat", "usage_usec 2500\nuser_usec 2000\nsystem_usec 500\n")
    host = HostStats(cgroup_root=str(cg), proc_root=str(tmp_path / "proc"))
    assert host.cpu_nanoseconds() == (2_500_000, "cgroup")


def test_proc_fallback(tmp_path):
    proc = tmp_path / "proc"
    # user nice system idle iowait irq softirq steal guest guest_nice
    _write(proc / "stat", "cpu  100 10 50 9999 77 5 3 2 40 0\ncpu0 1 1 1 1 1 1 1 1 1 1\n")
    _write(proc / "meminfo", "MemTotal:       2048 kB\nMemFree:         512 kB\nInactive(file):   256 kB\n")
    host = HostStats(cgroup_root=str(tmp_path / "nocg"), proc_root=str(proc))
    host.clock_ticks = 100
    # idle and iowait are not use; guest time is already in user
    assert host.cpu_nanoseconds() == ((100 + 10 + 50 + 5 + 3 + 2) * S // 100, "proc")
    assert host.memory_working_set() == ((2048 - 512 - 256) * 1024, "proc")


def test_nothing_readable_is_an_error_naming_the_file(tmp_path):
    host = HostStats(cgroup_root=str(tmp_path / "a"), proc_root=str(tmp_path / "b"))
    with pytest.raises(OSError, match="stat"):
        host.cpu_nanoseconds()
    with pytest.raises(OSError, match="meminfo"):
        host.memory_working_set()
    _write(tmp_path / "b" / "meminfo", "Buffers: 1 kB\n")
    with pytest.raises(OSError, match="MemTotal"):
        host.memory_working_set()


def test_formats():
    assert format_cpu(561061883) == "561061883n"
    assert format_cpu(250_000_000) == "250m"
    assert format_cpu(-5) == "0"
    assert format_memory(50589696) == "49404Ki"
    assert parse_quantity(format_memory(3 * 1024 * 1024)) == 3 * 1024 * 1024


def _sample(mono: float, node_cpu: int | None, containers: dict[str, ContainerSample]) -> Sample:
    s = Sample(wall_ns=int((1_800_000_000 + mono) * S), mono=mono, node_cpu_ns=node_cpu,
               node_memory_bytes=7 * 1024 * 1024)
    s.pods = {"u1": ("ns", "web"), "u2": ("ns", "db")}
    s.containers = containers
    return s


def _c(uid: str, name: str, created: float, ts: float, cpu: int | None, mem: int | None = 1024) -> ContainerSample:
    return ContainerSample(pod_uid=uid, name=name, created_ns=int(created * S), timestamp_ns=int(ts * S),
                           cpu_ns=cpu, memory_bytes=mem)


def test_rates_over_the_window_and_new_containers_over_their_life():
    p = StatsProvider(cri=None, min_window=1.0)
    base = _sample(100.0, 10 * S, {"a": _c("u1", "app", 50, 100.0, 4 * S)})
    now = _sample(102.0, 13 * S, {
        "a": _c("u1", "app", 50, 102.0, 5 * S, mem=2 * 1024 * 1024),   # 1 s of cpu in 2 s: 500m
        "b": _c("u1", "side", 101.0, 102.0, S // 4),                    # new: 0.25 s in its 1 s of life
        "c": _c("u2", "db", 20, 102.0, None, mem=None),                  # nothing measured: left out
    })
    u = p._usage(now, base)
    assert u.window_seconds == 2.0
    assert u.node == {"cpu": "1500m", "memory": "7Mi"}
    assert u.pods == [{"namespace": "ns", "name": "web", "uid": "u1", "containers": [
        {"name": "app", "usage": {"cpu": "500m", "memory": "2Mi"}},
        {"name": "side", "usage": {"cpu": "250m", "memory": "1Ki"}}]}]
    assert u.timestamp == _dt.datetime.fromtimestamp(1_800_000_102, _dt.timezone.utc)
    report = parse_report(u.report())
    assert report is not None and report.window == "2s" and report.node == {"cpu": "1500m", "memory": "7Mi"}
    assert report.pods["u1"][2][0] == ("app", {"cpu": "500m", "memory": "2Mi"})


def test_counter_going_back_is_not_negative_and_newer_container_of_a_name_wins():
    p = StatsProvider(cri=None, min_window=1.0)
    base = _sample(10.0, 5 * S, {"old": _c("u2", "db", 1, 10.0, 9 * S)})
    now = _sample(11.0, 4 * S, {
        "old": _c("u2", "db", 1, 11.0, 8 * S),
        "new": _c("u2", "db", 10.5, 11.0, S // 10),
    })
    u = p._usage(now, base)
    assert u.node["cpu"] == "0"
    assert u.pods[0]["containers"] == [{"name": "db", "usage": {"cpu": "200m", "memory": "1Ki"}}]


def test_no_node_cpu_without_two_readings():
    p = StatsProvider(cri=None, min_window=1.0)
    u = p._usage(_sample(2.0, 5 * S, {}), _sample(1.0, None, {}))
    assert u.node == {"memory": "7Mi"} and u.pods == []


def test_baseline_is_the_newest_sample_a_window_old():
    p = StatsProvider(cri=None, min_window=1.0)
    for t in (0.0, 5.0, 9.5, 9.9):
        p._samples.append(_sample(t, 0, {}))
    now = _sample(10.2, 0, {})
    p._samples.append(now)
    assert p._baseline(now).mono == 5.0


def test_min_window_must_be_positive():
    with pytest.raises(ValueError, match="min_window"):
        StatsProvider(cri=None, min_window=0)


async def test_usage_flow_windows_reuse_and_no_runtime(tmp_path):
    """A provider whose runtime is not there: the node's usage from the files,
    rated over real windows; no pods."""
    from kubeplane.node.cri.client import CRIClient

    cg = tmp_path / "cg"
    _write(cg / "cpuacct" / "cpuacct.usage", "0\n")
    _write(cg / "memory" / "memory.usage_in_bytes", str(64 * 1024 * 1024))
    _write(cg / "memory" / "memory.stat", "total_inactive_file 0\n")
    host = HostStats(cgroup_root=str(cg), proc_root=str(tmp_path / "proc"))
    async with CRIClient(f"unix://{tmp_path}/none.sock", timeout=1.0) as cri:
        p = StatsProvider(cri, host=host, min_window=0.3)
        import asyncio
        import time as _time

        async def bump(ns: int) -> None:
            await asyncio.sleep(0.1)
            _write(cg / "cpuacct" / "cpuacct.usage", f"{ns}\n")

        t0 = _time.monotonic()
        # half a core over the first window: 0.15 s of cpu appears during the 0.3 s wait
        bumper = asyncio.ensure_future(bump(150_000_000))
        first = await p.usage()
        await bumper
        assert _time.monotonic() - t0 >= 0.3 and first.window_seconds >= 0.3
        assert first.pods == [] and first.node["memory"] == "64Mi"
        assert 0 < parse_quantity(first.node["cpu"]) <= parse_quantity("500m")
        # asked again at once: the same measurement
        assert await p.usage() is first
        await asyncio.sleep(0.55)  # past the reuse of a fresh measurement
        _write(cg / "cpuacct" / "cpuacct.usage", "150000000\n")
        second = await p.usage()
        assert second is not first and second.window_seconds >= 0.3
        assert second.node["cpu"] == "0"
        assert parse_report(second.report()).node == {"cpu": "0", "memory": "64Mi"}
