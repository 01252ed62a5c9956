"""Bounds on connections and requests: header deadline and size, idle
keep-alive, request timeout (504), body deadline, in-flight limits (429) and
the randomised end of watches. Real sockets against an in-process server with
small limits."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from kubeplane.apiserver.app import APIServer, APIServerConfig
from kubeplane.api.duration import parse_duration as parse_go_duration
from kubeplane.apiserver.serving import ServingLimits, is_long_running
from rawhttp import closed_within, read_response, request

CM = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "b"}}
CMS = "/api/v1/namespaces/default/configmaps"


@pytest.fixture
async def make_server():
    servers: list[APIServer] = []

    async def make(**limits) -> APIServer:
        srv = APIServer(APIServerConfig(insecure_http=True, storage="memory", listen="127.0.0.1:0", limits=ServingLimits(**limits)))
        await srv.start()
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        await srv.stop()


async def connect(srv: APIServer):
    host, port = srv.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    return reader, writer, f"{host}:{port}"


class Gate:
    """Holds calls of an async registry method until opened; counts arrivals."""

    def __init__(self, target, name: str) -> None:
        self.inner = getattr(target, name)
        self.open = asyncio.Event()
        self.arrived = 0
        self.arrivals = asyncio.Condition()
        setattr(target, name, self)

    async def __call__(self, *args, **kwargs):
        async with self.arrivals:
            self.arrived += 1
            self.arrivals.notify_all()
        await self.open.wait()
        return await self.inner(*args, **kwargs)

    async def wait_arrived(self, n: int) -> None:
        async with self.arrivals:
            await asyncio.wait_for(self.arrivals.wait_for(lambda: self.arrived >= n), 10)


# -- headers -------------------------------------------------------------------

async def test_partial_headers_are_closed_at_the_header_deadline(make_server):
    srv = await make_server(header_timeout=0.5, idle_timeout=60)
    conns = [await connect(srv) for _ in range(20)]
    t0 = time.monotonic()
    for i, (_, w, host) in enumerate(conns):
        # Never finished: half stop inside the headers, half inside the request line.
        w.write(f"GET /version HTTP/1.1\r\nHost: {host}\r\nX-Slow: ".encode() if i % 2 else b"GET /vers")
        await w.drain()
    for r, w, _ in conns:
        assert await closed_within(r, 5) == b""  # closed without a response, as Go's server does
        w.close()
    elapsed = time.monotonic() - t0
    assert 0.4 <= elapsed < 4.5, elapsed


async def test_a_silent_connection_is_closed_at_the_header_deadline(make_server):
    srv = await make_server(header_timeout=0.5, idle_timeout=60)
    r, w, _ = await connect(srv)
    t0 = time.monotonic()
    assert await closed_within(r, 5) == b""
    assert time.monotonic() - t0 < 4.5
    w.close()


async def test_header_deadline_counts_from_the_first_byte_of_each_request(make_server):
    # Headers sent in pieces, each piece before the deadline, all within it: served.
    srv = await make_server(header_timeout=1.0, idle_timeout=60)
    r, w, host = await connect(srv)
    for _ in range(2):
        for piece in (b"GET /version HTTP/1.1\r\n", f"Host: {host}\r\n".encode(), b"\r\n"):
            w.write(piece)
            await w.drain()
            await asyncio.sleep(0.2)
        resp = await read_response(r)
        assert resp.status == 200 and orjson.loads(resp.body)["major"] == "1"
    w.close()


async def test_a_later_request_on_a_connection_has_its_own_header_deadline(make_server):
    srv = await make_server(header_timeout=0.5, idle_timeout=60)
    r, w, host = await connect(srv)
    w.write(request("GET", "/version", host))
    assert (await read_response(r)).status == 200
    await asyncio.sleep(0.6)  # idle, not yet sending: the idle limit applies, not the header one
    w.write(f"GET /version HTTP/1.1\r\nHost: {host}\r\n".encode())
    await w.drain()
    t0 = time.monotonic()
    assert await closed_within(r, 5) == b""
    assert 0.4 <= time.monotonic() - t0 < 4.5
    w.close()


async def test_idle_keepalive_connection_is_closed(make_server):
    srv = await make_server(header_timeout=30, idle_timeout=0.5)
    r, w, host = await connect(srv)
    w.write(request("GET", "/version", host))
    assert (await read_response(r)).status == 200
    t0 = time.monotonic()
    assert await closed_within(r, 5) == b""
    assert 0.3 <= time.monotonic() - t0 < 4.5
    w.close()


async def test_headers_over_the_cap_get_431(make_server):
    srv = await make_server(max_header_bytes=64 * 1024)
    # Many headers, each small: the total counts.
    r, w, host = await connect(srv)
    w.write(f"GET /version HTTP/1.1\r\nHost: {host}\r\n".encode())
    for i in range(2000):
        w.write(f"X-Filler-{i}: {'v' * 40}\r\n".encode())
    await w.drain()
    resp = await read_response(r)
    assert resp.status == 431 and resp.body == b"431 Request Header Fields Too Large"
    assert await closed_within(r, 5) == b""
    w.close()
    # One header line larger than the cap.
    r, w, host = await connect(srv)
    w.write(request("GET", "/version", host, {"X-Big": "v" * (100 * 1024)}))
    await w.drain()
    resp = await read_response(r)
    assert resp.status == 431
    w.close()


async def test_headers_larger_than_aiohttp_defaults_but_under_the_cap_are_served(make_server):
    srv = await make_server()  # 1 MiB, as upstream
    r, w, host = await connect(srv)
    token = "t" * 32 * 1024  # aiohttp alone refuses fields over 8190 bytes
    w.write(request("GET", "/version?" + "a=b&" * 4000, host, {"Authorization": f"Bearer {token}"}))
    resp = await read_response(r)
    assert resp.status == 200
    w.close()


# -- request timeout and body deadline -------------------------------------------

async def test_slow_handler_gets_504_and_its_write_still_completes(make_server):
    srv = await make_server(request_timeout=0.5)
    gate = Gate(srv.registry, "create")
    r, w, host = await connect(srv)
    t0 = time.monotonic()
    w.write(request("POST", CMS, host, {"Content-Type": "application/json"}, orjson.dumps(CM)))
    resp = await read_response(r)
    assert 0.4 <= time.monotonic() - t0 < 4.5
    assert resp.status == 504
    status = orjson.loads(resp.body)
    assert status["reason"] == "Timeout" and status["code"] == 504
    assert status["message"] == ("Timeout: request did not complete within requested timeout - "
                                 "context deadline exceeded")
    # The handler was not cut short: once it can go on, the object is stored.
    gate.open.set()
    for _ in range(200):
        w.write(request("GET", CMS + "/c", host))
        got = await read_response(r)
        if got.status == 200:
            break
        await asyncio.sleep(0.02)
    assert got.status == 200 and orjson.loads(got.body)["data"] == {"a": "b"}
    w.close()


async def test_timeout_parameter_shortens_the_deadline_and_is_validated(make_server):
    srv = await make_server(request_timeout=30)
    gate = Gate(srv.registry, "get")
    r, w, host = await connect(srv)
    t0 = time.monotonic()
    w.write(request("GET", CMS + "/x?timeout=300ms", host))
    resp = await read_response(r)
    assert resp.status == 504 and time.monotonic() - t0 < 4.5
    gate.open.set()
    w.write(request("GET", CMS + "/x?timeout=abc", host))
    resp = await read_response(r)
    assert resp.status == 400
    assert orjson.loads(resp.body)["message"] == (
        'invalid timeout specified in the request URL - time: invalid duration "abc"')
    w.close()


async def test_stalled_body_gets_504_and_the_connection_closes(make_server):
    srv = await make_server(request_timeout=0.5)
    r, w, host = await connect(srv)
    body = orjson.dumps(CM)
    head = request("POST", CMS, host, {"Content-Type": "application/json"}, body)
    w.write(head[: len(head) - len(body) // 2])  # half the body, then nothing
    await w.drain()
    t0 = time.monotonic()
    resp = await read_response(r)
    assert resp.status == 504 and orjson.loads(resp.body)["reason"] == "Timeout"
    assert await closed_within(r, 3) == b""
    assert time.monotonic() - t0 < 4.5
    w.close()
    # Nothing was stored.
    r, w, host = await connect(srv)
    w.write(request("GET", CMS + "/c", host))
    assert (await read_response(r)).status == 404
    w.close()


async def test_stalled_chunked_body_is_closed(make_server):
    srv = await make_server(request_timeout=0.5)
    r, w, host = await connect(srv)
    w.write(f"POST {CMS} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n5\r\n{\"api\r\n".encode())
    await w.drain()
    resp = await read_response(r)
    assert resp.status == 504
    assert await closed_within(r, 3) == b""
    w.close()


# -- in-flight limits ---------------------------------------------------------------

async def test_requests_over_the_inflight_limit_get_429(make_server):
    srv = await make_server(max_requests_inflight=2, max_mutating_requests_inflight=1)
    gate = Gate(srv.registry, "list")
    held = [await connect(srv) for _ in range(2)]
    for _, w, host in held:
        w.write(request("GET", CMS, host))
    await gate.wait_arrived(2)
    r, w, host = await connect(srv)
    w.write(request("GET", CMS, host))
    resp = await read_response(r)
    assert resp.status == 429
    assert resp.headers["retry-after"] == "1"
    assert resp.body == b"Too many requests, please try again later.\n"
    # Mutating requests have their own pool; watches and health probes are not counted.
    w.write(request("POST", CMS, host, {"Content-Type": "application/json"}, orjson.dumps(CM)))
    assert (await read_response(r)).status == 201
    w.write(request("GET", "/readyz", host))
    assert (await read_response(r)).status == 200
    w.write(request("GET", CMS + "?watch=true&timeoutSeconds=1", host))
    watch = await read_response(r)
    assert watch.status == 200 and b'"ADDED"' in watch.body
    # Once the held requests finish, there is room again.
    gate.open.set()
    for hr, hw, _ in held:
        assert (await read_response(hr)).status == 200
        hw.close()
    w.write(request("GET", CMS, host))
    assert (await read_response(r)).status == 200
    w.close()


async def test_mutating_requests_over_their_limit_get_429(make_server):
    srv = await make_server(max_requests_inflight=5, max_mutating_requests_inflight=1)
    gate = Gate(srv.registry, "create")
    r1, w1, host = await connect(srv)
    w1.write(request("POST", CMS, host, {"Content-Type": "application/json"}, orjson.dumps(CM)))
    await gate.wait_arrived(1)
    r2, w2, _ = await connect(srv)
    other = {**CM, "metadata": {"name": "d"}}
    w2.write(request("POST", CMS, host, {"Content-Type": "application/json"}, orjson.dumps(other)))
    resp = await read_response(r2)
    assert resp.status == 429 and resp.headers["retry-after"] == "1"
    w2.write(request("GET", CMS, host))  # reads are not held up by writes
    assert (await read_response(r2)).status == 200
    gate.open.set()
    assert (await read_response(r1)).status == 201
    w1.close()
    w2.close()


# -- watches end in [min, 2*min] -------------------------------------------------------

async def test_watch_without_timeout_ends_between_min_and_twice_min(make_server):
    srv = await make_server(min_request_timeout=0.5)
    r, w, host = await connect(srv)
    durations = []
    for _ in range(3):
        t0 = time.monotonic()
        w.write(request("GET", CMS + "?watch=true&allowWatchBookmarks=true", host))
        resp = await read_response(r, timeout=10)
        durations.append(time.monotonic() - t0)
        assert resp.status == 200
    assert all(0.45 <= d <= 2.5 for d in durations), durations
    # An explicit timeoutSeconds is kept, not replaced by the drawn one, and the
    # watch ends by itself (the whole response arrives).
    asked = []
    real = srv.registry.watch_batches

    def spy(res, namespace, opts):
        asked.append(opts.timeout_seconds)
        return real(res, namespace, opts)

    srv.registry.watch_batches = spy
    w.write(request("GET", CMS + "?watch=true&timeoutSeconds=1", host))
    resp = await read_response(r, timeout=10)
    assert resp.status == 200 and asked == [1.0]
    w.close()


async def test_watch_timeout_is_drawn_from_min_to_twice_min(make_server, monkeypatch):
    from kubeplane.apiserver import server as server_module

    srv = await make_server(min_request_timeout=100)
    seen = []
    real = srv.registry.watch_batches

    def spy(res, namespace, opts):
        seen.append(opts.timeout_seconds)
        return real(res, namespace, opts)

    srv.registry.watch_batches = spy
    r, w, host = await connect(srv)
    for draw in (0.0, 0.999999):
        monkeypatch.setattr(server_module.random, "random", lambda d=draw: d)
        w.write(request("GET", CMS + "?watch=true&timeoutSeconds=0", host))  # 0 means none asked
        await asyncio.wait_for(r.readline(), 5)
        w.close()
        r, w, host = await connect(srv)
    w.write(request("GET", CMS + "?watch=true&timeoutSeconds=7", host))
    await asyncio.wait_for(r.readline(), 5)
    w.close()
    assert seen[0] == pytest.approx(100) and seen[1] == pytest.approx(200, abs=0.01) and seen[2] == 7


async def test_watch_is_not_cut_by_the_request_timeout(make_server):
    srv = await make_server(request_timeout=0.3, min_request_timeout=0)
    r, w, host = await connect(srv)
    t0 = time.monotonic()
    w.write(request("GET", "/api/v1/watch/namespaces/default/configmaps?timeoutSeconds=1", host))
    resp = await read_response(r)
    assert resp.status == 200 and time.monotonic() - t0 >= 0.9
    w.close()


# -- helpers ------------------------------------------------------------------------

class _Req:
    def __init__(self, method: str, path: str, query: dict[str, str] | None = None) -> None:
        self.method, self.path, self.query = method, path, query or {}


@pytest.mark.parametrize("method,path,query,expected", [
    ("GET", "/api/v1/namespaces/d/pods", {"watch": "true"}, True),
    ("GET", "/api/v1/namespaces/d/pods", {"watch": "1"}, True),
    ("GET", "/api/v1/namespaces/d/pods", {"watch": "false"}, False),
    ("GET", "/api/v1/watch/pods", {}, True),
    ("GET", "/apis/apps/v1/watch/namespaces/d/deployments/x", {}, True),
    ("GET", "/api/v1/namespaces/d/pods/p/log", {}, True),
    ("POST", "/api/v1/namespaces/d/pods/p/exec", {}, True),
    ("GET", "/api/v1/namespaces/d/pods/p", {"watch": "true"}, False),
    ("GET", "/api/v1/namespaces/d/pods/p/status", {}, False),
    ("GET", "/api/v1/namespaces", {"watch": "true"}, True),
    ("GET", "/api/v1/namespaces/d", {}, False),
    ("GET", "/version", {"watch": "true"}, False),
])
def test_long_running_requests(method, path, query, expected):
    assert is_long_running(_Req(method, path, query)) is expected


def test_go_durations():
    assert parse_go_duration("1m0s") == 60
    assert parse_go_duration("250ms") == 0.25
    assert parse_go_duration("1h2m3.5s") == 3723.5
    assert parse_go_duration("0") == 0
    for bad in ("5", "abc", "5x", ""):
        with pytest.raises(ValueError):
            parse_go_duration(bad)


async def test_http_client_sends_a_throttled_request_again(make_server, monkeypatch):
    from kubeplane.api.resources import resource
    from kubeplane.apiserver import serving
    from kubeplane.client.http import HttpClient
    from kubeplane.client.kubeconfig import ClientConfig

    srv = await make_server(max_mutating_requests_inflight=1)
    gate = Gate(srv.registry, "create")
    throttled = asyncio.Event()
    real = serving.too_many_requests

    def counting():
        throttled.set()
        return real()

    monkeypatch.setattr(serving, "too_many_requests", counting)
    c = HttpClient(ClientConfig(server=srv.url))
    try:
        first = asyncio.ensure_future(c.create(resource("configmaps"), CM, "default"))
        await gate.wait_arrived(1)
        second = asyncio.ensure_future(c.create(resource("configmaps"), {**CM, "metadata": {"name": "d"}},
                                                "default"))
        await asyncio.wait_for(throttled.wait(), 10)
        gate.open.set()  # the held create finishes; the throttled one is sent again after Retry-After
        assert (await first)["metadata"]["name"] == "c"
        assert (await asyncio.wait_for(second, 10))["metadata"]["name"] == "d"
    finally:
        await c.close()
