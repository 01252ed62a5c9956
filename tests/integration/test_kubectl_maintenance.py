"""Node maintenance with real kubectl on a cluster of its own (it cordons,
drains and loses nodes): `kubectl drain` of a node whose pods a
PodDisruptionBudget covers (evictions, upstream's 429 and retries, PDB status
and columns), `cordon` / `uncordon`, and a node whose agent stops
heartbeating (a separate `kubeplane nodes` process) becoming NotReady, tainted
unreachable, and its pods evicted after their tolerationSeconds."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from conftest import Kubectl, start_server
from helpers import eventually_sync

NS = "maint"

DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: maint}
spec:
  replicas: 4
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: c, image: nginx:1}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: maint}
spec:
  minAvailable: 3
  selector: {matchLabels: {app: web}}
"""

SHORT_TOLERATION = """
apiVersion: v1
kind: Pod
metadata: {name: brief, namespace: maint}
spec:
  nodeName: edge-0
  tolerations:
  - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 2}
  - {key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 2}
  containers: [{name: c, image: nginx:1}]
---
apiVersion: v1
kind: Pod
metadata: {name: patient, namespace: maint}
spec:
  nodeName: edge-0
  containers: [{name: c, image: nginx:1}]
"""


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory):
    # a short grace period: the simulated nodes renew their Leases every 10 s
    srv = start_server(tmp_path_factory.mktemp("maintenance"), command="up", extra=[
        "--nodes", "2", "--node-monitor-grace-period", "15s", "--node-monitor-period", "1s"])
    log = open(srv.data_dir.parent / "edge.log", "ab")
    edge = subprocess.Popen([sys.executable, "-m", "kubeplane.cli.main", "nodes", "--kubeconfig",
                             str(srv.kubeconfig), "--nodes", "1", "--node-prefix", "edge"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        yield srv, edge
    finally:
        if edge.poll() is None:
            edge.kill()
            edge.wait(5)
        srv.stop()


@pytest.fixture(scope="module")
def k(own_cluster, tmp_path_factory) -> Kubectl:
    srv, _edge = own_cluster
    kc = Kubectl(srv.kubeconfig, tmp_path_factory.mktemp("maintenance-kubectl"))
    eventually_sync(lambda: "edge-0" in kc("get", "nodes", "-o", "name").out, timeout=30)
    kc("create", "namespace", NS)
    return kc


def get_json(k: Kubectl, *args: str) -> dict:
    return json.loads(k(*args, "-o", "json").out)


def test_drain_honours_the_disruption_budget_then_uncordon(k):
    k("apply", "-f", "-", stdin=DEPLOYMENT)
    k("rollout", "status", "deployment/web", "-n", NS, "--timeout=60s")
    pdb = eventually_sync(lambda: _pdb_status(k, disruptionsAllowed=1, currentHealthy=4), timeout=20)
    assert (pdb["desiredHealthy"], pdb["expectedPods"]) == (3, 4)
    cond = next(c for c in pdb["conditions"] if c["type"] == "DisruptionAllowed")
    assert (cond["status"], cond["reason"]) == ("True", "SufficientPods")
    table = k("get", "pdb", "web", "-n", NS).out.splitlines()
    assert table[0].split() == ["NAME", "MIN", "AVAILABLE", "MAX", "UNAVAILABLE", "ALLOWED", "DISRUPTIONS", "AGE"]
    assert table[1].split()[:4] == ["web", "3", "N/A", "1"]
    described = k("describe", "pdb", "web", "-n", NS).out
    assert "Min available:  3" in described and "Allowed disruptions:  1" in described

    # the node with the most of the pods (four pods, three nodes: at least two)
    pods = get_json(k, "get", "pods", "-n", NS, "-l", "app=web")["items"]
    by_node: dict[str, list[str]] = {}
    for p in pods:
        by_node.setdefault(p["spec"]["nodeName"], []).append(p["metadata"]["name"])
    node, names = max(by_node.items(), key=lambda kv: len(kv[1]))
    assert len(names) >= 2

    res = k("drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=90s", timeout=120)
    out = res.out + res.err
    assert f"node/{node} cordoned" in out and f"node/{node} drained" in out
    for name in names:
        assert f"evicting pod {NS}/{name}" in out
    # the budget allowed one at a time: the second eviction was refused and retried
    assert "Cannot evict pod as it would violate the pod's disruption budget." in out
    assert "(will retry after 5s)" in out
    left = [p for p in get_json(k, "get", "pods", "-n", NS, "-l", "app=web")["items"]
            if p["spec"].get("nodeName") == node and not p["metadata"].get("deletionTimestamp")]
    assert left == []
    n = get_json(k, "get", "node", node)
    assert n["spec"]["unschedulable"] is True
    # the node lifecycle controller mirrors the cordon as a taint
    eventually_sync(lambda: _taint_keys(k, node) == ["node.kubernetes.io/unschedulable"], timeout=10)
    assert "SchedulingDisabled" in k("get", "node", node).out
    k("rollout", "status", "deployment/web", "-n", NS, "--timeout=60s")

    assert f"node/{node} uncordoned" in k("uncordon", node).out
    eventually_sync(lambda: _taint_keys(k, node) == [], timeout=10)
    assert "SchedulingDisabled" not in k("get", "node", node).out
    k("delete", "deployment", "web", "-n", NS)


def _pdb_status(k: Kubectl, **want) -> dict | None:
    st = get_json(k, "get", "pdb", "web", "-n", NS).get("status") or {}
    return st if all(st.get(key) == v for key, v in want.items()) else None


def _taint_keys(k: Kubectl, node: str) -> list[str]:
    return sorted(t["key"] for t in get_json(k, "get", "node", node)["spec"].get("taints") or [])


def test_node_that_stops_heartbeating_goes_not_ready_and_its_pods_are_evicted(k, own_cluster):
    _srv, edge = own_cluster
    k("apply", "-f", "-", stdin=SHORT_TOLERATION)
    for name in ("brief", "patient"):
        k("wait", "--for=condition=Ready", f"pod/{name}", "-n", NS, "--timeout=30s")
    patient = get_json(k, "get", "pod", "patient", "-n", NS)
    # DefaultTolerationSeconds: five minutes on a not-ready or unreachable node
    assert {(t["key"], t.get("tolerationSeconds")) for t in patient["spec"]["tolerations"]} == {
        ("node.kubernetes.io/not-ready", 300), ("node.kubernetes.io/unreachable", 300)}

    edge.send_signal(signal.SIGTERM)
    edge.wait(15)
    # no Lease renewal for 15 s: NotReady (Ready Unknown), tainted unreachable
    eventually_sync(lambda: _node_status(k, "edge-0") == "NotReady", timeout=40, interval=0.5)
    node = get_json(k, "get", "node", "edge-0")
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.")
    eventually_sync(lambda: _taint_keys(k, "edge-0") == ["node.kubernetes.io/unreachable"] * 2, timeout=10)
    effects = sorted(t["effect"] for t in get_json(k, "get", "node", "edge-0")["spec"]["taints"])
    assert effects == ["NoExecute", "NoSchedule"]

    # the pod tolerating 2 s is evicted (terminating: no kubelet is left to finish it)
    brief = eventually_sync(lambda: _terminating(k, "brief"), timeout=20, interval=0.5)
    target = next(c for c in brief["status"]["conditions"] if c["type"] == "DisruptionTarget")
    assert (target["reason"], target["message"]) == ("DeletionByTaintManager",
                                                     "Taint manager: deleting due to NoExecute taint")
    # both pods were marked not ready; the patient one stays for its 300 s
    patient = get_json(k, "get", "pod", "patient", "-n", NS)
    assert not patient["metadata"].get("deletionTimestamp")
    assert next(c for c in patient["status"]["conditions"] if c["type"] == "Ready")["status"] == "False"
    events = k("get", "events", "-n", NS, "--field-selector", "reason=TaintManagerEviction").out
    assert f"Marking for deletion Pod {NS}/brief" in events
    node_events = k("get", "events", "-n", "default", "--field-selector", "involvedObject.name=edge-0").out
    assert "NodeNotReady" in node_events


def _node_status(k: Kubectl, name: str) -> str:
    return k("get", "node", name, "--no-headers").out.split()[1]


def _terminating(k: Kubectl, name: str) -> dict | None:
    pod = get_json(k, "get", "pod", name, "-n", NS)
    return pod if pod["metadata"].get("deletionTimestamp") else None
