"""Every kind of rule the proxier writes, accepted by the kernel: a Service of each kind synced
(full, then partial, then stale chains deleted) into a network namespace made for the test."""

from __future__ import annotations

import asyncio
import os
import subprocess

import pytest

from kubeplane.proxy import Proxier, ProxyConfig


def _svc(name, ips, **spec):
    ports = [{"port": 80, "protocol": "TCP", **({"nodePort": spec.pop("node_port")} if "node_port" in spec else {})},
             {"name": "dns", "port": 53, "protocol": "UDP"}]
    return {"metadata": {"namespace": "ns", "name": name},
            "spec": {"clusterIP": ips[0], "clusterIPs": ips, "ports": ports, **spec}}


def _slice(name, family, addrs, node="node-a"):
    return {"metadata": {"namespace": "ns", "name": f"{name}-{family}", "labels": {"kubernetes.io/service-name": name}},
            "addressType": family,
            "ports": [{"name": "", "port": 8080, "protocol": "TCP"}, {"name": "dns", "port": 5353, "protocol": "UDP"}],
            "endpoints": [{"addresses": [a], "conditions": {"ready": True}, "nodeName": node} for a in addrs]}


@pytest.fixture
def netns():
    name = f"kpk{os.getpid() % 100000}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.mark.parametrize("family", ["ipv4", "ipv6"])
async def test_every_kind_of_rule_is_accepted_by_the_kernel(netns, family):
    v6 = family == "ipv6"
    a = (lambda n: f"fd00:10::{n}") if v6 else (lambda n: f"10.0.0.{n}")
    vip = (lambda n: f"fd00:96::{n}") if v6 else (lambda n: f"172.30.0.{n}")
    addr_type = "IPv6" if v6 else "IPv4"
    cfg = ProxyConfig(node_name="node-a", node_ips=["fd00:1::5" if v6 else "192.168.1.5"],
                      local_cidrs=["fd00:10::/64" if v6 else "10.0.0.0/16"], nodeport_addresses=["primary"],
                      command_prefix=["ip", "netns", "exec", netns], families=(family,))
    p = Proxier(family, cfg)
    lb = _svc("lb", [vip(1)], type="LoadBalancer", node_port=30001, externalTrafficPolicy="Local",
              externalIPs=[vip(100)], loadBalancerSourceRanges=["fd00:1::/64" if v6 else "192.168.1.0/24"])
    lb["status"] = {"loadBalancer": {"ingress": [{"ip": vip(200)}]}}
    services = [
        lb,
        _svc("sticky", [vip(2)], sessionAffinity="ClientIP", sessionAffinityConfig={"clientIP": {"timeoutSeconds": 60}}),
        _svc("itp", [vip(3)], internalTrafficPolicy="Local"),
        _svc("empty", [vip(4)], type="NodePort", node_port=30004),
    ]
    for s in services:
        p.on_service(s)
    p.on_slice(_slice("lb", addr_type, [a(1), a(2)]))
    p.on_slice(_slice("sticky", addr_type, [a(3), a(4)], node="other"))
    p.on_slice(_slice("itp", addr_type, [a(5)], node="other"))
    p.set_initialized()
    try:
        assert await p.sync(), p.last_error  # full
        first = subprocess.run(["ip", "netns", "exec", netns, "nft", "list", "table", "ip6" if v6 else "ip",
                                "kube-proxy"], capture_output=True, text=True, check=True).stdout
        for what in ("chain firewall-", "chain external-", "chain local-", "chain endpoint-", "set affinity-",
                     f"{vip(100)} . tcp . 80 : goto external-", f"{vip(200)} . tcp . 80 : goto firewall-"):
            assert what in first, what
        p.on_slice(_slice("sticky", addr_type, [a(3)], node="other"))  # an endpoint (and its affinity set) goes
        p.on_service_deleted(services[0])
        assert await p.sync(), p.last_error  # partial
        assert not p.syncs[-1].full
        await asyncio.sleep(1.05)
        assert await p.sync(), p.last_error  # the stale chains deleted
        assert not p._stale_chains
        out = subprocess.run(["ip", "netns", "exec", netns, "nft", "list", "table", "ip6" if v6 else "ip",
                              "kube-proxy"], capture_output=True, text=True, check=True).stdout
        assert "/lb/" not in out and "/sticky/" in out and "timeout 1m" in out
        assert f"{vip(4)} . udp . 53" in out  # no endpoints: rejected, on each of its ports
        assert ("fd00:1::5" if v6 else "192.168.1.5") in out  # nodeport-ips: the node's address
    finally:
        await p.cleanup()
