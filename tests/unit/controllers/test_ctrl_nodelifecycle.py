"""Node lifecycle: a node whose kubelet never posted status gets upstream's
Unknown conditions and unreachable taints once the startup grace period has
passed."""

from __future__ import annotations

import datetime as dt

import pytest

from kubeplane.api.meta import format_time, utcnow
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.nodelifecycle import NodeLifecycleController
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore
from helpers import eventually

NODES = resource("nodes")


class Clock:
    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> dt.datetime:
        return utcnow() + dt.timedelta(seconds=self.offset)


@pytest.fixture
async def env():
    store = MemoryStore(history=500)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    factory = SharedInformerFactory(client)
    clock = Clock()
    ctrl = NodeLifecycleController(client, factory, startup_grace=60.0, clock=clock)
    await ctrl.start(sync_timeout=1)
    yield client, clock, ctrl
    await ctrl.stop(timeout=1)
    await factory.stop()
    await client.close()
    await registry.close()
    await store.close()


def conds(node):
    return {c["type"]: c for c in (node.get("status") or {}).get("conditions") or []}


async def test_never_reporting_node_gets_unknown_conditions_and_taints(env):
    client, clock, ctrl = env
    ghost = await client.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "ghost"}})
    # The registered node looks as upstream's: empty value structs.
    assert ghost["spec"] == {}
    assert ghost["status"]["daemonEndpoints"] == {"kubeletEndpoint": {"Port": 0}}
    assert ghost["status"]["nodeInfo"]["kubeletVersion"] == ""
    # Within the startup grace period nothing changes (the key is parked until then).
    await ctrl.sync("ghost")
    assert not conds(await client.get(NODES, "ghost"))
    clock.offset = 61
    await ctrl.sync("ghost")
    node = await eventually(lambda: _with_taints(client))
    c = conds(node)
    assert sorted(c) == ["DiskPressure", "MemoryPressure", "PIDPressure", "Ready"]
    for cond in c.values():
        assert (cond["status"], cond["reason"], cond["message"]) == (
            "Unknown", "NodeStatusNeverUpdated", "Kubelet never posted node status.")
        assert cond["lastHeartbeatTime"] == ghost["metadata"]["creationTimestamp"]
    taints = node["spec"]["taints"]
    assert [(t["key"], t["effect"]) for t in taints] == [
        ("node.kubernetes.io/unreachable", "NoSchedule"), ("node.kubernetes.io/unreachable", "NoExecute")]
    assert "timeAdded" in taints[1] and "timeAdded" not in taints[0]
    # The kubelet reports after all: the taints go.
    node["status"]["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                     "lastHeartbeatTime": format_time(utcnow()),
                                     "lastTransitionTime": format_time(utcnow())}]
    await client.update(NODES, node, subresource="status")
    await eventually(lambda: _untainted(client))


async def _with_taints(client):
    node = await client.get(NODES, "ghost")
    return node if len((node.get("spec") or {}).get("taints") or []) == 2 else None


async def _untainted(client):
    node = await client.get(NODES, "ghost")
    return node if not (node.get("spec") or {}).get("taints") else None


async def test_reporting_nodes_are_left_alone(env):
    client, clock, ctrl = env
    clock.offset = 3600
    now = format_time(utcnow())
    node = await client.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "live"},
                                       "status": {"conditions": [{"type": "Ready", "status": "True",
                                                                  "lastHeartbeatTime": now,
                                                                  "lastTransitionTime": now}]}})
    await ctrl.sync("live")
    after = await client.get(NODES, "live")
    assert after["metadata"]["resourceVersion"] == node["metadata"]["resourceVersion"]
