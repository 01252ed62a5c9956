"""DynamicResources: allocate the devices of a pod's ResourceClaims (resource.k8s.io/v1).

Upstream ``pkg/scheduler/framework/plugins/dynamicresources``, structured
parameters only:

* PreEnqueue gates a pod until every claim it references exists (template
  claims: generated, recorded in ``pod.status.resourceClaimStatuses`` and
  controlled by the pod) and is not being deleted.
* PreFilter collects the claims; allocated ones restrict nodes through their
  ``allocation.nodeSelector``, unallocated ones get an Allocator built from
  slices, classes and every allocated or in-flight device.
* Filter allocates per node and caches the result; PostFilter deallocates an
  allocated claim that only this pod uses when it was unavailable somewhere.
* ``filter_pass_except`` (the vectorised Filter hook) lists the nodes without
  a still-valid successful verdict of an earlier pod with the same
  allocation shape; Filter is then skipped elsewhere, and also answers from
  still-valid failed verdicts, which ``filter_known_statuses`` hands to the
  vectorised Filter as ready statuses. Reserve allocates on the chosen node
  itself when Filter did not run there.
* The ResourceClaim and pod queueing hints carry a ``HintScope``: the queue
  only asks them about pods naming the claim (any pod on a deallocation) or,
  for pod updates, about the updated pod.
* Reserve records allocations as in flight; Unreserve drops them.
* PreBind writes the finalizer (main resource), then allocation + reservedFor
  (status subresource), assumes the result in the claim assume cache and
  only then drops the in-flight entry.

Every rejection is UnschedulableAndUnresolvable (preemption cannot help);
PostFilter answers plain Unschedulable.

The shared :class:`~kubeplane.scheduler.plugins.dynamicresources.dra_manager.DRAManager` is taken from
``handle.dra_manager``; when absent it is built from
``handle.informer_factory`` and stored in the handle. Without either the plugin only
lets pods without claims through.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping

from kubeplane.api.meta import meta_of as _meta
from kubeplane.api.errors import StatusError
from kubeplane.dra.allocator import (
    REASON_CANNOT_ALLOCATE, AllocationError, AllocationResult, Allocator, DeferredAllocation,
)
from kubeplane.scheduler.plugins.dynamicresources.dra_manager import RESOURCE_CLAIMS, DRAManager, NodeVerdictCache
from kubeplane.scheduler.framework.nodeinfo import NodeInfo, NodeSelector, PodInfo
from kubeplane.scheduler.framework.plugin import Handle, Plugin
from kubeplane.scheduler.framework.types import (
    ActionType, ClusterEvent, ClusterEventWithHint, Code, CycleState, EventResource, Obj, PassOnly, PreFilterResult,
    QueueingHint, Status,
)
from kubeplane.scheduler.framework.hintscope import HintScope

log = logging.getLogger(__name__)

NAME = "DynamicResources"
STATE_KEY = NAME
#: finalizer the scheduler puts on claims it allocates
FINALIZER = "resource.kubernetes.io/delete-protection"
#: annotation on claims generated from a template: the pod's claim name
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
#: API limit of status.reservedFor
RESERVED_FOR_MAX_SIZE = 256
#: PreBind attempts on update conflicts (client-go DefaultRetry has 5 steps)
BIND_RETRIES = 5

MSG_NOT_AVAILABLE = "resourceclaim not available on the node"
MSG_DEALLOCATED = "deallocation of ResourceClaim completed"
MSG_STILL_UNSCHEDULABLE = "still not schedulable"

__all__ = [
    "ClaimError", "DynamicResources", "FINALIZER", "NAME", "POD_CLAIM_NAME_ANNOTATION", "RESERVED_FOR_MAX_SIZE",
    "is_reserved_for_pod", "pod_claim_names", "shared_dra_manager",
]


class ClaimError(Exception):
    """A pod's claim cannot be used yet (missing, being deleted, not owned)."""


# --------------------------------------------------------------------------- helpers


def _status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("status") or {}


def _pod_ref(pod: Mapping[str, Any]) -> str:
    return f"{_meta(pod).get('namespace') or 'default'}/{_meta(pod).get('name') or ''}"


def is_reserved_for_pod(claim: Mapping[str, Any], pod_uid: str) -> bool:
    return any(r.get("uid") == pod_uid for r in _status(claim).get("reservedFor") or ())


def is_controlled_by(obj: Mapping[str, Any], owner_uid: str) -> bool:
    return any(ref.get("controller") and ref.get("uid") == owner_uid for ref in _meta(obj).get("ownerReferences") or ())


def pod_claim_names(pod: Mapping[str, Any]) -> list[tuple[str, str | None, bool]]:
    """``(pod claim name, ResourceClaim name or None, generated from a template)`` per pod claim.

    A None name means the claim is not needed. Raises :class:`ClaimError`
    when a template claim's name is not recorded in the pod status yet."""
    out: list[tuple[str, str | None, bool]] = []
    statuses = {s.get("name"): s for s in _status(pod).get("resourceClaimStatuses") or ()}
    for pc in (pod.get("spec") or {}).get("resourceClaims") or ():
        name = pc.get("name") or ""
        if pc.get("resourceClaimName"):
            out.append((name, pc["resourceClaimName"], False))
        elif pc.get("resourceClaimTemplateName"):
            st = statuses.get(name)
            if st is None:
                raise ClaimError(f'pod "{_pod_ref(pod)}": ResourceClaim for pod claim "{name}" not created yet')
            out.append((name, st.get("resourceClaimName") or None, True))
        else:
            raise ClaimError(f'pod "{_pod_ref(pod)}", spec.resourceClaims "{name}": neither resourceClaimName '
                             "nor resourceClaimTemplateName is set")
    return out


def _mentions_claim(pod: Mapping[str, Any], name: Any) -> bool:
    """Whether ``name`` appears as a claim name in the pod's spec or its
    recorded claim statuses: a necessary condition for being one of the
    names :func:`pod_claim_names` returns (no dicts built)."""
    for pc in (pod.get("spec") or {}).get("resourceClaims") or ():
        if pc.get("resourceClaimName") == name:
            return True
    for st in _status(pod).get("resourceClaimStatuses") or ():
        if st.get("resourceClaimName") == name:
            return True
    return False


def _claim_keys_of_pod(pod: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``(namespace, claim name)`` of every claim name the pod mentions (see :func:`_mentions_claim`)."""
    ns = _meta(pod).get("namespace") or "default"
    keys = []
    for pc in (pod.get("spec") or {}).get("resourceClaims") or ():
        name = pc.get("resourceClaimName")
        if name:
            keys.append((ns, name))
    for st in _status(pod).get("resourceClaimStatuses") or ():
        name = st.get("resourceClaimName")
        if name:
            keys.append((ns, name))
    return keys


def _claim_event_keys(old: Any, new: Any) -> list[tuple[str, Any]] | None:
    """The claim a ResourceClaim add/update concerns; None (any pod) for a deallocation."""
    if old is not None and new is not None and _status(old).get("allocation") and not _status(new).get("allocation"):
        return None
    if new is None:
        return []
    meta = _meta(new)
    name = meta.get("name")
    return [(meta.get("namespace") or "default", name)] if name else []


def _uid_key_of_pod(pod: Mapping[str, Any]) -> list[Any]:
    return [_meta(pod).get("uid")]


def _uid_event_keys(old: Any, new: Any) -> list[Any]:
    return [] if new is None else [_meta(new).get("uid")]


#: is_schedulable_after_claim_change can only queue pods naming the claim, except on deallocation
CLAIM_HINT_SCOPE = HintScope(_claim_keys_of_pod, _claim_event_keys)
#: is_schedulable_after_pod_change only concerns the updated pod itself
POD_HINT_SCOPE = HintScope(_uid_key_of_pod, _uid_event_keys)


def _failure_status(reason: str) -> Status:
    """Filter's status for a failed allocation verdict."""
    return Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, [reason], NAME)


def _unresolvable(msg: str) -> Status:
    return Status.unresolvable(msg)


def shared_dra_manager(handle: Handle) -> DRAManager | None:
    """The DRA manager of ``handle``: ``handle.dra_manager``, else one built on
    ``handle.informer_factory`` and stored in the handle (the scheduler hands it
    to its other profiles, so they share one in-flight map and one tracker)."""
    mgr = handle.dra_manager
    if mgr is None and handle.informer_factory is not None:
        mgr = handle.dra_manager = DRAManager.from_informer_factory(handle.informer_factory)
    return mgr  # type: ignore[return-value]


# --------------------------------------------------------------------------- cycle state


@dataclass
class _ClaimInfo:
    """What PreFilter learned about one claim; ``allocation`` is set by Reserve."""

    available_on: NodeSelector | None = None
    allocation: AllocationResult | None = None


@dataclass
class _State:
    claims: list[Obj]
    infos: list[_ClaimInfo]
    to_allocate: list[int] = field(default_factory=list)
    allocator: Allocator | None = None
    # Filter's successful allocations; results are built for the chosen node only.
    node_allocations: dict[str, DeferredAllocation] = field(default_factory=dict)
    unavailable: set[int] = field(default_factory=set)
    has_selectors: bool = False  # some allocated claim restricts nodes
    lock: threading.Lock = field(default_factory=threading.Lock)
    nodes: list[NodeInfo] = field(default_factory=list)  # PreFilter's node list
    snapshot_pos: int = 0  # change-log position of the allocator's allocated devices
    # Set by filter_pass_except: Filter then records and reuses verdicts.
    verdicts: NodeVerdictCache | None = None
    shape_key: Any = None
    known_failures: Mapping[str, str] | None = None  # node -> reason, valid for this cycle

    def clone(self) -> "_State":
        # Shared by reference, as upstream: later phases see Filter's results.
        return self


# --------------------------------------------------------------------------- plugin


class DynamicResources(Plugin):
    """Allocates and reserves ResourceClaims for pods."""

    name = NAME

    def __init__(self, args: dict | None, handle: Handle) -> None:
        super().__init__(args, handle)
        self.manager: DRAManager | None = shared_dra_manager(handle)
        self._background: set[asyncio.Task[Any]] = set()
        self._names_cache: tuple[list[NodeInfo], int, dict[str, NodeInfo]] | None = None

    # ------------------------------------------------------------------ claims of a pod

    def pod_claims(self, pod: Mapping[str, Any]) -> list[Obj]:
        """The pod's claims (not-needed ones skipped), from the assume cache.

        Raises :class:`ClaimError` with the reason the pod must wait."""
        names = pod_claim_names(pod)
        if not names:
            return []
        ns = _meta(pod).get("namespace") or "default"
        uid = _meta(pod).get("uid") or ""
        out: list[Obj] = []
        for _, claim_name, templated in names:
            if claim_name is None:
                continue
            claim = self.manager.get_claim(ns, claim_name) if self.manager is not None else None
            if claim is None:
                raise ClaimError(f'waiting for resource claim "{ns}/{claim_name}" to be created')
            if _meta(claim).get("deletionTimestamp"):
                raise ClaimError(f'resourceclaim "{claim_name}" is being deleted')
            if templated and not is_controlled_by(claim, uid):
                raise ClaimError(f"ResourceClaim {ns}/{claim_name} was not created for pod {_pod_ref(pod)} "
                                 "(pod is not owner)")
            out.append(claim)
        return out

    # ------------------------------------------------------------------ queue side

    def pre_enqueue(self, pod: Obj) -> Status | None:
        if not (pod.get("spec") or {}).get("resourceClaims"):
            return None
        try:
            self.pod_claims(pod)
        except ClaimError as err:
            return _unresolvable(str(err))
        return None

    def events_to_register(self) -> list[ClusterEventWithHint]:
        return [
            ClusterEventWithHint(ClusterEvent(EventResource.RESOURCE_CLAIM, ActionType.ADD | ActionType.UPDATE),
                                 self.is_schedulable_after_claim_change),
            ClusterEventWithHint(ClusterEvent(EventResource.NODE, ActionType.ADD | ActionType.UPDATE_NODE_LABEL
                                              | ActionType.UPDATE_NODE_TAINT)),
            ClusterEventWithHint(ClusterEvent(EventResource.RESOURCE_SLICE, ActionType.ADD | ActionType.UPDATE)),
            ClusterEventWithHint(ClusterEvent(EventResource.DEVICE_CLASS, ActionType.ADD | ActionType.UPDATE)),
            ClusterEventWithHint(ClusterEvent(EventResource.POD, ActionType.UPDATE_POD_GENERATED_RESOURCE_CLAIM),
                                 self.is_schedulable_after_pod_change),
        ]

    def is_schedulable_after_claim_change(self, pod: Obj, old: Any, new: Any) -> QueueingHint:
        """Queue when the change can help this pod: its claim appeared, changed, or devices were freed."""
        freed = (old is not None and new is not None and bool(_status(old).get("allocation"))
                 and not _status(new).get("allocation"))
        if not freed:
            # Cheap tests first (no cache lookups): is it one of this pod's claims at all?
            if new is None:
                return QueueingHint.SKIP
            new_meta = _meta(new)
            if (new_meta.get("namespace") or "default") != (_meta(pod).get("namespace") or "default"):
                return QueueingHint.SKIP
            if not _mentions_claim(pod, new_meta.get("name")):
                return QueueingHint.SKIP
            try:
                names = {n for _, n, _ in pod_claim_names(pod) if n is not None}
            except ClaimError:
                return QueueingHint.SKIP
            ns = _meta(pod).get("namespace") or "default"
            if (_meta(new).get("namespace") or "default") != ns or _meta(new).get("name") not in names:
                return QueueingHint.SKIP
        try:
            self.pod_claims(pod)
        except ClaimError:
            return QueueingHint.SKIP
        if freed:
            return QueueingHint.QUEUE  # devices were freed
        if old is None:
            return QueueingHint.QUEUE
        if _status(old) == _status(new):
            return QueueingHint.SKIP  # e.g. only the finalizer changed
        return QueueingHint.QUEUE

    def is_schedulable_after_pod_change(self, pod: Obj, old: Any, new: Any) -> QueueingHint:
        """A generated claim was recorded: queue that same pod once all its claims exist."""
        if new is None or _meta(new).get("uid") != _meta(pod).get("uid"):
            return QueueingHint.SKIP
        try:
            self.pod_claims(new)
        except ClaimError:
            return QueueingHint.SKIP
        return QueueingHint.QUEUE

    # Which pods each hint can queue, for the queue's pre-selection (see HintScope).
    is_schedulable_after_claim_change.queue_scope = CLAIM_HINT_SCOPE  # type: ignore[attr-defined]
    is_schedulable_after_pod_change.queue_scope = POD_HINT_SCOPE  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ filtering

    def pre_filter(
        self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]
    ) -> tuple[PreFilterResult | None, Status | None]:
        pod = pod_info.pod
        if not (pod.get("spec") or {}).get("resourceClaims"):
            return None, Status.skip()
        try:
            claims = self.pod_claims(pod)
        except ClaimError as err:
            return None, _unresolvable(str(err))
        if not claims:
            return None, Status.skip()
        assert self.manager is not None
        s = _State(claims, [_ClaimInfo() for _ in claims], nodes=nodes)
        for i, claim in enumerate(claims):
            name = _meta(claim).get("name") or ""
            alloc = _status(claim).get("allocation")
            if alloc:
                reserved = _status(claim).get("reservedFor") or ()
                if not is_reserved_for_pod(claim, pod_info.uid) and len(reserved) >= RESERVED_FOR_MAX_SIZE:
                    return None, _unresolvable(f'resourceclaim "{name}" in use')
                if alloc.get("nodeSelector"):
                    s.infos[i].available_on = NodeSelector(alloc["nodeSelector"])
                    s.has_selectors = True
                continue
            if self.manager.claim_has_pending_allocation(_meta(claim).get("uid") or ""):
                return None, _unresolvable(f'resourceclaim "{name}" is in the process of being allocated')
            st = self._check_requests(claim)
            if st is not None:
                return None, st
            s.to_allocate.append(i)
        if s.to_allocate:
            s.snapshot_pos, allocated = self.manager.allocated_snapshot()
            try:
                s.allocator = Allocator(
                    [claims[i] for i in s.to_allocate],
                    allocated,
                    self.manager.classes(),
                    (),
                    match_cache=self.manager.match_cache,
                    pool_index=self.manager.pool_index(),
                )
            except AllocationError as err:
                return None, Status.as_status(err)
        state.write(STATE_KEY, s)
        return None, None

    def _check_requests(self, claim: Obj) -> Status | None:
        assert self.manager is not None
        name = _meta(claim).get("name") or ""
        for req in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ():
            rname = req.get("name") or ""
            if req.get("exactly") is not None:
                specs = [(rname, req["exactly"])]
            elif req.get("firstAvailable"):
                specs = [(f"{rname}/{sub.get('name') or ''}", sub) for sub in req["firstAvailable"]]
            else:
                return _unresolvable(f'resourceclaim "{name}", request {rname}: unsupported request type')
            for where, spec in specs:
                cls = spec.get("deviceClassName") or ""
                if not cls:
                    err = ValueError(f'resourceclaim "{name}", request {where}: missing device class name')
                    return Status.as_status(err)
                if self.manager.get_class(cls) is None:
                    # Wait for a DeviceClass event.
                    return _unresolvable(f'request {where}: device class {cls} does not exist')
        return None

    def filter(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> Status | None:
        s: _State | None = state.get(STATE_KEY)
        if s is None:
            return None
        failing = s.known_failures
        if failing is not None:
            cached = failing.get(node_info.name)
            if cached is not None:
                return Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, [cached])
        node = node_info.node or {}
        unavailable = [i for i, info in enumerate(s.infos)
                       if info.available_on is not None and not info.available_on.matches(node)] \
            if s.has_selectors else ()
        results: DeferredAllocation | None = None
        if s.allocator is not None:
            vc = s.verdicts
            try:
                results, reason = s.allocator.explain_deferred(node)
            except AllocationError as err:
                return Status.as_status(err)
            if results is None or len(results) != len(s.to_allocate):
                reason = (reason or REASON_CANNOT_ALLOCATE) if results is None else REASON_CANNOT_ALLOCATE
                if vc is not None:
                    vc.record(s.shape_key, node_info.name, s.snapshot_pos, False, reason)
                return _unresolvable(reason)
            if vc is not None:
                vc.record(s.shape_key, node_info.name, s.snapshot_pos, True)
        if unavailable:
            with s.lock:
                s.unavailable.update(unavailable)
            return _unresolvable(MSG_NOT_AVAILABLE)
        if results is not None:
            with s.lock:
                s.node_allocations[node_info.name] = results
        return None

    def filter_pass_except(self, state: CycleState, pod_info: PodInfo) -> set[str] | PassOnly | tuple[()] | None:
        """Nodes where Filter may fail for this pod; it certainly succeeds elsewhere.

        Verdicts of earlier pods with the same allocation shape are reused
        while the node's devices did not change (see
        :class:`~kubeplane.scheduler.plugins.dynamicresources.dra_manager.NodeVerdictCache`); the
        nodes without such a successful verdict are listed (or, when they
        are most nodes, ``PassOnly`` of the nodes with one). None (no
        vectorised form) when an allocated claim restricts nodes or pools
        depend on more than the node name."""
        s: _State | None = state.get(STATE_KEY)
        if s is None:
            return ()
        if s.has_selectors:
            return None
        if s.allocator is None:
            return ()
        index = s.allocator.pool_index
        if not index.per_node_name or self.manager is None:
            return None
        key = s.allocator.shape_key()
        if key is None:
            return None
        vc = NodeVerdictCache.for_index(index, self.manager)
        s.verdicts, s.shape_key = vc, key
        exceptions, s.known_failures = vc.begin(key, self._nodes_by_name(s.nodes).keys())
        return exceptions

    def filter_known_failures(self, state: CycleState, pod_info: PodInfo) -> Mapping[str, str] | None:
        """After :meth:`filter_pass_except`: nodes on which Filter certainly
        returns UnschedulableAndUnresolvable with the given single reason
        (None when unknown). The mapping is read-only for callers and may
        grow while Filter runs in this cycle."""
        s: _State | None = state.get(STATE_KEY)
        return None if s is None else s.known_failures

    def filter_known_statuses(self, state: CycleState, pod_info: PodInfo) -> Mapping[str, Status] | None:
        """After :meth:`filter_pass_except`: the Status Filter returns on the nodes
        where it is already known (see :meth:`filter_known_failures`), by node
        name; None when unknown. Equal statuses are one shared object (also
        across cycles); the mapping is live and read-only for callers."""
        s: _State | None = state.get(STATE_KEY)
        if s is None or s.known_failures is None or s.verdicts is None:
            return None
        return s.verdicts.failing_statuses(s.shape_key, _failure_status)

    def filter_known_rejections(self, state: CycleState, pod_info: PodInfo, rows: Mapping[str, int],
                                n: int) -> Any:
        """After :meth:`filter_pass_except`: a bool array by row (``rows`` maps node
        names to rows, ``n`` rows in all), True where Filter certainly rejects
        the node with the status :meth:`filter_known_statuses` gives; None when
        unknown. Live and read-only for callers."""
        s: _State | None = state.get(STATE_KEY)
        if s is None or s.known_failures is None or s.verdicts is None:
            return None
        return s.verdicts.failing_mask(s.shape_key, rows, n)

    def _nodes_by_name(self, nodes: list[NodeInfo]) -> dict[str, NodeInfo]:
        """``nodes`` by name, memoized for the last list seen (the snapshot keeps
        its list while the set of nodes does not change)."""
        cached = self._names_cache
        if cached is not None and cached[0] is nodes and cached[1] == len(nodes):
            return cached[2]
        by_name = {ni.name: ni for ni in nodes}
        self._names_cache = (nodes, len(nodes), by_name)
        return by_name

    def post_filter(
        self, state: CycleState, pod_info: PodInfo, filtered_statuses: dict[str, Status]
    ) -> tuple[str | None, Status]:
        """Deallocate one unavailable claim that only this pod uses (status write in the background).

        Returns plain Unschedulable so later PostFilter plugins (preemption) still run."""
        s: _State | None = state.get(STATE_KEY)
        if s is None or not s.unavailable or self.handle.client is None:
            return None, Status.unschedulable("no new claims to deallocate")
        indices = sorted(s.unavailable)
        self.handle.rng.shuffle(indices)
        for i in indices:
            claim = s.claims[i]
            reserved = _status(claim).get("reservedFor") or []
            if reserved and not (len(reserved) == 1 and reserved[0].get("uid") == pod_info.uid):
                continue
            # Shallow copy of the changed parts: cached objects stay untouched.
            st = {k: v for k, v in _status(claim).items() if k not in ("reservedFor", "allocation", "devices")}
            new = {**claim, "status": st}
            self._spawn(self._write_status(new, "deallocating"))
            return None, Status.unschedulable(MSG_DEALLOCATED)
        return None, Status.unschedulable(MSG_STILL_UNSCHEDULABLE)

    # ------------------------------------------------------------------ reserve

    def reserve(self, state: CycleState, pod_info: PodInfo, node_name: str) -> Status | None:
        s: _State | None = state.get(STATE_KEY)
        if s is None or not s.to_allocate:
            return None
        assert self.manager is not None
        deferred = s.node_allocations.get(node_name)
        if deferred is None and s.allocator is not None:
            # Filter need not have run here (filter_pass_except): allocate now.
            ni = self._nodes_by_name(s.nodes).get(node_name)
            if ni is not None and ni.node is not None:
                try:
                    deferred, _ = s.allocator.explain_deferred(ni.node)
                except AllocationError as err:
                    return Status.as_status(err)
                if deferred is not None:
                    with s.lock:
                        s.node_allocations[node_name] = deferred
        results = deferred.results() if deferred is not None else None
        if results is None or len(results) != len(s.to_allocate):
            return Status.as_status(RuntimeError(f"internal error: no allocation results cached for node {node_name}"))
        signalled: list[str] = []
        for k, i in enumerate(s.to_allocate):
            claim = s.claims[i]
            uid = _meta(claim).get("uid") or ""
            # Shallow copy of the changed parts: cached objects stay untouched.
            meta = _meta(claim)
            fins = list(meta.get("finalizers") or ())
            if FINALIZER not in fins:
                fins.append(FINALIZER)
            allocated = {**claim, "metadata": {**meta, "finalizers": fins},
                         "status": {**_status(claim), "allocation": results[k]}}
            if not self.manager.signal_claim_pending_allocation(uid, allocated):
                for u in signalled:
                    self.manager.remove_claim_pending_allocation(u)
                for j in s.to_allocate:
                    s.infos[j].allocation = None
                name = _meta(claim).get("name") or ""
                return _unresolvable(f'resourceclaim "{name}" is in the process of being allocated')
            signalled.append(uid)
            s.infos[i].allocation = results[k]
        return None

    def unreserve(self, state: CycleState, pod_info: PodInfo, node_name: str) -> None:
        s: _State | None = state.get(STATE_KEY)
        if s is None or self.manager is None:
            return
        for i, claim in enumerate(s.claims):
            meta = _meta(claim)
            if s.infos[i].allocation is not None and self.manager.remove_claim_pending_allocation(meta.get("uid") or ""):
                self.manager.assumed_claim_restore(meta.get("namespace") or "default", meta.get("name") or "")
            if _status(claim).get("allocation") and is_reserved_for_pod(claim, pod_info.uid) and self.handle.client:
                self._spawn(self._remove_reservation(claim, pod_info.uid))

    # ------------------------------------------------------------------ binding

    async def pre_bind(self, state: CycleState, pod_info: PodInfo, node_name: str) -> Status | None:
        s: _State | None = state.get(STATE_KEY)
        if s is None:
            return None
        for i, claim in enumerate(s.claims):
            if is_reserved_for_pod(claim, pod_info.uid):
                continue
            try:
                s.claims[i] = await self._bind_claim(s, i, pod_info)
            except Exception as err:  # noqa: BLE001 - reported as an Error status; Unreserve cleans up
                return Status.as_status(err)
        return None

    async def _bind_claim(self, s: _State, i: int, pod_info: PodInfo) -> Obj:
        """Finalizer (main resource) then allocation + reservedFor (status); assume; drop in-flight."""
        assert self.manager is not None and self.handle.client is not None
        client = self.handle.client
        claim = s.claims[i]
        meta = _meta(claim)
        ns, name, uid = meta.get("namespace") or "default", meta.get("name") or "", meta.get("uid") or ""
        allocation = s.infos[i].allocation
        written: Obj | None = None
        try:
            for attempt in range(BIND_RETRIES):
                if attempt:
                    claim = await client.get(RESOURCE_CLAIMS, name, ns)
                try:
                    if _meta(claim).get("deletionTimestamp"):
                        raise RuntimeError(f"resourceclaim {ns}/{name} is being deleted")
                    if _meta(claim).get("uid") != uid:
                        raise RuntimeError(f"resourceclaim {ns}/{name} was replaced (UID changed)")
                    # Request bodies are shallow copies of the changed parts: the
                    # client copies what it sends, cached objects stay untouched.
                    if allocation is not None:
                        if _status(claim).get("allocation"):
                            raise RuntimeError(f"resourceclaim {ns}/{name} got allocated elsewhere in the meantime")
                        fins = _meta(claim).get("finalizers") or []
                        if FINALIZER not in fins:
                            body = {**claim, "metadata": {**_meta(claim), "finalizers": [*fins, FINALIZER]}}
                            claim = await client.update(RESOURCE_CLAIMS, body)
                            written = claim
                        status = {**_status(claim), "allocation": allocation}
                    elif not _status(claim).get("allocation"):
                        raise RuntimeError(f"resourceclaim {ns}/{name} was deallocated in the meantime")
                    else:
                        status = dict(_status(claim))
                    status["reservedFor"] = [*(status.get("reservedFor") or ()),
                                             {"resource": "pods", "name": pod_info.name, "uid": pod_info.uid}]
                    new = await client.update(RESOURCE_CLAIMS, {**claim, "status": status}, subresource="status")
                    written = new
                    return new
                except StatusError as err:
                    if err.code != 409 or attempt == BIND_RETRIES - 1:
                        raise
            raise RuntimeError("unreachable")
        finally:
            # Assume first, so the tracker has the devices before the in-flight entry goes.
            if written is not None:
                self.manager.assume_claim_after_api_call(written)
            if allocation is not None:
                self.manager.remove_claim_pending_allocation(uid)

    # ------------------------------------------------------------------ background writes

    def _spawn(self, coro: Any) -> None:
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:
            coro.close()
            log.warning("%s: no running event loop; claim status write skipped", NAME)
            return
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def wait_for_background(self) -> None:
        """Wait for status writes started by PostFilter and Unreserve (used by tests and shutdown)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    async def _write_status(self, claim: Obj, what: str) -> None:
        assert self.handle.client is not None
        try:
            await self.handle.client.update(RESOURCE_CLAIMS, claim, subresource="status")
        except Exception as err:  # noqa: BLE001 - the claim event (or its absence) drives the retry
            log.info("%s resourceclaim %s: %s", what, _meta(claim).get("name"), err)

    async def _remove_reservation(self, claim: Obj, pod_uid: str) -> None:
        assert self.handle.client is not None
        meta = _meta(claim)
        patch = {"metadata": {"uid": meta.get("uid")},
                 "status": {"reservedFor": [{"$patch": "delete", "uid": pod_uid}]}}
        try:
            await self.handle.client.patch(RESOURCE_CLAIMS, meta.get("name") or "", patch,
                                           meta.get("namespace") or "default",
                                           patch_type="strategic", subresource="status")
        except Exception as err:  # noqa: BLE001 - logged only, as upstream
            log.info("removing pod %s from reservedFor of %s: %s", pod_uid, meta.get("name"), err)

