"""A node and its pods in network namespaces, for the Service proxy's tests.

(Not a conftest.py: other integration tests import their conftest by name.
The tests here import the fixture from this module.)

``topology`` makes, for the test module:

* a network namespace ``node`` with a bridge (the pods' gateway, ``10.77.0.1/24``
  and ``fd00:77::1/64``)
  and a second interface (``192.168.77.1/24``, the default route), forwarding on;
* three pod namespaces ``pod1``..``pod3`` (``10.77.0.11``..``13``, ``fd00:77::11``..``13``), each a veth
  on the bridge (in hairpin mode, as the bridge CNI plugin sets it up), each running ``busybox httpd`` on port 80 that answers its
  pod's name.

Everything (httpd processes, namespaces and with them their links and
nftables tables) is removed afterwards, also when a test fails. The host's
own network and ruleset are never touched.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import subprocess
from dataclasses import dataclass, field

import pytest

BUSYBOX = shutil.which("busybox") or "/bin/busybox"
BRIDGE_IP = "10.77.0.1"
BRIDGE_IP6 = "fd00:77::1"
EXT_IP = "192.168.77.1"
_SERIAL = itertools.count()


def _sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


@dataclass
class Topology:
    node: str
    pods: dict[str, str] = field(default_factory=dict)  # pod -> IPv4 address
    pods6: dict[str, str] = field(default_factory=dict)  # pod -> IPv6 address
    node_ips: tuple[str, ...] = (BRIDGE_IP, EXT_IP)

    @property
    def prefix(self) -> list[str]:
        """Runs a command in the node's namespace."""
        return ["ip", "netns", "exec", self.node]

    def pod_ns(self, pod: str) -> str:
        return f"{self.node}-{pod}"

    async def run(self, netns: str, *args: str, timeout: float = 10.0) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec("ip", "netns", "exec", netns, *args,
                                                    stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.STDOUT)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        return proc.returncode, out.decode(errors="replace").strip()

    async def get(self, url: str, *, source: str | None = None, timeout: float = 10.0) -> tuple[int, str]:
        """``wget -qO- url`` from the node's namespace, or from pod ``source``'s."""
        netns = self.node if source is None else self.pod_ns(source)
        # (no -T: this busybox's wget crashes with it; run() times out instead)
        return await self.run(netns, BUSYBOX, "wget", "-qO-", url, timeout=timeout)

    async def nft(self, *args: str) -> tuple[int, str]:
        return await self.run(self.node, "nft", *args)


@pytest.fixture(scope="module")
def topology(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.fail("the proxy's network tests need root (network namespaces, nftables)")
    tag = f"kpx{os.getpid() % 100000}-{next(_SERIAL)}"
    topo = Topology(node=tag)
    made: list[str] = []
    procs: list[subprocess.Popen] = []
    docroot = str(tmp_path_factory.mktemp("www"))
    try:
        _sh("ip", "netns", "add", topo.node)
        made.append(topo.node)
        node = topo.prefix
        _sh(*node, "ip", "link", "set", "lo", "up")
        _sh(*node, "ip", "link", "add", "br0", "type", "bridge")
        _sh(*node, "ip", "addr", "add", f"{BRIDGE_IP}/24", "dev", "br0")
        _sh(*node, "ip", "-6", "addr", "add", f"{BRIDGE_IP6}/64", "dev", "br0", "nodad")
        _sh(*node, "ip", "link", "set", "br0", "up")
        # a second address and the default route: one end of a veth pair (no dummy driver everywhere)
        _sh(*node, "ip", "link", "add", "ext0", "type", "veth", "peer", "name", "ext1")
        _sh(*node, "ip", "addr", "add", f"{EXT_IP}/24", "dev", "ext0")
        _sh(*node, "ip", "link", "set", "ext1", "up")
        _sh(*node, "ip", "link", "set", "ext0", "up")
        _sh(*node, "ip", "route", "add", "default", "dev", "ext0")
        _sh(*node, "ip", "-6", "route", "add", "default", "dev", "ext0")
        _sh(*node, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
        for i in (1, 2, 3):
            pod = f"pod{i}"
            ns = topo.pod_ns(pod)
            ip = f"10.77.0.{10 + i}"
            _sh("ip", "netns", "add", ns)
            made.append(ns)
            # the veth is made in the node's namespace, one end then moved into the pod's
            _sh(*node, "ip", "link", "add", f"veth{i}", "type", "veth", "peer", "name", "eth0")
            _sh(*node, "ip", "link", "set", "eth0", "netns", ns)
            _sh(*node, "ip", "link", "set", f"veth{i}", "master", "br0")
            # as the bridge CNI plugin's hairpinMode (kubeplane's configuration): a frame may leave
            # by the port it came in on, which a pod reaching itself through a Service needs
            _sh(*node, "ip", "link", "set", f"veth{i}", "type", "bridge_slave", "hairpin", "on")
            _sh(*node, "ip", "link", "set", f"veth{i}", "up")
            pod_cmd = ["ip", "netns", "exec", ns]
            _sh(*pod_cmd, "ip", "link", "set", "lo", "up")
            _sh(*pod_cmd, "ip", "addr", "add", f"{ip}/24", "dev", "eth0")
            _sh(*pod_cmd, "ip", "link", "set", "eth0", "up")
            _sh(*pod_cmd, "ip", "route", "add", "default", "via", BRIDGE_IP)
            ip6 = f"fd00:77::{10 + i}"
            _sh(*pod_cmd, "ip", "-6", "addr", "add", f"{ip6}/64", "dev", "eth0", "nodad")
            _sh(*pod_cmd, "ip", "-6", "route", "add", "default", "via", BRIDGE_IP6)
            topo.pods6[pod] = ip6
            root = os.path.join(docroot, pod)
            os.makedirs(root, exist_ok=True)
            with open(os.path.join(root, "index.html"), "w") as f:
                f.write(pod + "\n")
            os.makedirs(os.path.join(root, "cgi-bin"))
            with open(os.path.join(root, "cgi-bin", "client"), "w") as f:  # the client's address, as seen
                f.write('#!/bin/sh\nprintf "Content-Type: text/plain\\r\\n\\r\\n%s\\n" "$REMOTE_ADDR"\n')
            os.chmod(os.path.join(root, "cgi-bin", "client"), 0o755)
            procs.append(subprocess.Popen([*pod_cmd, BUSYBOX, "httpd", "-f", "-p", "80", "-h", root],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            topo.pods[pod] = ip
        yield topo
    finally:
        for p in procs:
            p.kill()
            p.wait()
        for ns in reversed(made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(docroot, ignore_errors=True)
