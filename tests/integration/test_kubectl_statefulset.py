"""StatefulSets with the real kubectl against ``kubeplane up`` (the shared
three-node cluster): create with a headless Service and volumeClaimTemplates,
get and describe with upstream's columns, ``rollout status/history/undo``,
scale, ControllerRevisions, delete with cascading."""

from __future__ import annotations

import json

import pytest

from conftest import Kubectl
from helpers import eventually_sync

NS = "sts-e2e"
CLASS = "sts-e2e-local"

MANIFEST = f"""
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: {CLASS}
provisioner: kubeplane.io/local
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: {NS}
spec:
  clusterIP: None
  selector:
    app: web
  ports:
  - name: http
    port: 80
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
  namespace: {NS}
spec:
  serviceName: web
  replicas: 3
  selector:
    matchLabels:
      app: web
  template:
    metadata:
      labels:
        app: web
    spec:
      containers:
      - name: nginx
        image: nginx:1
        volumeMounts:
        - name: data
          mountPath: /data
  volumeClaimTemplates:
  - metadata:
      name: data
    spec:
      storageClassName: {CLASS}
      accessModes: [ReadWriteOnce]
      resources:
        requests:
          storage: 1Gi
"""


@pytest.fixture(scope="module")
def k(cluster_kubectl: Kubectl):
    cluster_kubectl("create", "namespace", NS)
    yield cluster_kubectl
    cluster_kubectl("delete", "namespace", NS, "--wait=false", check=False)
    cluster_kubectl("delete", "storageclass", CLASS, "--wait=false", check=False)


def get(k: Kubectl, *what: str) -> dict:
    return json.loads(k("get", *what, "-n", NS, "-o", "json").out)


def pods(k: Kubectl) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in get(k, "pods", "-l", "app=web")["items"]
            if not p["metadata"].get("deletionTimestamp")}


def images(k: Kubectl) -> dict[str, str]:
    return {n: p["spec"]["containers"][0]["image"] for n, p in pods(k).items()}


def history_rows(k: Kubectl) -> list[list[str]]:
    lines = k("rollout", "history", "statefulset/web", "-n", NS).out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split() == ["REVISION", "CHANGE-CAUSE"])
    return [line.split() for line in lines[start + 1:] if line.strip()]


def test_statefulset_lifecycle_with_kubectl(k: Kubectl) -> None:
    out = k("apply", "-f", "-", stdin=MANIFEST).out
    assert "statefulset.apps/web created" in out and "service/web created" in out
    status = k("rollout", "status", "statefulset/web", "-n", NS, "--timeout=90s", timeout=120).out
    # rollingUpdate is defaulted (partition 0), so kubectl reports a partitioned roll out, as upstream.
    assert status.splitlines()[-1] == "partitioned roll out complete: 3 new pods have been updated..."

    sts = get(k, "statefulset", "web")
    st = sts["status"]
    assert st["replicas"] == st["readyReplicas"] == st["currentReplicas"] == st["updatedReplicas"] == 3
    assert st["availableReplicas"] == 3 and st["currentRevision"] == st["updateRevision"]
    assert st["observedGeneration"] == sts["metadata"]["generation"]

    # Stable identities, each pod with its own bound claim.
    ps = pods(k)
    assert sorted(ps) == ["web-0", "web-1", "web-2"]
    for name, p in ps.items():
        assert p["status"]["phase"] == "Running"
        assert p["spec"]["hostname"] == name and p["spec"]["subdomain"] == "web"
        assert p["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"] == name
        assert p["metadata"]["labels"]["apps.kubernetes.io/pod-index"] == name.split("-")[1]
        assert p["metadata"]["labels"]["controller-revision-hash"] == st["updateRevision"]
        vol = next(v for v in p["spec"]["volumes"] if v["name"] == "data")
        assert vol["persistentVolumeClaim"]["claimName"] == f"data-{name}"
    claims = eventually_sync(lambda: (lambda items: items if all(
        c["status"].get("phase") == "Bound" for c in items) and len(items) == 3 else None)(
        get(k, "pvc")["items"]), timeout=30)
    assert sorted(c["metadata"]["name"] for c in claims) == ["data-web-0", "data-web-1", "data-web-2"]

    # Tables: upstream's columns.
    table = k("get", "statefulset", "web", "-n", NS).out.splitlines()
    assert table[0].split() == ["NAME", "READY", "AGE"]
    assert table[1].split()[:2] == ["web", "3/3"]
    wide = k("get", "sts", "-n", NS, "-o", "wide").out.splitlines()
    assert wide[0].split() == ["NAME", "READY", "AGE", "CONTAINERS", "IMAGES"]
    assert wide[1].split()[3:] == ["nginx", "nginx:1"]
    revs = k("get", "controllerrevisions", "-n", NS).out.splitlines()
    assert revs[0].split() == ["NAME", "CONTROLLER", "REVISION", "AGE"]
    assert revs[1].split()[:3] == [st["updateRevision"], "statefulset.apps/web", "1"]

    described = k("describe", "statefulset", "web", "-n", NS).out
    for line in ("Name:               web", "Replicas:           3 desired | 3 total",
                 "Update Strategy:    RollingUpdate", "Pods Status:        3 Running / 0 Waiting / 0 Succeeded / "
                 "0 Failed", "Volume Claims:", "StorageClass:  " + CLASS):
        assert line in described, described
    assert "SuccessfulCreate" in described and "Create Pod web-0 in StatefulSet web successful" in described

    # A new template rolls out, highest ordinal first; history and undo.
    k("set", "image", "statefulset/web", "nginx=nginx:2", "-n", NS)
    k("rollout", "status", "statefulset/web", "-n", NS, "--timeout=90s", timeout=120)
    assert images(k) == {"web-0": "nginx:2", "web-1": "nginx:2", "web-2": "nginx:2"}
    assert history_rows(k) == [["1", "<none>"], ["2", "<none>"]]
    rev1 = k("rollout", "history", "statefulset/web", "-n", NS, "--revision=1").out
    assert "Image:" in rev1 and "nginx:1" in rev1
    out = k("rollout", "undo", "statefulset/web", "-n", NS).out
    assert "statefulset.apps/web rolled back" in out
    k("rollout", "status", "statefulset/web", "-n", NS, "--timeout=90s", timeout=120)
    assert images(k) == {"web-0": "nginx:1", "web-1": "nginx:1", "web-2": "nginx:1"}
    assert history_rows(k) == [["2", "<none>"], ["3", "<none>"]]
    # The rollback reused the first revision (renumbered), as upstream.
    names = get(k, "controllerrevisions")["items"]
    assert len(names) == 2

    # Scale down: the highest ordinals go; their claims stay (whenScaled: Retain).
    k("scale", "statefulset/web", "--replicas=1", "-n", NS)
    eventually_sync(lambda: sorted(pods(k)) == ["web-0"], timeout=60)
    assert len(get(k, "pvc")["items"]) == 3
    k("rollout", "status", "statefulset/web", "-n", NS, "--timeout=60s", timeout=90)

    # Deleting the set deletes its pods (background cascading), keeps the claims.
    assert 'statefulset.apps "web" deleted' in k("delete", "statefulset", "web", "-n", NS).out
    eventually_sync(lambda: not pods(k), timeout=60)
    eventually_sync(lambda: not get(k, "controllerrevisions")["items"], timeout=60)
    assert len(get(k, "pvc")["items"]) == 3


def test_rollout_status_refuses_on_delete(k: Kubectl) -> None:
    manifest = f"""
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: manual
  namespace: {NS}
spec:
  replicas: 1
  podManagementPolicy: Parallel
  updateStrategy:
    type: OnDelete
  selector:
    matchLabels:
      app: manual
  template:
    metadata:
      labels:
        app: manual
    spec:
      containers:
      - name: c
        image: busybox
"""
    k("apply", "-f", "-", stdin=manifest)
    res = k("rollout", "status", "statefulset/manual", "-n", NS, "--timeout=30s", check=False)
    assert res.rc != 0 and "rollout status is only available for RollingUpdate strategy type" in res.err
    bad = k("scale", "statefulset/manual", "--replicas=-1", "-n", NS, check=False)
    assert bad.rc != 0
    k("delete", "statefulset", "manual", "-n", NS, "--cascade=foreground", "--wait", "--timeout=60s", timeout=90)


def test_bad_statefulsets_are_refused_with_upstreams_errors(k: Kubectl) -> None:
    def manifest(**spec: str) -> str:
        lines = "".join(f"  {key}: {value}\n" for key, value in spec.items())
        return f"""
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: bad
  namespace: {NS}
spec:
{lines}  selector:
    matchLabels:
      app: bad
  template:
    metadata:
      labels:
        app: bad
    spec:
      containers:
      - name: c
        image: busybox
"""
    res = k("apply", "-f", "-", stdin=manifest(replicas='"three"'), check=False)
    assert res.rc != 0 and 'StatefulSet in version "v1" cannot be handled as a StatefulSet' in res.err, res.err
    res = k("apply", "-f", "-", stdin=manifest(podManagementPolicy="Sometimes"), check=False)
    assert res.rc != 0
    assert ('The StatefulSet "bad" is invalid: spec.podManagementPolicy: Invalid value: "Sometimes": '
            "must be 'OrderedReady' or 'Parallel'") in res.err, res.err
    k("apply", "-f", "-", stdin=manifest(serviceName="bad"))
    res = k("patch", "statefulset", "bad", "-n", NS, "-p", '{"spec":{"serviceName":"other"}}', check=False)
    assert res.rc != 0 and "updates to statefulset spec for fields other than 'replicas'" in res.err, res.err
    k("delete", "statefulset", "bad", "-n", NS)


def _nginx(image: str, *, pause: bool = False) -> str:
    """The StatefulSet of upstream's test/cmd history tests (replicas 0, then a second container)."""
    extra = """
      - name: pause
        image: registry.k8s.io/pause:2.0""" if pause else ""
    return f"""
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: nginx
  namespace: {NS}
spec:
  replicas: 0
  serviceName: nginx
  updateStrategy:
    type: RollingUpdate
  selector:
    matchLabels:
      app: nginx-statefulset
  template:
    metadata:
      labels:
        app: nginx-statefulset
    spec:
      terminationGracePeriodSeconds: 5
      containers:
      - name: nginx
        image: {image}
        ports:
        - containerPort: 80
          name: web{extra}
"""


def test_history_and_undo_as_upstreams_command_tests(k: Kubectl) -> None:
    """What test/cmd/apps.sh run_statefulset_history_tests and run_stateful_set_tests check."""
    def sts() -> dict:
        return get(k, "statefulset", "nginx")

    def containers() -> list[str]:
        return [c["image"] for c in sts()["spec"]["template"]["spec"]["containers"]]

    k("apply", "-f", "-", "--record", stdin=_nginx("registry.k8s.io/nginx-slim:0.7"))
    eventually_sync(lambda: any("--record" in (r["metadata"].get("annotations") or {}).get(
        "kubernetes.io/change-cause", "") for r in get(k, "controllerrevisions")["items"]), timeout=30)
    eventually_sync(lambda: sts().get("status", {}).get("observedGeneration") == 1, timeout=30)
    assert sts()["status"]["replicas"] == 0
    out = k("rollout", "undo", "statefulset/nginx", "--to-revision=1", "-n", NS).out
    assert "skipped rollback (current template already matches revision 1)" in out
    k("apply", "-f", "-", "--record", stdin=_nginx("registry.k8s.io/nginx-slim:0.8", pause=True))
    assert containers() == ["registry.k8s.io/nginx-slim:0.8", "registry.k8s.io/pause:2.0"]
    eventually_sync(lambda: len(get(k, "controllerrevisions")["items"]) == 2, timeout=30)
    out = k("rollout", "history", "statefulset/nginx", "-n", NS).out
    assert "statefulset.apps/nginx" in out and "REVISION  CHANGE-CAUSE" in out
    assert "1         kubectl apply" in out and "2         kubectl apply" in out
    one = k("rollout", "history", "statefulset/nginx", "-n", NS, "--revision=1").out
    assert "statefulset.apps/nginx with revision #1" in one and "Pod Template:" in one
    assert "registry.k8s.io/nginx-slim:0.7" in one and "pause" not in one
    two = k("rollout", "history", "statefulset/nginx", "-n", NS, "--revision=2").out
    assert "registry.k8s.io/nginx-slim:0.8" in two and "registry.k8s.io/pause:2.0" in two
    k("rollout", "undo", "statefulset/nginx", "-n", NS, "--dry-run=client")
    k("rollout", "undo", "statefulset/nginx", "-n", NS, "--dry-run=server")
    assert containers() == ["registry.k8s.io/nginx-slim:0.8", "registry.k8s.io/pause:2.0"]
    k("rollout", "undo", "statefulset/nginx", "--to-revision=1", "-n", NS)
    eventually_sync(lambda: containers() == ["registry.k8s.io/nginx-slim:0.7"], timeout=30)

    def history() -> str:
        return k("rollout", "history", "statefulset/nginx", "-n", NS).out
    eventually_sync(lambda: "3         kubectl apply" in history(), timeout=30)
    assert "2         kubectl apply" in history() and "1         kubectl apply" not in history()
    res = k("rollout", "undo", "statefulset/nginx", "--to-revision=1000000", "-n", NS, check=False)
    assert res.rc != 0 and "unable to find specified revision" in res.err
    assert containers() == ["registry.k8s.io/nginx-slim:0.7"]

    # run_stateful_set_tests: scale with a precondition, restart, delete.
    generation = sts()["status"]["observedGeneration"]
    k("scale", "--current-replicas=0", "--replicas=1", "statefulset", "nginx", "-n", NS)
    eventually_sync(lambda: sts()["status"].get("observedGeneration") == generation + 1, timeout=30)
    eventually_sync(lambda: sorted(pods_of(k, "app=nginx-statefulset")) == ["nginx-0"], timeout=60)
    k("rollout", "restart", "statefulset", "nginx", "-n", NS)
    eventually_sync(lambda: sts()["status"].get("observedGeneration") == generation + 2, timeout=30)
    k("rollout", "status", "statefulset/nginx", "-n", NS, "--timeout=60s", timeout=90)
    k("delete", "statefulset", "nginx", "-n", NS)
    eventually_sync(lambda: not pods_of(k, "app=nginx-statefulset"), timeout=60)


def pods_of(k: Kubectl, selector: str) -> list[str]:
    return [p["metadata"]["name"] for p in get(k, "pods", "-l", selector)["items"]]
