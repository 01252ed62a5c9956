"""Per-resource behaviour: defaults, create/update preparation, status handling.

Upstream keeps one ``strategy`` per resource type (pkg/registry/*/strategy.go);
here a strategy is a small object looked up by ``(group, plural)``. Anything a
strategy does not override behaves like upstream's generic registry: status is
owned by the ``status`` subresource when the resource has one, and
``metadata.generation`` moves when anything outside metadata and status changes.
"""

from __future__ import annotations

import ipaddress
import itertools
from fractions import Fraction
from typing import Any, Callable

from kubeplane.api.quantity import parse_quantity
from kubeplane.api.resources import ResourceInfo

Obj = dict[str, Any]

NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"


class Strategy:
    """Generic behaviour; subclasses override the hooks they need."""

    #: resources whose spec changes bump metadata.generation
    tracks_generation = True

    def __init__(self, res: ResourceInfo) -> None:
        self.res = res

    @property
    def has_status(self) -> bool:
        return "status" in self.res.subresources

    def default(self, obj: Obj) -> None:
        """Fill defaults in place (upstream: defaulting functions + admission)."""

    def prepare_for_create(self, obj: Obj) -> None:
        """Reset what a client may not set on create (e.g. status)."""
        if self.has_status:
            obj.pop("status", None)
            initial = self.initial_status(obj)
            if initial is not None:
                obj["status"] = initial

    def initial_status(self, obj: Obj) -> Obj | None:
        return None

    # The parts taken from the stored object are shared, not copied: stored
    # objects are never modified in place, and nothing modifies these parts of
    # the new version between here and the store.

    def prepare_for_update(self, new: Obj, old: Obj) -> None:
        """Main endpoint: status is owned by the status subresource."""
        if self.has_status:
            if "status" in old:
                new["status"] = old["status"]
            else:
                new.pop("status", None)

    def prepare_for_status_update(self, new: Obj, old: Obj) -> None:
        """Status endpoint: everything but status (and metadata) comes from old."""
        for k in list(new):
            if k not in ("status", "metadata", "apiVersion", "kind"):
                del new[k]
        for k, v in old.items():
            if k not in ("status", "metadata", "apiVersion", "kind"):
                new[k] = v

    def spec_changed(self, new: Obj, old: Obj) -> bool:
        for k in set(new) | set(old):
            if k in ("metadata", "status", "apiVersion", "kind"):
                continue
            if new.get(k) != old.get(k):
                return True
        return False


def _default_container(c: Obj) -> None:
    image = c.get("image") or ""
    if "imagePullPolicy" not in c and image:
        last = image.rsplit("/", 1)[-1]
        tag = ""
        if "@" not in last and ":" in last:
            tag = last.rsplit(":", 1)[1]
        c["imagePullPolicy"] = "Always" if (tag in ("", "latest") and "@" not in last) else "IfNotPresent"
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    c.setdefault("resources", {})
    for p in c.get("ports") or []:
        if isinstance(p, dict):
            p.setdefault("protocol", "TCP")
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        pr = c.get(probe)
        if isinstance(pr, dict):
            pr.setdefault("timeoutSeconds", 1)
            pr.setdefault("periodSeconds", 10)
            pr.setdefault("successThreshold", 1)
            pr.setdefault("failureThreshold", 3)
    # Upstream defaults limits into requests when only limits are given.
    res = c.get("resources")
    if isinstance(res, dict) and isinstance(res.get("limits"), dict):
        req = res.setdefault("requests", {})
        if isinstance(req, dict):
            for k, v in res["limits"].items():
                req.setdefault(k, v)


def default_pod_spec(spec: Obj) -> None:
    if not isinstance(spec, dict):
        return
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    for field in ("containers", "initContainers", "ephemeralContainers"):
        for c in spec.get(field) or []:
            if isinstance(c, dict):
                _default_container(c)
    for v in spec.get("volumes") or []:
        if isinstance(v, dict) and len(v) == 1 and "name" in v:
            v["emptyDir"] = {}


def _positive_quantities(resources: Any) -> dict[str, Fraction]:
    """The cpu and memory quantities above zero in a requests or limits map
    (values that do not parse are left out: validation rejects them)."""
    out: dict[str, Fraction] = {}
    if isinstance(resources, dict):
        for name in ("cpu", "memory"):
            if name in resources:
                try:
                    value = parse_quantity(resources[name])
                except (TypeError, ValueError):
                    continue
                if value.numerator > 0:
                    out[name] = value
    return out


def _sums(per_container: list[dict[str, Fraction]]) -> dict[str, Fraction]:
    if len(per_container) == 1:
        return per_container[0]  # one container: no Fraction arithmetic
    out: dict[str, Fraction] = {}
    for found in per_container:
        for name, value in found.items():
            out[name] = out[name] + value if name in out else value
    return out


def pod_qos_class(spec: Obj) -> str:
    """Guaranteed / Burstable / BestEffort as upstream computes it: from the cpu
    and memory requests and limits above zero, summed over the containers and
    init containers. Guaranteed needs every container to limit both, and the
    summed requests to equal the summed limits."""
    all_requests: list[dict[str, Fraction]] = []
    all_limits: list[dict[str, Fraction]] = []
    for c in list(spec.get("containers") or []) + list(spec.get("initContainers") or []):
        res = c.get("resources") if isinstance(c, dict) else None
        res = res if isinstance(res, dict) else {}
        all_requests.append(_positive_quantities(res.get("requests")))
        all_limits.append(_positive_quantities(res.get("limits")))
    requests, limits = _sums(all_requests), _sums(all_limits)
    if not requests and not limits:
        return "BestEffort"
    guaranteed = all(len(found) == 2 for found in all_limits)
    if guaranteed and len(requests) == len(limits) and all(limits.get(n) == v for n, v in requests.items()):
        return "Guaranteed"
    return "Burstable"


class PodStrategy(Strategy):
    def default(self, obj: Obj) -> None:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return
        default_pod_spec(spec)
        spec.setdefault("enableServiceLinks", True)
        spec.setdefault("priority", 0)
        # DefaultTolerationSeconds admission: tolerate a not-ready or
        # unreachable node for five minutes before eviction.
        tols = spec.get("tolerations")
        if tols is None or isinstance(tols, list):
            tols = list(tols or [])
            present = {t.get("key") for t in tols if isinstance(t, dict) and t.get("effect") in ("NoExecute", None, "")}
            for key in (NOT_READY_TAINT, UNREACHABLE_TAINT):
                if key not in present:
                    tols.append({"key": key, "operator": "Exists", "effect": "NoExecute",
                                 "tolerationSeconds": 300})
            spec["tolerations"] = tols

    def initial_status(self, obj: Obj) -> Obj:
        spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
        return {"phase": "Pending", "qosClass": pod_qos_class(spec)}

    def prepare_for_status_update(self, new: Obj, old: Obj) -> None:
        super().prepare_for_status_update(new, old)


class NamespaceStrategy(Strategy):
    tracks_generation = False

    def default(self, obj: Obj) -> None:
        md = obj.setdefault("metadata", {})
        name = md.get("name")
        if name:
            labels = md.get("labels")
            if labels is None:
                labels = md["labels"] = {}
            if isinstance(labels, dict):
                labels["kubernetes.io/metadata.name"] = name
        spec = obj.setdefault("spec", {})
        if isinstance(spec, dict):
            spec.setdefault("finalizers", ["kubernetes"])

    def initial_status(self, obj: Obj) -> Obj:
        return {"phase": "Active"}


class NodeStrategy(Strategy):
    tracks_generation = False

    def prepare_for_create(self, obj: Obj) -> None:
        """Kubelets register a Node with its status in one request: keep it."""


class DeploymentStrategy(Strategy):
    def default(self, obj: Obj) -> None:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return
        spec.setdefault("replicas", 1)
        strategy = spec.setdefault("strategy", {"type": "RollingUpdate"})
        if isinstance(strategy, dict):
            strategy.setdefault("type", "RollingUpdate")
            if strategy["type"] == "RollingUpdate":
                ru = strategy.setdefault("rollingUpdate", {})
                if isinstance(ru, dict):
                    ru.setdefault("maxUnavailable", "25%")
                    ru.setdefault("maxSurge", "25%")
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
        _default_template(spec)


def _default_template(spec: Obj) -> None:
    tmpl = spec.get("template")
    if isinstance(tmpl, dict):
        tmpl.setdefault("metadata", {})
        default_pod_spec(tmpl.get("spec"))


class ReplicaSetStrategy(Strategy):
    def default(self, obj: Obj) -> None:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return
        spec.setdefault("replicas", 1)
        _default_template(spec)

    def initial_status(self, obj: Obj) -> Obj:
        return {"replicas": 0}


class JobStrategy(Strategy):
    def default(self, obj: Obj) -> None:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return
        spec.setdefault("parallelism", 1)
        spec.setdefault("completions", 1)
        spec.setdefault("backoffLimit", 6)
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("suspend", False)
        spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
        _default_template(spec)


class ServiceStrategy(Strategy):
    tracks_generation = False
    _counter = itertools.count(1)
    _network = ipaddress.ip_network("10.96.0.0/12")

    def default(self, obj: Obj) -> None:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        spec.setdefault("internalTrafficPolicy", "Cluster")
        for p in spec.get("ports") or []:
            if isinstance(p, dict):
                p.setdefault("protocol", "TCP")
                if "port" in p:
                    p.setdefault("targetPort", p["port"])
        if spec["type"] != "ExternalName":
            spec.setdefault("ipFamilies", ["IPv4"])
            spec.setdefault("ipFamilyPolicy", "SingleStack")

    def prepare_for_create(self, obj: Obj) -> None:
        super().prepare_for_create(obj)
        spec = obj.get("spec")
        if isinstance(spec, dict) and spec.get("type") != "ExternalName" and not spec.get("clusterIP"):
            # A simple allocator: sequential addresses in the service CIDR.
            ip = str(self._network.network_address + 10 + next(self._counter))
            spec["clusterIP"] = ip
            spec["clusterIPs"] = [ip]
        obj["status"] = {"loadBalancer": {}}


class PVCStrategy(Strategy):
    tracks_generation = False

    def default(self, obj: Obj) -> None:
        spec = obj.get("spec")
        if isinstance(spec, dict):
            spec.setdefault("volumeMode", "Filesystem")

    def initial_status(self, obj: Obj) -> Obj:
        return {"phase": "Pending"}


class PVStrategy(Strategy):
    tracks_generation = False

    def default(self, obj: Obj) -> None:
        spec = obj.get("spec")
        if isinstance(spec, dict):
            spec.setdefault("persistentVolumeReclaimPolicy", "Retain")
            spec.setdefault("volumeMode", "Filesystem")

    def initial_status(self, obj: Obj) -> Obj:
        return {"phase": "Pending"}


class StorageClassStrategy(Strategy):
    tracks_generation = False

    def default(self, obj: Obj) -> None:
        obj.setdefault("reclaimPolicy", "Delete")
        obj.setdefault("volumeBindingMode", "Immediate")


class SecretStrategy(Strategy):
    tracks_generation = False

    def default(self, obj: Obj) -> None:
        obj.setdefault("type", "Opaque")
        # stringData is write-only: merged into data, base64-encoded.
        sd = obj.pop("stringData", None)
        if isinstance(sd, dict):
            import base64

            data = obj.setdefault("data", {})
            if isinstance(data, dict):
                for k, v in sd.items():
                    data[k] = base64.b64encode(str(v).encode()).decode()


class PriorityClassStrategy(Strategy):
    tracks_generation = False

    def default(self, obj: Obj) -> None:
        obj.setdefault("preemptionPolicy", "PreemptLowerPriority")


class ResourceClaimStrategy(Strategy):
    def default(self, obj: Obj) -> None:
        spec = obj.get("spec")
        if isinstance(spec, dict):
            default_claim_spec(spec)


def default_claim_spec(spec: Obj) -> None:
    devices = spec.get("devices")
    if not isinstance(devices, dict):
        return
    for req in devices.get("requests") or []:
        if not isinstance(req, dict):
            continue
        exactly = req.get("exactly")
        if isinstance(exactly, dict):
            _default_device_request(exactly)
        for sub in req.get("firstAvailable") or []:
            if isinstance(sub, dict):
                _default_device_request(sub)


def _default_device_request(r: Obj) -> None:
    r.setdefault("allocationMode", "ExactCount")
    if r["allocationMode"] == "ExactCount":
        r.setdefault("count", 1)


class ResourceClaimTemplateStrategy(Strategy):
    def default(self, obj: Obj) -> None:
        spec = obj.get("spec")
        if isinstance(spec, dict) and isinstance(spec.get("spec"), dict):
            default_claim_spec(spec["spec"])


class NoGenerationStrategy(Strategy):
    tracks_generation = False


_STRATEGIES: dict[tuple[str, str], Callable[[ResourceInfo], Strategy]] = {
    ("", "pods"): PodStrategy,
    ("", "namespaces"): NamespaceStrategy,
    ("", "nodes"): NodeStrategy,
    ("", "services"): ServiceStrategy,
    ("", "persistentvolumeclaims"): PVCStrategy,
    ("", "persistentvolumes"): PVStrategy,
    ("", "secrets"): SecretStrategy,
    ("", "configmaps"): NoGenerationStrategy,
    ("", "events"): NoGenerationStrategy,
    ("coordination.k8s.io", "leases"): NoGenerationStrategy,
    ("storage.k8s.io", "storageclasses"): StorageClassStrategy,
    ("storage.k8s.io", "csinodes"): NoGenerationStrategy,
    ("storage.k8s.io", "csistoragecapacities"): NoGenerationStrategy,
    ("apps", "deployments"): DeploymentStrategy,
    ("apps", "replicasets"): ReplicaSetStrategy,
    ("batch", "jobs"): JobStrategy,
    ("scheduling.k8s.io", "priorityclasses"): PriorityClassStrategy,
    ("resource.k8s.io", "resourceclaims"): ResourceClaimStrategy,
    ("resource.k8s.io", "resourceclaimtemplates"): ResourceClaimTemplateStrategy,
}


def strategy_for(res: ResourceInfo) -> Strategy:
    factory = _STRATEGIES.get(res.key, Strategy)
    return factory(res)
