"""A fake upstream DNS server on 127.0.0.1 (UDP and TCP on one port) for the
forwarding tests: it answers the records it is given, NXDOMAIN otherwise, and
counts the questions it saw."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset


class FakeUpstream:
    def __init__(self, records: dict[tuple[str, str], list[str]] | None = None) -> None:
        #: (name with trailing dot, type) -> rdata texts
        self.records = dict(records or {})
        self.questions: list[tuple[str, str, str]] = []  # (name, type, transport)
        self.port = 0
        self._udp: Any = None
        self._tcp: asyncio.AbstractServer | None = None

    def answer(self, wire: bytes, transport: str) -> bytes:
        q = dns.message.from_wire(wire)
        question = q.question[0]
        name, rdtype = question.name.to_text().lower(), dns.rdatatype.to_text(question.rdtype)
        self.questions.append((name, rdtype, transport))
        resp = dns.message.make_response(q)
        texts = self.records.get((name, rdtype))
        if texts is None:
            resp.set_rcode(dns.rcode.NXDOMAIN)
        else:
            resp.answer.append(dns.rrset.from_text_list(question.name, 60, "IN", rdtype, texts))
        return resp.to_wire(max_size=512 if transport == "udp" else 65535, prefer_truncation=True)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        fake = self

        class _UDP(asyncio.DatagramProtocol):
            def connection_made(self, transport: Any) -> None:
                self.transport = transport

            def datagram_received(self, data: bytes, addr: Any) -> None:
                self.transport.sendto(fake.answer(data, "udp"), addr)

        async def tcp(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while True:
                    (n,) = struct.unpack("!H", await reader.readexactly(2))
                    out = fake.answer(await reader.readexactly(n), "tcp")
                    writer.write(struct.pack("!H", len(out)) + out)
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        for _ in range(20):
            transport, _ = await loop.create_datagram_endpoint(_UDP, local_addr=("127.0.0.1", 0))
            port = transport.get_extra_info("sockname")[1]
            try:
                self._tcp = await asyncio.start_server(tcp, "127.0.0.1", port)
            except OSError:
                transport.close()
                continue
            self._udp, self.port = transport, port
            return
        raise RuntimeError("no free port for the fake upstream")

    async def stop(self) -> None:
        if self._udp is not None:
            self._udp.close()
        if self._tcp is not None:
            self._tcp.close()
            await self._tcp.wait_closed()

    async def __aenter__(self) -> "FakeUpstream":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()


# -- objects the DNS tests serve


def service(name: str, ns: str = "app", *, ip: str | None = "10.96.0.20",
            ports: tuple[tuple[str, int, str], ...] = (("http", 80, "TCP"),), type_: str = "ClusterIP",
            **spec: Any) -> dict:
    """A Service (``ip="None"``: headless; ``ip=None``: no ClusterIP, as ExternalName)."""
    s: dict[str, Any] = {"type": type_, **spec}
    if ports:
        s["ports"] = [{"name": n, "port": p, "protocol": pr, **({} if n else {})} for n, p, pr in ports]
    if ip is not None:
        s["clusterIP"] = ip
        s["clusterIPs"] = [ip]
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns, "resourceVersion": "1"}, "spec": s}


def endpoint_slice(name: str, svc: str, ns: str = "app", *, endpoints: list[dict],
                   ports: tuple[tuple[str, int, str], ...] = (("http", 8080, "TCP"),),
                   family: str = "IPv4") -> dict:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": ns, "labels": {"kubernetes.io/service-name": svc}},
            "addressType": family, "endpoints": endpoints,
            "ports": [{"name": n, "port": p, "protocol": pr} for n, p, pr in ports]}


def endpoint(ip: str, hostname: str | None = None, ready: bool = True) -> dict:
    out: dict[str, Any] = {"addresses": [ip], "conditions": {"ready": ready}}
    if hostname:
        out["hostname"] = hostname
    return out
