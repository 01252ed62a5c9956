"""The resource quota controller against a real registry (MemoryStore + InProcessClient + informers),
with the ResourceQuota admission of the default chain charging requests in between."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.resourcequota import ResourceQuotaController
from kubeplane.registry.policyadmission import ensure_system_priority_classes
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore
from helpers import eventually, settled

PODS = resource("pods")
QUOTAS = resource("resourcequotas")
SECRETS = resource("secrets")
SERVICES = resource("services")
PVCS = resource("persistentvolumeclaims")
DEPLOYMENTS = resource("deployments")
PCS = resource("priorityclasses", "scheduling.k8s.io")
NS = "default"
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> dt.datetime:
        return self.now


def pod(name: str, cpu: str | None = "100m", memory: str | None = "64Mi", **spec) -> dict:
    res: dict = {}
    if cpu:
        res.setdefault("requests", {})["cpu"] = cpu
        res.setdefault("limits", {})["cpu"] = cpu
    if memory:
        res.setdefault("requests", {})["memory"] = memory
        res.setdefault("limits", {})["memory"] = memory
    return {"metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "nginx:1", "resources": res}], **spec}}


def quota(name: str, hard: dict, **spec) -> dict:
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name}, "spec": {"hard": hard, **spec}}


class Env:
    def __init__(self, client: InProcessClient, ctrl: ResourceQuotaController, clock: Clock) -> None:
        self.client, self.ctrl, self.clock = client, ctrl, clock

    async def used(self, name: str, **want: str) -> dict | None:
        rq = await self.client.get(QUOTAS, name, NS)
        used = (rq.get("status") or {}).get("used")
        if used is None:
            return None
        return rq if all(used.get(k) == v for k, v in want.items()) else None


@pytest.fixture
async def env():
    store = MemoryStore(history=4000)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    await ensure_system_priority_classes(registry)
    client = InProcessClient(registry)
    clock = Clock()
    ctrl = ResourceQuotaController(client, clock=clock, resync_period=0)
    await ctrl.start(sync_timeout=1)
    yield Env(client, ctrl, clock)
    await ctrl.stop(timeout=1)
    await client.close()
    await registry.close()
    await store.close()


async def test_new_quota_gets_hard_and_used_from_what_exists(env: Env) -> None:
    await env.client.create(PODS, pod("a", "250m", "128Mi"), NS)
    await env.client.create(PODS, pod("b", "500m", "256Mi"), NS)
    await env.client.create(SECRETS, {"metadata": {"name": "s"}, "data": {}}, NS)
    await env.client.create(QUOTAS, quota("compute", {
        "pods": "10", "requests.cpu": "2", "limits.memory": "1Gi", "secrets": "5", "count/secrets": "5",
        "services": "3", "count/deployments.apps": "2"}), NS)
    rq = await eventually(lambda: env.used("compute", pods="2"))
    assert rq["status"]["hard"] == {"count/deployments.apps": "2", "count/secrets": "5", "limits.memory": "1Gi",
                                    "pods": "10", "requests.cpu": "2", "secrets": "5", "services": "3"}
    assert rq["status"]["used"] == {"count/deployments.apps": "0", "count/secrets": "1", "limits.memory": "384Mi",
                                    "pods": "2", "requests.cpu": "750m", "secrets": "1", "services": "0"}


async def test_admission_charges_and_refuses_with_upstreams_message(env: Env) -> None:
    await env.client.create(QUOTAS, quota("q", {"pods": "2", "requests.cpu": "1", "requests.memory": "1Gi"}), NS)
    await eventually(lambda: env.used("q", pods="0"))
    await env.client.create(PODS, pod("a", "400m", "256Mi"), NS)
    # charged by the admission before the pod was stored
    rq = await env.client.get(QUOTAS, "q", NS)
    assert rq["status"]["used"] == {"pods": "1", "requests.cpu": "400m", "requests.memory": "256Mi"}
    with pytest.raises(StatusError) as err:
        await env.client.create(PODS, pod("b", "700m", "256Mi"), NS)
    assert err.value.code == 403
    assert err.value.message == ('pods "b" is forbidden: exceeded quota: q, requested: requests.cpu=700m, '
                                 "used: requests.cpu=400m, limited: requests.cpu=1")
    # a pod that does not state what the quota limits
    with pytest.raises(StatusError) as err:
        await env.client.create(PODS, pod("c", cpu=None), NS)
    assert err.value.message == 'pods "c" is forbidden: failed quota: q: must specify requests.cpu for: c'
    # dry run: checked, not charged
    await env.client.create(PODS, pod("d", "100m", "64Mi"), NS, dry_run=True)
    assert (await env.client.get(QUOTAS, "q", NS))["status"]["used"]["pods"] == "1"
    await env.client.create(PODS, pod("e", "100m", "64Mi"), NS)
    with pytest.raises(StatusError) as err:
        await env.client.create(PODS, pod("f", "100m", "64Mi"), NS)
    assert err.value.message == ('pods "f" is forbidden: exceeded quota: q, requested: pods=1, used: pods=2, '
                                 "limited: pods=2")
    # refused in the validating phase: the generated name is known by then, as upstream reports it
    gen = pod("", "100m", "64Mi")
    gen["metadata"] = {"generateName": "gen-"}
    with pytest.raises(StatusError) as err:
        await env.client.create(PODS, gen, NS)
    assert re.fullmatch(r'pods "gen-[a-z0-9]{5}" is forbidden: exceeded quota: q, .*', err.value.message)


async def test_deleted_and_finished_pods_are_replenished(env: Env) -> None:
    await env.client.create(QUOTAS, quota("q", {"pods": "5", "requests.cpu": "2"}), NS)
    await eventually(lambda: env.used("q", pods="0"))
    for name in ("a", "b", "c"):
        await env.client.create(PODS, pod(name, "200m"), NS)
    assert (await env.client.get(QUOTAS, "q", NS))["status"]["used"] == {"pods": "3", "requests.cpu": "600m"}
    await env.client.delete(PODS, "a", NS, grace_period_seconds=0)
    await eventually(lambda: env.used("q", pods="2", **{"requests.cpu": "400m"}))
    await env.client.patch(PODS, "b", {"status": {"phase": "Succeeded"}}, NS, subresource="status")
    await eventually(lambda: env.used("q", pods="1", **{"requests.cpu": "200m"}))


async def test_pod_past_its_deletion_grace_period_stops_counting(env: Env) -> None:
    await env.client.create(QUOTAS, quota("q", {"pods": "5"}), NS)
    await eventually(lambda: env.used("q", pods="0"))
    await env.client.create(PODS, pod("a"), NS)
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "a"},
               "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}}
    await env.client.create(PODS, binding, NS, subresource="binding", name="a")
    # a pod on a node is deleted gracefully: it lingers with a deletionTimestamp
    await env.client.delete(PODS, "a", NS, grace_period_seconds=30)
    gone = await env.client.get(PODS, "a", NS)
    deleted_at = gone["metadata"]["deletionTimestamp"]
    env.clock.now = dt.datetime.fromisoformat(deleted_at.replace("Z", "+00:00")) + dt.timedelta(seconds=10)
    await env.client.patch(QUOTAS, "q", {"spec": {"hard": {"pods": "6"}}}, NS)
    await eventually(lambda: env.used("q", pods="1"))
    env.clock.now += dt.timedelta(seconds=30)
    await env.client.patch(QUOTAS, "q", {"spec": {"hard": {"pods": "7"}}}, NS)
    rq = await eventually(lambda: env.used("q", pods="0"))
    assert rq["status"]["hard"] == {"pods": "7"}


async def test_scopes_and_priority_class_selector(env: Env) -> None:
    await env.client.create(PCS, {"metadata": {"name": "high"}, "value": 1000})
    await env.client.create(QUOTAS, quota("best-effort", {"pods": "1"}, scopes=["BestEffort"]), NS)
    await env.client.create(QUOTAS, quota("high", {"pods": "1", "requests.cpu": "1"}, scopeSelector={
        "matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]}), NS)
    await env.client.create(QUOTAS, quota("terminating", {"pods": "3"}, scopes=["Terminating"]), NS)
    await eventually(lambda: env.used("best-effort", pods="0"))
    await eventually(lambda: env.used("high", pods="0"))
    await eventually(lambda: env.used("terminating", pods="0"))
    await env.client.create(PODS, pod("be", cpu=None, memory=None), NS)
    with pytest.raises(StatusError) as err:
        await env.client.create(PODS, pod("be2", cpu=None, memory=None), NS)
    assert "exceeded quota: best-effort, requested: pods=1, used: pods=1, limited: pods=1" in err.value.message
    # a burstable pod is outside the BestEffort scope; the high-priority one is inside "high"
    await env.client.create(PODS, pod("normal"), NS)
    await env.client.create(PODS, pod("vip", "300m", priorityClassName="high"), NS)
    with pytest.raises(StatusError) as err:
        await env.client.create(PODS, pod("vip2", "300m", priorityClassName="high"), NS)
    assert "exceeded quota: high" in err.value.message
    await env.client.create(PODS, pod("job", activeDeadlineSeconds=60), NS)
    ctrl = env.ctrl
    await settled(ctrl, env.client, (ctrl.quotas, QUOTAS), namespace=NS, delayed=True)
    # the controller's recount agrees with what admission charged
    await env.client.patch(QUOTAS, "high", {"spec": {"hard": {"pods": "2", "requests.cpu": "1"}}}, NS)
    high = await eventually(lambda: env.used("high", pods="1"))
    assert high["status"]["used"] == {"pods": "1", "requests.cpu": "300m"}
    assert (await env.used("best-effort", pods="1")) is not None
    assert (await env.used("terminating", pods="1")) is not None


async def test_services_claims_and_object_counts(env: Env) -> None:
    await env.client.create(QUOTAS, quota("objects", {
        "services": "3", "services.nodeports": "2", "services.loadbalancers": "1",
        "persistentvolumeclaims": "2", "requests.storage": "10Gi",
        "fast.storageclass.storage.k8s.io/requests.storage": "3Gi", "count/deployments.apps": "1"}), NS)
    await eventually(lambda: env.used("objects", services="0"))
    await env.client.create(SERVICES, {"metadata": {"name": "np"}, "spec": {
        "type": "NodePort", "ports": [{"port": 80, "name": "a"}, {"port": 81, "name": "b"}]}}, NS)
    with pytest.raises(StatusError) as err:
        await env.client.create(SERVICES, {"metadata": {"name": "lb"}, "spec": {
            "type": "LoadBalancer", "ports": [{"port": 80}]}}, NS)
    assert err.value.message == ('services "lb" is forbidden: exceeded quota: objects, requested: '
                                 "services.nodeports=1, used: services.nodeports=2, limited: services.nodeports=2")
    claim = {"metadata": {"name": "c1"}, "spec": {"storageClassName": "fast", "accessModes": ["ReadWriteOnce"],
                                                  "resources": {"requests": {"storage": "2Gi"}}}}
    await env.client.create(PVCS, claim, NS)
    claim2 = {**claim, "metadata": {"name": "c2"}}
    with pytest.raises(StatusError) as err:
        await env.client.create(PVCS, claim2, NS)
    assert "exceeded quota: objects, requested: fast.storageclass.storage.k8s.io/requests.storage=2Gi" \
        in err.value.message
    deploy = {"metadata": {"name": "d"}, "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
        "metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}}}}
    await env.client.create(DEPLOYMENTS, deploy, NS)
    with pytest.raises(StatusError) as err:
        await env.client.create(DEPLOYMENTS, {**deploy, "metadata": {"name": "d2"}}, NS)
    assert "exceeded quota: objects, requested: count/deployments.apps=1" in err.value.message
    rq = await env.client.get(QUOTAS, "objects", NS)
    assert rq["status"]["used"] == {
        "count/deployments.apps": "1", "fast.storageclass.storage.k8s.io/requests.storage": "2Gi",
        "persistentvolumeclaims": "1", "requests.storage": "2Gi", "services": "1",
        "services.loadbalancers": "0", "services.nodeports": "2"}
    # deleting a deployment is replenished through the informer started for count/deployments.apps
    await env.client.delete(DEPLOYMENTS, "d", NS)
    await eventually(lambda: env.used("objects", **{"count/deployments.apps": "0"}))


async def test_periodic_resync_recounts(env: Env) -> None:
    ctrl = env.ctrl
    timers: list[tuple[str, float]] = []
    ctrl.resync_period = 3600
    ctrl.queue_.add_after = lambda key, delay: timers.append((key, delay))  # type: ignore[method-assign]
    await env.client.create(PODS, pod("a"), NS)
    await env.client.create(QUOTAS, quota("q", {"pods": "3"}), NS)
    rq = await eventually(lambda: env.used("q", pods="1"))
    assert ("default/q", 3600) in timers
    # a status somebody else got wrong is only a status change: nothing recounts it ...
    rq["status"]["used"] = {"pods": "3"}
    await env.client.update(QUOTAS, rq, subresource="status")
    await settled(ctrl, env.client, (ctrl.quotas, QUOTAS), namespace=NS)
    assert (await env.used("q", pods="3")) is not None
    # ... until the resync period is over
    key, _delay = timers[-1]
    ctrl.queue_.add(key)
    await eventually(lambda: env.used("q", pods="1"))


async def test_status_write_reflects_spec_change_and_informer_settles(env: Env) -> None:
    await env.client.create(QUOTAS, quota("q", {"pods": "4"}), NS)
    await eventually(lambda: env.used("q", pods="0"))
    rq = await env.client.get(QUOTAS, "q", NS)
    ctrl = env.ctrl
    await settled(ctrl, env.client, (ctrl.quotas, QUOTAS), namespace=NS, delayed=True)
    # nothing changed: no new write
    assert (await env.client.get(QUOTAS, "q", NS))["metadata"]["resourceVersion"] == rq["metadata"]["resourceVersion"]


async def test_custom_resources_are_counted() -> None:
    from kubeplane.registry.crd import CRDController

    store = MemoryStore(history=4000)
    registry = Registry(store, CATALOGUE.copy())
    await ensure_default_namespaces(registry)
    crds = CRDController(registry)
    await crds.start()
    client = InProcessClient(registry)
    ctrl = ResourceQuotaController(client, resync_period=0)
    await ctrl.start(sync_timeout=1)
    try:
        await client.create(resource("customresourcedefinitions"), {
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced", "names": {"plural": "widgets", "kind": "Widget"},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                         "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}})
        widgets = await eventually(lambda: registry.catalogue.by_gvr("example.com", "v1", "widgets"))
        await client.create(widgets, {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1"}},
                            NS)
        await client.create(QUOTAS, quota("crs", {"count/widgets.example.com": "1"}), NS)
        await eventually(lambda: _used_is(client, "crs", "count/widgets.example.com", "1"))
        with pytest.raises(StatusError) as err:
            await client.create(widgets, {"apiVersion": "example.com/v1", "kind": "Widget",
                                          "metadata": {"name": "w2"}}, NS)
        assert err.value.message == ('widgets.example.com "w2" is forbidden: exceeded quota: crs, requested: '
                                     "count/widgets.example.com=1, used: count/widgets.example.com=1, "
                                     "limited: count/widgets.example.com=1")
    finally:
        await ctrl.stop(timeout=1)
        await crds.stop()
        await client.close()
        await registry.close()
        await store.close()


async def _used_is(client: InProcessClient, name: str, key: str, value: str) -> bool:
    rq = await client.get(QUOTAS, name, NS)
    return ((rq.get("status") or {}).get("used") or {}).get(key) == value


async def test_service_type_change_is_recounted(env: Env) -> None:
    await env.client.create(QUOTAS, quota("svc", {"services.loadbalancers": "2", "services.nodeports": "4"}), NS)
    await eventually(lambda: env.used("svc", **{"services.loadbalancers": "0"}))
    await env.client.create(SERVICES, {"metadata": {"name": "lb"}, "spec": {
        "type": "LoadBalancer", "ports": [{"port": 80}]}}, NS)
    assert (await env.used("svc", **{"services.loadbalancers": "1", "services.nodeports": "1"})) is not None
    lb = await env.client.get(SERVICES, "lb", NS)
    lb["spec"]["type"] = "ClusterIP"
    for key in ("nodePort",):
        for port in lb["spec"]["ports"]:
            port.pop(key, None)
    lb["spec"].pop("allocateLoadBalancerNodePorts", None)
    lb["spec"].pop("externalTrafficPolicy", None)
    await env.client.update(SERVICES, lb)
    await eventually(lambda: env.used("svc", **{"services.loadbalancers": "0", "services.nodeports": "0"}))


async def test_quota_without_limits_keeps_an_empty_status(env: Env) -> None:
    # kubectl create quota NAME (no --hard): nothing to count, nothing written, no busy loop
    created = await env.client.create(QUOTAS, quota("empty", {}), NS)
    await env.client.create(QUOTAS, quota("one", {"pods": "1"}), NS)
    await eventually(lambda: env.used("one", pods="0"))
    ctrl = env.ctrl
    await settled(ctrl, env.client, (ctrl.quotas, QUOTAS), namespace=NS)
    empty = await env.client.get(QUOTAS, "empty", NS)
    assert empty.get("status", {}) == {}
    assert empty["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
