"""The routes to other nodes' pod CIDRs and the pods' masquerade table."""

from __future__ import annotations

import pytest

from kubeplane.node import routes as r


def node(name, cidrs=(), ips=(), hostname=True):
    addrs = [{"type": "InternalIP", "address": ip} for ip in ips]
    if hostname:
        addrs.append({"type": "Hostname", "address": name})
    spec = {"podCIDRs": list(cidrs)}
    if cidrs:
        spec["podCIDR"] = cidrs[0]
    return {"metadata": {"name": name}, "spec": spec, "status": {"addresses": addrs}}


def test_desired_routes_pair_each_cidr_with_an_address_of_its_family():
    nodes = [node("a", ["10.244.0.0/24"], ["192.168.1.1"]),
             node("b", ["10.244.1.0/24", "fd00:1::/64"], ["192.168.1.2", "fc00::2"]),
             node("c", ["10.244.2.0/24"], ["fc00::3"]),          # no IPv4 address: no IPv4 route
             node("d", [], ["192.168.1.4"]),                      # no CIDR yet
             {"metadata": {"name": "e"}, "spec": {"podCIDR": "not-a-cidr"}, "status": {}}]
    assert r.desired_routes(nodes, "a") == {"10.244.1.0/24": "192.168.1.2", "fd00:1::/64": "fc00::2"}
    assert r.cluster_cidrs(nodes) == ["10.244.0.0/24", "10.244.1.0/24", "10.244.2.0/24", "fd00:1::/64"]


def test_only_pod_cidr_is_read_when_pod_cidrs_is_absent():
    n = {"metadata": {"name": "x"}, "spec": {"podCIDR": "10.1.0.0/24"}, "status": {}}
    assert r.node_pod_cidrs(n) == ["10.1.0.0/24"]


def test_parse_routes():
    out = "10.244.1.0/24 via 192.168.1.2 dev eth0 proto 75 \n10.244.9.0/24 dev kp0 proto 75 scope link\n"
    assert r.parse_routes(out) == {"10.244.1.0/24": "192.168.1.2"}


def test_nat_ruleset_masquerades_only_what_leaves_the_pod_network():
    t = r.nat_table("n1")
    assert t.startswith("kubeplane-nat-") and t != r.nat_table("n2") and len(t) == 24
    text = r.nat_ruleset(["10.244.0.0/24"], ["10.244.0.0/24", "10.244.1.0/24"], t)
    assert f"table ip {t} {{\n" in text
    assert "elements = { 10.244.0.0/24, 10.244.1.0/24 }" in text
    assert "ip saddr { 10.244.0.0/24 } ip daddr != @pod-cidrs masquerade" in text
    # replaced whole in one transaction, and an ip6 table only when there is an IPv6 CIDR
    assert text.index(f"delete table ip {t}") < text.index(f"table ip {t} {{\n")
    assert f"table ip6 {t} {{\n" not in text
    empty = r.nat_ruleset([], [], t)
    assert "masquerade" not in empty and f"delete table ip6 {t}" in empty


class FakeHost:
    """`ip route` and `nft` of a host, in memory."""

    def __init__(self, routes=None, fail=None):
        self.routes = dict(routes or {})
        self.fail = dict(fail or {})
        self.nft: list[str] = []
        self.calls: list[list[str]] = []

    async def __call__(self, argv, stdin=None):
        argv = list(argv)
        self.calls.append(argv)
        if argv[0] == "nft":
            self.nft.append(stdin.decode())
            return 0, "", ""
        fam, verb = argv[1], argv[3] if argv[2] == "route" else argv[2]
        if verb == "show":
            lines = [f"{d} via {g} dev eth0 proto 75" for d, g in self.routes.items() if (":" in d) == (fam == "-6")]
            return 0, "\n".join(lines), ""
        if verb in ("replace", "add"):
            cidr, gw = argv[4], argv[6]
            if cidr in self.fail:
                return 2, "", self.fail[cidr]
            if verb == "add" and cidr in self.routes:
                return 2, "", "RTNETLINK answers: File exists"
            self.routes[cidr] = gw
            return 0, "", ""
        if verb == "del":
            self.routes.pop(argv[4], None)
            return 0, "", ""
        if verb == "flush":
            self.routes = {d: g for d, g in self.routes.items() if (":" in d) != (fam == "-6")}
            return 0, "", ""
        raise AssertionError(argv)


async def test_sync_adds_changes_and_removes_routes_and_reapplies_nat_only_on_change():
    h = FakeHost(routes={"10.244.7.0/24": "192.168.1.7", "10.244.1.0/24": "192.168.1.99"})
    pr = r.PodRoutes(client=None, node_name="a", runner=h)
    nodes = [node("a", ["10.244.0.0/24"], ["192.168.1.1"]), node("b", ["10.244.1.0/24"], ["192.168.1.2"]),
             node("c", ["10.244.2.0/24"], ["192.168.1.3"])]
    await pr.sync(nodes)
    assert h.routes == {"10.244.1.0/24": "192.168.1.2", "10.244.2.0/24": "192.168.1.3"}
    assert len(h.nft) == 1 and "10.244.0.0/24, 10.244.1.0/24, 10.244.2.0/24" in h.nft[0]
    n_calls = len(h.calls)
    await pr.sync(nodes)  # nothing changed: only the two route listings
    assert len(h.calls) == n_calls + 2 and len(h.nft) == 1
    await pr.sync(nodes[:2])
    assert h.routes == {"10.244.1.0/24": "192.168.1.2"} and len(h.nft) == 2
    await pr.cleanup()
    assert h.routes == {} and "masquerade" not in h.nft[-1]


async def test_a_route_that_cannot_be_added_is_reported_and_the_others_still_made():
    h = FakeHost(fail={"10.244.1.0/24": "RTNETLINK answers: Operation not permitted"})
    pr = r.PodRoutes(client=None, node_name="a", runner=h)
    with pytest.raises(RuntimeError, match="10.244.1.0/24 via 192.168.1.2: RTNETLINK answers: Operation not permitted"):
        await pr.sync([node("a", ["10.244.0.0/24"], ["192.168.1.1"]), node("b", ["10.244.1.0/24"], ["192.168.1.2"]),
                       node("c", ["10.244.2.0/24"], ["192.168.1.3"])])
    assert h.routes == {"10.244.2.0/24": "192.168.1.3"} and len(h.nft) == 1


async def test_a_node_not_on_a_link_of_this_one_gets_no_route_and_no_error():
    h = FakeHost(fail={"10.244.1.0/24": "Error: Nexthop has invalid gateway."})
    pr = r.PodRoutes(client=None, node_name="a", runner=h)
    nodes = [node("a", ["10.244.0.0/24"], ["192.168.1.1"]), node("sim", ["10.244.1.0/24"], ["10.0.0.1"])]
    await pr.sync(nodes)
    await pr.sync(nodes)
    assert h.routes == {} and pr._unreachable == {("10.244.1.0/24", "10.0.0.1")}


async def test_loopback_gateways_and_routes_not_its_own_are_left_alone():
    h = FakeHost(fail={"10.244.2.0/24": "RTNETLINK answers: File exists"})
    pr = r.PodRoutes(client=None, node_name="a", runner=h)
    await pr.sync([node("a", ["10.244.0.0/24"], ["127.0.0.1"]), node("b", ["10.244.1.0/24"], ["127.0.0.1"]),
                   node("c", ["10.244.2.0/24"], ["192.168.1.3"])])
    assert h.routes == {} and not [c for c in h.calls if "10.244.1.0/24" in c]
    assert ("10.244.2.0/24", "192.168.1.3") in pr._unreachable
