from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from fake_client import FakeClient
from kubeplane.api.resources import Catalogue
from kubeplane.client.informer import (
    DeletedFinalStateUnknown,
    HandlerRegistration,
    Indexer,
    Reflector,
    SharedInformer,
    SharedInformerFactory,
    meta_namespace_key,
    unwrap_deleted,
)
from helpers import eventually as until

CAT = Catalogue()
PODS = CAT.by_kind("Pod")
NODES = CAT.by_kind("Node")
FAST = {"backoff_initial": 0.001, "backoff_max": 0.01}


def pod(name: str, node: str = "", ns: str = "default", **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "labels": labels}, "spec": {"nodeName": node}}


def by_node(obj: dict[str, Any]) -> list[str]:
    node = obj.get("spec", {}).get("nodeName")
    return [node] if node else []


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def add(self, obj: dict[str, Any]) -> None:
        self.events.append(("add", obj["metadata"]["name"]))

    def update(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        self.events.append(("update", new["metadata"]["name"], old["metadata"]["resourceVersion"],
                            new["metadata"]["resourceVersion"]))

    def delete(self, obj: dict[str, Any]) -> None:
        self.events.append(("delete", obj["metadata"]["name"], type(obj).__name__))

    def register(self, inf: SharedInformer):
        return inf.add_event_handler(self.add, self.update, self.delete)


@pytest.fixture
async def fake():
    client = FakeClient()
    yield client
    await client.close()


# ---------------------------------------------------------------- Indexer


def test_meta_namespace_key():
    assert meta_namespace_key(pod("a", ns="ns1")) == "ns1/a"
    assert meta_namespace_key({"metadata": {"name": "node-1"}}) == "node-1"


def test_indexer_indexes_follow_updates_and_deletes():
    idx = Indexer({"byNode": by_node})
    idx.add(pod("a", "n1"))
    idx.add(pod("b", "n1"))
    idx.add(pod("c", "n2"))
    assert [o["metadata"]["name"] for o in idx.by_index("byNode", "n1")] == ["a", "b"]
    idx.update(pod("a", "n2"))
    assert idx.index_keys("byNode", "n1") == ["default/b"]
    assert idx.index_keys("byNode", "n2") == ["default/a", "default/c"]
    idx.delete(pod("b", "n1"))
    assert idx.index_keys("byNode", "n1") == []
    assert sorted(idx.list_index_func_values("byNode")) == ["n2"]
    assert idx.get_by_key("default/a")["spec"]["nodeName"] == "n2"
    assert idx.get(pod("a")) is idx.get_by_key("default/a")
    assert sorted(idx.list_keys()) == ["default/a", "default/c"]


def test_indexer_late_indexer_and_replace():
    idx = Indexer()
    idx.add(pod("a", "n1"))
    idx.add_indexers({"byNode": by_node})
    assert idx.index_keys("byNode", "n1") == ["default/a"]
    with pytest.raises(ValueError):
        idx.add_indexers({"byNode": by_node})
    idx.replace([pod("x", "n3")], "42")
    assert idx.list_keys() == ["default/x"]
    assert idx.index_keys("byNode", "n1") == []
    assert idx.index_keys("byNode", "n3") == ["default/x"]
    assert idx.resource_version == "42"
    with pytest.raises(KeyError):
        idx.by_index("nope", "x")


def test_indexer_version_changes_with_every_content_change():
    idx = Indexer({"byNode": by_node})
    seen = [idx.version]

    def changed() -> bool:
        seen.append(idx.version)
        return seen[-1] != seen[-2]

    idx.add(pod("a", "n1"))
    assert changed()
    idx.update(pod("a", "n2"))
    assert changed()
    idx.update(pod("a", "n2"))  # a new object under the same key counts too
    assert changed()
    assert idx.get_by_key("default/a") is not None and not changed()
    idx.delete(pod("missing"))  # nothing removed: contents unchanged
    assert not changed()
    idx.delete(pod("a"))
    assert changed()
    idx.replace([], "7")
    assert changed()
    assert seen == sorted(seen)


# ------------------------------------------------------------ Reflector


class ListSink:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def replace(self, objs, rv):
        self.calls.append(("replace", sorted(o["metadata"]["name"] for o in objs), rv))

    def on_added(self, obj):
        self.calls.append(("added", obj["metadata"]["name"]))

    def on_modified(self, obj):
        self.calls.append(("modified", obj["metadata"]["name"]))

    def on_deleted(self, obj):
        self.calls.append(("deleted", obj["metadata"]["name"]))


async def test_reflector_paginates_and_watches_from_list_rv(fake):
    for i in range(7):
        await fake.create(PODS, pod(f"p{i}"))
    sink = ListSink()
    refl = Reflector(fake, PODS, sink, page_size=3, **FAST)
    task = asyncio.create_task(refl.run())
    try:
        await until(lambda: len(fake.watch_calls) == 1)
        assert [c["limit"] for c in fake.list_calls] == [3, 3, 3]
        assert sink.calls == [("replace", [f"p{i}" for i in range(7)], "7")]
        assert fake.watch_calls[0]["resource_version"] == "7"
        assert fake.watch_calls[0]["allow_bookmarks"] is True
        await fake.create(PODS, pod("new"))
        await until(lambda: ("added", "new") in sink.calls)
        assert refl.last_sync_resource_version == "8"
        await fake.create(NODES, {"metadata": {"name": "n"}})  # rv 9, other resource
        fake.send_bookmark(PODS)
        await until(lambda: refl.last_sync_resource_version == "9")
        assert sink.calls[-1] == ("added", "new")  # the bookmark is not an event
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_reflector_rewatches_from_last_rv_when_stream_ends(fake):
    await fake.create(PODS, pod("a"))
    sink = ListSink()
    refl = Reflector(fake, PODS, sink, **FAST)
    task = asyncio.create_task(refl.run())
    try:
        await until(lambda: len(fake.watch_calls) == 1)
        await fake.update(PODS, {**pod("a"), "spec": {"nodeName": "n1"}})
        await until(lambda: ("modified", "a") in sink.calls)
        fake.end_watches()
        await until(lambda: len(fake.watch_calls) == 2)
        assert fake.watch_calls[1]["resource_version"] == "2"
        assert len(fake.list_calls) == 1  # no relist on a normal end
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert not fake.watches  # the watch was closed on cancel


async def test_reflector_relists_after_broken_stream(fake):
    await fake.create(PODS, pod("a"))
    sink = ListSink()
    refl = Reflector(fake, PODS, sink, **FAST)
    task = asyncio.create_task(refl.run())
    try:
        await until(lambda: len(fake.watch_calls) == 1)
        fake.break_watches()
        await until(lambda: len(fake.watch_calls) == 2)
        assert len(fake.list_calls) == 2
        await fake.create(PODS, pod("b"))
        await until(lambda: ("added", "b") in sink.calls)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# -------------------------------------------------------- SharedInformer


async def test_initial_sync_and_live_events(fake):
    await fake.create(PODS, pod("a"))
    await fake.create(PODS, pod("b"))
    inf = SharedInformer(fake, PODS, reflector_options=FAST)
    rec = Recorder()
    reg = rec.register(inf)
    assert not inf.has_synced()
    inf.start()
    try:
        assert await inf.wait_for_sync(2)
        assert inf.has_synced()
        assert inf.last_sync_resource_version == "2"
        assert sorted(inf.indexer.list_keys()) == ["default/a", "default/b"]
        assert await reg.wait_for_sync(2)
        assert reg.has_synced()
        assert sorted(rec.events) == [("add", "a"), ("add", "b")]
        await fake.update(PODS, {**pod("a"), "spec": {"nodeName": "x"}})
        await fake.delete(PODS, "b", "default")
        await until(lambda: len(rec.events) == 4)
        assert rec.events[2:] == [("update", "a", "1", "3"), ("delete", "b", "dict")]
        assert inf.indexer.list_keys() == ["default/a"]
    finally:
        await inf.stop()


async def test_ordered_delivery_per_handler_and_slow_handler_does_not_block(fake):
    inf = SharedInformer(fake, PODS, reflector_options=FAST)
    release = asyncio.Event()
    slow_seen: list[str] = []
    fast_seen: list[str] = []

    async def slow_add(obj):
        await release.wait()
        slow_seen.append(obj["metadata"]["name"])

    async def fast_add(obj):
        await asyncio.sleep(0)
        fast_seen.append(obj["metadata"]["name"])

    inf.add_event_handler(on_add=slow_add)
    inf.add_event_handler(on_add=fast_add)
    inf.start()
    try:
        assert await inf.wait_for_sync(2)
        names = [f"p{i:02d}" for i in range(20)]
        for n in names:
            await fake.create(PODS, pod(n))
        await until(lambda: len(fast_seen) == 20)
        assert fast_seen == names
        assert slow_seen == []  # still blocked, and it blocked nobody
        assert len(inf.indexer) == 20
        assert inf.pending == 19  # the slow handler holds p00; the rest wait for it
        release.set()
        await until(lambda: len(slow_seen) == 20)
        assert slow_seen == names
        assert inf.pending == 0
    finally:
        await inf.stop()


async def test_indexer_updated_before_handler_runs(fake):
    inf = SharedInformer(fake, PODS, reflector_options=FAST)
    seen: list[tuple[str, Any]] = []

    def on_update(old, new):
        cur = inf.indexer.get_by_key(meta_namespace_key(new))
        seen.append(("update", cur["metadata"]["resourceVersion"] if cur else None))

    def on_delete(obj):
        seen.append(("delete", inf.indexer.get_by_key(meta_namespace_key(obj))))

    def on_add(obj):
        cur = inf.indexer.get_by_key(meta_namespace_key(obj))
        seen.append(("add", cur["metadata"]["resourceVersion"] if cur else None))

    inf.add_event_handler(on_add, on_update, on_delete)
    inf.start()
    try:
        assert await inf.wait_for_sync(2)
        await fake.create(PODS, pod("a"))
        await until(lambda: len(seen) == 1)
        await fake.update(PODS, pod("a", "n1"))
        await until(lambda: len(seen) == 2)
        await fake.delete(PODS, "a", "default")
        await until(lambda: len(seen) == 3)
        assert seen == [("add", "1"), ("update", "2"), ("delete", None)]
    finally:
        await inf.stop()


async def test_by_index_through_informer(fake):
    inf = SharedInformer(fake, PODS, indexers={"byNode": by_node}, reflector_options=FAST)
    await fake.create(PODS, pod("a", "n1"))
    inf.start()
    try:
        assert await inf.wait_for_sync(2)
        await fake.create(PODS, pod("b", "n1"))
        await fake.create(PODS, pod("c", "n2"))
        await until(lambda: len(inf.indexer) == 3)
        assert inf.indexer.index_keys("byNode", "n1") == ["default/a", "default/b"]
        await fake.update(PODS, pod("b", "n2"))
        await until(lambda: inf.indexer.index_keys("byNode", "n1") == ["default/a"])
        assert [o["metadata"]["name"] for o in inf.indexer.by_index("byNode", "n2")] == ["b", "c"]
    finally:
        await inf.stop()


async def test_relist_after_410_delivers_the_difference(fake):
    for n in ("keep", "change", "gone"):
        await fake.create(PODS, pod(n))
    inf = SharedInformer(fake, PODS, reflector_options=FAST)
    rec = Recorder()
    rec.register(inf)
    inf.start()
    try:
        assert await inf.wait_for_sync(2)
        await until(lambda: len(rec.events) == 3)
        fake.suspend_watches()  # a silent disconnect: the informer misses what follows
        await fake.update(PODS, pod("change", "n9"))
        await fake.delete(PODS, "gone", "default")
        await fake.create(PODS, pod("fresh"))
        await asyncio.sleep(0.02)
        assert len(rec.events) == 3
        fake.expire_watches()
        await until(lambda: len(rec.events) == 6)
        assert len(fake.list_calls) == 2
        assert sorted(rec.events[3:]) == [
            ("add", "fresh"),
            ("delete", "gone", "DeletedFinalStateUnknown"),
            ("update", "change", "2", "4"),
        ]
        assert sorted(inf.indexer.list_keys()) == ["default/change", "default/fresh", "default/keep"]
        # The informer goes on watching from the relist's revision.
        await fake.create(PODS, pod("after"))
        await until(lambda: ("add", "after") in rec.events)
        assert len(rec.events) == 7  # "keep" (unchanged revision) produced no update
    finally:
        await inf.stop()


async def test_deleted_final_state_unknown_carries_last_state(fake):
    await fake.create(PODS, pod("gone", "n1"))
    inf = SharedInformer(fake, PODS, reflector_options=FAST)
    got: list[Any] = []
    inf.add_event_handler(on_delete=got.append)
    inf.start()
    try:
        assert await inf.wait_for_sync(2)
        fake.suspend_watches()
        await fake.delete(PODS, "gone", "default")
        fake.expire_watches()
        await until(lambda: len(got) == 1)
        tomb = got[0]
        assert isinstance(tomb, DeletedFinalStateUnknown)
        assert tomb.key == "default/gone"
        assert tomb["spec"]["nodeName"] == "n1"
        assert unwrap_deleted(tomb)["metadata"]["resourceVersion"] == "1"
    finally:
        await inf.stop()


async def test_watch_resumes_after_410_on_rewatch(fake):
    """A compaction noticed on re-watch (ERROR as first event) also relists."""
    await fake.create(PODS, pod("a"))
    inf = SharedInformer(fake, PODS, reflector_options=FAST)
    rec = Recorder()
    rec.register(inf)
    inf.start()
    try:
        assert await inf.wait_for_sync(2)
        fake.suspend_watches()
        await fake.create(PODS, pod("b"))
        fake.compact()
        fake.end_watches()
        await until(lambda: ("add", "b") in rec.events)
        assert len(fake.list_calls) == 2
        assert fake.watch_calls[1]["resource_version"] == "1"
    finally:
        await inf.stop()


async def test_late_handler_gets_synthetic_adds_then_live_events(fake):
    await fake.create(PODS, pod("a"))
    await fake.create(PODS, pod("b"))
    inf = SharedInformer(fake, PODS, reflector_options=FAST)
    inf.start()
    try:
        assert await inf.wait_for_sync(2)
        rec = Recorder()
        reg = rec.register(inf)
        assert await reg.wait_for_sync(2)
        assert sorted(rec.events) == [("add", "a"), ("add", "b")]
        await fake.create(PODS, pod("c"))
        await until(lambda: len(rec.events) == 3)
        assert rec.events[2] == ("add", "c")
    finally:
        await inf.stop()


async def test_handler_exception_does_not_stop_delivery(fake):
    inf = SharedInformer(fake, PODS, reflector_options=FAST)
    seen: list[str] = []

    def on_add(obj):
        seen.append(obj["metadata"]["name"])
        if obj["metadata"]["name"] == "bad":
            raise RuntimeError("boom")

    inf.add_event_handler(on_add=on_add)
    inf.start()
    try:
        assert await inf.wait_for_sync(2)
        await fake.create(PODS, pod("bad"))
        await fake.create(PODS, pod("good"))
        await until(lambda: seen == ["bad", "good"])
    finally:
        await inf.stop()


async def test_registration_delivers_bursts_in_order_and_survives_a_restart():
    from kubeplane.client.informer import _Notification

    seen: list[tuple[str, str]] = []
    reg = HandlerRegistration(lambda o: seen.append(("add", o["n"])),
                              lambda old, new: seen.append(("update", new["n"])), None)
    reg._put(_Notification("add", new={"n": "a"}))
    reg._put(_Notification("update", old={"n": "a"}, new={"n": "b"}))
    reg._put(_Notification("delete", old={"n": "b"}))  # no delete handler: skipped
    assert reg.pending == 3
    reg._start()
    await until(lambda: reg.pending == 0)
    assert seen == [("add", "a"), ("update", "b")]
    # Stopped while waiting for work, then started again: nothing is lost.
    await reg._stop()
    reg._put(_Notification("add", new={"n": "c"}))
    await asyncio.sleep(0)
    assert seen[-1] == ("update", "b") and reg.pending == 1
    reg._start()
    for name in "def":
        reg._put(_Notification("add", new={"n": name}))
    reg._mark_sync()
    assert await reg.wait_for_sync(2)
    assert [n for _, n in seen[2:]] == ["c", "d", "e", "f"]
    await reg._stop()


async def test_stop_cancels_every_task(fake):
    inf = SharedInformer(fake, PODS, resync_period=10, reflector_options=FAST)
    inf.add_event_handler(on_add=lambda o: None)
    inf.add_event_handler(on_add=lambda o: None)
    before = set(asyncio.all_tasks())
    inf.start()
    assert await inf.wait_for_sync(2)
    assert len(set(asyncio.all_tasks()) - before) == 4  # reflector, resync, 2 handlers
    await inf.stop()
    assert set(asyncio.all_tasks()) - before == set()
    assert not fake.watches


async def test_resync_redelivers_updates(fake):
    await fake.create(PODS, pod("a"))
    inf = SharedInformer(fake, PODS, resync_period=0.02, reflector_options=FAST)
    rec = Recorder()
    rec.register(inf)
    inf.start()
    try:
        await until(lambda: ("update", "a", "1", "1") in rec.events)
    finally:
        await inf.stop()


async def test_namespace_and_label_selector(fake):
    await fake.create(PODS, pod("a", ns="one", app="web"))
    await fake.create(PODS, pod("b", ns="one", app="db"))
    await fake.create(PODS, pod("c", ns="two", app="web"))
    inf = SharedInformer(fake, PODS, namespace="one", label_selector="app=web", reflector_options=FAST)
    inf.start()
    try:
        assert await inf.wait_for_sync(2)
        assert inf.indexer.list_keys() == ["one/a"]
        await fake.create(PODS, pod("d", ns="two", app="web"))
        await fake.create(PODS, pod("e", ns="one", app="web"))
        await until(lambda: "one/e" in inf.indexer)
        assert sorted(inf.indexer.list_keys()) == ["one/a", "one/e"]
    finally:
        await inf.stop()


async def test_factory_shares_informers(fake):
    await fake.create(NODES, {"metadata": {"name": "n1"}})
    factory = SharedInformerFactory(fake, reflector_options=FAST)
    pods = factory.informer_for(PODS)
    assert factory.informer_for(PODS) is pods
    assert factory.informer_for(PODS, namespace="x") is not pods
    nodes = factory.informer_for(NODES)
    factory.start()
    try:
        synced = await factory.wait_for_cache_sync(2)
        assert synced[NODES] is True and synced[PODS] is True
        assert nodes.indexer.list_keys() == ["n1"]
        assert pods.has_synced()
    finally:
        await factory.stop()
    assert not fake.watches


async def test_reflector_backoff_doubles_and_caps_on_repeated_failures(fake):
    class FailingWatch(FakeClient):
        def watch(self, *a, **kw):
            raise ConnectionRefusedError("api down")

    client = FailingWatch()
    delays: list[float] = []
    done = asyncio.Event()

    async def fake_sleep(d: float) -> None:
        delays.append(d)
        if len(delays) == 8:
            done.set()
        await asyncio.sleep(0)

    refl = Reflector(client, PODS, ListSink(), backoff_initial=0.1, backoff_max=1.0,
                     rng=random.Random(1), sleep=fake_sleep)
    task = asyncio.create_task(refl.run())
    await asyncio.wait_for(done.wait(), 2)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    bases = [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0]
    for d, base in zip(delays, bases):
        assert base <= d <= min(base * 1.5, 1.0)
    assert len(client.list_calls) >= 8  # every failure relists


async def test_reflector_expired_continue_token_falls_back_to_full_list(fake):
    for i in range(5):
        await fake.create(PODS, pod(f"p{i}"))
    original_list = fake.list

    async def list_then_compact(*a, **kw):
        page = await original_list(*a, **kw)
        if len(fake.list_calls) == 1:
            await fake.create(PODS, pod("late"))
            fake.compact()
        return page

    fake.list = list_then_compact
    sink = ListSink()
    refl = Reflector(fake, PODS, sink, page_size=2, **FAST)
    task = asyncio.create_task(refl.run())
    try:
        await until(lambda: len(sink.calls) >= 1)
        assert sink.calls[0] == ("replace", ["late"] + [f"p{i}" for i in range(5)], "6")
        assert [c["limit"] for c in fake.list_calls] == [2, 2, None]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
