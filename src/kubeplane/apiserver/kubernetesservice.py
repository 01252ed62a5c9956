"""The ``kubernetes`` Service in ``default`` and its endpoints, kept by the API
server as upstream's kubernetes service controller and endpoint reconciler
(``pkg/controlplane/controller/kubernetesservice``, ``pkg/controlplane/reconcilers``) do.

The Service has the first address of the service range and port 443
(``https``) targeting the API server's secure port; its Endpoints and
EndpointSlice (both named ``kubernetes``) list the address the API server
advertises. The Service has no selector, so the endpoint controllers leave
them alone; this loop puts them back if they are deleted or changed.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from typing import Any

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import resource
from kubeplane.runtime import cancel_and_wait, every

log = logging.getLogger("kubeplane.apiserver")

Obj = dict[str, Any]

SERVICES = resource("services")
ENDPOINTS = resource("endpoints")
SLICES = resource("endpointslices")

NAME = "kubernetes"
NAMESPACE = "default"
SERVICE_PORT = 443
PORT_NAME = "https"
#: upstream's --endpoint-reconciler interval
DEFAULT_INTERVAL = 10.0


def advertise_address(configured: str | None, listen_host: str) -> str | None:
    """The address the API server publishes in the ``kubernetes`` endpoints:
    ``--advertise-address``, else the listen address when it is a specific
    routable one, else the host's address on its default route (upstream's
    ResolveBindAddress); None when the host has none."""
    if configured:
        return configured
    try:
        ip = ipaddress.ip_address(listen_host)
    except ValueError:
        ip = None
    if ip is not None and not ip.is_loopback and not ip.is_unspecified:
        return str(ip)
    family = socket.AF_INET6 if ip is not None and ip.version == 6 else socket.AF_INET
    # documentation addresses (TEST-NET-2, 2001:db8::/32): only the route is looked up
    probe = "2001:db8::1" if family == socket.AF_INET6 else "198.51.100.1"
    candidates: list[str] = []
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((probe, 9))  # a UDP connect sends nothing: it picks the route's source address
            candidates.append(s.getsockname()[0])
    except OSError:
        pass
    try:
        candidates += [info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, family)]
    except OSError:
        pass
    for host in candidates:
        try:
            found = ipaddress.ip_address(host)
        except ValueError:
            continue
        if not (found.is_loopback or found.is_unspecified or found.is_link_local):
            return str(found)
    return None


class KubernetesService:
    """Creates and repairs the ``kubernetes`` Service and its endpoints every ``interval`` seconds."""

    def __init__(self, registry: Any, *, service_ip: str, port: int, public_ip: str | None,
                 interval: float = DEFAULT_INTERVAL) -> None:
        self.registry = registry
        self.service_ip = service_ip
        self.port = port
        self.public_ip = public_ip
        self.interval = interval
        self._task: asyncio.Task[None] | None = None

    def service(self) -> Obj:
        return {
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": NAME, "namespace": NAMESPACE,
                         "labels": {"component": "apiserver", "provider": "kubernetes"}},
            "spec": {"type": "ClusterIP", "clusterIP": self.service_ip, "clusterIPs": [self.service_ip],
                     "sessionAffinity": "None", "ipFamilyPolicy": "SingleStack",
                     "ports": [{"name": PORT_NAME, "port": SERVICE_PORT, "protocol": "TCP",
                                "targetPort": self.port}]},
        }

    def endpoints(self) -> Obj:
        return {
            "apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": NAME, "namespace": NAMESPACE,
                         "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
            "subsets": [{"addresses": [{"ip": self.public_ip}],
                         "ports": [{"name": PORT_NAME, "port": self.port, "protocol": "TCP"}]}],
        }

    def endpoint_slice(self) -> Obj:
        family = "IPv6" if ipaddress.ip_address(self.public_ip or "0.0.0.0").version == 6 else "IPv4"
        return {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": NAME, "namespace": NAMESPACE,
                         "labels": {"kubernetes.io/service-name": NAME}},
            "addressType": family,
            "endpoints": [{"addresses": [self.public_ip], "conditions": {"ready": True}}],
            "ports": [{"name": PORT_NAME, "port": self.port, "protocol": "TCP"}],
        }

    async def reconcile(self) -> None:
        """One pass: the Service, then its Endpoints and EndpointSlice."""
        await self._ensure_service()
        if self.public_ip is None:
            return
        await self._ensure(ENDPOINTS, self.endpoints(), lambda cur, want: (
            cur.get("subsets") == want["subsets"]
            and (cur.get("metadata") or {}).get("labels") == want["metadata"]["labels"]))
        await self._ensure(SLICES, self.endpoint_slice(), lambda cur, want: all(
            cur.get(k) == want[k] for k in ("addressType", "endpoints", "ports"))
            and (cur.get("metadata") or {}).get("labels") == want["metadata"]["labels"])

    async def _ensure_service(self) -> None:
        want = self.service()
        try:
            current = await self.registry.get(SERVICES, NAME, NAMESPACE)
        except StatusError as err:
            if err.code != 404:
                raise
            try:
                await self.registry.create(SERVICES, want, NAMESPACE)
            except StatusError as exc:
                if exc.code != 409:
                    raise
            return
        spec = current.get("spec") or {}
        ports = [{k: p.get(k) for k in ("name", "port", "protocol", "targetPort")} for p in spec.get("ports") or []]
        if spec.get("type") == "ClusterIP" and ports == want["spec"]["ports"]:
            return
        # upstream's getMasterServiceUpdateIfNeeded: the ports and type are put back
        new = dict(current)
        new["spec"] = {**spec, "type": "ClusterIP", "ports": want["spec"]["ports"]}
        await self.registry.update(SERVICES, new, name=NAME, namespace=NAMESPACE)

    async def _ensure(self, res: Any, want: Obj, same: Any) -> None:
        try:
            current = await self.registry.get(res, NAME, NAMESPACE)
        except StatusError as err:
            if err.code != 404:
                raise
            try:
                await self.registry.create(res, want, NAMESPACE)
            except StatusError as exc:
                if exc.code != 409:
                    raise
            return
        if same(current, want):
            return
        new = {**current, **{k: v for k, v in want.items() if k != "metadata"}}
        new["metadata"] = {**(current.get("metadata") or {}), "labels": want["metadata"]["labels"]}
        await self.registry.update(res, new, name=NAME, namespace=NAMESPACE)

    async def start(self) -> None:
        if self.public_ip is None:
            log.warning("no routable address to advertise (set --advertise-address): the kubernetes Service "
                        "gets no endpoints")
        try:
            await self.reconcile()
        except StatusError as exc:
            log.warning("the kubernetes Service could not be set up: %s", exc.message)
        self._task = asyncio.get_running_loop().create_task(
            every(self.interval, self.reconcile, "reconciling the kubernetes Service"), name="kubernetes-service")

    async def stop(self) -> None:
        await cancel_and_wait([self._task], "the kubernetes Service reconciler")
        self._task = None
