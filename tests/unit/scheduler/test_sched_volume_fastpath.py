"""Vectorised-Filter hooks of the volume plugins and the narrowed PV listing,
checked against the per-node Filter and the full listing on seeded random inputs."""

from __future__ import annotations

import random
from typing import Any

import pytest

from kubeplane.scheduler.framework.nodeinfo import NodeInfo, PodInfo
from kubeplane.scheduler.framework.plugin import Handle
from kubeplane.scheduler.framework.types import EVERY_NODE, Code, CycleState
from kubeplane.scheduler.plugins.volumebinding.passivecache import new_pv_assume_cache
from kubeplane.scheduler.plugins.node_volume_limits import NodeVolumeLimits
from kubeplane.scheduler.plugins.volumebinding.binder import bind_volume_to_claim
from kubeplane.volume.matching import ANN_SELECTED_NODE, index_volumes_for_claim

from fake_client import FakeInformer
from volume_binding_env import Env, node, pod, pvc, random_env, random_volume, sc
from volume_plugins_env import Factory, Snapshot, claim_vol
from volume_plugins_env import pod as vl_pod
from volume_plugins_env import pvc as vl_pvc


def _plan_names(plan: Any) -> tuple[list[str], list[str]]:
    return ([b.pv["metadata"]["name"] for b in plan.static_bindings],
            [p.pvc["metadata"]["name"] for p in plan.dynamic_provisions])


def _check_pass_except_agrees_with_filter(seed: int) -> bool | str:
    """One seeded case; True when the hook answered with a shared plan, "rejected" when it
    answered EVERY_NODE (statuses stated at once), False on the fallback."""
    rng = random.Random(seed)
    env, names, claims = random_env(rng)
    env.handle.snapshot = Snapshot([env.node_info(n) for n in names])
    cache = env.plugin.binder.pv_cache
    # Some volumes assumed for another claim (not yet written).
    for v in list(env.inf("persistentvolumes").indexer.list()):
        if not v["spec"].get("claimRef") and rng.random() < 0.2:
            cache.assume(bind_volume_to_claim(cache.get(v["metadata"]["name"]), rng.choice(claims))[0])
    p = pod("p", *rng.sample([c["metadata"]["name"] for c in claims], rng.randrange(1, 3)))
    state, pi, (_, st) = env.cycle(p)
    if st is not None:
        return False
    exceptions = env.plugin.filter_pass_except(state, pi)
    ref_state, ref_pi, _ = env.cycle(p)
    if exceptions is EVERY_NODE:
        known = env.plugin.filter_known_statuses(state, pi)
        assert known is not None
        stated = 0
        for n in names:
            want = env.plugin.filter(ref_state, ref_pi, env.node_info(n))
            got = known.get(n)
            if got is None:
                continue  # Filter runs on this node
            stated += 1
            assert want is not None and (got.code, got.reasons) == (want.code, want.reasons), (n, want, got)
            assert got.plugin == "VolumeBinding"
        assert stated
        return "rejected"
    assert env.plugin.filter_known_statuses(state, pi) is None
    for n in names:
        want = env.plugin.filter(ref_state, ref_pi, env.node_info(n))
        if exceptions is None or n in exceptions:
            continue
        assert want is None, (n, want)
        got = env.plugin._plan_for(state.read("VolumeBinding"), n)
        assert got is not None
        assert _plan_names(got) == _plan_names(ref_state.read("VolumeBinding").pod_volumes_by_node[n])
    return exceptions is not None


@pytest.mark.parametrize("seed", range(60))
def test_volume_binding_pass_except_agrees_with_filter(seed: int) -> None:
    _check_pass_except_agrees_with_filter(seed)


def test_volume_binding_pass_except_random_cases_used_the_hook() -> None:
    """The seeded cases exercise the shared plan and the shared rejection, not only the fallback."""
    answers = [_check_pass_except_agrees_with_filter(seed) for seed in range(60)]
    assert answers.count(True) >= 10 and answers.count("rejected") >= 3, answers


def test_volume_binding_pass_except_static_and_dynamic_shared_plans() -> None:
    env = Env()
    env.handle.snapshot = Snapshot([env.node_info("n1"), env.node_info("n2")])
    env.put("storageclasses", sc("local"))
    env.put("storageclasses", sc("dyn", provisioner="kubeplane.io/local"))
    env.put("persistentvolumeclaims", pvc("a"))
    env.put("persistentvolumeclaims", pvc("d", cls="dyn"))
    env.put("persistentvolumes", pv_any := {"metadata": {"name": "v"}, "spec": {
        "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "local"},
        "status": {"phase": "Available"}})
    assert pv_any["metadata"]["name"] == "v"
    state, pi, (_, st) = env.cycle(pod("p", "a", "d"))
    assert st is None
    assert env.plugin.filter_pass_except(state, pi) == set()
    # Reserve on a node Filter never saw uses the shared plan.
    assert env.plugin.reserve(state, pi, "n2") is None
    plan = state.read("VolumeBinding").pod_volumes_by_node["n2"]
    assert _plan_names(plan) == (["v"], ["d"])
    assert env.plugin.binder.pv_cache.get("v")["spec"]["claimRef"]["name"] == "a"
    assert env.plugin.binder.pvc_cache.get("default/d")["metadata"]["annotations"][ANN_SELECTED_NODE] == "n2"
    env.plugin.unreserve(state, pi, "n2")
    assert "claimRef" not in env.plugin.binder.pv_cache.get("v")["spec"]
    # A pinned volume makes its node an exception.
    env.put("persistentvolumes", {"metadata": {"name": "local-n1"}, "spec": {
        "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "local",
        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}}},
        "status": {"phase": "Available"}})
    state, pi, (_, st) = env.cycle(pod("p", "a"))
    assert st is None
    assert env.plugin.filter_pass_except(state, pi) == {"n1"}


@pytest.mark.parametrize("seed", range(30))
def test_narrowed_pv_listing_gives_the_same_matches(seed: int) -> None:
    rng = random.Random(seed)
    inf = FakeInformer()
    cache = new_pv_assume_cache(inf)
    claims = [pvc(f"c{i}", size=rng.choice(["1Gi", "2Gi", "600Mi"])) for i in range(3)]
    claims[1]["spec"]["accessModes"] = ["ReadOnlyMany"]
    for i in range(rng.randrange(1, 40)):
        inf.put(random_volume(rng, i, claims))
    for v in list(inf.indexer.list()):
        if not v["spec"].get("claimRef") and rng.random() < 0.25:
            cache.assume(bind_volume_to_claim(v, rng.choice(claims))[0])
    nodes = [node("n1", zone="a"), node("n2", zone="b"), node("n3", zone="a"),
             {"metadata": {"name": "bare", "labels": {"zone": "b"}}}]
    for claim in claims:
        key = f"default/{claim['metadata']['name']}"
        full = cache.list_pvs("local")
        narrow = cache.list_pvs_for_claims("local", [key])
        assert [v["metadata"]["name"] for v in narrow] == [
            v["metadata"]["name"] for v in full
            if not inf.indexer.get_by_key(v["metadata"]["name"])["spec"].get("claimRef")
            or (inf.indexer.get_by_key(v["metadata"]["name"])["spec"]["claimRef"]["name"]
                == claim["metadata"]["name"])]
        a, b = index_volumes_for_claim(claim, full), index_volumes_for_claim(claim, narrow)
        assert a.prebound == b.prebound
        for n in nodes:
            for excluded in (set(), {f"pv{rng.randrange(40)}"}):
                assert a.find(n, excluded) is b.find(n, excluded)


@pytest.mark.parametrize("seed", range(30))
def test_node_volume_limits_pass_except_agrees_with_filter(seed: int) -> None:
    rng = random.Random(seed)
    f = Factory()
    drivers = ["csi.a", "csi.b", "csi.c"]
    nodes = [f"n{i}" for i in range(8)]
    pl = NodeVolumeLimits(None, Handle(informer_factory=f))
    for n in nodes:
        if rng.random() < 0.7:
            ds = []
            for d in rng.sample(drivers, rng.randrange(0, 3)):
                entry: dict = {"name": d, "nodeID": n}
                if rng.random() < 0.7:
                    entry["allocatable"] = {"count": rng.randrange(0, 3)}
                ds.append(entry)
            f.put("csinodes", {"metadata": {"name": n}, "spec": {"drivers": ds}})
    for d in drivers:
        f.put("storageclasses", {"metadata": {"name": d}, "provisioner": d})
    for i in range(8):
        d = rng.choice(drivers)
        f.put("persistentvolumes", {"metadata": {"name": f"pv{i}"}, "spec": {
            "csi": {"driver": d, "volumeHandle": f"h{i}"}}})
        f.put("persistentvolumeclaims", vl_pvc(f"c{i}", volume=f"pv{i}", cls=d))
        f.put("persistentvolumeclaims", vl_pvc(f"u{i}", cls=d))
    infos = []
    for n in nodes:
        existing = [vl_pod(f"e{n}{j}", claim_vol(f"c{rng.randrange(8)}"), node_name=n)
                    for j in range(rng.randrange(0, 3))]
        infos.append(NodeInfo(node(n), existing))
    vols = [claim_vol(rng.choice([f"c{rng.randrange(8)}", f"u{rng.randrange(8)}"]), name=f"v{j}")
            for j in range(rng.randrange(1, 4))]
    if rng.random() < 0.3:
        vols.append({"name": "inline", "csi": {"driver": rng.choice(drivers)}})
    p = vl_pod("p", *vols)
    state, pi = CycleState(), PodInfo(p)
    _, st = pl.pre_filter(state, pi, infos)
    assert st is None
    exceptions = pl.filter_pass_except(state, pi)
    assert exceptions is not None
    rejected = 0
    for ni in infos:
        got = pl.filter(state, pi, ni)
        if ni.name not in exceptions:
            assert got is None
        elif got is not None:
            assert got.code == Code.UNSCHEDULABLE
            rejected += 1
    assert rejected <= len(exceptions)
