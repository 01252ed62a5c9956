"""Defaults of the served kinds, as upstream's defaulting functions
(pkg/apis/*/v1/defaults.go and the declarative +default markers) set them."""

import copy

import pytest

from kubeplane.api.resources import resource
from kubeplane.registry.strategies import image_pull_policy, strategy_for


def defaulted(kind, obj, group=None):
    obj = copy.deepcopy(obj)
    strategy_for(resource(kind, group)).default(obj)
    return obj


def container(**extra):
    return {"name": "c", "image": "nginx", **extra}


ENV = [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
       {"name": "KEEP", "valueFrom": {"fieldRef": {"apiVersion": "v2", "fieldPath": "x"}}},
       {"name": "PLAIN", "value": "1"}]


def pod_spec():
    return {
        "containers": [container(env=copy.deepcopy(ENV), ports=[{"containerPort": 80}],
                                 livenessProbe={"httpGet": {"port": 80}},
                                 readinessProbe={"grpc": {"port": 9}},
                                 lifecycle={"preStop": {"httpGet": {"port": 81, "path": "/stop"}}},
                                 resources={"limits": {"cpu": "1"}})],
        "initContainers": [container(name="init", image="busybox:1.36", env=copy.deepcopy(ENV),
                                     resources={"limits": {"memory": "1Gi"}})],
        "volumes": [
            {"name": "e"},
            {"name": "h", "hostPath": {"path": "/x"}},
            {"name": "s", "secret": {"secretName": "s"}},
            {"name": "cm", "configMap": {"name": "cm", "defaultMode": 256}},
            {"name": "d", "downwardAPI": {"items": [{"path": "n", "fieldRef": {"fieldPath": "metadata.name"}}]}},
            {"name": "p", "projected": {"sources": [
                {"serviceAccountToken": {"path": "t"}},
                {"downwardAPI": {"items": [{"path": "l", "fieldRef": {"fieldPath": "metadata.labels"}}]}}]}},
            {"name": "eph", "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}},
            {"name": "r", "rbd": {"monitors": ["m"], "image": "i"}},
        ],
    }


def check_pod_spec(spec, *, pod):
    assert spec["restartPolicy"] == "Always" and spec["dnsPolicy"] == "ClusterFirst"
    assert spec["schedulerName"] == "default-scheduler" and spec["securityContext"] == {}
    assert spec["terminationGracePeriodSeconds"] == 30
    for c in spec["containers"] + spec["initContainers"]:
        assert c["terminationMessagePath"] == "/dev/termination-log"
        assert c["terminationMessagePolicy"] == "File"
        env = {e["name"]: e for e in c["env"]}
        assert env["POD"]["valueFrom"]["fieldRef"] == {"apiVersion": "v1", "fieldPath": "metadata.name"}
        assert env["KEEP"]["valueFrom"]["fieldRef"]["apiVersion"] == "v2"
        assert env["PLAIN"] == {"name": "PLAIN", "value": "1"}
    c, init = spec["containers"][0], spec["initContainers"][0]
    assert c["imagePullPolicy"] == "Always" and init["imagePullPolicy"] == "IfNotPresent"
    assert c["ports"] == [{"containerPort": 80, "protocol": "TCP"}]
    assert c["livenessProbe"] == {"httpGet": {"port": 80, "path": "/", "scheme": "HTTP"}, "timeoutSeconds": 1,
                                  "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3}
    assert c["readinessProbe"]["grpc"] == {"port": 9, "service": ""}
    assert c["lifecycle"]["preStop"]["httpGet"] == {"port": 81, "path": "/stop", "scheme": "HTTP"}
    # Requests default to limits on a Pod only, never in a template.
    if pod:
        assert c["resources"]["requests"] == {"cpu": "1"} and init["resources"]["requests"] == {"memory": "1Gi"}
    else:
        assert "requests" not in c["resources"] and "requests" not in init["resources"]
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["e"] == {"name": "e", "emptyDir": {}}
    assert vols["h"]["hostPath"] == {"path": "/x", "type": ""}
    assert vols["s"]["secret"]["defaultMode"] == 420
    assert vols["cm"]["configMap"]["defaultMode"] == 256
    assert vols["d"]["downwardAPI"] == {"defaultMode": 420, "items": [
        {"path": "n", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}]}
    sources = vols["p"]["projected"]["sources"]
    assert vols["p"]["projected"]["defaultMode"] == 420
    assert sources[0]["serviceAccountToken"] == {"path": "t", "expirationSeconds": 3600}
    assert sources[1]["downwardAPI"]["items"][0]["fieldRef"]["apiVersion"] == "v1"
    assert vols["eph"]["ephemeral"]["volumeClaimTemplate"]["spec"]["volumeMode"] == "Filesystem"
    assert vols["r"]["rbd"] == {"monitors": ["m"], "image": "i", "pool": "rbd", "user": "admin",
                                "keyring": "/etc/ceph/keyring"}


def test_pod_defaults():
    pod = defaulted("Pod", {"metadata": {"name": "p"}, "spec": pod_spec()})
    check_pod_spec(pod["spec"], pod=True)
    assert pod["spec"]["enableServiceLinks"] is True


@pytest.mark.parametrize("kind,group", [("Deployment", "apps"), ("ReplicaSet", "apps"), ("Job", "batch")])
def test_pod_template_defaults(kind, group):
    obj = defaulted(kind, {"metadata": {"name": "x"}, "spec": {"template": {"spec": pod_spec()}}}, group)
    check_pod_spec(obj["spec"]["template"]["spec"], pod=False)
    assert "enableServiceLinks" not in obj["spec"]["template"]["spec"]


def test_host_network_pods_default_host_ports():
    pod = defaulted("Pod", {"spec": {"hostNetwork": True, "containers": [container(ports=[{"containerPort": 8080}])]}})
    assert pod["spec"]["containers"][0]["ports"] == [{"containerPort": 8080, "hostPort": 8080, "protocol": "TCP"}]


@pytest.mark.parametrize("image,policy", [
    ("nginx", "Always"), ("nginx:latest", "Always"), ("nginx:1.25", "IfNotPresent"),
    ("registry:5000/team/app", "Always"), ("registry:5000/team/app:v1", "IfNotPresent"),
    ("nginx@sha256:" + "a" * 64, "IfNotPresent"), ("nginx:latest@sha256:" + "a" * 64, "Always"),
])
def test_image_pull_policy_by_tag(image, policy):
    assert image_pull_policy(image) == policy


def test_deployment_and_replicaset_defaults():
    d = defaulted("Deployment", {"spec": {"template": {"spec": {"containers": [container()]}}}}, "apps")
    spec = d["spec"]
    assert spec["replicas"] == 1 and spec["revisionHistoryLimit"] == 10 and spec["progressDeadlineSeconds"] == 600
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}}
    d = defaulted("Deployment", {"spec": {"strategy": {"type": "Recreate"}}}, "apps")
    assert d["spec"]["strategy"] == {"type": "Recreate"}
    rs = defaulted("ReplicaSet", {"spec": {}}, "apps")
    assert rs["spec"]["replicas"] == 1


def test_job_defaults():
    job = defaulted("Job", {"metadata": {"name": "j"},
                            "spec": {"template": {"metadata": {"labels": {"app": "j"}}, "spec": {}}}}, "batch")
    spec = job["spec"]
    assert (spec["completions"], spec["parallelism"], spec["backoffLimit"]) == (1, 1, 6)
    assert spec["completionMode"] == "NonIndexed" and spec["suspend"] is False
    assert spec["podReplacementPolicy"] == "TerminatingOrFailed"
    assert job["metadata"]["labels"] == {"app": "j"}
    # A parallel job with completions unset stays a work queue.
    job = defaulted("Job", {"spec": {"parallelism": 3, "backoffLimitPerIndex": 1, "completionMode": "Indexed",
                                     "podFailurePolicy": {"rules": [{"action": "Ignore", "onPodConditions": [
                                         {"type": "DisruptionTarget"}]}]}}}, "batch")
    spec = job["spec"]
    assert "completions" not in spec and spec["parallelism"] == 3
    assert spec["backoffLimit"] == 2147483647
    assert spec["podFailurePolicy"]["rules"][0]["onPodConditions"] == [{"type": "DisruptionTarget", "status": "True"}]
    assert spec["podReplacementPolicy"] == "Failed"


def test_service_defaults():
    svc = defaulted("Service", {"spec": {"ports": [{"port": 80}, {"port": 81, "targetPort": "http"}],
                                         "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 5}}}})
    spec = svc["spec"]
    assert spec["type"] == "ClusterIP" and spec["sessionAffinity"] == "None"
    assert "sessionAffinityConfig" not in spec and "externalTrafficPolicy" not in spec
    assert spec["internalTrafficPolicy"] == "Cluster"
    assert spec["ports"] == [{"port": 80, "protocol": "TCP", "targetPort": 80},
                             {"port": 81, "protocol": "TCP", "targetPort": "http"}]
    lb = defaulted("Service", {"spec": {"type": "LoadBalancer", "sessionAffinity": "ClientIP",
                                        "ports": [{"port": 80}]}})["spec"]
    assert lb["externalTrafficPolicy"] == "Cluster" and lb["allocateLoadBalancerNodePorts"] is True
    assert lb["sessionAffinityConfig"] == {"clientIP": {"timeoutSeconds": 10800}}
    ext = defaulted("Service", {"spec": {"type": "ExternalName", "externalName": "example.com"}})["spec"]
    assert "internalTrafficPolicy" not in ext


def test_volume_and_node_defaults():
    pv = defaulted("PersistentVolume", {"spec": {"hostPath": {"path": "/d"}, "capacity": {"storage": "1Gi"}}})
    assert pv["spec"]["hostPath"] == {"path": "/d", "type": ""}
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain" and pv["spec"]["volumeMode"] == "Filesystem"
    pvc = defaulted("PersistentVolumeClaim", {"spec": {}})
    assert pvc["spec"]["volumeMode"] == "Filesystem"
    node = defaulted("Node", {"status": {"capacity": {"cpu": "4", "pods": "110"}}})
    assert node["status"]["allocatable"] == {"cpu": "4", "pods": "110"}
    node = defaulted("Node", {"status": {"capacity": {"cpu": "4"}, "allocatable": {"cpu": "3"}}})
    assert node["status"]["allocatable"] == {"cpu": "3"}


async def test_job_selector_and_labels_are_generated_from_name_and_uid():
    from kubeplane.api.resources import CATALOGUE
    from kubeplane.apiserver.app import ensure_default_namespaces
    from kubeplane.registry.registry import Registry
    from kubeplane.storage.memory import MemoryStore

    store = MemoryStore(history=50)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    try:
        job = await registry.create(resource("Job", "batch"), {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "pi"},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                                           "containers": [container()]}}}}, "default")
        uid = job["metadata"]["uid"]
        generated = {"job-name": "pi", "batch.kubernetes.io/job-name": "pi",
                     "controller-uid": uid, "batch.kubernetes.io/controller-uid": uid}
        assert job["spec"]["template"]["metadata"]["labels"] == generated
        assert job["spec"]["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
        assert job["metadata"]["labels"] == generated
        manual = await registry.create(resource("Job", "batch"), {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "m"},
            "spec": {"manualSelector": True, "selector": {"matchLabels": {"app": "m"}},
                     "template": {"metadata": {"labels": {"app": "m"}},
                                  "spec": {"restartPolicy": "Never", "containers": [container()]}}}}, "default")
        assert manual["spec"]["selector"] == {"matchLabels": {"app": "m"}}
        assert manual["spec"]["template"]["metadata"]["labels"] == {"app": "m"}
    finally:
        await registry.close()
        await store.close()


def test_dynamic_resource_defaults():
    claim = defaulted("ResourceClaim", {"spec": {"devices": {"requests": [
        {"name": "a", "exactly": {"deviceClassName": "c", "count": 0, "tolerations": [{"key": "k"}]}},
        {"name": "b", "firstAvailable": [{"name": "s", "deviceClassName": "c", "allocationMode": "All"}]},
    ]}}}, "resource.k8s.io")
    a, b = claim["spec"]["devices"]["requests"]
    assert a["exactly"] == {"deviceClassName": "c", "allocationMode": "ExactCount", "count": 1,
                            "tolerations": [{"key": "k", "operator": "Equal"}]}
    assert b["firstAvailable"][0] == {"name": "s", "deviceClassName": "c", "allocationMode": "All"}
    s = defaulted("ResourceSlice", {"spec": {"devices": [
        {"name": "d0", "taints": [{"key": "k", "effect": "NoSchedule"},
                                  {"key": "j", "effect": "NoSchedule", "timeAdded": "2026-01-01T00:00:00Z"}]}]}},
                  "resource.k8s.io")
    taints = s["spec"]["devices"][0]["taints"]
    assert taints[0]["timeAdded"].endswith("Z") and taints[1]["timeAdded"] == "2026-01-01T00:00:00Z"
