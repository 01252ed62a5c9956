"""Garbage collector against a real registry (with the workload controllers where useful)."""

from __future__ import annotations

from typing import Any, AsyncIterator

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.deployment import DeploymentController
from kubeplane.controllers.garbagecollector import GarbageCollector
from kubeplane.controllers.replicaset import ReplicaSetController
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore
from helpers import caught_up, eventually, settled

PODS = resource("pods")
RS = resource("replicasets")
DEPLOY = resource("deployments")
CMS = resource("configmaps")
NS = "default"


class Env:
    def __init__(self, client: InProcessClient, gc: GarbageCollector) -> None:
        self.client = client
        self.gc = gc

    async def names(self, res: Any) -> set[str]:
        return {o["metadata"]["name"] for o in (await self.client.list(res, NS))["items"]}

    async def gone(self, res: Any, name: str) -> bool:
        try:
            await self.client.get(res, name, NS)
        except StatusError as err:
            return err.code == 404
        return False


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    store = MemoryStore(history=5000)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    factory = SharedInformerFactory(client)
    gc = GarbageCollector(client, factory)
    rsc = ReplicaSetController(client, factory)
    dc = DeploymentController(client, factory)
    for c in (gc, rsc, dc):
        await c.start(sync_timeout=1)
    yield Env(client, gc)
    for c in (dc, rsc, gc):
        await c.stop(timeout=1)
    await factory.stop()
    await client.close()
    await registry.close()
    await store.close()


def owner_ref(obj: dict, *, block: bool = False, controller: bool = False) -> dict:
    return {"apiVersion": obj.get("apiVersion", "v1"), "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "blockOwnerDeletion": block, "controller": controller}


def cm(name: str, *, owners: list[dict] | None = None, finalizers: list[str] | None = None) -> dict:
    md: dict = {"name": name}
    if owners:
        md["ownerReferences"] = owners
    if finalizers:
        md["finalizers"] = finalizers
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": md, "data": {"k": "v"}}


def deployment(name: str, replicas: int) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name}, "spec": {
        "replicas": replicas, "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}},
                     "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}}}}


async def test_background_cascade_after_deployment_delete(env: Env) -> None:
    await env.client.create(DEPLOY, deployment("web", 3), NS)

    async def three_pods() -> bool:
        return len(await env.names(PODS)) == 3 and len(await env.names(RS)) == 1

    await eventually(three_pods)
    await env.client.delete(DEPLOY, "web", NS, propagation_policy="Background")

    async def all_gone() -> bool:
        return not await env.names(RS) and not await env.names(PODS)

    await eventually(all_gone)


async def test_dependent_with_missing_owner_is_deleted(env: Env) -> None:
    owner = await env.client.create(CMS, cm("owner"), NS)
    dep = await env.client.create(CMS, cm("dep", owners=[owner_ref(owner)]), NS)
    await env.client.delete(CMS, "owner", NS)
    await eventually(lambda: env.gone(CMS, "dep"))
    # A dependent naming an owner uid that never existed goes too.
    await env.client.create(CMS, cm("ghost-dep", owners=[{**owner_ref(dep), "name": "nope", "uid": "no-such"}]), NS)
    await eventually(lambda: env.gone(CMS, "ghost-dep"))


async def test_dependent_with_a_live_owner_survives(env: Env) -> None:
    a = await env.client.create(CMS, cm("a"), NS)
    b = await env.client.create(CMS, cm("b"), NS)
    await env.client.create(CMS, cm("dep", owners=[owner_ref(a), owner_ref(b)]), NS)
    await env.client.delete(CMS, "a", NS)

    async def only_b() -> bool:
        dep = await env.client.get(CMS, "dep", NS)
        return [r["name"] for r in dep["metadata"].get("ownerReferences") or []] == ["b"]

    await eventually(only_b)
    assert not await env.gone(CMS, "dep")


async def test_foreground_deletes_blocking_dependents_first(env: Env) -> None:
    owner = await env.client.create(CMS, cm("owner", finalizers=["example.com/hold"]), NS)
    blocker = await env.client.create(CMS, cm("blocker", owners=[owner_ref(owner, block=True)],
                                              finalizers=["example.com/hold"]), NS)
    await env.client.create(CMS, cm("plain", owners=[owner_ref(owner)]), NS)
    await env.client.delete(CMS, "owner", NS, propagation_policy="Foreground")
    got = await env.client.get(CMS, "owner", NS)
    assert "foregroundDeletion" in got["metadata"]["finalizers"]

    async def plain_gone_blocker_deleting() -> bool:
        b = await env.client.get(CMS, "blocker", NS)
        return await env.gone(CMS, "plain") and bool(b["metadata"].get("deletionTimestamp"))

    await eventually(plain_gone_blocker_deleting)
    # The blocker lingers (its own finalizer): the owner keeps foregroundDeletion.
    # Sync point: the collector's graph has seen the blocker deleting and the plain
    # dependent gone (which re-queues the owner), and its queues have drained.
    gc = env.gc
    await eventually(lambda: gc.nodes[blocker["metadata"]["uid"]].deleting
                     and not any(n.name == "plain" for n in gc.nodes.values())
                     and gc.attempt_to_delete.idle and gc.attempt_to_orphan.idle)
    owner_now = await env.client.get(CMS, "owner", NS)
    assert "foregroundDeletion" in owner_now["metadata"]["finalizers"]
    await env.client.patch(CMS, "blocker", {"metadata": {"finalizers": None}}, NS)

    async def owner_released() -> bool:
        o = await env.client.get(CMS, "owner", NS)
        return o["metadata"].get("finalizers") == ["example.com/hold"]

    await eventually(owner_released)
    await env.client.patch(CMS, "owner", {"metadata": {"finalizers": None}}, NS)
    assert await eventually(lambda: env.gone(CMS, "owner"))


async def test_foreground_deployment_delete_cascades_through_replicaset(env: Env) -> None:
    await env.client.create(DEPLOY, deployment("web", 2), NS)

    async def two_pods() -> bool:
        return len(await env.names(PODS)) == 2

    await eventually(two_pods)
    await env.client.delete(DEPLOY, "web", NS, propagation_policy="Foreground")

    async def everything_gone() -> bool:
        return (await env.gone(DEPLOY, "web")) and not await env.names(RS) and not await env.names(PODS)

    await eventually(everything_gone)


async def test_orphan_strips_owner_references(env: Env) -> None:
    owner = await env.client.create(CMS, cm("owner", finalizers=["orphan"]), NS)
    await env.client.create(CMS, cm("dep", owners=[owner_ref(owner, block=True)]), NS)
    await env.client.delete(CMS, "owner", NS)
    await eventually(lambda: env.gone(CMS, "owner"))
    dep = await env.client.get(CMS, "dep", NS)
    assert not dep["metadata"].get("ownerReferences")
    # Sync point: the collector has seen the owner's deletion and the stripped
    # dependent, and has nothing left to do.
    gc = env.gc
    await eventually(lambda: caught_up(gc, gc.factory.informer_for(CMS), dep["metadata"]["resourceVersion"])
                     and owner["metadata"]["uid"] not in gc.nodes)
    assert not await env.gone(CMS, "dep")


async def test_orphan_deployment_delete_keeps_replicaset_and_pods(env: Env) -> None:
    await env.client.create(DEPLOY, deployment("web", 2), NS)

    async def two_pods() -> bool:
        return len(await env.names(PODS)) == 2

    await eventually(two_pods)
    await env.client.delete(DEPLOY, "web", NS, propagation_policy="Orphan")
    await eventually(lambda: env.gone(DEPLOY, "web"))
    (rs,) = (await env.client.list(RS, NS))["items"]
    assert not rs["metadata"].get("ownerReferences")
    gc = env.gc
    await settled(gc, env.client, (gc.factory.informer_for(RS), RS), (gc.factory.informer_for(PODS), PODS),
                  namespace=NS)
    assert len(await env.names(PODS)) == 2
