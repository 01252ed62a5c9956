"""Taint-eviction controller: pods on a node with NoExecute taints go at once
or after their tolerationSeconds (by the injected clock), and stay when the
taint goes first."""

from __future__ import annotations

import datetime as dt

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import utcnow
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.tainteviction import (
    TaintEvictionController,
    matching_tolerations,
    min_toleration_seconds,
    tolerates,
)
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore
from helpers import eventually

PODS = resource("pods")
NODES = resource("nodes")
EVENTS = resource("events")
NS = "default"
UNREACHABLE = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}


class Clock:
    def __init__(self) -> None:
        self.now = utcnow()

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


@pytest.fixture
async def env():
    store = MemoryStore(history=2000)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    factory = SharedInformerFactory(client)
    clock = Clock()
    ctrl = TaintEvictionController(client, factory, clock=clock)
    await ctrl.start(sync_timeout=1)
    await client.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    yield client, clock, ctrl
    await ctrl.stop(timeout=1)
    await factory.stop()
    await client.close()
    await registry.close()
    await store.close()


async def pod(client, name, tolerations=None):
    spec = {"nodeName": "n1", "containers": [{"name": "c", "image": "nginx:1"}]}
    if tolerations is not None:
        spec["tolerations"] = tolerations
    return await client.create(PODS, {"metadata": {"name": name}, "spec": spec}, NS)


async def taint(client, *taints):
    await client.patch(NODES, "n1", {"spec": {"taints": list(taints) or None}})


async def gone(client, name) -> bool:
    try:
        p = await client.get(PODS, name, NS)
    except StatusError as err:
        return err.code == 404
    return bool(p["metadata"].get("deletionTimestamp"))


async def test_default_tolerations_evict_after_300s_intolerant_at_once(env):
    client, clock, ctrl = env
    created = await pod(client, "defaulted")  # DefaultTolerationSeconds: 300 s for not-ready and unreachable
    assert {(t["key"], t["tolerationSeconds"]) for t in created["spec"]["tolerations"]} == {
        ("node.kubernetes.io/not-ready", 300), ("node.kubernetes.io/unreachable", 300)}
    await pod(client, "forever", [{"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                                   "effect": "NoExecute"}])
    await pod(client, "intolerant", [{"key": "other", "operator": "Exists", "effect": "NoExecute"}])
    await taint(client, {"key": "custom", "effect": "NoExecute"})
    # none of them tolerates "custom": all three go at once
    for name in ("intolerant", "defaulted", "forever"):
        await eventually(lambda: gone(client, name))


async def test_toleration_seconds_count_from_the_taint(env):
    client, clock, ctrl = env
    await pod(client, "p")
    await pod(client, "q", [{"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                             "effect": "NoExecute", "tolerationSeconds": 30}])
    await taint(client, UNREACHABLE)
    await eventually(lambda: {"default/p", "default/q"} <= set(ctrl.scheduled))
    clock.advance(31)
    assert ctrl.fire_due() == 1
    await eventually(lambda: gone(client, "q"))
    q = await client.get(PODS, "q", NS)  # bound and not finished: it terminates gracefully
    cond = next(c for c in q["status"]["conditions"] if c["type"] == "DisruptionTarget")
    assert (cond["reason"], cond["message"]) == ("DeletionByTaintManager",
                                                 "Taint manager: deleting due to NoExecute taint")
    assert not await gone(client, "p")
    clock.advance(270)
    assert ctrl.fire_due() == 1
    await eventually(lambda: gone(client, "p"))
    evs = {e["message"] for e in (await client.list(EVENTS, NS))["items"] if e["reason"] == "TaintManagerEviction"}
    assert {"Marking for deletion Pod default/p", "Marking for deletion Pod default/q"} <= evs


async def test_taint_removed_in_time_cancels(env):
    client, clock, ctrl = env
    await pod(client, "stays")
    await taint(client, UNREACHABLE)
    await eventually(lambda: "default/stays" in ctrl.scheduled)
    await taint(client)
    await eventually(lambda: "default/stays" not in ctrl.scheduled)
    clock.advance(400)
    assert ctrl.fire_due() == 0
    assert not await gone(client, "stays")

    async def cancelled():
        evs = (await client.list(EVENTS, NS))["items"]
        return any(e["message"] == "Cancelling deletion of Pod default/stays" for e in evs)
    await eventually(cancelled)


def test_toleration_matching():
    t = {"key": "k", "effect": "NoExecute"}
    assert tolerates({"operator": "Exists"}, t)
    assert tolerates({"key": "k", "operator": "Exists"}, t)
    assert not tolerates({"key": "k", "operator": "Exists", "effect": "NoSchedule"}, t)
    assert tolerates({"key": "k", "value": "", "operator": "Equal"}, t)
    assert not tolerates({"key": "k", "value": "v"}, t)
    ok, used = matching_tolerations([t], [{"key": "x", "operator": "Exists"}, {"key": "k", "operator": "Exists",
                                                                              "tolerationSeconds": 5}])
    assert ok and min_toleration_seconds(used) == 5
    assert matching_tolerations([t], []) == (False, [])
    assert min_toleration_seconds([{"tolerationSeconds": -3}]) == 0
    assert min_toleration_seconds([{"key": "k"}]) == -1
