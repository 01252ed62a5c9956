"""A failed SQLite commit (database or disk full) is survivable: the failed batch and the
writes staged on top of it fail, the staged state rolls back, later writes work again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kubeplane.storage import SQLiteStore, sqlite as sqlite_backend
from kubeplane.storage.interface import WriteFailedError

PODS = "/registry/core/pods/a/"


def pod(name: str, pad: int = 0, **spec: Any) -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "a"}, "spec": dict(spec), "pad": "x" * pad}


def limit_pages(s: SQLiteStore, extra: int | None) -> None:
    """Cap the database at its current size plus ``extra`` pages (None: lift the cap)."""
    conn = s._conn  # the writer thread is idle between the awaited writes of these tests
    if extra is None:
        conn.execute("PRAGMA max_page_count = 1073741823")
    else:
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        conn.execute(f"PRAGMA max_page_count = {pages + extra}")


@pytest.fixture(autouse=True)
def fast_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_backend, "PROBE_INTERVAL", 0.0)


async def test_full_database_fails_the_batch_and_what_was_staged_on_it_then_recovers(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    s = await SQLiteStore.open(path)
    acked = await s.create(PODS + "kept", pod("kept"))
    w = s.watch(PODS, acked.mod_revision)
    committed = s.revision
    limit_pages(s, 0)
    # Issued together: the update and the second create are validated against the
    # staged (not yet committed) create, which cannot be stored.
    results = await asyncio.gather(
        s.create(PODS + "big", pod("big", pad=200_000)),
        s.update(PODS + "big", pod("big", v=2)),
        s.create(PODS + "other", pod("other")),
        s.delete(PODS + "kept"),
        return_exceptions=True,
    )
    assert all(isinstance(r, WriteFailedError) for r in results), results
    assert "database or disk is full" in str(results[0])
    assert s.revision == committed
    assert await s.get(PODS + "big") is None and await s.get(PODS + "kept") == acked
    assert s.write_failure() is not None and "full" in s.write_failure()
    # While the database stays full, the probe says so and so does the next write.
    assert await s.check_writable() is not None
    with pytest.raises(WriteFailedError):
        await s.create(PODS + "big", pod("big", pad=200_000))
    assert await w.next_batch(0.05) == []

    limit_pages(s, None)
    assert await s.check_writable() is None
    assert s.write_failure() is None
    # The store validates against the committed state again: "big" does not exist,
    # revisions continue right after the last committed one.
    created = await s.create(PODS + "big", pod("big", pad=200_000))
    assert created.mod_revision == committed + 1
    updated = await s.update(PODS + "big", pod("big", v=2), expected_revision=created.mod_revision)
    deleted = await s.delete(PODS + "kept")
    events = await asyncio.wait_for(w.next_batch(), 2)
    while len(events) < 3:
        events += await asyncio.wait_for(w.next_batch(), 2)
    assert [(e.type, e.key, e.revision) for e in events] == [
        ("ADDED", PODS + "big", committed + 1),
        ("MODIFIED", PODS + "big", committed + 2),
        ("DELETED", PODS + "kept", committed + 3),
    ]
    w.close()
    await s.close()

    # Acknowledged writes are on disk, failed ones are not, history is consistent.
    s2 = await SQLiteStore.open(path)
    try:
        assert s2.revision == deleted.mod_revision
        assert await s2.get(PODS + "big") == updated
        assert await s2.get(PODS + "kept") is None and await s2.get(PODS + "other") is None
        replay = s2.watch(PODS, acked.mod_revision)
        got = await asyncio.wait_for(replay.next_batch(), 2)
        assert [e.revision for e in got] == [committed + 1, committed + 2, committed + 3]
        replay.close()
    finally:
        await s2.close()


async def test_a_write_after_space_returns_succeeds_without_a_probe(tmp_path: Path) -> None:
    s = await SQLiteStore.open(str(tmp_path / "db"))
    try:
        limit_pages(s, 0)
        with pytest.raises(WriteFailedError):
            await s.create(PODS + "a", pod("a", pad=100_000))
        limit_pages(s, None)
        kv = await s.create(PODS + "a", pod("a", pad=100_000))
        assert kv.mod_revision == 2
        assert s.write_failure() is None
    finally:
        await s.close()


async def test_writes_fail_cleanly_under_sustained_load_while_full(tmp_path: Path) -> None:
    """Many concurrent writers while the database fills up: every write either is
    acknowledged and stored, or fails; the memory state equals the file's."""
    path = str(tmp_path / "db")
    s = await SQLiteStore.open(path)
    limit_pages(s, 300)

    async def writer(i: int) -> list[tuple[str, int] | None]:
        out: list[tuple[str, int] | None] = []
        for j in range(20):
            key = PODS + f"w{i}-{j}"
            try:
                kv = await s.create(key, pod(key, pad=6000))
                out.append((key, kv.mod_revision))
            except WriteFailedError:
                out.append(None)
        return out

    results = [r for rs in await asyncio.gather(*(writer(i) for i in range(10))) for r in rs]
    stored = [r for r in results if r is not None]
    assert stored and len(stored) < len(results), "some writes fit, the rest did not"
    revisions = sorted(rev for _, rev in stored)
    assert revisions == list(range(2, 2 + len(stored))), "no revision is lost or reused among stored writes"
    memory = {kv.key: kv for kv in (await s.list(PODS)).items}
    await s.close()
    s2 = await SQLiteStore.open(path)
    try:
        disk = {kv.key: kv for kv in (await s2.list(PODS)).items}
        assert disk == memory
        assert set(disk) == {k for k, _ in stored}
    finally:
        await s2.close()
