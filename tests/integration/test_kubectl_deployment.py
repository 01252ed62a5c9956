"""Deployments with the real kubectl against the shared `kubeplane up` cluster:
`kubectl rollout pause/resume/restart/undo/status`, scaling, and a rollout
that exceeds its progress deadline."""

from __future__ import annotations

import json

import pytest

from conftest import Kubectl
from helpers import eventually_sync

NS = "deploy-e2e"

STUCK = f"""
apiVersion: apps/v1
kind: Deployment
metadata:
  name: stuck
  namespace: {NS}
spec:
  replicas: 1
  progressDeadlineSeconds: 1
  selector:
    matchLabels: {{app: stuck}}
  template:
    metadata:
      labels: {{app: stuck}}
    spec:
      nodeSelector: {{kubeplane.io/no-such-node: "true"}}
      containers:
      - name: c
        image: nginx:1
"""


@pytest.fixture(scope="module")
def kubectl(cluster_kubectl: Kubectl):
    cluster_kubectl("create", "namespace", NS)
    yield cluster_kubectl
    cluster_kubectl("delete", "namespace", NS, "--wait=false", check=False)


def _json(kubectl: Kubectl, *args: str) -> dict:
    return json.loads(kubectl(*args, "-n", NS, "-o", "json").out)


def _replicasets(kubectl: Kubectl) -> dict[str, dict]:
    """The web ReplicaSets by revision."""
    items = _json(kubectl, "get", "rs", "-l", "app=web")["items"]
    return {rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"]: rs for rs in items}


def _progressing(d: dict) -> dict:
    return next(c for c in d["status"]["conditions"] if c["type"] == "Progressing")


def test_pause_resume_restart_undo_and_scale(kubectl: Kubectl) -> None:
    kubectl("create", "deployment", "web", "--image=nginx:1", "--replicas=3", "-n", NS)
    kubectl("rollout", "status", "deployment/web", "-n", NS, "--timeout=60s")

    # paused: a template change is recorded but not rolled out
    kubectl("rollout", "pause", "deployment/web", "-n", NS)
    kubectl("set", "image", "deployment/web", "nginx=nginx:2", "-n", NS)

    def paused() -> dict | None:
        d = _json(kubectl, "get", "deployment", "web")
        observed = d["status"].get("observedGeneration") == d["metadata"]["generation"]
        return d if observed and _progressing(d)["reason"] == "DeploymentPaused" else None

    d = eventually_sync(paused, timeout=30, what="the pause observed")
    assert _progressing(d)["status"] == "Unknown" and _progressing(d)["message"] == "Deployment is paused"
    assert list(_replicasets(kubectl)) == ["1"]

    kubectl("rollout", "resume", "deployment/web", "-n", NS)
    kubectl("rollout", "status", "deployment/web", "-n", NS, "--timeout=60s")
    rss = _replicasets(kubectl)
    assert sorted(rss) == ["1", "2"] and rss["1"]["spec"]["replicas"] == 0 and rss["2"]["spec"]["replicas"] == 3

    # restart: a new ReplicaSet whose template carries the restart time
    kubectl("rollout", "restart", "deployment/web", "-n", NS)
    kubectl("rollout", "status", "deployment/web", "-n", NS, "--timeout=60s")
    rss = _replicasets(kubectl)
    assert sorted(rss) == ["1", "2", "3"]
    assert "kubectl.kubernetes.io/restartedAt" in rss["3"]["spec"]["template"]["metadata"]["annotations"]

    # undo: back to revision 2's ReplicaSet, renumbered, no new one
    names = {rs["metadata"]["name"] for rs in rss.values()}
    kubectl("rollout", "undo", "deployment/web", "-n", NS)
    kubectl("rollout", "status", "deployment/web", "-n", NS, "--timeout=60s")
    after = _replicasets(kubectl)
    assert {rs["metadata"]["name"] for rs in after.values()} == names
    assert after["4"]["metadata"]["name"] == rss["2"]["metadata"]["name"]
    assert after["4"]["spec"]["replicas"] == 3
    out = kubectl("rollout", "undo", "deployment/web", "--to-revision=4", "-n", NS).out
    assert out.strip() == "deployment.apps/web skipped rollback (current template already matches revision 4)"
    res = kubectl("rollout", "undo", "deployment/web", "--to-revision=99", "-n", NS, check=False)
    assert res.rc != 0 and "unable to find specified revision 99 in history" in res.err

    kubectl("scale", "deployment/web", "--replicas=5", "-n", NS)
    kubectl("rollout", "status", "deployment/web", "-n", NS, "--timeout=60s")
    table = kubectl("get", "deployment", "web", "-n", NS).out.splitlines()
    assert table[0].split() == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
    assert table[1].split()[:4] == ["web", "5/5", "5", "5"]

    kubectl("delete", "deployment", "web", "-n", NS)
    eventually_sync(lambda: not _json(kubectl, "get", "rs,pods", "-l", "app=web")["items"], timeout=60,
                    what="the Deployment's ReplicaSets and pods deleted")


def test_progress_deadline_exceeded(kubectl: Kubectl) -> None:
    kubectl("apply", "-f", "-", stdin=STUCK)
    res = kubectl("rollout", "status", "deployment/stuck", "-n", NS, "--timeout=60s", check=False)
    assert res.rc != 0
    assert 'error: deployment "stuck" exceeded its progress deadline' in res.err
    c = _progressing(_json(kubectl, "get", "deployment", "stuck"))
    assert (c["status"], c["reason"]) == ("False", "ProgressDeadlineExceeded")
    assert c["message"].startswith('ReplicaSet "stuck-') and c["message"].endswith('" has timed out progressing.')
    kubectl("delete", "deployment", "stuck", "-n", NS)
