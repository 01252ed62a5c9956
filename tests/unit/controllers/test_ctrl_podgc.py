"""Pod garbage collector: terminated pods above the threshold (evicted, then
oldest, first), orphans after the quarantine (injected clock), unscheduled
terminating pods and terminating pods on out-of-service nodes."""

from __future__ import annotations

import datetime as dt

import pytest

from kubeplane.api.meta import utcnow
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.podgc import PodGCController
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore
from helpers import settled

PODS = resource("pods")
NODES = resource("nodes")
NS = "default"


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
    created = utcnow()
    registry = Registry(store, CATALOGUE, clock=lambda: created)  # one creationTimestamp for all
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    factory = SharedInformerFactory(client)
    clock = Clock()
    # a long check period: the test runs each pass itself
    ctrl = PodGCController(client, factory, terminated_pod_threshold=2, check_period=3600, clock=clock)
    await ctrl.start(sync_timeout=1)
    for n in ("n1", "n2"):
        await client.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}})
    yield client, clock, ctrl
    await ctrl.stop(timeout=1)
    await factory.stop()
    await client.close()
    await registry.close()
    await store.close()


async def pod(client, name, *, node="n1", phase=None, reason=None, finalizer=False):
    md = {"name": name}
    if finalizer:
        md["finalizers"] = ["example.com/hold"]
    spec = {"containers": [{"name": "c", "image": "nginx:1"}]}
    if node:
        spec["nodeName"] = node
    await client.create(PODS, {"metadata": md, "spec": spec}, NS)
    if phase:
        status = {"phase": phase}
        if reason:
            status["reason"] = reason
        await client.patch(PODS, name, {"status": status}, NS, subresource="status")


async def names(client) -> set[str]:
    return {p["metadata"]["name"] for p in (await client.list(PODS, NS))["items"]}


async def run_pass(client, ctrl) -> None:
    await settled(ctrl, client, (ctrl.pods, PODS), (ctrl.nodes, NODES), namespace=None, delayed=True)
    await ctrl.gc()


async def test_terminated_pods_above_the_threshold_go_evicted_and_oldest_first(env):
    client, clock, ctrl = env
    # created within one second: equal timestamps fall back to the names
    await pod(client, "c-done", phase="Succeeded")
    await pod(client, "a-failed", phase="Failed")
    await pod(client, "d-evicted", phase="Failed", reason="Evicted")
    await pod(client, "b-done", phase="Succeeded")
    await pod(client, "running", phase="Running")
    await run_pass(client, ctrl)
    # four terminated, threshold two: the evicted one, then the first by age and name
    assert await names(client) == {"b-done", "c-done", "running"}


async def test_orphans_go_after_the_quarantine(env):
    client, clock, ctrl = env
    await pod(client, "orphan", node="vanished", phase="Running")
    await pod(client, "fine", node="n2", phase="Running")
    await run_pass(client, ctrl)
    assert "orphan" in await names(client)  # quarantined, not yet deleted
    clock.advance(41)
    await run_pass(client, ctrl)
    assert await names(client) == {"fine"}


async def test_orphan_is_marked_failed_with_the_condition_first(env):
    client, clock, ctrl = env
    await pod(client, "held", node="vanished", phase="Running", finalizer=True)
    await run_pass(client, ctrl)
    clock.advance(41)
    await run_pass(client, ctrl)
    p = await client.get(PODS, "held", NS)
    assert p["status"]["phase"] == "Failed" and p["metadata"].get("deletionTimestamp")
    cond = next(c for c in p["status"]["conditions"] if c["type"] == "DisruptionTarget")
    assert (cond["status"], cond["reason"], cond["message"]) == ("True", "DeletionByPodGC",
                                                                 "PodGC: node no longer exists")
    await client.patch(PODS, "held", {"metadata": {"finalizers": None}}, NS)


async def test_unscheduled_and_out_of_service_terminating_pods(env):
    client, clock, ctrl = env
    # terminating and never scheduled: a finalizer keeps it until the collector force-deletes
    await pod(client, "unscheduled", node=None)
    await client.patch(PODS, "unscheduled", {"metadata": {"finalizers": ["example.com/hold"]}}, NS)
    await client.delete(PODS, "unscheduled", NS)
    # terminating on a node that is not ready and out of service
    await pod(client, "stuck", node="n2", phase="Running")
    await client.delete(PODS, "stuck", NS)
    await pod(client, "stuck-ok", node="n1", phase="Running")
    await client.delete(PODS, "stuck-ok", NS)
    await client.patch(NODES, "n2", {"spec": {"taints": [{"key": "node.kubernetes.io/out-of-service",
                                                          "effect": "NoExecute"}]}})
    await run_pass(client, ctrl)
    left = await names(client)
    assert "stuck" not in left and "stuck-ok" in left
    p = await client.get(PODS, "unscheduled", NS)
    assert p["status"]["phase"] == "Failed"  # marked, then deleted (the finalizer holds it)
    await client.patch(PODS, "unscheduled", {"metadata": {"finalizers": None}}, NS)
    assert "unscheduled" not in await names(client)
