"""Custom resources over HTTP: discovery and OpenAPI follow the catalogue as
CRDs come and go, server-side Tables from additionalPrinterColumns, media
types (no protobuf) and deprecated-version warnings."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from kubeplane.api.resources import CATALOGUE
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.apiserver.server import build_app
from kubeplane.registry.crd import CRDController
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

AGG = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"

CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.com"},
    "spec": {
        "group": "example.com", "scope": "Namespaced",
        "names": {"plural": "widgets", "kind": "Widget", "shortNames": ["wd"], "categories": ["parts"]},
        "versions": [
            {"name": "v1beta1", "served": True, "storage": False, "deprecated": True,
             "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}},
            {"name": "v1", "served": True, "storage": True,
             "subresources": {"status": {}},
             "additionalPrinterColumns": [
                 {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                 {"name": "Ready", "type": "boolean", "jsonPath": ".status.ready"},
                 {"name": "Color", "type": "string", "jsonPath": ".spec.color", "priority": 1,
                  "description": "The widget's color."},
                 {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
             ],
             "schema": {"openAPIV3Schema": {
                 "type": "object", "description": "A widget.",
                 "properties": {
                     "spec": {"type": "object", "description": "The widget's wishes.",
                              "properties": {"size": {"type": "integer", "description": "How big."},
                                             "color": {"type": "string"}}},
                     "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}}}}}},
        ],
    },
}


@pytest.fixture
async def api() -> AsyncIterator[tuple[aiohttp.ClientSession, Registry]]:
    store = MemoryStore()
    registry = Registry(store, CATALOGUE.copy())
    await ensure_default_namespaces(registry)
    ctrl = CRDController(registry)
    await ctrl.start()
    server = TestServer(build_app(registry, registry.catalogue), host="127.0.0.1")
    await server.start_server()
    async with aiohttp.ClientSession(str(server.make_url(""))) as session:
        yield session, registry
    await server.close()
    await ctrl.stop()
    await store.close()


async def call(s, method, path, body=None, headers=None):
    h = {"Content-Type": "application/json", **(headers or {})}
    data = None if body is None else (body if isinstance(body, bytes) else orjson.dumps(body))
    async with s.request(method, path, data=data, headers=h) as r:
        raw = await r.read()
        return r.status, (orjson.loads(raw) if raw else None), r.headers


async def served(s, present=True):
    for _ in range(300):
        status, _, _ = await call(s, "GET", "/apis/example.com/v1")
        if (status == 200) == present:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("discovery did not follow the CRD")


async def test_discovery_and_openapi_follow_the_crd(api):
    s, _ = api
    status, _, _ = await call(s, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", CRD)
    assert status == 201
    await served(s)
    _, group, _ = await call(s, "GET", "/apis/example.com")
    assert group["preferredVersion"] == {"groupVersion": "example.com/v1", "version": "v1"}
    assert [v["version"] for v in group["versions"]] == ["v1", "v1beta1"]
    _, rl, _ = await call(s, "GET", "/apis/example.com/v1")
    names = {r["name"]: r for r in rl["resources"]}
    assert set(names) == {"widgets", "widgets/status"}
    assert names["widgets"]["shortNames"] == ["wd"] and names["widgets"]["categories"] == ["parts"]
    _, beta, _ = await call(s, "GET", "/apis/example.com/v1beta1")
    # both versions are stored in v1: the same storage version hash
    assert beta["resources"][0]["storageVersionHash"] == names["widgets"]["storageVersionHash"]
    _, agg, _ = await call(s, "GET", "/apis", headers={"Accept": AGG})
    mine = [g for g in agg["items"] if g["metadata"]["name"] == "example.com"]
    assert [v["version"] for v in mine[0]["versions"]] == ["v1", "v1beta1"]
    # OpenAPI v3: the index names the group-version with a hash; its document has the schema
    _, index, _ = await call(s, "GET", "/openapi/v3")
    url = index["paths"]["apis/example.com/v1"]["serverRelativeURL"]
    assert "?hash=" in url
    _, doc, _ = await call(s, "GET", url)
    schema = doc["components"]["schemas"]["com.example.v1.Widget"]
    assert schema["description"] == "A widget."
    assert schema["properties"]["spec"]["properties"]["size"]["description"] == "How big."
    assert schema["x-kubernetes-group-version-kind"] == [{"group": "example.com", "kind": "Widget", "version": "v1"}]
    assert "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta" in doc["components"]["schemas"]
    assert "/apis/example.com/v1/namespaces/{namespace}/widgets/{name}/status" in doc["paths"]
    patch = doc["paths"]["/apis/example.com/v1/namespaces/{namespace}/widgets/{name}"]["patch"]
    assert sorted(patch["requestBody"]["content"]) == [
        "application/apply-patch+yaml", "application/json-patch+json", "application/merge-patch+json"]
    assert sorted(patch["responses"]["200"]["content"]) == ["application/json", "application/yaml"]
    _, v2, _ = await call(s, "GET", "/openapi/v2", headers={"Accept": "application/json"})
    assert v2["definitions"]["com.example.v1.Widget"]["description"] == "A widget."
    assert "/apis/example.com/v1/namespaces/{namespace}/widgets" in v2["paths"]
    assert "io.k8s.api.core.v1.Pod" in v2["definitions"]
    # gone with the CRD
    status, _, _ = await call(s, "DELETE", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                                           "widgets.example.com")
    assert status == 200  # held by the cleanup finalizer for a moment: the object, as upstream answers
    await served(s, present=False)
    _, index, _ = await call(s, "GET", "/openapi/v3")
    assert "apis/example.com/v1" not in index["paths"]
    status, _, _ = await call(s, "GET", "/openapi/v3/apis/example.com/v1")
    assert status == 404
    _, agg, _ = await call(s, "GET", "/apis", headers={"Accept": AGG})
    assert not [g for g in agg["items"] if g["metadata"]["name"] == "example.com"]


async def test_tables_media_types_and_deprecation(api):
    s, _ = api
    await call(s, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", CRD)
    await served(s)
    base = "/apis/example.com/v1/namespaces/default/widgets"
    status, _, _ = await call(s, "POST", base, {"apiVersion": "example.com/v1", "kind": "Widget",
                                                "metadata": {"name": "w"}, "spec": {"size": 3}})
    assert status == 201
    _, table, _ = await call(s, "GET", base, headers={"Accept": TABLE})
    cols = [(c["name"], c["type"], c["priority"]) for c in table["columnDefinitions"]]
    assert cols == [("Name", "string", 0), ("Size", "integer", 0), ("Ready", "boolean", 0),
                    ("Color", "string", 1), ("Age", "date", 0)]
    assert table["columnDefinitions"][3]["description"] == "The widget's color."
    assert table["columnDefinitions"][1]["description"] == (
        "Custom resource definition column (in JSONPath format): .spec.size")
    cells = table["rows"][0]["cells"]
    assert cells[:4] == ["w", 3, None, None] and cells[4].endswith("s")
    # a version without columns gets Name and Age
    _, table, _ = await call(s, "GET", "/apis/example.com/v1beta1/namespaces/default/widgets",
                             headers={"Accept": TABLE})
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Age"]
    # protobuf: no such encoding for custom resources
    status, body, _ = await call(s, "POST", base, b"\x6b\x38\x73\x00",
                                 headers={"Content-Type": "application/vnd.kubernetes.protobuf"})
    assert status == 415 and body["reason"] == "UnsupportedMediaType"
    assert body["message"] == ("the body of the request was in an unknown format - accepted media types include: "
                               "application/json, application/yaml")
    status, body, _ = await call(s, "GET", base + "/w", headers={"Accept": "application/vnd.kubernetes.protobuf"})
    assert status == 406 and body["reason"] == "NotAcceptable"
    assert body["message"] == "only the following media types are accepted: application/json, application/yaml"
    status, _, _ = await call(s, "GET", base + "/w",
                              headers={"Accept": "application/vnd.kubernetes.protobuf, application/json"})
    assert status == 200
    # a deprecated version warns
    status, got, headers = await call(s, "GET", "/apis/example.com/v1beta1/namespaces/default/widgets/w")
    assert status == 200 and got["apiVersion"] == "example.com/v1beta1"
    assert headers["Warning"] == '299 - "example.com/v1beta1 Widget is deprecated"'
    _, _, headers = await call(s, "GET", base + "/w")
    assert "Warning" not in headers


async def test_json_patch_label_selectors_and_deletecollection(api):
    s, _ = api
    await call(s, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", CRD)
    await served(s)
    base = "/apis/example.com/v1/namespaces/default/widgets"
    for name, tier in (("a", "front"), ("b", "back"), ("c", "front")):
        status, _, _ = await call(s, "POST", base, {"apiVersion": "example.com/v1", "kind": "Widget",
                                                    "metadata": {"name": name, "labels": {"tier": tier}}})
        assert status == 201
    status, got, _ = await call(s, "PATCH", base + "/a", [{"op": "add", "path": "/spec", "value": {"size": 2}}],
                                headers={"Content-Type": "application/json-patch+json"})
    assert status == 200 and got["spec"] == {"size": 2} and got["metadata"]["generation"] == 2
    status, got, _ = await call(s, "PATCH", base + "/a", {"spec": {"unknown": 1}},
                                headers={"Content-Type": "application/merge-patch+json"})
    assert status == 200 and got["spec"] == {"size": 2}  # pruned
    _, listed, _ = await call(s, "GET", base + "?labelSelector=tier%3Dfront")
    assert [i["metadata"]["name"] for i in listed["items"]] == ["a", "c"]
    status, gone, _ = await call(s, "DELETE", base + "?labelSelector=tier%3Dfront")
    assert status == 200 and gone["kind"] == "WidgetList"
    assert sorted(i["metadata"]["name"] for i in gone["items"]) == ["a", "c"]
    _, listed, _ = await call(s, "GET", "/apis/example.com/v1/widgets")
    assert [i["metadata"]["name"] for i in listed["items"]] == ["b"]
