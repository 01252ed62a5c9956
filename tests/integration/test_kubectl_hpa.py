"""Real kubectl against ``kubeplane up``: ``kubectl top`` from the usage the
simulated nodes report, ``kubectl autoscale``, and an HPA that scales a
Deployment up and back down as the simulated usage changes.

The cluster is this module's own: a one-second HPA sync period and no
downscale stabilization, so the scaling happens in seconds."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import Kubectl, start_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import eventually_sync  # noqa: E402

NS = "hpa-e2e"


@pytest.fixture(scope="module")
def kubectl(tmp_path_factory) -> Kubectl:
    tmp = tmp_path_factory.mktemp("up-hpa")
    srv = start_server(tmp, command="up", extra=[
        "--nodes", "2", "--horizontal-pod-autoscaler-sync-period=1s",
        "--horizontal-pod-autoscaler-downscale-stabilization=0s"])
    k = Kubectl(srv.kubeconfig, tmp / "home")
    k("create", "namespace", NS)
    k("-n", NS, "create", "deployment", "web", "--image=nginx", "--replicas=1")
    k("-n", NS, "set", "resources", "deployment", "web", "--requests=cpu=100m,memory=64Mi")
    k("-n", NS, "rollout", "status", "deployment/web", "--timeout=60s")
    yield k
    srv.stop()


def pods(kubectl: Kubectl) -> list[dict]:
    items = json.loads(kubectl("-n", NS, "get", "pods", "-l", "app=web", "-o", "json").out)["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def replicas(kubectl: Kubectl) -> int:
    return json.loads(kubectl("-n", NS, "get", "deployment", "web", "-o", "json").out)["spec"]["replicas"]


def test_top_pods_and_nodes(kubectl: Kubectl) -> None:
    [pod] = pods(kubectl)
    name = pod["metadata"]["name"]

    def top_pods() -> list[list[str]]:
        res = kubectl("-n", NS, "top", "pods", check=False)
        return [line.split() for line in res.out.splitlines()] if res.rc == 0 else []

    lines = eventually_sync(top_pods, timeout=30)
    assert lines[0] == ["NAME", "CPU(cores)", "MEMORY(bytes)"]
    assert lines[1] == [name, "100m", "64Mi"]  # the pod uses what it requests
    node = pod["spec"]["nodeName"]
    top = kubectl("top", "nodes").out.splitlines()
    assert top[0].split() == ["NAME", "CPU(cores)", "CPU(%)", "MEMORY(bytes)", "MEMORY(%)"]
    row = next(line.split() for line in top[1:] if line.split()[0] == node)
    assert row[1] == "100m" and row[2] == "2%"  # of the node's 4 cpus
    missing = kubectl("-n", NS, "top", "pod", "nope", check=False)
    assert missing.rc == 1
    assert 'podmetrics.metrics.k8s.io "hpa-e2e/nope" not found' in missing.err
    got = kubectl("get", "nodes.metrics.k8s.io").out.splitlines()
    assert got[0].split() == ["NAME", "CPU", "MEMORY", "WINDOW"]


def test_autoscale_scales_up_and_back_down_with_usage(kubectl: Kubectl) -> None:
    out = kubectl("-n", NS, "autoscale", "deployment", "web", "--cpu-percent=100", "--min=1", "--max=4").out
    assert out.strip() == "horizontalpodautoscaler.autoscaling/web autoscaled"
    # using what they request (100%): steady at one replica
    eventually_sync(lambda: "cpu: 100%/100%" in kubectl("-n", NS, "get", "hpa", "web").out, timeout=30)
    assert replicas(kubectl) == 1
    # load: 350% of the request
    kubectl("-n", NS, "annotate", "pods", "-l", "app=web", "kubeplane.io/usage=cpu=350m", "--overwrite")
    eventually_sync(lambda: replicas(kubectl) == 4, timeout=30, what="scaled up to 4")
    table = kubectl("-n", NS, "get", "hpa", "web").out.splitlines()
    assert table[0].split() == ["NAME", "REFERENCE", "TARGETS", "MINPODS", "MAXPODS", "REPLICAS", "AGE"]
    described = kubectl("-n", NS, "describe", "hpa", "web").out
    assert "SuccessfulRescale" in described
    assert "New size: 4; reason: cpu resource utilization (percentage of request) above target" in described
    kubectl("-n", NS, "rollout", "status", "deployment/web", "--timeout=60s")
    # idle: a tenth of the request on every pod, the new ones too
    kubectl("-n", NS, "annotate", "pods", "-l", "app=web", "kubeplane.io/usage=cpu=10m", "--overwrite")
    eventually_sync(lambda: replicas(kubectl) == 1, timeout=30, what="scaled back down to 1")

    def settled_at_one() -> dict | None:
        hpa = json.loads(kubectl("-n", NS, "get", "hpa", "web", "-o", "json").out)
        status = hpa["status"]
        return hpa if status.get("currentReplicas") == 1 and status["desiredReplicas"] == 1 else None

    hpa = eventually_sync(settled_at_one, timeout=30)
    conditions = {c["type"]: c for c in hpa["status"]["conditions"]}
    assert conditions["ScalingActive"]["reason"] == "ValidMetricFound"
    assert conditions["ScalingLimited"]["reason"] == "DesiredWithinRange"
    assert hpa["status"]["currentMetrics"][0]["resource"]["current"] == {"averageUtilization": 10,
                                                                        "averageValue": "10m"}
    described = kubectl("-n", NS, "describe", "hpa", "web").out
    assert "New size: 1; reason: All metrics below target" in described
    # the same object through autoscaling/v1
    v1 = json.loads(kubectl("get", "--raw", f"/apis/autoscaling/v1/namespaces/{NS}/horizontalpodautoscalers/web").out)
    assert v1["spec"]["targetCPUUtilizationPercentage"] == 100
    assert v1["status"]["currentCPUUtilizationPercentage"] == 10
    kubectl("-n", NS, "delete", "hpa", "web")


def test_v1_manifest_and_invalid_input(kubectl: Kubectl) -> None:
    manifest = {"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
                "metadata": {"name": "legacy", "namespace": NS},
                "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                         "minReplicas": 1, "maxReplicas": 3, "targetCPUUtilizationPercentage": 70}}
    kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
    v2 = json.loads(kubectl("-n", NS, "get", "hpa", "legacy", "-o", "json").out)
    assert v2["apiVersion"] == "autoscaling/v2"
    assert v2["spec"]["metrics"] == [{"type": "Resource", "resource": {
        "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}}]
    manifest["spec"]["maxReplicas"] = 5
    kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
    assert json.loads(kubectl("-n", NS, "get", "hpa", "legacy", "-o", "json").out)["spec"]["maxReplicas"] == 5
    kubectl("-n", NS, "delete", "hpa", "legacy")
    bad = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "bad"},
           "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                    "minReplicas": 3, "maxReplicas": 2}}
    res = kubectl("-n", NS, "create", "-f", "-", stdin=json.dumps(bad), check=False)
    assert res.rc == 1
    assert ('The HorizontalPodAutoscaler "bad" is invalid: spec.maxReplicas: Invalid value: 2: must be greater '
            'than or equal to `minReplicas`') in res.err
