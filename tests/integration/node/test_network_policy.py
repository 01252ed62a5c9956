"""NetworkPolicy enforcement on a node's pod bridge: a node (a network
namespace with a bridge) and four pods (network namespaces on it, each serving
HTTP on ports 80 and 8080 with busybox httpd), Pod objects with those IPs in a
real API server, and the node's NetworkPolicyController, acting as
system:node:<name>, programming the node's namespace as policies come and go."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import resource
from kubeplane.node.netpol import NetworkPolicyController, table_name

from conftest import node_kubeconfig
from nodetest import in_netns, netns_sh as sh, network_policy_kubeconfig

TAG = f"{os.getpid() % 100000}"
NODE = f"np-node-{TAG}"
NS_A, NS_B = f"np-a-{TAG}", f"np-b-{TAG}"
NET = "10.77.0"
#: pod name -> (address, namespace, labels)
PODS = {
    "server": (f"{NET}.2", NS_A, {"app": "web"}),
    "client": (f"{NET}.3", NS_A, {"role": "client"}),
    "other": (f"{NET}.4", NS_A, {"role": "other"}),
    "remote": (f"{NET}.5", NS_B, {"role": "client"}),
}
BUSYBOX = "/bin/busybox"
POLICIES = resource("networkpolicies", "networking.k8s.io")


def ns(name: str) -> str:
    return f"knp{TAG}{name}"


@pytest.fixture
def network(tmp_path):
    """The node's namespace with bridge kp0 ({NET}.1/24), a pod namespace per
    pod on it, each running httpd on 80 and 8080; all removed afterwards."""
    names = [ns("node")] + [ns(p) for p in PODS]
    servers: list[subprocess.Popen] = []
    try:
        for n in names:
            sh("ip", "netns", "add", n)
        node = ns("node")
        sh("ip", "-n", node, "link", "set", "lo", "up")
        sh("ip", "-n", node, "link", "add", "name", "kp0", "type", "bridge")
        sh("ip", "-n", node, "addr", "add", f"{NET}.1/24", "dev", "kp0")
        sh("ip", "-n", node, "link", "set", "kp0", "up")
        for i, (name, (ip, _, _)) in enumerate(PODS.items()):
            pod = ns(name)
            sh("ip", "link", "add", "name", "eth0", "netns", pod, "type", "veth", "peer", "name", f"v{i}", "netns", node)
            sh("ip", "-n", node, "link", "set", "dev", f"v{i}", "master", "kp0", "up")
            sh("ip", "-n", pod, "addr", "add", f"{ip}/24", "dev", "eth0")
            sh("ip", "-n", pod, "link", "set", "eth0", "up")
            sh("ip", "-n", pod, "link", "set", "lo", "up")
            sh("ip", "-n", pod, "route", "add", "default", "via", f"{NET}.1")
            www = tmp_path / name
            www.mkdir()
            (www / "index.html").write_text(name)
            for port in ("80", "8080"):
                servers.append(subprocess.Popen(["ip", "netns", "exec", pod, BUSYBOX, "httpd", "-f", "-p", port,
                                                 "-h", str(www)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 10
        while not all(reaches(None, name, port) for name in PODS for port in (80, 8080)):
            assert time.monotonic() < deadline, "the pods' servers did not start"
            time.sleep(0.1)
        yield
    finally:
        for s in servers:
            s.kill()
            s.wait()
        for n in reversed(names):
            subprocess.run(["ip", "netns", "del", n], capture_output=True)


def reaches(src: str | None, dst: str, port: int = 80) -> bool:
    """Whether pod ``src`` (None: the node) gets pod ``dst``'s page on ``port``."""
    where = ns(src) if src else ns("node")
    argv = ["ip", "netns", "exec", where, BUSYBOX, "nc", "-w", "1", PODS[dst][0], str(port)]
    try:
        p = subprocess.run(argv, input="GET / HTTP/1.0\r\n\r\n", capture_output=True, text=True, timeout=5)
    except subprocess.TimeoutExpired:
        return False
    return p.returncode == 0 and p.stdout.startswith("HTTP/1.") and p.stdout.rstrip().endswith("\n" + dst)


async def reach(src: str | None, dst: str, port: int = 80) -> bool:
    return await asyncio.to_thread(reaches, src, dst, port)


@pytest.fixture(scope="module")
def cluster():
    from kubeplane.testing import Cluster
    with Cluster(scheduler=False, controllers=False) as c:
        yield c


async def wait_for(pred, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(pred):
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


def netpol(name: str, spec: dict, namespace: str = NS_A) -> dict:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


async def create_objects(admin) -> None:
    await admin.create(resource("namespaces"), {"metadata": {"name": NS_A}})
    await admin.create(resource("namespaces"), {"metadata": {"name": NS_B, "labels": {"team": "b"}}})
    for name, (ip, namespace, labels) in PODS.items():
        ports = [{"name": "http", "containerPort": 8080}] if name == "server" else []
        pod = await admin.create(PODS_RES, {
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "busybox", "ports": ports}]}})
        pod["status"] = {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}
        await admin.update(PODS_RES, pod, subresource="status")


PODS_RES = resource("pods")


async def test_policies_isolate_and_allow_pods_on_the_node(network, cluster, tmp_path):
    from kubeplane.client.http import HttpClient

    admin = HttpClient.from_kubeconfig(cluster.kubeconfig)
    # the policy agent's own account: a node's identity may not list every pod
    node = HttpClient.from_kubeconfig(node_kubeconfig(cluster, NODE, str(tmp_path / "node.kubeconfig")))
    with pytest.raises(StatusError, match="can only list/watch pods with spec.nodeName field selector"):
        await node.list(PODS_RES)
    await node.close()
    node_client = HttpClient.from_kubeconfig(network_policy_kubeconfig(cluster.kubeconfig,
                                                                       str(tmp_path / "netpol.kubeconfig")))
    ctl = NetworkPolicyController(node_client, NODE, runner=in_netns(ns("node")), resync_period=30.0)
    try:
        await create_objects(admin)
        await ctl.start()
        await asyncio.wait_for(ctl.synced.wait(), 10)
        assert [await reach(s, "server") for s in ("client", "other", "remote")] == [True, True, True]

        # default deny ingress in the namespace: no pod gets in, the node still does
        await admin.create(POLICIES, netpol("deny", {"podSelector": {}}), namespace=NS_A)
        await wait_for(lambda: not reaches("client", "server"))
        assert not await reach("other", "server") and not await reach("remote", "server")
        assert not await reach("server", "client")
        assert await reach(None, "server") and await reach(None, "client")
        assert await reach("server", "remote")  # egress of the namespace is not isolated, nor is remote's ingress

        # pods of the same namespace with role=client
        await admin.create(POLICIES, netpol("clients", {
            "podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}]}]}), namespace=NS_A)
        await wait_for(lambda: reaches("client", "server"))
        assert await reach("client", "server", 8080)
        assert not await reach("other", "server")
        assert not await reach("remote", "server")  # role=client, but of another namespace

        # every pod of the namespaces labelled team=b
        await admin.create(POLICIES, netpol("team-b", {
            "podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "b"}}}]}]}), namespace=NS_A)
        await wait_for(lambda: reaches("remote", "server"))
        assert not await reach("other", "server")

        # a named port: the server's container port "http" (8080), from anywhere
        await admin.create(POLICIES, netpol("http", {
            "podSelector": {"matchLabels": {"app": "web"}}, "ingress": [{"ports": [{"port": "http"}]}]}),
            namespace=NS_A)
        await wait_for(lambda: reaches("other", "server", 8080))
        assert not await reach("other", "server", 80)

        # egress: the clients may reach the pod network but the server (an ipBlock with an except)
        await admin.create(POLICIES, netpol("client-egress", {
            "podSelector": {"matchLabels": {"role": "client"}}, "policyTypes": ["Egress"],
            "egress": [{"to": [{"ipBlock": {"cidr": f"{NET}.0/24", "except": [f"{PODS['server'][0]}/32"]}}]}]}),
            namespace=NS_A)
        await wait_for(lambda: not reaches("client", "server"))
        assert not await reach("client", "server", 8080)
        assert await reach("client", "remote")
        assert await reach("other", "server", 8080)  # the server's ingress did not change

        # the policies gone, every pod reaches every other again
        for name in ("deny", "clients", "team-b", "http", "client-egress"):
            await admin.delete(POLICIES, name, namespace=NS_A)
        await wait_for(lambda: reaches("client", "server"))
        assert await reach("other", "server") and await reach("server", "client") and await reach("remote", "other")
        assert ctl.errors == 0
        assert table_name(NODE) in sh("nft", "list", "tables", netns=ns("node")).stdout
    finally:
        await ctl.stop()
        for name, (_, namespace, _) in PODS.items():
            await ignore_missing(admin.delete(PODS_RES, name, namespace=namespace))
        for n in (NS_A, NS_B):
            await ignore_missing(admin.delete(resource("namespaces"), n))
        await node_client.close()
        await admin.close()
    # stopped, the node's table is gone
    assert table_name(NODE) not in sh("nft", "list", "tables", netns=ns("node")).stdout


def _policy_sets():
    """Policies through the features the rules have (dual-stack peers, ipBlock
    except, ranges, SCTP and UDP, named ports both ways), one step after another."""
    def pod(name, ips, labels, node=NODE, ports=()):
        return {"metadata": {"name": name, "namespace": NS_A, "labels": labels},
                "spec": {"nodeName": node, "containers": [{"name": "c", "ports": list(ports)}]},
                "status": {"phase": "Running", "podIP": ips[0], "podIPs": [{"ip": ip} for ip in ips]}}
    pods = [pod("web", ["10.1.0.2", "fd00::2"], {"app": "web"}, ports=[{"name": "http", "containerPort": 8080},
                                                                          {"name": "q", "containerPort": 9000,
                                                                           "protocol": "SCTP"}]),
            pod("cl", ["10.1.0.3", "fd00::3"], {"role": "client"}),
            pod("far", ["10.2.0.3"], {"role": "client"}, node="elsewhere",
                ports=[{"name": "http", "containerPort": 8081}])]
    ns_objs = [{"metadata": {"name": NS_A, "labels": {"kubernetes.io/metadata.name": NS_A}}}]
    web = {"matchLabels": {"app": "web"}}
    clients = {"podSelector": {"matchLabels": {"role": "client"}}}
    steps = [
        [],
        [netpol("deny", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]})],
        [netpol("deny", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
         netpol("web", {"podSelector": web, "ingress": [
             {"from": [clients, {"ipBlock": {"cidr": "192.168.0.0/16", "except": ["192.168.4.0/22"]}},
                       {"ipBlock": {"cidr": "2001:db8::/32", "except": ["2001:db8:1::/48"]}}],
              "ports": [{"port": "http"}, {"protocol": "SCTP", "port": "q"}, {"protocol": "UDP", "port": 5000,
                                                                              "endPort": 5100}]}]}),
         netpol("out", {"podSelector": clients["podSelector"], "policyTypes": ["Egress"], "egress": [
             {"ports": [{"port": "http"}]}, {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [
                 {"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}]})],
        [netpol("web", {"podSelector": web, "ingress": [{"from": [clients]}]})],
        [],
    ]
    return [(policies, pods, ns_objs) for policies in steps]


async def test_rules_load_and_changes_leave_what_a_whole_write_does(tmp_path):
    """Each step's table written whole, and reached by changes from the step
    before, lists the same in the kernel."""
    from kubeplane.node import netpol

    node = ns("nft")
    sh("ip", "netns", "add", node)
    try:
        run = in_netns(node)
        table = netpol.table_name(NODE)
        before = None
        listings = []
        for policies, pods, namespaces in _policy_sets():
            rs = netpol.ruleset(netpol.compute(policies, pods, namespaces, NODE))
            if before is not None:
                text = netpol.incremental_ruleset(before, rs, table)
                if text:
                    rc, _, err = await run(["nft", "-f", "-"], text.encode())
                    assert rc == 0, err + text
            else:
                rc, _, err = await run(["nft", "-f", "-"], netpol.full_ruleset(rs, table).encode())
                assert rc == 0, err
            changed = sh("nft", "list", "table", "inet", table, netns=node).stdout
            rc, _, err = await run(["nft", "-f", "-"], netpol.full_ruleset(rs, table).encode())
            assert rc == 0, err
            whole = sh("nft", "list", "table", "inet", table, netns=node).stdout
            assert sorted(changed.splitlines()) == sorted(whole.splitlines())
            before = rs
            listings.append(whole)
        rich = listings[2]
        # (as the kernel lists them: adjacent networks merged into ranges)
        for expected in ("ct state established,related accept", "sctp dport 9000 return",
                         "udp dport 5000-5100 return", "192.168.0.0/22, 192.168.8.0-192.168.255.255",
                         "2001:db8::/48, 2001:db8:2::-2001:db8:ffff:ffff:ffff:ffff:ffff:ffff",
                         "ip daddr 10.2.0.3 tcp dport 8081 return"):
            assert expected in rich, (expected, rich)
        assert "192.168.4.0" not in rich and "2001:db8:1::" not in rich  # the excepts
        assert "jump" not in listings[-1]
        rc, _, err = await run(["nft", "-f", "-"], netpol.delete_ruleset(table).encode())
        assert rc == 0, err
        assert table not in sh("nft", "list", "tables", netns=node).stdout
    finally:
        subprocess.run(["ip", "netns", "del", node], capture_output=True)


async def ignore_missing(coro) -> None:
    from kubeplane.api.errors import StatusError
    try:
        await coro
    except StatusError as e:
        if e.code != 404:
            raise
