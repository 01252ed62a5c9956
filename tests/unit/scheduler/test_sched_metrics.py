"""Scheduler metrics: upstream names, labels, buckets, sampling and the HTTP endpoint."""

from __future__ import annotations

import random

from aiohttp.test_utils import TestClient, TestServer

from kubeplane.scheduler.framework.types import Code, Status
from kubeplane.scheduler.metrics import (
    PLUGIN_METRICS_SAMPLE_PERCENT, SchedulerMetrics, exponential_buckets, metrics_app,
    should_record_plugin_metrics, status_label,
)


def _value(m: SchedulerMetrics, name: str, labels: dict[str, str] | None = None) -> float | None:
    return m.registry.get_sample_value(name, labels or {})


def test_attempts_counter_and_duration_histogram() -> None:
    m = SchedulerMetrics()
    m.observe_attempt("scheduled", "default-scheduler", 0.003)
    m.observe_attempt("scheduled", "default-scheduler", 0.5)
    m.observe_attempt("unschedulable", "other", 0.02)
    labels = {"result": "scheduled", "profile": "default-scheduler"}
    assert _value(m, "scheduler_schedule_attempts_total", labels) == 2
    assert _value(m, "scheduler_schedule_attempts_total", {"result": "unschedulable", "profile": "other"}) == 1
    assert _value(m, "scheduler_schedule_attempts_total", {"result": "error", "profile": "other"}) is None
    h = "scheduler_scheduling_attempt_duration_seconds"
    assert _value(m, h + "_count", labels) == 2
    assert abs(_value(m, h + "_sum", labels) - 0.503) < 1e-9
    assert _value(m, h + "_bucket", {**labels, "le": "0.004"}) == 1
    assert _value(m, h + "_bucket", {**labels, "le": "16.384"}) == 2


def test_upstream_buckets() -> None:
    assert exponential_buckets(0.001, 2, 15)[-1] == 0.001 * 2**14
    m = SchedulerMetrics()
    m.observe_attempt("error", "p", 100.0)
    # the largest finite bucket is 0.001 * 2^14 = 16.384 s; 100 s only lands in +Inf
    labels = {"result": "error", "profile": "p"}
    assert _value(m, "scheduler_scheduling_attempt_duration_seconds_bucket", {**labels, "le": "16.384"}) == 0
    assert _value(m, "scheduler_scheduling_attempt_duration_seconds_bucket", {**labels, "le": "+Inf"}) == 1


def test_pending_gauge_and_incoming_counter() -> None:
    m = SchedulerMetrics()
    m.set_pending({"active": 3, "backoff": 1, "unschedulable": 2, "gated": 0})
    m.set_pending({"active": 5})
    assert _value(m, "scheduler_pending_pods", {"queue": "active"}) == 5
    assert _value(m, "scheduler_pending_pods", {"queue": "unschedulable"}) == 2
    m.inc_incoming("active", "PodAdd")
    m.inc_incoming("active", "PodAdd")
    m.inc_incoming("backoff", "ScheduleAttemptFailure")
    assert _value(m, "scheduler_queue_incoming_pods_total", {"queue": "active", "event": "PodAdd"}) == 2
    assert _value(m, "scheduler_queue_incoming_pods_total",
                  {"queue": "backoff", "event": "ScheduleAttemptFailure"}) == 1


def test_sli_plugin_and_extension_point() -> None:
    m = SchedulerMetrics()
    m.observe_sli(1, 0.2)
    m.observe_sli(3, 4.0)
    assert _value(m, "scheduler_pod_scheduling_sli_duration_seconds_count", {"attempts": "3"}) == 1
    assert _value(m, "scheduler_pod_scheduling_attempts_bucket", {"le": "2.0"}) == 1
    m.observe_plugin("NodeResourcesFit", "Filter", Status.unschedulable("Insufficient cpu"), 0.0001)
    m.observe_plugin("NodeResourcesFit", "Filter", None, 0.0001)
    m.observe_extension_point("Filter", Code.UNSCHEDULABLE_AND_UNRESOLVABLE, "p", 0.01)
    base = {"plugin": "NodeResourcesFit", "extension_point": "Filter"}
    assert _value(m, "scheduler_plugin_execution_duration_seconds_count", {**base, "status": "Unschedulable"}) == 1
    assert _value(m, "scheduler_plugin_execution_duration_seconds_count", {**base, "status": "Success"}) == 1
    assert _value(m, "scheduler_framework_extension_point_duration_seconds_count",
                  {"extension_point": "Filter", "status": "UnschedulableAndUnresolvable", "profile": "p"}) == 1


def test_status_label_names() -> None:
    assert status_label(None) == "Success"
    assert status_label(Status.skip()) == "Skip"
    assert status_label(Code.PENDING) == "Pending"
    assert status_label("Error") == "Error"


def test_plugin_metrics_sampled_about_ten_percent() -> None:
    rng = random.Random(42)
    hits = sum(should_record_plugin_metrics(rng) for _ in range(10_000))
    assert PLUGIN_METRICS_SAMPLE_PERCENT == 10
    assert 850 < hits < 1150
    assert [should_record_plugin_metrics(random.Random(7)) for _ in range(3)] == \
        [should_record_plugin_metrics(random.Random(7)) for _ in range(3)]


def test_registries_are_independent() -> None:
    a, b = SchedulerMetrics(), SchedulerMetrics()
    a.observe_attempt("scheduled", "p", 0.1)
    assert _value(b, "scheduler_schedule_attempts_total", {"result": "scheduled", "profile": "p"}) is None


async def test_metrics_and_healthz_endpoints() -> None:
    m = SchedulerMetrics()
    m.observe_attempt("scheduled", "default-scheduler", 0.01)
    m.set_pending({"active": 4})
    m.inc_incoming("active", "PodAdd")
    healthy = [True]
    async with TestClient(TestServer(metrics_app(m, lambda: healthy[0]))) as client:
        resp = await client.get("/metrics")
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
        assert 'scheduler_schedule_attempts_total{profile="default-scheduler",result="scheduled"} 1.0' in text
        assert 'scheduler_pending_pods{queue="active"} 4.0' in text
        assert 'scheduler_queue_incoming_pods_total{event="PodAdd",queue="active"} 1.0' in text
        for name in ("scheduler_scheduling_attempt_duration_seconds", "scheduler_pod_scheduling_sli_duration_seconds",
                     "scheduler_plugin_execution_duration_seconds",
                     "scheduler_framework_extension_point_duration_seconds"):
            assert f"# TYPE {name} histogram" in text
        resp = await client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        assert (await resp.text()).rstrip().endswith("# EOF")
        resp = await client.get("/healthz")
        assert resp.status == 200 and await resp.text() == "ok"
        healthy[0] = False
        resp = await client.get("/healthz")
        assert resp.status == 500
