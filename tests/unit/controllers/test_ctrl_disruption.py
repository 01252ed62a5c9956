"""Disruption controller: PodDisruptionBudget status from the selected pods
and their controllers' scale, with an injected clock for disruptedPods and
stale DisruptionTarget conditions."""

from __future__ import annotations

import datetime as dt

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import format_time, now_text, utcnow
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.disruption import DisruptionController, scaled_value
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore
from helpers import eventually

PODS = resource("pods")
PDBS = resource("poddisruptionbudgets")
RS = resource("replicasets")
DEPLOYMENTS = resource("deployments")
EVENTS = resource("events")
NS = "default"


class Clock:
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
    ctrl = DisruptionController(client, factory, clock=clock)
    await ctrl.start(sync_timeout=1)
    yield client, clock, ctrl
    await ctrl.stop(timeout=1)
    await factory.stop()
    await client.close()
    await registry.close()
    await store.close()


def template(labels):
    return {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}}


async def make_rs(client, name, replicas, labels, owner=None):
    md = {"name": name}
    if owner:
        md["ownerReferences"] = [owner]
    return await client.create(RS, {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": md, "spec": {
        "replicas": replicas, "selector": {"matchLabels": labels}, "template": template(labels)}}, NS)


def ref(obj, kind, api_version="apps/v1"):
    return {"apiVersion": api_version, "kind": kind, "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True}


async def make_pod(client, name, labels, *, ready=True, owner=None):
    md = {"name": name, "labels": labels}
    if owner:
        md["ownerReferences"] = [owner]
    await client.create(PODS, {"metadata": md, "spec": {"nodeName": "n1", "containers": [
        {"name": "c", "image": "nginx:1"}]}}, NS)
    await client.patch(PODS, name, {"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": now_text()}]}},
        NS, subresource="status")


async def make_pdb(client, name, labels, **spec):
    return await client.create(PDBS, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                                      "metadata": {"name": name},
                                      "spec": {"selector": {"matchLabels": labels}, **spec}}, NS)


async def status_when(client, name, **want):
    async def check():
        st = (await client.get(PDBS, name, NS)).get("status") or {}
        return st if all(st.get(k) == v for k, v in want.items()) else None
    return await eventually(check, what=f"pdb {name} status {want}")


def allowed_condition(status):
    return next(c for c in status["conditions"] if c["type"] == "DisruptionAllowed")


async def events(client, reason):
    return [e for e in (await client.list(EVENTS, NS))["items"] if e["reason"] == reason]


async def test_min_available_integer_counts_ready_pods(env):
    client, clock, ctrl = env
    await make_pdb(client, "empty", {"app": "none"}, minAvailable=1)
    st = await status_when(client, "empty", observedGeneration=1)
    assert (st["expectedPods"], st["disruptionsAllowed"]) == (0, 0)
    await eventually(lambda: events(client, "NoPods"))
    labels = {"app": "web"}
    for i in range(3):
        await make_pod(client, f"w{i}", labels, ready=i < 2)
    await make_pdb(client, "web", labels, minAvailable=1)
    st = await status_when(client, "web", currentHealthy=2, desiredHealthy=1, expectedPods=3, disruptionsAllowed=1)
    cond = allowed_condition(st)
    assert (cond["status"], cond["reason"], cond["observedGeneration"]) == ("True", "SufficientPods", 1)
    # a ready pod going away is seen at once
    await client.delete(PODS, "w0", NS, grace_period_seconds=0)
    st = await status_when(client, "web", currentHealthy=1, disruptionsAllowed=0)
    assert (allowed_condition(st)["status"], allowed_condition(st)["reason"]) == ("False", "InsufficientPods")


async def test_max_unavailable_uses_the_controllers_scale(env):
    client, clock, ctrl = env
    d = await client.create(DEPLOYMENTS, {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
                                          "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "d"}},
                                                   "template": template({"app": "d"})}}, NS)
    rs = await make_rs(client, "d-1", 3, {"app": "d"}, owner=ref(d, "Deployment"))
    for i in range(3):
        await make_pod(client, f"d{i}", {"app": "d"}, owner=ref(rs, "ReplicaSet"))
    await make_pdb(client, "d", {"app": "d"}, maxUnavailable="25%")
    # expected: the Deployment's 4 replicas; 25% of 4 rounded up is 1 unavailable
    await status_when(client, "d", expectedPods=4, desiredHealthy=3, currentHealthy=3, disruptionsAllowed=0)
    plain = await make_rs(client, "plain", 2, {"app": "p"})
    for i in range(2):
        await make_pod(client, f"p{i}", {"app": "p"}, owner=ref(plain, "ReplicaSet"))
    await make_pdb(client, "p", {"app": "p"}, minAvailable="50%")
    await status_when(client, "p", expectedPods=2, desiredHealthy=1, currentHealthy=2, disruptionsAllowed=1)


async def test_unaccounted_pods_fail_safe(env):
    client, clock, ctrl = env
    await make_pod(client, "lost", {"app": "l"}, owner={"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                                          "name": "gone", "uid": "u-1", "controller": True})
    await make_pdb(client, "l", {"app": "l"}, maxUnavailable=1)
    st = await status_when(client, "l", disruptionsAllowed=0)
    cond = await eventually(lambda: _condition(client, "l", "SyncFailed"))
    assert (cond["status"], cond["message"]) == ("False", 'found no controllers for pod "lost"')
    await eventually(lambda: events(client, "CalculateExpectedPodCountFailed"))
    del st
    # unmanaged pods under a percentage budget: an event, and they count for nothing expected
    await make_pod(client, "solo", {"app": "s"})
    await make_pdb(client, "s", {"app": "s"}, minAvailable="100%")
    await status_when(client, "s", expectedPods=0, currentHealthy=1, disruptionsAllowed=0)
    ev = await eventually(lambda: events(client, "UnmanagedPods"))
    assert "were found to be unmanaged" in ev[0]["message"]


async def _condition(client, name, reason):
    st = (await client.get(PDBS, name, NS)).get("status") or {}
    for c in st.get("conditions") or []:
        if c["type"] == "DisruptionAllowed" and c["reason"] == reason:
            return c
    return None


async def test_evicted_pods_stay_unhealthy_until_deleted_or_timed_out(env):
    client, clock, ctrl = env
    labels = {"app": "e"}
    for i in range(3):
        await make_pod(client, f"e{i}", labels)
    await make_pdb(client, "e", labels, minAvailable=1)
    await status_when(client, "e", currentHealthy=3, disruptionsAllowed=2)
    # the eviction subresource takes a disruption; the pod is slow to go (a finalizer)
    await client.patch(PODS, "e0", {"metadata": {"finalizers": ["example.com/hold"]}}, NS)
    await client.create(PODS, {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "e0"}}, NS,
                        subresource="eviction", name="e0")
    # terminating: not healthy
    await status_when(client, "e", currentHealthy=2, disruptionsAllowed=1)
    # a disruption recorded for a pod that is never deleted counts until the timeout
    st = (await client.get(PDBS, "e", NS))
    st["status"]["disruptedPods"] = {"e1": format_time(clock())}
    st["status"]["disruptionsAllowed"] = 0
    await client.update(PDBS, st, subresource="status")
    await status_when(client, "e", currentHealthy=1, disruptionsAllowed=0)
    clock.advance(121)
    ctrl.queue("pdbs").add("default/e")
    st = await status_when(client, "e", currentHealthy=2, disruptionsAllowed=1)
    assert not st.get("disruptedPods")
    ev = await eventually(lambda: events(client, "NotDeleted"))
    assert ev[0]["message"] == "Pod was expected by PDB default/default to be deleted but it wasn't"
    await client.patch(PODS, "e0", {"metadata": {"finalizers": None}}, NS)


async def test_stale_disruption_target_is_reset(env):
    client, clock, ctrl = env
    await make_pod(client, "t", {"app": "t"})
    await client.patch(PODS, "t", {"status": {"conditions": [
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
         "lastTransitionTime": format_time(clock())}]}}, NS, patch_type="strategic", subresource="status")
    await eventually(lambda: ctrl.queue("stale").idle is False)
    clock.advance(121)
    ctrl.queue("stale").add("default/t")

    async def reset():
        pod = await client.get(PODS, "t", NS)
        return next(c for c in pod["status"]["conditions"] if c["type"] == "DisruptionTarget")["status"] == "False"
    await eventually(reset)


def test_scaled_value():
    assert scaled_value(3, 10, True) == 3
    assert scaled_value("25%", 5, True) == 2 and scaled_value("25%", 5, False) == 1
    with pytest.raises(ValueError):
        scaled_value("3", 10, True)
    with pytest.raises(ValueError):
        scaled_value("x%", 10, True)


async def test_invalid_budget_is_refused(env):
    client, _clock, _ctrl = env
    with pytest.raises(StatusError) as err:
        await make_pdb(client, "bad", {"app": "x"}, minAvailable=1, maxUnavailable=1)
    assert err.value.code == 422
