"""Wire details third-party clients rely on, against the aiohttp app in process."""

from __future__ import annotations

import base64
import hashlib

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from kubeplane.api import errors
from kubeplane.api.resources import CATALOGUE
from kubeplane.apiserver import discovery
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.apiserver.server import VERSION_INFO, build_app
from kubeplane.registry.registry import Registry
from kubeplane.storage import open_store

JSON = {"Content-Type": "application/json"}
PROTO_V2 = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"


@pytest.fixture()
async def http():
    store = await open_store("memory", None)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = TestClient(TestServer(build_app(registry, CATALOGUE), host="127.0.0.1"))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()
        await registry.close()
        await store.close()


async def _json(client: TestClient, path: str, status: int = 200, **headers: str):
    resp = await client.get(path, headers=headers)
    assert resp.status == status, (path, resp.status, await resp.text())
    return orjson.loads(await resp.read())


# -- trailing slashes ---------------------------------------------------------

@pytest.mark.parametrize("path", ["/version", "/api", "/apis", "/api/v1", "/apis/apps", "/apis/apps/v1",
                                  "/apis/resource.k8s.io/v1"])
async def test_trailing_slash_serves_the_same_document(http, path):
    # upstream serves these from go-restful web services whose one route is "/"
    assert await _json(http, path + "/") == await _json(http, path)


async def test_trailing_slash_aggregated_discovery(http):
    accept = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
    resp = await http.get("/apis/", headers={"Accept": accept})
    assert resp.status == 200 and resp.headers["Content-Type"] == discovery.AGGREGATED_CONTENT_TYPE


@pytest.mark.parametrize("path", ["/healthz/", "/livez/", "/apis/nosuchgroup/", "/apis/apps/v9/"])
async def test_paths_upstream_does_not_serve_stay_404(http, path):
    status = await _json(http, path, 404)
    assert status["reason"] == "NotFound"


# -- Status details -------------------------------------------------------------

async def test_route_404_carries_empty_details(http):
    # kubectl debug reads details.name of this 404 (ephemeralcontainers not served)
    resp = await http.patch("/api/v1/namespaces/default/pods/p/ephemeralcontainers", data=b"{}",
                            headers={"Content-Type": "application/strategic-merge-patch+json"})
    assert resp.status == 404
    assert orjson.loads(await resp.read()) == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "the server could not find the requested resource", "reason": "NotFound",
        "details": {}, "code": 404}


async def test_object_404_details_as_upstream(http):
    core = await _json(http, "/api/v1/namespaces/default/pods/missing", 404)
    assert core["details"] == {"name": "missing", "kind": "pods"}  # core group: no group key
    apps = await _json(http, "/apis/apps/v1/namespaces/default/deployments/missing", 404)
    assert apps["details"] == {"name": "missing", "group": "apps", "kind": "deployments"}
    assert apps["message"] == 'deployments.apps "missing" not found'


async def test_already_exists_and_conflict_details(http):
    body = orjson.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}})
    assert (await http.post("/api/v1/namespaces/default/configmaps", data=body, headers=JSON)).status == 201
    resp = await http.post("/api/v1/namespaces/default/configmaps", data=body, headers=JSON)
    assert resp.status == 409
    assert orjson.loads(await resp.read())["details"] == {"name": "c", "kind": "configmaps"}
    stale = orjson.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "c", "resourceVersion": "1"}})
    resp = await http.put("/api/v1/namespaces/default/configmaps/c", data=stale, headers=JSON)
    status = orjson.loads(await resp.read())
    assert resp.status == 409 and status["reason"] == "Conflict"
    assert status["details"] == {"name": "c", "kind": "configmaps"}


def test_status_error_details_omit_empty_fields():
    assert errors.route_not_found().to_status()["details"] == {}
    assert "details" not in errors.bad_request("x").to_status()
    assert errors.not_found("pods", "p").to_status()["details"] == {"name": "p", "kind": "pods"}


async def test_delete_success_status_details(http):
    body = orjson.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gone"}})
    assert (await http.post("/api/v1/namespaces", data=body, headers=JSON)).status == 201
    body = orjson.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}})
    created = orjson.loads(await (await http.post("/api/v1/namespaces/gone/configmaps", data=body, headers=JSON)).read())
    resp = await http.delete("/api/v1/namespaces/gone/configmaps/c")
    status = orjson.loads(await resp.read())
    assert status["status"] == "Success"
    assert status["details"] == {"name": "c", "kind": "configmaps", "uid": created["metadata"]["uid"]}


# -- storageVersionHash -----------------------------------------------------------

def test_storage_version_hash_matches_upstream_values():
    # values a real kube-apiserver v1.32 reports in /api/v1 and /apis/apps/v1
    assert discovery.storage_version_hash("", "v1", "Pod") == "xPOwRZ+Yhw8="
    assert discovery.storage_version_hash("apps", "v1", "Deployment") == "8aSe+NMegvE="


async def test_legacy_discovery_has_storage_version_hash(http):
    for gv in ("/api/v1", "/apis/apps/v1", "/apis/storage.k8s.io/v1"):
        doc = await _json(http, gv)
        group = doc["groupVersion"].rpartition("/")[0]
        version = doc["groupVersion"].rpartition("/")[2]
        for r in doc["resources"]:
            if "/" in r["name"]:
                assert "storageVersionHash" not in r  # subresources have none upstream
                continue
            digest = hashlib.sha256(f"{group}/{version}/{r['kind']}".encode()).digest()
            assert r["storageVersionHash"] == base64.b64encode(digest[:8]).decode()


# -- /openapi/v2 ------------------------------------------------------------------

async def test_openapi_v2_json(http):
    resp = await http.get("/openapi/v2", headers={"Accept": "application/json"})
    assert resp.status == 200 and resp.headers["Content-Type"] == "application/json"
    doc = orjson.loads(await resp.read())
    assert doc["swagger"] == "2.0"
    pod = doc["definitions"]["io.k8s.api.core.v1.Pod"]
    assert pod["properties"]["spec"]["$ref"] == "#/definitions/io.k8s.api.core.v1.PodSpec"
    assert {"group": "", "kind": "Pod", "version": "v1"} in pod["x-kubernetes-group-version-kind"]
    assert doc["definitions"]["io.k8s.apimachinery.pkg.util.intstr.IntOrString"]["type"] == "string"
    text = orjson.dumps(doc).decode()
    assert "#/components/" not in text and '"oneOf"' not in text and '"requestBody"' not in text
    create = doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments"]["post"]
    assert create["parameters"][0] == {"name": "body", "in": "body", "required": True,
                                       "schema": {"$ref": "#/definitions/io.k8s.api.apps.v1.Deployment"}}
    assert create["x-kubernetes-group-version-kind"] == {"group": "apps", "kind": "Deployment", "version": "v1"}
    assert create["responses"]["201"]["schema"] == {"$ref": "#/definitions/io.k8s.api.apps.v1.Deployment"}
    assert "/api/v1/nodes/{name}/status" in doc["paths"]
    # every reference resolves
    import re

    for ref in set(re.findall(r'"#/definitions/([^"]+)"', text)):
        assert ref in doc["definitions"], ref
    etag = resp.headers["Etag"]
    again = await http.get("/openapi/v2", headers={"If-None-Match": etag})
    assert again.status == 304


PROTO_V2_TYPE = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"


@pytest.mark.parametrize("accept, status, content_type", [
    ("", 200, "application/json"), ("*/*", 200, "application/json"), ("application/*", 200, "application/json"),
    (f"{PROTO_V2}, application/json;q=0.5", 200, PROTO_V2_TYPE),
    (f"{PROTO_V2};q=0.5, application/json", 200, "application/json"),
    (PROTO_V2, 200, PROTO_V2_TYPE), (PROTO_V2_TYPE, 200, PROTO_V2_TYPE),
    ("text/html", 406, None), ("application/json;q=0", 406, None),
])
async def test_openapi_v2_negotiation(http, accept, status, content_type):
    headers = {"Accept": accept} if accept else {}
    resp = await http.get("/openapi/v2", headers=headers)
    assert resp.status == status
    assert resp.headers["Vary"] == "Accept"
    if status == 406:
        assert await resp.read() == b""
    else:
        assert resp.headers["Content-Type"] == content_type


async def test_openapi_v2_protobuf_is_gnostic_document(http):
    from kubeplane.api.protobuf import iter_fields

    resp = await http.get("/openapi/v2", headers={"Accept": PROTO_V2})
    raw = await resp.read()
    top = {}
    for number, _, value in iter_fields(raw):
        top.setdefault(number, []).append(value)
    assert top[1] == [b"2.0"]  # swagger
    info = dict((n, v) for n, _, v in iter_fields(top[2][0]))
    assert info[1] == b"Kubernetes"
    # definitions (9): NamedSchema entries; find Pod and read its vendor extension
    names = {}
    for _, _, entry in iter_fields(top[9][0]):
        fields = dict((n, v) for n, _, v in iter_fields(entry))
        names[fields[1].decode()] = fields[2]
    assert "io.k8s.api.apps.v1.Deployment" in names
    pod = names["io.k8s.api.core.v1.Pod"]
    ext = [v for n, _, v in iter_fields(pod) if n == 31]
    decoded = {}
    for e in ext:
        f = dict((n, v) for n, _, v in iter_fields(e))
        any_fields = dict((n, v) for n, _, v in iter_fields(f[2]))
        decoded[f[1].decode()] = any_fields[2].decode()
    assert "kind: Pod" in decoded["x-kubernetes-group-version-kind"]
    # paths (8): NamedPathItem entries
    paths = [dict((n, v) for n, _, v in iter_fields(e))[1].decode()
             for n, _, e in iter_fields(top[8][0]) if n == 2]
    assert "/api/v1/namespaces/{namespace}/pods/{name}" in paths


# -- version ----------------------------------------------------------------------

async def test_version_fields_as_upstream_1_32(http):
    info = await _json(http, "/version")
    assert list(info) == ["major", "minor", "gitVersion", "gitCommit", "gitTreeState", "buildDate",
                          "goVersion", "compiler", "platform"]
    assert info == VERSION_INFO
    import re

    m = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)(\+[0-9A-Za-z.-]+)?", info["gitVersion"])
    assert m, info["gitVersion"]  # semver, no pre-release part
    assert (m.group(1), m.group(2)) == (info["major"], info["minor"])
    import platform as _platform

    assert info["platform"].split("/")[1] in ("amd64", "arm64", _platform.machine().lower())


async def test_create_in_terminating_namespace_forbidden_names_the_object(http):
    body = orjson.dumps({"apiVersion": "v1", "kind": "Namespace",
                         "metadata": {"name": "ending", "finalizers": ["example.com/hold"]}})
    assert (await http.post("/api/v1/namespaces", data=body, headers=JSON)).status == 201
    assert (await http.delete("/api/v1/namespaces/ending")).status in (200, 202)
    ns = await _json(http, "/api/v1/namespaces/ending")
    assert ns["metadata"].get("deletionTimestamp")  # held by its finalizer
    cm = orjson.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late"}})
    resp = await http.post("/api/v1/namespaces/ending/configmaps", data=cm, headers=JSON)
    status = orjson.loads(await resp.read())
    assert resp.status == 403 and status["reason"] == "Forbidden"
    assert status["message"] == ('configmaps "late" is forbidden: unable to create new content in namespace '
                                 "ending because it is being terminated")
    assert status["details"] == {"name": "late", "kind": "configmaps"}


async def test_route_405_carries_empty_details(http):
    resp = await http.post("/version/", data=b"{}", headers=JSON)
    assert resp.status == 405
    status = orjson.loads(await resp.read())
    assert status["reason"] == "MethodNotAllowed" and status["details"] == {}
