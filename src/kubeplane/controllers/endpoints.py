"""The Endpoints controller, after upstream's ``pkg/controller/endpoint``.

For every Service with a selector (ExternalName Services excepted) it keeps
the core/v1 Endpoints of the same name: the selected pods that have an IP and
are not finished, ready ones under ``addresses`` and the others under
``notReadyAddresses`` (all under ``addresses`` with
``publishNotReadyAddresses``), one entry per Service port with named target
ports resolved per pod, repacked into subsets of pods sharing ports. Labels
are the Service's plus ``endpoints.kubernetes.io/managed-by`` (and the
headless label); more than 1000 addresses are truncated and annotated
``endpoints.kubernetes.io/over-capacity: truncated``. A Service that is gone
takes its Endpoints with it, and Endpoints left without a Service when the
controller starts are removed.
"""

from __future__ import annotations

import ipaddress
import logging
import math
from typing import Any

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import resource
from kubeplane.client.informer import SharedInformerFactory, unwrap_deleted
from kubeplane.client.interface import Client
from kubeplane.controllers.base import Controller
from kubeplane.controllers.endpointsutil import (
    HEADLESS_LABEL,
    LEADER_ANNOTATION,
    NAMESPACE_INDEX,
    TRIGGER_TIME_ANNOTATION,
    PortNotFound,
    TriggerTimeTracker,
    add_namespace_index,
    find_port,
    format_trigger_time,
    ip_family,
    is_headless,
    is_pod_ready,
    key_of,
    md,
    pod_endpoints_changed,
    pod_ip_for,
    selector_matches,
    services_for_pod,
    should_pod_be_in_endpoints,
    should_set_hostname,
    spec_of,
)

log = logging.getLogger(__name__)

PODS = resource("pods")
SERVICES = resource("services")
ENDPOINTS = resource("endpoints")

CONTROLLER_NAME = "endpoint-controller"
MANAGED_BY_LABEL = "endpoints.kubernetes.io/managed-by"
OVER_CAPACITY_ANNOTATION = "endpoints.kubernetes.io/over-capacity"
#: most addresses one Endpoints object lists
MAX_CAPACITY = 1000

Obj = dict[str, Any]


# ------------------------------------------------------------------ subsets


def _address_key(addr: Obj) -> tuple[str, str]:
    return (addr.get("ip", ""), (addr.get("targetRef") or {}).get("uid", ""))


def _port_key(port: Obj) -> tuple[Any, ...]:
    return (port.get("name", ""), port.get("port", 0), port.get("protocol", ""), port.get("appProtocol"))


def _ip_sort_key(ip: str) -> tuple[int, int, str]:
    try:
        a = ipaddress.ip_address(ip)
        return (a.version, int(a), ip)
    except ValueError:
        return (99, 0, ip)


def repack_subsets(subsets: list[Obj]) -> list[Obj]:
    """Upstream's RepackSubsets: one subset per set of addresses sharing the
    same ports (a ready address wins over the same one not ready), addresses
    and ports sorted, subsets sorted."""
    addresses: dict[tuple[str, str], Obj] = {}
    by_port: dict[tuple[Any, ...], tuple[Obj | None, dict[tuple[str, str], bool]]] = {}
    for ss in subsets:
        ports = ss.get("ports") or [None]
        for port in ports:
            pk = _port_key(port) if port is not None else ("", -1, "", None)
            _, seen = by_port.setdefault(pk, (port, {}))
            for addr in ss.get("addresses") or []:
                k = _address_key(addr)
                addresses.setdefault(k, addr)
                seen[k] = True
            for addr in ss.get("notReadyAddresses") or []:
                k = _address_key(addr)
                addresses.setdefault(k, addr)
                seen.setdefault(k, False)
    groups: dict[tuple[tuple[tuple[str, str], bool], ...], list[Obj]] = {}
    for port, seen in by_port.values():
        key = tuple(sorted(seen.items()))
        ports = groups.setdefault(key, [])
        if port is not None:
            ports.append(port)
    out: list[Obj] = []
    for key, ports in groups.items():
        ready = [addresses[k] for k, r in key if r]
        not_ready = [addresses[k] for k, r in key if not r]
        subset: Obj = {}
        if ready:
            subset["addresses"] = sorted(ready, key=lambda a: (_ip_sort_key(a.get("ip", "")), _address_key(a)[1]))
        if not_ready:
            subset["notReadyAddresses"] = sorted(
                not_ready, key=lambda a: (_ip_sort_key(a.get("ip", "")), _address_key(a)[1]))
        if ports:
            subset["ports"] = sorted(ports, key=lambda p: (str(p.get("name", "")), p.get("port", 0),
                                                           str(p.get("protocol", ""))))
        out.append(subset)

    def order(ss: Obj) -> tuple:
        addrs = ss.get("addresses") or ss.get("notReadyAddresses") or [{}]
        return (_ip_sort_key(addrs[0].get("ip", "")), repr([_port_key(p) for p in ss.get("ports") or []]))

    return sorted(out, key=order)


def truncate(subsets: list[Obj]) -> bool:
    """Keep at most MAX_CAPACITY addresses, ready ones first, each subset its
    share; True when something was dropped (upstream's truncateEndpoints)."""
    total_ready = sum(len(s.get("addresses") or []) for s in subsets)
    total_not_ready = sum(len(s.get("notReadyAddresses") or []) for s in subsets)
    if total_ready + total_not_ready <= MAX_CAPACITY:
        return False
    truncate_ready = total_ready > MAX_CAPACITY
    limit = MAX_CAPACITY if truncate_ready else MAX_CAPACITY - total_ready
    total = total_ready if truncate_ready else total_not_ready
    room = limit
    for ss in subsets:
        field = "addresses" if truncate_ready else "notReadyAddresses"
        items = ss.get(field) or []
        share = min(math.ceil(len(items) / total * limit), room) if total else 0
        kept = items[:share]
        if kept:
            ss[field] = kept
        else:
            ss.pop(field, None)
        if truncate_ready:
            ss.pop("notReadyAddresses", None)
        room -= len(kept)
    return True


def _without_resource_versions(subsets: list[Obj]) -> list[Obj]:
    out = []
    for ss in subsets:
        ss = dict(ss)
        for field in ("addresses", "notReadyAddresses"):
            if field in ss:
                ss[field] = [{**a, "targetRef": {k: v for k, v in (a.get("targetRef") or {}).items()
                                                 if k != "resourceVersion"}} if a.get("targetRef") else a
                             for a in ss[field]]
        out.append(ss)
    return out


def _labels_correct(ep_labels: dict[str, str], svc_labels: dict[str, str]) -> bool:
    if ep_labels.get(MANAGED_BY_LABEL) != CONTROLLER_NAME:
        return False
    rest = {k: v for k, v in ep_labels.items() if k not in (HEADLESS_LABEL, MANAGED_BY_LABEL)}
    return rest == svc_labels


# --------------------------------------------------------------- controller


class EndpointsController(Controller):
    """Keeps one Endpoints object per selecting Service."""

    def __init__(self, client: Client, factory: SharedInformerFactory | None = None, *, workers: int = 1,
                 name: str = "endpoints-controller") -> None:
        super().__init__(name, client, factory, workers=workers)
        self.triggers = TriggerTimeTracker()
        self.service_informer = self.factory.informer_for(SERVICES)
        self.pod_informer = self.factory.informer_for(PODS)
        self.endpoints_informer = self.factory.informer_for(ENDPOINTS)
        for inf in (self.service_informer, self.pod_informer, self.endpoints_informer):
            add_namespace_index(inf)
        self.services = self.add_queue("services", self.sync)
        self.service_informer.add_event_handler(self._service_changed, lambda _o, n: self._service_changed(n),
                                                self._service_changed)
        self.pod_informer.add_event_handler(self._pod_added, self._pod_updated, self._pod_deleted)
        self.endpoints_informer.add_event_handler(None, None, self._endpoints_deleted)
        self._leftovers_checked = False

    async def start(self, sync_timeout: float | None = 30.0) -> None:
        await super().start(sync_timeout)
        if not self._leftovers_checked:
            # Endpoints whose Service went while the controller was down
            self._leftovers_checked = True
            for ep in self.endpoints_informer.indexer.list():
                if LEADER_ANNOTATION not in (md(ep).get("annotations") or {}):
                    self.services.add(key_of(ep))

    # -- handlers ----------------------------------------------------------

    def _service_changed(self, svc: Obj) -> None:
        self.services.add(key_of(unwrap_deleted(svc)))

    def _endpoints_deleted(self, ep: Obj) -> None:
        self.services.add(key_of(unwrap_deleted(ep)))

    def _pod_added(self, pod: Obj) -> None:
        for key in services_for_pod(self.service_informer, pod):
            self.services.add(key)

    def _pod_updated(self, old: Obj, new: Obj) -> None:
        if not pod_endpoints_changed(old, new):
            return
        for key in services_for_pod(self.service_informer, new, old):
            self.services.add(key)

    def _pod_deleted(self, pod: Obj) -> None:
        self._pod_added(unwrap_deleted(pod))

    # -- sync --------------------------------------------------------------

    async def sync(self, key: str) -> None:
        namespace, _, name = key.partition("/")
        svc = self.service_informer.indexer.get_by_key(key)
        if svc is None:
            try:
                await self.client.delete(ENDPOINTS, name, namespace)
            except StatusError as err:
                if err.code != 404:
                    raise
            self.triggers.delete(key)
            return
        spec = spec_of(svc)
        if spec.get("type") == "ExternalName" or spec.get("selector") is None:
            return  # no endpoints from this controller: those are written by whoever owns the Service
        selector = spec["selector"]
        pods = [p for p in self.pod_informer.indexer.by_index(NAMESPACE_INDEX, namespace)
                if selector_matches(selector, md(p).get("labels"))]
        trigger = self.triggers.compute(svc, pods)
        subsets = self._subsets(svc, pods)
        current = self.endpoints_informer.indexer.get_by_key(key)
        svc_labels = dict(md(svc).get("labels") or {})
        if current is not None:
            cur_md = md(current)
            over = sum(len(s.get("addresses") or []) + len(s.get("notReadyAddresses") or [])
                       for s in subsets) > MAX_CAPACITY
            capacity_ok = not over and OVER_CAPACITY_ANNOTATION not in (cur_md.get("annotations") or {})
            if (_without_resource_versions(current.get("subsets") or []) == subsets
                    and _labels_correct(dict(cur_md.get("labels") or {}), svc_labels) and capacity_ok):
                return
        labels = dict(svc_labels)
        if is_headless(svc):
            labels[HEADLESS_LABEL] = ""
        else:
            labels.pop(HEADLESS_LABEL, None)
        labels[MANAGED_BY_LABEL] = CONTROLLER_NAME
        annotations = dict(md(current).get("annotations") or {}) if current is not None else {}
        if trigger is not None:
            annotations[TRIGGER_TIME_ANNOTATION] = format_trigger_time(trigger)
        else:
            annotations.pop(TRIGGER_TIME_ANNOTATION, None)
        if truncate(subsets):
            annotations[OVER_CAPACITY_ANNOTATION] = "truncated"
        else:
            annotations.pop(OVER_CAPACITY_ANNOTATION, None)
        if current is None:
            body: Obj = {"apiVersion": "v1", "kind": "Endpoints",
                         "metadata": {"name": name, "namespace": namespace, "labels": labels}}
            if annotations:
                body["metadata"]["annotations"] = annotations
            if subsets:
                body["subsets"] = subsets
            try:
                await self.client.create(ENDPOINTS, body, namespace)
            except StatusError as err:
                if err.code == 403 and "is being terminated" in err.message:
                    return  # the namespace is going; so are its Services
                if err.code != 409:
                    self.recorder.event(body, "Warning", "FailedToCreateEndpoint",
                                        f"Failed to create endpoint for service {namespace}/{name}: {err.message}")
                raise
            return
        body = dict(current)
        body["metadata"] = {**md(current), "labels": labels, "annotations": annotations}
        if not annotations:
            body["metadata"].pop("annotations")
        if subsets:
            body["subsets"] = subsets
        else:
            body.pop("subsets", None)
        try:
            await self.client.update(ENDPOINTS, body)
        except StatusError as err:
            if err.code not in (404, 409):
                self.recorder.event(body, "Warning", "FailedToUpdateEndpoint",
                                    f"Failed to update endpoint {namespace}/{name}: {err.message}")
            raise

    def _subsets(self, svc: Obj, pods: list[Obj]) -> list[Obj]:
        spec = spec_of(svc)
        tolerate_unready = bool(spec.get("publishNotReadyAddresses"))
        family = ip_family(svc)
        ports = [p for p in spec.get("ports") or [] if isinstance(p, dict)]
        subsets: list[Obj] = []
        for pod in pods:
            if not should_pod_be_in_endpoints(pod, tolerate_unready):
                continue
            ip = pod_ip_for(pod, family)
            if ip is None:
                continue
            pmd = md(pod)
            addr: Obj = {"ip": ip}
            if should_set_hostname(pod, svc):
                addr["hostname"] = spec_of(pod)["hostname"]
            if spec_of(pod).get("nodeName"):
                addr["nodeName"] = spec_of(pod)["nodeName"]
            addr["targetRef"] = {"kind": "Pod", "namespace": pmd.get("namespace", ""), "name": pmd.get("name", ""),
                                 "uid": pmd.get("uid", "")}
            field = "addresses" if tolerate_unready or is_pod_ready(pod) else "notReadyAddresses"
            if not ports:
                if is_headless(svc):
                    subsets.append({field: [addr]})
                continue
            for sp in ports:
                try:
                    number = find_port(pod, sp)
                except PortNotFound:
                    continue
                port: Obj = {"port": number, "protocol": sp.get("protocol") or "TCP"}
                if sp.get("name"):
                    port["name"] = sp["name"]
                if sp.get("appProtocol") is not None:
                    port["appProtocol"] = sp["appProtocol"]
                subsets.append({field: [addr], "ports": [port]})
        return repack_subsets(subsets)
