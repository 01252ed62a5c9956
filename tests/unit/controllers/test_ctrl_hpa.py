"""The HorizontalPodAutoscaler controller against a real registry (MemoryStore +
InProcessClient + informers), with the usage served by the resource metrics
API from the report on a node's Lease, and an injected clock for the
stabilization windows and policy periods."""

from __future__ import annotations

import datetime as dt

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import format_time, utcnow
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.podautoscaler import HorizontalController
from kubeplane.api.usage import USAGE_ANNOTATION, usage_report
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore
from helpers import eventually

PODS = resource("pods")
DEPLOYMENTS = resource("deployments")
LEASES = resource("leases")
EVENTS = resource("events")
HPA = CATALOGUE.by_gvr("autoscaling", "v2", "horizontalpodautoscalers")
NS = "default"
NODE = "node-a"


class Clock:
    def __init__(self) -> None:
        self.now = utcnow()

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


class Env:
    def __init__(self, client: InProcessClient, ctrl: HorizontalController, clock: Clock) -> None:
        self.client = client
        self.ctrl = ctrl
        self.clock = clock
        #: pod name -> its cpu usage (what the node reports)
        self.usage: dict[str, str] = {}

    async def deployment(self, replicas: int) -> None:
        await self.client.create(DEPLOYMENTS, {
            "metadata": {"name": "web"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}},
                                  "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}}, NS)

    async def pod(self, name: str, cpu_usage: str, *, request: str = "100m", started_ago: float = 3600) -> None:
        """A running, ready pod of the Deployment on NODE, started ``started_ago`` seconds ago."""
        resources = {"requests": {"cpu": request}} if request else {}
        await self.client.create(PODS, {
            "metadata": {"name": name, "labels": {"app": "web"}},
            "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "nginx", "resources": resources}]}}, NS)
        since = format_time(self.clock() - dt.timedelta(seconds=started_ago))
        await self.client.patch(PODS, name, {"status": {"phase": "Running", "startTime": since, "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": since}]}}, NS, subresource="status")
        self.usage[name] = cpu_usage

    async def report(self) -> None:
        """What the node's heartbeat says its pods use now."""
        pods = []
        for p in (await self.client.list(PODS, NS))["items"]:
            name = p["metadata"]["name"]
            if name in self.usage:
                pods.append({"namespace": NS, "name": name, "uid": p["metadata"]["uid"],
                             "containers": [{"name": "c", "usage": {"cpu": self.usage[name], "memory": "10Mi"}}]})
        text = usage_report(utcnow(), 1.0, {"cpu": "1", "memory": "1Gi"}, pods)
        lease = {"metadata": {"name": NODE, "namespace": "kube-node-lease", "annotations": {USAGE_ANNOTATION: text}},
                 "spec": {"holderIdentity": NODE, "leaseDurationSeconds": 40,
                          "renewTime": utcnow().strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}
        try:
            current = await self.client.get(LEASES, NODE, "kube-node-lease")
        except StatusError:
            await self.client.create(LEASES, lease, "kube-node-lease")
            return
        lease["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        await self.client.update(LEASES, lease)

    async def hpa(self, *, target: int = 50, behavior: dict | None = None, min_replicas: int = 1,
                  max_replicas: int = 10, metrics: list | None = None) -> None:
        spec: dict = {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                      "minReplicas": min_replicas, "maxReplicas": max_replicas,
                      "metrics": metrics or [{"type": "Resource", "resource": {
                          "name": "cpu", "target": {"type": "Utilization", "averageUtilization": target}}}]}
        if behavior is not None:
            spec["behavior"] = behavior
        await self.client.create(HPA, {"metadata": {"name": "web"}, "spec": spec}, NS)

    async def sync(self) -> dict:
        """One reconcile, once the controller's caches hold what was written."""
        pods = (await self.client.list(PODS, NS))["items"]
        hpa = await self.client.get(HPA, "web", NS)

        def seen() -> bool:
            cached = self.ctrl.hpa_informer.indexer.get_by_key(f"{NS}/web")
            have = {p["metadata"]["name"]: p["metadata"]["resourceVersion"]
                    for p in self.ctrl.pod_informer.indexer.list()}
            return cached is not None and cached["metadata"]["resourceVersion"] == hpa["metadata"][
                "resourceVersion"] and all(have.get(p["metadata"]["name"]) == p["metadata"]["resourceVersion"]
                                           for p in pods)

        await eventually(seen, what="caches caught up")
        assert await self.ctrl.reconcile_key(f"{NS}/web") is False
        return await self.client.get(HPA, "web", NS)

    async def replicas(self) -> int:
        return (await self.client.get(DEPLOYMENTS, "web", NS))["spec"]["replicas"]

    async def set_replicas(self, n: int) -> None:
        """What the Deployment's pods become (the ReplicaSet controller's part)."""
        await self.client.patch(DEPLOYMENTS, "web", {"spec": {"replicas": n}}, NS)

    async def events(self, reason: str) -> list[dict]:
        await self.ctrl.recorder.flush(5)
        return [e for e in (await self.client.list(EVENTS, NS))["items"] if e["reason"] == reason]


def condition(hpa: dict, typ: str) -> dict:
    return next(c for c in hpa["status"]["conditions"] if c["type"] == typ)


@pytest.fixture
async def env():
    store = MemoryStore(history=2000)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    clock = Clock()
    ctrl = HorizontalController(client, clock=clock, sync_period=3600)
    await ctrl.start(sync_timeout=2)
    yield Env(client, ctrl, clock)
    await ctrl.stop(timeout=1)
    await client.close()
    await registry.close()
    await store.close()


async def test_scales_up_on_utilization_with_the_legacy_limit(env: Env) -> None:
    await env.deployment(2)
    await env.pod("web-1", "200m")
    await env.pod("web-2", "200m")
    await env.report()
    await env.hpa(target=50)
    hpa = await env.sync()
    # 200% of request against 50%: 8 wanted; without a behavior at most max(2*2, 4) per sync
    assert await env.replicas() == 4
    status = hpa["status"]
    assert status["currentReplicas"] == 2 and status["desiredReplicas"] == 4
    assert status["currentMetrics"] == [{"type": "Resource", "resource": {
        "name": "cpu", "current": {"averageUtilization": 200, "averageValue": "200m"}}}]
    assert status["lastScaleTime"] == format_time(env.clock())
    assert condition(hpa, "AbleToScale")["reason"] == "SucceededRescale"
    assert condition(hpa, "AbleToScale")["message"] == "the HPA controller was able to update the target scale to 4"
    assert condition(hpa, "ScalingActive")["reason"] == "ValidMetricFound"
    assert condition(hpa, "ScalingActive")["message"] == (
        "the HPA was able to successfully calculate a replica count from cpu resource utilization "
        "(percentage of request)")
    limited = condition(hpa, "ScalingLimited")
    assert (limited["status"], limited["reason"]) == ("True", "ScaleUpLimit")
    assert limited["message"] == "the desired replica count is increasing faster than the maximum scale rate"
    [event] = await env.events("SuccessfulRescale")
    assert event["message"] == "New size: 4; reason: cpu resource utilization (percentage of request) above target"


async def test_within_tolerance_nothing_changes_until_the_behavior_narrows_it(env: Env) -> None:
    await env.deployment(2)
    await env.pod("web-1", "105m")
    await env.pod("web-2", "105m")
    await env.report()
    await env.hpa(target=100)
    hpa = await env.sync()
    assert await env.replicas() == 2
    assert hpa["status"]["desiredReplicas"] == 2 and "lastScaleTime" not in hpa["status"]
    assert condition(hpa, "AbleToScale")["reason"] == "ReadyForNewScale"
    assert condition(hpa, "ScalingLimited")["reason"] == "DesiredWithinRange"
    # a scale-up tolerance of 1% makes 105% worth a pod more
    await env.client.patch(HPA, "web", {"spec": {"behavior": {"scaleUp": {"tolerance": "0.01"}}}}, NS)
    hpa = await env.sync()
    assert await env.replicas() == 3
    assert hpa["spec"]["behavior"]["scaleUp"]["policies"][0] == {"type": "Pods", "value": 4, "periodSeconds": 15}


async def test_scale_down_waits_for_the_stabilization_window_and_the_policy_rate(env: Env) -> None:
    behavior = {"scaleDown": {"stabilizationWindowSeconds": 60,
                              "policies": [{"type": "Pods", "value": 1, "periodSeconds": 30}]}}
    await env.deployment(4)
    for i in range(4):
        await env.pod(f"web-{i}", "100m")
    await env.report()
    await env.hpa(target=100, behavior=behavior)
    hpa = await env.sync()
    assert await env.replicas() == 4
    # usage drops to a quarter: one pod would do, but the last minute recommended 4
    for name in env.usage:
        env.usage[name] = "25m"
    await env.report()
    env.clock.advance(30)
    hpa = await env.sync()
    assert await env.replicas() == 4
    assert condition(hpa, "AbleToScale")["reason"] == "ScaleDownStabilized"
    # the window has passed: down, by one pod per 30 s
    env.clock.advance(31)
    hpa = await env.sync()
    assert await env.replicas() == 3
    limited = condition(hpa, "ScalingLimited")
    assert (limited["status"], limited["reason"]) == ("True", "ScaleDownLimit")
    env.clock.advance(10)
    await env.sync()
    assert await env.replicas() == 3  # one pod went in the last 30 s already
    [event] = await env.events("SuccessfulRescale")
    assert event["message"] == "New size: 3; reason: All metrics below target"


async def test_scale_up_policy_select_min_and_disabled(env: Env) -> None:
    await env.deployment(2)
    await env.pod("web-1", "500m")
    await env.pod("web-2", "500m")
    await env.report()
    behavior = {"scaleUp": {"selectPolicy": "Min", "policies": [
        {"type": "Pods", "value": 1, "periodSeconds": 60}, {"type": "Percent", "value": 100, "periodSeconds": 60}]}}
    await env.hpa(target=100, behavior=behavior)
    await env.sync()
    assert await env.replicas() == 3  # the smaller of +1 pod and +100%
    env.clock.advance(20)
    await env.sync()
    assert await env.replicas() == 3  # +1 in this minute already
    await env.client.patch(HPA, "web", {"spec": {"behavior": {"scaleUp": {"selectPolicy": "Disabled"}}}}, NS)
    env.clock.advance(120)
    hpa = await env.sync()
    assert await env.replicas() == 3
    assert condition(hpa, "ScalingLimited")["reason"] == "ScaleUpLimit"


async def test_average_value_target_on_memory(env: Env) -> None:
    await env.deployment(1)
    await env.pod("web-1", "10m")
    await env.report()  # memory: 10Mi per pod
    await env.hpa(metrics=[{"type": "Resource", "resource": {
        "name": "memory", "target": {"type": "AverageValue", "averageValue": "5Mi"}}}])
    hpa = await env.sync()
    assert await env.replicas() == 2
    assert hpa["status"]["currentMetrics"][0]["resource"]["current"] == {"averageValue": "10Mi"}


async def test_without_metrics_scaling_is_inactive_with_upstreams_reason(env: Env) -> None:
    await env.deployment(2)
    await env.pod("web-1", "100m")
    await env.hpa(target=50)  # no node reported any usage
    hpa = await env.sync()
    assert await env.replicas() == 2
    active = condition(hpa, "ScalingActive")
    assert (active["status"], active["reason"]) == ("False", "FailedGetResourceMetric")
    assert active["message"] == (
        "the HPA was unable to compute the replica count: failed to get cpu utilization: unable to get metrics "
        "for resource cpu: no metrics returned from resource metrics API")
    assert condition(hpa, "AbleToScale")["reason"] == "SucceededGetScale"
    assert hpa["status"]["currentMetrics"] == [{"type": ""}]  # as upstream writes a failed metric's status
    [computed] = await env.events("FailedComputeMetricsReplicas")
    assert computed["message"] == (
        "invalid metrics (1 invalid out of 1), first error is: failed to get cpu resource metric value: failed to "
        "get cpu utilization: unable to get metrics for resource cpu: no metrics returned from resource metrics API")


async def test_missing_request_and_missing_target(env: Env) -> None:
    await env.deployment(1)
    await env.pod("web-1", "100m", request="")
    await env.report()
    await env.hpa(target=50)
    hpa = await env.sync()
    assert "missing request for cpu in container c of Pod web-1" in condition(hpa, "ScalingActive")["message"]
    await env.client.delete(DEPLOYMENTS, "web", NS)
    await eventually(lambda: _gone(env))
    hpa = await env.sync()
    able = condition(hpa, "AbleToScale")
    assert (able["status"], able["reason"]) == ("False", "FailedGetScale")
    assert able["message"] == ('the HPA controller was unable to get the target\'s current scale: '
                               'deployments.apps "web" not found')


async def test_a_target_without_scale(env: Env) -> None:
    # Jobs have no scale subresource
    await env.client.create(HPA, {"metadata": {"name": "web"}, "spec": {
        "scaleTargetRef": {"apiVersion": "batch/v1", "kind": "Job", "name": "web"}, "maxReplicas": 3}}, NS)
    hpa = await env.sync()
    assert condition(hpa, "AbleToScale")["message"] == (
        "the HPA controller was unable to get the target's current scale: the server could not find the "
        "requested resource")
    await env.client.patch(HPA, "web", {"spec": {"scaleTargetRef": {"apiVersion": "example.com/v1",
                                                                     "kind": "Widget"}}}, NS)
    hpa = await env.sync()
    assert condition(hpa, "AbleToScale")["message"] == (
        'the HPA controller was unable to get the target\'s current scale: no matches for kind "Widget" in group '
        '"example.com"')
    [event, *_] = await env.events("FailedGetScale")
    assert event["type"] == "Warning"


async def _gone(env: Env) -> bool:
    try:
        await env.client.get(DEPLOYMENTS, "web", NS)
    except StatusError as err:
        return err.code == 404
    return False


async def test_replicas_outside_the_bounds_are_brought_back_without_metrics(env: Env) -> None:
    await env.deployment(12)
    await env.hpa(target=50, max_replicas=5)
    hpa = await env.sync()
    assert await env.replicas() == 5
    [event] = await env.events("SuccessfulRescale")
    assert event["message"] == "New size: 5; reason: Current number of replicas above Spec.MaxReplicas"
    await env.set_replicas(0)
    hpa = await env.sync()
    assert await env.replicas() == 0
    active = condition(hpa, "ScalingActive")
    assert (active["status"], active["reason"]) == ("False", "ScalingDisabled")


async def test_new_pods_without_metrics_damp_a_scale_up(env: Env) -> None:
    await env.deployment(2)
    await env.pod("web-1", "300m")
    await env.client.create(PODS, {"metadata": {"name": "web-2", "labels": {"app": "web"}},
                                   "spec": {"nodeName": NODE, "containers": [
                                       {"name": "c", "image": "nginx", "resources": {"requests": {"cpu": "100m"}}}]}},
                            NS)  # still Pending: unready
    await env.report()
    await env.hpa(target=100, behavior={})
    await env.sync()
    # 300% on the ready pod; the pending one counts as 0%: (300 + 0) / 2 = 150% of 2 pods -> 3
    assert await env.replicas() == 3


async def test_ambiguous_selector(env: Env) -> None:
    await env.deployment(1)
    await env.pod("web-1", "100m")
    await env.report()
    await env.hpa(target=50)
    await env.client.create(HPA, {"metadata": {"name": "other"}, "spec": {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}, "maxReplicas": 3}}, NS)
    await eventually(lambda: env.ctrl.hpa_informer.indexer.get_by_key(f"{NS}/other"))
    assert await env.ctrl.reconcile_key(f"{NS}/other") is False
    hpa = await env.sync()
    active = condition(hpa, "ScalingActive")
    assert active["reason"] == "AmbiguousSelector"
    assert active["message"] == ("pods by selector app=web are controlled by multiple HPAs: "
                                 "[default/other default/web]")
