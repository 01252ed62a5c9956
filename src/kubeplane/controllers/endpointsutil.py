"""What the Endpoints and EndpointSlice controllers share, after upstream's
``k8s.io/endpointslice/util``: which pods a Service's endpoints list, the
port a pod offers for a Service port (named target ports resolved per pod),
the services a pod change concerns, and the trigger-time tracker behind the
``endpoints.kubernetes.io/last-change-trigger-time`` annotation.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
from typing import Any, Iterable

from kubeplane.api.meta import parse_time
from kubeplane.client.informer import SharedInformer

Obj = dict[str, Any]

TRIGGER_TIME_ANNOTATION = "endpoints.kubernetes.io/last-change-trigger-time"
HEADLESS_LABEL = "service.kubernetes.io/headless"
#: Endpoints kept by the endpoints controller for leader election (never deleted)
LEADER_ANNOTATION = "control-plane.alpha.kubernetes.io/leader"
NAMESPACE_INDEX = "namespace"


def md(obj: Obj) -> Obj:
    m = obj.get("metadata")
    return m if isinstance(m, dict) else {}


def spec_of(obj: Obj) -> Obj:
    s = obj.get("spec")
    return s if isinstance(s, dict) else {}


def status_of(obj: Obj) -> Obj:
    s = obj.get("status")
    return s if isinstance(s, dict) else {}


def key_of(obj: Obj) -> str:
    return f"{md(obj).get('namespace', '')}/{md(obj).get('name', '')}"


def namespace_index(obj: Obj) -> list[str]:
    return [md(obj).get("namespace", "")]


def add_namespace_index(informer: SharedInformer) -> None:
    try:
        informer.add_indexers({NAMESPACE_INDEX: namespace_index})
    except ValueError:
        pass  # another controller added it already


def is_pod_ready(pod: Obj) -> bool:
    for c in status_of(pod).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def should_pod_be_in_endpoints(pod: Obj, include_terminating: bool) -> bool:
    """Not finished, has an IP, and (unless ``include_terminating``) not being deleted."""
    status = status_of(pod)
    if status.get("phase") in ("Succeeded", "Failed"):
        return False
    if not status.get("podIP") and not status.get("podIPs"):
        return False
    if not include_terminating and md(pod).get("deletionTimestamp"):
        return False
    return True


def should_set_hostname(pod: Obj, svc: Obj) -> bool:
    """A pod with a hostname whose subdomain names the Service (same namespace)."""
    spec = spec_of(pod)
    return bool(spec.get("hostname")) and spec.get("subdomain") == md(svc).get("name") \
        and md(svc).get("namespace") == md(pod).get("namespace")


def is_headless(svc: Obj) -> bool:
    return spec_of(svc).get("clusterIP") == "None"


def ip_family(svc: Obj) -> str:
    """The Service's primary family: ``IPv4`` or ``IPv6``."""
    families = spec_of(svc).get("ipFamilies")
    if isinstance(families, list) and families and families[0] in ("IPv4", "IPv6"):
        return families[0]
    ip = spec_of(svc).get("clusterIP")
    try:
        if ip and ip != "None" and ipaddress.ip_address(ip).version == 6:
            return "IPv6"
    except ValueError:
        pass
    return "IPv4"


def pod_ip_for(pod: Obj, family: str) -> str | None:
    """The pod's address of ``family``, normalised; None when it has none."""
    status = status_of(pod)
    ips = [p.get("ip") for p in status.get("podIPs") or [] if isinstance(p, dict)]
    if not ips and status.get("podIP"):
        ips = [status["podIP"]]
    want = 6 if family == "IPv6" else 4
    for ip in ips:
        try:
            addr = ipaddress.ip_address(ip)
        except (ValueError, TypeError):
            continue
        if addr.version == want:
            return str(addr)
    return None


class PortNotFound(LookupError):
    pass


def find_port(pod: Obj, service_port: Obj) -> int:
    """The container port ``service_port.targetPort`` names (by name and
    protocol, in the containers and restartable init containers), or its number."""
    target = service_port.get("targetPort")
    if target in (None, "", 0):
        target = service_port.get("port")
    if isinstance(target, str):
        proto = service_port.get("protocol") or "TCP"
        spec = spec_of(pod)
        containers = list(spec.get("containers") or [])
        containers += [c for c in spec.get("initContainers") or []
                       if isinstance(c, dict) and c.get("restartPolicy") == "Always"]
        for c in containers:
            for p in (c.get("ports") or []) if isinstance(c, dict) else []:
                if isinstance(p, dict) and p.get("name") == target and (p.get("protocol") or "TCP") == proto:
                    return int(p.get("containerPort") or 0)
        raise PortNotFound(f"no suitable port for manifest: {md(pod).get('uid', '')}")
    if isinstance(target, int) and not isinstance(target, bool):
        return target
    raise PortNotFound(f"no suitable port for manifest: {md(pod).get('uid', '')}")


def selector_matches(selector: Any, labels: Any) -> bool:
    """A Service selector (a plain map) matching a pod's labels; an empty map matches every pod."""
    if not isinstance(selector, dict):
        return False
    labels = labels if isinstance(labels, dict) else {}
    return all(labels.get(k) == v for k, v in selector.items())


def services_for_pod(service_informer: SharedInformer, pod: Obj, old: Obj | None = None) -> set[str]:
    """Keys of the Services in the pod's namespace whose selector matches the
    pod's labels now or before ``old``'s labels changed."""
    ns = md(pod).get("namespace", "")
    label_sets = [md(pod).get("labels")]
    if old is not None and md(old).get("labels") != md(pod).get("labels"):
        label_sets.append(md(old).get("labels"))
    out: set[str] = set()
    for svc in service_informer.indexer.by_index(NAMESPACE_INDEX, ns):
        selector = spec_of(svc).get("selector")
        if selector is None:
            continue
        if any(selector_matches(selector, labels) for labels in label_sets):
            out.add(key_of(svc))
    return out


def pod_endpoints_changed(old: Obj, new: Obj) -> bool:
    """Whether an update can change any endpoint built from the pod (upstream's
    podEndpointsChanged plus the label test): its address, readiness,
    deletion, node, hostname or ports."""
    if md(old).get("labels") != md(new).get("labels"):
        return True
    if bool(md(old).get("deletionTimestamp")) != bool(md(new).get("deletionTimestamp")):
        return True
    if is_pod_ready(old) != is_pod_ready(new):
        return True
    so, sn = status_of(old), status_of(new)
    if so.get("podIP") != sn.get("podIP") or so.get("podIPs") != sn.get("podIPs") or so.get("phase") != sn.get("phase"):
        return True
    po, pn = spec_of(old), spec_of(new)
    for k in ("nodeName", "hostname", "subdomain", "containers", "initContainers"):
        if po.get(k) != pn.get(k):
            return True
    return False


def format_trigger_time(t: _dt.datetime) -> str:
    """RFC 3339 with nanoseconds, trailing zeros dropped (Go's RFC3339Nano), in UTC."""
    t = t.astimezone(_dt.timezone.utc)
    text = t.strftime("%Y-%m-%dT%H:%M:%S")
    if t.microsecond:
        text += ("." + f"{t.microsecond:06d}").rstrip("0")
    return text + "Z"


def _time(value: Any) -> _dt.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse_time(value)
    except ValueError:
        return None


def pod_trigger_time(pod: Obj) -> _dt.datetime | None:
    """When the pod last changed in a way endpoints show: its Ready condition's
    last transition, else its creation."""
    for c in status_of(pod).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == "Ready":
            t = _time(c.get("lastTransitionTime"))
            if t is not None:
                return t
    return _time(md(pod).get("creationTimestamp"))


class TriggerTimeTracker:
    """Upstream's TriggerTimeTracker: for each Service, the trigger times of
    its pods (and the Service's own creation) seen at the last sync; a sync's
    trigger time is the earliest one that changed since, or None."""

    def __init__(self) -> None:
        self._state: dict[str, tuple[_dt.datetime | None, dict[str, _dt.datetime | None]]] = {}

    def compute(self, svc: Obj, pods: Iterable[Obj]) -> _dt.datetime | None:
        key = key_of(svc)
        last_svc, last_pods = self._state.get(key, (None, {}))
        found = key in self._state
        svc_time = _time(md(svc).get("creationTimestamp"))
        candidates: list[_dt.datetime] = []
        if (not found or svc_time != last_svc) and svc_time is not None:
            candidates.append(svc_time)
        pods_now: dict[str, _dt.datetime | None] = {}
        for pod in pods:
            name = md(pod).get("name", "")
            t = pod_trigger_time(pod)
            pods_now[name] = t
            if t is not None and (name not in last_pods or last_pods[name] != t):
                candidates.append(t)
        self._state[key] = (svc_time, pods_now)
        return min(candidates) if candidates else None

    def delete(self, key: str) -> None:
        self._state.pop(key, None)
