"""The kubernetes Service the API server keeps in ``default``: the first
address of the service range, port 443 to the secure port, Endpoints and an
EndpointSlice listing the advertised address, repaired when changed or deleted."""

from __future__ import annotations

import copy

import pytest

from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.apiserver.kubernetesservice import KubernetesService, advertise_address
from kubeplane.registry.registry import Registry
from kubeplane.registry.servicealloc import ServiceAllocators
from kubeplane.storage.memory import MemoryStore

SVC = resource("services")
EP = resource("endpoints")
SLICES = resource("endpointslices")


@pytest.fixture
async def registry():
    store = MemoryStore()
    reg = Registry(store, CATALOGUE, service_allocators=ServiceAllocators(store, "10.43.0.0/16"))
    await ensure_default_namespaces(reg)
    yield reg
    await reg.close()
    await store.close()


async def test_service_endpoints_and_slice(registry: Registry) -> None:
    keeper = KubernetesService(registry, service_ip=registry.service_allocators.kubernetes_service_ip, port=6443,
                               public_ip="192.0.2.7")
    await keeper.reconcile()
    svc = await registry.get(SVC, "kubernetes", "default")
    assert svc["spec"]["clusterIP"] == "10.43.0.1" and svc["spec"]["clusterIPs"] == ["10.43.0.1"]
    assert svc["spec"]["ports"] == [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]
    assert svc["metadata"]["labels"] == {"component": "apiserver", "provider": "kubernetes"}
    assert "selector" not in svc["spec"]
    assert registry.service_allocators.ips.has("10.43.0.1")
    ep = await registry.get(EP, "kubernetes", "default")
    assert ep["subsets"] == [{"addresses": [{"ip": "192.0.2.7"}],
                              "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}]}]
    assert ep["metadata"]["labels"] == {"endpointslice.kubernetes.io/skip-mirror": "true"}
    es = await registry.get(SLICES, "kubernetes", "default")
    assert es["addressType"] == "IPv4"
    assert es["endpoints"] == [{"addresses": ["192.0.2.7"], "conditions": {"ready": True}}]
    assert es["ports"] == [{"name": "https", "port": 6443, "protocol": "TCP"}]
    assert es["metadata"]["labels"] == {"kubernetes.io/service-name": "kubernetes"}
    # a second pass writes nothing
    before = registry.store.revision
    await keeper.reconcile()
    assert registry.store.revision == before


async def test_repairs_what_was_changed_or_deleted(registry: Registry) -> None:
    keeper = KubernetesService(registry, service_ip="10.43.0.1", port=6443, public_ip="192.0.2.7")
    await keeper.reconcile()
    svc = copy.deepcopy(await registry.get(SVC, "kubernetes", "default"))
    svc["spec"]["ports"][0]["port"] = 8443
    await registry.update(SVC, svc, name="kubernetes", namespace="default")
    await registry.delete(EP, "kubernetes", "default")
    es = copy.deepcopy(await registry.get(SLICES, "kubernetes", "default"))
    es["endpoints"][0]["addresses"] = ["192.0.2.99"]
    await registry.update(SLICES, es, name="kubernetes", namespace="default")
    await keeper.reconcile()
    assert (await registry.get(SVC, "kubernetes", "default"))["spec"]["ports"][0]["port"] == 443
    assert (await registry.get(EP, "kubernetes", "default"))["subsets"][0]["addresses"] == [{"ip": "192.0.2.7"}]
    assert (await registry.get(SLICES, "kubernetes", "default"))["endpoints"][0]["addresses"] == ["192.0.2.7"]
    # the Service deleted: it comes back with the same address
    await registry.delete(SVC, "kubernetes", "default")
    await keeper.reconcile()
    assert (await registry.get(SVC, "kubernetes", "default"))["spec"]["clusterIP"] == "10.43.0.1"


async def test_without_an_address_only_the_service_is_kept(registry: Registry) -> None:
    keeper = KubernetesService(registry, service_ip="10.43.0.1", port=6443, public_ip=None)
    await keeper.reconcile()
    assert (await registry.get(SVC, "kubernetes", "default"))["spec"]["clusterIP"] == "10.43.0.1"
    assert not (await registry.list(EP, "default"))["items"]


def test_advertise_address_choice() -> None:
    assert advertise_address("192.0.2.5", "127.0.0.1") == "192.0.2.5"
    assert advertise_address(None, "192.0.2.6") == "192.0.2.6"
    found = advertise_address(None, "127.0.0.1")
    assert found is None or not found.startswith("127.")
