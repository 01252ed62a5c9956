"""Scheduler cache: assumed pods lifecycle and incremental snapshots."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kubeplane.scheduler.cache import Cache, CacheError, NodeTree, Snapshot


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def node(name: str, zone: str | None = None, cpu: str = "4", images: list | None = None) -> dict:
    labels = {"topology.kubernetes.io/zone": zone} if zone else {}
    status: dict[str, Any] = {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"}}
    if images:
        status["images"] = images
    return {"metadata": {"name": name, "labels": labels}, "status": status}


def pod(name: str, node_name: str = "", cpu: str = "100m", anti: bool = False) -> dict:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}
    if node_name:
        spec["nodeName"] = node_name
    if anti:
        spec["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {}, "topologyKey": "kubernetes.io/hostname"}]}}
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}"}, "spec": spec}


@pytest.fixture
def cache() -> Cache:
    c = Cache(Clock())
    for n in ("n1", "n2", "n3"):
        c.add_node(node(n))
    return c


def test_assume_then_confirm_by_informer_add(cache: Cache) -> None:
    p = pod("a", "n1", "500m")
    cache.assume_pod(p)
    assert cache.is_assumed(p)
    snap = cache.snapshot()
    assert snap.get("n1").requested["cpu"] == 500
    with pytest.raises(CacheError, match="is in the cache, so can't be assumed"):
        cache.assume_pod(p)
    cache.finish_binding(p)
    confirmed = copy.deepcopy(p)
    confirmed["metadata"]["resourceVersion"] = "7"
    cache.add_pod(confirmed)
    assert not cache.is_assumed(p)
    assert cache.get_pod(p) is confirmed
    cache.update_snapshot(snap)
    assert snap.get("n1").requested["cpu"] == 500 and len(snap.get("n1").pods) == 1
    with pytest.raises(CacheError, match="already in added state"):
        cache.add_pod(confirmed)


def test_confirm_on_a_different_node_moves_the_pod(cache: Cache) -> None:
    p = pod("a", "n1", "500m")
    cache.assume_pod(p)
    moved = pod("a", "n2", "500m")
    cache.add_pod(moved)
    snap = cache.snapshot()
    assert snap.get("n1").requested["cpu"] == 0
    assert snap.get("n2").requested["cpu"] == 500


def test_forget_pod(cache: Cache) -> None:
    p = pod("a", "n1")
    cache.assume_pod(p)
    with pytest.raises(CacheError, match="was assumed on n2 but assigned to n1"):
        cache.forget_pod(pod("a", "n2"))
    cache.forget_pod(p)
    assert not cache.is_assumed(p)
    assert cache.snapshot().get("n1").pods == []
    with pytest.raises(CacheError, match="wasn't assumed"):
        cache.forget_pod(p)
    cache.add_pod(p)
    with pytest.raises(CacheError, match="wasn't assumed"):
        cache.forget_pod(p)


def test_assumed_pods_expire_only_with_ttl_after_binding_finished() -> None:
    clock = Clock()
    c = Cache(clock, ttl=30)
    c.add_node(node("n1"))
    p = pod("a", "n1")
    c.assume_pod(p)
    clock.now += 100
    assert c.cleanup_assumed_pods() == []  # binding not finished: never expires
    c.finish_binding(p)
    clock.now += 29
    assert c.cleanup_assumed_pods() == []
    clock.now += 2
    assert c.cleanup_assumed_pods() == [p]
    assert not c.is_assumed(p) and c.pod_count() == 0


def test_ttl_zero_never_expires(cache: Cache) -> None:
    p = pod("a", "n1")
    cache.assume_pod(p)
    cache.finish_binding(p)
    assert cache.cleanup_assumed_pods(now=1e12) == []
    assert cache.is_assumed(p)


def test_update_and_remove_pod(cache: Cache) -> None:
    p = pod("a", "n1", "100m")
    cache.add_pod(p)
    bigger = pod("a", "n1", "300m")
    cache.update_pod(p, bigger)
    assert cache.snapshot().get("n1").requested["cpu"] == 300
    with pytest.raises(CacheError, match="different node"):
        cache.update_pod(bigger, pod("a", "n2"))
    cache.remove_pod(bigger)
    assert cache.snapshot().get("n1").requested["cpu"] == 0
    with pytest.raises(CacheError, match="not found in scheduler cache"):
        cache.remove_pod(bigger)
    assumed = pod("b", "n1")
    cache.assume_pod(assumed)
    with pytest.raises(CacheError, match="cannot be updated"):
        cache.update_pod(assumed, assumed)


def test_incremental_snapshot_copies_only_changed_nodes(cache: Cache) -> None:
    snap = Snapshot()
    cache.update_snapshot(snap)
    infos = {ni.name: ni for ni in snap.node_info_list}
    gens = {n: ni.generation for n, ni in infos.items()}
    order = [ni.name for ni in snap.node_info_list]
    cache.add_pod(pod("a", "n2"))
    cache.update_snapshot(snap)
    assert [ni.name for ni in snap.node_info_list] == order
    # identity of NodeInfo objects is kept (list not rebuilt)
    assert all(snap.node_info_list[i] is infos[n] for i, n in enumerate(order))
    assert snap.get("n2").generation > gens["n2"]
    assert snap.get("n1").generation == gens["n1"] and snap.get("n3").generation == gens["n3"]
    assert len(snap.get("n2").pods) == 1
    # the snapshot is a copy: later cache changes don't leak in until the next update
    cache.add_pod(pod("b", "n2"))
    assert len(snap.get("n2").pods) == 1
    cache.update_snapshot(snap)
    assert len(snap.get("n2").pods) == 2


def test_incremental_snapshot_touches_only_newer_nodes(cache: Cache, monkeypatch: pytest.MonkeyPatch) -> None:
    snap = cache.snapshot()
    from kubeplane.scheduler.framework import nodeinfo
    cloned: list[str] = []
    orig = nodeinfo.NodeInfo.copy_into

    def spy(self: Any, target: Any) -> None:
        cloned.append(self.name)
        orig(self, target)

    monkeypatch.setattr(nodeinfo.NodeInfo, "copy_into", spy)
    before = snap.get("n3")
    cache.add_pod(pod("a", "n3"))
    cache.update_snapshot(snap)
    assert cloned == ["n3"]
    # Updated in place, and independent of the cache's NodeInfo.
    assert snap.get("n3") is before and [p.pod["metadata"]["name"] for p in before.pods] == ["a"]
    cloned.clear()
    cache.update_snapshot(snap)
    assert cloned == []
    cache.add_pod(pod("b", "n3"))
    assert len(before.pods) == 1


def test_snapshot_node_add_remove_and_affinity_lists(cache: Cache) -> None:
    snap = cache.snapshot()
    assert snap.have_pods_with_required_anti_affinity_list == []
    cache.add_pod(pod("x", "n1", anti=True))
    cache.update_snapshot(snap)
    assert [n.name for n in snap.have_pods_with_required_anti_affinity_list] == ["n1"]
    assert [n.name for n in snap.have_pods_with_affinity_list] == ["n1"]
    cache.add_node(node("n4"))
    cache.update_snapshot(snap)
    assert [ni.name for ni in snap.node_info_list] == ["n1", "n2", "n3", "n4"]
    cache.remove_node(node("n2"))
    cache.update_snapshot(snap)
    assert [ni.name for ni in snap.node_info_list] == ["n1", "n3", "n4"]
    with pytest.raises(KeyError):
        snap.get("n2")
    # a removed node with pods left is kept internally but not in the snapshot
    cache.remove_node(node("n1"))
    cache.update_snapshot(snap)
    assert [ni.name for ni in snap.node_info_list] == ["n3", "n4"]
    assert snap.have_pods_with_affinity_list == []
    cache.remove_pod(pod("x", "n1", anti=True))
    assert "n1" not in cache.dump()["nodes"]


def test_pod_before_node(cache: Cache) -> None:
    cache.add_pod(pod("early", "n9", "1"))
    snap = cache.snapshot()
    assert "n9" not in [ni.name for ni in snap.node_info_list]
    cache.add_node(node("n9"))
    cache.update_snapshot(snap)
    assert snap.get("n9").requested["cpu"] == 1000


def test_node_tree_interleaves_zones() -> None:
    t = NodeTree()
    for name, zone in [("a1", "a"), ("a2", "a"), ("a3", "a"), ("b1", "b"), ("c1", "c"), ("c2", "c")]:
        t.add_node(node(name, zone))
    assert t.list() == ["a1", "b1", "c1", "a2", "c2", "a3"]
    t.remove_node(node("b1", "b"))
    assert t.list() == ["a1", "c1", "a2", "c2", "a3"]
    t.update_node(node("a1", "a"), node("a1", "c"))
    assert t.list() == ["a2", "c1", "a3", "c2", "a1"]


def test_image_states_are_shared_across_nodes() -> None:
    c = Cache()
    img = [{"names": ["nginx:1.0"], "sizeBytes": 100}]
    c.add_node(node("n1", images=img))
    c.add_node(node("n2", images=img))
    snap = c.snapshot()
    assert snap.get("n1").image_states["nginx:1.0"].num_nodes == 2
    c.update_node(node("n2", images=img), node("n2"))
    assert snap.get("n1").image_states["nginx:1.0"].num_nodes == 1


def test_dump_lists_assumed(cache: Cache) -> None:
    cache.assume_pod(pod("a", "n1"))
    d = cache.dump()
    assert d["assumed_pods"] == ["u-a"]
    assert d["nodes"]["n1"]["pods"] == ["ns/a"]


@pytest.mark.parametrize("seed", range(5))
def test_used_pvc_set_is_kept_incrementally_like_a_full_rebuild(seed: int) -> None:
    """Pods using shared and private claims come and go on random nodes; after every
    snapshot update the incrementally kept set equals the one rebuilt from all nodes."""
    import random

    rng = random.Random(seed)
    c = Cache(Clock())
    for i in range(8):
        c.add_node(node(f"n{i}"))
    snap = Snapshot()
    live: dict[str, dict] = {}
    for step in range(300):
        if live and rng.random() < 0.4:
            name = rng.choice(sorted(live))
            c.remove_pod(live.pop(name))
        else:
            name = f"p{step}"
            p = pod(name, node_name=f"n{rng.randrange(8)}")
            claims = rng.sample(["shared-a", "shared-b", f"own-{step}"], rng.randint(0, 2))
            p["spec"]["volumes"] = [{"name": f"v{j}", "persistentVolumeClaim": {"claimName": cl}}
                                    for j, cl in enumerate(claims)]
            c.add_pod(p)
            live[name] = p
        if step % 3 == 0 and rng.random() < 0.1:
            c.add_node(node(f"extra{step}"))
        c.update_snapshot(snap)
        kept = set(snap.used_pvc_set)
        snap._rebuild_pvcs()
        assert kept == snap.used_pvc_set, f"step {step}"
        assert all(snap.is_pvc_used_by_pods(f"ns/{cl}") for p in live.values()
                   for cl in [v["persistentVolumeClaim"]["claimName"] for v in p["spec"]["volumes"]])


def _info_of(cache: Cache, node_name: str, name: str):
    return next(pi for pi in cache.snapshot().get(node_name).pods if pi.name == name)


def test_a_new_version_with_the_same_spec_keeps_what_was_derived_from_it(cache: Cache) -> None:
    p = pod("a", "n1", "500m", anti=True)
    cache.assume_pod(p)
    assumed = _info_of(cache, "n1", "a")
    terms = assumed.required_anti_affinity_terms
    # The informer's version: same spec, newer metadata and a status.
    confirmed = copy.deepcopy(p)
    confirmed["metadata"]["resourceVersion"] = "7"
    confirmed["status"] = {"startTime": "2026-01-01T00:00:00Z"}
    cache.add_pod(confirmed)
    info = _info_of(cache, "n1", "a")
    assert info.pod is confirmed
    assert info.requests is assumed.requests and info.required_anti_affinity_terms is terms
    # The start time comes from the status, so it is read from the new version.
    assert assumed.start_time == float("inf")
    assert info.start_time == pytest.approx(1767225600.0)
    # A spec change: everything is derived again.
    grown = copy.deepcopy(confirmed)
    grown["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "700m"
    cache.update_pod(confirmed, grown)
    info = _info_of(cache, "n1", "a")
    assert info.requests is not assumed.requests and info.requests["cpu"] == 700
    assert cache.snapshot().get("n1").requested["cpu"] == 700


def test_for_version_refuses_another_pod_or_spec() -> None:
    from kubeplane.scheduler.framework.nodeinfo import PodInfo

    info = PodInfo(pod("a", "n1"))
    other = pod("b", "n1")
    assert info.for_version(other) is None  # another uid and name, same spec
    moved = pod("a", "n2")
    assert info.for_version(moved) is None
    same = pod("a", "n1")
    assert info.for_version(same).pod is same
