"""Deployment controller (with the ReplicaSet controller) against a real registry."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime as dt
from typing import AsyncIterator

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import format_time, utcnow
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.deployment import (
    DESIRED_REPLICAS,
    MAX_REPLICAS,
    POD_TEMPLATE_HASH,
    REVISION,
    DeploymentController,
    compute_hash,
    fnv32a,
    resolve_fenceposts,
    safe_encode_string,
)
from kubeplane.controllers.replicaset import ReplicaSetController
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore
from helpers import eventually, settled

PODS = resource("pods")
RS = resource("replicasets")
DEPLOY = resource("deployments")
EVENTS = resource("events")
NS = "default"


def make_deploy(name: str, replicas: int, image: str = "nginx:1", *, strategy: dict | None = None,
                history: int | None = None, deadline: int | None = None) -> dict:
    spec: dict = {
        "replicas": replicas,
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}},
                     "spec": {"containers": [{"name": "c", "image": image}]}},
    }
    if strategy is not None:
        spec["strategy"] = strategy
    if history is not None:
        spec["revisionHistoryLimit"] = history
    if deadline is not None:
        spec["progressDeadlineSeconds"] = deadline
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name}, "spec": spec}


class Clock:
    """The Deployment controller's clock: still unless a test moves it."""

    def __init__(self) -> None:
        self.now = utcnow()

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


class Env:
    def __init__(self, client: InProcessClient) -> None:
        self.client = client
        self.clock = Clock()
        #: only pods whose first image is in this set become Ready (None: all)
        self.ready_images: set[str] | None = None
        self.samples: list[tuple[int, int, int]] = []
        #: the controller under test (set by the fixture)
        self.dc: DeploymentController | None = None

    async def pods(self) -> list[dict]:
        items = (await self.client.list(PODS, NS))["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    async def rss(self) -> list[dict]:
        return (await self.client.list(RS, NS))["items"]

    async def deploy(self, name: str) -> dict:
        return await self.client.get(DEPLOY, name, NS)

    async def events(self, reason: str) -> list[dict]:
        return [e for e in (await self.client.list(EVENTS, NS))["items"] if e["reason"] == reason]

    async def kubelet(self) -> None:
        """Marks pods Ready; records (sum of RS replicas, ready pods, pods) samples."""
        while True:
            pods = await self.pods()
            for p in pods:
                image = p["spec"]["containers"][0]["image"]
                if self.ready_images is not None and image not in self.ready_images:
                    continue
                if any(c["type"] == "Ready" for c in p["status"].get("conditions") or []):
                    continue
                with contextlib.suppress(StatusError):
                    await self.client.patch(PODS, p["metadata"]["name"], {"status": {
                        "phase": "Running",
                        "conditions": [{"type": "Ready", "status": "True",
                                        "lastTransitionTime": format_time(utcnow())}]}}, NS, subresource="status")
            rss = await self.rss()
            ready = sum(1 for p in await self.pods()
                        if any(c["type"] == "Ready" and c["status"] == "True"
                               for c in p["status"].get("conditions") or []))
            self.samples.append((sum(r["spec"]["replicas"] for r in rss), ready, len(pods)))
            await asyncio.sleep(0.005)

    async def done(self, name: str, replicas: int, image: str) -> dict | None:
        """``kubectl rollout status`` logic: updated, no old replicas, available."""
        d = await self.deploy(name)
        st = d.get("status") or {}
        if st.get("observedGeneration", 0) < d["metadata"]["generation"]:
            return None
        if d["spec"]["template"]["spec"]["containers"][0]["image"] != image:
            return None
        if (st.get("updatedReplicas", 0), st.get("replicas", 0), st.get("availableReplicas", 0)) != (
                replicas, replicas, replicas):
            return None
        prog = cond(d, "Progressing")
        if not prog or prog["reason"] != "NewReplicaSetAvailable":
            return None
        return d


def cond(obj: dict, type_: str) -> dict | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return c
    return None


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    store = MemoryStore(history=5000)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    factory = SharedInformerFactory(client)
    e = Env(client)
    rsc = ReplicaSetController(client, factory)
    dc = DeploymentController(client, factory, clock=e.clock)
    await rsc.start(sync_timeout=1)
    await dc.start(sync_timeout=1)
    e.dc = dc
    task = asyncio.get_running_loop().create_task(e.kubelet())
    yield e
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await dc.stop(timeout=1)
    await rsc.stop(timeout=1)
    await factory.stop()
    await client.close()
    await registry.close()
    await store.close()


async def test_creates_replicaset_named_by_template_hash(env: Env) -> None:
    d = await env.client.create(DEPLOY, make_deploy("web", 3), NS)
    await eventually(lambda: env.done("web", 3, "nginx:1"))
    (rs,) = await env.rss()
    pod_hash = compute_hash(d["spec"]["template"])
    assert rs["metadata"]["name"] == f"web-{pod_hash}"
    assert rs["metadata"]["labels"] == {"app": "web", POD_TEMPLATE_HASH: pod_hash}
    assert rs["spec"]["selector"]["matchLabels"] == {"app": "web", POD_TEMPLATE_HASH: pod_hash}
    assert rs["spec"]["template"]["metadata"]["labels"][POD_TEMPLATE_HASH] == pod_hash
    ann = rs["metadata"]["annotations"]
    assert (ann[REVISION], ann[DESIRED_REPLICAS], ann[MAX_REPLICAS]) == ("1", "3", "4")
    ref = rs["metadata"]["ownerReferences"][0]
    assert (ref["kind"], ref["uid"], ref["controller"], ref["blockOwnerDeletion"]) == (
        "Deployment", d["metadata"]["uid"], True, True)
    d = await env.deploy("web")
    assert d["metadata"]["annotations"][REVISION] == "1"
    avail = cond(d, "Available")
    assert avail and (avail["status"], avail["reason"]) == ("True", "MinimumReplicasAvailable")
    prog = cond(d, "Progressing")
    assert prog and prog["message"] == f'ReplicaSet "web-{pod_hash}" has successfully progressed.'
    st = d["status"]
    assert (st["readyReplicas"], st["availableReplicas"], st.get("unavailableReplicas", 0)) == (3, 3, 0)
    msgs = [e["message"] for e in await env.events("ScalingReplicaSet")]
    assert f"Scaled up replica set web-{pod_hash} to 3 from 0" in msgs
    pods = await env.pods()
    assert len(pods) == 3 and all(p["metadata"]["labels"][POD_TEMPLATE_HASH] == pod_hash for p in pods)


async def test_rolling_update_respects_surge_and_unavailability(env: Env) -> None:
    strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 1}}
    await env.client.create(DEPLOY, make_deploy("web", 4, strategy=strategy), NS)
    await eventually(lambda: env.done("web", 4, "nginx:1"))
    old_rs = (await env.rss())[0]
    env.samples.clear()
    await env.client.patch(DEPLOY, "web", {"spec": {"template": {"spec": {"containers": [
        {"name": "c", "image": "nginx:2"}]}}}}, NS)
    d = await eventually(lambda: env.done("web", 4, "nginx:2"))
    assert d["metadata"]["annotations"][REVISION] == "2"
    rss = {r["metadata"]["name"]: r for r in await env.rss()}
    assert rss[old_rs["metadata"]["name"]]["spec"]["replicas"] == 0
    assert rss[old_rs["metadata"]["name"]]["metadata"]["annotations"][REVISION] == "1"
    (new_rs,) = [r for r in rss.values() if r["metadata"]["name"] != old_rs["metadata"]["name"]]
    assert new_rs["metadata"]["annotations"][REVISION] == "2" and new_rs["spec"]["replicas"] == 4
    assert env.samples, "kubelet sampled nothing"
    assert max(s[0] for s in env.samples) <= 5  # replicas + maxSurge
    assert min(s[1] for s in env.samples) >= 3  # replicas - maxUnavailable
    pods = await env.pods()
    assert {p["spec"]["containers"][0]["image"] for p in pods} == {"nginx:2"}
    msgs = [e["message"] for e in await env.events("ScalingReplicaSet")]
    assert any(m.startswith(f"Scaled down replica set {old_rs['metadata']['name']} to ") for m in msgs)


async def test_recreate_kills_old_pods_before_new(env: Env) -> None:
    await env.client.create(DEPLOY, make_deploy("web", 3, strategy={"type": "Recreate"}), NS)
    await eventually(lambda: env.done("web", 3, "nginx:1"))
    seen_mixed = False

    async def watch_mix() -> None:
        nonlocal seen_mixed
        while True:
            images = {p["spec"]["containers"][0]["image"] for p in await env.pods()}
            if images == {"nginx:1", "nginx:2"}:
                seen_mixed = True
            await asyncio.sleep(0.002)

    task = asyncio.get_running_loop().create_task(watch_mix())
    await env.client.patch(DEPLOY, "web", {"spec": {"template": {"spec": {"containers": [
        {"name": "c", "image": "nginx:2"}]}}}}, NS)
    await eventually(lambda: env.done("web", 3, "nginx:2"))
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert not seen_mixed
    assert len(await env.pods()) == 3


async def test_scale_during_rollout_is_proportional(env: Env) -> None:
    env.ready_images = {"nginx:1"}
    await env.client.create(DEPLOY, make_deploy("web", 4), NS)  # 25% / 25%: surge 1, unavailable 1
    await eventually(lambda: env.done("web", 4, "nginx:1"))
    old_name = (await env.rss())[0]["metadata"]["name"]
    await env.client.patch(DEPLOY, "web", {"spec": {"template": {"spec": {"containers": [
        {"name": "c", "image": "nginx:2"}]}}}}, NS)

    async def sizes() -> dict[str, int] | None:
        rss = await env.rss()
        if len(rss) != 2:
            return None
        out = {("old" if r["metadata"]["name"] == old_name else "new"): r["spec"]["replicas"] for r in rss}
        return out

    async def stuck() -> bool:
        return await sizes() == {"old": 3, "new": 2}

    await eventually(stuck)
    await env.client.patch(DEPLOY, "web", {"spec": {"replicas": 8}}, NS)

    async def scaled() -> bool:
        return await sizes() == {"old": 6, "new": 4}

    await eventually(scaled)
    rss = await env.rss()
    assert all(r["metadata"]["annotations"][DESIRED_REPLICAS] == "8" for r in rss)
    assert all(r["metadata"]["annotations"][MAX_REPLICAS] == "10" for r in rss)


async def test_revision_history_limit_cleans_old_replicasets(env: Env) -> None:
    await env.client.create(DEPLOY, make_deploy("web", 2, history=1), NS)
    for i, image in enumerate(("nginx:1", "nginx:2", "nginx:3")):
        if i:
            await env.client.patch(DEPLOY, "web", {"spec": {"template": {"spec": {"containers": [
                {"name": "c", "image": image}]}}}}, NS)
        await eventually(lambda: env.done("web", 2, image))

    async def two_left() -> list[dict] | None:
        rss = await env.rss()
        return rss if len(rss) == 2 else None

    rss = await eventually(two_left)
    revisions = sorted(r["metadata"]["annotations"][REVISION] for r in rss)
    assert revisions == ["2", "3"]


async def test_paused_deployment_does_not_roll_out(env: Env) -> None:
    await env.client.create(DEPLOY, make_deploy("web", 2), NS)
    await eventually(lambda: env.done("web", 2, "nginx:1"))
    await env.client.patch(DEPLOY, "web", {"spec": {"paused": True}}, NS)

    async def paused() -> bool:
        c = cond(await env.deploy("web"), "Progressing")
        return bool(c and c["reason"] == "DeploymentPaused" and c["status"] == "Unknown")

    await eventually(paused)
    await env.client.patch(DEPLOY, "web", {"spec": {"template": {"spec": {"containers": [
        {"name": "c", "image": "nginx:2"}]}}}}, NS)
    # Sync point: the controller has seen the new template and handled it (its
    # periodic progress re-checks stay scheduled, so its queue is never idle).
    dc = env.dc
    assert dc is not None
    await settled(dc, env.client, (dc.d_informer, DEPLOY), namespace=NS, delayed=True)
    assert len(await env.rss()) == 1
    await env.client.patch(DEPLOY, "web", {"spec": {"paused": False}}, NS)
    await eventually(lambda: env.done("web", 2, "nginx:2"))
    assert len(await env.rss()) == 2


async def test_unavailable_and_progress_deadline_conditions(env: Env) -> None:
    env.ready_images = set()
    await env.client.create(DEPLOY, make_deploy("web", 2, deadline=600), NS)

    async def unavailable() -> dict | None:
        d = await env.deploy("web")
        c = cond(d, "Available")
        return d if c and c["status"] == "False" and c["reason"] == "MinimumReplicasUnavailable" else None

    d = await eventually(unavailable)
    assert d["status"].get("unavailableReplicas") == 2

    async def progressing(reason: str, status: str = "True") -> dict | None:
        c = cond(await env.deploy("web"), "Progressing")
        return c if c and c["reason"] == reason and c["status"] == status else None

    d = await eventually(lambda: _counted(env, "web", 2))
    dc = env.dc
    assert dc is not None
    await settled(dc, env.client, (dc.d_informer, DEPLOY), (dc.rs_informer, RS), namespace=NS, delayed=True)
    started = cond(await env.deploy("web"), "Progressing")
    assert started is not None and started["status"] == "True"
    assert started["reason"] in ("NewReplicaSetCreated", "ReplicaSetUpdated")
    assert started["lastUpdateTime"] == format_time(env.clock())
    # just before the deadline nothing changes, however often the controller looks
    env.clock.advance(599)
    dc.deployments.add(f"{NS}/web")
    await settled(dc, env.client, (dc.d_informer, DEPLOY), (dc.rs_informer, RS), namespace=NS, delayed=True)
    assert cond(await env.deploy("web"), "Progressing") == started
    env.clock.advance(2)
    dc.deployments.add(f"{NS}/web")
    c = await eventually(lambda: progressing("ProgressDeadlineExceeded", "False"))
    assert c["message"] == f'ReplicaSet "{(await env.rss())[0]["metadata"]["name"]}" has timed out progressing.'
    assert c["lastUpdateTime"] == c["lastTransitionTime"] == format_time(env.clock())
    # the pods become available after all: the rollout completes
    env.ready_images = None
    c = await eventually(lambda: progressing("NewReplicaSetAvailable"))
    assert c["message"].endswith("has successfully progressed.")


async def _counted(env: Env, name: str, replicas: int) -> dict | None:
    d = await env.deploy(name)
    st = d.get("status") or {}
    return d if (st.get("replicas"), st.get("updatedReplicas")) == (replicas, replicas) else None


def test_fenceposts_round_as_upstream() -> None:
    assert resolve_fenceposts("25%", "25%", 4) == (1, 1)
    assert resolve_fenceposts("25%", "25%", 10) == (3, 2)  # surge rounds up, unavailable down
    assert resolve_fenceposts("0%", "0%", 10) == (0, 1)
    assert resolve_fenceposts(0, 0, 3) == (0, 1)
    assert resolve_fenceposts("50%", 2, 3) == (2, 2)


def test_hash_helpers() -> None:
    assert fnv32a(b"") == 0x811C9DC5
    assert fnv32a(b"a") == 0xE40C292C
    # Decimal digits map into the safe alphabet: '0' -> '4', '6' -> 'b'.
    assert safe_encode_string("0123456789") == "456789bcdf"
    t = {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    assert compute_hash(t) == compute_hash({"spec": t["spec"], "metadata": t["metadata"]})
    assert compute_hash(t) != compute_hash(t, 1)
    assert set(compute_hash(t)) <= set("bcdfghjklmnpqrstvwxz2456789")


def undo_patch(rs: dict, deployment: dict) -> list[dict]:
    """The JSON patch ``kubectl rollout undo`` sends: the ReplicaSet's template
    as Go marshals it (without the hash label; ``creationTimestamp: null``,
    empty omitempty maps and lists as the struct round trip leaves them) and
    the annotations."""
    template = copy.deepcopy(rs["spec"]["template"])
    template["metadata"]["labels"].pop(POD_TEMPLATE_HASH)
    template["metadata"]["creationTimestamp"] = None
    template["metadata"]["annotations"] = {}
    template["spec"]["containers"][0]["args"] = []
    annotations = {k: v for k, v in (deployment["metadata"].get("annotations") or {}).items()}
    return [{"op": "replace", "path": "/spec/template", "value": template},
            {"op": "replace", "path": "/metadata/annotations", "value": annotations}]


async def test_rollout_undo_reuses_the_old_replicaset(env: Env) -> None:
    await env.client.create(DEPLOY, make_deploy("web", 2), NS)
    await eventually(lambda: env.done("web", 2, "nginx:1"))
    (rs1,) = await env.rss()
    await env.client.patch(DEPLOY, "web", {"spec": {"template": {"spec": {"containers": [
        {"name": "c", "image": "nginx:2"}]}}}}, NS)
    d = await eventually(lambda: env.done("web", 2, "nginx:2"))
    assert len(await env.rss()) == 2
    await env.client.patch(DEPLOY, "web", undo_patch(rs1, d), NS, patch_type="json")
    d = await eventually(lambda: env.done("web", 2, "nginx:1"))
    rss = {r["metadata"]["name"]: r for r in await env.rss()}
    # No third ReplicaSet: the first one is the new one again, as revision 3.
    assert len(rss) == 2
    again = rss[rs1["metadata"]["name"]]
    assert again["spec"]["replicas"] == 2
    assert again["metadata"]["annotations"][REVISION] == "3"
    assert again["metadata"]["annotations"]["deployment.kubernetes.io/revision-history"] == "1"
    assert d["metadata"]["annotations"][REVISION] == "3"
    assert sorted(r["metadata"]["annotations"][REVISION] for r in rss.values()) == ["2", "3"]


def test_equal_templates_hash_equally() -> None:
    t = {"metadata": {"labels": {"app": "a"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    written_back = {"metadata": {"labels": {"app": "a"}, "creationTimestamp": None, "annotations": {}},
                    "spec": {"containers": [{"name": "c", "image": "i", "args": [], "env": None,
                                             "terminationMessagePath": "/dev/termination-log"}],
                             "restartPolicy": "Always", "nodeSelector": {}}}
    assert compute_hash(t) == compute_hash(written_back)
    # A pointer to an empty struct is not the same as no value.
    with_volume = copy.deepcopy(t)
    with_volume["spec"]["volumes"] = [{"name": "v", "emptyDir": {}}]
    assert compute_hash(with_volume) != compute_hash(t)
    assert compute_hash(t) != compute_hash({**t, "spec": {"containers": [{"name": "c", "image": "j"}]}})
