"""Every error path of a watch gives one well-framed HTTP response: a Status
before streaming, or an ERROR event inside a properly ended stream — never a
second response inside the first one's body."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from kubeplane.api import errors
from kubeplane.apiserver.app import APIServer, APIServerConfig
from kubeplane.apiserver.serving import ServingLimits
from rawhttp import read_response, request

CMS = "/api/v1/namespaces/default/configmaps"


def cm(name: str) -> bytes:
    return orjson.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}})


@pytest.fixture
async def conn():
    srv = APIServer(APIServerConfig(insecure_http=True, storage="memory", listen="127.0.0.1:0", history_revisions=5,
                                    limits=ServingLimits(min_request_timeout=0)))
    await srv.start()
    host, port = srv.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))

    async def send(method: str, path: str, body: bytes | None = None):
        hdrs = {"Content-Type": "application/json"} if body is not None else None
        writer.write(request(method, path, f"{host}:{port}", hdrs, body))
        return await read_response(reader)

    send.server = srv  # type: ignore[attr-defined]
    yield send
    writer.close()
    await srv.stop()


async def still_usable(send) -> None:
    """The connection carries a next request: the previous response was framed right."""
    resp = await send("GET", "/version")
    assert resp.status == 200 and orjson.loads(resp.body)["major"] == "1"


def events(resp) -> list[dict]:
    return [orjson.loads(line) for line in resp.body.splitlines() if line]


async def test_too_large_resource_version_is_a_504_status_before_streaming(conn):
    resp = await conn("GET", CMS + "?watch=true&resourceVersion=1000000000000")
    assert resp.status == 504
    assert "transfer-encoding" not in resp.headers
    status = orjson.loads(resp.body)
    current = conn.server.registry.store.revision
    assert status["kind"] == "Status" and status["reason"] == "Timeout" and status["code"] == 504
    assert status["message"] == f"Timeout: Too large resource version: 1000000000000, current: {current}"
    assert status["details"]["causes"] == [{"reason": "ResourceVersionTooLarge",
                                            "message": "Too large resource version"}]
    assert resp.headers["retry-after"] == "1"
    assert b"HTTP/1.1" not in resp.body
    await still_usable(conn)


async def test_bad_selectors_are_a_400_status_before_streaming(conn):
    for query in ("labelSelector=a%20in%20(", "fieldSelector=spec.bogus%3Dx"):
        resp = await conn("GET", CMS + "?watch=true&" + query)
        assert resp.status == 400 and orjson.loads(resp.body)["reason"] == "BadRequest"
    await still_usable(conn)


async def test_compacted_resource_version_is_an_error_event_in_an_ended_stream(conn):
    for i in range(12):
        assert (await conn("POST", CMS, cm(f"c{i}"))).status == 201
    resp = await conn("GET", CMS + "?watch=true&resourceVersion=2")
    assert resp.status == 200 and resp.headers["transfer-encoding"] == "chunked"
    evs = events(resp)
    assert [e["type"] for e in evs] == ["ERROR"]
    assert evs[0]["object"]["code"] == 410 and evs[0]["object"]["reason"] == "Expired"
    await still_usable(conn)


async def test_an_error_after_the_headers_is_an_error_event(conn):
    registry = conn.server.registry
    real = registry.watch_batches

    def failing(kind):
        async def batches(res, namespace, opts):
            inner = real(res, namespace, opts)
            try:
                async for batch in inner:
                    yield batch
                    if batch:
                        if kind == "status":
                            raise errors.StatusError(500, "InternalError", "the store went away")
                        raise RuntimeError("boom")
            finally:
                await inner.aclose()
        return batches

    assert (await conn("POST", CMS, cm("x"))).status == 201
    for kind, message in (("status", "the store went away"), ("crash", "RuntimeError('boom')")):
        registry.watch_batches = failing(kind)
        resp = await conn("GET", CMS + "?watch=true")
        assert resp.status == 200 and resp.headers["transfer-encoding"] == "chunked"
        evs = events(resp)
        assert [e["type"] for e in evs] == ["ADDED", "ERROR"]
        assert evs[1]["object"]["code"] == 500 and message in evs[1]["object"]["message"]
        assert b"HTTP/1.1" not in resp.body
        await still_usable(conn)


async def test_headers_go_out_before_the_first_event(conn):
    # A watch with nothing to send yet still answers 200 at once.
    srv = conn.server
    host, port = srv.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request("GET", CMS + "?watch=true&timeoutSeconds=30", f"{host}:{port}"))
    line = await asyncio.wait_for(reader.readline(), 5)
    assert line.startswith(b"HTTP/1.1 200")
    writer.close()


async def test_bad_parameters_are_a_status_before_streaming(conn):
    table = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
    srv = conn.server
    host, port = srv.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    for path, headers, code in (
        (CMS + "?watch=true&includeObject=Everything", table, 400),
        (CMS + "?watch=true&timeoutSeconds=soon", None, 400),
        (CMS + "?watch=true&sendInitialEvents=maybe", None, 400),
        (CMS + "?watch=true&sendInitialEvents=true", None, 422),  # needs resourceVersionMatch=NotOlderThan
    ):
        writer.write(request("GET", path, f"{host}:{port}", headers))
        resp = await read_response(reader)
        assert resp.status == code, (path, resp.status, resp.body)
        assert "transfer-encoding" not in resp.headers
    writer.close()
    await still_usable(conn)
