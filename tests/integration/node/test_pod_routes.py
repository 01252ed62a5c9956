"""Pod routes across nodes on real links: two hosts (network namespaces on one
link, each with a pod bridge and a pod) whose routes PodRoutes keeps from the
Node objects of a real API server, read as system:kube-proxy."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest

from kubeplane.node.routes import PodRoutes, ROUTE_PROTOCOL, nat_table

TAG = f"{os.getpid() % 100000}"
HOSTS = {"a": ("192.168.77.1", "10.244.1"), "b": ("192.168.77.2", "10.244.2")}
OUTSIDE = "192.168.77.100"


def ns(name: str) -> str:
    return f"kpr{TAG}{name}"


def sh(*argv: str, check: bool = True, netns: str | None = None, timeout: float = 20) -> subprocess.CompletedProcess:
    if netns:
        argv = ("ip", "netns", "exec", netns, *argv)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {p.stderr or p.stdout}")
    return p


@pytest.fixture
def network():
    """lan (a bridge, and the 'outside' address), hosts a and b on it, a pod on each host's bridge."""
    names = [ns("lan")] + [ns(h) for h in HOSTS] + [ns("p" + h) for h in HOSTS]
    try:
        for n in names:
            sh("ip", "netns", "add", n)
        lan = ns("lan")
        sh("ip", "-n", lan, "link", "add", "name", "lanbr", "type", "bridge")
        sh("ip", "-n", lan, "addr", "add", f"{OUTSIDE}/24", "dev", "lanbr")
        sh("ip", "-n", lan, "link", "set", "lanbr", "up")
        for h, (ip, net) in HOSTS.items():
            host, pod = ns(h), ns("p" + h)
            sh("ip", "link", "add", "name", "eth0", "netns", host, "type", "veth", "peer", "name", f"to-{h}", "netns", lan)
            sh("ip", "-n", lan, "link", "set", "dev", f"to-{h}", "master", "lanbr", "up")
            sh("ip", "-n", host, "addr", "add", f"{ip}/24", "dev", "eth0")
            sh("ip", "-n", host, "link", "set", "eth0", "up")
            sh("ip", "-n", host, "link", "set", "lo", "up")
            sh("ip", "-n", host, "link", "add", "name", "kp0", "type", "bridge")
            sh("ip", "-n", host, "addr", "add", f"{net}.1/24", "dev", "kp0")
            sh("ip", "-n", host, "link", "set", "kp0", "up")
            sh("ip", "link", "add", "name", "eth0", "netns", pod, "type", "veth", "peer", "name", "vpod", "netns", host)
            sh("ip", "-n", host, "link", "set", "dev", "vpod", "master", "kp0", "up")
            sh("ip", "-n", pod, "addr", "add", f"{net}.2/24", "dev", "eth0")
            sh("ip", "-n", pod, "link", "set", "eth0", "up")
            sh("ip", "-n", pod, "link", "set", "lo", "up")
            sh("ip", "-n", pod, "route", "add", "default", "via", f"{net}.1")
            sh("sysctl", "-qw", "net.ipv4.ip_forward=1", netns=host)
        yield
    finally:
        for n in reversed(names):
            subprocess.run(["ip", "netns", "del", n], capture_output=True)


@pytest.fixture(scope="module")
def cluster():
    from kubeplane.testing import Cluster
    with Cluster(scheduler=False, controllers=False) as c:
        yield c


def proxier_client(cluster, tmp_path):
    """A client as system:kube-proxy, bound by the bootstrap policy to system:node-proxier."""
    from kubeplane.auth import pki
    from kubeplane.client.http import HttpClient
    from kubeplane.client.kubeconfig import write_kubeconfig

    own = pki.PKI(cluster._pki_dir)
    cert, key = pki.issue(own.ca_cert, own.ca_key, "system:kube-proxy")
    path = str(tmp_path / "proxy.kubeconfig")
    write_kubeconfig(path, cluster.url, ca_data=own.ca_pem, client_cert_data=pki.cert_pem(cert),
                     client_key_data=pki.key_pem(key))
    return HttpClient.from_kubeconfig(path)


def in_netns(netns: str):
    async def run(argv, stdin=None):
        proc = await asyncio.create_subprocess_exec("ip", "netns", "exec", netns, *argv, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate(stdin)
        return proc.returncode, out.decode(), err.decode()
    return run


PEER_SERVER = ("import socket,sys\n"
               "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
               "s.bind(('0.0.0.0', 8080)); s.listen(1); print('ready', flush=True)\n"
               "c, a = s.accept(); print(a[0], flush=True)\n")


def peer_seen_by(server_ns: str, client_ns: str, target: str) -> str:
    """The source address a TCP server in ``server_ns`` sees for a connection from ``client_ns``."""
    srv = subprocess.Popen(["ip", "netns", "exec", server_ns, sys.executable, "-c", PEER_SERVER],
                           stdout=subprocess.PIPE, text=True)
    try:
        assert srv.stdout.readline().strip() == "ready"
        sh(sys.executable, "-c", f"import socket; socket.create_connection(({target!r}, 8080), 5).close()",
           netns=client_ns)
        return srv.stdout.readline().strip()
    finally:
        srv.kill()
        srv.wait()


def node_obj(name: str) -> dict:
    ip, net = HOSTS[name]
    return {"metadata": {"name": name}, "spec": {"podCIDR": f"{net}.0/24", "podCIDRs": [f"{net}.0/24"]},
            "status": {"addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}]}}


def routes_of(host: str) -> str:
    return sh("ip", "-n", ns(host), "route", "show", "proto", str(ROUTE_PROTOCOL)).stdout


async def wait_for(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def test_pods_reach_each_other_across_hosts_without_nat_and_leave_masqueraded(network, cluster, tmp_path):
    client = proxier_client(cluster, tmp_path)
    keepers = {h: PodRoutes(client, h, runner=in_netns(ns(h)), resync_period=5.0) for h in HOSTS}
    try:
        for h in HOSTS:
            await client_create_node(cluster, node_obj(h))
        for k in keepers.values():
            await k.start()
        await wait_for(lambda: "10.244.2.0/24 via 192.168.77.2" in routes_of("a")
                       and "10.244.1.0/24 via 192.168.77.1" in routes_of("b"))
        # pod to pod by IP, both ways, and the source address is the pod's own
        assert peer_seen_by(ns("pb"), ns("pa"), "10.244.2.2") == "10.244.1.2"
        assert peer_seen_by(ns("pa"), ns("pb"), "10.244.1.2") == "10.244.2.2"
        # to anything outside the pod network a pod is its node
        assert peer_seen_by(ns("lan"), ns("pa"), OUTSIDE) == HOSTS["a"][0]
        table = sh("nft", "list", "table", "ip", nat_table("a"), netns=ns("a")).stdout
        assert "10.244.1.0/24" in table and "10.244.2.0/24" in table
        # a node that goes takes its route with it
        await client_delete_node(cluster, "b")
        await wait_for(lambda: "10.244.2.0/24" not in routes_of("a"))
        assert keepers["a"].errors == 0
    finally:
        for k in keepers.values():
            await k.stop()
        await client.close()
        for h in HOSTS:
            await client_delete_node(cluster, h)
    # stopped, a node leaves neither routes nor its table
    for h in HOSTS:
        assert routes_of(h).strip() == ""
        assert nat_table(h) not in sh("nft", "list", "tables", netns=ns(h)).stdout


async def client_create_node(cluster, obj):
    from kubeplane.api.resources import resource
    from kubeplane.client.http import HttpClient
    c = HttpClient.from_kubeconfig(cluster.kubeconfig)
    try:
        await c.create(resource("nodes"), obj)
    finally:
        await c.close()


async def client_delete_node(cluster, name):
    from kubeplane.api.errors import StatusError
    from kubeplane.api.resources import resource
    from kubeplane.client.http import HttpClient
    c = HttpClient.from_kubeconfig(cluster.kubeconfig)
    try:
        await c.delete(resource("nodes"), name)
    except StatusError as e:
        if e.code != 404:
            raise
    finally:
        await c.close()
