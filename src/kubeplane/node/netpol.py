"""NetworkPolicy enforcement on a node, in nftables.

The node reads every NetworkPolicy, Pod and Namespace (informers) and, for each
pod of its own with an IP, works out what the policies let in and out
(:func:`compute`), as the NetworkPolicy API defines it:

* a pod is isolated for ingress (egress) when a policy of its namespace
  selects it whose policy types hold Ingress (Egress); without ``policyTypes``
  a policy is of type Ingress, and of type Egress too when it has egress rules;
* an isolated pod's allowed traffic is the union of the rules of every
  policy selecting it for that direction; an isolated pod with no rule allows
  nothing (default deny);
* a rule matches its peers (``from``/``to``; empty or missing: any address) and
  its ports (empty or missing: any protocol and port); a peer is the pods of
  the policy's namespace matching ``podSelector``, every pod of the namespaces
  matching ``namespaceSelector``, the matching pods of the matching namespaces
  when both are given, or an ``ipBlock`` (its CIDR without its ``except``);
* a port is a number (up to ``endPort`` when given) or a name, resolved on the
  destination pod's container ports of that name and protocol (TCP when not
  given): the pod itself for ingress, each peer pod for egress (an address
  that is not a pod has no named port);
* replies of allowed connections pass (conntrack), as does the traffic
  between a pod and its own node: the node's own traffic to its pods and theirs
  to it never reaches the forward hook, which is the only one filtered.

The choices NetworkPolicy leaves to implementations: ``ipBlock`` matches the
address a packet has whatever it is, a pod's included (pod traffic is not
NATed between pods here, so a pod's IP is what the rule sees, as with Calico
and kube-router); host-network pods are neither selected nor selectable by
pod selectors (their address is their node's); connections established before
a policy changes keep going (conntrack lets their packets through).

The rules (:func:`ruleset`) go into the node's own table, ``inet
kubeplane-netpol-<hash of the node name>``: a ``forward`` chain, after any
destination NAT (which happens in prerouting: a Service's traffic is filtered
with the endpoint's address and port), first lets established and related
packets through, then sends a packet from an egress-isolated local pod to that
pod's egress chain and one to an ingress-isolated local pod to its ingress
chain (verdict maps keyed by the pod's IP). Those chains return for what a rule
allows and drop the rest, so a packet between two pods of the node passes the
source's egress and then the destination's ingress. Pods on the same bridge
are seen there because bridged IP traffic goes through the IP hooks
(``net.bridge.bridge-nf-call-iptables``, which the controller turns on).

Changes are applied in one ``nft -f -`` transaction that touches only the
chains and map elements that changed; the whole table is written again at the
start and every resync period, and removed when the controller stops.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from kubeplane.api.resources import resource
from kubeplane.api.selectors import LabelSelector, label_selector_from_dict
from kubeplane.client.interface import Client, Obj
from kubeplane.node.routes import Runner, run_command

log = logging.getLogger(__name__)

NETWORK_POLICIES = resource("networkpolicies", "networking.k8s.io")
PODS = resource("pods")
NAMESPACES = resource("namespaces")

TABLE_PREFIX = "kubeplane-netpol-"
INGRESS = "Ingress"
EGRESS = "Egress"
PROTOCOLS = ("TCP", "UDP", "SCTP")
#: failed writes are retried, backing off up to this many seconds
RETRY_MAX = 30.0
#: the sysctls that make bridged IP traffic (pod to pod on one bridge) go through the IP hooks
BRIDGE_SYSCTLS = ("net.bridge.bridge-nf-call-iptables", "net.bridge.bridge-nf-call-ip6tables")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
#: addresses first..last (as integers) of IP version 4 or 6: (version, first, last)
Span = tuple[int, int, int]


def table_name(node_name: str) -> str:
    """The node's table: named after the node, so nodes sharing a network namespace keep theirs apart."""
    return TABLE_PREFIX + hashlib.sha256(node_name.encode()).hexdigest()[:10]


# ------------------------------------------------------------------ the rules


@dataclass(frozen=True, order=True)
class PortRange:
    """A protocol's destination ports ``first``..``last``."""

    protocol: str  # TCP, UDP, SCTP
    first: int = 0
    last: int = 65535

    @property
    def all_ports(self) -> bool:
        return self.first <= 1 and self.last >= 65535


@dataclass(frozen=True)
class Allow:
    """What one rule lets through: packets with a peer address in ``peers``
    (sorted, disjoint spans; None: any) and a protocol and destination port in
    ``ports`` (None: any protocol, any port)."""

    peers: tuple[Span, ...] | None = None
    ports: tuple[PortRange, ...] | None = None

    def matches(self, peer: str, protocol: str, port: int | None) -> bool:
        if self.peers is not None:
            ip = ipaddress.ip_address(peer)
            n = int(ip)
            if not any(v == ip.version and first <= n <= last for v, first, last in self.peers):
                return False
        if self.ports is None:
            return True
        return port is not None and any(p.protocol == protocol and p.first <= port <= p.last for p in self.ports)


@dataclass
class LocalPod:
    """A pod of this node and what it may receive and send: ``ingress`` or
    ``egress`` None when the pod is not isolated that way, else its rules (an
    empty tuple: nothing is allowed)."""

    key: str
    ips: tuple[str, ...]
    ingress: tuple[Allow, ...] | None = None
    egress: tuple[Allow, ...] | None = None
    policies: tuple[str, ...] = ()

    def allows(self, direction: str, peer: str, protocol: str = "TCP", port: int | None = None) -> bool:
        """Whether a new connection of ``protocol`` to ``port`` from (ingress)
        or to (egress) ``peer`` passes this pod's side of the policies."""
        rules = self.ingress if direction == INGRESS else self.egress
        return rules is None or any(a.matches(peer, protocol, port) for a in rules)


def _meta(obj: Obj) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _labels(obj: Obj) -> Mapping[str, str]:
    return _meta(obj).get("labels") or {}


def pod_ips(pod: Obj) -> tuple[str, ...]:
    """The pod's IPs (``status.podIPs``, else ``status.podIP``), valid ones only."""
    status = pod.get("status") or {}
    raw = [p.get("ip") for p in status.get("podIPs") or [] if isinstance(p, dict)]
    if not raw and status.get("podIP"):
        raw = [status["podIP"]]
    out = []
    for ip in raw:
        try:
            out.append(str(ipaddress.ip_address(ip)))
        except (TypeError, ValueError):
            continue
    return tuple(dict.fromkeys(out))


def _networked(pod: Obj) -> bool:
    """A pod with IPs of its own on the pod network, not finished."""
    spec = pod.get("spec") or {}
    if spec.get("hostNetwork"):
        return False
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    return bool(pod_ips(pod))


def policy_types(policy: Obj) -> set[str]:
    """``spec.policyTypes``, or its default: Ingress, and Egress when the policy has egress rules."""
    spec = policy.get("spec") or {}
    given = spec.get("policyTypes")
    if given:
        return {t for t in given if t in (INGRESS, EGRESS)}
    return {INGRESS, EGRESS} if spec.get("egress") else {INGRESS}


def _selector(sel: Any) -> LabelSelector:
    """A required selector: missing is the empty one (every object), as Go's zero value."""
    try:
        return label_selector_from_dict(sel if isinstance(sel, dict) else {})
    except Exception:  # noqa: BLE001 - an invalid selector (validation refuses them) selects nothing
        return label_selector_from_dict(None)


def _optional_selector(sel: Any) -> LabelSelector | None:
    if sel is None:
        return None
    return _selector(sel)


def ip_block(block: Mapping[str, Any]) -> list[Network]:
    """An ipBlock's addresses: its CIDR without the CIDRs of ``except``."""
    try:
        nets: list[Network] = [ipaddress.ip_network(block.get("cidr", ""), strict=False)]
    except (TypeError, ValueError):
        return []
    for raw in block.get("except") or []:
        try:
            ex = ipaddress.ip_network(raw, strict=False)
        except (TypeError, ValueError):
            continue
        out: list[Network] = []
        for n in nets:
            if n.version != ex.version or not n.overlaps(ex):
                out.append(n)
            elif ex.supernet_of(n):  # type: ignore[arg-type]
                continue
            else:
                out.extend(n.address_exclude(ex))  # type: ignore[arg-type]
        nets = out
    return nets


def net_span(net: Network) -> Span:
    return net.version, int(net.network_address), int(net.broadcast_address)


def ip_span(ip: str) -> Span:
    addr = ipaddress.ip_address(ip)
    return addr.version, int(addr), int(addr)


def merge_spans(spans: Iterable[Span]) -> tuple[Span, ...]:
    """Sorted, disjoint spans, overlapping and adjacent ones merged (IPv4 first)."""
    out: list[Span] = []
    for v, first, last in sorted(spans):
        if out and out[-1][0] == v and first <= out[-1][2] + 1:
            if last > out[-1][2]:
                out[-1] = (v, out[-1][1], last)
        else:
            out.append((v, first, last))
    return tuple(out)


def collapse(nets: Iterable[Network]) -> tuple[Span, ...]:
    """Networks as sorted, disjoint, merged spans."""
    return merge_spans(net_span(n) for n in nets)


def merge_ports(ports: Iterable[PortRange]) -> tuple[PortRange, ...]:
    """Per protocol, overlapping or adjacent ranges merged."""
    out: list[PortRange] = []
    for p in sorted(set(ports)):
        last = out[-1] if out else None
        if last is not None and last.protocol == p.protocol and p.first <= last.last + 1:
            out[-1] = PortRange(p.protocol, last.first, max(last.last, p.last))
        else:
            out.append(p)
    return tuple(out)


def container_ports(pod: Obj) -> list[Mapping[str, Any]]:
    """The ports of the pod's containers (sidecars included, restartPolicy Always init containers)."""
    spec = pod.get("spec") or {}
    containers = list(spec.get("containers") or [])
    containers += [c for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"]
    return [p for c in containers for p in c.get("ports") or [] if isinstance(p, dict)]


def resolve_named_port(pod: Obj, name: str, protocol: str) -> int | None:
    for p in container_ports(pod):
        if p.get("name") == name and (p.get("protocol") or "TCP") == protocol:
            try:
                return int(p["containerPort"])
            except (KeyError, TypeError, ValueError):
                return None
    return None


@dataclass
class _Ports:
    """A rule's ports: numbered ones, and named ones (name, protocol) to resolve on the destination."""

    any: bool
    numbered: list[PortRange] = field(default_factory=list)
    named: list[tuple[str, str]] = field(default_factory=list)


def _rule_ports(rule: Mapping[str, Any]) -> _Ports:
    ports = rule.get("ports") or []
    if not ports:
        return _Ports(any=True)
    out = _Ports(any=False)
    for p in ports:
        protocol = p.get("protocol") or "TCP"
        if protocol not in PROTOCOLS:
            continue
        port = p.get("port")
        if port is None:
            out.numbered.append(PortRange(protocol))
        elif isinstance(port, str) and not port.isdigit():
            out.named.append((port, protocol))
        else:
            try:
                first = int(port)
                last = int(p["endPort"]) if p.get("endPort") is not None else first
            except (TypeError, ValueError):
                continue
            if last >= first:
                out.numbered.append(PortRange(protocol, first, last))
    return out


class _Cluster:
    """The pods and namespaces a computation reads, indexed."""

    def __init__(self, pods: Sequence[Obj], namespaces: Sequence[Obj]) -> None:
        self.pods = [p for p in pods if _networked(p)]
        #: each pod's addresses as spans (by id: pods are not hashable)
        self.spans: dict[int, list[Span]] = {id(p): [ip_span(ip) for ip in pod_ips(p)] for p in self.pods}
        self.by_ns: dict[str, list[Obj]] = {}
        for p in self.pods:
            self.by_ns.setdefault(_meta(p).get("namespace") or "", []).append(p)
        self.ns_labels: dict[str, Mapping[str, str]] = {
            _meta(n).get("name") or "": _labels(n) for n in namespaces}
        #: what a rule resolves to whatever pod it is for, once per computation
        self._memo: dict[tuple[str, int], Any] = {}
        self._peers: dict[tuple[str, str], list[Obj]] = {}

    def once(self, what: str, rule: Mapping[str, Any], fn: Any) -> Any:
        key = (what, id(rule))  # the rule objects outlive the computation
        if key not in self._memo:
            self._memo[key] = fn()
        return self._memo[key]

    def labels_of_namespace(self, ns: str) -> Mapping[str, str]:
        # a namespace not (yet) known has at least the label the API server gives every namespace
        return self.ns_labels.get(ns) or {"kubernetes.io/metadata.name": ns}

    def pod_spans(self, pods: Iterable[Obj]) -> list[Span]:
        return [sp for p in pods for sp in self.spans[id(p)]]

    def peer_pods(self, peer: Mapping[str, Any], policy_ns: str) -> list[Obj]:
        """The pods a pod peer (podSelector, namespaceSelector or both) selects, once per
        computation for peers alike (a namespaceSelector's whatever the policy's namespace)."""
        key = (json.dumps(peer, sort_keys=True), policy_ns if peer.get("namespaceSelector") is None else "")
        found = self._peers.get(key)
        if found is None:
            found = self._peers[key] = self._peer_pods(peer, policy_ns)
        return found

    def _peer_pods(self, peer: Mapping[str, Any], policy_ns: str) -> list[Obj]:
        pod_sel = _optional_selector(peer.get("podSelector"))
        ns_sel = _optional_selector(peer.get("namespaceSelector"))
        if pod_sel is None and ns_sel is None:
            return []
        if ns_sel is None:
            candidates = self.by_ns.get(policy_ns, [])
        else:
            candidates = [p for ns, pods in self.by_ns.items() if ns_sel.matches(self.labels_of_namespace(ns))
                          for p in pods]
        if pod_sel is None:
            return list(candidates)
        return [p for p in candidates if pod_sel.matches(_labels(p))]


def _ingress_peers(rule: Mapping[str, Any], policy_ns: str, cluster: _Cluster) -> tuple[Span, ...] | None:
    peers = rule.get("from") or []
    spans: list[Span] = []
    for peer in peers:
        if peer.get("ipBlock"):
            spans.extend(net_span(n) for n in ip_block(peer["ipBlock"]))
        else:
            spans.extend(cluster.pod_spans(cluster.peer_pods(peer, policy_ns)))
    return merge_spans(spans) if peers else None


def _ingress_allows(rule: Mapping[str, Any], pod: Obj, policy_ns: str, cluster: _Cluster) -> list[Allow]:
    peer_nets = cluster.once("from", rule, lambda: _ingress_peers(rule, policy_ns, cluster))
    if peer_nets == ():
        return []
    ports = _rule_ports(rule)
    if ports.any:
        return [Allow(peer_nets, None)]
    ranges = list(ports.numbered)
    for name, protocol in ports.named:  # named on the destination: this pod
        number = resolve_named_port(pod, name, protocol)
        if number is not None:
            ranges.append(PortRange(protocol, number, number))
    return [Allow(peer_nets, merge_ports(ranges))] if ranges else []


def _egress_allows(rule: Mapping[str, Any], policy_ns: str, cluster: _Cluster) -> list[Allow]:
    peers = rule.get("to") or []
    spans: list[Span] = []
    peer_pods: list[Obj] = []
    for peer in peers:
        if peer.get("ipBlock"):
            spans.extend(net_span(n) for n in ip_block(peer["ipBlock"]))
        else:
            found = cluster.peer_pods(peer, policy_ns)
            peer_pods.extend(found)
            spans.extend(cluster.pod_spans(found))
    peer_nets = merge_spans(spans) if peers else None
    ports = _rule_ports(rule)
    if ports.any:
        return [Allow(peer_nets, None)] if peer_nets != () else []
    out: list[Allow] = []
    if ports.numbered and peer_nets != ():
        out.append(Allow(peer_nets, merge_ports(ports.numbered)))
    if ports.named:
        # named on the destination: each peer pod (every pod when the rule names no peer)
        dests = peer_pods if peers else cluster.pods
        by_port: dict[PortRange, list[Span]] = {}
        for pod in dests:
            for name, protocol in ports.named:
                number = resolve_named_port(pod, name, protocol)
                if number is not None:
                    by_port.setdefault(PortRange(protocol, number, number), []).extend(cluster.spans[id(pod)])
        for port, found in sorted(by_port.items()):
            out.append(Allow(merge_spans(found), (port,)))
    return out


def compute(policies: Sequence[Obj], pods: Sequence[Obj], namespaces: Sequence[Obj],
            node_name: str) -> dict[str, LocalPod]:
    """For every pod of ``node_name`` on the pod network: its isolation and allowed traffic."""
    cluster = _Cluster(pods, namespaces)
    by_ns: dict[str, list[Obj]] = {}
    for pol in policies:
        by_ns.setdefault(_meta(pol).get("namespace") or "", []).append(pol)
    for pols in by_ns.values():
        pols.sort(key=lambda p: _meta(p).get("name") or "")
    out: dict[str, LocalPod] = {}
    for pod in cluster.pods:
        if (pod.get("spec") or {}).get("nodeName") != node_name:
            continue
        ns = _meta(pod).get("namespace") or ""
        key = f"{ns}/{_meta(pod).get('name') or ''}"
        local = LocalPod(key, pod_ips(pod))
        ingress: list[Allow] | None = None
        egress: list[Allow] | None = None
        names = []
        for pol in by_ns.get(ns, []):
            spec = pol.get("spec") or {}
            if not _selector(spec.get("podSelector")).matches(_labels(pod)):
                continue
            names.append(_meta(pol).get("name") or "")
            types = policy_types(pol)
            if INGRESS in types:
                ingress = ingress if ingress is not None else []
                for rule in spec.get("ingress") or []:
                    ingress.extend(_ingress_allows(rule, pod, ns, cluster))
            if EGRESS in types:
                egress = egress if egress is not None else []
                for rule in spec.get("egress") or []:
                    egress.extend(cluster.once("egress", rule, lambda: _egress_allows(rule, ns, cluster)))
        local.ingress = _dedup(ingress)
        local.egress = _dedup(egress)
        local.policies = tuple(names)
        out[key] = local
    return out


def _dedup(allows: list[Allow] | None) -> tuple[Allow, ...] | None:
    if allows is None:
        return None
    if any(a.peers is None and a.ports is None for a in allows):
        return (Allow(),)  # one rule allows everything
    return tuple(dict.fromkeys(allows))


# ------------------------------------------------------------------ nftables


def _addr(span: Span) -> str:
    """A span in nft's words: an address, a network, or a range."""
    v, first, last = span
    make = ipaddress.IPv4Address if v == 4 else ipaddress.IPv6Address
    if first == last:
        return str(make(first))
    size = last - first + 1
    if size & (size - 1) == 0 and first % size == 0:
        bits = 32 if v == 4 else 128
        return f"{make(first)}/{bits - size.bit_length() + 1}"
    return f"{make(first)}-{make(last)}"


def _port_clause(ranges: Sequence[PortRange]) -> str:
    protocol = ranges[0].protocol.lower()
    if any(r.all_ports for r in ranges):
        return f"meta l4proto {protocol}"
    items = ", ".join(str(r.first) if r.first == r.last else f"{r.first}-{r.last}" for r in ranges)
    return f"meta l4proto {protocol} th dport {{ {items} }}"


def allow_rules(allow: Allow, direction: str) -> list[str]:
    """The nft rules (``... return``) of one Allow in a pod's chain."""
    where = "saddr" if direction == INGRESS else "daddr"
    if allow.peers is None:
        addrs = [""]
    else:
        addrs = []
        for family, version in (("ip", 4), ("ip6", 6)):
            nets = [_addr(sp) for sp in allow.peers if sp[0] == version]
            if nets:
                addrs.append(f"{family} {where} {{ {', '.join(nets)} }}")
    if allow.ports is None:
        ports = [""]
    else:
        ports = [_port_clause([p for p in allow.ports if p.protocol == proto])
                 for proto in PROTOCOLS if any(p.protocol == proto for p in allow.ports)]
    return [" ".join(part for part in (a, p, "return") if part) for a in addrs for p in ports]


def chain_name(direction: str, key: str) -> str:
    return ("in-" if direction == INGRESS else "out-") + hashlib.sha256(key.encode()).hexdigest()[:16]


@dataclass
class Ruleset:
    """The node's table as data: each pod chain's rules and each verdict map's
    elements (``{pod IP: chain}``)."""

    chains: dict[str, tuple[str, ...]] = field(default_factory=dict)
    maps: dict[str, dict[str, str]] = field(default_factory=dict)


MAPS = {("ingress", 4): ("ingress4", "ipv4_addr"), ("ingress", 6): ("ingress6", "ipv6_addr"),
        ("egress", 4): ("egress4", "ipv4_addr"), ("egress", 6): ("egress6", "ipv6_addr")}


def ruleset(local: Mapping[str, LocalPod]) -> Ruleset:
    rs = Ruleset(maps={name: {} for name, _ in MAPS.values()})
    rendered: dict[tuple[Allow, str], list[str]] = {}  # pods selected alike share their rules
    for key in sorted(local):
        pod = local[key]
        for direction, rules, which in ((INGRESS, pod.ingress, "ingress"), (EGRESS, pod.egress, "egress")):
            if rules is None:
                continue
            name = chain_name(direction, key)
            body = []
            for a in rules:
                if (a, direction) not in rendered:
                    rendered[(a, direction)] = allow_rules(a, direction)
                body.extend(rendered[(a, direction)])
            rs.chains[name] = tuple(dict.fromkeys(body)) + ("counter drop",)
            for ip in pod.ips:
                version = ipaddress.ip_address(ip).version
                rs.maps[MAPS[(which, version)][0]][ip] = name
    return rs


def _forward_chain() -> list[str]:
    return [
        "  chain forward {",
        "    type filter hook forward priority filter; policy accept;",
        "    ct state established,related accept",
        "    ip saddr vmap @egress4",
        "    ip6 saddr vmap @egress6",
        "    ip daddr vmap @ingress4",
        "    ip6 daddr vmap @ingress6",
        "  }",
    ]


def full_ruleset(rs: Ruleset, table: str) -> str:
    """One transaction replacing the table whole."""
    lines = [f"table inet {table} {{}}", f"delete table inet {table}", f"table inet {table} {{"]
    for name, addr_type in MAPS.values():
        lines.append(f"  map {name} {{")
        lines.append(f"    type {addr_type} : verdict;")
        elements = rs.maps.get(name) or {}
        if elements:
            lines.append("    elements = { " + ", ".join(f"{ip} : jump {c}" for ip, c in sorted(elements.items())) + " }")
        lines.append("  }")
    for name, body in sorted(rs.chains.items()):
        lines.append(f"  chain {name} {{")
        lines.extend(f"    {rule}" for rule in body)
        lines.append("  }")
    lines.extend(_forward_chain())
    lines.append("}")
    return "\n".join(lines) + "\n"


def delete_ruleset(table: str) -> str:
    return f"table inet {table} {{}}\ndelete table inet {table}\n"


def incremental_ruleset(old: Ruleset, new: Ruleset, table: str) -> str:
    """One transaction turning ``old`` into ``new``: new and changed chains
    (re)written, map elements moved, chains no longer used deleted. Empty when
    nothing changed."""
    lines: list[str] = []
    for name, body in sorted(new.chains.items()):
        if old.chains.get(name) == body:
            continue
        lines.append(f"add chain inet {table} {name}" if name not in old.chains
                     else f"flush chain inet {table} {name}")
        lines.extend(f"add rule inet {table} {name} {rule}" for rule in body)
    for name in sorted(new.maps):
        before, after = old.maps.get(name) or {}, new.maps[name]
        gone = sorted(ip for ip, c in before.items() if after.get(ip) != c)
        added = sorted(ip for ip, c in after.items() if before.get(ip) != c)
        if gone:
            lines.append(f"delete element inet {table} {name} {{ {', '.join(gone)} }}")
        if added:
            lines.append(f"add element inet {table} {name} {{ "
                         + ", ".join(f"{ip} : jump {after[ip]}" for ip in added) + " }")
    for name in sorted(set(old.chains) - set(new.chains)):
        lines.append(f"delete chain inet {table} {name}")
    return "\n".join(lines) + "\n" if lines else ""


# ------------------------------------------------------------------ controller


class NetworkPolicyController:
    """Keeps this node's NetworkPolicy table from the NetworkPolicies, Pods and
    Namespaces of the cluster.

    ``runner`` runs ``nft`` and ``sysctl`` (tests run them in a network
    namespace); ``min_interval`` bounds how often changes are applied (events
    in between are applied together), ``resync_period`` how long the table may
    go without being written whole."""

    def __init__(self, client: Client, node_name: str, *, runner: Runner | None = None,
                 resync_period: float = 60.0, min_interval: float = 0.2) -> None:
        self.client = client
        self.node_name = node_name
        self.table = table_name(node_name)
        self.run: Runner = runner or run_command
        self.resync_period = resync_period
        self.min_interval = min_interval
        self._informers: dict[str, Any] = {}
        self._task: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._applied: Ruleset | None = None
        self._last_full = 0.0
        self.synced = asyncio.Event()
        self.errors = 0
        self.syncs = 0
        #: the last computation (pod key -> LocalPod), for status and debugging
        self.local: dict[str, LocalPod] = {}

    async def start(self) -> None:
        from kubeplane.client.informer import SharedInformer

        await self._bridge_sysctls()
        for kind, res in (("networkpolicies", NETWORK_POLICIES), ("pods", PODS), ("namespaces", NAMESPACES)):
            inf = SharedInformer(self.client, res)
            inf.add_event_handler(self._changed, lambda o, n: self._changed(n), self._changed)
            inf.start()
            self._informers[kind] = inf
        self._task = asyncio.create_task(self._loop(), name=f"network-policy:{self.node_name}")

    def _changed(self, obj: Obj) -> None:
        self._wake.set()

    async def _bridge_sysctls(self) -> None:
        for name in BRIDGE_SYSCTLS:
            try:
                rc, out, _ = await self.run(["sysctl", "-n", name], None)
                if rc == 0 and out.strip() == "1":
                    continue
                rc, _, err = await self.run(["sysctl", "-qw", f"{name}=1"], None)
            except OSError as exc:  # no sysctl command
                rc, err = 1, str(exc)
            if rc != 0:
                log.warning("node %s: cannot set %s (pods of one bridge are not filtered between them): %s",
                            self.node_name, name, err.strip())

    async def stop(self, *, clean: bool = True) -> None:
        from kubeplane.runtime import cancel_and_wait

        await cancel_and_wait([self._task], "network policy loop")
        self._task = None
        informers, self._informers = self._informers, {}
        for inf in informers.values():
            await inf.stop()
        if clean:
            await self.cleanup()

    async def cleanup(self) -> None:
        """Remove the node's table."""
        await self.run(["nft", "-f", "-"], delete_ruleset(self.table).encode())
        self._applied = None

    def _ready(self) -> bool:
        return bool(self._informers) and all(inf.has_synced() for inf in self._informers.values())

    async def _loop(self) -> None:
        failures, last_error = 0, ""
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.resync_period)
            except asyncio.TimeoutError:
                pass
            if not self._ready():
                await asyncio.sleep(0.05)
                self._wake.set()
                continue
            await asyncio.sleep(self.min_interval)  # events close together are applied together
            self._wake.clear()
            try:
                await self.sync()
                self.synced.set()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - keep the last rules; retry, backing off
                self.errors += 1
                failures += 1
                self._applied = None  # the next attempt writes the table whole
                if str(err) != last_error:  # the same failure again is not logged again
                    last_error = str(err)
                    log.warning("node %s: applying network policies: %s", self.node_name, err)
                await asyncio.sleep(min(RETRY_MAX, 0.5 * 2 ** min(failures, 10)))
                self._wake.set()
            else:
                if last_error:
                    log.info("node %s: network policies applied again", self.node_name)
                failures, last_error = 0, ""

    async def sync(self) -> None:
        inf = self._informers
        # on snapshots of the stores (their objects are replaced, never changed), off the event loop
        policies, pods, namespaces = (inf[k].indexer.list() for k in ("networkpolicies", "pods", "namespaces"))

        def work() -> tuple[dict[str, LocalPod], Ruleset]:
            local = compute(policies, pods, namespaces, self.node_name)
            return local, ruleset(local)

        self.local, rs = await asyncio.to_thread(work)
        await self.apply(rs)

    async def apply(self, rs: Ruleset) -> None:
        now = time.monotonic()
        full = self._applied is None or now - self._last_full >= self.resync_period
        text = full_ruleset(rs, self.table) if full else incremental_ruleset(self._applied, rs, self.table)
        if text:
            rc, _, err = await self.run(["nft", "-f", "-"], text.encode())
            if rc != 0 and not full:  # the table changed under us: write it whole
                text, full = full_ruleset(rs, self.table), True
                rc, _, err = await self.run(["nft", "-f", "-"], text.encode())
            if rc != 0:
                raise RuntimeError(f"nft: {err.strip()}")
            self.syncs += 1
        if full:
            self._last_full = now
        self._applied = rs


__all__ = ["Allow", "EGRESS", "INGRESS", "LocalPod", "NetworkPolicyController", "PortRange", "Ruleset", "TABLE_PREFIX",
           "allow_rules", "chain_name", "compute", "delete_ruleset", "full_ruleset", "incremental_ruleset", "ip_block",
           "policy_types", "resolve_named_port", "ruleset", "table_name"]
