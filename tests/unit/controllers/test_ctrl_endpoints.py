"""The Endpoints and EndpointSlice controllers against a real registry
(MemoryStore + InProcessClient + informers): which pods are listed, named
target ports resolved per pod, ready/serving/terminating, labels, owner,
slices of at most 100 endpoints, placeholders, Services without selectors
and Services that go away."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import format_time, utcnow
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.endpoints import EndpointsController, repack_subsets, truncate
from kubeplane.controllers.endpointslice import EndpointSliceController
from kubeplane.controllers.endpointsutil import TRIGGER_TIME_ANNOTATION
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore
from helpers import eventually, settled

PODS = resource("pods")
SVC = resource("services")
NODES = resource("nodes")
EP = resource("endpoints")
SLICES = resource("endpointslices")
NS = "default"


class Env:
    def __init__(self, client: InProcessClient, ep: EndpointsController, es: EndpointSliceController) -> None:
        self.client = client
        self.ep = ep
        self.es = es
        self._ip = 1

    async def node(self, name: str, zone: str | None = None) -> None:
        labels = {"kubernetes.io/hostname": name, **({"topology.kubernetes.io/zone": zone} if zone else {})}
        await self.client.create(NODES, {"metadata": {"name": name, "labels": labels}})

    async def pod(self, name: str, labels: dict[str, str], *, node: str = "n1", ready: bool = True,
                  ports: list[dict] | None = None, running: bool = True, **spec: Any) -> dict:
        body = {"metadata": {"name": name, "labels": labels},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "nginx:1", "ports": ports or []}],
                         **spec}}
        pod = await self.client.create(PODS, body, NS)
        if running:
            ip = f"10.244.0.{self._ip}"
            self._ip += 1
            now = format_time(utcnow())
            await self.client.patch(PODS, name, {"status": {
                "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                "lastTransitionTime": now}]}}, NS, subresource="status")
        return pod

    async def set_ready(self, name: str, ready: bool, *, after: float = 0) -> None:
        when = format_time(utcnow() + dt.timedelta(seconds=after))
        await self.client.patch(PODS, name, {"status": {"conditions": [
            {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": when}]}},
            NS, subresource="status")

    async def service(self, name: str, selector: dict[str, str] | None, ports: list[dict] | None = None,
                      **spec: Any) -> dict:
        body: dict = {"metadata": {"name": name, "labels": {"team": "a"}},
                      "spec": {"ports": ports or [{"name": "http", "port": 80, "targetPort": 8080}], **spec}}
        if selector is not None:
            body["spec"]["selector"] = selector
        return await self.client.create(SVC, body, NS)

    async def endpoints(self, name: str) -> dict:
        return await self.client.get(EP, name, NS)

    async def slices(self, service: str) -> list[dict]:
        items = (await self.client.list(SLICES, NS, label_selector=f"kubernetes.io/service-name={service}"))["items"]
        return [s for s in items if not s["metadata"].get("deletionTimestamp")]

    async def settle(self) -> None:
        for ctrl, informers in ((self.ep, ((self.ep.endpoints_informer, EP), (self.ep.pod_informer, PODS),
                                           (self.ep.service_informer, SVC))),
                                (self.es, ((self.es.slice_informer, SLICES), (self.es.pod_informer, PODS)))):
            await settled(ctrl, self.client, *informers, namespace=NS)


@pytest.fixture
async def env():
    store = MemoryStore(history=5000)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    factory = SharedInformerFactory(client)
    ep = EndpointsController(client, factory)
    es = EndpointSliceController(client, factory)
    e = Env(client, ep, es)
    await e.node("n1", "zone-a")
    await e.node("n2", "zone-b")
    await ep.start(sync_timeout=2)
    await es.start(sync_timeout=2)
    yield e
    await es.stop(timeout=1)
    await ep.stop(timeout=1)
    await factory.stop()
    await client.close()
    await registry.close()
    await store.close()


def addresses(subset: dict, field: str = "addresses") -> list[str]:
    return [a["ip"] for a in subset.get(field) or []]


async def test_endpoints_list_ready_and_not_ready_pods_with_their_ports(env: Env) -> None:
    await env.service("web", {"app": "web"})
    await env.pod("a", {"app": "web"}, ready=True)
    await env.pod("b", {"app": "web"}, ready=False, node="n2")
    await env.pod("pending", {"app": "web"}, running=False)  # no IP: not listed
    await env.pod("other", {"app": "db"})

    async def both() -> dict:
        ep = await env.endpoints("web")
        assert ep["subsets"][0].get("addresses") and ep["subsets"][0].get("notReadyAddresses")
        return ep

    ep = await eventually(both)
    assert len(ep["subsets"]) == 1
    ss = ep["subsets"][0]
    assert addresses(ss) == ["10.244.0.1"] and addresses(ss, "notReadyAddresses") == ["10.244.0.2"]
    assert ss["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]
    a = ss["addresses"][0]
    assert a["nodeName"] == "n1"
    assert a["targetRef"] == {"kind": "Pod", "namespace": NS, "name": "a",
                              "uid": (await env.client.get(PODS, "a", NS))["metadata"]["uid"]}
    assert ep["metadata"]["labels"] == {"team": "a", "endpoints.kubernetes.io/managed-by": "endpoint-controller"}
    # the pod becomes ready: it moves over, and the change's time is the trigger time
    await env.set_ready("b", True, after=5)
    ep = await eventually(lambda: _where(env.endpoints("web"), lambda e: len(addresses(e["subsets"][0])) == 2))
    assert "notReadyAddresses" not in ep["subsets"][0]
    ready_at = (await env.client.get(PODS, "b", NS))["status"]["conditions"][0]["lastTransitionTime"]
    assert ep["metadata"]["annotations"][TRIGGER_TIME_ANNOTATION] == ready_at
    slices = await eventually(lambda: _where(env.slices("web"), lambda s: all(
        e["conditions"]["ready"] for e in s[0]["endpoints"])))
    assert slices[0]["metadata"]["annotations"][TRIGGER_TIME_ANNOTATION] == ready_at


async def _where(coro, pred):
    obj = await coro
    assert pred(obj)
    return obj


async def test_named_target_port_resolves_per_pod(env: Env) -> None:
    await env.service("web", {"app": "web"}, ports=[{"name": "http", "port": 80, "targetPort": "web"}])
    await env.pod("a", {"app": "web"}, ports=[{"name": "web", "containerPort": 8080}])
    await env.pod("b", {"app": "web"}, ports=[{"name": "web", "containerPort": 9090}])
    await env.pod("c", {"app": "web"}, ports=[{"name": "other", "containerPort": 7070}])  # no such port

    async def two_subsets() -> dict:
        ep = await env.endpoints("web")
        assert len(ep.get("subsets") or []) == 2
        return ep

    ep = await eventually(two_subsets)
    by_port = {ss["ports"][0]["port"]: addresses(ss) for ss in ep["subsets"]}
    assert by_port == {8080: ["10.244.0.1"], 9090: ["10.244.0.2"]}

    async def three_slices() -> list[dict]:
        slices = await env.slices("web")
        assert len(slices) == 3
        return slices

    # a slice per port mapping; the pod without the port is in one without ports, as upstream's
    slices = await eventually(three_slices)
    by_port = {(s["ports"][0]["port"] if s["ports"] else None): [e["addresses"][0] for e in s["endpoints"]]
               for s in slices}
    assert by_port == {8080: ["10.244.0.1"], 9090: ["10.244.0.2"], None: ["10.244.0.3"]}


async def test_slices_carry_conditions_topology_owner_and_labels(env: Env) -> None:
    svc = await env.service("web", {"app": "web"}, clusterIP="None")
    await env.pod("a", {"app": "web"}, hostname="a", subdomain="web")
    await env.pod("b", {"app": "web"}, node="n2", ready=False)
    slices = await eventually(lambda: _where(env.slices("web"), lambda s: len(s) == 1 and len(s[0]["endpoints"]) == 2))
    es = slices[0]
    assert es["metadata"]["name"].startswith("web-")
    assert es["addressType"] == "IPv4"
    assert es["metadata"]["labels"] == {"team": "a", "kubernetes.io/service-name": "web",
                                        "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                                        "service.kubernetes.io/headless": ""}
    assert es["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Service", "name": "web",
                                                  "uid": svc["metadata"]["uid"], "controller": True,
                                                  "blockOwnerDeletion": True}]
    assert es["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]
    a, b = es["endpoints"]
    assert a["conditions"] == {"ready": True, "serving": True, "terminating": False}
    assert a["nodeName"] == "n1" and a["zone"] == "zone-a" and a["hostname"] == "a"
    assert a["targetRef"]["kind"] == "Pod" and a["targetRef"]["name"] == "a"
    assert b["conditions"] == {"ready": False, "serving": False, "terminating": False}
    assert b["zone"] == "zone-b" and "hostname" not in b
    # a terminating pod stays listed, not ready but still serving
    await env.client.patch(PODS, "a", {"metadata": {"finalizers": ["example.com/hold"]}}, NS)
    await env.client.delete(PODS, "a", NS)

    async def terminating() -> dict:
        ep = next(e for e in (await env.slices("web"))[0]["endpoints"] if e["targetRef"]["name"] == "a")
        assert ep["conditions"]["terminating"]
        return ep

    ep = await eventually(terminating)
    assert ep["conditions"] == {"ready": False, "serving": True, "terminating": True}
    # the Endpoints object drops it
    ep_obj = await eventually(lambda: _where(env.endpoints("web"), lambda e: all(
        a["targetRef"]["name"] != "a" for ss in e.get("subsets") or []
        for a in ss.get("addresses", []) + ss.get("notReadyAddresses", []))))
    assert ep_obj["metadata"]["labels"]["service.kubernetes.io/headless"] == ""
    await env.client.patch(PODS, "a", {"metadata": {"finalizers": None}}, NS)


async def test_publish_not_ready_addresses(env: Env) -> None:
    await env.service("web", {"app": "web"}, publishNotReadyAddresses=True)
    await env.pod("a", {"app": "web"}, ready=False)
    ep = await eventually(lambda: _where(env.endpoints("web"), lambda e: e.get("subsets")))
    assert addresses(ep["subsets"][0]) == ["10.244.0.1"]
    slices = await eventually(lambda: _where(env.slices("web"), lambda s: s and s[0]["endpoints"]))
    assert slices[0]["endpoints"][0]["conditions"] == {"ready": True, "serving": True, "terminating": False}


async def test_at_most_100_endpoints_per_slice(env: Env) -> None:
    await env.service("big", {"app": "big"})
    for i in range(130):
        await env.pod(f"p{i}", {"app": "big"})

    async def all_listed() -> list[dict]:
        slices = await env.slices("big")
        assert sum(len(s["endpoints"]) for s in slices) == 130
        return slices

    slices = await eventually(all_listed)
    assert sorted(len(s["endpoints"]) for s in slices) == [30, 100]
    ips = [e["addresses"][0] for s in slices for e in s["endpoints"]]
    assert len(set(ips)) == 130  # no endpoint twice
    await env.settle()
    assert sorted(len(s["endpoints"]) for s in await env.slices("big")) == [30, 100]
    # scaling down empties what it can without churn: 130 -> 80 leaves one slice's worth
    for i in range(50):
        await env.client.delete(PODS, f"p{i}", NS, grace_period_seconds=0)

    async def eighty() -> list[dict]:
        slices = await env.slices("big")
        assert sum(len(s["endpoints"]) for s in slices) == 80
        return slices

    await eventually(eighty)


async def test_service_without_endpoints_keeps_a_placeholder(env: Env) -> None:
    await env.service("empty", {"app": "nobody"})
    slices = await eventually(lambda: _where(env.slices("empty"), lambda s: len(s) == 1))
    assert slices[0]["endpoints"] == [] and slices[0]["ports"] == []
    ep = await eventually(lambda: env.endpoints("empty"))
    assert "subsets" not in ep
    await env.pod("a", {"app": "nobody"})
    slices = await eventually(lambda: _where(env.slices("empty"), lambda s: len(s) == 1 and s[0]["endpoints"]))
    assert slices[0]["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]


async def test_selectorless_and_external_name_services_are_left_alone(env: Env) -> None:
    await env.service("manual", None)
    await env.service("ext", None, ports=[], type="ExternalName", externalName="db.example.com")
    await env.client.create(EP, {"metadata": {"name": "manual"}, "subsets": [
        {"addresses": [{"ip": "192.0.2.10"}], "ports": [{"port": 5432}]}]}, NS)
    await env.settle()
    ep = await env.endpoints("manual")
    assert addresses(ep["subsets"][0]) == ["192.0.2.10"]
    assert not await env.slices("manual") and not await env.slices("ext")
    with pytest.raises(StatusError):
        await env.endpoints("ext")


async def test_deleted_service_takes_its_endpoints(env: Env) -> None:
    await env.service("web", {"app": "web"})
    await env.pod("a", {"app": "web"})
    await eventually(lambda: env.endpoints("web"))
    await env.client.delete(SVC, "web", NS)

    async def gone() -> bool:
        try:
            await env.endpoints("web")
        except StatusError as err:
            return err.code == 404
        return False

    await eventually(gone)


async def test_relabelled_pod_leaves_the_service(env: Env) -> None:
    await env.service("web", {"app": "web"})
    await env.pod("a", {"app": "web"})
    await env.pod("b", {"app": "web"})
    await eventually(lambda: _where(env.slices("web"), lambda s: s and len(s[0]["endpoints"]) == 2))
    await env.client.patch(PODS, "a", {"metadata": {"labels": {"app": "moved"}}}, NS)
    slices = await eventually(lambda: _where(env.slices("web"), lambda s: s and len(s[0]["endpoints"]) == 1))
    assert slices[0]["endpoints"][0]["targetRef"]["name"] == "b"
    ep = await eventually(lambda: _where(env.endpoints("web"), lambda e: len(addresses(e["subsets"][0])) == 1))
    assert ep["subsets"][0]["addresses"][0]["targetRef"]["name"] == "b"


async def test_leftover_endpoints_without_a_service_are_removed_at_start() -> None:
    store = MemoryStore()
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    await client.create(EP, {"metadata": {"name": "orphan"}, "subsets": [
        {"addresses": [{"ip": "192.0.2.1"}], "ports": [{"port": 80}]}]}, NS)
    await client.create(EP, {"metadata": {"name": "lock", "annotations": {
        "control-plane.alpha.kubernetes.io/leader": "{}"}}}, NS)
    ctrl = EndpointsController(client)
    await ctrl.start(sync_timeout=2)
    try:
        async def gone() -> bool:
            try:
                await client.get(EP, "orphan", NS)
            except StatusError as err:
                return err.code == 404
            return False

        await eventually(gone)
        await settled(ctrl, client, (ctrl.endpoints_informer, EP), namespace=NS)
        assert (await client.get(EP, "lock", NS))["metadata"]["name"] == "lock"
    finally:
        await ctrl.stop(timeout=1)
        await client.close()
        await registry.close()
        await store.close()


def test_repack_groups_addresses_sharing_ports() -> None:
    def addr(ip: str) -> dict:
        return {"ip": ip, "targetRef": {"kind": "Pod", "uid": ip}}

    p80 = {"name": "http", "port": 80, "protocol": "TCP"}
    p443 = {"name": "https", "port": 443, "protocol": "TCP"}
    subsets = [
        {"addresses": [addr("10.0.0.2")], "ports": [p80]}, {"addresses": [addr("10.0.0.2")], "ports": [p443]},
        {"addresses": [addr("10.0.0.1")], "ports": [p80]}, {"addresses": [addr("10.0.0.1")], "ports": [p443]},
        {"notReadyAddresses": [addr("10.0.0.3")], "ports": [p80]},
    ]
    # the same addresses behind both ports: one subset
    out = repack_subsets(copy.deepcopy(subsets[:4]))
    assert len(out) == 1
    assert addresses(out[0]) == ["10.0.0.1", "10.0.0.2"] and out[0]["ports"] == [p80, p443]
    # one more (not ready) behind port 80 only: a subset per set of addresses
    out = repack_subsets(copy.deepcopy(subsets))
    assert len(out) == 2
    http = next(s for s in out if s["ports"] == [p80])
    assert addresses(http) == ["10.0.0.1", "10.0.0.2"] and addresses(http, "notReadyAddresses") == ["10.0.0.3"]
    https = next(s for s in out if s["ports"] == [p443])
    assert addresses(https) == ["10.0.0.1", "10.0.0.2"] and "notReadyAddresses" not in https


def test_truncate_keeps_1000_ready_first() -> None:
    subsets = [{"addresses": [{"ip": f"10.0.{i // 250}.{i % 250}"} for i in range(900)],
                "notReadyAddresses": [{"ip": f"10.1.{i // 250}.{i % 250}"} for i in range(300)]}]
    assert truncate(subsets)
    assert len(subsets[0]["addresses"]) == 900 and len(subsets[0]["notReadyAddresses"]) == 100
    small = [{"addresses": [{"ip": "10.0.0.1"}]}]
    assert not truncate(small)


def test_slice_tracker_holds_syncs_until_the_cache_has_our_writes() -> None:
    from kubeplane.controllers.endpointslice import SliceTracker

    t = SliceTracker()
    t.wrote("ns/web", {"metadata": {"name": "web-a", "generation": 1}})
    assert t.stale("ns/web", {})  # the create is not in the cache yet
    cached = {"web-a": {"metadata": {"name": "web-a", "generation": 1}}}
    assert not t.stale("ns/web", cached)
    t.wrote("ns/web", {"metadata": {"name": "web-a", "generation": 2}})
    assert t.stale("ns/web", cached)  # an older generation
    t.deleted("ns/web", "web-a")
    assert t.stale("ns/web", cached)
    assert not t.stale("ns/web", {"web-a": {"metadata": {"name": "web-a", "deletionTimestamp": "x"}}})
    assert not t.stale("ns/web", {})
