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
Modules, as upstream's backend/queue and backend/heap:

* :mod:`.queued_pod_info`: a queued pod and its bookkeeping;
* :mod:`.heap`: the heaps behind activeQ and backoffQ;
* :mod:`.backoff`: backoff durations and backoffQ's ordering;
* :mod:`.unschedulable_pods`: the unschedulable pool, filed for event handling;
* :mod:`.inflight`: the in-flight pods and the events logged while they are out;
* :mod:`.events`: event labels, matching and pod update classification;
* :mod:`.scheduling_queue`: the :class:`SchedulingQueue` itself.
"""

from kubeplane.scheduler.framework.hintscope import HintScope, hint_scope
from kubeplane.scheduler.queue.backoff import BACKOFF_ORDERING_WINDOW, Backoff
from kubeplane.scheduler.queue.events import (
    EVENT_ASSIGNED_POD_ADD,
    EVENT_ASSIGNED_POD_DELETE,
    EVENT_ASSIGNED_POD_UPDATE,
    EVENT_UNSCHEDULED_POD_ADD,
    EVENT_UNSCHEDULED_POD_DELETE,
    EVENT_UNSCHEDULED_POD_UPDATE,
    event_label,
    is_pod_updated,
    match_event,
    pod_update_events,
)
from kubeplane.scheduler.queue.heap import Heap, KeyedHeap
from kubeplane.scheduler.queue.inflight import InFlightLog
from kubeplane.scheduler.queue.queued_pod_info import (
    DEFAULT_SCHEDULER_NAME,
    LessFn,
    QueuedPodInfo,
    SortKeyFn,
    pod_key,
    pod_priority,
    pod_uid,
    priority_less,
    scheduler_name,
)
from kubeplane.scheduler.queue.scheduling_queue import (
    ACTIVE_Q,
    BACKOFF_COMPLETE,
    BACKOFF_Q,
    CROSS_TOPOLOGY_PLUGINS,
    FORCE_ACTIVATE_LABEL,
    GATED,
    POP_FROM_BACKOFF_Q,
    SCHEDULE_ATTEMPT_FAILURE,
    UNSCHEDULABLE_Q,
    PreCheck,
    PreEnqueueFn,
    QueueingStrategy,
    QueueProfile,
    SchedulingQueue,
)
from kubeplane.scheduler.queue.unschedulable_pods import UnschedulablePods

__all__ = [
    "ACTIVE_Q", "BACKOFF_COMPLETE", "BACKOFF_ORDERING_WINDOW", "BACKOFF_Q", "CROSS_TOPOLOGY_PLUGINS",
    "DEFAULT_SCHEDULER_NAME", "EVENT_ASSIGNED_POD_ADD", "EVENT_ASSIGNED_POD_DELETE", "EVENT_ASSIGNED_POD_UPDATE",
    "EVENT_UNSCHEDULED_POD_ADD", "EVENT_UNSCHEDULED_POD_DELETE", "EVENT_UNSCHEDULED_POD_UPDATE",
    "FORCE_ACTIVATE_LABEL", "GATED", "POP_FROM_BACKOFF_Q", "SCHEDULE_ATTEMPT_FAILURE", "UNSCHEDULABLE_Q",
    "Backoff", "Heap", "HintScope", "InFlightLog", "KeyedHeap", "LessFn", "PreCheck", "PreEnqueueFn",
    "QueuedPodInfo", "QueueingStrategy", "QueueProfile", "SchedulingQueue", "SortKeyFn", "UnschedulablePods",
    "event_label", "hint_scope", "is_pod_updated", "match_event", "pod_key", "pod_priority", "pod_uid",
    "pod_update_events", "priority_less", "scheduler_name",
]
