"""Resource quota accounting: what an object costs a ResourceQuota.

Shared by the ResourceQuota admission plugin (which charges a request to the
quotas of its namespace) and the resource quota controller (which recounts
``status.used`` from the objects stored), so both agree to the unit. After
upstream's quota evaluators (``pkg/quota/v1/evaluator/core`` and the generic
object-count evaluator):

* pods: ``pods``, ``count/pods``, ``requests.*`` / ``limits.*`` (and the bare
  ``cpu``, ``memory``, ``ephemeral-storage`` for requests), hugepages and
  extended resources (``requests.<name>``); a pod stops counting once it is
  Succeeded or Failed, or past its deletion grace period;
* services: ``services``, ``services.nodeports``, ``services.loadbalancers``;
* persistentvolumeclaims: ``persistentvolumeclaims``, ``requests.storage``
  and ``<class>.storageclass.storage.k8s.io/<resource>``;
* every other namespaced resource: ``count/<plural>[.<group>]`` and, for the
  legacy core kinds, their bare names (``secrets``, ``configmaps``,
  ``replicationcontrollers``, ``resourcequotas``).

Quantities are ``(Fraction, format)`` pairs: a sum takes the format of its
first non-zero term, as upstream's ``Quantity.Add`` does, so ``status.used``
reads ``512Mi`` where the pods asked in ``Mi``.
"""

from __future__ import annotations

import datetime as _dt
from fractions import Fraction
from typing import Any, Iterable, Mapping

from kubeplane.api.quantity import QuantityFormat, format_quantity, parse_quantity_with_format

Obj = dict[str, Any]
#: one quantity: its exact value and the format family it prints in
Quantity = tuple[Fraction, QuantityFormat]
#: resource name -> quantity
ResourceList = dict[str, Quantity]

ZERO: Quantity = (Fraction(0), "DecimalSI")
ONE: Quantity = (Fraction(1), "DecimalSI")

# the scopes a quota may name (spec.scopes, spec.scopeSelector)
TERMINATING = "Terminating"
NOT_TERMINATING = "NotTerminating"
BEST_EFFORT = "BestEffort"
NOT_BEST_EFFORT = "NotBestEffort"
PRIORITY_CLASS = "PriorityClass"
CROSS_NAMESPACE_POD_AFFINITY = "CrossNamespacePodAffinity"
VOLUME_ATTRIBUTES_CLASS = "VolumeAttributesClass"
SCOPES = (TERMINATING, NOT_TERMINATING, BEST_EFFORT, NOT_BEST_EFFORT, PRIORITY_CLASS,
          CROSS_NAMESPACE_POD_AFFINITY, VOLUME_ATTRIBUTES_CLASS)

REQUESTS_PREFIX = "requests."
LIMITS_PREFIX = "limits."
HUGEPAGES_PREFIX = "hugepages-"
STORAGE_CLASS_SUFFIX = ".storageclass.storage.k8s.io/"

POD_RESOURCES = frozenset({
    "count/pods", "cpu", "memory", "ephemeral-storage", "requests.cpu", "requests.memory",
    "requests.ephemeral-storage", "limits.cpu", "limits.memory", "limits.ephemeral-storage", "pods",
})
SERVICE_RESOURCES = frozenset({"count/services", "services", "services.nodeports", "services.loadbalancers"})
PVC_RESOURCES = frozenset({"count/persistentvolumeclaims", "persistentvolumeclaims", "requests.storage"})
#: the core kinds counted under a bare name besides ``count/<plural>``
LEGACY_COUNT_NAMES = {"pods": "pods", "services": "services", "replicationcontrollers": "replicationcontrollers",
                      "resourcequotas": "resourcequotas", "secrets": "secrets", "configmaps": "configmaps",
                      "persistentvolumeclaims": "persistentvolumeclaims"}

#: the names ``spec.hard`` may use without a domain (upstream's standard quota resources)
STANDARD_QUOTA_RESOURCES = frozenset({
    "cpu", "memory", "ephemeral-storage", "requests.cpu", "requests.memory", "requests.storage",
    "requests.ephemeral-storage", "limits.cpu", "limits.memory", "limits.ephemeral-storage", "pods",
    "resourcequotas", "services", "replicationcontrollers", "secrets", "persistentvolumeclaims", "configmaps",
    "services.nodeports", "services.loadbalancers",
})
#: quota resources counted in whole units
INTEGER_RESOURCES = frozenset({
    "pods", "resourcequotas", "services", "replicationcontrollers", "secrets", "configmaps",
    "persistentvolumeclaims", "services.nodeports", "services.loadbalancers",
})
_POD_COMPUTE = frozenset({"cpu", "memory", "limits.cpu", "limits.memory", "requests.cpu", "requests.memory"})


# ------------------------------------------------------------------ quantities


def parse_list(raw: Any) -> ResourceList:
    """A ``{name: quantity}`` map as a ResourceList (values that do not parse
    are left out: validation refuses them before they are stored)."""
    out: ResourceList = {}
    if isinstance(raw, dict):
        for name, value in raw.items():
            try:
                out[str(name)] = parse_quantity_with_format(value)
            except (TypeError, ValueError):
                continue
    return out


def fmt(q: Quantity) -> str:
    return format_quantity(q[0], q[1])


def to_raw(rl: Mapping[str, Quantity]) -> dict[str, str]:
    """A ResourceList as the API serves it (canonical quantity strings)."""
    return {name: fmt(q) for name, q in sorted(rl.items())}


def add_q(a: Quantity, b: Quantity) -> Quantity:
    return (a[0] + b[0], b[1] if a[0] == 0 else a[1])


def add(a: Mapping[str, Quantity], b: Mapping[str, Quantity]) -> ResourceList:
    out = dict(a)
    for name, q in b.items():
        out[name] = add_q(out[name], q) if name in out else q
    return out


def subtract_non_negative(a: Mapping[str, Quantity], b: Mapping[str, Quantity]) -> ResourceList:
    """``a - b`` per resource of ``a``, never below zero (upstream's SubtractWithNonNegativeResult)."""
    out: ResourceList = {}
    for name, q in a.items():
        v = q[0] - b[name][0] if name in b else q[0]
        out[name] = (max(v, Fraction(0)), q[1])
    return out


def mask(rl: Mapping[str, Quantity], names: Iterable[str]) -> ResourceList:
    keep = set(names)
    return {n: q for n, q in rl.items() if n in keep}


def remove_zeros(rl: Mapping[str, Quantity]) -> ResourceList:
    return {n: q for n, q in rl.items() if q[0] != 0}


def less_or_equal(a: Mapping[str, Quantity], b: Mapping[str, Quantity]) -> tuple[bool, list[str]]:
    """Whether every resource of ``a`` that ``b`` names is within it, and those that are not."""
    exceeded = [n for n, q in a.items() if n in b and q[0] > b[n][0]]
    return not exceeded, exceeded


def equal_values(a: Mapping[str, Quantity], b: Mapping[str, Quantity]) -> bool:
    return a.keys() == b.keys() and all(a[n][0] == b[n][0] for n in a)


def pretty(rl: Mapping[str, Quantity]) -> str:
    """``name=value`` pairs sorted by name, as upstream's quota messages print them."""
    return ",".join(f"{n}={fmt(rl[n])}" for n in sorted(rl))


# ----------------------------------------------------------------- pod usage


def _container_lists(spec: Obj, field: str) -> list[Obj]:
    items = spec.get(field)
    return [c for c in items if isinstance(c, dict)] if isinstance(items, list) else []


def _container_resources(c: Obj, which: str) -> ResourceList:
    res = c.get("resources")
    return parse_list(res.get(which)) if isinstance(res, dict) else {}


def _max_into(dst: ResourceList, src: Mapping[str, Quantity]) -> None:
    for n, q in src.items():
        if n not in dst or q[0] > dst[n][0]:
            dst[n] = q


def pod_aggregate(spec: Obj, which: str) -> ResourceList:
    """A pod's effective requests or limits (``which``), as upstream's
    PodRequests / PodLimits: the containers' sum (restartable init containers,
    the sidecars, included) or the largest init container with the sidecars
    started before it, whichever is larger; pod-level resources replace the
    containers' for what they set; ``spec.overhead`` comes on top."""
    total: ResourceList = {}
    for c in _container_lists(spec, "containers"):
        total = add(total, _container_resources(c, which))
    sidecars: ResourceList = {}
    init_max: ResourceList = {}
    for c in _container_lists(spec, "initContainers"):
        own = _container_resources(c, which)
        if c.get("restartPolicy") == "Always":
            total = add(total, own)
            sidecars = add(sidecars, own)
            _max_into(init_max, sidecars)
        else:
            _max_into(init_max, add(own, sidecars))
    _max_into(total, init_max)
    pod_level = spec.get("resources")
    if isinstance(pod_level, dict):
        for n, q in parse_list(pod_level.get(which)).items():
            if n in ("cpu", "memory") or n.startswith(HUGEPAGES_PREFIX):
                total[n] = q
    if spec.get("overhead"):
        total = add(total, parse_list(spec.get("overhead")))
    return total


def _is_extended(name: str) -> bool:
    """Not in the kubernetes.io domain and not a quota ``requests.`` name."""
    if "/" not in name or "kubernetes.io/" in name:
        return False
    return not name.startswith(REQUESTS_PREFIX)


def compute_usage(requests: Mapping[str, Quantity], limits: Mapping[str, Quantity]) -> ResourceList:
    """The quota resources a set of requests and limits uses (upstream's podComputeUsageHelper)."""
    out: ResourceList = {"pods": ONE}
    for name in ("cpu", "memory", "ephemeral-storage"):
        if name in requests:
            out[name] = requests[name]
            out[REQUESTS_PREFIX + name] = requests[name]
        if name in limits:
            out[LIMITS_PREFIX + name] = limits[name]
    for name, q in requests.items():
        if name.startswith(HUGEPAGES_PREFIX):
            out[name] = q
            out[REQUESTS_PREFIX + name] = q
        elif _is_extended(name):
            out[REQUESTS_PREFIX + name] = q
    return out


def is_terminating(pod: Obj) -> bool:
    """Has ``activeDeadlineSeconds`` (the Terminating scope)."""
    ads = (pod.get("spec") or {}).get("activeDeadlineSeconds")
    return isinstance(ads, int) and not isinstance(ads, bool) and ads >= 0


def _positive(rl: Mapping[str, Quantity]) -> set[str]:
    return {n for n in ("cpu", "memory") if n in rl and rl[n][0] > 0}


def is_best_effort(pod: Obj) -> bool:
    """No container requests or limits cpu or memory above zero (QoS class BestEffort)."""
    spec = pod.get("spec") or {}
    for c in _container_lists(spec, "containers") + _container_lists(spec, "initContainers"):
        if _positive(_container_resources(c, "requests")) or _positive(_container_resources(c, "limits")):
            return False
    pod_level = spec.get("resources")
    if isinstance(pod_level, dict):
        if _positive(parse_list(pod_level.get("requests"))) or _positive(parse_list(pod_level.get("limits"))):
            return False
    return True


def pod_counts(pod: Obj, now: _dt.datetime) -> bool:
    """Whether a pod still uses its compute resources (upstream's QuotaV1Pod):
    not Succeeded or Failed, and not past the end of its deletion grace period."""
    phase = (pod.get("status") or {}).get("phase")
    if phase in ("Succeeded", "Failed"):
        return False
    md = pod.get("metadata") or {}
    deleted, grace = md.get("deletionTimestamp"), md.get("deletionGracePeriodSeconds")
    if deleted and isinstance(grace, int):
        from kubeplane.api.meta import parse_time

        try:
            when = parse_time(deleted)
        except ValueError:
            return True
        if now > when + _dt.timedelta(seconds=grace):
            return False
    return True


def pod_usage(pod: Obj, now: _dt.datetime) -> ResourceList:
    out: ResourceList = {"count/pods": ONE}
    if not pod_counts(pod, now):
        return out
    spec = pod.get("spec") or {}
    return add(out, compute_usage(pod_aggregate(spec, "requests"), pod_aggregate(spec, "limits")))


def _cross_namespace(terms: Any, weighted: bool) -> bool:
    for t in terms if isinstance(terms, list) else []:
        if weighted and isinstance(t, dict):
            t = t.get("podAffinityTerm")
        if isinstance(t, dict) and (t.get("namespaces") or t.get("namespaceSelector") is not None):
            return True
    return False


def uses_cross_namespace_affinity(pod: Obj) -> bool:
    aff = (pod.get("spec") or {}).get("affinity")
    if not isinstance(aff, dict):
        return False
    for kind in ("podAffinity", "podAntiAffinity"):
        a = aff.get(kind)
        if isinstance(a, dict) and (
                _cross_namespace(a.get("requiredDuringSchedulingIgnoredDuringExecution"), False)
                or _cross_namespace(a.get("preferredDuringSchedulingIgnoredDuringExecution"), True)):
            return True
    return False


def _selector_matches(req: Obj, value: str | None) -> bool:
    """A scope selector requirement against the one label its scope stands for."""
    op = req.get("operator")
    values = [str(v) for v in req.get("values") or []]
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    return False


def pod_matches_scope(req: Obj, pod: Obj) -> bool:
    scope = req.get("scopeName")
    if scope == TERMINATING:
        return is_terminating(pod)
    if scope == NOT_TERMINATING:
        return not is_terminating(pod)
    if scope == BEST_EFFORT:
        return is_best_effort(pod)
    if scope == NOT_BEST_EFFORT:
        return not is_best_effort(pod)
    if scope == PRIORITY_CLASS:
        pc = (pod.get("spec") or {}).get("priorityClassName") or None
        return _selector_matches(req, pc)
    if scope == CROSS_NAMESPACE_POD_AFFINITY:
        return uses_cross_namespace_affinity(pod)
    return False


def pvc_matches_scope(req: Obj, pvc: Obj) -> bool:
    if req.get("scopeName") == VOLUME_ATTRIBUTES_CLASS:
        spec = pvc.get("spec") or {}
        status = pvc.get("status") or {}
        names = {spec.get("volumeAttributesClassName"), status.get("currentVolumeAttributesClassName"),
                 (status.get("modifyVolumeStatus") or {}).get("targetVolumeAttributesClassName")}
        names.discard(None)
        names.discard("")
        if req.get("operator") in ("Exists", "DoesNotExist"):
            return _selector_matches(req, next(iter(names), None))
        return any(_selector_matches(req, n) for n in names) if names else _selector_matches(req, None)
    return False


def missing_requirements(pod: Obj, required: Iterable[str]) -> str | None:
    """``must specify ...`` when a quota limits a compute resource some
    container does not state (upstream's pod Constraints), else None."""
    spec = pod.get("spec") or {}
    pod_level = spec.get("resources")
    if isinstance(pod_level, dict) and (pod_level.get("requests") or pod_level.get("limits")):
        return None
    wanted = set(required) & _POD_COMPUTE
    if not wanted:
        return None
    missing: dict[str, set[str]] = {}
    for c in _container_lists(spec, "containers") + _container_lists(spec, "initContainers"):
        have = set(compute_usage(_container_resources(c, "requests"), _container_resources(c, "limits")))
        for name in wanted - have:
            missing.setdefault(name, set()).add(str(c.get("name", "")))
    if not missing:
        return None
    parts = [f"{name} for: {','.join(sorted(missing[name]))}" for name in sorted(missing)]
    return "must specify " + "; ".join(parts)


# --------------------------------------------------------------- evaluators


class Evaluator:
    """What one resource costs: the quota names it uses, its usage, its scopes.

    ``group`` and ``plural`` name the resource; ``count_name`` is its
    ``count/...`` name."""

    def __init__(self, group: str, plural: str) -> None:
        self.group = group
        self.plural = plural
        self.count_name = f"count/{plural}.{group}" if group else f"count/{plural}"
        legacy = LEGACY_COUNT_NAMES.get(plural) if not group else None
        self.names = frozenset({self.count_name} | ({legacy} if legacy else set()))

    def matching_resources(self, names: Iterable[str]) -> list[str]:
        return sorted(n for n in names if n in self.names)

    def usage(self, obj: Obj, now: _dt.datetime) -> ResourceList:
        legacy = LEGACY_COUNT_NAMES.get(self.plural) if not self.group else None
        out: ResourceList = {self.count_name: ONE}
        if legacy:
            out[legacy] = ONE
        return out

    def matches_scope(self, req: Obj, obj: Obj) -> bool:
        return False

    def handles(self, operation: str, obj: Obj | None, old: Obj | None, subresource: str) -> bool:
        """Whether a request of this kind can change quota usage (only creates,
        for a plain object count)."""
        return operation == "CREATE" and not subresource

    def constraints(self, required: Iterable[str], obj: Obj) -> str | None:
        return None


class PodEvaluator(Evaluator):
    def __init__(self) -> None:
        super().__init__("", "pods")

    def matching_resources(self, names: Iterable[str]) -> list[str]:
        return sorted(n for n in names if n in POD_RESOURCES or n.startswith(HUGEPAGES_PREFIX)
                      or n.startswith(REQUESTS_PREFIX + HUGEPAGES_PREFIX)
                      or (n.startswith(REQUESTS_PREFIX) and _is_extended(n[len(REQUESTS_PREFIX):])))

    def usage(self, obj: Obj, now: _dt.datetime) -> ResourceList:
        return pod_usage(obj, now)

    def matches_scope(self, req: Obj, obj: Obj) -> bool:
        return pod_matches_scope(req, obj)

    def handles(self, operation: str, obj: Obj | None, old: Obj | None, subresource: str) -> bool:
        if subresource == "resize":
            return operation == "UPDATE"
        if subresource:
            return False
        if operation == "UPDATE" and obj is not None and old is not None:
            return is_terminating(obj) != is_terminating(old)
        return operation == "CREATE"

    def constraints(self, required: Iterable[str], obj: Obj) -> str | None:
        return missing_requirements(obj, required)


class ServiceEvaluator(Evaluator):
    def __init__(self) -> None:
        super().__init__("", "services")

    def matching_resources(self, names: Iterable[str]) -> list[str]:
        return sorted(n for n in names if n in SERVICE_RESOURCES)

    def usage(self, obj: Obj, now: _dt.datetime) -> ResourceList:
        spec = obj.get("spec") or {}
        out: ResourceList = {"count/services": ONE, "services": ONE,
                             "services.nodeports": ZERO, "services.loadbalancers": ZERO}
        ports = len([p for p in spec.get("ports") or [] if isinstance(p, dict)])
        typ = spec.get("type") or "ClusterIP"
        if typ == "NodePort":
            out["services.nodeports"] = (Fraction(ports), "DecimalSI")
        elif typ == "LoadBalancer":
            out["services.loadbalancers"] = ONE
            if spec.get("allocateLoadBalancerNodePorts") is not False:
                out["services.nodeports"] = (Fraction(ports), "DecimalSI")
        return out

    def handles(self, operation: str, obj: Obj | None, old: Obj | None, subresource: str) -> bool:
        return operation in ("CREATE", "UPDATE") and not subresource


class PVCEvaluator(Evaluator):
    def __init__(self) -> None:
        super().__init__("", "persistentvolumeclaims")

    def matching_resources(self, names: Iterable[str]) -> list[str]:
        out = []
        for n in names:
            if n in PVC_RESOURCES:
                out.append(n)
            elif STORAGE_CLASS_SUFFIX in n and n.rsplit("/", 1)[-1] in ("persistentvolumeclaims",
                                                                       "requests.storage"):
                out.append(n)
        return sorted(out)

    def usage(self, obj: Obj, now: _dt.datetime) -> ResourceList:
        spec = obj.get("spec") or {}
        out: ResourceList = {"count/persistentvolumeclaims": ONE, "persistentvolumeclaims": ONE}
        cls = spec.get("storageClassName") or ""
        if cls:
            out[f"{cls}{STORAGE_CLASS_SUFFIX}persistentvolumeclaims"] = ONE
        requested = parse_list((spec.get("resources") or {}).get("requests")).get("storage")
        allocated = parse_list((obj.get("status") or {}).get("allocatedResources")).get("storage")
        if requested is not None and allocated is not None and allocated[0] > requested[0]:
            requested = allocated
        if requested is not None:
            out["requests.storage"] = requested
            if cls:
                out[f"{cls}{STORAGE_CLASS_SUFFIX}requests.storage"] = requested
        return out

    def matches_scope(self, req: Obj, obj: Obj) -> bool:
        return pvc_matches_scope(req, obj)

    def handles(self, operation: str, obj: Obj | None, old: Obj | None, subresource: str) -> bool:
        return operation in ("CREATE", "UPDATE") and not subresource


_EVALUATORS: dict[tuple[str, str], Evaluator] = {
    ("", "pods"): PodEvaluator(),
    ("", "services"): ServiceEvaluator(),
    ("", "persistentvolumeclaims"): PVCEvaluator(),
}


def evaluator_for(group: str, plural: str) -> Evaluator:
    """The evaluator of a resource (an object count for those without one of their own)."""
    ev = _EVALUATORS.get((group, plural))
    if ev is None:
        ev = _EVALUATORS[(group, plural)] = Evaluator(group, plural)
    return ev


def resource_of_count(name: str) -> tuple[str, str] | None:
    """``count/deployments.apps`` -> ``("apps", "deployments")``; the legacy
    names of core kinds too (``secrets`` -> ``("", "secrets")``)."""
    if name.startswith("count/"):
        plural, _, group = name[len("count/"):].partition(".")
        return (group, plural) if plural else None
    for plural, legacy in LEGACY_COUNT_NAMES.items():
        if name == legacy:
            return ("", plural)
    return None


def scope_selectors(quota: Obj) -> list[Obj]:
    """``spec.scopes`` (as Exists requirements) and ``spec.scopeSelector``'s expressions."""
    spec = quota.get("spec") or {}
    out: list[Obj] = [{"scopeName": s, "operator": "Exists"} for s in spec.get("scopes") or []]
    sel = spec.get("scopeSelector")
    if isinstance(sel, dict):
        out += [r for r in sel.get("matchExpressions") or [] if isinstance(r, dict)]
    return out


def matches(ev: Evaluator, quota: Obj, obj: Obj) -> bool:
    """Whether ``quota`` constrains ``obj`` at all: it limits a resource the
    object uses, and the object is in every one of its scopes."""
    hard = (quota.get("status") or {}).get("hard") or (quota.get("spec") or {}).get("hard") or {}
    if not ev.matching_resources(hard):
        return False
    return all(ev.matches_scope(req, obj) for req in scope_selectors(quota))


def usage_stats(ev: Evaluator, quota: Obj, objects: Iterable[Obj], names: Iterable[str],
                now: _dt.datetime) -> ResourceList:
    """The usage of ``names`` by the ``objects`` in the quota's scopes (zero
    for each name when nothing uses it), as upstream's CalculateUsageStats."""
    names = list(names)
    out: ResourceList = {n: ZERO for n in names}
    selectors = scope_selectors(quota)
    for obj in objects:
        if all(ev.matches_scope(req, obj) for req in selectors):
            out = add(out, mask(ev.usage(obj, now), names))
    return out


__all__ = [
    "Evaluator", "ONE", "Quantity", "ResourceList", "SCOPES", "STANDARD_QUOTA_RESOURCES", "ZERO",
    "add", "equal_values", "evaluator_for", "fmt", "is_best_effort", "is_terminating", "less_or_equal",
    "mask", "matches", "parse_list", "pod_aggregate", "pod_usage", "pretty", "remove_zeros",
    "resource_of_count", "scope_selectors", "subtract_non_negative", "to_raw", "usage_stats",
]
