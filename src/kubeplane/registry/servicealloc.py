"""Service ClusterIP and NodePort allocation, after upstream's
``pkg/registry/core/service`` (ipallocator, portallocator, storage/alloc.go).

The API server hands every Service that needs one a ClusterIP from
``--service-cluster-ip-range`` and, for NodePort and LoadBalancer Services, a
node port from ``--service-node-port-range``. A requested value is reserved
if it is free and in range; otherwise the create fails with upstream's
field error (``spec.clusterIPs``, ``spec.ports[i].nodePort``). Values are
picked at random from the upper part of each range first (as upstream's
allocators with an offset do), leaving the low band to values clients ask for
by number, such as the ``kubernetes`` Service's first address.

The allocation state is the set of values the stored Services hold: it is
read from the store on the first allocation and kept by the registry's writes
(create, update, delete), each of which returns a :class:`Transaction` that
is committed when the write is stored and reverted when it fails. One API
server owns a store, so the state lives in its memory.
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
from dataclasses import dataclass, field
from typing import Any

from kubeplane.api import errors

Obj = dict[str, Any]

#: kubeplane's default ``--service-cluster-ip-range`` (kubeadm's; upstream's
#: kube-apiserver has 10.0.0.0/24, which kubeplane's simulated nodes use)
DEFAULT_SERVICE_CIDR = "10.96.0.0/12"
#: upstream's default ``--service-node-port-range``
DEFAULT_NODE_PORT_RANGE = "30000-32767"
#: the largest service range upstream accepts: 20 host bits
MAX_CIDR_BITS = 20

ERR_FULL = "range is full"
ERR_IP_ALLOCATED = "provided IP is already allocated"
ERR_PORT_ALLOCATED = "provided port is already allocated"


class AllocationError(Exception):
    """A value that cannot be reserved; ``str()`` is upstream's error text."""


class RangeFull(AllocationError):
    def __init__(self) -> None:
        super().__init__(ERR_FULL)


# ------------------------------------------------------------------- flags


def parse_service_cidr(text: str, flag: str = "--service-cluster-ip-range") -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """The service range of the flag's value: one CIDR, at most 20 host bits."""
    value = (text or "").strip()
    if not value:
        raise ValueError(f"{flag} must not be empty")
    parts = [p.strip() for p in value.split(",")]
    if len(parts) > 2:
        raise ValueError(f"{flag} must not contain more than two entries")
    if len(parts) == 2:
        raise ValueError(f"{flag}: kubeplane serves one IP family; give a single CIDR, not {value!r}")
    try:
        net = ipaddress.ip_network(parts[0], strict=False)
    except ValueError:
        raise ValueError(f"{flag}: {parts[0]!r} is not a valid CIDR (e.g. 10.96.0.0/12 or fd00:10:96::/112)") from None
    bits = net.max_prefixlen
    if bits - net.prefixlen > MAX_CIDR_BITS:
        raise ValueError(f"specified {flag} is too large; for {bits}-bit addresses, the mask must be >= "
                         f"{bits - MAX_CIDR_BITS}")
    if net.num_addresses < 4 if net.version == 4 else net.num_addresses < 2:
        raise ValueError(f"specified {flag} is too small: {net} leaves no address to allocate")
    return net


@dataclass(frozen=True, slots=True)
class PortRange:
    base: int
    size: int

    @property
    def last(self) -> int:
        return self.base + self.size - 1

    def __contains__(self, port: int) -> bool:
        return self.base <= port <= self.last

    def __str__(self) -> str:
        # upstream's PortRange.String(): "base-last" ("" for an empty range)
        return f"{self.base}-{self.last}" if self.size else ""


def parse_port_range(text: str) -> PortRange:
    """``30000-32767``, ``30000+2767`` or a single port (upstream's
    ``utilnet.ParsePortRange``), with its error wording."""
    value = (text or "").strip()
    if not value:
        raise ValueError("unable to parse port range: empty string")
    try:
        if "-" in value:
            low_s, high_s = value.split("-", 1)
            low, high = int(low_s), int(high_s)
            if high < low:
                raise ValueError(f"end port is less than start port: {value}")
            base, size = low, high - low + 1
        elif "+" in value:
            low_s, off_s = value.split("+", 1)
            base, off = int(low_s), int(off_s)
            if off < 0:
                raise ValueError(f"negative offset in port range: {value}")
            size = off + 1
        else:
            base, size = int(value), 1
    except ValueError as exc:
        msg = str(exc)
        if msg.startswith("invalid literal"):
            msg = f"unable to parse port range: {value}"
        raise ValueError(msg) from None
    if base < 1 or base + size - 1 > 65535:
        raise ValueError(f"port range {value} must be within 1-65535")
    return PortRange(base, size)


# -------------------------------------------------------------- allocators


def _offset(size: int, lo: int, hi: int, step: int) -> int:
    """min(max(lo, size/step), hi), 0 for ranges not larger than ``lo``
    (upstream's calculateRangeOffset of both allocators)."""
    if size <= lo:
        return 0
    return min(max(lo, size // step), hi)


class _Band:
    """Offsets ``0..max-1`` of a range; :meth:`next_free` prefers the upper
    band ``offset..max-1`` (a random start, scanning forward) over the lower."""

    def __init__(self, size: int, offset: int, rng: random.Random) -> None:
        self.max = size
        self.offset = offset
        self.used: set[int] = set()
        self._rng = rng

    def next_free(self) -> int:
        for lo, hi in ((self.offset, self.max), (0, self.offset)):
            n = hi - lo
            if n <= 0:
                continue
            start = self._rng.randrange(n)
            for i in range(n):
                cand = lo + (start + i) % n
                if cand not in self.used:
                    return cand
        raise RangeFull()


class IPAllocator:
    """Addresses of one service CIDR: the network address (and the broadcast
    address of an IPv4 range) are never handed out."""

    def __init__(self, cidr: ipaddress.IPv4Network | ipaddress.IPv6Network, rng: random.Random) -> None:
        self.cidr = cidr
        self.first = int(cidr.network_address) + 1
        size = cidr.num_addresses - (2 if cidr.version == 4 else 1)
        self._band = _Band(max(size, 0), _offset(cidr.num_addresses, 16, 256, 16), rng)

    def _index(self, ip: str) -> int:
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            raise AllocationError(f"failed to parse IP {ip!r}") from None
        i = int(addr) - self.first
        if addr.version != self.cidr.version or not 0 <= i < self._band.max:
            raise AllocationError(f"the provided IP ({addr}) is not in the valid range. The range of valid IPs "
                                  f"is {self.cidr}")
        return i

    def contains(self, ip: str) -> bool:
        try:
            self._index(ip)
        except AllocationError:
            return False
        return True

    def allocate(self, ip: str) -> None:
        i = self._index(ip)
        if i in self._band.used:
            raise AllocationError(ERR_IP_ALLOCATED)
        self._band.used.add(i)

    def allocate_next(self) -> str:
        i = self._band.next_free()
        self._band.used.add(i)
        return str(ipaddress.ip_address(self.first + i))

    def release(self, ip: str) -> None:
        try:
            self._band.used.discard(self._index(ip))
        except AllocationError:
            pass

    def has(self, ip: str) -> bool:
        try:
            return self._index(ip) in self._band.used
        except AllocationError:
            return False

    @property
    def used(self) -> int:
        return len(self._band.used)


class PortAllocator:
    """Ports of the node port range."""

    def __init__(self, ports: PortRange, rng: random.Random) -> None:
        self.range = ports
        self._band = _Band(ports.size, _offset(ports.size, 16, 128, 32), rng)

    def allocate(self, port: int) -> None:
        if port not in self.range:
            raise AllocationError(f"provided port is not in the valid range. The range of valid ports is {self.range}")
        i = port - self.range.base
        if i in self._band.used:
            raise AllocationError(ERR_PORT_ALLOCATED)
        self._band.used.add(i)

    def allocate_next(self) -> int:
        i = self._band.next_free()
        self._band.used.add(i)
        return self.range.base + i

    def release(self, port: int) -> None:
        if port in self.range:
            self._band.used.discard(port - self.range.base)

    def has(self, port: int) -> bool:
        return port in self.range and (port - self.range.base) in self._band.used

    @property
    def used(self) -> int:
        return len(self._band.used)


# ------------------------------------------------------------ transactions


@dataclass
class Transaction:
    """What one write reserved (undone by :meth:`revert`) and what it gives
    back once stored (freed by :meth:`commit`)."""

    allocated_ips: list[str] = field(default_factory=list)
    allocated_ports: list[int] = field(default_factory=list)
    release_ips: list[str] = field(default_factory=list)
    release_ports: list[int] = field(default_factory=list)
    owner: "ServiceAllocators | None" = None
    done: bool = False

    def commit(self) -> None:
        if self.done or self.owner is None:
            return
        self.done = True
        for ip in self.release_ips:
            self.owner.ips.release(ip)
        for port in self.release_ports:
            self.owner.ports.release(port)

    def revert(self) -> None:
        if self.done or self.owner is None:
            return
        self.done = True
        for ip in self.allocated_ips:
            self.owner.ips.release(ip)
        for port in self.allocated_ports:
            self.owner.ports.release(port)


# ------------------------------------------------------------- the service


def _spec(svc: Obj) -> Obj:
    spec = svc.get("spec")
    return spec if isinstance(spec, dict) else {}


def _name(svc: Obj) -> str:
    md = svc.get("metadata")
    return str((md or {}).get("name") or "") if isinstance(md, dict) else ""


def service_type(svc: Obj) -> str:
    return str(_spec(svc).get("type") or "ClusterIP")


def needs_cluster_ip(svc: Obj) -> bool:
    return service_type(svc) != "ExternalName"


def needs_node_port(svc: Obj) -> bool:
    return service_type(svc) in ("NodePort", "LoadBalancer")


def needs_health_check_node_port(svc: Obj) -> bool:
    spec = _spec(svc)
    return service_type(svc) == "LoadBalancer" and spec.get("externalTrafficPolicy") == "Local"


def should_allocate_node_ports(svc: Obj) -> bool:
    """NodePort Services always; LoadBalancers unless allocateLoadBalancerNodePorts is false."""
    if service_type(svc) == "NodePort":
        return True
    return service_type(svc) == "LoadBalancer" and _spec(svc).get("allocateLoadBalancerNodePorts") is not False


def _ports(svc: Obj) -> list[Obj]:
    return [p for p in _spec(svc).get("ports") or [] if isinstance(p, dict)]


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def cluster_ips(svc: Obj) -> list[str]:
    spec = _spec(svc)
    ips = [ip for ip in spec.get("clusterIPs") or [] if isinstance(ip, str) and ip and ip != "None"]
    if not ips and isinstance(spec.get("clusterIP"), str) and spec["clusterIP"] not in ("", "None"):
        ips = [spec["clusterIP"]]
    return ips


def node_ports(svc: Obj) -> list[int]:
    """Every node port the Service holds (ports, then the health check port)."""
    out = [_int(p.get("nodePort")) for p in _ports(svc) if _int(p.get("nodePort"))]
    hc = _int(_spec(svc).get("healthCheckNodePort"))
    if hc:
        out.append(hc)
    return out


# ------------------------------------------- before validation (strategy)


def normalize_cluster_ips(new: Obj, old: Obj | None) -> None:
    """Keep ``clusterIP`` and ``clusterIPs[0]`` in step (upstream's
    normalizeClusterIPs): the one given fills the other, and on update a
    cleared ``clusterIPs`` follows an unchanged ``clusterIP``."""
    spec = new.get("spec")
    if not isinstance(spec, dict):
        return
    ip, ips = spec.get("clusterIP"), spec.get("clusterIPs")
    if old is not None:
        ospec = _spec(old)
        if ip == ospec.get("clusterIP") and ips in (None, []) and ospec.get("clusterIPs"):
            return  # patchAllocatedValues put it back; nothing to normalize
    if ip and not ips:
        spec["clusterIPs"] = [ip]
    elif not ip and isinstance(ips, list) and ips and isinstance(ips[0], str):
        spec["clusterIP"] = ips[0]


def prepare_service_update(new: Obj, old: Obj) -> None:
    """What upstream does to an updated Service before validation: values the
    client left out keep their allocation (patchAllocatedValues), and the ones
    a type change makes meaningless are dropped when the client did not touch
    them (dropTypeDependentFields), to be released once the update is stored."""
    nspec, ospec = new.get("spec"), _spec(old)
    if not isinstance(nspec, dict):
        return
    # patchAllocatedValues
    if needs_cluster_ip(old) and needs_cluster_ip(new):
        if not nspec.get("clusterIP") and ospec.get("clusterIP"):
            nspec["clusterIP"] = ospec["clusterIP"]
        if not nspec.get("clusterIPs") and ospec.get("clusterIPs"):
            nspec["clusterIPs"] = ospec["clusterIPs"]
    if needs_node_port(old) and needs_node_port(new):
        used = {_int(p.get("nodePort")) for p in _ports(old)} & {_int(p.get("nodePort")) for p in _ports(new)}
        by_name = {p.get("name") or "": _int(p.get("nodePort")) for p in _ports(old)}
        for p in _ports(new):
            if not _int(p.get("nodePort")):
                value = by_name.get(p.get("name") or "", 0)
                if value and value not in used:
                    p["nodePort"] = value
    if needs_health_check_node_port(old) and needs_health_check_node_port(new):
        if not _int(nspec.get("healthCheckNodePort")) and _int(ospec.get("healthCheckNodePort")):
            nspec["healthCheckNodePort"] = ospec["healthCheckNodePort"]
    normalize_cluster_ips(new, old)
    # dropTypeDependentFields
    if needs_cluster_ip(old) and not needs_cluster_ip(new):
        if nspec.get("clusterIP") == ospec.get("clusterIP") and nspec.get("clusterIPs") == ospec.get("clusterIPs"):
            nspec.pop("clusterIP", None)
            nspec.pop("clusterIPs", None)
        if nspec.get("ipFamilies") == ospec.get("ipFamilies"):
            nspec.pop("ipFamilies", None)
        if nspec.get("ipFamilyPolicy") == ospec.get("ipFamilyPolicy"):
            nspec.pop("ipFamilyPolicy", None)
    if needs_node_port(old) and not needs_node_port(new):
        if [_int(p.get("nodePort")) for p in _ports(new)] == [_int(p.get("nodePort")) for p in _ports(old)]:
            for p in _ports(new):
                p.pop("nodePort", None)
    if needs_health_check_node_port(old) and not needs_health_check_node_port(new):
        if _int(nspec.get("healthCheckNodePort")) == _int(ospec.get("healthCheckNodePort")):
            nspec.pop("healthCheckNodePort", None)
    if service_type(old) == "LoadBalancer" and service_type(new) != "LoadBalancer":
        if "allocateLoadBalancerNodePorts" in nspec and \
                nspec.get("allocateLoadBalancerNodePorts") == ospec.get("allocateLoadBalancerNodePorts"):
            nspec.pop("allocateLoadBalancerNodePorts", None)


def _invalid(svc: Obj, path: str, value: Any, detail: str) -> errors.StatusError:
    return errors.invalid("Service", _name(svc), [errors.invalid_value(path, value, detail)])


def internal_error(message: str) -> errors.StatusError:
    """Upstream's NewInternalError."""
    return errors.StatusError(500, "InternalError", f"Internal error occurred: {message}",
                              causes=[errors.Cause("", message, "")])


class ServiceAllocators:
    """The ClusterIP and NodePort allocators of one API server."""

    def __init__(self, store: Any = None, cidr: str = DEFAULT_SERVICE_CIDR,
                 node_port_range: str = DEFAULT_NODE_PORT_RANGE, *, rng: random.Random | None = None,
                 prefix: str = "/registry/core/services/") -> None:
        self.store = store
        rng = rng or random.Random()
        self.ips = IPAllocator(parse_service_cidr(cidr), rng)
        self.ports = PortAllocator(parse_port_range(node_port_range), rng)
        self._prefix = prefix
        self._loaded = store is None
        self._lock: asyncio.Lock | None = None

    @property
    def cidr(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        return self.ips.cidr

    @property
    def kubernetes_service_ip(self) -> str:
        """The first address of the range: the ``kubernetes`` Service's."""
        return str(ipaddress.ip_address(self.ips.first))

    async def ensure_loaded(self) -> None:
        """Mark what the stored Services hold (once, before the first allocation)."""
        if self._loaded:
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._loaded:
                return
            result = await self.store.list(self._prefix)
            for kv in result.items:
                self._mark(kv.value)
            self._loaded = True

    def _mark(self, svc: Obj) -> None:
        for ip in cluster_ips(svc):
            if self.ips.contains(ip):
                try:
                    self.ips.allocate(ip)
                except AllocationError:
                    pass  # two stored Services share an address: keep it reserved once
        for port in node_ports(svc):
            if port in self.ports.range:
                try:
                    self.ports.allocate(port)
                except AllocationError:
                    pass

    # -- create ------------------------------------------------------------

    async def allocate_create(self, svc: Obj) -> Transaction:
        await self.ensure_loaded()
        txn = Transaction(owner=self)
        try:
            if needs_cluster_ip(svc):
                self._alloc_cluster_ip(svc, txn)
            if needs_node_port(svc):
                self._alloc_node_ports(svc, txn, set())
            if needs_health_check_node_port(svc):
                self._alloc_health_check(svc, txn)
        except BaseException:
            txn.revert()
            raise
        return txn

    def _alloc_cluster_ip(self, svc: Obj, txn: Transaction) -> None:
        spec = _spec(svc)
        requested = spec.get("clusterIP")
        if requested == "None":
            return
        if requested:
            try:
                self.ips.allocate(str(requested))
            except AllocationError as exc:
                raise _invalid(svc, "spec.clusterIPs", spec.get("clusterIPs") or [requested],
                               f"failed to allocate IP {requested}: {exc}") from None
            txn.allocated_ips.append(str(requested))
            spec["clusterIPs"] = [str(requested)]
            return
        try:
            ip = self.ips.allocate_next()
        except RangeFull as exc:
            raise internal_error(f'failed to allocate a serviceIP for Service "{_name(svc)}": {exc}') from None
        txn.allocated_ips.append(ip)
        spec["clusterIP"] = ip
        spec["clusterIPs"] = [ip]

    def _alloc_node_ports(self, svc: Obj, txn: Transaction, keep: set[int]) -> None:
        """Node ports for every port that needs one; ``keep``: ports the
        Service held before (an update), which need no new reservation."""
        ports = _ports(svc)
        by_service_port: dict[Any, int] = {}
        allocate_new = should_allocate_node_ports(svc)
        for i, p in enumerate(ports):
            np = _int(p.get("nodePort"))
            if np == 0 and not allocate_new:
                continue
            svc_port = p.get("port")
            shared = by_service_port.get(svc_port, 0)
            if shared and np in (0, shared):
                # one node port for one service port number, TCP and UDP alike
                p["nodePort"] = shared
                continue
            if np == 0:
                # a later entry of the same port number may ask for a node port by number
                np = next((_int(q.get("nodePort")) for q in ports[i + 1:]
                           if q.get("port") == svc_port and _int(q.get("nodePort"))), 0)
            if np:
                if np not in keep and np not in txn.allocated_ports:
                    try:
                        self.ports.allocate(np)
                    except AllocationError as exc:
                        raise _invalid(svc, f"spec.ports[{i}].nodePort", np, str(exc)) from None
                    txn.allocated_ports.append(np)
            else:
                try:
                    np = self.ports.allocate_next()
                except RangeFull as exc:
                    raise internal_error(f"failed to allocate a nodePort: {exc}") from None
                txn.allocated_ports.append(np)
            p["nodePort"] = np
            by_service_port.setdefault(svc_port, np)

    def _alloc_health_check(self, svc: Obj, txn: Transaction, keep: "set[int] | frozenset[int]" = frozenset()) -> None:
        spec = _spec(svc)
        hc = _int(spec.get("healthCheckNodePort"))
        if hc:
            if hc in keep or hc in txn.allocated_ports:
                return
            try:
                self.ports.allocate(hc)
            except AllocationError as exc:
                raise internal_error(f"failed to allocate requested HealthCheck NodePort {hc}: {exc}") from None
            txn.allocated_ports.append(hc)
            return
        try:
            hc = self.ports.allocate_next()
        except RangeFull as exc:
            raise internal_error(f"failed to allocate a HealthCheck NodePort {hc}: {exc}") from None
        txn.allocated_ports.append(hc)
        spec["healthCheckNodePort"] = hc

    # -- update ------------------------------------------------------------

    async def allocate_update(self, new: Obj, old: Obj) -> Transaction:
        await self.ensure_loaded()
        txn = Transaction(owner=self)
        try:
            old_ips = cluster_ips(old) if needs_cluster_ip(old) else []
            if needs_cluster_ip(new) and not old_ips and _spec(old).get("clusterIP") != "None":
                self._alloc_cluster_ip(new, txn)  # e.g. ExternalName -> ClusterIP
            kept_ips = set(cluster_ips(new)) if needs_cluster_ip(new) else set()
            txn.release_ips = [ip for ip in old_ips if ip not in kept_ips]
            old_ports = set(node_ports(old))
            if needs_node_port(new):
                self._alloc_node_ports(new, txn, old_ports)
            else:
                for p in _ports(new):
                    np = _int(p.get("nodePort"))
                    if np and np not in old_ports:
                        # a type that needs none keeps a node port it asked for; reserve it
                        self._reserve_port(new, p, np, txn)
            if needs_health_check_node_port(new):
                self._alloc_health_check(new, txn, old_ports)
            txn.release_ports = sorted(old_ports - set(node_ports(new)))
        except BaseException:
            txn.revert()
            raise
        return txn

    def _reserve_port(self, svc: Obj, port: Obj, np: int, txn: Transaction) -> None:
        i = _ports(svc).index(port)
        try:
            self.ports.allocate(np)
        except AllocationError as exc:
            raise _invalid(svc, f"spec.ports[{i}].nodePort", np, str(exc)) from None
        txn.allocated_ports.append(np)

    # -- delete ------------------------------------------------------------

    def release(self, svc: Obj) -> None:
        """Free everything a deleted Service held."""
        if not self._loaded:
            return  # the first allocation reads the store, where it is gone
        for ip in cluster_ips(svc):
            self.ips.release(ip)
        for port in node_ports(svc):
            self.ports.release(port)


