"""The local wire beyond the shared client suite: bad frames, lost connections,
flow control, cancelled watches and informers on top of it."""

from __future__ import annotations

import asyncio
import os
import stat
import struct

import orjson
import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.wireserver import WireServer
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.wire import FAILED, OK, WireClient, encode_frame
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

CMS = resource("configmaps")
PODS = resource("pods")


@pytest.fixture
async def registry():
    store = MemoryStore(history=10_000)
    reg = Registry(store, CATALOGUE)
    await ensure_default_namespaces(reg)
    yield reg
    await reg.close()
    await store.close()


@pytest.fixture
async def server(registry, tmp_path):
    srv = WireServer(registry, str(tmp_path / "api.sock"))
    await srv.start()
    yield srv
    await srv.stop()


@pytest.fixture
async def client(server):
    c = WireClient(server.path)
    yield c
    await c.close()


def cm(name: str, **data: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


async def _raw(path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_unix_connection(path)


async def _read_frame(reader: asyncio.StreamReader) -> list:
    (size,) = struct.unpack(">I", await reader.readexactly(4))
    return orjson.loads(await reader.readexactly(size))


async def test_socket_is_private_to_its_owner(server):
    mode = stat.S_IMODE(os.stat(server.path).st_mode)
    assert mode & 0o077 == 0


@pytest.mark.parametrize("garbage", [
    b"\x00\x00\x00\x05{oops",                    # undecodable JSON
    encode_frame({"not": "a list"}),              # wrong shape
    encode_frame([1, "get", "", "v1"]),           # too short
    struct.pack(">I", (1 << 30) + 1) + b"x",      # oversized frame header
])
async def test_malformed_frames_close_only_that_connection(server, client, garbage):
    await client.create(CMS, cm("kept", a="1"), "default")
    reader, writer = await _raw(server.path)
    writer.write(garbage)
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
    writer.close()
    got = await client.get(CMS, "kept", "default")
    assert got["data"] == {"a": "1"}
    assert (await client.create(CMS, cm("after"), "default"))["metadata"]["name"] == "after"


async def test_bad_requests_get_a_status_and_keep_the_connection(server):
    reader, writer = await _raw(server.path)
    writer.write(encode_frame([1, "explode", "", "v1", "configmaps", {}]))
    writer.write(encode_frame([2, "get", "", "v1", "widgets", {"name": "x", "namespace": "default"}]))
    writer.write(encode_frame([3, "get", "", "v1", "configmaps", {"nonsense": 1}]))
    writer.write(encode_frame([4, "list", "", "v1", "configmaps", {"namespace": "default"}]))
    replies = {}
    for _ in range(4):
        rid, kind, body = await asyncio.wait_for(_read_frame(reader), 5)
        replies[rid] = (kind, body)
    writer.close()
    assert replies[1][0] == FAILED and replies[1][1]["code"] == 400 and "explode" in replies[1][1]["message"]
    assert replies[2][0] == FAILED and replies[2][1]["code"] == 404
    assert replies[3][0] == FAILED and replies[3][1]["code"] == 400
    assert replies[4][0] == OK and replies[4][1]["kind"] == "ConfigMapList"


async def test_errors_arrive_as_status_errors(client):
    await client.create(CMS, cm("x"), "default")
    with pytest.raises(StatusError) as exc:
        await client.create(CMS, cm("x"), "default")
    assert exc.value.code == 409 and exc.value.reason == "AlreadyExists"
    with pytest.raises(StatusError) as exc:
        await client.create(CMS, cm("Bad_Name"), "default")
    assert exc.value.code == 422 and exc.value.causes


async def test_concurrent_requests_on_one_connection(client):
    created = await asyncio.gather(*(client.create(CMS, cm(f"c{i}", i=str(i)), "default") for i in range(200)))
    assert {c["metadata"]["name"] for c in created} == {f"c{i}" for i in range(200)}
    listed = await client.list(CMS, "default")
    assert len(listed["items"]) == 200


async def test_large_bursts_arrive_complete_and_in_order(registry, client):
    """More than the socket buffers hold while nobody reads: flow control, nothing lost."""
    w = client.watch(CMS, "default", resource_version="0")
    blob = "x" * 20_000
    for i in range(300):
        await registry.create(CMS, cm(f"big-{i:03d}", blob=blob), "default")
    await asyncio.sleep(0.2)  # let the server run into the full socket
    names = []
    async for ev in w:
        assert ev.type == "ADDED" and ev.object["data"]["blob"] == blob
        names.append(ev.object["metadata"]["name"])
        if len(names) == 300:
            break
    await w.close()
    assert names == [f"big-{i:03d}" for i in range(300)]


async def test_closing_a_watch_stops_it_on_the_server(server, client):
    w = client.watch(CMS, "default")
    await client.create(CMS, cm("one"), "default")
    ev = await asyncio.wait_for(w.__anext__(), 5)
    assert ev.object["metadata"]["name"] == "one"
    (conn,) = server._connections
    assert len(conn.watches) == 1
    await w.close()
    with pytest.raises(StopAsyncIteration):
        await w.__anext__()
    for _ in range(100):
        if not conn.watches:
            break
        await asyncio.sleep(0.01)
    assert not conn.watches


async def test_lost_connection_fails_requests_ends_watches_and_reconnects(registry, tmp_path):
    path = str(tmp_path / "api.sock")
    srv = WireServer(registry, path)
    await srv.start()
    c = WireClient(path)
    try:
        await c.create(CMS, cm("before"), "default")
        w = c.watch(CMS, "default")
        await asyncio.sleep(0.05)
        await srv.stop()
        events = [ev async for ev in w]  # ends instead of hanging
        assert [ev.object["metadata"]["name"] for ev in events if ev.type == "ADDED"] == ["before"]
        with pytest.raises(StatusError) as exc:
            await c.get(CMS, "before", "default")
        assert exc.value.code == 503
        w2 = c.watch(CMS, "default")
        ev = await asyncio.wait_for(w2.__anext__(), 5)
        assert ev.type == "ERROR" and ev.object["code"] == 503
        srv = WireServer(registry, path)
        await srv.start()
        got = await c.get(CMS, "before", "default")  # connects again; nothing was lost
        assert got["metadata"]["name"] == "before"
    finally:
        await c.close()
        await srv.stop()


async def test_expired_resource_version_is_a_410_error_event(client):
    store = MemoryStore(history=5)
    small = Registry(store, CATALOGUE)
    await ensure_default_namespaces(small)
    for i in range(20):
        await small.create(CMS, cm(f"m{i}"), "default")
    srv = WireServer(small, client.path + ".small")
    await srv.start()
    c = WireClient(srv.path)
    try:
        w = c.watch(CMS, "default", resource_version="1")
        ev = await asyncio.wait_for(w.__anext__(), 5)
        assert ev.type == "ERROR" and ev.object["code"] == 410
    finally:
        await c.close()
        await srv.stop()
        await small.close()
        await store.close()


async def test_informer_over_the_wire(registry, client):
    factory = SharedInformerFactory(client)
    inf = factory.informer_for(PODS)
    seen: list[tuple[str, str]] = []
    inf.add_event_handler(lambda o: seen.append(("add", o["metadata"]["name"])),
                          lambda old, new: seen.append(("update", new["metadata"]["name"])),
                          lambda o: seen.append(("delete", o["metadata"]["name"])))
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "c", "image": "nginx"}]}}
    await registry.create(PODS, pod, "default")
    factory.start()
    await factory.wait_for_cache_sync(timeout=5)
    await client.create(PODS, {**pod, "metadata": {"name": "q"}}, "default")
    await client.create(PODS, {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "q"},
                               "target": {"kind": "Node", "name": "n1"}}, "default",
                        subresource="binding", name="q")
    await client.delete(PODS, "p", "default", grace_period_seconds=0)
    for _ in range(200):
        if ("delete", "p") in seen and ("update", "q") in seen:
            break
        await asyncio.sleep(0.01)
    await factory.stop()
    assert seen[0] == ("add", "p") and ("add", "q") in seen and ("update", "q") in seen and ("delete", "p") in seen
    assert inf.indexer.get_by_key("default/q")["spec"]["nodeName"] == "n1"


async def test_a_live_socket_is_not_taken_over_and_a_stale_one_is(registry, server, tmp_path):
    second = WireServer(registry, server.path)
    with pytest.raises(OSError, match="another server"):
        await second.start()
    stale = tmp_path / "stale.sock"
    import socket as _socket

    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    s.bind(str(stale))
    s.close()  # the file stays, nobody listens
    third = WireServer(registry, str(stale))
    await third.start()
    try:
        c = WireClient(third.path)
        assert (await c.list(CMS, "default"))["kind"] == "ConfigMapList"
        await c.close()
    finally:
        await third.stop()


async def test_an_unencodable_argument_fails_cleanly(client):
    with pytest.raises(StatusError) as exc:
        await client.create(CMS, {"metadata": {"name": "x"}, "data": {"a": object()}}, "default")
    assert exc.value.code == 400
    assert client._pending == {}
    assert (await client.create(CMS, cm("fine"), "default"))["metadata"]["name"] == "fine"


async def test_requests_that_never_wait_cost_no_task_and_waiting_ones_finish_or_cancel(server, client, monkeypatch):
    tasks: list[asyncio.Task] = []
    loop = asyncio.get_running_loop()
    real_create_task = loop.create_task

    def counting(coro, **kw):
        task = real_create_task(coro, **kw)
        tasks.append(task)
        return task
    monkeypatch.setattr(loop, "create_task", counting)
    await client.create(CMS, cm("quick"), "default")
    for _ in range(20):
        assert (await client.get(CMS, "quick", "default"))["metadata"]["name"] == "quick"
    server_side = [t for t in tasks if any(n in repr(t.get_coro()) for n in ("_request", "_finish"))]
    assert server_side == []  # answered in the frame callback

    # A request that waits continues as a task: its reply still arrives ...
    gate = asyncio.Event()
    cancelled: list[str] = []
    real_get = server.client.get

    async def slow_get(res, name, namespace=None, **kw):
        try:
            await gate.wait()
        except asyncio.CancelledError:
            cancelled.append(name)
            raise
        return await real_get(res, name, namespace, **kw)
    monkeypatch.setattr(server.client, "get", slow_get)
    pending = asyncio.ensure_future(client.get(CMS, "quick", "default"))
    await asyncio.sleep(0.05)
    (conn,) = server._connections
    assert len(conn.tasks) == 1 and not pending.done()
    gate.set()
    assert (await asyncio.wait_for(pending, 5))["metadata"]["name"] == "quick"
    assert conn.tasks == {}
    # ... and one waiting when the connection goes is cancelled inside the request.
    gate.clear()
    stuck = asyncio.ensure_future(client.get(CMS, "quick", "default"))
    await asyncio.sleep(0.05)
    assert len(conn.tasks) == 1
    await client.close()
    with pytest.raises(StatusError):
        await asyncio.wait_for(stuck, 5)
    await asyncio.sleep(0.05)
    assert cancelled == ["quick"] and conn.tasks == {}


class _CountingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:  # type: ignore[override]
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing


async def test_frames_sent_in_one_turn_leave_in_one_write() -> None:
    from kubeplane.client.wire import FrameProtocol

    got: list = []
    proto = FrameProtocol(got.append, lambda exc: None)
    tr = _CountingTransport()
    proto.connection_made(tr)
    for i in range(5):
        proto.send([i, OK, {"n": i}])
    assert tr.writes == []  # nothing written before the turn ends
    await asyncio.sleep(0)
    assert len(tr.writes) == 1
    # The one write holds the five frames in order.
    reader = FrameProtocol(got.append, lambda exc: None)
    reader.data_received(tr.writes[0])
    assert got == [[i, OK, {"n": i}] for i in range(5)]
    # A message that cannot be encoded raises at once and leaves the queue as it was.
    proto.send([9, OK, None])
    with pytest.raises(TypeError):
        proto.send([10, OK, object()])
    proto.flush()
    assert len(tr.writes) == 2
    # Frames queued when the connection is lost are dropped, not written.
    proto.send([11, OK, None])
    proto.connection_lost(None)
    await asyncio.sleep(0)
    assert len(tr.writes) == 2


async def test_a_client_without_managed_fields_never_receives_them(server, client):
    """``managed_fields=False``: replies, lists and watch events leave out
    metadata.managedFields; the stored objects keep them, and an update sent
    from a trimmed object keeps the stored entries."""
    lean = WireClient(server.path, managed_fields=False, field_manager="lean")
    try:
        w = lean.watch(CMS, "default")
        created = await lean.create(CMS, cm("trim", a="1"), "default")
        assert "managedFields" not in created["metadata"] and created["data"] == {"a": "1"}
        ev = await asyncio.wait_for(w.__anext__(), 5)
        assert ev.type == "ADDED" and "managedFields" not in ev.object["metadata"]
        assert ev.object["kind"] == "ConfigMap" and ev.object["metadata"]["name"] == "trim"
        got = await lean.get(CMS, "trim", "default")
        assert "managedFields" not in got["metadata"]
        listed = await lean.list(CMS, "default")
        assert listed["items"] and all("managedFields" not in o["metadata"] for o in listed["items"])
        # A full client sees what is stored.
        full = await client.get(CMS, "trim", "default")
        assert [e["manager"] for e in full["metadata"]["managedFields"]] == ["lean"]
        got["data"]["b"] = "2"
        updated = await lean.update(CMS, got)
        assert "managedFields" not in updated["metadata"]
        ev = await asyncio.wait_for(w.__anext__(), 5)
        assert ev.type == "MODIFIED" and "managedFields" not in ev.object["metadata"]
        full = await client.get(CMS, "trim", "default")
        (entry,) = full["metadata"]["managedFields"]
        assert entry["manager"] == "lean" and "f:b" in entry["fieldsV1"]["f:data"]
        await w.close()
    finally:
        await lean.close()


async def test_an_undecryptable_value_is_an_internal_error_as_over_http(tmp_path):
    from kubeplane.storage.transformer import IDENTITY, TransformingStore, ValueTransformer, aes_provider

    backend = MemoryStore()
    sealed = ValueTransformer([aes_provider("aesgcm", [("key1", bytes(32))])])
    writer = TransformingStore(backend, lambda key: sealed)
    await writer.create(CMS.storage_key("locked", "default"),
                        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "locked", "namespace": "default"}})
    reg = Registry(TransformingStore(backend, lambda key: IDENTITY), CATALOGUE)  # served without the key
    await ensure_default_namespaces(reg)
    srv = WireServer(reg, str(tmp_path / "enc.sock"))
    await srv.start()
    c = WireClient(srv.path)
    try:
        with pytest.raises(StatusError) as exc:
            await c.get(CMS, "locked", "default")
        assert exc.value.code == 500 and exc.value.reason == "InternalError"
        assert str(exc.value.message) == "Internal error occurred: identity transformer tried to read encrypted data"
        await c.create(CMS, cm("fine"), "default")  # the rest keeps working
    finally:
        await c.close()
        await srv.stop()
        await reg.close()
