"""Scheduler Prometheus metrics with upstream kube-scheduler names, labels and buckets.

Every :class:`SchedulerMetrics` owns its own ``CollectorRegistry`` so several
schedulers (tests, ``kubeplane up``) can coexist in one process.
:func:`metrics_app` serves ``/metrics`` (text exposition, or OpenMetrics when
asked for) and ``/healthz``.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Mapping

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.exposition import choose_encoder

# Upstream exposes no ``*_created`` series; neither do we.
disable_created_metrics()

from kubeplane.scheduler.framework.types import Code, Status

#: upstream records plugin execution durations for this share of scheduling cycles
PLUGIN_METRICS_SAMPLE_PERCENT = 10

SCHEDULED = "scheduled"
UNSCHEDULABLE = "unschedulable"
ERROR = "error"

#: the ``queue`` label values of scheduler_pending_pods
PENDING_QUEUES = ("active", "backoff", "unschedulable", "gated")

_CODE_NAMES = {
    Code.SUCCESS: "Success",
    Code.ERROR: "Error",
    Code.UNSCHEDULABLE: "Unschedulable",
    Code.UNSCHEDULABLE_AND_UNRESOLVABLE: "UnschedulableAndUnresolvable",
    Code.WAIT: "Wait",
    Code.SKIP: "Skip",
    Code.PENDING: "Pending",
}


def exponential_buckets(start: float, factor: float, count: int) -> list[float]:
    """``count`` bucket bounds ``start * factor**i`` (Prometheus' ExponentialBuckets)."""
    return [start * factor**i for i in range(count)]


def status_label(status: Status | Code | str | None) -> str:
    """The upstream ``status`` label: the code name (``Success`` for None)."""
    if status is None:
        return "Success"
    if isinstance(status, Status):
        status = status.code
    if isinstance(status, Code):
        return _CODE_NAMES[status]
    return str(status)


def should_record_plugin_metrics(rng: random.Random) -> bool:
    """Whether this scheduling cycle samples per-plugin durations (10% of cycles, as upstream)."""
    return rng.randrange(100) < PLUGIN_METRICS_SAMPLE_PERCENT


class SchedulerMetrics:
    """The scheduler's metrics in a dedicated registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.schedule_attempts = Counter(
            "scheduler_schedule_attempts",
            "Number of attempts to schedule pods, by the result. 'unschedulable' means a pod could not be "
            "scheduled, while 'error' means an internal scheduler problem.",
            ["result", "profile"], registry=r)
        self.scheduling_attempt_duration = Histogram(
            "scheduler_scheduling_attempt_duration_seconds",
            "Scheduling attempt latency in seconds (scheduling algorithm + binding)",
            ["result", "profile"], buckets=exponential_buckets(0.001, 2, 15), registry=r)
        self.pending_pods = Gauge(
            "scheduler_pending_pods",
            "Number of pending pods, by the queue type. 'active' means number of pods in activeQ; 'backoff' "
            "means number of pods in backoffQ; 'unschedulable' means number of pods in unschedulablePods that "
            "the scheduler attempted to schedule and failed; 'gated' is the number of unschedulable pods that "
            "the scheduler never attempted to schedule because they are gated.",
            ["queue"], registry=r)
        self.pod_scheduling_sli_duration = Histogram(
            "scheduler_pod_scheduling_sli_duration_seconds",
            "E2e latency for a pod being scheduled, from the time the pod enters the scheduling queue and "
            "might involve multiple scheduling attempts.",
            ["attempts"], buckets=exponential_buckets(0.01, 2, 20), registry=r)
        self.pod_scheduling_attempts = Histogram(
            "scheduler_pod_scheduling_attempts",
            "Number of attempts to successfully schedule a pod.",
            buckets=exponential_buckets(1, 2, 5), registry=r)
        self.plugin_execution_duration = Histogram(
            "scheduler_plugin_execution_duration_seconds",
            "Duration for running a plugin at a specific extension point.",
            ["plugin", "extension_point", "status"], buckets=exponential_buckets(0.00001, 1.5, 20), registry=r)
        self.framework_extension_point_duration = Histogram(
            "scheduler_framework_extension_point_duration_seconds",
            "Latency for running all plugins of a specific extension point.",
            ["extension_point", "status", "profile"], buckets=exponential_buckets(0.0001, 2, 12), registry=r)
        self.queue_incoming_pods = Counter(
            "scheduler_queue_incoming_pods",
            "Number of pods added to scheduling queues by event and queue type.",
            ["queue", "event"], registry=r)
        self.unschedulable_pods = Gauge(
            "scheduler_unschedulable_pods",
            "The number of unschedulable pods broken down by plugin name. A pod will increment the gauge for "
            "all plugins that caused it to not schedule and so this metric have meaning only when broken down "
            "by plugin.",
            ["plugin", "profile"], registry=r)
        self.preemption_attempts = Counter(
            "scheduler_preemption_attempts", "Total preemption attempts in the cluster till now", registry=r)
        self.preemption_victims = Histogram(
            "scheduler_preemption_victims", "Number of selected preemption victims",
            buckets=exponential_buckets(1, 2, 7), registry=r)
        self.cache_size = Gauge(
            "scheduler_scheduler_cache_size",
            "Number of nodes, pods, and assumed (bound) pods in the scheduler cache.", ["type"], registry=r)

    # ------------------------------------------------------------------ driver hooks

    def observe_attempt(self, result: str, profile: str, seconds: float) -> None:
        """One scheduling attempt ended with ``result`` (scheduled, unschedulable or error)."""
        self.schedule_attempts.labels(result, profile).inc()
        self.scheduling_attempt_duration.labels(result, profile).observe(seconds)

    def set_pending(self, counts: Mapping[str, int]) -> None:
        """Set scheduler_pending_pods for the given queues (active, backoff, unschedulable, gated)."""
        for queue, n in counts.items():
            self.pending_pods.labels(queue).set(n)

    def observe_sli(self, attempts: int, seconds: float) -> None:
        """A pod was scheduled after ``attempts`` attempts, ``seconds`` after it was first queued."""
        self.pod_scheduling_sli_duration.labels(str(attempts)).observe(seconds)
        self.pod_scheduling_attempts.observe(attempts)

    def observe_plugin(self, plugin: str, point: str, status: Status | Code | str | None, seconds: float) -> None:
        """One plugin call; call only in cycles where :func:`should_record_plugin_metrics` said yes."""
        self.plugin_execution_duration.labels(plugin, point, status_label(status)).observe(seconds)

    def observe_extension_point(
        self, point: str, status: Status | Code | str | None, profile: str, seconds: float
    ) -> None:
        """All plugins of one extension point ran in ``seconds``."""
        self.framework_extension_point_duration.labels(point, status_label(status), profile).observe(seconds)

    def inc_incoming(self, queue: str, event: str) -> None:
        """A pod entered ``queue`` (active, backoff, unschedulable, gated) because of ``event``."""
        self.queue_incoming_pods.labels(queue, event).inc()

    def set_unschedulable(self, plugin: str, profile: str, n: int) -> None:
        self.unschedulable_pods.labels(plugin, profile).set(n)

    def observe_preemption(self, victims: int) -> None:
        """One preemption attempt that selected ``victims`` pods."""
        self.preemption_attempts.inc()
        self.preemption_victims.observe(victims)

    def set_cache_size(self, nodes: int, pods: int, assumed_pods: int) -> None:
        self.cache_size.labels("nodes").set(nodes)
        self.cache_size.labels("pods").set(pods)
        self.cache_size.labels("assumed_pods").set(assumed_pods)

    # ------------------------------------------------------------------ exposition

    def exposition(self, accept: str = "") -> tuple[bytes, str]:
        """Encoded metrics and their content type, chosen from an Accept header."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type


def metrics_app(
    metrics: SchedulerMetrics, health_check: Callable[[], bool] | None = None,
    configz: Mapping[str, Any] | None = None,
) -> web.Application:
    """An aiohttp app serving ``GET /metrics`` and ``GET /healthz`` (also ``/livez``, ``/readyz``),
    and ``GET /configz`` (the effective configuration, ``{"componentconfig": {...}}``) when given.

    ``health_check`` returning False makes the health endpoints answer 500.
    Authorization does not exist yet: once it does, these endpoints are
    restricted as upstream's (``system:monitoring`` for /metrics).
    """

    async def handle_metrics(request: web.Request) -> web.Response:
        body, content_type = metrics.exposition(request.headers.get("Accept", ""))
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def handle_health(request: web.Request) -> web.Response:
        ok = health_check() if health_check is not None else True
        if ok:
            return web.Response(text="ok")
        return web.Response(status=500, text=f"{request.path.lstrip('/')} check failed")

    async def handle_configz(request: web.Request) -> web.Response:
        import orjson

        return web.Response(body=orjson.dumps(configz), headers={"Content-Type": "application/json"})

    app = web.Application()
    app.router.add_get("/metrics", handle_metrics)
    if configz is not None:
        app.router.add_get("/configz", handle_configz)
    for path in ("/healthz", "/livez", "/readyz"):
        app.router.add_get(path, handle_health)
    return app


__all__ = [
    "ERROR", "PENDING_QUEUES", "PLUGIN_METRICS_SAMPLE_PERCENT", "SCHEDULED", "SchedulerMetrics", "UNSCHEDULABLE",
    "exponential_buckets", "metrics_app", "should_record_plugin_metrics", "status_label",
]
