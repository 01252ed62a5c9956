"""A real container runtime for the node tests: containerd with its own directories.

The session's containerd, its pods, shims, mounts, bridge and CNI state are
all removed afterwards, also when a test fails; so are the nftables tables and
chains the CNI plugins (portmap, through iptables) made and left.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import threading

import pytest

from kubeplane.node import cni
from kubeplane.node.containerd import ManagedContainerd, shims
from kubeplane.node.images import build_busybox_image, build_pause_image, import_archive

from helpers import node_kubeconfig  # noqa: F401 - the node tests import it from here
from nodetest import BUSYBOX, PAUSE, remove_cgroup_root, own_cgroup_root


def _unique_bridge_and_cidr() -> tuple[str, str]:
    """A bridge name and a /24 no other bridge on this host routes (tests may run side by side)."""
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    start = os.getpid() % 200
    for i in range(200):
        n = (start + i) % 200 + 20
        if f"10.250.{n}." not in routes:
            return f"kpt{os.getpid()}"[:15], f"10.250.{n}.0/24"
    raise RuntimeError("no free 10.250.x.0/24 for the test bridge")


# -- the host's nftables: what the session's pods made is removed at its end ---------

def _nft_ruleset() -> list[dict] | None:
    try:
        r = subprocess.run(["nft", "-j", "list", "ruleset"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    try:
        return json.loads(r.stdout).get("nftables", []) if r.returncode == 0 else None
    except ValueError:
        return None  # an nft without JSON output


def _tables_and_chains(items: list[dict]) -> tuple[set, set]:
    tables = {(x["table"]["family"], x["table"]["name"]) for x in items if "table" in x}
    chains = {(x["chain"]["family"], x["chain"]["table"], x["chain"]["name"]) for x in items if "chain" in x}
    return tables, chains


def _live_sandboxes() -> set[str]:
    """The ids the running containerd shims serve (a pod's shim has its sandbox's id)."""
    return {argv[argv.index(b"-id") + 1].decode() for _pid, argv in shims() if b"-id" in argv[:-1]}


def _remove_leaked_hostport_chains(new_chains: set[str]) -> None:
    """portmap's chains of single pods (CNI-DN-*) made during the session whose pod
    sandbox is gone (its CNI DEL never ran), and the rules that lead to them."""
    for tool in ("iptables", "ip6tables"):
        rules = cni.nat_rules(tool)
        if rules is None:
            continue
        live = _live_sandboxes()
        for chain in {r[1] for r in rules if r[:1] == ["-N"]} & new_chains:
            if not chain.startswith(cni.HOSTPORT_POD_CHAIN_PREFIX):
                continue
            into = [r for r in rules if r[:1] == ["-A"] and r[-2:] == ["-j", chain]]
            if any(sandbox in " ".join(r) for r in into for sandbox in live):
                continue  # a running pod's (of another node on this host)
            for r in into:
                cni.run_nat(tool, "-D", *r[1:])
            cni.run_nat(tool, "-F", chain)
            cni.run_nat(tool, "-X", chain)


@pytest.fixture(scope="session", autouse=True)
def no_mounts_left(tmp_path_factory):
    """A node agent makes its pods' directory a shared mount, as the kubelet does, and
    keeps it when it stops (its pods may run on): whatever the session's nodes left
    mounted under the session's directories goes at the end."""
    base = str(tmp_path_factory.getbasetemp())
    yield
    from kubeplane.node.containerd import unmount_under

    unmount_under(base)


@pytest.fixture(scope="session", autouse=True)
def host_nftables():
    """Snapshot the host's nftables tables and chains; at the end of the session
    (after every other fixture) remove the CNI chains made since and left
    unused, and the tables and base chains made since that hold no rule."""
    before = _nft_ruleset()
    yield
    if before is None:
        return  # no nft on this host
    old_tables, old_chains = _tables_and_chains(before)
    now = _nft_ruleset() or []
    _remove_leaked_hostport_chains({c for _f, _t, c in _tables_and_chains(now)[1] - old_chains})
    cni.remove_unused_hostport_chains()
    now = _nft_ruleset() or []
    tables, _chains = _tables_and_chains(now)
    ruled = {(x["rule"]["family"], x["rule"]["table"], x["rule"]["chain"]) for x in now if "rule" in x}
    # tables holding a rule, a set, a map, a flowtable... are in use: left alone
    in_use = {(f, t) for f, t, _c in ruled} | {
        (v["family"], v["table"]) for x in now for k, v in x.items()
        if k not in ("table", "chain", "rule", "metainfo") and isinstance(v, dict) and "table" in v}
    for family, name in tables - old_tables - in_use:
        subprocess.run(["nft", "delete", "table", family, name], capture_output=True)
    # base chains iptables-nft added to tables that were there (the kernel refuses a chain with rules)
    base = {(x["chain"]["family"], x["chain"]["table"], x["chain"]["name"]) for x in now
            if "chain" in x and "hook" in x["chain"]}
    for family, table, chain in base - old_chains - ruled:
        if (family, table) in old_tables:
            subprocess.run(["nft", "delete", "chain", family, table, chain], capture_output=True)


@pytest.fixture(scope="session")
def image_archives(tmp_path_factory):
    d = tmp_path_factory.mktemp("images")
    busybox, pause = str(d / "busybox.tar"), str(d / "pause.tar")
    build_busybox_image(busybox, BUSYBOX)
    build_pause_image(pause, PAUSE)
    return {"busybox": busybox, "pause": pause, "dir": str(d)}


@pytest.fixture(scope="session")
def containerd(tmp_path_factory, image_archives):
    base = tmp_path_factory.mktemp("containerd")
    ctd = ManagedContainerd(str(base), sandbox_image=PAUSE)
    bridge, cidr = _unique_bridge_and_cidr()
    cni.write_conflist(ctd.paths.cni_conf_dir,
                       cni.bridge_conflist(cidr, bridge=bridge, ipam_dir=ctd.paths.cni_state_dir))
    ctd.bridge, ctd.pod_cidr = bridge, cidr
    try:
        asyncio.run(ctd.start())
        for archive in (image_archives["busybox"], image_archives["pause"]):
            asyncio.run(import_archive(ctd.address, archive))
        yield ctd
    finally:
        asyncio.run(ctd.stop())
        ctd.remove()
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


# -- a whole real node: a cluster and a node agent with its own containerd --------

_HANDED_OUT: set[str] = set()


def free_bridge_and_cidr() -> tuple[str, str]:
    """A bridge name and a /24 that neither this host routes nor this session handed out already."""
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    start = (os.getpid() * 7) % 200
    for i in range(200):
        n = (start + i) % 200 + 20
        cidr = f"10.251.{n}.0/24"
        if f"10.251.{n}." not in routes and cidr not in _HANDED_OUT:
            _HANDED_OUT.add(cidr)
            return f"kpn{os.getpid() % 100000}x{n}"[:15], cidr
    raise RuntimeError("no free 10.251.x.0/24 for a test node")


class RealNode:
    """A :class:`kubeplane.testing.Cluster` (scheduler and controllers) and one
    real node ``name`` running in a thread of its own: a :class:`ManagedNode`
    (its containerd under ``data_dir``, the busybox image imported from its
    images directory, the pause image built) acting as ``system:node:<name>``.

    ``kubectl(...)`` runs the real kubectl as the cluster's admin; ``run(coro)``
    runs a coroutine in the node's event loop (``run(node.agent.cri.runtime(...))``);
    ``restart_agent()`` stops the agent and its containerd, leaving the
    containers running, and starts them again (adoption).
    """

    def __init__(self, cluster, data_dir: str, *, name: str = "real-0", busybox_archive: str | None = None,
                 max_pods: int = 110):
        self.cluster = cluster
        self.name = name
        self.data_dir = data_dir
        self.kubeconfig = cluster.kubeconfig
        self.busybox = BUSYBOX
        self.pause = PAUSE
        self.bridge, self.pod_cidr = free_bridge_and_cidr()
        self.node_kubeconfig = node_kubeconfig(cluster, name, os.path.join(data_dir, "kubelet.kubeconfig"))
        images = os.path.join(data_dir, "images")
        os.makedirs(images, exist_ok=True)
        if busybox_archive:
            shutil.copy(busybox_archive, os.path.join(images, "busybox.tar"))
        self.max_pods = max_pods
        #: the node's pods' cgroups go under <cgroup_root>/kubepods
        self.cgroup_root = own_cgroup_root(name)
        self.node = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"node-{name}", daemon=True)
        self._thread.start()
        self._client = None

    @property
    def agent(self):
        return self.node.agent if self.node is not None else None

    def run(self, coro, timeout: float = 120.0):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def config(self):
        from kubeplane.node.agent import AgentConfig

        return AgentConfig(name=self.name, data_dir=self.data_dir, node_ip="127.0.0.1", max_pods=self.max_pods,
                           pod_cidr=self.pod_cidr, cni_bridge=self.bridge, kubelet_port=0,
                           cgroup_root=self.cgroup_root)

    def start(self) -> "RealNode":
        self.run(self._start())
        return self

    async def _start(self) -> None:
        from kubeplane.client.http import HttpClient
        from kubeplane.node.agent import ManagedNode

        self._client = HttpClient.from_kubeconfig(self.node_kubeconfig)
        self.node = ManagedNode(self._client, self.config(), sandbox_image=PAUSE)
        await self.node.start()

    def restart_agent(self) -> None:
        """Stop the agent and its containerd (the containers keep running), then start both again."""
        self.run(self._restart())

    async def _restart(self) -> None:
        await self.node.stop(remove_pods=False)
        await self._client.close()
        await self._start()

    def stop(self) -> None:
        try:
            if self.node is not None:
                self.run(self.node.stop(remove_pods=True), timeout=180)
            if self._client is not None:
                self.run(self._client.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
            remove_cgroup_root(self.cgroup_root)

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 60.0, check: bool = True):
        """The real kubectl as the cluster's admin; returns the CompletedProcess (text)."""
        proc = subprocess.run(["kubectl", "--kubeconfig", self.kubeconfig, *args], input=input,
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc


@pytest.fixture(scope="module")
def real_node(tmp_path_factory, image_archives):
    """A cluster with one real node (see :class:`RealNode`); every pod, shim,
    mount and link it made is removed afterwards."""
    from kubeplane.testing import Cluster

    with Cluster(scheduler=True, controllers=True) as cluster:
        data_dir = str(tmp_path_factory.mktemp("real-node"))
        node = RealNode(cluster, data_dir, busybox_archive=image_archives["busybox"])
        try:
            node.start()
            cluster.wait_for("nodes", node.name, condition="Ready", timeout=60)
            yield node
        finally:
            node.stop()
            shutil.rmtree(data_dir, ignore_errors=True)
