"""``Store`` on etcd v3 (its gRPC API), as upstream's etcd3 storage.

Keys: the store's ``/registry/...`` keys live under ``--etcd-prefix``
(default ``/registry``, so by default a key is the same in etcd). Values are
the objects' JSON without ``metadata.resourceVersion``: a read stamps the
key's mod revision there, so resourceVersions are etcd's revisions.

Writes are single transactions: a create puts only if the key's
create_revision is 0, an update or delete only if its mod_revision is the
expected one (or, without one, if the key exists); a failed comparison reads
the key in the same transaction, so a conflict reports the state it was
checked against. Lists are ranges at one revision (the first page's; later
pages pass it on). A watch is one etcd watch from ``revision + 1`` with
``prev_kv`` (for DELETED events and old objects) and progress notifications
(the bookmarks' revision). An acknowledged write is committed by etcd's raft
log on a quorum: it survives kill -9 of the API server and of a member.

Several endpoints form one channel that fails over between them.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import urlsplit

import grpc
import orjson

from kubeplane.storage.etcdrpc import rpc_pb2 as pb
from kubeplane.storage.etcdrpc import rpc_pb2_grpc as pbg
from kubeplane.storage.interface import (
    CompactedError,
    Event,
    FutureRevisionError,
    KeyExistsError,
    KeyNotFoundError,
    KeyValue,
    ListResult,
    Obj,
    RevisionConflictError,
    StorageError,
    WriteFailedError,
)
from kubeplane.storage.memory import DEFAULT_WATCH_QUEUE, DEFAULT_WATCH_QUEUE_BYTES, BufferedWatch, stamp

log = logging.getLogger("kubeplane.storage.etcd")

DEFAULT_PREFIX = "/registry"
DEFAULT_COMPACTION_INTERVAL = 300.0
"""Seconds between compactions (upstream's ``--etcd-compaction-interval``, 5m)."""

REQUEST_TIMEOUT = 30.0
"""Seconds one etcd request may take before it fails."""

COMPACT_REV_KEY = b"compact_rev_key"
"""The key API servers agree on compactions through (upstream's, outside the prefix)."""

_OTHER = "/.other"

_TOO_MANY = "too many requests"
_BUSY_RETRY = 0.05

_COMPACTED = "mvcc: required revision has been compacted"
_FUTURE = "mvcc: required revision is a future revision"


@dataclass
class EtcdConfig:
    """How to reach etcd: ``--etcd-servers`` and the options next to it."""

    servers: list[str] = field(default_factory=lambda: ["http://127.0.0.1:2379"])
    prefix: str = DEFAULT_PREFIX
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    compaction_interval: float = DEFAULT_COMPACTION_INTERVAL
    request_timeout: float = REQUEST_TIMEOUT


def parse_servers(value: str) -> list[str]:
    """``--etcd-servers``: comma-separated URLs (``http(s)://host:port``)."""
    servers = [s.strip() for s in value.split(",") if s.strip()]
    if not servers:
        raise ValueError("--etcd-servers must name at least one URL")
    for s in servers:
        parts = urlsplit(s)
        if parts.scheme not in ("http", "https") or not parts.hostname or not parts.port:
            raise ValueError(f"invalid etcd server URL {s!r}: want http(s)://HOST:PORT")
    return servers


def _target(servers: list[str]) -> tuple[str, str, bool]:
    """The gRPC target for ``servers`` (one channel over all of them), the
    authority TLS checks and whether TLS is used."""
    parts = [urlsplit(s) for s in servers]
    secure = parts[0].scheme == "https"
    if any((p.scheme == "https") != secure for p in parts):
        raise ValueError("--etcd-servers must all be http or all https")
    hosts = [(p.hostname or "", p.port or 2379) for p in parts]
    authority = hosts[0][0]
    import ipaddress

    def is_ip(h: str) -> int:
        try:
            return ipaddress.ip_address(h).version
        except ValueError:
            return 0

    versions = {is_ip(h) for h, _ in hosts}
    if len(hosts) == 1 and versions == {0}:
        return f"dns:///{hosts[0][0]}:{hosts[0][1]}", authority, secure
    if versions == {4}:
        return "ipv4:" + ",".join(f"{h}:{p}" for h, p in hosts), authority, secure
    if versions == {6}:
        return "ipv6:" + ",".join(f"[{h}]:{p}" for h, p in hosts), authority, secure
    raise ValueError("several --etcd-servers must all be IPv4 or all IPv6 addresses")


def _prefix_end(prefix: bytes) -> bytes:
    """etcd's range end for every key starting with ``prefix``."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"


class EtcdWatch(BufferedWatch):
    """One etcd watch; implements the ``Watch`` protocol."""

    def __init__(self, store: "EtcdStore", prefix: str, after: int,
                 max_queue: int = DEFAULT_WATCH_QUEUE, max_bytes: int = DEFAULT_WATCH_QUEUE_BYTES) -> None:
        self._store = store
        self.prefix = prefix
        self._after = after
        self._progress = after
        self._buf: deque[Event] = deque()
        self._sizes: deque[int] = deque()
        self._bytes = 0
        self._max_queue = max_queue
        self._max_bytes = max_bytes
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self._error: StorageError | None = None
        self.on_overflow: Callable[[], None] | None = None
        self._call: Any = None
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        store = self._store
        key = store._key(self.prefix)
        # 0: from etcd's current revision (learnt from the creation's answer)
        start = self._after + 1 if self._after else 0
        while not self._closed:
            req = pb.WatchRequest(create_request=pb.WatchCreateRequest(
                key=key, range_end=_prefix_end(key), start_revision=start, prev_kv=True, progress_notify=True))
            try:
                self._call = store._watch_stub.Watch(iter([req]))
                async for resp in self._call:
                    if resp.compact_revision:
                        store._compacted = max(store._compacted, resp.compact_revision - 1)
                        self._fail(CompactedError(start - 1, resp.compact_revision - 1, resp.header.revision))
                        return
                    if resp.canceled:
                        self._fail(StorageError(f"etcd cancelled the watch: {resp.cancel_reason}"))
                        return
                    store._saw(resp.header.revision)
                    if resp.created and start == 0:
                        start = resp.header.revision + 1
                        self._after = self._progress = resp.header.revision
                    for ev in resp.events:
                        event = store._event(ev)
                        start = event.revision + 1
                        self._push(event, len(ev.kv.value) + len(ev.prev_kv.value))
                    if not resp.events and not resp.created:
                        # a progress notification: everything up to it was sent
                        self._progress = max(self._progress, resp.header.revision)
                        self._wake()
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                if self._closed:
                    return
                log.info("etcd watch of %s broke (%s); resuming at revision %d", self.prefix, exc.code().name, start)
                await asyncio.sleep(0.2)
            finally:
                call, self._call = self._call, None
                if call is not None:
                    call.cancel()

    def _fail(self, err: StorageError) -> None:
        self._error = err
        self._wake()

    def _push(self, event: Event, size: int) -> None:
        if self._closed or self._error is not None:
            return
        if len(self._buf) >= self._max_queue or self._bytes + size > self._max_bytes:
            last = self._buf[-1].revision if self._buf else event.revision
            self._buf.clear()
            self._sizes.clear()
            self._bytes = 0
            self._error = CompactedError(last, self._store.compacted_revision, self._store.revision)
            self._task.cancel()
            callback, self.on_overflow = self.on_overflow, None
            if callback is not None:
                callback()
        else:
            self._buf.append(event)
            self._sizes.append(size)
            self._bytes += size
            self._after = event.revision
            self._progress = max(self._progress, event.revision)
        self._wake()

    def progress_revision(self) -> int:
        """The revision this watch has seen everything up to (etcd's progress
        notifications; the bookmarks' revision)."""
        if self._buf or self._error is not None:
            return self._buf[0].revision - 1 if self._buf else self._after
        return self._progress

    def _end(self) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._buf.clear()
        self._sizes.clear()
        self._bytes = 0
        self._task.cancel()
        self._store._watches.discard(self)
        self._wake()


class EtcdStore:
    """A ``Store`` on an etcd cluster; create it with :meth:`open`."""

    def __init__(self, config: EtcdConfig, *, watch_queue: int = DEFAULT_WATCH_QUEUE,
                 watch_queue_bytes: int = DEFAULT_WATCH_QUEUE_BYTES) -> None:
        self.config = config
        target, authority, secure = _target(config.servers)
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", 2 * 1024 * 1024 * 1024 - 1),
            ("grpc.max_send_message_length", 2 * 1024 * 1024 * 1024 - 1),
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 2_000),
        ]
        if secure:
            def read(path: str | None) -> bytes | None:
                if not path:
                    return None
                with open(path, "rb") as f:
                    return f.read()

            creds = grpc.ssl_channel_credentials(read(config.cafile), read(config.keyfile), read(config.certfile))
            options.append(("grpc.ssl_target_name_override", authority))
            self._channel = grpc.aio.secure_channel(target, creds, options=options)
        else:
            self._channel = grpc.aio.insecure_channel(target, options=options)
        self._kv = pbg.KVStub(self._channel)
        self._watch_stub = pbg.WatchStub(self._channel)
        self._lease = pbg.LeaseStub(self._channel)
        self._maintenance = pbg.MaintenanceStub(self._channel)
        prefix = config.prefix.rstrip("/")
        if not prefix.startswith("/"):
            prefix = "/" + prefix
        self._prefix = prefix
        self._timeout = config.request_timeout
        self._rev = 0
        self._compacted = 0
        self._watch_queue = watch_queue
        self._watch_queue_bytes = watch_queue_bytes
        self._watches: set[EtcdWatch] = set()
        self._closed = False
        self._compactor: asyncio.Task | None = None
        self._failure: str | None = None

    @classmethod
    async def open(cls, config: EtcdConfig, *, watch_queue: int = DEFAULT_WATCH_QUEUE,
                   watch_queue_bytes: int = DEFAULT_WATCH_QUEUE_BYTES, connect_timeout: float = 20.0) -> "EtcdStore":
        """Connect (waiting up to ``connect_timeout`` for a member to answer) and
        start the compactor."""
        store = cls(config, watch_queue=watch_queue, watch_queue_bytes=watch_queue_bytes)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + connect_timeout
        while True:
            try:
                await store.refresh_revision(timeout=max(0.5, min(5.0, deadline - loop.time())))
                break
            except StorageError as exc:
                if loop.time() >= deadline:
                    await store.close()
                    raise StorageError(f"cannot reach etcd at {','.join(config.servers)}: {exc}") from None
                await asyncio.sleep(0.2)
        if config.compaction_interval > 0:
            store._compactor = loop.create_task(store._compact_loop(config.compaction_interval))
        return store

    # -- keys and values ---------------------------------------------------

    def _key(self, key: str) -> bytes:
        if not key:
            return (self._prefix + "/").encode()
        if key.startswith("/registry/") or key == "/registry":
            return (self._prefix + key[len("/registry"):]).encode()
        # a key outside /registry (none of the API server's) keeps its whole name
        return (self._prefix + _OTHER + key).encode()

    def _unkey(self, raw: bytes) -> str:
        rest = raw.decode()[len(self._prefix):]
        if rest.startswith(_OTHER):
            return rest[len(_OTHER):]
        return "/registry" + rest

    def _kv_of(self, kv: Any) -> KeyValue:
        return KeyValue(self._unkey(kv.key), stamp(orjson.loads(kv.value), kv.mod_revision),
                        kv.create_revision, kv.mod_revision)

    def _event(self, ev: Any) -> Event:
        key = self._unkey(ev.kv.key)
        rev = ev.kv.mod_revision
        prev = None
        if ev.HasField("prev_kv") and ev.prev_kv.value:
            prev = stamp(orjson.loads(ev.prev_kv.value), ev.prev_kv.mod_revision)
        if ev.type == pb.Event.DELETE:
            if prev is None:
                raise StorageError(f"etcd sent the delete of {key} without its previous value")
            return Event("DELETED", key, stamp(prev, rev), prev, rev)
        value = stamp(orjson.loads(ev.kv.value), rev)
        if ev.kv.create_revision == rev:
            return Event("ADDED", key, value, None, rev)
        return Event("MODIFIED", key, value, prev, rev)

    @staticmethod
    def _encode(value: Obj) -> bytes:
        if not isinstance(value, dict):
            raise TypeError(f"stored values must be dicts, got {type(value).__name__}")
        meta = value.get("metadata")
        if isinstance(meta, dict) and "resourceVersion" in meta:
            meta = {k: v for k, v in meta.items() if k != "resourceVersion"}
            value = {**value, "metadata": meta}
        return orjson.dumps(value)

    def _saw(self, revision: int) -> None:
        if revision > self._rev:
            self._rev = revision

    # -- the Store protocol --------------------------------------------------

    @property
    def revision(self) -> int:
        """The newest revision any etcd answer has carried."""
        return self._rev

    @property
    def compacted_revision(self) -> int:
        return self._compacted

    @property
    def closed(self) -> bool:
        return self._closed

    async def _call(self, method: Any, request: Any, *, write: bool = False, timeout: float | None = None) -> Any:
        """One etcd request. Compaction and future-revision errors come back as
        ``grpc.aio.AioRpcError`` for the caller to map; every other failure is
        a StorageError (WriteFailedError for a write)."""
        if self._closed:
            raise StorageError("store is closed")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (timeout or self._timeout)
        while True:
            try:
                resp = await method(request, timeout=max(0.1, deadline - loop.time()))
            except grpc.aio.AioRpcError as exc:
                details = exc.details() or exc.code().name
                if _TOO_MANY in details and loop.time() + _BUSY_RETRY < deadline:
                    # etcd sheds load while its apply backlog is long: wait and send again
                    await asyncio.sleep(_BUSY_RETRY)
                    continue
                if _COMPACTED in details or _FUTURE in details:
                    raise
                reason = f"etcd: {details}"
                if write:
                    self._failure = reason
                    raise WriteFailedError(reason) from None
                raise StorageError(reason) from None
            break
        if write:
            self._failure = None
        self._saw(resp.header.revision)
        return resp

    async def refresh_revision(self, timeout: float | None = None) -> int:
        """Ask etcd for its current revision (a count-only range, as upstream's
        GetCurrentResourceVersion) and return it."""
        key = self._key("/registry/")
        await self._call(self._kv.Range, pb.RangeRequest(key=key, range_end=_prefix_end(key), count_only=True),
                         timeout=timeout)
        return self._rev

    async def get(self, key: str) -> KeyValue | None:
        resp = await self._call(self._kv.Range, pb.RangeRequest(key=self._key(key)))
        return self._kv_of(resp.kvs[0]) if resp.kvs else None

    async def list(self, prefix: str, *, revision: int = 0, limit: int = 0, start_after: str = "") -> ListResult:
        base = self._key(prefix)
        start = self._key(start_after) + b"\0" if start_after else base
        req = pb.RangeRequest(key=start, range_end=_prefix_end(base), revision=revision, limit=limit)
        try:
            resp = await self._call(self._kv.Range, req)
        except grpc.aio.AioRpcError as exc:
            details = exc.details() or ""
            if _COMPACTED in details:
                await self._learn_compacted()
                raise CompactedError(revision, self._compacted, self._rev) from None
            raise FutureRevisionError(revision, self._rev) from None
        items = [self._kv_of(kv) for kv in resp.kvs]
        return ListResult(items, revision or resp.header.revision, resp.more)

    async def _learn_compacted(self) -> None:
        """Learn the compacted revision from the key compactions record."""
        try:
            resp = await self._call(self._kv.Range, pb.RangeRequest(key=COMPACT_REV_KEY))
        except StorageError:
            return
        if resp.kvs:
            try:
                self._compacted = max(self._compacted, int(resp.kvs[0].value))
            except ValueError:
                pass

    async def create(self, key: str, value: Obj) -> KeyValue:
        k = self._key(key)
        data = self._encode(value)
        resp = await self._call(self._kv.Txn, pb.TxnRequest(
            compare=[pb.Compare(result=pb.Compare.EQUAL, target=pb.Compare.CREATE, key=k, create_revision=0)],
            success=[pb.RequestOp(request_put=pb.PutRequest(key=k, value=data))],
        ), write=True)
        if not resp.succeeded:
            raise KeyExistsError(key)
        rev = resp.header.revision
        return KeyValue(key, stamp(value, rev), rev, rev)

    def _guard(self, k: bytes, expected: int | None) -> Any:
        if expected is None:
            return pb.Compare(result=pb.Compare.GREATER, target=pb.Compare.CREATE, key=k, create_revision=0)
        return pb.Compare(result=pb.Compare.EQUAL, target=pb.Compare.MOD, key=k, mod_revision=expected)

    def _failed(self, key: str, expected: int | None, resp: Any) -> StorageError:
        kvs = resp.responses[0].response_range.kvs if resp.responses else []
        if not kvs:
            return KeyNotFoundError(key)
        current = self._kv_of(kvs[0])
        return RevisionConflictError(key, expected if expected is not None else 0, current)

    async def update(self, key: str, value: Obj, expected_revision: int | None = None) -> KeyValue:
        k = self._key(key)
        resp = await self._call(self._kv.Txn, pb.TxnRequest(
            compare=[self._guard(k, expected_revision)],
            success=[pb.RequestOp(request_put=pb.PutRequest(key=k, value=self._encode(value), prev_kv=True))],
            failure=[pb.RequestOp(request_range=pb.RangeRequest(key=k))],
        ), write=True)
        if not resp.succeeded:
            raise self._failed(key, expected_revision, resp)
        rev = resp.header.revision
        prev = resp.responses[0].response_put.prev_kv
        return KeyValue(key, stamp(value, rev), prev.create_revision, rev)

    async def delete(self, key: str, expected_revision: int | None = None) -> KeyValue:
        k = self._key(key)
        resp = await self._call(self._kv.Txn, pb.TxnRequest(
            compare=[self._guard(k, expected_revision)],
            success=[pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=k, prev_kv=True))],
            failure=[pb.RequestOp(request_range=pb.RangeRequest(key=k))],
        ), write=True)
        if not resp.succeeded:
            raise self._failed(key, expected_revision, resp)
        rev = resp.header.revision
        prev = resp.responses[0].response_delete_range.prev_kvs[0]
        return KeyValue(key, stamp(orjson.loads(prev.value), rev), prev.create_revision, rev)

    def watch(self, prefix: str, revision: int) -> EtcdWatch:
        if self._closed:
            raise StorageError("store is closed")
        if revision < self._compacted:
            raise CompactedError(revision, self._compacted, self._rev)
        # 0: from now, i.e. after every write this store has seen (its own included),
        # not from whenever etcd gets to create the watch
        w = EtcdWatch(self, prefix, revision or self._rev, self._watch_queue, self._watch_queue_bytes)
        self._watches.add(w)
        return w

    async def compact(self, revision: int) -> None:
        """Compact etcd's history at ``revision`` (kept: revisions after it)."""
        if revision <= self._compacted:
            return
        try:
            await self._call(self._kv.Compact, pb.CompactionRequest(revision=revision), write=True)
        except grpc.aio.AioRpcError as exc:
            if _FUTURE in (exc.details() or ""):
                raise FutureRevisionError(revision, self._rev) from None
            await self._learn_compacted()
            return
        self._compacted = revision

    async def _compact_loop(self, interval: float) -> None:
        """Upstream's compactor: every ``interval``, the revision seen at the
        previous tick is compacted by whichever API server first advances the
        shared ``compact_rev_key`` (a transaction on its version), so several
        API servers compact once per interval between them."""
        key = COMPACT_REV_KEY
        version = 0
        previous = 0
        while True:
            await asyncio.sleep(interval)
            try:
                resp = await self._call(self._kv.Txn, pb.TxnRequest(
                    compare=[pb.Compare(result=pb.Compare.EQUAL, target=pb.Compare.VERSION, key=key,
                                        version=version)],
                    success=[pb.RequestOp(request_put=pb.PutRequest(key=key, value=str(self._rev).encode()))],
                    failure=[pb.RequestOp(request_range=pb.RangeRequest(key=key))],
                ), write=True)
                if resp.succeeded:
                    version += 1
                    target, previous = previous, resp.header.revision - 1
                    if target:
                        await self.compact(target)
                        log.info("compacted etcd at revision %d", target)
                else:
                    kvs = resp.responses[0].response_range.kvs
                    version = kvs[0].version if kvs else 0
            except StorageError as exc:
                log.warning("etcd compaction failed: %s", exc)

    # -- health ------------------------------------------------------------

    def write_failure(self) -> str | None:
        return self._failure

    async def check_writable(self) -> str | None:
        if self._failure is not None:
            try:
                await self.refresh_revision(timeout=2.0)
            except StorageError as exc:
                return str(exc)
            self._failure = None
        return self._failure

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for w in list(self._watches):
            w.close()
        if self._compactor is not None:
            self._compactor.cancel()
            try:
                await self._compactor
            except (asyncio.CancelledError, Exception):
                pass
        await self._channel.close()
