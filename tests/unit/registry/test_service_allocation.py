"""Service ClusterIP and NodePort allocation through the registry: ranges,
requested values, upstream's conflict errors, release on delete and on type
changes, reverts of failed writes, state read back from the store."""

from __future__ import annotations

import copy
import ipaddress
import random

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.registry.registry import Registry
from kubeplane.registry.servicealloc import (
    IPAllocator,
    PortAllocator,
    ServiceAllocators,
    parse_port_range,
    parse_service_cidr,
)
from kubeplane.storage.memory import MemoryStore

SVC = resource("services")
NS = "default"


def svc(name: str, *, type_: str = "ClusterIP", cluster_ip: str | None = None, node_port: int | None = None,
        ports: list[dict] | None = None) -> dict:
    spec: dict = {"type": type_, "selector": {"app": name},
                  "ports": ports or [{"port": 80, "targetPort": 8080, **({"nodePort": node_port} if node_port else {})}]}
    if cluster_ip is not None:
        spec["clusterIP"] = cluster_ip
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec}


async def make_registry(store: MemoryStore, cidr: str = "10.0.0.0/24", ports: str = "30000-30099") -> Registry:
    registry = Registry(store, CATALOGUE,
                        service_allocators=ServiceAllocators(store, cidr, ports, rng=random.Random(7)))
    await ensure_default_namespaces(registry)
    return registry


@pytest.fixture
async def reg():
    store = MemoryStore()
    registry = await make_registry(store)
    yield registry
    await registry.close()
    await store.close()


async def patch(reg: Registry, name: str, body: dict) -> dict:
    return (await reg.patch(SVC, name, body, NS))[0]


async def expect(code: int, coro) -> str:
    with pytest.raises(StatusError) as info:
        await coro
    assert info.value.code == code, info.value.message
    return info.value.message


async def test_cluster_ips_come_from_the_range_upper_band_first(reg: Registry) -> None:
    net = ipaddress.ip_network("10.0.0.0/24")
    seen = set()
    for i in range(20):
        created = await reg.create(SVC, svc(f"s{i}"), NS)
        spec = created["spec"]
        ip = ipaddress.ip_address(spec["clusterIP"])
        assert spec["clusterIPs"] == [spec["clusterIP"]]
        assert ip in net and ip not in (net.network_address, net.broadcast_address)
        # a /24's first 16 addresses are left to requests by number
        assert int(ip) - int(net.network_address) - 1 >= 16
        seen.add(ip)
    assert len(seen) == 20


async def test_requested_ip_conflict_and_range_errors_as_upstream(reg: Registry) -> None:
    await reg.create(SVC, svc("a", cluster_ip="10.0.0.10"), NS)
    msg = await expect(422, reg.create(SVC, svc("b", cluster_ip="10.0.0.10"), NS))
    assert msg == ('Service "b" is invalid: spec.clusterIPs: Invalid value: []string{"10.0.0.10"}: '
                   'failed to allocate IP 10.0.0.10: provided IP is already allocated')
    msg = await expect(422, reg.create(SVC, svc("c", cluster_ip="10.9.0.1"), NS))
    assert msg == ('Service "c" is invalid: spec.clusterIPs: Invalid value: []string{"10.9.0.1"}: failed to '
                   'allocate IP 10.9.0.1: the provided IP (10.9.0.1) is not in the valid range. The range of '
                   'valid IPs is 10.0.0.0/24')
    # the broadcast address is outside what can be handed out
    msg = await expect(422, reg.create(SVC, svc("d", cluster_ip="10.0.0.255"), NS))
    assert "is not in the valid range" in msg
    msg = await expect(422, reg.create(SVC, svc("e", cluster_ip="abc"), NS))
    assert msg == ('Service "e" is invalid: spec.clusterIPs[0]: Invalid value: "abc": must be a valid IP '
                   'address, (e.g. 10.9.8.7 or 2001:db8::ffff)')


async def test_headless_and_external_name_get_no_address(reg: Registry) -> None:
    h = await reg.create(SVC, svc("h", cluster_ip="None"), NS)
    assert h["spec"]["clusterIP"] == "None" and h["spec"]["clusterIPs"] == ["None"]
    e = await reg.create(SVC, {"metadata": {"name": "e"}, "spec": {"type": "ExternalName",
                                                                 "externalName": "db.example.com"}}, NS)
    assert "clusterIP" not in e["spec"]
    assert reg.service_allocators.ips.used == 0


async def test_node_ports_allocated_requested_and_conflicting(reg: Registry) -> None:
    a = await reg.create(SVC, svc("a", type_="NodePort"), NS)
    np = a["spec"]["ports"][0]["nodePort"]
    assert 30000 <= np <= 30099
    await reg.create(SVC, svc("b", type_="NodePort", node_port=30005), NS)
    msg = await expect(422, reg.create(SVC, svc("c", type_="NodePort", node_port=30005), NS))
    assert msg == ('Service "c" is invalid: spec.ports[0].nodePort: Invalid value: 30005: provided port is '
                   'already allocated')
    msg = await expect(422, reg.create(SVC, svc("d", type_="NodePort", node_port=31000), NS))
    assert msg == ('Service "d" is invalid: spec.ports[0].nodePort: Invalid value: 31000: provided port is not '
                   'in the valid range. The range of valid ports is 30000-30099')
    # the failed creates held nothing: their ClusterIPs are free again
    assert reg.service_allocators.ips.used == 2


async def test_tcp_and_udp_of_one_port_share_a_node_port(reg: Registry) -> None:
    s = await reg.create(SVC, svc("dns", type_="NodePort", ports=[
        {"name": "tcp", "port": 53, "protocol": "TCP"}, {"name": "udp", "port": 53, "protocol": "UDP"}]), NS)
    tcp, udp = (p["nodePort"] for p in s["spec"]["ports"])
    assert tcp == udp
    assert reg.service_allocators.ports.used == 1


async def test_delete_releases_address_and_ports(reg: Registry) -> None:
    await reg.create(SVC, svc("a", type_="NodePort", cluster_ip="10.0.0.20", node_port=30010), NS)
    await reg.delete(SVC, "a", NS)
    again = await reg.create(SVC, svc("b", type_="NodePort", cluster_ip="10.0.0.20", node_port=30010), NS)
    assert again["spec"]["clusterIP"] == "10.0.0.20"


async def test_failed_create_reverts_its_allocation(reg: Registry) -> None:
    await reg.create(SVC, svc("a", cluster_ip="10.0.0.30"), NS)
    await expect(409, reg.create(SVC, svc("a", cluster_ip="10.0.0.31", type_="NodePort", node_port=30031), NS))
    assert not reg.service_allocators.ips.has("10.0.0.31")
    assert not reg.service_allocators.ports.has(30031)
    # dry run: the answer shows what would be allocated, nothing stays reserved
    dry = await reg.create(SVC, svc("d", type_="NodePort"), NS, dry_run=True)
    assert dry["spec"]["clusterIP"] and dry["spec"]["ports"][0]["nodePort"]
    assert not reg.service_allocators.ips.has(dry["spec"]["clusterIP"])
    assert not reg.service_allocators.ports.has(dry["spec"]["ports"][0]["nodePort"])


async def test_type_changes_allocate_and_release(reg: Registry) -> None:
    await reg.create(SVC, svc("a"), NS)
    nodeport = await patch(reg, "a", {"spec": {"type": "NodePort"}})
    np = nodeport["spec"]["ports"][0]["nodePort"]
    assert reg.service_allocators.ports.has(np)
    back = await patch(reg, "a", {"spec": {"type": "ClusterIP"}})
    assert "nodePort" not in back["spec"]["ports"][0]
    assert not reg.service_allocators.ports.has(np)
    ip = back["spec"]["clusterIP"]
    ext = await patch(reg, "a", {"spec": {"type": "ExternalName", "externalName": "x.example.com"}})
    assert "clusterIP" not in ext["spec"] and not reg.service_allocators.ips.has(ip)
    again = await patch(reg, "a", {"spec": {"type": "ClusterIP", "externalName": None}})
    assert reg.service_allocators.ips.has(again["spec"]["clusterIP"])


async def test_changing_a_node_port_moves_the_reservation(reg: Registry) -> None:
    await reg.create(SVC, svc("a", type_="NodePort", node_port=30040), NS)
    cur = copy.deepcopy(await reg.get(SVC, "a", NS))
    cur["spec"]["ports"][0]["nodePort"] = 30041
    await reg.update(SVC, cur, name="a", namespace=NS)
    assert reg.service_allocators.ports.has(30041) and not reg.service_allocators.ports.has(30040)


async def test_a_put_without_allocated_values_keeps_them(reg: Registry) -> None:
    created = await reg.create(SVC, svc("a", type_="NodePort"), NS)
    ip, np = created["spec"]["clusterIP"], created["spec"]["ports"][0]["nodePort"]
    body = svc("a", type_="NodePort")
    body["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"]
    replaced = await reg.update(SVC, body, name="a", namespace=NS)
    assert replaced["spec"]["clusterIP"] == ip and replaced["spec"]["clusterIPs"] == [ip]
    assert replaced["spec"]["ports"][0]["nodePort"] == np
    # changing the address is refused
    replaced = copy.deepcopy(replaced)
    replaced["spec"]["clusterIP"] = "10.0.0.5"
    replaced["spec"]["clusterIPs"] = ["10.0.0.5"]
    msg = await expect(422, reg.update(SVC, replaced, name="a", namespace=NS))
    assert "may not change once set" in msg


async def test_full_range_is_an_internal_error() -> None:
    store = MemoryStore()
    registry = await make_registry(store, cidr="10.1.0.0/29", ports="30000-30001")
    try:
        for i in range(6):  # a /29: 6 usable addresses
            await registry.create(SVC, svc(f"s{i}"), NS)
        with pytest.raises(StatusError) as info:
            await registry.create(SVC, svc("s6"), NS)
        assert info.value.code == 500 and info.value.reason == "InternalError"
        assert info.value.message == ('Internal error occurred: failed to allocate a serviceIP for Service "s6": '
                                      'range is full')
        await registry.delete(SVC, "s0", NS)
        await patch(registry, "s1", {"spec": {"type": "NodePort"}})
        await patch(registry, "s2", {"spec": {"type": "NodePort"}})
        with pytest.raises(StatusError) as info:
            await patch(registry, "s3", {"spec": {"type": "NodePort"}})
        assert info.value.message == "Internal error occurred: failed to allocate a nodePort: range is full"
    finally:
        await registry.close()
        await store.close()


async def test_state_is_read_back_from_the_store() -> None:
    store = MemoryStore()
    first = await make_registry(store)
    await first.create(SVC, svc("a", type_="NodePort", cluster_ip="10.0.0.40", node_port=30050), NS)
    second = await make_registry(store)  # as a restarted API server
    msg = await expect(422, second.create(SVC, svc("b", cluster_ip="10.0.0.40"), NS))
    assert "provided IP is already allocated" in msg
    msg = await expect(422, second.create(SVC, svc("c", type_="NodePort", node_port=30050), NS))
    assert "provided port is already allocated" in msg
    await first.close()
    await second.close()
    await store.close()


def test_allocators_hand_out_every_value_once() -> None:
    rng = random.Random(1)
    ips = IPAllocator(ipaddress.ip_network("192.168.0.0/28"), rng)
    got = {ips.allocate_next() for _ in range(14)}
    assert len(got) == 14 and "192.168.0.0" not in got and "192.168.0.15" not in got
    ports = PortAllocator(parse_port_range("100-139"), rng)
    picked = [ports.allocate_next() for _ in range(40)]
    # the upper band (40 ports: offset 16) goes first
    assert all(p >= 116 for p in picked[:24]) and sorted(picked) == list(range(100, 140))


@pytest.mark.parametrize("value, message", [
    ("", "--service-cluster-ip-range must not be empty"),
    ("10.0.0.0/8", "specified --service-cluster-ip-range is too large; for 32-bit addresses, the mask must be >= 12"),
    ("nonsense", "--service-cluster-ip-range: 'nonsense' is not a valid CIDR (e.g. 10.96.0.0/12 or "
                 "fd00:10:96::/112)"),
    ("10.0.0.0/24,fd00::/112", "--service-cluster-ip-range: kubeplane serves one IP family; give a single CIDR, "
                               "not '10.0.0.0/24,fd00::/112'"),
])
def test_service_cidr_flag_errors(value: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_service_cidr(value)
    assert str(info.value) == message


@pytest.mark.parametrize("value, message", [
    ("30000-29999", "end port is less than start port: 30000-29999"),
    ("abc", "unable to parse port range: abc"),
    ("0-10", "port range 0-10 must be within 1-65535"),
])
def test_node_port_range_flag_errors(value: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_port_range(value)
    assert str(info.value) == message


def test_node_port_range_forms() -> None:
    assert str(parse_port_range("30000-32767")) == "30000-32767"
    assert str(parse_port_range("30000+2767")) == "30000-32767"
    assert parse_port_range("8080").size == 1
