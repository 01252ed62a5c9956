"""DefaultTolerationSeconds: pods not tolerating the not-ready / unreachable
NoExecute taints get five-minute tolerations, on create and update."""

from __future__ import annotations

import pytest

from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.inprocess import InProcessClient
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

PODS = resource("pods")
NOT_READY = "node.kubernetes.io/not-ready"
UNREACHABLE = "node.kubernetes.io/unreachable"


@pytest.fixture
async def client():
    store = MemoryStore()
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    c = InProcessClient(registry)
    yield c
    await c.close()
    await registry.close()
    await store.close()


async def create(client, name, tolerations=None):
    spec = {"containers": [{"name": "c", "image": "nginx:1"}]}
    if tolerations is not None:
        spec["tolerations"] = tolerations
    return (await client.create(PODS, {"metadata": {"name": name}, "spec": spec}, "default"))["spec"]["tolerations"]


async def test_both_added_to_a_pod_without_tolerations(client):
    assert await create(client, "a") == [
        {"key": NOT_READY, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        {"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]


async def test_existing_tolerations_are_kept_and_count(client):
    own = {"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 10}
    assert await create(client, "b", [own]) == [
        own, {"key": NOT_READY, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]
    # an empty effect tolerates NoExecute too; a NoSchedule one does not
    t = await create(client, "c", [{"key": NOT_READY, "operator": "Exists"},
                                   {"key": UNREACHABLE, "operator": "Exists", "effect": "NoSchedule"}])
    assert [x["key"] for x in t] == [NOT_READY, UNREACHABLE, UNREACHABLE]
    # tolerating everything (empty key, Exists) needs nothing more
    assert await create(client, "d", [{"operator": "Exists"}]) == [{"operator": "Exists"}]
