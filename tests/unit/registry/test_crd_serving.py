"""CustomResourceDefinitions over the registry: names and conditions, serving
through the catalogue, versions, subresources, selectors and the cleanup
finalizer (the CRD controller of the API server's process)."""

import asyncio
import copy

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.registry.crd import CRDController
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

CRDS = resource("customresourcedefinitions")


def crd(plural="widgets", kind="Widget", group="example.com", *, versions=None, scope="Namespaced",
        short_names=("wd",), categories=("all-widgets",), status=True, scale=False, columns=None,
        selectable=None):
    props = {
        "spec": {"type": "object", "properties": {
            "color": {"type": "string"}, "replicas": {"type": "integer"}, "selector": {"type": "string"}}},
        "status": {"type": "object", "properties": {"replicas": {"type": "integer"}, "phase": {"type": "string"}}},
    }
    subs = {}
    if status:
        subs["status"] = {}
    if scale:
        subs["scale"] = {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                         "labelSelectorPath": ".spec.selector"}
    if versions is None:
        versions = [("v1", True, True)]
    vs = []
    for name, served, storage in versions:
        v = {"name": name, "served": served, "storage": storage,
             "schema": {"openAPIV3Schema": {"type": "object", "properties": props}}}
        if subs:
            v["subresources"] = subs
        if columns is not None:
            v["additionalPrinterColumns"] = columns
        if selectable is not None:
            v["selectableFields"] = selectable
        vs.append(v)
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {"group": group, "scope": scope, "versions": vs,
                 "names": {"plural": plural, "kind": kind, "shortNames": list(short_names),
                           "categories": list(categories)}},
    }


@pytest.fixture
async def env():
    store = MemoryStore()
    registry = Registry(store, CATALOGUE.copy())
    await ensure_default_namespaces(registry)
    ctrl = CRDController(registry)
    await ctrl.start()
    yield registry, ctrl
    await ctrl.stop()
    await store.close()


async def until(pred, timeout=3.0):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        got = await pred()
        if got:
            return got
        if loop.time() > end:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


def conditions(obj):
    return {c["type"]: c for c in obj.get("status", {}).get("conditions") or ()}


async def established(registry, name):
    async def check():
        obj = await registry.get(CRDS, name)
        c = conditions(obj).get("Established")
        return obj if c and c["status"] == "True" else None

    return await until(check)


async def test_crd_established_and_served(env):
    registry, _ = env
    created = await registry.create(CRDS, crd())
    # upstream's fresh status (conditions has no omitempty)
    assert created["status"] == {"conditions": None, "acceptedNames": {"plural": "", "kind": ""},
                                 "storedVersions": ["v1"]}
    assert created["spec"]["names"]["singular"] == "widget"
    assert created["spec"]["names"]["listKind"] == "WidgetList"
    assert created["spec"]["conversion"] == {"strategy": "None"}
    obj = await established(registry, "widgets.example.com")
    conds = conditions(obj)
    assert conds["NamesAccepted"]["reason"] == "NoConflicts"
    assert conds["NamesAccepted"]["message"] == "no conflicts found"
    assert conds["Established"]["reason"] == "InitialNamesAccepted"
    assert obj["status"]["acceptedNames"]["shortNames"] == ["wd"]
    res = registry.catalogue.by_gvr("example.com", "v1", "widgets")
    assert res is not None and res.namespaced and res.short_names == ("wd",)
    assert res.categories == ("all-widgets",) and res.subresources == ("status",)
    w = await registry.create(res, {"apiVersion": "example.com/v1", "kind": "Widget",
                                    "metadata": {"name": "a"}, "spec": {"color": "red"},
                                    "status": {"phase": "ignored"}}, "default")
    assert "status" not in w  # owned by /status
    assert w["metadata"]["generation"] == 1
    listed = await registry.list(res, "default")
    assert listed["kind"] == "WidgetList" and [i["metadata"]["name"] for i in listed["items"]] == ["a"]


async def test_names_conflict_is_not_established(env):
    registry, _ = env
    await registry.create(CRDS, crd())
    await established(registry, "widgets.example.com")
    other = crd(plural="gadgets", kind="Gadget", short_names=("wd",))
    await registry.create(CRDS, other)

    async def refused():
        obj = await registry.get(CRDS, "gadgets.example.com")
        c = conditions(obj).get("NamesAccepted")
        return obj if c and c["status"] == "False" else None

    obj = await until(refused)
    conds = conditions(obj)
    assert conds["NamesAccepted"]["reason"] == "ShortNamesConflict"
    assert conds["NamesAccepted"]["message"] == '"wd" is already in use'
    assert conds["Established"] == {**conds["Established"], "status": "False", "reason": "NotAccepted",
                                    "message": "not all names are accepted"}
    assert registry.catalogue.by_gvr("example.com", "v1", "gadgets") is None
    # the kind and list kind of another CRD: the last conflict found is the reason, as upstream
    await registry.create(CRDS, crd(plural="things", kind="Widget", short_names=(), categories=()))

    async def kind_refused():
        c = conditions(await registry.get(CRDS, "things.example.com")).get("NamesAccepted")
        return c if c and c["status"] == "False" else None

    c = await until(kind_refused)
    assert (c["reason"], c["message"]) == ("ListKindConflict", '"WidgetList" is already in use')
    # a built-in resource of the group
    builtin = crd(plural="storageclasses", kind="Thing", group="storage.k8s.io", short_names=(), categories=())
    builtin["metadata"]["annotations"] = {"api-approved.kubernetes.io": "https://example.com/pull/1"}
    await registry.create(CRDS, builtin)

    async def builtin_refused():
        c = conditions(await registry.get(CRDS, "storageclasses.storage.k8s.io")).get("NamesAccepted")
        return c if c and c["status"] == "False" else None

    c = await until(builtin_refused)
    assert (c["reason"], c["message"]) == ("PluralConflict", '"storageclasses" is already in use')
    # freed names are taken at once: deleting the first CRD lets the second one in
    await registry.delete(CRDS, "widgets.example.com")
    await established(registry, "gadgets.example.com")


async def test_crd_validation_messages(env):
    registry, _ = env
    bad = crd(group="example")
    bad["metadata"]["name"] = "widgets.example"
    with pytest.raises(StatusError) as e:
        await registry.create(CRDS, bad)
    assert e.value.code == 422
    msgs = {c.field: c.message for c in e.value.causes}
    assert msgs["spec.group"] == 'Invalid value: "example": should be a domain with at least one dot'
    bad = crd(versions=[("v1", True, True), ("v2", True, True)])
    bad["metadata"]["name"] = "wrong.example.com"
    with pytest.raises(StatusError) as e:
        await registry.create(CRDS, bad)
    msgs = [(c.field, c.message) for c in e.value.causes]
    assert ("metadata.name", 'Invalid value: "wrong.example.com": must be spec.names.plural+"."+spec.group') in msgs
    assert any(f == "spec.versions" and m.endswith("must have exactly one version marked as storage version")
               for f, m in msgs)
    with pytest.raises(StatusError) as e:
        await registry.create(CRDS, crd(plural="things", group="x.k8s.io"))
    assert [(c.field, c.message) for c in e.value.causes] == [(
        "metadata.annotations[api-approved.kubernetes.io]",
        'Required value: protected groups must have approval annotation "api-approved.kubernetes.io", '
        "see https://github.com/kubernetes/enhancements/pull/1111")]


async def test_versions_rewrite_api_version_and_store_in_storage_version(env):
    registry, _ = env
    await registry.create(CRDS, crd(versions=[("v1beta1", True, False), ("v1", True, True)]))
    await established(registry, "widgets.example.com")
    v1 = registry.catalogue.by_gvr("example.com", "v1", "widgets")
    beta = registry.catalogue.by_gvr("example.com", "v1beta1", "widgets")
    got = await registry.create(beta, {"apiVersion": "example.com/v1beta1", "kind": "Widget",
                                       "metadata": {"name": "b"}, "spec": {"color": "blue"}}, "default")
    assert got["apiVersion"] == "example.com/v1beta1"
    stored = await registry.store.get(v1.storage_key("b", "default"))
    assert stored.value["apiVersion"] == "example.com/v1"
    assert (await registry.get(v1, "b", "default"))["apiVersion"] == "example.com/v1"
    assert (await registry.get(beta, "b", "default"))["apiVersion"] == "example.com/v1beta1"
    assert [i["apiVersion"] for i in (await registry.list(beta, "default"))["items"]] == ["example.com/v1beta1"]
    # the group's preferred version is the highest-priority served one
    assert [r.version for r in registry.catalogue.custom("widgets.example.com")] == ["v1", "v1beta1"]


async def test_status_subresource_and_generation(env):
    registry, _ = env
    await registry.create(CRDS, crd())
    await established(registry, "widgets.example.com")
    res = registry.catalogue.by_gvr("example.com", "v1", "widgets")
    w = await registry.create(res, {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "a"},
                                    "spec": {"color": "red"}}, "default")
    w = await registry.update(res, {**w, "status": {"phase": "Ready"}}, subresource="status")
    assert w["status"] == {"phase": "Ready"} and w["metadata"]["generation"] == 1
    w2 = await registry.update(res, {**w, "spec": {"color": "green"}, "status": {"phase": "lost"}})
    assert w2["status"] == {"phase": "Ready"} and w2["metadata"]["generation"] == 2


async def test_without_status_subresource_the_main_endpoint_writes_status(env):
    registry, _ = env
    await registry.create(CRDS, crd(status=False))
    await established(registry, "widgets.example.com")
    res = registry.catalogue.by_gvr("example.com", "v1", "widgets")
    assert res.subresources == ()
    w = await registry.create(res, {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "a"},
                                    "spec": {"color": "red"}, "status": {"phase": "x"}}, "default")
    assert w["status"] == {"phase": "x"}
    w = await registry.update(res, {**w, "status": {"phase": "y"}})
    assert w["status"] == {"phase": "y"} and w["metadata"]["generation"] == 2


async def test_scale_subresource(env):
    registry, _ = env
    await registry.create(CRDS, crd(scale=True))
    await established(registry, "widgets.example.com")
    res = registry.catalogue.by_gvr("example.com", "v1", "widgets")
    await registry.create(res, {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "a"},
                                "spec": {"replicas": 2, "selector": "app=a"}}, "default")
    scale = await registry.get_scale(res, "a", "default")
    assert scale["spec"] == {"replicas": 2} and scale["status"] == {"replicas": 0, "selector": "app=a"}
    out = await registry.update_scale(res, "a", "default", lambda s: {**s, "spec": {"replicas": 5}})
    assert out["spec"]["replicas"] == 5
    assert (await registry.get(res, "a", "default"))["spec"]["replicas"] == 5


async def test_field_selectors_and_selectable_fields(env):
    registry, _ = env
    await registry.create(CRDS, crd(selectable=[{"jsonPath": ".spec.color"}]))
    await established(registry, "widgets.example.com")
    res = registry.catalogue.by_gvr("example.com", "v1", "widgets")
    for name, color in (("a", "red"), ("b", "blue")):
        await registry.create(res, {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name},
                                    "spec": {"color": color}}, "default")
    got = await registry.list(res, "default", field_selector="spec.color=blue")
    assert [i["metadata"]["name"] for i in got["items"]] == ["b"]
    got = await registry.list(res, "default", field_selector="metadata.name=a")
    assert [i["metadata"]["name"] for i in got["items"]] == ["a"]
    with pytest.raises(StatusError) as e:
        await registry.list(res, "default", field_selector="spec.replicas=1")
    assert e.value.code == 400 and e.value.message == "field label not supported: spec.replicas"


async def test_strategic_merge_patch_is_415(env):
    registry, _ = env
    await registry.create(CRDS, crd())
    await established(registry, "widgets.example.com")
    res = registry.catalogue.by_gvr("example.com", "v1", "widgets")
    await registry.create(res, {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "a"}},
                          "default")
    with pytest.raises(StatusError) as e:
        await registry.patch(res, "a", {"spec": {"color": "x"}}, "default", patch_type="strategic")
    assert e.value.code == 415
    assert e.value.message == ("the body of the request was in an unknown format - accepted media types include: "
                               "application/json-patch+json, application/merge-patch+json, "
                               "application/apply-patch+yaml")
    got, _ = await registry.patch(res, "a", {"spec": {"color": "x"}}, "default", patch_type="merge")
    assert got["spec"] == {"color": "x"}


async def test_deleting_the_crd_deletes_its_objects_first(env):
    registry, _ = env
    await registry.create(CRDS, crd())
    await established(registry, "widgets.example.com")
    res = registry.catalogue.by_gvr("example.com", "v1", "widgets")
    for name in ("a", "b"):
        await registry.create(res, {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name}},
                              "default")
    await registry.create(res, {"apiVersion": "example.com/v1", "kind": "Widget",
                                       "metadata": {"name": "held", "finalizers": ["example.com/hold"]}}, "default")
    out, finished = await registry.delete(CRDS, "widgets.example.com")
    assert not finished
    assert "customresourcecleanup.apiextensions.k8s.io" in out["metadata"]["finalizers"]
    assert conditions(out)["Terminating"]["reason"] == "InstanceDeletionPending"

    async def only_held_left():
        items = (await registry.list(res, "default"))["items"]
        return [i["metadata"]["name"] for i in items] == ["held"] and items

    items = await until(only_held_left)
    assert items[0]["metadata"].get("deletionTimestamp")
    with pytest.raises(StatusError) as e:
        await registry.create(res, {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "c"}},
                              "default")
    assert e.value.code == 405
    assert e.value.message == "create not allowed while custom resource definition is terminating"
    crd_now = await registry.get(CRDS, "widgets.example.com")
    assert conditions(crd_now)["Terminating"]["reason"] == "InstanceDeletionInProgress"
    cur = await registry.get(res, "held", "default")
    await registry.update(res, {**cur, "metadata": {**cur["metadata"], "finalizers": []}})

    async def gone():
        try:
            await registry.get(CRDS, "widgets.example.com")
        except StatusError as err:
            return err.code == 404
        return False

    await until(gone)
    await until(lambda: _async(registry.catalogue.by_gvr("example.com", "v1", "widgets") is None))
    assert (await registry.store.list(res.storage_prefix())).items == []


async def _async(value):
    return value


async def test_namespace_controller_deletes_custom_resources(env):
    from kubeplane.client.inprocess import InProcessClient
    from kubeplane.controllers.namespace import NamespaceController

    registry, _ = env
    namespaces = resource("namespaces")
    ctrl = NamespaceController(InProcessClient(registry), retry_seconds=0.05)
    await ctrl.start()
    try:
        await registry.create(namespaces, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}})
        # the CRD comes after the controller started: it sees the catalogue as it is now
        await registry.create(CRDS, crd())
        await established(registry, "widgets.example.com")
        res = registry.catalogue.by_gvr("example.com", "v1", "widgets")
        await registry.create(res, {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "a"}},
                              "team")
        await registry.delete(namespaces, "team")

        async def ns_gone():
            try:
                await registry.get(namespaces, "team")
            except StatusError as err:
                return err.code == 404
            return False

        await until(ns_gone)
        assert (await registry.store.list(res.storage_prefix("team"))).items == []
    finally:
        await ctrl.stop()


async def test_crd_updates_change_what_is_served_and_defaults_apply_on_read(env):
    registry, _ = env
    await registry.create(CRDS, crd(versions=[("v1beta1", True, False), ("v1", True, True)]))
    await established(registry, "widgets.example.com")
    v1 = registry.catalogue.by_gvr("example.com", "v1", "widgets")
    await registry.create(v1, {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "old"},
                               "spec": {"color": "red"}}, "default")
    current = copy.deepcopy(await registry.get(CRDS, "widgets.example.com"))  # stored objects are read-only
    spec = current["spec"]
    spec["versions"][0]["served"] = False  # v1beta1 no longer served
    size = {"type": "integer", "default": 7}
    spec["versions"][1]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["size"] = size
    updated = await registry.update(CRDS, current)
    assert updated["metadata"]["generation"] == 2

    async def switched():
        return (registry.catalogue.by_gvr("example.com", "v1beta1", "widgets") is None
                and registry.catalogue.by_gvr("example.com", "v1", "widgets") is not v1)

    await until(switched)
    v1 = registry.catalogue.by_gvr("example.com", "v1", "widgets")
    # stored before the default existed: defaulted when read, not rewritten
    got = await registry.get(v1, "old", "default")
    assert got["spec"] == {"color": "red", "size": 7}
    stored = await registry.store.get(v1.storage_key("old", "default"))
    assert "size" not in stored.value["spec"]
    listed = await registry.list(v1, "default")
    assert listed["items"][0]["spec"]["size"] == 7
    new = await registry.create(v1, {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "new"},
                                     "spec": {"color": "red", "bogus": True}}, "default")
    assert new["spec"] == {"color": "red", "size": 7}  # pruned and defaulted on write


async def test_watches_of_custom_resources_end_with_their_crd(env, monkeypatch):
    from kubeplane.registry import watch as watch_module
    from kubeplane.registry.registry import WatchOptions

    monkeypatch.setattr(watch_module, "CUSTOM_GONE_CHECK_SECONDS", 0.05)
    registry, _ = env
    await registry.create(CRDS, crd())
    await established(registry, "widgets.example.com")
    res = registry.catalogue.by_gvr("example.com", "v1", "widgets")
    await registry.create(res, {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "a"}},
                          "default")
    events = []

    async def consume():
        async for ev in registry.watch(res, "default", WatchOptions(resource_version="")):
            events.append((ev[0], ev[1]["metadata"]["name"]))

    task = asyncio.ensure_future(consume())
    await until(lambda: _async(events == [("ADDED", "a")]))
    await registry.delete(CRDS, "widgets.example.com")
    await asyncio.wait_for(task, 5)  # ended, after the objects' deletions
    assert events == [("ADDED", "a"), ("DELETED", "a")]


async def test_garbage_collector_follows_owner_references_of_custom_resources(env):
    from kubeplane.client.informer import SharedInformerFactory
    from kubeplane.client.inprocess import InProcessClient
    from kubeplane.controllers.garbagecollector import GarbageCollector

    registry, _ = env
    cms = resource("configmaps")
    client = InProcessClient(registry)
    factory = SharedInformerFactory(client)
    gc = GarbageCollector(client, factory)
    await gc.start(sync_timeout=1)
    try:
        # the CRD is served after the collector started
        await registry.create(CRDS, crd())
        await established(registry, "widgets.example.com")
        res = registry.catalogue.by_gvr("example.com", "v1", "widgets")
        owner = await registry.create(res, {"apiVersion": "example.com/v1", "kind": "Widget",
                                            "metadata": {"name": "owner"}}, "default")
        ref = {"apiVersion": "example.com/v1", "kind": "Widget", "name": "owner", "uid": owner["metadata"]["uid"]}
        await registry.create(cms, {"apiVersion": "v1", "kind": "ConfigMap",
                                    "metadata": {"name": "dep", "ownerReferences": [ref]}}, "default")
        cm_owner = await registry.create(cms, {"apiVersion": "v1", "kind": "ConfigMap",
                                               "metadata": {"name": "cm-owner"}}, "default")
        cm_ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm-owner", "uid": cm_owner["metadata"]["uid"]}
        await registry.create(res, {"apiVersion": "example.com/v1", "kind": "Widget",
                                    "metadata": {"name": "dep-widget", "ownerReferences": [cm_ref]}}, "default")

        async def gone(r, name):
            try:
                await registry.get(r, name, "default")
            except StatusError as err:
                return err.code == 404
            return False

        await registry.delete(res, "owner", "default")
        await until(lambda: gone(cms, "dep"))  # a dependent of a custom resource
        await registry.delete(cms, "cm-owner", "default")
        await until(lambda: gone(res, "dep-widget"))  # a custom resource as the dependent
    finally:
        await gc.stop(timeout=1)
        await factory.stop()


async def test_what_mutating_admission_adds_is_pruned_and_defaulted():
    from kubeplane.registry.admission import AdmissionChain, AdmissionPlugin

    class AddsFields(AdmissionPlugin):
        name = "AddsFields"

        def handles(self, operation, res):
            return res.custom is not None

        async def admit(self, attrs):
            attrs.obj["spec"] = {"color": "set-by-admission", "unknown": True}

    store = MemoryStore()
    registry = Registry(store, CATALOGUE.copy(), admission=AdmissionChain([AddsFields()]))
    ctrl = CRDController(registry)
    await ctrl.start()
    try:
        schema_crd = crd()
        props = schema_crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        props["size"] = {"type": "integer", "default": 3}
        await registry.create(CRDS, schema_crd)
        await established(registry, "widgets.example.com")
        res = registry.catalogue.by_gvr("example.com", "v1", "widgets")
        got = await registry.create(res, {"apiVersion": "example.com/v1", "kind": "Widget",
                                          "metadata": {"name": "a", "namespace": "default"}}, "default")
        assert got["spec"] == {"color": "set-by-admission", "size": 3}
    finally:
        await ctrl.stop()
        await store.close()
