"""The namespace controller and the garbage collector with custom resources,
over each transport: in process (the registry's catalogue), HTTP and the
local wire (discovery). Over the wire the controllers authenticate as
system:kube-controller-manager and RBAC (the bootstrap policy) decides."""

from __future__ import annotations

import asyncio
import os
import tempfile

import pytest
from aiohttp.test_utils import TestServer

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.apiserver.bootstrappolicy import reconcile
from kubeplane.apiserver.server import build_app
from kubeplane.auth.rbac import PolicyCache, RBACAuthorizer
from kubeplane.auth.user import UserInfo
from kubeplane.client.discovery import ServedResources, resources_from_aggregated, served_resources
from kubeplane.client.http import HttpClient
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.inprocess import InProcessClient
from kubeplane.client.kubeconfig import ClientConfig
from kubeplane.client.wire import WireClient
from kubeplane.client.wireserver import WireServer
from kubeplane.controllers.garbagecollector import GarbageCollector
from kubeplane.controllers.namespace import NamespaceController
from kubeplane.registry.crd import CRDController
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore
from helpers import eventually

CRDS = resource("customresourcedefinitions")
NAMESPACES = resource("namespaces")
CMS = resource("configmaps")
KCM = UserInfo("system:kube-controller-manager", groups=("system:authenticated",))


def widget_crd(plural="widgets", kind="Widget", scope="Namespaced"):
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.example.com"},
        "spec": {"group": "example.com", "scope": scope, "names": {"plural": plural, "kind": kind},
                 "versions": [{"name": "v1", "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": {"type": "object",
                                                              "x-kubernetes-preserve-unknown-fields": True}}}]},
    }


def widget(name, ns, **md):
    return {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name, "namespace": ns, **md}}


class Env:
    def __init__(self, registry, admin, client):
        self.registry = registry
        self.admin = admin  # in-process, as the cluster's administrator
        self.client = client  # what the controllers use

    async def install_crd(self, plural="widgets", kind="Widget"):
        await self.admin.create(CRDS, widget_crd(plural, kind))

        def served():
            res = self.registry.catalogue.by_gvr("example.com", "v1", plural)
            assert res is not None
            return res

        return await eventually(served)


@pytest.fixture(params=["inprocess", "http", "wire-rbac"])
async def env(request):
    store = MemoryStore(history=5000)
    cache = None
    authorizer = None
    if request.param == "wire-rbac":
        cache = PolicyCache(store)
        await cache.start()
        authorizer = RBACAuthorizer(cache)
    registry = Registry(store, CATALOGUE.copy(), **({"authorizer": authorizer} if authorizer else {}))
    await ensure_default_namespaces(registry)
    crds = CRDController(registry)
    await crds.start()
    admin = InProcessClient(registry)
    cleanup = []
    if request.param == "inprocess":
        client = InProcessClient(registry)
    elif request.param == "http":
        server = TestServer(build_app(registry, registry.catalogue), host="127.0.0.1")
        await server.start_server()
        cleanup.append(server.close)
        client = HttpClient(ClientConfig(server=str(server.make_url("")).rstrip("/")))
    else:
        await reconcile(registry)
        assert await cache.wait_for_revision(registry.store.revision)
        tmp = tempfile.TemporaryDirectory()
        cleanup.append(lambda: asyncio.sleep(0, tmp.cleanup()))
        wire = WireServer(registry, os.path.join(tmp.name, "api.sock"), tokens={"kcm": KCM}, authorizer=authorizer)
        await wire.start()
        cleanup.append(wire.stop)
        client = WireClient(wire.path, token="kcm")
    yield Env(registry, admin, client)
    await client.close()
    for fn in reversed(cleanup):
        await fn()
    await crds.stop()
    if cache is not None:
        await cache.stop()
    await registry.close()
    await store.close()


async def gone(client, res, name, ns=None):
    try:
        await client.get(res, name, ns)
    except StatusError as err:
        return err.code == 404
    return False


async def test_discovery_lists_custom_resources_and_notices_new_crds(env):
    if not hasattr(env.client, "discover"):
        # in process the controllers read the registry's own catalogue
        assert served_resources(env.client) is env.registry.catalogue
        await env.install_crd()
        assert served_resources(env.client).by_api_version_kind("example.com/v1", "Widget") is not None
        return
    served = served_resources(env.client)
    assert isinstance(served, ServedResources)
    # the controllers sharing a client share what discovery tells it
    factory = SharedInformerFactory(env.client)
    assert GarbageCollector(env.client, factory)._catalogue is served
    assert NamespaceController(env.client, factory)._catalogue is served
    served.resync = 3600
    changes = []
    served.subscribe(lambda: changes.append(served.generation))
    await served.start()
    try:
        pods = served.by_gvr("", "v1", "pods")
        assert pods is not None and pods.namespaced and pods.kind == "Pod" and "binding" in pods.subresources
        assert served.by_gvr("example.com", "v1", "widgets") is None
        before = len(changes)
        await env.install_crd()
        # the CRD watch (not the hour-long resync) brings the new resource in
        res = await eventually(lambda: served.by_gvr("example.com", "v1", "widgets"))
        assert len(changes) > before
        assert (res.kind, res.namespaced, res.singular) == ("Widget", True, "widget")
        assert {"list", "watch", "delete", "deletecollection"} <= set(res.verbs)
        assert served.by_api_version_kind("example.com/v1", "Widget") == res
        await env.admin.delete(CRDS, "widgets.example.com")
        await eventually(lambda: served.by_gvr("example.com", "v1", "widgets") is None)
    finally:
        await served.stop()


def test_resources_from_aggregated_skips_what_it_cannot_read():
    doc = {"kind": "APIGroupDiscoveryList", "items": [
        {"metadata": {"name": "example.com"}, "versions": [
            {"version": "v1", "resources": [
                {"resource": "widgets", "responseKind": {"group": "example.com", "version": "v1", "kind": "Widget"},
                 "scope": "Cluster", "singularResource": "widget", "verbs": ["get", "list"],
                 "subresources": [{"subresource": "status", "verbs": ["get"]}, "junk"]},
                {"resource": 3}, "junk", {"responseKind": None},
            ]},
            {"version": None}, 7,
        ]},
        None,
    ]}
    got = resources_from_aggregated(doc, None, {"items": "x"})
    assert len(got) == 1
    r = got[0]
    assert (r.group, r.version, r.kind, r.plural, r.singular, r.namespaced) == (
        "example.com", "v1", "Widget", "widgets", "widget", False)
    assert r.verbs == ("get", "list") and r.subresources == ("status",)


async def test_namespace_with_custom_resources_is_emptied_and_reports_what_remains(env):
    await env.install_crd()
    res = env.registry.catalogue.by_gvr("example.com", "v1", "widgets")
    await env.admin.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "t"}})
    await env.admin.create(res, widget("plain", "t"), "t")
    await env.admin.create(res, widget("held", "t", finalizers=["example.com/hold"]), "t")
    factory = SharedInformerFactory(env.client)
    ctrl = NamespaceController(env.client, factory, retry_seconds=0.05, retry_max_seconds=0.2)
    await ctrl.start(sync_timeout=5)
    try:
        await env.admin.delete(NAMESPACES, "t")
        await eventually(lambda: gone(env.admin, res, "plain", "t"))

        async def reported():
            ns = await env.admin.get(NAMESPACES, "t")
            conds = {c["type"]: c for c in ns["status"]["conditions"]}
            assert conds["NamespaceContentRemaining"]["status"] == "True"
            return conds

        conds = await eventually(reported)
        assert conds["NamespaceContentRemaining"]["reason"] == "SomeResourcesRemain"
        assert conds["NamespaceContentRemaining"]["message"] == (
            "Some resources are remaining: widgets.example.com has 1 resource instances")
        assert conds["NamespaceFinalizersRemaining"] == {**conds["NamespaceFinalizersRemaining"], "status": "True",
            "reason": "SomeFinalizersRemain",
            "message": "Some content in the namespace has finalizers remaining: example.com/hold in 1 resource instances"}
        assert conds["NamespaceDeletionDiscoveryFailure"]["status"] == "False"
        assert conds["NamespaceDeletionDiscoveryFailure"]["reason"] == "ResourcesDiscovered"
        assert conds["NamespaceDeletionContentFailure"]["reason"] == "ContentDeleted"
        held = await env.admin.get(res, "held", "t")
        assert held["metadata"]["deletionTimestamp"]
        await env.admin.patch(res, "held", {"metadata": {"finalizers": None}}, "t")
        await eventually(lambda: gone(env.admin, NAMESPACES, "t"))
    finally:
        await ctrl.stop(timeout=1)
        await factory.stop()


async def test_garbage_collection_across_custom_and_builtin_kinds(env):
    factory = SharedInformerFactory(env.client)
    gc = GarbageCollector(env.client, factory)
    await gc.start(sync_timeout=5)
    try:
        # the CRD comes after the collector started: its monitor starts then
        res = await env.install_crd()
        owner = await env.admin.create(res, widget("owner", "default"), "default")
        ref = {"apiVersion": "example.com/v1", "kind": "Widget", "name": "owner", "uid": owner["metadata"]["uid"]}
        await env.admin.create(CMS, {"apiVersion": "v1", "kind": "ConfigMap",
                                     "metadata": {"name": "dep", "ownerReferences": [ref]}}, "default")
        cm = await env.admin.create(CMS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm-owner"}},
                                    "default")
        cm_ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm-owner", "uid": cm["metadata"]["uid"]}
        await env.admin.create(res, widget("dep-widget", "default", ownerReferences=[cm_ref]), "default")

        async def watched():
            assert gc.nodes.get(owner["metadata"]["uid"]) is not None
            return True

        await eventually(watched)
        await env.admin.delete(res, "owner", "default")
        await eventually(lambda: gone(env.admin, CMS, "dep", "default"))
        await env.admin.delete(CMS, "cm-owner", "default")
        await eventually(lambda: gone(env.admin, res, "dep-widget", "default"))
        # a dependent whose owner still exists is kept
        keep = await env.admin.create(res, widget("keeper", "default"), "default")
        kref = {"apiVersion": "example.com/v1", "kind": "Widget", "name": "keeper", "uid": keep["metadata"]["uid"]}
        await env.admin.create(CMS, {"apiVersion": "v1", "kind": "ConfigMap",
                                     "metadata": {"name": "kept", "ownerReferences": [kref]}}, "default")
        await eventually(lambda: gc.nodes.get(keep["metadata"]["uid"]) is not None
                         and any(n.name == "kept" for n in gc.nodes.values()))
        await asyncio.sleep(0.2)
        assert (await env.admin.get(CMS, "kept", "default"))["metadata"]["name"] == "kept"
        # the CRD goes: so does its monitor
        await env.admin.delete(CRDS, "widgets.example.com")
        await eventually(lambda: ("example.com", "widgets") not in gc._custom)
    finally:
        await gc.stop(timeout=1)
        await factory.stop()


class CountingDiscovery:
    """A client whose discovery answers what ``served`` holds and counts the reads."""

    def __init__(self):
        self.reads = 0
        self.served = [resource("pods")]

    async def discover(self):
        self.reads += 1
        return list(self.served)


async def test_a_burst_of_crd_events_costs_one_sequence_of_reads():
    client = CountingDiscovery()
    served = ServedResources(client, settle=(0.0, 0.05, 0.1))
    for _ in range(50):
        served._kick()  # what each CustomResourceDefinition event does
    await served._settler  # the one settle sequence the burst started, to its end
    # one read for the burst, then one per remaining settle delay (0.05, 0.1)
    assert client.reads == 3, client.reads
    assert [r.plural for r in served.resources] == ["pods"]
    # a later event is read again, with what is served then
    client.served.append(resource("configmaps"))
    served._kick()
    await eventually(lambda: served.by_gvr("", "v1", "configmaps") is not None)
    await served.stop()
