"""The storage contract, run against every backend."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any, AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubeplane.storage import MemoryStore, SQLiteStore, open_store
from kubeplane.storage.interface import (
    CompactedError,
    Event,
    FutureRevisionError,
    KeyExistsError,
    KeyNotFoundError,
    KeyValue,
    RevisionConflictError,
    Store,
)

from etcd_support import etcd_store
from helpers import eventually

KINDS = ["memory", "sqlite"]
PODS = "/registry/core/pods/"


def pod(name: str, **spec: Any) -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "a"}, "spec": dict(spec)}


async def _open(kind: str, path: Path, **opts: Any) -> Store:
    return await open_store(kind, str(path), **opts)


@pytest.fixture(params=KINDS + ["etcd"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "etcd":
        async with etcd_store(tmp_path / "etcd") as (s, _):
            yield s
        return
    s = await _open(request.param, tmp_path)
    yield s
    await s.close()


@pytest.fixture(params=KINDS)
async def small_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """A store that keeps only 5 revisions of history and lets watchers lag by 3 events."""
    s = await _open(request.param, tmp_path, history=5, watch_queue=3)
    yield s
    await s.close()


async def next_event(w: Any, timeout: float = 2.0) -> Event:
    return await asyncio.wait_for(w.__anext__(), timeout)


async def take(w: Any, n: int, timeout: float = 5.0) -> list[Event]:
    return [await next_event(w, timeout) for _ in range(n)]


def rv(obj: dict[str, Any]) -> str:
    return obj["metadata"]["resourceVersion"]


# -- basic operations -------------------------------------------------------


async def test_revision_starts_at_one_and_increments(store: Store) -> None:
    assert store.revision == 1
    a = await store.create(PODS + "a/x", pod("x"))
    assert (a.create_revision, a.mod_revision, store.revision) == (2, 2, 2)
    b = await store.update(PODS + "a/x", pod("x", v=1))
    assert (b.create_revision, b.mod_revision, store.revision) == (2, 3, 3)
    c = await store.delete(PODS + "a/x")
    assert (c.create_revision, c.mod_revision, store.revision) == (2, 4, 4)


async def test_crud_and_resource_version_stamping(store: Store) -> None:
    key = PODS + "a/x"
    assert await store.get(key) is None
    original = pod("x")
    created = await store.create(key, original)
    assert rv(created.value) == "2"
    assert "resourceVersion" not in original["metadata"], "caller's dict must not be mutated"
    got = await store.get(key)
    assert got == created

    updated = await store.update(key, pod("x", image="nginx"), expected_revision=2)
    assert rv(updated.value) == "3" and updated.value["spec"] == {"image": "nginx"}
    assert (await store.get(key)) == updated

    deleted = await store.delete(key, expected_revision=3)
    assert rv(deleted.value) == "4"
    assert deleted.value["spec"] == {"image": "nginx"}
    assert deleted.mod_revision == 4 and deleted.create_revision == 2
    assert await store.get(key) is None


async def test_value_without_metadata_gets_one(store: Store) -> None:
    kv = await store.create("/k", {"data": 1})
    assert kv.value == {"data": 1, "metadata": {"resourceVersion": "2"}}


async def test_non_dict_values_rejected(store: Store) -> None:
    with pytest.raises(TypeError):
        await store.create("/k", ["not", "a", "dict"])  # type: ignore[arg-type]
    await store.create("/k", {"a": 1})
    with pytest.raises(TypeError):
        await store.update("/k", "text")  # type: ignore[arg-type]
    assert store.revision == 2


async def test_key_exists_and_not_found(store: Store) -> None:
    await store.create("/k", {"a": 1})
    with pytest.raises(KeyExistsError) as ei:
        await store.create("/k", {"a": 2})
    assert ei.value.key == "/k"
    with pytest.raises(KeyNotFoundError):
        await store.update("/missing", {"a": 1})
    with pytest.raises(KeyNotFoundError):
        await store.delete("/missing")
    assert store.revision == 2
    assert (await store.get("/k")).value["a"] == 1  # type: ignore[union-attr]


async def test_expected_revision_conflict(store: Store) -> None:
    kv = await store.create("/k", {"a": 1})
    await store.update("/k", {"a": 2})
    with pytest.raises(RevisionConflictError) as ei:
        await store.update("/k", {"a": 3}, expected_revision=kv.mod_revision)
    assert ei.value.current.mod_revision == 3 and ei.value.current.value["a"] == 2
    assert ei.value.expected == 2
    with pytest.raises(RevisionConflictError):
        await store.delete("/k", expected_revision=2)
    assert store.revision == 3


async def test_concurrent_conflicting_updates_exactly_one_wins(store: Store) -> None:
    kv = await store.create("/k", {"n": 0})

    async def bump(i: int) -> KeyValue | None:
        try:
            return await store.update("/k", {"n": i}, expected_revision=kv.mod_revision)
        except RevisionConflictError:
            return None

    results = await asyncio.gather(*(bump(i) for i in range(1, 9)))
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert await store.get("/k") == winners[0]
    assert store.revision == kv.mod_revision + 1


async def test_concurrent_creates_of_one_key(store: Store) -> None:
    async def make(i: int) -> bool:
        try:
            await store.create("/k", {"n": i})
            return True
        except KeyExistsError:
            return False

    assert sum(await asyncio.gather(*(make(i) for i in range(6)))) == 1
    assert store.revision == 2


# -- list ----------------------------------------------------------------------


async def test_list_prefix_isolation_and_order(store: Store) -> None:
    for key in ["ab/p1", "a/p2", "a/p1", "b/p1", "a/p3"]:
        await store.create(PODS + key, pod(key))
    await store.create("/registry/core/podsx/a/p1", pod("other"))
    res = await store.list(PODS + "a/")
    assert [kv.key for kv in res.items] == [PODS + "a/p1", PODS + "a/p2", PODS + "a/p3"]
    assert res.revision == store.revision and not res.more
    assert [kv.key for kv in (await store.list(PODS + "ab/")).items] == [PODS + "ab/p1"]
    assert len((await store.list(PODS)).items) == 5
    assert len((await store.list("")).items) == 6


async def test_list_at_older_revision(store: Store) -> None:
    await store.create(PODS + "a/1", pod("1", v=1))
    await store.create(PODS + "a/2", pod("2", v=1))
    at = store.revision
    await store.update(PODS + "a/1", pod("1", v=2))
    await store.delete(PODS + "a/2")
    await store.create(PODS + "a/3", pod("3"))
    await store.create(PODS + "a/0", pod("0"))

    old = await store.list(PODS + "a/", revision=at)
    assert old.revision == at
    assert [(kv.key, kv.value["spec"]["v"], kv.mod_revision) for kv in old.items] == [
        (PODS + "a/1", 1, 2),
        (PODS + "a/2", 1, 3),
    ]
    first = await store.list(PODS + "a/", revision=2)
    assert [kv.key for kv in first.items] == [PODS + "a/1"]
    now = await store.list(PODS + "a/")
    assert [kv.key for kv in now.items] == [PODS + "a/0", PODS + "a/1", PODS + "a/3"]
    paged = await store.list(PODS + "a/", revision=at, limit=1, start_after=PODS + "a/1")
    assert [kv.key for kv in paged.items] == [PODS + "a/2"] and not paged.more


async def test_pagination_consistent_while_writing(store: Store) -> None:
    for i in range(20):
        await store.create(f"{PODS}a/{i:03d}", pod(str(i)))
    expected = [kv.key for kv in (await store.list(PODS + "a/")).items]
    at = store.revision
    seen: list[str] = []
    start = ""
    writes = 0
    while True:
        page = await store.list(PODS + "a/", revision=at, limit=3, start_after=start)
        assert page.revision == at
        seen += [kv.key for kv in page.items]
        assert all(kv.mod_revision <= at for kv in page.items)
        # Mutate between pages: delete a later key, add one, update an earlier one.
        await store.create(f"{PODS}a/{writes:03d}x", pod("new"))
        await store.delete(f"{PODS}a/{19 - writes:03d}")
        await store.update(f"{PODS}a/{writes:03d}", pod("changed"))
        writes += 1
        if not page.more:
            break
        start = page.items[-1].key
    assert seen == expected
    assert writes == 7


async def test_limit_sets_more(store: Store) -> None:
    for i in range(4):
        await store.create(f"/p/{i}", {"i": i})
    assert (await store.list("/p/", limit=4)).more is False
    res = await store.list("/p/", limit=3)
    assert res.more is True and len(res.items) == 3
    res = await store.list("/p/", limit=3, start_after="/p/2")
    assert [kv.key for kv in res.items] == ["/p/3"] and res.more is False


async def test_future_revision(store: Store) -> None:
    await store.create("/k", {})
    with pytest.raises(FutureRevisionError) as ei:
        await store.list("/", revision=store.revision + 1)
    assert ei.value.current == 2 and ei.value.requested == 3


async def test_returned_values_not_mutated_by_later_writes(store: Store) -> None:
    created = await store.create("/k", {"metadata": {"labels": {"a": "1"}}, "spec": {"x": 1}})
    listed = (await store.list("/")).items[0]
    await store.update("/k", {"metadata": {"labels": {"a": "2"}}, "spec": {"x": 2}})
    deleted = await store.delete("/k")
    assert created.value == {"metadata": {"labels": {"a": "1"}, "resourceVersion": "2"}, "spec": {"x": 1}}
    assert listed.value == created.value
    assert rv(deleted.value) == "4" and deleted.value["spec"] == {"x": 2}


class _CountingItems(dict):
    """The current-state map of a store's core, counting the items a read takes from it."""

    taken = 0

    def __getitem__(self, key: str) -> Any:
        self.taken += 1
        return super().__getitem__(key)


@pytest.fixture(params=KINDS)
async def indexed_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """A backend serving reads from its in-memory index (memory, SQLite)."""
    s = await _open(request.param, tmp_path)
    yield s
    await s.close()


async def test_list_is_fast_for_many_keys(indexed_store: Store) -> None:
    store = indexed_store
    # Work, not wall-clock time (which a loaded machine makes meaningless): a
    # list at the current revision is served from the in-memory index, taking
    # exactly the items in its range (a page: only the page), and reads nothing from SQL.
    await asyncio.gather(*(store.create(f"{PODS}ns/p{i:05d}", pod(str(i))) for i in range(10_000)))
    await asyncio.gather(*(store.create(f"{PODS}other/p{i}", pod(str(i))) for i in range(10)))
    core = store._core  # type: ignore[attr-defined]
    counting = core._current = _CountingItems(core._current)
    statements: list[str] = []
    conn = getattr(store, "_conn", None)
    if conn is not None:
        conn.set_trace_callback(statements.append)
    try:
        res = await store.list(PODS)
        assert len(res.items) == 10_010 and counting.taken == 10_010
        counting.taken = 0
        narrow = await store.list(PODS + "other/")
        assert len(narrow.items) == 10 and counting.taken == 10
        counting.taken = 0
        page = await store.list(PODS + "ns/", limit=50, start_after=f"{PODS}ns/p05000")
        assert [kv.key for kv in page.items][:1] == [f"{PODS}ns/p05001"] and counting.taken == 50
    finally:
        if conn is not None:
            conn.set_trace_callback(None)
    # (the writer thread may still trim history meanwhile: only reads count)
    assert [q for q in statements if q.lstrip().upper().startswith("SELECT")] == []


# -- watch ---------------------------------------------------------------------


async def test_watch_replays_then_streams(store: Store) -> None:
    await store.create(PODS + "a/1", pod("1"))
    start = store.revision
    await store.update(PODS + "a/1", pod("1", v=2))
    await store.create(PODS + "a/2", pod("2"))
    w = store.watch(PODS, start)
    replay = await take(w, 2)
    assert [(e.type, e.revision) for e in replay] == [("MODIFIED", 3), ("ADDED", 4)]
    assert replay[0].prev_value is not None and rv(replay[0].prev_value) == "2"
    await store.delete(PODS + "a/2")
    ev = await next_event(w)
    assert (ev.type, ev.key, ev.revision) == ("DELETED", PODS + "a/2", 5)
    assert rv(ev.value) == "5" and ev.prev_value is not None and rv(ev.prev_value) == "4"
    w.close()


async def test_watch_from_zero_is_live_only(store: Store) -> None:
    await store.create("/k/1", {})
    w = store.watch("/k/", 0)
    await store.create("/k/2", {})
    ev = await next_event(w)
    assert ev.key == "/k/2" and ev.type == "ADDED"
    w.close()


async def test_watch_prefix_filtering(store: Store) -> None:
    w = store.watch(PODS + "a/", store.revision)
    await store.create(PODS + "ab/1", pod("1"))
    await store.create(PODS + "b/1", pod("1"))
    await store.create(PODS + "a/1", pod("1"))
    ev = await next_event(w)
    assert ev.key == PODS + "a/1" and ev.revision == 4
    w.close()


async def test_watch_exactly_once_under_concurrent_writes(store: Store) -> None:
    start = store.revision
    early = store.watch("/c/", start)

    async def writer(n: int) -> None:
        for i in range(25):
            key = f"/c/{n}/{i}"
            await store.create(key, {"i": i})
            if i % 3 == 0:
                await store.update(key, {"i": -i})
            if i % 5 == 0:
                await store.delete(key)

    task = asyncio.gather(*(writer(n) for n in range(8)))
    await asyncio.sleep(0)
    late = store.watch("/c/", start)  # starts mid-stream: replay then live
    await task
    total = store.revision - start
    for w in (early, late):
        events = await take(w, total)
        assert [e.revision for e in events] == list(range(start + 1, store.revision + 1))
        w.close()
    with pytest.raises(StopAsyncIteration):
        await early.__anext__()


async def test_watch_close_ends_iteration(store: Store) -> None:
    w = store.watch("/", store.revision)
    collected: list[Event] = []

    async def consume() -> None:
        async for ev in w:
            collected.append(ev)

    task = asyncio.create_task(consume())
    await store.create("/x", {})
    for _ in range(50):
        if collected:
            break
        await asyncio.sleep(0.01)
    w.close()
    await asyncio.wait_for(task, 2)
    assert [e.key for e in collected] == ["/x"]
    await store.create("/y", {})
    with pytest.raises(StopAsyncIteration):
        await w.__anext__()


async def test_watchers_of_prefixes_of_every_depth_get_exactly_their_keys(store: Store) -> None:
    """Shallow and deep prefixes, prefixes ending inside a name, keys of every
    depth: each watcher gets each change under its prefix once, no other."""
    prefixes = ["", "/", "/r", "/r/", "/r/g/", "/r/g/p/", "/r/g/p/ns/", "/r/g/p/ns/na", "/r/g/q/", "/r/h/p/", "/x/y/z/w/"]
    keys = ["/k", "/r/a", "/r/g/b", "/r/g/p/c", "/r/g/p/ns/name", "/r/g/p/ns/other", "/r/g/p/ns2/name", "/r/g/q/ns/name",
            "/r/h/p/ns/name", "/x/y/z/w/v", "/x/y/z/wv"]
    watches = {p: store.watch(p, store.revision) for p in prefixes}
    watches["/r/g/p/#2"] = store.watch("/r/g/p/", store.revision)  # two watchers of one prefix
    closed = store.watch("/r/g/p/", store.revision)
    closed.close()
    for k in keys:
        await store.create(k, {})
    for p, w in watches.items():
        want = [k for k in keys if k.startswith(p.split("#")[0])]
        got: list[str] = []
        while len(got) < len(want):
            got += [e.key for e in await w.next_batch(timeout=2.0) or []]
        assert got == want, p
        assert await w.next_batch(timeout=0.05) == []
        w.close()


async def test_watch_batches_wait_with_a_timeout(store: Store) -> None:
    """next_batch: [] when the timeout passes, the buffered events as soon as one
    arrives (well before the timeout), None once closed while waiting; a waiting
    batch leaves no timer behind once answered."""
    w = store.watch("/", store.revision)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await w.next_batch(timeout=0.05) == []
    assert loop.time() - t0 >= 0.04

    async def write_soon() -> None:
        await asyncio.sleep(0.02)
        await store.create("/a", {})
        await store.create("/b", {})

    writer = asyncio.create_task(write_soon())
    t0 = loop.time()
    batch = await w.next_batch(timeout=5.0)
    await writer
    assert batch and batch[0].key == "/a" and loop.time() - t0 < 2.0
    rest = [] if len(batch) == 2 else await w.next_batch(timeout=1.0)
    assert [e.key for e in batch + rest] == ["/a", "/b"]
    timers = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
    assert all(h.when() - loop.time() < 4.0 for h in timers)  # the 5 s timer is gone

    assert not w.waiting
    waiting = asyncio.create_task(w.next_batch(timeout=5.0))
    await eventually(lambda: w.waiting, what="next_batch parked")
    assert not waiting.done()
    w.close()
    assert await asyncio.wait_for(waiting, 2) is None


async def test_store_close_ends_watches(tmp_path: Path) -> None:
    for kind in KINDS:
        s = await _open(kind, tmp_path / kind)
        w = s.watch("/", 0)
        await s.close()
        with pytest.raises(StopAsyncIteration):
            await next_event(w)


# -- compaction ----------------------------------------------------------------


async def test_compaction_rejects_old_list_and_watch(store: Store) -> None:
    for i in range(6):
        await store.create(f"/k/{i}", {"i": i})
    await store.compact(5)
    assert store.compacted_revision == 5
    with pytest.raises(CompactedError) as ei:
        await store.list("/k/", revision=4)
    assert ei.value.compacted == 5 and ei.value.current == 7
    with pytest.raises(CompactedError):
        store.watch("/k/", 4)
    # The compacted revision itself stays listable and watchable.
    at5 = await store.list("/k/", revision=5)
    assert [kv.key for kv in at5.items] == ["/k/0", "/k/1", "/k/2", "/k/3"]
    w = store.watch("/k/", 5)
    assert [e.revision for e in await take(w, 2)] == [6, 7]
    w.close()
    with pytest.raises(FutureRevisionError):
        await store.compact(100)


async def test_auto_compaction_keeps_window(small_store: Store) -> None:
    s = small_store
    for i in range(20):
        await s.create(f"/k/{i}", {})
    assert s.revision == 21
    assert s.revision - s.compacted_revision >= 5
    assert s.compacted_revision > 1
    with pytest.raises(CompactedError):
        s.watch("/", 1)
    w = s.watch("/", s.revision - 5)
    assert len(await take(w, 5)) == 5
    w.close()
    res = await s.list("/", revision=s.revision - 5)
    assert len(res.items) == 15


async def test_slow_watcher_gets_compacted_error(small_store: Store) -> None:
    s = small_store
    slow = s.watch("/", 0)
    for i in range(6):
        await s.create(f"/k/{i}", {})
    with pytest.raises(CompactedError):
        await next_event(slow)
    with pytest.raises(StopAsyncIteration):
        await next_event(slow)


# -- sqlite specifics ----------------------------------------------------------


async def test_sqlite_reopen_keeps_data_and_revision(tmp_path: Path) -> None:
    s = await _open("sqlite", tmp_path)
    await s.create("/a", {"v": 1})
    await s.create("/b", {"v": 1})
    await s.update("/a", {"v": 2})
    await s.delete("/b")
    await s.create("/c", {"v": 1})
    before = await s.list("/")
    await s.close()

    s2 = await _open("sqlite", tmp_path)
    assert isinstance(s2, SQLiteStore)
    # History is kept on disk: nothing was compacted, so every revision is still reachable.
    assert s2.revision == 6 and s2.compacted_revision == 1
    after = await s2.list("/")
    assert after.items == before.items
    at5 = await s2.list("/", revision=5)
    assert [(kv.key, kv.value["v"], kv.mod_revision) for kv in at5.items] == [("/a", 2, 4)]
    w = s2.watch("/", 6)
    kv = await s2.update("/a", {"v": 3}, expected_revision=4)
    assert kv.mod_revision == 7 and rv(kv.value) == "7" and kv.create_revision == 2
    assert (await next_event(w)).revision == 7
    w.close()
    await s2.close()
    s3 = await _open("sqlite", tmp_path)
    assert s3.revision == 7 and (await s3.get("/a")) == kv
    await s3.close()


async def test_open_store_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        await open_store("sqlite", None)
    with pytest.raises(ValueError):
        await open_store("etcd3", None)
    assert isinstance(await open_store("memory", None), MemoryStore)


# -- property test against a model -------------------------------------------

KEYS = ["/m/a", "/m/b", "/m/ab", "/m/c/1", "/n/a"]

op_strategy = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(KEYS), st.integers(0, 9)),
    st.tuples(st.just("update"), st.sampled_from(KEYS), st.integers(0, 9), st.booleans()),
    st.tuples(st.just("delete"), st.sampled_from(KEYS), st.booleans()),
    st.tuples(st.just("list"), st.sampled_from(["/m/", "/m/a", "/", "/n/"]), st.integers(0, 3)),
)


async def _run_model(s: Store, ops: list[tuple[Any, ...]]) -> None:
    model: dict[str, tuple[int, int, int]] = {}  # key -> (payload, create_rev, mod_rev)
    snapshots: dict[int, dict[str, tuple[int, int, int]]] = {1: {}}
    events: list[tuple[str, str, int]] = []
    watch = s.watch("/m/", 1)
    rev = 1
    for op in ops:
        kind, key = op[0], op[1]
        if kind == "create":
            if key in model:
                with pytest.raises(KeyExistsError):
                    await s.create(key, {"v": op[2]})
                continue
            rev += 1
            kv = await s.create(key, {"v": op[2]})
            model[key] = (op[2], rev, rev)
            events.append(("ADDED", key, rev))
        elif kind == "update":
            stale = op[3]
            if key not in model:
                with pytest.raises(KeyNotFoundError):
                    await s.update(key, {"v": op[2]})
                continue
            if stale:
                with pytest.raises(RevisionConflictError):
                    await s.update(key, {"v": op[2]}, expected_revision=model[key][2] - 1)
                continue
            rev += 1
            kv = await s.update(key, {"v": op[2]}, expected_revision=model[key][2])
            model[key] = (op[2], model[key][1], rev)
            events.append(("MODIFIED", key, rev))
        elif kind == "delete":
            if key not in model:
                with pytest.raises(KeyNotFoundError):
                    await s.delete(key)
                continue
            rev += 1
            kv = await s.delete(key, expected_revision=model[key][2] if op[2] else None)
            assert kv.value["v"] == model.pop(key)[0]
            events.append(("DELETED", key, rev))
        else:
            prefix, back = key, op[2]
            at = max(1, rev - back)
            res = await s.list(prefix, revision=at)
            want = sorted((k, v) for k, v in snapshots[at].items() if k.startswith(prefix))
            got = [(kv.key, (kv.value["v"], kv.create_revision, kv.mod_revision)) for kv in res.items]
            assert got == want
            for kv in res.items:
                assert rv(kv.value) == str(kv.mod_revision)
            continue
        assert s.revision == rev
        assert rv(kv.value) == str(rev)
        snapshots[rev] = dict(model)
    full = await s.list("/")
    assert [(kv.key, kv.value["v"]) for kv in full.items] == sorted((k, v[0]) for k, v in model.items())
    want_events = [e for e in events if e[1].startswith("/m/")]
    got_events = await take(watch, len(want_events))
    assert [(e.type, e.key, e.revision) for e in got_events] == want_events
    watch.close()


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(op_strategy, max_size=40))
def test_memory_matches_model(ops: list[tuple[Any, ...]]) -> None:
    async def run() -> None:
        s = MemoryStore()
        await _run_model(s, ops)
        await s.close()

    asyncio.run(run())


@settings(max_examples=15, deadline=None)
@given(ops=st.lists(op_strategy, max_size=30))
def test_sqlite_matches_model_and_reloads(ops: list[tuple[Any, ...]]) -> None:
    async def run(d: str) -> None:
        s = await open_store("sqlite", d)
        await _run_model(s, ops)
        before = (await s.list("/")).items
        revision = s.revision
        await s.close()
        s2 = await open_store("sqlite", d)
        assert s2.revision == revision and (await s2.list("/")).items == before
        await s2.close()

    with tempfile.TemporaryDirectory() as d:
        asyncio.run(run(d))


async def test_cancelled_writer_still_commits(tmp_path: Path) -> None:
    s = await _open("sqlite", tmp_path)
    w = s.watch("/", 0)
    task = asyncio.create_task(s.create("/k", {"a": 1}))
    await asyncio.sleep(0)
    task.cancel()
    ev = await next_event(w)
    assert (ev.key, ev.revision) == ("/k", 2)
    assert (await s.get("/k")) is not None
    kv = await s.create("/j", {})
    assert kv.mod_revision == 3
    await s.close()
