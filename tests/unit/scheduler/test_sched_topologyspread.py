"""PodTopologySpread: skew filtering, defaults, scoring and queueing hints as upstream."""

from __future__ import annotations

from typing import Any

import pytest

from kubeplane.scheduler.cache import Snapshot
from kubeplane.scheduler.framework.nodeinfo import PodInfo
from kubeplane.scheduler.framework.plugin import Handle
from kubeplane.scheduler.framework.types import Code, CycleState, QueueingHint
from kubeplane.scheduler.plugins.pod_topology_spread import (
    ERR_REASON_CONSTRAINTS_NOT_MATCH, ERR_REASON_NODE_LABEL_NOT_MATCH, PodTopologySpread, default_selector,
    topology_normalizing_weight,
)

ZONE = "zone"
HOST = "kubernetes.io/hostname"


def node(name: str, labels: dict | None = None, taints: list | None = None) -> dict:
    spec: dict[str, Any] = {"taints": taints} if taints else {}
    return {"metadata": {"name": name, "labels": dict(labels or {})}, "spec": spec,
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}}


def zn(name: str, zone: str | None, **extra: str) -> dict:
    labels = {HOST: name, **extra}
    if zone is not None:
        labels[ZONE] = zone
    return node(name, labels)


def pod(name: str, labels: dict | None = None, node_name: str = "", ns: str = "default", **spec: Any) -> dict:
    s: dict[str, Any] = {"containers": [{"name": "c", "image": "i"}]}
    if node_name:
        s["nodeName"] = node_name
    s.update(spec)
    return {"metadata": {"name": name, "namespace": ns, "uid": f"{ns}-{name}", "labels": dict(labels or {})},
            "spec": s}


def constraint(max_skew: int, key: str, when: str = "DoNotSchedule", selector: dict | None = None,
               **extra: Any) -> dict:
    c = {"maxSkew": max_skew, "topologyKey": key, "whenUnsatisfiable": when,
         "labelSelector": selector if selector is not None else {"matchExpressions": [
             {"key": "foo", "operator": "Exists"}]}}
    c.update(extra)
    return c


def placed(spec: dict[str, int], labels: dict | None = None, ns: str = "default") -> list[dict]:
    """``{"node-a": 2}`` -> two pods labelled foo on node-a."""
    out = []
    for n, count in spec.items():
        for i in range(count):
            out.append(pod(f"p-{n}-{i}", labels if labels is not None else {"foo": ""}, n, ns))
    return out


def setup(nodes: list[dict], pods: list[dict], args: dict | None = None,
          list_objects: Any = None) -> tuple[PodTopologySpread, Snapshot]:
    snap = Snapshot.from_objects(nodes, pods)
    h = Handle(snapshot=snap)
    if list_objects is not None:
        h.list_objects = list_objects
    return PodTopologySpread(args, h), snap


def filter_all(pl: PodTopologySpread, snap: Snapshot, p: dict) -> dict[str, Any]:
    state = CycleState()
    pi = PodInfo(p)
    _, s = pl.pre_filter(state, pi, snap.node_info_list)
    assert s is None or s.is_success(), s
    out: dict[str, Any] = {}
    for ni in snap.node_info_list:
        st = pl.filter(state, pi, ni)
        out[ni.name] = None if st is None else (st.code, st.message())
    return out


FAIL = (Code.UNSCHEDULABLE, ERR_REASON_CONSTRAINTS_NOT_MATCH)
NO_LABEL = (Code.UNSCHEDULABLE_AND_UNRESOLVABLE, ERR_REASON_NODE_LABEL_NOT_MATCH)
FOUR_ZONED = [zn("node-a", "zone1"), zn("node-b", "zone1"), zn("node-x", "zone2"), zn("node-y", "zone2")]


@pytest.mark.parametrize("name,nodes,existing,constraints,want", [
    ("no existing pods", FOUR_ZONED, [], [constraint(1, ZONE)],
     {"node-a": None, "node-b": None, "node-x": None, "node-y": None}),
    ("no existing pods, incoming pod doesn't match itself", FOUR_ZONED, [],
     [constraint(1, ZONE, selector={"matchExpressions": [{"key": "bar", "operator": "Exists"}]})],
     {"node-a": None, "node-b": None, "node-x": None, "node-y": None}),
    ("existing pods in a different namespace do not count", FOUR_ZONED,
     placed({"node-a": 1}, ns="ns1") + placed({"node-x": 2}),
     [constraint(1, ZONE)],
     {"node-a": None, "node-b": None, "node-x": FAIL, "node-y": FAIL}),
    ("pods spread across zones as 3/3, all nodes fit", FOUR_ZONED,
     placed({"node-a": 1, "node-b": 2, "node-x": 2, "node-y": 1}), [constraint(1, ZONE)],
     {"node-a": None, "node-b": None, "node-x": None, "node-y": None}),
    ("pods spread as 1/2 due to absence of label 'zone' on node-b",
     [zn("node-a", "zone1"), zn("node-b", None), zn("node-x", "zone2"), zn("node-y", "zone2")],
     placed({"node-a": 1, "node-b": 1, "node-y": 2}), [constraint(1, ZONE)],
     {"node-a": None, "node-b": NO_LABEL, "node-x": FAIL, "node-y": FAIL}),
    ("pods spread across nodes as 2/1/0/3, only node-x fits", FOUR_ZONED,
     placed({"node-a": 2, "node-b": 1, "node-y": 3}), [constraint(1, HOST)],
     {"node-a": FAIL, "node-b": FAIL, "node-x": None, "node-y": FAIL}),
    ("pods spread across nodes as 2/1/0/3, maxSkew is 2, node-b and node-x fit", FOUR_ZONED,
     placed({"node-a": 2, "node-b": 1, "node-y": 3}), [constraint(2, HOST)],
     {"node-a": FAIL, "node-b": None, "node-x": None, "node-y": FAIL}),
    ("terminating pods are not counted", FOUR_ZONED,
     [dict(p, metadata={**p["metadata"], "deletionTimestamp": "2024-01-01T00:00:00Z"})
      for p in placed({"node-a": 3})], [constraint(1, HOST)],
     {"node-a": None, "node-b": None, "node-x": None, "node-y": None}),
    ("two constraints: zone 3/3 is fine, hostname 2/1/0/3 only node-x", FOUR_ZONED,
     placed({"node-a": 2, "node-b": 1, "node-y": 3}), [constraint(1, ZONE), constraint(1, HOST)],
     {"node-a": FAIL, "node-b": FAIL, "node-x": None, "node-y": FAIL}),
    ("two constraints: zone 1/2, hostname 1/0/0/2: node-b", FOUR_ZONED,
     placed({"node-a": 1, "node-y": 2}), [constraint(1, ZONE), constraint(1, HOST)],
     {"node-a": FAIL, "node-b": None, "node-x": FAIL, "node-y": FAIL}),
])
def test_filter_table(name: str, nodes: list, existing: list, constraints: list, want: dict) -> None:
    pl, snap = setup(nodes, existing)
    p = pod("p", {"foo": ""}, topologySpreadConstraints=constraints)
    assert filter_all(pl, snap, p) == want, name


def test_min_domains_treats_global_minimum_as_zero() -> None:
    existing = placed({"node-a": 1, "node-b": 1, "node-x": 1, "node-y": 1})
    pl, snap = setup(FOUR_ZONED, existing)
    without = pod("p", {"foo": ""}, topologySpreadConstraints=[constraint(2, ZONE)])
    assert set(filter_all(pl, snap, without).values()) == {None}
    with_min = pod("p", {"foo": ""}, topologySpreadConstraints=[constraint(2, ZONE, minDomains=3)])
    # 2 domains < minDomains 3: skew = 2 + 1 - 0 = 3 > 2 everywhere.
    assert set(filter_all(pl, snap, with_min).values()) == {FAIL}
    enough = pod("p", {"foo": ""}, topologySpreadConstraints=[constraint(2, ZONE, minDomains=2)])
    assert set(filter_all(pl, snap, enough).values()) == {None}


def test_node_affinity_policy_honor_and_ignore() -> None:
    nodes = [zn("node-a", "zone1", foo="x"), zn("node-x", "zone2", foo="x"), zn("node-y", "zone3")]
    existing = placed({"node-a": 1, "node-x": 1})
    pl, snap = setup(nodes, existing)
    sel = {"foo": "x"}
    honor = pod("p", {"foo": ""}, nodeSelector=sel, topologySpreadConstraints=[constraint(1, ZONE)])
    # zone3 is excluded (node-y fails the pod's node selector): min is 1.
    got = filter_all(pl, snap, honor)
    assert got["node-a"] is None and got["node-x"] is None
    ignore = pod("p", {"foo": ""}, nodeSelector=sel,
                 topologySpreadConstraints=[constraint(1, ZONE, nodeAffinityPolicy="Ignore")])
    got = filter_all(pl, snap, ignore)
    assert got["node-a"] == FAIL and got["node-x"] == FAIL and got["node-y"] is None


def test_node_taints_policy_honor_excludes_untolerated_nodes() -> None:
    tainted = node("node-y", {HOST: "node-y", ZONE: "zone3"}, taints=[{"key": "k", "effect": "NoSchedule"}])
    nodes = [zn("node-a", "zone1"), zn("node-x", "zone2"), tainted]
    pl, snap = setup(nodes, placed({"node-a": 1, "node-x": 1}))
    ignore = pod("p", {"foo": ""}, topologySpreadConstraints=[constraint(1, ZONE)])
    assert filter_all(pl, snap, ignore)["node-a"] == FAIL
    honor = pod("p", {"foo": ""}, topologySpreadConstraints=[constraint(1, ZONE, nodeTaintsPolicy="Honor")])
    assert filter_all(pl, snap, honor)["node-a"] is None
    tolerating = pod("p", {"foo": ""}, tolerations=[{"key": "k", "operator": "Exists"}],
                     topologySpreadConstraints=[constraint(1, ZONE, nodeTaintsPolicy="Honor")])
    assert filter_all(pl, snap, tolerating)["node-a"] == FAIL


def test_match_label_keys_restricts_to_same_revision() -> None:
    existing = placed({"node-a": 2}, labels={"foo": "", "rev": "old"})
    pl, snap = setup(FOUR_ZONED, existing)
    plain = pod("p", {"foo": "", "rev": "new"}, topologySpreadConstraints=[constraint(1, HOST)])
    assert filter_all(pl, snap, plain)["node-a"] == FAIL
    keyed = pod("p", {"foo": "", "rev": "new"},
                topologySpreadConstraints=[constraint(1, HOST, matchLabelKeys=["rev"])])
    assert filter_all(pl, snap, keyed)["node-a"] is None


def test_soft_constraints_and_no_constraints_skip_pre_filter() -> None:
    pl, snap = setup(FOUR_ZONED, [])
    for p in (pod("p", {"foo": ""}, topologySpreadConstraints=[constraint(1, ZONE, when="ScheduleAnyway")]),
              pod("q", {"foo": ""})):
        _, s = pl.pre_filter(CycleState(), PodInfo(p), snap.node_info_list)
        assert s is not None and s.is_skip()


def test_add_and_remove_pod_update_counts_and_state_clone_is_independent() -> None:
    pl, snap = setup(FOUR_ZONED, placed({"node-a": 1}))
    p = pod("p", {"foo": ""}, topologySpreadConstraints=[constraint(1, HOST)])
    pi = PodInfo(p)
    state = CycleState()
    pl.pre_filter(state, pi, snap.node_info_list)
    ni_a = snap.get("node-a")
    assert pl.filter(state, pi, ni_a) == pl.filter(state, pi, ni_a)  # deterministic
    assert pl.filter(state, pi, ni_a) is not None
    copy = state.clone()
    victim = ni_a.pods[0]
    assert pl.remove_pod(copy, pi, victim, ni_a) is None
    assert pl.filter(copy, pi, ni_a) is None
    # The original state still counts the pod.
    assert pl.filter(state, pi, ni_a).code == Code.UNSCHEDULABLE
    other_ns = PodInfo(pod("o", {"foo": ""}, "node-b", ns="other"))
    pl.add_pod(copy, pi, other_ns, snap.get("node-b"))
    assert pl.filter(copy, pi, snap.get("node-b")) is None
    pl.add_pod(copy, pi, PodInfo(pod("n", {"foo": ""}, "node-b")), snap.get("node-b"))
    assert pl.filter(copy, pi, snap.get("node-b")).code == Code.UNSCHEDULABLE


# --------------------------------------------------------------------------- scoring


def score_all(pl: PodTopologySpread, snap: Snapshot, p: dict, filtered: list[str] | None = None) -> dict[str, int] | None:
    state = CycleState()
    pi = PodInfo(p)
    nodes = [ni for ni in snap.node_info_list if filtered is None or ni.name in filtered]
    s = pl.pre_score(state, pi, nodes)
    if s is not None and s.is_skip():
        return None
    assert s is None, s
    scores = []
    for ni in nodes:
        sc, st = pl.score(state, pi, ni)
        assert st is None
        scores.append([ni.name, sc])
    pl.normalize_score(state, pi, scores)
    return dict((n, s) for n, s in scores)


def test_score_hostname_constraint_all_nodes_candidates() -> None:
    nodes = [zn("node-a", None), zn("node-b", None), zn("node-c", None), zn("node-d", None)]
    pl, snap = setup(nodes, placed({"node-a": 2, "node-b": 1, "node-d": 3}))
    p = pod("p", {"foo": ""}, topologySpreadConstraints=[constraint(1, HOST, when="ScheduleAnyway")])
    assert score_all(pl, snap, p) == {"node-a": 20, "node-b": 60, "node-c": 100, "node-d": 0}


def test_score_no_existing_pods_all_max() -> None:
    pl, snap = setup(FOUR_ZONED, [])
    p = pod("p", {"foo": ""}, topologySpreadConstraints=[constraint(1, HOST, when="ScheduleAnyway")])
    assert score_all(pl, snap, p) == dict.fromkeys(["node-a", "node-b", "node-x", "node-y"], 100)


def test_score_zone_counts_all_nodes_but_scores_filtered_ones() -> None:
    pl, snap = setup(FOUR_ZONED, placed({"node-a": 1, "node-b": 2, "node-x": 1}))
    p = pod("p", {"foo": ""}, topologySpreadConstraints=[constraint(1, ZONE, when="ScheduleAnyway")])
    # Two zones among the filtered nodes: weight ln(4); zone1 has 3, zone2 1.
    w = topology_normalizing_weight(2)
    raw = {"zone1": round(3 * w), "zone2": round(1 * w)}
    assert raw == {"zone1": 4, "zone2": 1}
    got = score_all(pl, snap, p, filtered=["node-a", "node-x"])
    assert got == {"node-a": 100 * (4 + 1 - 4) // 4, "node-x": 100 * (4 + 1 - 1) // 4}


def test_score_nodes_missing_topology_key_get_zero() -> None:
    nodes = [zn("node-a", "zone1"), zn("node-b", None), zn("node-x", "zone2")]
    pl, snap = setup(nodes, placed({"node-a": 1}))
    p = pod("p", {"foo": ""}, topologySpreadConstraints=[constraint(1, ZONE, when="ScheduleAnyway")])
    got = score_all(pl, snap, p)
    assert got is not None
    # Raw scores: node-a round(1 * ln 4) = 1, node-x 0; node-b is ignored.
    assert got == {"node-a": 0, "node-b": 0, "node-x": 100}


def test_score_skips_without_soft_constraints() -> None:
    pl, snap = setup(FOUR_ZONED, [])
    assert score_all(pl, snap, pod("p", {"foo": ""}, topologySpreadConstraints=[constraint(1, ZONE)])) is None


# --------------------------------------------------------------------------- defaults


def service_lister(selector: dict) -> Any:
    def lister(plural: str, ns: str | None) -> list[dict]:
        if plural == "services":
            return [{"metadata": {"name": "svc", "namespace": ns}, "spec": {"selector": selector}}]
        return []
    return lister


def test_system_defaults_need_a_selector() -> None:
    nodes = [zn("node-a", "zone1"), zn("node-b", "zone1")]
    pl, snap = setup(nodes, [])
    assert score_all(pl, snap, pod("p", {"app": "web"})) is None


def test_system_defaults_spread_by_service_selector() -> None:
    nodes = [zn("node-a", "zone1"), zn("node-b", "zone1"), zn("node-c", None)]
    existing = [pod("w1", {"app": "web"}, "node-a"), pod("w2", {"app": "web"}, "node-a"),
                pod("x", {"app": "other"}, "node-b")]
    pl, snap = setup(nodes, existing, list_objects=service_lister({"app": "web"}))
    got = score_all(pl, snap, pod("p", {"app": "web"}))
    assert got is not None
    # node-c lacks the zone label but system defaults still score hostname spreading.
    assert got["node-a"] < got["node-b"] and got["node-c"] == 100
    # The soft system defaults never filter.
    _, s = pl.pre_filter(CycleState(), PodInfo(pod("p", {"app": "web"})), snap.node_info_list)
    assert s is not None and s.is_skip()


def test_list_defaulting_requires_all_topologies() -> None:
    nodes = [zn("node-a", "zone1"), zn("node-c", None)]
    args = {"defaultingType": "List", "defaultConstraints": [
        {"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule"}]}
    pl, snap = setup(nodes, [pod("w1", {"app": "web"}, "node-a")], args, service_lister({"app": "web"}))
    got = filter_all(pl, snap, pod("p", {"app": "web"}))
    assert got == {"node-a": None, "node-c": NO_LABEL}
    with pytest.raises(ValueError):
        PodTopologySpread({"defaultingType": "System", "defaultConstraints": args["defaultConstraints"]}, Handle())


def test_default_selector_uses_owner_replicaset() -> None:
    p = pod("p", {"app": "web", "pod-template-hash": "abc"})
    p["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                                         "controller": True}]

    def lister(plural: str, ns: str | None) -> list[dict]:
        if plural == "replicasets":
            return [{"metadata": {"name": "rs", "namespace": "default"},
                     "spec": {"selector": {"matchLabels": {"app": "web", "pod-template-hash": "abc"}}}}]
        return []
    sel = default_selector(p, lister)
    assert sel.matches({"app": "web", "pod-template-hash": "abc"})
    assert not sel.matches({"app": "web", "pod-template-hash": "def"})
    assert default_selector(p, None).empty


# --------------------------------------------------------------------------- hints


def test_queueing_hints() -> None:
    pl = PodTopologySpread(None, Handle())
    target = pod("p", {"foo": ""}, topologySpreadConstraints=[constraint(1, ZONE)])
    assigned = pod("q", {"foo": ""}, "node-a")
    other = pod("r", {"bar": ""}, "node-a")
    assert pl.is_schedulable_after_pod_change(target, None, assigned) == QueueingHint.QUEUE
    assert pl.is_schedulable_after_pod_change(target, None, other) == QueueingHint.SKIP
    assert pl.is_schedulable_after_pod_change(target, assigned, None) == QueueingHint.QUEUE
    assert pl.is_schedulable_after_pod_change(target, assigned, other) == QueueingHint.QUEUE
    assert pl.is_schedulable_after_pod_change(target, assigned, assigned) == QueueingHint.SKIP
    unassigned = pod("u", {"foo": ""})
    assert pl.is_schedulable_after_pod_change(target, None, unassigned) == QueueingHint.SKIP
    other_ns = pod("q", {"foo": ""}, "node-a", ns="x")
    assert pl.is_schedulable_after_pod_change(target, None, other_ns) == QueueingHint.SKIP

    with_zone, without = zn("n", "zone1"), zn("n", None)
    assert pl.is_schedulable_after_node_change(target, None, with_zone) == QueueingHint.QUEUE
    assert pl.is_schedulable_after_node_change(target, None, without) == QueueingHint.SKIP
    assert pl.is_schedulable_after_node_change(target, without, with_zone) == QueueingHint.QUEUE
    assert pl.is_schedulable_after_node_change(target, with_zone, zn("n", "zone2")) == QueueingHint.QUEUE
    assert pl.is_schedulable_after_node_change(target, with_zone, zn("n", "zone1", x="y")) == QueueingHint.SKIP
    tainted = node("n", {HOST: "n", ZONE: "zone1"}, taints=[{"key": "k", "effect": "NoSchedule"}])
    assert pl.is_schedulable_after_node_change(target, tainted, with_zone) == QueueingHint.QUEUE
    assert pl.is_schedulable_after_node_change(target, with_zone, None) == QueueingHint.QUEUE
    kinds = {(e.event.resource.value, int(e.event.action)) for e in pl.events_to_register()}
    assert ("Pod", 1 | 128 | 2) in kinds and ("Node", 1 | 2 | 8 | 16) in kinds


def test_default_profile_registers_spread_and_affinity_with_weight_two() -> None:
    from kubeplane.scheduler.plugins.registry import in_tree_registry
    from kubeplane.scheduler.framework.runtime import Framework

    fw = Framework(in_tree_registry())
    assert fw.score_weights["PodTopologySpread"] == 2 and fw.score_weights["InterPodAffinity"] == 2
    lp = fw.list_plugins()
    assert "PodTopologySpread" in lp["preFilter"] and "InterPodAffinity" in lp["filter"]
    assert lp["postFilter"][-1] == "DefaultPreemption"
