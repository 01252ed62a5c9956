"""DefaultPreemption / preemption evaluator: victims, PDBs, candidate choice, API side effects."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from kubeplane.scheduler.cache import Snapshot
from kubeplane.scheduler.framework.nodeinfo import PodInfo
from kubeplane.scheduler.framework.plugin import Handle
from kubeplane.scheduler.plugins.registry import in_tree_registry
from kubeplane.scheduler.framework.runtime import Framework
from kubeplane.scheduler.framework.types import Code, CycleState, Status
from kubeplane.scheduler.nominator import Nominator
from kubeplane.scheduler.plugins.default_preemption import DefaultPreemption
from kubeplane.scheduler.preemption import (
    Candidate, NodeToStatus, Victims, filter_pods_with_pdb_violation, fit_error_message,
    pick_one_node_for_preemption, preemption_message,
)
from fake_client import RecordingClient as FakeClient


def node(name: str, cpu: str = "4", pods: int = 110, **labels: str) -> dict:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
            "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": str(pods)}}}


def pod(name: str, cpu: str = "1", prio: int = 0, node_name: str = "", labels: dict | None = None,
        start: str | None = None, **spec: Any) -> dict:
    s: dict[str, Any] = {"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": cpu}}}],
                         "priority": prio}
    if node_name:
        s["nodeName"] = node_name
    s.update(spec)
    p: dict[str, Any] = {"metadata": {"name": name, "namespace": "default", "uid": name, "labels": labels or {}},
                         "spec": s, "status": {}}
    if start:
        p["status"]["startTime"] = start
    return p


class Env:
    def __init__(self, nodes: list[dict], pods: list[dict], pdbs: list[dict] | None = None,
                 args: dict | None = None, nominator: Nominator | None = None) -> None:
        self.snap = Snapshot.from_objects(nodes, pods)
        self.client = FakeClient()
        self.handle = Handle(client=self.client, snapshot=self.snap, nominator=nominator, rng=random.Random(1))
        self.handle.pdb_lister = lambda: list(pdbs or [])
        profile = {"pluginConfig": [{"name": "DefaultPreemption", "args": args or {}}]}
        self.fw = Framework(in_tree_registry(), profile, self.handle)
        self.plugin: DefaultPreemption = self.fw.plugins["DefaultPreemption"]  # type: ignore[assignment]

    def schedule_fail(self, p: dict) -> tuple[CycleState, PodInfo, NodeToStatus]:
        state = CycleState()
        pi = PodInfo(p)
        _, s, _ = self.fw.run_pre_filter_plugins(state, pi, self.snap.node_info_list)
        assert s is None, s
        statuses = NodeToStatus()
        for ni in self.snap.node_info_list:
            st = self.fw.run_filter_plugins_with_nominated_pods(state, pi, ni)
            assert st is not None and st.is_rejected(), f"{ni.name} unexpectedly fits"
            statuses[ni.name] = st
        return state, pi, statuses

    def preempt(self, p: dict) -> tuple[str | None, Status]:
        state, pi, statuses = self.schedule_fail(p)
        return self.plugin.post_filter(state, pi, statuses)


def test_minimal_victim_set_and_api_calls() -> None:
    env = Env([node("n1")], [pod("p1", "1", 1, "n1"), pod("p2", "2", 2, "n1"), pod("p3", "1", 3, "n1")])
    name, st = env.preempt(pod("hi", "2", 10))
    assert (name, st.code) == ("n1", Code.SUCCESS)
    # Reprieve from the most important: p3 stays, p2 must go, then p1 fits again.
    assert env.client.deleted() == ["p2"]
    patch = [c for c in env.client.calls if c[0] == "patch"][0]
    assert patch[1] == "status" and patch[3] == "p2"
    cond = patch[4]["status"]["conditions"][0]
    assert cond["type"] == "DisruptionTarget" and cond["reason"] == "PreemptionByScheduler"
    assert cond["message"] == "default-scheduler: preempting to accommodate a higher priority pod"


def test_no_lower_priority_pods_and_not_helpful_message() -> None:
    nodes = [node("n1"), node("n2"), node("n3", cpu="1")]
    pods = [pod("a", "4", 100, "n1"), pod("b", "4", 100, "n2"), pod("c", "500m", 0, "n3")]
    env = Env(nodes, pods)
    name, st = env.preempt(pod("p", "2", 10))
    assert name == "" and st.code == Code.UNSCHEDULABLE
    assert st.message() == ("preemption: 0/3 nodes are available: 1 Insufficient cpu, "
                            "2 No preemption victims found for incoming pod.")
    assert env.client.calls == []


def test_unresolvable_nodes_are_not_candidates() -> None:
    env = Env([node("n1"), node("n2")], [pod("low", "4", 0, "n1")])
    p = pod("p", "2", 10, nodeSelector={"disk": "ssd"})
    name, st = env.preempt(p)
    assert name == ""
    assert st.message() == "preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."


def test_preemption_policy_never() -> None:
    env = Env([node("n1")], [pod("low", "4", 0, "n1")])
    name, st = env.preempt(pod("p", "2", 10, preemptionPolicy="Never"))
    assert name is None and st.code == Code.UNSCHEDULABLE
    assert st.message() == "preemption: not eligible due to preemptionPolicy=Never."
    assert env.client.calls == []


def test_terminating_victim_on_nominated_node_blocks_preemption() -> None:
    victim = pod("low", "4", 0, "n1")
    victim["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    victim["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True",
                                       "reason": "PreemptionByScheduler"}]
    env = Env([node("n1"), node("n2")], [victim, pod("low2", "4", 0, "n2")])
    p = pod("p", "2", 10)
    p["status"]["nominatedNodeName"] = "n1"
    name, st = env.preempt(p)
    assert name is None and st.message() == "preemption: not eligible due to a terminating pod on the nominated node."
    # Without the preemption condition the pod is eligible again.
    victim["status"]["conditions"] = []
    env = Env([node("n1"), node("n2")], [victim, pod("low2", "4", 0, "n2")])
    name, st = env.preempt(p)
    assert st.is_success() and name in ("n1", "n2")


def test_pdb_violating_candidates_come_last() -> None:
    pods = [pod("guarded", "4", 0, "n1", {"app": "db"}), pod("free", "4", 0, "n2", {"app": "web"})]
    pdb = {"metadata": {"name": "pdb", "namespace": "default"},
           "spec": {"selector": {"matchLabels": {"app": "db"}}}, "status": {"disruptionsAllowed": 0}}
    for _ in range(3):
        env = Env([node("n1"), node("n2")], pods, [pdb])
        name, st = env.preempt(pod("p", "2", 10))
        assert st.is_success() and name == "n2"
        assert env.client.deleted() == ["free"]
    # If the PDB is the only option it is still violated.
    env = Env([node("n1")], pods[:1], [pdb])
    name, _ = env.preempt(pod("p", "2", 10))
    assert name == "n1" and env.client.deleted() == ["guarded"]


def test_pdb_violating_victims_are_reprieved_first() -> None:
    pods = [pod("a", "2", 5, "n1", {"app": "db"}), pod("b", "2", 1, "n1", {"app": "web"})]
    pdb = {"metadata": {"name": "pdb", "namespace": "default"},
           "spec": {"selector": {"matchLabels": {"app": "db"}}}, "status": {"disruptionsAllowed": 0}}
    env = Env([node("n1")], pods, [pdb])
    state, pi, _ = env.schedule_fail(pod("p", "2", 10))
    ni = env.snap.get("n1").clone()
    victims, violations, st = env.plugin.evaluator.select_victims_on_node(state.clone(), pi, ni, [pdb])
    assert st.is_success() and [v.name for v in victims] == ["b"] and violations == 0
    # With the budget on the lower-priority pod, that one is reprieved first.
    pdb2 = {**pdb, "spec": {"selector": {"matchLabels": {"app": "web"}}}}
    victims, violations, st = env.plugin.evaluator.select_victims_on_node(
        state.clone(), pi, env.snap.get("n1").clone(), [pdb2])
    assert [v.name for v in victims] == ["a"] and violations == 0


def test_filter_pods_with_pdb_violation_counts_budget() -> None:
    pis = [PodInfo(pod(f"p{i}", labels={"app": "db"})) for i in range(3)] + [PodInfo(pod("nolabel"))]
    pdb = {"metadata": {"namespace": "default"}, "spec": {"selector": {"matchLabels": {"app": "db"}}},
           "status": {"disruptionsAllowed": 1, "disruptedPods": {"p0": "2024-01-01T00:00:00Z"}}}
    violating, ok = filter_pods_with_pdb_violation(pis, [pdb])
    assert [p.name for p in violating] == ["p2"] and [p.name for p in ok] == ["p0", "p1", "nolabel"]
    empty = {**pdb, "spec": {"selector": {}}}
    assert filter_pods_with_pdb_violation(pis, [empty])[0] == []
    other_ns = {**pdb, "metadata": {"namespace": "x"}, "status": {"disruptionsAllowed": 0}}
    assert filter_pods_with_pdb_violation(pis, [other_ns])[0] == []


def cand(name: str, prios: list[int], violations: int = 0, starts: list[str] | None = None) -> Candidate:
    pods = [PodInfo(pod(f"{name}-{i}", prio=p, start=(starts[i] if starts else None))) for i, p in enumerate(prios)]
    return Candidate(name, Victims(pods, violations))


@pytest.mark.parametrize("cands,want", [
    ([cand("a", [1], 1), cand("b", [5, 4], 0)], "b"),
    ([cand("a", [5]), cand("b", [3, 3, 3])], "b"),
    ([cand("a", [3, 2]), cand("b", [3, 1])], "b"),
    ([cand("a", [-5, -5]), cand("b", [-5])], "b"),
    ([cand("a", [3, 1, 1]), cand("b", [3, 2])], "b"),
    ([cand("a", [3, 1]), cand("b", [3, 0, 1])], "a"),
    ([cand("a", [3, 1], starts=["2024-01-01T00:00:00Z", "2024-06-01T00:00:00Z"]),
      cand("b", [3, 1], starts=["2024-02-01T00:00:00Z", "2023-01-01T00:00:00Z"])], "b"),
    ([cand("a", [2]), cand("b", [2])], "a"),
])
def test_pick_one_node_for_preemption(cands: list[Candidate], want: str) -> None:
    assert pick_one_node_for_preemption(cands).name == want


def test_best_candidate_chosen_across_nodes() -> None:
    nodes = [node("n1"), node("n2"), node("n3")]
    pods = [pod("a", "4", 7, "n1"), pod("b1", "2", 3, "n2"), pod("b2", "2", 3, "n2"),
            pod("c1", "2", 3, "n3"), pod("c2", "2", 2, "n3")]
    env = Env(nodes, pods)
    name, st = env.preempt(pod("p", "4", 10))
    # n1: highest victim 7; n2: [3, 3] sum; n3: [3, 2] lowest sum.
    assert name == "n3" and st.is_success()
    assert env.client.deleted() == ["c1", "c2"]


def test_lower_priority_nominated_pods_are_cleared() -> None:
    nom = Nominator()
    low_nom = pod("lownom", "1", 1)
    low_nom["status"]["nominatedNodeName"] = "n1"
    high_nom = pod("highnom", "1", 20)
    high_nom["status"]["nominatedNodeName"] = "n1"
    nom.add_nominated_pod(low_nom)
    nom.add_nominated_pod(high_nom)
    env = Env([node("n1", cpu="6")], [pod("v", "4", 0, "n1")], nominator=nom)
    name, st = env.preempt(pod("p", "2", 10))
    assert name == "n1" and st.is_success()
    clears = [c for c in env.client.calls if c[0] == "patch" and c[4] == {"status": {"nominatedNodeName": None}}]
    assert [c[3] for c in clears] == ["lownom"]


def test_own_nomination_cleared_when_preemption_cannot_help() -> None:
    env = Env([node("n1")], [pod("low", "4", 0, "n1")])
    p = pod("p", "2", 10, nodeSelector={"x": "y"})
    p["status"]["nominatedNodeName"] = "n1"
    name, _ = env.preempt(p)
    assert name == ""
    assert [c[3] for c in env.client.calls if c[0] == "patch"] == ["p"]


def test_anti_affinity_victim_via_remove_pod_extension() -> None:
    nodes = [node("n1", zone="z1")]
    existing = [pod("web", "1", 0, "n1", {"app": "web"}), pod("other", "1", 0, "n1", {"app": "x"})]
    env = Env(nodes, existing)
    p = pod("p", "1", 10, affinity={"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "zone"}]}})
    name, st = env.preempt(p)
    assert name == "n1" and st.is_success()
    assert env.client.deleted() == ["web"]


def test_background_preparation_on_running_loop() -> None:
    env = Env([node("n1")], [pod("low", "4", 0, "n1")])

    async def run() -> tuple[str | None, list[str], list[str]]:
        name, _ = env.preempt(pod("p", "2", 10))
        before = env.client.deleted()
        await env.plugin.evaluator.wait_for_preparations()
        return name, before, env.client.deleted()

    name, before, after = asyncio.run(run())
    assert name == "n1" and before == [] and after == ["low"]


def test_waiting_victim_is_rejected_not_deleted() -> None:
    env = Env([node("n1")], [pod("low", "4", 0, "n1")])

    async def run() -> Status:
        from kubeplane.scheduler.framework.runtime import WaitingPod
        low = env.snap.get("n1").pods[0]
        wp = WaitingPod(low, {"Gate": 60.0})
        env.fw.waiting_pods[low.uid] = wp
        env.preempt(pod("p", "2", 10))
        await env.plugin.evaluator.wait_for_preparations()
        return await wp.wait()

    st = asyncio.run(run())
    assert st.code == Code.UNSCHEDULABLE and st.message() == "preempted" and st.plugin == "DefaultPreemption"
    assert env.client.deleted() == []


def test_num_candidates_and_args() -> None:
    env = Env([node("n1")], [])
    ev = env.plugin.evaluator
    assert ev.calculate_num_candidates(50) == 50
    assert ev.calculate_num_candidates(5000) == 500
    ev2 = Env([node("n1")], [], args={"minCandidateNodesPercentage": 0, "minCandidateNodesAbsolute": 3}).plugin.evaluator
    assert ev2.calculate_num_candidates(10) == 3
    with pytest.raises(ValueError):
        DefaultPreemption({"minCandidateNodesPercentage": 0, "minCandidateNodesAbsolute": 0}, Handle())
    with pytest.raises(ValueError):
        DefaultPreemption({"minCandidateNodesPercentage": 101}, Handle())


def test_dry_run_stops_after_enough_candidates() -> None:
    nodes = [node(f"n{i}") for i in range(6)]
    pods = [pod(f"v{i}", "4", 0, f"n{i}") for i in range(6)]
    env = Env(nodes, pods, args={"minCandidateNodesPercentage": 0, "minCandidateNodesAbsolute": 2})
    state, pi, statuses = env.schedule_fail(pod("p", "2", 10))
    ev = env.plugin.evaluator
    cands, node_statuses = ev.find_candidates(state, pi, statuses, env.snap.node_info_list)
    assert len(cands) == 2 and node_statuses == {}
    names = [c.name for c in cands]
    idx = int(names[0][1:])
    assert names[1] == f"n{(idx + 1) % 6}"


def test_fit_error_message_formats() -> None:
    statuses = {"a": Status.unresolvable("No preemption victims found for incoming pod"),
                "b": Status.unresolvable("No preemption victims found for incoming pod")}
    assert preemption_message(5, statuses) == (
        "preemption: 0/5 nodes are available: 2 No preemption victims found for incoming pod, "
        "3 Preemption is not helpful for scheduling.")
    assert fit_error_message(2, {"a": Status.unschedulable("Insufficient cpu", "Too many pods"),
                                 "b": Status.unschedulable("Insufficient cpu")}) == (
        "0/2 nodes are available: 1 Too many pods, 2 Insufficient cpu.")


def test_victim_already_gone_is_not_an_error_but_other_failures_are() -> None:
    from kubeplane.api.errors import StatusError

    class GoneClient(FakeClient):
        def __init__(self, code: int) -> None:
            super().__init__()
            self.code = code

        async def delete(self, res: Any, name: str, namespace: str | None = None, **kw: Any) -> dict:
            raise StatusError(self.code, "X", f"pods {name!r} failed")

    for code, errors in ((404, 0), (500, 1)):
        env = Env([node("n1")], [pod("low", "4", 0, "n1")])
        env.handle.client = GoneClient(code)
        name, st = env.preempt(pod("p", "2", 10))
        assert name == "n1" and st.is_success()
        assert len(env.plugin.evaluator.errors) == errors


@pytest.mark.parametrize("seed", range(8))
def test_resource_arithmetic_dry_run_equals_the_general_one(seed: int) -> None:
    """When only NodeResourcesFit depends on a node's pods, victims are chosen by request sums;
    on random nodes, pods, priorities, start times and PDBs the result (victims, their order,
    PDB violations) equals the general dry run's, and the shortcut is taken on most nodes."""
    rng = random.Random(seed)
    nodes = [node(f"n{i}", cpu=rng.choice(["2", "4", "8"]), pods=rng.choice([3, 5, 110]),
                  zone=rng.choice(["a", "b"])) for i in range(40)]
    pods = []
    for i in range(160):
        pods.append(pod(f"e{i}", rng.choice(["100m", "500m", "900m", "1", "2"]), rng.choice([0, 1, 5, 20]),
                        f"n{rng.randrange(40)}", labels={"app": rng.choice(["x", "y"])},
                        start=f"2026-01-01T00:00:{rng.randrange(60):02d}Z"))
    pdbs = [{"metadata": {"name": "b", "namespace": "default"},
             "spec": {"selector": {"matchLabels": {"app": "x"}}},
             "status": {"disruptionsAllowed": rng.choice([0, 1, 3])}}]
    env = Env(nodes, pods, pdbs)
    ev = env.plugin.evaluator
    shortcut = unfit = 0
    for j in range(25):
        preemptor = pod(f"hi{j}", rng.choice(["1", "2", "3", "6"]), rng.choice([2, 10, 30]))
        if rng.random() < 0.3:
            preemptor["spec"]["nodeSelector"] = {"zone": "a"}
        state = CycleState()
        pi = PodInfo(preemptor)
        env.fw.run_pre_filter_plugins(state, pi, env.snap.node_info_list)
        arithmetic = ev._resource_only_filters(state, pi)
        assert arithmetic is not None
        for ni in env.snap.node_info_list:
            general = ev.select_victims_on_node(state.clone(), pi, ni.clone(), pdbs)
            quick = ev._select_victims_by_resources(state, pi, ni, pdbs, *arithmetic[:3])
            if quick is None:
                assert not general[2].is_success()
                continue
            shortcut += 1
            assert [v.uid for v in quick[0]] == [v.uid for v in general[0]]
            assert quick[1] == general[1]
            assert (quick[2].code, quick[2].reasons, quick[2].plugin) == \
                (general[2].code, general[2].reasons, general[2].plugin)
            unfit += not quick[2].is_success() and quick[2].plugin == "NodeResourcesFit"
    assert shortcut > 300 and unfit > 20


def test_arithmetic_dry_run_is_not_used_when_other_filters_depend_on_pods() -> None:
    env = Env([node("n1")], [pod("p1", "1", 1, "n1")])
    p = pod("hi", "1", 10, labels={"app": "z"})
    p["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "z"}}, "topologyKey": "kubernetes.io/hostname"}]}}
    state = CycleState()
    pi = PodInfo(p)
    env.fw.run_pre_filter_plugins(state, pi, env.snap.node_info_list)
    assert env.plugin.evaluator._resource_only_filters(state, pi) is None


def _count_dry_runs(env: Env) -> list[str]:
    """Names of the nodes the evaluator's resource-only dry run is computed for, as it runs."""
    ev = env.plugin.evaluator
    calls: list[str] = []
    original = ev._select_victims_by_resources

    def counting(state, pi, ni, *rest):
        calls.append(ni.name)
        return original(state, pi, ni, *rest)

    ev._select_victims_by_resources = counting  # type: ignore[method-assign]
    return calls


def test_failed_dry_runs_are_reused_only_while_node_and_pod_shape_are_unchanged() -> None:
    """A 9-CPU preemptor fits no 4-CPU node: the second identical preemptor reuses every
    node's failed dry run; a changed node, or a pod of another shape, is evaluated again,
    and the statuses always equal those of a fresh evaluator."""
    nodes = [node(f"n{i}") for i in range(30)]
    pods = [pod(f"e{i}", "1", 0, f"n{i % 30}") for i in range(60)]
    env = Env(nodes, pods)
    ev = env.plugin.evaluator
    calls = _count_dry_runs(env)

    def statuses_for(p: dict) -> dict:
        state, pi, statuses = env.schedule_fail(p)
        cands, st = ev.find_candidates(state, pi, statuses, env.snap.node_info_list)
        assert cands == []
        return {n: (s.code, tuple(s.reasons), s.plugin) for n, s in st.items()}

    first = statuses_for(pod("h1", "9", 10))
    assert len(calls) == 30
    again = statuses_for(pod("h2", "9", 10))
    assert again == first and len(calls) == 30
    env.snap.node_info_map["n3"].add_pod(PodInfo(pod("late", "1", 0, "n3")))
    changed = statuses_for(pod("h3", "9", 10))
    assert calls[30:] == ["n3"]
    other = statuses_for(pod("h4", "5", 10))
    assert len(calls) == 61
    fresh = Env(nodes, pods + [pod("late", "1", 0, "n3")])
    state, pi, statuses = fresh.schedule_fail(pod("h5", "9", 10))
    _, want = fresh.plugin.evaluator.find_candidates(state, pi, statuses, fresh.snap.node_info_list)
    assert changed == {n: (s.code, tuple(s.reasons), s.plugin) for n, s in want.items()}
    assert set(other) == set(changed)


def test_successful_dry_runs_are_reused_without_pdbs_only() -> None:
    """Without PDBs a successful dry run is reused while the node and the pod shape are
    unchanged: the candidates (victims, their order) equal a fresh evaluator's. With a
    PDB only failed dry runs are reused."""
    nodes = [node(f"n{i}") for i in range(12)]
    pods = [pod(f"e{i}", "1", i % 3, f"n{i % 12}", start=f"2026-01-01T00:00:{i:02d}Z") for i in range(48)]

    def candidates(env: Env, p: dict) -> list[tuple[str, list[str], int]]:
        state, pi, statuses = env.schedule_fail(p)
        cands, _ = env.plugin.evaluator.find_candidates(state, pi, statuses, env.snap.node_info_list)
        return sorted((c.name, [v.name for v in c.victims.pods], c.victims.num_pdb_violations) for c in cands)

    args = {"minCandidateNodesPercentage": 100}
    env = Env(nodes, pods, args=args)
    calls = _count_dry_runs(env)
    first = candidates(env, pod("h1", "2", 10))
    assert len(first) == 12 and len(calls) == 12
    assert candidates(env, pod("h2", "2", 10)) == first and len(calls) == 12
    env.snap.node_info_map["n3"].add_pod(PodInfo(pod("late", "1", 0, "n3", start="2026-01-01T00:01:00Z")))
    changed = candidates(env, pod("h3", "2", 10))
    assert calls[12:] == ["n3"]
    fresh = Env(nodes, pods + [pod("late", "1", 0, "n3", start="2026-01-01T00:01:00Z")], args=args)
    assert changed == candidates(fresh, pod("h4", "2", 10))

    pdbs = [{"metadata": {"name": "b", "namespace": "default"}, "spec": {"selector": {"matchLabels": {}}},
             "status": {"disruptionsAllowed": 1}}]
    with_pdb = Env(nodes, pods, pdbs, args=args)
    calls = _count_dry_runs(with_pdb)
    candidates(with_pdb, pod("h1", "2", 10))
    candidates(with_pdb, pod("h2", "2", 10))
    assert len(calls) == 24


def test_pod_info_start_time_is_parsed_once_and_unset_or_bad_is_latest():
    import math

    from kubeplane.scheduler.framework.nodeinfo import PodInfo

    pi = PodInfo({"metadata": {"name": "a", "uid": "1"}, "status": {"startTime": "2026-01-01T00:00:10Z"}})
    assert pi.start_time == 1767225610.0
    pi.pod["status"]["startTime"] = "2026-01-01T00:00:20Z"  # PodInfo is rebuilt on updates: value kept
    assert pi.start_time == 1767225610.0
    assert PodInfo({"metadata": {"name": "b", "uid": "2"}}).start_time == math.inf
    assert PodInfo({"metadata": {"name": "c", "uid": "3"}, "status": {"startTime": "yesterday"}}).start_time == math.inf
