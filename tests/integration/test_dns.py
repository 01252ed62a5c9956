"""Cluster DNS against a real API server: the DNS component (as ``kubeplane
dns`` runs it: over HTTPS with a kubeconfig) on 127.0.0.1, Services,
EndpointSlices (the endpoint slice controller's and hand-made ones), a
StatefulSet's pods, and a fake upstream resolver on 127.0.0.1, queried with
dnspython over UDP and TCP."""

from __future__ import annotations

import asyncio

import dns.asyncquery
import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype as T
import dns.reversename
import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import resource
from kubeplane.client.http import HttpClient
from kubeplane.dns.component import ClusterDNS, DNSConfig
from kubeplane.testing import Cluster

from fake_dns import FakeUpstream, endpoint, endpoint_slice
from helpers import eventually

NS = "dns-test"
ZONE = "cluster.local"

MANIFESTS = [
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": NS},
     "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080},
                                                    {"name": "dns", "port": 53, "protocol": "UDP"}]}},
    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "db", "namespace": NS},
     "spec": {"clusterIP": "None", "selector": {"app": "db"}, "ports": [{"name": "pg", "port": 5432}]}},
    {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db", "namespace": NS},
     "spec": {"serviceName": "db", "replicas": 2, "selector": {"matchLabels": {"app": "db"}},
              "template": {"metadata": {"labels": {"app": "db"}},
                           "spec": {"containers": [{"name": "pg", "image": "postgres:16",
                                                    "ports": [{"name": "pg", "containerPort": 5432}]}]}}}},
    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ext", "namespace": NS},
     "spec": {"type": "ExternalName", "externalName": "www.example.org"}},
    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "many", "namespace": NS},
     "spec": {"clusterIP": "None", "ports": [{"name": "http", "port": 80}]}},
]


@pytest.fixture
async def cluster():
    async with Cluster(scheduler=True, controllers=True, nodes=1) as c:
        yield c


@pytest.fixture
async def upstream():
    async with FakeUpstream({("www.example.org.", "A"): ["192.0.2.80"],
                             ("outside.example.net.", "A"): ["192.0.2.81"]}) as fake:
        yield fake


@pytest.fixture
async def client(cluster):
    http = HttpClient.from_kubeconfig(cluster.kubeconfig)
    yield http
    await http.close()


@pytest.fixture
async def dns_server(cluster, client, upstream, tmp_path):
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("search example.net\nnameserver 127.0.0.1\n")
    component = ClusterDNS(client, DNSConfig(listen="127.0.0.1:0", resolv_conf=str(resolv),
                                             upstream_port=upstream.port, forward_timeout=1.0,
                                             advertise_address="192.0.2.53", service_interval=0.2,
                                             metrics_listen="127.0.0.1:0"))
    await component.start()
    yield component
    await component.stop()


async def ask(server, name, qtype=T.A, *, tcp=False, **kw):
    q = dns.message.make_query(name, qtype, **kw)
    if tcp:
        return await dns.asyncquery.tcp(q, "127.0.0.1", port=server.port, timeout=3)
    return await dns.asyncquery.udp(q, "127.0.0.1", port=server.port, timeout=3)


def texts(resp, rdtype=None):
    return sorted(rd.to_text() for rr in resp.answer if rdtype is None or rr.rdtype == rdtype for rd in rr)


async def test_cluster_dns_end_to_end(cluster, client, dns_server, upstream):
    await cluster.apply_async(MANIFESTS)
    web = await client.get(resource("services"), "web", NS)
    web_ip = web["spec"]["clusterIP"]

    # a ClusterIP Service: A, SRV of its named ports, PTR of its address
    r = await eventually(lambda: _answered(dns_server, f"web.{NS}.svc.{ZONE}"), what="web's A record")
    assert texts(r) == [web_ip] and r.answer[0].ttl == 5 and r.flags & dns.flags.AA
    srv = await ask(dns_server, f"_http._tcp.web.{NS}.svc.{ZONE}", T.SRV)
    assert texts(srv) == [f"0 100 80 web.{NS}.svc.{ZONE}."]
    assert [rd.to_text() for rd in srv.additional[0]] == [web_ip]
    assert texts(await ask(dns_server, f"_dns._udp.web.{NS}.svc.{ZONE}", T.SRV)) == [f"0 100 53 web.{NS}.svc.{ZONE}."]
    ptr = await ask(dns_server, dns.reversename.from_address(web_ip), T.PTR)
    assert texts(ptr) == [f"web.{NS}.svc.{ZONE}."]
    # NODATA (the name exists) and NXDOMAIN (it does not), both with the SOA
    nodata = await ask(dns_server, f"web.{NS}.svc.{ZONE}", T.AAAA)
    assert nodata.rcode() == dns.rcode.NOERROR and not nodata.answer and nodata.authority[0].rdtype == T.SOA
    nx = await ask(dns_server, f"nope.{NS}.svc.{ZONE}")
    assert nx.rcode() == dns.rcode.NXDOMAIN and nx.authority[0].rdtype == T.SOA
    assert (await ask(dns_server, f"web.no-such-ns.svc.{ZONE}")).rcode() == dns.rcode.NXDOMAIN
    assert texts(await ask(dns_server, f"dns-version.{ZONE}", T.TXT)) == ['"1.1.0"']

    # the StatefulSet's pods behind the headless Service: <hostname>.<subdomain> records
    pods = await eventually(lambda: _ready_pods(client), timeout=30, what="db-0 and db-1 running")
    ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods}
    r = await eventually(lambda: _answered(dns_server, f"db.{NS}.svc.{ZONE}", count=2), timeout=15,
                         what="both db endpoints")
    assert texts(r) == sorted(ips.values())
    for name, ip in ips.items():
        assert texts(await ask(dns_server, f"{name}.db.{NS}.svc.{ZONE}")) == [ip]
        assert texts(await ask(dns_server, dns.reversename.from_address(ip), T.PTR)) == [f"{name}.db.{NS}.svc.{ZONE}."]
    srv = await ask(dns_server, f"_pg._tcp.db.{NS}.svc.{ZONE}", T.SRV)
    assert texts(srv) == [f"0 50 5432 db-0.db.{NS}.svc.{ZONE}.", f"0 50 5432 db-1.db.{NS}.svc.{ZONE}."]
    # a pod record
    dashed = ips["db-0"].replace(".", "-")
    assert texts(await ask(dns_server, f"{dashed}.{NS}.pod.{ZONE}")) == [ips["db-0"]]

    # an ExternalName Service: a CNAME, followed upstream
    r = await ask(dns_server, f"ext.{NS}.svc.{ZONE}")
    assert texts(r, T.CNAME) == ["www.example.org."] and texts(r, T.A) == ["192.0.2.80"]

    # names outside the cluster go to the resolv.conf's nameserver
    r = await ask(dns_server, "outside.example.net")
    assert texts(r) == ["192.0.2.81"] and ("outside.example.net.", "A", "udp") in upstream.questions
    assert (await ask(dns_server, "missing.example.net")).rcode() == dns.rcode.NXDOMAIN

    # a large headless answer: truncated over UDP, whole over TCP
    await client.create(resource("endpointslices"), endpoint_slice(
        "many-1", "many", NS, endpoints=[endpoint(f"10.244.3.{i}") for i in range(1, 81)],
        ports=(("http", 80, "TCP"),)), NS)
    await eventually(lambda: _answered(dns_server, f"many.{NS}.svc.{ZONE}", tcp=True, count=80))
    udp = await ask(dns_server, f"many.{NS}.svc.{ZONE}")
    assert udp.flags & dns.flags.TC and len(texts(udp)) < 80
    tcp = await ask(dns_server, f"many.{NS}.svc.{ZONE}", tcp=True)
    assert not tcp.flags & dns.flags.TC and len(texts(tcp)) == 80


async def test_changes_are_served_within_a_second(cluster, client, dns_server):
    await cluster.apply_async(MANIFESTS[0])
    loop = asyncio.get_running_loop()
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "late", "namespace": NS},
           "spec": {"ports": [{"name": "http", "port": 80}]}}
    created = await client.create(resource("services"), svc, NS)
    t0 = loop.time()
    r = await eventually(lambda: _answered(dns_server, f"late.{NS}.svc.{ZONE}"), timeout=1.0,
                         what="the new Service within a second")
    assert texts(r) == [created["spec"]["clusterIP"]] and loop.time() - t0 < 1.0
    await client.delete(resource("services"), "late", NS)
    t0 = loop.time()

    async def gone():
        return (await ask(dns_server, f"late.{NS}.svc.{ZONE}")).rcode() == dns.rcode.NXDOMAIN

    await eventually(gone, timeout=1.0, what="the deleted Service gone within a second")
    assert loop.time() - t0 < 1.0


async def test_kube_dns_service_is_kept(cluster, client, dns_server):
    svc = await client.get(resource("services"), "kube-dns", "kube-system")
    assert svc["spec"]["clusterIP"] == "10.96.0.10"
    metrics_port = int(dns_server.metrics.url.rsplit(":", 1)[1])
    assert [(p["name"], p["port"], p["protocol"], p["targetPort"]) for p in svc["spec"]["ports"]] == [
        ("dns", 53, "UDP", dns_server.port), ("dns-tcp", 53, "TCP", dns_server.port),
        ("metrics", 9153, "TCP", metrics_port)]
    assert svc["metadata"]["labels"]["k8s-app"] == "kube-dns" and "selector" not in svc["spec"]
    assert svc["metadata"]["annotations"] == {"prometheus.io/port": "9153", "prometheus.io/scrape": "true"}
    es = await client.get(resource("endpointslices"), "kube-dns", "kube-system")
    assert es["endpoints"][0]["addresses"] == ["192.0.2.53"]
    assert {(p["name"], p["port"], p["protocol"]) for p in es["ports"]} == {
        ("dns", dns_server.port, "UDP"), ("dns-tcp", dns_server.port, "TCP"), ("metrics", metrics_port, "TCP")}
    # the kube-dns Service answers for itself, and ns.dns.<zone> is its address
    assert texts(await ask(dns_server, f"kube-dns.kube-system.svc.{ZONE}")) == ["10.96.0.10"]
    assert texts(await ask(dns_server, f"ns.dns.{ZONE}")) == ["10.96.0.10"]
    # deleted, the EndpointSlice is put back
    await client.delete(resource("endpointslices"), "kube-dns", "kube-system")

    async def back():
        try:
            return await client.get(resource("endpointslices"), "kube-dns", "kube-system")
        except StatusError as err:
            assert err.code == 404
            return None

    assert (await eventually(back, what="the kube-dns EndpointSlice back"))["endpoints"][0]["addresses"] == \
        ["192.0.2.53"]


async def test_metrics(cluster, dns_server):
    import aiohttp

    await ask(dns_server, f"kubernetes.default.svc.{ZONE}")
    await ask(dns_server, f"kubernetes.default.svc.{ZONE}")
    await ask(dns_server, f"nope.default.svc.{ZONE}", T.AAAA, tcp=True)
    async with aiohttp.ClientSession() as session:
        async with session.get(dns_server.metrics.url + "/metrics") as resp:
            text = await resp.text()
        async with session.get(dns_server.metrics.url + "/healthz") as resp:
            assert resp.status == 200
    server = f'server="dns://127.0.0.1:{dns_server.port}"'
    assert f'coredns_dns_requests_total{{family="1",proto="udp",{server},type="A",zone="."}} 2.0' in text, text
    assert f'coredns_dns_requests_total{{family="1",proto="tcp",{server},type="AAAA",zone="."}} 1.0' in text
    assert f'coredns_dns_responses_total{{rcode="NXDOMAIN",{server},zone="."}} 1.0' in text
    assert f'coredns_cache_hits_total{{{server},type="success"}} 1.0' in text


async def _answered(server, name, *, tcp=False, count=1):
    r = await ask(server, name, tcp=tcp)
    return r if r.rcode() == dns.rcode.NOERROR and len(texts(r)) >= count else None


async def _ready_pods(client):
    pods = (await client.list(resource("pods"), NS, label_selector="app=db"))["items"]
    ready = [p for p in pods if (p.get("status") or {}).get("podIP") and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in p["status"].get("conditions") or [])]
    return ready if len(ready) == 2 else None
