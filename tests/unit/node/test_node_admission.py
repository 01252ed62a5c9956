"""The node agent's pod admission, as upstream kubelet's predicate admit handler."""

from __future__ import annotations

import pytest

from kubeplane.node.admission import admit, general_predicates


def _node(allocatable=None, labels=None, taints=None, name="n1"):
    alloc = {"cpu": "2", "memory": "4Gi", "ephemeral-storage": "10Gi", "pods": "110"}
    alloc.update(allocatable or {})
    return {"metadata": {"name": name, "labels": {"kubernetes.io/os": "linux", **(labels or {})}},
            "spec": {"taints": taints or []},
            "status": {"allocatable": alloc, "capacity": alloc}}


def _pod(name="p", requests=None, *, node="n1", init=(), sidecars=(), ports=(), labels=None, **spec):
    c = {"name": "main", "image": "busybox"}
    if requests:
        c["resources"] = {"requests": requests}
    if ports:
        c["ports"] = list(ports)
    inits = [{"name": f"init{i}", "image": "busybox", "resources": {"requests": r}} for i, r in enumerate(init)]
    inits += [{"name": f"side{i}", "image": "busybox", "restartPolicy": "Always", "resources": {"requests": r}}
              for i, r in enumerate(sidecars)]
    body = {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "labels": labels or {}},
            "spec": {"nodeName": node, "containers": [c], **spec}}
    if inits:
        body["spec"]["initContainers"] = inits
    return body


def test_fits():
    assert admit(_pod(requests={"cpu": "1", "memory": "1Gi"}), _node(), [_pod("o", {"cpu": "1"})]) is None


@pytest.mark.parametrize("requests,reason,message", [
    ({"cpu": "1500m"}, "OutOfcpu", "Node didn't have enough resource: cpu, requested: 1500, used: 1000, capacity: 2000"),
    ({"memory": "4Gi"}, "OutOfmemory",
     "Node didn't have enough resource: memory, requested: 4294967296, used: 1073741824, capacity: 4294967296"),
    ({"ephemeral-storage": "11Gi"}, "OutOfephemeral-storage",
     "Node didn't have enough resource: ephemeral-storage, requested: 11811160064, used: 0, capacity: 10737418240"),
])
def test_out_of_a_resource(requests, reason, message):
    other = _pod("o", {"cpu": "1", "memory": "1Gi"})
    assert admit(_pod(requests=requests), _node(), [other]) == (reason, message)


def test_out_of_pods():
    node = _node({"pods": "2"})
    assert admit(_pod(), node, [_pod("a")]) is None
    assert admit(_pod(), node, [_pod("a"), _pod("b")]) == (
        "OutOfpods", "Node didn't have enough resource: pods, requested: 1, used: 2, capacity: 2")


def test_extended_resources_and_hugepages():
    node = _node({"example.com/gpu": "2", "hugepages-2Mi": "20Mi"})
    other = _pod("o", {"example.com/gpu": "1"})
    assert admit(_pod(requests={"example.com/gpu": "1"}), node, [other]) is None
    assert admit(_pod(requests={"example.com/gpu": "2"}), node, [other]) == (
        "OutOfexample.com/gpu", "Node didn't have enough resource: example.com/gpu, requested: 2, used: 1, capacity: 2")
    assert admit(_pod(requests={"hugepages-2Mi": "40Mi"}), node, []) == (
        "OutOfhugepages-2Mi",
        "Node didn't have enough resource: hugepages-2Mi, requested: 41943040, used: 0, capacity: 20971520")
    # an extended resource the node does not report is not the node's to check (cluster-level)
    assert admit(_pod(requests={"other.example.com/thing": "5"}), node, []) is None
    # hugepages the node does not report are: none there
    assert admit(_pod(requests={"hugepages-1Gi": "1Gi"}), node, [])[0] == "OutOfhugepages-1Gi"


def test_init_containers_sidecars_and_overhead_count_as_the_scheduler_counts_them():
    node = _node({"cpu": "3"})
    # max(init) = 2500m < 3 cores: fits though init + main would not
    assert admit(_pod(requests={"cpu": "1"}, init=[{"cpu": "2500m"}]), node, []) is None
    # a sidecar runs next to the containers and the later init containers: 1 + 1 + (overhead 1) = 3
    pod = _pod(requests={"cpu": "1"}, sidecars=[{"cpu": "1"}], overhead={"cpu": "1"})
    assert admit(pod, node, []) is None
    assert admit(pod, node, [_pod("o", {"cpu": "100m"})]) == (
        "OutOfcpu", "Node didn't have enough resource: cpu, requested: 3000, used: 100, capacity: 3000")


def test_node_selector_and_required_affinity():
    node = _node(labels={"zone": "a"})
    assert admit(_pod(nodeSelector={"zone": "a"}), node, []) is None
    assert admit(_pod(nodeSelector={"zone": "b"}), node, []) == (
        "NodeAffinity", "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector")
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b", "c"]}]}]}}}
    assert admit(_pod(affinity=affinity), node, [])[0] == "NodeAffinity"
    assert admit(_pod(affinity=affinity), _node(labels={"zone": "c"}), []) is None


def test_node_name():
    assert admit(_pod(node="elsewhere"), _node(), []) == (
        "NodeName", "Predicate NodeName failed: node(s) didn't match the requested node name")


def test_host_ports():
    used = _pod("o", ports=[{"containerPort": 80, "hostPort": 8080}])
    want = _pod(ports=[{"containerPort": 80, "hostPort": 8080}])
    assert admit(want, _node(), [used]) == (
        "NodePorts", "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports")
    udp = _pod(ports=[{"containerPort": 80, "hostPort": 8080, "protocol": "UDP"}])
    assert admit(udp, _node(), [used]) is None
    assert admit(want, _node(), []) is None


def test_only_untolerated_no_execute_taints_reject():
    no_schedule = _node(taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}])
    assert admit(_pod(), no_schedule, []) is None  # the scheduler's business, not the kubelet's
    no_execute = _node(taints=[{"key": "k", "value": "v", "effect": "NoExecute"}])
    assert admit(_pod(), no_execute, []) == (
        "TaintToleration", "Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate")
    tolerated = _pod(tolerations=[{"key": "k", "operator": "Exists", "effect": "NoExecute"}])
    assert admit(tolerated, no_execute, []) is None


def test_pod_os():
    assert admit(_pod(os={"name": "linux"}), _node(), []) is None
    assert admit(_pod(os={"name": "windows"}), _node(), []) == (
        "PodOSNotSupported", "Failed to admit pod as the OS field doesn't match node OS")
    assert admit(_pod(labels={"kubernetes.io/os": "windows"}), _node(), []) == (
        "PodOSSelectorNodeLabelDoesNotMatch",
        "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label")
    # the OS checks come first, preemption could not help them
    assert admit(_pod(requests={"cpu": "64"}, os={"name": "windows"}), _node(), [])[0] == "PodOSNotSupported"


def test_the_first_failure_decides_in_upstreams_order():
    pod = _pod(requests={"cpu": "64"}, node="elsewhere", nodeSelector={"zone": "x"})
    failures = general_predicates(pod, _node(), [])
    assert [f.reason for f in failures] == ["OutOfcpu", "NodeAffinity", "NodeName"]
    assert admit(pod, _node(), [])[0] == "OutOfcpu"
