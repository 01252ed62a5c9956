"""The ``kube-dns`` Service in ``kube-system`` and its endpoints, kept by the
component that serves cluster DNS, as the API server keeps the ``kubernetes``
Service (:mod:`kubeplane.apiserver.kubernetesservice`).

The Service has kubeadm's fixed ClusterIP, the tenth address of the service
range (10.96.0.10 for 10.96.0.0/12), which kubelets get as ``--cluster-dns``,
and kubeadm's ports ``dns`` (53/UDP), ``dns-tcp`` (53/TCP) and, when the
server serves metrics, ``metrics`` (9153/TCP), targeting the ports the server
listens on. The server is no pod, so the Service has no
selector (the endpoint controllers leave it alone) and its EndpointSlice and
Endpoints (both named ``kube-dns``) list the address the server is reached
at. A server on a loopback address gets no endpoints: no endpoint may be a
loopback address. Deleted or changed objects are put back every
``interval`` seconds.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from typing import Any

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import resource
from kubeplane.runtime import cancel_and_wait, every

log = logging.getLogger("kubeplane.dns")

Obj = dict[str, Any]

SERVICES = resource("services")
ENDPOINTS = resource("endpoints")
SLICES = resource("endpointslices")

NAME = "kube-dns"
NAMESPACE = "kube-system"
DNS_PORT = 53
#: kubeadm's metrics port of the kube-dns Service (CoreDNS's prometheus plugin)
METRICS_PORT = 9153
#: kubeadm's labels of the kube-dns Service
LABELS = {"k8s-app": "kube-dns", "kubernetes.io/cluster-service": "true", "kubernetes.io/name": "KubeDNS"}
#: kubeadm's DNS Service address: this offset into the service range
SERVICE_IP_OFFSET = 10


def kube_dns_ip(service_cidr: str) -> str:
    """The kube-dns ClusterIP of a service range, as kubeadm picks it (the tenth address)."""
    from kubeplane.registry.servicealloc import parse_service_cidr

    net = parse_service_cidr(service_cidr)
    if net.num_addresses <= SERVICE_IP_OFFSET + (1 if net.version == 4 else 0):
        raise ValueError(f"the service range {service_cidr} has no tenth address for the kube-dns Service")
    return str(net[SERVICE_IP_OFFSET])


def endpoint_address(listen_host: str, configured: str | None = None) -> str | None:
    """The address the kube-dns endpoints list: ``configured``, else the
    listen address when it is a routable one, else (listening on every
    address) the host's own; None for a loopback listener."""
    from kubeplane.apiserver.kubernetesservice import advertise_address

    if configured:
        return configured
    try:
        ip = ipaddress.ip_address(listen_host)
    except ValueError:
        return None
    if ip.is_loopback:
        return None
    return advertise_address(None, listen_host)


class KubeDNSService:
    """Creates and repairs the kube-dns Service and its endpoints over ``client``."""

    def __init__(self, client: Any, *, service_ip: str, port: int, address: str | None,
                 interval: float = 10.0, metrics_port: int | None = None) -> None:
        self.client = client
        self.service_ip = service_ip
        self.port = port
        #: the port /metrics is served on at the same address (None: no metrics port)
        self.metrics_port = metrics_port
        self.address = address
        self.interval = interval
        #: the ClusterIP the Service has (another one when someone made it before)
        self.cluster_ip: str | None = None
        self._task: asyncio.Task[None] | None = None

    def _ports(self, target: bool) -> list[Obj]:
        out = []
        ports = [("dns", "UDP", DNS_PORT, self.port), ("dns-tcp", "TCP", DNS_PORT, self.port)]
        if self.metrics_port is not None:
            ports.append(("metrics", "TCP", METRICS_PORT, self.metrics_port))
        for name, proto, port, backend in ports:
            p: Obj = {"name": name, "port": port if target else backend, "protocol": proto}
            if target:
                p["targetPort"] = backend
            out.append(p)
        return out

    def service(self) -> Obj:
        md: Obj = {"name": NAME, "namespace": NAMESPACE, "labels": dict(LABELS)}
        if self.metrics_port is not None:
            md["annotations"] = {"prometheus.io/port": str(METRICS_PORT), "prometheus.io/scrape": "true"}
        return {
            "apiVersion": "v1", "kind": "Service",
            "metadata": md,
            "spec": {"type": "ClusterIP", "clusterIP": self.service_ip, "clusterIPs": [self.service_ip],
                     "sessionAffinity": "None", "ipFamilyPolicy": "SingleStack", "ports": self._ports(True)},
        }

    def endpoints(self) -> Obj:
        return {
            "apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": NAME, "namespace": NAMESPACE,
                         "labels": {**LABELS, "endpointslice.kubernetes.io/skip-mirror": "true"}},
            "subsets": [{"addresses": [{"ip": self.address}], "ports": self._ports(False)}],
        }

    def endpoint_slice(self) -> Obj:
        family = "IPv6" if ipaddress.ip_address(self.address or "0.0.0.0").version == 6 else "IPv4"
        return {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": NAME, "namespace": NAMESPACE,
                         "labels": {**LABELS, "kubernetes.io/service-name": NAME}},
            "addressType": family,
            "endpoints": [{"addresses": [self.address], "conditions": {"ready": True}}],
            "ports": self._ports(False),
        }

    async def reconcile(self) -> None:
        """One pass: the Service, then (with an address) its Endpoints and EndpointSlice."""
        await self._ensure(SERVICES, self.service(), self._same_service, self._fix_service)
        if self.address is None:
            return
        await self._ensure(ENDPOINTS, self.endpoints(), lambda cur, want: cur.get("subsets") == want["subsets"]
                           and _labels(cur) == want["metadata"]["labels"], self._fix)
        await self._ensure(SLICES, self.endpoint_slice(), lambda cur, want: all(
            cur.get(k) == want[k] for k in ("addressType", "endpoints", "ports"))
            and _labels(cur) == want["metadata"]["labels"], self._fix)

    @staticmethod
    def _same_service(cur: Obj, want: Obj) -> bool:
        spec = cur.get("spec") or {}
        ports = [{k: p.get(k) for k in ("name", "port", "protocol", "targetPort")} for p in spec.get("ports") or []]
        return spec.get("type") == "ClusterIP" and ports == want["spec"]["ports"] and not spec.get("selector")

    @staticmethod
    def _fix_service(cur: Obj, want: Obj) -> Obj:
        spec = {k: v for k, v in (cur.get("spec") or {}).items() if k != "selector"}
        return {**cur, "spec": {**spec, "type": "ClusterIP", "ports": want["spec"]["ports"]}}

    @staticmethod
    def _fix(cur: Obj, want: Obj) -> Obj:
        new = {**cur, **{k: v for k, v in want.items() if k != "metadata"}}
        new["metadata"] = {**(cur.get("metadata") or {}), "labels": want["metadata"]["labels"]}
        return new

    async def _ensure(self, res: Any, want: Obj, same: Any, fix: Any) -> None:
        try:
            current = await self.client.get(res, NAME, NAMESPACE)
        except StatusError as err:
            if err.code != 404:
                raise
            try:
                current = await self.client.create(res, want, NAMESPACE)
            except StatusError as exc:
                if exc.code != 409:
                    raise
                return
        else:
            if not same(current, want):
                current = await self.client.update(res, fix(current, want))
        if res is SERVICES:
            self._note_cluster_ip(current)

    def _note_cluster_ip(self, svc: Obj) -> None:
        ip = (svc.get("spec") or {}).get("clusterIP")
        if ip and ip != self.service_ip and ip != self.cluster_ip:
            log.warning("the kube-dns Service has ClusterIP %s, not %s: kubelets need --cluster-dns=%s", ip,
                        self.service_ip, ip)
        self.cluster_ip = ip

    async def start(self) -> None:
        if self.address is None:
            log.info("the DNS server listens on a loopback address: the kube-dns Service gets no endpoints")
        try:
            await self.reconcile()
        except StatusError as exc:
            log.warning("the kube-dns Service could not be set up: %s", exc.message)
        self._task = asyncio.get_running_loop().create_task(
            every(self.interval, self.reconcile, "reconciling the kube-dns Service"), name="kube-dns-service")

    async def stop(self) -> None:
        await cancel_and_wait([self._task], "the kube-dns Service reconciler")
        self._task = None


def _labels(obj: Obj) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}
