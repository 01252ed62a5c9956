"""The vectorised Filter/Score path gives exactly the generic path's results.

Randomised clusters (seeded): nodes with varied allocatable (including zero
and extended resources), taints of every effect, unschedulable nodes,
images, used host ports and existing pods; pods with varied requests,
tolerations, node selectors, host ports, images and pinned node names.
Two schedulers over identical caches, one with the fast path and one
without, must agree on every cycle: chosen host, feasible count, evaluated
count, rotating start index, and each rejected node's status.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from kubeplane.scheduler.cache import Snapshot
from kubeplane.scheduler.framework.fastpath import FastPath, NodeArrays, arrays_for, select_host_index
from kubeplane.scheduler.framework.nodeinfo import NodeInfo, PodInfo
from kubeplane.scheduler.framework.plugin import Handle
from kubeplane.scheduler.framework.plugin import Plugin
from kubeplane.scheduler.plugins.registry import in_tree_registry
from kubeplane.scheduler.framework.runtime import Framework
from kubeplane.scheduler.framework.types import CycleState
from kubeplane.scheduler.scheduler import FitError, Scheduler, num_feasible_nodes_to_find

TAINT_KEYS = ["dedicated", "gpu", "spot"]
EFFECTS = ["NoSchedule", "PreferNoSchedule", "NoExecute"]
IMAGES = ["nginx:1.27", "redis:7", "busybox"]


def make_node(rng: random.Random, name: str) -> dict:
    alloc = {"cpu": rng.choice(["0", "1", "2", "4", "8"]) if rng.random() < 0.1 else rng.choice(["2", "4", "8"]),
             "memory": rng.choice(["4Gi", "8Gi", "32Gi"]) if rng.random() > 0.05 else "0",
             "pods": str(rng.choice([2, 5, 110]))}
    if rng.random() < 0.3:
        alloc["ephemeral-storage"] = rng.choice(["10Gi", "100Gi"])
    if rng.random() < 0.2:
        alloc["example.com/gpu"] = str(rng.choice([0, 1, 4]))
    labels = {"kubernetes.io/hostname": name, "zone": rng.choice(["a", "b", "c"])}
    if rng.random() < 0.3:
        labels["disk"] = rng.choice(["ssd", "hdd"])
    spec: dict = {}
    if rng.random() < 0.3:
        spec["taints"] = [{"key": rng.choice(TAINT_KEYS), "value": rng.choice(["", "x"]), "effect": rng.choice(EFFECTS)}
                          for _ in range(rng.randint(1, 2))]
    if rng.random() < 0.1:
        spec["unschedulable"] = True
    status: dict = {"allocatable": alloc, "capacity": dict(alloc)}
    if rng.random() < 0.3:
        status["images"] = [{"names": [img], "sizeBytes": rng.choice([50, 300, 900]) * 1024 * 1024}
                            for img in rng.sample(IMAGES, rng.randint(1, 2))]
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}, "spec": spec,
            "status": status}


def make_pod(rng: random.Random, name: str, node_names: list[str], node_name: str = "") -> dict:
    requests: dict = {}
    if rng.random() < 0.9:
        requests["cpu"] = rng.choice(["100m", "500m", "1", "3"])
    if rng.random() < 0.8:
        requests["memory"] = rng.choice(["128Mi", "500Mi", "2Gi", "6Gi"])
    if rng.random() < 0.1:
        requests["ephemeral-storage"] = rng.choice(["1Gi", "50Gi"])
    if rng.random() < 0.05:
        requests["example.com/gpu"] = "1"
    container: dict = {"name": "c", "image": rng.choice(IMAGES), "resources": {"requests": requests}}
    if rng.random() < 0.1:
        container["ports"] = [{"containerPort": 80, "hostPort": rng.choice([80, 8080])}]
    spec: dict = {"containers": [container], "schedulerName": "default-scheduler"}
    if rng.random() < 0.3:
        spec["tolerations"] = [
            rng.choice([{"key": rng.choice(TAINT_KEYS), "operator": "Exists"},
                        {"key": rng.choice(TAINT_KEYS), "value": "x", "effect": rng.choice(EFFECTS)},
                        {"operator": "Exists", "effect": "PreferNoSchedule"},
                        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}])]
    if rng.random() < 0.1:
        spec["nodeSelector"] = {"disk": "ssd"}
    if rng.random() < 0.05:
        spec["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 5, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}]}}
    if rng.random() < 0.05 and node_names:
        pinned = rng.sample(node_names, min(len(node_names), rng.randint(1, 30)))
        spec.setdefault("affinity", {})["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [n]}]}
                                  for n in pinned]}}
    if rng.random() < 0.03 and node_names:
        spec["nodeName"] = rng.choice(node_names)
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"}, "spec": spec}


def _twin_schedulers(seed: int, pct: int | None, profile: dict | None = None) -> tuple[Scheduler, Scheduler]:
    profiles = None if profile is None else [dict(profile, schedulerName="default-scheduler")]
    fast = Scheduler(None, rng=random.Random(seed), percentage_of_nodes_to_score=pct, profiles=profiles)
    slow = Scheduler(None, rng=random.Random(seed), percentage_of_nodes_to_score=pct, profiles=profiles)
    slow.use_fast_path = False
    return fast, slow


GPU = "example.com/gpu"

#: non-default profiles: other scoring strategies, unequal weights, addedAffinity,
#: disabled plugins, extended resources
PROFILES: dict[str, dict] = {
    "most-allocated-unequal-resource-weights": {"pluginConfig": [{"name": "NodeResourcesFit", "args": {
        "scoringStrategy": {"type": "MostAllocated", "resources": [{"name": "cpu", "weight": 3},
                                                                   {"name": "memory", "weight": 1}]}}}]},
    "most-allocated-extended": {"pluginConfig": [{"name": "NodeResourcesFit", "args": {
        "scoringStrategy": {"type": "MostAllocated", "resources": [{"name": "cpu", "weight": 1},
                                                                   {"name": GPU, "weight": 2}]}}}]},
    "least-allocated-memory-only": {"pluginConfig": [{"name": "NodeResourcesFit", "args": {
        "scoringStrategy": {"type": "LeastAllocated", "resources": [{"name": "memory", "weight": 2}]}}}]},
    "requested-to-capacity-ratio": {"pluginConfig": [{"name": "NodeResourcesFit", "args": {
        "scoringStrategy": {"type": "RequestedToCapacityRatio",
                            "resources": [{"name": "cpu", "weight": 2}, {"name": "memory", "weight": 1}],
                            "requestedToCapacityRatio": {"shape": [{"utilization": 0, "score": 0},
                                                                   {"utilization": 60, "score": 10},
                                                                   {"utilization": 100, "score": 2}]}}}}]},
    "unequal-plugin-weights": {"plugins": {"score": {"enabled": [
        {"name": "TaintToleration", "weight": 1}, {"name": "NodeAffinity", "weight": 7},
        {"name": "NodeResourcesFit", "weight": 4}, {"name": "ImageLocality", "weight": 5},
        {"name": "NodeResourcesBalancedAllocation", "weight": 3}]}}},
    "added-affinity": {"pluginConfig": [{"name": "NodeAffinity", "args": {"addedAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]},
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 40, "preference": {"matchExpressions": [{"key": "disk", "operator": "Exists"}]}}]}}}]},
    "disabled-plugins": {"plugins": {
        "filter": {"disabled": [{"name": "TaintToleration"}, {"name": "NodePorts"}]},
        "score": {"disabled": [{"name": "ImageLocality"}, {"name": "NodeResourcesBalancedAllocation"}]},
        "multiPoint": {"disabled": [{"name": "NodeUnschedulable"}]}}},
    "extended-resources": {"pluginConfig": [
        {"name": "NodeResourcesFit", "args": {"ignoredResources": ["example.com/other"], "scoringStrategy": {
            "type": "LeastAllocated", "resources": [{"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1},
                                                    {"name": GPU, "weight": 5}]}}},
        {"name": "NodeResourcesBalancedAllocation", "args": {"resources": [
            {"name": "cpu", "weight": 1}, {"name": GPU, "weight": 1}]}}]},
    "ignored-extended-group": {"pluginConfig": [
        {"name": "NodeResourcesFit", "args": {"ignoredResourceGroups": ["example.com"]}}]},
    "balanced-three-resources": {"pluginConfig": [
        {"name": "NodeResourcesBalancedAllocation", "args": {"resources": [
            {"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1},
            {"name": "ephemeral-storage", "weight": 1}]}}]},
}


def _status_view(diag) -> dict:
    return {n: (s.code, tuple(s.reasons), s.plugin) for n, s in diag.node_to_status.items()}


@pytest.mark.parametrize("seed", range(12))
def test_fast_path_matches_generic_scheduling(seed: int) -> None:
    _compare_twins(seed)


@pytest.mark.parametrize("name", sorted(PROFILES))
@pytest.mark.parametrize("seed", range(3))
def test_fast_path_matches_generic_scheduling_in_other_profiles(name: str, seed: int) -> None:
    _compare_twins(1000 + seed, PROFILES[name])


def _compare_twins(seed: int, profile: dict | None = None) -> None:
    rng = random.Random(seed)
    num_nodes = rng.choice([5, 40, 150, 300])
    nodes = [make_node(rng, f"n{i}") for i in range(num_nodes)]
    names = [n["metadata"]["name"] for n in nodes]
    fast, slow = _twin_schedulers(seed, rng.choice([None, 0, 10, 50]), profile)
    existing = [make_pod(rng, f"e{i}", names, node_name=rng.choice(names)) for i in range(num_nodes // 2)]
    for s in (fast, slow):
        for n in nodes:
            s.cache.add_node(n)
        for p in existing:
            s.cache.add_pod(p)
    if rng.random() < 0.5:
        victim = make_pod(rng, "nominated", names)
        victim["spec"]["priority"] = 1000
        for s in (fast, slow):
            s.nominator.add_nominated_pod(victim, rng.choice(names))
    fw_fast, fw_slow = fast.frameworks["default-scheduler"], slow.frameworks["default-scheduler"]
    outcomes = {"scheduled": 0, "unschedulable": 0}
    for i in range(60):
        pod = make_pod(rng, f"p{i}", names)
        results = []
        for s, fw in ((fast, fw_fast), (slow, fw_slow)):
            try:
                r = s.schedule_pod(fw, CycleState(), PodInfo(pod))
                results.append(("ok", r.suggested_host, r.evaluated_nodes, r.feasible_nodes, s.next_start_node_index))
            except FitError as e:
                results.append(("fit", str(e), _status_view(e.diagnosis), sorted(e.diagnosis.unschedulable_plugins),
                                s.next_start_node_index))
        assert results[0] == results[1], f"cycle {i}"
        if results[0][0] == "ok":
            outcomes["scheduled"] += 1
            host = results[0][1]
            for s in (fast, slow):
                assumed = dict(pod, spec=dict(pod["spec"], nodeName=host))
                s.cache.assume_pod(assumed)
        else:
            outcomes["unschedulable"] += 1
        if i % 20 == 19:
            # Node churn: an update (taints/labels) and a removal.
            victim_node = rng.choice(nodes)
            new = make_node(rng, victim_node["metadata"]["name"])
            for s in (fast, slow):
                s.cache.update_node(victim_node, new)
            nodes[nodes.index(victim_node)] = new
    assert outcomes["scheduled"] > 0


def test_fast_path_stops_after_enough_feasible_nodes_and_rotates() -> None:
    fast, slow = _twin_schedulers(3, None)
    rng = random.Random(3)
    nodes = [make_node(random.Random(i), f"n{i:04d}") for i in range(600)]
    for s in (fast, slow):
        for n in nodes:
            n = dict(n, spec={})
            s.cache.add_node(n)
    starts = []
    for i in range(5):
        pod = make_pod(rng, f"p{i}", [])
        pod["spec"].pop("nodeName", None)
        pod["spec"].pop("nodeSelector", None)
        rs = [s.schedule_pod(s.frameworks["default-scheduler"], CycleState(), PodInfo(pod)) for s in (fast, slow)]
        assert (rs[0].suggested_host, rs[0].evaluated_nodes, rs[0].feasible_nodes) == \
            (rs[1].suggested_host, rs[1].evaluated_nodes, rs[1].feasible_nodes)
        assert fast.next_start_node_index == slow.next_start_node_index
        starts.append(fast.next_start_node_index)
    # 600 nodes -> 46 % -> at most 276 feasible nodes per cycle; the start index moves on.
    assert rs[0].feasible_nodes <= num_feasible_nodes_to_find(None, 600) == 276
    assert starts[0] != 0 and len(set(starts)) > 1


def _framework_with_snapshot(snap: Snapshot, profile: dict | None = None) -> Framework:
    return Framework(in_tree_registry(), profile or {}, Handle(snapshot=snap))


@pytest.mark.parametrize("name", ["default", *sorted(PROFILES)])
def test_vectorised_scores_equal_plugin_scores_on_random_nodes(name: str) -> None:
    profile = PROFILES.get(name)
    rng = random.Random(7)
    nodes = [make_node(rng, f"n{i}") for i in range(200)]
    names = [n["metadata"]["name"] for n in nodes]
    infos = [NodeInfo(n) for n in nodes]
    for ni in infos:
        for j in range(rng.randint(0, 3)):
            ni.add_pod(make_pod(rng, f"{ni.name}-e{j}", names, node_name=ni.name))
    snap = Snapshot(infos)
    fw = _framework_with_snapshot(snap, profile)
    fp = FastPath(fw)
    arr = arrays_for(snap)
    for i in range(40):
        pi = PodInfo(make_pod(rng, f"p{i}", []))
        state = CycleState()
        fw.run_pre_filter_plugins(state, pi, snap.node_info_list)
        fw.run_pre_score_plugins(state, pi, snap.node_info_list)
        rows = np.array(sorted(rng.sample(range(len(infos)), 120)), dtype=np.intp)
        sub_nodes = [snap.node_info_list[r] for r in rows.tolist()]
        totals, s = fp.score(state, pi, arr, rows, sub_nodes)
        expected, s2 = fw.run_score_plugins(state, pi, sub_nodes)
        assert s is None and s2 is None
        assert totals.tolist() == [nps.total_score for nps in expected]


def test_balanced_allocation_float_rounding_matches_python() -> None:
    # Fractions chosen so (1 - std) * 100 lands next to an integer.
    node = {"metadata": {"name": "n"}, "spec": {},
            "status": {"allocatable": {"cpu": "3", "memory": "3", "pods": "10"}}}
    ni = NodeInfo(node)
    snap = Snapshot([ni])
    fw = _framework_with_snapshot(snap)
    pod = {"metadata": {"name": "p", "uid": "p"},
           "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "memory": "2"}}}]}}
    pi = PodInfo(pod)
    state = CycleState()
    fw.run_pre_score_plugins(state, pi, [ni])
    fp = FastPath(fw)
    got, _ = fp.score(state, pi, arrays_for(snap), np.array([0]), [ni])
    want, _ = fw.run_score_plugins(state, pi, [ni])
    assert got.tolist() == [want[0].total_score]


def test_memoized_rows_are_recomputed_after_a_change() -> None:
    infos = [NodeInfo({"metadata": {"name": f"n{i}"}, "spec": {},
                       "status": {"allocatable": {"cpu": "1", "memory": "1Gi", "pods": "3"}}}) for i in range(40)]
    arr = NodeArrays(infos)
    batches: list[list[int]] = []
    singles: list[int] = []

    def compute(rows: np.ndarray) -> np.ndarray:
        batches.append(rows.tolist())
        return arr.cols[4, rows] + 1

    def compute_one(row: int) -> int:
        singles.append(row)
        return int(arr.cols[4, row]) + 1

    def get(sel):
        return arr.memoized("k", np.int64, compute, compute_one, sel).tolist()

    assert get(slice(0, 40)) == [1] * 40
    assert get(slice(0, 40)) == [1] * 40
    assert batches == [list(range(40))] and singles == []
    infos[2].add_pod({"metadata": {"name": "x", "uid": "x"},
                      "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "500m"}}}]}})
    arr.set_row(2, infos[2])
    assert singles == [2] and len(batches) == 1
    assert get(np.array([5, 2, 7])) == [1, 501, 1]
    assert singles == [2]
    # The same pod confirmed (another object, same requests): nothing a memo reads changed.
    infos[2].remove_pod({"metadata": {"name": "x", "uid": "x"}})
    infos[2].add_pod({"metadata": {"name": "x", "uid": "x"}, "spec": {"nodeName": "n2", "containers": [
        {"name": "c", "resources": {"requests": {"cpu": "500m"}}}]}})
    arr.set_row(2, infos[2])
    assert singles == [2]
    # A new Node object (labels may differ) recomputes the row even with equal columns.
    infos[2].set_node(dict(infos[2].node, metadata={"name": "n2", "labels": {"a": "b"}}))
    arr.set_row(2, infos[2])
    assert singles == [2, 2] and get(slice(2, 3)) == [501]


def test_select_host_is_uniform_among_ties_and_prefers_the_maximum() -> None:
    rng = random.Random(0)
    totals = np.array([5, 9, 3, 9, 9, 1])
    picks = [select_host_index(totals, rng) for _ in range(3000)]
    assert set(picks) == {1, 3, 4}
    for idx in (1, 3, 4):
        assert 850 < picks.count(idx) < 1150
    assert select_host_index(np.array([1, 7, 2]), rng) == 1


def _random_container(rng: random.Random, name: str) -> dict:
    requests = {}
    for res, choices in (("cpu", ["0", "100m", "1", 2]), ("memory", ["0", "64Mi", "1Gi"]),
                         ("ephemeral-storage", ["1Gi"]), ("example.com/foo", ["1", "3"]), ("pods", ["1"])):
        if rng.random() < 0.5:
            requests[res] = rng.choice(choices)
    c: dict = {"name": name, "image": "img"}
    if requests or rng.random() < 0.5:
        c["resources"] = {"requests": requests}
    return c


@pytest.mark.parametrize("seed", range(5))
def test_pod_info_requests_match_pod_requests(seed: int) -> None:
    from kubeplane.scheduler.framework.nodeinfo import _NON_ZERO_DEFAULTS, pod_requests

    rng = random.Random(seed)
    for i in range(200):
        spec: dict = {"containers": [_random_container(rng, f"c{j}") for j in range(rng.randint(0, 3))]}
        if rng.random() < 0.2:
            spec["initContainers"] = [dict(_random_container(rng, "i0"), restartPolicy=rng.choice(["Always", None]))]
        if rng.random() < 0.1:
            spec["overhead"] = {"cpu": "50m"}
        if rng.random() < 0.1:
            spec["resources"] = {"requests": {"cpu": "2"}}
        pod = {"metadata": {"name": f"p{i}", "uid": f"p{i}"}, "spec": spec}
        pi = PodInfo(pod)
        nz = pod_requests(pod, _NON_ZERO_DEFAULTS)
        assert pi.requests == pod_requests(pod)
        assert list(pi.requests) == list(pod_requests(pod))
        assert (pi.non_zero_cpu, pi.non_zero_memory) == (nz.get("cpu", 0), nz.get("memory", 0))


def test_huge_quantities_fall_back_to_the_plugins() -> None:
    fast, slow = _twin_schedulers(11, None)
    rng = random.Random(11)
    for s in (fast, slow):
        for i in range(30):
            memory = "64Pi" if i % 3 == 0 else "8Gi"
            s.cache.add_node({"metadata": {"name": f"n{i}", "labels": {}}, "spec": {},
                              "status": {"allocatable": {"cpu": "4", "memory": memory, "pods": "10"}}})
    for i in range(40):
        pod = make_pod(rng, f"p{i}", [])
        pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m", "memory": rng.choice(["1Gi", "9Pi"])}}
        results = []
        for s in (fast, slow):
            try:
                r = s.schedule_pod(s.frameworks["default-scheduler"], CycleState(), PodInfo(pod))
                results.append((r.suggested_host, r.feasible_nodes, s.next_start_node_index))
            except FitError as e:
                results.append((str(e), s.next_start_node_index))
        assert results[0] == results[1]
        if len(results[0]) == 3:
            for s in (fast, slow):
                s.cache.assume_pod(dict(pod, spec=dict(pod["spec"], nodeName=results[0][0])))
    assert arrays_for(fast.snapshot).num_big == 10


@pytest.mark.parametrize("seed", range(6))
def test_bulk_rejection_statuses_equal_the_plugins_own(seed: int) -> None:
    """Pods that fit almost nowhere: every rejected node's status (computed in bulk for
    NodeResourcesFit, NodeUnschedulable and TaintToleration) equals the per-node plugin's."""
    rng = random.Random(100 + seed)
    nodes = [make_node(rng, f"n{i}") for i in range(400)]
    names = [n["metadata"]["name"] for n in nodes]
    fast, slow = _twin_schedulers(seed, None)
    for s in (fast, slow):
        for n in nodes:
            s.cache.add_node(n)
        for j in range(900):
            s.cache.add_pod(make_pod(random.Random(j), f"e{j}", names, node_name=names[j % len(names)]))
    bulk_calls: list[int] = []
    original = FastPath._bulk_statuses

    def counting(self, *args, **kwargs):
        out, todo, sure = original(self, *args, **kwargs)
        assert sorted(todo + sure) == [i for i, st in enumerate(out) if st is None]
        bulk_calls.append(sum(st is not None for st in out))
        return out, todo, sure

    FastPath._bulk_statuses = counting
    try:
        for i in range(30):
            pod = make_pod(rng, f"p{i}", names)
            pod["spec"].pop("nodeName", None)
            res = pod["spec"]["containers"][0]["resources"]["requests"]
            res["cpu"] = rng.choice(["3", "7", "9"])
            res["memory"] = rng.choice(["6Gi", "30Gi", "40Gi"])
            results = []
            for s in (fast, slow):
                try:
                    r = s.schedule_pod(s.frameworks["default-scheduler"], CycleState(), PodInfo(pod))
                    results.append(("ok", r.suggested_host, r.evaluated_nodes, r.feasible_nodes))
                except FitError as e:
                    results.append(("fit", str(e), _status_view(e.diagnosis),
                                    sorted(e.diagnosis.unschedulable_plugins)))
            assert results[0] == results[1], f"pod {i}"
    finally:
        FastPath._bulk_statuses = original
    # the bulk path ran and decided most rejected nodes
    assert bulk_calls and sum(bulk_calls) > 1000


class _PassExceptPlugin(Plugin):
    """A Filter plugin with the ``filter_pass_except`` hook: rejects the nodes it lists."""

    name = "PassExcept"

    def __init__(self, rejected: set[str], answer_none: bool = False, pass_only: set[str] | None = None) -> None:
        self.rejected = rejected
        self.answer_none = answer_none
        self.pass_only = pass_only
        self.filtered: list[str] = []

    def filter(self, state, pod_info, node_info):
        from kubeplane.scheduler.framework.types import Status
        self.filtered.append(node_info.name)
        if node_info.name in self.rejected:
            return Status.unschedulable("listed")
        return None

    def filter_pass_except(self, state, pod_info):
        from kubeplane.scheduler.framework.types import PassOnly
        if self.pass_only is not None:
            return PassOnly(self.pass_only)
        return None if self.answer_none else self.rejected


def test_pass_only_answer_calls_filter_on_every_other_node() -> None:
    sched = Scheduler(None, rng=random.Random(1), percentage_of_nodes_to_score=100)
    for i in range(50):
        sched.cache.add_node({"metadata": {"name": f"n{i:02d}", "labels": {}}, "spec": {},
                              "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}})
    fw = sched.frameworks["default-scheduler"]
    rejected = {f"n{i:02d}" for i in range(50) if i % 10}
    plugin = _PassExceptPlugin(rejected, pass_only={"n00", "n10", "n20", "gone"})
    fw.filter_plugins.append(plugin)
    pod = {"metadata": {"name": "p", "namespace": "default", "uid": "p"},
           "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "100m"}}}]}}
    r = sched.schedule_pod(fw, CycleState(), PodInfo(pod))
    assert r.feasible_nodes == 5 and r.suggested_host not in rejected
    # Filter ran on the 47 nodes outside the answer, not on n00, n10 and n20.
    assert len(plugin.filtered) == 47 and not {"n00", "n10", "n20"} & set(plugin.filtered)


@pytest.mark.parametrize("answer_none", [False, True])
def test_filter_pass_except_hook_calls_filter_only_on_listed_nodes(answer_none: bool) -> None:
    sched = Scheduler(None, rng=random.Random(1), percentage_of_nodes_to_score=100)
    for i in range(50):
        sched.cache.add_node({"metadata": {"name": f"n{i:02d}", "labels": {}}, "spec": {},
                              "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}})
    fw = sched.frameworks["default-scheduler"]
    plugin = _PassExceptPlugin({"n03", "n17", "n40"}, answer_none)
    fw.filter_plugins.append(plugin)
    pod = make_pod(random.Random(5), "p", [])
    pod["spec"] = {"containers": [{"name": "c", "resources": {"requests": {"cpu": "100m"}}}]}
    r = sched.schedule_pod(fw, CycleState(), PodInfo(pod))
    assert r.feasible_nodes == 47 and r.suggested_host not in plugin.rejected
    if answer_none:
        assert len(plugin.filtered) == 50
    else:
        assert sorted(plugin.filtered) == ["n03", "n17", "n40"]


class _RejectAllButPlugin(Plugin):
    """A Filter plugin that rejects every node but a few, stating the rejections
    in bulk (``EVERY_NODE`` + ``filter_known_statuses``)."""

    name = "RejectAllBut"

    def __init__(self, maybe: set[str], passing: set[str]) -> None:
        from kubeplane.scheduler.framework.types import Status
        self.maybe = maybe
        self.passing = passing
        self.status = Status.unresolvable("no volume here", plugin=self.name)
        self.filtered: list[str] = []

    def filter(self, state, pod_info, node_info):
        self.filtered.append(node_info.name)
        return None if node_info.name in self.passing else self.status

    def filter_pass_except(self, state, pod_info):
        from kubeplane.scheduler.framework.types import EVERY_NODE
        return EVERY_NODE

    def filter_known_statuses(self, state, pod_info):
        return {f"n{i:02d}": self.status for i in range(50) if f"n{i:02d}" not in self.maybe}


@pytest.mark.parametrize("passing", [set(), {"n17"}])
def test_every_node_answer_states_rejections_in_bulk(passing: set[str]) -> None:
    from kubeplane.scheduler.scheduler import FitError

    sched = Scheduler(None, rng=random.Random(1), percentage_of_nodes_to_score=100)
    for i in range(50):
        sched.cache.add_node({"metadata": {"name": f"n{i:02d}", "labels": {}}, "spec": {},
                              "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}})
    fw = sched.frameworks["default-scheduler"]
    plugin = _RejectAllButPlugin({"n03", "n17"}, passing)
    fw.filter_plugins.append(plugin)
    pod = make_pod(random.Random(5), "p", [])
    pod["spec"] = {"containers": [{"name": "c", "resources": {"requests": {"cpu": "100m"}}}]}
    if passing:
        r = sched.schedule_pod(fw, CycleState(), PodInfo(pod))
        assert r.suggested_host == "n17" and r.feasible_nodes == 1
    else:
        with pytest.raises(FitError) as err:
            sched.schedule_pod(fw, CycleState(), PodInfo(pod))
        assert str(err.value) == "0/50 nodes are available: 50 no volume here."
        assert err.value.diagnosis.unschedulable_plugins == {"RejectAllBut"}
    assert sorted(plugin.filtered) == ["n03", "n17"]  # Filter ran only where the answer was not known


@pytest.mark.parametrize("free", [{"n05"}, set()])
def test_statuses_of_certain_rejections_are_computed_only_when_the_cycle_fails(
        free: set[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from kubeplane.scheduler.plugins.node_resources_fit import NodeResourcesFit

    sched = Scheduler(None, rng=random.Random(1), percentage_of_nodes_to_score=100)
    for i in range(10):
        sched.cache.add_node({"metadata": {"name": f"n{i:02d}", "labels": {}}, "spec": {},
                              "status": {"allocatable": {"cpu": "1", "memory": "8Gi", "pods": "110"}}})
        if f"n{i:02d}" not in free:
            sched.cache.add_pod({"metadata": {"name": f"big{i}", "namespace": "default", "uid": f"big{i}"},
                                 "spec": {"nodeName": f"n{i:02d}", "containers": [
                                     {"name": "c", "resources": {"requests": {"cpu": "900m"}}}]}})
    calls: list[str] = []
    real = NodeResourcesFit.filter

    def spy(self, state, pod_info, node_info):
        calls.append(node_info.name)
        return real(self, state, pod_info, node_info)
    monkeypatch.setattr(NodeResourcesFit, "filter", spy)
    fw = sched.frameworks["default-scheduler"]
    pod = {"metadata": {"name": "p", "namespace": "default", "uid": "p"},
           "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "500m"}}}]}}
    if free:
        r = sched.schedule_pod(fw, CycleState(), PodInfo(pod))
        # Nine nodes rejected by the resource mask alone: counted, never filtered.
        assert (r.suggested_host, r.evaluated_nodes, r.feasible_nodes) == ("n05", 10, 1)
        assert calls == []
    else:
        with pytest.raises(FitError) as err:
            sched.schedule_pod(fw, CycleState(), PodInfo(pod))
        assert str(err.value).startswith("0/10 nodes are available: 10 Insufficient cpu.")
        # Now every status is computed (in bulk, from the same arrays as the mask).
        statuses = err.value.diagnosis.node_to_status
        assert sorted(statuses) == [f"n{i:02d}" for i in range(10)]
        assert {(st.plugin, tuple(st.reasons)) for st in statuses.values()} == {
            ("NodeResourcesFit", ("Insufficient cpu",))}
        assert calls == []


def test_row_with_unchanged_numbers_still_follows_host_ports_and_node() -> None:
    """A set_row that finds the same numbers and Node skips the row, but not
    when the host ports in use or the Node (its taints) changed."""
    infos = [NodeInfo({"metadata": {"name": "n0"}, "spec": {},
                       "status": {"allocatable": {"cpu": "1", "memory": "1Gi", "pods": "3"}}})]
    arr = NodeArrays(infos)
    ni = infos[0]

    def pod(ports: bool) -> dict:
        c = {"name": "c", "resources": {"requests": {"cpu": "500m"}}}
        if ports:
            c["ports"] = [{"containerPort": 80, "hostPort": 8080}]
        return {"metadata": {"name": "x", "uid": "x"}, "spec": {"nodeName": "n0", "containers": [c]}}

    ni.add_pod(pod(ports=True))
    arr.set_row(0, ni)
    assert bool(arr.has_ports[0]) and arr.num_ports == 1
    # The same pod again without its host port: equal numbers, the ports flag clears.
    ni.remove_pod(pod(ports=True))
    ni.add_pod(pod(ports=False))
    arr.set_row(0, ni)
    assert not bool(arr.has_ports[0]) and arr.num_ports == 0
    # A new Node object with a taint and equal numbers: the taint group follows.
    ni.set_node(dict(ni.node, spec={"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]}))
    arr.set_row(0, ni)
    assert arr.num_tainted == 1 and int(arr.taint_gid[0]) != 0


@pytest.mark.parametrize("name", ["default", "unequal-plugin-weights", "requested-to-capacity-ratio"])
def test_fast_path_records_the_plugin_metrics_of_the_generic_path(name: str) -> None:
    """In a sampled cycle both paths record scheduler_plugin_execution_duration_seconds
    for the same plugins at the same extension points."""
    from kubeplane.scheduler.metrics import SchedulerMetrics

    rng = random.Random(5)
    nodes = [make_node(rng, f"n{i}") for i in range(60)]
    fast, slow = _twin_schedulers(5, 100, PROFILES.get(name))
    seen = []
    for s in (fast, slow):
        m = SchedulerMetrics()
        s.frameworks["default-scheduler"].metrics = m
        for n in nodes:
            s.cache.add_node(n)
        pod = {"metadata": {"name": "p", "namespace": "default", "uid": "p"},
               "spec": {"containers": [{"name": "c", "image": "nginx:1.27",
                                        "resources": {"requests": {"cpu": "100m", "memory": "1Gi"}}}]}}
        state = CycleState()
        state.record_metrics = True
        s.schedule_pod(s.frameworks["default-scheduler"], state, PodInfo(pod))
        points = {(smp.labels["plugin"], smp.labels["extension_point"])
                  for metric in m.registry.collect() if metric.name == "scheduler_plugin_execution_duration_seconds"
                  for smp in metric.samples if smp.name.endswith("_count")}
        seen.append(points)
    assert seen[0] == seen[1]
    assert {p for p, ep in seen[0] if ep == "Filter"} >= {"NodeResourcesFit", "TaintToleration"}
    assert {ep for _, ep in seen[0]} >= {"PreFilter", "Filter", "PreScore", "Score"}
