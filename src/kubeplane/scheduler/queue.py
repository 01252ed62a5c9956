"""The scheduling queue, with upstream kube-scheduler's PriorityQueue semantics.

Three places hold pending pods:

* ``activeQ``: heap ordered by the profile's QueueSort ``less``; ``pop`` takes
  its head and blocks while it is empty.
* ``backoffQ``: heaps ordered by backoff expiry, one for pods rejected by
  plugins and one for pods that failed with an error (no rejector plugin).
* ``unschedulablePods``: a map of pods waiting for a cluster event that may
  make them schedulable (or for the periodic flush), including gated pods
  that failed PreEnqueue.

Popped pods are "in flight" until ``done`` (or ``add_unschedulable_if_not_present``).
With queueing hints enabled, cluster events arriving while any pod is in
flight are logged, and replayed through the hints of the rejecting plugins
when that pod comes back, so no event that could help it is lost. The log only
keeps events that some in-flight pod may still need.

For a cluster event, unschedulablePods are pre-selected through the hints'
scopes (:class:`HintScope`): pods whose rejectors' matching hints certainly
answer Skip are not visited at all.

Heaps are keyed by ``namespace/name`` as upstream; in-flight tracking and the
nominator by UID. All state is guarded by one re-entrant lock, so methods may
be called from worker threads; ``pop`` must be awaited on one event loop.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import heapq
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Hashable, Iterable, Iterator, Optional

from kubeplane.api.quantity import parse_quantity
from kubeplane.scheduler.framework.types import (
    FORCE_ACTIVATE,
    UNSCHEDULABLE_TIMEOUT,
    ActionType,
    ClusterEvent,
    ClusterEventWithHint,
    EventResource,
    QueueingHint,
    Status,
)
from kubeplane.scheduler.framework.hintscope import HintScope, hint_scope
from kubeplane.scheduler.nominator import Nominator, PodGetter

log = logging.getLogger(__name__)

Obj = dict[str, Any]

DEFAULT_SCHEDULER_NAME = "default-scheduler"

#: Backoff expiries are grouped in windows of this size when popping from backoffQ is enabled.
BACKOFF_ORDERING_WINDOW = 1.0

# Queue names (metrics label values and return values of internal moves).
ACTIVE_Q = "active"
BACKOFF_Q = "backoff"
UNSCHEDULABLE_Q = "unschedulable"
GATED = "gated"

# Event labels used for the incoming-pods metric, as upstream.
SCHEDULE_ATTEMPT_FAILURE = "ScheduleAttemptFailure"
BACKOFF_COMPLETE = "BackoffComplete"
POP_FROM_BACKOFF_Q = "PopFromBackoffQ"
FORCE_ACTIVATE_LABEL = "ForceActivate"

EVENT_UNSCHEDULED_POD_ADD = ClusterEvent(EventResource.UNSCHEDULED_POD, ActionType.ADD, "UnscheduledPodAdd")
EVENT_UNSCHEDULED_POD_UPDATE = ClusterEvent(EventResource.UNSCHEDULED_POD, ActionType.UPDATE, "UnscheduledPodUpdate")
EVENT_UNSCHEDULED_POD_DELETE = ClusterEvent(EventResource.UNSCHEDULED_POD, ActionType.DELETE, "UnscheduledPodDelete")
EVENT_ASSIGNED_POD_ADD = ClusterEvent(EventResource.ASSIGNED_POD, ActionType.ADD, "AssignedPodAdd")
EVENT_ASSIGNED_POD_UPDATE = ClusterEvent(EventResource.ASSIGNED_POD, ActionType.UPDATE, "AssignedPodUpdate")
EVENT_ASSIGNED_POD_DELETE = ClusterEvent(EventResource.ASSIGNED_POD, ActionType.DELETE, "AssignedPodDelete")

#: Plugins whose rejections an assigned pod add/update may resolve (see ``assigned_pod_added``).
CROSS_TOPOLOGY_PLUGINS = ("InterPodAffinity", "PodTopologySpread")

_POD_SCALE_DOWN = ClusterEvent(EventResource.POD, ActionType.UPDATE_POD_SCALE_DOWN)


#: bound of the per-event memo tables (distinct events are few; cleared when exceeded)
_MATCH_CACHE_SIZE = 4096

class QueueingStrategy(enum.IntEnum):
    """Where a pod goes when it leaves unschedulablePods (or comes back from a cycle)."""

    SKIP = 0
    AFTER_BACKOFF = 1
    IMMEDIATELY = 2


def event_label(event: ClusterEvent) -> str:
    """Upstream-style label: the custom label, else resource + action (``NodeAdd``)."""
    if event.label:
        return event.label
    name = event.action.name or str(int(event.action))
    action = "".join(part.capitalize() for part in name.split("_"))
    return f"{event.resource.value}{action}"


def match_event(registered: ClusterEvent, incoming: ClusterEvent) -> bool:
    """Whether a registered event covers an incoming one (upstream MatchClusterEvents).

    An incoming wildcard event (e.g. UnschedulableTimeout) only matches a
    registration on the wildcard resource.
    """
    if registered.is_wildcard():
        return True
    if incoming.resource == EventResource.WILDCARD and registered.resource != EventResource.WILDCARD:
        return False
    return registered.matches(incoming)


from kubeplane.api.meta import meta_of as _meta  # noqa: E402 - the shared helper


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
PreEnqueueFn = Callable[[Obj], Optional[Status]]
PreCheck = Callable[[Obj], bool]


def priority_less(a: QueuedPodInfo, b: QueuedPodInfo) -> bool:
    """PrioritySort: higher ``spec.priority`` first, then earlier timestamp."""
    pa, pb = a.priority, b.priority
    if pa != pb:
        return pa > pb
    return a.timestamp < b.timestamp


@dataclass
class QueueProfile:
    """What the queue needs from one scheduling profile."""

    pre_enqueue: list[tuple[str, PreEnqueueFn]] = field(default_factory=list)
    #: plugin name -> the events it registered (with optional hint functions)
    hints: dict[str, list[ClusterEventWithHint]] = field(default_factory=dict)
    less: LessFn = priority_less
    #: the same order as ``less`` as a key function, when the plugin offers one
    sort_key: SortKeyFn | None = None


class _Heap:
    """Binary heap ordered by ``lt``, with O(log n) update/delete by key (see
    :class:`_KeyedHeap` for activeQ under a QueueSort plugin with a sort key)."""

    __slots__ = ("_items", "_pos", "_lt")

    def __init__(self, lt: Callable[[QueuedPodInfo, QueuedPodInfo], bool]) -> None:
        self._items: list[QueuedPodInfo] = []
        self._pos: dict[str, int] = {}
        self._lt = lt

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: str) -> bool:
        return key in self._pos

    def get(self, key: str) -> QueuedPodInfo | None:
        i = self._pos.get(key)
        return None if i is None else self._items[i]

    def peek(self) -> QueuedPodInfo | None:
        return self._items[0] if self._items else None

    def list(self) -> list[QueuedPodInfo]:
        return list(self._items)

    def add_or_update(self, item: QueuedPodInfo) -> None:
        key = item.key
        i = self._pos.get(key)
        if i is None:
            self._items.append(item)
            i = len(self._items) - 1
            self._pos[key] = i
            self._up(i)
        else:
            self._items[i] = item
            self._fix(i)

    def pop(self) -> QueuedPodInfo | None:
        if not self._items:
            return None
        return self._remove_at(0)

    def delete(self, key: str) -> QueuedPodInfo | None:
        i = self._pos.get(key)
        return None if i is None else self._remove_at(i)

    def _remove_at(self, i: int) -> QueuedPodInfo:
        items = self._items
        item = items[i]
        del self._pos[item.key]
        last = items.pop()
        if i < len(items):
            items[i] = last
            self._pos[last.key] = i
            self._fix(i)
        return item

    def _fix(self, i: int) -> None:
        if not self._up(i):
            self._down(i)

    def _up(self, i: int) -> bool:
        items, pos, lt = self._items, self._pos, self._lt
        item = items[i]
        moved = False
        while i > 0:
            parent = (i - 1) >> 1
            if not lt(item, items[parent]):
                break
            items[i] = items[parent]
            pos[items[i].key] = i
            i = parent
            moved = True
        items[i] = item
        pos[item.key] = i
        return moved

    def _down(self, i: int) -> None:
        items, pos, lt = self._items, self._pos, self._lt
        n = len(items)
        item = items[i]
        while True:
            child = 2 * i + 1
            if child >= n:
                break
            right = child + 1
            if right < n and lt(items[right], items[child]):
                child = right
            if not lt(items[child], item):
                break
            items[i] = items[child]
            pos[items[i].key] = i
            i = child
        items[i] = item
        pos[item.key] = i


class _KeyedHeap:
    """activeQ when the QueueSort plugin offers a sort key: a heapq of
    ``(key, n, pod key, item)`` entries, so sifting runs in C. An update or a
    delete leaves the old entry behind; it is skipped when it reaches the top
    and dropped when stale entries come to outnumber live ones. Same interface
    as :class:`_Heap` (``list`` in no particular order)."""

    __slots__ = ("_heap", "_live", "_keyfn", "_n")

    def __init__(self, keyfn: Callable[[QueuedPodInfo], tuple]) -> None:
        self._heap: list[tuple[tuple, int, str, QueuedPodInfo]] = []
        self._live: dict[str, tuple[tuple, int, str, QueuedPodInfo]] = {}
        self._keyfn = keyfn
        self._n = 0

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, key: str) -> bool:
        return key in self._live

    def get(self, key: str) -> QueuedPodInfo | None:
        e = self._live.get(key)
        return None if e is None else e[3]

    def peek(self) -> QueuedPodInfo | None:
        heap, live = self._heap, self._live
        while heap and live.get(heap[0][2]) is not heap[0]:
            heapq.heappop(heap)
        return heap[0][3] if heap else None

    def list(self) -> list[QueuedPodInfo]:
        return [e[3] for e in self._live.values()]

    def add_or_update(self, item: QueuedPodInfo) -> None:
        k = self._keyfn(item)
        self._n += 1
        e = (k, self._n, item.key, item)
        self._live[item.key] = e
        heapq.heappush(self._heap, e)
        self._compact()

    def pop(self) -> QueuedPodInfo | None:
        heap, live = self._heap, self._live
        while heap:
            e = heapq.heappop(heap)
            if live.get(e[2]) is e:
                del live[e[2]]
                return e[3]
        return None

    def delete(self, key: str) -> QueuedPodInfo | None:
        e = self._live.pop(key, None)
        if e is None:
            return None
        self._compact()
        return e[3]

    def _compact(self) -> None:
        if len(self._heap) > 2 * len(self._live) + 64:
            self._heap = list(self._live.values())
            heapq.heapify(self._heap)


_Group = tuple[str, frozenset[str]]


class _UnschedulablePods:
    """Map key -> pod info, counting gated pods separately for metrics.

    For event handling, pods are also filed by group (scheduler name,
    rejector plugins) and, per hint scope, under the keys the scope gives
    them (see :class:`HintScope`). ``order`` numbers keys in insertion order
    (the order of ``pods``). Pod infos in the map may only change through
    the queue, which calls :meth:`refresh` after changing one in place.
    """

    __slots__ = ("pods", "gated", "scopes", "order", "groups", "by_key", "unkeyed", "_seq", "_filed")

    def __init__(self, scopes: Iterable[HintScope] = ()) -> None:
        self.pods: dict[str, QueuedPodInfo] = {}
        self.gated: set[str] = set()
        self.scopes: tuple[HintScope, ...] = tuple(scopes)
        self.order: dict[str, int] = {}
        self.groups: dict[_Group, set[str]] = {}
        #: (scope position, key) -> pod keys
        self.by_key: dict[tuple[int, Hashable], set[str]] = {}
        #: pods whose scope keys could not be computed (always candidates)
        self.unkeyed: set[str] = set()
        self._seq = 0
        self._filed: dict[str, tuple[_Group, list[tuple[int, Hashable]] | None]] = {}

    def __len__(self) -> int:
        return len(self.pods)

    def get(self, key: str) -> QueuedPodInfo | None:
        return self.pods.get(key)

    def add_or_update(self, pinfo: QueuedPodInfo) -> None:
        key = pinfo.key
        if key in self.pods:
            self._unfile(key)
        else:
            self._seq += 1
            self.order[key] = self._seq
        self.pods[key] = pinfo
        if pinfo.gated:
            self.gated.add(key)
        else:
            self.gated.discard(key)
        self._file(key, pinfo)

    def delete(self, key: str) -> QueuedPodInfo | None:
        self.gated.discard(key)
        pinfo = self.pods.pop(key, None)
        if pinfo is not None:
            self._unfile(key)
            del self.order[key]
        return pinfo

    def refresh(self, pinfo: QueuedPodInfo) -> None:
        """File ``pinfo`` again if it is the info held for its key (it changed in place)."""
        key = pinfo.key
        if self.pods.get(key) is pinfo:
            self._unfile(key)
            self._file(key, pinfo)

    def _file(self, key: str, pinfo: QueuedPodInfo) -> None:
        group = (scheduler_name(pinfo.pod), frozenset(pinfo.unschedulable_plugins | pinfo.pending_plugins))
        self.groups.setdefault(group, set()).add(key)
        keys: list[tuple[int, Hashable]] | None = None
        if self.scopes:
            keys = []
            try:
                for i, scope in enumerate(self.scopes):
                    for k in scope.pod_keys(pinfo.pod):
                        hash(k)
                        keys.append((i, k))
            except Exception:  # malformed pod or unhashable key: never left out
                keys = None
                self.unkeyed.add(key)
            else:
                for k in keys:
                    self.by_key.setdefault(k, set()).add(key)
        self._filed[key] = (group, keys)

    def _unfile(self, key: str) -> None:
        filed = self._filed.pop(key, None)
        if filed is None:
            return
        group, keys = filed
        members = self.groups.get(group)
        if members is not None:
            members.discard(key)
            if not members:
                del self.groups[group]
        if keys is None:
            self.unkeyed.discard(key)
            return
        for k in keys:
            members = self.by_key.get(k)
            if members is not None:
                members.discard(key)
                if not members:
                    del self.by_key[k]


_POD, _EVENT = 0, 1


class _InFlightLog:
    """Popped pods and the events received while any of them was in flight.

    Entries are ``(seq, kind, a, b, c)``: for a pod ``a`` is its UID and ``b``
    the pod; for an event ``a`` is the ClusterEvent, ``b``/``c`` old/new objects.
    A finished pod's entry is dropped lazily once it reaches the head.
    """

    def __init__(self) -> None:
        self._entries: collections.deque[tuple[int, int, Any, Any, Any]] = collections.deque()
        self._pods: dict[str, int] = {}
        self._seq = 0

    def __contains__(self, uid: str) -> bool:
        return uid in self._pods

    def __len__(self) -> int:
        return len(self._pods)

    def add_pod(self, uid: str, pod: Obj) -> None:
        self._seq += 1
        self._pods[uid] = self._seq
        self._entries.append((self._seq, _POD, uid, pod, None))

    def add_event(self, event: ClusterEvent, old: Any, new: Any) -> None:
        self._seq += 1
        self._entries.append((self._seq, _EVENT, event, old, new))

    def events_since(self, uid: str) -> list[tuple[ClusterEvent, Any, Any]] | None:
        start = self._pods.get(uid)
        if start is None:
            return None
        return [(e[2], e[3], e[4]) for e in self._entries if e[1] == _EVENT and e[0] > start]

    def done(self, uid: str) -> None:
        if self._pods.pop(uid, None) is None:
            return
        entries, pods = self._entries, self._pods
        while entries:
            seq, kind, a, _, _ = entries[0]
            if kind == _POD and pods.get(a) == seq:
                break
            entries.popleft()

    def pods(self) -> list[Obj]:
        return [e[3] for e in self._entries if e[1] == _POD and self._pods.get(e[2]) == e[0]]

    def events(self) -> list[tuple[ClusterEvent, Any, Any]]:
        return [(e[2], e[3], e[4]) for e in self._entries if e[1] == _EVENT]

    def clear(self) -> None:
        self._pods.clear()
        self._entries.clear()


# --------------------------------------------------------------------------------------------
# Pod update classification (upstream PodSchedulingPropertiesChange)


def _parse_qty(v: Any) -> Fraction | None:
    try:
        return parse_quantity(v)
    except Exception:  # malformed quantities are ignored here; validation rejects them
        return None


def _container_requests(c: Obj) -> dict[str, Fraction]:
    out: dict[str, Fraction] = {}
    for name, v in (((c.get("resources") or {}).get("requests")) or {}).items():
        q = _parse_qty(v)
        if q is not None:
            out[name] = q
    return out


def _add_into(dst: dict[str, Fraction], src: dict[str, Fraction]) -> None:
    for k, v in src.items():
        dst[k] = dst.get(k, Fraction(0)) + v


def _max_into(dst: dict[str, Fraction], src: dict[str, Fraction]) -> None:
    for k, v in src.items():
        if k not in dst or v > dst[k]:
            dst[k] = v


def pod_requests(pod: Obj) -> dict[str, Fraction]:
    """Effective pod requests: containers + sidecars, max with init steps, plus overhead."""
    spec = pod.get("spec") or {}
    reqs: dict[str, Fraction] = {}
    for c in spec.get("containers") or ():
        _add_into(reqs, _container_requests(c))
    sidecars: dict[str, Fraction] = {}
    init_max: dict[str, Fraction] = {}
    for c in spec.get("initContainers") or ():
        r = _container_requests(c)
        if c.get("restartPolicy") == "Always":
            _add_into(reqs, r)
            _add_into(sidecars, r)
            step = dict(sidecars)
        else:
            step = dict(r)
            _add_into(step, sidecars)
        _max_into(init_max, step)
    _max_into(reqs, init_max)
    overhead: dict[str, Fraction] = {}
    for name, v in (spec.get("overhead") or {}).items():
        q = _parse_qty(v)
        if q is not None:
            overhead[name] = q
    if overhead:
        _add_into(reqs, overhead)
    return reqs


#: the parts of a pod spec ``pod_requests`` reads
_REQUEST_FIELDS = ("containers", "initContainers", "overhead")


def _is_scale_down(new_pod: Obj, old_pod: Obj) -> bool:
    new_spec, old_spec = new_pod.get("spec") or {}, old_pod.get("spec") or {}
    if all(new_spec.get(f) == old_spec.get(f) for f in _REQUEST_FIELDS):
        return False  # the same requests (most updates change only metadata or status)
    new_reqs = pod_requests(new_pod)
    for name, old_v in pod_requests(old_pod).items():
        new_v = new_reqs.get(name)
        if new_v is None or old_v > new_v:
            return True
    return False


def pod_update_events(old_pod: Obj, new_pod: Obj) -> list[ClusterEvent]:
    """Classify a pod update into UpdatePodXYZ events (UnscheduledPod or AssignedPod resource)."""
    new_spec = new_pod.get("spec") or {}
    old_spec = old_pod.get("spec") or {}
    resource = EventResource.ASSIGNED_POD if new_spec.get("nodeName") else EventResource.UNSCHEDULED_POD
    actions: list[ActionType] = []
    if (_meta(new_pod).get("labels") or {}) != (_meta(old_pod).get("labels") or {}):
        actions.append(ActionType.UPDATE_POD_LABEL)
    if _is_scale_down(new_pod, old_pod):
        actions.append(ActionType.UPDATE_POD_SCALE_DOWN)
    if old_spec.get("schedulingGates") and not new_spec.get("schedulingGates"):
        actions.append(ActionType.UPDATE_POD_SCHEDULING_GATES_ELIMINATED)
    if (new_spec.get("tolerations") or []) != (old_spec.get("tolerations") or []):
        actions.append(ActionType.UPDATE_POD_TOLERATIONS)
    old_claims = (old_pod.get("status") or {}).get("resourceClaimStatuses") or []
    new_claims = (new_pod.get("status") or {}).get("resourceClaimStatuses") or []
    if old_claims != new_claims:
        actions.append(ActionType.UPDATE_POD_GENERATED_RESOURCE_CLAIM)
    if not actions:
        actions.append(ActionType.UPDATED_POD_OTHER)
    return [ClusterEvent(resource, a) for a in actions]


def is_pod_updated(old_pod: Obj, new_pod: Obj) -> bool:
    """Whether anything but status/resourceVersion/generation/managedFields/finalizers changed."""

    def strip(p: Obj) -> Obj:
        meta = {k: v for k, v in _meta(p).items()
                if k not in ("resourceVersion", "generation", "managedFields", "finalizers")}
        out = {k: v for k, v in p.items() if k not in ("metadata", "status")}
        out["metadata"] = meta
        status = p.get("status") or {}
        out["status"] = {k: status[k] for k in ("resourceClaimStatuses", "extendedResourceClaimStatus") if k in status}
        return out

    return strip(old_pod) != strip(new_pod)


# --------------------------------------------------------------------------------------------


class SchedulingQueue:
    """activeQ + backoffQ + unschedulablePods + in-flight tracking (upstream PriorityQueue)."""

    def __init__(
        self,
        profiles: dict[str, QueueProfile],
        *,
        clock: Callable[[], float] = time.monotonic,
        initial_backoff: float = 1.0,
        max_backoff: float = 10.0,
        max_unschedulable_duration: float = 300.0,
        flush_backoff_interval: float = 1.0,
        flush_unschedulable_interval: float = 30.0,
        queueing_hints_enabled: bool = True,
        pop_from_backoff: bool = False,
        pod_getter: PodGetter | None = None,
    ) -> None:
        if not profiles:
            raise ValueError("at least one profile is required")
        self._profiles = dict(profiles)
        self._clock = clock
        self._initial_backoff = float(initial_backoff)
        self._max_backoff = float(max_backoff)
        self._max_unschedulable_duration = float(max_unschedulable_duration)
        self._flush_backoff_interval = float(flush_backoff_interval)
        self._flush_unschedulable_interval = float(flush_unschedulable_interval)
        self._hints_enabled = queueing_hints_enabled
        self._pop_from_backoff = pop_from_backoff

        # Per profile: flattened hint registrations and plugin -> events.
        self._hint_entries: dict[str, list[tuple[ClusterEvent, str, Any]]] = {}
        self._plugin_events: dict[str, dict[str, list[ClusterEvent]]] = {}
        for name, prof in self._profiles.items():
            entries: list[tuple[ClusterEvent, str, Any]] = []
            per_plugin: dict[str, list[ClusterEvent]] = {}
            for plugin, regs in prof.hints.items():
                for reg in regs:
                    entries.append((reg.event, plugin, reg.hint))
                    per_plugin.setdefault(plugin, []).append(reg.event)
            self._hint_entries[name] = entries
            self._plugin_events[name] = per_plugin
        self._all_registered: list[ClusterEvent] = [e for es in self._hint_entries.values() for e, _, _ in es]
        scopes: dict[int, HintScope] = {}
        for es in self._hint_entries.values():
            for _, _, hint_fn in es:
                scope = hint_scope(hint_fn)
                if scope is not None:
                    scopes.setdefault(id(scope), scope)
        self._scopes: list[HintScope] = list(scopes.values())
        self._scope_pos: dict[int, int] = {id(sc): i for i, sc in enumerate(self._scopes)}
        #: pick event candidates through hint scopes (False: every unschedulable pod, for comparisons)
        self._use_scopes = True
        self._plan_cache: dict[tuple[_Group, ClusterEvent], tuple[int, ...] | None] = {}
        self._interest_cache: dict[ClusterEvent, bool] = {}
        self._match_cache: dict[tuple[str, ClusterEvent], list[tuple[str, Any]]] = {}

        # All profiles share one QueueSort (upstream requires it); the first one's is used.
        less = next(iter(self._profiles.values())).less
        self._less = less

        def active_lt(a: QueuedPodInfo, b: QueuedPodInfo) -> bool:
            if less(a, b):
                return True
            if less(b, a):
                return False
            return a.seq < b.seq

        sort_key = next(iter(self._profiles.values())).sort_key
        if sort_key is not None:
            self._active: _Heap | _KeyedHeap = _KeyedHeap(lambda p: (*sort_key(p), p.seq))
        else:
            self._active = _Heap(active_lt)
        self._backoff = _Heap(self._backoff_lt_with_priority if pop_from_backoff else self._backoff_lt)
        self._error_backoff = _Heap(self._backoff_lt)
        self._unschedulable = _UnschedulablePods(self._scopes)
        self._in_flight = _InFlightLog()
        self.nominator = Nominator(pod_getter)

        self._lock = threading.RLock()
        self._cycle = 0
        self._move_request_cycle = -1
        self._seq = 0
        self._closed = False
        self._wakeup: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        #: (queue, event label) -> number of pods that entered that queue
        self.incoming_pods: collections.Counter[tuple[str, str]] = collections.Counter()

    # ---------------------------------------------------------------- properties / introspection

    @property
    def scheduling_cycle(self) -> int:
        """Number of pops so far."""
        with self._lock:
            return self._cycle

    @property
    def closed(self) -> bool:
        return self._closed

    def counts(self) -> dict[str, int]:
        """Pending pods per queue (``scheduler_pending_pods`` labels)."""
        with self._lock:
            gated = len(self._unschedulable.gated)
            return {
                ACTIVE_Q: len(self._active),
                BACKOFF_Q: len(self._backoff) + len(self._error_backoff),
                UNSCHEDULABLE_Q: len(self._unschedulable) - gated,
                GATED: gated,
            }

    def pending_pods(self) -> tuple[list[Obj], str]:
        """All queued pods and an upstream-style summary string."""
        with self._lock:
            active = [p.pod for p in self._active.list()]
            backoff = [p.pod for p in self._backoff.list() + self._error_backoff.list()]
            unsched = [p.pod for p in self._unschedulable.pods.values()]
            summary = f"activeQ:{len(active)}; backoffQ:{len(backoff)}; unschedulablePods:{len(unsched)}"
            return active + backoff + unsched, summary

    def pods_in_active_q(self) -> list[Obj]:
        with self._lock:
            return [p.pod for p in self._active.list()]

    def pods_in_backoff_q(self) -> list[Obj]:
        with self._lock:
            return [p.pod for p in self._backoff.list() + self._error_backoff.list()]

    def unschedulable_pods(self) -> list[Obj]:
        with self._lock:
            return [p.pod for p in self._unschedulable.pods.values()]

    def in_flight_pods(self) -> list[Obj]:
        with self._lock:
            return self._in_flight.pods()

    def in_flight_events(self) -> list[tuple[ClusterEvent, Any, Any]]:
        """Logged events, oldest first, as ``(event, old, new)``."""
        with self._lock:
            return self._in_flight.events()

    def get(self, pod: Obj) -> QueuedPodInfo | None:
        """The queued info for a pod (by namespace/name), from any of the three queues."""
        with self._lock:
            key = pod_key(pod)
            return self._active.get(key) or self._backoff.get(key) or self._error_backoff.get(key) \
                or self._unschedulable.get(key)

    def locate(self, pod: Obj) -> str | None:
        """Which queue holds the pod: ``active``, ``backoff``, ``unschedulable``, ``gated``, ``in_flight`` or None."""
        with self._lock:
            key = pod_key(pod)
            if key in self._active:
                return ACTIVE_Q
            if key in self._backoff or key in self._error_backoff:
                return BACKOFF_Q
            pinfo = self._unschedulable.get(key)
            if pinfo is not None:
                return GATED if pinfo.gated else UNSCHEDULABLE_Q
            if pod_uid(pod) in self._in_flight:
                return "in_flight"
            return None

    # ---------------------------------------------------------------- backoff

    def backoff_duration(self, pinfo: QueuedPodInfo) -> float:
        """``min(initial * 2**(count-1), max)``; count = consecutive errors if any, else unschedulable count."""
        count = pinfo.consecutive_errors_count if pinfo.consecutive_errors_count > 0 else pinfo.unschedulable_count
        if count <= 0 or self._max_backoff <= 0:
            return 0.0
        duration = self._initial_backoff
        for _ in range(count - 1):
            if duration >= self._max_backoff - duration:
                return self._max_backoff
            duration += duration
        return min(duration, self._max_backoff)

    def _align(self, t: float) -> float:
        if not self._pop_from_backoff:
            return t
        return math.floor(t / BACKOFF_ORDERING_WINDOW) * BACKOFF_ORDERING_WINDOW

    def backoff_expiry(self, pinfo: QueuedPodInfo) -> float:
        """When the pod's backoff completes (cached in ``pinfo.backoff_expiration``)."""
        duration = self.backoff_duration(pinfo)
        if duration <= 0:
            return -math.inf
        if pinfo.backoff_expiration is None:
            pinfo.backoff_expiration = self._align(pinfo.timestamp + duration)
        return pinfo.backoff_expiration

    def is_pod_backing_off(self, pinfo: QueuedPodInfo) -> bool:
        """Whether the pod must still wait before being retried."""
        expiry = self.backoff_expiry(pinfo)
        if expiry == -math.inf:
            return False
        now = self._clock()
        if self._pop_from_backoff:
            # Same window as now (or later) still counts as backing off.
            return expiry >= self._align(now)
        return expiry > now

    def _backoff_lt(self, a: QueuedPodInfo, b: QueuedPodInfo) -> bool:
        ea, eb = self.backoff_expiry(a), self.backoff_expiry(b)
        if ea != eb:
            return ea < eb
        return a.seq < b.seq

    def _backoff_lt_with_priority(self, a: QueuedPodInfo, b: QueuedPodInfo) -> bool:
        ea, eb = self.backoff_expiry(a), self.backoff_expiry(b)
        if ea != eb:
            return ea < eb
        if self._less(a, b):
            return True
        if self._less(b, a):
            return False
        return a.seq < b.seq

    # ---------------------------------------------------------------- internals

    def _profile_name(self, pod: Obj) -> str | None:
        name = scheduler_name(pod)
        return name if name in self._profiles else None

    def _new_pinfo(self, pod: Obj) -> QueuedPodInfo:
        self._seq += 1
        return QueuedPodInfo(pod=pod, timestamp=self._clock(), seq=self._seq)

    def _broadcast(self) -> None:
        ev, loop = self._wakeup, self._loop
        if ev is None or loop is None:
            return
        if threading.get_ident() == self._loop_thread:
            ev.set()
            return
        try:
            loop.call_soon_threadsafe(ev.set)
        except RuntimeError:  # loop already closed
            pass

    def _run_pre_enqueue(self, pinfo: QueuedPodInfo) -> None:
        prof_name = scheduler_name(pinfo.pod)
        prof = self._profiles.get(prof_name)
        plugins = prof.pre_enqueue if prof else []
        gating = pinfo.gating_plugin
        ordered: Iterable[tuple[str, PreEnqueueFn]] = plugins
        if gating is not None:
            ordered = [p for p in plugins if p[0] == gating] + [p for p in plugins if p[0] != gating]
        for name, fn in ordered:
            try:
                status = fn(pinfo.pod)
            except Exception as exc:  # a crashing plugin gates the pod, like an Error status
                log.exception("PreEnqueue plugin %s failed for pod %s", name, pinfo.key)
                status = Status.as_status(exc, name)
            if status is None or status.is_success():
                continue
            pinfo.unschedulable_plugins.add(name)
            pinfo.gating_plugin = name
            pinfo.gating_plugin_events = list(self._plugin_events.get(prof_name, {}).get(name, ()))
            self._unschedulable.refresh(pinfo)
            return
        pinfo.gating_plugin = None
        pinfo.gating_plugin_events = []

    def _move_to_active(self, pinfo: QueuedPodInfo, event: str, moves_from_backoff: bool = False) -> bool:
        if not (self._pop_from_backoff and moves_from_backoff):
            self._run_pre_enqueue(pinfo)
        key = pinfo.key
        if pinfo.gated:
            if key in self._active or key in self._backoff or key in self._error_backoff:
                return False
            if self._unschedulable.get(key) is not None:
                return False
            self._unschedulable.add_or_update(pinfo)
            self.incoming_pods[(UNSCHEDULABLE_Q, event)] += 1
            return False
        if pinfo.initial_attempt_timestamp is None:
            pinfo.initial_attempt_timestamp = self._clock()
        self._unschedulable.delete(key)
        self._backoff.delete(key)
        self._error_backoff.delete(key)
        self._active.add_or_update(pinfo)
        self.incoming_pods[(ACTIVE_Q, event)] += 1
        if event in (EVENT_UNSCHEDULED_POD_ADD.label, EVENT_UNSCHEDULED_POD_UPDATE.label):
            self.nominator.add_nominated_pod(pinfo.pod)
        return True

    def _move_to_backoff(self, pinfo: QueuedPodInfo, event: str) -> bool:
        key = pinfo.key
        if self._pop_from_backoff:
            self._run_pre_enqueue(pinfo)
            if pinfo.gated:
                if self._unschedulable.get(key) is None:
                    self._unschedulable.add_or_update(pinfo)
                    self.incoming_pods[(UNSCHEDULABLE_Q, event)] += 1
                return False
        self._unschedulable.delete(key)
        if pinfo.rejector_plugins:
            self._error_backoff.delete(key)
            self._backoff.add_or_update(pinfo)
        else:
            self._backoff.delete(key)
            self._error_backoff.add_or_update(pinfo)
        self.incoming_pods[(BACKOFF_Q, event)] += 1
        return True

    def _add_to_unschedulable(self, pinfo: QueuedPodInfo, event: str) -> None:
        self._unschedulable.add_or_update(pinfo)
        self.incoming_pods[(UNSCHEDULABLE_Q, event)] += 1

    def _requeue(self, pinfo: QueuedPodInfo, strategy: QueueingStrategy, event: str) -> str:
        if strategy == QueueingStrategy.SKIP:
            self._add_to_unschedulable(pinfo, event)
            return UNSCHEDULABLE_Q
        if strategy == QueueingStrategy.AFTER_BACKOFF and self.is_pod_backing_off(pinfo):
            return BACKOFF_Q if self._move_to_backoff(pinfo, event) else UNSCHEDULABLE_Q
        return ACTIVE_Q if self._move_to_active(pinfo, event) else UNSCHEDULABLE_Q

    def _wakes_pop(self, queue: str) -> bool:
        return queue == ACTIVE_Q or (self._pop_from_backoff and queue == BACKOFF_Q)

    def _is_event_of_interest(self, event: ClusterEvent) -> bool:
        if event.resource == EventResource.WILDCARD:
            return True
        hit = self._interest_cache.get(event)
        if hit is None:
            hit = any(match_event(reg, event) for reg in self._all_registered)
            if len(self._interest_cache) >= _MATCH_CACHE_SIZE:
                self._interest_cache.clear()
            self._interest_cache[event] = hit
        return hit

    def _matching_hints(self, profile: str, event: ClusterEvent) -> list[tuple[str, Any]] | None:
        """(plugin, hint function) of the profile's registrations covering ``event``, in
        registration order; None for an unknown profile. Memoized per (profile, event)."""
        k = (profile, event)
        hit = self._match_cache.get(k)
        if hit is None:
            entries = self._hint_entries.get(profile)
            if entries is None:
                return None
            hit = [(plugin, hint_fn) for registered, plugin, hint_fn in entries if match_event(registered, event)]
            if len(self._match_cache) >= _MATCH_CACHE_SIZE:
                self._match_cache.clear()
            self._match_cache[k] = hit
        return hit

    def _worth_requeuing(self, pinfo: QueuedPodInfo, event: ClusterEvent, old: Any, new: Any) -> QueueingStrategy:
        rejectors = pinfo.unschedulable_plugins | pinfo.pending_plugins
        if not rejectors:
            return QueueingStrategy.AFTER_BACKOFF
        if event.resource == EventResource.WILDCARD and event.action == ActionType.ALL:
            if new is not None:
                # A wildcard event carrying a pod (ForceActivate) is meant for that pod only.
                if not isinstance(new, dict) or pod_uid(new) != pinfo.pod_uid:
                    return QueueingStrategy.SKIP
            return QueueingStrategy.AFTER_BACKOFF
        entries = self._matching_hints(scheduler_name(pinfo.pod), event)
        if entries is None:
            return QueueingStrategy.AFTER_BACKOFF
        strategy = QueueingStrategy.SKIP
        pending = pinfo.pending_plugins
        for plugin, hint_fn in entries:
            if plugin not in rejectors:
                continue
            if hint_fn is None:
                hint = QueueingHint.QUEUE
            else:
                try:
                    hint = hint_fn(pinfo.pod, old, new)
                except Exception:  # an erroring hint must not strand the pod: treat as Queue
                    log.exception("queueing hint of %s failed for pod %s on %s", plugin, pinfo.key, event_label(event))
                    hint = QueueingHint.QUEUE
            if hint == QueueingHint.SKIP:
                continue
            if plugin in pending:
                return QueueingStrategy.IMMEDIATELY
            if not pending:
                return QueueingStrategy.AFTER_BACKOFF
            strategy = QueueingStrategy.AFTER_BACKOFF
        return strategy

    def _strategy_for_in_flight(self, pinfo: QueuedPodInfo) -> QueueingStrategy:
        if not pinfo.unschedulable_plugins and not pinfo.pending_plugins:
            return QueueingStrategy.AFTER_BACKOFF
        events = self._in_flight.events_since(pinfo.pod_uid)
        if events is None:
            log.error("pod %s returned to the queue without being in flight", pinfo.key)
            return QueueingStrategy.AFTER_BACKOFF
        strategy = QueueingStrategy.SKIP
        for event, old, new in events:
            s = self._worth_requeuing(pinfo, event, old, new)
            if s == QueueingStrategy.IMMEDIATELY:
                return s
            if s == QueueingStrategy.AFTER_BACKOFF:
                strategy = s
                if not pinfo.pending_plugins:
                    return s
        return strategy

    def _move_pods(self, pinfos: Iterable[QueuedPodInfo], event: ClusterEvent, old: Any, new: Any) -> None:
        if not self._is_event_of_interest(event):
            return
        label = event_label(event)
        activated = False
        for pinfo in list(pinfos):
            if pinfo.gated and not any(match_event(e, event) for e in pinfo.gating_plugin_events):
                continue
            strategy = self._worth_requeuing(pinfo, event, old, new)
            if strategy == QueueingStrategy.SKIP:
                continue
            self._unschedulable.delete(pinfo.key)
            if self._wakes_pop(self._requeue(pinfo, strategy, label)):
                activated = True
        self._move_request_cycle = self._cycle
        if self._hints_enabled and len(self._in_flight):
            self._in_flight.add_event(event, old, new)
        if activated:
            self._broadcast()

    def _cross_topology_candidates(self, pod: Obj) -> list[QueuedPodInfo]:
        ns = _meta(pod).get("namespace", "")
        pool = self._unschedulable
        # Only the groups whose rejectors include either plugin, in pool order.
        keys = [k for (_, rejectors), members in pool.groups.items()
                if "PodTopologySpread" in rejectors or "InterPodAffinity" in rejectors for k in members]
        keys.sort(key=pool.order.__getitem__)
        out = []
        for key in keys:
            pinfo = pool.pods[key]
            plugins = pinfo.unschedulable_plugins
            if "PodTopologySpread" in plugins and _meta(pinfo.pod).get("namespace", "") == ns:
                out.append(pinfo)
            elif "InterPodAffinity" in plugins:
                out.append(pinfo)
        return out

    def _pop_locked(self) -> QueuedPodInfo | None:
        while True:
            pinfo = self._active.pop()
            if pinfo is None:
                if self._pop_from_backoff and len(self._backoff):
                    pinfo = self._backoff.pop()
                    assert pinfo is not None
                    self.incoming_pods[(ACTIVE_Q, POP_FROM_BACKOFF_Q)] += 1
                else:
                    return None
            uid = pinfo.pod_uid
            if uid in self._in_flight:
                log.error("pod %s is tracked in multiple places; discarding the popped copy", pinfo.key)
                continue
            pinfo.attempts += 1
            self._cycle += 1
            self._in_flight.add_pod(uid, pinfo.pod)
            # Rejectors describe one attempt; the failure handler sets them for this one.
            pinfo.unschedulable_plugins = set()
            pinfo.pending_plugins = set()
            return pinfo

    # ---------------------------------------------------------------- public operations

    def add(self, pod: Obj) -> None:
        """A new unscheduled pod (informer Add): PreEnqueue, then activeQ or gated."""
        with self._lock:
            if self._profile_name(pod) is None:
                return
            pinfo = self._new_pinfo(pod)
            if self._move_to_active(pinfo, EVENT_UNSCHEDULED_POD_ADD.label):
                self._broadcast()

    def update(self, old_pod: Obj | None, new_pod: Obj) -> None:
        """An unscheduled pod changed (informer Update)."""
        with self._lock:
            if self._profile_name(new_pod) is None:
                return
            events = pod_update_events(old_pod, new_pod) if (self._hints_enabled and old_pod is not None) \
                else [EVENT_UNSCHEDULED_POD_UPDATE]
            uid = pod_uid(new_pod)
            if self._hints_enabled and uid in self._in_flight:
                # Replayed through the hints if the pod comes back unschedulable.
                for ev in events:
                    self._in_flight.add_event(ev, old_pod, new_pod)
                return
            if old_pod is not None:
                key = pod_key(old_pod)
                for heap in (self._active, self._backoff, self._error_backoff):
                    pinfo = heap.get(key)
                    if pinfo is not None:
                        pinfo.update(new_pod)
                        heap.add_or_update(pinfo)
                        self.nominator.update_nominated_pod(old_pod, pinfo.pod)
                        return
            pinfo = self._unschedulable.get(pod_key(new_pod))
            if pinfo is not None:
                pinfo.update(new_pod)
                self._unschedulable.refresh(pinfo)
                self.nominator.update_nominated_pod(old_pod or new_pod, new_pod)
                if self._hints_enabled:
                    for ev in events:
                        strategy = self._worth_requeuing(pinfo, ev, old_pod, new_pod)
                        queue = self._requeue(pinfo, strategy, event_label(ev))
                        if self._wakes_pop(queue):
                            self._broadcast()
                        if queue != UNSCHEDULABLE_Q:
                            break
                    return
                if old_pod is None or is_pod_updated(old_pod, new_pod):
                    label = EVENT_UNSCHEDULED_POD_UPDATE.label
                    if self.is_pod_backing_off(pinfo):
                        if self._move_to_backoff(pinfo, label) and self._pop_from_backoff:
                            self._broadcast()
                        return
                    if self._move_to_active(pinfo, label):
                        self._broadcast()
                    return
                self._add_to_unschedulable(pinfo, EVENT_UNSCHEDULED_POD_UPDATE.label)
                return
            pinfo = self._new_pinfo(new_pod)
            if self._move_to_active(pinfo, EVENT_UNSCHEDULED_POD_UPDATE.label):
                self._broadcast()

    def delete(self, pod: Obj) -> None:
        """Forget the pod everywhere (queues and nominator)."""
        with self._lock:
            self.nominator.delete_nominated_pod_if_exists(pod)
            key = pod_key(pod)
            if self._active.delete(key) is not None:
                return
            if self._backoff.delete(key) is not None or self._error_backoff.delete(key) is not None:
                return
            self._unschedulable.delete(key)

    def try_pop(self) -> QueuedPodInfo | None:
        """Non-blocking ``pop``: None when nothing is ready (or the queue is closed)."""
        with self._lock:
            if self._closed:
                return None
            return self._pop_locked()

    async def pop(self) -> QueuedPodInfo | None:
        """Take the head of activeQ, waiting while it is empty.

        Increments ``scheduling_cycle`` and ``attempts`` and marks the pod in
        flight. Returns None once the queue is closed (also to waiters blocked
        when ``close`` is called).
        """
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if self._closed:
                    return None
                pinfo = self._pop_locked()
                if pinfo is not None:
                    return pinfo
                if self._wakeup is None or self._loop is not loop:
                    self._wakeup = asyncio.Event()
                    self._loop = loop
                    self._loop_thread = threading.get_ident()
                wakeup = self._wakeup
                wakeup.clear()
            await wakeup.wait()

    def close(self) -> None:
        """Stop: pending and future ``pop`` calls return None; in-flight tracking is dropped."""
        with self._lock:
            self._closed = True
            self._in_flight.clear()
            self._broadcast()

    def done(self, uid: str) -> None:
        """The pod's scheduling attempt (including binding) is over."""
        with self._lock:
            self._in_flight.done(uid)

    def add_unschedulable_if_not_present(self, pinfo: QueuedPodInfo, pod_scheduling_cycle: int) -> None:
        """Requeue a pod whose attempt failed; also marks it done.

        No rejector plugins (an error) -> error backoff. Otherwise the events
        seen while it was in flight decide: none helpful -> unschedulablePods;
        Queue from an unschedulable plugin -> backoffQ/activeQ; Queue from a
        pending plugin -> activeQ. Without queueing hints, the pod goes to
        backoffQ if a move request arrived since ``pod_scheduling_cycle``.
        A pod already queued is left alone (logged).
        """
        with self._lock:
            try:
                key = pinfo.key
                if self._unschedulable.get(key) is not None or key in self._active \
                        or key in self._backoff or key in self._error_backoff:
                    log.error("pod %s is already present in the scheduling queue", key)
                    return
                if not pinfo.unschedulable_plugins and not pinfo.pending_plugins:
                    pinfo.consecutive_errors_count += 1
                else:
                    pinfo.unschedulable_count += 1
                    pinfo.consecutive_errors_count = 0
                pinfo.timestamp = self._clock()
                pinfo.backoff_expiration = None
                if not self._hints_enabled:
                    if self._move_request_cycle >= pod_scheduling_cycle or not pinfo.rejector_plugins:
                        if self._move_to_backoff(pinfo, SCHEDULE_ATTEMPT_FAILURE) and self._pop_from_backoff:
                            self._broadcast()
                    else:
                        self._add_to_unschedulable(pinfo, SCHEDULE_ATTEMPT_FAILURE)
                    return
                strategy = self._strategy_for_in_flight(pinfo)
                queue = self._requeue(pinfo, strategy, SCHEDULE_ATTEMPT_FAILURE)
                if self._wakes_pop(queue):
                    self._broadcast()
            finally:
                self._in_flight.done(pinfo.pod_uid)

    def move_all_to_active_or_backoff(
        self, event: ClusterEvent, old: Any = None, new: Any = None, pre_check: PreCheck | None = None
    ) -> None:
        """A cluster event: requeue the unschedulable pods whose rejectors' hints say it may help."""
        with self._lock:
            if not self._is_event_of_interest(event):
                return
            candidates = self._event_candidates(event, old, new)
            if candidates is None:
                candidates = list(self._unschedulable.pods.values())
            pods = [p for p in candidates if pre_check is None or pre_check(p.pod)]
            self._move_pods(pods, event, old, new)

    def _event_candidates(self, event: ClusterEvent, old: Any, new: Any) -> list[QueuedPodInfo] | None:
        """The unschedulable pods ``event`` may requeue, in pool order; None: all of them.

        Exact pre-selection: a pod left out is one for which every matching
        hint of its rejector plugins has a :class:`HintScope` and the event's
        keys miss the pod's keys, so ``_worth_requeuing`` would answer Skip.
        Pods are handled by group (scheduler name, rejectors); a group
        without such a guarantee for this event is taken whole."""
        pool = self._unschedulable
        if not self._use_scopes or not self._scopes or event.resource == EventResource.WILDCARD:
            return None
        event_keys: dict[int, list[Hashable] | None] = {}
        picked: set[str] = set()
        whole = 0
        for group, members in pool.groups.items():
            plan = self._group_plan(group, event)
            if plan is None:
                picked |= members
                whole += len(members)
                continue
            for pos in plan:
                keys = event_keys.get(pos, ())
                if keys == ():
                    keys = event_keys[pos] = self._scope_event_keys(pos, old, new)
                if keys is None:
                    picked |= members
                    break
                by_key = pool.by_key
                for k in keys:
                    hits = by_key.get((pos, k))
                    if hits:
                        picked |= hits & members if len(hits) > len(members) else members & hits
        if whole == len(pool.pods):
            return None
        if pool.unkeyed:
            picked |= pool.unkeyed
        order = pool.order
        pods = pool.pods
        return [pods[k] for k in sorted(picked, key=order.__getitem__)]

    def _scope_event_keys(self, pos: int, old: Any, new: Any) -> list[Hashable] | None:
        try:
            keys = self._scopes[pos].event_keys(old, new)
            if keys is None:
                return None
            out = list(keys)
            for k in out:
                hash(k)
            return out
        except Exception:  # a malformed object: no pre-selection
            return None

    def _group_plan(self, group: _Group, event: ClusterEvent) -> tuple[int, ...] | None:
        """Positions of the scopes deciding whether ``event`` may requeue pods of ``group``;
        None when the whole group is a candidate (no rejectors, unknown profile,
        or a matching hint of a rejector without a scope). Memoized."""
        ck = (group, event)
        if ck in self._plan_cache:
            return self._plan_cache[ck]
        profile, rejectors = group
        plan: tuple[int, ...] | None = None
        entries = self._matching_hints(profile, event) if rejectors else None
        if entries is not None:
            positions: list[int] = []
            for plugin, hint_fn in entries:
                if plugin not in rejectors:
                    continue
                scope = hint_scope(hint_fn)
                if scope is None:
                    positions = []
                    break
                pos = self._scope_pos[id(scope)]
                if pos not in positions:
                    positions.append(pos)
            else:
                plan = tuple(positions)
        if len(self._plan_cache) >= _MATCH_CACHE_SIZE:
            self._plan_cache.clear()
        self._plan_cache[ck] = plan
        return plan

    def assigned_pod_added(self, pod: Obj) -> None:
        """A bound pod appeared.

        Candidates are unschedulable pods rejected by PodTopologySpread (same
        namespace) or InterPodAffinity; their hints decide. This is a superset
        of upstream's "required affinity term matches the pod" pre-filter.
        """
        with self._lock:
            self._move_pods(self._cross_topology_candidates(pod), EVENT_ASSIGNED_POD_ADD, None, pod)

    def assigned_pod_updated(self, old_pod: Obj | None, new_pod: Obj, event: ClusterEvent | None = None) -> None:
        """A bound pod changed; a request scale-down considers every unschedulable pod."""
        with self._lock:
            if event is None:
                events = pod_update_events(old_pod, new_pod) if old_pod is not None else [EVENT_ASSIGNED_POD_UPDATE]
                for ev in events:
                    self._assigned_pod_updated_locked(old_pod, new_pod, ev)
                return
            self._assigned_pod_updated_locked(old_pod, new_pod, event)

    def _assigned_pod_updated_locked(self, old_pod: Obj | None, new_pod: Obj, event: ClusterEvent) -> None:
        if match_event(_POD_SCALE_DOWN, event):
            self.move_all_to_active_or_backoff(event, old_pod, new_pod)
        else:
            self._move_pods(self._cross_topology_candidates(new_pod), event, old_pod, new_pod)

    def activate(self, pods: Iterable[Obj] | dict[str, Obj]) -> None:
        """Move the given pods from unschedulablePods/backoffQ to activeQ.

        In-flight pods get a ForceActivate event recorded so they are requeued
        when they come back; unknown pods are ignored.
        """
        items = pods.values() if isinstance(pods, dict) else pods
        with self._lock:
            activated = False
            for pod in items:
                key = pod_key(pod)
                pinfo = self._unschedulable.get(key)
                from_backoff = False
                if pinfo is None:
                    pinfo = self._backoff.delete(key) or self._error_backoff.delete(key)
                    from_backoff = pinfo is not None
                if pinfo is not None:
                    if self._move_to_active(pinfo, FORCE_ACTIVATE_LABEL, from_backoff):
                        activated = True
                    continue
                uid = pod_uid(pod)
                if self._hints_enabled and uid in self._in_flight:
                    self._in_flight.add_event(FORCE_ACTIVATE, None, pod)
                self._move_request_cycle = self._cycle
            if activated:
                self._broadcast()

    def flush_backoff_q_completed(self) -> None:
        """Move every pod whose backoff has completed to activeQ."""
        with self._lock:
            activated = False
            for heap in (self._backoff, self._error_backoff):
                while True:
                    head = heap.peek()
                    if head is None or self.is_pod_backing_off(head):
                        break
                    heap.pop()
                    if self._move_to_active(head, BACKOFF_COMPLETE, True):
                        activated = True
            if activated:
                self._broadcast()

    def flush_unschedulable_pods_left_over(self) -> None:
        """Requeue pods that stayed in unschedulablePods longer than the maximum duration."""
        with self._lock:
            now = self._clock()
            stale = [p for p in self._unschedulable.pods.values()
                     if now - p.timestamp > self._max_unschedulable_duration]
            if stale:
                self._move_pods(stale, UNSCHEDULABLE_TIMEOUT, None, None)

    async def run(self) -> None:
        """Periodic flushes until cancelled or closed."""

        async def every(interval: float, fn: Callable[[], None]) -> None:
            while not self._closed:
                await asyncio.sleep(interval)
                if self._closed:
                    return
                try:
                    fn()
                except Exception:  # keep flushing; one bad hint must not stop the loop
                    log.exception("scheduling queue flush failed")

        await asyncio.gather(
            every(self._flush_backoff_interval, self.flush_backoff_q_completed),
            every(self._flush_unschedulable_interval, self.flush_unschedulable_pods_left_over),
        )

    # ---------------------------------------------------------------- nominator

    def add_nominated_pod(self, pod_or_info: Any, node_name: str | None = None) -> None:
        """See ``Nominator.add_nominated_pod``."""
        with self._lock:
            self.nominator.add_nominated_pod(pod_or_info, node_name)

    def delete_nominated_pod_if_exists(self, pod: Obj) -> None:
        with self._lock:
            self.nominator.delete_nominated_pod_if_exists(pod)

    def update_nominated_pod(self, old_pod: Obj, new_pod_or_info: Any) -> None:
        with self._lock:
            self.nominator.update_nominated_pod(old_pod, new_pod_or_info)

    def nominated_pods_for_node(self, node_name: str) -> list[Obj]:
        """Nominated pods on a node, each as the latest object the queue holds."""
        with self._lock:
            out = []
            for pod in self.nominator.nominated_pods_for_node(node_name):
                pinfo = self.get(pod)
                out.append(pinfo.pod if pinfo is not None else pod)
            return out

    def __iter__(self) -> Iterator[QueuedPodInfo]:
        """Snapshot of queued pod infos (active, backoff, unschedulable)."""
        with self._lock:
            items = self._active.list() + self._backoff.list() + self._error_backoff.list() \
                + list(self._unschedulable.pods.values())
        return iter(items)
