"""InterPodAffinity and PodTopologySpread in the vectorised Filter: their
``filter_pass_except`` (one Filter call per distinct topology-label
combination) gives exactly the generic per-node results on random clusters."""

from __future__ import annotations

import random
from typing import Callable

import pytest

from kubeplane.scheduler.framework.labelgroups import nodes_not_passing
from kubeplane.scheduler.framework.nodeinfo import NodeInfo, PodInfo
from kubeplane.scheduler.framework.types import CycleState
from kubeplane.scheduler.scheduler import FitError, Scheduler

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"


def _node(rng: random.Random, name: str) -> dict:
    labels = {HOST: name}
    if rng.random() < 0.9:
        labels[ZONE] = rng.choice(["z1", "z2", "z3"])
    if rng.random() < 0.5:
        labels["rack"] = rng.choice(["r1", "r2"])
    return {"metadata": {"name": name, "labels": labels}, "spec": {},
            "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}}}


def _term(rng: random.Random) -> dict:
    return {"labelSelector": {"matchLabels": {"color": rng.choice(["blue", "green"])}},
            "topologyKey": rng.choice([ZONE, HOST, "rack"])}


def _pod(rng: random.Random, name: str, node_name: str = "") -> dict:
    spec: dict = {"containers": [{"name": "c", "resources": {"requests": {"cpu": "100m"}}}]}
    aff: dict = {}
    if rng.random() < 0.3:
        aff["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [_term(rng)]}
    if rng.random() < 0.3:
        aff["podAntiAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [_term(rng)]}
    if aff:
        spec["affinity"] = aff
    if rng.random() < 0.3:
        spec["topologySpreadConstraints"] = [{
            "maxSkew": rng.choice([1, 2]), "topologyKey": rng.choice([ZONE, "rack"]),
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"color": rng.choice(["blue", "green"])}}}]
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"name": name, "namespace": "default", "uid": f"u-{name}",
                         "labels": {"color": rng.choice(["blue", "green"])}}, "spec": spec}


def _churn_step(rng: random.Random, schedulers: tuple[Scheduler, ...], nodes: list[dict], live: list[dict],
                new_pod: Callable[[], dict], bounds: tuple[float, float, float], taints: bool = False) -> None:
    """One random change applied to every scheduler's cache: below ``bounds[0]`` a pod from
    ``new_pod`` is added, below ``bounds[1]`` a live pod removed, below ``bounds[2]`` a node
    replaced by a relabelled one (tainted half of the time with ``taints``)."""
    op = rng.random()
    if op < bounds[0]:
        p = new_pod()
        live.append(p)
        for s in schedulers:
            s.cache.add_pod(p)
    elif op < bounds[1] and live:
        p = live.pop(rng.randrange(len(live)))
        for s in schedulers:
            s.cache.remove_pod(p)
    elif op < bounds[2]:
        k = rng.randrange(len(nodes))
        new = _node(rng, nodes[k]["metadata"]["name"])
        if taints and rng.random() < 0.5:
            new["spec"]["taints"] = [{"key": "t", "effect": "NoSchedule"}]
        for s in schedulers:
            s.cache.update_node(nodes[k], new)
        nodes[k] = new


@pytest.mark.parametrize("seed", range(8))
def test_affinity_and_spread_fast_filter_matches_generic(seed: int) -> None:
    rng = random.Random(seed)
    nodes = [_node(rng, f"n{i}") for i in range(rng.choice([30, 120]))]
    names = [n["metadata"]["name"] for n in nodes]
    fast = Scheduler(None, rng=random.Random(seed))
    slow = Scheduler(None, rng=random.Random(seed))
    slow.use_fast_path = False
    existing = [_pod(rng, f"e{i}", rng.choice(names)) for i in range(len(nodes))]
    for s in (fast, slow):
        for n in nodes:
            s.cache.add_node(n)
        for p in existing:
            s.cache.add_pod(p)
    outcomes = {"ok": 0, "fit": 0}
    for i in range(50):
        pod = _pod(rng, f"p{i}")
        results = []
        for s in (fast, slow):
            fw = s.frameworks["default-scheduler"]
            try:
                r = s.schedule_pod(fw, CycleState(), PodInfo(pod))
                results.append(("ok", r.suggested_host, r.evaluated_nodes, r.feasible_nodes))
            except FitError as e:
                results.append(("fit", str(e), {n: (st.code, tuple(st.reasons), st.plugin)
                                                for n, st in e.diagnosis.node_to_status.items()}))
        assert results[0] == results[1], f"pod {i}"
        outcomes[results[0][0]] += 1
        if results[0][0] == "ok":
            for s in (fast, slow):
                s.cache.assume_pod(dict(pod, spec=dict(pod["spec"], nodeName=results[0][1])))
    assert outcomes["ok"] > 0 and outcomes["fit"] > 0


def test_nodes_not_passing_calls_once_per_label_combination() -> None:
    infos = [NodeInfo({"metadata": {"name": f"n{i}", "labels": {ZONE: f"z{i % 3}", "x": str(i)}}})
             for i in range(30)]
    infos.append(NodeInfo.__new__(NodeInfo))
    infos[-1].__init__()  # a NodeInfo without a Node object
    infos[-1].name = "ghost"
    seen: list[str | None] = []

    def passes(ni: NodeInfo) -> bool:
        zone = ni.node["metadata"]["labels"].get(ZONE)
        seen.append(zone)
        return zone != "z1"

    failing = nodes_not_passing(infos, (ZONE,), passes)
    assert sorted(seen) == ["z0", "z1", "z2"]
    assert failing == [f"n{i}" for i in range(30) if i % 3 == 1] + ["ghost"]


def _weighted(rng: random.Random) -> list[dict]:
    return [{"weight": rng.choice([1, 5, 50]), "podAffinityTerm": _term(rng)}]


@pytest.mark.parametrize("seed", range(8))
def test_interpodaffinity_totals_kept_across_cycles_equal_a_fresh_count(seed: int) -> None:
    """PreFilter counts and PreScore sums kept per node (recomputed for changed nodes only)
    equal a fresh walk over all pods, while pods are added and removed and node labels change."""
    rng = random.Random(1000 + seed)
    nodes = [_node(rng, f"n{i}") for i in range(40)]
    names = [n["metadata"]["name"] for n in nodes]
    kept = Scheduler(None, rng=random.Random(seed))
    fresh = Scheduler(None, rng=random.Random(seed))
    fresh.frameworks["default-scheduler"].plugins["InterPodAffinity"].keep_totals = False
    live: list[dict] = []
    for s in (kept, fresh):
        for n in nodes:
            s.cache.add_node(n)

    def random_pod(name: str, node_name: str = "") -> dict:
        p = _pod(rng, name, node_name)
        if rng.random() < 0.4:
            aff = p["spec"].setdefault("affinity", {})
            aff.setdefault("podAffinity", {})["preferredDuringSchedulingIgnoredDuringExecution"] = _weighted(rng)
            aff.setdefault("podAntiAffinity", {})["preferredDuringSchedulingIgnoredDuringExecution"] = _weighted(rng)
        return p

    shapes = [random_pod(f"shape{k}") for k in range(3)]
    for i in range(120):
        _churn_step(rng, (kept, fresh), nodes, live, lambda: random_pod(f"e{i}", rng.choice(names)),
                    (0.35, 0.5, 0.55))
        template = rng.choice(shapes)
        pod = dict(template, metadata=dict(template["metadata"], name=f"p{i}", uid=f"u-p{i}"))
        views = []
        for s in (kept, fresh):
            s.cache.update_snapshot(s.snapshot)
            fw = s.frameworks["default-scheduler"]
            state = CycleState()
            pi = PodInfo(pod)
            pl = fw.plugins["InterPodAffinity"]
            _, st = pl.pre_filter(state, pi, s.snapshot.node_info_list)
            pf = state.get("PreFilterInterPodAffinity")
            st2 = pl.pre_score(state, pi, s.snapshot.node_info_list)
            ps = state.get("PreScoreInterPodAffinity")
            views.append((None if st is None else st.code,
                          None if pf is None else (pf.existing_anti_affinity_counts, pf.affinity_counts,
                                                   pf.anti_affinity_counts),
                          None if st2 is None else st2.code,
                          None if ps is None else ps.topology_score))
        assert views[0] == views[1], f"step {i}"


@pytest.mark.parametrize("seed", range(8))
def test_topologyspread_counts_kept_across_cycles_equal_a_fresh_count(seed: int) -> None:
    """PodTopologySpread's PreFilter counts kept per node equal a fresh count while pods come
    and go, node labels and taints change, and pods differ in selector, affinity and policies."""
    rng = random.Random(2000 + seed)
    nodes = [_node(rng, f"n{i}") for i in range(40)]
    names = [n["metadata"]["name"] for n in nodes]
    kept = Scheduler(None, rng=random.Random(seed))
    fresh = Scheduler(None, rng=random.Random(seed))
    fresh.frameworks["default-scheduler"].plugins["PodTopologySpread"].keep_totals = False
    for s in (kept, fresh):
        for n in nodes:
            s.cache.add_node(n)
    live: list[dict] = []
    shapes = []
    for k in range(4):
        p = _pod(rng, f"shape{k}")
        p["spec"]["topologySpreadConstraints"] = [{
            "maxSkew": 1, "topologyKey": rng.choice([ZONE, "rack"]), "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"color": rng.choice(["blue", "green"])}},
            "nodeAffinityPolicy": rng.choice(["Honor", "Ignore"]), "nodeTaintsPolicy": rng.choice(["Honor", "Ignore"])}]
        if k % 2:
            p["spec"]["nodeSelector"] = {ZONE: "z1"}
        shapes.append(p)
    for i in range(150):
        _churn_step(rng, (kept, fresh), nodes, live, lambda: _pod(rng, f"e{i}", rng.choice(names)),
                    (0.4, 0.55, 0.62), taints=True)
        template = rng.choice(shapes)
        pod = dict(template, metadata=dict(template["metadata"], name=f"p{i}", uid=f"u-p{i}"))
        views = []
        for s in (kept, fresh):
            s.cache.update_snapshot(s.snapshot)
            pl = s.frameworks["default-scheduler"].plugins["PodTopologySpread"]
            state = CycleState()
            _, st = pl.pre_filter(state, PodInfo(pod), s.snapshot.node_info_list)
            pf = state.get("PreFilterPodTopologySpread")
            # Critical paths keep the two smallest counts; with ties, which values they name
            # depends on iteration order (as upstream's map order), the minimum does not.
            views.append((None if st is None else st.code,
                          None if pf is None else (pf.tp_value_to_match_num,
                                                   [sorted(n for _, n in cp.paths) for cp in pf.critical_paths])))
        assert views[0] == views[1], f"step {i}"
    assert kept.frameworks["default-scheduler"].plugins["PodTopologySpread"]._filter_totals


@pytest.mark.parametrize("seed", range(6))
def test_interpodaffinity_known_statuses_equal_filter(seed: int) -> None:
    """For pods without required affinity terms, the statuses stated in bulk equal Filter's
    own on every node, and every node they leave out passes Filter."""
    rng = random.Random(3000 + seed)
    nodes = [_node(rng, f"n{i}") for i in range(60)]
    names = [n["metadata"]["name"] for n in nodes]
    sched = Scheduler(None, rng=random.Random(seed))
    for n in nodes:
        sched.cache.add_node(n)
    for i in range(80):
        p = _pod(rng, f"e{i}", rng.choice(names))
        if rng.random() < 0.4:
            p["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [_term(rng)]}}
        sched.cache.add_pod(p)
    sched.cache.update_snapshot(sched.snapshot)
    pl = sched.frameworks["default-scheduler"].plugins["InterPodAffinity"]
    checked = 0
    for i in range(30):
        if i % 3 == 2:  # relabel a node: the label indexes must follow
            k = rng.randrange(len(nodes))
            new = _node(rng, names[k])
            new["metadata"]["labels"][HOST] = rng.choice(names)
            sched.cache.update_node(nodes[k], new)
            nodes[k] = new
            sched.cache.update_snapshot(sched.snapshot)
        pod = _pod(rng, f"p{i}")
        pod["spec"].pop("affinity", None)
        if rng.random() < 0.7:
            pod["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [_term(rng)]}}
        state = CycleState()
        pi = PodInfo(pod)
        _, st = pl.pre_filter(state, pi, sched.snapshot.node_info_list)
        if st is not None:
            continue
        known = pl.filter_known_statuses(state, pi)
        listed = set(pl.filter_pass_except(state, pi))
        for ni in sched.snapshot.node_info_list:
            got = pl.filter(state, pi, ni)
            if ni.name in known:
                assert got is not None and (got.code, got.reasons) == (known[ni.name].code, known[ni.name].reasons)
                checked += 1
            else:
                assert got is None and ni.name not in listed
    assert checked > 50
