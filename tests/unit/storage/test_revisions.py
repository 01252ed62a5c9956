"""The storage layer's revision helpers: the only place revisions are numbers."""

import asyncio

import pytest

from kubeplane.storage.interface import latest_revision, parse_revision, wait_for_revision
from kubeplane.storage.memory import MemoryStore


@pytest.mark.parametrize("value, want", [("0", 0), ("17", 17), (42, 42)])
def test_parse_revision_accepts_non_negative_integers(value, want):
    assert parse_revision(value) == want


@pytest.mark.parametrize("value", ["", "abc", "-1", -3, None, "1.5"])
def test_parse_revision_rejects_everything_else(value):
    with pytest.raises(ValueError):
        parse_revision(value)


def test_latest_revision():
    assert latest_revision(3, 9, 4) == 9


def test_wait_for_revision_returns_once_reached_or_false_at_timeout():
    async def main():
        store = MemoryStore()
        await store.create("/a", {"metadata": {"name": "a"}})
        assert await wait_for_revision(store, store.revision, 0.0)
        target = store.revision + 1
        waiter = asyncio.ensure_future(wait_for_revision(store, target, 5.0))
        await store.create("/b", {"metadata": {"name": "b"}})
        assert await waiter
        assert not await wait_for_revision(store, store.revision + 5, 0.05)
        await store.close()

    asyncio.run(main())
