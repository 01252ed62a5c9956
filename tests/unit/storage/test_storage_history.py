"""History bounded by bytes, slow watchers bounded by bytes, and SQLite history across restarts."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from kubeplane.storage import SQLiteStore, open_store
from kubeplane.storage.interface import CompactedError, Event, Store

KINDS = ["memory", "sqlite"]
PODS = "/registry/core/pods/a/"


def pod(name: str, pad: int = 0, **spec: Any) -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "a"}, "spec": dict(spec), "pad": "x" * pad}


async def drain(w: Any, n: int, timeout: float = 5.0) -> list[Event]:
    out: list[Event] = []
    while len(out) < n:
        batch = await asyncio.wait_for(w.next_batch(), timeout)
        assert batch is not None, f"watch closed after {len(out)} of {n} events"
        out.extend(batch)
    return out


def summary(events: list[Event]) -> list[tuple[int, str, str]]:
    return [(e.revision, e.type, e.key) for e in events]


# -- history bounded by bytes (both backends) -----------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_history_is_bounded_by_bytes(kind: str, tmp_path: Path) -> None:
    # 100 updates of one 20 KiB object against a 200 KiB budget: the revision
    # cap (10,000) would keep all of them, the byte cap keeps about ten.
    s = await open_store(kind, str(tmp_path), history_bytes=200 * 1024)
    try:
        await s.create(PODS + "big", pod("big", pad=20 * 1024))
        for i in range(100):
            await s.update(PODS + "big", pod("big", pad=20 * 1024, i=i))
        core = s._core  # type: ignore[attr-defined]
        assert core.history_bytes <= 200 * 1024
        assert s.revision - s.compacted_revision >= 7, "the byte budget keeps the most recent changes"
        assert s.compacted_revision > 50
        with pytest.raises(CompactedError):
            s.watch(PODS, 2)
        # What is kept is complete: a watch from the compacted revision gets every later change.
        w = s.watch(PODS, s.compacted_revision)
        events = await drain(w, s.revision - s.compacted_revision)
        assert [e.revision for e in events] == list(range(s.compacted_revision + 1, s.revision + 1))
        w.close()
    finally:
        await s.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_watcher_that_does_not_read_is_dropped_by_bytes(kind: str, tmp_path: Path) -> None:
    # The event count bound (10,000) is far away; the byte bound (64 KiB) is passed after a few big events.
    s = await open_store(kind, str(tmp_path), watch_queue_bytes=64 * 1024)
    try:
        dropped: list[bool] = []
        idle = s.watch(PODS, 0)
        idle.on_overflow = lambda: dropped.append(True)  # type: ignore[attr-defined]
        reader = s.watch(PODS, 0)
        for i in range(10):
            await s.create(PODS + f"p{i}", pod(f"p{i}", pad=16 * 1024))
            assert len(await drain(reader, 1)) == 1
        assert dropped == [True]
        assert idle.buffered_bytes == 0  # type: ignore[attr-defined]
        with pytest.raises(CompactedError):
            await asyncio.wait_for(idle.next_batch(), 2)
        assert await idle.next_batch() is None
        reader.close()
    finally:
        await s.close()


# -- SQLite history on disk --------------------------------------------------------


async def test_watch_resumes_across_restart_exactly_once_in_order(tmp_path: Path) -> None:
    s = await SQLiteStore.open(str(tmp_path / "db"))
    await s.create(PODS + "a", pod("a"))
    await s.create(PODS + "b", pod("b"))
    seen = s.revision  # a watcher saw everything up to here
    await s.update(PODS + "a", pod("a", v=2))
    await s.delete(PODS + "b")
    await s.create(PODS + "c", pod("c"))
    await s.update(PODS + "c", pod("c", v=2))
    await s.create("/registry/core/configmaps/a/x", {"metadata": {"name": "x"}})
    expected = [(e.revision, e.type, e.key, e.value, e.prev_value) for e in await drain(s.watch(PODS, seen), 4)]
    final = s.revision
    await s.close()

    s2 = await SQLiteStore.open(str(tmp_path / "db"))
    try:
        assert s2.revision == final
        w = s2.watch(PODS, seen)
        got = [(e.revision, e.type, e.key, e.value, e.prev_value) for e in await drain(w, 4)]
        assert got == expected
        assert [g[1] for g in got] == ["MODIFIED", "DELETED", "ADDED", "MODIFIED"]
        # The DELETED event carries the deleted object re-stamped with the delete's revision.
        assert got[1][3]["metadata"]["name"] == "b" and got[1][3]["metadata"]["resourceVersion"] == str(got[1][0])
        # Nothing more: exactly once.
        assert await w.next_batch(0.05) == []
        # New writes follow on.
        await s2.update(PODS + "a", pod("a", v=3))
        assert summary(await drain(w, 1)) == [(final + 1, "MODIFIED", PODS + "a")]
        w.close()
    finally:
        await s2.close()


async def test_restart_after_compaction_keeps_lists_and_watches_within_history(tmp_path: Path) -> None:
    """Random writes with a short history, restarted often: after every restart each
    revision the history still covers lists and watches exactly as before."""
    rng = random.Random(1717)
    path = str(tmp_path / "db")
    s = await SQLiteStore.open(path, history=16)
    names = [f"p{i}" for i in range(12)]
    try:
        for step in range(8):
            for _ in range(40):
                name = rng.choice(names)
                cur = await s.get(PODS + name)
                op = rng.random()
                if cur is None:
                    await s.create(PODS + name, pod(name, step=step))
                elif op < 0.25:
                    await s.delete(PODS + name)
                else:
                    await s.update(PODS + name, pod(name, step=step, r=rng.random()))
            lo, hi = s.compacted_revision, s.revision
            lists = {r: (await s.list(PODS, revision=r)).items for r in range(lo, hi + 1)}
            watched = summary(await drain(s.watch(PODS, lo), hi - lo))
            await s.close()
            s = await SQLiteStore.open(path, history=16)
            assert s.revision == hi
            assert s.compacted_revision <= lo + 1
            for r in range(max(lo, s.compacted_revision), hi + 1):
                assert (await s.list(PODS, revision=r)).items == lists[r], f"list at {r} after restart {step}"
            start = max(lo, s.compacted_revision)
            w = s.watch(PODS, start)
            assert summary(await drain(w, hi - start)) == watched[start - lo:]
            w.close()
            with pytest.raises(CompactedError):
                s.watch(PODS, s.compacted_revision - 1)
    finally:
        await s.close()


async def test_history_table_is_trimmed_with_compaction(tmp_path: Path) -> None:
    import sqlite3

    path = str(tmp_path / "db")
    s = await SQLiteStore.open(path, history=20)
    await s.create(PODS + "old", pod("old"))  # idle for longer than the history: its version stays
    for i in range(300):
        await s.update(PODS + "hot", pod("hot", i=i)) if i else await s.create(PODS + "hot", pod("hot"))
    # A key idle for longer than the history changes: its old version is still reachable.
    await s.update(PODS + "old", pod("old", v=2))
    compacted = s.compacted_revision
    await s.close()
    conn = sqlite3.connect(path)
    (rows,) = conn.execute("SELECT count(*) FROM history").fetchone()
    (disk_compacted,) = conn.execute("SELECT compacted FROM history_state").fetchone()
    conn.close()
    assert disk_compacted == compacted
    assert rows <= 20 + 20 // 8 + 3, "history rows beyond the window are trimmed"
    s2 = await SQLiteStore.open(path, history=20)
    try:
        before = s2.revision - 1
        items = (await s2.list(PODS + "old", revision=before)).items
        assert [kv.value["spec"] for kv in items] == [{}]
        last = (await drain(s2.watch(PODS + "old", before), 1))[0]
        assert last.type == "MODIFIED" and last.prev_value is not None and last.prev_value["spec"] == {}
    finally:
        await s2.close()


async def test_sqlite_file_shrinks_after_mass_deletion(tmp_path: Path) -> None:
    import os

    path = tmp_path / "db"
    s = await SQLiteStore.open(str(path), history=100)
    await asyncio.gather(*(s.create(PODS + f"p{i}", pod(f"p{i}", pad=4000)) for i in range(3000)))
    await s.close()  # closing checkpoints the WAL into the file
    full = os.path.getsize(path)
    s = await SQLiteStore.open(str(path), history=100)
    try:
        await asyncio.gather(*(s.delete(PODS + f"p{i}") for i in range(3000)))
        # A few more small writes let compaction trim the history of the deletes.
        for i in range(200):
            await s.create(PODS + f"q{i}", pod(f"q{i}"))
    finally:
        await s.close()
    emptied = os.path.getsize(path)
    print(f"file size after 3,000 creates of 4 KB: {full} B; after deleting them: {emptied} B")
    assert full > 12_000_000
    assert emptied < full // 10


async def test_files_from_before_history_are_migrated(tmp_path: Path) -> None:
    """A file with the older one-table layout opens with its objects and revision;
    its history starts at that revision and grows from there."""
    import sqlite3

    import orjson

    path = str(tmp_path / "db")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE objects (key TEXT PRIMARY KEY, create_rev INTEGER NOT NULL, "
                 "mod_rev INTEGER NOT NULL, value BLOB NOT NULL)")
    conn.execute("CREATE TABLE meta (id INTEGER PRIMARY KEY CHECK (id = 0), revision INTEGER NOT NULL)")
    a = pod("a")
    a["metadata"]["resourceVersion"] = "3"
    b = pod("b")
    b["metadata"]["resourceVersion"] = "4"
    conn.execute("INSERT INTO objects VALUES (?, 2, 3, ?)", (PODS + "a", orjson.dumps(a)))
    conn.execute("INSERT INTO objects VALUES (?, 4, 4, ?)", (PODS + "b", orjson.dumps(b)))
    conn.execute("INSERT INTO meta VALUES (0, 5)")
    conn.close()

    s = await SQLiteStore.open(path)
    try:
        assert s.revision == 5 and s.compacted_revision == 5
        assert [(kv.key, kv.create_revision, kv.mod_revision) for kv in (await s.list(PODS)).items] == [
            (PODS + "a", 2, 3), (PODS + "b", 4, 4)]
        await s.update(PODS + "a", pod("a", v=2))
        await s.delete(PODS + "b")
    finally:
        await s.close()
    s = await SQLiteStore.open(path)
    try:
        events = await drain(s.watch(PODS, 5), 2)
        assert [(e.type, e.key, e.prev_value["metadata"]["resourceVersion"]) for e in events] == [
            ("MODIFIED", PODS + "a", "3"), ("DELETED", PODS + "b", "4")]
        assert [kv.key for kv in (await s.list(PODS, revision=5)).items] == [PODS + "a", PODS + "b"]
    finally:
        await s.close()
