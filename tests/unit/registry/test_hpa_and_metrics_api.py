"""autoscaling HorizontalPodAutoscalers (v2 defaults and validation, v1 served
by conversion, the Table) and the resource metrics API served from the usage
simulated nodes report on their Leases."""

from __future__ import annotations

import datetime as dt
from typing import AsyncIterator

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import utcnow
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver import tables
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.apiserver.server import build_app
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.nodeagent import NodeAgent, NodeSpec
from kubeplane.controllers.nodeusage import parse_usage, pod_usage
from kubeplane.registry.hpa_conversion import to_v1, to_v2
from kubeplane.api.usage import USAGE_ANNOTATION
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore
from helpers import eventually

HPA = CATALOGUE.by_gvr("autoscaling", "v2", "horizontalpodautoscalers")
HPA_V1 = CATALOGUE.by_gvr("autoscaling", "v1", "horizontalpodautoscalers")
NODE_METRICS = CATALOGUE.by_gvr("metrics.k8s.io", "v1beta1", "nodes")
POD_METRICS = CATALOGUE.by_gvr("metrics.k8s.io", "v1beta1", "pods")
PODS = resource("pods")
LEASES = resource("leases")
NS = "default"
REF = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}


@pytest.fixture
async def client() -> AsyncIterator[InProcessClient]:
    store = MemoryStore()
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    c = InProcessClient(registry)
    yield c
    await c.close()
    await registry.close()
    await store.close()


async def test_v2_defaults(client: InProcessClient) -> None:
    hpa = await client.create(HPA, {"metadata": {"name": "web"}, "spec": {
        "scaleTargetRef": REF, "maxReplicas": 3, "behavior": {"scaleDown": {"stabilizationWindowSeconds": 10}}}}, NS)
    spec = hpa["spec"]
    assert spec["minReplicas"] == 1
    assert spec["metrics"] == [{"type": "Resource", "resource": {
        "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]
    assert spec["behavior"]["scaleDown"] == {
        "stabilizationWindowSeconds": 10, "selectPolicy": "Max",
        "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]}
    assert spec["behavior"]["scaleUp"] == {
        "stabilizationWindowSeconds": 0, "selectPolicy": "Max",
        "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15},
                     {"type": "Percent", "value": 100, "periodSeconds": 15}]}
    assert hpa["status"] == {"desiredReplicas": 0}


@pytest.mark.parametrize("spec, message", [
    ({"scaleTargetRef": REF}, "spec.maxReplicas: Required value: must be set and greater than 0"),
    ({"scaleTargetRef": REF, "maxReplicas": 2, "minReplicas": 3},
     "spec.maxReplicas: Invalid value: 2: must be greater than or equal to `minReplicas`"),
    ({"scaleTargetRef": REF, "maxReplicas": 2, "minReplicas": 0},
     "spec.minReplicas: Invalid value: 0: must be greater than or equal to 1"),
    ({"scaleTargetRef": {"kind": "Deployment", "name": "web", "apiVersion": "v1"}, "maxReplicas": 2},
     'spec.scaleTargetRef.apiVersion: Invalid value: "v1": apiVersion must specify API group'),
    ({"scaleTargetRef": REF, "maxReplicas": 2, "metrics": [{"type": "Resource", "resource": {
        "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 0}}}]},
     "spec.metrics[0].resource.target.averageUtilization: Invalid value: 0: must be greater than 0"),
    ({"scaleTargetRef": REF, "maxReplicas": 2, "metrics": [{"type": "Resource", "resource": {
        "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50, "averageValue": "1"}}}]},
     "spec.metrics[0].resource.target.averageValue: Forbidden: may not set both a target raw value and a target "
     "utilization"),
    ({"scaleTargetRef": REF, "maxReplicas": 2, "metrics": [{"type": "Bogus"}]},
     'spec.metrics[0].type: Unsupported value: "Bogus": supported values: "ContainerResource", "External", '
     '"Object", "Pods", "Resource"'),
    ({"scaleTargetRef": REF, "maxReplicas": 2, "behavior": {"scaleUp": {"selectPolicy": "Most", "policies": [
        {"type": "Pods", "value": 0, "periodSeconds": 1801}]}}},
     'spec.behavior.scaleUp.selectPolicy: Unsupported value: "Most": supported values: "Disabled", "Max", "Min"'),
    ({"scaleTargetRef": REF, "maxReplicas": 2, "behavior": {"scaleDown": {"policies": [
        {"type": "Pods", "value": 0, "periodSeconds": 1801}]}}},
     "spec.behavior.scaleDown.policies[0].value: Invalid value: 0: must be greater than zero"),
    ({"scaleTargetRef": REF, "maxReplicas": 2, "behavior": {"scaleDown": {"stabilizationWindowSeconds": 3601}}},
     "spec.behavior.scaleDown.stabilizationWindowSeconds: Invalid value: 3601: must be less than or equal to 3600"),
])
async def test_v2_validation(client: InProcessClient, spec: dict, message: str) -> None:
    with pytest.raises(StatusError) as err:
        await client.create(HPA, {"metadata": {"name": "web"}, "spec": spec}, NS)
    assert err.value.code == 422
    assert message in err.value.message
    assert err.value.message.startswith('HorizontalPodAutoscaler.autoscaling "web" is invalid: ')


async def test_v1_is_the_v2_object_converted(client: InProcessClient) -> None:
    created = await client.create(HPA_V1, {"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
                                           "metadata": {"name": "web"},
                                           "spec": {"scaleTargetRef": REF, "maxReplicas": 4,
                                                    "targetCPUUtilizationPercentage": 60}}, NS)
    assert created["apiVersion"] == "autoscaling/v1"
    assert created["spec"] == {"scaleTargetRef": REF, "minReplicas": 1, "maxReplicas": 4,
                               "targetCPUUtilizationPercentage": 60}
    assert created["status"] == {"currentReplicas": 0, "desiredReplicas": 0}
    v2 = await client.get(HPA, "web", NS)
    assert v2["spec"]["metrics"] == [{"type": "Resource", "resource": {
        "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 60}}}]
    # what v1 cannot say survives in annotations, and comes back in v2
    await client.patch(HPA, "web", {"spec": {"metrics": v2["spec"]["metrics"] + [{"type": "Resource", "resource": {
        "name": "memory", "target": {"type": "AverageValue", "averageValue": "64Mi"}}}]}}, NS)
    v1 = await client.get(HPA_V1, "web", NS)
    assert v1["metadata"]["annotations"]["autoscaling.alpha.kubernetes.io/metrics"] == (
        '[{"type":"Resource","resource":{"name":"memory","targetAverageValue":"64Mi"}}]')
    patched = await client.patch(HPA_V1, "web", {"spec": {"maxReplicas": 6}}, NS)
    assert patched["spec"]["maxReplicas"] == 6
    v2 = await client.get(HPA, "web", NS)
    assert [m["resource"]["name"] for m in v2["spec"]["metrics"]] == ["memory", "cpu"]
    assert "annotations" not in v2["metadata"]
    listed = await client.list(HPA_V1, NS)
    assert listed["kind"] == "HorizontalPodAutoscalerList" and listed["items"][0]["apiVersion"] == "autoscaling/v1"
    with pytest.raises(StatusError) as err:
        await client.patch(HPA_V1, "web", {"spec": {"maxReplicas": 0}}, NS)
    assert err.value.code == 422 and "spec.maxReplicas: Required value" in err.value.message


async def test_v1_watch_and_delete(client: InProcessClient) -> None:
    await client.create(HPA, {"metadata": {"name": "w"}, "spec": {"scaleTargetRef": REF, "maxReplicas": 2}}, NS)
    listed = await client.list(HPA_V1, NS)
    stream = client.watch(HPA_V1, NS, resource_version=listed["metadata"]["resourceVersion"])
    try:
        await client.patch(HPA, "w", {"spec": {"maxReplicas": 3}}, NS)
        event = await stream.__anext__()
        assert event.type == "MODIFIED"
        assert event.object["apiVersion"] == "autoscaling/v1" and event.object["spec"]["maxReplicas"] == 3
        assert event.object["spec"]["targetCPUUtilizationPercentage"] == 80
        deleted = await client.delete(HPA_V1, "w", NS)
        assert deleted["kind"] == "Status" and deleted["status"] == "Success"
        event = await stream.__anext__()
        assert event.type == "DELETED" and event.object["apiVersion"] == "autoscaling/v1"
    finally:
        await stream.close()


def test_conversion_round_trips_status() -> None:
    v2 = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "a"},
          "spec": {"scaleTargetRef": REF, "minReplicas": 2, "maxReplicas": 5,
                   "behavior": {"scaleUp": {"selectPolicy": "Min"}},
                   "metrics": [{"type": "Resource", "resource": {
                       "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}},
                       {"type": "Pods", "pods": {"metric": {"name": "qps"},
                                                 "target": {"type": "AverageValue", "averageValue": "10"}}}]},
          "status": {"currentReplicas": 2, "desiredReplicas": 3,
                     "currentMetrics": [{"type": "Resource", "resource": {
                         "name": "cpu", "current": {"averageUtilization": 70, "averageValue": "70m"}}}],
                     "conditions": [{"type": "AbleToScale", "status": "True", "reason": "SucceededRescale"}]}}
    v1 = to_v1(v2)
    assert v1["status"]["currentCPUUtilizationPercentage"] == 70
    assert v1["spec"]["targetCPUUtilizationPercentage"] == 50
    back = to_v2(v1)
    assert back["spec"]["behavior"] == v2["spec"]["behavior"]
    assert back["status"]["conditions"] == v2["status"]["conditions"]
    assert back["status"]["currentMetrics"] == v2["status"]["currentMetrics"]
    assert sorted(m["type"] for m in back["spec"]["metrics"]) == ["Pods", "Resource"]
    assert "annotations" not in back["metadata"]


def test_table_targets_column() -> None:
    hpa = {"metadata": {"name": "web", "creationTimestamp": "2026-01-01T00:00:00Z"},
           "spec": {"scaleTargetRef": REF, "minReplicas": 1, "maxReplicas": 5, "metrics": [
               {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization",
                                                                          "averageUtilization": 50}}},
               {"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue",
                                                                             "averageValue": "64Mi"}}},
               {"type": "Pods", "pods": {"metric": {"name": "qps"}, "target": {"type": "AverageValue",
                                                                            "averageValue": "1k"}}}]},
           "status": {"currentReplicas": 2, "currentMetrics": [
               {"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 70}}}]}}
    printer = tables.printer_for(HPA)
    assert [c.name for c in printer.columns] == ["Name", "Reference", "Targets", "MinPods", "MaxPods", "Replicas",
                                                 "Age"]
    cells = printer.row(hpa, dt.datetime(2026, 1, 1, 0, 5, tzinfo=dt.timezone.utc))
    assert cells == ["web", "Deployment/web", "cpu: 70%/50%, memory: <unknown>/64Mi + 1 more...", "1", 5, 2, "5m"]
    # a v1 object prints as the v2 one it stands for
    hpa["spec"]["metrics"] = hpa["spec"]["metrics"][:1]
    assert printer.row(to_v1({"apiVersion": "autoscaling/v2", **hpa}),
                       dt.datetime(2026, 1, 1, 0, 5, tzinfo=dt.timezone.utc)) == [
        "web", "Deployment/web", "cpu: 70%/50%", "1", 5, 2, "5m"]


def test_usage_model() -> None:
    pod = {"metadata": {"name": "p", "annotations": {}}, "spec": {"containers": [
        {"name": "a", "resources": {"requests": {"cpu": "300m", "memory": "1Gi"}}},
        {"name": "b", "resources": {"requests": {"cpu": "100m"}}}]}}
    assert pod_usage(pod) == [("a", {"cpu": "300m", "memory": "1Gi"}), ("b", {"cpu": "100m", "memory": "0"})]
    pod["metadata"]["annotations"]["kubeplane.io/usage"] = "cpu=1,memory=100Mi"
    assert pod_usage(pod) == [("a", {"cpu": "750m", "memory": "100Mi"}), ("b", {"cpu": "250m", "memory": "0"})]
    pod["metadata"]["annotations"]["kubeplane.io/usage"] = "cpu=lots"
    assert pod_usage(pod)[0][1]["cpu"] == "300m"  # a malformed override is ignored
    with pytest.raises(ValueError, match="unknown resource 'gpu'"):
        parse_usage("gpu=1")
    with pytest.raises(ValueError, match="is not <resource>=<quantity>"):
        parse_usage("cpu")
    with pytest.raises(ValueError, match="must not be negative"):
        parse_usage("cpu=-1")


async def test_simulated_nodes_report_usage_served_as_metrics(client: InProcessClient) -> None:
    agent = NodeAgent(client, ["n0"], NodeSpec(), heartbeat_interval=3600)
    await agent.start(sync_timeout=2)
    try:
        for name, annotations in (("a", {}), ("b", {"kubeplane.io/usage": "cpu=40m,memory=20Mi"})):
            await client.create(PODS, {"metadata": {"name": name, "labels": {"app": name}, "annotations": annotations},
                                       "spec": {"nodeName": "n0", "containers": [{"name": "c", "image": "x", "resources": {
                                           "requests": {"cpu": "100m", "memory": "64Mi"}}}]}}, NS)

        async def both() -> dict:
            out = await client.list(POD_METRICS, NS)
            return out if len(out["items"]) == 2 else {}

        listed = await eventually(both)
        by_name = {m["metadata"]["name"]: m for m in listed["items"]}
        assert by_name["a"]["containers"] == [{"name": "c", "usage": {"cpu": "100m", "memory": "64Mi"}}]
        assert by_name["b"]["containers"] == [{"name": "c", "usage": {"cpu": "40m", "memory": "20Mi"}}]
        assert by_name["b"]["metadata"]["labels"] == {"app": "b"} and by_name["b"]["window"] == "1s"
        assert [m["metadata"]["name"] for m in (await client.list(POD_METRICS, NS, label_selector="app=b"))[
            "items"]] == ["b"]
        node = await client.get(NODE_METRICS, "n0")
        assert node["usage"] == {"cpu": "140m", "memory": "84Mi"}
        assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "n0"
        # a changed annotation is reported without waiting for the heartbeat
        await client.patch(PODS, "b", {"metadata": {"annotations": {"kubeplane.io/usage": "cpu=2"}}}, NS)

        async def changed() -> bool:
            m = await client.get(POD_METRICS, "b", NS)
            return m["containers"][0]["usage"]["cpu"] == "2"

        await eventually(changed)
        with pytest.raises(StatusError) as err:
            await client.get(POD_METRICS, "nope", NS)
        assert (err.value.code, err.value.message) == (404, 'podmetrics.metrics.k8s.io "default/nope" not found')
        with pytest.raises(StatusError) as err:
            await client.get(NODE_METRICS, "n9")
        assert err.value.message == 'nodemetrics.metrics.k8s.io "n9" not found'
        with pytest.raises(StatusError) as err:
            await client.list(POD_METRICS, NS, field_selector="spec.nodeName=n0")
        assert (err.value.code, err.value.message) == (400, "field label not supported: spec.nodeName")
    finally:
        await agent.stop()
    # once the node's Lease expires, so do its metrics
    lease = await client.get(LEASES, "n0", "kube-node-lease")
    assert USAGE_ANNOTATION in lease["metadata"]["annotations"]
    stale = (utcnow() - dt.timedelta(seconds=41)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    await client.patch(LEASES, "n0", {"spec": {"renewTime": stale}}, "kube-node-lease")
    assert (await client.list(NODE_METRICS))["items"] == []
    assert (await client.list(POD_METRICS, NS))["items"] == []


async def test_metrics_are_read_only_over_http() -> None:
    store = MemoryStore()
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    server = TestServer(build_app(registry, CATALOGUE), host="127.0.0.1")
    await server.start_server()
    base = str(server.make_url("")).rstrip("/") + "/apis/metrics.k8s.io/v1beta1"
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(base + "/nodes") as resp:
                assert resp.status == 200
                assert (await resp.json())["kind"] == "NodeMetricsList"
            async with session.get(base + "/nodes?watch=true") as resp:
                assert resp.status == 405
            async with session.post(base + "/namespaces/default/pods", json={"metadata": {"name": "x"}}) as resp:
                assert resp.status == 405
                assert (await resp.json())["message"] == (
                    "the server does not allow this method on the requested resource")
            async with session.get(base + "/nodes", headers={
                    "Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}) as resp:
                table = await resp.json()
                assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "CPU", "Memory", "Window"]
    finally:
        await server.close()
        await registry.close()
        await store.close()
