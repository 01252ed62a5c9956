"""The structured allocator: pools, search, constraints, results and CEL caching."""

from __future__ import annotations

import pytest

from kubeplane.dra.allocator import (
    AllocationError,
    Allocator,
    DeviceMatchCache,
    Features,
    NodeAllocationError,
    REASON_CANNOT_ALLOCATE,
    claim_device_ids,
)
from kubeplane.dra.cel import compile_selector
from kubeplane.dra.pools import DeviceID, gather_pools

DA, DB = "driver-a.example.com", "driver-b.example.com"


def node(name="node1", **labels):
    return {"metadata": {"name": name, "labels": {"region": "region1", **labels} if name == "node1" else labels}}


def dclass(name, driver, config=None, extra=None):
    sels = [{"cel": {"expression": f'device.driver == "{driver}"'}}] + (extra or [])
    spec = {"selectors": sels}
    if config:
        spec["config"] = config
    return {"metadata": {"name": name}, "spec": spec}


CLASSES = {"class-a": dclass("class-a", DA), "class-b": dclass("class-b", DB)}


def dev(name, attrs=None, mem=None):
    d = {"name": name}
    if attrs:
        d["attributes"] = attrs
    if mem:
        d["capacity"] = {"memory": {"value": mem}}
    return d


def rslice(name, devices, driver=DA, pool="pool1", node_name="node1", gen=1, count=1, selector=None, all_nodes=False):
    spec = {"driver": driver, "pool": {"name": pool, "generation": gen, "resourceSliceCount": count},
            "devices": devices}
    if selector is not None:
        spec["nodeSelector"] = selector
    elif all_nodes:
        spec["allNodes"] = True
    else:
        spec["nodeName"] = node_name
    return {"metadata": {"name": name}, "spec": spec}


def exact(name, cls="class-a", count=None, mode=None, selectors=None, admin=None):
    e = {"deviceClassName": cls}
    if count is not None:
        e["count"] = count
    if mode:
        e["allocationMode"] = mode
    if selectors:
        e["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if admin is not None:
        e["adminAccess"] = admin
    return {"name": name, "exactly": e}


def claim(name, *requests, constraints=None, config=None):
    devices = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    if config:
        devices["config"] = config
    return {"metadata": {"name": name, "namespace": "default"}, "spec": {"devices": devices}}


def picks(results):
    return [[(r["request"], r["pool"], r["device"]) for r in res["devices"]["results"]] for res in results]


LOCAL = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node1"]}]}]}
MEM = 'device.capacity["%s"].memory.compareTo(quantity("%s")) >= 0'


def test_empty_claims():
    assert Allocator([], set(), CLASSES, []).allocate(node()) == []


def test_simple():
    res = Allocator([claim("c", exact("req-0"))], set(), CLASSES, [rslice("s", [dev("device-1")])]).allocate(node())
    assert res == [{"devices": {"results": [{"request": "req-0", "driver": DA, "pool": "pool1", "device": "device-1"}]},
                    "nodeSelector": LOCAL}]


def test_other_node_slice_ignored():
    slices = [rslice("s1", [dev("device-1")], node_name="node1"), rslice("s2", [dev("device-2")], pool="pool2", node_name="node2")]
    res = Allocator([claim("c", exact("req-0"))], set(), CLASSES, slices).allocate(node("node2"))
    assert picks(res) == [[("req-0", "pool2", "device-2")]]
    assert res[0]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["node2"]


def test_count_two_across_pools():
    slices = [rslice("s1", [dev("d1")], pool="pool1"), rslice("s2", [dev("d2")], pool="pool2")]
    res = Allocator([claim("c", exact("req-0", count=2))], set(), CLASSES, slices).allocate(node())
    assert sorted(p[1:] for p in picks(res)[0]) == [("pool1", "d1"), ("pool2", "d2")]


def test_not_enough_devices():
    alloc = Allocator([claim("c", exact("req-0", count=2))], set(), CLASSES, [rslice("s", [dev("d1")])])
    assert alloc.allocate(node()) is None
    assert alloc.explain(node()) == (None, REASON_CANNOT_ALLOCATE)


def test_backtrack_requests_small_and_large():
    devs = [dev("large", mem="2Gi"), dev("small", mem="1Gi")]
    c = claim("c", exact("req-0", selectors=[MEM % (DA, "1Gi")]), exact("req-1", selectors=[MEM % (DA, "2Gi")]))
    res = Allocator([c], set(), CLASSES, [rslice("s", devs)]).allocate(node())
    assert picks(res) == [[("req-0", "pool1", "small"), ("req-1", "pool1", "large")]]


def test_backtrack_across_claims():
    devs = [dev("large", mem="2Gi"), dev("small", mem="1Gi")]
    c0 = claim("c0", exact("req-0", selectors=[MEM % (DA, "1Gi")]))
    c1 = claim("c1", exact("req-0", selectors=[MEM % (DA, "2Gi")]))
    res = Allocator([c0, c1], set(), CLASSES, [rslice("s", devs)]).allocate(node())
    assert picks(res) == [[("req-0", "pool1", "small")], [("req-0", "pool1", "large")]]


def test_already_allocated_excluded():
    slices = [rslice("s", [dev("d1"), dev("d2")])]
    res = Allocator([claim("c", exact("r"))], {DeviceID(DA, "pool1", "d1")}, CLASSES, slices).allocate(node())
    assert picks(res) == [[("r", "pool1", "d2")]]
    assert Allocator([claim("c", exact("r", count=2))], {DeviceID(DA, "pool1", "d1")}, CLASSES, slices).allocate(node()) is None


def test_devices_not_shared_between_claims():
    slices = [rslice("s", [dev("d1")])]
    assert Allocator([claim("a", exact("r")), claim("b", exact("r"))], set(), CLASSES, slices).allocate(node()) is None


def test_all_mode():
    slices = [rslice("s1", [dev("d1"), dev("d2")], pool="p1"), rslice("s2", [dev("d3")], pool="p2"),
              rslice("s3", [dev("b1")], driver=DB, pool="p3")]
    res = Allocator([claim("c", exact("r", mode="All"))], set(), CLASSES, slices).allocate(node())
    assert [p[2] for p in picks(res)[0]] == ["d1", "d2", "d3"]


def test_all_mode_plus_another_claim_either_order():
    slices = [rslice("s1", [dev("d1"), dev("d2")]), rslice("s2", [dev("b1")], driver=DB, pool="pb")]
    for order in ([0, 1], [1, 0]):
        cl = [claim("all", exact("r", mode="All")), claim("one", exact("r", cls="class-b"))]
        res = Allocator([cl[i] for i in order], set(), CLASSES, slices).allocate(node())
        assert res is not None and len(res) == 2


def test_all_mode_some_allocated_and_admin_access():
    slices = [rslice("s", [dev("d1"), dev("d2")])]
    allocated = {DeviceID(DA, "pool1", "d1")}
    assert Allocator([claim("c", exact("r", mode="All"))], allocated, CLASSES, slices).allocate(node()) is None
    res = Allocator([claim("c", exact("r", mode="All", admin=True))], allocated, CLASSES, slices).allocate(node())
    assert [r["adminAccess"] for r in res[0]["devices"]["results"]] == [True, True]


def test_all_mode_no_devices_and_incomplete_pool():
    assert Allocator([claim("c", exact("r", mode="All"))], set(), CLASSES, [rslice("s", [])]).allocate(node()) is None
    with pytest.raises(AllocationError, match="currently being updated"):
        Allocator([claim("c", exact("r", mode="All"))], set(), CLASSES, [rslice("s", [dev("d1")], count=2)]).allocate(node())


def test_admin_access_shares_devices():
    slices = [rslice("s", [dev("d1")])]
    res = Allocator([claim("a", exact("r", admin=True)), claim("b", exact("r", admin=True))], set(), CLASSES, slices).allocate(node())
    assert picks(res) == [[("r", "pool1", "d1")], [("r", "pool1", "d1")]]
    res = Allocator([claim("a", exact("r")), claim("b", exact("r", admin=True))], set(), CLASSES, slices).allocate(node())
    assert picks(res) == [[("r", "pool1", "d1")], [("r", "pool1", "d1")]]
    assert claim_device_ids({"status": {"allocation": res[1]}}) == []
    with pytest.raises(AllocationError, match="feature is disabled"):
        Allocator([claim("a", exact("r", admin=False))], set(), CLASSES, slices, Features(admin_access=False))


def test_first_available_fallback():
    slices = [rslice("s", [dev("d1")])]
    req = {"name": "req-0", "firstAvailable": [{"name": "subreq-0", "deviceClassName": "class-b"},
                                               {"name": "subreq-1", "deviceClassName": "class-a"}]}
    res = Allocator([claim("c", req)], set(), CLASSES, slices).allocate(node())
    assert picks(res) == [[("req-0/subreq-1", "pool1", "d1")]]
    with pytest.raises(AllocationError, match="disabled"):
        Allocator([claim("c", req)], set(), CLASSES, slices, Features(prioritized_list=False))


def test_first_available_needs_backtracking_of_earlier_request():
    devs = [dev("big1", mem="2Gi"), dev("small", mem="1Gi"), dev("big2", mem="2Gi")]
    req1 = {"name": "req-1", "firstAvailable": [
        {"name": "sub-0", "deviceClassName": "class-a", "selectors": [{"cel": {"expression": MEM % (DA, "4Gi")}}]},
        {"name": "sub-1", "deviceClassName": "class-a", "count": 2, "selectors": [{"cel": {"expression": MEM % (DA, "2Gi")}}]}]}
    c = claim("c", exact("req-0", selectors=[MEM % (DA, "1Gi")]), req1)
    res = Allocator([c], set(), CLASSES, [rslice("s", devs)]).allocate(node())
    assert picks(res) == [[("req-0", "pool1", "small"), ("req-1/sub-1", "pool1", "big1"), ("req-1/sub-1", "pool1", "big2")]]


def attrs(model, numa):
    return {"model": {"string": model}, "numa": {"int": numa}}


def test_match_attribute_across_requests_forces_choice():
    devs = [dev("d1", attrs("x", 0)), dev("d2", attrs("y", 1)), dev("d3", attrs("y", 1))]
    c = claim("c", exact("req-0"), exact("req-1"),
              constraints=[{"matchAttribute": f"{DA}/numa"}, {"requests": ["req-0", "req-1"], "matchAttribute": f"{DA}/model"}])
    res = Allocator([c], set(), CLASSES, [rslice("s", devs)]).allocate(node())
    assert picks(res) == [[("req-0", "pool1", "d2"), ("req-1", "pool1", "d3")]]


def test_match_attribute_scoped_to_request_and_missing_attribute():
    devs = [dev("d1", attrs("x", 0)), dev("d2", attrs("y", 1))]
    scoped = claim("c", exact("req-0"), exact("req-1"), constraints=[{"requests": ["req-0"], "matchAttribute": f"{DA}/numa"}])
    assert Allocator([scoped], set(), CLASSES, [rslice("s", devs)]).allocate(node()) is not None
    unscoped = claim("c", exact("req-0"), exact("req-1"), constraints=[{"matchAttribute": f"{DA}/numa"}])
    assert Allocator([unscoped], set(), CLASSES, [rslice("s", devs)]).allocate(node()) is None
    missing = claim("c", exact("req-0"), constraints=[{"matchAttribute": f"{DA}/nope"}])
    assert Allocator([missing], set(), CLASSES, [rslice("s", devs)]).allocate(node()) is None
    all_mode = claim("c", exact("req-0", mode="All"), constraints=[{"matchAttribute": f"{DA}/numa"}])
    with pytest.raises(AllocationError, match="constraint"):
        Allocator([all_mode], set(), CLASSES, [rslice("s", devs)]).allocate(node())


def test_incomplete_and_obsolete_pools_skipped():
    incomplete = [rslice("s", [dev("d1")], count=2)]
    assert Allocator([claim("c", exact("r"))], set(), CLASSES, incomplete).allocate(node()) is None
    pools = gather_pools(incomplete, node())
    assert pools[0].is_incomplete
    # Two generations: only the newest counts, and it is incomplete.
    obsolete = [rslice("s1", [dev("d1")], gen=1, count=2), rslice("s2", [dev("d2")], gen=2, count=2)]
    assert Allocator([claim("c", exact("r"))], set(), CLASSES, obsolete).allocate(node()) is None
    # Complete when the other slice of the generation targets another node.
    split = [rslice("s1", [dev("d1")], count=2), rslice("s2", [dev("d2")], count=2, node_name="node2")]
    assert picks(Allocator([claim("c", exact("r"))], set(), CLASSES, split).allocate(node())) == [[("r", "pool1", "d1")]]


def test_duplicate_devices_make_pool_invalid():
    dup = [rslice("s1", [dev("d1")], count=2), rslice("s2", [dev("d1")], count=2)]
    alloc = Allocator([claim("c", exact("r"))], set(), CLASSES, dup)
    with pytest.raises(NodeAllocationError, match="invalid resource pools"):
        alloc.allocate(node())
    results, reason = alloc.explain(node())
    assert results is None and "invalid resource pools" in reason


def test_network_attached_devices_node_selector():
    region = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "region", "operator": "In", "values": ["region1"]}]}]}
    planet = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "planet", "operator": "In", "values": ["earth"]}]}]}
    slices = [rslice("s1", [dev("d1")], pool="p1", selector=region), rslice("s2", [dev("d2")], pool="p2", all_nodes=True),
              rslice("s3", [dev("d3")], pool="p3", selector=planet)]
    n = node("node1", planet="earth")
    res = Allocator([claim("c", exact("r", count=3))], set(), CLASSES, slices).allocate(n)
    assert res[0]["nodeSelector"] == {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "region", "operator": "In", "values": ["region1"]}, {"key": "planet", "operator": "In", "values": ["earth"]}]}]}
    assert Allocator([claim("c", exact("r"))], set(), CLASSES, slices[:1]).allocate(node("node9", region="region2")) is None
    only_all = Allocator([claim("c", exact("r"))], set(), CLASSES, slices[1:2]).allocate(n)
    assert "nodeSelector" not in only_all[0]
    mixed = slices + [rslice("s4", [dev("d4")], pool="p4")]
    res = Allocator([claim("c", exact("r", count=4))], set(), CLASSES, mixed).allocate(n)
    assert res[0]["nodeSelector"] == LOCAL


def test_configs_from_class_and_claim():
    opaque = {"opaque": {"driver": DA, "parameters": {"k": "v"}}}
    classes = {"class-a": dclass("class-a", DA, config=[opaque])}
    c = claim("c", exact("req-0"), exact("req-1"),
              config=[{"requests": ["req-1"], "opaque": {"driver": DA, "parameters": {"c": 1}}}])
    res = Allocator([c], set(), classes, [rslice("s", [dev("d1"), dev("d2")])]).allocate(node())
    assert res[0]["devices"]["config"] == [
        {"source": "FromClass", "opaque": {"driver": DA, "parameters": {"k": "v"}}},
        {"source": "FromClaim", "requests": ["req-1"], "opaque": {"driver": DA, "parameters": {"c": 1}}},
    ]


@pytest.mark.parametrize(
    "claims,classes,fragment",
    [
        ([claim("c", exact("r", cls="nope"))], CLASSES, "could not retrieve device class nope"),
        ([claim("c", exact("r", cls=""))], CLASSES, "missing device class name"),
        ([claim("c", exact("r", selectors=["noSuchVar"]))], CLASSES, "undeclared reference"),
        ([claim("c", exact("r"))], {"class-a": dclass("class-a", DA, extra=[{"cel": {"expression": "noSuchVar"}}])},
         "undeclared reference"),
        ([claim("c", exact("r", mode="Some"))], CLASSES, "unsupported count mode"),
        ([claim("c", exact("r", count=33))], CLASSES, "exceeds the claim limit"),
        ([claim("c", exact("r"), constraints=[{"requests": ["r"]}])], CLASSES, "empty constraint"),
        ([claim("c", {"name": "r", "exactly": {"deviceClassName": "class-a", "selectors": [{}]}})], CLASSES, "CEL expression empty"),
    ],
)
def test_fatal_errors(claims, classes, fragment):
    with pytest.raises(AllocationError, match=fragment):
        Allocator(claims, set(), classes, [rslice("s", [dev("d1")])]).allocate(node())


def test_32_devices_ok():
    devs = [dev(f"d{i}") for i in range(32)]
    res = Allocator([claim("c", exact("r", count=32))], set(), CLASSES, [rslice("s", devs)]).allocate(node())
    assert len(res[0]["devices"]["results"]) == 32


def test_cel_runtime_error_means_no_match_and_is_reported():
    devs = [dev("d1"), dev("d2", {"model": {"string": "a100"}})]
    c = claim("c", exact("r", selectors=[f'device.attributes["{DA}"].model == "a100"']))
    alloc = Allocator([c], set(), CLASSES, [rslice("s", devs)])
    assert picks(alloc.allocate(node())) == [[("r", "pool1", "d2")]]
    alloc2 = Allocator([claim("c", exact("r", count=2, selectors=[f'device.attributes["{DA}"].model == "a100"']))],
                       set(), CLASSES, [rslice("s", devs)])
    results, reason = alloc2.explain(node())
    assert results is None and "cannot allocate all claims" in reason and "model" in reason


def test_cel_evaluated_once_per_device_across_nodes():
    expr = 'device.attributes["%s"].model == "m"' % DA
    sel = compile_selector(expr)
    slices = [rslice(f"s{i}", [dev(f"d{j}", {"model": {"string": "m" if j == 7 else "x"}}) for j in range(8)],
                     pool=f"n{i}", node_name=f"n{i}") for i in range(10)]
    alloc = Allocator([claim("c", exact("r", selectors=[expr]))], set(), CLASSES, slices)
    before = sel.evaluations
    for _ in range(3):
        for i in range(10):
            assert picks(alloc.allocate(node(f"n{i}"))) == [[("r", f"n{i}", "d7")]]
    assert sel.evaluations - before == 80  # 10 nodes x 8 devices, never repeated


def test_shared_match_cache_across_allocators():
    expr = 'device.attributes["%s"].model == "shared"' % DA
    sel = compile_selector(expr)
    s = rslice("s", [dev("d1", {"model": {"string": "shared"}})])
    s["metadata"].update(uid="u1", resourceVersion="5")
    cache = DeviceMatchCache()
    before = sel.evaluations
    for _ in range(3):
        res = Allocator([claim("c", exact("r", selectors=[expr]))], set(), CLASSES, [s], match_cache=cache).allocate(node())
        assert res is not None
    assert sel.evaluations - before == 1


# ---------------------------------------------------------------- fast paths and shared indexes


def _general(c):
    """The same claim with a constraint every device satisfies: forces the backtracking search."""
    c = {**c, "spec": {"devices": {**c["spec"]["devices"], "constraints": [{"matchAttribute": f"{DA}/kind"}]}}}
    return c


@pytest.mark.parametrize("seed", range(12))
def test_single_request_fast_path_matches_backtracking_search(seed):
    import random

    rng = random.Random(seed)
    nodes = [f"n{i}" for i in range(4)]
    slices = []
    for i, n in enumerate(nodes):
        devs = [dev(f"d{j}", {"kind": {"string": "k"}, "model": {"string": rng.choice(["a", "b"])}}) for j in range(6)]
        slices.append(rslice(f"s{i}", devs, pool=n, node_name=n))
    allocated = {DeviceID(DA, rng.choice(nodes), f"d{rng.randrange(6)}") for _ in range(10)}
    count = rng.randint(1, 4)
    c = claim("c", exact("r", count=count, selectors=[f'device.attributes["{DA}"].model == "a"']))
    fast = Allocator([c], allocated, CLASSES, slices)
    slow = Allocator([_general(c)], allocated, CLASSES, slices)
    assert fast._simple is not None and slow._simple is None
    for n in nodes:
        assert fast.allocate(node(n)) == slow.allocate(node(n))


def test_fast_path_reports_cel_runtime_errors_and_skips_allocated():
    devs = [dev("d1"), dev("d2", {"model": {"string": "a100"}}), dev("d3", {"model": {"string": "a100"}})]
    c = claim("c", exact("r", selectors=[f'device.attributes["{DA}"].model == "a100"']))
    alloc = Allocator([c], {DeviceID(DA, "pool1", "d2")}, CLASSES, [rslice("s", devs)])
    assert picks(alloc.allocate(node())) == [[("r", "pool1", "d3")]]
    alloc2 = Allocator([c], {DeviceID(DA, "pool1", "d2"), DeviceID(DA, "pool1", "d3")}, CLASSES, [rslice("s", devs)])
    results, reason = alloc2.explain(node())
    assert results is None
    assert reason.startswith(REASON_CANNOT_ALLOCATE + "; ") and "pool1/d1" in reason and "model" in reason


def test_shared_pool_index_memoizes_per_node_and_results_are_deferred():
    from kubeplane.dra.pools import PoolIndex

    expr = 'device.attributes["%s"].model == "m"' % DA
    sel = compile_selector(expr)
    slices = [rslice(f"s{i}", [dev(f"d{j}", {"model": {"string": "m"}}) for j in range(3)], pool=f"n{i}",
                     node_name=f"n{i}") for i in range(5)]
    index = PoolIndex(slices)
    before = sel.evaluations
    taken: set[DeviceID] = set()
    for _ in range(3):
        alloc = Allocator([claim("c", exact("r", selectors=[expr]))], set(taken), CLASSES, (), pool_index=index)
        deferred, reason = alloc.explain_deferred(node("n2"))
        assert reason == "" and deferred is not None and len(deferred) == 1
        res = deferred.results()
        assert deferred.results() is res  # built once
        taken.update(claim_device_ids({"status": {"allocation": res[0]}}))
    assert sorted(d.device for d in taken) == ["d0", "d1", "d2"]
    assert sel.evaluations - before == 3  # three devices of n2, once each, across allocators
    full = Allocator([claim("c", exact("r", selectors=[expr]))], set(taken), CLASSES, (), pool_index=index)
    assert full.explain_deferred(node("n2")) == (None, REASON_CANNOT_ALLOCATE)


def test_pool_index_per_node_memo_disabled_with_selector_slices():
    from kubeplane.dra.pools import PoolIndex

    sel_slice = rslice("sel", [dev("x")], pool="shared",
                       selector={"nodeSelectorTerms": [{"matchExpressions": [
                           {"key": "zone", "operator": "In", "values": ["z1"]}]}]})
    index = PoolIndex([rslice("s", [dev("d1")], node_name="n1"), sel_slice])
    assert not index.per_node_name
    c = claim("c", exact("r", count=2))
    alloc = Allocator([c], set(), CLASSES, (), pool_index=index)
    assert alloc.allocate(node("n1", zone="z2")) is None
    assert sorted(d for _, _, d in picks(alloc.allocate(node("n1", zone="z1")))[0]) == ["d1", "x"]
