"""Durable ``Store``: the in-memory core backed by an SQLite file.

Every object lives in memory (reads never touch the disk) and in the
``objects`` table. Writes are validated and given their revision in order on
the event loop, then handed to one writer thread which commits whatever is
pending in a single transaction (group commit, ``synchronous=FULL``). Only
after the commit does a write become visible, in revision order, and its
caller get an answer: an acknowledged write is on disk.
"""

from __future__ import annotations

import asyncio
import os
import queue
import sqlite3
import threading
from typing import Any

import orjson

from kubeplane.storage.interface import KeyValue, StorageError
from kubeplane.storage.memory import (
    DEFAULT_HISTORY,
    DEFAULT_WATCH_QUEUE,
    Change,
    MemoryCore,
    MemoryStore,
)

DB_FILE = "kubeplane.db"
MAX_BATCH = 2_000
"""Most writes committed in one transaction."""

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS objects ("
    " key TEXT PRIMARY KEY, create_rev INTEGER NOT NULL, mod_rev INTEGER NOT NULL, value BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS meta (id INTEGER PRIMARY KEY CHECK (id = 0), revision INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO meta (id, revision) VALUES (0, 1)",
)

_Pending = tuple[Change, "asyncio.Future[None]"]


def _connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    for stmt in _SCHEMA:
        conn.execute(stmt)
    return conn


def _load(conn: sqlite3.Connection) -> tuple[int, list[KeyValue]]:
    (revision,) = conn.execute("SELECT revision FROM meta WHERE id = 0").fetchone()
    items = [
        KeyValue(key, orjson.loads(value), create_rev, mod_rev)
        for key, create_rev, mod_rev, value in conn.execute(
            "SELECT key, create_rev, mod_rev, value FROM objects"
        )
    ]
    return int(revision), items


def _open(path: str) -> tuple[sqlite3.Connection, int, list[KeyValue]]:
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, mode=0o700, exist_ok=True)
    # Private to this user: SQLite gives its -wal and -shm files the database's mode.
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    conn = _connect(path)
    try:
        revision, items = _load(conn)
    except BaseException:
        conn.close()
        raise
    return conn, revision, items


class SQLiteStore(MemoryStore):
    """A durable ``Store`` in one SQLite file; create it with :meth:`open`."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        revision: int,
        items: list[KeyValue],
        *,
        history: int = DEFAULT_HISTORY,
        watch_queue: int = DEFAULT_WATCH_QUEUE,
    ) -> None:
        """Use :meth:`open`; this wraps an already opened and loaded database."""
        super().__init__(history=history, watch_queue=watch_queue)
        self._core = MemoryCore(revision=revision, items=items, history=history, watch_queue=watch_queue)
        self._conn = conn
        self._loop = asyncio.get_running_loop()
        # Writes validated but not yet committed: key -> (revision, new state or None if deleted).
        self._staged: dict[str, tuple[int, KeyValue | None]] = {}
        self._staged_revision = revision
        self._failure: BaseException | None = None
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._writer, name="kubeplane-sqlite-writer", daemon=True)
        self._thread.start()

    @classmethod
    async def open(
        cls, path: str, *, history: int = DEFAULT_HISTORY, watch_queue: int = DEFAULT_WATCH_QUEUE
    ) -> "SQLiteStore":
        """Open (creating if needed) the database at ``path`` and load it into memory."""
        conn, revision, items = await asyncio.to_thread(_open, path)
        return cls(conn, revision, items, history=history, watch_queue=watch_queue)

    # -- write pipeline ----------------------------------------------------

    def _check_writable(self) -> None:
        super()._check_writable()
        if self._failure is not None:
            raise StorageError(f"store failed: {self._failure!r}")

    def _lookup(self, key: str) -> KeyValue | None:
        staged = self._staged.get(key)
        if staged is not None:
            return staged[1]
        return self._core.get(key)

    def _next_revision(self) -> int:
        return self._staged_revision + 1

    async def _commit(self, change: Change) -> None:
        # Runs without suspending until the put: validation, revision and queue order agree.
        self._staged_revision = change.revision
        self._staged[change.key] = (change.revision, change.new)
        fut: asyncio.Future[None] = self._loop.create_future()
        self._queue.put((change, fut))
        # A cancelled caller cancels only its wait: the write still commits and is published.
        await fut

    def _writer(self) -> None:
        """Writer thread: commit pending writes in batches, then report back to the loop."""
        conn = self._conn
        failed: BaseException | None = None
        try:
            while True:
                item = self._queue.get()
                if item is None:
                    return
                batch = [item]
                stop = False
                while len(batch) < MAX_BATCH:
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None:
                        stop = True
                        break
                    batch.append(nxt)
                if failed is None:
                    try:
                        self._write_batch(conn, [ch for ch, _ in batch])
                    except BaseException as exc:  # noqa: BLE001 - reported to every waiting writer
                        failed = exc
                error = failed
                try:
                    self._loop.call_soon_threadsafe(self._committed, batch, error)
                except RuntimeError:
                    return  # the loop is gone; nobody is waiting any more
                if stop:
                    return
        finally:
            conn.close()

    @staticmethod
    def _write_batch(conn: sqlite3.Connection, changes: list[Change]) -> None:
        upserts: list[tuple[Any, ...]] = []
        conn.execute("BEGIN IMMEDIATE")
        try:
            for ch in changes:
                if ch.new is None:
                    if upserts:
                        conn.executemany("INSERT OR REPLACE INTO objects VALUES (?, ?, ?, ?)", upserts)
                        upserts.clear()
                    conn.execute("DELETE FROM objects WHERE key = ?", (ch.key,))
                else:
                    kv = ch.new
                    upserts.append((kv.key, kv.create_revision, kv.mod_revision, orjson.dumps(kv.value)))
            if upserts:
                conn.executemany("INSERT OR REPLACE INTO objects VALUES (?, ?, ?, ?)", upserts)
            conn.execute("UPDATE meta SET revision = ? WHERE id = 0", (changes[-1].revision,))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _committed(self, batch: list[_Pending], error: BaseException | None) -> None:
        """On the loop: publish a committed batch in revision order, or fail it."""
        if error is not None:
            # Later staged writes were validated against these: the store cannot go on.
            self._failure = error
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(StorageError(f"commit failed: {error!r}"))
            return
        for change, fut in batch:
            self._core.apply(change)
            staged = self._staged.get(change.key)
            if staged is not None and staged[0] == change.revision:
                del self._staged[change.key]
            if not fut.done():
                fut.set_result(None)

    async def close(self) -> None:
        """Finish pending commits, stop the writer thread and end all watches."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        await asyncio.to_thread(self._thread.join)
        # Commit reports were queued on the loop before the thread ended; let them run.
        await asyncio.sleep(0)
        self._core.close_watches()
