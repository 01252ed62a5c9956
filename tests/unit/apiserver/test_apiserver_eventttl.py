"""Events are deleted --event-ttl after their last write."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kubeplane.apiserver.eventttl import EventExpiry
from kubeplane.storage import open_store
from helpers import eventually as until

EVENTS = "/registry/core/events/default/"


def event(name: str, **fields: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": "default"},
            "reason": "Test", "message": "m", **fields}


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_events_expire_a_ttl_after_their_last_write(kind: str, tmp_path: Path) -> None:
    store = await open_store(kind, str(tmp_path))
    clock = Clock(1_000_000.0)
    # A long interval: the test sweeps itself, at the times it chooses.
    expiry = EventExpiry(store, 3600, interval=3600, clock=clock)
    expiry.start()
    try:
        a = await store.create(EVENTS + "a", event("a"))
        b = await store.create(EVENTS + "b", event("b"))
        other = await store.create("/registry/core/configmaps/default/c", {"metadata": {"name": "c"}})
        await until(lambda: expiry.revision_seen(EVENTS + "b") == b.mod_revision)
        clock.t += 1800
        a2 = await store.update(EVENTS + "a", event("a", count=2))
        await until(lambda: expiry.revision_seen(EVENTS + "a") == a2.mod_revision)

        clock.t += 1799
        assert await expiry.sweep() == 0
        clock.t += 1
        assert await expiry.sweep() == 1  # b: an hour after its only write
        assert await store.get(EVENTS + "b") is None
        assert await store.get(EVENTS + "a") == a2
        clock.t += 1800
        assert await expiry.sweep() == 1  # a: an hour after its rewrite
        assert await store.get(EVENTS + "a") is None
        assert await store.get(other.key) == other
        assert a.mod_revision < a2.mod_revision
    finally:
        await expiry.stop()
        await store.close()


async def test_events_stored_before_start_count_from_their_timestamps(tmp_path: Path) -> None:
    store = await open_store("sqlite", str(tmp_path))
    old = await store.create(EVENTS + "old", event("old", lastTimestamp="2026-01-01T10:00:00Z",
                                                   metadata={"name": "old", "creationTimestamp": "2026-01-01T09:00:00Z"}))
    fresh = await store.create(EVENTS + "fresh", event("fresh", eventTime="2026-01-01T10:59:00.000000Z"))
    series = await store.create(EVENTS + "series", event(
        "series", lastTimestamp="2026-01-01T09:00:00Z", series={"count": 3, "lastObservedTime": "2026-01-01T10:30:00.000000Z"}))
    await store.close()
    store = await open_store("sqlite", str(tmp_path))
    from kubeplane.api.meta import parse_time

    clock = Clock(parse_time("2026-01-01T11:10:00Z").timestamp())
    expiry = EventExpiry(store, 3600, interval=3600, clock=clock)
    expiry.start()
    try:
        await until(lambda: expiry.revision_seen(EVENTS + "series") == series.mod_revision)
        assert await expiry.sweep() == 1
        assert await store.get(EVENTS + "old") is None
        assert (await store.get(EVENTS + "fresh")) == fresh
        clock.t = parse_time("2026-01-01T11:30:00Z").timestamp()
        assert await expiry.sweep() == 1
        assert await store.get(EVENTS + "series") is None
        assert old.mod_revision < fresh.mod_revision
    finally:
        await expiry.stop()
        await store.close()


async def test_an_event_rewritten_during_the_sweep_is_kept(tmp_path: Path) -> None:
    store = await open_store("memory", str(tmp_path))
    clock = Clock(5_000.0)
    expiry = EventExpiry(store, 60, interval=3600, clock=clock)
    expiry.start()
    try:
        e = await store.create(EVENTS + "e", event("e"))
        await until(lambda: expiry.revision_seen(EVENTS + "e") == e.mod_revision)
        # Rewritten, but the expiry has not heard of it yet when it sweeps.
        e2 = await store.update(EVENTS + "e", event("e", count=2))
        clock.t += 61
        assert await expiry.sweep() == 0
        assert await store.get(EVENTS + "e") == e2
    finally:
        await expiry.stop()
        await store.close()


async def test_the_background_loop_sweeps_on_its_interval(tmp_path: Path) -> None:
    store = await open_store("memory", str(tmp_path))
    clock = Clock(0.0)
    expiry = EventExpiry(store, 10, interval=0.01, clock=clock)
    expiry.start()
    try:
        e = await store.create(EVENTS + "e", event("e"))
        await until(lambda: expiry.revision_seen(EVENTS + "e") == e.mod_revision)
        clock.t = 11
        await until(lambda: expiry.expired == 1)
        assert await store.get(EVENTS + "e") is None
    finally:
        await expiry.stop()
        await store.close()


async def test_expiry_relists_after_falling_behind_and_ends_with_the_store(tmp_path: Path) -> None:
    # A watch queue of 2 events: a burst of writes drops the expiry's watch and it relists.
    store = await open_store("memory", str(tmp_path), watch_queue=2)
    clock = Clock(100.0)
    expiry = EventExpiry(store, 10, interval=3600, clock=clock)
    expiry.start()
    try:
        await asyncio.sleep(0)
        kvs = [await store.create(EVENTS + f"e{i}", event(f"e{i}")) for i in range(10)]
        await until(lambda: all(expiry.revision_seen(kv.key) == kv.mod_revision for kv in kvs))
        clock.t += 10
        assert await expiry.sweep() == 10
    finally:
        await store.close()
        task = expiry._task
        assert task is not None
        await asyncio.wait_for(asyncio.shield(task), 2)  # the closed store ends the loop
        await expiry.stop()
