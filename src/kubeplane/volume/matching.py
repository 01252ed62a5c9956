"""PV <-> PVC matching, shared by the PV controller and the VolumeBinding plugin.

Follows upstream's ``FindMatchingVolume`` and the PV controller's
``findBestMatchForClaim``: the smallest volume that fits wins, a volume
pre-bound to the claim (``spec.claimRef``) wins outright, node affinity is
checked only when a node is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from operator import itemgetter
from typing import Any, Callable, Iterable, Mapping

from kubeplane.api.meta import meta_of
from kubeplane.api.quantity import parse_quantity
from kubeplane.api.selectors import label_selector_from_dict

Obj = dict[str, Any]

ANN_SELECTED_NODE = "volume.kubernetes.io/selected-node"
ANN_BIND_COMPLETED = "pv.kubernetes.io/bind-completed"
ANN_BOUND_BY_CONTROLLER = "pv.kubernetes.io/bound-by-controller"
ANN_PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
ANN_STORAGE_PROVISIONER = "volume.kubernetes.io/storage-provisioner"
ANN_BETA_STORAGE_PROVISIONER = "volume.beta.kubernetes.io/storage-provisioner"
ANN_BETA_STORAGE_CLASS = "volume.beta.kubernetes.io/storage-class"
NOT_SUPPORTED_PROVISIONER = "kubernetes.io/no-provisioner"
HOSTNAME_LABEL = "kubernetes.io/hostname"


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("spec") or {}


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return meta_of(obj).get("annotations") or {}


def claim_class(claim: Mapping[str, Any]) -> str:
    """Storage class of a claim (the beta annotation wins, as upstream)."""
    ann = annotations_of(claim).get(ANN_BETA_STORAGE_CLASS)
    if ann is not None:
        return ann
    return _spec(claim).get("storageClassName") or ""


def volume_class(pv: Mapping[str, Any]) -> str:
    ann = annotations_of(pv).get(ANN_BETA_STORAGE_CLASS)
    if ann is not None:
        return ann
    return _spec(pv).get("storageClassName") or ""


def _exact(q: Fraction) -> Fraction | int:
    """An integral quantity as an int (compares and sorts much faster, with the same results)."""
    return q.numerator if q.denominator == 1 else q


def claim_request(claim: Mapping[str, Any]) -> Fraction | int:
    """Requested storage (0 when absent)."""
    req = ((_spec(claim).get("resources") or {}).get("requests") or {}).get("storage")
    return _exact(parse_quantity(req)) if req is not None else 0


def volume_capacity(pv: Mapping[str, Any]) -> Fraction | int:
    cap = (_spec(pv).get("capacity") or {}).get("storage")
    return _exact(parse_quantity(cap)) if cap is not None else 0


def volume_mode(obj: Mapping[str, Any]) -> str:
    """``spec.volumeMode``; unset means Filesystem."""
    return _spec(obj).get("volumeMode") or "Filesystem"


def access_modes_contain(required: Iterable[str], offered: Iterable[str]) -> bool:
    """True when every requested access mode is offered."""
    have = set(offered)
    return all(m in have for m in required)


def is_volume_bound_to_claim(pv: Mapping[str, Any], claim: Mapping[str, Any]) -> bool:
    """``claimRef`` names the claim (and its uid, when the ref carries one)."""
    ref = _spec(pv).get("claimRef")
    if not ref:
        return False
    md = meta_of(claim)
    if ref.get("name") != md.get("name") or (ref.get("namespace") or "") != (md.get("namespace") or ""):
        return False
    uid = ref.get("uid") or ""
    return not uid or uid == md.get("uid")


# --------------------------------------------------------------- node affinity


def _expression_matches(expr: Mapping[str, Any], value: str | None) -> bool:
    op = expr.get("operator")
    values = expr.get("values") or []
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt"):
        if value is None or len(values) != 1:
            return False
        try:
            have, want = int(value), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def node_selector_term_matches(term: Mapping[str, Any], labels: Mapping[str, str], node_name: str) -> bool:
    """Expressions of one term are ANDed; a term with none matches nothing."""
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not exprs and not fields:
        return False
    for e in exprs:
        if not _expression_matches(e, labels.get(e.get("key", ""))):
            return False
    for f in fields:
        value = node_name if f.get("key") == "metadata.name" else None
        if not _expression_matches(f, value):
            return False
    return True


def node_selector_matches(selector: Mapping[str, Any] | None, node: Mapping[str, Any]) -> bool:
    """``NodeSelector`` terms are ORed; ``None`` matches every node, no terms none."""
    if selector is None:
        return True
    labels = meta_of(node).get("labels") or {}
    name = meta_of(node).get("name") or ""
    return any(node_selector_term_matches(t, labels, name) for t in selector.get("nodeSelectorTerms") or [])


def check_node_affinity(pv: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """True when the PV may be used on ``node`` (no affinity: any node)."""
    affinity = _spec(pv).get("nodeAffinity") or {}
    return node_selector_matches(affinity.get("required"), node)


def topology_matches(allowed_topologies: list[Mapping[str, Any]] | None, labels: Mapping[str, str]) -> bool:
    """StorageClass ``allowedTopologies``: terms ORed, label expressions ANDed; none = all."""
    if not allowed_topologies:
        return True
    for term in allowed_topologies:
        exprs = term.get("matchLabelExpressions") or []
        if all(labels.get(e.get("key", "")) in (e.get("values") or []) for e in exprs):
            return True
    return False


def hostname_affinity(node_name: str) -> Obj:
    """A required node affinity pinning a volume to one node."""
    return {"required": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": HOSTNAME_LABEL, "operator": "In", "values": [node_name]}]}]}}


def pinned_hostnames(pv: Mapping[str, Any]) -> set[str] | None:
    """Hostnames a local-like PV is pinned to, or ``None`` when not local-like.

    Local-like: every required term has a ``kubernetes.io/hostname In`` expression."""
    required = (_spec(pv).get("nodeAffinity") or {}).get("required")
    if not required:
        return None
    names: set[str] = set()
    for term in required.get("nodeSelectorTerms") or []:
        found = False
        for e in term.get("matchExpressions") or []:
            if e.get("key") == HOSTNAME_LABEL and e.get("operator") == "In":
                names.update(e.get("values") or [])
                found = True
        if not found:
            return None
    return names


# --------------------------------------------------------------------- matching


def find_matching_volume(
    claim: Mapping[str, Any],
    volumes: Iterable[Mapping[str, Any]],
    node: Mapping[str, Any] | None = None,
    excluded: set[str] | Mapping[str, Any] | None = None,
    delay_binding: bool = False,
) -> Any | None:
    """Best PV for ``claim`` among ``volumes``, or ``None``.

    A PV pre-bound to the claim is returned at once (if large enough; when it
    fails the node affinity, the whole match fails). Otherwise the smallest
    Available, unclaimed PV of the same class, volume mode, selector and (with
    a node) access modes and node affinity wins; first one wins ties. With no
    node and ``delay_binding`` only pre-bound PVs are considered (the
    controller never picks PVs for WaitForFirstConsumer claims).
    """
    request = claim_request(claim)
    cls = claim_class(claim)
    mode = volume_mode(claim)
    selector_dict = _spec(claim).get("selector")
    selector = label_selector_from_dict(selector_dict) if selector_dict is not None else None
    modes = _spec(claim).get("accessModes") or []
    excluded = excluded or set()
    best: Any | None = None
    best_cap: Fraction | int | None = None
    for pv in volumes:
        name = meta_of(pv).get("name") or ""
        if name in excluded:
            continue
        if volume_mode(pv) != mode:
            continue
        if meta_of(pv).get("deletionTimestamp"):
            continue
        affinity_ok = node is None or check_node_affinity(pv, node)
        capacity = volume_capacity(pv)
        if is_volume_bound_to_claim(pv, claim):
            if capacity < request:
                continue
            if not affinity_ok:
                return None
            return pv
        if node is None and delay_binding:
            continue
        if ((pv.get("status") or {}).get("phase")) != "Available":
            continue
        if _spec(pv).get("claimRef"):
            continue
        if selector is not None and not selector.matches(meta_of(pv).get("labels") or {}):
            continue
        if volume_class(pv) != cls:
            continue
        if not affinity_ok:
            continue
        if node is not None and not access_modes_contain(modes, _spec(pv).get("accessModes") or []):
            continue
        if capacity >= request and (best_cap is None or capacity < best_cap):
            best, best_cap = pv, capacity
    return best


def find_best_match_for_claim(
    claim: Mapping[str, Any], volumes: Iterable[Mapping[str, Any]], delay_binding: bool = False
) -> Any | None:
    """The PV controller's search: volumes grouped by access modes that cover
    the claim's, fewest modes first; the first group with a match wins."""
    modes = _spec(claim).get("accessModes") or []
    if delay_binding:
        # only volumes pre-bound to the claim can match without a node
        claim_name = meta_of(claim).get("name")
        volumes = [pv for pv in volumes
                   if ((pv.get("spec") or {}).get("claimRef") or {}).get("name") == claim_name
                   and is_volume_bound_to_claim(pv, claim)]
    groups: dict[frozenset[str], list[Mapping[str, Any]]] = {}
    for pv in volumes:
        offered = frozenset(_spec(pv).get("accessModes") or [])
        if access_modes_contain(modes, offered):
            groups.setdefault(offered, []).append(pv)
    for offered in sorted(groups, key=lambda s: (len(s), sorted(s))):
        found = find_matching_volume(claim, groups[offered], None, None, delay_binding)
        if found is not None:
            return found
    return None


def check_volume_satisfies_claim(pv: Mapping[str, Any], claim: Mapping[str, Any]) -> str | None:
    """Why a user-chosen PV (``claim.spec.volumeName``) cannot serve the claim, or ``None``."""
    if volume_capacity(pv) < claim_request(claim):
        return "requested PV is too small"
    if volume_class(pv) != claim_class(claim):
        return "storageClassName does not match"
    if volume_mode(pv) != volume_mode(claim):
        return "incompatible volumeMode"
    if not access_modes_contain(_spec(claim).get("accessModes") or [], _spec(pv).get("accessModes") or []):
        return "incompatible accessMode"
    if meta_of(pv).get("deletionTimestamp"):
        return "volume is being deleted"
    return None


# ------------------------------------------------------- per-claim volume index

#: ``(capacity, position in the listed volumes, name, volume)``; sorts as the
#: linear search prefers: smallest capacity first, earliest listed on ties.
_Entry = tuple[Fraction | int, int, str, Any]


@dataclass
class ClaimVolumeIndex:
    """The static PVs that may serve one delayed claim, grouped by where they can be used.

    Built once per scheduling cycle (:func:`index_volumes_for_claim`): every
    node-independent rule of :func:`find_matching_volume` (phase, claimRef,
    class, volume mode, selector, access modes, size, deletion) is applied
    up front, so :meth:`find` on a node only checks node affinity of the
    volumes that can be on that node. :meth:`find` returns exactly what
    ``find_matching_volume(claim, volumes, node, excluded, True)`` returns.
    """

    claim: Mapping[str, Any]
    volumes: list[Any]
    #: a volume pre-bound to the claim exists: :meth:`find` scans ``volumes``
    prebound: bool = False
    #: candidates without node affinity (usable on every node)
    anywhere: list[_Entry] = field(default_factory=list)
    #: candidates whose every affinity term pins ``kubernetes.io/hostname``
    by_hostname: dict[str, list[_Entry]] = field(default_factory=dict)
    #: candidates with any other node affinity (checked on each node)
    other: list[_Entry] = field(default_factory=list)
    #: when the entries were collected earlier (a shared index): the volume an
    #: entry stands for now, or ``None`` when it is no longer a candidate
    current: Callable[[_Entry], Any | None] | None = None

    @property
    def empty(self) -> bool:
        """No volume can serve the claim on any node."""
        return not (self.prebound or self.anywhere or self.by_hostname or self.other)

    def find(self, node: Mapping[str, Any], excluded: set[str] | Mapping[str, Any] | None = None) -> Any | None:
        """Smallest candidate usable on ``node`` and not ``excluded`` (by name), or ``None``."""
        if self.prebound:
            return find_matching_volume(self.claim, self.volumes, node, excluded, True)
        excluded = excluded or ()
        current = self.current
        best: tuple[_Entry, Any] | None = None
        for entry in self.anywhere:
            if entry[2] not in excluded:
                pv = entry[3] if current is None else current(entry)
                if pv is not None:
                    best = (entry, pv)
                    break
        hostname = (meta_of(node).get("labels") or {}).get(HOSTNAME_LABEL)
        if hostname is not None:
            best = _first_usable(self.by_hostname.get(hostname, ()), node, excluded, best, current)
        if self.other:
            best = _first_usable(self.other, node, excluded, best, current)
        return best[1] if best is not None else None


def _first_usable(
    entries: Iterable[_Entry], node: Mapping[str, Any], excluded: Any, best: tuple[_Entry, Any] | None,
    current: Callable[[_Entry], Any | None] | None,
) -> tuple[_Entry, Any] | None:
    """``best`` or the first of the sorted ``entries`` that beats it, fits ``node``
    and (with ``current``) is still a candidate; paired with its volume."""
    for entry in entries:
        if best is not None and (entry[0], entry[1]) >= (best[0][0], best[0][1]):
            return best
        if entry[2] not in excluded and check_node_affinity(entry[3], node):
            pv = entry[3] if current is None else current(entry)
            if pv is not None:
                return entry, pv
    return best


#: node-independent facts of one volume, see :func:`volume_facts`
VolumeFacts = tuple[str, bool, bool, str, str, frozenset[str], Fraction | int, Any]

_UNSET = object()


def volume_facts(pv: Mapping[str, Any]) -> VolumeFacts:
    """``(name, has claimRef, usable: Available and not deleting, volume mode, class,
    access modes, capacity, hostnames)``; hostnames is :func:`pinned_hostnames`,
    or ``_UNSET`` for a volume without required node affinity."""
    spec = _spec(pv)
    md = meta_of(pv)
    required = (spec.get("nodeAffinity") or {}).get("required")
    return (md.get("name") or "", bool(spec.get("claimRef")),
            ((pv.get("status") or {}).get("phase")) == "Available" and not md.get("deletionTimestamp"),
            volume_mode(pv), volume_class(pv), frozenset(spec.get("accessModes") or ()), volume_capacity(pv),
            _UNSET if required is None else pinned_hostnames(pv))


class VolumeFactsCache:
    """Memo of :func:`volume_facts` per volume object, valid while the object is
    the one cached (informer objects are replaced, never mutated, on update).
    Entries of volumes not seen by :meth:`prune` callers are dropped there."""

    def __init__(self) -> None:
        self._facts: dict[str, tuple[Any, Any, VolumeFacts]] = {}

    def get(self, pv: Mapping[str, Any]) -> VolumeFacts:
        md = meta_of(pv)
        name = md.get("name") or ""
        rv = md.get("resourceVersion")
        hit = self._facts.get(name)
        if hit is not None and hit[0] is pv and hit[1] == rv:
            return hit[2]
        facts = volume_facts(pv)
        self._facts[name] = (pv, rv, facts)
        return facts

    def prune(self, limit: int) -> None:
        """Forget everything once more than ``limit`` volumes are held (bounded memory)."""
        if len(self._facts) > limit:
            self._facts.clear()

    def __len__(self) -> int:
        return len(self._facts)


def index_volumes_for_claim(
    claim: Mapping[str, Any], volumes: Iterable[Mapping[str, Any]], facts: VolumeFactsCache | None = None
) -> ClaimVolumeIndex:
    """Pre-select the volumes that could serve ``claim`` on some node (see :class:`ClaimVolumeIndex`).

    ``facts`` memoises the per-volume work across calls."""
    vols = list(volumes)
    out = ClaimVolumeIndex(claim, vols)
    request = claim_request(claim)
    cls = claim_class(claim)
    mode = volume_mode(claim)
    spec = _spec(claim)
    selector_dict = spec.get("selector")
    selector = label_selector_from_dict(selector_dict) if selector_dict is not None else None
    modes = frozenset(spec.get("accessModes") or ())
    get_facts = facts.get if facts is not None else volume_facts
    for pos, pv in enumerate(vols):
        name, has_ref, usable, pv_mode, pv_class, pv_modes, capacity, hosts = get_facts(pv)
        if has_ref:
            if (is_volume_bound_to_claim(pv, claim) and pv_mode == mode
                    and not meta_of(pv).get("deletionTimestamp") and capacity >= request):
                out.prebound = True
                return out
            continue
        if not usable or pv_mode != mode or pv_class != cls or capacity < request or not modes <= pv_modes:
            continue
        if selector is not None and not selector.matches(meta_of(pv).get("labels") or {}):
            continue
        entry: _Entry = (capacity, pos, name, pv)
        if hosts is _UNSET:
            out.anywhere.append(entry)
        elif hosts is None:
            out.other.append(entry)
        else:
            for host in hosts:
                out.by_hostname.setdefault(host, []).append(entry)
    # Entries were appended in listing order, so a stable sort by capacity keeps
    # earlier-listed volumes first among equal capacities: (capacity, position) order.
    key = itemgetter(0)
    out.anywhere.sort(key=key)
    out.other.sort(key=key)
    for entries in out.by_hostname.values():
        entries.sort(key=key)
    return out
