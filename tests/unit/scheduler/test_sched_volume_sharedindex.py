"""Candidate PV indexes kept across pods (``SharedVolumeIndex``) against a fresh
linear search, over seeded random sequences of informer changes and assumptions."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from kubeplane.client.informer import Indexer
from kubeplane.scheduler.plugins.volumebinding.passivecache import UnclaimedGenerations, new_pv_assume_cache, unclaimed_generations
from kubeplane.scheduler.plugins.volumebinding.binder import bind_volume_to_claim
from kubeplane.volume.matching import claim_class, find_matching_volume

from volume_binding_env import Env, node, pod, pvc, random_env, random_volume, sc

NODES = [node("n1", zone="a"), node("n2", zone="b"), node("n3", zone="a"),
         {"metadata": {"name": "bare", "labels": {"zone": "b"}}}]


def _claims(env: Env) -> list[dict]:
    specs: list[tuple[str, str, str, list[str] | None, dict | None]] = [
        ("c0", "local", "1Gi", None, None),
        ("c1", "local", "1Gi", None, None),  # same shape as c0: shares its index
        ("c2", "local", "2Gi", None, None),
        ("c3", "local", "600Mi", ["ReadOnlyMany"], None),
        ("c4", "local", "1Gi", None, {"matchLabels": {"tier": "gold"}}),
        ("c5", "other", "1Gi", None, None),
        ("c6", "local", "500Mi", None, {"matchExpressions": [{"key": "tier", "operator": "In",
                                                              "values": ["silver", "gold"]}]}),
    ]
    out = []
    for name, cls, size, modes, selector in specs:
        c = pvc(name, cls=cls, size=size)
        if modes is not None:
            c["spec"]["accessModes"] = modes
        if selector is not None:
            c["spec"]["selector"] = selector
        out.append(env.put("persistentvolumeclaims", c))
    return out


def _reference(env: Env, claims: list[dict], node_obj: dict) -> list[Any]:
    """The Filter's choice by a linear search over a fresh listing (unclaimed PVs
    of the class and PVs pre-bound to the pod's claims, current view)."""
    cache = env.plugin.binder.pv_cache
    keys: dict[str, list[str]] = {}
    for c in claims:
        keys.setdefault(claim_class(c), []).append(f"default/{c['metadata']['name']}")
    chosen: dict[str, Any] = {}
    out: list[Any] = []
    for c in claims:
        cls = claim_class(c)
        pv = find_matching_volume(c, cache.list_pvs_for_claims(cls, keys[cls]), node_obj, chosen, True)
        out.append(pv)
        if pv is not None:
            chosen[pv["metadata"]["name"]] = pv
    return out


def _mutate(env: Env, rng: random.Random, claims: list[dict], counter: list[int], assumed: list[dict]) -> None:
    inf = env.inf("persistentvolumes")
    cache = env.plugin.binder.pv_cache
    pvs = inf.indexer.list()
    op = rng.random()
    notify = rng.random() < 0.7  # handlers may run late: nothing may depend on them
    if op < 0.2 or not pvs:
        counter[0] += 1
        v = random_volume(rng, 1000 + counter[0], claims)
        env.put("persistentvolumes", v, notify)
    elif op < 0.4:
        v = copy.deepcopy(rng.choice(pvs))
        change = rng.randrange(6)
        if change == 0:
            v["spec"]["claimRef"] = {"namespace": "default", "name": "someone", "uid": "x"}
        elif change == 1:
            v["spec"].pop("claimRef", None)
        elif change == 2:
            v["status"]["phase"] = rng.choice(["Available", "Bound", "Released"])
        elif change == 3:
            v["spec"]["capacity"]["storage"] = rng.choice(["1Gi", "2Gi", "500Mi"])
        elif change == 4:
            v["metadata"]["labels"] = {"tier": rng.choice(["gold", "silver"])}
        else:
            c = rng.choice(claims)
            v["spec"]["claimRef"] = {"namespace": "default", "name": c["metadata"]["name"],
                                     "uid": c["metadata"]["uid"]}
        env.put("persistentvolumes", v, notify)
    elif op < 0.5:
        v = rng.choice(pvs)
        inf.indexer.delete(v)
        if notify:
            for _, _, on_delete in inf.handlers:
                if on_delete:
                    on_delete(v)
    elif op < 0.8:
        v = cache.get(rng.choice(pvs)["metadata"]["name"])
        if rng.random() < 0.05:
            new = copy.deepcopy(v)  # an assumption without claimRef (never made by VolumeBinding)
            new["metadata"]["labels"] = {"tier": "gold"}
            new["spec"].pop("claimRef", None)
        else:
            new = bind_volume_to_claim(v, rng.choice(claims))[0]
        if new["metadata"].get("resourceVersion") == inf.indexer.get_by_key(v["metadata"]["name"])["metadata"].get(
                "resourceVersion"):
            cache.assume(new)
            assumed.append(new)
    elif assumed:
        cache.restore(assumed.pop(rng.randrange(len(assumed))))


@pytest.mark.parametrize("seed", range(40))
def test_shared_index_matches_linear_search(seed: int) -> None:
    rng = random.Random(seed)
    env = Env()
    env.put("storageclasses", sc("local"))
    env.put("storageclasses", sc("other"))
    for n in NODES[2:]:
        env.put("nodes", n)
    claims = _claims(env)
    counter = [0]
    assumed: list[dict] = []
    for i in range(rng.randrange(5, 60)):
        v = random_volume(rng, i, claims)
        if rng.random() < 0.6:
            v["spec"].pop("claimRef", None)
        env.put("persistentvolumes", v)
    binder = env.plugin.binder
    shared_used = 0
    for step in range(120):
        for _ in range(rng.randrange(0, 4)):
            _mutate(env, rng, claims, counter, assumed)
        names = rng.sample([c["metadata"]["name"] for c in claims], rng.choice([1, 1, 2, 3]))
        p = pod(f"p{step}", *names)
        got = binder.get_pod_volume_claims(p)
        shared_used += sum(1 for ix in got.volume_indexes.values() if ix.current is not None)
        for n in NODES:
            _, bindings, unmatched = binder._find_matching_volumes(
                got.claims_to_find, got.unbound_volumes_delay_binding, n, got.volume_indexes, True)
            chosen = {id(b.pvc): b.pv for b in bindings}
            want = _reference(env, got.claims_to_find, n)
            assert [chosen.get(id(c)) for c in got.claims_to_find] == want
            for c, w in zip(got.claims_to_find, want):
                assert (chosen.get(id(c)) is w) or w is None
    assert shared_used > 0


def test_generation_counts_unclaimed_arrivals_only() -> None:
    store = Indexer()
    gens: UnclaimedGenerations = unclaimed_generations(store)
    assert unclaimed_generations(store) is gens
    free = {"metadata": {"name": "a", "resourceVersion": "1"}, "spec": {"storageClassName": "x"}}
    store.add(free)
    assert gens.get("x") == 1
    claimed = copy.deepcopy(free)
    claimed["metadata"]["resourceVersion"] = "2"
    claimed["spec"]["claimRef"] = {"namespace": "d", "name": "c"}
    store.update(claimed)  # the outgoing unclaimed object is not counted again
    assert gens.get("x") == 1
    released = copy.deepcopy(free)
    released["metadata"]["resourceVersion"] = "3"
    store.update(released)
    assert gens.get("x") == 2
    store.update(released)  # the same object again: nothing new
    assert gens.get("x") == 2
    store.delete(released)
    assert gens.get("x") == 2
    store.add(copy.deepcopy(released))
    assert gens.get("x") == 3
    assert gens.get("y") == 0


def test_cache_tracks_assumed_claim_refs() -> None:
    env = Env()
    env.put("storageclasses", sc("local"))
    c = env.put("persistentvolumeclaims", pvc("c"))
    v = env.put("persistentvolumes", {"metadata": {"name": "v"}, "spec": {
        "storageClassName": "local", "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]},
        "status": {"phase": "Available"}})
    cache = env.plugin.binder.pv_cache
    assert not cache.may_be_prebound("default/c")
    new = bind_volume_to_claim(v, c)[0]
    cache.assume(new)
    assert cache.may_be_prebound("default/c")
    assert cache.candidate_state("v", v) == cache.SHADOWED
    cache.restore(new)
    assert not cache.may_be_prebound("default/c")
    assert cache.candidate_state("v", v) == cache.CANDIDATE
    cache.assume(new)
    env.put("persistentvolumes", new)  # the write comes back: the assumption expires
    assert cache.candidate_state("v", v) == cache.GONE
    assert cache.may_be_prebound("default/c")  # now through the informer's claimRef index
    assert len(cache) == 0


def test_second_cache_on_the_same_informer_shares_generations() -> None:
    env = Env()
    other = new_pv_assume_cache(env.inf("persistentvolumes"))
    env.put("persistentvolumes", {"metadata": {"name": "v"}, "spec": {"storageClassName": "local"}})
    assert other.unclaimed_generation("local") == env.plugin.binder.pv_cache.unclaimed_generation("local") == 1


def _reference_pv_hint(pod: dict, pv: Any, lookup: Any) -> Any:
    """The PV queueing hint computed from scratch (no memo)."""
    from kubeplane.api.selectors import label_selector_from_dict
    from kubeplane.scheduler.framework.types import QueueingHint
    from kubeplane.volume.matching import check_volume_satisfies_claim

    claims = set()
    for vol in (pod.get("spec") or {}).get("volumes") or []:
        if isinstance(vol.get("persistentVolumeClaim"), dict):
            claims.add(vol["persistentVolumeClaim"].get("claimName"))
        elif vol.get("ephemeral") is not None:
            claims.add(f"{pod['metadata']['name']}-{vol.get('name')}")
    if not claims:
        return QueueingHint.SKIP
    if pv["metadata"].get("deletionTimestamp"):
        return QueueingHint.SKIP
    ns = pod["metadata"].get("namespace")
    ref = pv["spec"].get("claimRef") or {}
    if ref.get("name") in claims and ref.get("namespace") == ns:
        return QueueingHint.QUEUE
    if (pv.get("status") or {}).get("phase") != "Available" or ref:
        return QueueingHint.SKIP
    for name in claims:
        claim = lookup(ns, name)
        if claim is None:
            return QueueingHint.QUEUE
        spec = claim["spec"]
        if spec.get("volumeName"):
            if spec["volumeName"] == pv["metadata"]["name"]:
                return QueueingHint.QUEUE
            continue
        if check_volume_satisfies_claim(pv, claim) is not None:
            continue
        sel = spec.get("selector")
        if sel is not None and not label_selector_from_dict(sel).matches(pv["metadata"].get("labels") or {}):
            continue
        return QueueingHint.QUEUE
    return QueueingHint.SKIP


@pytest.mark.parametrize("seed", range(20))
def test_pv_hint_with_memo_matches_reference(seed: int) -> None:
    from kubeplane.scheduler.plugins.volumebinding.volume_binding import HintMemo, pv_change_hint

    rng = random.Random(seed)
    claims: dict[tuple[str, str], dict] = {}
    names = [f"c{i}" for i in range(6)]

    def new_claim(name: str) -> dict:
        c = pvc(name, cls=rng.choice(["local", "other"]), size=rng.choice(["1Gi", "2Gi", "500Mi"]))
        if rng.random() < 0.3:
            c["spec"]["selector"] = {"matchLabels": {"tier": rng.choice(["gold", "silver"])}}
        if rng.random() < 0.2:
            c["spec"]["accessModes"] = ["ReadOnlyMany"]
        if rng.random() < 0.1:
            c["spec"]["volumeName"] = f"pv{rng.randrange(10)}"
        return c

    for n in names:
        if rng.random() < 0.9:
            claims[("default", n)] = new_claim(n)
    pods = [pod(f"p{i}", *rng.sample(names, rng.randrange(0, 3))) for i in range(8)]
    memo = HintMemo()
    pvs = [random_volume(rng, i, list(claims.values()) or [pvc("x")]) for i in range(10)]
    for _ in range(400):
        r = rng.random()
        if r < 0.1:
            n = rng.choice(names)
            claims[("default", n)] = new_claim(n)  # a replaced claim object
        elif r < 0.15:
            claims.pop(("default", rng.choice(names)), None)
        elif r < 0.3:
            i = rng.randrange(len(pvs))
            pvs[i] = random_volume(rng, i, list(claims.values()) or [pvc("x")])
        p, v = rng.choice(pods), rng.choice(pvs)
        lookup = lambda ns, name: claims.get((ns, name))  # noqa: E731
        assert pv_change_hint(p, v, lookup, memo) == _reference_pv_hint(p, v, lookup)


@pytest.mark.parametrize("seed", range(60))
def test_per_cycle_memos_give_the_per_node_answer(seed: int) -> None:
    """find_pod_volumes with one PodVolumeClaims for all nodes (memos filled
    along the way) equals a fresh PreFilter per node."""

    rng = random.Random(seed)
    env, names, claims = random_env(rng)
    if rng.random() < 0.5:
        env.put("storageclasses", sc("local", provisioner=rng.choice(["", "kubeplane.io/local"])))
    binder = env.plugin.binder
    cache = binder.pv_cache
    for v in list(env.inf("persistentvolumes").indexer.list()):
        if not v["spec"].get("claimRef") and rng.random() < 0.2:
            cache.assume(bind_volume_to_claim(cache.get(v["metadata"]["name"]), rng.choice(claims))[0])
    p = pod("p", *rng.sample([c["metadata"]["name"] for c in claims], rng.randrange(1, 3)))
    try:
        shared = binder.get_pod_volume_claims(p)
    except Exception:  # noqa: BLE001 - an invalid class: PreFilter errors, nothing to compare
        return
    order = names * 2
    rng.shuffle(order)
    for n in order:
        node_obj = env.get("nodes", n)
        fresh = binder.get_pod_volume_claims(p)
        try:
            want = binder.find_pod_volumes(p, fresh, node_obj)
        except Exception as err:  # noqa: BLE001 - the same error must come from the memoized path
            with pytest.raises(type(err)):
                binder.find_pod_volumes(p, shared, node_obj)
            continue
        got = binder.find_pod_volumes(p, shared, node_obj)
        assert got[1] == want[1]
        assert [(b.pvc["metadata"]["name"], b.pv["metadata"]["name"]) for b in got[0].static_bindings] == [
            (b.pvc["metadata"]["name"], b.pv["metadata"]["name"]) for b in want[0].static_bindings]
        assert [d.pvc["metadata"]["name"] for d in got[0].dynamic_provisions] == [
            d.pvc["metadata"]["name"] for d in want[0].dynamic_provisions]
