"""Smoke tests of the scheduler_perf harness at a tiny size (proves the ops and
the measurements work; says nothing about speed)."""

from __future__ import annotations

import pytest

from kubeplane.bench.scheduler import WORKLOADS, ThroughputCollector, percentile, run_workload
from kubeplane.bench.workloads import get_workload
from kubeplane.scheduler.plugins.registry import in_tree_registry

KEYS = {"workload", "nodes", "pods", "scheduled", "duration_s", "throughput_avg", "throughput_p50",
        "throughput_p90", "throughput_p99", "latency_p50_ms", "latency_p99_ms", "peak_rss_mb"}

# (workload, nodes, measured pods): sizes where every measured pod fits.
SCHEDULABLE = [
    ("SchedulingBasic", 10, 20),
    ("SchedulingPodAntiAffinity", 10, 8),
    ("SchedulingPodAffinity", 10, 20),
    ("SchedulingNodeAffinity", 10, 20),
    ("TopologySpreading", 10, 20),
    ("Unschedulable", 10, 20),
    ("SchedulingInTreePVs", 10, 10),
    ("SchedulingCSIPVs", 10, 10),
    ("SchedulingWithResourceClaimTemplate", 4, 10),
    ("SteadyStateClusterResourceClaimTemplate/half", 4, 12),
]


def _needs(name: str) -> None:
    """Every plugin a workload depends on is part of the default registry."""
    plugin = get_workload(name).requires_plugin
    assert plugin is None or plugin in in_tree_registry(), f"{name} needs the {plugin} plugin"


def test_percentile_interpolates() -> None:
    assert percentile([], 50) == 0.0
    assert percentile([5.0], 99) == 5.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([10.0, 0.0], 100) == 10.0


def test_workload_names_and_shapes_follow_upstream() -> None:
    for name in ("SchedulingBasic", "SchedulingPodAntiAffinity", "SchedulingPodAffinity", "SchedulingNodeAffinity",
                 "TopologySpreading", "PreemptionBasic", "Unschedulable", "SchedulingInTreePVs", "SchedulingCSIPVs",
                 "SchedulingWithResourceClaimTemplate"):
        assert name in WORKLOADS
    basic = WORKLOADS["SchedulingBasic"]
    assert (basic.nodes, basic.init_pods, basic.measure_pods) == (5000, 1000, 10000)
    assert WORKLOADS["PreemptionBasic"].init_count(500) == 2000
    assert get_workload("SteadyStateClusterResourceClaimTemplate").name.endswith("/empty")
    with pytest.raises(KeyError):
        get_workload("NoSuchWorkload")


@pytest.mark.parametrize("name,nodes,pods", SCHEDULABLE, ids=[s[0] for s in SCHEDULABLE])
async def test_measured_pods_are_all_scheduled(name: str, nodes: int, pods: int) -> None:
    _needs(name)
    seen: list[tuple[int, int]] = []
    out = await run_workload(name, nodes=nodes, pods=pods, progress=lambda d, t: seen.append((d, t)),
                             stall_timeout_s=5)
    assert KEYS <= out.keys()
    assert out["workload"] == get_workload(name).name
    assert (out["nodes"], out["pods"]) == (nodes, pods)
    assert out["scheduled"] == pods and not out["timed_out"]
    assert out["duration_s"] > 0 and out["throughput_overall"] == pytest.approx(pods / out["duration_s"], rel=0.02)
    if out["throughput_samples"] == 0:
        assert out["throughput_avg"] == out["throughput_overall"]
    assert 0 < out["latency_p50_ms"] <= out["latency_p99_ms"]
    assert out["throughput_p50"] > 0 and out["peak_rss_mb"] > 10
    assert seen[-1] == (pods, pods)
    assert out["init_scheduled"] == out["init_pods"]
    assert out["cpu_ms_per_pod"] > 0 and "scheduler_process_cpu_ms_per_pod" not in out


@pytest.mark.parametrize("name", ["Unschedulable", "PreemptionAsync"])
async def test_churn_pods_arrive_during_the_measured_phase(name: str) -> None:
    """Unschedulable: 9-CPU priority-10 pods keep arriving and fit nowhere (none bound);
    PreemptionAsync: 3-CPU priority-10 pods keep arriving and preempt low-priority pods."""
    out = await run_workload(name, nodes=50, pods=150, stall_timeout_s=10)
    assert out["scheduled"] == 150 and not out["timed_out"]
    assert out["churn_created"] >= 1
    if name == "Unschedulable":
        assert out["init_pods"] == 1 and out["churn_scheduled"] == 0  # 100 init pods scaled to 50 nodes
    else:
        assert out["init_pods"] == 200 and out["init_scheduled"] == 200


@pytest.mark.parametrize("name,nodes,pods", [("SchedulingBasic", 10, 20), ("SchedulingInTreePVs", 10, 10),
                                             ("SchedulingWithResourceClaimTemplate", 4, 10)])
async def test_split_runs_the_scheduler_in_a_second_process(name: str, nodes: int, pods: int) -> None:
    """The scheduler and the controllers reach the registry over the local wire."""
    out = await run_workload(name, nodes=nodes, pods=pods, stall_timeout_s=10, split=True)
    assert out["split"] is True
    assert out["scheduled"] == pods and not out["timed_out"]
    assert out["init_scheduled"] == out["init_pods"]
    # memory is both processes': the scheduler process reported its own
    assert out["scheduler_peak_rss_mb"] > 10
    assert out["peak_rss_mb"] > out["scheduler_peak_rss_mb"]
    # CPU per measured pod of both processes (the child's in clock ticks: maybe 0 for so few pods)
    assert out["cpu_ms_per_pod"] > 0 and out["scheduler_process_cpu_ms_per_pod"] >= 0


async def test_preemption_binds_high_priority_pods() -> None:
    out = await run_workload("PreemptionBasic", nodes=3, pods=3, stall_timeout_s=15)
    assert out["init_pods"] == 12 and out["init_scheduled"] == 12  # 4 x 900m per 4-CPU node
    assert out["scheduled"] == 3


async def test_measured_pods_that_cannot_fit_are_reported_unscheduled() -> None:
    # One green anti-affinity pod per node: 3 nodes, 1 init pod, 4 measured -> only 2 fit.
    out = await run_workload("SchedulingPodAntiAffinity", nodes=3, pods=4, stall_timeout_s=0.5)
    assert out["scheduled"] == 2 and out["timed_out"]


async def test_pv_churn_reports_pv_to_binding() -> None:
    _needs("SchedulingPVsChurn")
    out = await run_workload("SchedulingPVsChurn", nodes=5, pods=2, stall_timeout_s=15, pv_interval_ms=30)
    assert out["scheduled"] == 2 and out["pv_interval_ms"] == 30
    # the second PV appeared 30 ms after the first: the measured phase spans that gap
    assert out["duration_s"] >= 0.03
    assert 0 < out["pv_to_binding_p50_ms"] <= out["pv_to_binding_p99_ms"]
    # Each pod waited for its PV, so creation-to-binding exceeds PV-to-binding.
    assert out["latency_p50_ms"] > out["pv_to_binding_p50_ms"]


def test_throughput_collector_samples_as_upstream() -> None:
    """Ticks before the first binding and the first tick after it are not samples;
    a tick with no new binding folds into the next sample, which is recorded once
    per interval it spans; percentiles are nearest-rank."""
    counts = iter([0, 0, 5, 15, 15, 35, 36, 36, 36, 76])
    c = ThroughputCollector(lambda: next(counts))
    for t in range(1, 11):
        c.tick(float(t))
    # 5 at t=3 starts; 15 at t=4: 10/s; t=5 nothing; 35 at t=6: 20 over 2 s = 10/s twice;
    # 36 at t=7: 1/s; t=8, t=9 nothing; 76 at t=10: 40 over 3 s, three times.
    assert c.samples == [10.0, 10.0, 10.0, 1.0, 40 / 3, 40 / 3, 40 / 3]
    assert c.average() == pytest.approx(sum(c.samples) / 7)
    assert c.percentile(50) == 10.0  # sorted [1, 10, 10, 10, 13.3, 13.3, 13.3], rank ceil(3.5) = 4
    assert c.percentile(99) == pytest.approx(40 / 3)
    assert c.percentile(10) == 1.0


def test_throughput_collector_without_bindings_has_no_samples() -> None:
    c = ThroughputCollector(lambda: 0)
    for t in range(5):
        c.tick(float(t))
    assert c.samples == [] and c.average() == 0.0 and c.percentile(50) == 0.0


def test_process_cpu_seconds_of_this_process_and_a_child() -> None:
    import os
    import subprocess
    import sys
    import time

    from kubeplane.bench.scheduler import process_cpu_s

    start = process_cpu_s()
    sum(i * i for i in range(300_000))
    assert process_cpu_s() > start
    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                              "while time.process_time() - t < 0.3: pass\ninput()"], stdin=subprocess.PIPE)
    try:
        used = 0.0
        for _ in range(200):
            used = process_cpu_s(child.pid) or 0.0
            if used >= 0.25:
                break
            time.sleep(0.02)
        assert 0.25 <= used < 5
    finally:
        child.communicate(b"\n", timeout=10)
    assert process_cpu_s(2**22 + 12345) is None or os.path.exists(f"/proc/{2**22 + 12345}")


def test_median_run_reports_one_whole_run_and_every_runs_throughput() -> None:
    from kubeplane.bench.scheduler import median_run

    runs = [{"throughput_avg": a, "throughput_overall": o, "latency_p50_ms": lat, "timed_out": t}
            for a, o, lat, t in [(300.0, 280.0, 10.0, False), (100.0, 90.0, 30.0, True), (200.0, 190.0, 20.0, False)]]
    out = median_run(runs)
    # The 200 pods/s run, whole: its latency, not a median taken key by key.
    assert (out["throughput_avg"], out["throughput_overall"], out["latency_p50_ms"]) == (200.0, 190.0, 20.0)
    assert out["runs"] == 3
    assert out["throughput_avg_runs"] == [300.0, 100.0, 200.0]
    assert out["throughput_overall_runs"] == [280.0, 90.0, 190.0]
    assert out["timed_out"] is True  # one run timed out
    # An even count takes the lower middle run.
    assert median_run(runs[:2])["throughput_avg"] == 100.0
    with pytest.raises(ValueError):
        median_run([])


async def test_runs_are_repeated_and_the_median_run_printed(capsys) -> None:
    import json

    from kubeplane.bench.scheduler import run_cli

    out = await run_cli("SchedulingBasic", nodes=5, pods=5, as_json=True, runs=2)
    printed = json.loads(capsys.readouterr().out)
    assert printed == out
    assert out["runs"] == 2 and len(out["throughput_avg_runs"]) == 2
    assert out["scheduled"] == 5 and not out["timed_out"]


async def test_profile_of_each_process_over_the_measured_phase(tmp_path) -> None:
    """--split --profile: the API process's and the scheduler process's profiles
    are written, and where their time went matches what each process runs."""
    import pstats

    out = await run_workload("SchedulingWithResourceClaimTemplate", nodes=4, pods=10, stall_timeout_s=10,
                             split=True, profile_prefix=str(tmp_path / "x-"))
    assert out["scheduled"] == 10 and not out["timed_out"]
    prof = out["profile"]
    assert set(prof) == {"api", "scheduler"}
    assert prof["api"]["file"] == str(tmp_path / "x-api.prof")
    assert prof["scheduler"]["file"] == str(tmp_path / "x-scheduler.prof")
    api, sched = prof["api"]["shares_percent"], prof["scheduler"]["shares_percent"]
    for parts in (api, sched):
        assert abs(sum(parts.values()) - 100.0) < 1.0
    for name in ("api", "scheduler"):
        assert 0.0 <= prof[name]["idle_percent"] < 100.0
    # the registry runs in the first process only, the DRA plugin in the second only
    assert api.get("API: registry, storage, watch", 0) > 0 and "DRA plugin and allocator" not in api
    assert sched.get("DRA plugin and allocator", 0) > 0 and "API: registry, storage, watch" not in sched
    funcs = {f[2] for f in pstats.Stats(prof["scheduler"]["file"]).stats}  # type: ignore[attr-defined]
    assert "schedule_one" in funcs or any("schedule" in f for f in funcs)


async def test_profile_in_one_process_and_printed(tmp_path, capsys) -> None:
    from kubeplane.bench.scheduler import run_cli

    out = await run_cli("SchedulingBasic", nodes=5, pods=5, runs=2, profile_dir=str(tmp_path / "p"))
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["run1-bench.prof", "run2-bench.prof"]
    assert set(out["profile"]) == {"bench"}
    printed = capsys.readouterr().out
    assert "bench process" in printed and "scheduler: framework, queue, cache, other plugins" in printed
