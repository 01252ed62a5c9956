"""Shared by the hint-scope tests: a settable clock for the queue, a hint
wrapper counting its calls, and what two queues must agree on."""

from __future__ import annotations

from typing import Any, Callable

from kubeplane.scheduler.framework.types import QueueingHint
from kubeplane.scheduler.queue import SchedulingQueue, hint_scope


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def counting(fn: Callable[..., QueueingHint], calls: list[int]) -> Callable[..., QueueingHint]:
    def wrapped(pod: dict, old: Any, new: Any) -> QueueingHint:
        calls[0] += 1
        return fn(pod, old, new)
    scope = hint_scope(fn)
    if scope is not None:
        wrapped.queue_scope = scope  # type: ignore[attr-defined]
    return wrapped


def snapshot(q: SchedulingQueue, key: str = "name") -> tuple:
    """What must be identical between the scoped and the plain queue (pods by metadata ``key``)."""
    pods, _ = q.pending_pods()
    return ([p["metadata"][key] for p in pods], q.counts(), dict(q.incoming_pods),
            [p["metadata"][key] for p in q.in_flight_pods()], len(q.in_flight_events()))
