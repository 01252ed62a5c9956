"""The DNS component (kubeplane.dns.component) over the in-process client."""

from __future__ import annotations

import socket

import dns.asyncquery
import dns.message
import dns.rcode
import pytest

from kubeplane.api.resources import resource
from kubeplane.dns.component import ClusterDNS, DNSConfig
from kubeplane.startup import StartupError

from fake_dns import service
from helpers import eventually


async def test_serves_and_stops(inprocess_client, tmp_path):
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("")
    comp = ClusterDNS(inprocess_client, DNSConfig(listen="127.0.0.1:0", resolv_conf=str(resolv)))
    await comp.start()
    try:
        await inprocess_client.create(resource("services"), service("web", "default", ip="10.96.0.33"), "default")

        async def answered():
            q = dns.message.make_query("web.default.svc.cluster.local", "A")
            r = await dns.asyncquery.udp(q, "127.0.0.1", port=comp.port, timeout=2)
            return r.rcode() == dns.rcode.NOERROR and r.answer

        await eventually(answered, what="the new Service's A record")
        # no nameserver in resolv.conf: other names are SERVFAIL
        q = dns.message.make_query("example.org", "A")
        r = await dns.asyncquery.udp(q, "127.0.0.1", port=comp.port, timeout=2)
        assert r.rcode() == dns.rcode.SERVFAIL
        assert (await inprocess_client.get(resource("services"), "kube-dns", "kube-system"))["spec"]["clusterIP"] \
            == "10.96.0.10"
    finally:
        await comp.stop()
    assert not any(inf.started for inf in comp.factory.informers)


async def test_a_busy_address_fails_and_cleans_up(inprocess_client):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        comp = ClusterDNS(inprocess_client, DNSConfig(listen=f"127.0.0.1:{port}", resolv_conf="/nonexistent"))
        with pytest.raises(StartupError, match=f"listen tcp 127.0.0.1:{port}: bind: address already in use"):
            await comp.start()
    assert comp.server is None and not any(inf.started for inf in comp.factory.informers)


def test_a_resolv_conf_naming_the_server_itself_is_no_upstream():
    from kubeplane.dns.component import _is_self

    class S:
        host, port = "127.0.0.1", 53

    assert _is_self("127.0.0.1", 53, S) and not _is_self("127.0.0.1", 5353, S) and not _is_self("192.0.2.1", 53, S)
    S.host = "0.0.0.0"
    assert _is_self("127.0.0.53", 53, S) and not _is_self("192.0.2.1", 53, S)
