"""Pod volumes on a real node, end to end: kubectl makes the ConfigMap, Secret, claim and pod, the
node agent sets the volumes up and the container reads them (what it writes to its termination log
comes back in the pod's status; a running one is asked through kubectl exec)."""

from __future__ import annotations

import json
import time

from conftest import BUSYBOX

READ = ("cat /cfg/greeting; echo; cat /sec/password; echo; cat /info/labels; echo; "
        "cat /var/run/secrets/kubernetes.io/serviceaccount/namespace; echo; "
        "head -c 3 /var/run/secrets/kubernetes.io/serviceaccount/token; echo; "
        "grep -c BEGIN /var/run/secrets/kubernetes.io/serviceaccount/ca.crt; "
        "grep ' /mem ' /proc/mounts | cut -d' ' -f3; "
        "echo kept > /data/f; cat /data/f; "
        "if touch /cfg/x 2>/dev/null; then echo writable; else echo read-only; fi; echo done")
# what the container printed comes back as its termination message (no kubelet API needed)
READ = f"({READ}) > /dev/termination-log"


def _terminated(node, name: str, timeout: float = 90.0) -> dict:
    deadline = time.monotonic() + timeout
    pod: dict = {}
    while time.monotonic() < deadline:
        pod = json.loads(node.kubectl("get", "pod", name, "-o", "json").stdout)
        for st in (pod.get("status") or {}).get("containerStatuses") or []:
            if "terminated" in (st.get("state") or {}):
                return st["state"]["terminated"]
        time.sleep(0.3)
    events = node.kubectl("get", "events", "--field-selector", f"involvedObject.name={name}", "-o", "json").stdout
    raise AssertionError(f"{name} never finished: {json.dumps(pod.get('status'))[:1500]}\n{events[-2000:]}")


def test_config_secret_downward_token_claim_and_memory_volumes(real_node):
    manifests = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "web-cfg"}, "data": {"greeting": "hello"}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "web-sec"}, "stringData": {"password": "s3cret"}},
        {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "node-local"},
         "provisioner": "kubeplane.io/local", "volumeBindingMode": "WaitForFirstConsumer"},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "web-data"},
         "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "node-local",
                  "resources": {"requests": {"storage": "1Gi"}}}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "vols", "labels": {"app": "vols"}}, "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": BUSYBOX, "imagePullPolicy": "Never",
                            "command": ["sh", "-c", READ], "volumeMounts": [
                                {"name": "cfg", "mountPath": "/cfg"}, {"name": "sec", "mountPath": "/sec"},
                                {"name": "info", "mountPath": "/info"}, {"name": "mem", "mountPath": "/mem"},
                                {"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "cfg", "configMap": {"name": "web-cfg"}},
                        {"name": "sec", "secret": {"secretName": "web-sec"}},
                        {"name": "info", "downwardAPI": {"items": [
                            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
                        {"name": "mem", "emptyDir": {"medium": "Memory"}},
                        {"name": "data", "persistentVolumeClaim": {"claimName": "web-data"}}]}},
    ]
    real_node.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests}))
    try:
        done = _terminated(real_node, "vols")
        assert done["exitCode"] == 0
        assert done["message"].splitlines() == ["hello", "s3cret", 'app="vols"', "default", "eyJ", "1", "tmpfs", "kept",
                                    "read-only", "done"]
    finally:
        real_node.kubectl("delete", "pod", "vols", "--wait=false", check=False)


def test_a_missing_config_map_is_a_failed_mount_event(real_node):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nocfg"}, "spec": {
        "containers": [{"name": "main", "image": BUSYBOX, "imagePullPolicy": "Never", "command": ["true"],
                        "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]}],
        "volumes": [{"name": "cfg", "configMap": {"name": "absent"}}]}}
    real_node.kubectl("apply", "-f", "-", input=json.dumps(pod))
    try:
        deadline = time.monotonic() + 60
        messages: list[str] = []
        while time.monotonic() < deadline:
            events = json.loads(real_node.kubectl("get", "events", "--field-selector",
                                                  "involvedObject.name=nocfg", "-o", "json").stdout)["items"]
            messages = [e["message"] for e in events if e["reason"] == "FailedMount"]
            if messages:
                break
            time.sleep(0.3)
        assert messages == ['MountVolume.SetUp failed for volume "cfg" : configmap "absent" not found']
        pod = json.loads(real_node.kubectl("get", "pod", "nocfg", "-o", "json").stdout)
        assert pod["status"]["phase"] == "Pending"
    finally:
        real_node.kubectl("delete", "pod", "nocfg", "--wait=false", check=False)


def test_a_running_container_sees_its_config_map_and_labels_change(real_node):
    manifests = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "live-cfg"}, "data": {"greeting": "hello"}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "live", "labels": {"stage": "one"}}, "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": BUSYBOX, "imagePullPolicy": "Never",
                            "command": ["sleep", "3600"], "volumeMounts": [
                                {"name": "cfg", "mountPath": "/cfg"}, {"name": "info", "mountPath": "/info"}]}],
            "volumes": [{"name": "cfg", "configMap": {"name": "live-cfg"}},
                        {"name": "info", "downwardAPI": {"items": [
                            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}]}},
    ]
    real_node.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests}))
    try:
        real_node.kubectl("wait", "--for=condition=Ready", "pod/live", "--timeout=60s", timeout=90)

        def read() -> str:
            script = "cat /cfg/greeting; echo; cat /info/labels"
            return real_node.kubectl("exec", "live", "--", "sh", "-c", script).stdout

        assert read() == 'hello\nstage="one"'
        real_node.kubectl("patch", "configmap", "live-cfg", "-p", '{"data":{"greeting":"bonjour"}}')
        # a change of the pod syncs it: its volumes are written again (the ConfigMap too, read afresh)
        real_node.kubectl("label", "pod", "live", "stage=two", "--overwrite")
        deadline = time.monotonic() + 30
        while (out := read()) != 'bonjour\nstage="two"':
            assert time.monotonic() < deadline, f"the container still reads {out!r}"
            time.sleep(0.3)
    finally:
        real_node.kubectl("delete", "pod", "live", "--wait=false", check=False)


def _pod_volume_state(node, uid: str) -> tuple[bool, list[str]]:
    import os

    pod_dir = os.path.join(node.data_dir, "pods", uid)
    with open("/proc/self/mounts") as f:
        mounts = [line.split()[1] for line in f if line.split()[1].startswith(pod_dir + "/")]
    return os.path.exists(os.path.join(pod_dir, "volumes")), mounts


def test_volumes_are_unmounted_before_a_deleted_pod_leaves_and_when_a_pod_ends(real_node):
    spec = {"containers": [{"name": "main", "image": BUSYBOX, "imagePullPolicy": "Never",
                            "command": ["sh", "-c", "exec sleep 60"],
                            "volumeMounts": [{"name": "mem", "mountPath": "/mem"}, {"name": "cfg", "mountPath": "/cfg"}]}],
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "mem", "emptyDir": {"medium": "Memory"}},
                        {"name": "cfg", "configMap": {"name": "unmount-cfg"}}]}
    once = json.loads(json.dumps(spec))
    once["restartPolicy"] = "Never"
    once["containers"][0]["command"] = ["true"]
    manifests = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "unmount-cfg"}, "data": {"a": "1"}},
                 {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "unmount"}, "spec": spec},
                 {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "unmount-once"}, "spec": once}]
    real_node.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests}))
    try:
        real_node.kubectl("wait", "--for=condition=Ready", "pod/unmount", "--timeout=90s")
        uid = json.loads(real_node.kubectl("get", "pod", "unmount", "-o", "json").stdout)["metadata"]["uid"]
        exists, mounts = _pod_volume_state(real_node, uid)
        assert exists and len(mounts) >= 2
        real_node.kubectl("delete", "pod", "unmount", "--wait=true", "--timeout=60s")
        # gone from the API: nothing of its volumes is left mounted
        assert _pod_volume_state(real_node, uid) == (False, [])
        # a pod that ended keeps its record, not its volumes
        real_node.kubectl("wait", "--for=jsonpath={.status.phase}=Succeeded", "pod/unmount-once", "--timeout=90s")
        uid = json.loads(real_node.kubectl("get", "pod", "unmount-once", "-o", "json").stdout)["metadata"]["uid"]
        deadline = time.monotonic() + 10
        while _pod_volume_state(real_node, uid) != (False, []):
            assert time.monotonic() < deadline, _pod_volume_state(real_node, uid)
            time.sleep(0.2)
    finally:
        real_node.kubectl("delete", "pod", "unmount", "unmount-once", "--wait=false", check=False)
        real_node.kubectl("delete", "configmap", "unmount-cfg", check=False)


def test_host_to_container_propagation_shows_a_later_host_mount_in_the_container(real_node):
    import os
    import subprocess

    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "propagated"}, "spec": {
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "main", "image": BUSYBOX, "imagePullPolicy": "Never", "command": ["sleep", "3600"],
                        "volumeMounts": [{"name": "shared", "mountPath": "/mnt", "mountPropagation": "HostToContainer"},
                                         {"name": "shared", "mountPath": "/private"}]}],
        "volumes": [{"name": "shared", "emptyDir": {}}]}}
    real_node.kubectl("apply", "-f", "-", input=json.dumps(body))
    sub = None
    try:
        real_node.kubectl("wait", "--for=condition=Ready", "pod/propagated", "--timeout=90s")
        uid = json.loads(real_node.kubectl("get", "pod", "propagated", "-o", "json").stdout)["metadata"]["uid"]
        sub = os.path.join(real_node.data_dir, "pods", uid, "volumes", "kubernetes.io~empty-dir", "shared", "sub")
        os.makedirs(sub)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "late", sub], check=True)
        mounts = real_node.kubectl("exec", "propagated", "--", "cat", "/proc/mounts").stdout
        assert "late /mnt/sub tmpfs" in mounts          # propagated from the host
        assert "/private/sub" not in mounts             # the other mount stays private
    finally:
        if sub is not None:
            subprocess.run(["umount", "-l", sub], capture_output=True)
        real_node.kubectl("delete", "pod", "propagated", "--wait=true", timeout=90, check=False)
