"""Volume scheduling end to end: the real Scheduler, PV controller and local
provisioner over an in-process registry (no subprocess)."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import pytest

from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.pv import DEFAULT_PROVISIONER, LocalProvisioner, PersistentVolumeController
from kubeplane.volume.matching import ANN_SELECTED_NODE, hostname_affinity, pinned_hostnames
from kubeplane.registry.registry import Registry
from kubeplane.scheduler.scheduler import Scheduler
from kubeplane.storage.memory import MemoryStore
from helpers import eventually

PODS = resource("pods")
NODES = resource("nodes")
PVS = resource("persistentvolumes")
PVCS = resource("persistentvolumeclaims")
SCS = resource("storageclasses")
CAPS = resource("csistoragecapacities")


def node(name: str) -> dict:
    alloc = {"cpu": "4", "memory": "8Gi", "pods": "110"}
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"capacity": alloc, "allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]}}


def storage_class(name: str, mode: str = "WaitForFirstConsumer", provisioner: str = DEFAULT_PROVISIONER,
                  per_node: str | None = None) -> dict:
    sc: dict = {"metadata": {"name": name}, "provisioner": provisioner, "volumeBindingMode": mode,
                "reclaimPolicy": "Delete"}
    if per_node:
        sc["parameters"] = {"capacityPerNode": per_node}
    return sc


def claim(name: str, cls: str, size: str = "1Gi") -> dict:
    return {"metadata": {"name": name}, "spec": {"storageClassName": cls, "accessModes": ["ReadWriteOnce"],
                                                 "resources": {"requests": {"storage": size}}}}


def pod(name: str, *claims: str) -> dict:
    return {"metadata": {"name": name}, "spec": {
        "containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "10m"}}}],
        "volumes": [{"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}} for i, c in enumerate(claims)]}}


def static_pv(name: str, cls: str, node_name: str | None, size: str = "1Gi") -> dict:
    spec: dict = {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"], "storageClassName": cls,
                  "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": f"/data/{name}"}}
    if node_name:
        spec["nodeAffinity"] = hostname_affinity(node_name)
    return {"metadata": {"name": name}, "spec": spec}


class Cluster:
    def __init__(self, client: InProcessClient) -> None:
        self.client = client

    async def bound_node(self, name: str) -> str | None:
        return (await self.client.get(PODS, name, "default"))["spec"].get("nodeName")

    async def bound_claim(self, name: str) -> dict | None:
        c = await self.client.get(PVCS, name, "default")
        return c if (c.get("status") or {}).get("phase") == "Bound" else None

    async def pv_of(self, claim_name: str) -> dict:
        c = await self.client.get(PVCS, claim_name, "default")
        return await self.client.get(PVS, c["spec"]["volumeName"])


@pytest.fixture
async def cluster():
    store = MemoryStore(history=5000)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    for n in ("n1", "n2"):
        await client.create(NODES, node(n))
    factory = SharedInformerFactory(client)
    pvctrl = PersistentVolumeController(client, factory, resync_period=0)
    prov = LocalProvisioner(client, factory)
    await pvctrl.start(sync_timeout=2)
    await prov.start(sync_timeout=2)
    sched = Scheduler(client, pod_initial_backoff=0.2, pod_max_backoff=0.5)
    task = asyncio.create_task(sched.run())
    try:
        yield Cluster(client)
    finally:
        await sched.stop()
        await asyncio.wait_for(task, 5)
        await prov.stop(timeout=1)
        await pvctrl.stop(timeout=1)
        await factory.stop()
        await client.close()
        await registry.close()
        await store.close()


async def test_wait_for_first_consumer_dynamic_provisioning(cluster: Cluster) -> None:
    c = cluster.client
    await c.create(SCS, storage_class("local", per_node="4Gi"))
    for i in range(3):
        await c.create(PVCS, claim(f"data{i}", "local"), "default")
        await c.create(PODS, pod(f"p{i}", f"data{i}"), "default")
    for i in range(3):
        host = await eventually(lambda: cluster.bound_node(f"p{i}"))
        pvc = await eventually(lambda: cluster.bound_claim(f"data{i}"))
        # The scheduler chose the node; the provisioner pinned the new PV to it.
        assert pvc["metadata"]["annotations"][ANN_SELECTED_NODE] == host
        pv = await cluster.pv_of(f"data{i}")
        assert pinned_hostnames(pv) == {host}
        assert pv["spec"]["claimRef"]["uid"] == pvc["metadata"]["uid"]
        assert pv["status"]["phase"] == "Bound"


async def test_static_local_pvs_bind_on_their_node(cluster: Cluster) -> None:
    c = cluster.client
    await c.create(SCS, storage_class("static", provisioner="kubernetes.io/no-provisioner"))
    await c.create(PVS, static_pv("small-n2", "static", "n2", "1Gi"))
    await c.create(PVCS, claim("a", "static", "1Gi"), "default")
    await c.create(PODS, pod("pa", "a"), "default")
    assert await eventually(lambda: cluster.bound_node("pa")) == "n2"  # the only PV is pinned to n2
    await eventually(lambda: cluster.bound_claim("a"))
    assert (await cluster.pv_of("a"))["metadata"]["name"] == "small-n2"
    # The second claim needs 5Gi: only big-n1 fits, so the pod lands on n1.
    await c.create(PVS, static_pv("big-n1", "static", "n1", "10Gi"))
    await c.create(PVCS, claim("b", "static", "5Gi"), "default")
    await c.create(PODS, pod("pb", "b"), "default")
    assert await eventually(lambda: cluster.bound_node("pb")) == "n1"
    await eventually(lambda: cluster.bound_claim("b"))
    pv = await c.get(PVS, "big-n1")
    assert pv["spec"]["claimRef"]["name"] == "b" and pv["status"]["phase"] == "Bound"
    # No PV left: a third pod stays pending with the binder's reason.
    await c.create(PVCS, claim("c", "static", "1Gi"), "default")
    await c.create(PODS, pod("pc", "c"), "default")

    async def pending_reason() -> str | None:
        p = await c.get(PODS, "pc", "default")
        cond = next((x for x in (p.get("status") or {}).get("conditions") or () if x["type"] == "PodScheduled"), None)
        return cond["message"] if cond and cond["status"] == "False" else None

    msg = await eventually(pending_reason)
    assert "2 node(s) didn't find available persistent volumes to bind" in msg
    # A matching PV appears: the waiting pod is scheduled onto its node.
    await c.create(PVS, static_pv("late-n1", "static", "n1", "1Gi"))
    assert await eventually(lambda: cluster.bound_node("pc")) == "n1"
    await eventually(lambda: cluster.bound_claim("c"))


async def test_immediate_binding(cluster: Cluster) -> None:
    c = cluster.client
    await c.create(SCS, storage_class("fast", mode="Immediate"))
    await c.create(PVCS, claim("imm", "fast"), "default")
    await c.create(PODS, pod("pi", "imm"), "default")
    await eventually(lambda: cluster.bound_claim("imm"))
    assert await eventually(lambda: cluster.bound_node("pi")) in ("n1", "n2")
    pvc = await c.get(PVCS, "imm", "default")
    # The PV controller bound it; the scheduler did not select a node.
    assert ANN_SELECTED_NODE not in (pvc["metadata"].get("annotations") or {})


async def test_capacity_exhaustion_leaves_pod_pending(cluster: Cluster) -> None:
    c = cluster.client
    await c.create(SCS, storage_class("tiny", per_node="1Gi"))

    async def remaining() -> dict[str, str]:
        items = (await c.list(CAPS, "kube-system"))["items"]
        return {o["nodeTopology"]["matchLabels"]["kubernetes.io/hostname"]: o["capacity"] for o in items
                if o["storageClassName"] == "tiny"}

    await eventually(lambda: _eq(remaining, {"n1": "1Gi", "n2": "1Gi"}))
    hosts = set()
    for name in ("x", "y"):
        await c.create(PVCS, claim(name, "tiny"), "default")
        await c.create(PODS, pod(f"p{name}", name), "default")
        hosts.add(await eventually(lambda: cluster.bound_node(f"p{name}")))
        await eventually(lambda: cluster.bound_claim(name))
    assert hosts == {"n1", "n2"}  # the published capacity steered the second pod
    await eventually(lambda: _eq(remaining, {"n1": "0", "n2": "0"}))
    await c.create(PVCS, claim("z", "tiny"), "default")
    await c.create(PODS, pod("pz", "z"), "default")

    async def pending_reason() -> str | None:
        p = await c.get(PODS, "pz", "default")
        cond = next((x for x in (p.get("status") or {}).get("conditions") or () if x["type"] == "PodScheduled"), None)
        return cond["message"] if cond and cond["status"] == "False" else None

    msg = await eventually(pending_reason)
    assert msg.startswith("0/2 nodes are available: 2 node(s) did not have enough free storage.")
    assert not (await c.get(PODS, "pz", "default"))["spec"].get("nodeName")
    assert ANN_SELECTED_NODE not in ((await c.get(PVCS, "z", "default"))["metadata"].get("annotations") or {})


async def _eq(fn: Callable[[], Awaitable[Any]], expected: Any) -> bool:
    return (await fn()) == expected
