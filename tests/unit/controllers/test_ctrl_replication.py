"""ReplicationController manager (the ReplicaSet controller for core/v1
ReplicationControllers) against a real registry, next to a ReplicaSet controller."""

from __future__ import annotations

import pytest

from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.replicaset import ReplicaSetController
from kubeplane.controllers.replication import ReplicationManager
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore
from helpers import eventually, settled

PODS = resource("pods")
RCS = resource("replicationcontrollers", "")
RS = resource("replicasets")
EVENTS = resource("events")
NS = "default"


def make_rc(name: str, replicas: int, labels: dict[str, str] | None = None) -> dict:
    labels = labels or {"app": name}
    return {"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": labels,
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}}}}


class Env:
    def __init__(self, client: InProcessClient, rcm: ReplicationManager, rsc: ReplicaSetController) -> None:
        self.client, self.rcm, self.rsc = client, rcm, rsc

    async def pods(self, owner_uid: str | None = None) -> list[dict]:
        items = [p for p in (await self.client.list(PODS, NS))["items"] if not p["metadata"].get("deletionTimestamp")]
        if owner_uid is not None:
            items = [p for p in items if any(r["uid"] == owner_uid for r in p["metadata"].get("ownerReferences") or [])]
        return items

    async def rc(self, name: str) -> dict:
        return await self.client.get(RCS, name, NS)

    async def events(self, reason: str) -> list[dict]:
        return [e for e in (await self.client.list(EVENTS, NS))["items"] if e["reason"] == reason]


@pytest.fixture
async def env():
    store = MemoryStore(history=2000)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    factory = SharedInformerFactory(client)
    rcm = ReplicationManager(client, factory)
    rsc = ReplicaSetController(client, factory)
    await rcm.start(sync_timeout=1)
    await rsc.start(sync_timeout=1)
    yield Env(client, rcm, rsc)
    await rcm.stop(timeout=1)
    await rsc.stop(timeout=1)
    await factory.stop()
    await client.close()
    await registry.close()
    await store.close()


async def _n(coro, n: int):  # type: ignore[no-untyped-def]
    items = await coro
    return items if len(items) == n else None


async def _status(env: Env, name: str, **want: int) -> dict | None:
    got = await env.rc(name)
    st = got.get("status") or {}
    return got if all(st.get(k, 0) == v for k, v in want.items()) else None


async def test_creates_pods_owned_by_the_replication_controller(env: Env) -> None:
    rc = await env.client.create(RCS, make_rc("web", 3), NS)
    uid = rc["metadata"]["uid"]
    pods = await eventually(lambda: _n(env.pods(uid), 3))
    for p in pods:
        assert p["metadata"]["generateName"] == "web-"
        assert p["metadata"]["ownerReferences"] == [{
            "apiVersion": "v1", "kind": "ReplicationController", "name": "web", "uid": uid,
            "controller": True, "blockOwnerDeletion": True}]
    got = await eventually(lambda: _status(env, "web", replicas=3, fullyLabeledReplicas=3))
    assert got["status"]["observedGeneration"] == got["metadata"]["generation"]
    created = await eventually(lambda: _n(env.events("SuccessfulCreate"), 3))
    assert all(e["involvedObject"]["kind"] == "ReplicationController" for e in created)
    assert all(e["source"]["component"] == "replication-controller" for e in created)


async def test_scale_subresource_and_scale_down(env: Env) -> None:
    rc = await env.client.create(RCS, make_rc("web", 3), NS)
    uid = rc["metadata"]["uid"]
    await eventually(lambda: _n(env.pods(uid), 3))
    scale = await env.client.get(RCS, "web", NS, subresource="scale")
    scale["spec"]["replicas"] = 1
    await env.client.update(RCS, scale, subresource="scale")
    await eventually(lambda: _n(env.pods(uid), 1))
    await eventually(lambda: _status(env, "web", replicas=1))
    deleted = await eventually(lambda: _n(env.events("SuccessfulDelete"), 2))
    assert all(e["message"].startswith("Deleted pod: web-") for e in deleted)


async def test_adopts_matching_orphans_by_its_label_set(env: Env) -> None:
    for name, labels in (("orphan", {"app": "web", "extra": "1"}), ("stranger", {"app": "db"})):
        await env.client.create(PODS, {"metadata": {"name": name, "labels": labels},
                                       "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}}, NS)
    rc = await env.client.create(RCS, make_rc("web", 2), NS)
    owned = await eventually(lambda: _n(env.pods(rc["metadata"]["uid"]), 2))
    names = {p["metadata"]["name"] for p in owned}
    assert "orphan" in names and "stranger" not in names


async def test_replica_set_and_replication_controller_keep_to_their_own_pods(env: Env) -> None:
    labels = {"app": "shared"}
    rc = await env.client.create(RCS, make_rc("rc", 2, labels), NS)
    await eventually(lambda: _n(env.pods(rc["metadata"]["uid"]), 2))
    rs = await env.client.create(RS, {
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "rs"},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}}}}, NS)
    await eventually(lambda: _n(env.pods(rs["metadata"]["uid"]), 1))
    for ctrl, inf, res in ((env.rcm, env.rcm.rs_informer, RCS), (env.rsc, env.rsc.rs_informer, RS)):
        await settled(ctrl, env.client, (ctrl.pod_informer, PODS), (inf, res), namespace=NS)
    assert len(await env.pods(rc["metadata"]["uid"])) == 2
    assert len(await env.pods(rs["metadata"]["uid"])) == 1
    assert len(await env.pods()) == 3
