"""Per-pod and per-node data the scheduler computes once and reuses.

``PodInfo`` is derived from one pod object (never mutated afterwards): its
resource requests computed as upstream ``PodRequests`` (init containers,
restartable sidecars, pod-level requests, overhead), the non-zero variant
used for scoring, tolerations, parsed node and pod (anti-)affinity, host
ports and volume claims.

``NodeInfo`` aggregates one node and the pods assigned to it. Resources are
``dict[str, int]``: ``cpu`` in milli-cores, memory and storage in bytes,
everything else in whole units. Every mutation takes a fresh value from a
process-wide generation counter, which the cache uses for incremental
snapshots.
"""

from __future__ import annotations

import itertools
import math
from datetime import datetime
from functools import lru_cache
from typing import Any, Iterable, Mapping

from kubeplane.api.nodeselector import NodeSelector, NodeSelectorTerm  # noqa: F401 - re-exported
from kubeplane.api.quantity import int_value, milli_value
from kubeplane.api.selectors import IN, NOT_IN, LabelSelector, Requirement, label_selector_from_dict

Obj = dict[str, Any]

CPU = "cpu"
MEMORY = "memory"
EPHEMERAL_STORAGE = "ephemeral-storage"
PODS = "pods"

#: Defaults assumed for containers without a cpu/memory request when scoring.
DEFAULT_MILLI_CPU_REQUEST = 100
DEFAULT_MEMORY_REQUEST = 200 * 1024 * 1024

_generation = itertools.count(1)


def next_generation() -> int:
    """A new, strictly increasing generation number (shared by all NodeInfos)."""
    return next(_generation)


# --------------------------------------------------------------------------- resources


@lru_cache(maxsize=8192)
def _quantity(name: str, raw: str) -> int:
    return milli_value(raw) if name == CPU else int_value(raw)


def quantity_value(name: str, raw: Any) -> int:
    """The integer value of a quantity for resource ``name`` (milli for cpu)."""
    if isinstance(raw, bool):
        raw = int(raw)
    if isinstance(raw, int):
        return raw * 1000 if name == CPU else raw
    return _quantity(name, str(raw))


def is_extended_resource_name(name: str) -> bool:
    """Extended resources: domain-prefixed, not ``kubernetes.io/`` and not ``requests.``."""
    if name.startswith("requests."):
        return False
    if "/" not in name:
        return False
    domain = name.split("/", 1)[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


def is_scalar_resource_name(name: str) -> bool:
    """Resources tracked by name besides cpu, memory, ephemeral-storage and pods."""
    return (
        is_extended_resource_name(name)
        or name.startswith("hugepages-")
        or name.startswith("attachable-volumes-")
        or name.startswith("kubernetes.io/")
    )


def _tracked(name: str) -> bool:
    return name in (CPU, MEMORY, EPHEMERAL_STORAGE) or is_scalar_resource_name(name)


def resource_list(raw: Mapping[str, Any] | None) -> dict[str, int]:
    """Convert an API ``ResourceList`` to integer values, keeping tracked resources."""
    out: dict[str, int] = {}
    if raw:
        for name, q in raw.items():
            if _tracked(name) or name == PODS:
                out[name] = quantity_value(name, q)
    return out


def _add_into(dst: dict[str, int], src: Mapping[str, int]) -> None:
    for k, v in src.items():
        dst[k] = dst.get(k, 0) + v


def _max_into(dst: dict[str, int], src: Mapping[str, int]) -> None:
    for k, v in src.items():
        dst[k] = max(v, dst.get(k, 0))


def _container_requests(c: Obj, defaults: Mapping[str, int] | None) -> dict[str, int]:
    reqs = {k: v for k, v in resource_list((c.get("resources") or {}).get("requests")).items() if k != PODS}
    if defaults:
        for k, v in defaults.items():
            if k not in reqs:
                reqs[k] = v
    return reqs


def _is_sidecar(c: Obj) -> bool:
    return c.get("restartPolicy") == "Always"


def pod_requests(pod: Obj, non_missing: Mapping[str, int] | None = None) -> dict[str, int]:
    """Effective resource requests of a pod, as upstream ``PodRequests``.

    ``max(sum(containers) + sum(sidecars), max over init containers of
    (init + sidecars started before it))``, replaced by pod-level requests
    for cpu/memory/hugepages when ``spec.resources.requests`` sets them, plus
    ``spec.overhead``. ``non_missing`` fills in per-container defaults for
    requests that are absent (the scoring variant).
    """
    spec = pod.get("spec") or {}
    reqs: dict[str, int] = {}
    for c in spec.get("containers") or ():
        _add_into(reqs, _container_requests(c, non_missing))
    sidecars: dict[str, int] = {}
    init_max: dict[str, int] = {}
    for c in spec.get("initContainers") or ():
        creq = _container_requests(c, non_missing)
        if _is_sidecar(c):
            _add_into(reqs, creq)
            _add_into(sidecars, creq)
            effective = dict(sidecars)
        else:
            effective = dict(creq)
            _add_into(effective, sidecars)
        _max_into(init_max, effective)
    _max_into(reqs, init_max)
    pod_level = (spec.get("resources") or {}).get("requests")
    if pod_level:
        for name, value in resource_list(pod_level).items():
            if name in (CPU, MEMORY) or name.startswith("hugepages-"):
                reqs[name] = value
    overhead = spec.get("overhead")
    if overhead:
        _add_into(reqs, {k: v for k, v in resource_list(overhead).items() if k != PODS})
    return reqs


_NON_ZERO_DEFAULTS = {CPU: DEFAULT_MILLI_CPU_REQUEST, MEMORY: DEFAULT_MEMORY_REQUEST}


# --------------------------------------------------------------------------- node selectors


class RequiredNodeAffinity:
    """``spec.nodeSelector`` AND ``requiredDuringScheduling...`` node affinity of a pod."""

    __slots__ = ("label_selector", "node_selector")

    def __init__(self, pod: Obj) -> None:
        spec = pod.get("spec") or {}
        ns = spec.get("nodeSelector")
        self.label_selector: dict[str, str] | None = dict(ns) if ns else None
        required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                    .get("requiredDuringSchedulingIgnoredDuringExecution"))
        self.node_selector = NodeSelector(required) if required is not None else None

    def matches(self, node: Obj) -> bool:
        if self.label_selector:
            labels = (node.get("metadata") or {}).get("labels") or {}
            for k, v in self.label_selector.items():
                if labels.get(k) != v:
                    return False
        if self.node_selector is not None:
            return self.node_selector.matches(node)
        return True


# --------------------------------------------------------------------------- pod affinity


class AffinityTerm:
    """A parsed ``podAffinityTerm``."""

    __slots__ = ("namespaces", "selector", "topology_key", "namespace_selector")

    def __init__(self, pod: Obj, term: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        sel = label_selector_from_dict(term.get("labelSelector"))
        extra: list[Requirement] = []
        if term.get("labelSelector") is not None:
            for key in term.get("matchLabelKeys") or ():
                if key in labels:
                    v = labels[key]
                    extra.append(Requirement(key, IN, (v,), frozenset((v,))))
            for key in term.get("mismatchLabelKeys") or ():
                if key in labels:
                    v = labels[key]
                    extra.append(Requirement(key, NOT_IN, (v,), frozenset((v,))))
        self.selector: LabelSelector = sel.add(*extra) if extra else sel
        self.topology_key: str = term.get("topologyKey") or ""
        namespaces = set(term.get("namespaces") or ())
        ns_sel = term.get("namespaceSelector")
        if not namespaces and ns_sel is None:
            namespaces = {meta.get("namespace") or "default"}
        self.namespaces: set[str] = namespaces
        self.namespace_selector: LabelSelector | None = (
            label_selector_from_dict(ns_sel) if ns_sel is not None else None
        )

    def matches(self, pod: Obj, ns_labels: Mapping[str, str] | None = None) -> bool:
        """Whether ``pod`` is selected (namespace and labels)."""
        meta = pod.get("metadata") or {}
        ns = meta.get("namespace") or "default"
        in_ns = ns in self.namespaces or (
            self.namespace_selector is not None and ns_labels is not None and self.namespace_selector.matches(ns_labels)
        )
        return in_ns and self.selector.matches(meta.get("labels") or {})


class WeightedAffinityTerm:
    __slots__ = ("term", "weight")

    def __init__(self, term: AffinityTerm, weight: int) -> None:
        self.term = term
        self.weight = weight


# --------------------------------------------------------------------------- PodInfo


@lru_cache(maxsize=8192)
def parse_time(value: str) -> float:
    """RFC 3339 to a POSIX timestamp; memoized (pods started in the same second share it)."""
    v = value.strip()
    if v.endswith("Z"):
        v = v[:-1] + "+00:00"
    return datetime.fromisoformat(v).timestamp()


def pod_start_time(pod: Obj) -> float:
    """``status.startTime`` as a POSIX timestamp; unset means "now" (later than any start)."""
    raw = (pod.get("status") or {}).get("startTime")
    if not raw:
        return math.inf
    try:
        return parse_time(str(raw))
    except ValueError:
        return math.inf


def pod_key(pod: Obj) -> str:
    """The cache key of a pod: its uid, or namespace/name when it has none."""
    meta = pod.get("metadata") or {}
    return meta.get("uid") or f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


class PodInfo:
    """Everything the scheduler derives from one pod object.

    Fields used by every NodeInfo update (requests, ports, claims, whether
    the pod has affinity) are computed at once; the rest (tolerations, node
    affinity, parsed pod affinity terms, images, resource claims) on first
    access, since most pods in a NodeInfo are never asked for them.
    """

    __slots__ = (
        "pod", "uid", "name", "namespace", "key", "node_name", "priority", "requests",
        "non_zero_cpu", "non_zero_memory", "has_affinity", "host_ports", "pvc_names",
        "_tolerations", "_required_node_affinity", "_preferred_node_terms", "_required_affinity_terms",
        "_required_anti_affinity_terms", "_preferred_affinity_terms", "_preferred_anti_affinity_terms",
        "_resource_claims", "_images", "_start_time",
    )

    def __init__(self, pod: Obj) -> None:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        self.pod = pod
        self.name: str = meta.get("name") or ""
        self.namespace: str = meta.get("namespace") or "default"
        self.uid: str = pod_key(pod)
        self.key = self.uid
        self.node_name: str = spec.get("nodeName") or ""
        self.priority: int = int(spec.get("priority") or 0)
        self.requests, self.non_zero_cpu, self.non_zero_memory = _requests_and_non_zero(pod, spec)
        affinity = spec.get("affinity") or {}
        self.has_affinity = bool(affinity.get("podAffinity") is not None or affinity.get("podAntiAffinity") is not None)
        self.host_ports: list[tuple[str, str, int]] = host_ports(pod)
        pvcs: list[str] = []
        for v in spec.get("volumes") or ():
            claim = (v.get("persistentVolumeClaim") or {}).get("claimName")
            if claim:
                pvcs.append(claim)
            elif v.get("ephemeral") is not None:
                pvcs.append(f"{self.name}-{v.get('name')}")
        self.pvc_names: list[str] = pvcs
        self._tolerations: list[Obj] | None = None
        self._required_node_affinity: RequiredNodeAffinity | None = None
        self._preferred_node_terms: list[tuple[int, NodeSelectorTerm]] | None = None
        self._required_affinity_terms: list[AffinityTerm] | None = None
        self._required_anti_affinity_terms: list[AffinityTerm] | None = None
        self._preferred_affinity_terms: list[WeightedAffinityTerm] | None = None
        self._preferred_anti_affinity_terms: list[WeightedAffinityTerm] | None = None
        self._resource_claims: list[Obj] | None = None
        self._images: list[str] | None = None
        self._start_time: float | None = None

    def for_copy(self, pod: Obj) -> "PodInfo":
        """The PodInfo of ``pod``, a copy of this pod that differs at most in
        ``spec.nodeName`` (the scheduler's assumed pod): everything derived from
        the pod is shared instead of computed again."""
        out = PodInfo.__new__(PodInfo)
        for name in PodInfo.__slots__:
            setattr(out, name, getattr(self, name))
        out.pod = pod
        out.node_name = (pod.get("spec") or {}).get("nodeName") or ""
        return out

    def for_version(self, pod: Obj) -> "PodInfo | None":
        """The PodInfo of ``pod``, another version of this pod, sharing what is
        derived from the spec when the spec and identity are unchanged (an
        assumed pod confirmed by the informer, a status update); None when
        they differ. The start time, read from the status, is read again."""
        if pod.get("spec") != self.pod.get("spec"):
            return None
        meta, mine = pod.get("metadata") or {}, self.pod.get("metadata") or {}
        if (meta.get("uid"), meta.get("name"), meta.get("namespace")) != (
                mine.get("uid"), mine.get("name"), mine.get("namespace")):
            return None
        out = self.for_copy(pod)
        out._start_time = None
        return out

    def _spec(self) -> Obj:
        return self.pod.get("spec") or {}

    def _affinity(self, kind: str) -> Obj:
        return ((self._spec().get("affinity") or {}).get(kind)) or {}

    @property
    def tolerations(self) -> list[Obj]:
        if self._tolerations is None:
            self._tolerations = list(self._spec().get("tolerations") or ())
        return self._tolerations

    @property
    def required_node_affinity(self) -> RequiredNodeAffinity:
        if self._required_node_affinity is None:
            self._required_node_affinity = RequiredNodeAffinity(self.pod)
        return self._required_node_affinity

    @property
    def preferred_node_terms(self) -> list[tuple[int, NodeSelectorTerm]]:
        if self._preferred_node_terms is None:
            self._preferred_node_terms = [
                (int(p.get("weight") or 0), NodeSelectorTerm(p.get("preference") or {}))
                for p in self._affinity("nodeAffinity").get("preferredDuringSchedulingIgnoredDuringExecution") or ()
            ]
        return self._preferred_node_terms

    @property
    def required_affinity_terms(self) -> list[AffinityTerm]:
        if self._required_affinity_terms is None:
            self._required_affinity_terms = [
                AffinityTerm(self.pod, t)
                for t in self._affinity("podAffinity").get("requiredDuringSchedulingIgnoredDuringExecution") or ()
            ]
        return self._required_affinity_terms

    @property
    def required_anti_affinity_terms(self) -> list[AffinityTerm]:
        if self._required_anti_affinity_terms is None:
            self._required_anti_affinity_terms = [
                AffinityTerm(self.pod, t)
                for t in self._affinity("podAntiAffinity").get("requiredDuringSchedulingIgnoredDuringExecution") or ()
            ]
        return self._required_anti_affinity_terms

    @property
    def preferred_affinity_terms(self) -> list[WeightedAffinityTerm]:
        if self._preferred_affinity_terms is None:
            self._preferred_affinity_terms = _weighted_terms(
                self.pod, self._affinity("podAffinity").get("preferredDuringSchedulingIgnoredDuringExecution"))
        return self._preferred_affinity_terms

    @property
    def preferred_anti_affinity_terms(self) -> list[WeightedAffinityTerm]:
        if self._preferred_anti_affinity_terms is None:
            self._preferred_anti_affinity_terms = _weighted_terms(
                self.pod, self._affinity("podAntiAffinity").get("preferredDuringSchedulingIgnoredDuringExecution"))
        return self._preferred_anti_affinity_terms

    @property
    def resource_claims(self) -> list[Obj]:
        if self._resource_claims is None:
            self._resource_claims = list(self._spec().get("resourceClaims") or ())
        return self._resource_claims

    @property
    def start_time(self) -> float:
        """``status.startTime`` as a POSIX timestamp, infinity when unset (parsed once)."""
        if self._start_time is None:
            self._start_time = pod_start_time(self.pod)
        return self._start_time

    @property
    def images(self) -> list[str]:
        if self._images is None:
            spec = self._spec()
            self._images = [c.get("image") or "" for c in
                            itertools.chain(spec.get("initContainers") or (), spec.get("containers") or ())]
        return self._images

    def update(self, pod: Obj) -> "PodInfo":
        """A PodInfo for a newer version of the pod (recomputed)."""
        return PodInfo(pod)

    def __repr__(self) -> str:
        return f"PodInfo({self.namespace}/{self.name})"


def _weighted_terms(pod: Obj, raw: Any) -> list[WeightedAffinityTerm]:
    return [WeightedAffinityTerm(AffinityTerm(pod, w.get("podAffinityTerm") or {}), int(w.get("weight") or 0))
            for w in raw or ()]


@lru_cache(maxsize=4096)
def _container_request_items(items: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, int], ...]:
    return tuple((k, v) for k, v in resource_list(dict(items)).items() if k != PODS)


def _requests_and_non_zero(pod: Obj, spec: Obj) -> tuple[dict[str, int], int, int]:
    """``pod_requests(pod)`` and the non-zero cpu/memory of ``pod_requests(pod, defaults)``.

    One pass over the containers in the common case (no init containers,
    pod-level requests or overhead); otherwise the general functions.
    """
    if spec.get("initContainers") or spec.get("overhead") or (spec.get("resources") or {}).get("requests"):
        nz = pod_requests(pod, _NON_ZERO_DEFAULTS)
        return pod_requests(pod), nz.get(CPU, 0), nz.get(MEMORY, 0)
    reqs: dict[str, int] = {}
    nz_cpu = nz_mem = 0
    for c in spec.get("containers") or ():
        raw = (c.get("resources") or {}).get("requests")
        if raw:
            try:
                items = _container_request_items(tuple(raw.items()))
            except TypeError:  # unhashable quantity values
                items = tuple((k, v) for k, v in resource_list(raw).items() if k != PODS)
        else:
            items = ()
        have_cpu = have_mem = False
        for k, v in items:
            reqs[k] = reqs.get(k, 0) + v
            if k == CPU:
                nz_cpu += v
                have_cpu = True
            elif k == MEMORY:
                nz_mem += v
                have_mem = True
        if not have_cpu:
            nz_cpu += DEFAULT_MILLI_CPU_REQUEST
        if not have_mem:
            nz_mem += DEFAULT_MEMORY_REQUEST
    return reqs, nz_cpu, nz_mem


def host_ports(pod: Obj) -> list[tuple[str, str, int]]:
    """``(hostIP, protocol, hostPort)`` of every container port with a host port.

    Regular containers and restartable init containers (sidecars) count; an
    empty hostIP means ``0.0.0.0``, an empty protocol means TCP.
    """
    spec = pod.get("spec") or {}
    out: list[tuple[str, str, int]] = []
    containers: Iterable[Obj] = itertools.chain(
        spec.get("containers") or (), (c for c in spec.get("initContainers") or () if _is_sidecar(c))
    )
    for c in containers:
        for p in c.get("ports") or ():
            hp = int(p.get("hostPort") or 0)
            if hp <= 0:
                continue
            out.append((p.get("hostIP") or "0.0.0.0", p.get("protocol") or "TCP", hp))
    return out


# --------------------------------------------------------------------------- host ports


class HostPortInfo:
    """Used host ports of a node: ``ip -> {(protocol, port)}`` with 0.0.0.0 wildcard."""

    __slots__ = ("_ports",)

    def __init__(self) -> None:
        self._ports: dict[str, dict[tuple[str, int], int]] = {}

    def add(self, ip: str, protocol: str, port: int) -> None:
        m = self._ports.setdefault(ip or "0.0.0.0", {})
        k = (protocol or "TCP", port)
        m[k] = m.get(k, 0) + 1

    def remove(self, ip: str, protocol: str, port: int) -> None:
        ip = ip or "0.0.0.0"
        m = self._ports.get(ip)
        if not m:
            return
        k = (protocol or "TCP", port)
        n = m.get(k, 0) - 1
        if n <= 0:
            m.pop(k, None)
        else:
            m[k] = n
        if not m:
            del self._ports[ip]

    def check_conflict(self, ip: str, protocol: str, port: int) -> bool:
        """Whether ``(ip, protocol, port)`` collides with a used port."""
        if port <= 0:
            return False
        ip = ip or "0.0.0.0"
        k = (protocol or "TCP", port)
        if ip == "0.0.0.0":
            return any(k in m for m in self._ports.values())
        for check_ip in (ip, "0.0.0.0"):
            m = self._ports.get(check_ip)
            if m and k in m:
                return True
        return False

    def __len__(self) -> int:
        return sum(len(m) for m in self._ports.values())

    def clone(self) -> "HostPortInfo":
        c = HostPortInfo()
        c._ports = {ip: dict(m) for ip, m in self._ports.items()}
        return c


# --------------------------------------------------------------------------- NodeInfo


class ImageStateSummary:
    """Size of an image and on how many nodes it is present (shared across NodeInfos)."""

    __slots__ = ("size", "nodes")

    def __init__(self, size: int) -> None:
        self.size = size
        self.nodes: set[str] = set()

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)


class NodeInfo:
    """A node and the pods assigned to it, with aggregated requests."""

    __slots__ = (
        "node", "name", "allocatable", "requested", "non_zero_requested", "pods", "pods_with_affinity",
        "pods_with_required_anti_affinity", "used_ports", "pvc_ref_counts", "image_states", "generation",
    )

    def __init__(self, node: Obj | None = None, pods: Iterable[PodInfo | Obj] = ()) -> None:
        self.node: Obj | None = None
        self.name: str = ""
        self.allocatable: dict[str, int] = {}
        self.requested: dict[str, int] = {}
        self.non_zero_requested: dict[str, int] = {CPU: 0, MEMORY: 0}
        self.pods: list[PodInfo] = []
        self.pods_with_affinity: list[PodInfo] = []
        self.pods_with_required_anti_affinity: list[PodInfo] = []
        self.used_ports = HostPortInfo()
        self.pvc_ref_counts: dict[str, int] = {}
        self.image_states: dict[str, ImageStateSummary] = {}
        self.generation = next_generation()
        if node is not None:
            self.set_node(node)
        for p in pods:
            self.add_pod(p)

    @property
    def allowed_pod_number(self) -> int:
        return self.allocatable.get(PODS, 0)

    def set_node(self, node: Obj) -> None:
        self.node = node
        self.name = (node.get("metadata") or {}).get("name") or ""
        self.allocatable = resource_list((node.get("status") or {}).get("allocatable"))
        self.generation = next_generation()

    def remove_node(self) -> None:
        self.node = None
        self.generation = next_generation()

    def add_pod(self, pod: PodInfo | Obj) -> PodInfo:
        pi = pod if isinstance(pod, PodInfo) else PodInfo(pod)
        self.pods.append(pi)
        if pi.has_affinity:
            self.pods_with_affinity.append(pi)
        if pi.required_anti_affinity_terms:
            self.pods_with_required_anti_affinity.append(pi)
        self._update(pi, 1)
        return pi

    def remove_pod(self, pod: PodInfo | Obj) -> PodInfo:
        """Remove the pod with the same uid; ``KeyError`` when absent."""
        uid = pod_key(pod) if isinstance(pod, dict) else pod.uid
        for lst in (self.pods_with_affinity, self.pods_with_required_anti_affinity):
            for i, p in enumerate(lst):
                if p.uid == uid:
                    del lst[i]
                    break
        for i, p in enumerate(self.pods):
            if p.uid == uid:
                del self.pods[i]
                self._update(p, -1)
                return p
        raise KeyError(f"no corresponding pod {uid} in pods of node {self.name}")

    def _update(self, pi: PodInfo, sign: int) -> None:
        req = self.requested
        for k, v in pi.requests.items():
            req[k] = req.get(k, 0) + sign * v
        nz = self.non_zero_requested
        nz[CPU] += sign * pi.non_zero_cpu
        nz[MEMORY] += sign * pi.non_zero_memory
        for ip, proto, port in pi.host_ports:
            if sign > 0:
                self.used_ports.add(ip, proto, port)
            else:
                self.used_ports.remove(ip, proto, port)
        for claim in pi.pvc_names:
            key = f"{pi.namespace}/{claim}"
            n = self.pvc_ref_counts.get(key, 0) + sign
            if n <= 0:
                self.pvc_ref_counts.pop(key, None)
            else:
                self.pvc_ref_counts[key] = n
        self.generation = next_generation()

    def clone(self) -> "NodeInfo":
        """A copy whose lists and maps can be mutated independently (PodInfos shared)."""
        c = NodeInfo.__new__(NodeInfo)
        self.copy_into(c)
        return c

    def copy_into(self, c: "NodeInfo") -> None:
        """Overwrite ``c``'s state with a copy of this one's, as :meth:`clone` makes
        (``c`` keeps its identity: the snapshot's NodeInfos are updated in place)."""
        c.node = self.node
        c.name = self.name
        c.allocatable = dict(self.allocatable)
        c.requested = dict(self.requested)
        c.non_zero_requested = dict(self.non_zero_requested)
        c.pods = list(self.pods)
        c.pods_with_affinity = list(self.pods_with_affinity)
        c.pods_with_required_anti_affinity = list(self.pods_with_required_anti_affinity)
        c.used_ports = self.used_ports.clone()
        c.pvc_ref_counts = dict(self.pvc_ref_counts)
        c.image_states = dict(self.image_states)
        c.generation = self.generation

    def __repr__(self) -> str:
        return f"NodeInfo({self.name!r}, pods={len(self.pods)}, gen={self.generation})"
