"""InterPodAffinity: required (anti-)affinity filtering, symmetry, namespaces, scoring, hints."""

from __future__ import annotations

from typing import Any

import pytest

from kubeplane.scheduler.cache import Snapshot
from kubeplane.scheduler.framework.nodeinfo import PodInfo
from kubeplane.scheduler.framework.plugin import Handle
from kubeplane.scheduler.framework.types import Code, CycleState, QueueingHint
from kubeplane.scheduler.plugins.inter_pod_affinity import (
    ERR_REASON_AFFINITY_RULES_NOT_MATCH, ERR_REASON_ANTI_AFFINITY_RULES_NOT_MATCH,
    ERR_REASON_EXISTING_ANTI_AFFINITY_RULES_NOT_MATCH, InterPodAffinity,
)

REGION = "region"
ZONE = "zone"
HOST = "kubernetes.io/hostname"


def node(name: str, **labels: str) -> dict:
    lbl = {HOST: name}
    lbl.update(labels)
    return {"metadata": {"name": name, "labels": lbl},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}}


def pod(name: str, labels: dict | None = None, node_name: str = "", ns: str = "default",
        affinity: dict | None = None) -> dict:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "i"}]}
    if node_name:
        spec["nodeName"] = node_name
    if affinity:
        spec["affinity"] = affinity
    return {"metadata": {"name": name, "namespace": ns, "uid": f"{ns}-{name}", "labels": dict(labels or {})},
            "spec": spec}


def term(key: str, labels: dict, **extra: Any) -> dict:
    t = {"labelSelector": {"matchLabels": labels}, "topologyKey": key}
    t.update(extra)
    return t


def required(kind: str, *terms: dict) -> dict:
    return {kind: {"requiredDuringSchedulingIgnoredDuringExecution": list(terms)}}


def preferred(kind: str, *weighted: tuple[int, dict]) -> dict:
    return {kind: {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": w, "podAffinityTerm": t} for w, t in weighted]}}


def setup(nodes: list[dict], pods: list[dict], args: dict | None = None,
          ns_labels: dict[str, dict] | None = None) -> tuple[InterPodAffinity, Snapshot]:
    snap = Snapshot.from_objects(nodes, pods)
    h = Handle(snapshot=snap)
    if ns_labels is not None:
        h.namespace_labels = ns_labels.get
    return InterPodAffinity(args, h), snap


def filter_all(pl: InterPodAffinity, snap: Snapshot, p: dict) -> dict[str, Any] | None:
    state = CycleState()
    pi = PodInfo(p)
    _, s = pl.pre_filter(state, pi, snap.node_info_list)
    if s is not None and s.is_skip():
        return None
    assert s is None, s
    out: dict[str, Any] = {}
    for ni in snap.node_info_list:
        st = pl.filter(state, pi, ni)
        out[ni.name] = None if st is None else (st.code, st.message())
    return out


AFF = (Code.UNSCHEDULABLE_AND_UNRESOLVABLE, ERR_REASON_AFFINITY_RULES_NOT_MATCH)
ANTI = (Code.UNSCHEDULABLE, ERR_REASON_ANTI_AFFINITY_RULES_NOT_MATCH)
EXISTING = (Code.UNSCHEDULABLE, ERR_REASON_EXISTING_ANTI_AFFINITY_RULES_NOT_MATCH)
NODES = [node("n1", region="r1", zone="z11"), node("n2", region="r1", zone="z12"), node("n3", region="r2", zone="z21")]


def test_required_affinity_by_region() -> None:
    pl, snap = setup(NODES, [pod("sec", {"service": "securityscan"}, "n1")])
    p = pod("p", affinity=required("podAffinity", term(REGION, {"service": "securityscan"})))
    assert filter_all(pl, snap, p) == {"n1": None, "n2": None, "n3": AFF}


def test_required_affinity_all_terms_must_match_the_same_pod() -> None:
    existing = [pod("a", {"x": "1"}, "n1"), pod("b", {"y": "1"}, "n1")]
    pl, snap = setup(NODES, existing)
    p = pod("p", affinity=required("podAffinity", term(REGION, {"x": "1"}), term(REGION, {"y": "1"})))
    assert set(filter_all(pl, snap, p).values()) == {AFF}
    both = [pod("a", {"x": "1", "y": "1"}, "n3")]
    pl, snap = setup(NODES, both)
    assert filter_all(pl, snap, p) == {"n1": AFF, "n2": AFF, "n3": None}


def test_first_pod_of_a_group_matching_its_own_affinity() -> None:
    nodes = NODES + [node("n4")]
    pl, snap = setup(nodes, [pod("other", {"app": "db"}, "n1")])
    p = pod("p", {"app": "web"}, affinity=required("podAffinity", term(REGION, {"app": "web"})))
    # No pod matches anywhere and the pod matches itself: any node with the key.
    assert filter_all(pl, snap, p) == {"n1": None, "n2": None, "n3": None, "n4": AFF}
    q = pod("q", {"app": "api"}, affinity=required("podAffinity", term(REGION, {"app": "web"})))
    assert set(filter_all(pl, snap, q).values()) == {AFF}


def test_required_anti_affinity() -> None:
    pl, snap = setup(NODES, [pod("web", {"app": "web"}, "n1")])
    p = pod("p", affinity=required("podAntiAffinity", term(ZONE, {"app": "web"})))
    assert filter_all(pl, snap, p) == {"n1": ANTI, "n2": None, "n3": None}
    p = pod("p", affinity=required("podAntiAffinity", term(REGION, {"app": "web"})))
    assert filter_all(pl, snap, p) == {"n1": ANTI, "n2": ANTI, "n3": None}


def test_existing_pods_anti_affinity_symmetry() -> None:
    guard = pod("guard", {"app": "guard"}, "n1", affinity=required("podAntiAffinity", term(REGION, {"app": "db"})))
    pl, snap = setup(NODES, [guard])
    assert filter_all(pl, snap, pod("db", {"app": "db"})) == {"n1": EXISTING, "n2": EXISTING, "n3": None}
    # Nothing relevant: PreFilter skips.
    assert filter_all(pl, snap, pod("web", {"app": "web"})) is None
    # Other namespace: the guard's term only covers its own namespace.
    assert filter_all(pl, snap, pod("db", {"app": "db"}, ns="other")) is None


def test_explicit_namespaces() -> None:
    existing = [pod("a", {"app": "web"}, "n1", ns="default"), pod("b", {"app": "web"}, "n3", ns="team")]
    pl, snap = setup(NODES, existing)
    p = pod("p", affinity=required("podAffinity", term(REGION, {"app": "web"}, namespaces=["team"])))
    assert filter_all(pl, snap, p) == {"n1": AFF, "n2": AFF, "n3": None}


def test_namespace_selector_uses_namespace_labels() -> None:
    existing = [pod("a", {"app": "web"}, "n1", ns="ns-a"), pod("b", {"app": "web"}, "n3", ns="ns-b")]
    ns_labels = {"ns-a": {"team": "a"}, "ns-b": {"team": "b"}, "default": {}}
    pl, snap = setup(NODES, existing, ns_labels=ns_labels)
    sel = {"matchLabels": {"team": "b"}}
    p = pod("p", affinity=required("podAffinity", term(REGION, {"app": "web"}, namespaceSelector=sel)))
    assert filter_all(pl, snap, p) == {"n1": AFF, "n2": AFF, "n3": None}
    # Empty selector: every namespace.
    anti = pod("p", affinity=required("podAntiAffinity", term(REGION, {"app": "web"}, namespaceSelector={})))
    assert filter_all(pl, snap, anti) == {"n1": ANTI, "n2": ANTI, "n3": ANTI}
    # Existing pod whose anti-affinity selects the incoming pod's namespace by label.
    guard = pod("g", {}, "n2", ns="ns-a", affinity=required(
        "podAntiAffinity", term(ZONE, {"app": "db"}, namespaceSelector={"matchLabels": {"team": "b"}})))
    pl, snap = setup(NODES, [guard], ns_labels=ns_labels)
    assert filter_all(pl, snap, pod("db", {"app": "db"}, ns="ns-b")) == {"n1": None, "n2": EXISTING, "n3": None}
    assert filter_all(pl, snap, pod("db", {"app": "db"}, ns="ns-a")) is None


def test_namespace_selector_without_lookup_selects_nothing() -> None:
    pl, snap = setup(NODES, [pod("a", {"app": "web"}, "n1", ns="ns-a")])
    p = pod("p", affinity=required("podAntiAffinity", term(
        REGION, {"app": "web"}, namespaceSelector={"matchLabels": {"team": "a"}})))
    assert filter_all(pl, snap, p) == {"n1": None, "n2": None, "n3": None}


def test_add_remove_pod_extensions() -> None:
    web = pod("web", {"app": "web"}, "n1")
    pl, snap = setup(NODES, [web])
    p = pod("p", affinity=required("podAntiAffinity", term(REGION, {"app": "web"})))
    pi = PodInfo(p)
    state = CycleState()
    pl.pre_filter(state, pi, snap.node_info_list)
    n1, n3 = snap.get("n1"), snap.get("n3")
    copy = state.clone()
    pl.remove_pod(copy, pi, n1.pods[0], n1)
    assert pl.filter(copy, pi, n1) is None
    assert pl.filter(state, pi, n1).code == Code.UNSCHEDULABLE
    pl.add_pod(copy, pi, PodInfo(pod("web2", {"app": "web"}, "n3")), n3)
    assert pl.filter(copy, pi, n3).message() == ERR_REASON_ANTI_AFFINITY_RULES_NOT_MATCH
    # A nominated pod with anti-affinity against the incoming pod.
    guard = PodInfo(pod("g", {}, "n3", affinity=required("podAntiAffinity", term(HOST, {"app": "db"}))))
    q = PodInfo(pod("q", {"app": "db"}, affinity=required("podAffinity", term(REGION, {"app": "web"}))))
    st = CycleState()
    pl.pre_filter(st, q, snap.node_info_list)
    pl.add_pod(st, q, guard, n3)
    assert pl.filter(st, q, n3).message() == ERR_REASON_AFFINITY_RULES_NOT_MATCH
    pl.add_pod(st, q, PodInfo(pod("w3", {"app": "web"}, "n3")), n3)
    assert pl.filter(st, q, n3).message() == ERR_REASON_EXISTING_ANTI_AFFINITY_RULES_NOT_MATCH


# --------------------------------------------------------------------------- scoring


def score_all(pl: InterPodAffinity, snap: Snapshot, p: dict) -> dict[str, int] | None:
    state = CycleState()
    pi = PodInfo(p)
    nodes = snap.node_info_list
    s = pl.pre_score(state, pi, nodes)
    if s is not None and s.is_skip():
        return None
    assert s is None
    scores = []
    for ni in nodes:
        sc, st = pl.score(state, pi, ni)
        assert st is None
        scores.append([ni.name, sc])
    pl.normalize_score(state, pi, scores)
    return {n: s for n, s in scores}


def test_score_preferred_affinity_weights() -> None:
    existing = [pod("a", {"security": "S1"}, "n1"), pod("b", {"security": "S2"}, "n3")]
    pl, snap = setup(NODES, existing)
    p = pod("p", affinity=preferred("podAffinity", (5, term(REGION, {"security": "S1"})),
                                    (2, term(REGION, {"security": "S2"}))))
    # Raw: r1 -> 5, r2 -> 2; normalized (s - 2) / 3 * 100.
    assert score_all(pl, snap, p) == {"n1": 100, "n2": 100, "n3": 0}


def test_score_preferred_anti_affinity_and_mixed() -> None:
    existing = [pod("a", {"app": "web"}, "n1"), pod("b", {"app": "db"}, "n3")]
    pl, snap = setup(NODES, existing)
    p = pod("p", affinity={**preferred("podAntiAffinity", (4, term(ZONE, {"app": "web"}))),
                           **preferred("podAffinity", (1, term(REGION, {"app": "db"})))})
    # n1: -4, n2: 0, n3: +1 -> min -4, max 1.
    assert score_all(pl, snap, p) == {"n1": 0, "n2": 80, "n3": 100}


def test_score_symmetry_hard_weight_and_existing_preferences() -> None:
    wants_web = pod("x", {}, "n3", affinity=required("podAffinity", term(REGION, {"app": "web"})))
    pl, snap = setup(NODES, [wants_web], {"hardPodAffinityWeight": 3})
    assert score_all(pl, snap, pod("p", {"app": "web"})) == {"n1": 0, "n2": 0, "n3": 100}
    pl0, snap0 = setup(NODES, [wants_web], {"hardPodAffinityWeight": 0})
    assert score_all(pl0, snap0, pod("p", {"app": "web"})) is None
    avoid = pod("y", {}, "n1", affinity=preferred("podAntiAffinity", (10, term(ZONE, {"app": "web"}))))
    pl, snap = setup(NODES, [avoid])
    assert score_all(pl, snap, pod("p", {"app": "web"})) == {"n1": 0, "n2": 100, "n3": 100}
    pl, snap = setup(NODES, [avoid], {"ignorePreferredTermsOfExistingPods": True})
    assert score_all(pl, snap, pod("p", {"app": "web"})) is None


def test_score_skip_without_any_terms() -> None:
    pl, snap = setup(NODES, [pod("a", {"app": "web"}, "n1")])
    assert score_all(pl, snap, pod("p", {"app": "web"})) is None


def test_args_validation() -> None:
    with pytest.raises(ValueError):
        InterPodAffinity({"hardPodAffinityWeight": 101}, Handle())


# --------------------------------------------------------------------------- hints


def test_pod_change_hints() -> None:
    pl = InterPodAffinity(None, Handle())
    target = pod("p", affinity={**required("podAffinity", term(REGION, {"app": "web"})),
                                **required("podAntiAffinity", term(ZONE, {"app": "db"}))})
    web = pod("w", {"app": "web"}, "n1")
    db = pod("d", {"app": "db"}, "n1")
    plain = pod("x", {"app": "x"}, "n1")
    assert pl.is_schedulable_after_pod_change(target, None, web) == QueueingHint.QUEUE
    assert pl.is_schedulable_after_pod_change(target, None, plain) == QueueingHint.SKIP
    assert pl.is_schedulable_after_pod_change(target, None, pod("u", {"app": "web"})) == QueueingHint.SKIP
    assert pl.is_schedulable_after_pod_change(target, plain, web) == QueueingHint.QUEUE
    assert pl.is_schedulable_after_pod_change(target, db, plain) == QueueingHint.QUEUE
    assert pl.is_schedulable_after_pod_change(target, plain, plain) == QueueingHint.SKIP
    assert pl.is_schedulable_after_pod_change(target, db, None) == QueueingHint.QUEUE
    assert pl.is_schedulable_after_pod_change(target, web, None) == QueueingHint.SKIP
    guard = pod("g", {}, "n1", affinity=required("podAntiAffinity", term(ZONE, {"app": "api"})))
    api = pod("a", {"app": "api"})
    assert pl.is_schedulable_after_pod_change(api, guard, None) == QueueingHint.QUEUE


def test_node_change_hints() -> None:
    pl = InterPodAffinity(None, Handle())
    aff = pod("p", affinity=required("podAffinity", term(REGION, {"app": "web"})))
    anti = pod("q", affinity=required("podAntiAffinity", term(REGION, {"app": "web"})))
    bare, r1, r2 = node("n"), node("n", region="r1"), node("n", region="r2")
    assert pl.is_schedulable_after_node_change(aff, None, r1) == QueueingHint.QUEUE
    assert pl.is_schedulable_after_node_change(aff, None, bare) == QueueingHint.SKIP
    assert pl.is_schedulable_after_node_change(aff, bare, r1) == QueueingHint.QUEUE
    assert pl.is_schedulable_after_node_change(aff, r1, r2) == QueueingHint.QUEUE
    assert pl.is_schedulable_after_node_change(aff, r1, bare) == QueueingHint.SKIP
    assert pl.is_schedulable_after_node_change(anti, None, bare) == QueueingHint.QUEUE
    assert pl.is_schedulable_after_node_change(anti, r1, bare) == QueueingHint.QUEUE
    assert pl.is_schedulable_after_node_change(anti, bare, r1) == QueueingHint.SKIP
    assert pl.is_schedulable_after_node_change(pod("z"), None, r1) == QueueingHint.SKIP
