"""The pod network across nodes: a route to every other node's pod CIDR.

Host-gateway routing, as flannel's host-gw backend and kubenet with a cloud
route controller do it: for every other Node with a pod CIDR and an
InternalIP, the node holds ``ip route <podCIDR> via <InternalIP>``, so a pod
reaches a pod on another node by its IP, with no NAT and no tunnel (the nodes
share a link). The routes carry their own protocol number
(:data:`ROUTE_PROTOCOL`), which is how the node finds the routes it made
after a restart and removes those of Nodes that are gone.

Traffic from the pods to anything outside the cluster's pod CIDRs is
masqueraded behind the node's address (an nftables table of the node's, :func:`nat_table`),
as the bridge plugin's ``ipMasq`` would, but without NAT between pods of
different nodes.

The node lists and watches every Node, which the Node authorizer alone does
not let a kubelet do (it may read only its own): the bootstrap policy's
``kubeplane:node-network`` role, bound to ``system:nodes``, allows list and
watch (not get) of Nodes for this.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from typing import Any, Awaitable, Callable, Sequence

from kubeplane.api.resources import resource
from kubeplane.client.interface import Client, Obj

log = logging.getLogger(__name__)

NODES = resource("nodes")
#: the routing protocol number of the routes the node makes (an unassigned one, "K")
ROUTE_PROTOCOL = 75
#: the nftables tables (families ip and ip6) holding the pods' masquerade rule are
#: named after the node (nodes sharing a network namespace, as in tests, keep theirs apart)
NAT_TABLE_PREFIX = "kubeplane-nat-"


def nat_table(node_name: str) -> str:
    import hashlib

    return NAT_TABLE_PREFIX + hashlib.sha256(node_name.encode()).hexdigest()[:10]

#: what ``ip route`` says of a gateway not on any link of the node
_UNREACHABLE = "Nexthop has invalid gateway"
#: runs a command (argv, optional stdin); returns (exit code, stdout, stderr)
Runner = Callable[[Sequence[str], bytes | None], Awaitable[tuple[int, str, str]]]


async def run_command(argv: Sequence[str], stdin: bytes | None = None, *, timeout: float = 30.0) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        return -1, "", f"{argv[0]} did not finish in {timeout:.0f}s"
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


def node_pod_cidrs(node: Obj) -> list[str]:
    spec = node.get("spec") or {}
    cidrs = list(spec.get("podCIDRs") or [])
    if not cidrs and spec.get("podCIDR"):
        cidrs = [spec["podCIDR"]]
    out = []
    for c in cidrs:
        try:
            out.append(str(ipaddress.ip_network(c, strict=False)))
        except ValueError:
            continue
    return out


def node_internal_ips(node: Obj) -> list[str]:
    ips = []
    for a in (node.get("status") or {}).get("addresses") or []:
        if a.get("type") == "InternalIP":
            try:
                ips.append(str(ipaddress.ip_address(a.get("address", ""))))
            except ValueError:
                continue
    return ips


def desired_routes(nodes: Sequence[Obj], self_name: str) -> dict[str, str]:
    """``{pod CIDR: gateway}`` for every other node: each CIDR through the node's
    InternalIP of the same family."""
    routes: dict[str, str] = {}
    for node in nodes:
        if (node.get("metadata") or {}).get("name") == self_name:
            continue
        ips = node_internal_ips(node)
        for cidr in node_pod_cidrs(node):
            version = ipaddress.ip_network(cidr).version
            gw = next((ip for ip in ips if ipaddress.ip_address(ip).version == version), None)
            if gw is not None:
                routes[cidr] = gw
    return routes


def cluster_cidrs(nodes: Sequence[Obj]) -> list[str]:
    """Every node's pod CIDRs, this node's included: what pods reach without NAT."""
    return sorted({c for n in nodes for c in node_pod_cidrs(n)})


def nat_ruleset(own: Sequence[str], cluster: Sequence[str], table: str) -> str:
    """The masquerade table for traffic from this node's pods to outside the pod
    network: one transaction that replaces the table whole."""
    lines = []
    for family, version in (("ip", 4), ("ip6", 6)):
        mine = [c for c in own if ipaddress.ip_network(c).version == version]
        allc = [c for c in cluster if ipaddress.ip_network(c).version == version]
        addr = "ip" if version == 4 else "ip6"
        lines.append(f"table {family} {table} {{}}")
        lines.append(f"delete table {family} {table}")
        if not mine:
            continue
        lines.append(f"table {family} {table} {{")
        lines.append("  set pod-cidrs {")
        lines.append(f"    type {'ipv4_addr' if version == 4 else 'ipv6_addr'}; flags interval;")
        lines.append(f"    elements = {{ {', '.join(allc)} }}")
        lines.append("  }")
        lines.append("  chain postrouting {")
        lines.append("    type nat hook postrouting priority srcnat; policy accept;")
        lines.append(f"    {addr} saddr {{ {', '.join(mine)} }} {addr} daddr != @pod-cidrs masquerade")
        lines.append("  }")
        lines.append("}")
    return "\n".join(lines) + "\n"


def parse_routes(text: str) -> dict[str, str]:
    """``ip route show proto N`` output → ``{destination: gateway}``."""
    routes = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "via":
            routes[parts[0]] = parts[2]
    return routes


class PodRoutes:
    """Keeps this node's routes to the other nodes' pod CIDRs, and the pods'
    masquerade, from the Node objects (an informer on every Node)."""

    def __init__(self, client: Client, node_name: str, *, runner: Runner | None = None,
                 resync_period: float = 60.0) -> None:
        self.client = client
        self.node_name = node_name
        self.nat_table = nat_table(node_name)
        self.run: Runner = runner or run_command
        self.resync_period = resync_period
        self._informer: Any = None
        self._task: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._nat = ""          # the ruleset last applied
        self.synced = asyncio.Event()
        self.errors = 0
        self._unreachable: set[tuple[str, str]] = set()

    async def start(self) -> None:
        from kubeplane.client.informer import SharedInformer

        self._informer = SharedInformer(self.client, NODES)
        self._informer.add_event_handler(lambda o: self._wake.set(), lambda o, n: self._wake.set(),
                                         lambda o: self._wake.set())
        self._informer.start()
        self._task = asyncio.create_task(self._loop(), name=f"pod-routes:{self.node_name}")

    async def stop(self, *, clean: bool = True) -> None:
        from kubeplane.runtime import cancel_and_wait

        await cancel_and_wait([self._task], "pod routes loop")
        self._task = None
        if self._informer is not None:
            await self._informer.stop()
            self._informer = None
        if clean:
            await self.cleanup()

    async def cleanup(self) -> None:
        """Remove every route and the table this node made."""
        for family in ("-4", "-6"):
            await self.run(["ip", family, "route", "flush", "proto", str(ROUTE_PROTOCOL)], None)
        await self.run(["nft", "-f", "-"], nat_ruleset([], [], self.nat_table).encode())
        self._nat = ""

    async def _loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.resync_period)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            if self._informer is None or not self._informer.has_synced():
                await asyncio.sleep(0.05)
                self._wake.set()
                continue
            try:
                await self.sync(self._informer.indexer.list())
                self.synced.set()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - keep routing; retry on the next change or resync
                self.errors += 1
                log.warning("node %s: syncing pod routes: %s", self.node_name, err)
                await asyncio.sleep(1.0)
                self._wake.set()

    async def current_routes(self) -> dict[str, str]:
        routes: dict[str, str] = {}
        for family in ("-4", "-6"):
            rc, out, err = await self.run(["ip", family, "route", "show", "proto", str(ROUTE_PROTOCOL)], None)
            if rc != 0:
                raise RuntimeError(f"ip route show: {err.strip()}")
            routes.update(parse_routes(out))
        return routes

    async def sync(self, nodes: Sequence[Obj]) -> None:
        want = desired_routes(nodes, self.node_name)
        have = await self.current_routes()
        failed = []
        for cidr, gw in sorted(want.items()):
            if have.get(cidr) == gw:
                continue
            if ipaddress.ip_address(gw).is_loopback:
                continue  # nodes sharing a host's loopback (tests): their bridges are local already
            family = "-6" if ":" in cidr else "-4"
            # "add" for a new one: a route to the same prefix that is not this node's (a
            # connected bridge, another network's) is left alone
            verb = "replace" if cidr in have else "add"
            rc, _, err = await self.run(["ip", family, "route", verb, cidr, "via", gw,
                                         "proto", str(ROUTE_PROTOCOL)], None)
            if rc != 0 and "File exists" in err:
                if (cidr, gw) not in self._unreachable:
                    self._unreachable.add((cidr, gw))
                    log.info("node %s: no route to pod CIDR %s via %s: another route to it exists",
                             self.node_name, cidr, gw)
            elif rc != 0 and _UNREACHABLE in err:
                # host-gw routing needs the nodes on one link: a node this one cannot
                # reach directly (another network, a simulated node) gets no route
                if (cidr, gw) not in self._unreachable:
                    self._unreachable.add((cidr, gw))
                    log.info("node %s: no route to pod CIDR %s: %s is not on a link of this node",
                             self.node_name, cidr, gw)
            elif rc != 0:
                failed.append(f"{cidr} via {gw}: {err.strip()}")
        for cidr in sorted(set(have) - set(want)):
            family = "-6" if ":" in cidr else "-4"
            await self.run(["ip", family, "route", "del", cidr, "proto", str(ROUTE_PROTOCOL)], None)
        own = next((node_pod_cidrs(n) for n in nodes if (n.get("metadata") or {}).get("name") == self.node_name), [])
        nat = nat_ruleset(own, cluster_cidrs(nodes), self.nat_table)
        if nat != self._nat:
            rc, _, err = await self.run(["nft", "-f", "-"], nat.encode())
            if rc != 0:
                raise RuntimeError(f"nft: {err.strip()}")
            self._nat = nat
        if failed:
            raise RuntimeError("routes not added: " + "; ".join(failed))


__all__ = ["NAT_TABLE_PREFIX", "PodRoutes", "ROUTE_PROTOCOL", "cluster_cidrs", "desired_routes", "nat_ruleset", "nat_table",
           "node_internal_ips", "node_pod_cidrs", "parse_routes", "run_command"]
