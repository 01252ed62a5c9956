"""The node IPAM controller's range allocator: subnets handed out in order
from the cluster CIDR, dual stack, those nodes hold kept, freed on delete,
exhaustion reported, and upstream's flag errors."""

from __future__ import annotations

import ipaddress

import pytest

from helpers import eventually
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.manager import ControllerOptions
from kubeplane.controllers.nodeipam import CIDRExhausted, CIDRSet, NodeIPAMController, build, parse_cluster_cidrs
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

NODES = resource("nodes")
net = ipaddress.ip_network


def test_cidrset_in_order_then_round_robin():
    s = CIDRSet(net("10.0.0.0/22"), 24)
    assert [str(s.allocate_next()) for _ in range(4)] == ["10.0.0.0/24", "10.0.1.0/24", "10.0.2.0/24",
                                                          "10.0.3.0/24"]
    with pytest.raises(CIDRExhausted, match="no remaining CIDRs left to allocate in the accepted range 10.0.0.0/22"):
        s.allocate_next()
    s.release(net("10.0.1.0/24"))
    assert str(s.allocate_next()) == "10.0.1.0/24"
    s2 = CIDRSet(net("10.0.0.0/22"), 24)
    s2.occupy(net("10.0.0.0/24"))
    assert str(s2.allocate_next()) == "10.0.1.0/24"
    s6 = CIDRSet(net("fd00::/48"), 64)
    assert str(s6.allocate_next()) == "fd00::/64" and str(s6.allocate_next()) == "fd00:0:0:1::/64"


def test_flag_errors():
    assert [str(c) for c in parse_cluster_cidrs("10.244.0.0/16,fd00::/48")] == ["10.244.0.0/16", "fd00::/48"]
    with pytest.raises(ValueError, match="invalid CIDR address: nope"):
        parse_cluster_cidrs("nope")
    with pytest.raises(ValueError, match="one IPv4 and one IPv6"):
        parse_cluster_cidrs("10.0.0.0/16,10.1.0.0/16")
    with pytest.raises(ValueError, match="smaller than the cluster CIDR"):
        CIDRSet(net("10.0.0.0/16"), 8)
    with pytest.raises(ValueError, match="too big"):
        CIDRSet(net("10.0.0.0/8"), 30)
    assert build(None, None, ControllerOptions(cluster_cidr="10.0.0.0/16")) == []  # not --allocate-node-cidrs


@pytest.fixture
async def registry():
    store = MemoryStore()
    reg = Registry(store, CATALOGUE)
    from kubeplane.apiserver.app import ensure_default_namespaces

    await ensure_default_namespaces(reg)
    yield reg
    await reg.close()
    await store.close()


def node(name, *cidrs):
    spec = {"podCIDR": cidrs[0], "podCIDRs": list(cidrs)} if cidrs else {}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": spec}


async def test_nodes_get_their_subnets(registry):
    client = InProcessClient(registry)
    await client.create(NODES, node("has", "10.0.0.0/24"))  # set before: kept, marked used
    await client.create(NODES, node("a"))
    ctrl = NodeIPAMController(client, parse_cluster_cidrs("10.0.0.0/22,fd00::/48"))
    await ctrl.start()
    try:
        async def cidrs(name):
            spec = (await client.get(NODES, name)).get("spec") or {}
            return spec.get("podCIDRs")

        assert await eventually(lambda: cidrs("a")) == ["10.0.1.0/24", "fd00::/64"]
        assert (await client.get(NODES, "a"))["spec"]["podCIDR"] == "10.0.1.0/24"
        assert await cidrs("has") == ["10.0.0.0/24"]
        await client.create(NODES, node("b"))
        assert await eventually(lambda: cidrs("b")) == ["10.0.2.0/24", "fd00:0:0:1::/64"]
        await client.delete(NODES, "a")
        await client.create(NODES, node("c"))
        assert (await eventually(lambda: cidrs("c")))[0] == "10.0.3.0/24"
        await client.create(NODES, node("d"))  # round robin: a's subnet is free again
        assert (await eventually(lambda: cidrs("d")))[0] == "10.0.1.0/24"
        await client.create(NODES, node("e"))  # none left

        async def exhausted():
            events = (await client.list(resource("events"), "default"))["items"]
            return [e for e in events if e.get("reason") == "CIDRNotAvailable"]

        ev = (await eventually(exhausted))[0]
        assert ev["message"] == "Node e status is now: CIDRNotAvailable"
        assert await cidrs("e") is None
    finally:
        await ctrl.stop()
        await client.close()
