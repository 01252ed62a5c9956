"""What the proxier knows of Services and EndpointSlices, after upstream's pkg/proxy.

* :func:`service_ports` turns a Service into one :class:`ServicePort` per
  port for one IP family (nothing for headless and ExternalName Services,
  which get no rules: DNS serves them).
* :func:`endpoints_by_port` turns a Service's EndpointSlices into the
  endpoints of each of its ports (by port name and protocol), one per
  address and port, with the slice's conditions (a missing ``ready`` or
  ``serving`` is true, a missing ``terminating`` false) and whether the
  endpoint is on this node.
* :func:`categorize_endpoints` picks, as upstream's CategorizeEndpoints, the
  endpoints the Cluster and Local traffic policies use: the ready ones, or,
  when none is ready, the serving terminating ones.

``publishNotReadyAddresses`` needs nothing here: the EndpointSlice controller
then marks every address ready.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]

#: upstream's default sessionAffinityConfig.clientIP.timeoutSeconds (3 hours)
DEFAULT_STICKY_SECONDS = 10800
#: a Service with this label is handled by another proxy (upstream's LabelServiceProxyName)
LABEL_SERVICE_PROXY_NAME = "service.kubernetes.io/service-proxy-name"
#: EndpointSlices of headless Services carry it (upstream's IsHeadlessService label)
LABEL_HEADLESS = "service.kubernetes.io/headless"
#: what the proxier's informers list: neither other proxies' Services nor headless ones
INFORMER_LABEL_SELECTOR = f"!{LABEL_SERVICE_PROXY_NAME},!{LABEL_HEADLESS}"
LABEL_SERVICE_NAME = "kubernetes.io/service-name"

#: nftables names are at most 256 bytes; each prefix is at most 16 of them
NAME_LENGTH_MAX = 256
CHAIN_NAME_BASE_LENGTH_MAX = NAME_LENGTH_MAX - 16


def family_of(ip: str) -> str:
    try:
        return "ipv6" if ipaddress.ip_address(ip).version == 6 else "ipv4"
    except ValueError:
        return ""


def hash_and_truncate(name: str) -> str:
    """``HASH-name``: 8 base32 characters of name's sha256, then name (cut at the limit)."""
    digest = base64.b32encode(hashlib.sha256(name.encode()).digest()).decode()
    out = digest[:8] + "-" + name
    if len(out) > CHAIN_NAME_BASE_LENGTH_MAX:
        out = out[:CHAIN_NAME_BASE_LENGTH_MAX - 3] + "..."
    return out


@dataclass(frozen=True, slots=True)
class ServicePortName:
    namespace: str
    name: str
    port: str
    protocol: str  # TCP, UDP, SCTP

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" + (f":{self.port}" if self.port else "")

    @property
    def service(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def chain_base(self) -> str:
        return hash_and_truncate(f"{self.namespace}/{self.name}/{self.protocol.lower()}/{self.port}")


@dataclass(frozen=True)
class ServicePort:
    """One port of a Service, for one IP family (upstream's BaseServicePortInfo)."""

    name: ServicePortName
    cluster_ip: str
    port: int
    protocol: str  # lowercase, as nft writes it
    node_port: int = 0
    external_ips: tuple[str, ...] = ()
    load_balancer_vips: tuple[str, ...] = ()
    load_balancer_source_ranges: tuple[str, ...] = ()
    session_affinity_client_ip: bool = False
    sticky_seconds: int = 0
    external_policy_local: bool = False
    internal_policy_local: bool = False
    health_check_node_port: int = 0

    @property
    def externally_accessible(self) -> bool:
        return bool(self.node_port or self.load_balancer_vips or self.external_ips)

    @property
    def uses_cluster_endpoints(self) -> bool:
        return not self.internal_policy_local or self.externally_accessible

    @property
    def uses_local_endpoints(self) -> bool:
        return self.internal_policy_local or (self.external_policy_local and self.externally_accessible)

    @property
    def chain_base(self) -> str:
        return self.name.chain_base()


@dataclass(frozen=True, slots=True)
class Endpoint:
    ip: str
    port: int
    is_local: bool = False
    ready: bool = True
    serving: bool = True
    terminating: bool = False
    zone_hints: frozenset[str] = frozenset()
    node_hints: frozenset[str] = frozenset()

    def __str__(self) -> str:
        return f"[{self.ip}]:{self.port}" if ":" in self.ip else f"{self.ip}:{self.port}"

    def chain_base(self, spn: ServicePortName) -> str:
        ip = self.ip.replace(":", ".")
        return hash_and_truncate(f"{spn.namespace}/{spn.name}/{spn.protocol.lower()}/{spn.port}__{ip}/{self.port}")


def should_skip_service(svc: Obj) -> bool:
    """Headless and ExternalName Services get no rules (upstream's ShouldSkipService)."""
    spec = svc.get("spec") or {}
    if spec.get("type") == "ExternalName":
        return True
    ip = spec.get("clusterIP")
    return ip in (None, "", "None")


def cluster_ip_for_family(svc: Obj, family: str) -> str | None:
    spec = svc.get("spec") or {}
    ips = spec.get("clusterIPs") or ([spec["clusterIP"]] if spec.get("clusterIP") else [])
    for ip in ips:
        if family_of(ip) == family:
            return str(ipaddress.ip_address(ip))
    return None


def _externally_accessible(spec: Obj) -> bool:
    t = spec.get("type") or "ClusterIP"
    return t in ("LoadBalancer", "NodePort") or (t == "ClusterIP" and bool(spec.get("externalIPs")))


def service_ports(svc: Obj, family: str) -> list[ServicePort]:
    """The ServicePorts of ``svc`` for ``family`` ("ipv4"/"ipv6"); none when it gets no rules."""
    if should_skip_service(svc):
        return []
    cluster_ip = cluster_ip_for_family(svc, family)
    if cluster_ip is None:
        return []
    meta = svc.get("metadata") or {}
    spec = svc.get("spec") or {}
    ns, name = meta.get("namespace") or "default", meta.get("name") or ""
    affinity = spec.get("sessionAffinity") == "ClientIP"
    sticky = 0
    if affinity:
        sticky = int((((spec.get("sessionAffinityConfig") or {}).get("clientIP") or {}).get("timeoutSeconds"))
                     or DEFAULT_STICKY_SECONDS)
    ext_local = _externally_accessible(spec) and spec.get("externalTrafficPolicy") == "Local"
    int_local = spec.get("internalTrafficPolicy") == "Local"
    external_ips = tuple(str(ipaddress.ip_address(ip)) for ip in spec.get("externalIPs") or []
                         if family_of(ip) == family)
    vips = []
    for ing in ((svc.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []:
        ip = ing.get("ip")
        if ip and family_of(ip) == family and ing.get("ipMode", "VIP") == "VIP":
            vips.append(str(ipaddress.ip_address(ip)))
    ranges = []
    for r in spec.get("loadBalancerSourceRanges") or []:
        try:
            net = ipaddress.ip_network(r.strip(), strict=False)
        except ValueError:
            continue
        if ("ipv6" if net.version == 6 else "ipv4") == family:
            ranges.append(str(net))
    if any(ipaddress.ip_network(r).prefixlen == 0 for r in ranges):
        ranges = []  # 0.0.0.0/0 allows everything: no firewall
    hc = int(spec.get("healthCheckNodePort") or 0) if ext_local and spec.get("type") == "LoadBalancer" else 0
    out = []
    for p in spec.get("ports") or []:
        proto = (p.get("protocol") or "TCP").upper()
        spn = ServicePortName(ns, name, p.get("name") or "", proto)
        out.append(ServicePort(
            name=spn, cluster_ip=cluster_ip, port=int(p.get("port") or 0), protocol=proto.lower(),
            node_port=int(p.get("nodePort") or 0), external_ips=external_ips, load_balancer_vips=tuple(vips),
            load_balancer_source_ranges=tuple(ranges), session_affinity_client_ip=affinity, sticky_seconds=sticky,
            external_policy_local=ext_local, internal_policy_local=int_local, health_check_node_port=hc))
    return out


def slice_service(slice_: Obj) -> tuple[str, str] | None:
    meta = slice_.get("metadata") or {}
    name = (meta.get("labels") or {}).get(LABEL_SERVICE_NAME)
    if not name:
        return None
    return (meta.get("namespace") or "default", name)


def endpoints_by_port(service: tuple[str, str], slices: list[Obj], family: str,
                      node_name: str) -> dict[ServicePortName, list[Endpoint]]:
    """Endpoints of each port of ``service`` from its slices of ``family``, sorted by address.

    An address in several slices counts once; its non-terminating entry wins
    (as upstream's EndpointSliceCache)."""
    want = "IPv6" if family == "ipv6" else "IPv4"
    by_port: dict[ServicePortName, dict[str, Endpoint]] = {}
    ns, name = service
    for sl in slices:
        if (sl.get("addressType") or "IPv4") != want:
            continue
        for port in sl.get("ports") or []:
            num = port.get("port")
            if not num:
                continue
            spn = ServicePortName(ns, name, port.get("name") or "", (port.get("protocol") or "TCP").upper())
            eps = by_port.setdefault(spn, {})
            for ep in sl.get("endpoints") or []:
                addrs = ep.get("addresses") or []
                if not addrs:
                    continue
                try:
                    ip = str(ipaddress.ip_address(addrs[0]))
                except ValueError:
                    continue
                cond = ep.get("conditions") or {}
                ready = cond.get("ready") is not False
                serving = cond.get("serving") is not False
                terminating = cond.get("terminating") is True
                hints = ep.get("hints") or {}
                zones = frozenset(z.get("name", "") for z in hints.get("forZones") or [])
                nodes = frozenset(n.get("name", "") for n in hints.get("forNodes") or [])
                e = Endpoint(ip=ip, port=int(num), is_local=bool(node_name) and ep.get("nodeName") == node_name,
                             ready=ready, serving=serving, terminating=terminating, zone_hints=zones,
                             node_hints=nodes)
                key = str(e)
                if key not in eps or not terminating:
                    eps[key] = e
    return {spn: sorted(eps.values(), key=str) for spn, eps in by_port.items() if eps}


@dataclass
class Categorized:
    cluster: list[Endpoint] = field(default_factory=list)
    local: list[Endpoint] = field(default_factory=list)
    #: every endpoint reachable from this node under the service's policies
    reachable: list[Endpoint] = field(default_factory=list)
    #: the service has usable endpoints somewhere in the cluster
    has_any: bool = False


def topology_mode(endpoints: list[Endpoint], node: str, zone: str) -> str:
    """``PreferSameNode`` when every ready endpoint has node hints and one names this node, else
    ``PreferSameZone`` when every ready endpoint has zone hints and one names this node's zone,
    else "" (every endpoint), as upstream's topologyModeFromHints."""
    ready = [e for e in endpoints if e.ready]
    if not ready:
        return ""
    if all(e.node_hints for e in ready) and any(node in e.node_hints for e in ready):
        return "PreferSameNode"
    if zone and all(e.zone_hints for e in ready) and any(zone in e.zone_hints for e in ready):
        return "PreferSameZone"
    return ""


def _available(e: Endpoint, mode: str, node: str, zone: str) -> bool:
    if mode == "PreferSameNode":
        return node in e.node_hints
    if mode == "PreferSameZone":
        return zone in e.zone_hints
    return True


def categorize_endpoints(endpoints: list[Endpoint], svc: ServicePort, zone: str = "", node: str = "") -> Categorized:
    out = Categorized()
    if not endpoints:
        return out
    mode = ""
    if svc.uses_cluster_endpoints:
        mode = topology_mode(endpoints, node, zone)
        out.cluster = [e for e in endpoints if e.ready and _available(e, mode, node, zone)]
        if not out.cluster:
            out.cluster = [e for e in endpoints if e.serving and e.terminating]
        out.has_any = bool(out.cluster)
    if not svc.uses_local_endpoints:
        out.reachable = out.cluster
        return out
    local_ready = local_terminating = False
    for e in endpoints:
        if e.ready:
            out.has_any = True
            local_ready = local_ready or e.is_local
        elif e.serving and e.terminating:
            out.has_any = True
            local_terminating = local_terminating or e.is_local
    terminating_fallback = False
    if local_ready:
        out.local = [e for e in endpoints if e.is_local and e.ready]
    elif local_terminating:
        terminating_fallback = True
        out.local = [e for e in endpoints if e.is_local and e.serving and e.terminating]
    if not svc.uses_cluster_endpoints:
        out.reachable = out.local
        return out
    if not mode and not terminating_fallback:
        out.reachable = out.cluster
        return out
    merged = {str(e): e for e in out.cluster}
    merged.update({str(e): e for e in out.local})
    out.reachable = sorted(merged.values(), key=str)
    return out
