"""Regressions found by the OpenAPI fuzz (tests/integration/test_openapi_fuzz.py),
each reproduced over real HTTP against the aiohttp application."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from kubeplane.api.resources import CATALOGUE
from kubeplane.apiserver import openapi
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.apiserver.server import build_app
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore


@pytest.fixture
async def http():
    store = MemoryStore(history=100)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    server = TestServer(build_app(registry, CATALOGUE), host="127.0.0.1")
    await server.start_server()
    async with aiohttp.ClientSession(str(server.make_url(""))) as session:
        yield session
    await server.close()
    await registry.close()
    await store.close()


async def test_warning_for_unknown_field_with_control_characters(http):
    # The unknown field's name is quoted in the Warning header; a line break in it made
    # the header unwritable and the connection was dropped after the object was stored.
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "w"},
            "bad\r\nX-Injected: 1": 1, "ctl\x01\x7f": 2}
    async with http.post("/api/v1/namespaces/default/configmaps", json=body) as resp:
        assert resp.status == 201, await resp.text()
        assert "X-Injected" not in resp.headers
        assert resp.headers.getall("Warning") == [
            '299 - "unknown field \\"bad  X-Injected: 1\\"", 299 - "unknown field \\"ctl  \\""'
        ]
    async with http.get("/api/v1/namespaces/default/configmaps/w") as resp:
        assert resp.status == 200


def test_warning_header_keeps_tabs_and_text():
    assert openapi.warning_header('a\tb "q" \\ é') == '299 - "a\tb \\"q\\" \\\\ é"'
    assert openapi.warning_header("x\ny\rz\x00") == '299 - "x y z "'


def test_delete_bodies_are_optional_in_openapi_documents():
    # DeleteOptions may be omitted (upstream marks the body not required); a document that
    # requires it means generated clients and fuzzers never send the ordinary body-less
    # DELETE. Bodies of create, replace and patch stay required.
    seen = {"delete": 0, "other": 0}
    for group, version in CATALOGUE.group_versions():
        doc = openapi.v3_document(group, version)
        for path, item in doc["paths"].items():
            for method, op in item.items():
                if method == "parameters" or "requestBody" not in op:
                    continue
                if method == "delete":
                    seen["delete"] += 1
                    assert "required" not in op["requestBody"], (method, path)
                else:
                    seen["other"] += 1
                    assert op["requestBody"]["required"] is True, (method, path)
    assert seen["delete"] > 40 and seen["other"] > 80, seen


def _deployment(match_expressions):
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"selector": {"matchLabels": {"app": "x"}, "matchExpressions": match_expressions},
                     "template": {"metadata": {"labels": {"app": "x"}},
                                  "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}}


@pytest.mark.parametrize("exprs, causes", [
    # null decodes to the zero requirement (no key, no operator), as upstream's decoder does
    ([None], {"spec.selector.matchExpressions[0].operator", "spec.selector.matchExpressions[0].key",
              "spec.selector"}),
    # a null string in values decodes to "", so the selector no longer matches the template
    ([{"key": "app", "operator": "In", "values": [None]}], {"spec.template.metadata.labels"}),
])
async def test_null_in_selector_match_expressions_is_invalid_not_a_crash(http, exprs, causes):
    async with http.post("/apis/apps/v1/namespaces/default/deployments", json=_deployment(exprs)) as resp:
        status = await resp.json()
        assert resp.status == 422, status
        assert {c["field"] for c in status["details"]["causes"]} == causes, status


def test_label_selector_from_dict_null_entries():
    from kubeplane.api.errors import StatusError
    from kubeplane.api.selectors import label_selector_from_dict

    with pytest.raises(StatusError) as info:
        label_selector_from_dict({"matchExpressions": [None]})
    assert info.value.code == 400
    sel = label_selector_from_dict({"matchExpressions": [{"key": "a", "operator": "In", "values": [None, "x"]}]})
    assert sel.matches({"a": ""}) and sel.matches({"a": "x"}) and not sel.matches({"a": "y"})


async def test_documented_delete_response_is_what_a_delete_answers(http):
    # The documents said a delete answers the object for every kind; only pods do, the
    # others answer a Status (upstream documents the same).
    def documented(path: str) -> str:
        op = openapi.v3_document("", "v1")["paths"][path]["delete"]
        return op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].rsplit(".", 1)[-1]

    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "gone"}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gone"},
           "spec": {"containers": [{"name": "c", "image": "nginx"}]}}
    for plural, obj in (("configmaps", cm), ("pods", pod)):
        async with http.post(f"/api/v1/namespaces/default/{plural}", json=obj) as resp:
            assert resp.status == 201
        async with http.delete(f"/api/v1/namespaces/default/{plural}/gone") as resp:
            assert resp.status == 200
            answered = (await resp.json())["kind"]
        assert documented(f"/api/v1/namespaces/{{namespace}}/{plural}/{{name}}") == answered, plural
    assert answered == "Pod"


@pytest.mark.parametrize("content_type, patch, status, message", [
    # null decodes to "" upstream: a new (empty) finalizer on a terminating object
    ("application/merge-patch+json", {"metadata": {"finalizers": ["x", None]}}, 422,
     'no new finalizers can be added if the object is being deleted, found new finalizers []string{"", "x"}'),
    ("application/json-patch+json", [{"op": "add", "path": "/metadata/finalizers/-", "value": {"a": 1}}], 422,
     "metadata.finalizers"),
])
async def test_finalizers_of_a_terminating_object_never_crash(http, content_type, patch, status, message):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "t", "finalizers": ["a/b"]},
           "spec": {"containers": [{"name": "c", "image": "nginx"}]}}
    async with http.post("/api/v1/namespaces/default/pods", json=pod) as resp:
        assert resp.status == 201
    async with http.delete("/api/v1/namespaces/default/pods/t") as resp:
        assert resp.status == 200  # kept for its finalizer, with a deletionTimestamp (upstream answers 200)
    async with http.patch("/api/v1/namespaces/default/pods/t", json=patch,
                          headers={"Content-Type": content_type}) as resp:
        body = await resp.json()
        assert resp.status == status, body
        assert message in body["message"], body
    async with http.get("/api/v1/namespaces/default/pods/t") as resp:
        assert (await resp.json())["metadata"]["finalizers"] == ["a/b"]


@pytest.mark.parametrize("path, content_type, patch", [
    ("pods/tp/status", "application/json-patch+json",
     [{"op": "add", "path": "/status/containerStatuses", "value": [5]}]),
    ("configmaps/x?fieldValidation=Ignore", "application/merge-patch+json", {"metadata": {"labels": {"a": 5}}}),
    ("configmaps/x", "application/merge-patch+json", {"metadata": {"labels": {"a": 5}}}),
    ("configmaps/x", "application/strategic-merge-patch+json", {"data": {"a": 5}}),
    ("configmaps/x?fieldValidation=Strict", "application/json-patch+json",
     [{"op": "add", "path": "/data", "value": {"a": [1]}}]),
])
async def test_a_patch_whose_result_does_not_decode_is_invalid_and_stores_nothing(http, path, content_type, patch):
    """Upstream decodes the patched object into its type: a value of the wrong
    type is a 422 on the field ``patch`` and nothing is stored (a wrongly typed
    container status once broke every later list of pods)."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tp"},
           "spec": {"containers": [{"name": "c", "image": "nginx"}]}}
    for plural, obj in (("pods", pod), ("configmaps", {"metadata": {"name": "x"}, "data": {"k": "v"}})):
        async with http.post(f"/api/v1/namespaces/default/{plural}", json=obj) as resp:
            assert resp.status == 201
    target = path.split("?")[0].rsplit("/status", 1)[0]
    async with http.get(f"/api/v1/namespaces/default/{target}") as resp:
        before = await resp.json()
    async with http.patch(f"/api/v1/namespaces/default/{path}", json=patch,
                          headers={"Content-Type": content_type}) as resp:
        body = await resp.json()
    assert resp.status == 422, body
    assert body["reason"] == "Invalid"
    assert body["details"]["causes"][0]["field"] == "patch"
    assert body["message"].startswith(' "" is invalid: patch: Invalid value: "'), body["message"]
    assert ": json: cannot unmarshal " in body["message"]
    async with http.get(f"/api/v1/namespaces/default/{target}") as resp:
        after = await resp.json()
    assert after == before
    async with http.get("/api/v1/pods") as resp:
        assert resp.status == 200
