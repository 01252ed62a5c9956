"""VolumeBinding: bind a pod's PersistentVolumeClaims as part of scheduling.

Upstream ``pkg/scheduler/framework/plugins/volumebinding``; the work is done
by :class:`~kubeplane.scheduler.plugins.volumebinding.binder.VolumeBinder`:

* PreFilter: pods without claims Skip; missing, lost, deleting or foreign
  ephemeral claims and unbound Immediate claims are UnschedulableAndUnresolvable.
  Local-like bound PVs narrow the candidate nodes.
* Filter: bound PVs' node affinity, a static PV per delayed claim, or dynamic
  provisioning on the node (UnschedulableAndUnresolvable with upstream's reasons).
  ``filter_pass_except`` lets the vectorised Filter skip the nodes where the
  answer is the binder's node-independent shared plan; later phases then
  use that plan for a node Filter never saw.
* PreScore/Score: storage-utilisation scoring, only when ``shape`` is configured.
* Reserve: PV claimRefs and PVC selected-node annotations are only *assumed*
  in the passive caches; Unreserve restores them.
* PreBind: one update per object, then wait for the PV controller (or the
  ``bindTimeoutSeconds`` timeout). Any failure, including a 409 Conflict, is an
  Error: the pod is retried after backoff.

The binder comes from ``handle.volume_binder`` when the driver provides one;
otherwise it is built from ``handle.informer_factory`` (sharing
``handle.pv_assume_cache``/``handle.pvc_assume_cache`` when present).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Mapping

from kubeplane.api.meta import meta_of as _meta
from kubeplane.api.quantity import parse_quantity
from kubeplane.scheduler.framework.nodeinfo import NodeInfo, PodInfo
from kubeplane.scheduler.framework.plugin import Handle, Plugin
from kubeplane.scheduler.framework.types import (
    EVERY_NODE,
    MAX_NODE_SCORE,
    ActionType,
    ClusterEvent,
    ClusterEventWithHint,
    CycleState,
    EventResource,
    Obj,
    PreFilterResult,
    QueueingHint,
    Status,
)
from kubeplane.scheduler.plugins.volumebinding.passivecache import NotFoundError
from kubeplane.scheduler.framework.hintscope import HintScope, pod_independent_scope, set_hint_scope
from kubeplane.api.selectors import label_selector_from_dict
from kubeplane.volume.matching import (
    HOSTNAME_LABEL,
    claim_class,
    claim_request,
    volume_capacity,
    volume_class,
    volume_mode,
)
from kubeplane.scheduler.plugins.hint_scopes import CLAIM_HINT_SCOPE, claim_event_keys, claim_keys_of_pod
from kubeplane.scheduler.plugins.volumebinding.binder import (
    DEFAULT_BIND_TIMEOUT,
    REASON_BIND_CONFLICT,
    PodVolumeClaims,
    PodVolumes,
    VolumeBinder,
    VolumeBindingError,
    pod_claim_names,
)

NAME = "VolumeBinding"
STATE_KEY = NAME
MSG_UNBOUND_IMMEDIATE = "pod has unbound immediate PersistentVolumeClaims"
ANN_MIGRATED_PLUGINS = "storage.alpha.kubernetes.io/migrated-plugins"
MAX_UTILIZATION = 100

#: upstream default shape for StorageCapacityScoring: prefer nodes with more free space
DEFAULT_SHAPE: list[dict[str, int]] = [{"utilization": 0, "score": 10}, {"utilization": 100, "score": 0}]

__all__ = ["CLAIM_HINT_SCOPE", "DEFAULT_SHAPE", "NAME", "PV_HINT_SCOPE", "VolumeBinding",
           "build_broken_linear_function", "claim_event_keys", "claim_keys_of_pod", "pod_independent_scope",
           "set_hint_scope"]


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def build_broken_linear_function(points: list[tuple[int, int]]) -> Callable[[int], int]:
    """Piecewise-linear function through ``points`` (sorted by x), flat outside them."""

    def fn(p: int) -> int:
        for i, (x, y) in enumerate(points):
            if p <= x:
                if i == 0:
                    return points[0][1]
                x0, y0 = points[i - 1]
                return y0 + _trunc_div((y - y0) * (p - x0), x - x0)
        return points[-1][1]

    return fn


@dataclass
class _State:
    claims: PodVolumeClaims | None = None
    pod_volumes_by_node: dict[str, PodVolumes] = field(default_factory=dict)
    has_static_bindings: bool = False
    all_bound: bool = False
    #: the plan of every node outside ``shared_exceptions`` (see ``filter_pass_except``)
    shared_plan: PodVolumes | None = None
    shared_exceptions: set[str] = field(default_factory=set)
    #: the Filter status of every node outside ``shared_exceptions`` when no shared plan exists
    shared_rejection: Status | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def clone(self) -> "_State":
        return self  # shared by all phases of one cycle, as upstream


class _AllBut(Mapping[str, Status]):
    """``status`` for every node name but ``exceptions`` (a read-only mapping that
    answers lookups without listing the nodes)."""

    __slots__ = ("_exceptions", "_status")

    def __init__(self, exceptions: set[str], status: Status) -> None:
        self._exceptions = exceptions
        self._status = status

    def __getitem__(self, name: str) -> Status:
        if name in self._exceptions:
            raise KeyError(name)
        return self._status

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return default if name in self._exceptions else self._status

    def __iter__(self):  # type: ignore[no-untyped-def]
        raise TypeError("the nodes are not listed")

    def __len__(self) -> int:
        raise TypeError("the nodes are not listed")


def _pod_claim_names(pod: Obj) -> set[str]:
    names = set()
    pod_name = _meta(pod).get("name", "")
    for vol in (pod.get("spec") or {}).get("volumes") or []:
        if not isinstance(vol, dict):
            continue
        if isinstance(vol.get("persistentVolumeClaim"), dict):
            names.add(vol["persistentVolumeClaim"].get("claimName"))
        elif vol.get("ephemeral") is not None:
            names.add(f"{pod_name}-{vol.get('name')}")
    return names


class HintMemo:
    """Per-object memos for the queueing hints, which run for every waiting pod
    on every PV/PVC event. Entries are keyed by object identity (informer
    objects are replaced, never mutated) and the tables are bounded."""

    LIMIT = 20000

    def __init__(self) -> None:
        self._pods: dict[int, tuple[Obj, frozenset[str], Any]] = {}
        self._pods_pvc: dict[int, tuple[Obj, frozenset[str]]] = {}
        self._claims: dict[int, tuple[Obj, tuple[Any, ...]]] = {}
        self._pv: tuple[Any, tuple[Any, ...]] | None = None

    def pod_claims(self, pod: Obj) -> tuple[Obj, frozenset[str], Any]:
        """``(pod, its claim names as _pod_claim_names gives them, its namespace)``."""
        hit = self._pods.get(id(pod))
        if hit is not None and hit[0] is pod:
            return hit
        entry = (pod, frozenset(_pod_claim_names(pod)), _meta(pod).get("namespace"))
        if len(self._pods) >= self.LIMIT:
            self._pods.clear()
        self._pods[id(pod)] = entry
        return entry

    def pod_claims_pvc(self, pod: Obj) -> frozenset[str]:
        """The claim names of :func:`pod_claim_names` (the PVC hint's view)."""
        hit = self._pods_pvc.get(id(pod))
        if hit is not None and hit[0] is pod:
            return hit[1]
        names = frozenset(n for n, _ in pod_claim_names(pod))
        if len(self._pods_pvc) >= self.LIMIT:
            self._pods_pvc.clear()
        self._pods_pvc[id(pod)] = (pod, names)
        return names

    def pv_facts(self, pv: Obj) -> tuple[Any, ...]:
        """``(name, deleting, claimRef, phase, capacity, class, volume mode, access modes, labels)``."""
        hit = self._pv
        if hit is not None and hit[0] is pv:
            return hit[1]
        md = _meta(pv)
        spec = pv.get("spec") or {}
        facts = (md.get("name"), bool(md.get("deletionTimestamp")), spec.get("claimRef") or {},
                 (pv.get("status") or {}).get("phase"), volume_capacity(pv), volume_class(pv), volume_mode(pv),
                 frozenset(spec.get("accessModes") or ()), md.get("labels") or {})
        self._pv = (pv, facts)
        return facts

    def claim_facts(self, claim: Obj) -> tuple[Any, ...]:
        """``(volumeName, request, class, volume mode, access modes, selector dict, [compiled selector])``."""
        hit = self._claims.get(id(claim))
        if hit is not None and hit[0] is claim:
            return hit[1]
        spec = claim.get("spec") or {}
        facts = (spec.get("volumeName"), claim_request(claim), claim_class(claim), volume_mode(claim),
                 tuple(spec.get("accessModes") or ()), spec.get("selector"), [])
        if len(self._claims) >= self.LIMIT:
            self._claims.clear()
        self._claims[id(claim)] = (claim, facts)
        return facts


def pv_change_hint(
    pod: Obj, pv: Any, lookup: Callable[[str, str], Obj | None], memo: HintMemo | None = None
) -> QueueingHint:
    """Queueing hint for a PV add/update (see VolumeBinding.is_schedulable_after_pv_change).

    ``memo`` caches per-object work across calls; the answer is the same without it."""
    memo = memo or HintMemo()
    hit = memo._pods.get(id(pod))
    if hit is None or hit[0] is not pod:
        hit = memo.pod_claims(pod)
    claims = hit[1]
    if not claims:
        return QueueingHint.SKIP
    if not isinstance(pv, dict):
        return QueueingHint.QUEUE
    last = memo._pv
    name, deleting, ref, phase, capacity, cls, mode, modes, labels = (
        last[1] if last is not None and last[0] is pv else memo.pv_facts(pv))
    if deleting:
        return QueueingHint.SKIP
    ns = hit[2]
    if ref:
        if ref.get("name") in claims and ref.get("namespace") == ns:
            return QueueingHint.QUEUE
        return QueueingHint.SKIP
    if phase != "Available":
        return QueueingHint.SKIP
    for claim_name in claims:
        claim = lookup(ns, claim_name)
        if claim is None:
            return QueueingHint.QUEUE  # unknown claim: let the cycle decide
        volume_name, request, claim_cls, claim_mode, claim_modes, selector, compiled = memo.claim_facts(claim)
        if volume_name:
            if volume_name == name:
                return QueueingHint.QUEUE
            continue
        # check_volume_satisfies_claim on the memoized facts
        if capacity < request or cls != claim_cls or mode != claim_mode or not all(m in modes for m in claim_modes):
            continue
        if selector is not None:
            if not compiled:
                compiled.append(label_selector_from_dict(selector))
            if not compiled[0].matches(labels):
                continue
        return QueueingHint.QUEUE
    return QueueingHint.SKIP


# ---------------------------------------------------------------- hint scopes
# Which pods each queueing hint can answer Queue for (see queue.HintScope).
# Every scope's pod keys are a superset of what its hint tests, and its
# event keys are computed with the same accesses as the hint, so a malformed
# object raises there too (the queue then pre-selects nothing).

_SCOPE_MEMO = HintMemo()


def _pv_keys_of_pod(pod: Obj) -> list[tuple[Any, Any]]:
    ns = _meta(pod).get("namespace")
    return [(ns, name) for name in _pod_claim_names(pod)]


def _pv_event_keys(old: Any, new: Any) -> list[tuple[Any, Any]] | None:
    """Mirror of :func:`pv_change_hint`'s pod-independent branches: a deleting
    PV or one neither claimed nor Available helps no pod; a claimed PV only the
    pods naming its claimRef; an Available unclaimed PV any pod (None)."""
    if not isinstance(new, dict):
        return None
    _, deleting, ref, phase, *_ = _SCOPE_MEMO.pv_facts(new)
    if deleting:
        return []
    if ref:
        return [(ref.get("namespace"), ref.get("name"))]
    if phase != "Available":
        return []
    return None


#: pv_change_hint's pod-independent part, keyed by (raw namespace, claim name) as the
#: hint compares them; each plugin registers the narrower scope of ``_scoped_pv_hint``
PV_HINT_SCOPE = HintScope(_pv_keys_of_pod, _pv_event_keys)

#: a pod key (and a key of every Available unclaimed PV's event) for a claim not
#: known yet, or one whose selector does not compile
_UNKNOWN_CLAIM = ("unknown-claim",)


def _pv_event_keys_by_claim(old: Any, new: Any) -> list[Any] | None:
    """:func:`_pv_event_keys`, with an Available unclaimed PV keyed by what a claim
    it could serve has (see ``VolumeBinding._pv_keys_of_pod``): its name, its
    class, and its class with each of its labels."""
    keys = _pv_event_keys(old, new)
    if keys is not None:
        return keys
    name, _, _, _, _, cls, _, _, labels = _SCOPE_MEMO.pv_facts(new)
    out: list[Any] = [_UNKNOWN_CLAIM, ("volume", name), ("class", cls, None)]
    out.extend(("class", cls, (k, v)) for k, v in labels.items())
    return out


def _csi_driver_keys_of_pod(pod: Obj) -> list[Any]:
    return [(vol.get("csi") or {}).get("driver") for vol in (pod.get("spec") or {}).get("volumes") or ()
            if vol.get("csi") is not None]


def _csi_driver_event_keys(old: Any, new: Any) -> list[Any]:
    if old is None or new is None:
        return []
    driver = _meta(new).get("name")
    if (old.get("spec") or {}).get("storageCapacity") and not (new.get("spec") or {}).get("storageCapacity"):
        return [driver]
    return []


#: is_schedulable_after_csi_driver_change: only pods with an inline CSI volume of the driver
CSI_DRIVER_HINT_SCOPE = HintScope(_csi_driver_keys_of_pod, _csi_driver_event_keys)


class VolumeBinding(Plugin):
    """See the module docstring."""

    name = NAME

    def __init__(self, args: dict | None, handle: Handle) -> None:
        super().__init__(args, handle)
        self.bind_timeout = float(self.args.get("bindTimeoutSeconds", DEFAULT_BIND_TIMEOUT))
        self.scorer: Callable[[dict[str, tuple[Fraction, Fraction]]], int] | None = None
        if "shape" in self.args:
            self.scorer = self._build_scorer(self.args.get("shape") or DEFAULT_SHAPE)
        self._hint_memo = HintMemo()
        self._pv_hint = self._scoped_pv_hint()
        self.binder: VolumeBinder | None = handle.volume_binder  # type: ignore[assignment]
        if self.binder is None and handle.informer_factory is not None:
            self.binder = VolumeBinder.from_informer_factory(
                handle.informer_factory, client=handle.client,
                pv_cache=handle.pv_assume_cache, pvc_cache=handle.pvc_assume_cache,
                bind_timeout=self.bind_timeout)
            handle.volume_binder = self.binder

    @staticmethod
    def _build_scorer(shape: list[Mapping[str, Any]]) -> Callable[[dict[str, tuple[Fraction, Fraction]]], int]:
        points = sorted((int(p.get("utilization", 0)), int(p.get("score", 0)) * (MAX_NODE_SCORE // 10))
                        for p in shape)
        fn = build_broken_linear_function(points)

        def scorer(classes: dict[str, tuple[Fraction, Fraction]]) -> int:
            if not classes:
                return 0
            total = 0
            for requested, capacity in classes.values():
                if capacity == 0 or requested > capacity:
                    util = MAX_UTILIZATION
                else:
                    util = int(requested * MAX_UTILIZATION // capacity)
                total += fn(util)
            return round(total / len(classes))

        return scorer

    # ------------------------------------------------------------------ events

    def events_to_register(self) -> list[ClusterEventWithHint]:
        return [
            ClusterEventWithHint(ClusterEvent(EventResource.STORAGE_CLASS, ActionType.ADD | ActionType.UPDATE),
                                 self.is_schedulable_after_storage_class_change),
            ClusterEventWithHint(ClusterEvent(EventResource.PERSISTENT_VOLUME_CLAIM,
                                              ActionType.ADD | ActionType.UPDATE),
                                 self.is_schedulable_after_pvc_change),
            ClusterEventWithHint(ClusterEvent(EventResource.PERSISTENT_VOLUME, ActionType.ADD | ActionType.UPDATE),
                                 self._pv_hint),
            ClusterEventWithHint(ClusterEvent(EventResource.NODE, ActionType.ADD | ActionType.UPDATE_NODE_LABEL)),
            ClusterEventWithHint(ClusterEvent(EventResource.CSI_NODE, ActionType.ADD | ActionType.UPDATE),
                                 self.is_schedulable_after_csi_node_change),
            ClusterEventWithHint(ClusterEvent(EventResource.CSI_DRIVER, ActionType.UPDATE),
                                 self.is_schedulable_after_csi_driver_change),
            ClusterEventWithHint(ClusterEvent(EventResource.CSI_STORAGE_CAPACITY, ActionType.ADD | ActionType.UPDATE),
                                 self.is_schedulable_after_capacity_change),
        ]

    def is_schedulable_after_pv_change(self, pod: Obj, old: Any, new: Any) -> QueueingHint:
        """Upstream queues any PV event for a pod with claims. We queue only
        when the PV could serve one of the pod's claims now: matching
        considers Available PVs (and PVs pre-bound to the claim) of the
        claim's class, size, modes and selector. A just-created PV (not yet
        Available) or one meant for other claims cannot help; retrying on it
        would only fail and double the pod's backoff, delaying the attempt
        that the PV's own transition to Available (an event of its own) makes
        possible."""
        return pv_change_hint(pod, new, self._claim_lookup, self._hint_memo)

    def _scoped_pv_hint(self) -> Callable[[Obj, Any, Any], QueueingHint]:
        """:meth:`is_schedulable_after_pv_change` with a scope that also reads the pods'
        claims: an Available unclaimed PV then concerns only the pods with a claim of
        its class whose selector it can meet (one matchLabels pair of the claim is
        looked up in the PV's labels), a claim naming it, or a claim not known yet,
        instead of every pod with claims. The pod's keys are taken when it enters
        the unschedulable pool; any change of its claims moves it out of the pool
        (this plugin's claim hint), so they stay current while it waits there."""
        def is_schedulable_after_pv_change(pod: Obj, old: Any, new: Any) -> QueueingHint:
            return self.is_schedulable_after_pv_change(pod, old, new)

        set_hint_scope(is_schedulable_after_pv_change, HintScope(self._pv_keys_of_pod, _pv_event_keys_by_claim))
        return is_schedulable_after_pv_change

    def _pv_keys_of_pod(self, pod: Obj) -> list[Any]:
        ns = _meta(pod).get("namespace")
        keys: list[Any] = []
        for name in _pod_claim_names(pod):
            keys.append((ns, name))  # PVs whose claimRef names the claim
            claim = self._claim_lookup(ns, name)  # as pv_change_hint looks it up
            if claim is None:
                keys.append(_UNKNOWN_CLAIM)
                continue
            volume_name, _, cls, _, _, selector, compiled = self._hint_memo.claim_facts(claim)
            if volume_name:
                keys.append(("volume", volume_name))
                continue
            pair = None
            if selector is not None:
                try:
                    if not compiled:
                        compiled.append(label_selector_from_dict(selector))
                    labels = selector.get("matchLabels")
                except Exception:  # noqa: BLE001 - a malformed selector: the hint decides
                    keys.append(_UNKNOWN_CLAIM)
                    continue
                if isinstance(labels, dict) and labels:
                    k = min((k for k in labels if isinstance(k, str)), default=None)
                    if k is not None and isinstance(labels[k], str):
                        pair = (k, labels[k])
            keys.append(("class", cls, pair))
        return keys

    def _claim_lookup(self, namespace: str, name: str) -> Obj | None:
        if self.binder is None:
            return None
        return self.binder.pvc_cache.get(f"{namespace}/{name}")

    @staticmethod
    def is_schedulable_after_storage_class_change(pod: Obj, old: Any, new: Any) -> QueueingHint:
        if old is None or (old.get("allowedTopologies") or None) != ((new or {}).get("allowedTopologies") or None):
            return QueueingHint.QUEUE
        return QueueingHint.SKIP

    def is_schedulable_after_pvc_change(self, pod: Obj, old: Any, new: Any) -> QueueingHint:
        if new is None:
            return QueueingHint.SKIP
        ns = _meta(pod).get("namespace") or "default"
        if (_meta(new).get("namespace") or "default") != ns:
            return QueueingHint.SKIP
        names = self._hint_memo.pod_claims_pvc(pod)
        return QueueingHint.QUEUE if _meta(new).get("name") in names else QueueingHint.SKIP

    @staticmethod
    def is_schedulable_after_csi_node_change(pod: Obj, old: Any, new: Any) -> QueueingHint:
        if old is None:
            return QueueingHint.QUEUE
        before = (_meta(old).get("annotations") or {}).get(ANN_MIGRATED_PLUGINS)
        after = (_meta(new or {}).get("annotations") or {}).get(ANN_MIGRATED_PLUGINS)
        return QueueingHint.QUEUE if before != after else QueueingHint.SKIP

    @staticmethod
    def is_schedulable_after_csi_driver_change(pod: Obj, old: Any, new: Any) -> QueueingHint:
        if old is None or new is None:
            return QueueingHint.SKIP
        driver = _meta(new).get("name")
        for vol in (pod.get("spec") or {}).get("volumes") or ():
            if (vol.get("csi") or {}).get("driver") != driver or vol.get("csi") is None:
                continue
            if (old.get("spec") or {}).get("storageCapacity") and not (new.get("spec") or {}).get("storageCapacity"):
                return QueueingHint.QUEUE
        return QueueingHint.SKIP

    @staticmethod
    def _volume_limit(cap: Mapping[str, Any]) -> Fraction | None:
        raw = cap.get("maximumVolumeSize")
        if raw is None:
            raw = cap.get("capacity")
        return parse_quantity(raw) if raw is not None else None

    @classmethod
    def is_schedulable_after_capacity_change(cls, pod: Obj, old: Any, new: Any) -> QueueingHint:
        if old is None:
            return QueueingHint.QUEUE
        old_limit = cls._volume_limit(old)
        new_limit = cls._volume_limit(new or {})
        if new_limit is not None and (old_limit is None or new_limit > old_limit):
            return QueueingHint.QUEUE
        return QueueingHint.SKIP

    # ------------------------------------------------------------------ PreFilter

    def _check_claims_exist(self, pod: Obj) -> Status | None:
        """The lister checks of upstream ``podHasPVCs`` (informer view, no assumptions)."""
        assert self.binder is not None
        md = _meta(pod)
        ns = md.get("namespace") or "default"
        for name, ephemeral in pod_claim_names(pod):
            try:
                pvc = self.binder.pvc_cache.get_api_obj(f"{ns}/{name}")
            except NotFoundError:
                if ephemeral:
                    return Status.unresolvable(
                        f'waiting for ephemeral volume controller to create the persistentvolumeclaim "{name}"')
                return Status.unresolvable(f'persistentvolumeclaim "{name}" not found')
            if (pvc.get("status") or {}).get("phase") == "Lost":
                volume = (pvc.get("spec") or {}).get("volumeName") or ""
                return Status.unresolvable(
                    f'persistentvolumeclaim "{name}" bound to non-existent persistentvolume "{volume}"')
            if _meta(pvc).get("deletionTimestamp"):
                return Status.unresolvable(f'persistentvolumeclaim "{name}" is being deleted')
            if ephemeral and not any(ref.get("controller") and ref.get("uid") == md.get("uid")
                                     for ref in _meta(pvc).get("ownerReferences") or ()):
                return Status.unresolvable(
                    f'PVC {ns}/{name} was not created for pod {ns}/{md.get("name") or ""} (pod is not owner)')
        return None

    def pre_filter(
        self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]
    ) -> tuple[PreFilterResult | None, Status | None]:
        pod = pod_info.pod
        if not pod_claim_names(pod):
            state.write(STATE_KEY, _State())
            return None, Status.skip()
        if self.binder is None:
            return None, Status.as_status(RuntimeError("VolumeBinding has no informers to read volumes from"))
        st = self._check_claims_exist(pod)
        if st is not None:
            return None, st
        try:
            claims = self.binder.get_pod_volume_claims(pod)
        except VolumeBindingError as err:
            return None, Status.as_status(err)
        if claims.unbound_claims_immediate:
            return None, Status.unresolvable(MSG_UNBOUND_IMMEDIATE)
        result = None
        eligible = self.binder.get_eligible_nodes(claims.bound_claims)
        if eligible is not None:
            result = PreFilterResult(eligible)
        state.write(STATE_KEY, _State(claims=claims))
        return result, None

    # ------------------------------------------------------------------ Filter

    def filter(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> Status | None:
        s: _State | None = state.get(STATE_KEY)
        if s is None:
            return Status.as_status(KeyError(f"{STATE_KEY!r} not found in cycle state"))
        if s.claims is None or self.binder is None or node_info.node is None:
            return None
        try:
            pod_volumes, reasons = self.binder.find_pod_volumes(pod_info.pod, s.claims, node_info.node)
        except VolumeBindingError as err:
            return Status.as_status(err)
        if reasons:
            return Status.unresolvable(*reasons)
        with s.lock:
            s.pod_volumes_by_node[node_info.name] = pod_volumes
            s.has_static_bindings = s.has_static_bindings or bool(pod_volumes.static_bindings)
        return None

    def filter_pass_except(self, state: CycleState, pod_info: PodInfo) -> set[str] | None:
        """Nodes where Filter must run; every other node passes with the shared plan.

        The binder's shared plan holds on every node whose hostname label has
        no pinned candidate volume; those few nodes (looked up in the
        snapshot) are the exceptions. Without a shared plan, when every such
        node is rejected for the same reason (a claim with no volume for it
        that cannot be provisioned: a pod waiting for its PV), ``EVERY_NODE``:
        :meth:`filter_known_statuses` then states those rejections at once and
        only the exceptions run Filter. None otherwise."""
        s: _State | None = state.get(STATE_KEY)
        if s is None or self.binder is None:
            return None
        if s.claims is None:
            return set()
        try:
            plan = self.binder.shared_plan(s.claims)
            rejected = plan is None and self.binder.rejects_unpinned_nodes(s.claims)
        except VolumeBindingError:
            return None
        if plan is None and not rejected:
            return None
        exceptions: set[str] = set()
        pinned = s.claims.pinned_hostnames
        if pinned or plan is None:
            for ni in self.handle.node_infos():
                node = ni.node
                if node is None or (pinned and (_meta(node).get("labels") or {}).get(HOSTNAME_LABEL) in pinned):
                    exceptions.add(ni.name)
        with s.lock:
            s.shared_exceptions = exceptions
            if plan is None:
                s.shared_rejection = Status.unresolvable(REASON_BIND_CONFLICT, plugin=self.name)
                return EVERY_NODE
            s.shared_plan = plan
            s.has_static_bindings = s.has_static_bindings or bool(plan.static_bindings)
        return exceptions

    def filter_known_statuses(self, state: CycleState, pod_info: PodInfo) -> Mapping[str, Status] | None:
        """After :meth:`filter_pass_except` answered ``EVERY_NODE``: the rejection of
        every node outside its exceptions, by node name (read-only)."""
        s: _State | None = state.get(STATE_KEY)
        if s is None or s.shared_rejection is None:
            return None
        return _AllBut(s.shared_exceptions, s.shared_rejection)

    def _plan_for(self, s: _State, node_name: str) -> PodVolumes | None:
        """Filter's plan for ``node_name``, or the shared plan when Filter was skipped there."""
        pod_volumes = s.pod_volumes_by_node.get(node_name)
        if pod_volumes is None and s.shared_plan is not None and node_name not in s.shared_exceptions:
            plan = s.shared_plan
            pod_volumes = PodVolumes(list(plan.static_bindings), list(plan.dynamic_provisions))
            with s.lock:
                pod_volumes = s.pod_volumes_by_node.setdefault(node_name, pod_volumes)
        return pod_volumes

    # ------------------------------------------------------------------ scoring

    def pre_score(self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]) -> Status | None:
        if self.scorer is None:
            return Status.skip()
        s: _State | None = state.get(STATE_KEY)
        if s is None:
            return Status.as_status(KeyError(f"{STATE_KEY!r} not found in cycle state"))
        plans = list(s.pod_volumes_by_node.values())
        if s.shared_plan is not None:
            plans.append(s.shared_plan)
        has_dynamic = any(p.node_capacity is not None for pv in plans for p in pv.dynamic_provisions)
        return None if s.has_static_bindings or has_dynamic else Status.skip()

    def score(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> tuple[int, Status | None]:
        if self.scorer is None:
            return 0, None
        s: _State | None = state.get(STATE_KEY)
        if s is None:
            return 0, Status.as_status(KeyError(f"{STATE_KEY!r} not found in cycle state"))
        pod_volumes = self._plan_for(s, node_info.name)
        if pod_volumes is None:
            return 0, None
        classes: dict[str, tuple[Fraction, Fraction]] = {}
        for b in pod_volumes.static_bindings:
            req, cap = classes.get(b.storage_class, (Fraction(0), Fraction(0)))
            classes[b.storage_class] = (req + b.requested, cap + b.capacity)
        if not pod_volumes.static_bindings:
            for p in pod_volumes.dynamic_provisions:
                if p.node_capacity is None:
                    continue
                cls = p.node_capacity.get("storageClassName") or ""
                req, _ = classes.get(cls, (Fraction(0), Fraction(0)))
                raw = p.node_capacity.get("capacity")
                cap = parse_quantity(raw) if raw is not None else Fraction(0)
                request = ((p.pvc.get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage")
                classes[cls] = (req + (parse_quantity(request) if request is not None else 0), cap)
        return self.scorer(classes), None

    # ------------------------------------------------------------------ Reserve / Unreserve

    def reserve(self, state: CycleState, pod_info: PodInfo, node_name: str) -> Status | None:
        s: _State | None = state.get(STATE_KEY)
        if s is None:
            return Status.as_status(KeyError(f"{STATE_KEY!r} not found in cycle state"))
        pod_volumes = self._plan_for(s, node_name)
        if pod_volumes is None or self.binder is None:
            s.all_bound = True
            return None
        try:
            s.all_bound = self.binder.assume_pod_volumes(pod_info.pod, node_name, pod_volumes)
        except Exception as err:  # noqa: BLE001 - cache errors become an Error status
            return Status.as_status(err)
        return None

    def unreserve(self, state: CycleState, pod_info: PodInfo, node_name: str) -> None:
        s: _State | None = state.get(STATE_KEY)
        if s is None or self.binder is None:
            return
        pod_volumes = self._plan_for(s, node_name)
        if pod_volumes is not None:
            self.binder.revert_assumed_pod_volumes(pod_volumes)

    # ------------------------------------------------------------------ PreBind

    async def pre_bind(self, state: CycleState, pod_info: PodInfo, node_name: str) -> Status | None:
        s: _State | None = state.get(STATE_KEY)
        if s is None:
            return Status.as_status(KeyError(f"{STATE_KEY!r} not found in cycle state"))
        if s.all_bound:
            return None
        pod_volumes = self._plan_for(s, node_name)
        if pod_volumes is None or self.binder is None:
            return Status.as_status(RuntimeError(f'no pod volumes found for node "{node_name}"'))
        try:
            await self.binder.bind_pod_volumes(pod_info.pod, node_name, pod_volumes)
        except Exception as err:  # noqa: BLE001 - Conflict, timeout, reset claimRef: retry the pod
            return Status.as_status(err)
        return None


set_hint_scope(VolumeBinding.is_schedulable_after_pvc_change, CLAIM_HINT_SCOPE)
set_hint_scope(VolumeBinding.is_schedulable_after_csi_driver_change, CSI_DRIVER_HINT_SCOPE)
for _hint in (VolumeBinding.is_schedulable_after_storage_class_change,
              VolumeBinding.is_schedulable_after_csi_node_change,
              VolumeBinding.is_schedulable_after_capacity_change):
    set_hint_scope(_hint, pod_independent_scope(_hint))
del _hint
