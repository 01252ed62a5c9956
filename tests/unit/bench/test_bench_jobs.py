"""The JobChurn benchmark runs Jobs to completion on a whole in-process cluster."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from kubeplane.bench.jobs import churn_job, run_job_churn
from kubeplane.cli.main import main


def test_churn_job_shape() -> None:
    job = churn_job("churn-0")
    spec = job["spec"]
    assert spec["completions"] == spec["parallelism"] == 10
    assert spec["template"]["metadata"]["annotations"] == {"kubeplane.io/exit-after": "1"}


async def test_job_churn_measures_every_job() -> None:
    seen: list[int] = []
    out = await run_job_churn(jobs=4, in_flight=2, nodes=1, progress=lambda done, total: seen.append(done))
    assert out["completed"] == 4 and not out["timed_out"]
    assert seen == [1, 2, 3, 4]
    # Each Job's pods run for 1 s: no Job completes faster than that.
    assert 1000 <= out["latency_p50_ms"] <= out["latency_p99_ms"]
    assert out["jobs_per_s"] > 0 and out["pods_per_s"] == pytest.approx(out["jobs_per_s"] * 10, rel=0.05)


def test_cli_rejects_options_of_other_workloads() -> None:
    res = CliRunner().invoke(main, ["bench", "JobChurn", "--pods", "5"])
    assert res.exit_code == 2 and "does not apply to JobChurn" in res.output
    res = CliRunner().invoke(main, ["bench", "SchedulingBasic", "--jobs", "5"])
    assert res.exit_code == 2 and "applies to JobChurn only" in res.output
