"""The DNS server (kubeplane.dns.server) on 127.0.0.1: UDP and TCP, truncation,
malformed packets, forwarding to a fake upstream, its bounds."""

from __future__ import annotations

import asyncio
import os
import socket
import struct

import dns.asyncquery
import dns.edns
import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdatatype as T
import pytest

from kubeplane.client.informer import Indexer
from kubeplane.dns.records import ClusterRecords
from kubeplane.dns.server import DNSServer, Forwarder

from fake_dns import FakeUpstream, endpoint, endpoint_slice, service
from helpers import eventually


@pytest.fixture
def stores():
    services, slices, namespaces = Indexer(), Indexer(), Indexer()
    namespaces.add({"metadata": {"name": "app"}})
    services.add(service("web"))
    services.add(service("ext", type_="ExternalName", ip=None, ports=(), externalName="www.example.org"))
    services.add(service("many", ip="None"))
    slices.add(endpoint_slice("many-1", "many", endpoints=[endpoint(f"10.42.1.{i}") for i in range(1, 101)]))
    return services, slices, namespaces


@pytest.fixture
async def upstream():
    async with FakeUpstream({("www.example.org.", "A"): ["192.0.2.80"],
                             ("big.example.org.", "TXT"): [f'"{i}{"x" * 200}"' for i in range(5)]}) as fake:
        yield fake


@pytest.fixture
async def server(stores, upstream):
    services, slices, namespaces = stores
    records = ClusterRecords(services, slices, namespaces=namespaces)
    srv = DNSServer(records, "127.0.0.1", 0, forwarder=Forwarder([("127.0.0.1", upstream.port)], timeout=1.0),
                    max_tcp=4, tcp_idle_timeout=0.5)
    await srv.start()
    yield srv
    await srv.stop()


async def udp(server, name, qtype=T.A, **kw):
    return await dns.asyncquery.udp(dns.message.make_query(name, qtype, **kw), "127.0.0.1", port=server.port,
                                    timeout=3, ignore_trailing=True)


async def tcp(server, name, qtype=T.A, **kw):
    return await dns.asyncquery.tcp(dns.message.make_query(name, qtype, **kw), "127.0.0.1", port=server.port,
                                    timeout=3)


def texts(resp, rdtype=None):
    return sorted(rd.to_text() for rr in resp.answer if rdtype is None or rr.rdtype == rdtype for rd in rr)


async def test_udp_and_tcp_answers(server):
    for ask in (udp, tcp):
        r = await ask(server, "web.app.svc.cluster.local")
        assert r.rcode() == dns.rcode.NOERROR and texts(r) == ["10.96.0.20"]
        assert r.flags & dns.flags.AA and r.flags & dns.flags.QR
        nx = await ask(server, "nope.app.svc.cluster.local")
        assert nx.rcode() == dns.rcode.NXDOMAIN and nx.authority[0].rdtype == T.SOA


async def test_truncation_over_udp_and_the_whole_answer_over_tcp(server):
    # 100 A records do not fit 512 bytes: TC, and the client asks again over TCP
    r = await udp(server, "many.app.svc.cluster.local")
    assert r.flags & dns.flags.TC and len(texts(r)) < 100
    # an EDNS0 client with 4096 bytes gets it all over UDP
    r = await udp(server, "many.app.svc.cluster.local", use_edns=0, payload=4096)
    assert not r.flags & dns.flags.TC and len(texts(r)) == 100 and r.edns == 0
    r = await tcp(server, "many.app.svc.cluster.local")
    assert not r.flags & dns.flags.TC and len(texts(r)) == 100
    assert server.stats["truncated"] >= 1


async def test_forwarding_and_external_name_chase(server, upstream):
    r = await udp(server, "www.example.org")
    assert texts(r) == ["192.0.2.80"] and not r.flags & dns.flags.AA
    assert ("www.example.org.", "A", "udp") in upstream.questions
    nx = await udp(server, "missing.example.org")
    assert nx.rcode() == dns.rcode.NXDOMAIN
    # an upstream answer truncated over UDP is fetched again over TCP
    big = await tcp(server, "big.example.org", T.TXT)
    assert len(texts(big)) == 5 and ("big.example.org.", "TXT", "tcp") in upstream.questions
    # and truncated again for a classic UDP client
    small = await udp(server, "big.example.org", T.TXT)
    assert small.flags & dns.flags.TC
    # an ExternalName's target outside the cluster is looked up upstream
    r = await udp(server, "ext.app.svc.cluster.local")
    assert texts(r, T.CNAME) == ["www.example.org."] and texts(r, T.A) == ["192.0.2.80"]


async def test_upstream_down_is_servfail(stores):
    services, slices, namespaces = stores
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # a port where nobody answers
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
        srv = DNSServer(ClusterRecords(services, slices, namespaces=namespaces), "127.0.0.1", 0,
                        forwarder=Forwarder([("127.0.0.1", dead)], timeout=0.3))
        await srv.start()
        try:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            r = await udp(srv, "www.example.org")
            assert r.rcode() == dns.rcode.SERVFAIL and loop.time() - t0 < 2.5
            # the cluster domain is still answered
            assert texts(await udp(srv, "web.app.svc.cluster.local")) == ["10.96.0.20"]
        finally:
            await srv.stop()


async def _raw_udp(port: int, data: bytes, timeout: float = 0.5) -> bytes | None:
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[bytes] = loop.create_future()

    class P(asyncio.DatagramProtocol):
        def datagram_received(self, d, addr):
            if not fut.done():
                fut.set_result(d)

    transport, _ = await loop.create_datagram_endpoint(P, remote_addr=("127.0.0.1", port))
    try:
        transport.sendto(data)
        return await asyncio.wait_for(fut, timeout)
    except asyncio.TimeoutError:
        return None
    finally:
        transport.close()


async def test_malformed_packets(server):
    # a readable header and garbage after it: FORMERR with the same ID
    garbage = struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + b"\xff\xfe\x00"
    reply = await _raw_udp(server.port, garbage)
    assert reply is not None and reply[:2] == b"\x12\x34" and reply[3] & 0x0F == dns.rcode.FORMERR
    assert reply[2] & 0x80  # QR
    # shorter than a header: dropped
    assert await _raw_udp(server.port, b"\x00\x01\x02") is None
    # a response sent to the server: dropped
    resp = dns.message.make_response(dns.message.make_query("web.app.svc.cluster.local", T.A)).to_wire()
    assert await _raw_udp(server.port, resp) is None
    # random packets never stop it
    for _ in range(50):
        await _raw_udp(server.port, os.urandom(40), timeout=0.01)
    # two questions: FORMERR; another opcode: NOTIMP
    two = dns.message.make_query("web.app.svc.cluster.local", T.A)
    two.question.append(dns.message.make_query("x.app.svc.cluster.local", T.A).question[0])
    reply = dns.message.from_wire(await _raw_udp(server.port, two.to_wire()))
    assert reply.rcode() == dns.rcode.FORMERR
    notify = dns.message.make_query("cluster.local", T.SOA)
    notify.set_opcode(dns.opcode.NOTIFY)
    reply = dns.message.from_wire(await _raw_udp(server.port, notify.to_wire()))
    assert reply.rcode() == dns.rcode.NOTIMP
    axfr = dns.message.make_query("cluster.local", T.AXFR)
    reply = dns.message.from_wire(await _raw_udp(server.port, axfr.to_wire()))
    assert reply.rcode() == dns.rcode.REFUSED
    assert texts(await udp(server, "web.app.svc.cluster.local")) == ["10.96.0.20"]


async def test_tcp_limits(server):
    # an idle connection is closed after the idle timeout
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    assert await asyncio.wait_for(reader.read(), 3) == b""
    writer.close()
    # a half-sent message too
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"\x00\x30abc")
    assert await asyncio.wait_for(reader.read(), 3) == b""
    writer.close()
    # beyond max_tcp connections, new ones are closed at once
    server.tcp_idle_timeout = 30.0  # the held connections stay while the fifth is tried
    held = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(4)]
    await eventually(lambda: len(server._tcp_writers) == 4, what="four connections accepted")
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    assert await asyncio.wait_for(reader.read(), 3) == b""
    writer.close()
    assert server.stats["tcp_refused"] == 1
    for _r, w in held:
        w.close()
    await eventually(lambda: not server._tcp_writers, what="the held connections closed")
    # several questions on one connection
    q1 = dns.message.make_query("web.app.svc.cluster.local", T.A).to_wire()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write((struct.pack("!H", len(q1)) + q1) * 3)
    for _ in range(3):
        (n,) = struct.unpack("!H", await reader.readexactly(2))
        assert dns.message.from_wire(await reader.readexactly(n)).rcode() == dns.rcode.NOERROR
    writer.close()


async def test_answers_follow_changes_despite_the_cache(server, stores):
    services = stores[0]
    assert texts(await udp(server, "web.app.svc.cluster.local")) == ["10.96.0.20"]
    assert texts(await udp(server, "web.app.svc.cluster.local")) == ["10.96.0.20"]
    services.add(service("web", ip="10.96.0.21"))
    assert texts(await udp(server, "web.app.svc.cluster.local")) == ["10.96.0.21"]


async def test_forwards_are_bounded(stores, upstream):
    services, slices, namespaces = stores
    srv = DNSServer(ClusterRecords(services, slices, namespaces=namespaces), "127.0.0.1", 0,
                    forwarder=Forwarder([("127.0.0.1", upstream.port)]), max_forwards=0)
    await srv.start()
    try:
        assert (await udp(srv, "www.example.org")).rcode() == dns.rcode.SERVFAIL
        # an ExternalName is answered with its CNAME alone
        r = await udp(srv, "ext.app.svc.cluster.local")
        assert r.rcode() == dns.rcode.NOERROR and texts(r) == ["www.example.org."]
        assert not upstream.questions
    finally:
        await srv.stop()


async def test_a_change_elsewhere_keeps_cached_answers(server, stores):
    services, slices, namespaces = stores
    records = server.records
    q = dns.message.make_query("web.app.svc.cluster.local", T.A).to_wire()
    first = server.answer_now(q, udp=True)
    calls = []
    real = records.resolve
    records.resolve = lambda *a: calls.append(a) or real(*a)
    try:
        # another Service and another Service's slice change: web's answer comes from the cache
        services.add(service("other", ip="10.96.0.99"))
        slices.add(endpoint_slice("many-1", "many", endpoints=[endpoint("10.42.1.1")]))
        assert server.answer_now(q, udp=True)[2:] == first[2:] and not calls
        # web's own slice changes: resolved again
        slices.add(endpoint_slice("web-1", "web", endpoints=[endpoint("10.42.2.1")]))
        server.answer_now(q, udp=True)
        assert len(calls) == 1
        # a namespace change: resolved again
        namespaces.add({"metadata": {"name": "other"}})
        server.answer_now(q, udp=True)
        assert len(calls) == 2
        # a name that is not a Service's depends on everything
        v = dns.message.make_query("dns-version.cluster.local", T.TXT).to_wire()
        server.answer_now(v, udp=True)
        server.answer_now(v, udp=True)
        assert len(calls) == 3
        services.add(service("third", ip="10.96.0.98"))
        server.answer_now(v, udp=True)
        assert len(calls) == 4
    finally:
        records.resolve = real
