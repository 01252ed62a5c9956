"""Services on a node with nftables: upstream kube-proxy's nftables mode.

One :class:`Proxier` per IP family owns the table ``kube-proxy`` of family
``ip`` or ``ip6``, laid out as upstream's pkg/proxy/nftables:

* base chains ``filter-prerouting-pre-dnat``, ``filter-output-pre-dnat``,
  ``filter-input``, ``filter-forward``, ``filter-output``, ``nat-prerouting``,
  ``nat-output`` and ``nat-postrouting`` jump to the regular chains
  ``services``, ``masquerading``, ``firewall-check``,
  ``service-endpoints-check``, ``nodeport-endpoints-check`` and
  ``cluster-ips-check``;
* ``services`` dispatches through the verdict maps ``service-ips`` (ClusterIP,
  external IP and load-balancer IP . protocol . port) and
  ``service-nodeports`` (protocol . port, on every local address or the
  ``nodeport-ips`` set) to one chain per service port: ``service-HASH-ns/name/proto/port``
  (Cluster policy), ``local-...`` (Local policy), ``external-...`` (NodePort,
  external and load-balancer traffic, masquerading as the policy asks) and
  ``firewall-...`` (loadBalancerSourceRanges);
* a service chain DNATs with ``numgen random mod N`` over its usable endpoints;
  with ``sessionAffinity: ClientIP`` it goes through ``endpoint-...`` chains
  instead, each recording the client in an ``affinity-...`` set with the
  service's timeout and a rule sending clients in that set back to it;
* services without usable endpoints are in ``no-endpoint-services`` /
  ``no-endpoint-nodeports``: rejected (no endpoints at all) or dropped (Local
  policy without local endpoints); any other port of an active ClusterIP
  (the ``cluster-ips`` set) is rejected too;
* masquerading: rules mark packets with ``0x4000`` and ``masquerading`` SNATs
  marked packets; hairpin connections (an endpoint on this node reaching
  itself through a service) are masqueraded through the
  ``hairpin-connections`` set.

Syncs are transactions (``nft -f -``, all or nothing). A full sync (the first,
after a failure, and every ``full_sync_period``) rewrites everything; a
partial sync rewrites only the chains of the services that changed since the
last sync and adds or deletes only the map and set elements that differ from
those it wrote. Chains no longer used are flushed at once and deleted a
second later (older kernels notice late that a map element no longer points
to them). The :class:`~kubeplane.proxy.runner.BoundedFrequencyRunner`
batches changes: at most one sync per ``min_sync_period``, one at once after
a quiet period.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from kubeplane.proxy import nft
from kubeplane.proxy.model import (Endpoint, ServicePort, categorize_endpoints, endpoints_by_port,
                                   service_ports, slice_service)
from kubeplane.proxy.nft import Chain, Element, Map, Rule, Set, Table
from kubeplane.proxy.runner import BoundedFrequencyRunner

log = logging.getLogger(__name__)

TABLE = "kube-proxy"

# base chains
FILTER_PREROUTING_PRE_DNAT = "filter-prerouting-pre-dnat"
FILTER_OUTPUT_PRE_DNAT = "filter-output-pre-dnat"
FILTER_INPUT = "filter-input"
FILTER_FORWARD = "filter-forward"
FILTER_OUTPUT = "filter-output"
NAT_PREROUTING = "nat-prerouting"
NAT_OUTPUT = "nat-output"
NAT_POSTROUTING = "nat-postrouting"
# service dispatch
SERVICES_CHAIN = "services"
SERVICE_IPS_MAP = "service-ips"
SERVICE_NODEPORTS_MAP = "service-nodeports"
NODEPORT_IPS_SET = "nodeport-ips"
CLUSTER_IPS_SET = "cluster-ips"
# services without endpoints
SERVICE_ENDPOINTS_CHECK = "service-endpoints-check"
NODEPORT_ENDPOINTS_CHECK = "nodeport-endpoints-check"
NO_ENDPOINT_SERVICES_MAP = "no-endpoint-services"
NO_ENDPOINT_NODEPORTS_MAP = "no-endpoint-nodeports"
REJECT_CHAIN = "reject-chain"
CLUSTER_IPS_CHECK = "cluster-ips-check"
# loadBalancerSourceRanges
FIREWALL_IPS_MAP = "firewall-ips"
FIREWALL_CHECK = "firewall-check"
# masquerading
MASQUERADING_CHAIN = "masquerading"
HAIRPIN_SET = "hairpin-connections"

BASE_CHAINS = [
    (FILTER_PREROUTING_PRE_DNAT, "filter", "prerouting", nft.DNAT_PRIORITY - 10),
    (FILTER_OUTPUT_PRE_DNAT, "filter", "output", nft.DNAT_PRIORITY - 10),
    (FILTER_INPUT, "filter", "input", nft.FILTER_PRIORITY),
    (FILTER_FORWARD, "filter", "forward", nft.FILTER_PRIORITY),
    (FILTER_OUTPUT, "filter", "output", nft.FILTER_PRIORITY),
    (NAT_PREROUTING, "nat", "prerouting", nft.DNAT_PRIORITY),
    (NAT_OUTPUT, "nat", "output", nft.DNAT_PRIORITY),
    (NAT_POSTROUTING, "nat", "postrouting", nft.SNAT_PRIORITY),
]

#: (regular chain, base chain it is jumped to from, match before the jump)
JUMP_CHAINS = [
    (NODEPORT_ENDPOINTS_CHECK, FILTER_INPUT, "ct state new"),
    (SERVICE_ENDPOINTS_CHECK, FILTER_INPUT, "ct state new"),
    (SERVICE_ENDPOINTS_CHECK, FILTER_FORWARD, "ct state new"),
    (SERVICE_ENDPOINTS_CHECK, FILTER_OUTPUT, "ct state new"),
    (FIREWALL_CHECK, FILTER_PREROUTING_PRE_DNAT, "ct state new"),
    (FIREWALL_CHECK, FILTER_OUTPUT_PRE_DNAT, "ct state new"),
    (SERVICES_CHAIN, NAT_OUTPUT, ""),
    (SERVICES_CHAIN, NAT_PREROUTING, ""),
    (MASQUERADING_CHAIN, NAT_POSTROUTING, ""),
    (CLUSTER_IPS_CHECK, FILTER_FORWARD, "ct state new"),
    (CLUSTER_IPS_CHECK, FILTER_OUTPUT, "ct state new"),
]

#: the element containers a sync diffs (affinity sets are filled by the kernel, never by us)
CONTAINERS = (CLUSTER_IPS_SET, SERVICE_IPS_MAP, FIREWALL_IPS_MAP, NO_ENDPOINT_SERVICES_MAP,
              NO_ENDPOINT_NODEPORTS_MAP, SERVICE_NODEPORTS_MAP, HAIRPIN_SET)
_MAPS = {SERVICE_IPS_MAP, FIREWALL_IPS_MAP, NO_ENDPOINT_SERVICES_MAP, NO_ENDPOINT_NODEPORTS_MAP, SERVICE_NODEPORTS_MAP}

CLUSTER_PREFIX = "service-"
LOCAL_PREFIX = "local-"
EXTERNAL_PREFIX = "external-"
ENDPOINT_PREFIX = "endpoint-"
AFFINITY_PREFIX = "affinity-"
FIREWALL_PREFIX = "firewall-"


def is_service_chain(name: str) -> bool:
    """Per-service chains have a ``/`` in their name; the fixed ones do not."""
    return "/" in name


@dataclass
class ProxyConfig:
    """``kubeplane proxy``'s settings (upstream's KubeProxyConfiguration, nftables part)."""

    node_name: str
    #: the node's addresses (one per family at most is used, for loadBalancerSourceRanges and "primary")
    node_ips: list[str] = field(default_factory=list)
    #: which families get a table: "ipv4", "ipv6"
    families: tuple[str, ...] = ("ipv4",)
    #: at most one sync per this many seconds (upstream's minSyncPeriod)
    min_sync_period: float = 1.0
    #: a failed sync is retried after this many seconds, and a sync runs at least this often (syncPeriod)
    sync_period: float = 30.0
    #: a full sync at least this often
    full_sync_period: float = 3600.0
    masquerade_bit: int = 14
    masquerade_all: bool = False
    #: the pods' addresses (upstream's detect-local-mode ClusterCIDR / NodeCIDR): traffic to a ClusterIP
    #: from elsewhere is masqueraded; none given, it is not
    local_cidrs: list[str] = field(default_factory=list)
    #: where NodePorts answer: [] every local address but loopback; ["primary"] the node IPs; else CIDRs
    #: whose local addresses answer
    nodeport_addresses: list[str] = field(default_factory=list)
    #: the node's topology.kubernetes.io/zone, for topology-aware hints
    zone: str = ""
    #: runs nft behind this (e.g. ["ip", "netns", "exec", "NAME"])
    command_prefix: list[str] = field(default_factory=list)
    #: keep the table when the proxy stops (default: delete it)
    keep_rules_on_stop: bool = False


@dataclass
class ServiceRules:
    """Everything one service contributes to the table."""

    chains: dict[str, list[Rule]] = field(default_factory=dict)
    elements: list[Element] = field(default_factory=list)
    affinity_sets: list[Set] = field(default_factory=list)


@dataclass
class SyncResult:
    full: bool
    services: set[tuple[str, str]]
    duration: float
    ops: int


class Proxier:
    """The rules of one IP family, kept in sync with the Services and EndpointSlices it is told of."""

    def __init__(self, family: str, config: ProxyConfig, *, nftables: Any = None,
                 local_addresses: Callable[[], Any] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if family not in ("ipv4", "ipv6"):
            raise ValueError(f"unknown IP family {family!r}")
        self.family = family
        self.config = config
        self.nft_family = "ip6" if family == "ipv6" else "ip"
        self.nft = nftables or nft.NFTables(self.nft_family, TABLE, command_prefix=config.command_prefix)
        self.clock = clock
        self._local_addresses = local_addresses
        self.ipx = self.nft_family
        self.addr_type = "ipv6_addr" if family == "ipv6" else "ipv4_addr"
        self.no_localhost = "ip6 daddr != ::1" if family == "ipv6" else "ip daddr != 127.0.0.0/8"
        self.masquerade_mark = f"{1 << config.masquerade_bit:#08x}"
        self.masquerade_rule = f"mark set mark or {self.masquerade_mark}"
        cidrs = [c for c in config.local_cidrs if _cidr_family(c) == family]
        self.local_cidrs = cidrs
        self.node_ip = next((ip for ip in config.node_ips if _ip_family(ip) == family), None)
        #: the node's topology.kubernetes.io/zone (set_zone follows the Node)
        self.zone = config.zone
        # what the informers said
        self._services: dict[tuple[str, str], dict] = {}
        self._slices: dict[tuple[str, str], dict[str, dict]] = {}
        self._dirty: set[tuple[str, str]] = set()
        # what the last sync computed, per service
        self._rules: dict[tuple[str, str], ServiceRules] = {}
        # what the table holds (as far as our transactions went)
        self._applied: dict[str, dict[tuple[str, ...], Element]] = {c: {} for c in CONTAINERS}
        self._applied_chains: set[str] = set()
        self._applied_affinity: set[str] = set()
        self._stale_chains: dict[str, float] = {}
        self._need_full = True
        self._last_full = 0.0
        self._base_reset = False
        self.initialized = False
        self.runner = BoundedFrequencyRunner(f"sync-{family}", self.sync, min_interval=config.min_sync_period,
                                             retry_interval=config.sync_period, max_interval=config.sync_period)
        self.synced = asyncio.Event()
        self.last_error: str | None = None
        self.syncs: list[SyncResult] = []
        #: called after each successful sync with its result
        self.on_sync: list[Callable[[SyncResult], None]] = []
        self._lock = asyncio.Lock()

    # -- informer events -------------------------------------------------------

    def _changed(self, key: tuple[str, str]) -> None:
        self._dirty.add(key)
        if self.initialized:
            self.runner.run()

    def on_service(self, svc: dict) -> None:
        meta = svc.get("metadata") or {}
        key = (meta.get("namespace") or "default", meta.get("name") or "")
        self._services[key] = svc
        self._changed(key)

    def on_service_deleted(self, svc: dict) -> None:
        meta = svc.get("metadata") or {}
        key = (meta.get("namespace") or "default", meta.get("name") or "")
        self._services.pop(key, None)
        self._changed(key)

    def on_slice(self, slice_: dict) -> None:
        key = slice_service(slice_)
        if key is None:
            return
        self._slices.setdefault(key, {})[slice_["metadata"]["name"]] = slice_
        self._changed(key)

    def on_slice_deleted(self, slice_: dict) -> None:
        key = slice_service(slice_)
        if key is None:
            return
        slices = self._slices.get(key)
        if slices is not None:
            slices.pop(slice_["metadata"]["name"], None)
            if not slices:
                del self._slices[key]
        self._changed(key)

    def set_zone(self, zone: str) -> None:
        """The node's zone changed: every service's endpoints may differ (a full sync)."""
        if zone == self.zone:
            return
        self.zone = zone
        self._need_full = True
        self._dirty.update(self._services)
        if self.initialized:
            self.runner.run()

    def set_initialized(self) -> None:
        """Services and EndpointSlices are all known: syncs may start."""
        self.initialized = True
        self.runner.run()

    # -- rule generation ---------------------------------------------------------

    def compute(self, key: tuple[str, str]) -> ServiceRules | None:
        svc = self._services.get(key)
        if svc is None:
            return None
        ports = service_ports(svc, self.family)
        if not ports:
            return None
        eps = endpoints_by_port(key, list((self._slices.get(key) or {}).values()), self.family,
                                self.config.node_name)
        out = ServiceRules()
        for sp in ports:
            self._service_port_rules(out, sp, eps.get(sp.name, []))
        return out

    def _service_port_rules(self, out: ServiceRules, svc: ServicePort, endpoints: list[Endpoint]) -> None:
        ipx = self.ipx
        proto = svc.protocol
        port = str(svc.port)
        name = str(svc.name)
        base = svc.chain_base
        cat = categorize_endpoints(endpoints, svc, self.zone, self.config.node_name)
        affinity = svc.session_affinity_client_ip

        def chain(n: str) -> list[Rule]:
            return out.chains.setdefault(n, [])

        def elem(container: str, key: list[str], value: list[str] | None = None, comment: str | None = None) -> None:
            out.elements.append(Element(container, tuple(key), tuple(value) if value is not None else None,
                                        comment, container in _MAPS))

        ep_chains = {str(e): ENDPOINT_PREFIX + e.chain_base(svc.name) for e in cat.reachable}
        ep_sets = {str(e): AFFINITY_PREFIX + e.chain_base(svc.name) for e in cat.reachable}
        for e in cat.reachable:
            if affinity:
                chain(ep_chains[str(e)])
            if e.is_local:
                elem(HAIRPIN_SET, [e.ip, e.ip, proto, str(e.port)])

        cluster_chain = CLUSTER_PREFIX + base
        uses_cluster = bool(cat.cluster) and svc.uses_cluster_endpoints
        if uses_cluster:
            chain(cluster_chain)
        local_chain = LOCAL_PREFIX + base
        uses_local = bool(cat.local) and svc.uses_local_endpoints
        if uses_local:
            chain(local_chain)

        internal_chain, has_internal = cluster_chain, cat.has_any
        if svc.internal_policy_local:
            internal_chain = local_chain
            has_internal = has_internal and bool(cat.local)
        external_policy_chain, has_external = cluster_chain, cat.has_any
        if svc.external_policy_local:
            external_policy_chain = local_chain
            has_external = has_external and bool(cat.local)
        external_chain = EXTERNAL_PREFIX + base
        uses_external = cat.has_any and svc.externally_accessible
        if uses_external:
            chain(external_chain)

        if not cat.has_any:
            internal_verdict = external_verdict = f"goto {REJECT_CHAIN}"
        else:
            internal_verdict = "" if has_internal else "drop"
            external_verdict = "" if has_external else "drop"

        elem(CLUSTER_IPS_SET, [svc.cluster_ip])
        if has_internal:
            elem(SERVICE_IPS_MAP, [svc.cluster_ip, proto, port], [f"goto {internal_chain}"])
        else:
            elem(NO_ENDPOINT_SERVICES_MAP, [svc.cluster_ip, proto, port], [internal_verdict], name)

        for ip in svc.external_ips:
            if cat.has_any:
                elem(SERVICE_IPS_MAP, [ip, proto, port], [f"goto {external_chain}"])
            if not has_external:
                elem(NO_ENDPOINT_SERVICES_MAP, [ip, proto, port], [external_verdict], name)

        uses_fw = bool(svc.load_balancer_vips) and bool(svc.load_balancer_source_ranges)
        fw_chain = FIREWALL_PREFIX + base
        if uses_fw:
            chain(fw_chain)
        for ip in svc.load_balancer_vips:
            if cat.has_any:
                elem(SERVICE_IPS_MAP, [ip, proto, port], [f"goto {external_chain}"])
            if uses_fw:
                elem(FIREWALL_IPS_MAP, [ip, proto, port], [f"goto {fw_chain}"])
        if not has_external:
            for ip in svc.load_balancer_vips:
                elem(NO_ENDPOINT_SERVICES_MAP, [ip, proto, port], [external_verdict], name)

        if svc.node_port:
            if cat.has_any:
                elem(SERVICE_NODEPORTS_MAP, [proto, str(svc.node_port)], [f"goto {external_chain}"])
            if not has_external:
                elem(NO_ENDPOINT_NODEPORTS_MAP, [proto, str(svc.node_port)], [external_verdict], name)

        if uses_external:
            rules = chain(external_chain)
            if not svc.external_policy_local:
                # endpoints may be on other nodes: masquerade so that replies come back here
                rules.append(Rule(external_chain, self.masquerade_rule, "masquerade"))
            else:
                if self.local_cidrs:
                    rules.append(Rule(external_chain, nft.concat(self._if_local(), "goto", cluster_chain),
                                      "short-circuit pod traffic"))
                rules.append(Rule(external_chain, nft.concat("fib saddr type local", self.masquerade_rule),
                                  "masquerade local traffic"))
                rules.append(Rule(external_chain, nft.concat("fib saddr type local goto", cluster_chain),
                                  "short-circuit local traffic"))
            if has_external:
                rules.append(Rule(external_chain, f"goto {external_policy_chain}"))

        if uses_fw:
            sources = list(svc.load_balancer_source_ranges)
            if self.node_ip and any(ipaddress.ip_address(self.node_ip) in ipaddress.ip_network(r)
                                    for r in sources):
                sources += list(svc.load_balancer_vips)
            chain(fw_chain).append(Rule(fw_chain, nft.concat(ipx, "saddr != {", ", ".join(sources), "} drop")))

        if affinity:
            for e in cat.reachable:
                out.affinity_sets.append(Set(ep_sets[str(e)], self.addr_type, ("dynamic", "timeout"),
                                             svc.sticky_seconds))
        for policy_chain, used, eps in ((cluster_chain, uses_cluster, cat.cluster),
                                        (local_chain, uses_local, cat.local)):
            if not used:
                continue
            rules = chain(policy_chain)
            if not affinity:
                targets = ", ".join(f"{i} : {e.ip} . {e.port}" for i, e in enumerate(eps))
                rules.append(Rule(policy_chain, f"meta l4proto {proto} dnat {ipx} addr . port to "
                                                f"numgen random mod {len(eps)} map {{ {targets} }}"))
            else:
                for e in eps:
                    rules.append(Rule(policy_chain, f"{ipx} saddr @{ep_sets[str(e)]} goto {ep_chains[str(e)]}"))
                targets = ", ".join(f"{i} : goto {ep_chains[str(e)]}" for i, e in enumerate(eps))
                rules.append(Rule(policy_chain, f"numgen random mod {len(eps)} vmap {{ {targets} }}"))
        if affinity:
            for e in cat.reachable:
                c = ep_chains[str(e)]
                chain(c).append(Rule(c, f"update @{ep_sets[str(e)]} {{ {ipx} saddr }}"))
                chain(c).append(Rule(c, f"meta l4proto {proto} dnat to {e}"))

    def _if_local(self) -> str:
        return nft.concat(self.ipx, "saddr", self._cidr_match())

    def _if_not_local(self) -> str:
        return nft.concat(self.ipx, "saddr !=", self._cidr_match())

    def _cidr_match(self) -> str:
        if len(self.local_cidrs) == 1:
            return self.local_cidrs[0]
        return "{ " + ", ".join(self.local_cidrs) + " }"

    # -- the fixed part of the table -------------------------------------------

    async def _nodeport_ips(self) -> list[str] | None:
        """The nodeport-ips set's addresses; None: every local address answers (no set)."""
        spec = self.config.nodeport_addresses
        if not spec:
            return None
        if spec == ["primary"]:
            return [self.node_ip] if self.node_ip else []
        nets = [ipaddress.ip_network(c, strict=False) for c in spec if _cidr_family(c) == self.family]
        if any(n.prefixlen == 0 for n in nets):
            return None
        addrs = await self._addresses()
        out = []
        for a in addrs:
            ip = ipaddress.ip_address(a)
            if _ip_family(a) == self.family and not ip.is_loopback and any(ip in n for n in nets):
                out.append(str(ip))
        return sorted(set(out))

    async def _addresses(self) -> list[str]:
        if self._local_addresses is not None:
            res = self._local_addresses()
            if asyncio.iscoroutine(res):
                res = await res
            return list(res)
        return await interface_addresses(self.config.command_prefix)

    async def setup(self, tx: nft.Transaction) -> None:
        ipx, addr = self.ipx, self.addr_type
        tx.add(Table("rules for kube-proxy"))
        if not self._base_reset:
            # once per process: base chains made by an older version may differ (priorities)
            for name, *_ in BASE_CHAINS:
                tx.add(Chain(name))
                tx.delete(Chain(name))
        for name, ctype, hook, prio in BASE_CHAINS:
            tx.add(Chain(name, ctype, hook, prio))
            tx.flush(Chain(name))
        made: set[str] = set()

        def ensure(name: str, comment: str | None = None) -> None:
            if name not in made:
                made.add(name)
                tx.add(Chain(name, comment=comment))
                tx.flush(Chain(name))

        for dst, src, match in JUMP_CHAINS:
            ensure(dst)
            tx.add(Rule(src, nft.concat(match, "jump", dst)))
        for name in (SERVICES_CHAIN, CLUSTER_IPS_CHECK, MASQUERADING_CHAIN):
            ensure(name)

        tx.add(Set(HAIRPIN_SET, f"{addr} . {addr} . inet_proto . inet_service", comment="service hairpin connections"))
        tx.add(Rule(MASQUERADING_CHAIN, f"mark and {self.masquerade_mark} != 0 mark set mark xor "
                                        f"{self.masquerade_mark} masquerade fully-random"))
        tx.add(Rule(MASQUERADING_CHAIN, f"ct status dnat {ipx} saddr . {ipx} daddr . meta l4proto . th dport "
                                        f"@{HAIRPIN_SET} masquerade fully-random"))
        tx.add(Set(CLUSTER_IPS_SET, addr, comment="Active ClusterIPs"))
        tx.add(Rule(CLUSTER_IPS_CHECK, f"{ipx} daddr @{CLUSTER_IPS_SET} reject",
                    "Reject traffic to invalid ports of ClusterIPs"))

        tx.add(Set(NODEPORT_IPS_SET, addr, comment="IPs that accept NodePort traffic"))
        nodeport_ips = await self._nodeport_ips()
        if nodeport_ips is None:
            tx.delete(Set(NODEPORT_IPS_SET))
        else:
            tx.flush(Set(NODEPORT_IPS_SET))
            for ip in nodeport_ips:
                tx.add(Element(NODEPORT_IPS_SET, (ip,)))

        tx.add(Map(NO_ENDPOINT_SERVICES_MAP, f"{addr} . inet_proto . inet_service : verdict",
                   "vmap to drop or reject packets to services with no endpoints"))
        tx.add(Map(NO_ENDPOINT_NODEPORTS_MAP, "inet_proto . inet_service : verdict",
                   "vmap to drop or reject packets to service nodeports with no endpoints"))
        tx.add(Chain(REJECT_CHAIN, comment="helper for @no-endpoint-services / @no-endpoint-nodeports"))
        tx.flush(Chain(REJECT_CHAIN))
        tx.add(Rule(REJECT_CHAIN, "reject"))
        tx.add(Rule(SERVICE_ENDPOINTS_CHECK,
                    f"{ipx} daddr . meta l4proto . th dport vmap @{NO_ENDPOINT_SERVICES_MAP}"))
        if nodeport_ips is None:
            tx.add(Rule(NODEPORT_ENDPOINTS_CHECK,
                        f"{self.no_localhost} meta l4proto . th dport vmap @{NO_ENDPOINT_NODEPORTS_MAP}"))
        else:
            tx.add(Rule(NODEPORT_ENDPOINTS_CHECK, f"{ipx} daddr @{NODEPORT_IPS_SET} meta l4proto . th dport "
                                                  f"vmap @{NO_ENDPOINT_NODEPORTS_MAP}"))

        tx.add(Map(FIREWALL_IPS_MAP, f"{addr} . inet_proto . inet_service : verdict",
                   "destinations that are subject to LoadBalancerSourceRanges"))
        ensure(FIREWALL_CHECK)
        tx.add(Rule(FIREWALL_CHECK, f"{ipx} daddr . meta l4proto . th dport vmap @{FIREWALL_IPS_MAP}"))

        tx.add(Map(SERVICE_IPS_MAP, f"{addr} . inet_proto . inet_service : verdict",
                   "ClusterIP, ExternalIP and LoadBalancer IP traffic"))
        tx.add(Map(SERVICE_NODEPORTS_MAP, "inet_proto . inet_service : verdict", "NodePort traffic"))
        if self.config.masquerade_all:
            tx.add(Rule(SERVICES_CHAIN, f"{ipx} daddr @{CLUSTER_IPS_SET} {self.masquerade_rule}",
                        "masquerade all clusterIP traffic"))
        elif self.local_cidrs:
            tx.add(Rule(SERVICES_CHAIN, nft.concat(f"{ipx} daddr @{CLUSTER_IPS_SET}", self._if_not_local(),
                                                   self.masquerade_rule),
                        "masquerade clusterIP traffic from outside cluster"))
        tx.add(Rule(SERVICES_CHAIN, f"{ipx} daddr . meta l4proto . th dport vmap @{SERVICE_IPS_MAP}"))
        if nodeport_ips is None:
            tx.add(Rule(SERVICES_CHAIN, f"fib daddr type local {self.no_localhost} meta l4proto . th dport "
                                        f"vmap @{SERVICE_NODEPORTS_MAP}"))
        else:
            tx.add(Rule(SERVICES_CHAIN, f"{ipx} daddr @{NODEPORT_IPS_SET} meta l4proto . th dport "
                                        f"vmap @{SERVICE_NODEPORTS_MAP}"))
        # a full sync rewrites every element: flush what the table holds
        for c in CONTAINERS:
            if c in _MAPS:
                tx.flush(Map(c))
            else:
                tx.flush(Set(c))

    # -- sync ------------------------------------------------------------------

    async def sync(self) -> bool:
        """One sync; True when the table now holds what the informers said."""
        async with self._lock:
            return await self._sync()

    async def _sync(self) -> bool:
        if not self.initialized:
            return True
        start = self.clock()
        full = self._need_full or start - self._last_full > self.config.full_sync_period
        changed: set[tuple[str, str]] = set()
        dirty, self._dirty = self._dirty, set()
        for key in dirty:
            new = self.compute(key)
            if new is None:
                if self._rules.pop(key, None) is not None:
                    changed.add(key)
            elif self._rules.get(key) != new:
                self._rules[key] = new
                changed.add(key)
        if not full and not changed and not self._stale_chains:
            return True

        if self._stale_chains:
            await self._delete_stale_chains(start)

        try:
            tx = self.nft.transaction()
            if full:
                existing = await self.nft.list_table()
                await self.setup(tx)
                applied = {c: {} for c in CONTAINERS}
                applied_chains = {c for c in existing.chains if is_service_chain(c)}
                applied_affinity = {s for s in existing.sets if s.startswith(AFFINITY_PREFIX)}
            else:
                applied = {c: dict(v) for c, v in self._applied.items()}
                applied_chains = set(self._applied_chains)
                applied_affinity = set(self._applied_affinity)

            active_chains: set[str] = set()
            active_affinity: set[str] = set()
            desired: dict[str, dict[tuple[str, ...], Element]] = {c: {} for c in CONTAINERS}
            for key, rules in self._rules.items():
                active_chains.update(rules.chains)
                active_affinity.update(s.name for s in rules.affinity_sets)
                for e in rules.elements:
                    desired[e.container].setdefault(e.key, e)
                if not (full or key in changed):
                    continue
                for s in rules.affinity_sets:
                    tx.add(s)
                for name in rules.chains:  # chains first: rules and elements refer to them
                    tx.add(Chain(name))
                    tx.flush(Chain(name))
                for name, chain_rules in rules.chains.items():
                    for r in chain_rules:
                        tx.add(r)

            for c in CONTAINERS:
                have, want = applied[c], desired[c]
                for k, e in list(have.items()):
                    if k not in want or want[k].value != e.value:
                        tx.delete(Element(c, k, is_map=e.is_map))
                        del have[k]
                for k, e in want.items():
                    if k not in have:
                        tx.add(e)
                        have[k] = e

            stale_now = applied_chains - active_chains
            for name in sorted(stale_now):
                tx.flush(Chain(name))
            for name in sorted(applied_affinity - active_affinity):
                tx.delete(Set(name))

            await self.nft.run(tx)
        except Exception as err:  # noqa: BLE001 - nft failed: the next sync is a full one
            self.last_error = str(err)
            self._need_full = True
            self._dirty |= changed | dirty
            self._stale_chains.clear()
            log.error("nftables sync (%s) failed: %s", self.family, err)
            return False

        self.last_error = None
        self._applied = applied
        self._applied_chains = active_chains | stale_now
        self._applied_affinity = active_affinity
        for name in stale_now:
            self._stale_chains.setdefault(name, start)
        for name in active_chains:
            self._stale_chains.pop(name, None)
        if self._stale_chains:
            self.runner.retry_after(1.0)  # delete them once the kernel let go of them
        if full:
            self._need_full = False
            self._last_full = start
            self._base_reset = True
        result = SyncResult(full, changed if not full else set(self._rules), self.clock() - start, len(tx))
        self.syncs.append(result)
        del self.syncs[:-1000]
        self.synced.set()
        log.debug("nftables sync (%s, %s): %d services changed, %d operations, %.3fs", self.family,
                  "full" if full else "partial", len(changed), len(tx), result.duration)
        for cb in list(self.on_sync):
            cb(result)
        return True

    async def _delete_stale_chains(self, now: float) -> None:
        due = [c for c, t in self._stale_chains.items() if now - t >= 1.0]
        if not due:
            return
        tx = self.nft.transaction()
        for c in sorted(due):
            tx.delete(Chain(c))
        for c in due:
            del self._stale_chains[c]
        try:
            await self.nft.run(tx)
            self._applied_chains.difference_update(due)
        except Exception as err:  # noqa: BLE001 - they come back as stale on the full sync
            log.error("deleting stale nftables chains failed: %s", err)
            self._need_full = True

    async def cleanup(self) -> bool:
        """Delete the table (False when it was not there)."""
        return await self.nft.delete_table()


def _ip_family(ip: str) -> str:
    try:
        return "ipv6" if ipaddress.ip_address(ip).version == 6 else "ipv4"
    except ValueError:
        return ""


def _cidr_family(cidr: str) -> str:
    try:
        return "ipv6" if ipaddress.ip_network(cidr, strict=False).version == 6 else "ipv4"
    except ValueError:
        return ""


async def interface_addresses(command_prefix: Sequence[str] = ()) -> list[str]:
    """Every address of every interface (``ip -j addr``, behind ``command_prefix``)."""
    import json

    proc = await asyncio.create_subprocess_exec(*command_prefix, "ip", "-j", "addr", "show",
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"ip addr: {err.decode(errors='replace').strip()}")
    return [a["local"] for link in json.loads(out or b"[]") for a in link.get("addr_info", []) if a.get("local")]
