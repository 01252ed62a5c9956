"""The scheduler's volume binder (upstream ``SchedulerVolumeBinder``).

Used by the VolumeBinding plugin in every phase of a pod's cycle:

* :meth:`VolumeBinder.get_pod_volume_claims` (PreFilter) classifies the pod's
  claims: bound, unbound with delayed binding (WaitForFirstConsumer) and
  unbound immediate; it indexes the candidate PVs of every delayed claim
  (kept across pods per claim shape, see :class:`SharedVolumeIndex`).
* :meth:`VolumeBinder.find_pod_volumes` (Filter) checks one node: bound PVs'
  node affinity, a static PV per delayed claim, or dynamic provisioning
  (provisioner, allowedTopologies, published storage capacity).
* :meth:`VolumeBinder.assume_pod_volumes` (Reserve) records PV claimRefs and
  PVC selected-node annotations in the passive assume caches only.
* :meth:`VolumeBinder.bind_pod_volumes` (PreBind) makes the one API update per
  object and waits until the PV controller finished the binding.

PVs and PVCs are read through passive assume caches that sit on the informers'
indexers, so a pod requeued by a PV/PVC event sees that event's object.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Iterable, Mapping, Protocol

from kubeplane.api.meta import meta_of as _meta
from kubeplane.api.errors import StatusError
from kubeplane.api.meta import deep_copy
from kubeplane.api.quantity import parse_quantity
from kubeplane.api.resources import ResourceInfo, resource
from kubeplane.api.selectors import label_selector_from_dict
from kubeplane.volume.matching import (
    ANN_BIND_COMPLETED,
    ANN_BOUND_BY_CONTROLLER,
    ANN_SELECTED_NODE,
    HOSTNAME_LABEL,
    NOT_SUPPORTED_PROVISIONER,
    annotations_of,
    check_node_affinity,
    claim_class,
    claim_request,
    ClaimVolumeIndex,
    VolumeFactsCache,
    find_matching_volume,
    index_volumes_for_claim,
    is_volume_bound_to_claim,
    pinned_hostnames,
    topology_matches,
    volume_capacity,
    volume_class,
    volume_mode,
)
from kubeplane.scheduler.plugins.volumebinding.passivecache import (
    CANDIDATE, GONE, NotFoundError, new_pv_assume_cache, new_pvc_assume_cache,
)

Obj = dict[str, Any]

PVS = resource("persistentvolumes")
PVCS = resource("persistentvolumeclaims")
STORAGE_CLASSES = resource("storageclasses")
CSI_NODES = resource("csinodes")
CSI_STORAGE_CAPACITIES = resource("csistoragecapacities")
NODES = resource("nodes")
PODS = resource("pods")

WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"

# Filter reasons (upstream ConflictReason values).
REASON_NODE_CONFLICT = "node(s) had volume node affinity conflict"
REASON_BIND_CONFLICT = "node(s) didn't find available persistent volumes to bind"
REASON_NOT_ENOUGH_SPACE = "node(s) did not have enough free storage"
REASON_PV_NOT_EXIST = "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)"

#: PreBind re-checks bindings at least this often even without informer events.
#: Every change it reads (its PVs and PVCs, its node, its pod) wakes it at once,
#: so this is only a safety net; upstream polls every second instead.
DEFAULT_POLL_INTERVAL = 5.0
DEFAULT_BIND_TIMEOUT = 600.0


class Lister(Protocol):
    """Read access to an informer's store (an :class:`~kubeplane.client.informer.Indexer`)."""

    def get_by_key(self, key: str) -> Obj | None: ...

    def list(self) -> list[Obj]: ...


class VolumeBindingError(Exception):
    """A binder step failed; the plugin turns it into an Error status."""


def _rv(obj: Mapping[str, Any]) -> str:
    return str(_meta(obj).get("resourceVersion") or "")


def _spec_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("spec") or {}


def _pv_wait_key(pv: Any) -> str:
    return "pv:" + (_meta(pv).get("name") or "")


def _pvc_wait_key(pvc: Any) -> str:
    return "pvc:" + _ns_name(pvc)


def _pv_wait_keys(pv: Any) -> tuple[str, ...]:
    """A PV's own key and, when it is bound or being bound, its claim's: a newly
    provisioned PV wakes the PreBind waiting on the claim it was made for."""
    ref = (pv.get("spec") or {}).get("claimRef") if isinstance(pv, dict) else None
    if isinstance(ref, dict) and ref.get("name"):
        return _pv_wait_key(pv), f"pvc:{ref.get('namespace') or ''}/{ref['name']}"
    return (_pv_wait_key(pv),)


def _node_wait_key(node: Any) -> str:
    return "node:" + (_meta(node).get("name") or "")


def _pod_wait_key(pod: Any) -> str:
    return "pod:" + _ns_name(pod)


class _BindWait:
    """One waiting PreBind: the future the next change of what it reads resolves."""

    __slots__ = ("fut",)

    def __init__(self) -> None:
        self.fut: asyncio.Future[None] | None = None

    def wake(self) -> None:
        fut = self.fut
        if fut is not None and not fut.done():
            fut.set_result(None)


def _ns_name(obj: Mapping[str, Any]) -> str:
    md = _meta(obj)
    return f"{md.get('namespace') or ''}/{md.get('name') or ''}"


def is_pvc_fully_bound(pvc: Mapping[str, Any]) -> bool:
    """``spec.volumeName`` set and the PV controller's bind-completed annotation present."""
    return bool((pvc.get("spec") or {}).get("volumeName")) and ANN_BIND_COMPLETED in annotations_of(pvc)


def pod_claim_names(pod: Mapping[str, Any]) -> list[tuple[str, bool]]:
    """``(claim name, is ephemeral)`` for every PVC-backed volume of the pod."""
    out: list[tuple[str, bool]] = []
    pod_name = _meta(pod).get("name") or ""
    for vol in (pod.get("spec") or {}).get("volumes") or ():
        pvc = vol.get("persistentVolumeClaim")
        if pvc is not None:
            out.append((pvc.get("claimName") or "", False))
        elif vol.get("ephemeral") is not None:
            out.append((f"{pod_name}-{vol.get('name') or ''}", True))
    return out


def claim_reference(claim: Mapping[str, Any]) -> Obj:
    md = _meta(claim)
    return {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": md.get("namespace") or "",
            "name": md.get("name") or "", "uid": md.get("uid") or "", "resourceVersion": md.get("resourceVersion") or ""}


def bind_volume_to_claim(pv: Mapping[str, Any], claim: Mapping[str, Any]) -> tuple[Obj, bool]:
    """A copy of ``pv`` whose claimRef names ``claim``; ``dirty`` when it differs from ``pv``.

    ``bound-by-controller`` is added unless the user had pre-bound the PV to this claim."""
    new = deep_copy(dict(pv))
    dirty = False
    set_by_controller = not is_volume_bound_to_claim(pv, claim)
    ref = (pv.get("spec") or {}).get("claimRef")
    md = _meta(claim)
    if (not ref or ref.get("name") != md.get("name") or (ref.get("namespace") or "") != (md.get("namespace") or "")
            or (ref.get("uid") or "") != (md.get("uid") or "")):
        new.setdefault("spec", {})["claimRef"] = claim_reference(claim)
        dirty = True
    if set_by_controller and ANN_BOUND_BY_CONTROLLER not in annotations_of(new):
        new.setdefault("metadata", {}).setdefault("annotations", {})[ANN_BOUND_BY_CONTROLLER] = "yes"
        dirty = True
    return new, dirty


# --------------------------------------------------------------------------- data


@dataclass
class StaticBinding:
    """A delayed claim matched to an existing PV on one node."""

    pvc: Obj
    pv: Obj
    #: resourceVersion of the PV the binding was computed from (before any write)
    base_rv: str = ""

    def __post_init__(self) -> None:
        if not self.base_rv:
            self.base_rv = _rv(self.pv)

    @property
    def storage_class(self) -> str:
        return volume_class(self.pv)

    @property
    def requested(self) -> Fraction | int:
        return claim_request(self.pvc)

    @property
    def capacity(self) -> Fraction | int:
        return volume_capacity(self.pv)


@dataclass
class DynamicProvision:
    """A delayed claim to be provisioned on one node; ``node_capacity`` is the
    CSIStorageCapacity object that admitted it (when capacity is tracked)."""

    pvc: Obj
    node_capacity: Obj | None = None
    base_rv: str = ""

    def __post_init__(self) -> None:
        if not self.base_rv:
            self.base_rv = _rv(self.pvc)


@dataclass
class PodVolumes:
    static_bindings: list[StaticBinding] = field(default_factory=list)
    dynamic_provisions: list[DynamicProvision] = field(default_factory=list)


@dataclass
class PodVolumeClaims:
    bound_claims: list[Obj] = field(default_factory=list)
    unbound_claims_delay_binding: list[Obj] = field(default_factory=list)
    unbound_claims_immediate: list[Obj] = field(default_factory=list)
    #: storage class -> the PVs of that class that may serve its delayed claims: unclaimed ones and
    #: ones pre-bound to those claims (assumed versions included); listed only for classes with a
    #: claim whose index could not come from a :class:`SharedVolumeIndex`
    unbound_volumes_delay_binding: dict[str, list[Obj]] = field(default_factory=dict)
    #: per delayed claim (``id`` of the claim object): its candidate PVs, indexed by node
    volume_indexes: dict[int, ClaimVolumeIndex] = field(default_factory=dict)
    #: delayed claims without a selected node, smallest request first (the Filter order)
    claims_to_find: list[Obj] = field(default_factory=list)
    #: hostnames with volumes pinned to them for some claim; ``None`` when some
    #: claim's match depends on the node in other ways (then no shared result)
    pinned_hostnames: set[str] | None = None
    #: the static matching result shared by all nodes outside ``pinned_hostnames``
    shared_match: tuple[bool, list[StaticBinding], list[Obj]] | None = None
    #: when set, Filter fails with REASON_BIND_CONFLICT on every node outside ``pinned_hostnames``
    #: (the static bindings found there); see ``VolumeBinder.find_pod_volumes``
    shared_failure: list[StaticBinding] | None = None


# --------------------------------------------------------------------------- shared candidate lists


def claim_shape(claim: Mapping[str, Any]) -> tuple[Any, ...]:
    """Everything of a claim that :func:`index_volumes_for_claim` looks at for
    PVs without claimRef: class, request, volume mode, access modes, selector."""
    spec = _spec_of(claim)
    selector = spec.get("selector")
    return (claim_class(claim), claim_request(claim), volume_mode(claim), frozenset(spec.get("accessModes") or ()),
            None if selector is None else json.dumps(selector, sort_keys=True))


class SharedVolumeIndex:
    """A :class:`ClaimVolumeIndex` of the informer's unclaimed PVs of one class
    for one claim shape, reused by every pod whose claim has that shape until
    an unclaimed PV of the class enters the informer (the cache's unclaimed
    generation changes).

    Entries hold informer objects. A pod reads them through :meth:`view`: an
    entry counts only while the informer still holds that very object and no
    assumed version shadows it, which is what a fresh listing would offer
    (an assumed version of a PV carries a claimRef, so such a PV is skipped; a
    PV the informer claimed or deleted is dropped for good, a shadowed one is
    kept since its assumption may be restored without any informer event)."""

    #: drop dead entries from the node-dependent lists once this many are known
    COMPACT_AT = 64

    def __init__(self, index: ClaimVolumeIndex, cache: Any) -> None:
        self.index = index
        self.cache = cache
        self.dead: set[str] = set()
        self._check = self._current
        #: entries held when built (memory accounting)
        self.size = len(index.anywhere) + len(index.other) + sum(len(e) for e in index.by_hostname.values())

    def _current(self, entry: Any) -> Obj | None:
        state = self.cache.candidate_state(entry[2], entry[3])
        if state == CANDIDATE:
            return entry[3]
        if state == GONE:
            self.dead.add(entry[2])
        return None

    def _compact(self) -> None:
        dead = self.dead
        idx = self.index
        idx.other = [e for e in idx.other if e[2] not in dead]
        for host in list(idx.by_hostname):
            kept = [e for e in idx.by_hostname[host] if e[2] not in dead]
            if kept:
                idx.by_hostname[host] = kept
            else:
                del idx.by_hostname[host]
        dead.clear()

    def view(self, claim: Obj, needed: int) -> ClaimVolumeIndex:
        """The candidates for ``claim`` now. ``needed``: how many volumes the
        pod's claims can exclude plus one (the usable head of the node-independent
        list that Filter may reach)."""
        if len(self.dead) >= self.COMPACT_AT:
            self._compact()
        anywhere = self.index.anywhere
        head: list[Any] = []
        i = 0
        state = self.cache.candidate_state
        while i < len(anywhere) and len(head) < needed:
            entry = anywhere[i]
            st = state(entry[2], entry[3])
            if st == GONE:
                del anywhere[i]
                continue
            if st == CANDIDATE:
                head.append(entry)
            i += 1
        return ClaimVolumeIndex(claim, [], anywhere=head, by_hostname=self.index.by_hostname,
                                other=self.index.other, current=self._check)


# --------------------------------------------------------------------------- binder


class VolumeBinder:
    """Finds, assumes and binds a pod's volumes; see the module docstring.

    ``pv_cache``/``pvc_cache`` are passive assume caches (anything with
    ``get``, ``get_api_obj``, ``assume``, ``restore`` and, for PVs,
    ``list_pvs(class)``). The listers are informer stores. ``csi_driver_lister``
    is optional: without a CSIDriver resource, storage capacity is checked for
    a class as soon as any CSIStorageCapacity names that class.
    """

    #: claim shapes whose :class:`SharedVolumeIndex` is kept, per storage class
    SHARED_SHAPES = 256

    def __init__(
        self,
        *,
        pv_cache: Any,
        pvc_cache: Any,
        class_lister: Lister,
        node_lister: Lister,
        pod_lister: Lister,
        csi_node_lister: Lister | None = None,
        capacity_lister: Lister | None = None,
        csi_driver_lister: Lister | None = None,
        client: Any = None,
        bind_timeout: float = DEFAULT_BIND_TIMEOUT,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
    ) -> None:
        self.pv_cache = pv_cache
        self.pvc_cache = pvc_cache
        self.class_lister = class_lister
        self.node_lister = node_lister
        self.pod_lister = pod_lister
        self.csi_node_lister = csi_node_lister
        self.capacity_lister = capacity_lister
        self.csi_driver_lister = csi_driver_lister
        self.client = client
        self.bind_timeout = bind_timeout
        self.poll_interval = poll_interval
        #: PreBinds waiting for their writes to complete, by the keys of what they read
        self._waiters: dict[str, set[_BindWait]] = {}
        self._volume_facts = VolumeFactsCache()
        #: storage class -> (unclaimed generation, claim shape -> shared index)
        self._shared: dict[str, tuple[int, dict[tuple[Any, ...], SharedVolumeIndex]]] = {}

    @classmethod
    def from_informer_factory(
        cls,
        factory: Any,
        *,
        client: Any = None,
        pv_cache: Any = None,
        pvc_cache: Any = None,
        bind_timeout: float = DEFAULT_BIND_TIMEOUT,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        csi_driver_resource: ResourceInfo | None = None,
    ) -> "VolumeBinder":
        """A binder over ``factory``'s informers (caches built unless given)."""
        pv_inf = factory.informer_for(PVS)
        pvc_inf = factory.informer_for(PVCS)
        binder = cls(
            pv_cache=pv_cache if pv_cache is not None else new_pv_assume_cache(pv_inf),
            pvc_cache=pvc_cache if pvc_cache is not None else new_pvc_assume_cache(pvc_inf),
            class_lister=factory.informer_for(STORAGE_CLASSES).indexer,
            node_lister=factory.informer_for(NODES).indexer,
            pod_lister=factory.informer_for(PODS).indexer,
            csi_node_lister=factory.informer_for(CSI_NODES).indexer,
            capacity_lister=factory.informer_for(CSI_STORAGE_CAPACITIES).indexer,
            csi_driver_lister=(factory.informer_for(csi_driver_resource).indexer
                               if csi_driver_resource is not None else None),
            client=client,
            bind_timeout=bind_timeout,
            poll_interval=poll_interval,
        )
        for res, keys_of in ((PVS, _pv_wait_keys), (PVCS, lambda o: (_pvc_wait_key(o),)),
                             (NODES, lambda o: (_node_wait_key(o),)), (PODS, lambda o: (_pod_wait_key(o),))):
            def wake(obj: Any, keys_of: Callable[[Any], tuple[str, ...]] = keys_of) -> None:
                if binder._waiters:  # most events find no PreBind waiting
                    for key in keys_of(obj):
                        binder.notify(key)

            factory.informer_for(res).add_event_handler(wake, lambda old, new, wake=wake: wake(new), wake)
        return binder

    # ------------------------------------------------------------------ PreFilter

    def _storage_class(self, name: str) -> Obj | None:
        return self.class_lister.get_by_key(name) if name else None

    def is_delay_binding_mode(self, claim: Mapping[str, Any]) -> bool:
        """WaitForFirstConsumer class; an empty or unknown class is not delayed."""
        name = claim_class(claim)
        if not name:
            return False
        sc = self._storage_class(name)
        if sc is None:
            return False
        mode = sc.get("volumeBindingMode")
        if mode is None:
            raise VolumeBindingError(f'VolumeBindingMode not set for StorageClass "{name}"')
        return mode == WAIT_FOR_FIRST_CONSUMER

    def get_pod_volume_claims(self, pod: Mapping[str, Any]) -> PodVolumeClaims:
        """Classify the pod's claims (read through the PVC assume cache)."""
        ns = _meta(pod).get("namespace") or "default"
        out = PodVolumeClaims()
        for name, _ in pod_claim_names(pod):
            try:
                pvc = self.pvc_cache.get(f"{ns}/{name}")
            except NotFoundError as err:
                raise VolumeBindingError(f'error getting PVC "{ns}/{name}": {err}') from err
            if is_pvc_fully_bound(pvc):
                out.bound_claims.append(pvc)
                continue
            delayed = self.is_delay_binding_mode(pvc)
            if delayed and not (pvc.get("spec") or {}).get("volumeName"):
                out.unbound_claims_delay_binding.append(pvc)
            else:
                out.unbound_claims_immediate.append(pvc)
        by_class: dict[str, list[str]] = {}
        for pvc in out.unbound_claims_delay_binding:
            by_class.setdefault(claim_class(pvc), []).append(_ns_name(pvc))
        to_find = [pvc for pvc in out.unbound_claims_delay_binding if ANN_SELECTED_NODE not in annotations_of(pvc)]
        out.claims_to_find = sorted(to_find, key=claim_request)
        listed = 0
        for pvc in out.claims_to_find:
            index = self._shared_view(pvc, len(out.claims_to_find))
            if index is None:
                cls = claim_class(pvc)
                volumes = out.unbound_volumes_delay_binding.get(cls)
                if volumes is None:
                    volumes = out.unbound_volumes_delay_binding[cls] = self._list_volumes(cls, by_class[cls])
                    listed += len(volumes)
                index = index_volumes_for_claim(pvc, volumes, self._volume_facts)
            out.volume_indexes[id(pvc)] = index
        pinned: set[str] | None = set()
        for index in out.volume_indexes.values():
            if index.prebound or index.other:
                pinned = None
                break
            pinned.update(index.by_hostname)
        out.pinned_hostnames = pinned
        if listed:
            self._volume_facts.prune(4 * listed + 1024)
        return out

    def _list_volumes(self, storage_class: str, claim_keys: list[str]) -> list[Obj]:
        """The PVs of the class that may serve these claims (current view)."""
        narrow = getattr(self.pv_cache, "list_pvs_for_claims", None)
        # Only unclaimed PVs and PVs pre-bound to these claims can match them.
        if narrow is not None:
            return list(narrow(storage_class, claim_keys))
        return list(self.pv_cache.list_pvs(storage_class))

    def _shared_view(self, pvc: Obj, needed: int) -> ClaimVolumeIndex | None:
        """The claim's candidates from a :class:`SharedVolumeIndex`, or None when
        it must be computed from a fresh listing: a PV may be pre-bound to the
        claim, or some assumed PV has no claimRef, or the cache cannot tell."""
        cache = self.pv_cache
        if not hasattr(cache, "unclaimed_generation") or cache.has_unclaimed_assumptions:
            return None
        if cache.may_be_prebound(_ns_name(pvc)):
            return None
        shape = claim_shape(pvc)
        cls = shape[0]
        generation = cache.unclaimed_generation(cls)
        slot = self._shared.get(cls)
        if slot is None or slot[0] != generation:
            slot = self._shared[cls] = (generation, {})
        shared = slot[1].get(shape)
        if shared is None:
            volumes = cache.informer_unclaimed(cls)
            held = sum(ix.size for ix in slot[1].values())
            if len(slot[1]) >= self.SHARED_SHAPES or held > 8 * len(volumes) + 4096:
                slot[1].clear()  # bounded memory: start over
            shared = slot[1][shape] = SharedVolumeIndex(
                index_volumes_for_claim(pvc, volumes, self._volume_facts), cache)
            self._volume_facts.prune(4 * len(volumes) + 1024)
        return shared.view(pvc, needed)

    def get_eligible_nodes(self, bound_claims: Iterable[Mapping[str, Any]]) -> set[str] | None:
        """Hostnames allowed by local-like bound PVs (intersection), or None for no restriction."""
        eligible: set[str] | None = None
        for pvc in bound_claims:
            name = (pvc.get("spec") or {}).get("volumeName") or ""
            try:
                pv = self.pv_cache.get(name)
            except NotFoundError:
                return None
            hosts = pinned_hostnames(pv)
            if hosts is None:
                continue
            eligible = set(hosts) if eligible is None else eligible & hosts
        return eligible

    # ------------------------------------------------------------------ Filter

    def find_pod_volumes(
        self, pod: Mapping[str, Any], claims: PodVolumeClaims, node: Mapping[str, Any]
    ) -> tuple[PodVolumes, list[str]]:
        """Can the pod's volumes be used on ``node``? Returns the plan and the rejection reasons."""
        shared = claims.shared_match
        if (shared is not None and shared[0] and not claims.bound_claims
                and len(claims.claims_to_find) == len(claims.unbound_claims_delay_binding)
                and claims.pinned_hostnames is not None
                and (_meta(node).get("labels") or {}).get(HOSTNAME_LABEL) not in claims.pinned_hostnames):
            # every claim has a static match that is the same on all nodes without pinned volumes
            return PodVolumes(list(shared[1])), []
        failure = claims.shared_failure
        if (failure is not None and claims.pinned_hostnames is not None
                and (_meta(node).get("labels") or {}).get(HOSTNAME_LABEL) not in claims.pinned_hostnames):
            # set only without bound claims and selected nodes: the same outcome as computed below
            return PodVolumes(list(failure)), [REASON_BIND_CONFLICT]
        pod_volumes = PodVolumes()
        bound_ok = unbound_ok = enough_space = pvs_found = True
        if claims.bound_claims:
            bound_ok, pvs_found = self._check_bound_claims(claims.bound_claims, node)
        if claims.unbound_claims_delay_binding:
            to_find: list[Obj] = []
            to_provision: list[Obj] = []
            node_name = _meta(node).get("name") or ""
            for pvc in claims.unbound_claims_delay_binding:
                selected = annotations_of(pvc).get(ANN_SELECTED_NODE)
                if selected is not None:
                    if selected != node_name:
                        unbound_ok = False  # fast path: provisioning was started for another node
                        break
                    to_provision.append(pvc)
                else:
                    to_find.append(pvc)
            else:
                if to_find:
                    presorted = len(claims.claims_to_find) == len(to_find)
                    hostname = (_meta(node).get("labels") or {}).get(HOSTNAME_LABEL)
                    shared = (presorted and claims.pinned_hostnames is not None
                              and (hostname is None or hostname not in claims.pinned_hostnames))
                    if shared and claims.shared_match is not None:
                        unbound_ok, bindings, unmatched = claims.shared_match
                    else:
                        unbound_ok, bindings, unmatched = self._find_matching_volumes(
                            claims.claims_to_find if presorted else to_find, claims.unbound_volumes_delay_binding,
                            node, claims.volume_indexes, presorted)
                        if shared:
                            # the same on every node without pinned volumes: computed once per cycle
                            claims.shared_match = (unbound_ok, bindings, unmatched)
                    pod_volumes.static_bindings = list(bindings)
                    unmatched = list(unmatched)
                    to_provision.extend(unmatched)
                    if (shared and unmatched and not claims.bound_claims
                            and len(claims.claims_to_find) == len(claims.unbound_claims_delay_binding)
                            and self._cannot_provision(unmatched[0])):
                        # provisioning the first unmatched claim fails the same way on every such node
                        claims.shared_failure = list(bindings)
                if to_provision:
                    unbound_ok, enough_space, pod_volumes.dynamic_provisions = self._check_volume_provisions(
                        to_provision, node)
        reasons: list[str] = []
        if not bound_ok:
            reasons.append(REASON_NODE_CONFLICT)
        if not unbound_ok:
            reasons.append(REASON_BIND_CONFLICT)
        if not enough_space:
            reasons.append(REASON_NOT_ENOUGH_SPACE)
        if not pvs_found:
            reasons.append(REASON_PV_NOT_EXIST)
        return pod_volumes, reasons

    def shared_plan(self, claims: PodVolumeClaims) -> PodVolumes | None:
        """The plan :meth:`find_pod_volumes` returns, without reasons, on every
        node whose ``kubernetes.io/hostname`` is not in ``claims.pinned_hostnames``;
        None when the answer may depend on the node in other ways or fails.

        That is the case when bound claims' PVs have no required node affinity,
        no delayed claim has a selected node, every candidate PV is either
        usable anywhere or pinned to hostnames, and the claims without a static
        match can be provisioned on any node (a usable provisioner, no
        ``allowedTopologies``, no capacity check)."""
        if claims.pinned_hostnames is None or claims.unbound_claims_immediate:
            return None
        if len(claims.claims_to_find) != len(claims.unbound_claims_delay_binding):
            return None  # a selected node: the answer differs between nodes
        for pvc in claims.bound_claims:
            try:
                pv = self.pv_cache.get((pvc.get("spec") or {}).get("volumeName") or "")
            except NotFoundError:
                return None
            if (_spec_of(pv).get("nodeAffinity") or {}).get("required") is not None:
                return None
        bindings: list[StaticBinding] = []
        provisions: list[DynamicProvision] = []
        if claims.claims_to_find:
            if claims.shared_match is None:
                # A node without a hostname label: only volumes usable anywhere are considered.
                claims.shared_match = self._find_matching_volumes(
                    claims.claims_to_find, claims.unbound_volumes_delay_binding, {}, claims.volume_indexes, True)
            _, found, unmatched = claims.shared_match
            bindings = list(found)
            for pvc in unmatched:
                cls = claim_class(pvc)
                sc = self._storage_class(cls) if cls else None
                if sc is None:
                    return None  # Filter reports the error
                provisioner = sc.get("provisioner") or ""
                if not provisioner or provisioner == NOT_SUPPORTED_PROVISIONER or sc.get("allowedTopologies"):
                    return None
                request = ((pvc.get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage")
                if request is not None and self._capacity_tracked(provisioner, sc):
                    return None
                provisions.append(DynamicProvision(pvc))
        return PodVolumes(bindings, provisions)

    def rejects_unpinned_nodes(self, claims: PodVolumeClaims) -> bool:
        """True when :meth:`find_pod_volumes` certainly rejects, with the one reason
        ``REASON_BIND_CONFLICT``, every node whose ``kubernetes.io/hostname`` is not
        in ``claims.pinned_hostnames``: no bound claims, no selected node, and the
        first delayed claim without a static match on such nodes cannot be
        provisioned (its class names no usable provisioner)."""
        if (claims.pinned_hostnames is None or claims.unbound_claims_immediate or claims.bound_claims
                or not claims.claims_to_find
                or len(claims.claims_to_find) != len(claims.unbound_claims_delay_binding)):
            return False
        if claims.shared_failure is not None:
            return True
        if claims.shared_match is None:
            claims.shared_match = self._find_matching_volumes(
                claims.claims_to_find, claims.unbound_volumes_delay_binding, {}, claims.volume_indexes, True)
        _, bindings, unmatched = claims.shared_match
        if not unmatched or not self._cannot_provision(unmatched[0]):
            return False
        claims.shared_failure = list(bindings)
        return True

    def _cannot_provision(self, pvc: Obj) -> bool:
        """The claim's class exists and names no usable provisioner: then
        :meth:`_check_volume_provisions`, reaching it first, fails the same way
        on every node."""
        cls = claim_class(pvc)
        sc = self._storage_class(cls) if cls else None
        return sc is not None and (sc.get("provisioner") or "") in ("", NOT_SUPPORTED_PROVISIONER)

    def _check_bound_claims(self, claims: Iterable[Mapping[str, Any]], node: Mapping[str, Any]) -> tuple[bool, bool]:
        """(node affinity ok, every PV found)."""
        for pvc in claims:
            name = (pvc.get("spec") or {}).get("volumeName") or ""
            try:
                pv = self.pv_cache.get(name)
            except NotFoundError:
                return True, False
            if not check_node_affinity(pv, node):
                return False, True
        return True, True

    def _find_matching_volumes(
        self, claims: list[Obj], pvs_by_class: Mapping[str, list[Obj]], node: Mapping[str, Any],
        indexes: Mapping[int, ClaimVolumeIndex] | None = None, presorted: bool = False,
    ) -> tuple[bool, list[StaticBinding], list[Obj]]:
        """Smallest claims first; each chosen PV is excluded for the next claims.

        Uses the claims' PreFilter volume indexes when present, so the work per
        node does not grow with the number of PVs usable elsewhere."""
        chosen: dict[str, Obj] = {}
        bindings: list[StaticBinding] = []
        unmatched: list[Obj] = []
        found_all = True
        ordered = claims if presorted else sorted(claims, key=claim_request)
        for pvc in ordered:
            index = indexes.get(id(pvc)) if indexes else None
            if index is not None and index.claim is pvc:
                pv = index.find(node, chosen)
            else:
                pv = find_matching_volume(pvc, pvs_by_class.get(claim_class(pvc), []), node, chosen, True)
            if pv is None:
                found_all = False
                unmatched.append(pvc)
                continue
            chosen[_meta(pv).get("name") or ""] = pv
            bindings.append(StaticBinding(pvc, pv))
        return found_all, bindings, unmatched

    def _check_volume_provisions(
        self, claims: list[Obj], node: Mapping[str, Any]
    ) -> tuple[bool, bool, list[DynamicProvision]]:
        """(provisioning possible, enough space, provisions)."""
        provisions: list[DynamicProvision] = []
        labels = _meta(node).get("labels") or {}
        for pvc in claims:
            cls = claim_class(pvc)
            if not cls:
                raise VolumeBindingError(f'no class for claim "{_ns_name(pvc)}"')
            sc = self._storage_class(cls)
            if sc is None:
                raise VolumeBindingError(f'failed to find storage class "{cls}"')
            provisioner = sc.get("provisioner") or ""
            if not provisioner or provisioner == NOT_SUPPORTED_PROVISIONER:
                return False, True, []
            if not topology_matches(sc.get("allowedTopologies"), labels):
                return False, True, []
            ok, capacity = self.has_enough_capacity(provisioner, pvc, sc, node)
            if not ok:
                return True, False, []
            provisions.append(DynamicProvision(pvc, capacity))
        return True, True, provisions

    def _capacity_tracked(self, provisioner: str, sc: Mapping[str, Any]) -> bool:
        if self.csi_driver_lister is not None:
            driver = self.csi_driver_lister.get_by_key(provisioner)
            return driver is not None and bool((driver.get("spec") or {}).get("storageCapacity"))
        if self.capacity_lister is None:
            return False
        name = _meta(sc).get("name")
        return any(c.get("storageClassName") == name for c in self.capacity_lister.list())

    def has_enough_capacity(
        self, provisioner: str, pvc: Mapping[str, Any], sc: Mapping[str, Any], node: Mapping[str, Any]
    ) -> tuple[bool, Obj | None]:
        """Whether a published CSIStorageCapacity admits the claim on ``node`` (and which one)."""
        request = ((pvc.get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage")
        if request is None:
            return True, None
        if not self._capacity_tracked(provisioner, sc):
            return True, None
        size = parse_quantity(request)
        name = _meta(sc).get("name")
        labels = _meta(node).get("labels") or {}
        assert self.capacity_lister is not None
        for cap in self.capacity_lister.list():
            if cap.get("storageClassName") != name:
                continue
            raw = cap.get("maximumVolumeSize")
            if raw is None:
                raw = cap.get("capacity")
            if raw is None or parse_quantity(raw) < size:
                continue
            topology = cap.get("nodeTopology")
            if topology is None:
                continue
            try:
                selector = label_selector_from_dict(topology)
            except StatusError:
                continue
            if selector.matches(labels):
                return True, cap
        return False, None

    # ------------------------------------------------------------------ Reserve / Unreserve

    def are_pod_volumes_bound(self, pod: Mapping[str, Any]) -> bool:
        ns = _meta(pod).get("namespace") or "default"
        for name, _ in pod_claim_names(pod):
            try:
                if not is_pvc_fully_bound(self.pvc_cache.get(f"{ns}/{name}")):
                    return False
            except NotFoundError:
                return False
        return True

    def assume_pod_volumes(self, pod: Mapping[str, Any], node_name: str, pod_volumes: PodVolumes) -> bool:
        """Record the planned changes in the assume caches; True when all volumes are already bound.

        On failure everything assumed so far is restored and the error raised."""
        if self.are_pod_volumes_bound(pod):
            return True
        bindings: list[StaticBinding] = []
        provisions: list[DynamicProvision] = []
        try:
            for b in pod_volumes.static_bindings:
                new_pv, dirty = bind_volume_to_claim(b.pv, b.pvc)
                if dirty:
                    self.pv_cache.assume(new_pv)
                bindings.append(StaticBinding(b.pvc, new_pv, b.base_rv))
            for p in pod_volumes.dynamic_provisions:
                new_pvc = deep_copy(p.pvc)
                new_pvc.setdefault("metadata", {}).setdefault("annotations", {})[ANN_SELECTED_NODE] = node_name
                self.pvc_cache.assume(new_pvc)
                provisions.append(DynamicProvision(new_pvc, p.node_capacity, p.base_rv))
        except Exception:
            self.revert_assumed_pod_volumes(PodVolumes(bindings, provisions))
            raise
        pod_volumes.static_bindings = bindings
        pod_volumes.dynamic_provisions = provisions
        return False

    def revert_assumed_pod_volumes(self, pod_volumes: PodVolumes) -> None:
        """Drop this pod's assumptions (no-op for objects already replaced by server copies)."""
        for b in pod_volumes.static_bindings:
            self.pv_cache.restore(b.pv)
        for p in pod_volumes.dynamic_provisions:
            self.pvc_cache.restore(p.pvc)

    # ------------------------------------------------------------------ PreBind

    async def bind_pod_volumes(self, pod: Mapping[str, Any], node_name: str, pod_volumes: PodVolumes) -> None:
        """Write the assumed objects, then wait for the PV controller (raises on failure/timeout)."""
        await self.bind_api_update(pod_volumes)
        await self.wait_for_bindings(pod, node_name, pod_volumes)

    async def bind_api_update(self, pod_volumes: PodVolumes) -> None:
        """One PUT per PV, then one per PVC. Objects not written are restored on failure;
        written ones are never rolled back."""
        if self.client is None:
            raise VolumeBindingError("no API client to bind volumes")
        bindings, provisions = pod_volumes.static_bindings, pod_volumes.dynamic_provisions
        done_b = done_p = 0
        try:
            for b in bindings:
                b.pv = await self.client.update(PVS, b.pv)
                done_b += 1
            for p in provisions:
                p.pvc = await self.client.update(PVCS, p.pvc)
                done_p += 1
        except BaseException:
            for b in bindings[done_b:]:
                self.pv_cache.restore(b.pv)
            for p in provisions[done_p:]:
                self.pvc_cache.restore(p.pvc)
            raise

    def notify(self, key: str) -> None:
        """Wake the PreBinds waiting on one object (called from the informer
        handlers with the ``_*_wait_key`` keys)."""
        for w in self._waiters.get(key, ()):
            w.wake()

    def is_waiting(self, pod: Mapping[str, Any]) -> bool:
        """True while a PreBind of ``pod`` is parked: its last check found the
        writes incomplete and nothing has woken it since. A wake makes this
        False until the PreBind has checked again and parked again, so callers
        (tests, debugging) can tell "handled the change and still waits" from
        "has not run yet"."""
        return any(w.fut is not None and not w.fut.done() for w in self._waiters.get(_pod_wait_key(pod), ()))

    async def wait_for_bindings(self, pod: Mapping[str, Any], node_name: str, pod_volumes: PodVolumes) -> None:
        """Check until the writes of PreBind are complete. Informer events of the
        objects the check reads (the pod's PVs and PVCs, the PV provisioned for a
        claim, the node, the pod) wake it; it also re-checks every poll interval."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.bind_timeout
        keys = {_pv_wait_key(b.pv) for b in pod_volumes.static_bindings}
        keys.update(_pvc_wait_key(b.pvc) for b in pod_volumes.static_bindings)
        keys.update(_pvc_wait_key(p.pvc) for p in pod_volumes.dynamic_provisions)
        keys.add("node:" + node_name)
        keys.add(_pod_wait_key(pod))
        waiter = _BindWait()
        for k in keys:
            self._waiters.setdefault(k, set()).add(waiter)
        timer: asyncio.TimerHandle | None = None
        try:
            while True:
                # A fresh future per wait; the check reads the latest state, so a wake
                # that came before it (and found the old future done) is not lost.
                waiter.fut = loop.create_future()
                try:
                    done = self.check_bindings(pod, node_name, pod_volumes)
                except VolumeBindingError as err:
                    raise VolumeBindingError(f"binding volumes: {err}") from err
                if done:
                    return
                now = loop.time()
                remaining = deadline - now
                if remaining <= 0:
                    raise VolumeBindingError(
                        f"binding volumes: timed out waiting for the condition after {self.bind_timeout:g}s")
                # One poll timer at a time: informer wakes do not re-arm it.
                if timer is None or timer.when() <= now:
                    timer = loop.call_at(now + min(self.poll_interval, remaining), waiter.wake)
                await waiter.fut
        finally:
            if timer is not None:
                timer.cancel()
            waiter.fut = None
            for k in keys:
                waiting = self._waiters.get(k)
                if waiting is not None:
                    waiting.discard(waiter)
                    if not waiting:
                        del self._waiters[k]

    def check_bindings(self, pod: Mapping[str, Any], node_name: str, pod_volumes: PodVolumes) -> bool:
        """True once every written object is fully bound; raises when binding cannot succeed."""
        node = self.node_lister.get_by_key(node_name)
        if node is None:
            raise VolumeBindingError(f'failed to get node "{node_name}"')
        md = _meta(pod)
        if self.pod_lister.get_by_key(f"{md.get('namespace') or 'default'}/{md.get('name') or ''}") is None:
            raise VolumeBindingError("pod does not exist any more")
        for b in pod_volumes.static_bindings:
            pv_name = _meta(b.pv).get("name") or ""
            try:
                pv = self.pv_cache.get_api_obj(pv_name)
            except NotFoundError as err:
                raise VolumeBindingError(f'failed to check binding: PV "{pv_name}" not found') from err
            if _rv(pv) == b.base_rv != _rv(b.pv):
                return False  # the informer has not seen our write yet
            if not check_node_affinity(pv, node):
                raise VolumeBindingError(f'pv "{pv_name}" node affinity doesn\'t match node "{node_name}"')
            ref = (pv.get("spec") or {}).get("claimRef")
            if not ref or not ref.get("uid"):
                raise VolumeBindingError(f'ClaimRef got reset for pv "{pv_name}"')
            key = _ns_name(b.pvc)
            try:
                pvc = self.pvc_cache.get_api_obj(key)
            except NotFoundError as err:
                raise VolumeBindingError(f'failed to check binding: PVC "{key}" not found') from err
            if not is_pvc_fully_bound(pvc):
                return False
        for p in pod_volumes.dynamic_provisions:
            key = _ns_name(p.pvc)
            try:
                pvc = self.pvc_cache.get_api_obj(key)
            except NotFoundError as err:
                raise VolumeBindingError(f'failed to check provisioning: PVC "{key}" not found') from err
            if _rv(pvc) == p.base_rv != _rv(p.pvc):
                return False
            anns = _meta(pvc).get("annotations")
            if not anns:
                raise VolumeBindingError(f'selectedNode annotation reset for PVC "{key}"')
            if anns.get(ANN_SELECTED_NODE) != node_name:
                raise VolumeBindingError(f'provisioning failed for PVC "{key}"')
            volume_name = (pvc.get("spec") or {}).get("volumeName")
            if volume_name:
                try:
                    pv = self.pv_cache.get_api_obj(volume_name)
                except NotFoundError:
                    return False
                if not check_node_affinity(pv, node):
                    raise VolumeBindingError(
                        f'pv "{volume_name}" node affinity doesn\'t match node "{node_name}"')
            if not is_pvc_fully_bound(pvc):
                return False
        return True


__all__ = [
    "DynamicProvision", "Lister", "PodVolumeClaims", "PodVolumes", "REASON_BIND_CONFLICT", "REASON_NODE_CONFLICT",
    "REASON_NOT_ENOUGH_SPACE", "REASON_PV_NOT_EXIST", "StaticBinding", "VolumeBinder", "VolumeBindingError",
    "bind_volume_to_claim", "claim_reference", "is_pvc_fully_bound", "pod_claim_names",
]
