import datetime as dt

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import resource
from kubeplane.apiserver.tables import (
    access_modes,
    build_table,
    column_definitions,
    format_label_selector,
    human_duration,
    resource_claim_state,
    selector_string,
)

NOW = dt.datetime(2026, 11, 29, 12, 0, 0, tzinfo=dt.timezone.utc)


def ago(**kw) -> str:
    return (NOW - dt.timedelta(**kw)).strftime("%Y-%m-%dT%H:%M:%SZ")


def meta(name: str, namespace: str | None = "default", age: dt.timedelta = dt.timedelta(minutes=5), **extra):
    md = {"name": name, "uid": f"uid-{name}", "resourceVersion": "42",
          "creationTimestamp": (NOW - age).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if namespace:
        md["namespace"] = namespace
    md.update(extra)
    return md


def cells(res: str, obj: dict) -> list:
    table = build_table(resource(res), [obj], now=NOW)
    return table["rows"][0]["cells"]


def headers(res: str, wide: bool = False) -> list[str]:
    return [c["name"].upper() for c in column_definitions(resource(res)) if wide or c["priority"] == 0]


def wide_headers(res: str) -> list[str]:
    return [c["name"].upper() for c in column_definitions(resource(res)) if c["priority"] == 1]


# --------------------------------------------------------------------------- HumanDuration


@pytest.mark.parametrize(
    ("delta", "expected"),
    [
        (dt.timedelta(seconds=-5), "<invalid>"),
        (dt.timedelta(seconds=-1.5), "0s"),
        (dt.timedelta(0), "0s"),
        (dt.timedelta(seconds=45), "45s"),
        (dt.timedelta(seconds=119), "119s"),
        (dt.timedelta(minutes=2), "2m"),
        (dt.timedelta(minutes=5, seconds=30), "5m30s"),
        (dt.timedelta(minutes=9, seconds=59), "9m59s"),
        (dt.timedelta(minutes=10, seconds=30), "10m"),
        (dt.timedelta(minutes=179), "179m"),
        (dt.timedelta(hours=3), "3h"),
        (dt.timedelta(hours=3, minutes=25), "3h25m"),
        (dt.timedelta(hours=8, minutes=25), "8h"),
        (dt.timedelta(hours=47), "47h"),
        (dt.timedelta(days=2), "2d"),
        (dt.timedelta(days=3, hours=5), "3d5h"),
        (dt.timedelta(days=8, hours=5), "8d"),
        (dt.timedelta(days=729), "729d"),
        (dt.timedelta(days=730), "2y"),
        (dt.timedelta(days=800), "2y70d"),
        (dt.timedelta(days=365 * 9), "9y"),
    ],
)
def test_human_duration(delta, expected):
    assert human_duration(delta) == expected


# --------------------------------------------------------------------------- pods


def running_pod() -> dict:
    return {
        "metadata": meta("web", labels={"app": "web"}),
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "nginx"}]},
        "status": {
            "phase": "Running",
            "podIP": "10.244.0.5",
            "podIPs": [{"ip": "10.244.0.5"}],
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{
                "name": "c", "ready": True, "restartCount": 0,
                "state": {"running": {"startedAt": ago(minutes=4)}},
            }],
        },
    }


def test_pod_columns_and_priorities():
    assert headers("pods") == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert wide_headers("pods") == ["IP", "NODE", "NOMINATED NODE", "READINESS GATES"]
    defs = column_definitions(resource("pods"))
    assert defs[0]["format"] == "name"
    assert all(d["format"] == "" for d in defs[1:])


def test_pod_running():
    assert cells("pods", running_pod()) == [
        "web", "1/1", "Running", "0", "5m", "10.244.0.5", "node-1", "<none>", "<none>",
    ]


def test_pod_pending_unscheduled():
    pod = {
        "metadata": meta("pending", age=dt.timedelta(seconds=45)),
        "spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]},
        "status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]},
    }
    assert cells("pods", pod) == ["pending", "0/2", "Pending", "0", "45s", "<none>", "<none>", "<none>", "<none>"]


def test_pod_scheduling_gated_and_nominated():
    pod = {
        "metadata": meta("gated"),
        "spec": {"containers": [{"name": "a", "image": "x"}], "schedulingGates": [{"name": "g"}]},
        "status": {"phase": "Pending", "nominatedNodeName": "node-2", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]},
    }
    row = cells("pods", pod)
    assert row[2] == "SchedulingGated"
    assert row[7] == "node-2"


def test_pod_container_creating():
    pod = {
        "metadata": meta("new"),
        "spec": {"nodeName": "node-1", "containers": [{"name": "a", "image": "x"}]},
        "status": {"phase": "Pending", "containerStatuses": [
            {"name": "a", "ready": False, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}]},
    }
    assert cells("pods", pod)[:3] == ["new", "0/1", "ContainerCreating"]


def test_pod_terminating():
    pod = running_pod()
    pod["metadata"]["deletionTimestamp"] = ago(seconds=3)
    assert cells("pods", pod)[2] == "Terminating"
    pod["status"]["phase"] = "Succeeded"
    pod["status"]["containerStatuses"][0]["state"] = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    assert cells("pods", pod)[2] == "Completed"


def test_pod_node_lost_is_unknown():
    pod = running_pod()
    pod["metadata"]["deletionTimestamp"] = ago(seconds=3)
    pod["status"]["reason"] = "NodeLost"
    assert cells("pods", pod)[2] == "Unknown"


def test_pod_restarts_with_last_restart_age():
    pod = running_pod()
    pod["status"]["containerStatuses"][0].update(
        restartCount=3, lastState={"terminated": {"exitCode": 1, "finishedAt": ago(minutes=2, seconds=10)}})
    assert cells("pods", pod)[3] == "3 (2m10s ago)"
    del pod["status"]["containerStatuses"][0]["lastState"]
    assert cells("pods", pod)[3] == "3"


def test_pod_crashloop_and_exit_codes():
    pod = running_pod()
    pod["status"]["containerStatuses"][0].update(
        ready=False, state={"waiting": {"reason": "CrashLoopBackOff"}})
    assert cells("pods", pod)[1:3] == ["0/1", "CrashLoopBackOff"]
    pod["status"]["containerStatuses"][0]["state"] = {"terminated": {"exitCode": 137}}
    assert cells("pods", pod)[2] == "ExitCode:137"
    pod["status"]["containerStatuses"][0]["state"] = {"terminated": {"exitCode": 0, "signal": 9}}
    assert cells("pods", pod)[2] == "Signal:9"


def test_pod_init_containers():
    pod = {
        "metadata": meta("init"),
        "spec": {
            "initContainers": [{"name": "i1", "image": "x"}, {"name": "i2", "image": "x"}],
            "containers": [{"name": "c", "image": "x"}],
        },
        "status": {"phase": "Pending", "initContainerStatuses": [
            {"name": "i1", "restartCount": 0, "state": {"terminated": {"exitCode": 0}}},
            {"name": "i2", "restartCount": 0, "state": {"running": {}}},
        ]},
    }
    assert cells("pods", pod)[1:3] == ["0/1", "Init:1/2"]
    pod["status"]["initContainerStatuses"][1]["state"] = {"waiting": {"reason": "ImagePullBackOff"}}
    assert cells("pods", pod)[2] == "Init:ImagePullBackOff"
    pod["status"]["initContainerStatuses"][1]["state"] = {"terminated": {"exitCode": 2, "reason": "Error"}}
    assert cells("pods", pod)[2] == "Init:Error"


def test_pod_sidecar_counts_in_total():
    pod = running_pod()
    pod["spec"]["initContainers"] = [{"name": "side", "image": "x", "restartPolicy": "Always"}]
    pod["status"]["conditions"].append({"type": "Initialized", "status": "True"})
    pod["status"]["initContainerStatuses"] = [
        {"name": "side", "ready": True, "started": True, "restartCount": 1, "state": {"running": {}}}]
    assert cells("pods", pod)[1:4] == ["2/2", "Running", "1"]


def test_pod_readiness_gates():
    pod = running_pod()
    pod["spec"]["readinessGates"] = [{"conditionType": "a"}, {"conditionType": "b"}]
    pod["status"]["conditions"] += [{"type": "a", "status": "True"}, {"type": "b", "status": "False"}]
    assert cells("pods", pod)[8] == "1/2"


def test_pod_completed_row_condition():
    pod = running_pod()
    pod["status"]["phase"] = "Succeeded"
    pod["status"]["containerStatuses"][0].update(
        ready=False, state={"terminated": {"exitCode": 0, "reason": "Completed"}})
    row = build_table(resource("pods"), [pod], now=NOW)["rows"][0]
    assert row["cells"][1:3] == ["0/1", "Completed"]
    assert row["conditions"] == [{"type": "Completed", "status": "True", "reason": "Succeeded",
                                  "message": "The pod has completed successfully."}]


# --------------------------------------------------------------------------- nodes


def node(**status_extra) -> dict:
    status = {
        "conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "True"}],
        "addresses": [{"type": "InternalIP", "address": "172.18.0.2"}, {"type": "Hostname", "address": "cp"}],
        "nodeInfo": {"kubeletVersion": "v1.32.0", "osImage": "Debian GNU/Linux 12 (bookworm)",
                     "kernelVersion": "6.1.0", "containerRuntimeVersion": "containerd://1.7.24"},
    }
    status.update(status_extra)
    return {
        "metadata": meta("cp", namespace=None, age=dt.timedelta(days=3, hours=5),
                         labels={"node-role.kubernetes.io/control-plane": "", "kubernetes.io/hostname": "cp"}),
        "spec": {},
        "status": status,
    }


def test_node_ready_control_plane():
    assert headers("nodes") == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert wide_headers("nodes") == ["INTERNAL-IP", "EXTERNAL-IP", "OS-IMAGE", "KERNEL-VERSION", "CONTAINER-RUNTIME"]
    assert cells("nodes", node()) == [
        "cp", "Ready", "control-plane", "3d5h", "v1.32.0", "172.18.0.2", "<none>",
        "Debian GNU/Linux 12 (bookworm)", "6.1.0", "containerd://1.7.24",
    ]


def test_node_status_variants_and_roles():
    n = node(conditions=[{"type": "Ready", "status": "Unknown"}])
    n["spec"]["unschedulable"] = True
    n["metadata"]["labels"] = {"node-role.kubernetes.io/worker": "", "kubernetes.io/role": "infra",
                               "node-role.kubernetes.io/": ""}
    row = cells("nodes", n)
    assert row[1:3] == ["NotReady,SchedulingDisabled", "infra,worker"]
    n = node(conditions=[], nodeInfo={})
    n["metadata"]["labels"] = {}
    row = cells("nodes", n)
    assert row[1:3] == ["Unknown", "<none>"]
    assert row[7:] == ["<unknown>", "<unknown>", "<unknown>"]


# --------------------------------------------------------------------------- storage


def test_pv_bound():
    pv = {
        "metadata": meta("pv-1", namespace=None, age=dt.timedelta(hours=2)),
        "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteMany", "ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "standard",
                 "claimRef": {"namespace": "default", "name": "data"}, "volumeMode": "Filesystem"},
        "status": {"phase": "Bound"},
    }
    assert headers("pv") == ["NAME", "CAPACITY", "ACCESS MODES", "RECLAIM POLICY", "STATUS", "CLAIM",
                             "STORAGECLASS", "VOLUMEATTRIBUTESCLASS", "REASON", "AGE"]
    assert wide_headers("pv") == ["VOLUMEMODE"]
    assert cells("pv", pv) == ["pv-1", "10Gi", "RWO,RWX", "Retain", "Bound", "default/data", "standard",
                               "<unset>", "", "120m", "Filesystem"]
    pv["metadata"]["deletionTimestamp"] = ago(seconds=1)
    pv["metadata"]["annotations"] = {"volume.beta.kubernetes.io/storage-class": "beta"}
    assert cells("pv", pv)[4:7] == ["Terminating", "default/data", "beta"]


def test_pvc_pending_and_bound():
    pvc = {
        "metadata": meta("data", age=dt.timedelta(seconds=30)),
        "spec": {"accessModes": ["ReadWriteOncePod"], "storageClassName": "local",
                 "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Pending"},
    }
    assert headers("pvc") == ["NAME", "STATUS", "VOLUME", "CAPACITY", "ACCESS MODES", "STORAGECLASS",
                              "VOLUMEATTRIBUTESCLASS", "AGE"]
    assert cells("pvc", pvc) == ["data", "Pending", "", "", "", "local", "<unset>", "30s", "<unset>"]
    pvc["spec"].update(volumeName="pv-1", volumeMode="Block")
    pvc["status"] = {"phase": "Bound", "capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOncePod"]}
    assert cells("pvc", pvc) == ["data", "Bound", "pv-1", "2Gi", "RWOP", "local", "<unset>", "30s", "Block"]


def test_access_modes_order_and_dedup():
    assert access_modes(["ReadWriteOncePod", "ReadOnlyMany", "ReadWriteOnce", "ReadWriteOnce"]) == "RWO,ROX,RWOP"
    assert access_modes(None) == ""


def test_storage_class_default_marker():
    sc = {"metadata": meta("standard", namespace=None,
                           annotations={"storageclass.kubernetes.io/is-default-class": "true"}),
          "provisioner": "rancher.io/local-path", "volumeBindingMode": "WaitForFirstConsumer"}
    assert headers("sc") == ["NAME", "PROVISIONER", "RECLAIMPOLICY", "VOLUMEBINDINGMODE", "ALLOWVOLUMEEXPANSION", "AGE"]
    assert cells("sc", sc) == ["standard (default)", "rancher.io/local-path", "Delete", "WaitForFirstConsumer",
                               False, "5m"]
    sc["metadata"]["annotations"] = {}
    sc.update(reclaimPolicy="Retain", allowVolumeExpansion=True)
    del sc["volumeBindingMode"]
    assert cells("sc", sc) == ["standard", "rancher.io/local-path", "Retain", "Immediate", True, "5m"]


def test_csinode_and_capacity():
    csinode = {"metadata": meta("n1", namespace=None), "spec": {"drivers": [{"name": "a"}, {"name": "b"}]}}
    assert headers("csinodes") == ["NAME", "DRIVERS", "AGE"]
    assert cells("csinodes", csinode) == ["n1", 2, "5m"]
    cap = {"metadata": meta("cap"), "storageClassName": "fast", "capacity": "100Gi"}
    assert cells("csistoragecapacities", cap) == ["cap", "fast", "100Gi"]
    del cap["capacity"]
    assert cells("csistoragecapacities", cap) == ["cap", "fast", "<unset>"]


# --------------------------------------------------------------------------- workloads


def template(*containers: tuple[str, str]) -> dict:
    return {"metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": n, "image": i} for n, i in containers]}}


def test_deployment_two_of_three():
    d = {
        "metadata": meta("web", age=dt.timedelta(minutes=15)),
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web", "tier": "fe"}},
                 "template": template(("nginx", "nginx:1.27"), ("side", "busybox"))},
        "status": {"replicas": 3, "readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2},
    }
    assert headers("deploy") == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
    assert wide_headers("deploy") == ["CONTAINERS", "IMAGES", "SELECTOR"]
    assert cells("deploy", d) == ["web", "2/3", 3, 2, "15m", "nginx,side", "nginx:1.27,busybox", "app=web,tier=fe"]
    d["status"] = {}
    del d["spec"]["replicas"]
    assert cells("deploy", d)[1:4] == ["0/1", 0, 0]


def test_replicaset():
    rs = {
        "metadata": meta("web-5d4f", age=dt.timedelta(minutes=15)),
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web", "pod-template-hash": "5d4f"}},
                 "template": template(("nginx", "nginx:1.27"))},
        "status": {"replicas": 3, "readyReplicas": 1},
    }
    assert headers("rs") == ["NAME", "DESIRED", "CURRENT", "READY", "AGE"]
    assert cells("rs", rs) == ["web-5d4f", 3, 3, 1, "15m", "nginx", "nginx:1.27", "app=web,pod-template-hash=5d4f"]
    rs["spec"]["selector"] = {}
    assert cells("rs", rs)[7] == "<none>"


def test_selector_expressions():
    sel = {"matchLabels": {"z": "1"}, "matchExpressions": [
        {"key": "env", "operator": "In", "values": ["prod", "dev", "prod"]},
        {"key": "tier", "operator": "NotIn", "values": ["db"]},
        {"key": "a", "operator": "Exists"},
        {"key": "gone", "operator": "DoesNotExist"},
    ]}
    assert selector_string(sel) == "a,env in (dev,prod),!gone,tier notin (db),z=1"
    assert format_label_selector(None) == "<none>"
    assert selector_string({"matchExpressions": [{"key": "k", "operator": "Bogus"}]}) == "<error>"


def test_job_states():
    job = {
        "metadata": meta("pi", age=dt.timedelta(minutes=3)),
        "spec": {"completions": 1, "parallelism": 1, "selector": {"matchLabels": {"job-name": "pi"}},
                 "template": template(("pi", "perl"))},
        "status": {"startTime": ago(minutes=3), "active": 1},
    }
    assert headers("jobs") == ["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"]
    assert cells("jobs", job) == ["pi", "Running", "0/1", "3m", "3m", "pi", "perl", "job-name=pi"]
    job["status"].update(succeeded=1, completionTime=ago(minutes=2, seconds=15),
                         conditions=[{"type": "Complete", "status": "True"}])
    assert cells("jobs", job)[1:4] == ["Complete", "1/1", "45s"]
    job["spec"].pop("completions")
    job["spec"]["parallelism"] = 3
    job["status"] = {"conditions": [{"type": "Failed", "status": "True"}]}
    assert cells("jobs", job)[1:4] == ["Failed", "0/1 of 3", ""]
    # the interim conditions, before the final one, as upstream's printer orders them
    for conds, state in (([{"type": "SuccessCriteriaMet", "status": "True"}], "SuccessCriteriaMet"),
                         ([{"type": "SuccessCriteriaMet", "status": "True"},
                           {"type": "FailureTarget", "status": "True"}], "FailureTarget"),
                         ([{"type": "Suspended", "status": "True"},
                           {"type": "FailureTarget", "status": "True"}], "Suspended"),
                         ([{"type": "Suspended", "status": "False"}], "Running")):
        job["status"] = {"conditions": conds}
        assert cells("jobs", job)[1] == state


def test_pdb_and_priorityclass():
    pdb = {"metadata": meta("pdb"), "spec": {"minAvailable": "50%"}, "status": {"disruptionsAllowed": 1}}
    assert headers("pdb") == ["NAME", "MIN AVAILABLE", "MAX UNAVAILABLE", "ALLOWED DISRUPTIONS", "AGE"]
    assert cells("pdb", pdb) == ["pdb", "50%", "N/A", 1, "5m"]
    pdb["spec"] = {"maxUnavailable": 1}
    assert cells("pdb", pdb)[1:3] == ["N/A", "1"]
    pc = {"metadata": meta("high", namespace=None), "value": 1000000, "globalDefault": True,
          "preemptionPolicy": "PreemptLowerPriority"}
    assert headers("pc") == ["NAME", "VALUE", "GLOBAL-DEFAULT", "AGE", "PREEMPTIONPOLICY"]
    assert cells("pc", pc) == ["high", 1000000, True, "5m", "PreemptLowerPriority"]


# --------------------------------------------------------------------------- core misc


def test_event():
    ev = {
        "metadata": meta("web.17f3", age=dt.timedelta(minutes=10)),
        "involvedObject": {"kind": "Pod", "name": "web", "namespace": "default",
                           "fieldPath": "spec.containers{c}"},
        "reason": "Pulled", "message": "Successfully pulled image\n", "type": "Normal",
        "source": {"component": "kubelet", "host": "node-1"},
        "firstTimestamp": ago(minutes=10), "lastTimestamp": ago(seconds=30), "count": 4,
    }
    assert headers("events") == ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert wide_headers("events") == ["SUBOBJECT", "SOURCE", "FIRST SEEN", "COUNT", "NAME"]
    name_col = [c for c in column_definitions(resource("events")) if c["name"] == "Name"][0]
    assert name_col["format"] == "name" and name_col["priority"] == 1
    assert cells("events", ev) == ["30s", "Normal", "Pulled", "pod/web", "spec.containers{c}",
                                   "kubelet, node-1", "Successfully pulled image", "10m", 4, "web.17f3"]


def test_event_new_style_fields():
    ev = {
        "metadata": meta("sched.1"),
        "involvedObject": {"kind": "Pod", "name": "web"},
        "reason": "Scheduled", "message": "ok", "type": "Normal",
        "eventTime": "2026-11-29T11:57:59.500000Z", "reportingComponent": "default-scheduler",
        "reportingInstance": "", "series": None,
    }
    row = cells("events", ev)
    assert row[0] == "2m" and row[7] == "2m"
    assert row[5] == "default-scheduler"
    assert row[8] == 1
    ev["series"] = {"count": 7, "lastObservedTime": "2026-11-29T11:59:50.000000Z"}
    row = cells("events", ev)
    assert row[0] == "10s" and row[8] == 7
    ev.pop("eventTime")
    ev.pop("series")
    assert cells("events", ev)[0] == "<unknown>"


def test_namespace_configmap_secret_lease():
    ns = {"metadata": meta("kube-system", namespace=None), "status": {"phase": "Active"}}
    assert cells("ns", ns) == ["kube-system", "Active", "5m"]
    cm = {"metadata": meta("cfg"), "data": {"a": "1", "b": "2"}, "binaryData": {"c": "AA=="}}
    assert headers("cm") == ["NAME", "DATA", "AGE"]
    assert cells("cm", cm) == ["cfg", 3, "5m"]
    sec = {"metadata": meta("tls"), "type": "kubernetes.io/tls", "data": {"tls.crt": "", "tls.key": ""}}
    assert headers("secrets") == ["NAME", "TYPE", "DATA", "AGE"]
    assert cells("secrets", sec) == ["tls", "kubernetes.io/tls", 2, "5m"]
    lease = {"metadata": meta("node-1", namespace="kube-node-lease"), "spec": {"holderIdentity": "node-1"}}
    assert headers("leases") == ["NAME", "HOLDER", "AGE"]
    assert cells("leases", lease) == ["node-1", "node-1", "5m"]
    lease["spec"] = {}
    assert cells("leases", lease)[1] == ""


def test_services():
    svc = {
        "metadata": meta("web"),
        "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
                 "ports": [{"port": 80, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}],
                 "selector": {"app": "web"}},
    }
    assert headers("svc") == ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"]
    assert cells("svc", svc) == ["web", "ClusterIP", "10.96.0.10", "<none>", "80/TCP,53/UDP", "5m", "app=web"]
    svc["spec"].update(type="NodePort", ports=[{"port": 80, "nodePort": 30080}])
    svc["spec"].pop("selector")
    assert cells("svc", svc)[1:] == ["NodePort", "10.96.0.10", "<none>", "80:30080/TCP", "5m", "<none>"]
    svc["spec"]["type"] = "LoadBalancer"
    assert cells("svc", svc)[3] == "<pending>"
    svc["status"] = {"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}, {"hostname": "lb.example.com"}]}}
    svc["spec"]["externalIPs"] = ["5.6.7.8"]
    assert cells("svc", svc)[3] == "1.2.3.4,lb.example.com,5.6.7.8"
    ext = {"metadata": meta("ext"), "spec": {"type": "ExternalName", "externalName": "db.example.com"}}
    assert cells("svc", ext)[1:5] == ["ExternalName", "<none>", "db.example.com", "<none>"]


# --------------------------------------------------------------------------- resource.k8s.io


def test_resource_claims():
    claim = {"metadata": meta("gpu"), "spec": {}, "status": {}}
    assert headers("resourceclaims") == ["NAME", "STATE", "AGE"]
    assert cells("resourceclaims", claim) == ["gpu", "pending", "5m"]
    claim["status"] = {"allocation": {"devices": {"results": []}},
                       "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]}
    assert resource_claim_state(claim) == "allocated,reserved"
    claim["metadata"]["deletionTimestamp"] = ago(seconds=1)
    claim["status"].pop("reservedFor")
    assert resource_claim_state(claim) == "deleted,allocated"
    claim["status"] = {}
    assert resource_claim_state(claim) == "deleted"


def test_resource_slices_classes_templates():
    rs = {"metadata": meta("node-1-gpu", namespace=None),
          "spec": {"nodeName": "node-1", "driver": "gpu.example.com", "pool": {"name": "node-1"}}}
    assert headers("resourceslices") == ["NAME", "NODE", "DRIVER", "POOL", "AGE"]
    assert cells("resourceslices", rs) == ["node-1-gpu", "node-1", "gpu.example.com", "node-1", "5m"]
    assert headers("deviceclasses") == ["NAME", "AGE"]
    assert cells("deviceclasses", {"metadata": meta("gpu", namespace=None)}) == ["gpu", "5m"]
    assert cells("resourceclaimtemplates", {"metadata": meta("t")}) == ["t", "5m"]


# --------------------------------------------------------------------------- table envelope


def test_table_envelope_metadata_rows():
    pod = running_pod()
    table = build_table(resource("pods"), [pod, pod], now=NOW,
                        list_metadata={"resourceVersion": "100", "continue": ""})
    assert table["kind"] == "Table" and table["apiVersion"] == "meta.k8s.io/v1"
    assert table["metadata"] == {"resourceVersion": "100"}
    assert len(table["rows"]) == 2
    obj = table["rows"][0]["object"]
    assert obj["kind"] == "PartialObjectMetadata" and obj["apiVersion"] == "meta.k8s.io/v1"
    assert obj["metadata"]["labels"] == {"app": "web"}
    assert obj["metadata"]["namespace"] == "default"
    assert "spec" not in obj
    assert "conditions" not in table["rows"][0]
    assert set(table["columnDefinitions"][0]) == {"name", "type", "format", "description", "priority"}
    # the input is not mutated by the embedded copy
    obj["metadata"]["labels"]["x"] = "y"
    assert pod["metadata"]["labels"] == {"app": "web"}


def test_table_single_object_and_continue():
    pod = running_pod()
    assert build_table(resource("pods"), [pod], now=NOW)["metadata"] == {"resourceVersion": "42"}
    table = build_table(resource("pods"), [], now=NOW,
                        list_metadata={"resourceVersion": "7", "continue": "tok", "remainingItemCount": 3})
    assert table["metadata"] == {"resourceVersion": "7", "continue": "tok", "remainingItemCount": 3}
    assert table["rows"] == []


def test_include_object_modes():
    pod = running_pod()
    full = build_table(resource("pods"), [pod], now=NOW, include_object="Object")["rows"][0]["object"]
    assert full["kind"] == "Pod" and full["apiVersion"] == "v1"
    assert full["spec"]["nodeName"] == "node-1"
    assert "kind" not in pod
    none = build_table(resource("pods"), [pod], now=NOW, include_object="None")["rows"][0]
    assert "object" not in none
    default = build_table(resource("pods"), [pod], now=NOW, include_object="")["rows"][0]
    assert default["object"]["kind"] == "PartialObjectMetadata"
    beta = build_table(resource("pods"), [pod], now=NOW, api_version="meta.k8s.io/v1beta1")
    assert beta["apiVersion"] == "meta.k8s.io/v1beta1"
    assert beta["rows"][0]["object"]["apiVersion"] == "meta.k8s.io/v1beta1"
    with pytest.raises(StatusError) as exc:
        build_table(resource("pods"), [pod], now=NOW, include_object="Everything")
    assert exc.value.code == 400


def test_every_catalogue_resource_renders_consistent_rows():
    from kubeplane.api.resources import RESOURCES

    for res in RESOURCES:
        obj = {"metadata": meta("x", namespace="default" if res.namespaced else None)}
        table = build_table(res, [obj], now=NOW)
        assert len(table["rows"][0]["cells"]) == len(table["columnDefinitions"]), res.plural
        names = [c for c in table["columnDefinitions"] if c["format"] == "name"]
        assert len(names) == 1, res.plural


def test_missing_creation_timestamp_is_unknown_and_naive_now_accepted():
    obj = {"metadata": {"name": "x"}, "data": {}}
    table = build_table(resource("cm"), [obj], now=NOW.replace(tzinfo=None))
    assert table["rows"][0]["cells"] == ["x", 0, "<unknown>"]
