"""Durable ``Store``: the in-memory core backed by an SQLite file.

Every object lives in memory (reads never touch the disk) and on disk.
Writes are validated and given their revision in order on
the event loop, then handed to one writer thread which commits whatever is
pending in a single transaction (group commit, ``synchronous=FULL``). Only
after the commit does a write become visible, in revision order, and its
caller get an answer: an acknowledged write is on disk.

Versions are stored once, as rows of the ``history`` table: one per change
(the new version of the key, or no value for a delete) with the revision of
the version it replaced; ``current`` names the live version of each key. So
the changes since the compacted revision are on disk, written in the same
transaction as the state they make, and watches and lists at older revisions
keep working across a restart. Compaction to revision C drops the versions
replaced at or before C and the deletes at or before C; free pages go back
to the file system by incremental vacuum.

A failed commit (``database or disk is full``) fails that batch and every
write staged after it (they were validated against its state), rolls the
staged state back to the committed one, and the store goes on: the next write
is tried afresh, and a small probe transaction tells readiness when writes
work again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import sqlite3
import threading
import time
from typing import Any

import orjson

from kubeplane.storage.interface import Event, KeyValue, StorageError, WriteFailedError
from kubeplane.storage.memory import (
    DEFAULT_HISTORY,
    DEFAULT_HISTORY_BYTES,
    DEFAULT_WATCH_QUEUE,
    DEFAULT_WATCH_QUEUE_BYTES,
    Change,
    MemoryCore,
    MemoryStore,
    stamp,
)

log = logging.getLogger("kubeplane.storage.sqlite")

DB_FILE = "kubeplane.db"
MAX_BATCH = 2_000
"""Most writes committed in one transaction."""

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (id INTEGER PRIMARY KEY CHECK (id = 0), revision INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO meta (id, revision) VALUES (0, 1)",
    # op: 0 create, 1 update, 2 delete (value NULL: the deleted object is the row at prev_rev).
    "CREATE TABLE IF NOT EXISTS history ("
    " rev INTEGER PRIMARY KEY, key TEXT NOT NULL, op INTEGER NOT NULL, create_rev INTEGER NOT NULL,"
    " prev_rev INTEGER NOT NULL, value BLOB)",
    # The live version of every key: the history row at ``rev``.
    "CREATE TABLE IF NOT EXISTS current (key TEXT PRIMARY KEY, rev INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS history_state (id INTEGER PRIMARY KEY CHECK (id = 0), compacted INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO history_state (id, compacted) SELECT 0, revision FROM meta WHERE id = 0",
    "CREATE TABLE IF NOT EXISTS probe (id INTEGER PRIMARY KEY CHECK (id = 0), data BLOB NOT NULL)",
)

_MIGRATE_OBJECTS = (
    # Files written before history was kept hold one row per object in ``objects``;
    # their history starts at the file's revision.
    "INSERT OR IGNORE INTO history (rev, key, op, create_rev, prev_rev, value)"
    " SELECT mod_rev, key, CASE WHEN create_rev = mod_rev THEN 0 ELSE 1 END, create_rev, 0, value FROM objects",
    "INSERT OR REPLACE INTO current (key, rev) SELECT key, mod_rev FROM objects",
    "UPDATE history_state SET compacted = (SELECT revision FROM meta WHERE id = 0) WHERE id = 0",
    "DROP TABLE objects",
)

_CREATE, _UPDATE, _DELETE = 0, 1, 2

VACUUM_MIN_FREE_PAGES = 256
"""Free pages (of 4 KiB) the file may hold before incremental vacuum returns them."""

VACUUM_STEP_PAGES = 4096
"""Most pages one incremental vacuum step frees, so one step never stalls commits long."""

PROBE_BYTES = 1024 * 1024
"""Size of the probe transaction that tells whether writes work again after a failure."""

PROBE_INTERVAL = 1.0
"""Seconds between write probes while writes are failing."""




class _Trim:
    """Trim the history table to a compacted revision (queued in write order)."""

    __slots__ = ("revision",)

    def __init__(self, revision: int) -> None:
        self.revision = revision


class _Probe:
    """A small write transaction reporting whether the database accepts writes."""

    __slots__ = ("future",)

    def __init__(self, future: "asyncio.Future[BaseException | None]") -> None:
        self.future = future


# (change, future, epoch): the epoch is bumped by every rollback of the staged state.
_Pending = tuple[Change, "asyncio.Future[None]", int]


def _connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    (auto_vacuum,) = conn.execute("PRAGMA auto_vacuum").fetchone()
    if auto_vacuum != 2:
        # INCREMENTAL takes effect only before the file's first page is written;
        # an older file switches with a one-time VACUUM.
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        if pages:
            try:
                conn.execute("VACUUM")
            except sqlite3.Error as exc:
                log.warning("could not switch %s to incremental vacuum: %s", path, exc)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    for stmt in _SCHEMA:
        conn.execute(stmt)
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'objects'").fetchone():
        conn.execute("BEGIN IMMEDIATE")
        try:
            for stmt in _MIGRATE_OBJECTS:
                conn.execute(stmt)
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise
    return conn


_Loaded = tuple[int, list[KeyValue], int, list[tuple[Change, int]]]


def _load(conn: sqlite3.Connection) -> _Loaded:
    """The revision, the objects, the compacted revision and the history after it."""
    (revision,) = conn.execute("SELECT revision FROM meta WHERE id = 0").fetchone()
    revision = int(revision)
    (compacted,) = conn.execute("SELECT compacted FROM history_state WHERE id = 0").fetchone()
    compacted = int(compacted)
    versions: dict[int, tuple[KeyValue, int]] = {}
    changes: list[tuple[Change, int]] = []
    broken = False
    expect = compacted + 1
    for rev, key, op, create_rev, prev_rev, blob in conn.execute(
        "SELECT rev, key, op, create_rev, prev_rev, value FROM history ORDER BY rev"
    ):
        kv = None
        if blob is not None:
            kv = KeyValue(key, orjson.loads(blob), create_rev, rev)
            versions[rev] = (kv, len(blob))
        if rev <= compacted or broken:
            continue
        if rev != expect:
            broken = True
            continue
        expect += 1
        size = len(key) + (len(blob) if blob is not None else 0)
        if op == _CREATE and kv is not None:
            changes.append((Change(key, kv, None, Event("ADDED", key, kv.value, None, rev), kv), size))
            continue
        found = versions.get(prev_rev)
        if found is None or found[0].key != key:
            broken = True
            continue
        prev, prev_size = found
        if op == _UPDATE and kv is not None:
            changes.append((Change(key, kv, prev, Event("MODIFIED", key, kv.value, prev.value, rev), kv), size))
        else:
            gone = KeyValue(key, stamp(prev.value, rev), prev.create_revision, rev)
            ev = Event("DELETED", key, gone.value, prev.value, rev)
            changes.append((Change(key, None, prev, ev, gone), len(key) + prev_size))
    items: list[KeyValue] = []
    for key, rev in conn.execute("SELECT key, rev FROM current"):
        found = versions.get(rev)
        if found is None or found[0].key != key:
            raise StorageError(f"the database names version {rev} of {key} but does not hold it")
        items.append(found[0])
    if broken or expect != revision + 1:
        log.warning("history in the database is incomplete; watches resume from revision %d", revision)
        return revision, items, revision, []
    return revision, items, compacted, changes


def _open(path: str) -> tuple[sqlite3.Connection, _Loaded]:
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, mode=0o700, exist_ok=True)
    # Private to this user: SQLite gives its -wal and -shm files the database's mode.
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    conn = _connect(path)
    try:
        loaded = _load(conn)
    except BaseException:
        conn.close()
        raise
    return conn, loaded


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
        history_bytes: int = DEFAULT_HISTORY_BYTES,
        watch_queue_bytes: int = DEFAULT_WATCH_QUEUE_BYTES,
        compacted: int | None = None,
        log_changes: list[tuple[Change, int]] | None = None,
    ) -> None:
        """Use :meth:`open`; this wraps an already opened and loaded database."""
        super().__init__(history=history, watch_queue=watch_queue, history_bytes=history_bytes,
                         watch_queue_bytes=watch_queue_bytes)
        if compacted is None:
            compacted = revision
        self._core = MemoryCore(
            revision=revision, items=items, history=history, watch_queue=watch_queue,
            history_bytes=history_bytes, watch_queue_bytes=watch_queue_bytes,
            compacted=compacted, log=log_changes or (),
        )
        self._conn = conn
        self._loop = asyncio.get_running_loop()
        # Writes validated but not yet committed: key -> (revision, new state or None if deleted).
        self._staged: dict[str, tuple[int, KeyValue | None]] = {}
        self._staged_revision = revision
        self._epoch = 0
        self._failure: BaseException | None = None
        self._last_probe = float("-inf")
        self._probing: asyncio.Future[BaseException | None] | None = None
        self._queue: queue.SimpleQueue[_Pending | _Trim | _Probe | None] = queue.SimpleQueue()
        self._disk_compacted = compacted
        self._core.on_compact = self._queue_trim
        # A history longer than the limits (the limits were lowered) is cut now.
        self._core.compact(max(compacted, revision - history))
        self._thread = threading.Thread(target=self._writer, name="kubeplane-sqlite-writer", daemon=True)
        self._thread.start()

    @classmethod
    async def open(
        cls,
        path: str,
        *,
        history: int = DEFAULT_HISTORY,
        watch_queue: int = DEFAULT_WATCH_QUEUE,
        history_bytes: int = DEFAULT_HISTORY_BYTES,
        watch_queue_bytes: int = DEFAULT_WATCH_QUEUE_BYTES,
    ) -> "SQLiteStore":
        """Open (creating if needed) the database at ``path`` and load it into memory."""
        conn, (revision, items, compacted, changes) = await asyncio.to_thread(_open, path)
        return cls(conn, revision, items, history=history, watch_queue=watch_queue, history_bytes=history_bytes,
                   watch_queue_bytes=watch_queue_bytes, compacted=compacted, log_changes=changes)

    # -- health ------------------------------------------------------------

    def write_failure(self) -> str | None:
        """Why writes fail now (the last commit's error), or None when they work."""
        if self._failure is None:
            return None
        return str(self._failure)

    async def check_writable(self) -> str | None:
        """Like :meth:`write_failure`, but while writes fail, first try a probe
        transaction (at most once per :data:`PROBE_INTERVAL`) to learn whether
        the database accepts writes again."""
        if self._failure is None or self._closed:
            return self.write_failure()
        if self._probing is None and time.monotonic() - self._last_probe >= PROBE_INTERVAL:
            self._last_probe = time.monotonic()
            fut: asyncio.Future[BaseException | None] = self._loop.create_future()
            self._probing = fut
            self._queue.put(_Probe(fut))
        if self._probing is not None:
            probing = self._probing
            error = await asyncio.shield(probing)
            if self._probing is probing:
                self._probing = None
                if error is None:
                    self._failure = None
                    log.info("the database accepts writes again")
                elif self._failure is not None:
                    self._failure = error
        return self.write_failure()

    # -- write pipeline ----------------------------------------------------

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
        self._queue.put((change, fut, self._epoch))
        # A cancelled caller cancels only its wait: the write still commits and is published.
        await fut

    def _queue_trim(self, revision: int) -> None:
        self._queue.put(_Trim(revision))

    def _writer(self) -> None:
        """Writer thread: commit pending writes in batches, then report back to the loop."""
        conn = self._conn
        # Writes of an epoch at or below this one were staged on top of a failed
        # batch: they fail without being tried.
        failed_epoch = -1
        failed: BaseException | None = None
        try:
            while True:
                item = self._queue.get()
                if item is None:
                    return
                items = [item]
                stop = False
                while len(items) < MAX_BATCH:
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None:
                        stop = True
                        break
                    items.append(nxt)
                writes: list[_Pending] = []
                skipped: list[_Pending] = []
                trim = 0
                probes: list[_Probe] = []
                for it in items:
                    if isinstance(it, tuple):
                        (skipped if it[2] <= failed_epoch else writes).append(it)
                    elif isinstance(it, _Trim):
                        trim = max(trim, it.revision)
                    else:
                        probes.append(it)
                reports: list[tuple[list[_Pending], BaseException | None, list[int]]] = []
                if skipped:
                    reports.append((skipped, failed, []))
                if writes or trim:
                    try:
                        sizes = self._write_batch(conn, [w[0] for w in writes], trim)
                    except BaseException as exc:  # noqa: BLE001 - reported to every waiting writer
                        if writes:
                            failed_epoch = writes[-1][2]
                            failed = exc
                        log.error("database commit failed: %s", exc)
                        reports.append((writes, exc, []))
                    else:
                        reports.append((writes, None, sizes))
                        if trim or any(w[0].new is None for w in writes):
                            self._vacuum(conn)
                probe_results = [(p, self._probe(conn)) for p in probes]
                try:
                    for writes_, error, sizes_ in reports:
                        if writes_:
                            self._loop.call_soon_threadsafe(self._committed, writes_, error, sizes_)
                    for p, result in probe_results:
                        self._loop.call_soon_threadsafe(_resolve, p.future, result)
                except RuntimeError:
                    return  # the loop is gone; nobody is waiting any more
                if stop:
                    return
        finally:
            conn.close()

    def _write_batch(self, conn: sqlite3.Connection, changes: list[Change], trim: int) -> list[int]:
        """Commit ``changes`` (and a trim of history to ``trim``) in one transaction;
        returns each change's size estimate."""
        rows: list[tuple[Any, ...]] = []
        sizes: list[int] = []
        # The live version of each key once the batch is applied (None: deleted).
        live: dict[str, int | None] = {}
        for ch in changes:
            prev = ch.prev
            prev_rev = prev.mod_revision if prev is not None else 0
            key = ch.key
            if ch.new is None:
                rows.append((ch.revision, key, _DELETE, ch.result.create_revision, prev_rev, None))
                live[key] = None
                # The deleted object stays in history: estimate it once here.
                sizes.append(len(key) + len(orjson.dumps(ch.event.value)))
            else:
                kv = ch.new
                blob = orjson.dumps(kv.value)
                rows.append((kv.mod_revision, key, _UPDATE if prev is not None else _CREATE,
                             kv.create_revision, prev_rev, blob))
                live[key] = kv.mod_revision
                sizes.append(len(key) + len(blob))
        disk_compacted = self._disk_compacted
        conn.execute("BEGIN IMMEDIATE")
        try:
            if rows:
                conn.executemany("INSERT INTO history VALUES (?, ?, ?, ?, ?, ?)", rows)
                upserts = [(k, r) for k, r in live.items() if r is not None]
                if upserts:
                    conn.executemany("INSERT OR REPLACE INTO current VALUES (?, ?)", upserts)
                if len(upserts) < len(live):
                    conn.executemany("DELETE FROM current WHERE key = ?", [(k,) for k, r in live.items() if r is None])
                conn.execute("UPDATE meta SET revision = ? WHERE id = 0", (changes[-1].revision,))
            if trim > disk_compacted:
                # Versions replaced at or before the compacted revision, then the deletes there.
                conn.execute(
                    "DELETE FROM history WHERE rev IN (SELECT prev_rev FROM history"
                    " WHERE rev > ?1 AND rev <= ?2 AND prev_rev > 0)",
                    (disk_compacted, trim),
                )
                conn.execute("DELETE FROM history WHERE rev > ? AND rev <= ? AND op = 2", (disk_compacted, trim))
                conn.execute("UPDATE history_state SET compacted = ? WHERE id = 0", (trim,))
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise
        if trim > disk_compacted:
            self._disk_compacted = trim
        return sizes

    @staticmethod
    def _vacuum(conn: sqlite3.Connection) -> None:
        """Return free pages to the file system once enough have piled up."""
        try:
            (free,) = conn.execute("PRAGMA freelist_count").fetchone()
            if free < VACUUM_MIN_FREE_PAGES:
                return
            (pages,) = conn.execute("PRAGMA page_count").fetchone()
            if free * 4 < pages:
                return  # under a quarter of the file: reused by the next writes
            # executescript steps the pragma to the end (one step frees one page).
            conn.executescript(f"PRAGMA incremental_vacuum({VACUUM_STEP_PAGES})")
            # In WAL mode the file is cut at the checkpoint.
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:
            log.warning("incremental vacuum failed: %s", exc)
            _rollback(conn)

    @staticmethod
    def _probe(conn: sqlite3.Connection) -> BaseException | None:
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT OR REPLACE INTO probe (id, data) VALUES (0, randomblob(?))", (PROBE_BYTES,))
            conn.execute("COMMIT")
        except BaseException as exc:  # noqa: BLE001 - the probe's outcome is the answer
            _rollback(conn)
            return exc
        try:
            conn.execute("DELETE FROM probe")  # the space is the next writes' again
        except sqlite3.Error:
            _rollback(conn)
        return None

    def _committed(self, batch: list[_Pending], error: BaseException | None, sizes: list[int]) -> None:
        """On the loop: publish a committed batch in revision order, or fail it."""
        if error is not None:
            failure = WriteFailedError(str(error) or type(error).__name__)
            for _, fut, _ in batch:
                if not fut.done():
                    fut.set_exception(failure)
            if batch[-1][2] == self._epoch:
                # Every write staged after the failed batch was validated against
                # it and fails too (the writer skips them); validation restarts
                # from the committed state.
                self._epoch += 1
                self._staged.clear()
                self._staged_revision = self._core.revision
                self._failure = error
            return
        core = self._core
        for (change, fut, _), size in zip(batch, sizes):
            core.apply(change, size)
            staged = self._staged.get(change.key)
            if staged is not None and staged[0] == change.revision:
                del self._staged[change.key]
            if not fut.done():
                fut.set_result(None)
        if self._failure is not None and batch[-1][2] == self._epoch:
            self._failure = None
            log.info("the database accepts writes again")

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


def _resolve(fut: "asyncio.Future[BaseException | None]", result: BaseException | None) -> None:
    if not fut.done():
        fut.set_result(result)


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error as exc:
            log.warning("rollback failed: %s", exc)
