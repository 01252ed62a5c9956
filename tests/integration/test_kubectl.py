"""The real kubectl (v1.32) against a kubeplane API server."""

from __future__ import annotations

import json
import time
import uuid

import pytest


def ns_name(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


MANIFEST = """\
apiVersion: v1
kind: Namespace
metadata:
  name: {ns}
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: {ns}-fast
provisioner: kubeplane.io/local
volumeBindingMode: WaitForFirstConsumer
---
apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: {ns}
  labels: {{app: web, tier: front}}
spec:
  containers:
  - name: c
    image: nginx:1.27
    ports: [{{containerPort: 80}}]
---
apiVersion: v1
kind: Pod
metadata:
  name: db
  namespace: {ns}
  labels: {{app: db}}
spec:
  containers:
  - name: c
    image: postgres:16
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: dep
  namespace: {ns}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: dep}}}}
  template:
    metadata: {{labels: {{app: dep}}}}
    spec:
      containers:
      - name: c
        image: nginx:1.27
        env: [{{name: A, value: "1"}}]
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: data
  namespace: {ns}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: {ns}-fast
  resources: {{requests: {{storage: 1Gi}}}}
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: {ns}-gpu
spec:
  selectors:
  - cel:
      expression: device.driver == "gpu.kubeplane.io"
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: gpu
  namespace: {ns}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: {ns}-gpu
"""


@pytest.fixture()
def ns(kubectl):
    name = ns_name()
    kubectl("create", "namespace", name)
    yield name
    kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_version_and_api_resources(kubectl):
    out = kubectl("version").out
    assert "Server Version: v1.32" in out
    res = kubectl("api-resources").out
    lines: dict[str, str] = {}
    for line in res.splitlines()[1:]:
        # the first of a name: core/v1 pods and nodes come before metrics.k8s.io's
        lines.setdefault(line.split()[0], line)
    assert "pods" in lines and "po" in lines["pods"].split()
    assert "metrics.k8s.io/v1beta1" in [l.split()[1] for l in res.splitlines()[1:] if l.startswith("pods ")]
    assert "deployments" in lines and "apps/v1" in lines["deployments"]
    assert "resourceclaims" in lines and "resource.k8s.io/v1" in lines["resourceclaims"]
    assert "storageclasses" in lines and "sc" in lines["storageclasses"].split()


def test_apply_multi_document_manifest_and_get(kubectl):
    ns = ns_name("apply")
    out = kubectl("apply", "-f", "-", stdin=MANIFEST.format(ns=ns)).out
    for what in (f"namespace/{ns} created", f"storageclass.storage.k8s.io/{ns}-fast created", "pod/web created",
                 "pod/db created", "deployment.apps/dep created", "persistentvolumeclaim/data created",
                 f"deviceclass.resource.k8s.io/{ns}-gpu created", "resourceclaimtemplate.resource.k8s.io/gpu created"):
        assert what in out
    # Re-applying the same manifest changes nothing.
    again = kubectl("apply", "-f", "-", stdin=MANIFEST.format(ns=ns)).out
    assert "pod/web unchanged" in again and "deployment.apps/dep unchanged" in again

    table = kubectl("get", "pods", "-n", ns).out.splitlines()
    assert table[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    rows = {l.split()[0]: l.split() for l in table[1:]}
    assert set(rows) == {"web", "db"}
    assert rows["web"][1:3] == ["0/1", "Pending"]
    wide = kubectl("get", "pods", "-n", ns, "-o", "wide").out.splitlines()[0].split()
    assert wide[:5] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"] and "NODE" in wide and "IP" in wide
    assert kubectl("get", "pods", "-n", ns, "-l", "app=web", "-o", "name").out.split() == ["pod/web"]
    assert kubectl("get", "pods", "-n", ns, "-l", "app!=web", "-o", "name").out.split() == ["pod/db"]
    doc = json.loads(kubectl("get", "pod", "web", "-n", ns, "-o", "json").out)
    assert doc["kind"] == "Pod" and doc["spec"]["containers"][0]["image"] == "nginx:1.27"
    assert doc["metadata"]["uid"] and doc["metadata"]["resourceVersion"]
    assert "kubectl.kubernetes.io/last-applied-configuration" in doc["metadata"]["annotations"]
    assert "name: web" in kubectl("get", "pod", "web", "-n", ns, "-o", "yaml").out
    pvc = kubectl("get", "pvc", "-n", ns).out.splitlines()
    assert pvc[0].split()[:3] == ["NAME", "STATUS", "VOLUME"] and pvc[1].split()[:2] == ["data", "Pending"]
    deploy = kubectl("get", "deploy", "-n", ns).out.splitlines()
    assert deploy[0].split() == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
    all_ns = kubectl("get", "pods", "-A").out.splitlines()
    assert all_ns[0].split()[0] == "NAMESPACE"
    assert any(l.split()[:2] == [ns, "web"] for l in all_ns[1:])
    kubectl("delete", "namespace", ns, "--wait=false")
    kubectl("delete", "storageclass", f"{ns}-fast")
    kubectl("delete", "deviceclass", f"{ns}-gpu")


def test_errors_match_real_cluster_wording(kubectl, ns):
    r = kubectl("get", "pod", "nope", "-n", ns, check=False)
    assert r.rc == 1
    assert 'Error from server (NotFound): pods "nope" not found' in r.err
    r = kubectl("get", "deploy", "nope", "-n", ns, check=False)
    assert 'Error from server (NotFound): deployments.apps "nope" not found' in r.err
    pod = f"apiVersion: v1\nkind: Pod\nmetadata: {{name: p, namespace: {ns}}}\nspec: {{containers: [{{name: c, image: i}}]}}\n"
    kubectl("create", "-f", "-", stdin=pod)
    r = kubectl("create", "-f", "-", stdin=pod, check=False)
    assert r.rc == 1 and 'Error from server (AlreadyExists)' in r.err and 'pods "p" already exists' in r.err
    bad = f"apiVersion: v1\nkind: Pod\nmetadata: {{name: bad, namespace: {ns}}}\nspec: {{containers: []}}\n"
    r = kubectl("create", "-f", "-", stdin=bad, check=False)
    assert r.rc == 1 and 'The Pod "bad" is invalid' in r.err and "spec.containers: Required value" in r.err
    unknown = f"apiVersion: v1\nkind: Pod\nmetadata: {{name: u, namespace: {ns}}}\nspec: {{foo: 1, containers: [{{name: c, image: i}}]}}\n"
    r = kubectl("create", "-f", "-", stdin=unknown, check=False)
    assert r.rc == 1 and "BadRequest" in r.err and 'unknown field "spec.foo"' in r.err
    r = kubectl("get", "widgets", check=False)
    assert r.rc == 1 and 'the server doesn\'t have a resource type "widgets"' in r.err


def test_patch_label_annotate_scale(kubectl, ns):
    kubectl("create", "deployment", "dep", "--image=nginx:1.27", "--replicas=1", "-n", ns)
    kubectl("patch", "deploy", "dep", "-n", ns, "-p",
            '{"spec":{"template":{"spec":{"containers":[{"name":"nginx","image":"nginx:1.28"}]}}}}')
    d = json.loads(kubectl("get", "deploy", "dep", "-n", ns, "-o", "json").out)
    assert [c["image"] for c in d["spec"]["template"]["spec"]["containers"]] == ["nginx:1.28"]
    assert d["metadata"]["generation"] == 2
    kubectl("patch", "deploy", "dep", "-n", ns, "--type=merge", "-p", '{"metadata":{"labels":{"m":"1"}}}')
    kubectl("patch", "deploy", "dep", "-n", ns, "--type=json", "-p",
            '[{"op":"add","path":"/metadata/labels/j","value":"2"}]')
    kubectl("label", "deploy", "dep", "-n", ns, "l=3")
    kubectl("annotate", "deploy", "dep", "-n", ns, "note=hello")
    d = json.loads(kubectl("get", "deploy", "dep", "-n", ns, "-o", "json").out)
    assert {"m": "1", "j": "2", "l": "3"}.items() <= d["metadata"]["labels"].items()
    assert d["metadata"]["annotations"]["note"] == "hello"
    kubectl("label", "deploy", "dep", "-n", ns, "l-")
    out = kubectl("scale", "deploy", "dep", "-n", ns, "--replicas=4").out
    assert "deployment.apps/dep scaled" in out
    d = json.loads(kubectl("get", "deploy", "dep", "-n", ns, "-o", "json").out)
    assert d["spec"]["replicas"] == 4 and "l" not in d["metadata"]["labels"]
    r = kubectl("scale", "deploy", "dep", "-n", ns, "--current-replicas=3", "--replicas=5", check=False)
    # kubectl checks the precondition against the scale subresource it read.
    assert r.rc == 1 and "Expected replicas to be 3, was 4" in r.err


def test_server_side_apply_and_conflict(kubectl, ns):
    cm = f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: cfg, namespace: {ns}}}\ndata: {{a: '1'}}\n"
    out = kubectl("apply", "--server-side", "-f", "-", stdin=cm).out
    assert "configmap/cfg serverside-applied" in out
    other = cm.replace("'1'", "'2'")
    r = kubectl("apply", "--server-side", "--field-manager=other", "-f", "-", stdin=other, check=False)
    assert r.rc == 1 and 'conflict with "kubectl"' in r.err and ".data.a" in r.err
    kubectl("apply", "--server-side", "--field-manager=other", "--force-conflicts", "-f", "-", stdin=other)
    got = json.loads(kubectl("get", "cm", "cfg", "-n", ns, "-o", "json", "--show-managed-fields").out)
    assert got["data"] == {"a": "2"}
    managers = {m["manager"] for m in got["metadata"]["managedFields"]}
    assert "other" in managers


def test_get_watch_sees_change(kubectl, ns):
    kubectl("create", "configmap", "w", "--from-literal=k=v", "-n", ns)
    proc = kubectl.popen("get", "configmaps", "-n", ns, "-w", "-o", "name", "--request-timeout=20s")
    try:
        time.sleep(1.5)
        kubectl("create", "configmap", "w2", "--from-literal=k=v", "-n", ns)
        deadline = time.monotonic() + 15
        seen = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line.strip())
            if "configmap/w2" in line:
                break
        assert "configmap/w2" in seen
    finally:
        proc.kill()
        proc.wait()


def test_delete_wait_and_wait_for_delete(kubectl, ns):
    kubectl("create", "configmap", "gone", "--from-literal=a=b", "-n", ns)
    out = kubectl("delete", "configmap", "gone", "-n", ns, "--wait").out
    assert 'configmap "gone" deleted' in out
    # An object held by a finalizer lingers until the finalizer is removed.
    held = (f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: held, namespace: {ns}, "
            f"finalizers: [example.com/hold]}}\n")
    kubectl("create", "-f", "-", stdin=held)
    kubectl("delete", "configmap", "held", "-n", ns, "--wait=false")
    got = json.loads(kubectl("get", "cm", "held", "-n", ns, "-o", "json").out)
    assert got["metadata"]["deletionTimestamp"]
    waiter = kubectl.popen("wait", "--for=delete", "configmap/held", "-n", ns, "--timeout=30s")
    time.sleep(1)
    kubectl("patch", "cm", "held", "-n", ns, "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
    out, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 0, err
    assert "configmap/held condition met" in out
    r = kubectl("get", "cm", "held", "-n", ns, check=False)
    assert r.rc == 1 and "NotFound" in r.err


def test_imperative_generators_send_protobuf(kubectl, ns):
    kubectl("create", "configmap", "pc", "--from-literal=x=1", "-n", ns)
    kubectl("create", "secret", "generic", "ps", "--from-literal=p=secret", "-n", ns)
    kubectl("create", "service", "clusterip", "svc", "--tcp=80:8080", "-n", ns)
    kubectl("create", "job", "jb", "--image=busybox", "-n", ns)
    cm = json.loads(kubectl("get", "cm", "pc", "-n", ns, "-o", "json").out)
    assert cm["data"] == {"x": "1"}
    sec = json.loads(kubectl("get", "secret", "ps", "-n", ns, "-o", "json").out)
    assert sec["data"] == {"p": "c2VjcmV0"} and sec["type"] == "Opaque"
    svc = json.loads(kubectl("get", "svc", "svc", "-n", ns, "-o", "json").out)
    assert svc["spec"]["ports"][0]["port"] == 80 and svc["spec"]["ports"][0]["targetPort"] == 8080
    assert svc["spec"]["clusterIP"]


def test_explain_pod(kubectl):
    out = kubectl("explain", "pod.spec.containers").out
    assert "KIND:" in out and "Pod" in out and "image" in out
