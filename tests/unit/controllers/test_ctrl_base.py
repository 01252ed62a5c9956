"""WorkQueue semantics (dedupe, processing exclusivity, backoff), Controller lifecycle, events."""

from __future__ import annotations

import asyncio

import pytest

from kubeplane.api.errors import conflict
from kubeplane.api.resources import resource
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.base import Controller, EventRecorder, WorkQueue

CMS = resource("configmaps")
EVENTS = resource("events")


async def test_queue_dedupes_and_orders() -> None:
    q = WorkQueue()
    for k in ("a", "b", "a", "c", "b"):
        q.add(k)
    assert len(q) == 3
    assert [await q.get() for _ in range(3)] == ["a", "b", "c"]


async def test_key_readded_while_processing_waits_for_done() -> None:
    q = WorkQueue()
    q.add("a")
    key = await q.get()
    q.add("a")
    assert len(q) == 0  # not handed to a second worker
    q.done(key)
    assert len(q) == 1 and await q.get() == "a"


async def test_idle_only_when_nothing_is_queued_processing_or_delayed() -> None:
    q = WorkQueue()
    assert q.idle
    q.add("a")
    assert not q.idle  # queued
    key = await q.get()
    assert not q.idle  # in processing
    q.done(key)
    assert q.idle
    q.add_after("b", 60)
    assert not q.idle  # waiting for a delayed add
    q.shut_down()


async def test_quiet_leaves_delayed_adds_out() -> None:
    q = WorkQueue()
    assert q.quiet
    q.add("a")
    assert not q.quiet  # queued
    key = await q.get()
    assert not q.quiet  # in processing
    q.done(key)
    q.add_after("b", 60)
    assert q.quiet and not q.idle  # only a delayed add waits
    ctrl = Controller("t", client=None, factory=object())  # type: ignore[arg-type]

    async def sync(key: str) -> None:
        pass

    c = ctrl.add_queue("c", sync)
    c.add_after("k", 60)
    assert ctrl.quiet and not ctrl.idle
    c.add("now")
    assert not ctrl.quiet
    q.shut_down()
    c.shut_down()


async def test_controller_idle_when_every_queue_is() -> None:
    ctrl = Controller("t", client=None, factory=object())  # type: ignore[arg-type]

    async def sync(key: str) -> None:
        pass

    a = ctrl.add_queue("a", sync)
    b = ctrl.add_queue("b", sync)
    assert ctrl.idle
    b.add("k")
    assert not ctrl.idle and a.idle
    b.done(await b.get())
    assert ctrl.idle


async def test_backoff_is_exponential_and_capped_and_forget_resets() -> None:
    q = WorkQueue(base_delay=0.005, max_delay=1000.0)
    delays = [q.when("k") for _ in range(20)]
    assert delays[:4] == [0.005, 0.01, 0.02, 0.04]
    assert delays[-1] == 1000.0 and max(delays) == 1000.0
    assert q.num_requeues("k") == 20
    q.forget("k")
    assert q.num_requeues("k") == 0 and q.when("k") == 0.005


async def test_add_after_and_rate_limited_fire_later() -> None:
    q = WorkQueue(base_delay=0.02)
    q.add_rate_limited("x")
    assert len(q) == 0
    got = await asyncio.wait_for(q.get(), 1)
    assert got == "x"
    q.add_after("y", 10)
    q.add_after("y", 0.01)  # an earlier add wins
    assert await asyncio.wait_for(q.get(), 1) == "y"


async def test_shutdown_releases_waiting_getters() -> None:
    q = WorkQueue()
    getter = asyncio.ensure_future(q.get())
    await asyncio.sleep(0)
    q.shut_down()
    assert await asyncio.wait_for(getter, 1) is None
    q.add("late")
    assert len(q) == 0


async def test_a_key_wakes_one_idle_worker() -> None:
    q = WorkQueue()
    got: list[str] = []

    async def worker() -> None:
        while True:
            key = await q.get()
            if key is None:
                return
            got.append(key)
            q.done(key)

    workers = [asyncio.ensure_future(worker()) for _ in range(4)]
    await asyncio.sleep(0)
    assert len(q._waiters) == 4
    q.add("a")
    for _ in range(3):
        await asyncio.sleep(0)
    # One worker took the key; the three others never left their wait.
    assert got == ["a"] and len(q._waiters) == 4
    assert sum(1 for w in q._waiters if w.done()) == 0
    for k in ("b", "c", "d", "e", "f"):
        q.add(k)
    await asyncio.sleep(0.01)
    assert sorted(got) == ["a", "b", "c", "d", "e", "f"]
    q.shut_down()
    assert await asyncio.wait_for(asyncio.gather(*workers), 1) == [None] * 4


async def test_a_worker_cancelled_after_its_wake_passes_the_key_on() -> None:
    q = WorkQueue()
    first = asyncio.ensure_future(q.get())
    second = asyncio.ensure_future(q.get())
    await asyncio.sleep(0)
    q.add("k")  # wakes the first getter ...
    first.cancel()  # ... which is cancelled before it runs
    assert await asyncio.wait_for(second, 1) == "k"
    assert first.cancelled()


@pytest.fixture
def client(inprocess_client: InProcessClient) -> InProcessClient:
    return inprocess_client


class Counting(Controller):
    def __init__(self, client, fail_times: int) -> None:
        super().__init__("counting", client, workers=2)
        self.fail_times = fail_times
        self.calls: list[str] = []
        self.informer = self.factory.informer_for(CMS)
        self.q = self.add_queue("cms", self.sync, base_delay=0.001)
        self.informer.add_event_handler(lambda o: self.q.add(o["metadata"]["namespace"] + "/" + o["metadata"]["name"]))

    async def sync(self, key: str) -> None:
        self.calls.append(key)
        if len(self.calls) <= self.fail_times:
            raise conflict("configmaps", key)


async def test_controller_retries_conflicts_then_stops_gracefully(client) -> None:
    await client.create(CMS, {"metadata": {"name": "one"}}, "default")
    ctrl = Counting(client, fail_times=3)
    await ctrl.start(sync_timeout=1)
    try:
        for _ in range(200):
            if len(ctrl.calls) >= 4:
                break
            await asyncio.sleep(0.005)
        assert ctrl.calls == ["default/one"] * 4
        assert ctrl.q.num_requeues("default/one") == 0  # forgotten after success
    finally:
        await ctrl.stop(timeout=1)
    assert not ctrl.running and ctrl.q.shutting_down
    assert not ctrl.informer.started


async def test_event_recorder_creates_then_counts(client) -> None:
    rec = EventRecorder(client, "tester")
    cm = await client.create(CMS, {"metadata": {"name": "cm"}}, "default")
    rec.event(cm, "Normal", "Reason", "hello")
    assert await rec.flush(5)
    rec.event(cm, "Normal", "Reason", "hello")
    rec.event(cm, "Warning", "Other", "bye")
    assert await rec.flush(5)
    items = (await client.list(EVENTS, "default"))["items"]
    by_reason = {e["reason"]: e for e in items}
    assert set(by_reason) == {"Reason", "Other"}
    assert by_reason["Reason"]["count"] == 2 and by_reason["Other"]["type"] == "Warning"
    assert by_reason["Reason"]["involvedObject"]["uid"] == cm["metadata"]["uid"]
    assert by_reason["Reason"]["source"] == {"component": "tester"}
