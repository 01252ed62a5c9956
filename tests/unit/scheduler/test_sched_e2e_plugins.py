"""Each default plugin's main behaviour, end to end: real registry, in-process
client, informers, queue, cache and binding."""

from __future__ import annotations

import asyncio

import pytest

from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.inprocess import InProcessClient
from kubeplane.registry.registry import Registry
from kubeplane.scheduler.scheduler import Scheduler
from kubeplane.storage.memory import MemoryStore
from helpers import eventually

PODS = resource("pods")
NODES = resource("nodes")
PCS = resource("priorityclasses")


def node(name, cpu="4", labels=None, taints=None, unschedulable=False):
    alloc = {"cpu": cpu, "memory": "32Gi", "pods": "110"}
    spec = {}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": spec, "status": {"capacity": alloc, "allocatable": alloc,
                                     "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(name, cpu="100m", labels=None, **spec):
    return {"metadata": {"name": name, "labels": labels or {}},
            "spec": {"containers": [{"name": "c", "image": "nginx", "resources": {"requests": {"cpu": cpu}}}],
                     **spec}}


@pytest.fixture
async def env():
    store = MemoryStore()
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    state: dict = {}

    async def start():
        sched = Scheduler(client)
        state["sched"] = sched
        state["task"] = asyncio.create_task(sched.run())
        return sched

    yield client, start
    if "sched" in state:
        await state["sched"].stop()
        await asyncio.wait_for(state["task"], 5)
    await registry.close()
    await store.close()


async def node_of(client, name, timeout=5.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        p = await client.get(PODS, name, "default")
        if p["spec"].get("nodeName"):
            return p["spec"]["nodeName"]
        await asyncio.sleep(0.02)
    return None


async def failure_message(client, name, timeout=5.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        p = await client.get(PODS, name, "default")
        for c in p["status"].get("conditions") or []:
            if c["type"] == "PodScheduled" and c["status"] == "False":
                return c["message"]
        await asyncio.sleep(0.02)
    return None


async def test_node_name_unschedulable_and_taints(env):
    client, start = env
    await client.create(NODES, node("a"))
    await client.create(NODES, node("cordoned", unschedulable=True))
    await client.create(NODES, node("tainted", taints=[{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]))
    await start()
    await client.create(PODS, pod("pinned", nodeName=None, nodeSelector={"kubernetes.io/hostname": "tainted"},
                                  tolerations=[{"key": "gpu", "operator": "Equal", "value": "yes",
                                                "effect": "NoSchedule"}]), "default")
    assert await node_of(client, "pinned") == "tainted"
    await client.create(PODS, pod("to-cordoned", nodeSelector={"kubernetes.io/hostname": "cordoned"}), "default")
    msg = await failure_message(client, "to-cordoned")
    # Each node reports its first failing filter, in the profile's plugin order.
    assert msg.startswith("0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
                          "1 node(s) had untolerated taint {gpu: yes}, 1 node(s) were unschedulable.")
    await client.create(PODS, pod("plain"), "default")
    assert await node_of(client, "plain") == "a"


async def test_node_affinity_and_ports(env):
    client, start = env
    await client.create(NODES, node("ssd", labels={"disk": "ssd"}))
    await client.create(NODES, node("hdd", labels={"disk": "hdd"}))
    await start()
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}]}}}
    await client.create(PODS, pod("fast", affinity=affinity), "default")
    assert await node_of(client, "fast") == "ssd"
    port_pod = pod("p1")
    port_pod["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
    await client.create(PODS, port_pod, "default")
    first = await node_of(client, "p1")
    port_pod2 = pod("p2")
    port_pod2["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
    await client.create(PODS, port_pod2, "default")
    second = await node_of(client, "p2")
    assert {first, second} == {"ssd", "hdd"}
    port_pod3 = pod("p3")
    port_pod3["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
    await client.create(PODS, port_pod3, "default")
    msg = await failure_message(client, "p3")
    assert msg.startswith("0/2 nodes are available: 2 node(s) didn't have free ports for the requested pod ports.")


async def test_topology_spread_and_anti_affinity(env):
    client, start = env
    for i in range(4):
        await client.create(NODES, node(f"n{i}", labels={"zone": f"z{i % 2}"}))
    await start()
    spread = [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
               "labelSelector": {"matchLabels": {"app": "s"}}}]
    for i in range(4):
        await client.create(PODS, pod(f"s{i}", labels={"app": "s"}, topologySpreadConstraints=spread), "default")
    zones = {}
    for i in range(4):
        n = await node_of(client, f"s{i}")
        zones[n] = zones.get(n, 0)
    per_zone = {"z0": 0, "z1": 0}
    for i in range(4):
        n = await node_of(client, f"s{i}")
        per_zone[f"z{int(n[1:]) % 2}"] += 1
    assert per_zone == {"z0": 2, "z1": 2}
    anti = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "solo"}}, "topologyKey": "kubernetes.io/hostname"}]}}
    hosts = set()
    for i in range(4):
        await client.create(PODS, pod(f"solo{i}", labels={"app": "solo"}, affinity=anti), "default")
        hosts.add(await node_of(client, f"solo{i}"))
    assert len(hosts) == 4
    await client.create(PODS, pod("solo-extra", labels={"app": "solo"}, affinity=anti), "default")
    msg = await failure_message(client, "solo-extra")
    assert "didn't match pod anti-affinity rules" in msg


async def test_scheduling_gates_hold_pods_until_removed(env):
    client, start = env
    await client.create(NODES, node("a"))
    sched = await start()
    gated = await client.create(PODS, pod("gated", schedulingGates=[{"name": "example.com/wait"}]), "default")
    # Sync point: the scheduler has received the pod and PreEnqueue parked it as gated.
    await eventually(lambda: sched.queue.locate(gated) == "gated")
    assert (await client.get(PODS, "gated", "default"))["spec"].get("nodeName") is None
    await client.patch(PODS, "gated", {"spec": {"schedulingGates": None}}, "default")
    assert await node_of(client, "gated") == "a"


async def test_preemption_evicts_lower_priority(env):
    client, start = env
    await client.create(PCS, {"metadata": {"name": "high"}, "value": 1000})
    await client.create(NODES, node("only", cpu="1"))
    await start()
    await client.create(PODS, pod("low", cpu="800m"), "default")
    assert await node_of(client, "low") == "only"
    await client.create(PODS, pod("high", cpu="800m", priorityClassName="high", priority=1000), "default")
    # The victim is deleted gracefully and the preemptor nominated to the node.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while loop.time() < deadline:
        low = await client.get(PODS, "low", "default")
        high = await client.get(PODS, "high", "default")
        if low["metadata"].get("deletionTimestamp") and high["status"].get("nominatedNodeName"):
            break
        await asyncio.sleep(0.02)
    assert low["metadata"].get("deletionTimestamp")
    assert high["status"]["nominatedNodeName"] == "only"
    assert any(c["type"] == "DisruptionTarget" for c in low["status"].get("conditions", []))
    # What the kubelet does once the victim's containers stopped.
    await client.delete(PODS, "low", "default", grace_period_seconds=0)
    assert await node_of(client, "high", timeout=15) == "only"
    # The victim got upstream's Preempted event naming its preemptor.
    events = []
    while loop.time() < deadline + 15 and not events:
        events = [e for e in (await client.list(resource("events"), "default"))["items"]
                  if e["reason"] == "Preempted"]
        await asyncio.sleep(0.02)
    [ev] = events
    assert ev["involvedObject"]["name"] == "low" and ev["related"]["name"] == "high"
    assert ev["action"] == "Preempting" and ev["message"].startswith("Preempted by pod ")
