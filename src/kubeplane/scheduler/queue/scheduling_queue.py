"""The SchedulingQueue (upstream PriorityQueue): activeQ, backoffQ, unschedulablePods and
in-flight tracking, moved by cluster events through the plugins' queueing hints."""

from __future__ import annotations

import asyncio
import collections
import enum
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable, Iterator, Optional

from kubeplane.scheduler.framework.hintscope import HintScope, hint_scope
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
from kubeplane.scheduler.nominator import Nominator, PodGetter
from kubeplane.scheduler.queue.backoff import Backoff
from kubeplane.scheduler.queue.events import (
    EVENT_ASSIGNED_POD_ADD,
    EVENT_ASSIGNED_POD_UPDATE,
    EVENT_UNSCHEDULED_POD_ADD,
    EVENT_UNSCHEDULED_POD_UPDATE,
    event_label,
    is_pod_updated,
    match_event,
    pod_update_events,
)
from kubeplane.scheduler.queue.heap import Heap, KeyedHeap
from kubeplane.scheduler.queue.inflight import InFlightLog
from kubeplane.scheduler.queue.queued_pod_info import (
    LessFn,
    Obj,
    QueuedPodInfo,
    SortKeyFn,
    _meta,
    pod_key,
    pod_uid,
    priority_less,
    scheduler_name,
)
from kubeplane.scheduler.queue.unschedulable_pods import Group, UnschedulablePods

log = logging.getLogger(__name__)

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


PreEnqueueFn = Callable[[Obj], Optional[Status]]
PreCheck = Callable[[Obj], bool]


@dataclass
class QueueProfile:
    """What the queue needs from one scheduling profile."""

    pre_enqueue: list[tuple[str, PreEnqueueFn]] = field(default_factory=list)
    #: plugin name -> the events it registered (with optional hint functions)
    hints: dict[str, list[ClusterEventWithHint]] = field(default_factory=dict)
    less: LessFn = priority_less
    #: the same order as ``less`` as a key function, when the plugin offers one
    sort_key: SortKeyFn | None = None


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
        self._plan_cache: dict[tuple[Group, ClusterEvent], tuple[int, ...] | None] = {}
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
            self._active: Heap | KeyedHeap = KeyedHeap(lambda p: (*sort_key(p), p.seq))
        else:
            self._active = Heap(active_lt)
        backoff = self._backoff_policy = Backoff(initial_backoff, max_backoff, clock, pop_from_backoff, less)
        self._backoff = Heap(backoff.lt_with_priority if pop_from_backoff else backoff.lt)
        self._error_backoff = Heap(backoff.lt)
        self._unschedulable = UnschedulablePods(self._scopes)
        self._in_flight = InFlightLog()
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

    def unschedulable_pods_by_plugin(self) -> dict[tuple[str, str], int]:
        """Pods in the unschedulable pool per (rejecting or pending plugin, scheduler name)
        (``scheduler_unschedulable_pods`` labels); a pod counts for each of its plugins."""
        out: dict[tuple[str, str], int] = {}
        with self._lock:
            for (profile, plugins), keys in self._unschedulable.groups.items():
                for plugin in plugins:
                    out[(plugin, profile)] = out.get((plugin, profile), 0) + len(keys)
        return out

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
        """How long ``pinfo`` backs off (see :meth:`Backoff.duration`)."""
        return self._backoff_policy.duration(pinfo)

    def backoff_expiry(self, pinfo: QueuedPodInfo) -> float:
        """When the pod's backoff completes (cached in ``pinfo.backoff_expiration``)."""
        return self._backoff_policy.expiry(pinfo)

    def is_pod_backing_off(self, pinfo: QueuedPodInfo) -> bool:
        """Whether the pod must still wait before being retried."""
        return self._backoff_policy.is_backing_off(pinfo)

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
        if strategy == QueueingStrategy.AFTER_BACKOFF and self._backoff_policy.is_backing_off(pinfo):
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
                    if self._backoff_policy.is_backing_off(pinfo):
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

    def _group_plan(self, group: Group, event: ClusterEvent) -> tuple[int, ...] | None:
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
                    if head is None or self._backoff_policy.is_backing_off(head):
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
