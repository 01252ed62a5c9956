"""ResourceQuotas, LimitRanges and pod priority with real kubectl against the
shared ``kubeplane up`` cluster: the quota controller keeps status.used, the
admission refuses with upstream's ``exceeded quota`` 403, LimitRange defaults
and bounds apply, priorities come from PriorityClasses."""

from __future__ import annotations

import json
import re

import pytest

from conftest import Kubectl
from helpers import eventually_sync

NS = "quota-it"
NS2 = "quota-it-priority"
PC = "quota-it-high"


def used(kubectl: Kubectl, name: str) -> dict:
    out = kubectl("get", "quota", name, "-n", NS, "-o", "json").out
    return (json.loads(out).get("status") or {}).get("used") or {}


def pod_yaml(name: str, cpu: str | None = None, memory: str | None = None, priority_class: str = "",
             namespace: str = NS) -> str:
    res = ""
    if cpu or memory:
        req = "".join(f"\n          {k}: {v}" for k, v in (("cpu", cpu), ("memory", memory)) if v)
        res = f"\n      resources:\n        requests:{req}\n        limits:{req}"
    pc = f"\n  priorityClassName: {priority_class}" if priority_class else ""
    return f"""apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {namespace}
spec:{pc}
  containers:
    - name: app
      image: nginx:1{res}
"""


LIMIT_RANGE = f"""apiVersion: v1
kind: LimitRange
metadata:
  name: defaults
  namespace: {NS}
spec:
  limits:
    - type: Container
      default:
        cpu: 200m
        memory: 128Mi
      max:
        cpu: 500m
"""


@pytest.fixture(scope="module")
def kubectl(cluster_kubectl: Kubectl):
    cluster_kubectl("create", "namespace", NS)
    cluster_kubectl("create", "namespace", NS2)
    yield cluster_kubectl
    cluster_kubectl("delete", "priorityclass", PC, "--ignore-not-found", "--wait=false", check=False)
    cluster_kubectl("delete", "namespace", NS, NS2, "--wait=false", check=False)


def test_quota_counts_refuses_and_replenishes(kubectl: Kubectl) -> None:
    kubectl("create", "quota", "compute", "-n", NS, "--hard=pods=3,requests.cpu=1,limits.memory=1Gi,count/secrets=5")
    eventually_sync(lambda: used(kubectl, "compute").get("pods") == "0", timeout=30, what="quota counted")
    table = kubectl("get", "quota", "-n", NS).out.splitlines()
    assert table[0].split() == ["NAME", "REQUEST", "LIMIT", "AGE"]
    assert "count/secrets: 0/5, pods: 0/3, requests.cpu: 0/1   limits.memory: 0/1Gi" in table[1]
    kubectl("apply", "-f", "-", stdin=LIMIT_RANGE)
    assert kubectl("get", "limits", "-n", NS).out.split()[:3] == ["NAME", "CREATED", "AT"]

    # defaults from the LimitRange, charged to the quota at admission
    kubectl("run", "web", "--image=nginx:1", "-n", NS)
    web = json.loads(kubectl("get", "pod", "web", "-n", NS, "-o", "json").out)
    assert web["spec"]["containers"][0]["resources"] == {"limits": {"cpu": "200m", "memory": "128Mi"},
                                                         "requests": {"cpu": "200m", "memory": "128Mi"}}
    assert web["metadata"]["annotations"]["kubernetes.io/limit-ranger"] == (
        "LimitRanger plugin set: cpu, memory request for container web; cpu, memory limit for container web")
    assert used(kubectl, "compute") == {"count/secrets": "0", "limits.memory": "128Mi", "pods": "1",
                                        "requests.cpu": "200m"}

    # above the LimitRange's max
    res = kubectl("apply", "-f", "-", stdin=pod_yaml("huge", cpu="600m"), check=False)
    assert res.rc != 0
    assert ('pods "huge" is forbidden: maximum cpu usage per Container is 500m, but limit is 600m'
            in res.err), res.err
    # beyond the quota
    kubectl("apply", "-f", "-", stdin=pod_yaml("big", cpu="500m", memory="256Mi"))
    res = kubectl("apply", "-f", "-", stdin=pod_yaml("more", cpu="400m", memory="256Mi"), check=False)
    assert res.rc != 0
    assert ('Error from server (Forbidden): error when creating "STDIN": pods "more" is forbidden: exceeded quota: '
            "compute, requested: requests.cpu=400m, used: requests.cpu=700m, limited: requests.cpu=1") in res.err

    described = kubectl("describe", "quota", "compute", "-n", NS).out
    lines = [line.split() for line in described.splitlines()]
    assert ["Resource", "Used", "Hard"] in lines
    assert ["requests.cpu", "700m", "1"] in lines and ["pods", "2", "3"] in lines
    assert ["limits.memory", "384Mi", "1Gi"] in lines

    # deleting a pod gives its share back (the controller's replenishment)
    kubectl("delete", "pod", "big", "-n", NS, "--grace-period=0", "--force")
    eventually_sync(lambda: used(kubectl, "compute").get("requests.cpu") == "200m", timeout=30,
                    what="quota replenished")
    kubectl("apply", "-f", "-", stdin=pod_yaml("more", cpu="400m", memory="256Mi"))
    kubectl("create", "secret", "generic", "s1", "-n", NS)
    eventually_sync(lambda: used(kubectl, "compute").get("count/secrets") == "1", timeout=10, what="secret counted")

    # a ReplicaSet whose second pod does not fit says so, with the generated pod name upstream reports
    kubectl("create", "deployment", "fill", "--image=nginx:1", "--replicas=2", "-n", NS)

    def failure() -> dict | None:
        items = json.loads(kubectl("get", "rs", "-n", NS, "-l", "app=fill", "-o", "json").out)["items"]
        conds = ((items[0].get("status") or {}).get("conditions") or []) if items else []
        return next((c for c in conds if c["type"] == "ReplicaFailure"), None)

    cond = eventually_sync(failure, timeout=30, what="ReplicaFailure")
    assert cond["reason"] == "FailedCreate"
    assert re.fullmatch(r'pods "fill-[a-z0-9]+-[a-z0-9]{5}" is forbidden: exceeded quota: compute, requested: '
                        r"pods=1, used: pods=3, limited: pods=3", cond["message"]), cond["message"]
    described = kubectl("describe", "limitrange", "defaults", "-n", NS).out.splitlines()
    assert ["Container", "cpu", "-", "500m", "200m", "200m", "-"] in [line.split() for line in described]


def test_priority_from_priority_classes(kubectl: Kubectl) -> None:
    classes = kubectl("get", "priorityclasses").out
    assert "system-cluster-critical" in classes and "system-node-critical" in classes
    kubectl("create", "priorityclass", PC, "--value=1000", "--description=quota test")
    kubectl("apply", "-f", "-", stdin=pod_yaml("vip", priority_class=PC, namespace=NS2))
    vip = json.loads(kubectl("get", "pod", "vip", "-n", NS2, "-o", "json").out)
    assert (vip["spec"]["priority"], vip["spec"]["preemptionPolicy"]) == (1000, "PreemptLowerPriority")
    res = kubectl("apply", "-f", "-", stdin=pod_yaml("ghost", priority_class="no-such-class", namespace=NS2),
                  check=False)
    assert 'pods "ghost" is forbidden: no PriorityClass with name no-such-class was found' in res.err, res.err
    res = kubectl("delete", "priorityclass", "system-node-critical", check=False)
    assert ('priorityclasses.scheduling.k8s.io "system-node-critical" is forbidden: this is a system priority '
            "class and cannot be deleted") in res.err, res.err
