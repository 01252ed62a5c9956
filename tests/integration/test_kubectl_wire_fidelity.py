"""What real kubectl sends and expects for apply, patch strategies, defaults,
unknown fields and node output, end to end against a server subprocess."""

from __future__ import annotations

import json
import time
import uuid

import pytest


@pytest.fixture()
def ns(kubectl):
    name = "wf-" + uuid.uuid4().hex[:8]
    kubectl("create", "namespace", name)
    yield name
    kubectl("delete", "namespace", name, "--wait=false", check=False)


DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: {ns}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: web}}}}
  strategy: {strategy}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      containers:
      - name: c
        image: nginx
        volumeMounts: [{{name: data, mountPath: /data}}]
      volumes:
      - name: data
        {volume}
"""


def test_apply_switches_volume_type_and_strategy_with_retain_keys(kubectl, ns):
    before = DEPLOYMENT.format(ns=ns, strategy="{type: RollingUpdate, rollingUpdate: {maxSurge: 1}}",
                               volume="emptyDir: {}")
    after = DEPLOYMENT.format(ns=ns, strategy="{type: Recreate}", volume="hostPath: {path: /tmp/x}")
    kubectl("apply", "-f", "-", stdin=before)
    out = kubectl("apply", "-f", "-", stdin=after).out
    assert "configured" in out
    spec = json.loads(kubectl("get", "deployment", "web", "-n", ns, "-o", "json").out)["spec"]
    assert spec["strategy"] == {"type": "Recreate"}
    assert spec["template"]["spec"]["volumes"] == [{"name": "data", "hostPath": {"path": "/tmp/x", "type": ""}}]
    # And back: the patch kubectl computes clears hostPath again.
    kubectl("apply", "-f", "-", stdin=before)
    spec = json.loads(kubectl("get", "deployment", "web", "-n", ns, "-o", "json").out)["spec"]
    assert spec["template"]["spec"]["volumes"] == [{"name": "data", "emptyDir": {}}]
    assert spec["strategy"]["type"] == "RollingUpdate"


def test_defaults_of_env_field_refs_in_pods_and_templates(kubectl, ns):
    manifest = f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: env, namespace: {ns}}}
spec:
  selector: {{matchLabels: {{app: env}}}}
  template:
    metadata: {{labels: {{app: env}}}}
    spec:
      initContainers:
      - name: i
        image: busybox:1.36
        env: [{{name: VAR, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}]
      containers:
      - name: c
        image: nginx
        env: [{{name: VAR, valueFrom: {{fieldRef: {{fieldPath: metadata.namespace}}}}}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: envpod, namespace: {ns}}}
spec:
  containers:
  - name: c
    image: nginx:1.25
    env: [{{name: VAR, valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}}}]
"""
    kubectl("apply", "-f", "-", stdin=manifest)
    tmpl = json.loads(kubectl("get", "deployment", "env", "-n", ns, "-o", "json").out)["spec"]["template"]["spec"]
    for c in tmpl["initContainers"] + tmpl["containers"]:
        assert c["env"][0]["valueFrom"]["fieldRef"]["apiVersion"] == "v1"
    assert tmpl["initContainers"][0]["imagePullPolicy"] == "IfNotPresent"
    assert tmpl["containers"][0]["imagePullPolicy"] == "Always"
    pod = json.loads(kubectl("get", "pod", "envpod", "-n", ns, "-o", "json").out)["spec"]
    assert pod["containers"][0]["env"][0]["valueFrom"]["fieldRef"] == {"apiVersion": "v1", "fieldPath": "spec.nodeName"}
    # Applying the same manifest again changes nothing.
    out = kubectl("apply", "-f", "-", stdin=manifest).out
    assert out.count("unchanged") == 2, out


def managed(kubectl, ns, kind, name):
    obj = json.loads(kubectl("get", kind, name, "-n", ns, "-o", "json", "--show-managed-fields").out)
    return obj, {(e["manager"], e["operation"]): e["fieldsV1"] for e in obj["metadata"]["managedFields"]}


def test_client_side_apply_then_server_side_apply(kubectl, ns):
    cm = f"""
apiVersion: v1
kind: ConfigMap
metadata: {{name: switch, namespace: {ns}, labels: {{team: a}}}}
data: {{a: "1", b: "2"}}
"""
    kubectl("apply", "-f", "-", stdin=cm)
    _, owners = managed(kubectl, ns, "configmap", "switch")
    assert list(owners) == [("kubectl-client-side-apply", "Update")]
    changed = cm.replace('a: "1"', 'a: "3"').replace("team: a", "team: b")
    out = kubectl("apply", "--server-side", "-f", "-", stdin=changed)
    assert "serverside-applied" in out.out and "Warning" not in out.err, out.err
    obj, owners = managed(kubectl, ns, "configmap", "switch")
    assert obj["data"] == {"a": "3", "b": "2"} and obj["metadata"]["labels"] == {"team": "b"}
    # kubectl moved the client-side manager's fields to its own Apply entry;
    # the annotation, kept up to date by the server, has its own manager.
    assert sorted(owners) == [("kubectl", "Apply"), ("kubectl-last-applied", "Apply")]
    assert owners[("kubectl", "Apply")] == {"f:data": {"f:a": {}, "f:b": {}},
                                            "f:metadata": {"f:labels": {"f:team": {}}}}
    last = json.loads(obj["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"])
    assert last["data"] == {"a": "3", "b": "2"}
    # Dropping a field from the manifest removes it: kubectl owns it alone now.
    out = kubectl("apply", "--server-side", "-f", "-", stdin=changed.replace(', b: "2"', ""))
    obj, _ = managed(kubectl, ns, "configmap", "switch")
    assert obj["data"] == {"a": "3"}
    # And back to client-side apply works too.
    kubectl("apply", "-f", "-", stdin=cm)
    obj, _ = managed(kubectl, ns, "configmap", "switch")
    assert obj["data"] == {"a": "1", "b": "2"}


def test_server_side_apply_by_another_manager_still_conflicts(kubectl, ns):
    cm = f"""
apiVersion: v1
kind: ConfigMap
metadata: {{name: other, namespace: {ns}}}
data: {{a: "1"}}
"""
    kubectl("apply", "-f", "-", stdin=cm)
    r = kubectl("apply", "--server-side", "--field-manager=tool", "-f", "-", stdin=cm.replace('"1"', '"2"'),
                check=False)
    assert r.rc != 0 and 'conflict with "kubectl-client-side-apply"' in r.err


def test_describe_node_that_never_reported(kubectl, server):
    import asyncio

    from kubeplane.api.resources import resource
    from kubeplane.client.http import HttpClient
    from kubeplane.client.informer import SharedInformerFactory
    from kubeplane.client.kubeconfig import load_kubeconfig
    from kubeplane.controllers.nodelifecycle import NodeLifecycleController

    name = "ghost-" + uuid.uuid4().hex[:6]
    # a node that reports, so that the cluster is not wholly down (the node
    # lifecycle controller taints nothing NoExecute then, as upstream)
    live = "live-" + uuid.uuid4().hex[:6]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    kubectl("create", "-f", "-", stdin=json.dumps({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": live},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                   "lastHeartbeatTime": now, "lastTransitionTime": now}]}}))
    kubectl("create", "-f", "-", stdin=f"apiVersion: v1\nkind: Node\nmetadata: {{name: {name}}}\n")
    node = json.loads(kubectl("get", "node", name, "-o", "json").out)
    assert node["spec"] == {} and node["status"]["daemonEndpoints"] == {"kubeletEndpoint": {"Port": 0}}

    async def run_controller() -> None:
        client = HttpClient(load_kubeconfig(str(server.kubeconfig)))
        factory = SharedInformerFactory(client)
        ctrl = NodeLifecycleController(client, factory, startup_grace=0)
        await ctrl.start()
        try:
            for _ in range(500):
                got = await client.get(resource("nodes"), name)
                if len((got.get("spec") or {}).get("taints") or []) == 2:
                    return
                await asyncio.sleep(0.01)
            raise AssertionError("the node was not marked unreachable")
        finally:
            await ctrl.stop()
            await factory.stop()
            await client.close()

    asyncio.run(run_controller())
    out = kubectl("describe", "node", name).out
    lines = out.splitlines()
    start = lines.index("Conditions:")
    assert lines[start + 1].split() == ["Type", "Status", "LastHeartbeatTime", "LastTransitionTime", "Reason",
                                        "Message"]
    rows = lines[start + 3:start + 7]
    assert [r.split()[0] for r in rows] == ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"]
    for r in rows:
        assert r.split()[1] == "Unknown" and r.endswith("NodeStatusNeverUpdated   Kubelet never posted node status.")
    assert "Taints:             node.kubernetes.io/unreachable:NoExecute" in out
    assert "node.kubernetes.io/unreachable:NoSchedule" in out
    assert kubectl("get", "node", name).out.splitlines()[1].split()[1] == "NotReady"
    kubectl("delete", "node", name, live)
