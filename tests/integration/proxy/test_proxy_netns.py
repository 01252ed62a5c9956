"""The Service proxy programming a node's network namespace, reached with real traffic.

An in-process API server holds Services and EndpointSlices pointing at the
pods of the ``topology`` fixture (conftest.py); a ServiceProxy watches them
over HTTPS and programs nftables in the node's namespace; busybox wget from
the node (and from pods) reaches busybox httpd in the pods.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from kubeplane.api.resources import resource
from kubeplane.client.http import HttpClient
from kubeplane.proxy import ProxyConfig, ServiceProxy
from kubeplane.testing import Cluster

from helpers import eventually
from netns_topology import topology  # noqa: F401 - the fixture

SERVICES = resource("services")
SLICES = resource("endpointslices", "discovery.k8s.io")
NODE = "node-a"
NS = "default"

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
async def env(topology):
    async with Cluster() as cluster:
        client = HttpClient.from_kubeconfig(cluster.kubeconfig)
        proxy = ServiceProxy(client, ProxyConfig(node_name=NODE, node_ips=[topology.node_ips[0]],
                                                 command_prefix=topology.prefix))
        try:
            await proxy.start()
            yield Env(topology, client, proxy)
        finally:
            await proxy.stop()
            await client.close()
            await topology.nft("delete", "table", "ip", "kube-proxy")  # in case stop did not


class Env:
    def __init__(self, topo, client, proxy) -> None:
        self.topo = topo
        self.client = client
        self.proxy = proxy
        self.proxier = proxy.proxier("ipv4")

    async def service(self, name: str, *, port: int = 80, **spec) -> dict:
        body = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                "spec": {"ports": [{"port": port, "targetPort": 80, "protocol": "TCP"}], **spec}}
        return await self.client.create(SERVICES, body, NS)

    def slice_body(self, service: str, pods: dict[str, bool], *, local: bool = False) -> dict:
        return {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{service}-1", "labels": {"kubernetes.io/service-name": service,
                                                             "endpointslice.kubernetes.io/managed-by": "tests"}},
            "addressType": "IPv4",
            "ports": [{"name": "", "port": 80, "protocol": "TCP"}],
            "endpoints": [{"addresses": [self.topo.pods[p]], "conditions": {"ready": ready},
                           "nodeName": NODE if local else "elsewhere"} for p, ready in pods.items()],
        }

    async def slice(self, service: str, pods: dict[str, bool], *, local: bool = False) -> dict:
        return await self.client.create(SLICES, self.slice_body(service, pods, local=local), NS)

    async def synced_with(self, obj: dict) -> None:
        """Until the proxier has applied a change as new as ``obj`` (its informers saw it, then a sync ran)."""
        rv = obj["metadata"]["resourceVersion"]

        def done() -> bool:
            infs = self.proxy._informers
            seen = all(int(i.last_sync_resource_version or 0) >= int(rv) and i.pending == 0 for i in infs)
            return seen and not self.proxier._dirty and not self.proxier._lock.locked()

        await eventually(done, what="the proxier caught up")

    async def table(self) -> str:
        code, out = await self.topo.nft("list", "table", "ip", "kube-proxy")
        assert code == 0, out
        return out

    async def hits(self, url: str, n: int, *, source: str | None = None) -> list[str]:
        out = []
        for _ in range(n):
            code, body = await self.topo.get(url, source=source)
            assert code == 0, f"GET {url}: {body}"
            out.append(body)
        return out


async def test_cluster_ip_balances_over_ready_endpoints_and_nodeports_answer_on_every_node_address(env):
    svc = await env.service("web", type="NodePort")
    await env.slice("web", {"pod1": True, "pod2": True, "pod3": False})
    ip, node_port = svc["spec"]["clusterIP"], svc["spec"]["ports"][0]["nodePort"]

    async def answered():
        code, body = await env.topo.get(f"http://{ip}/")
        return code == 0 and body

    await eventually(answered, what="the ClusterIP answers")
    seen = await env.hits(f"http://{ip}/", 30)
    assert set(seen) == {"pod1", "pod2"}  # both ready backends, never the not-ready pod3
    for addr in env.topo.node_ips:
        assert set(await env.hits(f"http://{addr}:{node_port}/", 20)) == {"pod1", "pod2"}
    # from a pod (the prerouting path), masqueraded towards the chosen backend
    assert set(await env.hits(f"http://{env.topo.node_ips[0]}:{node_port}/", 20, source="pod3")) == {"pod1", "pod2"}
    table = await env.table()
    assert f"{ip} . tcp . 80 : goto service-" in table
    assert f"tcp . {node_port} : goto external-" in table
    assert "numgen random mod 2" in table


async def test_an_endpoint_turned_not_ready_is_gone_within_a_second(env):
    svc = await env.service("flaky")
    sl = await env.slice("flaky", {"pod1": True, "pod2": True})
    ip = svc["spec"]["clusterIP"]
    await eventually(lambda: env.topo.get(f"http://{ip}/"), what="the ClusterIP answers")
    await env.synced_with(sl)
    await asyncio.sleep(env.proxy.config.min_sync_period + 0.1)  # no sync pending: the change goes at once
    sl["endpoints"][1]["conditions"]["ready"] = False
    t0 = time.monotonic()
    await env.client.update(SLICES, sl)
    chain = next(c for c in env.proxier._rules[(NS, "flaky")].chains)

    async def pod2_gone():
        code, out = await env.topo.nft("list", "chain", "ip", "kube-proxy", chain)
        return code == 0 and env.topo.pods["pod2"] not in out and env.topo.pods["pod1"] in out

    await eventually(pod2_gone, timeout=5, interval=0.005, what="pod2 left the service chain")
    took = time.monotonic() - t0
    assert took < 1.0, f"the rules changed {took:.3f}s after the EndpointSlice"
    assert env.proxier.syncs[-1].full is False  # a partial sync
    assert set(await env.hits(f"http://{ip}/", 15)) == {"pod1"}


async def test_a_service_without_endpoints_is_rejected(env):
    svc = await env.service("empty")
    ip = svc["spec"]["clusterIP"]
    await env.synced_with(svc)

    async def refused(url):
        code, body = await env.topo.get(url)
        return code != 0 and "refused" in body.lower()

    await eventually(lambda: refused(f"http://{ip}/"), what="connection refused")
    assert f"{ip} . tcp . 80 comment \"default/empty\" : goto reject-chain" in await env.table()
    # a port the ClusterIP does not serve: rejected through cluster-ips
    busy = await env.service("busy")
    await env.slice("busy", {"pod1": True})
    await eventually(lambda: env.topo.get(f"http://{busy['spec']['clusterIP']}/"), what="busy answers")
    assert await refused(f"http://{busy['spec']['clusterIP']}:81/")


async def test_session_affinity_client_ip_sticks_to_one_endpoint(env):
    svc = await env.service("sticky", sessionAffinity="ClientIP")
    await env.slice("sticky", {"pod1": True, "pod2": True})
    ip = svc["spec"]["clusterIP"]
    await eventually(lambda: env.topo.get(f"http://{ip}/"), what="the ClusterIP answers")
    seen = await env.hits(f"http://{ip}/", 15)
    assert len(set(seen)) == 1, seen
    table = await env.table()
    assert "set affinity-" in table and "timeout 3h" in table
    # pods stick too, each to its own choice
    assert len(set(await env.hits(f"http://{ip}/", 8, source="pod3"))) == 1


async def test_hairpin_a_pod_reaches_itself_through_its_service(env):
    svc = await env.service("self")
    await env.slice("self", {"pod1": True}, local=True)
    ip = svc["spec"]["clusterIP"]
    await eventually(lambda: env.topo.get(f"http://{ip}/"), what="the ClusterIP answers")
    assert await env.hits(f"http://{ip}/", 5, source="pod1") == ["pod1"] * 5
    pod1 = env.topo.pods["pod1"]
    assert f"{pod1} . {pod1} . tcp . 80" in await env.table()  # hairpin-connections


async def test_headless_services_get_no_rules(env):
    svc = await env.service("headless", clusterIP="None")
    await env.slice("headless", {"pod1": True})
    marker = await env.service("marker")  # made after the headless Service and its slice
    await env.synced_with(marker)
    assert (NS, "marker") in env.proxier._rules and (NS, "headless") not in env.proxier._rules
    assert svc["spec"]["clusterIP"] == "None"
    table = await env.table()
    assert "/headless/" not in table and env.topo.pods["pod1"] not in table


async def test_deleting_the_service_removes_its_rules_and_stopping_removes_the_table(env):
    svc = await env.service("gone", type="NodePort")
    await env.slice("gone", {"pod1": True, "pod2": True})
    ip = svc["spec"]["clusterIP"]
    await eventually(lambda: env.topo.get(f"http://{ip}/"), what="the ClusterIP answers")
    assert "/gone/" in await env.table()
    await env.client.delete(SERVICES, "gone", NS)

    async def removed():
        return "/gone/" not in await env.table() and ip not in await env.table()

    await eventually(removed, timeout=5, what="the service's chains and elements are gone")
    code, _ = await env.topo.get(f"http://{ip}/")
    assert code != 0
    await env.proxy.stop()
    code, out = await env.topo.nft("list", "tables")
    assert code == 0 and "kube-proxy" not in out


async def test_ipv6_services_are_programmed_in_the_ip6_table(topology):
    """The ip6 family's proxier, fed a dual-stack Service and an IPv6 EndpointSlice (the test API
    server's Service range is IPv4 only, so the objects are handed to the proxier directly)."""
    from kubeplane.proxy import Proxier

    v6 = Proxier("ipv6", ProxyConfig(node_name=NODE, families=("ipv4", "ipv6"), command_prefix=topology.prefix))
    v6.on_service({"metadata": {"namespace": NS, "name": "v6"},
                   "spec": {"clusterIP": "10.96.9.9", "clusterIPs": ["10.96.9.9", "fd00:96::9"],
                            "ipFamilies": ["IPv4", "IPv6"], "ports": [{"port": 80, "protocol": "TCP"}]}})
    v6.on_slice({"metadata": {"namespace": NS, "name": "v6-x", "labels": {"kubernetes.io/service-name": "v6"}},
                 "addressType": "IPv6", "ports": [{"name": "", "port": 80, "protocol": "TCP"}],
                 "endpoints": [{"addresses": [topology.pods6[p]], "conditions": {"ready": True}}
                               for p in ("pod1", "pod2")]})
    v6.set_initialized()
    try:
        assert await v6.sync(), v6.last_error
        seen = set()
        for _ in range(20):
            code, body = await topology.get("http://[fd00:96::9]/")
            assert code == 0, body
            seen.add(body)
        assert seen == {"pod1", "pod2"}
        code, out = await topology.nft("list", "table", "ip6", "kube-proxy")
        assert code == 0 and "dnat ip6 to numgen random mod 2 map { 0 : fd00:77::11 . 80" in out
    finally:
        assert await v6.cleanup()
    code, out = await topology.nft("list", "tables")
    assert "ip6 kube-proxy" not in out


async def test_external_traffic_policy_local_keeps_the_client_address_cluster_masquerades(env):
    pod3 = env.topo.pods["pod3"]
    node_ip = env.topo.node_ips[0]
    cluster = await env.service("etp-cluster", type="NodePort")
    await env.slice("etp-cluster", {"pod1": True}, local=True)
    local = await env.service("etp-local", type="NodePort", externalTrafficPolicy="Local")
    await env.slice("etp-local", {"pod1": True}, local=True)
    remote = await env.service("etp-remote", type="NodePort", externalTrafficPolicy="Local")
    await env.slice("etp-remote", {"pod2": True}, local=False)  # its only endpoint is on another node
    await env.synced_with(remote)

    async def client_seen(svc) -> str:
        url = f"http://{node_ip}:{svc['spec']['ports'][0]['nodePort']}/cgi-bin/client"
        code, body = await env.topo.get(url, source="pod3")
        assert code == 0, body
        return body.removeprefix("[::ffff:").removesuffix("]")  # httpd listens on IPv6: mapped addresses

    assert await eventually(lambda: client_seen(cluster)) == node_ip  # Cluster: masqueraded, may cross nodes
    assert await client_seen(local) == pod3  # Local: the client's own address reaches the pod
    # Local with no endpoint on this node: dropped (not rejected), the client waits
    with pytest.raises(asyncio.TimeoutError):
        await env.topo.get(f"http://{node_ip}:{remote['spec']['ports'][0]['nodePort']}/", source="pod3", timeout=3)
    # while its ClusterIP still reaches the remote endpoint
    code, body = await env.topo.get(f"http://{remote['spec']['clusterIP']}/")
    assert (code, body) == (0, "pod2")


async def test_internal_traffic_policy_local_uses_only_this_nodes_endpoints(env):
    local = await env.service("itp-local", internalTrafficPolicy="Local")
    await env.slice("itp-local", {"pod1": True, "pod2": True}, local=True)
    remote = await env.service("itp-remote", internalTrafficPolicy="Local")
    await env.slice("itp-remote", {"pod2": True}, local=False)
    await env.synced_with(remote)
    ip = local["spec"]["clusterIP"]
    await eventually(lambda: env.topo.get(f"http://{ip}/"), what="the ClusterIP answers")
    assert set(await env.hits(f"http://{ip}/", 10)) == {"pod1", "pod2"}  # both are this node's
    with pytest.raises(asyncio.TimeoutError):  # no endpoint on this node: dropped
        await env.topo.get(f"http://{remote['spec']['clusterIP']}/", timeout=3)
