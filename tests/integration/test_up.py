"""``kubeplane up``: a working cluster with simulated nodes, driven by kubectl."""

from __future__ import annotations

import json
import time

import pytest

from conftest import Kubectl, start_server


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("up")
    srv = start_server(tmp, storage="sqlite", command="up", extra=["--nodes", "3", "--node-cpu", "2"])
    yield srv, Kubectl(srv.kubeconfig, tmp / "home")
    srv.stop()


def test_nodes_are_ready(cluster):
    _, kubectl = cluster
    lines = kubectl("get", "nodes").out.splitlines()
    assert lines[0].split()[:2] == ["NAME", "STATUS"]
    assert sorted(l.split()[0] for l in lines[1:]) == ["node-0", "node-1", "node-2"]
    assert all(l.split()[1] == "Ready" for l in lines[1:])


def test_pod_runs_and_deletes(cluster):
    _, kubectl = cluster
    kubectl("run", "web", "--image=nginx")
    kubectl("wait", "--for=condition=Ready", "pod/web", "--timeout=30s")
    pod = json.loads(kubectl("get", "pod", "web", "-o", "json").out)
    assert pod["status"]["phase"] == "Running" and pod["spec"]["nodeName"].startswith("node-")
    assert pod["status"]["podIP"].startswith("10.244.")
    row = kubectl("get", "pod", "web").out.splitlines()[1].split()
    assert row[1:3] == ["1/1", "Running"]
    out = kubectl("delete", "pod", "web", "--wait", "--timeout=30s").out
    assert 'pod "web" deleted' in out
    r = kubectl("get", "pod", "web", check=False)
    assert r.rc == 1 and "NotFound" in r.err


def test_unschedulable_pod_explains_why(cluster):
    _, kubectl = cluster
    kubectl("run", "huge", "--image=nginx",
            "--overrides", '{"spec":{"containers":[{"name":"huge","image":"nginx",'
                           '"resources":{"requests":{"cpu":"64"}}}]}}')
    out = ""
    for _ in range(50):
        out = kubectl("get", "pod", "huge", "-o", "jsonpath={.status.conditions[0].message}").out
        if out:
            break
        time.sleep(0.1)
    assert out.startswith("0/3 nodes are available: 3 Insufficient cpu.")
    events = kubectl("get", "events", "--field-selector", "involvedObject.name=huge", "-o", "json").out
    assert any(e["reason"] == "FailedScheduling" for e in json.loads(events)["items"])
    kubectl("delete", "pod", "huge")


def test_kubectl_apply_pods_wide_and_describe(cluster):
    _, kubectl = cluster
    manifest = """\
apiVersion: v1
kind: Pod
metadata: {name: fits, labels: {app: demo}}
spec:
  containers: [{name: c, image: nginx, resources: {requests: {cpu: 100m}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: toobig, labels: {app: demo}}
spec:
  containers: [{name: c, image: nginx, resources: {requests: {cpu: "32"}}}]
"""
    kubectl("apply", "-f", "-", stdin=manifest)
    kubectl("wait", "--for=condition=Ready", "pod/fits", "--timeout=30s")
    rows = {l.split()[0]: l.split() for l in kubectl("get", "pods", "-l", "app=demo", "-o", "wide").out.splitlines()[1:]}
    assert rows["fits"][6].startswith("node-")  # NODE column
    assert rows["toobig"][2] == "Pending" and rows["toobig"][6] == "<none>"
    described = ""
    for _ in range(50):
        described = kubectl("describe", "pod", "toobig").out
        if "FailedScheduling" in described:
            break
        time.sleep(0.1)
    assert "FailedScheduling" in described and "default-scheduler" in described
    assert "0/3 nodes are available: 3 Insufficient cpu." in described
    described = kubectl("describe", "pod", "fits").out
    assert "Scheduled" in described and "Successfully assigned default/fits to node-" in described
    kubectl("delete", "pod", "fits", "toobig", "--wait=false")
