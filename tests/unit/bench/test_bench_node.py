"""``kubeplane bench node``'s harness: the workload on a simulated node, and
the process measurements it takes of a real one."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from kubeplane.bench.node import node_processes, proc_cpu_seconds, proc_rss_bytes, run_node_bench, startup_pod
from kubeplane.cli.main import main


async def test_batches_on_a_simulated_node():
    out = await run_node_bench(counts=(3, 6), simulated=True, steady_s=0.1, in_flight=4)
    assert out["node"] == "simulated" and out["in_flight"] == 4
    assert [b["pods"] for b in out["batches"]] == [3, 6]
    for b in out["batches"]:
        assert b["ready"] == b["pods"] and not b["timed_out"]
        assert 0 < b["running_p50_ms"] <= b["running_p99_ms"]
        assert b["ready_p50_ms"] <= b["ready_p99_ms"] <= b["ready_max_ms"]
        assert b["pods_per_s"] > 0 and b["delete_s"] >= 0
        # no agent process to measure
        assert "agent_rss_mb" not in b


def test_startup_pod_is_pinned_and_pre_pulled():
    pod = startup_pod("p", "ns", "n1")
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "n1"}
    assert pod["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"


def test_process_measurements(tmp_path):
    marker = str(tmp_path / "data")
    os.makedirs(marker)
    # a busy child whose command line names the data directory, as containerd's does
    child = subprocess.Popen([sys.executable, "-c", "import sys\nwhile True: pass", marker])
    try:
        deadline = time.monotonic() + 20
        while (proc_cpu_seconds(child.pid) or 0.0) < 0.05 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc_cpu_seconds(child.pid) >= 0.05
        assert proc_rss_bytes(child.pid) > 1024 * 1024
        procs = node_processes(os.getpid(), marker)
        assert procs.agent == os.getpid() and procs.containerd == [] and procs.shims == []
    finally:
        child.kill()
        child.wait()
    assert proc_cpu_seconds(child.pid) is None and proc_rss_bytes(child.pid) is None


@pytest.mark.parametrize("args, hint", [(["--nodes", "2"], "--nodes"), (["--jobs", "3"], "--jobs"),
                                        (["--split"], "--split"), (["--storage", "sqlite"], "--storage")])
def test_cli_rejects_options_of_other_workloads(args, hint):
    r = CliRunner().invoke(main, ["bench", "node", *args])
    assert r.exit_code == 2 and hint in r.output and "does not apply to node" in r.output
