"""HttpClient against a small aiohttp server that mimics the Kubernetes API."""

from __future__ import annotations

import asyncio
import base64
import shutil
import ssl
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from kubeplane.api import errors
from kubeplane.api.errors import StatusError
from kubeplane.api.resources import Catalogue
from kubeplane.client.http import HttpClient
from kubeplane.client.informer import SharedInformer
from kubeplane.client.kubeconfig import ClientConfig, write_kubeconfig
from helpers import make_cert

CAT = Catalogue()
PODS = CAT.by_kind("Pod")
NODES = CAT.by_kind("Node")
CONFIGMAPS = CAT.by_kind("ConfigMap")
DEPLOYMENTS = CAT.by_kind("Deployment")


def status_response(err: StatusError) -> web.Response:
    return web.json_response(err.to_status(), status=err.code, dumps=lambda o: orjson.dumps(o).decode())


class FakeApi:
    """Just enough of the API: pods and nodes in memory, a scripted watch."""

    def __init__(self) -> None:
        self.rv = 0
        self.objects: dict[str, dict[str, Any]] = {}
        self.requests: list[dict[str, Any]] = []
        self.watch_events: list[bytes] = []
        self.watch_block = False
        self.app = web.Application(middlewares=[self.record])
        r = self.app.router
        for base in ("/api/v1/namespaces/{ns}/pods", "/api/v1/nodes"):
            r.add_get(base, self.list_or_watch)
            r.add_post(base, self.create)
            r.add_get(base + "/{name}", self.get)
            r.add_put(base + "/{name}", self.put)
            r.add_patch(base + "/{name}", self.patch)
            r.add_delete(base + "/{name}", self.delete)
            r.add_get(base + "/{name}/{sub}", self.get)
        r.add_post("/api/v1/namespaces/{ns}/pods/{name}/binding", self.bind)
        r.add_get("/api/v1/namespaces/{ns}/configmaps/{name}", self.plain_text_error)
        r.add_patch("/apis/apps/v1/namespaces/{ns}/deployments/{name}", self.apply)

    @web.middleware
    async def record(self, request: web.Request, handler):
        body = await request.read()
        self.requests.append({
            "method": request.method, "path": request.path, "query": dict(request.query),
            "content_type": request.headers.get("Content-Type"),
            "authorization": request.headers.get("Authorization"),
            "body": orjson.loads(body) if body else None,
        })
        try:
            return await handler(request)
        except StatusError as err:
            return status_response(err)

    def key(self, request: web.Request) -> str:
        ns = request.match_info.get("ns")
        return f"{ns}/{request.match_info['name']}" if ns else request.match_info["name"]

    def store(self, key: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[key] = obj
        return obj

    async def list_or_watch(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") in ("1", "true"):
            return await self.watch(request)
        items = [o for k, o in sorted(self.objects.items())
                 if k.startswith(request.match_info["ns"] + "/")] if "ns" in request.match_info else []
        limit = int(request.query.get("limit", "0"))
        start = int(request.query.get("continue", "0"))
        items = items[start:]
        meta: dict[str, Any] = {"resourceVersion": str(self.rv)}
        if limit and len(items) > limit:
            items = items[:limit]
            meta["continue"] = str(start + limit)
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": items})

    async def watch(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("resourceVersion") == "1":
            raise errors.gone("too old resource version: 1 (50)")
        if request.query.get("resourceVersion") == "forbidden":
            raise errors.forbidden("pods is forbidden: User cannot watch")
        resp = web.StreamResponse()
        resp.content_type = "application/json"
        await resp.prepare(request)
        events, self.watch_events = self.watch_events, []  # each script is served once
        for payload in events:
            # Split every line in small writes so lines straddle reads.
            for i in range(0, len(payload), 7000):
                await resp.write(payload[i:i + 7000])
        if self.watch_block:
            await asyncio.sleep(3600)
        await resp.write_eof()
        return resp

    async def create(self, request: web.Request) -> web.Response:
        obj = await request.json(loads=orjson.loads)
        ns = request.match_info.get("ns")
        if ns:
            obj["metadata"]["namespace"] = ns
        key = f"{ns}/{obj['metadata']['name']}" if ns else obj["metadata"]["name"]
        if key in self.objects:
            raise errors.already_exists("pods", obj["metadata"]["name"])
        if request.query.get("dryRun") == "All":
            return web.json_response(obj, status=201)
        return web.json_response(self.store(key, obj), status=201)

    async def get(self, request: web.Request) -> web.Response:
        obj = self.objects.get(self.key(request))
        if obj is None:
            raise errors.not_found("pods", request.match_info["name"])
        if request.match_info.get("sub") == "status":
            return web.json_response({"metadata": obj["metadata"], "status": obj.get("status", {})})
        return web.json_response(obj)

    async def put(self, request: web.Request) -> web.Response:
        obj = await request.json()
        cur = self.objects.get(self.key(request))
        if cur is None:
            raise errors.not_found("pods", request.match_info["name"])
        if obj["metadata"].get("resourceVersion") != cur["metadata"]["resourceVersion"]:
            raise errors.conflict("pods", request.match_info["name"])
        return web.json_response(self.store(self.key(request), obj))

    async def patch(self, request: web.Request) -> web.Response:
        if request.content_type != "application/merge-patch+json":
            raise errors.unsupported_media_type(request.content_type, ["application/merge-patch+json"])
        patch = await request.json()
        cur = self.objects.get(self.key(request))
        if cur is None:
            raise errors.not_found("pods", request.match_info["name"])
        cur = {**cur, "metadata": {**cur["metadata"], **patch.get("metadata", {})}}
        return web.json_response(self.store(self.key(request), cur))

    async def apply(self, request: web.Request) -> web.Response:
        obj = await request.json()  # JSON is valid YAML: the apply body parses as JSON
        obj["metadata"]["resourceVersion"] = "77"
        return web.json_response(obj)

    async def delete(self, request: web.Request) -> web.Response:
        cur = self.objects.pop(self.key(request), None)
        if cur is None:
            raise errors.not_found("pods", request.match_info["name"])
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success",
                                  "details": {"name": request.match_info["name"], "kind": "pods"}})

    async def bind(self, request: web.Request) -> web.Response:
        body = await request.json()
        pod = self.objects[self.key(request)]
        pod.setdefault("spec", {})["nodeName"] = body["target"]["name"]
        self.store(self.key(request), pod)
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success"}, status=201)

    async def plain_text_error(self, request: web.Request) -> web.Response:
        return web.Response(status=503, text="upstream connect error")


@pytest.fixture
async def api():
    fake = FakeApi()
    server = TestServer(fake.app, host="127.0.0.1")
    await server.start_server()
    fake.server = server
    yield fake
    await server.close()


@pytest.fixture
async def client(api):
    c = HttpClient(ClientConfig(server=str(api.server.make_url("")).rstrip("/"), token="tok"))
    yield c
    await c.close()


def pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"containers": []}}


async def test_crud_round_trip(api, client):
    created = await client.create(PODS, pod("a"), "default", field_manager="me")
    assert created["metadata"] == {"name": "a", "namespace": "default", "resourceVersion": "1"}
    req = api.requests[-1]
    assert (req["method"], req["path"]) == ("POST", "/api/v1/namespaces/default/pods")
    assert req["query"] == {"fieldManager": "me"}
    assert req["content_type"] == "application/json"
    assert req["authorization"] == "Bearer tok"

    got = await client.get(PODS, "a", "default")
    assert got == created
    status = await client.get(PODS, "a", "default", subresource="status")
    assert api.requests[-1]["path"] == "/api/v1/namespaces/default/pods/a/status"
    assert status["metadata"]["name"] == "a"

    got["metadata"]["labels"] = {"x": "y"}
    updated = await client.update(PODS, got)
    assert updated["metadata"]["resourceVersion"] == "2"
    assert api.requests[-1]["method"] == "PUT"

    patched = await client.patch(PODS, "a", {"metadata": {"annotations": {"k": "v"}}}, "default")
    assert patched["metadata"]["annotations"] == {"k": "v"}
    assert api.requests[-1]["content_type"] == "application/merge-patch+json"

    await client.create(PODS, {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "a"},
                               "target": {"kind": "Node", "name": "n1"}},
                        "default", subresource="binding", name="a")
    assert api.requests[-1]["path"] == "/api/v1/namespaces/default/pods/a/binding"
    assert (await client.get(PODS, "a", "default"))["spec"]["nodeName"] == "n1"

    result = await client.delete(PODS, "a", "default", grace_period_seconds=0,
                                 propagation_policy="Background", preconditions={"uid": "u1"})
    assert result["status"] == "Success"
    req = api.requests[-1]
    assert req["method"] == "DELETE"
    assert req["query"] == {"gracePeriodSeconds": "0", "propagationPolicy": "Background"}
    assert req["body"] == {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                           "propagationPolicy": "Background", "preconditions": {"uid": "u1"}}


async def test_list_params_and_cluster_scoped_paths(api, client):
    for n in ("a", "b", "c"):
        await client.create(PODS, pod(n), "ns1")
    page = await client.list(PODS, "ns1", label_selector="app=x", field_selector="spec.nodeName=n1",
                             limit=2, continue_token="0", resource_version="0",
                             resource_version_match="NotOlderThan")
    assert api.requests[-1]["query"] == {
        "labelSelector": "app=x", "fieldSelector": "spec.nodeName=n1", "limit": "2", "continue": "0",
        "resourceVersion": "0", "resourceVersionMatch": "NotOlderThan",
    }
    assert [o["metadata"]["name"] for o in page["items"]] == ["a", "b"]
    assert page["metadata"] == {"resourceVersion": "3", "continue": "2"}
    await client.create(NODES, {"metadata": {"name": "n1"}})
    assert api.requests[-1]["path"] == "/api/v1/nodes"
    await client.delete(NODES, "n1", dry_run=True)
    assert api.requests[-1]["path"] == "/api/v1/nodes/n1"
    assert api.requests[-1]["query"] == {"dryRun": "All"}
    assert api.requests[-1]["body"]["dryRun"] == ["All"]


async def test_dry_run_create(api, client):
    out = await client.create(PODS, pod("dry"), "default", dry_run=True)
    assert out["metadata"]["name"] == "dry"
    assert api.requests[-1]["query"] == {"dryRun": "All"}
    assert api.objects == {}


async def test_apply_patch_sends_json_as_yaml(api, client):
    body = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "spec": {"replicas": 2}}
    out = await client.patch(DEPLOYMENTS, "web", body, "default", patch_type="apply",
                             field_manager="kubectl", force=True)
    req = api.requests[-1]
    assert req["content_type"] == "application/apply-patch+yaml"
    assert req["query"] == {"fieldManager": "kubectl", "force": "true"}
    assert req["body"] == body
    assert out["metadata"]["resourceVersion"] == "77"


async def test_errors_become_status_errors(api, client):
    with pytest.raises(StatusError) as exc:
        await client.get(PODS, "missing", "default")
    assert (exc.value.code, exc.value.reason) == (404, "NotFound")
    assert exc.value.message == 'pods "missing" not found'
    assert exc.value.name == "missing"

    await client.create(PODS, pod("a"), "default")
    with pytest.raises(StatusError) as exc:
        await client.create(PODS, pod("a"), "default")
    assert (exc.value.code, exc.value.reason) == (409, "AlreadyExists")

    stale = await client.get(PODS, "a", "default")
    stale["metadata"]["resourceVersion"] = "0"
    with pytest.raises(StatusError) as exc:
        await client.update(PODS, stale)
    assert exc.value.reason == "Conflict"

    with pytest.raises(StatusError) as exc:
        await client.patch(PODS, "a", [{"op": "add", "path": "/x", "value": 1}], "default", patch_type="json")
    assert exc.value.code == 415
    assert api.requests[-1]["content_type"] == "application/json-patch+json"

    with pytest.raises(StatusError) as exc:
        await client.get(CONFIGMAPS, "cm", "default")
    assert (exc.value.code, exc.value.reason, exc.value.message) == (503, "ServiceUnavailable",
                                                                    "upstream connect error")

    with pytest.raises(StatusError) as exc:
        await client.get(NODES, "x", subresource="nope")
    assert exc.value.code == 404


def event_line(type_: str, obj: dict[str, Any]) -> bytes:
    return orjson.dumps({"type": type_, "object": obj}) + b"\n"


async def test_watch_streams_ndjson_with_huge_lines(api, client):
    big = "x" * (150 * 1024)
    api.watch_events = [
        event_line("ADDED", {"metadata": {"name": "a", "resourceVersion": "5"}}),
        event_line("MODIFIED", {"metadata": {"name": "a", "resourceVersion": "6",
                                             "annotations": {"big": big}}}),
        b"\n",
        event_line("BOOKMARK", {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "9"}}),
        # The last line has no trailing newline.
        event_line("DELETED", {"metadata": {"name": "a", "resourceVersion": "10"}}).rstrip(b"\n"),
    ]
    stream = client.watch(PODS, "default", resource_version="4", label_selector="app=x", timeout_seconds=30)
    events = [e async for e in stream]
    assert [e.type for e in events] == ["ADDED", "MODIFIED", "BOOKMARK", "DELETED"]
    assert events[1].object["metadata"]["annotations"]["big"] == big
    assert events[2].object["metadata"]["resourceVersion"] == "9"
    assert api.requests[-1]["query"] == {
        "watch": "1", "allowWatchBookmarks": "true", "resourceVersion": "4",
        "labelSelector": "app=x", "timeoutSeconds": "30",
    }


async def test_watch_send_initial_events_params(api, client):
    stream = client.watch(NODES, send_initial_events=True, allow_bookmarks=False)
    assert [e async for e in stream] == []
    assert api.requests[-1]["path"] == "/api/v1/nodes"
    assert api.requests[-1]["query"] == {"watch": "1", "sendInitialEvents": "true",
                                         "resourceVersionMatch": "NotOlderThan"}


async def test_watch_410_http_status_becomes_error_event(api, client):
    events = [e async for e in client.watch(PODS, "default", resource_version="1")]
    assert len(events) == 1
    assert events[0].type == "ERROR"
    assert events[0].object["code"] == 410
    assert events[0].object["reason"] == "Expired"
    assert events[0].object["message"] == "too old resource version: 1 (50)"


async def test_watch_other_http_errors_raise(api, client):
    stream = client.watch(PODS, "default", resource_version="forbidden")
    with pytest.raises(StatusError) as exc:
        await stream.__anext__()
    assert exc.value.code == 403


async def test_watch_close_ends_pending_read(api, client):
    api.watch_events = [event_line("ADDED", {"metadata": {"name": "a", "resourceVersion": "5"}})]
    api.watch_block = True
    stream = client.watch(PODS, "default")
    first = await stream.__anext__()
    assert first.object["metadata"]["name"] == "a"
    pending = asyncio.create_task(stream.__anext__())
    await asyncio.sleep(0.05)
    assert not pending.done()
    await stream.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(pending, 2)
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()


async def test_from_kubeconfig(api, tmp_path):
    path = tmp_path / "config"
    write_kubeconfig(str(path), str(api.server.make_url("")).rstrip("/"))
    async with HttpClient.from_kubeconfig(str(path)) as c:
        assert c.namespace == "default"
        await c.create(PODS, pod("k"), c.namespace)
        assert api.requests[-1]["authorization"] is None
    assert "default/k" in api.objects


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not available")
async def test_tls_with_ca_data_and_client_certificate(tmp_path):
    server_cert, server_key = make_cert(tmp_path, "server")
    client_cert, client_key = make_cert(tmp_path, "client")
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(server_cert, server_key)
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    server_ctx.load_verify_locations(cafile=str(client_cert))
    fake = FakeApi()
    server = TestServer(fake.app, host="127.0.0.1")
    await server.start_server(ssl=server_ctx)
    try:
        url = str(server.make_url("")).rstrip("/")
        assert url.startswith("https://")
        config = ClientConfig(
            server=url, token="t0k",
            ca_data=server_cert.read_bytes(),
            client_cert_data=client_cert.read_bytes(), client_key_data=client_key.read_bytes(),
        )
        async with HttpClient(config) as c:
            await c.create(PODS, pod("tls"), "default")
            assert (await c.get(PODS, "tls", "default"))["metadata"]["name"] == "tls"
        assert fake.requests[-1]["authorization"] == "Bearer t0k"
        # Without the client certificate the server refuses the handshake.
        no_cert = ClientConfig(server=url, ca_data=server_cert.read_bytes())
        async with HttpClient(no_cert) as c:
            with pytest.raises(Exception) as exc:
                await c.get(PODS, "tls", "default")
            assert not isinstance(exc.value, StatusError)
    finally:
        await server.close()


def test_basic_auth_header():
    c = HttpClient(ClientConfig(server="http://x", username="u", password="p"))
    assert c._headers["Authorization"] == "Basic " + base64.b64encode(b"u:p").decode()


async def test_informer_over_http(api, client):
    for n in ("a", "b", "c"):
        await client.create(PODS, pod(n), "default")
    api.watch_events = [event_line("ADDED", {"metadata": {"name": "d", "namespace": "default",
                                                          "resourceVersion": "10"}})]
    inf = SharedInformer(client, PODS, "default",
                         reflector_options={"page_size": 2, "backoff_initial": 0.01, "backoff_max": 0.02})
    added: list[str] = []
    inf.add_event_handler(on_add=lambda o: added.append(o["metadata"]["name"]))
    inf.start()
    try:
        assert await inf.wait_for_sync(2)
        deadline = asyncio.get_running_loop().time() + 2
        while len(added) < 4 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        assert sorted(added) == ["a", "b", "c", "d"]
        assert inf.indexer.get_by_key("default/d")["kind"] == "Pod"
        lists = [r for r in api.requests if r["method"] == "GET" and "watch" not in r["query"]]
        assert [r["query"].get("continue") for r in lists] == [None, "2"]
        watches = [r for r in api.requests if r["query"].get("watch") == "1"]
        assert watches[0]["query"]["resourceVersion"] == "3"
        while len(watches) < 2 and asyncio.get_running_loop().time() < deadline + 2:
            await asyncio.sleep(0.01)
            watches = [r for r in api.requests if r["query"].get("watch") == "1"]
        assert watches[1]["query"]["resourceVersion"] == "10"
    finally:
        await inf.stop()
