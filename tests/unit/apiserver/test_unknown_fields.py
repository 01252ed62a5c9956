"""Unknown fields of built-in kinds are dropped, as decoding into upstream's
typed objects drops them: with a Warning header under fieldValidation=Warn
(the default), 400 under Strict, silently under Ignore; for create, update and
every kind of patch (the patched object is pruned too)."""

from __future__ import annotations

import re

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from kubeplane.api.resources import CATALOGUE
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.apiserver.server import build_app
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

CMS = "/api/v1/namespaces/default/configmaps"
PODS = "/api/v1/namespaces/default/pods"


@pytest.fixture()
async def http():
    store = MemoryStore(history=50)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = TestClient(TestServer(build_app(registry, CATALOGUE), host="127.0.0.1"))
    await client.start_server()
    yield client
    await client.close()
    await registry.close()
    await store.close()


def cm(name, **extra):
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"a": "1"}, **extra}


def warnings(resp):
    # 299 - "unknown field \"status\""
    texts = re.findall(r'299 - "((?:[^"\\]|\\.)*)"', ", ".join(resp.headers.getall("Warning", [])))
    return [t.replace('\\"', '"') for t in texts]


async def send(http, method, url, body, content_type="application/json", **params):
    data = body if isinstance(body, (bytes, str)) else orjson.dumps(body)
    resp = await http.request(method, url, data=data, params=params, headers={"Content-Type": content_type})
    return resp, await resp.json()


async def stored(http, url):
    resp = await http.get(url)
    return await resp.json()


async def test_create_drops_unknown_fields_with_a_warning(http):
    resp, obj = await send(http, "POST", CMS, cm("c1", status={"phase": "x"}, extra=1))
    assert resp.status == 201
    assert sorted(warnings(resp)) == ['unknown field "extra"', 'unknown field "status"']
    assert "status" not in obj and "extra" not in obj
    got = await stored(http, CMS + "/c1")
    assert "status" not in got and got["data"] == {"a": "1"}


async def test_nested_unknown_fields_and_fields_kept(http):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"any-label": "kept"}},
           "spec": {"containers": [{"name": "c", "image": "nginx", "imagePullPolice": "Never"}],
                    "nodeSelector": {"k": "v"}}}
    resp, obj = await send(http, "POST", PODS, pod)
    assert resp.status == 201
    assert warnings(resp) == ['unknown field "spec.containers[0].imagePullPolice"']
    c = obj["spec"]["containers"][0]
    assert "imagePullPolice" not in c and c["imagePullPolicy"] == "Always"
    # Map values (labels, nodeSelector) are data, not fields: kept.
    assert obj["metadata"]["labels"] == {"any-label": "kept"} and obj["spec"]["nodeSelector"] == {"k": "v"}


async def test_strict_rejects_and_ignore_drops_silently(http):
    resp, status = await send(http, "POST", CMS, cm("c2", status={}), fieldValidation="Strict")
    assert resp.status == 400 and status["reason"] == "BadRequest"
    assert status["message"] == ('ConfigMap in version "v1" cannot be handled as a ConfigMap: '
                                 'strict decoding error: unknown field "status"')
    resp, obj = await send(http, "POST", CMS, cm("c2", status={}), fieldValidation="Ignore")
    assert resp.status == 201 and warnings(resp) == [] and "status" not in obj


async def test_yaml_bodies_with_aliases_are_pruned_per_place(http):
    body = ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: y1, labels: &l {a: b}}\n"
            "data: {k: v}\nbogus: *l\n")
    resp, obj = await send(http, "POST", CMS, body, "application/yaml")
    assert resp.status == 201 and warnings(resp) == ['unknown field "bogus"']
    assert obj["metadata"]["labels"] == {"a": "b"} and "bogus" not in obj


async def test_update_drops_unknown_fields(http):
    _, obj = await send(http, "POST", CMS, cm("u1"))
    obj["status"] = {"x": 1}
    obj["data"]["b"] = "2"
    resp, out = await send(http, "PUT", CMS + "/u1", obj)
    assert resp.status == 200 and warnings(resp) == ['unknown field "status"']
    assert "status" not in out and (await stored(http, CMS + "/u1"))["data"] == {"a": "1", "b": "2"}


@pytest.mark.parametrize("content_type,patch", [
    ("application/merge-patch+json", {"status": {"x": 1}, "data": {"b": "2"}}),
    ("application/strategic-merge-patch+json", {"status": {"x": 1}, "data": {"b": "2"}}),
    ("application/json-patch+json", [{"op": "add", "path": "/status", "value": {"x": 1}},
                                     {"op": "add", "path": "/data/b", "value": "2"}]),
])
async def test_patches_drop_unknown_fields_of_the_result(http, content_type, patch):
    await send(http, "POST", CMS, cm("p1"))
    resp, out = await send(http, "PATCH", CMS + "/p1", patch, content_type)
    assert resp.status == 200, out
    assert warnings(resp) == ['unknown field "status"']
    got = await stored(http, CMS + "/p1")
    assert "status" not in out and "status" not in got and got["data"] == {"a": "1", "b": "2"}
    resp, status = await send(http, "PATCH", CMS + "/p1", patch, content_type, fieldValidation="Strict")
    assert resp.status == 400 and 'strict decoding error: unknown field "status"' in status["message"]


async def test_server_side_apply_neither_stores_nor_owns_unknown_fields(http):
    body = cm("a1", status={"x": 1})
    resp, out = await send(http, "PATCH", CMS + "/a1", body, "application/apply-patch+yaml", fieldManager="me")
    assert resp.status == 201 and warnings(resp) == ['unknown field "status"']
    assert "status" not in out
    fields = out["metadata"]["managedFields"][0]["fieldsV1"]
    assert "f:status" not in fields and fields["f:data"] == {"f:a": {}}


async def test_unchecked_or_odd_patch_bodies_are_pruned_in_the_result(http):
    await send(http, "POST", CMS, cm("q1"))
    resp, out = await send(http, "PATCH", CMS + "/q1", {"status": {"x": 1}}, "application/merge-patch+json",
                           fieldValidation="Ignore")
    assert resp.status == 200 and warnings(resp) == [] and "status" not in out
    # A "$" key that is no directive survives the merge as a field: dropped.
    resp, out = await send(http, "PATCH", CMS + "/q1", {"$odd": 1, "data": {"c": "3"}},
                           "application/strategic-merge-patch+json")
    assert resp.status == 200 and "$odd" not in out and out["data"]["c"] == "3"
    assert "$odd" not in await stored(http, CMS + "/q1")


async def test_free_form_values_are_kept(http):
    # Opaque driver parameters (RawExtension) hold anything; so does FieldsV1.
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "rc"},
             "spec": {"devices": {
                 "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}],
                 "config": [{"requests": ["gpu"], "opaque": {"driver": "gpu.example.com",
                                                             "parameters": {"anything": {"goes": [1, 2]}}}}]}}}
    resp, out = await send(http, "POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims", claim)
    assert resp.status == 201, out
    assert warnings(resp) == []
    assert out["spec"]["devices"]["config"][0]["opaque"]["parameters"] == {"anything": {"goes": [1, 2]}}
    _, obj = await send(http, "POST", CMS, cm("mf"), fieldManager="me")
    assert obj["metadata"]["managedFields"][0]["fieldsV1"] == {"f:data": {".": {}, "f:a": {}}}
