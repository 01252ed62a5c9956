"""A small controller base: informers, rate-limited work queues, workers, events
(:class:`kubeplane.client.events.EventRecorder`).

The queue follows client-go's ``workqueue``: a key is queued at most once
(dirty set), never processed by two workers at once (a key re-added while
being processed is queued again when :meth:`WorkQueue.done` is called), and
failures are retried with a per-key exponential backoff (5 ms doubling up to
1000 s by default) until :meth:`WorkQueue.forget`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import weakref
from bisect import bisect_left
from typing import Awaitable, Callable, Iterator

from kubeplane.api.errors import StatusError
from kubeplane.client.events import EventRecorder
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.interface import Client
from kubeplane.runtime import wake_first

log = logging.getLogger(__name__)

SyncFunc = Callable[[str], Awaitable[None]]

#: every live work queue, for :class:`WorkQueueCollector`
_QUEUES: "weakref.WeakSet[WorkQueue]" = weakref.WeakSet()

#: client-go's buckets for the work queues' durations: 10ns to 10s, by factors of 10
DURATION_BUCKETS = tuple(10e-9 * 10**i for i in range(10))


class RetryLater(Exception):
    """A sync that cannot finish yet (e.g. a namespace whose content remains):
    retried with the queue's backoff and logged at debug level only."""


class WorkQueue:
    """Deduplicating, rate-limited async queue of string keys."""

    def __init__(self, name: str = "", *, base_delay: float = 0.005, max_delay: float = 1000.0) -> None:
        self.name = name
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._queue: collections.deque[str] = collections.deque()
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._failures: dict[str, int] = {}
        self._timers: dict[str, tuple[float, asyncio.TimerHandle]] = {}
        self._shutting_down = False
        # Workers waiting for a key, first come first served. A new key wakes
        # one of them, not all: with an Event every add woke every idle worker
        # and all but one went back to sleep.
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        # Metrics, read when scraped (WorkQueueCollector): plain counters and
        # the monotonic time each key in processing was taken.
        self.adds = 0
        self.retries = 0
        self._started: dict[str, float] = {}
        self._queued_at: dict[str, float] = {}
        #: bucket counts (the last is +Inf) and sums of the time keys waited and were worked on
        self.queue_durations = [0] * (len(DURATION_BUCKETS) + 1)
        self.work_durations = [0] * (len(DURATION_BUCKETS) + 1)
        self.queue_duration_sum = 0.0
        self.work_duration_sum = 0.0
        _QUEUES.add(self)

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    @property
    def idle(self) -> bool:
        """Nothing queued, in processing or waiting for a delayed add."""
        return not self._queue and not self._processing and not self._timers

    @property
    def quiet(self) -> bool:
        """Nothing queued or in processing; delayed adds (periodic re-checks,
        retries) may still be waiting for their time. For a controller that
        always keeps a re-check scheduled, this is "done with what it was given"."""
        return not self._queue and not self._processing

    def add(self, key: str) -> None:
        if self._shutting_down or key in self._dirty:
            return
        self._dirty.add(key)
        self.adds += 1
        if key in self._processing:
            return
        self._queue.append(key)
        self._queued_at[key] = time.monotonic()
        wake_first(self._waiters)

    def add_after(self, key: str, delay: float) -> None:
        """Add ``key`` after ``delay`` seconds (an earlier pending add wins)."""
        if self._shutting_down:
            return
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        pending = self._timers.get(key)
        if pending is not None:
            if pending[0] <= when:
                return
            pending[1].cancel()
        handle = loop.call_at(when, self._fire, key)
        self._timers[key] = (when, handle)

    def _fire(self, key: str) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def when(self, key: str) -> float:
        """Next backoff for ``key`` (and count the failure)."""
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        return min(self.base_delay * (2 ** min(n, 60)), self.max_delay)

    def add_rate_limited(self, key: str) -> None:
        self.retries += 1
        self.add_after(key, self.when(key))

    def forget(self, key: str) -> None:
        self._failures.pop(key, None)

    def num_requeues(self, key: str) -> int:
        return self._failures.get(key, 0)

    async def get(self) -> str | None:
        """Next key to process, or ``None`` once shut down and drained of work."""
        while not self._queue:
            if self._shutting_down:
                return None
            w = asyncio.get_running_loop().create_future()
            self._waiters.append(w)
            try:
                await w
            except asyncio.CancelledError:
                if w.done() and not w.cancelled():
                    wake_first(self._waiters)  # woken, then cancelled: the key goes to another worker
                raise
        key = self._queue.popleft()
        self._dirty.discard(key)
        self._processing.add(key)
        now = self._started[key] = time.monotonic()
        queued = self._queued_at.pop(key, None)
        if queued is not None:
            waited = now - queued
            self.queue_durations[bisect_left(DURATION_BUCKETS, waited)] += 1
            self.queue_duration_sum += waited
        return key

    def done(self, key: str) -> None:
        self._processing.discard(key)
        started = self._started.pop(key, None)
        now = time.monotonic()
        if started is not None:
            worked = now - started
            self.work_durations[bisect_left(DURATION_BUCKETS, worked)] += 1
            self.work_duration_sum += worked
        if key in self._dirty and not self._shutting_down:
            self._queue.append(key)
            self._queued_at[key] = now
            wake_first(self._waiters)

    def shut_down(self) -> None:
        """Stop accepting keys; waiting workers get ``None``."""
        self._shutting_down = True
        self._queue.clear()
        self._dirty.clear()
        self._queued_at.clear()
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        waiters, self._waiters = self._waiters, collections.deque()
        for w in waiters:
            if not w.done():
                w.set_result(None)


class WorkQueueCollector:
    """client-go's work-queue metrics (workqueue_depth, workqueue_adds_total,
    workqueue_retries_total, workqueue_queue_duration_seconds,
    workqueue_work_duration_seconds, workqueue_unfinished_work_seconds,
    workqueue_longest_running_processor_seconds) by queue ``name``, for every
    live queue of this process, computed when scraped."""

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
        from prometheus_client.utils import floatToGoString

        depth = GaugeMetricFamily("workqueue_depth", "Current depth of workqueue", labels=["name"])
        adds = CounterMetricFamily("workqueue_adds", "Total number of adds handled by workqueue", labels=["name"])
        retries = CounterMetricFamily("workqueue_retries", "Total number of retries handled by workqueue",
                                      labels=["name"])
        unfinished = GaugeMetricFamily(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has been done that is in progress and hasn't been observed by "
            "work_duration. Large values indicate stuck threads. One can deduce the number of stuck threads by "
            "observing the rate at which this increases.", labels=["name"])
        longest = GaugeMetricFamily(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running.", labels=["name"])
        queue_duration = HistogramMetricFamily(
            "workqueue_queue_duration_seconds", "How long in seconds an item stays in workqueue before being "
            "requested.", labels=["name"])
        work_duration = HistogramMetricFamily(
            "workqueue_work_duration_seconds", "How long in seconds processing an item from workqueue takes.",
            labels=["name"])
        now = time.monotonic()
        n = len(DURATION_BUCKETS) + 1
        totals: dict[str, list] = {}
        for q in list(_QUEUES):
            if q.shutting_down:
                continue
            t = totals.setdefault(q.name, [0, 0, 0, 0.0, 0.0, [0] * n, 0.0, [0] * n, 0.0])
            t[0] += len(q)
            t[1] += q.adds
            t[2] += q.retries
            ages = [now - s for s in q._started.values()]
            t[3] += sum(ages)
            t[4] = max([t[4], *ages])
            t[5] = [a + b for a, b in zip(t[5], q.queue_durations)]
            t[6] += q.queue_duration_sum
            t[7] = [a + b for a, b in zip(t[7], q.work_durations)]
            t[8] += q.work_duration_sum

        def cumulative(counts: list[int]) -> list[tuple[str, float]]:
            out, total = [], 0
            for bound, c in zip((*DURATION_BUCKETS, float("inf")), counts):
                total += c
                out.append((floatToGoString(bound), total))
            return out

        for name, (d, a, r, u, lng, qd, qs, wd, ws) in sorted(totals.items()):
            depth.add_metric([name], d)
            adds.add_metric([name], a)
            retries.add_metric([name], r)
            unfinished.add_metric([name], u)
            longest.add_metric([name], lng)
            queue_duration.add_metric([name], cumulative(qd), qs)
            work_duration.add_metric([name], cumulative(wd), ws)
        return iter([depth, adds, retries, queue_duration, work_duration, unfinished, longest])


class Controller:
    """Informers + named work queues + workers.

    Subclasses get informers from ``factory`` and register handlers in their
    constructor, create queues with :meth:`add_queue`, and implement sync
    functions ``async def sync(key)``. A sync that raises is retried with
    backoff (StatusError Conflict is logged at debug level only); one that
    returns normally resets the key's backoff.
    """

    def __init__(
        self,
        name: str,
        client: Client,
        factory: SharedInformerFactory | None = None,
        *,
        workers: int = 1,
    ) -> None:
        self.name = name
        self.client = client
        self._owns_factory = factory is None
        self.factory = factory or SharedInformerFactory(client)
        self.workers = workers
        self.recorder = EventRecorder(client, name)
        self._queues: dict[str, tuple[WorkQueue, SyncFunc]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._running = False

    def add_queue(self, name: str, sync: SyncFunc, *, base_delay: float = 0.005,
                  max_delay: float = 1000.0) -> WorkQueue:
        queue = WorkQueue(f"{self.name}-{name}", base_delay=base_delay, max_delay=max_delay)
        self._queues[name] = (queue, sync)
        return queue

    def queue(self, name: str) -> WorkQueue:
        return self._queues[name][0]

    @property
    def running(self) -> bool:
        return self._running

    @property
    def idle(self) -> bool:
        """Every work queue idle (nothing queued, in processing or delayed)."""
        return all(queue.idle for queue, _ in self._queues.values())

    @property
    def quiet(self) -> bool:
        """Every work queue quiet: nothing queued or in processing (delayed adds left out)."""
        return all(queue.quiet for queue, _ in self._queues.values())

    async def start(self, sync_timeout: float | None = 30.0) -> None:
        """Start informers (if not running), wait for their caches, start workers."""
        if self._running:
            return
        self.factory.start()
        synced = await self.factory.wait_for_cache_sync(sync_timeout)
        if not all(synced.values()):
            raise TimeoutError(f"{self.name}: informer caches did not sync")
        self._running = True
        loop = asyncio.get_running_loop()
        for qname, (queue, sync) in self._queues.items():
            for i in range(self.workers):
                self._tasks.append(loop.create_task(self._worker(queue, sync), name=f"{self.name}-{qname}-{i}"))

    async def stop(self, timeout: float = 5.0) -> None:
        """Shut the queues down, let workers finish their current key, then stop
        the informers if this controller created them."""
        for queue, _ in self._queues.values():
            queue.shut_down()
        tasks, self._tasks = self._tasks, []
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            for t in pending:
                t.cancel()
            for t in pending:
                try:
                    await t
                except asyncio.CancelledError:
                    pass
        self._running = False
        await self.recorder.close(timeout)
        if self._owns_factory:
            await self.factory.stop()

    async def _worker(self, queue: WorkQueue, sync: SyncFunc) -> None:
        while True:
            key = await queue.get()
            if key is None:
                return
            try:
                await sync(key)
            except asyncio.CancelledError:
                queue.done(key)
                raise
            except RetryLater as err:
                log.debug("%s: %s, requeueing", queue.name, err)
                queue.add_rate_limited(key)
            except StatusError as err:
                if err.code == 409:
                    log.debug("%s: conflict syncing %s, requeueing", queue.name, key)
                else:
                    log.warning("%s: error syncing %s: %s", queue.name, key, err)
                queue.add_rate_limited(key)
            except Exception:  # noqa: BLE001 - one bad key must not stop the worker
                log.exception("%s: error syncing %s", queue.name, key)
                queue.add_rate_limited(key)
            else:
                queue.forget(key)
            queue.done(key)
