"""A queued pod and the queue's bookkeeping about it (upstream framework.QueuedPodInfo)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from kubeplane.api.meta import meta_of as _meta
from kubeplane.scheduler.framework.types import ClusterEvent

Obj = dict[str, Any]

DEFAULT_SCHEDULER_NAME = "default-scheduler"


def pod_key(pod: Obj) -> str:
    """``namespace/name``."""
    m = _meta(pod)
    return f"{m.get('namespace', '')}/{m.get('name', '')}"


def pod_uid(pod: Obj) -> str:
    """The pod's UID (falls back to its key for objects without one)."""
    return _meta(pod).get("uid") or pod_key(pod)


def pod_priority(pod: Obj) -> int:
    """``spec.priority``, 0 when unset."""
    return int((pod.get("spec") or {}).get("priority") or 0)


def scheduler_name(pod: Obj) -> str:
    """``spec.schedulerName`` with the API default."""
    return (pod.get("spec") or {}).get("schedulerName") or DEFAULT_SCHEDULER_NAME


@dataclass(eq=False)
class QueuedPodInfo:
    """A pod plus the queue's bookkeeping about it."""

    pod: Obj
    timestamp: float = 0.0
    initial_attempt_timestamp: float | None = None
    attempts: int = 0
    unschedulable_count: int = 0
    consecutive_errors_count: int = 0
    unschedulable_plugins: set[str] = field(default_factory=set)
    pending_plugins: set[str] = field(default_factory=set)
    gating_plugin: str | None = None
    gating_plugin_events: list[ClusterEvent] = field(default_factory=list)
    #: cached backoff expiry; None means "recompute"
    backoff_expiration: float | None = None
    #: insertion sequence; keeps activeQ FIFO among equal pods even with a frozen clock
    seq: int = 0
    _key: str = field(init=False, repr=False, default="")
    #: ``spec.priority`` (immutable in the API; cached for QueueSort)
    priority: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self._key = pod_key(self.pod)
        self.priority = pod_priority(self.pod)

    @property
    def pod_uid(self) -> str:
        return pod_uid(self.pod)

    @property
    def key(self) -> str:
        """``namespace/name`` (fixed for the pod's lifetime; cached)."""
        return self._key

    @property
    def gated(self) -> bool:
        """True while a PreEnqueue plugin keeps the pod out of activeQ."""
        return self.gating_plugin is not None

    @property
    def rejector_plugins(self) -> set[str]:
        """Unschedulable ∪ pending plugins of the last attempt."""
        return self.unschedulable_plugins | self.pending_plugins

    def update(self, new_pod: Obj) -> None:
        """Replace the pod object (same namespace/name)."""
        self.pod = new_pod
        self._key = pod_key(new_pod)
        self.priority = pod_priority(new_pod)


LessFn = Callable[[QueuedPodInfo, QueuedPodInfo], bool]
#: a QueueSort plugin's ordering as a key: ``a`` sorts before ``b`` iff key(a) < key(b)
SortKeyFn = Callable[[QueuedPodInfo], tuple]


def priority_less(a: QueuedPodInfo, b: QueuedPodInfo) -> bool:
    """PrioritySort: higher ``spec.priority`` first, then earlier timestamp."""
    pa, pb = a.priority, b.priority
    if pa != pb:
        return pa > pb
    return a.timestamp < b.timestamp


