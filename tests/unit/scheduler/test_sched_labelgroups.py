"""InterPodAffinity and PodTopologySpread in the vectorised Filter: their
``filter_pass_except`` (one Filter call per distinct topology-label
combination) gives exactly the generic per-node results on random clusters."""

from __future__ import annotations

import random

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
