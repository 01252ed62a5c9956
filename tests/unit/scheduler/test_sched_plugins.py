"""Default plugins: filter/score behaviour, messages and queueing hints as upstream."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from kubeplane.scheduler.cache import Snapshot
from kubeplane.scheduler.framework.nodeinfo import NodeInfo, PodInfo
from kubeplane.scheduler.framework.plugin import Handle, Plugin
from kubeplane.scheduler.framework.types import Code, CycleState, QueueingHint, Status
from kubeplane.scheduler.plugins.default_binder import DefaultBinder
from kubeplane.scheduler.plugins.image_locality import ImageLocality, normalized_image_name
from kubeplane.scheduler.plugins.node_affinity import NodeAffinity
from kubeplane.scheduler.plugins.node_name import NodeName
from kubeplane.scheduler.plugins.node_ports import NodePorts
from kubeplane.scheduler.plugins.node_resources_balanced import NodeResourcesBalancedAllocation
from kubeplane.scheduler.plugins.node_resources_fit import NodeResourcesFit
from kubeplane.scheduler.plugins.node_unschedulable import NodeUnschedulable
from kubeplane.scheduler.plugins.priority_sort import PrioritySort
from kubeplane.scheduler.plugins.scheduling_gates import SchedulingGates
from kubeplane.scheduler.plugins.taint_toleration import TaintToleration

MB = 1024 * 1024


def node(name: str = "n1", cpu: Any = "4", mem: Any = "8Gi", pods: Any = 110, labels: dict | None = None,
         taints: list | None = None, unschedulable: bool = False, extra: dict | None = None,
         images: list | None = None) -> dict:
    alloc: dict[str, Any] = {"cpu": cpu, "memory": mem, "pods": pods}
    alloc.update(extra or {})
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    status: dict[str, Any] = {"allocatable": alloc}
    if images:
        status["images"] = images
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec, "status": status}


def pod(name: str = "p", requests: dict | None = None, uid: str | None = None, images: list | None = None,
        ports: list | None = None, **spec: Any) -> dict:
    containers = []
    for img in images or ["img"]:
        c: dict[str, Any] = {"name": img, "image": img}
        if requests:
            c["resources"] = {"requests": dict(requests)}
        if ports:
            c["ports"] = ports
        containers.append(c)
    s: dict[str, Any] = {"containers": containers}
    s.update(spec)
    return {"metadata": {"name": name, "namespace": "default", "uid": uid or f"uid-{name}"}, "spec": s}


def mk(cls: type[Plugin], args: dict | None = None, handle: Handle | None = None) -> Any:
    return cls(args, handle or Handle())


def run_filter(pl: Any, p: dict, ni: NodeInfo) -> Status | None:
    state = CycleState()
    pi = PodInfo(p)
    if hasattr(pl, "pre_filter") and type(pl).pre_filter is not Plugin.pre_filter:
        _, s = pl.pre_filter(state, pi, [ni])
        if s is not None and s.is_skip():
            return None
        assert s is None or s.is_success(), s
    return pl.filter(state, pi, ni)


def run_scores(pl: Any, p: dict, nodes: list[NodeInfo]) -> dict[str, int] | None:
    state = CycleState()
    pi = PodInfo(p)
    if type(pl).pre_score is not Plugin.pre_score:
        s = pl.pre_score(state, pi, nodes)
        if s is not None and s.is_skip():
            return None
    scores = [[ni.name, pl.score(state, pi, ni)[0]] for ni in nodes]
    if type(pl).normalize_score is not Plugin.normalize_score:
        pl.normalize_score(state, pi, scores)
    return {n: s for n, s in scores}


# ------------------------------------------------------------------ queue side


def test_priority_sort() -> None:
    @dataclass
    class Q:
        pod: dict
        timestamp: float

    pl = mk(PrioritySort)
    hi, lo = pod("hi", priority=10), pod("lo", priority=1)
    assert pl.less(Q(hi, 5.0), Q(lo, 1.0))
    assert not pl.less(Q(lo, 1.0), Q(hi, 5.0))
    assert pl.less(Q(lo, 1.0), Q(pod("x", priority=1), 2.0))
    assert pl.less(Q(PodInfo(hi), 5.0), Q(PodInfo(lo), 1.0))


def test_scheduling_gates() -> None:
    pl = mk(SchedulingGates)
    assert pl.pre_enqueue(pod()) is None
    s = pl.pre_enqueue(pod(schedulingGates=[{"name": "a"}, {"name": "b"}]))
    assert s is not None and s.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert s.message() == "waiting for scheduling gates: [a b]"
    hint = pl.events_to_register()[0].hint
    assert hint(pod("p"), pod("p"), pod("p")) == QueueingHint.QUEUE
    assert hint(pod("p"), pod("q"), pod("q")) == QueueingHint.SKIP


# ------------------------------------------------------------------ simple filters


def test_node_unschedulable() -> None:
    pl = mk(NodeUnschedulable)
    ni = NodeInfo(node(unschedulable=True))
    s = run_filter(pl, pod(), ni)
    assert s is not None and s.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE and s.message() == "node(s) were unschedulable"
    tol = [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]
    assert run_filter(pl, pod(tolerations=tol), ni) is None
    assert run_filter(pl, pod(), NodeInfo(node())) is None
    node_hint = pl.events_to_register()[0].hint
    assert node_hint(pod(), node(unschedulable=True), node()) == QueueingHint.QUEUE
    assert node_hint(pod(), node(), node(labels={"a": "b"})) == QueueingHint.SKIP
    assert node_hint(pod(), None, node()) == QueueingHint.QUEUE


def test_node_name() -> None:
    pl = mk(NodeName)
    s = run_filter(pl, pod(nodeName="other"), NodeInfo(node("n1")))
    assert s is not None and s.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert s.message() == "node(s) didn't match the requested node name"
    assert run_filter(pl, pod(nodeName="n1"), NodeInfo(node("n1"))) is None
    assert run_filter(pl, pod(), NodeInfo(node("n1"))) is None
    hint = pl.events_to_register()[0].hint
    assert hint(pod(nodeName="n2"), None, node("n1")) == QueueingHint.SKIP
    assert hint(pod(nodeName="n1"), None, node("n1")) == QueueingHint.QUEUE


# ------------------------------------------------------------------ TaintToleration


@pytest.mark.parametrize(
    "taints,tolerations,expected",
    [
        ([{"key": "dedicated", "value": "user1", "effect": "NoSchedule"}], [],
         "node(s) had untolerated taint {dedicated: user1}"),
        ([{"key": "dedicated", "value": "user1", "effect": "NoSchedule"}],
         [{"key": "dedicated", "value": "user1", "effect": "NoSchedule"}], None),
        ([{"key": "dedicated", "value": "user1", "effect": "NoSchedule"}],
         [{"key": "dedicated", "operator": "Equal", "value": "user2", "effect": "NoSchedule"}],
         "node(s) had untolerated taint {dedicated: user1}"),
        ([{"key": "foo", "value": "bar", "effect": "NoSchedule"}], [{"key": "foo", "operator": "Exists"}], None),
        ([{"key": "foo", "value": "bar", "effect": "NoExecute"}], [{"operator": "Exists"}], None),
        ([{"key": "foo", "value": "bar", "effect": "NoExecute"}],
         [{"key": "foo", "operator": "Exists", "effect": "NoSchedule"}],
         "node(s) had untolerated taint {foo: bar}"),
        ([{"key": "foo", "value": "bar", "effect": "PreferNoSchedule"}], [], None),
    ],
)
def test_taint_toleration_filter(taints: list, tolerations: list, expected: str | None) -> None:
    s = run_filter(mk(TaintToleration), pod(tolerations=tolerations), NodeInfo(node(taints=taints)))
    if expected is None:
        assert s is None
    else:
        assert s is not None and s.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE and s.message() == expected


def test_taint_toleration_score() -> None:
    pns = "PreferNoSchedule"
    nodes = [
        NodeInfo(node("nodeA")),
        NodeInfo(node("nodeB", taints=[{"key": "cpu-type", "value": "arm64", "effect": pns}])),
        NodeInfo(node("nodeC", taints=[{"key": "cpu-type", "value": "arm64", "effect": pns},
                                       {"key": "gpu-type", "value": "nvidia", "effect": pns}])),
    ]
    assert run_scores(mk(TaintToleration), pod(), nodes) == {"nodeA": 100, "nodeB": 50, "nodeC": 0}
    tol = [{"key": "cpu-type", "operator": "Equal", "value": "arm64", "effect": pns},
           {"key": "gpu-type", "operator": "Equal", "value": "nvidia", "effect": pns}]
    assert run_scores(mk(TaintToleration), pod(tolerations=tol), nodes) == {"nodeA": 100, "nodeB": 100, "nodeC": 100}


def test_taint_toleration_hints() -> None:
    pl = mk(TaintToleration)
    node_hint, pod_hint = (e.hint for e in pl.events_to_register())
    tainted = node(taints=[{"key": "k", "effect": "NoSchedule"}])
    assert node_hint(pod(), tainted, node()) == QueueingHint.QUEUE
    assert node_hint(pod(), None, tainted) == QueueingHint.SKIP
    assert node_hint(pod(), node(), node(labels={"a": "b"})) == QueueingHint.SKIP
    assert pod_hint(pod("p"), pod("p"), pod("p")) == QueueingHint.QUEUE


# ------------------------------------------------------------------ NodeAffinity


def aff(*terms: dict) -> dict:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def expr(key: str, op: str, *values: str) -> dict:
    return {"matchExpressions": [{"key": key, "operator": op, "values": list(values)}]}


@pytest.mark.parametrize(
    "spec,labels,ok",
    [
        ({}, {}, True),
        ({"nodeSelector": {"foo": "bar"}}, {"foo": "bar"}, True),
        ({"nodeSelector": {"foo": "bar"}}, {"foo": "baz"}, False),
        ({"affinity": aff(expr("foo", "In", "bar", "value2"))}, {"foo": "bar"}, True),
        ({"affinity": aff(expr("kernel-version", "Gt", "0204"))}, {"kernel-version": "0206"}, True),
        ({"affinity": aff(expr("mem-type", "NotIn", "DDR", "DDR2"))}, {"mem-type": "DDR3"}, True),
        ({"affinity": aff(expr("GPU", "Exists"))}, {"GPU": "NVIDIA-GRID-K1"}, True),
        ({"affinity": aff(expr("foo", "In", "bar"), expr("diffkey", "In", "wrong"))}, {"foo": "bar"}, True),
        ({"affinity": aff(expr("foo", "In", "bar"))}, {"foo": "baz"}, False),
        ({"affinity": aff()}, {"foo": "bar"}, False),
        ({"affinity": aff({})}, {"foo": "bar"}, False),
        ({"affinity": aff(expr("foo", "DoesNotExist"))}, {"foo": "bar"}, False),
        # nodeSelector and affinity are ANDed
        ({"nodeSelector": {"foo": "bar"}, "affinity": aff(expr("foo", "Exists"))}, {"foo": "baz"}, False),
    ],
)
def test_node_affinity_filter(spec: dict, labels: dict, ok: bool) -> None:
    s = run_filter(mk(NodeAffinity), pod(**spec), NodeInfo(node(labels=labels)))
    if ok:
        assert s is None
    else:
        assert s is not None and s.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE
        assert s.message() == "node(s) didn't match Pod's node affinity/selector"


def field_term(*names: str) -> dict:
    return {"matchFields": [{"key": "metadata.name", "operator": "In", "values": list(names)}]}


def test_node_affinity_pre_filter_narrowing() -> None:
    pl = mk(NodeAffinity)
    r, s = pl.pre_filter(CycleState(), PodInfo(pod(affinity=aff(field_term("n1"), field_term("n2")))), [])
    assert s is None and r is not None and r.node_names == {"n1", "n2"}
    # a term without a name pin allows every node
    r, s = pl.pre_filter(CycleState(), PodInfo(pod(affinity=aff(field_term("n1"), expr("a", "Exists")))), [])
    assert r is None and s is None
    # ANDed name pins within a term intersect; conflicting terms can't match anything
    conflict = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]},
                                {"key": "metadata.name", "operator": "In", "values": ["n2"]}]}
    r, s = pl.pre_filter(CycleState(), PodInfo(pod(affinity=aff(conflict))), [])
    assert s is not None and s.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE and s.message() == "pod affinity terms conflict"
    _, s = pl.pre_filter(CycleState(), PodInfo(pod()), [])
    assert s is not None and s.is_skip()


def test_node_affinity_added_affinity() -> None:
    args = {"addedAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [expr("zone", "In", "foo")]}}}
    pl = mk(NodeAffinity, args)
    s = run_filter(pl, pod(), NodeInfo(node(labels={"zone": "bar"})))
    assert s is not None and s.message() == "node(s) didn't match scheduler-enforced node affinity"
    assert run_filter(pl, pod(), NodeInfo(node(labels={"zone": "foo"}))) is None


def pref(weight: int, labels: dict) -> dict:
    return {"weight": weight, "preference": {"matchExpressions": [
        {"key": k, "operator": "In", "values": [v]} for k, v in labels.items()]}}


def test_node_affinity_score() -> None:
    affinity = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        pref(2, {"foo": "bar"}), pref(4, {"key": "value"}), pref(5, {"foo": "bar", "key": "value", "az": "az1"})]}}
    nodes = [NodeInfo(node("machine1", labels={"foo": "bar"})),
             NodeInfo(node("machine5", labels={"foo": "bar", "key": "value", "az": "az1"})),
             NodeInfo(node("machine2", labels={"key": "value"}))]
    assert run_scores(mk(NodeAffinity), pod(affinity=affinity), nodes) == {"machine1": 18, "machine5": 100, "machine2": 36}
    assert run_scores(mk(NodeAffinity), pod(), nodes) is None  # PreScore skip
    added = mk(NodeAffinity, {"addedAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [pref(1, {"key": "value"})]}})
    assert run_scores(added, pod(), nodes) == {"machine1": 0, "machine5": 100, "machine2": 100}


def test_node_affinity_hint() -> None:
    hint = mk(NodeAffinity).events_to_register()[0].hint
    p = pod(nodeSelector={"foo": "bar"})
    assert hint(p, None, node(labels={"foo": "bar"})) == QueueingHint.QUEUE
    assert hint(p, node(), node(labels={"foo": "bar"})) == QueueingHint.QUEUE
    assert hint(p, node(labels={"foo": "bar"}), node(labels={"foo": "bar", "x": "y"})) == QueueingHint.SKIP
    assert hint(p, None, node(labels={"foo": "baz"})) == QueueingHint.SKIP


# ------------------------------------------------------------------ NodePorts


def port(host_port: int, ip: str = "", proto: str = "TCP") -> dict:
    d: dict[str, Any] = {"containerPort": host_port, "hostPort": host_port, "protocol": proto}
    if ip:
        d["hostIP"] = ip
    return d


@pytest.mark.parametrize(
    "want,existing,fits",
    [
        ([], [port(8080)], True),
        ([port(8080, "127.0.0.1", "UDP")], [port(8080, "127.0.0.1", "UDP")], False),
        ([port(8080, "127.0.0.1", "TCP")], [port(8080, "127.0.0.1", "UDP")], True),
        ([port(8080, "127.0.0.2")], [port(8080, "127.0.0.1")], True),
        ([port(8080, "0.0.0.0")], [port(8080, "127.0.0.1")], False),
        ([port(8080, "127.0.0.1")], [port(8080)], False),
        ([port(8001, "127.0.0.1", "UDP")], [port(8001, "", "UDP")], False),
    ],
)
def test_node_ports(want: list, existing: list, fits: bool) -> None:
    ni = NodeInfo(node())
    ni.add_pod(pod("other", ports=existing, nodeName="n1"))
    s = run_filter(mk(NodePorts), pod(ports=want), ni)
    if fits:
        assert s is None
    else:
        assert s is not None and s.code == Code.UNSCHEDULABLE
        assert s.message() == "node(s) didn't have free ports for the requested pod ports"


def test_node_ports_hint() -> None:
    hint = mk(NodePorts).events_to_register()[0].hint
    me = pod(ports=[port(80)])
    assert hint(me, pod("x", ports=[port(80)], nodeName="n1"), None) == QueueingHint.QUEUE
    assert hint(me, pod("x", ports=[port(81)], nodeName="n1"), None) == QueueingHint.SKIP
    assert hint(me, pod("x", ports=[port(80)]), None) == QueueingHint.SKIP


# ------------------------------------------------------------------ NodeResourcesFit


def test_fit_filter_messages() -> None:
    pl = mk(NodeResourcesFit)
    ni = NodeInfo(node(cpu="10m", mem="20", pods=32))
    ni.add_pod(pod("a", {"cpu": "5m", "memory": "19"}, nodeName="n1"))
    s = run_filter(pl, pod(requests={"cpu": "1m", "memory": "1"}), ni)
    assert s is None
    s = run_filter(pl, pod(requests={"memory": "2", "cpu": "6m"}), ni)
    assert s is not None and s.code == Code.UNSCHEDULABLE and s.reasons == ["Insufficient cpu", "Insufficient memory"]
    full = NodeInfo(node(pods=1))
    full.add_pod(pod("a", nodeName="n1"))
    s = run_filter(pl, pod(), full)
    assert s is not None and s.reasons == ["Too many pods"]


def test_fit_init_containers_and_overhead() -> None:
    pl = mk(NodeResourcesFit)
    ni = NodeInfo(node(cpu="10m", mem="20"))
    big_init = pod(requests={"cpu": "1m"}, initContainers=[{"name": "i", "resources": {"requests": {"cpu": "11m"}}}])
    s = run_filter(pl, big_init, ni)
    assert s is not None and s.reasons == ["Insufficient cpu"]
    assert run_filter(pl, pod(requests={"cpu": "5m"}, overhead={"cpu": "5m"}), ni) is None
    s = run_filter(pl, pod(requests={"cpu": "5m"}, overhead={"cpu": "6m"}), ni)
    assert s is not None and s.reasons == ["Insufficient cpu"]


def test_fit_extended_resources() -> None:
    ni = NodeInfo(node(extra={"example.com/foo": "5", "hugepages-2Mi": "2Mi"}))
    ni.add_pod(pod("a", {"example.com/foo": "3"}, nodeName="n1"))
    pl = mk(NodeResourcesFit)
    assert run_filter(pl, pod(requests={"example.com/foo": "2"}), ni) is None
    s = run_filter(pl, pod(requests={"example.com/foo": "3"}), ni)
    assert s is not None and s.reasons == ["Insufficient example.com/foo"]
    s = run_filter(pl, pod(requests={"example.com/bar": "1"}), ni)
    assert s is not None and s.reasons == ["Insufficient example.com/bar"]
    s = run_filter(pl, pod(requests={"hugepages-2Mi": "3Mi"}), ni)
    assert s is not None and s.reasons == ["Insufficient hugepages-2Mi"]
    assert run_filter(mk(NodeResourcesFit, {"ignoredResources": ["example.com/bar"]}),
                      pod(requests={"example.com/bar": "1"}), ni) is None
    assert run_filter(mk(NodeResourcesFit, {"ignoredResourceGroups": ["example.com"]}),
                      pod(requests={"example.com/bar": "1"}), ni) is None


SIZED = [NodeInfo(node("node1", cpu="4000m", mem="10000")), NodeInfo(node("node2", cpu="6000m", mem="10000"))]
REQ = {"cpu": "1000m", "memory": "2000"}


def test_fit_least_allocated() -> None:
    assert run_scores(mk(NodeResourcesFit), pod(requests=REQ), SIZED) == {"node1": 77, "node2": 81}


def test_fit_least_allocated_non_zero_defaults() -> None:
    nodes = [NodeInfo(node("n", cpu="4000m", mem=str(400 * MB)))]
    # 100m default cpu -> 97; 200Mi default memory of 400Mi -> 50; (97 + 50) / 2 = 73
    assert run_scores(mk(NodeResourcesFit), pod(), nodes) == {"n": 73}


def test_fit_most_allocated() -> None:
    args = {"scoringStrategy": {"type": "MostAllocated", "resources": [{"name": "cpu", "weight": 1},
                                                                        {"name": "memory", "weight": 1}]}}
    assert run_scores(mk(NodeResourcesFit, args), pod(requests=REQ), SIZED) == {"node1": 22, "node2": 18}


def test_fit_requested_to_capacity_ratio() -> None:
    args = {"scoringStrategy": {"type": "RequestedToCapacityRatio",
                                "requestedToCapacityRatio": {"shape": [{"utilization": 0, "score": 10},
                                                                       {"utilization": 100, "score": 0}]}}}
    # node1: cpu util 25 -> 75, memory util 20 -> 80, rounded mean 77.5 -> 78
    assert run_scores(mk(NodeResourcesFit, args), pod(requests=REQ), SIZED)["node1"] == 78
    bin_packing = {"scoringStrategy": {"type": "RequestedToCapacityRatio", "resources": [{"name": "cpu", "weight": 1}],
                                       "requestedToCapacityRatio": {"shape": [{"utilization": 0, "score": 0},
                                                                              {"utilization": 100, "score": 10}]}}}
    assert run_scores(mk(NodeResourcesFit, bin_packing), pod(requests=REQ), SIZED) == {"node1": 25, "node2": 16}


def test_fit_extended_resource_scoring_ignored_when_not_requested() -> None:
    args = {"scoringStrategy": {"type": "LeastAllocated", "resources": [
        {"name": "cpu", "weight": 1}, {"name": "example.com/gpu", "weight": 3}]}}
    nodes = [NodeInfo(node("n", cpu="4000m", extra={"example.com/gpu": "4"}))]
    assert run_scores(mk(NodeResourcesFit, args), pod(requests={"cpu": "1"}), nodes) == {"n": 75}
    # cpu 75 x1 + gpu 75 x3 / 4 = 75; with 2 gpus: (75 + 50*3) / 4 = 56
    assert run_scores(mk(NodeResourcesFit, args), pod(requests={"cpu": "1", "example.com/gpu": "2"}), nodes) == {"n": 56}


def test_fit_hints() -> None:
    pod_hint, node_hint = (e.hint for e in mk(NodeResourcesFit).events_to_register())
    me = pod(requests={"cpu": "2"})
    assert pod_hint(me, pod("x", nodeName="n1"), None) == QueueingHint.QUEUE
    assert pod_hint(me, pod("x"), None) == QueueingHint.SKIP
    assert pod_hint(me, pod("x", {"cpu": "2"}, nodeName="n1"), pod("x", {"cpu": "1"}, nodeName="n1")) == QueueingHint.QUEUE
    assert pod_hint(me, pod("x", {"memory": "2"}, nodeName="n1"), pod("x", {"memory": "1"}, nodeName="n1")) == QueueingHint.SKIP
    assert node_hint(me, None, node(cpu="1")) == QueueingHint.SKIP
    assert node_hint(me, None, node(cpu="4")) == QueueingHint.QUEUE
    assert node_hint(me, node(cpu="3"), node(cpu="4")) == QueueingHint.QUEUE
    assert node_hint(me, node(cpu="4"), node(cpu="4", labels={"a": "b"})) == QueueingHint.SKIP


# ------------------------------------------------------------------ BalancedAllocation


def test_balanced_allocation() -> None:
    ni = NodeInfo(node("n", cpu="10000m", mem="20000"))
    existing = pod("e", {"cpu": "1000m", "memory": "1000"}, nodeName="n")
    ni.add_pod(existing)
    # fractions: cpu (1000+2000)/10000 = 0.3, memory (1000+4000)/20000 = 0.25 -> std 0.025 -> 97
    scores = run_scores(mk(NodeResourcesBalancedAllocation), pod(requests={"cpu": "2000m", "memory": "4000"}), [ni])
    assert scores == {"n": 97}
    # three resources use the population standard deviation
    args = {"resources": [{"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1},
                          {"name": "example.com/gpu", "weight": 1}]}
    ni3 = NodeInfo(node("n", cpu="10000m", mem="20000", extra={"example.com/gpu": "4"}))
    s3 = run_scores(mk(NodeResourcesBalancedAllocation, args),
                    pod(requests={"cpu": "2000m", "memory": "10000", "example.com/gpu": "1"}), [ni3])
    # fractions 0.2, 0.5, 0.25 -> mean 0.3167, std 0.1312 -> 86
    assert s3 == {"n": 86}


def test_balanced_allocation_skips_best_effort() -> None:
    assert run_scores(mk(NodeResourcesBalancedAllocation), pod(), [NodeInfo(node())]) is None


# ------------------------------------------------------------------ ImageLocality


def test_image_locality() -> None:
    images = [{"names": ["gcr.io/300:latest"], "sizeBytes": 300 * MB}, {"names": ["gcr.io/10:v1"], "sizeBytes": 10 * MB}]
    snap = Snapshot()
    from kubeplane.scheduler.cache import Cache
    cache = Cache()
    cache.add_node(node("n1", images=images))
    cache.add_node(node("n2"))
    cache.update_snapshot(snap)
    pl = mk(ImageLocality, handle=Handle(snapshot=snap))
    # 300MB present on 1 of 2 nodes -> 150MB -> 100 * (150 - 23) / (1000 - 23) = 12
    assert run_scores(pl, pod(images=["gcr.io/300"]), snap.node_info_list) == {"n1": 12, "n2": 0}
    # two containers: threshold doubles, small images below the minimum count as nothing
    assert run_scores(pl, pod(images=["gcr.io/300", "gcr.io/10:v1"]), snap.node_info_list) == {"n1": 6, "n2": 0}
    cache.add_node(node("n2", images=images))
    cache.update_snapshot(snap)
    assert run_scores(pl, pod(images=["gcr.io/300"]), snap.node_info_list) == {"n1": 28, "n2": 28}


def test_normalized_image_name() -> None:
    assert normalized_image_name("nginx") == "nginx:latest"
    assert normalized_image_name("localhost:5000/nginx") == "localhost:5000/nginx:latest"
    assert normalized_image_name("nginx:1.2") == "nginx:1.2"


# ------------------------------------------------------------------ DefaultBinder


class RecordingClient:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple] = []
        self.fail = fail

    async def create(self, res: Any, obj: dict, namespace: str | None = None, **kw: Any) -> dict:
        self.calls.append((res.plural, obj, namespace, kw))
        if self.fail:
            raise RuntimeError("conflict")
        return obj


async def test_default_binder() -> None:
    client = RecordingClient()
    pl = mk(DefaultBinder, handle=Handle(client=client))  # type: ignore[arg-type]
    p = pod("web", uid="u1")
    assert await pl.bind(CycleState(), PodInfo(p), "n7") is None
    plural, obj, ns, kw = client.calls[0]
    assert plural == "pods" and ns == "default" and kw == {"subresource": "binding", "name": "web"}
    assert obj == {"apiVersion": "v1", "kind": "Binding",
                   "metadata": {"name": "web", "namespace": "default", "uid": "u1"},
                   "target": {"kind": "Node", "name": "n7"}}
    failing = mk(DefaultBinder, handle=Handle(client=RecordingClient(fail=True)))  # type: ignore[arg-type]
    s = await failing.bind(CycleState(), PodInfo(p), "n7")
    assert s is not None and s.code == Code.ERROR and "conflict" in s.message()
