"""ResourceClaim controller against a real registry (MemoryStore + InProcessClient + informers)."""

from __future__ import annotations

import asyncio

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.resourceclaim import (
    FINALIZER,
    POD_CLAIM_NAME_ANNOTATION,
    ResourceClaimController,
    generate_claim_name_prefix,
    pod_is_done,
)
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore
from helpers import caught_up, eventually, settled

PODS = resource("pods")
CLAIMS = resource("resourceclaims")
TEMPLATES = resource("resourceclaimtemplates")
NS = "default"
CLAIM_SPEC = {"devices": {"requests": [{"name": "req-0", "exactly": {"deviceClassName": "gpu"}}]}}


def make_pod(name: str, *, templates: dict[str, str] | None = None, claims: dict[str, str] | None = None,
             node: str | None = None) -> dict:
    rcs = [{"name": k, "resourceClaimTemplateName": v} for k, v in (templates or {}).items()]
    rcs += [{"name": k, "resourceClaimName": v} for k, v in (claims or {}).items()]
    spec: dict = {"containers": [{"name": "c", "image": "busybox:1"}], "resourceClaims": rcs}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name}, "spec": spec}


def template(name: str = "gpu-tmpl") -> dict:
    return {"metadata": {"name": name},
            "spec": {"metadata": {"labels": {"team": "ml"}, "annotations": {"note": "x"}}, "spec": CLAIM_SPEC}}


@pytest.fixture
async def env():
    store = MemoryStore(history=200)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    ctrl = ResourceClaimController(client)
    await ctrl.start(sync_timeout=2)
    yield client, ctrl
    await ctrl.stop()
    await client.close()
    await registry.close()
    await store.close()


async def allocate_and_reserve(client: InProcessClient, claim_name: str, *pods: dict) -> dict:
    """What the scheduler's PreBind does: finalizer, then allocation + reservedFor."""
    c = await client.get(CLAIMS, claim_name, NS)
    c["metadata"].setdefault("finalizers", []).append(FINALIZER)
    c = await client.update(CLAIMS, c)
    c["status"] = {
        "allocation": {"devices": {"results": [{"request": "req-0", "driver": "d", "pool": "p", "device": "g0"}]}},
        "reservedFor": [{"resource": "pods", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]}
                        for p in pods],
    }
    return await client.update(CLAIMS, c, subresource="status")


async def finish(client: InProcessClient, pod: dict, phase: str = "Succeeded") -> None:
    p = await client.get(PODS, pod["metadata"]["name"], NS)
    p["status"]["phase"] = phase
    await client.update(PODS, p, subresource="status")


def test_helpers() -> None:
    assert generate_claim_name_prefix("web", "gpu") == "web-gpu-"
    long = generate_claim_name_prefix("p" * 60, "c" * 40)
    assert long.endswith("-") and len(long) <= 59 and "-c" in long and long.startswith("p")
    assert pod_is_done({"status": {"phase": "Failed"}})
    assert pod_is_done({"metadata": {"deletionTimestamp": "t"}, "spec": {}})
    assert not pod_is_done({"metadata": {"deletionTimestamp": "t"}, "spec": {"nodeName": "n"}})


async def test_creates_claim_from_template_and_records_status(env) -> None:
    client, ctrl = env
    await client.create(TEMPLATES, template(), NS)
    pod = await client.create(PODS, make_pod("p1", templates={"gpu": "gpu-tmpl"}), NS)

    async def recorded() -> list:
        p = await client.get(PODS, "p1", NS)
        return p["status"].get("resourceClaimStatuses")

    statuses = await eventually(recorded)
    assert len(statuses) == 1 and statuses[0]["name"] == "gpu"
    claim = await client.get(CLAIMS, statuses[0]["resourceClaimName"], NS)
    md = claim["metadata"]
    assert md["name"].startswith("p1-gpu-") and md["generateName"] == "p1-gpu-"
    assert md["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": "p1", "uid": pod["metadata"]["uid"],
                                      "controller": True, "blockOwnerDeletion": True}]
    assert md["annotations"] == {"note": "x", POD_CLAIM_NAME_ANNOTATION: "gpu"}
    assert md["labels"] == {"team": "ml"}
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == "gpu"
    # Further pod updates do not create more claims.
    p = await client.get(PODS, "p1", NS)
    p["metadata"]["labels"] = {"x": "y"}
    updated = await client.update(PODS, p)
    await eventually(lambda: caught_up(ctrl, ctrl.pod_informer, updated["metadata"]["resourceVersion"]))
    assert len((await client.list(CLAIMS, NS))["items"]) == 1


async def test_missing_template_is_retried(env) -> None:
    client, ctrl = env
    await client.create(PODS, make_pod("p1", templates={"gpu": "later"}), NS)
    # Sync point: the controller has tried the pod and failed (a retry is scheduled).
    await eventually(lambda: ctrl.pods.num_requeues(f"{NS}/p1") >= 1)
    assert (await client.list(CLAIMS, NS))["items"] == []
    await client.create(TEMPLATES, template("later"), NS)

    async def created() -> list:
        return (await client.list(CLAIMS, NS))["items"]

    items = await eventually(created)
    assert items[0]["metadata"]["annotations"][POD_CLAIM_NAME_ANNOTATION] == "gpu"


async def test_finished_pod_deallocates_and_deletes_its_generated_claim(env) -> None:
    client, ctrl = env
    await client.create(TEMPLATES, template(), NS)
    pod = await client.create(PODS, make_pod("p1", templates={"gpu": "gpu-tmpl"}), NS)
    statuses = await eventually(lambda: _statuses(client, "p1"))
    name = statuses[0]["resourceClaimName"]
    await allocate_and_reserve(client, name, pod)
    await asyncio.sleep(0.02)
    assert (await client.get(CLAIMS, name, NS))["status"]["allocation"]  # still in use
    await finish(client, pod)

    async def gone() -> bool:
        try:
            await client.get(CLAIMS, name, NS)
        except StatusError as err:
            return err.code == 404
        return False

    assert await eventually(gone)


async def test_deleted_pod_releases_direct_claim(env) -> None:
    client, ctrl = env
    await client.create(CLAIMS, {"metadata": {"name": "shared"}, "spec": CLAIM_SPEC}, NS)
    p1 = await client.create(PODS, make_pod("p1", claims={"gpu": "shared"}), NS)
    p2 = await client.create(PODS, make_pod("p2", claims={"gpu": "shared"}), NS)
    await allocate_and_reserve(client, "shared", p1, p2)

    await client.delete(PODS, "p1", NS, grace_period_seconds=0)

    async def one_left() -> dict | None:
        c = await client.get(CLAIMS, "shared", NS)
        return c if [r["name"] for r in c["status"].get("reservedFor") or []] == ["p2"] else None

    c = await eventually(one_left)
    assert c["status"]["allocation"] and FINALIZER in c["metadata"]["finalizers"]

    await finish(client, p2, "Failed")

    async def released() -> dict | None:
        c = await client.get(CLAIMS, "shared", NS)
        return c if not c["metadata"].get("finalizers") else None

    c = await eventually(released)
    assert "allocation" not in c["status"] and "reservedFor" not in c["status"]
    # Not generated for a pod: the claim itself stays.
    await settled(ctrl, client, (ctrl.claim_informer, CLAIMS), (ctrl.pod_informer, PODS), namespace=NS)
    assert (await client.get(CLAIMS, "shared", NS))["metadata"]["name"] == "shared"


async def test_pod_bound_without_scheduler_gets_reservation(env) -> None:
    client, ctrl = env
    await client.create(CLAIMS, {"metadata": {"name": "c1"}, "spec": CLAIM_SPEC}, NS)
    await allocate_and_reserve(client, "c1")
    pod = await client.create(PODS, make_pod("p1", claims={"gpu": "c1"}, node="node-a"), NS)

    async def reserved() -> list:
        c = await client.get(CLAIMS, "c1", NS)
        return [r["uid"] for r in c["status"].get("reservedFor") or []]

    assert await eventually(reserved) == [pod["metadata"]["uid"]]


async def test_deleted_claim_of_running_pod_is_left_for_the_pod(env) -> None:
    """A claim being deleted keeps its finalizer while a live pod reserves it."""
    client, ctrl = env
    await client.create(CLAIMS, {"metadata": {"name": "c1"}, "spec": CLAIM_SPEC}, NS)
    p1 = await client.create(PODS, make_pod("p1", claims={"gpu": "c1"}), NS)
    await allocate_and_reserve(client, "c1", p1)
    await client.delete(CLAIMS, "c1", NS)
    await settled(ctrl, client, (ctrl.claim_informer, CLAIMS), namespace=NS)
    c = await client.get(CLAIMS, "c1", NS)
    assert c["metadata"]["deletionTimestamp"] and c["status"]["allocation"]
    await client.delete(PODS, "p1", NS, grace_period_seconds=0)

    async def gone() -> bool:
        try:
            await client.get(CLAIMS, "c1", NS)
        except StatusError as err:
            return err.code == 404
        return False

    assert await eventually(gone)


async def _statuses(client: InProcessClient, name: str) -> list:
    return (await client.get(PODS, name, NS))["status"].get("resourceClaimStatuses")
