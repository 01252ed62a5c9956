"""Probe actions against local servers on 127.0.0.1, and the probe workers'
timing, thresholds and gating driven through pod statuses."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
import time

import grpc
import grpc.aio
import pytest
from aiohttp import web

from kubeplane.auth import pki
from kubeplane.node import prober as pr
from kubeplane.node.volumes import expand
from kubeplane.node.prober import (
    FAILURE, LIVENESS, READINESS, STARTUP, SUCCESS, UNKNOWN, HandlerError, HTTPProber, ProbeError,
    ProbeManager, Result,
)


# ---------------------------------------------------------------- helpers

def test_expand_as_upstream():
    env = {"A": "1", "EMPTY": ""}.get
    assert expand("x $(A) y", env) == "x 1 y"
    assert expand("$$(A)", env) == "$(A)"
    assert expand("$(MISSING)", env) == "$(MISSING)"
    assert expand("$(EMPTY)-", env) == "-"
    assert expand("$(A", env) == "$(A"
    assert expand("$A $", env) == "$A $"
    assert expand("$(A)-$(B)-$$(A)-$", env) == "1-$(B)-$(A)-$"
    c = {"env": [{"name": "A", "value": "v"}, {"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}
    assert pr.static_env(c) == {"A": "v", "S": ""}


def test_http_helpers():
    assert pr.canonical_header("x-custom-HEADER") == "X-Custom-Header"
    assert pr.join_host_port("::1", 80) == "[::1]:80"
    assert pr.strip_runtime("containerd://abc") == "abc"


def test_resolve_port():
    c = {"ports": [{"name": "http", "containerPort": 8080}]}
    assert pr.resolve_port(80, c) == 80
    assert pr.resolve_port("http", c) == 8080
    assert pr.resolve_port("81", c) == 81
    with pytest.raises(ProbeError, match="invalid syntax"):
        pr.resolve_port("metrics", c)
    with pytest.raises(ProbeError, match="invalid port number: 70000"):
        pr.resolve_port(70000, c)
    with pytest.raises(ProbeError, match="invalid port number: 0"):
        pr.resolve_port(0, c)


def test_request_for_http_get_action():
    h = HTTPProber()
    url, headers = h.request_for({"port": "web", "path": "/healthz?full=1"},
                                 {"ports": [{"name": "web", "containerPort": 8080}]}, "10.1.2.3")
    assert url == "http://10.1.2.3:8080/healthz?full=1"
    assert headers["User-Agent"].startswith("kube-probe/1.") and headers["Accept"] == "*/*"
    from kubeplane.apiserver.server import VERSION_INFO
    assert headers["User-Agent"] == f"kube-probe/{VERSION_INFO['major']}.{VERSION_INFO['minor']}"
    url, headers = h.request_for({"port": 443, "scheme": "HTTPS", "host": "example.test", "path": "ready",
                                  "httpHeaders": [{"name": "accept", "value": ""},
                                                  {"name": "user-agent", "value": "mine"},
                                                  {"name": "x-a", "value": "1"}, {"name": "X-A", "value": "2"}]},
                                 {}, "10.1.2.3")
    assert url == "https://example.test:443/ready"
    assert "Accept" not in headers and headers["User-Agent"] == "mine" and headers["X-A"] == "1, 2"
    with pytest.raises(ProbeError):
        h.request_for({"port": 80}, {}, "")


def test_kill_grace_seconds():
    c = {"name": "c", "livenessProbe": {"terminationGracePeriodSeconds": 3}}
    pod = {"metadata": {}, "spec": {"terminationGracePeriodSeconds": 30, "containers": [c]}}
    assert pr.kill_grace_seconds(pod, c, "LivenessProbe") == 3
    assert pr.kill_grace_seconds(pod, c, "StartupProbe") == 30
    assert pr.kill_grace_seconds(pod, c) == 30
    pod["metadata"]["deletionGracePeriodSeconds"] = 7
    assert pr.kill_grace_seconds(pod, c, "LivenessProbe") == 7
    assert pr.kill_grace_seconds({"metadata": {}, "spec": {}}, c) == 2


def test_container_should_restart():
    assert pr.container_should_restart({}, {"restartPolicy": "Always"}, 0)
    assert not pr.container_should_restart({}, {"restartPolicy": "OnFailure"}, 0)
    assert pr.container_should_restart({}, {"restartPolicy": "OnFailure"}, 1)
    assert not pr.container_should_restart({}, {"restartPolicy": "Never"}, 1)
    assert pr.container_should_restart({"restartPolicy": "Always"}, {"restartPolicy": "Never"}, 0)
    rules = {"restartPolicy": "Never", "restartPolicyRules": [
        {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]}
    assert pr.container_should_restart(rules, {"restartPolicy": "Never"}, 42)
    assert not pr.container_should_restart(rules, {"restartPolicy": "Never"}, 1)


def test_health_messages_round_trip():
    assert pr.decode_health_request(pr.encode_health_request("svc.A")) == "svc.A"
    assert pr.encode_health_request("") == b""
    for s in (0, 1, 2, 3):
        assert pr.decode_health_response(pr.encode_health_response(s)) == s
    # unknown fields are skipped
    assert pr.decode_health_response(b"\x12\x02hi" + pr.encode_health_response(2)) == 2


# ---------------------------------------------------------------- local servers

class HTTPServer:
    """An aiohttp server on 127.0.0.1 whose /healthz answers ``self.code``."""

    def __init__(self):
        self.code = 200
        self.delay = 0.0
        self.requests: list[web.Request] = []
        self.port = 0
        self.runner: web.AppRunner | None = None

    async def start(self, ssl_context=None):
        app = web.Application()
        app.router.add_get("/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=ssl_context)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self

    async def handle(self, request: web.Request):
        self.requests.append(request)
        if self.delay:
            await asyncio.sleep(self.delay)
        path = request.path
        if path == "/redirect-local":
            raise web.HTTPFound("/healthz")
        if path == "/redirect-away":
            raise web.HTTPFound(f"http://localhost:{self.port}/healthz")
        if path == "/loop":
            raise web.HTTPFound("/loop")
        if path == "/big":
            resp = web.StreamResponse()
            await resp.prepare(request)
            for _ in range(30):  # 30 KiB in 1 KiB chunks
                await resp.write(b"x" * 1024)
            return resp
        return web.Response(status=self.code, text=f"code {self.code}")

    async def stop(self):
        if self.runner:
            await self.runner.cleanup()


@pytest.fixture
async def http_server():
    s = await HTTPServer().start()
    try:
        yield s
    finally:
        await s.stop()


@pytest.fixture
async def prober_client():
    h = HTTPProber()
    try:
        yield h
    finally:
        await h.close()


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_http_probe_results(http_server, prober_client):
    base = f"http://127.0.0.1:{http_server.port}"
    url, headers = prober_client.request_for({"port": http_server.port, "path": "/healthz",
                                              "httpHeaders": [{"name": "Host", "value": "svc.local"}]},
                                             {}, "127.0.0.1")
    assert await pr.probe_http(prober_client, url, headers, 1) == (Result.SUCCESS, "code 200")
    req = http_server.requests[-1]
    assert req.headers["Host"] == "svc.local" and req.headers["User-Agent"].startswith("kube-probe/")
    assert req.headers["Accept"] == "*/*" and "Accept-Encoding" not in req.headers
    http_server.code = 503
    assert await pr.probe_http(prober_client, url, headers, 1) == (
        Result.FAILURE, "HTTP probe failed with statuscode: 503")
    http_server.code = 200
    # a redirect on the same host is followed, one elsewhere ends the probe with a warning
    assert (await pr.probe_http(prober_client, base + "/redirect-local", {}, 1))[0] == Result.SUCCESS
    assert http_server.requests[-1].path == "/healthz"
    n = len(http_server.requests)
    result, out = await pr.probe_http(prober_client, base + "/redirect-away", {}, 1)
    assert result == Result.WARNING and out.startswith("Probe terminated redirects, Response body:")
    assert len(http_server.requests) == n + 1
    result, out = await pr.probe_http(prober_client, base + "/loop", {}, 1)
    assert (result, out) == (Result.FAILURE, f'Get "{base}/loop": stopped after 10 redirects')


async def test_http_probe_body_read_up_to_10k(http_server, prober_client):
    result, out = await pr.probe_http(prober_client, f"http://127.0.0.1:{http_server.port}/big", {}, 2)
    assert result == Result.SUCCESS and out == "x" * 10240


async def test_http_probe_server_closing_without_answer(prober_client):
    async def hang_up(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.close()
    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        assert await pr.probe_http(prober_client, f"http://127.0.0.1:{port}/", {}, 2) == (
            Result.FAILURE, f'Get "http://127.0.0.1:{port}/": EOF')
    finally:
        server.close()
        await server.wait_closed()


async def test_http_probe_refused_and_timeout(http_server, prober_client):
    port = _free_port()
    result, out = await pr.probe_http(prober_client, f"http://127.0.0.1:{port}/", {}, 1)
    assert result == Result.FAILURE
    assert out == f'Get "http://127.0.0.1:{port}/": dial tcp 127.0.0.1:{port}: connect: connection refused'
    http_server.delay = 1
    t0 = time.monotonic()
    result, out = await pr.probe_http(prober_client, f"http://127.0.0.1:{http_server.port}/", {}, 0.3)
    assert time.monotonic() - t0 < 1.5
    assert result == Result.FAILURE and out.endswith("context deadline exceeded (Client.Timeout exceeded while awaiting headers)")


async def test_https_probe_does_not_verify(tmp_path, prober_client):
    ca, ca_key = pki.make_ca("probe-test-ca")
    cert, key = pki.issue(ca, ca_key, "server", server_names=("127.0.0.1",), client=False)
    (tmp_path / "c.pem").write_bytes(pki.cert_pem(cert))
    (tmp_path / "k.pem").write_bytes(pki.key_pem(key))
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(tmp_path / "c.pem"), str(tmp_path / "k.pem"))
    s = await HTTPServer().start(ssl_context=ctx)
    try:
        url, headers = prober_client.request_for({"port": s.port, "scheme": "HTTPS", "path": "/x"}, {}, "127.0.0.1")
        assert await pr.probe_http(prober_client, url, headers, 2) == (Result.SUCCESS, "code 200")
    finally:
        await s.stop()


async def test_tcp_probe():
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        assert await pr.probe_tcp("127.0.0.1", port, 1) == (Result.SUCCESS, "")
    finally:
        server.close()
        await server.wait_closed()
    assert await pr.probe_tcp("127.0.0.1", port, 1) == (
        Result.FAILURE, f"dial tcp 127.0.0.1:{port}: connect: connection refused")


class HealthServer:
    def __init__(self, statuses: dict[str, int]):
        self.statuses = statuses
        self.agents: list[str] = []

    def check(self, service: str, context):
        self.agents.append(dict(context.invocation_metadata()).get("user-agent", ""))
        if service not in self.statuses:
            context.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
        return self.statuses[service]


async def _grpc_server(handlers):
    server = grpc.aio.server()
    for h in handlers:
        server.add_generic_rpc_handlers((h,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def test_grpc_probe():
    health = HealthServer({"": 1, "db": 2})

    async def check(req, ctx):
        if req not in health.statuses:
            await ctx.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
        health.agents.append(dict(ctx.invocation_metadata()).get("user-agent", ""))
        return health.statuses[req]

    handler = grpc.method_handlers_generic_handler("grpc.health.v1.Health", {
        "Check": grpc.unary_unary_rpc_method_handler(
            check, request_deserializer=pr.decode_health_request,
            response_serializer=pr.encode_health_response)})
    server, port = await _grpc_server([handler])
    try:
        assert await pr.probe_grpc("127.0.0.1", "", port, 2) == (Result.SUCCESS, "service healthy")
        assert health.agents[-1].startswith("kube-probe/1.")
        assert await pr.probe_grpc("127.0.0.1", "db", port, 2) == (
            Result.FAILURE, 'service unhealthy (responded with "NOT_SERVING")')
        assert await pr.probe_grpc("127.0.0.1", "nope", port, 2) == (
            Result.FAILURE, "error: health rpc probe failed: rpc error: code = NotFound desc = unknown service")
    finally:
        await server.stop(None)
    # a gRPC server without the health service
    other = grpc.method_handlers_generic_handler("other.Svc", {
        "Do": grpc.unary_unary_rpc_method_handler(lambda r, c: b"")})
    server, port = await _grpc_server([other])
    try:
        result, out = await pr.probe_grpc("127.0.0.1", "", port, 2)
        assert result == Result.FAILURE and out.startswith(
            "error: this server does not implement the grpc health protocol (grpc.health.v1.Health)")
    finally:
        await server.stop(None)
    port = _free_port()
    t0 = time.monotonic()
    assert await pr.probe_grpc("127.0.0.1", "", port, 0.5) == (
        Result.FAILURE, f'timeout: failed to connect service "127.0.0.1:{port}" within 500ms: '
                        "context deadline exceeded")
    assert time.monotonic() - t0 < 2


# ---------------------------------------------------------------- workers

class Changes:
    def __init__(self):
        self.uids: list[str] = []
        self.event = asyncio.Event()

    def __call__(self, uid):
        self.uids.append(uid)
        self.event.set()


class Events:
    def __init__(self):
        self.items: list[tuple[str, str, str]] = []
        #: the involvedObject fieldPath of each item
        self.field_paths: list[str] = []

    def event(self, obj, type_, reason, message, *, field_path=""):
        self.items.append((type_, reason, message))
        self.field_paths.append(field_path)


def _rfc3339(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod(containers, *, uid="u1", restart="Always", init=()):
    return {"metadata": {"name": "p", "namespace": "default", "uid": uid},
            "spec": {"containers": containers, "initContainers": list(init), "restartPolicy": restart},
            "status": {}}


def _status(*names_ids, started_at=None, phase="Running", running=True, exit_code=None, init=()):
    started_at = started_at if started_at is not None else time.time()

    def one(name, cid):
        if running:
            state = {"running": {"startedAt": _rfc3339(started_at)}}
        else:
            state = {"terminated": {"exitCode": exit_code or 0}}
        return {"name": name, "containerID": cid, "state": state, "ready": False}
    return {"phase": phase, "podIP": "127.0.0.1",
            "containerStatuses": [one(n, c) for n, c in names_ids],
            "initContainerStatuses": [one(n, c) for n, c in init]}


def _http_probe(port, **kw):
    return {"httpGet": {"port": port, "path": "/healthz"}, "periodSeconds": 0.05, **kw}


async def _until(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


@pytest.fixture
async def manager():
    changes, events = Changes(), Events()
    m = ProbeManager(None, changes, recorder=events, rand=lambda: 0.0)
    m.changes, m.events = changes, events
    try:
        yield m
    finally:
        await m.close()


async def test_readiness_initial_failure_then_ready(manager, http_server):
    c = {"name": "web", "readinessProbe": _http_probe(http_server.port)}
    pod = _pod([c])
    manager.add_pod(pod)
    status = _status(("web", "containerd://a1"))
    manager.update_pod_status(pod, status)
    assert status["containerStatuses"][0]["started"] is True
    assert status["containerStatuses"][0]["ready"] is False
    await _until(lambda: manager.ready("containerd://a1"))
    assert manager.ready("a1")  # the bare CRI id names the same container
    assert manager.result(READINESS, "containerd://a1") == SUCCESS
    manager.update_pod_status(pod, status)
    assert status["containerStatuses"][0]["ready"] is True
    assert manager.changes.uids.count("u1") >= 2  # initial Failure, then Success
    # three failures in a row make it unready (failureThreshold 3 by default)
    http_server.code = 500
    n = len(http_server.requests)
    await _until(lambda: not manager.ready("containerd://a1"))
    assert len(http_server.requests) - n >= 3
    assert ("Warning", "Unhealthy", "Readiness probe failed: HTTP probe failed with statuscode: 500") in manager.events.items
    # about the container, as upstream's container references
    i = manager.events.items.index(("Warning", "Unhealthy", "Readiness probe failed: HTTP probe failed with statuscode: 500"))
    assert manager.events.field_paths[i] == "spec.containers{web}"


async def test_thresholds(manager, http_server):
    c = {"name": "web", "readinessProbe": _http_probe(http_server.port, successThreshold=3, failureThreshold=2)}
    pod = _pod([c])
    manager.add_pod(pod)
    manager.update_pod_status(pod, _status(("web", "containerd://b1")))
    await _until(lambda: len(http_server.requests) >= 1)
    assert manager.result(READINESS, "containerd://b1") == FAILURE
    await _until(lambda: manager.ready("containerd://b1"))
    assert len(http_server.requests) >= 3
    http_server.code = 500
    n = len(http_server.requests)
    await _until(lambda: not manager.ready("containerd://b1"))
    assert len(http_server.requests) - n >= 2


async def test_liveness_failure_holds_until_new_container(manager, http_server):
    c = {"name": "app", "livenessProbe": _http_probe(http_server.port, failureThreshold=2)}
    pod = _pod([c])
    manager.add_pod(pod)
    manager.update_pod_status(pod, _status(("app", "containerd://c1")))
    await _until(lambda: len(http_server.requests) >= 2)
    assert manager.result(LIVENESS, "c1") == SUCCESS and not manager.liveness_failed("c1")
    http_server.code = 500
    await _until(lambda: manager.liveness_failed("containerd://c1"))
    assert manager.kill_reason("app", "containerd://c1") == ("LivenessProbe", "Container app failed liveness probe")
    # on hold: no more probes until the container is replaced
    n = len(http_server.requests)
    await asyncio.sleep(0.3)
    assert len(http_server.requests) == n
    http_server.code = 200
    manager.update_pod_status(pod, _status(("app", "containerd://c2")))
    await _until(lambda: len(http_server.requests) > n)
    assert manager.result(LIVENESS, "c2") == SUCCESS
    assert manager.result(LIVENESS, "c1") is None  # the old container's result is gone


async def test_startup_gates_liveness_and_readiness(manager, http_server):
    ready_srv = await HTTPServer().start()
    try:
        c = {"name": "app", "startupProbe": _http_probe(http_server.port, failureThreshold=1000),
             "livenessProbe": _http_probe(ready_srv.port), "readinessProbe": _http_probe(ready_srv.port)}
        pod = _pod([c])
        http_server.code = 500
        manager.add_pod(pod)
        st = _status(("app", "containerd://d1"))
        manager.update_pod_status(pod, st)
        assert st["containerStatuses"][0]["started"] is False
        assert manager.result(STARTUP, "d1") in (None, UNKNOWN)
        await _until(lambda: len(http_server.requests) >= 3)
        assert not manager.started("containerd://d1")
        assert ready_srv.requests == []  # liveness and readiness wait for the start
        http_server.code = 200
        await _until(lambda: manager.started("containerd://d1"))
        await _until(lambda: manager.ready("containerd://d1"))
        assert ready_srv.requests
        n = len(http_server.requests)
        await asyncio.sleep(0.3)
        assert len(http_server.requests) == n  # the startup probe stopped
        manager.update_pod_status(pod, st)
        assert st["containerStatuses"][0]["started"] is True and st["containerStatuses"][0]["ready"] is True
    finally:
        await ready_srv.stop()


async def test_startup_failure_kills(manager, http_server):
    http_server.code = 500
    c = {"name": "app", "startupProbe": _http_probe(http_server.port, failureThreshold=2)}
    pod = _pod([c])
    manager.add_pod(pod)
    manager.update_pod_status(pod, _status(("app", "containerd://e1")))
    await _until(lambda: manager.startup_failed("e1"))
    assert manager.kill_reason("app", "e1") == ("StartupProbe", "Container app failed startup probe")


async def test_initial_delay(http_server):
    clock = [1000.0]
    m = ProbeManager(None, None, now=lambda: clock[0], rand=lambda: 0.0)
    try:
        c = {"name": "app", "readinessProbe": _http_probe(http_server.port, initialDelaySeconds=5)}
        pod = _pod([c])
        m.add_pod(pod)
        m.update_pod_status(pod, _status(("app", "containerd://f1"), started_at=clock[0]))
        await asyncio.sleep(0.3)
        assert http_server.requests == [] and m.result(READINESS, "f1") == FAILURE
        clock[0] += 4.9  # int(4.9) < 5: still waiting
        await asyncio.sleep(0.2)
        assert http_server.requests == []
        clock[0] += 0.2
        await _until(lambda: m.ready("f1"))
    finally:
        await m.close()


async def test_jitter_at_agent_start(http_server):
    # the agent just started: the first probe waits rand() * period
    m = ProbeManager(None, None, rand=lambda: 0.9)
    try:
        c = {"name": "app", "readinessProbe": {**_http_probe(http_server.port), "periodSeconds": 0.5}}
        pod = _pod([c])
        m.add_pod(pod)
        m.update_pod_status(pod, _status(("app", "containerd://g1")))  # triggers a manual run
        await asyncio.sleep(0.3)
        assert http_server.requests == []
        await _until(lambda: http_server.requests, timeout=1)
    finally:
        await m.close()
    # an agent running for longer than a period probes at once
    m = ProbeManager(None, None, now=lambda: time.time() + 60, rand=lambda: 0.9)
    m.start -= 60
    try:
        n = len(http_server.requests)
        m.add_pod(pod)
        m.update_pod_status(pod, _status(("app", "containerd://g2")))
        await _until(lambda: len(http_server.requests) > n, timeout=0.3)
    finally:
        await m.close()


async def test_worker_ends_with_the_pod(manager, http_server):
    c = {"name": "app", "readinessProbe": _http_probe(http_server.port)}
    pod = _pod([c], restart="Never")
    manager.add_pod(pod)
    manager.update_pod_status(pod, _status(("app", "containerd://h1")))
    await _until(lambda: manager.ready("h1"))
    assert manager.worker_count() == 1
    # terminated under restartPolicy Never: not ready, and the worker ends
    manager.update_pod_status(pod, _status(("app", "containerd://h1"), running=False, exit_code=1))
    await _until(lambda: manager.worker_count() == 0)
    # under Always a terminated container keeps its worker, a terminal phase ends it
    pod2 = _pod([c], uid="u2")
    manager.add_pod(pod2)
    manager.update_pod_status(pod2, _status(("app", "containerd://h2"), running=False, exit_code=0))
    await asyncio.sleep(0.2)
    assert manager.worker_count() == 1 and manager.result(READINESS, "h2") == FAILURE
    manager.update_pod_status(pod2, _status(("app", "containerd://h2"), running=False, phase="Failed"))
    await _until(lambda: manager.worker_count() == 0)


async def test_a_worker_that_ended_is_not_started_again_for_the_same_container(manager, http_server):
    """The agent adds the pod on every sync, and syncs on every probe change: a worker
    ended with its container (restartPolicy Never) must not come back for it, else
    each new worker's initial result would wake a sync that starts the next one."""
    c = {"name": "app", "readinessProbe": _http_probe(http_server.port)}
    pod = _pod([c], restart="Never")
    manager.add_pod(pod)
    manager.update_pod_status(pod, _status(("app", "containerd://e1")))
    await _until(lambda: manager.ready("e1"))
    done = _status(("app", "containerd://e1"), running=False, exit_code=1)
    manager.update_pod_status(pod, done)
    await _until(lambda: manager.worker_count() == 0)
    before = len(manager.changes.uids)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 0.5
    while loop.time() < deadline:   # what the agent's pod worker does on each change
        manager.add_pod(pod)
        manager.update_pod_status(pod, done)
        await asyncio.sleep(0.005)
    assert manager.worker_count() == 0 and len(manager.changes.uids) - before == 0
    # a new container of the same name is probed again
    manager.update_pod_status(pod, _status(("app", "containerd://e2")))
    manager.add_pod(pod)
    await _until(lambda: manager.ready("e2"))
    manager.remove_pod(pod)
    assert not manager._ended


async def test_deletion_makes_liveness_succeed_and_stop(manager, http_server):
    http_server.code = 500
    c = {"name": "app", "livenessProbe": _http_probe(http_server.port, failureThreshold=1000)}
    pod = _pod([c])
    manager.add_pod(pod)
    manager.update_pod_status(pod, _status(("app", "containerd://i1")))
    await _until(lambda: len(http_server.requests) >= 2)
    deleting = {**pod, "metadata": {**pod["metadata"], "deletionTimestamp": "2030-01-01T00:00:00Z"}}
    manager.update_pod_status(deleting, _status(("app", "containerd://i1")))
    await _until(lambda: manager.worker_count() == 0)
    assert not manager.liveness_failed("i1")


async def test_remove_pods(manager, http_server):
    c = {"name": "app", "readinessProbe": _http_probe(http_server.port),
         "livenessProbe": _http_probe(http_server.port)}
    for uid in ("a", "b", "c"):
        manager.add_pod(_pod([c], uid=uid))
    manager.add_pod(_pod([c], uid="a"))  # again: no second worker
    assert manager.worker_count() == 6
    manager.stop_liveness_and_startup(_pod([c], uid="a"))
    await _until(lambda: manager.worker_count() == 5)
    plain = _pod([{"name": "noprobe"}], uid="d")
    manager.update_pod_status(plain, _status(("noprobe", "containerd://d1")))
    assert manager.started("d1") and manager.ready("d1")
    for uid in ("a", "c", "d"):
        manager.remove_pod(uid)
    await _until(lambda: manager.worker_count() == 2)
    assert not manager.started("d1")  # forgotten with its pod


async def test_sidecar_probed_and_init_ready(manager, http_server):
    sidecar = {"name": "side", "restartPolicy": "Always", "readinessProbe": _http_probe(http_server.port)}
    plain_init = {"name": "setup"}
    pod = _pod([{"name": "main"}], init=[plain_init, sidecar])
    manager.add_pod(pod)
    assert manager.worker_count() == 1
    st = _status(("main", "containerd://m1"), init=[("side", "containerd://s1")])
    st["initContainerStatuses"].insert(0, {"name": "setup", "containerID": "containerd://x0",
                                           "state": {"terminated": {"exitCode": 0}}})
    manager.update_pod_status(pod, st)
    assert st["initContainerStatuses"][0]["ready"] is True
    assert st["containerStatuses"][0]["ready"] is True  # no probe: ready once running
    await _until(lambda: manager.ready("s1"))
    manager.update_pod_status(pod, st)
    assert st["initContainerStatuses"][1]["ready"] is True


async def test_adopted_container_keeps_state_after_agent_restart(manager, http_server):
    http_server.code = 500
    c = {"name": "app", "readinessProbe": {**_http_probe(http_server.port), "periodSeconds": 30},
         "startupProbe": {**_http_probe(http_server.port), "periodSeconds": 30}}
    long_ago = time.time() - 3600
    for uid, pod_ready in (("ready", True), ("unready", False)):
        pod = _pod([c], uid=uid)
        # the pod as the API has it, written by the agent before it restarted
        api = _status(("app", f"containerd://{uid}1"), started_at=long_ago)
        api["containerStatuses"][0].update(started=True, ready=pod_ready)
        api["conditions"] = [{"type": "Ready", "status": str(pod_ready)}]
        pod["status"] = api
        manager.add_pod(pod)
        # the runtime's fresh status of the same container
        assert manager.started(f"{uid}1") and manager.ready(f"{uid}1") is pod_ready
        st = manager.update_pod_status(pod, _status(("app", f"containerd://{uid}1"), started_at=long_ago))
        assert st["containerStatuses"][0]["started"] is True
        assert st["containerStatuses"][0]["ready"] is pod_ready
        assert manager.result(READINESS, f"{uid}1") is None and manager.result(STARTUP, f"{uid}1") is None
    # a container started after the agent gets the initial values, whatever the API said
    pod = _pod([c], uid="new")
    api = _status(("app", "containerd://new1"))
    api["containerStatuses"][0].update(started=True, ready=True)
    pod["status"] = api
    manager.add_pod(pod)
    assert not manager.started("new1") and not manager.ready("new1")


async def test_async_on_change_and_probe_error_thrown_away(http_server):
    seen = []

    async def on_change(uid):
        seen.append(uid)

    events = Events()
    m = ProbeManager(None, on_change, recorder=events, rand=lambda: 0.0)
    try:
        # a named port the container does not have: the probe errors, no result is recorded
        bad = {"name": "x", "readinessProbe": {"httpGet": {"port": "nope"}, "periodSeconds": 0.05}}
        pod = _pod([bad])
        m.add_pod(pod)
        m.update_pod_status(pod, _status(("x", "containerd://k1")))
        await _until(lambda: any(r == "Unhealthy" for _, r, _ in events.items))
        assert events.items[0][2].startswith("Readiness probe errored and resulted in unknown state:")
        assert m.result(READINESS, "k1") == FAILURE  # only the initial value
        await _until(lambda: seen == ["u1"])
    finally:
        await m.close()


# ---------------------------------------------------------------- lifecycle hooks

async def test_http_hook_and_https_fallback(http_server):
    events = Events()
    pod = _pod([{"name": "c"}])
    await pr.run_handler(None, pod, {"name": "c"}, "containerd://z",
                         {"httpGet": {"port": http_server.port, "path": "/hook"}}, pod_ip="127.0.0.1")
    req = http_server.requests[-1]
    assert req.path == "/hook" and req.headers["User-Agent"].startswith("kube-lifecycle/")
    # a 500 is not a failed hook (upstream checks only that the request was answered)
    http_server.code = 500
    await pr.run_handler(None, pod, {"name": "c"}, "z", {"httpGet": {"port": http_server.port}},
                         pod_ip="127.0.0.1")
    # HTTPS to a plain HTTP server: retried as HTTP, with an event
    await pr.run_handler(None, pod, {"name": "c"}, "z",
                         {"httpGet": {"port": http_server.port, "scheme": "HTTPS", "path": "/tls"}},
                         pod_ip="127.0.0.1", recorder=events)
    assert http_server.requests[-1].path == "/tls"
    assert events.items == [("Warning", "LifecycleHTTPFallback",
                             f"request to HTTPS lifecycle hook 127.0.0.1:{http_server.port} got HTTP "
                             "response, retry with HTTP succeeded")]
    port = _free_port()
    with pytest.raises(HandlerError) as e:
        await pr.run_handler(None, pod, {"name": "c"}, "z", {"httpGet": {"port": port, "path": "/x"}},
                             pod_ip="127.0.0.1")
    assert e.value.message == (
        f'HTTP lifecycle hook (/x) for Container "c" in Pod "p_default(u1)" failed - error: '
        f'Get "http://127.0.0.1:{port}/x": dial tcp 127.0.0.1:{port}: connect: connection refused')


async def test_sleep_and_unsupported_hooks():
    pod = _pod([{"name": "c"}])
    t0 = time.monotonic()
    await pr.run_handler(None, pod, {"name": "c"}, "z", {"sleep": {"seconds": 1}})
    assert time.monotonic() - t0 >= 0.95
    with pytest.raises(HandlerError, match="^Cannot run handler: invalid handler: tcpSocket"):
        await pr.run_handler(None, pod, {"name": "c"}, "z", {"tcpSocket": {"port": 80}})
    with pytest.raises(HandlerError, match="^Cannot run handler: invalid handler"):
        await pr.run_handler(None, pod, {"name": "c"}, "z", {})


async def test_tcp_and_grpc_workers(manager):
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    tcp_port = server.sockets[0].getsockname()[1]
    serving = {"": 1}

    async def check(req, ctx):
        return serving[req]

    handler = grpc.method_handlers_generic_handler("grpc.health.v1.Health", {
        "Check": grpc.unary_unary_rpc_method_handler(
            check, request_deserializer=pr.decode_health_request,
            response_serializer=pr.encode_health_response)})
    gserver, grpc_port = await _grpc_server([handler])
    try:
        tcp = {"name": "tcp", "ports": [{"name": "t", "containerPort": tcp_port}],
               "readinessProbe": {"tcpSocket": {"port": "t"}, "periodSeconds": 0.05}}
        g = {"name": "g", "livenessProbe": {"grpc": {"port": grpc_port}, "periodSeconds": 0.05,
                                            "failureThreshold": 2}}
        pod = _pod([tcp, g])
        manager.add_pod(pod)
        manager.update_pod_status(pod, _status(("tcp", "containerd://t1"), ("g", "containerd://g1")))
        await _until(lambda: manager.ready("t1"))
        await _until(lambda: manager.result(LIVENESS, "g1") == SUCCESS)
        serving[""] = 2
        await _until(lambda: manager.liveness_failed("g1"))
        assert ("Warning", "Unhealthy",
                'Liveness probe failed: service unhealthy (responded with "NOT_SERVING")') in manager.events.items
        server.close()
        await server.wait_closed()
        await _until(lambda: not manager.ready("t1"))
    finally:
        server.close()
        await gserver.stop(None)
