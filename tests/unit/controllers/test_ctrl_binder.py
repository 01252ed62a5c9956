"""PV controller against a real registry (MemoryStore + InProcessClient + informers)."""

from __future__ import annotations


import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.pv.binder import PersistentVolumeController
from kubeplane.volume.matching import (
    ANN_BIND_COMPLETED,
    ANN_BOUND_BY_CONTROLLER,
    ANN_SELECTED_NODE,
    ANN_STORAGE_PROVISIONER,
    ANN_BETA_STORAGE_PROVISIONER,
)
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore
from helpers import caught_up, eventually, settled

PVS = resource("persistentvolumes")
PVCS = resource("persistentvolumeclaims")
SCS = resource("storageclasses")
EVENTS = resource("events")


def make_pv(name: str, size: str = "1Gi", *, cls: str = "manual", modes=("ReadWriteOnce",), labels=None,
            mode: str | None = None, policy: str = "Retain", claim_ref=None, ann=None) -> dict:
    spec: dict = {"capacity": {"storage": size}, "accessModes": list(modes), "storageClassName": cls,
                  "persistentVolumeReclaimPolicy": policy, "hostPath": {"path": f"/data/{name}"}}
    if mode:
        spec["volumeMode"] = mode
    if claim_ref:
        spec["claimRef"] = claim_ref
    return {"metadata": {"name": name, "labels": labels or {}, "annotations": ann or {}}, "spec": spec}


def make_pvc(name: str, size: str = "1Gi", *, cls: str | None = "manual", modes=("ReadWriteOnce",),
             selector=None, mode: str | None = None, volume_name: str | None = None) -> dict:
    spec: dict = {"resources": {"requests": {"storage": size}}, "accessModes": list(modes)}
    if cls is not None:
        spec["storageClassName"] = cls
    if selector is not None:
        spec["selector"] = selector
    if mode:
        spec["volumeMode"] = mode
    if volume_name:
        spec["volumeName"] = volume_name
    return {"metadata": {"name": name}, "spec": spec}


def make_class(name: str, *, mode: str = "Immediate", provisioner: str = "kubernetes.io/no-provisioner") -> dict:
    return {"metadata": {"name": name}, "provisioner": provisioner, "volumeBindingMode": mode}


class Env:
    def __init__(self, client: InProcessClient) -> None:
        self.client = client

    async def pv(self, name: str) -> dict:
        return await self.client.get(PVS, name)

    async def pvc(self, name: str) -> dict:
        return await self.client.get(PVCS, name, "default")

    async def bound(self, claim: str) -> dict | None:
        c = await self.pvc(claim)
        if c["status"].get("phase") == "Bound" and c["spec"].get("volumeName"):
            pv = await self.pv(c["spec"]["volumeName"])
            if pv["status"].get("phase") == "Bound":
                return c
        return None

    async def events(self, reason: str) -> list[dict]:
        items = (await self.client.list(EVENTS, "default"))["items"]
        return [e for e in items if e["reason"] == reason]


@pytest.fixture
async def env():
    store = MemoryStore(history=1000)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    ctrl = PersistentVolumeController(client, resync_period=0)
    await ctrl.start(sync_timeout=1)
    e = Env(client)
    e.ctrl = ctrl  # type: ignore[attr-defined]
    yield e
    await ctrl.stop(timeout=1)
    await client.close()
    await registry.close()
    await store.close()


async def test_immediate_binds_smallest_fitting_pv(env: Env) -> None:
    c = env.client
    await c.create(SCS, make_class("manual"))
    for name, size in (("pv-10g", "10Gi"), ("pv-500m", "500Mi"), ("pv-2g", "2Gi"), ("pv-3g", "3Gi")):
        await c.create(PVS, make_pv(name, size))
    # As upstream, only Available PVs are candidates: let the controller mark them first.
    for name in ("pv-10g", "pv-500m", "pv-2g", "pv-3g"):
        await eventually(lambda: _phase_is(env, name, "Available"))
    await c.create(PVCS, make_pvc("claim", "1500Mi"), "default")
    claim = await eventually(lambda: env.bound("claim"))
    assert claim["spec"]["volumeName"] == "pv-2g"
    anns = claim["metadata"]["annotations"]
    assert anns[ANN_BIND_COMPLETED] == "yes" and anns[ANN_BOUND_BY_CONTROLLER] == "yes"
    assert claim["status"]["capacity"] == {"storage": "2Gi"}
    assert claim["status"]["accessModes"] == ["ReadWriteOnce"]
    pv = await env.pv("pv-2g")
    ref = pv["spec"]["claimRef"]
    assert (ref["name"], ref["namespace"], ref["uid"]) == ("claim", "default", claim["metadata"]["uid"])
    assert pv["metadata"]["annotations"][ANN_BOUND_BY_CONTROLLER] == "yes"
    # Unused PVs become Available.
    assert (await env.pv("pv-10g"))["status"]["phase"] == "Available"


async def _phase_is(env: Env, pv: str, phase: str) -> bool:
    return (await env.pv(pv))["status"].get("phase") == phase


async def test_selector_access_modes_and_volume_mode(env: Env) -> None:
    c = env.client
    await c.create(SCS, make_class("manual"))
    await c.create(PVS, make_pv("gold", "1Gi", labels={"tier": "gold"}))
    await c.create(PVS, make_pv("silver", "1Gi", labels={"tier": "silver"}))
    await c.create(PVS, make_pv("rwx", "5Gi", modes=("ReadWriteMany",)))
    await c.create(PVS, make_pv("block", "5Gi", mode="Block"))
    for name in ("gold", "silver", "rwx", "block"):
        await eventually(lambda: _phase_is(env, name, "Available"))
    await c.create(PVCS, make_pvc("sel", selector={"matchLabels": {"tier": "silver"}}), "default")
    await c.create(PVCS, make_pvc("shared", modes=("ReadWriteMany",)), "default")
    await c.create(PVCS, make_pvc("raw", mode="Block"), "default")
    assert (await eventually(lambda: env.bound("sel")))["spec"]["volumeName"] == "silver"
    assert (await eventually(lambda: env.bound("shared")))["spec"]["volumeName"] == "rwx"
    assert (await eventually(lambda: env.bound("raw")))["spec"]["volumeName"] == "block"
    assert (await env.pv("gold"))["spec"].get("claimRef") is None


async def test_no_class_no_match_reports_failed_binding_then_binds_new_pv(env: Env) -> None:
    c = env.client
    await c.create(PVCS, make_pvc("lonely", cls=""), "default")
    events = await eventually(lambda: env.events("FailedBinding"))
    assert events[0]["message"] == "no persistent volumes available for this claim and no storage class is set"
    assert (await env.pvc("lonely"))["status"]["phase"] == "Pending"
    await c.create(PVS, make_pv("late", cls=""))
    assert (await eventually(lambda: env.bound("lonely")))["spec"]["volumeName"] == "late"


async def test_user_prebound_pv_and_claim_volume_name(env: Env) -> None:
    c = env.client
    await c.create(SCS, make_class("manual"))
    await c.create(PVS, make_pv("small", "1Gi"))
    await c.create(PVS, make_pv("reserved", "8Gi", claim_ref={"namespace": "default", "name": "picky"}))
    await c.create(PVCS, make_pvc("picky"), "default")
    claim = await eventually(lambda: env.bound("picky"))
    assert claim["spec"]["volumeName"] == "reserved"
    # Pre-bound by a user: the PV gets no bound-by-controller annotation.
    assert ANN_BOUND_BY_CONTROLLER not in ((await env.pv("reserved"))["metadata"].get("annotations") or {})
    # A claim naming its volume.
    await c.create(PVS, make_pv("chosen", "2Gi"))
    await c.create(PVCS, make_pvc("named", volume_name="chosen"), "default")
    named = await eventually(lambda: env.bound("named"))
    assert ANN_BOUND_BY_CONTROLLER not in named["metadata"]["annotations"]
    # A named volume that is too small is refused with VolumeMismatch.
    await c.create(PVS, make_pv("tiny", "100Mi"))
    await c.create(PVCS, make_pvc("toobig", "1Gi", volume_name="tiny"), "default")
    ev = await eventually(lambda: env.events("VolumeMismatch"))
    assert "requested PV is too small" in ev[0]["message"]
    assert (await env.pvc("toobig"))["status"]["phase"] == "Pending"


async def test_wait_for_first_consumer_waits(env: Env) -> None:
    c = env.client
    await c.create(SCS, make_class("local", mode="WaitForFirstConsumer"))
    await c.create(PVS, make_pv("local-pv", cls="local"))
    created = await c.create(PVCS, make_pvc("wffc", cls="local"), "default")
    ev = await eventually(lambda: env.events("WaitForFirstConsumer"))
    assert ev[0]["message"] == "waiting for first consumer to be created before binding"
    ctrl = env.ctrl  # type: ignore[attr-defined]
    await eventually(lambda: caught_up(ctrl, ctrl.pvc_informer, created["metadata"]["resourceVersion"]))
    claim = await env.pvc("wffc")
    assert claim["status"]["phase"] == "Pending" and not claim["spec"].get("volumeName")
    assert (await env.pv("local-pv"))["spec"].get("claimRef") is None


async def test_wait_for_first_consumer_claim_naming_a_pv_binds_when_it_appears(env: Env) -> None:
    """A claim of a WaitForFirstConsumer class that names its volume binds as soon as
    the volume is created; other waiting claims of the class stay as they are."""
    c = env.client
    await c.create(SCS, make_class("local", mode="WaitForFirstConsumer"))
    for i in range(20):
        await c.create(PVCS, make_pvc(f"other-{i}", cls="local"), "default")
    await c.create(PVCS, make_pvc("named", cls="local", volume_name="later"), "default")
    ctrl = env.ctrl  # type: ignore[attr-defined]
    await settled(ctrl, c, (ctrl.pvc_informer, PVCS), namespace="default")
    assert (await env.pvc("named"))["status"]["phase"] == "Pending"
    await c.create(PVS, make_pv("later", cls="local"))
    claim = await eventually(lambda: env.bound("named"))
    assert claim["spec"]["volumeName"] == "later"
    for i in range(20):
        other = await env.pvc(f"other-{i}")
        assert other["status"]["phase"] == "Pending" and not other["spec"].get("volumeName")


async def test_completes_scheduler_started_static_binding(env: Env) -> None:
    c = env.client
    await c.create(SCS, make_class("local", mode="WaitForFirstConsumer"))
    await c.create(PVS, make_pv("local-pv", cls="local"))
    claim = await c.create(PVCS, make_pvc("wffc", cls="local"), "default")
    await eventually(lambda: _phase_is(env, "local-pv", "Available"))
    # The scheduler's PreBind: PUT the PV with claimRef(uid) + bound-by-controller.
    pv = await env.pv("local-pv")
    pv["spec"]["claimRef"] = {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": "default",
                              "name": "wffc", "uid": claim["metadata"]["uid"],
                              "resourceVersion": claim["metadata"]["resourceVersion"]}
    pv["metadata"].setdefault("annotations", {})[ANN_BOUND_BY_CONTROLLER] = "yes"
    await c.update(PVS, pv)
    bound = await eventually(lambda: env.bound("wffc"))
    assert bound["spec"]["volumeName"] == "local-pv"
    assert bound["metadata"]["annotations"][ANN_BIND_COMPLETED] == "yes"


async def test_selected_node_hands_claim_to_external_provisioner(env: Env) -> None:
    c = env.client
    await c.create(SCS, make_class("dyn", mode="WaitForFirstConsumer", provisioner="example.com/prov"))
    await c.create(PVCS, make_pvc("dyn-claim", cls="dyn"), "default")
    await eventually(lambda: env.events("WaitForFirstConsumer"))
    claim = await env.pvc("dyn-claim")
    assert ANN_STORAGE_PROVISIONER not in (claim["metadata"].get("annotations") or {})
    claim["metadata"].setdefault("annotations", {})[ANN_SELECTED_NODE] = "node-1"
    await c.update(PVCS, claim)

    async def annotated() -> bool:
        anns = (await env.pvc("dyn-claim"))["metadata"].get("annotations") or {}
        return anns.get(ANN_STORAGE_PROVISIONER) == anns.get(ANN_BETA_STORAGE_PROVISIONER) == "example.com/prov"

    await eventually(annotated)
    ev = await eventually(lambda: env.events("ExternalProvisioning"))
    assert "'example.com/prov'" in ev[0]["message"]


async def test_release_retain_and_delete(env: Env) -> None:
    c = env.client
    await c.create(SCS, make_class("manual"))
    await c.create(PVS, make_pv("keep", "1Gi", policy="Retain"))
    await c.create(PVCS, make_pvc("a"), "default")
    await eventually(lambda: env.bound("a"))
    await c.create(PVS, make_pv("drop", "5Gi", policy="Delete"))
    await c.create(PVCS, make_pvc("b", "5Gi"), "default")
    assert (await eventually(lambda: env.bound("b")))["spec"]["volumeName"] == "drop"
    await c.delete(PVCS, "a", "default")
    await c.delete(PVCS, "b", "default")
    await eventually(lambda: _phase_is(env, "keep", "Released"))

    async def gone() -> bool:
        try:
            await env.pv("drop")
        except StatusError as err:
            return err.code == 404
        return False

    await eventually(gone)
    ctrl = env.ctrl  # type: ignore[attr-defined]
    await settled(ctrl, c, (ctrl.pv_informer, PVS))
    kept = await env.pv("keep")
    assert kept["status"]["phase"] == "Released" and kept["spec"]["claimRef"]["name"] == "a"
    # A new claim does not get the Released volume.
    await c.create(PVCS, make_pvc("c"), "default")
    await settled(ctrl, c, (ctrl.pvc_informer, PVCS), (ctrl.pv_informer, PVS), namespace="default")
    assert (await env.pvc("c"))["status"]["phase"] == "Pending"


async def test_bound_claim_lost_when_pv_deleted(env: Env) -> None:
    c = env.client
    await c.create(SCS, make_class("manual"))
    await c.create(PVS, make_pv("only"))
    await c.create(PVCS, make_pvc("x"), "default")
    await eventually(lambda: env.bound("x"))
    await c.delete(PVS, "only")

    async def lost() -> bool:
        return (await env.pvc("x"))["status"]["phase"] == "Lost"

    await eventually(lost)
    ev = await env.events("ClaimLost")
    assert ev and ev[0]["type"] == "Warning"


async def test_two_claims_never_share_a_pv(env: Env) -> None:
    c = env.client
    await c.create(SCS, make_class("manual"))
    await c.create(PVS, make_pv("one", "1Gi"))
    await c.create(PVS, make_pv("two", "1Gi"))
    for i in range(3):
        await c.create(PVCS, make_pvc(f"r{i}"), "default")

    async def two_bound() -> bool:
        return sum([bool(await env.bound(f"r{i}")) for i in range(3)]) == 2

    await eventually(two_bound)
    vols = [(await env.pvc(f"r{i}"))["spec"].get("volumeName") for i in range(3)]
    assert sorted(v for v in vols if v) == ["one", "two"]
