"""The EndpointSlice controller, after upstream's ``pkg/controller/endpointslice``
and its reconciler (``k8s.io/endpointslice``).

For every Service with a selector (ExternalName Services excepted) it keeps
the discovery.k8s.io/v1 EndpointSlices labelled
``kubernetes.io/service-name=<service>`` and
``endpointslice.kubernetes.io/managed-by=endpointslice-controller.k8s.io``,
owned by the Service: one endpoint per selected pod that has an IP and is not
finished, with conditions ``ready`` (serving and not terminating, or the
Service publishes not-ready addresses), ``serving`` (the pod is Ready) and
``terminating`` (the pod is being deleted), its node, zone and target pod.
Endpoints whose pods resolve the Service's (named) target ports to the same
numbers share slices of at most ``max_endpoints_per_slice`` (100) endpoints;
a Service without endpoints keeps one empty placeholder slice.

A reconcile changes as few slices as it can, as upstream's: endpoints that
are gone or changed are updated in place, new ones fill slices already being
updated, then an unchanged slice with room for all of them, then new slices.
The controller remembers the generation of every slice it wrote and does not
reconcile a Service until its informer has caught up with them, so a slow
cache never makes it create duplicates.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import Any

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import resource
from kubeplane.client.informer import SharedInformerFactory, unwrap_deleted
from kubeplane.client.interface import Client
from kubeplane.controllers.base import Controller, RetryLater
from kubeplane.controllers.endpointsutil import (
    HEADLESS_LABEL,
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
NODES = resource("nodes")
SLICES = resource("endpointslices")

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
CONTROLLER_NAME = "endpointslice-controller.k8s.io"
ZONE_LABEL = "topology.kubernetes.io/zone"
#: upstream's --max-endpoints-per-slice default
MAX_ENDPOINTS_PER_SLICE = 100
SERVICE_INDEX = "service"

Obj = dict[str, Any]


def _service_index(es: Obj) -> list[str]:
    labels = md(es).get("labels") or {}
    name = labels.get(SERVICE_NAME_LABEL)
    return [f"{md(es).get('namespace', '')}/{name}"] if name else []


def _ports_key(ports: list[Obj] | None) -> tuple:
    return tuple(sorted((p.get("name") or "", p.get("port"), p.get("protocol") or "TCP", p.get("appProtocol"))
                        for p in ports or []))


def _endpoint_key(ep: Obj) -> tuple:
    ref = ep.get("targetRef") or {}
    return (ref.get("namespace", ""), ref.get("name", ""), ref.get("uid", ""),
            tuple(ep.get("addresses") or []))


def _ip_order(ep: Obj) -> tuple:
    addr = (ep.get("addresses") or [""])[0]
    try:
        a = ipaddress.ip_address(addr)
        return (a.version, int(a), addr)
    except ValueError:
        return (99, 0, addr)


class SliceTracker:
    """The generations of slices this controller wrote (0: deleted), per
    Service, until its informer shows them (upstream's EndpointSliceTracker)."""

    def __init__(self) -> None:
        self._expected: dict[str, dict[str, int]] = {}

    def wrote(self, service: str, slice_obj: Obj) -> None:
        self._expected.setdefault(service, {})[md(slice_obj).get("name", "")] = int(
            md(slice_obj).get("generation") or 1)

    def deleted(self, service: str, name: str) -> None:
        self._expected.setdefault(service, {})[name] = 0

    def stale(self, service: str, cached: dict[str, Obj]) -> bool:
        """Whether the cache lacks a write of ours; caught-up entries are forgotten."""
        expected = self._expected.get(service)
        if not expected:
            return False
        behind = False
        for name, gen in list(expected.items()):
            have = cached.get(name)
            if gen == 0:
                caught_up = have is None or bool(md(have).get("deletionTimestamp"))
            else:
                caught_up = have is not None and int(md(have).get("generation") or 1) >= gen
            if caught_up:
                del expected[name]
            else:
                behind = True
        if not expected:
            self._expected.pop(service, None)
        return behind

    def forget(self, service: str) -> None:
        self._expected.pop(service, None)


class EndpointSliceController(Controller):
    """Keeps the EndpointSlices of every selecting Service."""

    def __init__(self, client: Client, factory: SharedInformerFactory | None = None, *, workers: int = 1,
                 max_endpoints_per_slice: int = MAX_ENDPOINTS_PER_SLICE,
                 name: str = "endpointslice-controller") -> None:
        super().__init__(name, client, factory, workers=workers)
        if not 1 <= max_endpoints_per_slice <= 1000:
            raise ValueError(f"--max-endpoints-per-slice must be between 1 and 1000, got {max_endpoints_per_slice}")
        self.max_endpoints = max_endpoints_per_slice
        self.triggers = TriggerTimeTracker()
        self.tracker = SliceTracker()
        self.service_informer = self.factory.informer_for(SERVICES)
        self.pod_informer = self.factory.informer_for(PODS)
        self.node_informer = self.factory.informer_for(NODES)
        self.slice_informer = self.factory.informer_for(SLICES)
        for inf in (self.service_informer, self.pod_informer):
            add_namespace_index(inf)
        try:
            self.slice_informer.add_indexers({SERVICE_INDEX: _service_index})
        except ValueError:
            pass
        self.services = self.add_queue("services", self.sync)
        self.service_informer.add_event_handler(self._service_changed, lambda _o, n: self._service_changed(n),
                                                self._service_changed)
        self.pod_informer.add_event_handler(self._pod_added, self._pod_updated, self._pod_deleted)
        self.slice_informer.add_event_handler(self._slice_changed, self._slice_updated, self._slice_changed)
        self.node_informer.add_event_handler(None, self._node_updated, None)

    # -- handlers ----------------------------------------------------------

    def _service_changed(self, svc: Obj) -> None:
        self.services.add(key_of(unwrap_deleted(svc)))

    def _pod_added(self, pod: Obj) -> None:
        for key in services_for_pod(self.service_informer, pod):
            self.services.add(key)

    def _pod_updated(self, old: Obj, new: Obj) -> None:
        if pod_endpoints_changed(old, new):
            for key in services_for_pod(self.service_informer, new, old):
                self.services.add(key)

    def _pod_deleted(self, pod: Obj) -> None:
        self._pod_added(unwrap_deleted(pod))

    def _slice_changed(self, es: Obj) -> None:
        es = unwrap_deleted(es)
        if (md(es).get("labels") or {}).get(MANAGED_BY_LABEL) == CONTROLLER_NAME:
            for key in _service_index(es):
                self.services.add(key)

    def _slice_updated(self, old: Obj, new: Obj) -> None:
        # a slice that stops being ours (its labels changed) concerns its old Service too
        self._slice_changed(old)
        self._slice_changed(new)

    def _node_updated(self, old: Obj, new: Obj) -> None:
        """A node's zone shows in its endpoints: requeue the Services with pods there."""
        if (md(old).get("labels") or {}).get(ZONE_LABEL) == (md(new).get("labels") or {}).get(ZONE_LABEL):
            return
        node = md(new).get("name")
        for pod in self.pod_informer.indexer.list():
            if spec_of(pod).get("nodeName") == node:
                for key in services_for_pod(self.service_informer, pod):
                    self.services.add(key)

    # -- sync --------------------------------------------------------------

    async def sync(self, key: str) -> None:
        namespace, _, name = key.partition("/")
        svc = self.service_informer.indexer.get_by_key(key)
        if svc is None:
            # its slices go with it: they are owned by the Service (the garbage collector's work)
            self.triggers.delete(key)
            self.tracker.forget(key)
            return
        spec = spec_of(svc)
        if spec.get("type") == "ExternalName" or spec.get("selector") is None:
            return
        cached = {md(es).get("name", ""): es for es in self.slice_informer.indexer.by_index(SERVICE_INDEX, key)}
        if self.tracker.stale(key, cached):
            raise RetryLater(f"the EndpointSlice cache of Service {key} is behind this controller's writes")
        existing = [es for es in cached.values()
                    if (md(es).get("labels") or {}).get(MANAGED_BY_LABEL) == CONTROLLER_NAME
                    and not md(es).get("deletionTimestamp")]
        selector = spec["selector"]
        pods = [p for p in self.pod_informer.indexer.by_index(NAMESPACE_INDEX, namespace)
                if selector_matches(selector, md(p).get("labels"))]
        trigger = self.triggers.compute(svc, pods)
        desired, missing_nodes = self._desired(svc, pods)
        await self._reconcile(svc, existing, desired, trigger)
        if missing_nodes:
            raise RetryLater(f"pods of Service {key} are on nodes not found: {', '.join(sorted(missing_nodes))}")

    def _desired(self, svc: Obj, pods: list[Obj]) -> tuple[dict[tuple, tuple[list[Obj], list[Obj]]], set[str]]:
        """Endpoints by port mapping: ports key -> (ports, endpoints)."""
        spec = spec_of(svc)
        family = ip_family(svc)
        publish = bool(spec.get("publishNotReadyAddresses"))
        service_ports = [p for p in spec.get("ports") or [] if isinstance(p, dict)]
        out: dict[tuple, tuple[list[Obj], list[Obj]]] = {}
        missing_nodes: set[str] = set()
        for pod in pods:
            if not should_pod_be_in_endpoints(pod, True):
                continue
            ip = pod_ip_for(pod, family)
            if ip is None:
                continue
            node_name = spec_of(pod).get("nodeName") or ""
            node = self.node_informer.indexer.get_by_key(node_name) if node_name else None
            if node_name and node is None:
                missing_nodes.add(node_name)
                continue
            ports: list[Obj] = []
            for sp in service_ports:
                try:
                    number = find_port(pod, sp)
                except PortNotFound:
                    continue
                port: Obj = {"name": sp.get("name") or "", "port": number, "protocol": sp.get("protocol") or "TCP"}
                if sp.get("appProtocol") is not None:
                    port["appProtocol"] = sp["appProtocol"]
                ports.append(port)
            serving = publish or is_pod_ready(pod)
            terminating = bool(md(pod).get("deletionTimestamp"))
            ready = publish or (serving and not terminating)
            pmd = md(pod)
            ep: Obj = {"addresses": [ip], "conditions": {"ready": ready, "serving": serving,
                                                         "terminating": terminating}}
            if should_set_hostname(pod, svc):
                ep["hostname"] = spec_of(pod)["hostname"]
            ep["targetRef"] = {"kind": "Pod", "namespace": pmd.get("namespace", ""), "name": pmd.get("name", ""),
                               "uid": pmd.get("uid", "")}
            if node_name:
                ep["nodeName"] = node_name
            zone = (md(node).get("labels") or {}).get(ZONE_LABEL) if node is not None else None
            if zone:
                ep["zone"] = zone
            group = out.setdefault(_ports_key(ports), (ports, []))
            group[1].append(ep)
        return out, missing_nodes

    def _slice_body(self, svc: Obj, ports: list[Obj], endpoints: list[Obj], existing: Obj | None) -> Obj:
        smd = md(svc)
        labels = {k: v for k, v in (smd.get("labels") or {}).items()
                  if k not in (SERVICE_NAME_LABEL, MANAGED_BY_LABEL, HEADLESS_LABEL)}
        labels[SERVICE_NAME_LABEL] = smd.get("name", "")
        labels[MANAGED_BY_LABEL] = CONTROLLER_NAME
        if is_headless(svc):
            labels[HEADLESS_LABEL] = ""
        if existing is not None:
            body = dict(existing)
            meta = dict(md(existing))
        else:
            body = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice"}
            meta = {"generateName": f"{smd.get('name', '')[:57]}-", "namespace": smd.get("namespace", ""),
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": smd.get("name", ""),
                                         "uid": smd.get("uid", ""), "controller": True,
                                         "blockOwnerDeletion": True}]}
        meta["labels"] = labels
        body["metadata"] = meta
        body["addressType"] = existing.get("addressType") if existing is not None else ip_family(svc)
        body["ports"] = ports
        body["endpoints"] = sorted(endpoints, key=_ip_order)
        return body

    async def _reconcile(self, svc: Obj, existing: list[Obj], desired: dict[tuple, tuple[list[Obj], list[Obj]]],
                         trigger: Any) -> None:
        key = key_of(svc)
        family = ip_family(svc)
        to_create: list[Obj] = []
        to_update: list[Obj] = []
        to_delete: list[Obj] = []
        unchanged: list[Obj] = []
        by_ports: dict[tuple, list[Obj]] = {}
        for es in existing:
            if es.get("addressType") != family:
                to_delete.append(es)  # the Service changed family
                continue
            by_ports.setdefault(_ports_key(es.get("ports")), []).append(es)
        for pkey, slices in by_ports.items():
            if pkey not in desired:
                to_delete.extend(slices)  # no endpoint has these ports any more
        for pkey, (ports, wanted) in desired.items():
            self._by_port_mapping(svc, by_ports.get(pkey, []), ports, wanted, to_create, to_update, to_delete,
                                  unchanged)
        if len(existing) == len(to_delete) and not to_create:
            placeholder = self._slice_body(svc, [], [], None)
            placeholder["addressType"] = family
            keep = next((es for es in to_delete if not es.get("endpoints") and not es.get("ports")
                         and es.get("addressType") == family), None)
            if keep is not None:
                to_delete.remove(keep)
                if self._labels_differ(svc, keep):
                    to_update.append(self._slice_body(svc, [], [], keep))
            else:
                to_create.append(placeholder)
        stamp = format_trigger_time(trigger) if trigger is not None else None
        for es in to_update + to_create:
            annotations = dict(md(es).get("annotations") or {})
            if stamp is not None:
                annotations[TRIGGER_TIME_ANNOTATION] = stamp
            else:
                annotations.pop(TRIGGER_TIME_ANNOTATION, None)
            if annotations:
                es["metadata"]["annotations"] = annotations
            else:
                es["metadata"].pop("annotations", None)
        namespace = md(svc).get("namespace", "")
        # creates first, deletes last: a Service never loses every endpoint in between
        for es in to_create:
            try:
                created = await self.client.create(SLICES, es, namespace)
            except StatusError as err:
                if err.code == 403 and "is being terminated" in err.message:
                    return
                raise
            self.tracker.wrote(key, created)
        for es in to_update:
            updated = await self.client.update(SLICES, es)
            self.tracker.wrote(key, updated)
        for es in to_delete:
            try:
                await self.client.delete(SLICES, md(es).get("name", ""), namespace)
            except StatusError as err:
                if err.code != 404:
                    raise
            self.tracker.deleted(key, md(es).get("name", ""))

    def _labels_differ(self, svc: Obj, es: Obj) -> bool:
        return (md(self._slice_body(svc, [], [], es)).get("labels") or {}) != (md(es).get("labels") or {})

    def _by_port_mapping(self, svc: Obj, slices: list[Obj], ports: list[Obj], wanted: list[Obj],
                         to_create: list[Obj], to_update: list[Obj], to_delete: list[Obj],
                         unchanged: list[Obj]) -> None:
        """Upstream's reconcileByPortMapping for the slices of one port mapping."""
        remaining = {_endpoint_key(ep): ep for ep in wanted}
        updating: list[Obj] = []
        keep_unchanged: list[Obj] = []
        for es in slices:
            new_eps: list[Obj] = []
            changed = False
            for ep in es.get("endpoints") or []:
                k = _endpoint_key(ep)
                want = remaining.pop(k, None)
                if want is None:
                    changed = True  # gone (or duplicated in another slice)
                    continue
                if want != ep:
                    changed = True
                new_eps.append(want)
            labels_changed = self._labels_differ(svc, es)
            if changed or labels_changed:
                if not new_eps:
                    to_delete.append(es)
                else:
                    updating.append(self._slice_body(svc, ports, new_eps, es))
            else:
                keep_unchanged.append(es)
        left = list(remaining.values())
        # fill the slices being updated, fullest first
        updating.sort(key=lambda es: -len(es["endpoints"]))
        for es in updating:
            while left and len(es["endpoints"]) < self.max_endpoints:
                es["endpoints"].append(left.pop(0))
            es["endpoints"].sort(key=_ip_order)
        # then one unchanged slice that takes all that is left, the fullest that fits
        if left:
            fits = [es for es in keep_unchanged if len(es.get("endpoints") or []) + len(left) <= self.max_endpoints]
            if fits:
                target = max(fits, key=lambda es: len(es.get("endpoints") or []))
                keep_unchanged.remove(target)
                updating.append(self._slice_body(svc, ports, list(target.get("endpoints") or []) + left, target))
                left = []
        while left:
            chunk, left = left[:self.max_endpoints], left[self.max_endpoints:]
            to_create.append(self._slice_body(svc, ports, chunk, None))
        to_update.extend(updating)
        unchanged.extend(keep_unchanged)
