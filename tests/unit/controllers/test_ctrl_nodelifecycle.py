"""Node lifecycle: health monitoring with an injected clock. A node that never
posted status, or stops renewing its Lease and status, becomes Unknown after
the grace period; conditions become taints (NoSchedule, and NoExecute through
the zone's rate limiter); pods on a node that went not ready are marked not
ready; a cluster whose every node is down is left untainted."""

from __future__ import annotations

import datetime as dt

import pytest

from kubeplane.api.meta import format_time, utcnow
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.nodelifecycle import NodeLifecycleController, TokenBucket
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore
from helpers import eventually

NODES = resource("nodes")
PODS = resource("pods")
LEASES = resource("leases")
EVENTS = resource("events")

UNREACHABLE = "node.kubernetes.io/unreachable"
NOT_READY = "node.kubernetes.io/not-ready"


class Clock:
    """Wall time moved by hand: ``advance`` adds seconds."""

    def __init__(self) -> None:
        self.now = utcnow().replace(microsecond=0)

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
    ctrl = NodeLifecycleController(client, factory, startup_grace=60.0, monitor_grace=50.0, monitor_period=0.02,
                                   clock=clock)
    await ctrl.start(sync_timeout=1)
    yield client, clock, ctrl
    await ctrl.stop(timeout=1)
    await factory.stop()
    await client.close()
    await registry.close()
    await store.close()


def conds(node):
    return {c["type"]: c for c in (node.get("status") or {}).get("conditions") or []}


def taints(node):
    return sorted((t["key"], t["effect"]) for t in (node.get("spec") or {}).get("taints") or [])


async def add_node(client, clock, name, *, zone: str | None = None, ready: str = "True") -> dict:
    labels = {"topology.kubernetes.io/zone": zone, "topology.kubernetes.io/region": "r"} if zone else {}
    now = format_time(clock())
    node = await client.create(NODES, {"apiVersion": "v1", "kind": "Node",
                                       "metadata": {"name": name, "labels": labels}})
    node["status"]["conditions"] = [{"type": "Ready", "status": ready, "reason": "KubeletReady",
                                     "message": "kubelet is posting ready status",
                                     "lastHeartbeatTime": now, "lastTransitionTime": now}]
    await client.update(NODES, node, subresource="status")
    await renew(client, clock, name)
    return node


async def renew(client, clock, name) -> None:
    stamp = clock().strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    try:
        await client.patch(LEASES, name, {"spec": {"renewTime": stamp}}, "kube-node-lease")
    except Exception:  # noqa: BLE001 - first renewal creates it
        await client.create(LEASES, {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                     "metadata": {"name": name, "namespace": "kube-node-lease"},
                                     "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                                              "renewTime": stamp}}, "kube-node-lease")


async def run_pod(client, name, node) -> None:
    await client.create(PODS, {"metadata": {"name": name}, "spec": {
        "nodeName": node, "containers": [{"name": "c", "image": "nginx:1"}]}}, "default")
    now = format_time(utcnow())
    await client.patch(PODS, name, {"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": now}]}}, "default", subresource="status")


async def node_when(client, name, pred):
    async def check():
        node = await client.get(NODES, name)
        return node if pred(node) else None
    return await eventually(check, what=f"node {name}")


async def test_never_reporting_node_gets_unknown_conditions_and_taints(env):
    client, clock, ctrl = env
    await add_node(client, clock, "live")
    ghost = await client.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "ghost"}})
    # The registered node looks as upstream's: empty value structs.
    assert ghost["spec"] == {}
    assert ghost["status"]["daemonEndpoints"] == {"kubeletEndpoint": {"Port": 0}}
    # Within the startup grace period nothing changes.
    await eventually(lambda: "ghost" in ctrl.health)
    clock.advance(30)
    await renew(client, clock, "live")
    await eventually(lambda: ctrl.health["live"].probe_timestamp == clock())
    assert not conds(await client.get(NODES, "ghost"))
    clock.advance(31)
    await renew(client, clock, "live")
    node = await node_when(client, "ghost", lambda n: len(taints(n)) == 2)
    c = conds(node)
    assert sorted(c) == ["DiskPressure", "MemoryPressure", "PIDPressure", "Ready"]
    for cond in c.values():
        assert (cond["status"], cond["reason"], cond["message"]) == (
            "Unknown", "NodeStatusNeverUpdated", "Kubelet never posted node status.")
        assert cond["lastHeartbeatTime"] == ghost["metadata"]["creationTimestamp"]
    assert taints(node) == [(UNREACHABLE, "NoExecute"), (UNREACHABLE, "NoSchedule")]
    assert all(t.get("timeAdded") for t in node["spec"]["taints"])
    # The kubelet reports after all: the taints go.
    now = format_time(clock())
    node["status"]["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                     "lastHeartbeatTime": now, "lastTransitionTime": now}]
    await client.update(NODES, node, subresource="status")
    await node_when(client, "ghost", lambda n: not taints(n))
    # the healthy node was never touched
    assert taints(await client.get(NODES, "live")) == []


async def test_node_that_stops_heartbeating_becomes_unknown_and_its_pods_not_ready(env):
    client, clock, ctrl = env
    await add_node(client, clock, "a")
    await add_node(client, clock, "b")
    await run_pod(client, "on-a", "a")
    await run_pod(client, "on-b", "b")
    await eventually(lambda: {"a", "b"} <= set(ctrl.health))
    # Lease renewals alone keep a node healthy, without a status post.
    for _ in range(3):
        clock.advance(30)
        await renew(client, clock, "a")
        await renew(client, clock, "b")
        await eventually(lambda: all(h.probe_timestamp == clock() for h in ctrl.health.values()))
    assert conds(await client.get(NODES, "a"))["Ready"]["status"] == "True"
    # "a" stops: after the grace period (50 s) its conditions become Unknown.
    clock.advance(30)
    await renew(client, clock, "b")
    await eventually(lambda: ctrl.health["b"].probe_timestamp == clock())
    assert conds(await client.get(NODES, "a"))["Ready"]["status"] == "True"
    clock.advance(25)
    await renew(client, clock, "b")
    node = await node_when(client, "a", lambda n: conds(n)["Ready"]["status"] == "Unknown")
    ready = conds(node)["Ready"]
    assert (ready["reason"], ready["message"]) == ("NodeStatusUnknown", "Kubelet stopped posting node status.")
    assert ready["lastTransitionTime"] == format_time(clock())
    # never-posted pressure conditions are added as never updated
    assert conds(node)["MemoryPressure"]["reason"] == "NodeStatusNeverUpdated"
    node = await node_when(client, "a", lambda n: taints(n) == [(UNREACHABLE, "NoExecute"),
                                                                (UNREACHABLE, "NoSchedule")])

    async def pod_not_ready():
        pod = await client.get(PODS, "on-a", "default")
        return next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")["status"] == "False"
    await eventually(pod_not_ready)
    other = await client.get(PODS, "on-b", "default")
    assert next(c for c in other["status"]["conditions"] if c["type"] == "Ready")["status"] == "True"

    async def events():
        items = (await client.list(EVENTS, "default"))["items"]
        return {(e["involvedObject"].get("name"), e["reason"], e["message"]) for e in items}
    await eventually(lambda: _has(events, ("a", "NodeNotReady", "Node a status is now: NodeNotReady")))
    await eventually(lambda: _has(events, ("on-a", "NodeNotReady", "Node is not ready")))
    assert taints(await client.get(NODES, "b")) == []

    # The kubelet says NotReady: not-ready replaces unreachable at once.
    now = format_time(clock())
    node = await client.get(NODES, "a")
    node["status"]["conditions"] = [{"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                                     "lastHeartbeatTime": now, "lastTransitionTime": now}]
    await client.update(NODES, node, subresource="status")
    await node_when(client, "a", lambda n: taints(n) == [(NOT_READY, "NoExecute"), (NOT_READY, "NoSchedule")])


async def _has(events, item) -> bool:
    return item in await events()


async def test_every_node_down_is_master_disruption_and_nothing_is_tainted(env):
    client, clock, ctrl = env
    await add_node(client, clock, "x")
    await add_node(client, clock, "y")
    await eventually(lambda: {"x", "y"} <= set(ctrl.health))
    clock.advance(51)
    for name in ("x", "y"):
        await node_when(client, name, lambda n: conds(n)["Ready"]["status"] == "Unknown")
    await eventually(lambda: set(ctrl.zone_states.values()) == {"FullDisruption"})
    # NoSchedule taints mirror the conditions; the NoExecute ones are held back.
    for name in ("x", "y"):
        node = await node_when(client, name, lambda n: (UNREACHABLE, "NoSchedule") in taints(n))
        assert (UNREACHABLE, "NoExecute") not in taints(node)
    # One node comes back: normal operation, the other is tainted NoExecute.
    await renew(client, clock, "x")
    now = format_time(clock())
    x = await client.get(NODES, "x")
    x["status"]["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                  "lastHeartbeatTime": now, "lastTransitionTime": now}]
    await client.update(NODES, x, subresource="status")
    await eventually(lambda: set(ctrl.zone_states.values()) == {"Normal"})
    await node_when(client, "y", lambda n: (UNREACHABLE, "NoExecute") in taints(n))
    await node_when(client, "x", lambda n: taints(n) == [])


async def test_no_execute_taints_are_rate_limited_per_zone(env):
    client, clock, ctrl = env
    for i in range(6):
        await add_node(client, clock, f"n{i}", zone="z1")
    await eventually(lambda: len(ctrl.health) == 6)
    for _ in range(2):
        clock.advance(26)
        for i in range(2, 6):
            await renew(client, clock, f"n{i}")
        await eventually(lambda: ctrl.health["n5"].probe_timestamp == clock())
    # two of six down: the zone stays Normal, one node per 10 s (0.1 qps) is tainted
    first = await eventually(lambda: _tainted(client, ["n0", "n1"]))
    assert len(first) == 1
    clock.advance(5)
    for i in range(2, 6):
        await renew(client, clock, f"n{i}")
    await eventually(lambda: ctrl.health["n2"].probe_timestamp == clock())
    assert len(await _tainted(client, ["n0", "n1"])) == 1
    clock.advance(6)
    for i in range(2, 6):
        await renew(client, clock, f"n{i}")
    await eventually(lambda: _count(client, ["n0", "n1"], 2))


async def _tainted(client, names) -> list[str]:
    out = []
    for n in names:
        if (UNREACHABLE, "NoExecute") in taints(await client.get(NODES, n)):
            out.append(n)
    return out


async def _count(client, names, want) -> bool:
    return len(await _tainted(client, names)) == want


async def test_cordon_gives_the_unschedulable_taint(env):
    client, clock, ctrl = env
    await add_node(client, clock, "c")
    await client.patch(NODES, "c", {"spec": {"unschedulable": True}})
    await node_when(client, "c", lambda n: taints(n) == [("node.kubernetes.io/unschedulable", "NoSchedule")])
    await client.patch(NODES, "c", {"spec": {"unschedulable": None}})
    await node_when(client, "c", lambda n: taints(n) == [])


def test_token_bucket():
    b = TokenBucket(0.1, 0.0)
    assert b.try_accept(0.0) and not b.try_accept(0.0)
    assert not b.try_accept(9.9) and b.try_accept(10.5)
    assert not TokenBucket(0.0, 0.0).try_accept(100.0)
