"""The local wire: the Client protocol between two processes on one machine.

``kubeplane up --split`` and ``kubeplane bench --split`` run the registry in
one process and the scheduler and controllers in another, so that both cores
do work. HTTP would cost the API server about a millisecond per request; this
transport sends length-prefixed orjson frames over a Unix socket instead.

Every frame is a 4-byte big-endian length followed by one orjson-encoded list:

* request ``[id, op, group, version, plural, args]`` where ``op`` is a Client
  method name (or ``cancel`` to stop watch ``id``) and ``args`` its keyword
  arguments, plus ``omit_managed_fields`` (see ``WireClient.managed_fields``);
* reply ``[id, 0, result]``, or ``[id, 1, status]`` for a failed request;
* watch events ``[id, 2, [[type, object], ...]]`` (one burst per frame) and
  ``[id, 3, null]`` when the watch has ended.

One connection carries any number of concurrent requests and watches. The
server side lives in :mod:`kubeplane.client.wireserver`.

Identity: a server started with tokens requires the connection's first frame
to be ``[0, "authenticate", "", "", "", {"token": TOKEN}]`` (answered
``[0, 0, userInfo]``, or ``[0, 1, status]`` and closed); the connection is
then that user. A request or watch may carry ``as: [user, [groups...]]``, the
client's :func:`~kubeplane.auth.user.current_user` when it is not the
process default: the server serves it as that user if the connection's user
may impersonate it (the ``impersonate`` verb, as the HTTP
``Impersonate-User`` header), so the scheduler, controllers and each
simulated node of one process keep their own identities on one connection.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import struct
from typing import Any, Callable

import orjson

from kubeplane.api import errors
from kubeplane.api.resources import ResourceInfo
from kubeplane.client.interface import Obj, PatchType, WatchEvent

OK, FAILED, EVENTS, ENDED = 0, 1, 2, 3
#: the (group, version, plural) slots of a request about no one resource
_NO_RESOURCE = ResourceInfo("", "", "", "", "", False)
#: request and watch argument: the user the request is made as (see above)
ACTING_AS = "as"
#: request and watch argument: leave metadata.managedFields out of returned objects
OMIT_MANAGED_FIELDS = "omit_managed_fields"

#: frames larger than this are refused (a protocol error, not a request error)
MAX_FRAME = 1 << 30
_HEADER = struct.Struct(">I")


def _frame_parts(message: Any) -> tuple[bytes, bytes]:
    """The header and payload of ``message``'s frame; raises if it cannot be framed."""
    payload = orjson.dumps(message)
    if len(payload) > MAX_FRAME:
        raise errors.too_large(MAX_FRAME)
    return _HEADER.pack(len(payload)), payload


def encode_frame(message: Any) -> bytes:
    return b"".join(_frame_parts(message))


def _add_identity(args: dict[str, Any]) -> None:
    from kubeplane.auth.user import SYSTEM_ADMIN, current_user

    user = current_user()
    if user is not SYSTEM_ADMIN:
        args[ACTING_AS] = [user.name, list(user.groups)]


class FrameProtocol(asyncio.Protocol):
    """Splits the byte stream into frames and hands each decoded message on.

    Frames sent during one turn of the event loop leave in one write, at the
    end of the turn: a burst of replies and watch events then costs one
    system call here and one read on the peer, instead of one each.

    :meth:`drain` waits while the socket's send buffer is full (the peer's
    loop is not reading); a peer that reads but queues events without
    consuming them is not slowed down, as with informers over HTTP."""

    def __init__(self, on_message: Callable[[Any], None], on_lost: Callable[[Exception | None], None]) -> None:
        self._on_message = on_message
        self._on_lost = on_lost
        self._buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self._paused = False
        self._drain_waiters: list[asyncio.Future] = []
        self.closed = False
        self._out: list[bytes] = []  # frames not yet written, headers and payloads

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos = 0
        end = len(buf)
        while end - pos >= 4:
            (size,) = _HEADER.unpack_from(buf, pos)
            if size > MAX_FRAME:
                self._protocol_error(f"frame of {size} bytes exceeds the limit")
                return
            if end - pos - 4 < size:
                break
            try:
                message = orjson.loads(memoryview(buf)[pos + 4:pos + 4 + size])
            except orjson.JSONDecodeError as err:
                self._protocol_error(f"undecodable frame: {err}")
                return
            pos += 4 + size
            self._on_message(message)
            if self.closed:
                return
        if pos:
            del buf[:pos]

    def _protocol_error(self, message: str) -> None:
        self._buf.clear()
        if self.transport is not None:
            self.transport.close()
        self.connection_lost(ConnectionError(message))

    def send(self, message: Any) -> None:
        """Queue one frame; raises at once if ``message`` cannot be framed."""
        if self.closed or self.transport is None:
            raise ConnectionResetError("connection closed")
        parts = _frame_parts(message)
        out = self._out
        if not out:
            asyncio.get_running_loop().call_soon(self.flush)
        out.extend(parts)

    def flush(self) -> None:
        """Write the queued frames now."""
        out = self._out
        if not out:
            return
        self._out = []
        if not self.closed and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(out))

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def drain(self) -> None:
        if self.closed:
            raise ConnectionResetError("connection closed")
        if self._paused:
            w = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(w)
            await w

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        self._out = []
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                w.set_exception(ConnectionResetError("connection closed"))
        self._on_lost(exc)


def _lost() -> errors.StatusError:
    return errors.StatusError(503, "ServiceUnavailable", "connection to the API server was lost")


class WireWatch:
    """One watch over the wire; events arrive in bursts and are handed out one by one."""

    def __init__(self, client: "WireClient", wid: int) -> None:
        self._client = client
        self._id = wid
        self._events: collections.deque[WatchEvent] = collections.deque()
        self._ended = False
        self._waiter: asyncio.Future | None = None
        self._closed = False

    def _feed(self, batch: list[list[Any]]) -> None:
        self._events.extend(WatchEvent(t, o) for t, o in batch)
        self._wake()

    def _end(self) -> None:
        self._ended = True
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def __aiter__(self) -> "WireWatch":
        return self

    async def __anext__(self) -> WatchEvent:
        while not self._events:
            if self._ended or self._closed:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._events.popleft()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._wake()
        self._client._cancel_watch(self._id)


class WireClient:
    """Implements :class:`kubeplane.client.interface.Client` over a Unix socket.

    Connects on first use. When the connection drops, requests in flight fail
    with 503 and open watches end (informers then watch again); the next request
    connects again."""

    def __init__(self, path: str, *, field_manager: str = "kubeplane", managed_fields: bool = True,
                 token: str | None = None) -> None:
        self.path = path
        #: sent in the connection's first frame when set
        self.token = token
        self.field_manager = field_manager
        #: False: the server leaves metadata.managedFields out of every object it
        #: returns or streams. For processes that never read them (the scheduler
        #: and the controllers; upstream's scheduler trims them from its pod
        #: informer's objects): often half of an object's bytes, which then
        #: cost neither encoding, decoding nor memory. Updates sent without
        #: managedFields keep the stored ones.
        self.managed_fields = managed_fields
        self._ids = itertools.count(1)
        self._proto: FrameProtocol | None = None
        self._connecting: asyncio.Future | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._watches: dict[int, WireWatch] = {}
        self._closed = False

    # -- connection ------------------------------------------------------------

    async def _connection(self) -> FrameProtocol:
        proto = self._proto
        if proto is not None and not proto.closed:
            return proto
        if self._closed:
            raise errors.StatusError(503, "ServiceUnavailable", "client is closed")
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        try:
            return await asyncio.shield(self._connecting)
        finally:
            if self._connecting is not None and self._connecting.done():
                self._connecting = None

    async def _connect(self) -> FrameProtocol:
        loop = asyncio.get_running_loop()
        try:
            transport, proto = await loop.create_unix_connection(
                lambda: FrameProtocol(self._on_message, self._on_lost), self.path)
        except OSError as err:
            raise errors.StatusError(503, "ServiceUnavailable",
                                     f"cannot connect to the API server at {self.path}: {err}") from None
        if self._closed:  # closed while connecting
            transport.close()
            raise errors.StatusError(503, "ServiceUnavailable", "client is closed")
        if self.token is not None:
            fut = loop.create_future()
            self._pending[0] = fut
            try:
                proto.send([0, "authenticate", "", "", "", {"token": self.token}])
                await fut
            except BaseException:
                transport.close()
                raise
            finally:
                self._pending.pop(0, None)
        self._proto = proto
        return proto

    def _on_lost(self, exc: Exception | None) -> None:
        self._proto = None
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(_lost())
        watches, self._watches = self._watches, {}
        for w in watches.values():
            w._end()

    def _on_message(self, message: Any) -> None:
        rid, kind, body = message
        if kind == EVENTS:
            w = self._watches.get(rid)
            if w is not None:
                w._feed(body)
            return
        if kind == ENDED:
            w = self._watches.pop(rid, None)
            if w is not None:
                w._end()
            return
        fut = self._pending.pop(rid, None)
        if fut is None or fut.done():
            return
        if kind == OK:
            fut.set_result(body)
        else:
            fut.set_exception(errors.StatusError.from_status(body))

    async def _call(self, op: str, res: ResourceInfo, args: dict[str, Any]) -> Any:
        if not self.managed_fields:
            args[OMIT_MANAGED_FIELDS] = True
        _add_identity(args)
        proto = await self._connection()
        rid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            try:
                proto.send([rid, op, res.group, res.version, res.plural, args])
            except ConnectionError:
                raise _lost() from None
            except TypeError as err:  # not JSON-encodable
                raise errors.bad_request(f"cannot encode the request: {err}") from None
            return await fut
        finally:
            self._pending.pop(rid, None)

    def _cancel_watch(self, wid: int) -> None:
        if self._watches.pop(wid, None) is None:
            return
        proto = self._proto
        if proto is not None and not proto.closed:
            try:
                proto.send([wid, "cancel", "", "", "", {}])
            except ConnectionError:
                pass

    async def discover(self) -> list[ResourceInfo]:
        """The resources the server serves now: the ``discovery`` request, which
        answers the aggregated discovery documents of ``/api`` and ``/apis``
        (see :mod:`kubeplane.client.discovery`)."""
        from kubeplane.client.discovery import resources_from_aggregated

        answer = await self._call("discovery", _NO_RESOURCE, {})
        if not isinstance(answer, dict):
            raise errors.internal("malformed discovery answer")
        return resources_from_aggregated(answer.get("api"), answer.get("apis"))

    # -- the Client protocol -----------------------------------------------------

    async def get(self, res: ResourceInfo, name: str, namespace: str | None = None, *,
                  subresource: str | None = None) -> Obj:
        return await self._call("get", res, {"name": name, "namespace": namespace, "subresource": subresource})

    async def list(self, res: ResourceInfo, namespace: str | None = None, *, label_selector: str | None = None,
                   field_selector: str | None = None, limit: int | None = None, continue_token: str | None = None,
                   resource_version: str | None = None, resource_version_match: str | None = None) -> Obj:
        return await self._call("list", res, {
            "namespace": namespace, "label_selector": label_selector, "field_selector": field_selector,
            "limit": limit, "continue_token": continue_token, "resource_version": resource_version,
            "resource_version_match": resource_version_match})

    async def create(self, res: ResourceInfo, obj: Obj, namespace: str | None = None, *,
                     subresource: str | None = None, name: str | None = None, field_manager: str | None = None,
                     dry_run: bool = False) -> Obj:
        return await self._call("create", res, {
            "obj": obj, "namespace": namespace, "subresource": subresource, "name": name,
            "field_manager": field_manager or self.field_manager, "dry_run": dry_run})

    async def update(self, res: ResourceInfo, obj: Obj, *, subresource: str | None = None,
                     field_manager: str | None = None, dry_run: bool = False) -> Obj:
        return await self._call("update", res, {
            "obj": obj, "subresource": subresource, "field_manager": field_manager or self.field_manager,
            "dry_run": dry_run})

    async def patch(self, res: ResourceInfo, name: str, patch: Any, namespace: str | None = None, *,
                    patch_type: PatchType = "merge", subresource: str | None = None,
                    field_manager: str | None = None, force: bool | None = None, dry_run: bool = False) -> Obj:
        return await self._call("patch", res, {
            "name": name, "patch": patch, "namespace": namespace, "patch_type": patch_type,
            "subresource": subresource, "field_manager": field_manager or self.field_manager, "force": force,
            "dry_run": dry_run})

    async def delete(self, res: ResourceInfo, name: str, namespace: str | None = None, *,
                     grace_period_seconds: int | None = None, propagation_policy: str | None = None,
                     preconditions: dict[str, str] | None = None, dry_run: bool = False) -> Obj:
        return await self._call("delete", res, {
            "name": name, "namespace": namespace, "grace_period_seconds": grace_period_seconds,
            "propagation_policy": propagation_policy, "preconditions": preconditions, "dry_run": dry_run})

    async def delete_collection(self, res: ResourceInfo, namespace: str | None = None, *,
                                label_selector: str | None = None, field_selector: str | None = None,
                                grace_period_seconds: int | None = None, propagation_policy: str | None = None,
                                dry_run: bool = False) -> Obj:
        return await self._call("delete_collection", res, {
            "namespace": namespace, "label_selector": label_selector, "field_selector": field_selector,
            "grace_period_seconds": grace_period_seconds, "propagation_policy": propagation_policy,
            "dry_run": dry_run})

    def watch(self, res: ResourceInfo, namespace: str | None = None, *, resource_version: str | None = None,
              label_selector: str | None = None, field_selector: str | None = None, allow_bookmarks: bool = True,
              timeout_seconds: int | None = None, send_initial_events: bool = False) -> WireWatch:
        wid = next(self._ids)
        w = WireWatch(self, wid)
        args = {"namespace": namespace, "resource_version": resource_version, "label_selector": label_selector,
                "field_selector": field_selector, "allow_bookmarks": allow_bookmarks,
                "timeout_seconds": timeout_seconds, "send_initial_events": send_initial_events}
        _add_identity(args)
        if not self.managed_fields:
            args[OMIT_MANAGED_FIELDS] = True
        self._watches[wid] = w
        proto = self._proto
        if proto is not None and not proto.closed:
            self._send_watch(proto, wid, res, args)
        else:
            asyncio.ensure_future(self._start_watch(wid, res, args))
        return w

    def _send_watch(self, proto: FrameProtocol, wid: int, res: ResourceInfo, args: dict[str, Any]) -> None:
        try:
            proto.send([wid, "watch", res.group, res.version, res.plural, args])
        except ConnectionError:
            w = self._watches.pop(wid, None)
            if w is not None:
                w._feed([["ERROR", _lost().to_status()]])
                w._end()

    async def _start_watch(self, wid: int, res: ResourceInfo, args: dict[str, Any]) -> None:
        try:
            proto = await self._connection()
        except errors.StatusError as err:
            w = self._watches.pop(wid, None)
            if w is not None:
                w._feed([["ERROR", err.to_status()]])
                w._end()
            return
        if wid in self._watches:
            self._send_watch(proto, wid, res, args)

    async def close(self) -> None:
        self._closed = True
        proto = self._proto
        if proto is not None and proto.transport is not None:
            proto.flush()
            proto.transport.close()
        await asyncio.sleep(0)
