"""Local provisioner + PV controller against a real registry (shared informer factory)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.pv import DEFAULT_PROVISIONER, LocalProvisioner, PersistentVolumeController
from kubeplane.volume.matching import ANN_PROVISIONED_BY, ANN_SELECTED_NODE, pinned_hostnames
from kubeplane.controllers.pv.provisioner import capacity_object_name
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore
from helpers import caught_up, eventually, settled

PVS = resource("persistentvolumes")
PVCS = resource("persistentvolumeclaims")
SCS = resource("storageclasses")
NODES = resource("nodes")
EVENTS = resource("events")
CAPS = resource("csistoragecapacities")


def storage_class(name: str, *, mode: str = "WaitForFirstConsumer", per_node: str | None = None,
                  zones: list[str] | None = None, policy: str = "Delete") -> dict:
    sc: dict = {"metadata": {"name": name}, "provisioner": DEFAULT_PROVISIONER,
                "volumeBindingMode": mode, "reclaimPolicy": policy}
    if per_node:
        sc["parameters"] = {"capacityPerNode": per_node}
    if zones:
        sc["allowedTopologies"] = [{"matchLabelExpressions": [{"key": "zone", "values": zones}]}]
    return sc


def claim(name: str, cls: str, size: str = "1Gi", node: str | None = None) -> dict:
    md: dict = {"name": name}
    if node:
        md["annotations"] = {ANN_SELECTED_NODE: node}
    return {"metadata": md, "spec": {"storageClassName": cls, "accessModes": ["ReadWriteOnce"],
                                     "resources": {"requests": {"storage": size}}}}


class Env:
    def __init__(self, client: InProcessClient, prov: LocalProvisioner) -> None:
        self.client = client
        self.prov = prov

    async def pvc(self, name: str) -> dict:
        return await self.client.get(PVCS, name, "default")

    async def bound_pv(self, name: str) -> dict | None:
        c = await self.pvc(name)
        if c["status"].get("phase") != "Bound":
            return None
        return await self.client.get(PVS, c["spec"]["volumeName"])

    async def events(self, reason: str, obj_name: str | None = None) -> list[dict]:
        items = (await self.client.list(EVENTS, "default"))["items"]
        return [e for e in items if e["reason"] == reason
                and (obj_name is None or e["involvedObject"]["name"] == obj_name)]

    async def capacities(self) -> dict[str, str]:
        items = (await self.client.list(CAPS, "kube-system"))["items"]
        return {o["nodeTopology"]["matchLabels"]["kubernetes.io/hostname"]: o["capacity"] for o in items}


@pytest.fixture
async def env():
    store = MemoryStore(history=2000)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    for name, zone in (("n1", "a"), ("n2", "b"), ("n3", "b")):
        await client.create(NODES, {"metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "zone": zone}}})
    factory = SharedInformerFactory(client)
    binder = PersistentVolumeController(client, factory, resync_period=0)
    prov = LocalProvisioner(client, factory)
    await binder.start(sync_timeout=1)
    await prov.start(sync_timeout=1)
    yield Env(client, prov)
    await prov.stop(timeout=1)
    await binder.stop(timeout=1)
    await factory.stop()
    await client.close()
    await registry.close()
    await store.close()


async def test_wffc_provisions_on_selected_node_and_deletes_on_release(env: Env) -> None:
    c = env.client
    await c.create(SCS, storage_class("local"))
    created = await c.create(PVCS, claim("data", "local"), "default")
    await eventually(lambda: env.events("WaitForFirstConsumer", "data"))
    # Sync point: the provisioner has seen the claim and has nothing left to do.
    await eventually(lambda: caught_up(env.prov, env.prov.pvc_informer, created["metadata"]["resourceVersion"]))
    assert (await c.list(PVS))["items"] == []
    # The scheduler selects a node.
    pvc = await env.pvc("data")
    pvc["metadata"].setdefault("annotations", {})[ANN_SELECTED_NODE] = "n2"
    await c.update(PVCS, pvc)
    pv = await eventually(lambda: env.bound_pv("data"))
    assert pv["metadata"]["name"] == f"pvc-{created['metadata']['uid']}"
    assert pv["metadata"]["annotations"][ANN_PROVISIONED_BY] == DEFAULT_PROVISIONER
    assert pinned_hostnames(pv) == {"n2"}
    spec = pv["spec"]
    assert spec["capacity"] == {"storage": "1Gi"} and spec["accessModes"] == ["ReadWriteOnce"]
    assert spec["storageClassName"] == "local" and spec["persistentVolumeReclaimPolicy"] == "Delete"
    assert spec["volumeMode"] == "Filesystem" and spec["claimRef"]["uid"] == created["metadata"]["uid"]
    assert spec["csi"]["driver"] == DEFAULT_PROVISIONER
    ok = await eventually(lambda: env.events("ProvisioningSucceeded", "data"))
    assert pv["metadata"]["name"] in ok[0]["message"]
    # Claim deleted: Released, then deleted by the provisioner.
    await c.delete(PVCS, "data", "default")

    async def gone() -> bool:
        return not (await c.list(PVS))["items"]

    await eventually(gone)


async def test_immediate_without_topology_has_no_node_affinity(env: Env) -> None:
    c = env.client
    await c.create(SCS, storage_class("anywhere", mode="Immediate"))
    await c.create(PVCS, claim("free", "anywhere", "3Gi"), "default")
    pv = await eventually(lambda: env.bound_pv("free"))
    assert "nodeAffinity" not in pv["spec"] and pv["spec"]["capacity"] == {"storage": "3Gi"}


async def test_allowed_topologies(env: Env) -> None:
    c = env.client
    await c.create(SCS, storage_class("zone-b-imm", mode="Immediate", zones=["b"]))
    await c.create(PVCS, claim("imm", "zone-b-imm"), "default")
    pv = await eventually(lambda: env.bound_pv("imm"))
    assert pinned_hostnames(pv) <= {"n2", "n3"} and len(pinned_hostnames(pv)) == 1
    # WaitForFirstConsumer with a node outside the topology: refused, node deselected.
    await c.create(SCS, storage_class("zone-b", zones=["b"]))
    await c.create(PVCS, claim("wrong", "zone-b", node="n1"), "default")
    ev = await eventually(lambda: env.events("ProvisioningFailed", "wrong"))
    assert 'selected node "n1" does not match the allowedTopologies' in ev[0]["message"]

    async def deselected() -> bool:
        return ANN_SELECTED_NODE not in ((await env.pvc("wrong"))["metadata"].get("annotations") or {})

    await eventually(deselected)
    assert not [p for p in (await c.list(PVS))["items"] if p["spec"]["claimRef"]["name"] == "wrong"]


async def test_capacity_limit_exhausted_then_freed(env: Env) -> None:
    c = env.client
    await c.create(SCS, storage_class("small", per_node="2Gi"))
    await eventually(lambda: _caps_equal(env, {"n1": "2Gi", "n2": "2Gi", "n3": "2Gi"}))
    await c.create(PVCS, claim("a", "small", "1Gi", node="n1"), "default")
    await c.create(PVCS, claim("b", "small", "1Gi", node="n1"), "default")
    await eventually(lambda: env.bound_pv("a"))
    await eventually(lambda: env.bound_pv("b"))
    await eventually(lambda: _caps_equal(env, {"n1": "0", "n2": "2Gi", "n3": "2Gi"}))
    await c.create(PVCS, claim("c", "small", "1Gi", node="n1"), "default")
    ev = await eventually(lambda: env.events("ProvisioningFailed", "c"))
    assert ev[0]["type"] == "Warning"
    assert 'insufficient capacity on node "n1" for storage class "small"' in ev[0]["message"]
    assert "remaining 0 of capacityPerNode 2Gi" in ev[0]["message"]
    await settled(env.prov, c, (env.prov.pvc_informer, PVCS), namespace="default")
    assert (await env.pvc("c"))["status"]["phase"] == "Pending"
    # The claim keeps its node and waits.
    assert (await env.pvc("c"))["metadata"]["annotations"][ANN_SELECTED_NODE] == "n1"
    # Free capacity: delete claim a -> its PV is deleted -> c is provisioned on n1.
    await c.delete(PVCS, "a", "default")
    pv = await eventually(lambda: env.bound_pv("c"))
    assert pinned_hostnames(pv) == {"n1"}
    await eventually(lambda: _caps_equal(env, {"n1": "0", "n2": "2Gi", "n3": "2Gi"}))
    # Used never exceeds the limit.
    assert env.prov.used_on_node("small", "n1") == 2 * 1024 ** 3


async def _caps_equal(env: Env, want: dict[str, str]) -> bool:
    return await env.capacities() == want


async def test_csistoragecapacity_objects(env: Env) -> None:
    c = env.client
    await c.create(SCS, storage_class("zonal", per_node="10Gi", zones=["b"]))
    await c.create(SCS, storage_class("unlimited"))  # no limit: nothing published
    await eventually(lambda: _caps_equal(env, {"n2": "10Gi", "n3": "10Gi"}))
    obj = await c.get(CAPS, capacity_object_name("zonal", "n2"), "kube-system")
    assert obj["storageClassName"] == "zonal" and obj["maximumVolumeSize"] == "10Gi"
    assert obj["metadata"]["labels"]["csi.storage.k8s.io/drivername"] == "kubeplane.io-local"
    await c.create(PVCS, claim("x", "zonal", "4Gi", node="n3"), "default")
    await eventually(lambda: env.bound_pv("x"))
    await eventually(lambda: _caps_equal(env, {"n2": "10Gi", "n3": "6Gi"}))
    # A new node in the zone gets an object; a class deletion removes them.
    await c.create(NODES, {"metadata": {"name": "n4", "labels": {"kubernetes.io/hostname": "n4", "zone": "b"}}})
    await eventually(lambda: _caps_equal(env, {"n2": "10Gi", "n3": "6Gi", "n4": "10Gi"}))
    await c.delete(SCS, "zonal")
    await eventually(lambda: _caps_equal(env, {}))


async def test_concurrent_syncs_never_overcommit_a_node(env: Env) -> None:
    """Syncs of several claims interleaving at their awaits still respect capacityPerNode."""
    c = env.client
    other = LocalProvisioner(c, env.prov.factory, provisioner_name="test.io/other")
    await c.create(SCS, {**storage_class("tight", per_node="2Gi"), "provisioner": "test.io/other"})
    for i in range(4):
        await c.create(PVCS, claim(f"w{i}", "tight", "1Gi", node="n1"), "default")

    async def handed_over() -> bool:
        claims = [other.pvc_informer.indexer.get_by_key(f"default/w{i}") for i in range(4)]
        return all(x and (x["metadata"].get("annotations") or {}).get(
            "volume.kubernetes.io/storage-provisioner") == "test.io/other" for x in claims)

    await eventually(handed_over)
    create = c.create

    async def yielding_create(*args: Any, **kw: Any) -> Any:
        await asyncio.sleep(0)  # as over HTTP: every API call is a suspension point
        return await create(*args, **kw)

    c.create = yielding_create  # type: ignore[method-assign]
    try:
        await asyncio.gather(*(other.sync_claim(f"default/w{i}") for i in range(4)))
    finally:
        del c.create
    assert await other.recorder.flush(5)
    pvs = [p for p in (await c.list(PVS))["items"] if p["spec"]["storageClassName"] == "tight"]
    assert len(pvs) == 2
    assert len(await env.events("ProvisioningFailed")) == 2
