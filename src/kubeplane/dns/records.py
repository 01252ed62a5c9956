"""The records of the cluster domain, after the Kubernetes DNS schema
(kubernetes/dns ``docs/specification.md``, version 1.1.0) as CoreDNS's
``kubernetes`` plugin serves it.

Names under the cluster domain (``cluster.local``):

* ``<svc>.<ns>.svc.<zone>``: A/AAAA of a Service's ClusterIPs; for a
  headless Service the addresses of its ready endpoints; for an ExternalName
  Service a CNAME to the external name.
* ``_<port>._<proto>.<svc>.<ns>.svc.<zone>``: SRV of a named port (for a
  headless Service one per ready endpoint, the target being the endpoint's
  name), with the targets' addresses in the additional section.
* ``<hostname>.<svc>.<ns>.svc.<zone>``: the address of an endpoint of the
  Service by its hostname (``hostname`` of the EndpointSlice endpoint, which
  the endpoint controller sets for pods whose ``subdomain`` names the Service,
  else the address with dashes).
* ``<a-b-c-d>.<ns>.pod.<zone>``: a pod's address (CoreDNS's ``pods
  insecure``: any well-formed address; ``verified``: only a pod's of that
  namespace).
* ``dns-version.<zone>``: TXT with the schema version.
* PTR in ``in-addr.arpa``/``ip6.arpa`` of ClusterIPs (the Service's name) and
  of ready endpoint addresses (the endpoint's name).

A name that does not exist is NXDOMAIN; one that exists without records of
the asked type is NODATA (NOERROR, no answer); both carry the zone's SOA in
the authority section. Records have a TTL of 5 seconds by default. Names
match case-insensitively.

The data are the informers' stores (:class:`~kubeplane.client.informer.Indexer`),
which watch events keep current, looked up through indexes this module adds;
nothing is listed per query. An answer is built from at most
:data:`MAX_ENDPOINTS` endpoints, which bounds the work of one query.
"""

from __future__ import annotations

import functools
import ipaddress
import time
from dataclasses import dataclass, field
from typing import Any

import dns.exception
import dns.name
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.reversename
import dns.rrset
from dns.rdtypes.ANY.CNAME import CNAME
from dns.rdtypes.ANY.NS import NS
from dns.rdtypes.ANY.PTR import PTR
from dns.rdtypes.ANY.SOA import SOA
from dns.rdtypes.ANY.TXT import TXT
from dns.rdtypes.IN.A import A
from dns.rdtypes.IN.AAAA import AAAA
from dns.rdtypes.IN.SRV import SRV

from kubeplane.client.informer import Indexer

Obj = dict[str, Any]

#: CoreDNS's kubernetes plugin default TTL
DEFAULT_TTL = 5
#: the version of the DNS schema served (``dns-version.<zone>``)
SCHEMA_VERSION = "1.1.0"
#: endpoints one answer is built from at most
MAX_ENDPOINTS = 1000
#: CoreDNS's SOA timers
SOA_REFRESH, SOA_RETRY, SOA_EXPIRE = 7200, 1800, 86400
#: ``pods`` modes, as CoreDNS's plugin option
POD_MODES = ("insecure", "verified", "disabled")

SERVICE_NAME_LABEL = "kubernetes.io/service-name"

#: index names this module adds to the informers' stores
SLICES_BY_SERVICE = "kubeplane.dns/service"
SLICES_BY_ADDRESS = "kubeplane.dns/address"
SERVICES_BY_CLUSTER_IP = "kubeplane.dns/cluster-ip"
PODS_BY_IP = "kubeplane.dns/pod-ip"

IN = dns.rdataclass.IN
T_A, T_AAAA, T_SRV, T_PTR = dns.rdatatype.A, dns.rdatatype.AAAA, dns.rdatatype.SRV, dns.rdatatype.PTR
T_CNAME, T_TXT, T_SOA, T_NS, T_ANY = (dns.rdatatype.CNAME, dns.rdatatype.TXT, dns.rdatatype.SOA,
                                       dns.rdatatype.NS, dns.rdatatype.ANY)
REVERSE_ZONES = (dns.name.from_text("in-addr.arpa."), dns.name.from_text("ip6.arpa."))


def _norm_ip(text: str) -> str | None:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def slice_service_key(es: Obj) -> str | None:
    """``namespace/service`` of an EndpointSlice (its ``kubernetes.io/service-name`` label)."""
    md = es.get("metadata") or {}
    svc = (md.get("labels") or {}).get(SERVICE_NAME_LABEL)
    return f"{md.get('namespace', '')}/{svc}" if svc else None


def _slices_by_service(es: Obj) -> list[str]:
    key = slice_service_key(es)
    return [key] if key else []


def _slices_by_address(es: Obj) -> list[str]:
    out = set()
    for ep in es.get("endpoints") or []:
        for addr in ep.get("addresses") or []:
            ip = _norm_ip(addr)
            if ip:
                out.add(ip)
    return list(out)


def _services_by_cluster_ip(svc: Obj) -> list[str]:
    spec = svc.get("spec") or {}
    ips = spec.get("clusterIPs") or ([spec["clusterIP"]] if spec.get("clusterIP") else [])
    return [ip for ip in (_norm_ip(i) for i in ips if i and i != "None") if ip]


def _pods_by_ip(pod: Obj) -> list[str]:
    status = pod.get("status") or {}
    ips = [p.get("ip") for p in status.get("podIPs") or []] or [status.get("podIP")]
    return [ip for ip in (_norm_ip(i) for i in ips if i) if ip]


INDEXES = {
    "services": {SERVICES_BY_CLUSTER_IP: _services_by_cluster_ip},
    "endpointslices": {SLICES_BY_SERVICE: _slices_by_service, SLICES_BY_ADDRESS: _slices_by_address},
    "pods": {PODS_BY_IP: _pods_by_ip},
}


def add_indexes(indexer: Indexer, kind: str) -> None:
    """Add this module's indexes for ``kind`` (services, endpointslices, pods) to a store."""
    for name, fn in INDEXES[kind].items():
        try:
            indexer.add_indexers({name: fn})
        except ValueError:
            pass  # a shared store already has it


def endpoint_hostname(ep: Obj, ip: str) -> str:
    """The endpoint's label in DNS: its ``hostname``, else its address with dashes."""
    return (ep.get("hostname") or ip.replace(".", "-").replace(":", "-")).lower()


def dashed_ip(label: str) -> str | None:
    """The address a pod label (``10-0-0-1``, ``fd00--1``) stands for, as CoreDNS parses it."""
    if label.count("-") == 3 and "--" not in label:
        text = label.replace("-", ".")
    else:
        text = label.replace("-", ":")
    return _norm_ip(text)


def _strip_underscore(label: str) -> str:
    return label[1:] if label.startswith("_") else label


@dataclass
class Answer:
    """What the cluster domain says about one question."""

    rcode: int = dns.rcode.NOERROR
    answer: list[dns.rrset.RRset] = field(default_factory=list)
    authority: list[dns.rrset.RRset] = field(default_factory=list)
    additional: list[dns.rrset.RRset] = field(default_factory=list)
    #: an ExternalName's target outside the cluster domain, whose records of
    #: the asked type the server looks up upstream and appends
    chase: dns.name.Name | None = None
    #: ``namespace/service`` when the answer depends only on that Service, its
    #: EndpointSlices and the namespaces (see :meth:`ClusterRecords.depends_on`);
    #: None: on anything
    dep: str | None = None
    #: an in-cluster ExternalName target's records were added
    followed: bool = False


@dataclass(slots=True)
class _Target:
    owner: str  # the record's name, relative to nothing: "<label>.<svc>.<ns>.svc.<zone>."
    ip: str
    port: int  # -1: no port


class ClusterRecords:
    """Answers questions about the cluster domain from the informers' stores.

    ``services`` and ``slices`` are required; without ``namespaces`` every
    namespace is taken to exist; ``pods`` is needed for ``pods="verified"``.
    ``dns_ips`` are the addresses of ``ns.dns.<zone>`` (the kube-dns Service's)."""

    def __init__(self, services: Indexer, slices: Indexer, *, namespaces: Indexer | None = None,
                 pods: Indexer | None = None, zone: str = "cluster.local", ttl: int = DEFAULT_TTL,
                 pod_mode: str = "insecure", dns_ips: list[str] | tuple[str, ...] = ()) -> None:
        if pod_mode not in POD_MODES:
            raise ValueError(f"pods mode {pod_mode!r}: one of {', '.join(POD_MODES)}")
        if pod_mode == "verified" and pods is None:
            raise ValueError("pods verified needs the pods' store")
        self.services = services
        self.slices = slices
        self.namespaces = namespaces
        self.pods = pods
        add_indexes(services, "services")
        add_indexes(slices, "endpointslices")
        if pods is not None:
            add_indexes(pods, "pods")
        self.zone_text = zone.strip(".").lower()
        self.zone = dns.name.from_text(self.zone_text + ".")
        self.ttl = ttl
        self.pod_mode = pod_mode
        self.dns_ips = list(dns_ips)
        self._versions: tuple[int, ...] = ()
        self._serial = int(time.time())

    # -- change tracking

    def version(self) -> tuple[int, ...]:
        """Changes whenever any store the answers come from changed."""
        stores = (self.services, self.slices, self.namespaces, self.pods)
        return tuple(s.version if s is not None else 0 for s in stores) + tuple(self.dns_ips)

    def namespaces_version(self) -> int:
        """Changes whenever a namespace came or went (or changed)."""
        return self.namespaces.version if self.namespaces is not None else 0

    def depends_on(self, dep: str) -> tuple[Any, ...]:
        """The stored objects an answer with ``Answer.dep == dep`` was made
        from: the Service and its EndpointSlices. The stores replace an object
        on every change, so the same objects (by identity) mean the same answer
        (given the same namespaces)."""
        return (self.services.get_by_key(dep), *self.slices.by_index(SLICES_BY_SERVICE, dep))

    def serial(self) -> int:
        """The SOA serial: the time of the last change seen (as CoreDNS's)."""
        v = self.version()
        if v != self._versions:
            self._versions = v
            self._serial = max(self._serial, int(time.time()))
        return self._serial

    # -- entry point

    def in_zone(self, qname: dns.name.Name) -> bool:
        return qname.is_subdomain(self.zone)

    def resolve(self, qname: dns.name.Name, qtype: int) -> Answer | None:
        """The answer, or None when the question is for the upstream resolvers
        (names outside the cluster domain, reverse names of no cluster address)."""
        if qname.is_subdomain(self.zone):
            return self._zone(qname, qtype)
        if qtype == T_PTR and any(qname.is_subdomain(z) for z in REVERSE_ZONES):
            return self._reverse(qname)
        return None

    # -- building blocks

    def _name(self, text: str) -> dns.name.Name:
        return _name_of(text)

    def _rrset(self, name: dns.name.Name, rdatas: list[Any]) -> dns.rrset.RRset:
        return dns.rrset.from_rdata_list(name, self.ttl, rdatas)

    def soa(self) -> dns.rrset.RRset:
        rd = SOA(IN, T_SOA, self._name(f"ns.dns.{self.zone_text}."), self._name(f"hostmaster.{self.zone_text}."),
                 self.serial(), SOA_REFRESH, SOA_RETRY, SOA_EXPIRE, self.ttl)
        return self._rrset(self.zone, [rd])

    def _negative(self, rcode: int) -> Answer:
        return Answer(rcode=rcode, authority=[self.soa()])

    def nxdomain(self) -> Answer:
        return self._negative(dns.rcode.NXDOMAIN)

    def nodata(self) -> Answer:
        return self._negative(dns.rcode.NOERROR)

    def _addresses(self, qname: dns.name.Name, qtype: int, ips: list[str]) -> Answer:
        """A and/or AAAA records of ``ips`` for the question; NODATA when none fits."""
        v4 = [_a(ip) for ip in ips if ":" not in ip]
        v6 = [_aaaa(ip) for ip in ips if ":" in ip]
        out = Answer()
        if qtype in (T_A, T_ANY) and v4:
            out.answer.append(self._rrset(qname, v4))
        if qtype in (T_AAAA, T_ANY) and v6:
            out.answer.append(self._rrset(qname, v6))
        return out if out.answer else self.nodata()

    def _namespace_exists(self, ns: str) -> bool:
        return self.namespaces is None or ns in self.namespaces

    # -- the zone

    def _zone(self, qname: dns.name.Name, qtype: int) -> Answer:
        labels = [label.decode("latin-1").lower() for label in qname.relativize(self.zone).labels]
        if not labels:
            if qtype == T_SOA:
                return Answer(answer=[self.soa()])
            if qtype == T_NS:
                out = Answer(answer=[self._rrset(qname, [NS(IN, T_NS, self._name(f"ns.dns.{self.zone_text}."))])])
                out.additional = self._addresses(self._name(f"ns.dns.{self.zone_text}."), T_ANY,
                                                 self.dns_ips).answer
                return out
            return self.nodata()
        if labels == ["dns-version"]:
            if qtype in (T_TXT, T_ANY):
                return Answer(answer=[self._rrset(qname, [TXT(IN, T_TXT, [SCHEMA_VERSION.encode()])])])
            return self.nodata()
        if labels == ["ns", "dns"]:
            return self._addresses(qname, qtype, self.dns_ips)
        if labels == ["dns"]:
            return self.nodata()
        kind, rest = labels[-1], labels[:-1]
        if kind == "svc":
            return self._service(qname, qtype, rest)
        if kind == "pod":
            return self._pod(qname, qtype, rest)
        return self.nxdomain()

    def _service(self, qname: dns.name.Name, qtype: int, segs: list[str]) -> Answer:
        if not segs:
            return self.nodata()
        ns = segs[-1]
        if not self._namespace_exists(ns):
            return self.nxdomain()
        if len(segs) == 1:
            return self.nodata()
        answer = self._service_of(qname, qtype, ns, segs[-2], segs[:-2])
        if answer.dep is None and answer.chase is None and not answer.followed:
            answer.dep = f"{ns}/{segs[-2]}"
        return answer

    def _service_of(self, qname: dns.name.Name, qtype: int, ns: str, name: str, rest: list[str]) -> Answer:
        endpoint = port = proto = None
        if len(rest) == 1:
            endpoint = rest[0]
        elif len(rest) == 2:
            port, proto = _strip_underscore(rest[0]), _strip_underscore(rest[1])
        elif rest:
            return self.nxdomain()
        svc = self.services.get_by_key(f"{ns}/{name}")
        if svc is None:
            return self.nxdomain()
        spec = svc.get("spec") or {}
        if spec.get("type") == "ExternalName":
            return self._external_name(qname, qtype, spec.get("externalName") or "")
        svc_fqdn = f"{name}.{ns}.svc.{self.zone_text}."
        targets: list[_Target] = []
        found = False
        if spec.get("clusterIP") == "None" or endpoint is not None:
            found = self._endpoint_targets(svc, f"{ns}/{name}", svc_fqdn, endpoint, port, proto, targets)
        else:
            cluster_ips = [ip for ip in (_norm_ip(i) for i in (spec.get("clusterIPs") or [spec.get("clusterIP")])
                                         if i) if ip]
            for p in spec.get("ports") or []:
                if not _port_matches(port, proto, p.get("name") or "", p.get("protocol") or "TCP"):
                    continue
                found = True
                for ip in cluster_ips:
                    targets.append(_Target(svc_fqdn, ip, int(p.get("port") or 0)))
        if not found:
            return self.nxdomain()
        if qtype == T_SRV:
            return self._srv(qname, targets)
        return self._addresses(qname, qtype, _unique(t.ip for t in targets))

    def _endpoint_targets(self, svc: Obj, key: str, svc_fqdn: str, endpoint: str | None, port: str | None,
                          proto: str | None, out: list[_Target]) -> bool:
        publish = bool((svc.get("spec") or {}).get("publishNotReadyAddresses"))
        found = False
        count = 0
        for es in self.slices.by_index(SLICES_BY_SERVICE, key):
            ports = [(p.get("name") or "", p.get("protocol") or "TCP", int(p.get("port") or 0))
                     for p in es.get("ports") or []] or [("", "", -1)]  # CoreDNS's sentinel: no ports
            for ep in es.get("endpoints") or []:
                ready = (ep.get("conditions") or {}).get("ready")
                if ready is False and not publish:
                    continue
                for addr in ep.get("addresses") or []:
                    ip = _norm_ip(addr)
                    if ip is None:
                        continue
                    label = endpoint_hostname(ep, ip)
                    if endpoint is not None and label != endpoint:
                        continue
                    count += 1
                    if count > MAX_ENDPOINTS:
                        return found
                    for pname, pproto, pnum in ports:
                        if pnum >= 0 and not _port_matches(port, proto, pname, pproto):
                            continue
                        if pnum < 0 and port is not None:
                            continue
                        found = True
                        out.append(_Target(f"{label}.{svc_fqdn}", ip, pnum))
        return found

    def _srv(self, qname: dns.name.Name, targets: list[_Target]) -> Answer:
        pairs = _unique((t.owner, t.port) for t in targets if t.port >= 0)
        if not pairs:
            return self.nodata()
        weight = max(1, 100 // len(pairs))
        rds = [SRV(IN, T_SRV, 0, weight, port, self._name(owner)) for owner, port in pairs]
        out = Answer(answer=[self._rrset(qname, rds)])
        by_owner: dict[str, list[str]] = {}
        for t in targets:
            ips = by_owner.setdefault(t.owner, [])
            if t.ip not in ips:
                ips.append(t.ip)
        for owner, ips in by_owner.items():
            out.additional += self._addresses(self._name(owner), T_ANY, ips).answer
        return out

    def _external_name(self, qname: dns.name.Name, qtype: int, external: str) -> Answer:
        try:
            target = dns.name.from_text(external.rstrip(".") + ".")
        except dns.exception.DNSException:
            return self.nxdomain()
        out = Answer(answer=[self._rrset(qname, [CNAME(IN, T_CNAME, target)])])
        if qtype == T_CNAME:
            return out
        if target.is_subdomain(self.zone):
            # an in-cluster target: its records follow (one step, as a loop guard)
            chased = self._zone(target, qtype) if target != qname else Answer()
            if chased.rcode == dns.rcode.NOERROR:
                out.answer += [rr for rr in chased.answer if rr.rdtype != T_CNAME]
            out.followed = True  # the answer depends on the target too
        else:
            out.chase = target
        return out

    def _pod(self, qname: dns.name.Name, qtype: int, segs: list[str]) -> Answer:
        if self.pod_mode == "disabled":
            return self.nxdomain()
        if not segs:
            return self.nodata()
        ns = segs[-1]
        if not self._namespace_exists(ns):
            return self.nxdomain()
        if len(segs) == 1:
            return self.nodata()
        if len(segs) > 2:
            return self.nxdomain()
        ip = dashed_ip(segs[0])
        if ip is None:
            return self.nxdomain()
        if self.pod_mode == "verified" and not self._pod_exists(ns, ip):
            return self.nxdomain()
        return self._addresses(qname, qtype, [ip])

    def _pod_exists(self, ns: str, ip: str) -> bool:
        assert self.pods is not None
        for pod in self.pods.by_index(PODS_BY_IP, ip):
            md = pod.get("metadata") or {}
            if md.get("namespace") == ns and not md.get("deletionTimestamp"):
                return True
        return False

    # -- reverse names

    def _reverse(self, qname: dns.name.Name) -> Answer | None:
        try:
            ip = _norm_ip(dns.reversename.to_address(qname))
        except (dns.exception.DNSException, ValueError):
            return None
        if ip is None:
            return None
        names: list[str] = []
        for svc in self.services.by_index(SERVICES_BY_CLUSTER_IP, ip):
            md = svc.get("metadata") or {}
            names.append(f"{md.get('name')}.{md.get('namespace')}.svc.{self.zone_text}.")
        for es in self.slices.by_index(SLICES_BY_ADDRESS, ip):
            key = slice_service_key(es)
            if key is None:
                continue
            ns, _, svc_name = key.partition("/")
            for ep in es.get("endpoints") or []:
                if (ep.get("conditions") or {}).get("ready") is False:
                    continue
                if any(_norm_ip(a) == ip for a in ep.get("addresses") or []):
                    names.append(f"{endpoint_hostname(ep, ip)}.{svc_name}.{ns}.svc.{self.zone_text}.")
            if len(names) >= MAX_ENDPOINTS:
                break
        names = _unique(names)
        if not names:
            return None
        return Answer(answer=[self._rrset(qname, [PTR(IN, T_PTR, self._name(n)) for n in names])])


@functools.lru_cache(maxsize=65536)
def _a(ip: str) -> A:
    """An A record's data (immutable: the made ones are kept)."""
    return A(IN, T_A, ip)


@functools.lru_cache(maxsize=65536)
def _aaaa(ip: str) -> AAAA:
    return AAAA(IN, T_AAAA, ip)


@functools.lru_cache(maxsize=8192)
def _name_of(text: str) -> dns.name.Name:
    """A name from its text (names are immutable: the parsed ones are kept)."""
    return dns.name.from_text(text)


def _port_matches(port: str | None, proto: str | None, name: str, protocol: str) -> bool:
    """A port query (``_<port>._<proto>``; None: any) against a port's name and protocol."""
    if port is None:
        return True
    return port == name.lower() and proto == protocol.lower()


def _unique(items: Any) -> list[Any]:
    seen: set[Any] = set()
    out = []
    for x in items:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out
