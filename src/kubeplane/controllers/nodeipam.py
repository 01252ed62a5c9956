"""The node IPAM controller with upstream's range allocator
(pkg/controller/nodeipam, ``--allocate-node-cidrs`` with ``--cluster-cidr``).

Each Node gets ``spec.podCIDR`` and ``spec.podCIDRs``: one subnet of
``--node-cidr-mask-size`` bits (IPv4 /24, IPv6 /64 by default) from each
cluster CIDR (one, or an IPv4 and an IPv6 one for dual stack), the next free
one after the last handed out as upstream's cidrset does. Subnets nodes hold
already (set by anyone) are marked used at start and on sight; a deleted
node's are free again. When a cluster CIDR is used up the node gets an event
``CIDRNotAvailable`` and is tried again later.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass, field
from typing import Any, Iterable

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import resource
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.interface import Client, Obj
from kubeplane.controllers.base import Controller, RetryLater

log = logging.getLogger(__name__)

NODES = resource("nodes")
DEFAULT_MASK_V4 = 24
DEFAULT_MASK_V6 = 64
#: upstream's cidrset limit: at most 2^16 node subnets per cluster CIDR
MAX_PREFIX_DIFF = 16

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class CIDRExhausted(Exception):
    pass


@dataclass
class CIDRSet:
    """Upstream's cidrset: the /``mask`` subnets of ``cluster``, as a bitmap."""

    cluster: Network
    mask: int
    used: set[int] = field(default_factory=set)
    next_candidate: int = 0

    def __post_init__(self) -> None:
        if self.mask < self.cluster.prefixlen:
            raise ValueError(f"CIDRSet: node mask size {self.mask} is smaller than the cluster CIDR's "
                             f"({self.cluster.prefixlen}) of {self.cluster}")
        if self.mask - self.cluster.prefixlen > MAX_PREFIX_DIFF:
            raise ValueError(f"CIDRSet: subnet mask size of {self.cluster} too big: the node mask size {self.mask} "
                             f"must be at most {MAX_PREFIX_DIFF} bits larger than the cluster CIDR's")
        self.size = 1 << (self.mask - self.cluster.prefixlen)
        self._step = 1 << (self.cluster.max_prefixlen - self.mask)

    def _subnet(self, index: int) -> Network:
        base = int(self.cluster.network_address) + index * self._step
        return ipaddress.ip_network((base, self.mask))

    def allocate_next(self) -> Network:
        for i in range(self.size):
            index = (self.next_candidate + i) % self.size
            if index not in self.used:
                self.used.add(index)
                self.next_candidate = (index + 1) % self.size
                return self._subnet(index)
        raise CIDRExhausted(f"CIDR allocation failed; there are no remaining CIDRs left to allocate in the accepted "
                            f"range {self.cluster}")

    def _indexes(self, cidr: Network) -> range:
        if cidr.version != self.cluster.version or not (
                cidr.subnet_of(self.cluster) or self.cluster.subnet_of(cidr)):  # type: ignore[arg-type]
            return range(0)
        start = max(int(cidr.network_address), int(self.cluster.network_address))
        end = min(int(cidr.broadcast_address), int(self.cluster.broadcast_address))
        base = int(self.cluster.network_address)
        return range((start - base) // self._step, (end - base) // self._step + 1)

    def occupy(self, cidr: Network) -> None:
        self.used.update(self._indexes(cidr))

    def release(self, cidr: Network) -> None:
        self.used.difference_update(self._indexes(cidr))

    def contains(self, cidr: Network) -> bool:
        return cidr.version == self.cluster.version and cidr.subnet_of(self.cluster)  # type: ignore[arg-type]


def parse_cluster_cidrs(text: str) -> list[Network]:
    """``--cluster-cidr``: one CIDR or two comma-separated (one IPv4, one
    IPv6). ValueError with upstream's wording."""
    cidrs: list[Network] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            cidrs.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise ValueError(f"invalid CIDR address: {part}") from None
    if not cidrs:
        raise ValueError("--cluster-cidr is empty")
    if len(cidrs) > 2:
        raise ValueError("len of clusters is:" + str(len(cidrs)) + " > more than max allowed of 2")
    if len(cidrs) == 2 and cidrs[0].version == cidrs[1].version:
        raise ValueError("err: when configuring dual stack, the cluster CIDRs must be one IPv4 and one IPv6")
    return cidrs


def _node_cidrs(node: Obj) -> list[str]:
    spec = node.get("spec") or {}
    cidrs = [c for c in spec.get("podCIDRs") or [] if isinstance(c, str)]
    if not cidrs and isinstance(spec.get("podCIDR"), str) and spec["podCIDR"]:
        cidrs = [spec["podCIDR"]]
    return cidrs


class NodeIPAMController(Controller):
    """Assigns every node its pod CIDRs (upstream's RangeAllocator)."""

    def __init__(self, client: Client, cluster_cidrs: Iterable[Network], factory: SharedInformerFactory | None = None,
                 *, mask_v4: int = DEFAULT_MASK_V4, mask_v6: int = DEFAULT_MASK_V6,
                 name: str = "node-ipam-controller") -> None:
        super().__init__(name, client, factory)
        self.sets = [CIDRSet(c, mask_v4 if c.version == 4 else mask_v6) for c in cluster_cidrs]
        #: the subnets this controller knows each node holds (to release them on delete)
        self._held: dict[str, list[Network]] = {}
        self.nodes = self.factory.informer_for(NODES)
        self.work = self.add_queue("node", self.sync, base_delay=0.05, max_delay=30.0)
        self.nodes.add_event_handler(self._added, lambda _old, new: self._added(new), self._deleted)

    def _name(self, node: Obj) -> str:
        return (node.get("metadata") or {}).get("name", "")

    def _added(self, node: Obj) -> None:
        name = self._name(node)
        have = _node_cidrs(node)
        if have:
            self._occupy(name, have)
        else:
            self.work.add(name)

    def _deleted(self, node: Obj) -> None:
        name = self._name(node)
        for cidr in self._held.pop(name, []):
            for s in self.sets:
                if s.contains(cidr):
                    s.release(cidr)

    def _occupy(self, name: str, cidrs: list[str]) -> None:
        if name in self._held:
            return
        held: list[Network] = []
        for text in cidrs:
            try:
                cidr = ipaddress.ip_network(text, strict=False)
            except ValueError:
                log.warning("node %s has an invalid pod CIDR %r", name, text)
                continue
            for s in self.sets:
                if s.contains(cidr):
                    s.occupy(cidr)
            held.append(cidr)
        self._held[name] = held

    async def sync(self, name: str) -> None:
        node = self.nodes.indexer.get_by_key(name)
        if node is None or (node.get("metadata") or {}).get("deletionTimestamp"):
            return
        have = _node_cidrs(node)
        if have:
            self._occupy(name, have)
            return
        if name in self._held:  # allocated before, the write not seen yet
            allocated = self._held[name]
        else:
            allocated = []
            try:
                for s in self.sets:
                    allocated.append(s.allocate_next())
            except CIDRExhausted as err:
                for cidr, s in zip(allocated, self.sets):
                    s.release(cidr)
                self.recorder.event(node, "Normal", "CIDRNotAvailable",
                                    f"Node {name} status is now: CIDRNotAvailable")
                log.warning("node %s: failed to allocate cidr from cluster cidr: %s", name, err)
                raise RetryLater(str(err)) from None
            self._held[name] = allocated
        texts = [str(c) for c in allocated]
        try:
            await self.client.patch(NODES, name, {"spec": {"podCIDR": texts[0], "podCIDRs": texts}},
                                    patch_type="strategic")
        except StatusError as err:
            if err.code == 404:
                self._deleted(node)
                return
            if err.code == 422:
                # set meanwhile by someone else: take theirs, free ours
                self._deleted(node)
                raise
            raise
        log.info("set node %s pod CIDRs to %s", name, ", ".join(texts))


def build(client: Client, factory: SharedInformerFactory, opts: Any) -> list[Any]:
    """The controller for :class:`~kubeplane.controllers.manager.ControllerOptions`
    (upstream runs it only with ``--allocate-node-cidrs`` and a ``--cluster-cidr``)."""
    if not getattr(opts, "allocate_node_cidrs", False):
        return []
    if not getattr(opts, "cluster_cidr", ""):
        log.warning("--allocate-node-cidrs is set but no --cluster-cidr: pod CIDRs are not assigned")
        return []
    from kubeplane.startup import StartupError

    try:
        cidrs = parse_cluster_cidrs(opts.cluster_cidr)
    except ValueError as err:
        raise StartupError(f"--cluster-cidr: {err}") from None
    mask_v4 = opts.node_cidr_mask_size_ipv4 or (opts.node_cidr_mask_size if len(cidrs) == 1 and cidrs[0].version == 4
                                                 and opts.node_cidr_mask_size else DEFAULT_MASK_V4)
    mask_v6 = opts.node_cidr_mask_size_ipv6 or (opts.node_cidr_mask_size if len(cidrs) == 1 and cidrs[0].version == 6
                                                 and opts.node_cidr_mask_size else DEFAULT_MASK_V6)
    try:
        return [NodeIPAMController(client, cidrs, factory, mask_v4=mask_v4, mask_v6=mask_v6)]
    except ValueError as err:
        raise StartupError(f"--node-cidr-mask-size: {err}") from None
