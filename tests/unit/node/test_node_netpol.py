"""NetworkPolicy semantics: from policies, pods and namespaces to each local
pod's isolation and allowed traffic, and from those to nftables rules."""

from __future__ import annotations

import ipaddress

from kubeplane.node.netpol import (EGRESS, INGRESS, Allow, PortRange, Ruleset, allow_rules, chain_name, collapse,
                                   compute, full_ruleset, incremental_ruleset, ip_block, policy_types, ruleset, table_name)

NODE = "n1"


def pod(name, ip, *, ns="default", labels=None, node=NODE, ports=(), host_network=False, phase="Running"):
    return {"metadata": {"name": name, "namespace": ns, "labels": labels or {}},
            "spec": {"nodeName": node, "hostNetwork": host_network,
                     "containers": [{"name": "c", "ports": [dict(p) for p in ports]}]},
            "status": {"phase": phase, "podIP": ip, "podIPs": [{"ip": ip}]}}


def namespace(name, **labels):
    return {"metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name, **labels}}}


def policy(name, spec, ns="default"):
    return {"metadata": {"name": name, "namespace": ns}, "spec": spec}


NAMESPACES = [namespace("default"), namespace("other", team="a"), namespace("third", team="b")]
SERVER = pod("server", "10.0.0.10", labels={"app": "web"},
             ports=[{"name": "http", "containerPort": 8080}, {"name": "dns", "containerPort": 53, "protocol": "UDP"}])
CLIENT = pod("client", "10.0.0.11", labels={"role": "client"})
OTHER = pod("stranger", "10.0.0.12", labels={"role": "other"})
REMOTE_CLIENT = pod("rc", "10.0.1.5", labels={"role": "client"}, ns="other", node="n2")
THIRD = pod("t", "10.0.2.5", labels={"role": "client"}, ns="third", node="n2")
PODS = [SERVER, CLIENT, OTHER, REMOTE_CLIENT, THIRD]


def local(policies, pods=PODS, namespaces=NAMESPACES):
    return compute(policies, pods, namespaces, NODE)


def test_not_selected_pods_are_not_isolated():
    out = local([policy("web", {"podSelector": {"matchLabels": {"app": "web"}}})])
    assert set(out) == {"default/server", "default/client", "default/stranger"}  # the pods of this node only
    assert out["default/client"].ingress is None and out["default/client"].egress is None
    assert out["default/client"].allows(INGRESS, "1.2.3.4", "TCP", 80)


def test_policy_types_default_ingress_and_egress_when_egress_rules():
    assert policy_types(policy("a", {"podSelector": {}})) == {INGRESS}
    assert policy_types(policy("a", {"podSelector": {}, "egress": [{}]})) == {INGRESS, EGRESS}
    assert policy_types(policy("a", {"podSelector": {}, "ingress": [{}], "policyTypes": ["Egress"]})) == {EGRESS}


def test_default_deny_ingress_leaves_egress_open():
    out = local([policy("deny", {"podSelector": {}})])
    srv = out["default/server"]
    assert srv.ingress == () and srv.egress is None
    assert not srv.allows(INGRESS, "10.0.0.11", "TCP", 8080)
    assert srv.allows(EGRESS, "8.8.8.8", "UDP", 53)


def test_default_deny_egress_only():
    out = local([policy("deny", {"podSelector": {}, "policyTypes": ["Egress"]})])
    srv = out["default/server"]
    assert srv.ingress is None and srv.egress == ()
    assert not srv.allows(EGRESS, "10.0.0.11", "TCP", 80)


def test_ingress_rules_of_an_egress_only_policy_are_ignored():
    out = local([policy("e", {"podSelector": {}, "policyTypes": ["Egress"], "ingress": [{}]})])
    assert out["default/server"].ingress is None


def test_pod_selector_peers_are_of_the_policy_namespace():
    out = local([policy("web", {"podSelector": {"matchLabels": {"app": "web"}},
                                "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}]}]})])
    srv = out["default/server"]
    assert srv.allows(INGRESS, "10.0.0.11", "TCP", 1234)
    assert srv.allows(INGRESS, "10.0.0.11", "ICMP")  # no ports: any protocol
    assert not srv.allows(INGRESS, "10.0.0.12", "TCP", 1234)
    assert not srv.allows(INGRESS, "10.0.1.5", "TCP", 1234)  # role=client, but of another namespace


def test_namespace_selector_and_both_together():
    ns_only = local([policy("p", {"podSelector": {}, "ingress": [
        {"from": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}]}]})])["default/server"]
    assert ns_only.allows(INGRESS, "10.0.1.5") and not ns_only.allows(INGRESS, "10.0.2.5")
    assert not ns_only.allows(INGRESS, "10.0.0.11")
    both = local([policy("p", {"podSelector": {}, "ingress": [{"from": [{
        "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "Exists"}]},
        "podSelector": {"matchLabels": {"role": "client"}}}]}]})], pods=PODS + [
        pod("x", "10.0.1.6", ns="other", labels={"role": "db"}, node="n2")])["default/server"]
    assert both.allows(INGRESS, "10.0.1.5") and both.allows(INGRESS, "10.0.2.5")
    assert not both.allows(INGRESS, "10.0.1.6")  # right namespace, wrong pod
    assert not both.allows(INGRESS, "10.0.0.11")  # right pod, wrong namespace
    every_ns = local([policy("p", {"podSelector": {}, "ingress": [
        {"from": [{"namespaceSelector": {}}]}]})])["default/server"]
    assert all(every_ns.allows(INGRESS, ip) for ip in ("10.0.0.11", "10.0.1.5", "10.0.2.5"))
    assert not every_ns.allows(INGRESS, "192.168.1.1")  # pods only, not any address


def test_ip_block_with_except():
    assert [str(n) for n in ip_block({"cidr": "10.0.0.0/24", "except": ["10.0.0.0/25"]})] == ["10.0.0.128/25"]
    srv = local([policy("p", {"podSelector": {}, "ingress": [{"from": [
        {"ipBlock": {"cidr": "172.16.0.0/16", "except": ["172.16.1.0/24", "172.16.2.128/25"]}}]}]})])["default/server"]
    assert srv.allows(INGRESS, "172.16.0.1") and srv.allows(INGRESS, "172.16.2.1")
    assert not srv.allows(INGRESS, "172.16.1.9") and not srv.allows(INGRESS, "172.16.2.200")
    assert not srv.allows(INGRESS, "172.17.0.1")
    # the spans are disjoint and merged (nftables sets take no overlap)
    peers = srv.ingress[0].peers
    assert all(a[2] + 1 < b[1] for a, b in zip(peers, peers[1:]))
    assert allow_rules(srv.ingress[0], INGRESS) == [
        "ip saddr { 172.16.0.0/24, 172.16.2.0/25, 172.16.3.0-172.16.255.255 } return"]


def test_ports_numbers_ranges_protocols_and_named_ports():
    srv = local([policy("p", {"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [{"ports": [
        {"port": 80}, {"protocol": "UDP", "port": 1000, "endPort": 1010}, {"port": "http"},
        {"protocol": "UDP", "port": "dns"}, {"port": "dns"}, {"protocol": "SCTP"}]}]})])["default/server"]
    assert srv.allows(INGRESS, "1.1.1.1", "TCP", 80) and not srv.allows(INGRESS, "1.1.1.1", "UDP", 80)
    assert srv.allows(INGRESS, "1.1.1.1", "UDP", 1005) and not srv.allows(INGRESS, "1.1.1.1", "UDP", 1011)
    assert srv.allows(INGRESS, "1.1.1.1", "TCP", 8080)  # "http" on this pod
    assert srv.allows(INGRESS, "1.1.1.1", "UDP", 53)
    assert not srv.allows(INGRESS, "1.1.1.1", "TCP", 53)  # "dns" is a UDP port of the pod, not a TCP one
    assert srv.allows(INGRESS, "1.1.1.1", "SCTP", 9999)  # a protocol without a port: all its ports
    assert not srv.allows(INGRESS, "1.1.1.1", "ICMP")


def test_named_port_unknown_to_the_pod_allows_nothing():
    out = local([policy("p", {"podSelector": {}, "ingress": [{"ports": [{"port": "http"}]}]})])
    assert out["default/server"].allows(INGRESS, "1.1.1.1", "TCP", 8080)
    assert out["default/client"].ingress == ()  # client has no "http": isolated, nothing allowed


def test_egress_named_port_resolves_on_each_destination():
    pods = PODS + [pod("web2", "10.0.1.9", ns="other", node="n2", labels={"app": "web"},
                       ports=[{"name": "http", "containerPort": 9090}])]
    out = local([policy("p", {"podSelector": {"matchLabels": {"role": "client"}}, "policyTypes": ["Egress"],
                              "egress": [{"ports": [{"port": "http"}]}]})], pods=pods)
    cl = out["default/client"]
    assert cl.allows(EGRESS, "10.0.0.10", "TCP", 8080) and not cl.allows(EGRESS, "10.0.0.10", "TCP", 9090)
    assert cl.allows(EGRESS, "10.0.1.9", "TCP", 9090) and not cl.allows(EGRESS, "10.0.1.9", "TCP", 8080)
    assert not cl.allows(EGRESS, "8.8.8.8", "TCP", 8080)  # not a pod: no named port


def test_egress_ip_block_and_ports():
    cl = local([policy("p", {"podSelector": {"matchLabels": {"role": "client"}}, "egress": [
        {"to": [{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.1.0/24"]}}], "ports": [{"port": 80}]}]})])[
        "default/client"]
    assert cl.ingress == () and cl.egress is not None  # policyTypes defaulted to both
    assert cl.allows(EGRESS, "10.0.0.10", "TCP", 80) and not cl.allows(EGRESS, "10.0.0.10", "TCP", 81)
    assert not cl.allows(EGRESS, "10.0.1.5", "TCP", 80)


def test_union_of_policies():
    out = local([
        policy("a", {"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}],
                                                     "ports": [{"port": 80}]}]}),
        policy("b", {"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [
            {"from": [{"ipBlock": {"cidr": "192.168.0.0/16"}}]}]}),
        policy("elsewhere", {"podSelector": {}}, ns="other"),
    ])
    srv = out["default/server"]
    assert srv.policies == ("a", "b")
    assert srv.allows(INGRESS, "10.0.0.11", "TCP", 80) and not srv.allows(INGRESS, "10.0.0.11", "TCP", 81)
    assert srv.allows(INGRESS, "192.168.3.3", "UDP", 5)
    assert not out["default/client"].allows(INGRESS, "192.168.3.3", "UDP", 5)  # b does not select it


def test_empty_rule_allows_everything():
    srv = local([policy("p", {"podSelector": {}, "ingress": [{}, {"ports": [{"port": 80}]}]})])["default/server"]
    assert srv.ingress == (Allow(),)


def test_host_network_and_finished_pods_are_neither_selected_nor_peers():
    pods = [SERVER, pod("h", "192.168.0.1", host_network=True, labels={"role": "client"}),
            pod("done", "10.0.0.50", labels={"role": "client"}, phase="Succeeded")]
    out = local([policy("p", {"podSelector": {}, "ingress": [
        {"from": [{"podSelector": {"matchLabels": {"role": "client"}}}]}]})], pods=pods)
    assert set(out) == {"default/server"}
    assert out["default/server"].ingress == ()  # no pod peer left: the rule allows nothing


def test_dual_stack_pods():
    p = pod("d", "10.0.0.20")
    p["status"]["podIPs"] = [{"ip": "10.0.0.20"}, {"ip": "fd00::20"}]
    peer = pod("e", "10.0.0.21", labels={"role": "client"})
    peer["status"]["podIPs"] = [{"ip": "10.0.0.21"}, {"ip": "fd00::21"}]
    out = local([policy("p", {"podSelector": {}, "ingress": [
        {"from": [{"podSelector": {"matchLabels": {"role": "client"}}}]}]})], pods=[p, peer])
    assert out["default/d"].allows(INGRESS, "fd00::21") and out["default/d"].allows(INGRESS, "10.0.0.21")
    rs = ruleset(out)
    assert rs.maps["ingress4"]["10.0.0.20"] == rs.maps["ingress6"]["fd00::20"] == chain_name(INGRESS, "default/d")


def test_rules_render_per_family_and_protocol():
    a = Allow(peers=collapse([ipaddress.ip_network("10.0.0.1/32"), ipaddress.ip_network("fd00::/64")]),
              ports=(PortRange("TCP", 80, 80), PortRange("TCP", 100, 200), PortRange("UDP")))
    assert allow_rules(a, INGRESS) == [
        "ip saddr { 10.0.0.1 } meta l4proto tcp th dport { 80, 100-200 } return",
        "ip saddr { 10.0.0.1 } meta l4proto udp return",
        "ip6 saddr { fd00::/64 } meta l4proto tcp th dport { 80, 100-200 } return",
        "ip6 saddr { fd00::/64 } meta l4proto udp return",
    ]
    assert allow_rules(Allow(), EGRESS) == ["return"]


def test_ruleset_chains_maps_and_incremental_changes():
    out = local([policy("p", {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress", "Egress"],
                              "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}]}]})])
    rs = ruleset(out)
    cin, cout = chain_name(INGRESS, "default/server"), chain_name(EGRESS, "default/server")
    assert rs.maps["ingress4"] == {"10.0.0.10": cin} and rs.maps["egress4"] == {"10.0.0.10": cout}
    assert rs.chains[cin] == ("ip saddr { 10.0.0.11 } return", "counter drop")
    assert rs.chains[cout] == ("counter drop",)
    table = table_name(NODE)
    text = full_ruleset(rs, table)
    assert text.startswith(f"table inet {table} {{}}\ndelete table inet {table}\n")
    assert "type filter hook forward priority filter; policy accept;" in text
    assert text.index("ct state established,related accept") < text.index("ip saddr vmap @egress4") \
        < text.index("ip daddr vmap @ingress4")
    assert incremental_ruleset(rs, rs, table) == ""
    # a second client: only the server's ingress chain is rewritten
    more = ruleset(local([policy("p", {"podSelector": {"matchLabels": {"app": "web"}},
                                       "policyTypes": ["Ingress", "Egress"], "ingress": [
        {"from": [{"podSelector": {"matchLabels": {"role": "client"}}}]}]})],
        pods=PODS + [pod("c2", "10.0.0.13", labels={"role": "client"})]))
    assert incremental_ruleset(rs, more, table).splitlines() == [
        f"flush chain inet {table} {cin}",
        f"add rule inet {table} {cin} ip saddr {{ 10.0.0.11, 10.0.0.13 }} return",
        f"add rule inet {table} {cin} counter drop",
    ]
    # the policy gone: the elements go, then the chains
    lines = incremental_ruleset(rs, ruleset(local([])), table).splitlines()
    assert lines == [f"delete element inet {table} egress4 {{ 10.0.0.10 }}",
                     f"delete element inet {table} ingress4 {{ 10.0.0.10 }}",
                     *sorted([f"delete chain inet {table} {cin}", f"delete chain inet {table} {cout}"])]
    back = incremental_ruleset(Ruleset(maps={m: {} for m in rs.maps}), rs, table).splitlines()
    assert back[0].startswith(f"add chain inet {table} ")
    assert f"add element inet {table} ingress4 {{ 10.0.0.10 : jump {cin} }}" in back


async def test_controller_applies_whole_then_changes_and_rewrites_when_a_change_fails():
    from kubeplane.node.netpol import NetworkPolicyController

    sent: list[str] = []
    fail = []

    async def runner(argv, stdin=None):
        assert list(argv) == ["nft", "-f", "-"]
        sent.append(stdin.decode())
        return (1, "", "Error: No such file or directory") if fail and fail.pop() else (0, "", "")

    ctl = NetworkPolicyController(None, NODE, runner=runner, resync_period=3600)
    deny = ruleset(local([policy("deny", {"podSelector": {}})]))
    await ctl.apply(deny)
    assert sent[-1] == full_ruleset(deny, ctl.table)
    await ctl.apply(deny)
    assert len(sent) == 1  # nothing changed, nothing sent
    open_again = ruleset(local([]))
    await ctl.apply(open_again)
    assert sent[-1] == incremental_ruleset(deny, open_again, ctl.table)
    fail.append(True)  # the table was removed behind the controller's back: the change fails
    await ctl.apply(deny)
    assert sent[-2] == incremental_ruleset(open_again, deny, ctl.table)
    assert sent[-1] == full_ruleset(deny, ctl.table)
    await ctl.cleanup()
    assert sent[-1] == f"table inet {ctl.table} {{}}\ndelete table inet {ctl.table}\n"
