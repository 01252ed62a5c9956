"""DaemonSets with the real kubectl against the shared `kubeplane up` cluster
(three simulated nodes): one pod per node, upstream's columns and describe
output, `kubectl rollout status/history/undo/restart`, cascading deletion."""

from __future__ import annotations

import json

import pytest

from conftest import Kubectl, start_server
from helpers import eventually_sync

NS = "ds-e2e"

MANIFEST = f"""
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: agent
  namespace: {NS}
spec:
  selector:
    matchLabels: {{app: agent}}
  template:
    metadata:
      labels: {{app: agent}}
    spec:
      containers:
      - name: agent
        image: agent:1
"""


@pytest.fixture(scope="module")
def kubectl(cluster_kubectl: Kubectl):
    cluster_kubectl("create", "namespace", NS)
    yield cluster_kubectl
    cluster_kubectl("delete", "namespace", NS, "--wait=false", check=False)


def _json(kubectl: Kubectl, *args: str) -> dict:
    return json.loads(kubectl(*args, "-n", NS, "-o", "json").out)


def _revisions(kubectl: Kubectl) -> list[int]:
    items = _json(kubectl, "get", "controllerrevisions")["items"]
    return sorted(r["revision"] for r in items)


def test_daemonset_lifecycle_with_kubectl(kubectl: Kubectl) -> None:
    kubectl("apply", "-f", "-", stdin=MANIFEST)
    out = kubectl("rollout", "status", "daemonset/agent", "-n", NS, "--timeout=60s").out
    assert out.strip().endswith('daemon set "agent" successfully rolled out')

    table = kubectl("get", "ds", "-n", NS).out.splitlines()
    assert table[0].split() == ["NAME", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE", "NODE",
                                "SELECTOR", "AGE"]
    assert table[1].split()[:7] == ["agent", "3", "3", "3", "3", "3", "<none>"]
    wide = kubectl("get", "ds", "-n", NS, "-o", "wide").out.splitlines()
    assert wide[0].split()[-3:] == ["CONTAINERS", "IMAGES", "SELECTOR"]
    assert wide[1].split()[-3:] == ["agent", "agent:1", "app=agent"]

    # one pod on every node, placed by the scheduler through the node affinity term
    pods = _json(kubectl, "get", "pods", "-l", "app=agent")["items"]
    nodes = [n["metadata"]["name"] for n in json.loads(kubectl("get", "nodes", "-o", "json").out)["items"]]
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(nodes)
    for p in pods:
        term = p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]
        assert term == [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                          "values": [p["spec"]["nodeName"]]}]}]
        assert {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"} in \
            p["spec"]["tolerations"]

    described = kubectl("describe", "ds", "agent", "-n", NS).out
    for line in ("Desired Number of Nodes Scheduled: 3", "Current Number of Nodes Scheduled: 3",
                 "Number of Nodes Scheduled with Up-to-date Pods: 3",
                 "Number of Nodes Scheduled with Available Pods: 3", "Number of Nodes Misscheduled: 0",
                 "Pods Status:  3 Running / 0 Waiting / 0 Succeeded / 0 Failed"):
        assert line in described
    assert "SuccessfulCreate" in described and "Created pod: agent-" in described

    # kubectl compares the revision with the DaemonSet byte for byte, as upstream writes it
    out = kubectl("rollout", "undo", "daemonset/agent", "--to-revision=1", "-n", NS).out
    assert out.strip() == "daemonset.apps/agent skipped rollback (current template already matches revision 1)"
    res = kubectl("rollout", "undo", "daemonset/agent", "--to-revision=1000000", "-n", NS, check=False)
    assert res.rc != 0 and "unable to find specified revision 1000000 in history" in res.err

    # a rolling update, its history, an undo that reuses revision 1's template
    kubectl("set", "image", "daemonset/agent", "agent=agent:2", "-n", NS)
    kubectl("rollout", "status", "daemonset/agent", "-n", NS, "--timeout=60s")
    history = kubectl("rollout", "history", "daemonset/agent", "-n", NS).out.split()
    assert history[history.index("CHANGE-CAUSE") + 1:] == ["1", "<none>", "2", "<none>"]
    shown = kubectl("rollout", "history", "daemonset/agent", "-n", NS, "--revision=1").out
    assert "daemonset.apps/agent with revision #1" in shown
    assert "agent:1" in shown and "agent:2" not in shown
    out = kubectl("rollout", "undo", "daemonset/agent", "-n", NS).out
    assert out.strip() == "daemonset.apps/agent rolled back"
    kubectl("rollout", "status", "daemonset/agent", "-n", NS, "--timeout=60s")
    ds = _json(kubectl, "get", "ds", "agent")
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == "agent:1"
    assert _revisions(kubectl) == [2, 3]  # revision 1 became revision 3
    images = {p["spec"]["containers"][0]["image"] for p in _json(kubectl, "get", "pods", "-l", "app=agent")["items"]
              if not p["metadata"].get("deletionTimestamp")}
    assert images == {"agent:1"}

    # rollout restart: a new template, so a new revision rolled to every node
    kubectl("rollout", "restart", "daemonset/agent", "-n", NS)
    kubectl("rollout", "status", "daemonset/agent", "-n", NS, "--timeout=60s")
    assert _revisions(kubectl) == [2, 3, 4]
    ds = _json(kubectl, "get", "ds", "agent")
    assert ds["status"]["updatedNumberScheduled"] == 3 and ds["status"]["numberAvailable"] == 3
    assert ds["status"]["observedGeneration"] == ds["metadata"]["generation"]

    # cascading deletion: pods and revisions go with the DaemonSet
    kubectl("delete", "daemonset", "agent", "-n", NS)

    def gone() -> bool:
        pods = _json(kubectl, "get", "pods", "-l", "app=agent")["items"]
        return not pods and not _json(kubectl, "get", "controllerrevisions")["items"]

    eventually_sync(gone, timeout=60, what="the DaemonSet's pods and revisions deleted")


EDGE = """
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: edge
spec:
  selector:
    matchLabels: {app: edge}
  template:
    metadata:
      labels: {app: edge}
    spec:
      nodeSelector: {role: edge}
      containers:
      - name: agent
        image: agent:1
"""

NEW_NODE = """
apiVersion: v1
kind: Node
metadata:
  name: edge-9
  labels: {role: edge, kubernetes.io/hostname: edge-9}
status:
  capacity: {cpu: "1", memory: 1Gi, pods: "10"}
  allocatable: {cpu: "1", memory: 1Gi, pods: "10"}
  conditions:
  - {type: Ready, status: "True", reason: KubeletReady, message: ready}
"""


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory):
    """A cluster of its own: this test adds, relabels and taints nodes."""
    tmp = tmp_path_factory.mktemp("ds-nodes")
    srv = start_server(tmp, command="up", extra=["--nodes", "1"])
    yield Kubectl(srv.kubeconfig, tmp / "home")
    srv.stop()


def _edge_pods(kubectl: Kubectl) -> list[dict]:
    items = json.loads(kubectl("get", "pods", "-l", "app=edge", "-o", "json").out)["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def _target(pod: dict) -> str:
    return pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchFields"][0]["values"][0]


def _desired(kubectl: Kubectl, n: int) -> dict | None:
    ds = json.loads(kubectl("get", "ds", "edge", "-o", "json").out)
    return ds if ds["status"]["desiredNumberScheduled"] == n else None


def test_node_selector_new_nodes_and_taints(own_cluster: Kubectl) -> None:
    kubectl = own_cluster
    node = json.loads(kubectl("get", "nodes", "-o", "json").out)["items"][0]["metadata"]["name"]
    kubectl("apply", "-f", "-", stdin=EDGE)
    eventually_sync(lambda: _desired(kubectl, 0) is not None, timeout=30, what="no node selected")
    assert not _edge_pods(kubectl)

    kubectl("label", "node", node, "role=edge")
    kubectl("rollout", "status", "daemonset/edge", "--timeout=60s")
    assert [p["spec"]["nodeName"] for p in _edge_pods(kubectl)] == [node]

    # a new node that matches gets its pod, bound there by the scheduler (no agent runs it)
    kubectl("create", "-f", "-", stdin=NEW_NODE)
    eventually_sync(lambda: sorted(p["spec"].get("nodeName", "") for p in _edge_pods(kubectl))
                    == sorted([node, "edge-9"]), timeout=30, what="a pod bound to the new node")
    assert sorted(_target(p) for p in _edge_pods(kubectl)) == sorted([node, "edge-9"])
    row = eventually_sync(lambda: _desired(kubectl, 2), timeout=30, what="two nodes desired")
    assert row["status"]["currentNumberScheduled"] == 2

    # a node that stops matching loses its pod
    kubectl("label", "node", "edge-9", "role-")
    eventually_sync(lambda: [_target(p) for p in _edge_pods(kubectl)] == [node], timeout=30,
                    what="the pod of the relabelled node deleted")
    eventually_sync(lambda: _desired(kubectl, 1), timeout=30, what="one node desired")

    # a NoExecute taint the pod does not tolerate evicts it; the daemon tolerations keep it
    kubectl("taint", "node", node, "node.kubernetes.io/unschedulable:NoSchedule")
    kubectl("rollout", "status", "daemonset/edge", "--timeout=60s")
    assert [p["spec"]["nodeName"] for p in _edge_pods(kubectl)] == [node]
    kubectl("taint", "node", node, "dedicated=db:NoExecute")
    eventually_sync(lambda: not _edge_pods(kubectl), timeout=30, what="the pod evicted by the NoExecute taint")
    eventually_sync(lambda: _desired(kubectl, 0), timeout=30, what="no node desired")
