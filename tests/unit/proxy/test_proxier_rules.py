"""The proxier's rules, checked on an in-memory table (FakeNFTables), as upstream's proxier tests do.

Each test states Services and EndpointSlices, syncs, and checks chains and
map elements by what they mean (which chain a ClusterIP goes to, which
endpoints a chain DNATs to), not by the whole text. Partial syncs are checked
against a full sync of the same state: both must leave the same table.
"""

from __future__ import annotations

import pytest

from kubeplane.proxy.model import Endpoint, ServicePortName
from kubeplane.proxy.nft import Chain, Element, FakeNFTables, Set, Transaction
from kubeplane.proxy.proxier import Proxier, ProxyConfig
from kubeplane.proxy.runner import BoundedFrequencyRunner

NODE = "node-a"


def svc(name: str, ip: str, *, port: int = 80, node_port: int = 0, ns: str = "ns1", **spec) -> dict:
    p = {"port": port, "protocol": "TCP"}
    if node_port:
        p["nodePort"] = node_port
    return {"metadata": {"namespace": ns, "name": name},
            "spec": {"clusterIP": ip, "clusterIPs": [ip] if ip != "None" else ["None"], "ports": [p], **spec}}


def eps(name: str, *endpoints: tuple, ns: str = "ns1", port: int = 80, slice_name: str | None = None) -> dict:
    """endpoints: (ip, ready[, nodeName[, serving, terminating]])."""
    out = []
    for e in endpoints:
        ip, ready, node, serving, terminating = (*e, None, None, None)[:5] if len(e) < 5 else e
        cond = {"ready": ready}
        if serving is not None:
            cond["serving"] = serving
        if terminating is not None:
            cond["terminating"] = terminating
        out.append({"addresses": [ip], "conditions": cond, "nodeName": node or "other"})
    return {"metadata": {"namespace": ns, "name": slice_name or f"{name}-x",
                         "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4", "ports": [{"name": "", "port": port, "protocol": "TCP"}], "endpoints": out}


def chain_of(name: str, prefix: str = "service-", ns: str = "ns1") -> str:
    return prefix + ServicePortName(ns, name, "", "TCP").chain_base()


def make(**cfg) -> tuple[Proxier, FakeNFTables]:
    fake = FakeNFTables()
    p = Proxier("ipv4", ProxyConfig(node_name=NODE, **cfg), nftables=fake, local_addresses=lambda: [])
    return p, fake


async def synced(p: Proxier) -> None:
    if not p.initialized:
        p.set_initialized()
    assert await p.sync(), p.last_error


async def test_cluster_ip_load_balances_over_ready_endpoints():
    p, fake = make()
    p.on_service(svc("a", "172.30.0.1"))
    p.on_slice(eps("a", ("10.0.1.1", True), ("10.0.1.2", True), ("10.0.1.3", False)))
    await synced(p)
    chain = chain_of("a")
    assert fake.map_elements("service-ips") == {"172.30.0.1 . tcp . 80": f"goto {chain}"}
    assert fake.chain_rules(chain) == [
        "meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.0.1.1 . 80, 1 : 10.0.1.2 . 80 }"]
    assert "172.30.0.1" in fake.map_elements("cluster-ips")
    assert fake.map_elements("no-endpoint-services") == {}


async def test_terminating_serving_endpoints_are_used_only_when_none_is_ready():
    p, fake = make()
    p.on_service(svc("a", "172.30.0.1"))
    p.on_slice(eps("a", ("10.0.1.1", False, "n", True, True), ("10.0.1.2", True)))
    await synced(p)
    assert "10.0.1.1" not in fake.chain_rules(chain_of("a"))[0]
    p.on_slice(eps("a", ("10.0.1.1", False, "n", True, True), ("10.0.1.2", False, "n", False, True)))
    await synced(p)
    rule = fake.chain_rules(chain_of("a"))[0]
    assert "10.0.1.1 . 80" in rule and "10.0.1.2" not in rule  # serving and terminating only


async def test_no_endpoints_reject_and_headless_and_external_name_get_nothing():
    p, fake = make()
    p.on_service(svc("empty", "172.30.0.9", node_port=30009, type="NodePort"))
    p.on_service(svc("headless", "None"))
    p.on_slice(eps("headless", ("10.0.1.1", True)))
    p.on_service({"metadata": {"namespace": "ns1", "name": "ext"},
                  "spec": {"type": "ExternalName", "externalName": "example.com", "ports": [{"port": 80}]}})
    await synced(p)
    assert fake.map_elements("no-endpoint-services") == {"172.30.0.9 . tcp . 80": "goto reject-chain"}
    assert fake.map_elements("no-endpoint-nodeports") == {"tcp . 30009": "goto reject-chain"}
    assert fake.map_elements("service-ips") == {}
    assert not [c for c in fake.chains if "/" in c]  # no per-service chain at all
    assert fake.chain_rules("cluster-ips-check") == [
        'ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"']


async def test_nodeport_masquerades_on_every_local_address_by_default():
    p, fake = make()
    p.on_service(svc("np", "172.30.0.2", node_port=30080, type="NodePort"))
    p.on_slice(eps("np", ("10.0.1.1", True)))
    await synced(p)
    ext = chain_of("np", "external-")
    assert fake.map_elements("service-nodeports") == {"tcp . 30080": f"goto {ext}"}
    assert fake.chain_rules(ext) == ['mark set mark or 0x004000 comment "masquerade"', f"goto {chain_of('np')}"]
    assert "fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports" \
        in fake.chain_rules("services")
    assert "nodeport-ips" not in fake.sets


async def test_nodeport_addresses_primary_uses_the_nodeport_ips_set():
    p, fake = make(nodeport_addresses=["primary"], node_ips=["192.168.1.5"])
    p.on_service(svc("np", "172.30.0.2", node_port=30080, type="NodePort"))
    p.on_slice(eps("np", ("10.0.1.1", True)))
    await synced(p)
    assert fake.map_elements("nodeport-ips") == {"192.168.1.5": None}
    assert "ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports" in fake.chain_rules("services")


async def test_external_traffic_policy_local_uses_local_endpoints_and_drops_without_them():
    p, fake = make(local_cidrs=["10.0.0.0/16"])
    p.on_service(svc("lb", "172.30.0.3", node_port=30081, type="NodePort", externalTrafficPolicy="Local"))
    p.on_slice(eps("lb", ("10.0.1.1", True, NODE), ("10.0.2.1", True, "other")))
    await synced(p)
    ext, local, cluster = chain_of("lb", "external-"), chain_of("lb", "local-"), chain_of("lb")
    assert fake.chain_rules(ext) == [
        f'ip saddr 10.0.0.0/16 goto {cluster} comment "short-circuit pod traffic"',
        'fib saddr type local mark set mark or 0x004000 comment "masquerade local traffic"',
        f'fib saddr type local goto {cluster} comment "short-circuit local traffic"',
        f"goto {local}"]
    assert "10.0.2.1" not in fake.chain_rules(local)[0] and "10.0.1.1" in fake.chain_rules(local)[0]
    assert "10.0.2.1" in fake.chain_rules(cluster)[0]  # the ClusterIP still uses every endpoint
    # the local endpoint goes away: NodePort traffic from outside is dropped, not rejected
    p.on_slice(eps("lb", ("10.0.2.1", True, "other")))
    await synced(p)
    assert fake.map_elements("no-endpoint-nodeports") == {"tcp . 30081": "drop"}
    assert fake.map_elements("service-nodeports") == {"tcp . 30081": f"goto {ext}"}
    assert "ip daddr @cluster-ips ip saddr != 10.0.0.0/16 mark set mark or 0x004000 " \
           'comment "masquerade clusterIP traffic from outside cluster"' in fake.chain_rules("services")


async def test_internal_traffic_policy_local_without_local_endpoints_drops():
    p, fake = make()
    p.on_service(svc("itp", "172.30.0.4", internalTrafficPolicy="Local"))
    p.on_slice(eps("itp", ("10.0.2.1", True, "other")))
    await synced(p)
    assert fake.map_elements("no-endpoint-services") == {"172.30.0.4 . tcp . 80": "drop"}
    p.on_slice(eps("itp", ("10.0.2.1", True, "other"), ("10.0.1.1", True, NODE)))
    await synced(p)
    local = chain_of("itp", "local-")
    assert fake.map_elements("service-ips") == {"172.30.0.4 . tcp . 80": f"goto {local}"}
    assert "10.0.2.1" not in fake.chain_rules(local)[0]


async def test_session_affinity_goes_through_endpoint_chains_and_timed_sets():
    p, fake = make()
    p.on_service(svc("s", "172.30.0.5", sessionAffinity="ClientIP",
                     sessionAffinityConfig={"clientIP": {"timeoutSeconds": 600}}))
    p.on_slice(eps("s", ("10.0.1.1", True), ("10.0.1.2", True)))
    await synced(p)
    spn = ServicePortName("ns1", "s", "", "TCP")
    rules = fake.chain_rules(chain_of("s"))
    ep_chain = "endpoint-" + Endpoint("10.0.1.1", 80).chain_base(spn)
    aff = "affinity-" + ep_chain[len("endpoint-"):]
    assert rules[0] == f"ip saddr @{aff} goto {ep_chain}"
    assert rules[-1].startswith("numgen random mod 2 vmap { 0 : goto endpoint-")
    assert fake.chain_rules(ep_chain) == [f"update @{aff} {{ ip saddr }}", "meta l4proto tcp dnat to 10.0.1.1:80"]
    s = fake.sets[aff]
    assert isinstance(s, Set) and s.timeout == 600 and "timeout" in s.flags
    # affinity off again: the sets go at once, the endpoint chains are flushed (deleted a second later)
    p.on_service(svc("s", "172.30.0.5"))
    await synced(p)
    assert aff not in fake.sets and fake.chain_rules(ep_chain) == []


async def test_hairpin_connections_hold_the_local_endpoints():
    p, fake = make()
    p.on_service(svc("h", "172.30.0.6"))
    p.on_slice(eps("h", ("10.0.1.1", True, NODE), ("10.0.2.1", True, "other")))
    await synced(p)
    assert fake.map_elements("hairpin-connections") == {"10.0.1.1 . 10.0.1.1 . tcp . 80": None}
    assert fake.chain_rules("masquerading") == [
        "mark and 0x004000 != 0 mark set mark xor 0x004000 masquerade fully-random",
        "ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random"]


async def test_partial_syncs_rewrite_only_changed_services_and_end_like_a_full_sync():
    p, fake = make()
    for i in range(20):
        p.on_service(svc(f"s{i}", f"172.30.1.{i + 1}", node_port=30100 + i, type="NodePort"))
        p.on_slice(eps(f"s{i}", (f"10.0.{i}.1", True), (f"10.0.{i}.2", True)))
    await synced(p)
    assert p.syncs[-1].full
    # one endpoint of one service changes: only that service's chains are rewritten, no map is touched
    p.on_slice(eps("s3", ("10.0.3.1", True), ("10.0.3.2", False)))
    await synced(p)
    tx = fake.transactions[-1]
    touched = {obj.name for verb, obj in tx.ops if isinstance(obj, Chain)}
    assert touched == {chain_of("s3"), chain_of("s3", "external-")}
    assert not [o for _, o in tx.ops if isinstance(o, Element)]
    assert p.syncs[-1].full is False and p.syncs[-1].services == {("ns1", "s3")}
    # a service goes, another loses every endpoint
    p.on_service_deleted(svc("s5", "172.30.1.6"))
    p.on_slice_deleted(eps("s7"))
    await synced(p)
    partial = fake.dump()
    # the same state from scratch
    q, fresh = make()
    for key, s in p._services.items():
        q.on_service(s)
    for slices in p._slices.values():
        for sl in slices.values():
            q.on_slice(sl)
    await synced(q)
    stale = {chain_of("s5"), chain_of("s5", "external-"), chain_of("s7"), chain_of("s7", "external-")}
    assert set(fake.chains) - set(fresh.chains) == stale  # flushed now, deleted a second later
    assert all(fake.chain_rules(c) == [] for c in stale)
    assert _without(partial, stale) == fresh.dump()


def _without(dump: str, chains: set[str]) -> str:
    return "\n".join(line for line in dump.splitlines() if line.removeprefix("chain ") not in chains)


async def test_stale_chains_are_deleted_a_second_later():
    clock = [100.0]
    fake = FakeNFTables()
    p = Proxier("ipv4", ProxyConfig(node_name=NODE), nftables=fake, clock=lambda: clock[0])
    p.on_service(svc("a", "172.30.0.1"))
    p.on_slice(eps("a", ("10.0.1.1", True)))
    await synced(p)
    p.on_service_deleted(svc("a", "172.30.0.1"))
    await synced(p)
    assert chain_of("a") in fake.chains
    clock[0] += 1.5
    await synced(p)
    assert chain_of("a") not in fake.chains


async def test_a_failed_transaction_leads_to_a_full_sync():
    p, fake = make()
    p.on_service(svc("a", "172.30.0.1"))
    p.on_slice(eps("a", ("10.0.1.1", True)))
    await synced(p)
    fake.fail_next = "Error: boom"
    p.on_slice(eps("a", ("10.0.1.2", True)))
    assert await p.sync() is False and p.last_error == "Error: boom"
    await synced(p)
    assert p.syncs[-1].full
    assert "10.0.1.2 . 80" in fake.chain_rules(chain_of("a"))[0]


def test_transaction_text_is_nft_syntax():
    tx = Transaction("ip", "kube-proxy")
    tx.add(Chain("nat-output", "nat", "output", -100))
    tx.add(Element("service-ips", ("172.30.0.1", "tcp", "80"), ("goto service-X/ns/a/tcp/",), is_map=True))
    tx.add(Element("no-endpoint-services", ("172.30.0.2", "tcp", "80"), ("goto reject-chain",), "ns/b", True))
    tx.delete(Element("service-ips", ("172.30.0.3", "tcp", "80"), is_map=True))
    assert tx.text().splitlines() == [
        "add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }",
        "add element ip kube-proxy service-ips { 172.30.0.1 . tcp . 80 : goto service-X/ns/a/tcp/ }",
        'add element ip kube-proxy no-endpoint-services { 172.30.0.2 . tcp . 80 comment "ns/b" : goto reject-chain }',
        "delete element ip kube-proxy service-ips { 172.30.0.3 . tcp . 80 }",
    ]


async def test_fake_refuses_what_the_kernel_refuses():
    fake = FakeNFTables()
    tx = fake.transaction()
    tx.add(Element("m", ("1",), ("drop",), is_map=True))
    with pytest.raises(Exception, match="No such file"):
        await fake.run(tx)


async def test_the_runner_batches_changes_within_min_interval():
    import asyncio

    calls = []

    async def fn():
        calls.append(asyncio.get_running_loop().time())
        return True

    r = BoundedFrequencyRunner("t", fn, min_interval=0.2, retry_interval=5, max_interval=60)
    task = asyncio.get_running_loop().create_task(r.loop())
    try:
        r.run()
        await asyncio.sleep(0.05)
        assert len(calls) == 1  # the first at once
        for _ in range(5):
            r.run()
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        assert len(calls) == 2 and calls[1] - calls[0] >= 0.19  # the burst: one more, min_interval later
    finally:
        task.cancel()


def _hinted(name: str, *endpoints: tuple) -> dict:
    """endpoints: (ip, zone, node hint or None)."""
    sl = eps(name, *[(ip, True) for ip, _, _ in endpoints])
    for ep, (_, zone, node) in zip(sl["endpoints"], endpoints):
        ep["hints"] = {"forZones": [{"name": zone}]}
        if node:
            ep["hints"]["forNodes"] = [{"name": node}]
    return sl


async def test_topology_hints_pick_this_zones_endpoints_and_follow_the_nodes_zone():
    p, fake = make()
    p.on_service(svc("t", "172.30.0.7"))
    p.on_slice(_hinted("t", ("10.0.1.1", "zone-a", None), ("10.0.1.2", "zone-b", None)))
    await synced(p)
    assert "10.0.1.2" in fake.chain_rules(chain_of("t"))[0]  # the node's zone is unknown: every endpoint
    p.set_zone("zone-a")
    await synced(p)
    assert p.syncs[-1].full
    rule = fake.chain_rules(chain_of("t"))[0]
    assert "10.0.1.1 . 80" in rule and "10.0.1.2" not in rule
    p.set_zone("zone-c")  # no endpoint hinted for it: hints are ignored
    await synced(p)
    assert "10.0.1.2" in fake.chain_rules(chain_of("t"))[0]


async def test_node_hints_prefer_this_nodes_endpoints():
    p, fake = make(zone="zone-a")
    p.on_service(svc("n", "172.30.0.8"))
    p.on_slice(_hinted("n", ("10.0.1.1", "zone-a", "elsewhere"), ("10.0.1.2", "zone-a", NODE)))
    await synced(p)
    rule = fake.chain_rules(chain_of("n"))[0]
    assert "10.0.1.2 . 80" in rule and "10.0.1.1" not in rule


async def test_each_family_takes_its_own_cluster_ip_and_slices():
    fake4, fake6 = FakeNFTables("ip"), FakeNFTables("ip6")
    cfg = ProxyConfig(node_name=NODE, families=("ipv4", "ipv6"))
    v4 = Proxier("ipv4", cfg, nftables=fake4, local_addresses=lambda: [])
    v6 = Proxier("ipv6", cfg, nftables=fake6, local_addresses=lambda: [])
    s = svc("d", "172.30.0.10")
    s["spec"]["clusterIPs"] = ["172.30.0.10", "fd00:96::10"]
    s6 = eps("d", ("fd00:1::1", True), slice_name="d-6")
    s6["addressType"] = "IPv6"
    for p in (v4, v6):
        p.on_service(s)
        p.on_slice(eps("d", ("10.0.1.1", True), slice_name="d-4"))
        p.on_slice(s6)
        await synced(p)
    assert fake4.map_elements("service-ips") == {"172.30.0.10 . tcp . 80": f"goto {chain_of('d')}"}
    assert fake6.map_elements("service-ips") == {"fd00:96::10 . tcp . 80": f"goto {chain_of('d')}"}
    assert fake6.chain_rules(chain_of("d")) == [
        "meta l4proto tcp dnat ip6 addr . port to numgen random mod 1 map { 0 : fd00:1::1 . 80 }"]
    assert "ip6 daddr != ::1" in " ".join(fake6.chain_rules("services"))


BASE_TABLE = """\
chain cluster-ips-check
  ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"
chain filter-forward
  ct state new jump service-endpoints-check
  ct state new jump cluster-ips-check
chain filter-input
  ct state new jump nodeport-endpoints-check
  ct state new jump service-endpoints-check
chain filter-output
  ct state new jump service-endpoints-check
  ct state new jump cluster-ips-check
chain filter-output-pre-dnat
  ct state new jump firewall-check
chain filter-prerouting-pre-dnat
  ct state new jump firewall-check
chain firewall-check
  ip daddr . meta l4proto . th dport vmap @firewall-ips
chain masquerading
  mark and 0x004000 != 0 mark set mark xor 0x004000 masquerade fully-random
  ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random
chain nat-output
  jump services
chain nat-postrouting
  jump masquerading
chain nat-prerouting
  jump services
chain nodeport-endpoints-check
  ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @no-endpoint-nodeports
chain reject-chain
  reject
chain service-endpoints-check
  ip daddr . meta l4proto . th dport vmap @no-endpoint-services
chain services
  ip daddr . meta l4proto . th dport vmap @service-ips
  fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports
set cluster-ips
map firewall-ips
set hairpin-connections
map no-endpoint-nodeports
map no-endpoint-services
map service-ips
map service-nodeports"""


async def test_the_fixed_part_of_the_table_is_upstreams():
    p, fake = make()
    await synced(p)
    assert fake.dump() == BASE_TABLE
    hooks = {n: (c.type, c.hook, c.priority) for n, c in fake.chains.items() if c.type}
    assert hooks == {
        "filter-prerouting-pre-dnat": ("filter", "prerouting", -110), "filter-output-pre-dnat": ("filter", "output", -110),
        "filter-input": ("filter", "input", 0), "filter-forward": ("filter", "forward", 0),
        "filter-output": ("filter", "output", 0), "nat-prerouting": ("nat", "prerouting", -100),
        "nat-output": ("nat", "output", -100), "nat-postrouting": ("nat", "postrouting", 100)}
    # services come and go: the fixed part stays as it was
    p.on_service(svc("a", "172.30.0.1", node_port=30001, type="NodePort"))
    p.on_slice(eps("a", ("10.0.1.1", True)))
    await synced(p)
    p.on_service_deleted(svc("a", "172.30.0.1"))
    await synced(p)
    p.clock = lambda: 1e9  # the stale chains' second has passed
    await synced(p)
    assert fake.dump() == BASE_TABLE


async def test_load_balancer_ips_source_ranges_and_external_ips():
    p, fake = make(node_ips=["192.168.1.5"])
    s = svc("lb", "172.30.0.11", node_port=30011, type="LoadBalancer", externalIPs=["203.0.113.7"],
            loadBalancerSourceRanges=["192.168.1.0/24", " 198.51.100.0/24"])
    s["status"] = {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}, {"ip": "203.0.113.11", "ipMode": "Proxy"}]}}
    p.on_service(s)
    p.on_slice(eps("lb", ("10.0.1.1", True)))
    await synced(p)
    ext, fw = chain_of("lb", "external-"), chain_of("lb", "firewall-")
    assert fake.map_elements("service-ips") == {
        "172.30.0.11 . tcp . 80": f"goto {chain_of('lb')}",
        "203.0.113.7 . tcp . 80": f"goto {ext}",
        "203.0.113.10 . tcp . 80": f"goto {ext}"}  # an ingress of ipMode Proxy is the load balancer's business
    assert fake.map_elements("firewall-ips") == {"203.0.113.10 . tcp . 80": f"goto {fw}"}
    # the node is in a source range: its own traffic to the VIP (which it may hold) stays allowed
    assert fake.chain_rules(fw) == ["ip saddr != { 192.168.1.0/24, 198.51.100.0/24, 203.0.113.10 } drop"]
    # no endpoints: every external address rejects
    p.on_slice_deleted(eps("lb"))
    await synced(p)
    assert fake.map_elements("no-endpoint-services") == {
        "172.30.0.11 . tcp . 80": "goto reject-chain", "203.0.113.7 . tcp . 80": "goto reject-chain",
        "203.0.113.10 . tcp . 80": "goto reject-chain"}
    assert fake.map_elements("service-ips") == {}
