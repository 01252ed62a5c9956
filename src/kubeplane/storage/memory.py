"""In-memory MVCC store (the etcd model) and the core that durable backends build on.

The core keeps the current value of every key, a sorted key list for prefix
ranges and a log of every change since the compacted revision. The log serves
both watches that start at an older revision and lists at an older revision
(the state at revision R is the current state with the changes after R undone).
Stored dicts are shared read-only with callers and never mutated.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Literal

import orjson
from sortedcontainers import SortedList

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
)

DEFAULT_HISTORY = 10_000
"""Revisions of history (events and old versions) kept by auto-compaction."""

DEFAULT_HISTORY_BYTES = 256 * 1024 * 1024
"""Bytes of history (estimated from each change's encoded size) kept by auto-compaction."""

DEFAULT_WATCH_QUEUE = 10_000
"""Undelivered live events a watcher may accumulate before it is dropped."""

DEFAULT_WATCH_QUEUE_BYTES = 32 * 1024 * 1024
"""Bytes of undelivered live events a watcher may accumulate before it is dropped."""

Op = Literal["create", "update", "delete"]


def stamp(value: Obj, revision: int) -> Obj:
    """A shallow copy of ``value`` with ``metadata.resourceVersion`` set to ``revision``."""
    if not isinstance(value, dict):
        raise TypeError(f"stored values must be dicts, got {type(value).__name__}")
    meta = value.get("metadata")
    if meta is None:
        meta = {}
    elif not isinstance(meta, dict):
        raise TypeError(f"metadata must be a dict, got {type(meta).__name__}")
    out = dict(value)
    new_meta = dict(meta)
    new_meta["resourceVersion"] = str(revision)
    out["metadata"] = new_meta
    return out


@dataclass(frozen=True, slots=True)
class Change:
    """One validated write: the new state of ``key`` (None when deleted) and the state before."""

    key: str
    new: KeyValue | None
    prev: KeyValue | None
    event: Event
    result: KeyValue

    @property
    def revision(self) -> int:
        return self.event.revision


def plan_change(
    op: Op, key: str, value: Obj | None, expected: int | None, current: KeyValue | None, revision: int
) -> Change:
    """Validate ``op`` against ``current`` and build the change it makes at ``revision``."""
    if not isinstance(key, str) or not key:
        raise TypeError("keys must be non-empty strings")
    if op == "create":
        if current is not None:
            raise KeyExistsError(key)
        assert value is not None
        kv = KeyValue(key, stamp(value, revision), revision, revision)
        return Change(key, kv, None, Event("ADDED", key, kv.value, None, revision), kv)
    if current is None:
        raise KeyNotFoundError(key)
    if expected is not None and expected != current.mod_revision:
        raise RevisionConflictError(key, expected, current)
    if op == "update":
        assert value is not None
        kv = KeyValue(key, stamp(value, revision), current.create_revision, revision)
        return Change(key, kv, current, Event("MODIFIED", key, kv.value, current.value, revision), kv)
    gone = KeyValue(key, stamp(current.value, revision), current.create_revision, revision)
    return Change(key, None, current, Event("DELETED", key, gone.value, current.value, revision), gone)


def change_size(change: Change) -> int:
    """The encoded size of the object a change's event carries: the byte estimate
    used to bound history and watch buffers (one ``orjson.dumps`` per change)."""
    value = change.new.value if change.new is not None else change.event.value
    return len(change.key) + len(orjson.dumps(value))


def _prefix_end(prefix: str) -> str | None:
    """The smallest string greater than every string starting with ``prefix``."""
    for i in range(len(prefix) - 1, -1, -1):
        code = ord(prefix[i])
        if code < 0x10FFFF:
            return prefix[:i] + chr(code + 1)
    return None


class BufferedWatch:
    """The reading side every backend's watch shares: events buffered in
    ``_buf`` (their sizes in ``_sizes``, ``_bytes`` in all), a parked reader's
    ``_waiter``, ``_closed``, and ``_error`` raised once the buffer is read.
    Subclasses fill the buffer and say in :meth:`_end` what ending takes."""

    _buf: deque[Event]
    _sizes: deque[int]
    _bytes: int
    _waiter: "asyncio.Future[None] | None"
    _closed: bool
    _error: StorageError | None

    def _end(self) -> None:
        """The watch ends after its error was raised."""
        self._closed = True

    @property
    def buffered_bytes(self) -> int:
        """Estimated bytes of the events waiting to be read."""
        return self._bytes

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def __aiter__(self) -> "BufferedWatch":
        return self

    async def __anext__(self) -> Event:
        while True:
            if self._closed:
                raise StopAsyncIteration
            if self._buf:
                self._bytes -= self._sizes.popleft()
                return self._buf.popleft()
            if self._error is not None:
                err, self._error = self._error, None
                self._end()
                raise err
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    @property
    def waiting(self) -> bool:
        """True while a reader is parked in ``__anext__``/``next_batch`` for the
        next event (nothing buffered, not closed): a sync point for callers
        that must know the reader really waits."""
        return self._waiter is not None and not self._waiter.done()

    async def next_batch(self, timeout: float | None = None) -> list[Event] | None:
        """Every buffered event at once, waiting up to ``timeout`` for the first.

        Returns ``[]`` on timeout and ``None`` once the watch is closed;
        raises CompactedError when the watcher fell behind. Taking events in
        batches lets the API server write a burst with one socket write.
        """
        while True:
            if self._closed:
                return None
            if self._buf:
                out = list(self._buf)
                self._buf.clear()
                self._sizes.clear()
                self._bytes = 0
                return out
            if self._error is not None:
                err, self._error = self._error, None
                self._end()
                raise err
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                if timeout is None:
                    await self._waiter
                else:
                    done, _ = await asyncio.wait({self._waiter}, timeout=timeout)
                    if not done:
                        return []
            finally:
                if self._waiter is not None and not self._waiter.done():
                    self._waiter.cancel()
                self._waiter = None



class MemoryWatch(BufferedWatch):
    """A watch fed by :class:`MemoryCore`; implements the ``Watch`` protocol."""

    def __init__(
        self,
        core: "MemoryCore",
        prefix: str,
        after: int,
        backlog: Iterable[tuple[Event, int]],
        max_queue: int,
        max_bytes: int = DEFAULT_WATCH_QUEUE_BYTES,
    ) -> None:
        self._core = core
        self.prefix = prefix
        self._after = after
        self._buf: deque[Event] = deque()
        # Sizes of the buffered events, in step with ``_buf``.
        self._sizes: deque[int] = deque()
        for event, size in backlog:
            self._buf.append(event)
            self._sizes.append(size)
        self._bytes = sum(self._sizes)
        # The backlog replayed from history is owed to the watcher; the bounds
        # apply to what piles up on top of it.
        self._limit = max_queue + len(self._buf)
        self._byte_limit = max_bytes + self._bytes
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self._error: StorageError | None = None
        #: called once when the watcher is dropped for not keeping up, so the
        #: transport serving it can be closed even if it is stuck writing.
        self.on_overflow: Callable[[], None] | None = None

    def _push(self, event: Event, size: int = 0) -> None:
        if self._closed or self._error is not None or event.revision <= self._after:
            return
        if len(self._buf) >= self._limit or self._bytes + size > self._byte_limit:
            # Too slow: drop the buffer and make the client relist.
            last = self._buf[-1].revision if self._buf else event.revision
            self._buf.clear()
            self._sizes.clear()
            self._bytes = 0
            self._error = CompactedError(last, self._core.compacted_revision, self._core.revision)
            self._core._watchers.discard(self)
            callback, self.on_overflow = self.on_overflow, None
            if callback is not None:
                callback()
        else:
            self._buf.append(event)
            self._sizes.append(size)
            self._bytes += size
        self._wake()

    def progress_revision(self) -> int:
        """The revision this watcher has provably seen everything up to.

        Events are fanned out synchronously with the revision bump, so an
        empty buffer means the watcher is caught up with the store (what an
        etcd progress notification says); used for watch bookmarks.
        """
        if self._buf or self._error is not None:
            return self._after
        return max(self._after, self._core.revision)

    def close(self) -> None:
        """End the watch; a pending or later ``__anext__`` stops iteration."""
        self._closed = True
        self._buf.clear()
        self._sizes.clear()
        self._bytes = 0
        self._core._watchers.discard(self)
        self._wake()


class MemoryCore:
    """Synchronous MVCC state: current values, sorted keys, change log, watchers."""

    def __init__(
        self,
        *,
        revision: int = 1,
        items: Iterable[KeyValue] = (),
        history: int = DEFAULT_HISTORY,
        watch_queue: int = DEFAULT_WATCH_QUEUE,
        history_bytes: int = DEFAULT_HISTORY_BYTES,
        watch_queue_bytes: int = DEFAULT_WATCH_QUEUE_BYTES,
        compacted: int | None = None,
        log: Iterable[tuple[Change, int]] = (),
    ) -> None:
        """``compacted`` and ``log`` restore history kept by a durable backend:
        the changes after ``compacted`` up to ``revision``, with their sizes."""
        if history < 1:
            raise ValueError("history must be at least 1")
        if history_bytes < 1:
            raise ValueError("history_bytes must be at least 1")
        self._revision = revision
        self._current: dict[str, KeyValue] = {kv.key: kv for kv in items}
        # Sorted for range reads; a SortedList inserts in O(log n) where a
        # plain list moves every later key on each create.
        self._keys: SortedList = SortedList(self._current)
        # _log[i].revision == _compacted + 1 + i: one change per revision.
        self._log: list[Change] = []
        # Estimated bytes of each logged change, in step with ``_log``.
        self._sizes: list[int] = []
        for change, size in log:
            self._log.append(change)
            self._sizes.append(size)
        self._log_bytes = sum(self._sizes)
        self._compacted = revision - len(self._log) if compacted is None else compacted
        if self._log and (self._log[0].revision != self._compacted + 1 or self._log[-1].revision != revision):
            raise StorageError(
                f"history revisions {self._log[0].revision}..{self._log[-1].revision} do not follow "
                f"compacted revision {self._compacted} up to {revision}"
            )
        self._history = history
        self._slack = max(1, history // 8)
        self._history_bytes = history_bytes
        self._watch_queue = watch_queue
        self._watch_queue_bytes = watch_queue_bytes
        self._watchers: set[MemoryWatch] = set()
        #: called with the new compacted revision after every compaction
        #: (durable backends trim their copy of the history).
        self.on_compact: Callable[[int], None] | None = None

    @property
    def revision(self) -> int:
        return self._revision

    @property
    def compacted_revision(self) -> int:
        return self._compacted

    def get(self, key: str) -> KeyValue | None:
        return self._current.get(key)

    def __len__(self) -> int:
        return len(self._current)

    # -- reads -------------------------------------------------------------

    def _check_revision(self, revision: int) -> int:
        if revision <= 0:
            return self._revision
        if revision > self._revision:
            raise FutureRevisionError(revision, self._revision)
        if revision < self._compacted:
            raise CompactedError(revision, self._compacted, self._revision)
        return revision

    def _key_range(self, prefix: str, start_after: str) -> tuple[int, int]:
        keys = self._keys
        lo = keys.bisect_left(prefix)
        if start_after:
            lo = max(lo, keys.bisect_right(start_after))
        end = _prefix_end(prefix) if prefix else None
        if not prefix:
            hi = len(keys)
        elif end is not None:
            hi = keys.bisect_left(end)
        else:
            hi = lo
            while hi < len(keys) and keys[hi].startswith(prefix):
                hi += 1
        return lo, max(lo, hi)

    def list(self, prefix: str, *, revision: int = 0, limit: int = 0, start_after: str = "") -> ListResult:
        at = self._check_revision(revision)
        lo, hi = self._key_range(prefix, start_after)
        if at == self._revision:
            cur = self._current
            more = bool(limit) and hi - lo > limit
            if more:
                hi = lo + limit
            return ListResult([cur[k] for k in self._keys.islice(lo, hi)], at, more)
        # Undo the changes after ``at``: the oldest one per key gives its state at ``at``.
        overrides: dict[str, KeyValue | None] = {}
        log = self._log
        for i in range(len(log) - 1, at - self._compacted - 1, -1):
            ch = log[i]
            k = ch.key
            if k.startswith(prefix) and k > start_after:
                overrides[k] = ch.prev
        cur = self._current
        live: Iterator[str] = (k for k in self._keys.islice(lo, hi) if k not in overrides)
        extra = sorted(k for k, kv in overrides.items() if kv is not None)
        merged = heapq.merge(live, extra)
        take = itertools.islice(merged, limit + 1) if limit else merged
        items: list[KeyValue] = []
        for k in take:
            old = overrides.get(k)
            items.append(old if old is not None else cur[k])
        more = bool(limit) and len(items) > limit
        if more:
            del items[limit:]
        return ListResult(items, at, more)

    # -- writes ------------------------------------------------------------

    @property
    def history_bytes(self) -> int:
        """Estimated bytes of the changes kept as history."""
        return self._log_bytes

    def apply(self, change: Change, size: int = 0) -> None:
        """Make ``change`` current, log it and fan it out to watchers.

        ``size`` is the change's estimated size in bytes (see :func:`change_size`).
        """
        if change.revision != self._revision + 1:
            raise StorageError(f"out-of-order revision {change.revision}, current {self._revision}")
        key = change.key
        if change.new is None:
            del self._current[key]
            self._keys.remove(key)
        else:
            if key not in self._current:
                self._keys.add(key)
            self._current[key] = change.new
        self._revision = change.revision
        self._log.append(change)
        self._sizes.append(size)
        self._log_bytes += size
        event = change.event
        for w in tuple(self._watchers):
            if key.startswith(w.prefix):
                w._push(event, size)
        if len(self._log) > self._history + self._slack:
            self.compact(self._revision - self._history)
        if self._log_bytes > self._history_bytes:
            self.compact(self._compacted + self._bytes_to_drop(self._history_bytes - self._history_bytes // 8))

    def _bytes_to_drop(self, keep: int) -> int:
        """How many of the oldest changes to forget so at most ``keep`` bytes remain."""
        excess = self._log_bytes - keep
        n = 0
        sizes = self._sizes
        while excess > 0 and n < len(sizes):
            excess -= sizes[n]
            n += 1
        return n

    def compact(self, revision: int) -> None:
        """Forget changes at or below ``revision``; lists at ``revision`` itself stay possible."""
        if revision > self._revision:
            raise FutureRevisionError(revision, self._revision)
        if revision <= self._compacted:
            return
        n = revision - self._compacted
        self._log_bytes -= sum(self._sizes[:n])
        del self._log[:n]
        del self._sizes[:n]
        self._compacted = revision
        if self.on_compact is not None:
            self.on_compact(revision)

    # -- watches -----------------------------------------------------------

    def watch(self, prefix: str, revision: int) -> MemoryWatch:
        """Watch changes under ``prefix`` after ``revision`` (0: from now on)."""
        if revision <= 0:
            revision = self._revision
        if revision < self._compacted:
            raise CompactedError(revision, self._compacted, self._revision)
        start = revision - self._compacted
        backlog = [
            (ch.event, size)
            for ch, size in zip(itertools.islice(self._log, start, None), itertools.islice(self._sizes, start, None))
            if ch.key.startswith(prefix)
        ]
        w = MemoryWatch(self, prefix, revision, backlog, self._watch_queue, self._watch_queue_bytes)
        self._watchers.add(w)
        return w

    def close_watches(self) -> None:
        for w in tuple(self._watchers):
            w.close()


class MemoryStore:
    """A non-durable ``Store`` kept entirely in memory."""

    def __init__(
        self,
        *,
        history: int = DEFAULT_HISTORY,
        watch_queue: int = DEFAULT_WATCH_QUEUE,
        history_bytes: int = DEFAULT_HISTORY_BYTES,
        watch_queue_bytes: int = DEFAULT_WATCH_QUEUE_BYTES,
    ) -> None:
        self._core = MemoryCore(
            history=history, watch_queue=watch_queue, history_bytes=history_bytes, watch_queue_bytes=watch_queue_bytes
        )
        self._closed = False

    @property
    def revision(self) -> int:
        return self._core.revision

    @property
    def compacted_revision(self) -> int:
        return self._core.compacted_revision

    async def get(self, key: str) -> KeyValue | None:
        return self._core.get(key)

    async def list(
        self, prefix: str, *, revision: int = 0, limit: int = 0, start_after: str = ""
    ) -> ListResult:
        return self._core.list(prefix, revision=revision, limit=limit, start_after=start_after)

    def count(self, prefix: str) -> int:
        """How many keys are under ``prefix`` now (two bisections: cheap enough for a metrics scrape)."""
        lo, hi = self._core._key_range(prefix, "")
        return max(0, hi - lo)

    async def create(self, key: str, value: Obj) -> KeyValue:
        return await self._write("create", key, value, None)

    async def update(self, key: str, value: Obj, expected_revision: int | None = None) -> KeyValue:
        return await self._write("update", key, value, expected_revision)

    async def delete(self, key: str, expected_revision: int | None = None) -> KeyValue:
        return await self._write("delete", key, None, expected_revision)

    def watch(self, prefix: str, revision: int) -> MemoryWatch:
        return self._core.watch(prefix, revision)

    async def compact(self, revision: int) -> None:
        self._core.compact(revision)

    async def close(self) -> None:
        self._closed = True
        self._core.close_watches()

    # -- health ------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def write_failure(self) -> str | None:
        """Why writes fail now, or None when they work (memory never fails)."""
        return None

    async def check_writable(self) -> str | None:
        """:meth:`write_failure`, after checking with the backend where it can tell."""
        return self.write_failure()

    # -- write pipeline (overridden by durable backends) -------------------

    def _check_writable(self) -> None:
        if self._closed:
            raise StorageError("store is closed")

    def _lookup(self, key: str) -> KeyValue | None:
        """The latest state of ``key`` that writes validate against."""
        return self._core.get(key)

    def _next_revision(self) -> int:
        return self._core.revision + 1

    async def _write(self, op: Op, key: str, value: Obj | None, expected: int | None) -> KeyValue:
        self._check_writable()
        change = plan_change(op, key, value, expected, self._lookup(key), self._next_revision())
        await self._commit(change)
        return change.result

    async def _commit(self, change: Change) -> None:
        self._core.apply(change, change_size(change))
