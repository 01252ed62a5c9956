"""The kube-dns Service the DNS component keeps in kube-system (kubeplane.dns.kubedns),
and resolv.conf as the kubelet and the forwarder read it (kubeplane.dns.resolvconf)."""

from __future__ import annotations

import pytest

from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.inprocess import InProcessClient
from kubeplane.dns.kubedns import KubeDNSService, endpoint_address, kube_dns_ip
from kubeplane.dns.resolvconf import parse_resolv_conf_text, read_resolv_conf
from kubeplane.registry.registry import Registry
from kubeplane.registry.servicealloc import ServiceAllocators
from kubeplane.storage.memory import MemoryStore

SVC = resource("services")
EP = resource("endpoints")
SLICES = resource("endpointslices")


@pytest.fixture
async def client():
    store = MemoryStore()
    reg = Registry(store, CATALOGUE, service_allocators=ServiceAllocators(store, "10.96.0.0/12"))
    await ensure_default_namespaces(reg)
    c = InProcessClient(reg)
    yield c
    await c.close()
    await reg.close()
    await store.close()


def test_kube_dns_ip_is_the_tenth_address():
    assert kube_dns_ip("10.96.0.0/12") == "10.96.0.10"
    assert kube_dns_ip("10.43.0.0/16") == "10.43.0.10"
    assert kube_dns_ip("fd00:10:96::/112") == "fd00:10:96::a"
    with pytest.raises(ValueError, match="no tenth address"):
        kube_dns_ip("10.96.0.0/29")


def test_endpoint_address():
    assert endpoint_address("127.0.0.1") is None
    assert endpoint_address("::1") is None
    assert endpoint_address("192.0.2.9") == "192.0.2.9"
    assert endpoint_address("127.0.0.1", "192.0.2.10") == "192.0.2.10"
    found = endpoint_address("0.0.0.0")
    assert found is None or not found.startswith("127.")


async def test_service_and_endpoints(client):
    keeper = KubeDNSService(client, service_ip="10.96.0.10", port=10053, address="192.0.2.53")
    await keeper.reconcile()
    svc = await client.get(SVC, "kube-dns", "kube-system")
    assert svc["spec"]["clusterIP"] == "10.96.0.10" and svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["ports"] == [
        {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 10053},
        {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 10053}]
    assert svc["metadata"]["labels"]["k8s-app"] == "kube-dns" and "selector" not in svc["spec"]
    es = await client.get(SLICES, "kube-dns", "kube-system")
    assert es["endpoints"] == [{"addresses": ["192.0.2.53"], "conditions": {"ready": True}}]
    assert es["metadata"]["labels"]["kubernetes.io/service-name"] == "kube-dns"
    ep = await client.get(EP, "kube-dns", "kube-system")
    assert ep["subsets"][0]["addresses"] == [{"ip": "192.0.2.53"}]
    assert {p["name"]: p["port"] for p in ep["subsets"][0]["ports"]} == {"dns": 10053, "dns-tcp": 10053}
    assert keeper.cluster_ip == "10.96.0.10"
    # a second pass writes nothing
    rv = es["metadata"]["resourceVersion"]
    await keeper.reconcile()
    assert (await client.get(SLICES, "kube-dns", "kube-system"))["metadata"]["resourceVersion"] == rv


async def test_changes_are_repaired(client):
    keeper = KubeDNSService(client, service_ip="10.96.0.10", port=10053, address="192.0.2.53")
    await keeper.reconcile()
    svc = await client.get(SVC, "kube-dns", "kube-system")
    svc["spec"]["ports"] = [{"name": "dns", "port": 5353, "protocol": "UDP", "targetPort": 5353}]
    svc["spec"]["selector"] = {"k8s-app": "kube-dns"}
    await client.update(SVC, svc)
    await client.delete(EP, "kube-dns", "kube-system")
    es = await client.get(SLICES, "kube-dns", "kube-system")
    es["endpoints"][0]["addresses"] = ["192.0.2.99"]
    await client.update(SLICES, es)
    await keeper.reconcile()
    svc = await client.get(SVC, "kube-dns", "kube-system")
    assert [p["port"] for p in svc["spec"]["ports"]] == [53, 53] and "selector" not in svc["spec"]
    assert (await client.get(EP, "kube-dns", "kube-system"))["subsets"][0]["addresses"] == [{"ip": "192.0.2.53"}]
    assert (await client.get(SLICES, "kube-dns", "kube-system"))["endpoints"][0]["addresses"] == ["192.0.2.53"]
    # deleted, the Service comes back with its address
    await client.delete(SVC, "kube-dns", "kube-system")
    await keeper.reconcile()
    assert (await client.get(SVC, "kube-dns", "kube-system"))["spec"]["clusterIP"] == "10.96.0.10"


async def test_without_an_address_only_the_service(client):
    keeper = KubeDNSService(client, service_ip="10.96.0.10", port=10053, address=None)
    await keeper.reconcile()
    assert (await client.get(SVC, "kube-dns", "kube-system"))["spec"]["clusterIP"] == "10.96.0.10"
    assert not (await client.list(SLICES, "kube-system"))["items"]


async def test_a_service_made_before_keeps_its_address(client):
    other = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "kube-dns", "namespace": "kube-system"},
             "spec": {"clusterIP": "10.96.0.53", "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}}
    await client.create(SVC, other, "kube-system")
    keeper = KubeDNSService(client, service_ip="10.96.0.10", port=10053, address=None)
    await keeper.reconcile()
    assert keeper.cluster_ip == "10.96.0.53"
    assert len((await client.get(SVC, "kube-dns", "kube-system"))["spec"]["ports"]) == 2


def test_resolv_conf_parsing(tmp_path):
    conf = parse_resolv_conf_text(
        "# comment\n; also\nnameserver 192.0.2.1\nnameserver 192.0.2.2 extra\nnameserver\n"
        "search a.example b.example.\nsearch c.example. .\noptions ndots:1 rotate\noptions ndots:3\n")
    assert conf.nameservers == ["192.0.2.1", "192.0.2.2"]
    assert conf.searches == ["c.example"]
    assert sorted(conf.options) == ["ndots:3", "rotate"]
    assert read_resolv_conf(str(tmp_path / "missing")).nameservers == []
    path = tmp_path / "resolv.conf"
    path.write_text("nameserver 127.0.0.53\n")
    assert read_resolv_conf(str(path)).nameservers == ["127.0.0.53"]
