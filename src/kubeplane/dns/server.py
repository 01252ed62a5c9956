"""The DNS server: UDP and TCP on one address, answering the cluster domain
from :class:`~kubeplane.dns.records.ClusterRecords` and forwarding every
other name to the upstream resolvers.

Wire handling is dnspython's. Bounds:

* UDP answers longer than the client's limit (512 bytes, or its EDNS0 size
  up to :data:`MAX_UDP_PAYLOAD`) are truncated with the TC bit, so that the
  client asks again over TCP.
* At most ``max_tcp`` TCP connections at once (more are closed at once); a
  connection idle for ``tcp_idle_timeout`` seconds, or slow to send a whole
  message, is closed.
* At most ``max_forwards`` forwarded questions in flight; more are answered
  SERVFAIL, as are those the upstreams do not answer in time.
* A packet that does not parse is answered FORMERR when its header can be
  read and it is a query, and dropped otherwise; responses sent to the
  server are dropped.
* Local answers are kept, keyed by the question's bytes, for as long as what
  they were made from is unchanged: for a Service's names, the Service's and
  its EndpointSlices' stored objects and the namespaces; for other names,
  every store. Repeated questions cost a dictionary look-up, and a change
  elsewhere in the cluster leaves them cached.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import struct
from typing import Any

import dns.edns
import dns.exception
import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype

from kubeplane.dns.records import Answer, ClusterRecords
from kubeplane.runtime import cancel_and_wait

log = logging.getLogger("kubeplane.dns")

#: the EDNS0 payload size the server announces (the DNS flag day's value)
OUR_PAYLOAD = 1232
#: the largest UDP answer sent, whatever the client announces
MAX_UDP_PAYLOAD = 4096
#: a classic DNS message over UDP
CLASSIC_UDP = 512
_QR = 0x8000
_TC = 0x0200


def _header_reply(wire: bytes, rcode: int) -> bytes | None:
    """A bare reply (no sections) to a query's header, or None for a packet
    that is too short or is itself a response."""
    if len(wire) < 12:
        return None
    ident, flags = struct.unpack("!HH", wire[:4])
    if flags & _QR:
        return None
    opcode_bits = flags & 0x7800
    rd = flags & 0x0100
    return struct.pack("!HHHHHH", ident, _QR | opcode_bits | rd | 0x0080 | (rcode & 0xF), 0, 0, 0, 0)


#: the query types counted by name (others: "other"), as CoreDNS's metrics do
_COUNTED_TYPES = frozenset(dns.rdatatype.from_text(t) for t in (
    "A", "AAAA", "CNAME", "MX", "NS", "PTR", "SOA", "SRV", "TXT", "ANY", "HTTPS", "SVCB", "CAA", "DS", "DNSKEY",
    "NAPTR", "AXFR", "IXFR"))


#: the header's rcode values (4 bits) as text
_RCODE_TEXT = tuple(dns.rcode.to_text(i) for i in range(16))


def _type_label(query: dns.message.Message) -> str:
    if len(query.question) != 1 or query.question[0].rdtype not in _COUNTED_TYPES:
        return "other"
    return dns.rdatatype.to_text(query.question[0].rdtype)


class Forwarder:
    """Asks the upstream resolvers (``(host, port)`` pairs) in turn: over UDP,
    again over TCP when the answer is truncated; ``timeout`` seconds per
    upstream."""

    def __init__(self, servers: list[tuple[str, int]], *, timeout: float = 2.0) -> None:
        self.servers = list(servers)
        self.timeout = timeout
        self._next = 0

    async def query(self, wire: bytes) -> bytes | None:
        """The upstream's answer to ``wire`` (its ID kept), or None when none answered."""
        if not self.servers or len(wire) < 12:
            return None
        ident = wire[:2]
        ours = struct.pack("!H", random.getrandbits(16))
        wire = ours + wire[2:]
        start = self._next % len(self.servers)
        self._next += 1
        for i in range(len(self.servers)):
            server = self.servers[(start + i) % len(self.servers)]
            try:
                reply = await asyncio.wait_for(self._udp(server, wire), self.timeout)
                if struct.unpack("!H", reply[2:4])[0] & _TC:
                    reply = await asyncio.wait_for(self._tcp(server, wire), self.timeout)
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as err:
                log.debug("upstream %s:%d: %r", server[0], server[1], err)
                continue
            return ident + reply[2:]
        return None

    async def _udp(self, server: tuple[str, int], wire: bytes) -> bytes:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bytes] = loop.create_future()
        ident = wire[:2]

        class _One(asyncio.DatagramProtocol):
            def datagram_received(self, data: bytes, addr: Any) -> None:
                if len(data) >= 12 and data[:2] == ident and data[2] & 0x80 and not fut.done():
                    fut.set_result(data)

            def error_received(self, exc: Exception) -> None:
                if not fut.done():
                    fut.set_exception(exc)

        transport, _ = await loop.create_datagram_endpoint(_One, remote_addr=server)
        try:
            transport.sendto(wire)
            return await fut
        finally:
            transport.close()

    async def _tcp(self, server: tuple[str, int], wire: bytes) -> bytes:
        reader, writer = await asyncio.open_connection(*server)
        try:
            writer.write(struct.pack("!H", len(wire)) + wire)
            await writer.drain()
            while True:
                (n,) = struct.unpack("!H", await reader.readexactly(2))
                data = await reader.readexactly(n)
                if len(data) >= 12 and data[:2] == wire[:2]:
                    return data
        finally:
            writer.close()


class _UDP(asyncio.DatagramProtocol):
    def __init__(self, server: "DNSServer") -> None:
        self.server = server
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: Any) -> None:
        out = self.server.answer_now(data, udp=True)
        if isinstance(out, bytes):
            if self.transport is not None:
                self.transport.sendto(out, addr)
        elif out is not None:
            self.server.spawn(self._later(out, addr))

    async def _later(self, pending: Any, addr: Any) -> None:
        out = await self.server.finish(pending)
        if out is not None and self.transport is not None:
            self.transport.sendto(out, addr)

    def error_received(self, exc: Exception) -> None:
        log.debug("UDP: %r", exc)


class _Pending:
    """A question that needs the upstreams: forwarded whole, or an
    ExternalName answer whose target's records are looked up."""

    __slots__ = ("query", "wire", "answer", "max_size", "udp", "qtype")

    def __init__(self, query: dns.message.Message, wire: bytes, answer: Answer | None, max_size: int) -> None:
        self.query = query
        self.wire = wire
        self.answer = answer
        self.max_size = max_size
        self.udp = True
        self.qtype = "other"


class DNSServer:
    """Serves ``records`` on ``host:port`` (UDP and TCP; port 0: a free one),
    forwarding other names through ``forwarder`` (None: they are SERVFAIL)."""

    def __init__(self, records: ClusterRecords, host: str = "127.0.0.1", port: int = 0, *,
                 forwarder: Forwarder | None = None, max_tcp: int = 128, tcp_idle_timeout: float = 10.0,
                 max_forwards: int = 256, cache_size: int = 10000) -> None:
        self.records = records
        self.host = host
        self.port = port
        self.forwarder = forwarder
        self.max_tcp = max_tcp
        self.tcp_idle_timeout = tcp_idle_timeout
        self.max_forwards = max_forwards
        self.cache_size = cache_size
        self._udp_transport: asyncio.DatagramTransport | None = None
        self._tcp_server: asyncio.AbstractServer | None = None
        self._tcp_writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._forwarding = 0
        #: (question bytes after the ID, UDP?) -> (answer after the ID, dependency, its state)
        self._cache: dict[tuple[bytes, int], tuple[bytes, str | None, Any]] = {}
        #: counters by outcome, for metrics and tests
        self.stats: dict[str, int] = {"queries": 0, "forwarded": 0, "dropped": 0, "formerr": 0, "servfail": 0,
                                      "truncated": 0, "tcp_refused": 0, "cache_hits": 0, "cache_misses": 0}
        #: answered requests by (protocol, query type) and responses by rcode (see :mod:`kubeplane.dns.metrics`)
        self.requests: collections.Counter[tuple[str, str]] = collections.Counter()
        self.responses: collections.Counter[str] = collections.Counter()

    # -- lifecycle

    async def start(self) -> None:
        """Bind UDP, then TCP on the same port; a busy address fails with a
        one-line :class:`~kubeplane.startup.StartupError`."""
        from kubeplane.startup import StartupError, listen_error

        loop = asyncio.get_running_loop()
        for attempt in range(20):
            try:
                transport, _ = await loop.create_datagram_endpoint(lambda: _UDP(self),
                                                                   local_addr=(self.host, self.port))
            except OSError as exc:
                raise StartupError(listen_error(self.host, self.port, exc).replace("listen tcp", "listen udp",
                                                                                   1)) from None
            port = transport.get_extra_info("sockname")[1]
            try:
                self._tcp_server = await asyncio.start_server(self._tcp_client, self.host, port, backlog=128,
                                                              reuse_address=True)
            except OSError as exc:
                transport.close()
                if self.port != 0 or attempt == 19:
                    raise StartupError(listen_error(self.host, port, exc)) from None
                continue  # the free UDP port is taken for TCP: try another
            self._udp_transport = transport  # type: ignore[assignment]
            self.port = port
            break
        log.info("DNS server listening on %s:%d (UDP and TCP), zone %s", self.host, self.port,
                 self.records.zone_text)

    async def stop(self) -> None:
        if self._udp_transport is not None:
            self._udp_transport.close()
            self._udp_transport = None
        if self._tcp_server is not None:
            self._tcp_server.close()
        for w in list(self._tcp_writers):
            w.close()
        await cancel_and_wait(list(self._tasks), "DNS server task")
        if self._tcp_server is not None:
            await self._tcp_server.wait_closed()
            self._tcp_server = None

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- one message

    async def handle(self, wire: bytes, *, udp: bool) -> bytes | None:
        """The answer to one message (None: nothing is sent back)."""
        out = self.answer_now(wire, udp=udp)
        if isinstance(out, _Pending):
            return await self.finish(out)
        return out

    def answer_now(self, wire: bytes, *, udp: bool) -> bytes | _Pending | None:
        """The answer when it needs no upstream; else what :meth:`finish` completes."""
        self.stats["queries"] += 1
        key = (wire[2:], 1 if udp else 0)
        hit = self._cache.get(key)
        if hit is not None:
            if self._fresh(hit[1], hit[2]):
                self.stats["cache_hits"] += 1
                out = wire[:2] + hit[0]
                self._count(udp, hit[3], out)
                return out
            del self._cache[key]
        self.stats["cache_misses"] += 1
        try:
            query = dns.message.from_wire(wire)
        except dns.message.ShortHeader:
            self.stats["dropped"] += 1
            return None
        except Exception:  # noqa: BLE001 - any parse failure: FORMERR (or drop)
            reply = _header_reply(wire, dns.rcode.FORMERR)
            self.stats["formerr" if reply else "dropped"] += 1
            return reply
        if query.flags & dns.flags.QR:
            self.stats["dropped"] += 1
            return None
        max_size = 65535
        if udp:
            max_size = max(CLASSIC_UDP, min(query.payload, MAX_UDP_PAYLOAD)) if query.edns >= 0 else CLASSIC_UDP
        qtype = _type_label(query)
        try:
            result = self._answer(query, wire, max_size)
        except Exception:  # noqa: BLE001 - a failing question must not stop the server
            log.exception("answering %s failed", query.question)
            self.stats["servfail"] += 1
            out = self._render(self._reply(query, dns.rcode.SERVFAIL), max_size)
            self._count(udp, qtype, out)
            return out
        if isinstance(result, tuple):
            out, dep = result
            if self.cache_size > 0:
                if len(self._cache) >= self.cache_size:
                    self._cache.clear()
                self._cache[key] = (out[2:], dep, self._state(dep), qtype)
            self._count(udp, qtype, out)
            return out
        result.udp = udp
        result.qtype = qtype
        return result

    def _count(self, udp: bool, qtype: str, out: bytes) -> None:
        self.requests["udp" if udp else "tcp", qtype] += 1
        self.responses[_RCODE_TEXT[out[3] & 0x0F]] += 1

    def _state(self, dep: str | None) -> Any:
        """What a cached answer depends on, now (see :meth:`ClusterRecords.depends_on`)."""
        if dep is None:
            return self.records.version()
        return (self.records.namespaces_version(), self.records.depends_on(dep))

    def _fresh(self, dep: str | None, state: Any) -> bool:
        if dep is None:
            return state == self.records.version()
        ns_version, objs = state
        if ns_version != self.records.namespaces_version():
            return False
        now = self.records.depends_on(dep)
        return len(now) == len(objs) and all(a is b for a, b in zip(now, objs))

    def _reply(self, query: dns.message.Message, rcode: int) -> dns.message.Message:
        resp = dns.message.make_response(query, recursion_available=True, our_payload=OUR_PAYLOAD)
        resp.set_rcode(rcode)
        return resp

    def _render(self, resp: dns.message.Message, max_size: int) -> bytes:
        wire = resp.to_wire(max_size=max_size, prefer_truncation=True)
        if resp.flags & dns.flags.TC or struct.unpack("!H", wire[2:4])[0] & _TC:
            self.stats["truncated"] += 1
        return wire

    def _answer(self, query: dns.message.Message, wire: bytes, max_size: int) -> tuple[bytes, str | None] | _Pending:
        if query.opcode() != dns.opcode.QUERY:
            return self._render(self._reply(query, dns.rcode.NOTIMP), max_size), None
        if query.edns > 0:
            return self._render(self._reply(query, dns.rcode.BADVERS), max_size), None
        if len(query.question) != 1:
            self.stats["formerr"] += 1
            return self._render(self._reply(query, dns.rcode.FORMERR), max_size), None
        q = query.question[0]
        in_zone = self.records.in_zone(q.name)
        if in_zone and (q.rdclass != dns.rdataclass.IN or q.rdtype in (dns.rdatatype.AXFR, dns.rdatatype.IXFR)):
            return self._render(self._reply(query, dns.rcode.REFUSED), max_size), None
        answer = self.records.resolve(q.name, q.rdtype) if q.rdclass == dns.rdataclass.IN else None
        if answer is None:
            return _Pending(query, wire, None, max_size)
        if answer.chase is not None:
            return _Pending(query, wire, answer, max_size)
        return self._render(self._local(query, answer), max_size), answer.dep

    def _local(self, query: dns.message.Message, answer: Answer) -> dns.message.Message:
        resp = self._reply(query, answer.rcode)
        resp.flags |= dns.flags.AA
        resp.answer = list(answer.answer)
        resp.authority = list(answer.authority)
        resp.additional = list(answer.additional)
        return resp

    async def finish(self, pending: _Pending) -> bytes | None:
        """Completes a question through the upstreams."""
        out = await self._finish(pending)
        if out is not None:
            self._count(pending.udp, pending.qtype, out)
        return out

    async def _finish(self, pending: _Pending) -> bytes | None:
        if self.forwarder is None or self._forwarding >= self.max_forwards:
            if pending.answer is not None:  # an ExternalName's CNAME is still the answer
                return self._render(self._local(pending.query, pending.answer), pending.max_size)
            return self._servfail(pending)
        self._forwarding += 1
        try:
            if pending.answer is None:
                self.stats["forwarded"] += 1
                reply = await self.forwarder.query(pending.wire)
                if reply is None:
                    return self._servfail(pending)
                if len(reply) > pending.max_size:
                    try:
                        msg = dns.message.from_wire(reply)
                    except Exception:  # noqa: BLE001 - an upstream's garbage is SERVFAIL
                        return self._servfail(pending)
                    return self._render(msg, pending.max_size)
                return reply
            return await self._chase(pending)
        finally:
            self._forwarding -= 1

    async def _chase(self, pending: _Pending) -> bytes:
        answer = pending.answer
        assert answer is not None and answer.chase is not None
        q = pending.query.question[0]
        sub = dns.message.make_query(answer.chase, q.rdtype)
        reply = await self.forwarder.query(sub.to_wire()) if self.forwarder is not None else None
        resp = self._local(pending.query, answer)
        if reply is not None:
            try:
                got = dns.message.from_wire(reply)
                if got.rcode() == dns.rcode.NOERROR:
                    resp.answer += got.answer
            except Exception:  # noqa: BLE001 - the CNAME alone is still the answer
                pass
        return self._render(resp, pending.max_size)

    def _servfail(self, pending: _Pending) -> bytes:
        self.stats["servfail"] += 1
        return self._render(self._reply(pending.query, dns.rcode.SERVFAIL), pending.max_size)

    # -- TCP

    async def _tcp_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._tcp_writers) >= self.max_tcp:
            self.stats["tcp_refused"] += 1
            writer.close()
            return
        self._tcp_writers.add(writer)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            while True:
                head = await asyncio.wait_for(reader.readexactly(2), self.tcp_idle_timeout)
                (n,) = struct.unpack("!H", head)
                data = await asyncio.wait_for(reader.readexactly(n), self.tcp_idle_timeout)
                out = await self.handle(data, udp=False)
                if out is None:
                    break
                writer.write(struct.pack("!H", len(out)) + out)
                await asyncio.wait_for(writer.drain(), self.tcp_idle_timeout)
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError):
            pass
        except asyncio.CancelledError:
            # stopping: the connection task ends here (asyncio's stream callback
            # would log a cancelled connection task as an error)
            pass
        finally:
            self._tcp_writers.discard(writer)
            if task is not None:
                self._tasks.discard(task)
            writer.close()
