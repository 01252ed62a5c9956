"""ReplicaSet controller against a real registry (MemoryStore + InProcessClient + informers)."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Awaitable

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import format_time, utcnow
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.replicaset import (
    Expectations,
    ReplicaSetController,
    pods_to_delete,
    slow_start_batch,
)
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore
from helpers import eventually, settled

PODS = resource("pods")
RS = resource("replicasets")
EVENTS = resource("events")
NS = "default"


def make_rs(name: str, replicas: int, labels: dict[str, str] | None = None, *, min_ready: int = 0) -> dict:
    labels = labels or {"app": name}
    spec: dict = {
        "replicas": replicas,
        "selector": {"matchLabels": labels},
        "template": {"metadata": {"labels": labels},
                     "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}},
    }
    if min_ready:
        spec["minReadySeconds"] = min_ready
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name}, "spec": spec}


def make_pod(name: str, labels: dict[str, str]) -> dict:
    return {"metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}}


async def mark_ready(client: InProcessClient, name: str, *, since: str | None = None) -> None:
    now = since or format_time(utcnow())
    await client.patch(PODS, name, {"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": now}]}}, NS, subresource="status")


async def bind(client: InProcessClient, pod: str, node: str) -> None:
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod},
               "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    await client.create(PODS, binding, NS, subresource="binding", name=pod)


class Env:
    def __init__(self, client: InProcessClient, ctrl: ReplicaSetController) -> None:
        self.client = client
        self.ctrl = ctrl

    async def pods(self, owner_uid: str | None = None, *, active: bool = True) -> list[dict]:
        items = (await self.client.list(PODS, NS))["items"]
        if active:
            items = [p for p in items if not p["metadata"].get("deletionTimestamp")]
        if owner_uid is not None:
            items = [p for p in items
                     if any(r["uid"] == owner_uid for r in p["metadata"].get("ownerReferences") or [])]
        return items

    async def rs(self, name: str) -> dict:
        return await self.client.get(RS, name, NS)

    async def events(self, reason: str) -> list[dict]:
        return [e for e in (await self.client.list(EVENTS, NS))["items"] if e["reason"] == reason]


@pytest.fixture
async def env():
    store = MemoryStore(history=2000)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    ctrl = ReplicaSetController(client)
    await ctrl.start(sync_timeout=1)
    yield Env(client, ctrl)
    await ctrl.stop(timeout=1)
    await client.close()
    await registry.close()
    await store.close()


async def test_creates_pods_with_owner_reference_and_events(env: Env) -> None:
    rs = await env.client.create(RS, make_rs("web", 3), NS)
    uid = rs["metadata"]["uid"]
    pods = await eventually(lambda: _n(env.pods(uid), 3))
    for p in pods:
        assert p["metadata"]["name"].startswith("web-")
        assert p["metadata"]["labels"] == {"app": "web"}
        ref = p["metadata"]["ownerReferences"][0]
        assert ref == {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": uid,
                       "controller": True, "blockOwnerDeletion": True}
    got = await eventually(lambda: _status(env, "web", replicas=3))
    assert got["status"]["fullyLabeledReplicas"] == 3
    assert got["status"]["readyReplicas"] == 0
    assert got["status"]["observedGeneration"] == got["metadata"]["generation"]
    created = await eventually(lambda: _n(env.events("SuccessfulCreate"), 3))
    assert all(e["message"].startswith("Created pod: web-") for e in created)
    # Steady state: no more pods once the controller has seen its own writes.
    ctrl = env.ctrl
    await settled(ctrl, env.client, (ctrl.pod_informer, PODS), (ctrl.rs_informer, RS), namespace=NS)
    assert len(await env.pods(uid)) == 3


async def test_scale_down_deletes_least_valuable_pods(env: Env) -> None:
    rs = await env.client.create(RS, make_rs("web", 4), NS)
    uid = rs["metadata"]["uid"]
    pods = await eventually(lambda: _n(env.pods(uid), 4))
    ready_names = sorted(p["metadata"]["name"] for p in pods)[:2]
    for n in ready_names:
        await mark_ready(env.client, n)
    await eventually(lambda: _status(env, "web", readyReplicas=2))
    await env.client.patch(RS, "web", {"spec": {"replicas": 2}}, NS)
    left = await eventually(lambda: _n(env.pods(uid), 2))
    assert sorted(p["metadata"]["name"] for p in left) == ready_names
    await eventually(lambda: _status(env, "web", replicas=2, readyReplicas=2, availableReplicas=2))
    deleted = await eventually(lambda: _n(env.events("SuccessfulDelete"), 2))
    assert all(e["message"].startswith("Deleted pod: ") for e in deleted)


async def test_replaces_deleted_pod(env: Env) -> None:
    rs = await env.client.create(RS, make_rs("web", 2), NS)
    uid = rs["metadata"]["uid"]
    pods = await eventually(lambda: _n(env.pods(uid), 2))
    await env.client.delete(PODS, pods[0]["metadata"]["name"], NS)
    after = await eventually(lambda: _n(env.pods(uid), 2))
    assert pods[0]["metadata"]["name"] not in {p["metadata"]["name"] for p in after}


async def test_adopts_orphans_and_releases_non_matching(env: Env) -> None:
    await env.client.create(PODS, make_pod("orphan-1", {"app": "web"}), NS)
    await env.client.create(PODS, make_pod("other", {"app": "db"}), NS)
    rs = await env.client.create(RS, make_rs("web", 2), NS)
    uid = rs["metadata"]["uid"]
    owned = await eventually(lambda: _n(env.pods(uid), 2))
    names = {p["metadata"]["name"] for p in owned}
    assert "orphan-1" in names and "other" not in names
    # Relabel the adopted pod: it is released and replaced.
    await env.client.patch(PODS, "orphan-1", {"metadata": {"labels": {"app": "moved"}}}, NS)
    owned = await eventually(lambda: _n(env.pods(uid), 2, exclude="orphan-1"))
    assert "orphan-1" not in {p["metadata"]["name"] for p in owned}
    released = await env.client.get(PODS, "orphan-1", NS)
    assert not released["metadata"].get("ownerReferences")


async def test_terminating_pods_do_not_count(env: Env) -> None:
    rs = await env.client.create(RS, make_rs("web", 1), NS)
    uid = rs["metadata"]["uid"]
    # A pod on a node deletes gracefully: it lingers with a deletionTimestamp.
    pod = (await eventually(lambda: _n(env.pods(uid), 1)))[0]
    await bind(env.client, pod["metadata"]["name"], "n1")
    await env.client.delete(PODS, pod["metadata"]["name"], NS)
    term = await env.client.get(PODS, pod["metadata"]["name"], NS)
    assert term["metadata"].get("deletionTimestamp")
    fresh = await eventually(lambda: _n(env.pods(uid), 1, exclude=pod["metadata"]["name"]))
    assert fresh[0]["metadata"]["name"] != pod["metadata"]["name"]
    await eventually(lambda: _status(env, "web", replicas=1))


async def test_expectations_prevent_over_creation(env: Env) -> None:
    # Slow the pod informer's view: creations must not repeat while in flight.
    creates = 0
    orig = env.client.create

    async def counting_create(res, obj, namespace=None, **kw):  # type: ignore[no-untyped-def]
        nonlocal creates
        if res is PODS or res == PODS:
            creates += 1
        return await orig(res, obj, namespace, **kw)

    env.client.create = counting_create  # type: ignore[method-assign]
    rs = await env.client.create(RS, make_rs("web", 5), NS)
    uid = rs["metadata"]["uid"]
    # Hammer the queue while creations are being observed.
    for _ in range(20):
        env.ctrl.replicasets.add(f"{NS}/web")
        await asyncio.sleep(0.005)
    await eventually(lambda: _n(env.pods(uid), 5))
    ctrl = env.ctrl
    await settled(ctrl, env.client, (ctrl.pod_informer, PODS), (ctrl.rs_informer, RS), namespace=NS)
    assert creates == 5
    assert len(await env.pods(uid)) == 5


async def test_ready_and_available_counts_with_min_ready_seconds(env: Env) -> None:
    rs = await env.client.create(RS, make_rs("web", 2, min_ready=30), NS)
    uid = rs["metadata"]["uid"]
    pods = await eventually(lambda: _n(env.pods(uid), 2))
    old = format_time(utcnow() - dt.timedelta(seconds=120))
    await mark_ready(env.client, pods[0]["metadata"]["name"], since=old)
    await mark_ready(env.client, pods[1]["metadata"]["name"])
    got = await eventually(lambda: _status(env, "web", readyReplicas=2))
    assert got["status"]["availableReplicas"] == 1


async def test_create_failure_sets_replica_failure_condition(env: Env) -> None:
    failing = True
    orig = env.client.create

    async def flaky_create(res, obj, namespace=None, **kw):  # type: ignore[no-untyped-def]
        if res == PODS and failing:
            raise StatusError(403, "Forbidden", 'pods "x" is forbidden: exceeded quota')
        return await orig(res, obj, namespace, **kw)

    env.client.create = flaky_create  # type: ignore[method-assign]
    await env.client.create(RS, make_rs("web", 2), NS)
    got = await eventually(lambda: _cond(env, "web", "ReplicaFailure"))
    assert got["status"] == "True" and got["reason"] == "FailedCreate"
    assert "exceeded quota" in got["message"]
    failed = await eventually(lambda: env.events("FailedCreate"))
    assert failed[0]["message"] == 'Error creating: pods "x" is forbidden: exceeded quota'
    failing = False
    env.ctrl.replicasets.add(f"{NS}/web")
    await eventually(lambda: _status(env, "web", replicas=2))
    assert await _cond(env, "web", "ReplicaFailure") is None


def test_expectations_bookkeeping() -> None:
    t = [0.0]
    e = Expectations(timeout=10, clock=lambda: t[0])
    assert e.satisfied("k")
    e.expect_creations("k", 2)
    assert not e.satisfied("k")
    e.creation_observed("k")
    assert not e.satisfied("k")
    e.creation_observed("k")
    assert e.satisfied("k")
    e.expect_deletions("k", ["ns/a", "ns/b"])
    e.deletion_observed("k", "ns/a")
    e.deletion_observed("k", "ns/a")
    assert e.pending("k") == (0, 1)
    t[0] = 11.0
    assert e.satisfied("k")  # expired


def test_deletion_ranking_upstream_order() -> None:
    now = utcnow()

    def pod(name: str, *, node: str = "", phase: str = "Pending", ready: bool = False) -> dict:
        p: dict = {"metadata": {"name": name, "creationTimestamp": format_time(now)},
                   "spec": {"nodeName": node} if node else {}, "status": {"phase": phase}}
        if ready:
            p["status"]["conditions"] = [{"type": "Ready", "status": "True",
                                          "lastTransitionTime": format_time(now)}]
        return p

    pods = [pod("running-ready", node="n1", phase="Running", ready=True),
            pod("running", node="n2", phase="Running"),
            pod("unknown", node="n3", phase="Unknown"),
            pod("pending-on-node", node="n4"),
            pod("unscheduled")]
    order = [p["metadata"]["name"] for p in pods_to_delete(pods, pods, 5, now)]
    assert order == ["unscheduled", "pending-on-node", "unknown", "running", "running-ready"]


async def test_slow_start_batches_and_stops_on_error() -> None:
    sizes: list[int] = []
    calls = 0
    current = 0

    async def ok() -> None:
        nonlocal calls, current
        calls += 1
        current += 1
        await asyncio.sleep(0)
        sizes.append(current)
        current -= 1

    done, err = await slow_start_batch(7, 1, ok)
    assert (done, err, calls) == (7, None, 7)

    calls = 0

    async def fail_third() -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError("boom")

    done, err = await slow_start_batch(10, 1, fail_third)
    # Batches 1, 2 (one fails): the 4-batch is never started.
    assert calls == 3 and done == 2 and isinstance(err, RuntimeError)


# ------------------------------------------------------------------ helpers


async def _n(coro: Awaitable[list[dict]], n: int, *, exclude: str | None = None) -> list[dict] | None:
    items = await coro
    if exclude is not None and any(p["metadata"]["name"] == exclude for p in items):
        return None
    return items if len(items) == n else None


async def _status(env: Env, name: str, **want: int) -> dict | None:
    rs = await env.rs(name)
    st = rs.get("status") or {}
    return rs if all(st.get(k, 0) == v for k, v in want.items()) else None


async def _cond(env: Env, name: str, type_: str) -> dict | None:
    rs = await env.rs(name)
    for c in (rs.get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return c
    return None
