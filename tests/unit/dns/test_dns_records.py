"""The cluster domain's records (kubeplane.dns.records) from stores filled by hand."""

from __future__ import annotations

import dns.name
import dns.rcode
import dns.rdatatype as T
import dns.reversename
import pytest

from kubeplane.client.informer import Indexer
from kubeplane.dns import records as rec
from kubeplane.dns.records import ClusterRecords

from fake_dns import endpoint as ep, endpoint_slice as eslice, service as svc


def ns(name):
    return {"metadata": {"name": name}}


@pytest.fixture
def stores():
    services, slices, namespaces, pods = Indexer(), Indexer(), Indexer(), Indexer()
    for n in ("app", "default", "kube-system"):
        namespaces.add(ns(n))
    services.add(svc("web"))
    services.add(svc("v6", ip="fd00:10:96::20"))
    services.add(svc("db", ip="None", ports=(("pg", 5432, "TCP"),)))
    slices.add(eslice("db-abc", "db", ports=(("pg", 5432, "TCP"),), endpoints=[
        ep("10.42.0.5", "db-0"), ep("10.42.0.6", "db-1"), ep("10.42.0.7", ready=False), ep("10.42.0.8")]))
    services.add(svc("ext", type_="ExternalName", ip=None, externalName="example.org"))
    services.add(svc("alias", type_="ExternalName", ip=None, externalName="web.app.svc.cluster.local"))
    services.add(svc("empty", ip="None"))
    slices.add(eslice("web-xyz", "web", endpoints=[ep("10.42.0.9")]))
    return services, slices, namespaces, pods


def q(r: ClusterRecords, name: str, qtype=T.A):
    return r.resolve(dns.name.from_text(name), qtype)


def values(answer, rdtype=None):
    return sorted(rd.to_text() for rr in answer.answer if rdtype is None or rr.rdtype == rdtype for rd in rr)


def test_cluster_ip_service(stores):
    r = ClusterRecords(*stores[:2], namespaces=stores[2])
    a = q(r, "web.app.svc.cluster.local.")
    assert a.rcode == dns.rcode.NOERROR and values(a) == ["10.96.0.20"]
    assert a.answer[0].ttl == 5 and a.answer[0].name == dns.name.from_text("web.app.svc.cluster.local.")
    # names are case-insensitive
    assert values(q(r, "WEB.App.SVC.cluster.LOCAL.")) == ["10.96.0.20"]
    # NODATA: the name exists, no AAAA; SOA in the authority section
    nodata = q(r, "web.app.svc.cluster.local.", T.AAAA)
    assert nodata.rcode == dns.rcode.NOERROR and not nodata.answer
    soa = nodata.authority[0]
    assert soa.rdtype == T.SOA and soa.name == dns.name.from_text("cluster.local.")
    assert soa[0].mname.to_text() == "ns.dns.cluster.local." and soa[0].minimum == 5
    six = q(r, "v6.app.svc.cluster.local.", T.AAAA)
    assert values(six) == ["fd00:10:96::20"]
    assert not q(r, "v6.app.svc.cluster.local.", T.A).answer


def test_nxdomain(stores):
    r = ClusterRecords(*stores[:2], namespaces=stores[2])
    for name in ("nope.app.svc.cluster.local.", "web.nons.svc.cluster.local.", "x.cluster.local.",
                 "a.b.c.web.app.svc.cluster.local.", "nobody.web.app.svc.cluster.local."):
        a = q(r, name)
        assert a.rcode == dns.rcode.NXDOMAIN, name
        assert a.authority[0].rdtype == T.SOA
    # names that exist without records: NODATA
    for name in ("cluster.local.", "svc.cluster.local.", "app.svc.cluster.local.", "app.pod.cluster.local."):
        a = q(r, name)
        assert a.rcode == dns.rcode.NOERROR and not a.answer, name
    # a headless Service without ready endpoints has no name (CoreDNS)
    assert q(r, "empty.app.svc.cluster.local.").rcode == dns.rcode.NXDOMAIN


def test_headless_service_and_endpoint_names(stores):
    r = ClusterRecords(*stores[:2], namespaces=stores[2])
    # every ready endpoint, the unready one left out
    assert values(q(r, "db.app.svc.cluster.local.")) == ["10.42.0.5", "10.42.0.6", "10.42.0.8"]
    assert values(q(r, "db-0.db.app.svc.cluster.local.")) == ["10.42.0.5"]
    # an endpoint without hostname is named by its address
    assert values(q(r, "10-42-0-8.db.app.svc.cluster.local.")) == ["10.42.0.8"]
    assert q(r, "10-42-0-7.db.app.svc.cluster.local.").rcode == dns.rcode.NXDOMAIN
    # endpoint names of a ClusterIP Service
    assert values(q(r, "10-42-0-9.web.app.svc.cluster.local.")) == ["10.42.0.9"]
    srv = q(r, "_pg._tcp.db.app.svc.cluster.local.", T.SRV)
    assert values(srv) == ["0 33 5432 10-42-0-8.db.app.svc.cluster.local.",
                           "0 33 5432 db-0.db.app.svc.cluster.local.",
                           "0 33 5432 db-1.db.app.svc.cluster.local."]
    extra = {rr.name.to_text(): [rd.to_text() for rd in rr] for rr in srv.additional}
    assert extra["db-0.db.app.svc.cluster.local."] == ["10.42.0.5"]
    # publishNotReadyAddresses: the unready one too
    services = stores[0]
    services.add(svc("db", ip="None", ports=(("pg", 5432, "TCP"),), publishNotReadyAddresses=True))
    assert "10.42.0.7" in values(q(r, "db.app.svc.cluster.local."))


def test_srv_of_named_ports(stores):
    r = ClusterRecords(*stores[:2], namespaces=stores[2])
    stores[0].add(svc("multi", ip="10.96.0.30", ports=(("http", 80, "TCP"), ("dns", 53, "UDP"), ("", 99, "TCP"))))
    a = q(r, "_http._tcp.multi.app.svc.cluster.local.", T.SRV)
    assert values(a) == ["0 100 80 multi.app.svc.cluster.local."]
    assert [rd.to_text() for rd in a.additional[0]] == ["10.96.0.30"]
    assert values(q(r, "_dns._udp.multi.app.svc.cluster.local.", T.SRV)) == ["0 100 53 multi.app.svc.cluster.local."]
    # the wrong protocol, or a port that has no such name: no such name
    assert q(r, "_dns._tcp.multi.app.svc.cluster.local.", T.SRV).rcode == dns.rcode.NXDOMAIN
    assert q(r, "_https._tcp.multi.app.svc.cluster.local.", T.SRV).rcode == dns.rcode.NXDOMAIN
    # the port name's A record is the Service's address
    assert values(q(r, "_http._tcp.multi.app.svc.cluster.local.")) == ["10.96.0.30"]
    # SRV of the Service's own name: every port
    assert len(values(q(r, "multi.app.svc.cluster.local.", T.SRV))) == 3


def test_external_name(stores):
    r = ClusterRecords(*stores[:2], namespaces=stores[2])
    a = q(r, "ext.app.svc.cluster.local.")
    assert values(a) == ["example.org."] and a.answer[0].rdtype == T.CNAME
    assert a.chase == dns.name.from_text("example.org.")
    assert q(r, "ext.app.svc.cluster.local.", T.CNAME).chase is None
    # an in-cluster target is followed
    inner = q(r, "alias.app.svc.cluster.local.")
    assert values(inner, T.CNAME) == ["web.app.svc.cluster.local."] and values(inner, T.A) == ["10.96.0.20"]
    assert inner.chase is None


def test_pods_insecure_verified_disabled(stores):
    services, slices, namespaces, pods = stores
    r = ClusterRecords(services, slices, namespaces=namespaces)
    assert values(q(r, "10-42-0-77.app.pod.cluster.local.")) == ["10.42.0.77"]
    assert values(q(r, "fd00--7.app.pod.cluster.local.", T.AAAA)) == ["fd00::7"]
    assert q(r, "10-42-0-77.nons.pod.cluster.local.").rcode == dns.rcode.NXDOMAIN
    assert q(r, "not-an-ip.app.pod.cluster.local.").rcode == dns.rcode.NXDOMAIN
    verified = ClusterRecords(services, slices, namespaces=namespaces, pods=pods, pod_mode="verified")
    assert q(verified, "10-42-0-77.app.pod.cluster.local.").rcode == dns.rcode.NXDOMAIN
    pods.add({"metadata": {"name": "p", "namespace": "app"}, "status": {"podIP": "10.42.0.77",
                                                                        "podIPs": [{"ip": "10.42.0.77"}]}})
    assert values(q(verified, "10-42-0-77.app.pod.cluster.local.")) == ["10.42.0.77"]
    assert q(verified, "10-42-0-77.default.pod.cluster.local.").rcode == dns.rcode.NXDOMAIN
    disabled = ClusterRecords(services, slices, namespaces=namespaces, pod_mode="disabled")
    assert q(disabled, "10-42-0-77.app.pod.cluster.local.").rcode == dns.rcode.NXDOMAIN


def test_ptr_of_cluster_ips_and_endpoints(stores):
    r = ClusterRecords(*stores[:2], namespaces=stores[2])
    a = r.resolve(dns.reversename.from_address("10.96.0.20"), T.PTR)
    assert values(a) == ["web.app.svc.cluster.local."]
    a = r.resolve(dns.reversename.from_address("10.42.0.5"), T.PTR)
    assert values(a) == ["db-0.db.app.svc.cluster.local."]
    a = r.resolve(dns.reversename.from_address("fd00:10:96::20"), T.PTR)
    assert values(a) == ["v6.app.svc.cluster.local."]
    # unknown addresses and unready endpoints go upstream
    assert r.resolve(dns.reversename.from_address("10.42.0.7"), T.PTR) is None
    assert r.resolve(dns.reversename.from_address("192.0.2.1"), T.PTR) is None


def test_version_soa_ns_and_outside_names(stores):
    r = ClusterRecords(*stores[:2], namespaces=stores[2], dns_ips=["10.96.0.10"])
    assert values(q(r, "dns-version.cluster.local.", T.TXT)) == ['"1.1.0"']
    assert values(q(r, "cluster.local.", T.SOA))[0].startswith("ns.dns.cluster.local. hostmaster.cluster.local. ")
    ns_answer = q(r, "cluster.local.", T.NS)
    assert values(ns_answer) == ["ns.dns.cluster.local."]
    assert [rd.to_text() for rd in ns_answer.additional[0]] == ["10.96.0.10"]
    assert values(q(r, "ns.dns.cluster.local.")) == ["10.96.0.10"]
    assert q(r, "example.org.") is None
    # another cluster domain
    other = ClusterRecords(*stores[:2], namespaces=stores[2], zone="corp.internal")
    assert values(q(other, "web.app.svc.corp.internal.")) == ["10.96.0.20"]
    assert q(other, "web.app.svc.cluster.local.") is None


def test_changes_show_in_answers_and_serial(stores):
    services, slices, namespaces, _ = stores
    r = ClusterRecords(services, slices, namespaces=namespaces)
    v = r.version()
    services.add(svc("new", ip="10.96.0.40"))
    assert r.version() != v
    assert values(q(r, "new.app.svc.cluster.local.")) == ["10.96.0.40"]
    services.delete_key("app/new")
    assert q(r, "new.app.svc.cluster.local.").rcode == dns.rcode.NXDOMAIN
    # an endpoint that is no longer ready leaves the headless answer
    slices.add(eslice("db-abc", "db", ports=(("pg", 5432, "TCP"),), endpoints=[ep("10.42.0.5", "db-0", ready=False)]))
    assert q(r, "db-0.db.app.svc.cluster.local.").rcode == dns.rcode.NXDOMAIN


def test_answers_are_bounded(stores):
    services, slices, namespaces, _ = stores
    services.add(svc("big", ip="None"))
    slices.add(eslice("big-1", "big", endpoints=[ep(f"10.43.{i // 250}.{i % 250 + 1}")
                                                  for i in range(rec.MAX_ENDPOINTS + 500)]))
    r = ClusterRecords(services, slices, namespaces=namespaces)
    assert len(values(q(r, "big.app.svc.cluster.local."))) == rec.MAX_ENDPOINTS


def test_bad_pod_mode():
    with pytest.raises(ValueError):
        ClusterRecords(Indexer(), Indexer(), pod_mode="bogus")
    with pytest.raises(ValueError):
        ClusterRecords(Indexer(), Indexer(), pod_mode="verified")
