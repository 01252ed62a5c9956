"""StatefulSet controller against a real registry (MemoryStore + InProcessClient
+ informers). Pods become Running and Ready only when a test says so, and
time under minReadySeconds moves only when the test moves the clock."""

from __future__ import annotations

import datetime as dt

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import format_time
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.garbagecollector import GarbageCollector
from kubeplane.controllers.history import CONTROLLER_REVISION_HASH_LABEL, typed_template
from kubeplane.controllers.statefulset import (
    POD_INDEX_LABEL,
    POD_NAME_LABEL,
    REVISION_LABEL,
    StatefulSetController,
    apply_revision,
    claim_owner_up_to_date,
    new_revision,
    parent_and_ordinal,
    update_claim_owner_refs,
)
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore
from helpers import eventually, settled

PODS = resource("pods")
PVCS = resource("persistentvolumeclaims")
STS = resource("statefulsets")
CR = resource("controllerrevisions")
EVENTS = resource("events")
NS = "default"
T0 = dt.datetime(2026, 6, 1, 12, 0, 0, tzinfo=dt.timezone.utc)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> dt.datetime:
        return self.now


def make_sts(name: str = "web", replicas: int = 3, *, image: str = "nginx:1", **spec_extra) -> dict:
    labels = {"app": name}
    spec: dict = {
        "replicas": replicas,
        "serviceName": name,
        "selector": {"matchLabels": labels},
        "template": {"metadata": {"labels": labels},
                     "spec": {"containers": [{"name": "c", "image": image}]}},
    }
    spec.update(spec_extra)
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name}, "spec": spec}


class Env:
    def __init__(self, client: InProcessClient, ctrl: StatefulSetController, clock: Clock) -> None:
        self.client = client
        self.ctrl = ctrl
        self.clock = clock

    async def pods(self, *, terminating: bool = False) -> dict[str, dict]:
        items = (await self.client.list(PODS, NS))["items"]
        return {p["metadata"]["name"]: p for p in items
                if terminating or not p["metadata"].get("deletionTimestamp")}

    async def names(self) -> list[str]:
        return sorted(await self.pods())

    async def ready(self, name: str, *, since: dt.datetime | None = None) -> None:
        await self.client.patch(PODS, name, {"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": format_time(since or self.clock.now)}]}},
            NS, subresource="status")

    async def bind(self, pod: str, node: str) -> None:
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        await self.client.create(PODS, binding, NS, subresource="binding", name=pod)

    async def sts(self, name: str = "web") -> dict:
        return await self.client.get(STS, name, NS)

    async def status(self, name: str = "web", **want) -> dict:
        got = await self.sts(name)
        status = got.get("status") or {}
        for k, v in want.items():
            if status.get(k, 0 if not isinstance(v, str) else None) != v:
                return {}
        return got

    async def events(self, reason: str) -> list[dict]:
        return [e for e in (await self.client.list(EVENTS, NS))["items"] if e["reason"] == reason]

    async def settle(self) -> None:
        c = self.ctrl
        await settled(c, self.client, (c.pod_informer, PODS), (c.set_informer, STS),
                      (c.revision_informer, CR), (c.pvc_informer, PVCS), namespace=NS, delayed=True)

    async def finish(self, name: str) -> None:
        """A kubelet finishing a graceful deletion: the pod goes."""
        await self.client.delete(PODS, name, NS, grace_period_seconds=0)


@pytest.fixture
async def env():
    store = MemoryStore(history=5000)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    clock = Clock()
    ctrl = StatefulSetController(client, clock=clock)
    await ctrl.start(sync_timeout=2)
    yield Env(client, ctrl, clock)
    await ctrl.stop(timeout=1)
    await client.close()
    await registry.close()
    await store.close()


async def _n(env: Env, n: int) -> list[str]:
    names = await env.names()
    return names if len(names) == n else []


# --------------------------------------------------------------- pure helpers


def test_parent_and_ordinal() -> None:
    assert parent_and_ordinal({"metadata": {"name": "web-12"}}) == ("web", 12)
    assert parent_and_ordinal({"metadata": {"name": "my-db-0"}}) == ("my-db", 0)
    assert parent_and_ordinal({"metadata": {"name": "web"}}) == ("", -1)
    assert parent_and_ordinal({"metadata": {"name": "web-99999999999"}})[1] == -1


def test_revision_round_trip() -> None:
    sts = make_sts()
    sts["metadata"].update(namespace=NS, uid="u1", annotations={"kubernetes.io/change-cause": "v1"})
    rev = new_revision(sts, 4, 0)
    assert rev["revision"] == 4
    assert rev["data"]["spec"]["template"]["$patch"] == "replace"
    assert rev["metadata"]["labels"]["app"] == "web"
    assert rev["metadata"]["labels"][CONTROLLER_REVISION_HASH_LABEL] in rev["metadata"]["name"]
    assert rev["metadata"]["annotations"] == {"kubernetes.io/change-cause": "v1"}
    other = make_sts(image="nginx:2")
    other["metadata"].update(namespace=NS, uid="u1")
    restored = apply_revision(other, rev)
    # The template as upstream's typed round trip writes it: defaults filled in,
    # creationTimestamp null, resources {}; map keys sorted, as kubectl compares bytes.
    assert restored["spec"]["template"] == typed_template(sts["spec"]["template"])
    tmpl = restored["spec"]["template"]
    assert tmpl["metadata"] == {"creationTimestamp": None, "labels": {"app": "web"}}
    container = tmpl["spec"]["containers"][0]
    assert container["image"] == "nginx:1" and container["resources"] == {}
    assert list(container) == sorted(container)
    assert restored["spec"]["replicas"] == other["spec"]["replicas"]
    assert list(rev["data"]["spec"]["template"]) == ["$patch", "metadata", "spec"]
    # Equal templates, however written, make equal revisions.
    written_differently = make_sts()
    written_differently["metadata"].update(namespace=NS, uid="u1")
    written_differently["spec"]["template"]["metadata"]["annotations"] = {}
    written_differently["spec"]["template"]["spec"]["containers"][0]["env"] = []
    assert new_revision(written_differently, 4, 0)["metadata"]["name"] == rev["metadata"]["name"]


@pytest.mark.parametrize(("when_deleted", "when_scaled", "scaled_down", "owners"), [
    ("Retain", "Retain", False, set()),
    ("Retain", "Retain", True, set()),
    ("Delete", "Retain", False, {"set"}),
    ("Delete", "Retain", True, {"set"}),
    ("Retain", "Delete", False, set()),
    ("Retain", "Delete", True, {"pod"}),
    ("Delete", "Delete", False, {"set"}),
    ("Delete", "Delete", True, {"pod"}),
])
def test_claim_owner_refs_follow_retention_policy(when_deleted: str, when_scaled: str, scaled_down: bool,
                                                  owners: set[str]) -> None:
    sts = make_sts(replicas=2, persistentVolumeClaimRetentionPolicy={"whenDeleted": when_deleted,
                                                                     "whenScaled": when_scaled})
    sts["metadata"].update(namespace=NS, uid="set-uid")
    pod = {"metadata": {"name": "web-5" if scaled_down else "web-1", "namespace": NS, "uid": "pod-uid"}}
    claim = {"metadata": {"name": "data-" + pod["metadata"]["name"], "ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "other", "uid": "x"}]}}
    update_claim_owner_refs(claim, sts, pod)
    refs = claim["metadata"]["ownerReferences"]
    got = {{"set-uid": "set", "pod-uid": "pod"}[r["uid"]] for r in refs if r["uid"] != "x"}
    assert got == owners
    assert any(r["uid"] == "x" for r in refs)  # other owners are kept
    assert claim_owner_up_to_date(claim, sts, pod)


# --------------------------------------------------------------- behaviour


async def test_ordered_ready_creates_one_at_a_time_with_identity(env: Env) -> None:
    sts = await env.client.create(STS, make_sts(replicas=3), NS)
    assert await eventually(lambda: _n(env, 1)) == ["web-0"]
    await env.settle()
    assert await env.names() == ["web-0"]  # waits for web-0 to be Running and Ready
    pod = (await env.pods())["web-0"]
    md, spec = pod["metadata"], pod["spec"]
    assert md["labels"][POD_NAME_LABEL] == "web-0" and md["labels"][POD_INDEX_LABEL] == "0"
    assert md["labels"]["app"] == "web" and md["labels"][REVISION_LABEL]
    assert md["ownerReferences"] == [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web",
                                      "uid": sts["metadata"]["uid"], "controller": True,
                                      "blockOwnerDeletion": True}]
    assert spec["hostname"] == "web-0" and spec["subdomain"] == "web"
    await env.ready("web-0")
    assert await eventually(lambda: _n(env, 2)) == ["web-0", "web-1"]
    await env.ready("web-1")
    await eventually(lambda: _n(env, 3))
    await env.ready("web-2")
    got = await eventually(lambda: env.status(replicas=3, readyReplicas=3, availableReplicas=3,
                                              currentReplicas=3, updatedReplicas=3))
    st = got["status"]
    assert st["currentRevision"] == st["updateRevision"] == md["labels"][REVISION_LABEL]
    assert st["observedGeneration"] == got["metadata"]["generation"] and st["collisionCount"] == 0
    created = await eventually(lambda: _len(env.events("SuccessfulCreate"), 3))
    assert sorted(e["message"] for e in created) == [
        f"Create Pod web-{i} in StatefulSet web successful" for i in range(3)]
    revs = (await env.client.list(CR, NS))["items"]
    assert [r["metadata"]["name"] for r in revs] == [st["updateRevision"]]
    assert revs[0]["revision"] == 1


async def _len(coro, n: int):  # type: ignore[no-untyped-def]
    items = await coro
    return items if len(items) >= n else []


async def test_parallel_creates_all_and_ordinals_start(env: Env) -> None:
    await env.client.create(STS, make_sts(replicas=3, podManagementPolicy="Parallel", ordinals={"start": 5}), NS)
    assert await eventually(lambda: _n(env, 3)) == ["web-5", "web-6", "web-7"]
    assert (await env.pods())["web-6"]["metadata"]["labels"][POD_INDEX_LABEL] == "6"
    await env.client.patch(STS, "web", {"spec": {"replicas": 1}}, NS)
    # Parallel: scale-down does not wait for health; the highest ordinals go.
    assert await eventually(lambda: _n(env, 1)) == ["web-5"]


async def test_ordered_scale_down_from_highest_and_replacement(env: Env) -> None:
    await env.client.create(STS, make_sts(replicas=3), NS)
    for i in range(3):
        await eventually(lambda: _n(env, i + 1))
        await env.ready(f"web-{i}")
    await eventually(lambda: env.status(readyReplicas=3))
    # A deleted pod comes back under the same name.
    await env.client.delete(PODS, "web-1", NS)
    await eventually(lambda: _n(env, 3))
    assert await env.names() == ["web-0", "web-1", "web-2"]
    await env.ready("web-1")
    await eventually(lambda: env.status(readyReplicas=3))
    # Bound pods terminate gracefully: the next one goes only once the last is gone.
    for i in range(3):
        await env.bind(f"web-{i}", "n1")
    await env.client.patch(STS, "web", {"spec": {"replicas": 1}}, NS)
    assert await eventually(lambda: _n(env, 2)) == ["web-0", "web-1"]
    await env.settle()
    assert await env.names() == ["web-0", "web-1"]
    await env.finish("web-2")
    assert await eventually(lambda: _n(env, 1)) == ["web-0"]
    deleted = await eventually(lambda: _len(env.events("SuccessfulDelete"), 2))
    assert {e["message"] for e in deleted} >= {"Delete Pod web-2 in StatefulSet web successful",
                                              "Delete Pod web-1 in StatefulSet web successful"}


async def test_failed_pod_is_recreated(env: Env) -> None:
    await env.client.create(STS, make_sts(replicas=1), NS)
    first = (await eventually(lambda: env.pods()))["web-0"]
    await env.client.patch(PODS, "web-0", {"status": {"phase": "Failed"}}, NS, subresource="status")

    async def replaced() -> bool:
        pod = (await env.pods()).get("web-0")
        return pod is not None and pod["metadata"]["uid"] != first["metadata"]["uid"]
    await eventually(replaced)


async def test_rolling_update_in_reverse_ordinal_order_with_partition(env: Env) -> None:
    await env.client.create(STS, make_sts(replicas=3, updateStrategy={
        "type": "RollingUpdate", "rollingUpdate": {"partition": 1}}), NS)
    for i in range(3):
        await eventually(lambda: _n(env, i + 1))
        await env.ready(f"web-{i}")
    old = (await eventually(lambda: env.status(readyReplicas=3)))["status"]["updateRevision"]
    await env.client.patch(STS, "web", {"spec": {"template": {"spec": {"containers": [
        {"name": "c", "image": "nginx:2"}]}}}}, NS)

    async def image(name: str) -> str:
        pod = (await env.pods()).get(name)
        return pod["spec"]["containers"][0]["image"] if pod else ""

    # web-2 goes first; web-1 waits until web-2 is back and ready.
    assert await eventually(lambda: _eq(image("web-2"), "nginx:2"))
    await env.settle()
    assert await image("web-1") == "nginx:1"
    await env.ready("web-2")
    assert await eventually(lambda: _eq(image("web-1"), "nginx:2"))
    await env.ready("web-1")
    got = await eventually(lambda: env.status(updatedReplicas=2, readyReplicas=3))
    st = got["status"]
    # The partition keeps web-0 at the old revision: the rollout is not complete.
    assert await image("web-0") == "nginx:1"
    assert st["currentRevision"] == old and st["updateRevision"] != old and st["currentReplicas"] == 1
    revs = sorted((await env.client.list(CR, NS))["items"], key=lambda r: r["revision"])
    assert [r["revision"] for r in revs] == [1, 2] and revs[1]["metadata"]["name"] == st["updateRevision"]
    # Lowering the partition finishes it.
    await env.client.patch(STS, "web", {"spec": {"updateStrategy": {"rollingUpdate": {"partition": 0}}}}, NS)
    assert await eventually(lambda: _eq(image("web-0"), "nginx:2"))
    await env.ready("web-0")
    got = await eventually(lambda: env.status(updatedReplicas=3, readyReplicas=3, currentReplicas=3))
    assert got["status"]["currentRevision"] == got["status"]["updateRevision"] == st["updateRevision"]


async def _eq(coro, want):  # type: ignore[no-untyped-def]
    return (await coro) == want


async def test_max_unavailable_deletes_several_at_once(env: Env) -> None:
    await env.client.create(STS, make_sts(replicas=4, podManagementPolicy="Parallel", updateStrategy={
        "type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2}}), NS)
    await eventually(lambda: _n(env, 4))
    for i in range(4):
        await env.ready(f"web-{i}")
    await eventually(lambda: env.status(readyReplicas=4))
    before = {n: p["metadata"]["uid"] for n, p in (await env.pods()).items()}
    await env.client.patch(STS, "web", {"spec": {"template": {"spec": {"containers": [
        {"name": "c", "image": "nginx:2"}]}}}}, NS)

    async def replaced() -> set[str]:
        pods = await env.pods(terminating=True)
        return {n for n, p in pods.items() if p["metadata"]["uid"] != before[n]}
    assert await eventually(lambda: _eq(replaced(), {"web-2", "web-3"}))
    await env.settle()
    assert await replaced() == {"web-2", "web-3"}  # two unavailable: no third deletion
    await env.ready("web-3")
    await env.ready("web-2")
    assert await eventually(lambda: _eq(replaced(), {"web-0", "web-1", "web-2", "web-3"}))


async def test_on_delete_waits_for_manual_deletion(env: Env) -> None:
    await env.client.create(STS, make_sts(replicas=2, updateStrategy={"type": "OnDelete"}), NS)
    for i in range(2):
        await eventually(lambda: _n(env, i + 1))
        await env.ready(f"web-{i}")
    await eventually(lambda: env.status(readyReplicas=2))
    await env.client.patch(STS, "web", {"spec": {"template": {"spec": {"containers": [
        {"name": "c", "image": "nginx:2"}]}}}}, NS)
    await eventually(lambda: _revs(env, 2))
    await env.settle()
    pods = await env.pods()
    assert [p["spec"]["containers"][0]["image"] for p in pods.values()] == ["nginx:1", "nginx:1"]
    await env.client.delete(PODS, "web-1", NS)

    async def web1_new() -> bool:
        pod = (await env.pods()).get("web-1")
        return bool(pod) and pod["spec"]["containers"][0]["image"] == "nginx:2"
    await eventually(web1_new)
    got = await eventually(lambda: env.status(updatedReplicas=1, currentReplicas=1))
    assert got["status"]["currentRevision"] != got["status"]["updateRevision"]


async def _revs(env: Env, n: int) -> list[dict]:
    items = (await env.client.list(CR, NS))["items"]
    return items if len(items) == n else []


async def test_undo_renumbers_the_old_revision_and_history_is_truncated(env: Env) -> None:
    await env.client.create(STS, make_sts(replicas=1, revisionHistoryLimit=1, podManagementPolicy="Parallel"), NS)
    await eventually(lambda: _n(env, 1))
    first = (await eventually(lambda: _revs(env, 1)))[0]
    for image in ("nginx:2", "nginx:3"):
        await env.client.patch(STS, "web", {"spec": {"template": {"spec": {"containers": [
            {"name": "c", "image": image}]}}}}, NS)
        await env.ready("web-0")

        async def at(image: str = image) -> bool:
            pod = (await env.pods()).get("web-0")
            return bool(pod) and pod["spec"]["containers"][0]["image"] == image
        await eventually(at)
        await env.ready("web-0")
        await eventually(lambda: env.status(updatedReplicas=1, readyReplicas=1))
    # revisionHistoryLimit 1: of the two unused revisions the oldest went.
    revs = await eventually(lambda: _revs(env, 2))
    assert first["metadata"]["name"] not in {r["metadata"]["name"] for r in revs}
    # Rolling back to revision 2's template (what kubectl rollout undo does) renumbers it to 4.
    two = next(r for r in revs if r["revision"] == 2)
    await env.client.patch(STS, "web", two["data"], NS, patch_type="strategic")
    got = await eventually(lambda: _renumbered(env, two["metadata"]["name"], 4))
    assert got["metadata"]["uid"] == two["metadata"]["uid"]
    assert (await eventually(lambda: env.status(updateRevision=two["metadata"]["name"])))


async def _renumbered(env: Env, name: str, revision: int) -> dict:
    got = await env.client.get(CR, name, NS)
    return got if got["revision"] == revision else {}


async def test_volume_claim_templates_and_retention_policy(env: Env) -> None:
    gc = GarbageCollector(env.client)
    await gc.start(sync_timeout=2)
    try:
        claim = {"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"],
                                                       "resources": {"requests": {"storage": "1Gi"}}}}
        sts = await env.client.create(STS, make_sts(
            replicas=2, podManagementPolicy="Parallel", volumeClaimTemplates=[claim],
            persistentVolumeClaimRetentionPolicy={"whenDeleted": "Retain", "whenScaled": "Delete"}), NS)
        assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["volumeMode"] == "Filesystem"
        await eventually(lambda: _n(env, 2))
        pods = await env.pods()
        assert pods["web-1"]["spec"]["volumes"] == [{"name": "data",
                                                     "persistentVolumeClaim": {"claimName": "data-web-1"}}]
        pvcs = await eventually(lambda: _pvcs(env, 2))
        assert sorted(pvcs) == ["data-web-0", "data-web-1"]
        assert pvcs["data-web-0"]["metadata"]["labels"] == {"app": "web"}
        assert not pvcs["data-web-0"]["metadata"].get("ownerReferences")
        made = await eventually(lambda: _len(env.events("SuccessfulCreate"), 4))
        assert "Create Claim data-web-0 Pod web-0 in StatefulSet web success" in {e["message"] for e in made}
        # Scaling down: the condemned pod's claim gets the pod as owner, and goes with it.
        await env.client.patch(STS, "web", {"spec": {"replicas": 1}}, NS)
        assert await eventually(lambda: _n(env, 1)) == ["web-0"]
        assert sorted(await eventually(lambda: _pvcs(env, 1))) == ["data-web-0"]
    finally:
        await gc.stop(timeout=1)


async def test_when_deleted_delete_removes_claims_with_the_set(env: Env) -> None:
    gc = GarbageCollector(env.client)
    await gc.start(sync_timeout=2)
    try:
        claim = {"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"],
                                                       "resources": {"requests": {"storage": "1Gi"}}}}
        sts = await env.client.create(STS, make_sts(
            replicas=2, podManagementPolicy="Parallel", volumeClaimTemplates=[claim],
            persistentVolumeClaimRetentionPolicy={"whenDeleted": "Delete", "whenScaled": "Retain"}), NS)
        pvcs = await eventually(lambda: _pvcs(env, 2))

        async def owned_by_set() -> bool:
            items = (await _pvcs(env, 2)).values()
            return bool(items) and all([r["uid"] for r in c["metadata"].get("ownerReferences") or []]
                                       == [sts["metadata"]["uid"]] for c in items)
        await eventually(owned_by_set)
        # Scaling down keeps the claim (whenScaled: Retain) ...
        await env.client.patch(STS, "web", {"spec": {"replicas": 1}}, NS)
        await eventually(lambda: _n(env, 1))
        await env.settle()
        assert sorted(await _pvcs(env, 2)) == sorted(pvcs)
        # ... deleting the set deletes them all.
        await env.client.delete(STS, "web", NS)
        await eventually(lambda: _none_left(env))
    finally:
        await gc.stop(timeout=1)


async def _none_left(env: Env) -> bool:
    return not (await env.client.list(PVCS, NS))["items"] and not (await env.client.list(PODS, NS))["items"]


async def _pvcs(env: Env, n: int) -> dict[str, dict]:
    items = {c["metadata"]["name"]: c for c in (await env.client.list(PVCS, NS))["items"]
             if not c["metadata"].get("deletionTimestamp")}
    return items if len(items) == n else {}


async def test_min_ready_seconds_follows_the_injected_clock(env: Env) -> None:
    await env.client.create(STS, make_sts(replicas=2, minReadySeconds=30), NS)
    await eventually(lambda: _n(env, 1))
    await env.ready("web-0", since=T0)
    await eventually(lambda: env.status(readyReplicas=1))
    await env.settle()
    assert await env.names() == ["web-0"]  # ready, not yet available
    assert (await env.sts())["status"]["availableReplicas"] == 0
    env.clock.now = T0 + dt.timedelta(seconds=31)
    env.ctrl.statefulsets.add(f"{NS}/web")
    assert await eventually(lambda: _n(env, 2)) == ["web-0", "web-1"]
    await eventually(lambda: env.status(availableReplicas=1))


async def test_adopts_orphans_and_releases_non_matching(env: Env) -> None:
    orphan = {"metadata": {"name": "web-0", "labels": {"app": "web"}},
              "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}}
    await env.client.create(PODS, orphan, NS)
    await env.client.create(PODS, {**orphan, "metadata": {"name": "other-0", "labels": {"app": "web"}}}, NS)
    sts = await env.client.create(STS, make_sts(replicas=1), NS)

    async def owned(name: str) -> bool:
        pod = (await env.pods()).get(name)
        refs = (pod or {}).get("metadata", {}).get("ownerReferences") or []
        return any(r["uid"] == sts["metadata"]["uid"] for r in refs)
    await eventually(lambda: owned("web-0"))
    # Once Running and Ready, the adopted pod gets the set's identity labels.
    await env.ready("web-0")
    await eventually(lambda: _has_label(env, "web-0", POD_NAME_LABEL))
    await env.settle()
    assert not await owned("other-0")  # matches the selector, but not named after the set
    await env.client.patch(PODS, "web-0", {"metadata": {"labels": {"app": "moved"}}}, NS)

    async def released() -> bool:
        return not await owned("web-0")
    await eventually(released)


async def _has_label(env: Env, name: str, label: str) -> bool:
    pod = (await env.pods()).get(name)
    return bool(pod) and label in pod["metadata"].get("labels", {})


async def test_status_and_spec_validation(env: Env) -> None:
    created = await env.client.create(STS, make_sts(replicas=1), NS)
    spec = created["spec"]
    assert spec["podManagementPolicy"] == "OrderedReady" and spec["revisionHistoryLimit"] == 10
    assert spec["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"partition": 0, "maxUnavailable": 1}}
    assert spec["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    assert created["status"] == {"replicas": 0, "availableReplicas": 0}
    assert created["metadata"]["generation"] == 1

    async def causes(obj: dict, *, update: bool = False) -> list[tuple[str, str]]:
        with pytest.raises(StatusError) as err:
            if update:
                await env.client.update(STS, obj)
            else:
                await env.client.create(STS, obj, NS)
        assert err.value.code == 422
        return [(c.field, c.message) for c in err.value.causes]

    bad = make_sts("bad", podManagementPolicy="Sometimes", updateStrategy={"type": "Never"},
                   persistentVolumeClaimRetentionPolicy={"whenDeleted": "Keep"}, ordinals={"start": -1})
    got = await causes(bad)
    assert ("spec.podManagementPolicy", 'Invalid value: "Sometimes": must be \'OrderedReady\' or \'Parallel\'') in got
    assert any(f == "spec.updateStrategy" and "must be 'RollingUpdate' or 'OnDelete'" in m for f, m in got)
    assert ("spec.persistentVolumeClaimRetentionPolicy.whenDeleted",
            'Unsupported value: "Keep": supported values: "Retain", "Delete"') in got
    assert ("spec.ordinals.start", "Invalid value: -1: must be greater than or equal to 0") in got
    zero = make_sts("zero", updateStrategy={"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0}})
    assert ("spec.updateStrategy.rollingUpdate.maxUnavailable", "Invalid value: 0: cannot be 0") in await causes(zero)
    ondel = make_sts("ondel", updateStrategy={"type": "OnDelete", "rollingUpdate": {"partition": 1}})
    assert any(f == "spec.updateStrategy.rollingUpdate" and "only allowed for updateStrategy 'RollingUpdate'" in m
               for f, m in await causes(ondel))
    mismatch = make_sts("mm")
    mismatch["spec"]["selector"] = {"matchLabels": {"app": "x"}}
    assert any(f == "spec.template.metadata.labels" for f, _ in await causes(mismatch))
    # Only some fields may change.
    fresh = await env.sts()
    fresh["spec"]["serviceName"] = "other"
    assert await causes(fresh, update=True) == [(
        "spec", "Forbidden: updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', "
        "'updateStrategy', 'revisionHistoryLimit', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' "
        "are forbidden")]
    # Status: counts may not exceed replicas; collisionCount may not go down.
    fresh = await env.sts()
    fresh["status"] = {"replicas": 1, "readyReplicas": 2, "availableReplicas": 0}
    with pytest.raises(StatusError) as err:
        await env.client.update(STS, fresh, subresource="status")
    assert ("status.readyReplicas", "Invalid value: 2: cannot be greater than status.replicas") in [
        (c.field, c.message) for c in err.value.causes]


async def test_scale_subresource(env: Env) -> None:
    await env.client.create(STS, make_sts(replicas=1, podManagementPolicy="Parallel"), NS)
    scale = await env.client.get(STS, "web", NS, subresource="scale")
    assert scale["spec"]["replicas"] == 1 and scale["status"]["selector"] == "app=web"
    scale["spec"]["replicas"] = 3
    await env.client.update(STS, scale, subresource="scale")
    assert await eventually(lambda: _n(env, 3)) == ["web-0", "web-1", "web-2"]
