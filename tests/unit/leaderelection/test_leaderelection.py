"""Lease-based leader election: two candidates on one in-process registry."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from kubeplane.client.inprocess import InProcessClient
from kubeplane.leaderelection import LEASES, LeaderElector, format_micro_time, parse_micro_time
from helpers import ManualClock, eventually

NS, NAME = "kube-system", "kube-scheduler"
FAST = {"lease_duration": 1.0, "renew_deadline": 0.5, "retry_period": 0.1}


@pytest.fixture
def client(inprocess_client: InProcessClient) -> InProcessClient:
    return inprocess_client


class Candidate:
    """An elector plus a log of its callbacks."""

    def __init__(self, client: Any, identity: str, *, release: bool = True, **kw: Any) -> None:
        self.events: list[str] = []
        self.leaders: list[str] = []
        self.started = asyncio.Event()
        self.stopped = asyncio.Event()
        opts = {**FAST, **kw}
        self.elector = LeaderElector(
            client, NS, NAME, identity,
            on_started_leading=self._started, on_stopped_leading=self._stopped,
            on_new_leader=self.leaders.append, rng=random.Random(1), release_on_cancel=release, **opts,
        )
        self.task: asyncio.Task[None] | None = None

    def _started(self) -> None:
        self.events.append("started")
        self.started.set()

    def _stopped(self) -> None:
        self.events.append("stopped")
        self.stopped.set()

    def start(self) -> "Candidate":
        self.task = asyncio.create_task(self.elector.run())
        return self

    async def stop(self) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def _lease(client: Any) -> dict:
    return (await client.get(LEASES, NAME, NS))["spec"]


def test_micro_time_format() -> None:
    assert format_micro_time(0.25) == "1970-01-01T00:00:00.250000Z"
    assert parse_micro_time("2006-01-02T15:04:05.000000Z") == parse_micro_time("2006-01-02T15:04:05Z")
    assert parse_micro_time(format_micro_time(1_700_000_000.5)) == 1_700_000_000.5


def test_rejects_bad_timings(client: Any) -> None:
    with pytest.raises(ValueError, match="leaseDuration must be greater than renewDeadline"):
        LeaderElector(client, NS, NAME, "a", lease_duration=5, renew_deadline=5, retry_period=1,
                      on_started_leading=lambda: None, on_stopped_leading=lambda: None)
    with pytest.raises(ValueError, match="retryPeriod"):
        LeaderElector(client, NS, NAME, "a", lease_duration=15, renew_deadline=2, retry_period=2,
                      on_started_leading=lambda: None, on_stopped_leading=lambda: None)


class _CountingClient:
    """Delegates to a client and counts the lease reads (one per election attempt)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.gets = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def get(self, *args: Any, **kw: Any) -> dict:
        self.gets += 1
        return await self.inner.get(*args, **kw)


async def test_only_one_leads_and_renews(client: Any) -> None:
    # Lease times come from a clock the test moves: the lease cannot expire
    # while it stands still, however slowly the machine runs.
    clock = ManualClock()
    a = Candidate(client, "a", clock=clock).start()
    b = Candidate(client, "b", clock=clock).start()
    await asyncio.wait_for(asyncio.wait([asyncio.create_task(a.started.wait()),
                                         asyncio.create_task(b.started.wait())],
                                        return_when=asyncio.FIRST_COMPLETED), 2)
    leader, other = (a, b) if a.started.is_set() else (b, a)
    first = await _lease(client)
    # Sync point: the other candidate has read the lease and seen the leader.
    await eventually(lambda: other.leaders == [leader.elector.identity])
    clock.advance(0.5)  # half the 1 s lease: the leader renews, nobody takes over
    renewed = format_micro_time(clock())
    spec = await eventually(lambda: _renewed(client, renewed))
    assert not other.started.is_set()
    assert spec["holderIdentity"] == leader.elector.identity
    assert spec["leaseDurationSeconds"] == 1 and spec["leaseTransitions"] == 0
    assert spec["acquireTime"] == first["acquireTime"] == format_micro_time(1000.0)
    assert leader.elector.is_leader() and not other.elector.is_leader()
    assert other.elector.get_leader() == leader.elector.identity
    assert other.leaders == [leader.elector.identity]
    await a.stop()
    await b.stop()


async def _renewed(client: Any, stamp: str) -> dict | None:
    spec = await _lease(client)
    return spec if spec["renewTime"] == stamp else None


async def test_takeover_after_leader_dies(client: Any) -> None:
    clock = ManualClock()
    a = Candidate(client, "a", release=False, clock=clock).start()
    await asyncio.wait_for(a.started.wait(), 1)
    counting = _CountingClient(client)
    b = Candidate(counting, "b", clock=clock).start()
    await eventually(lambda: b.leaders == ["a"])  # b has seen a's lease at t=1000
    await a.stop()  # no release: the lease still names "a" until it expires
    assert (await _lease(client))["holderIdentity"] == "a"
    clock.advance(0.9)  # not yet expired for b (1 s lease, observed at t=1000)
    seen = counting.gets
    await eventually(lambda: counting.gets >= seen + 2)  # b tried again, twice
    assert not b.started.is_set()
    clock.advance(0.2)  # 1.1 s since b first saw the record unchanged
    await asyncio.wait_for(b.started.wait(), 5)
    spec = await _lease(client)
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
    assert spec["acquireTime"] == format_micro_time(1001.1)
    assert b.leaders == ["a", "b"]
    await b.stop()


async def test_graceful_release_hands_over_quickly(client: Any) -> None:
    # The clock stands still: "b" can only take over because "a" released the
    # lease, never because the 15 s lease expired.
    clock = ManualClock()
    opts = {"lease_duration": 15.0, "renew_deadline": 5.0, "retry_period": 0.1, "clock": clock}
    a = Candidate(client, "a", **opts).start()
    await asyncio.wait_for(a.started.wait(), 3)
    b = Candidate(client, "b", **opts).start()
    await eventually(lambda: b.leaders == ["a"])
    await a.stop()
    assert a.events == ["started", "stopped"]
    spec = await _lease(client)
    assert spec["holderIdentity"] in ("", "b")
    await asyncio.wait_for(b.started.wait(), 5)
    spec = await _lease(client)
    assert spec["holderIdentity"] == "b" and spec["leaseDurationSeconds"] == 15
    assert spec["leaseTransitions"] == 1
    await b.stop()
    assert (await _lease(client))["holderIdentity"] == ""


async def test_held_lease_not_taken_until_observed_expired(client: Any) -> None:
    now = [1000.0]
    other = LeaderElector(client, NS, NAME, "x", **FAST, clock=lambda: now[0],
                          on_started_leading=lambda: None, on_stopped_leading=lambda: None)
    assert await other.try_acquire_or_renew()
    me = LeaderElector(client, NS, NAME, "me", **FAST, clock=lambda: now[0],
                       on_started_leading=lambda: None, on_stopped_leading=lambda: None)
    assert not await me.try_acquire_or_renew()
    now[0] += 0.9
    assert not await me.try_acquire_or_renew()
    now[0] += 0.2  # 1.1 s since "me" first saw the record unchanged
    assert await me.try_acquire_or_renew()
    spec = await _lease(client)
    assert spec["holderIdentity"] == "me" and spec["leaseTransitions"] == 1
    assert spec["renewTime"] == format_micro_time(1001.1)
    # the old holder sees a fresh record and must wait a full lease again
    assert not await other.try_acquire_or_renew()
    assert not other.is_leader() and other.get_leader() == "me"


class _RacingClient:
    """Delegates to a client, but lets a rival write the lease just before each update."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.races = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def update(self, res: Any, obj: dict, **kw: Any) -> dict:
        current = await self.inner.get(LEASES, NAME, NS)
        current["spec"]["holderIdentity"] = "rival"
        await self.inner.update(LEASES, current)
        self.races += 1
        return await self.inner.update(res, obj, **kw)


async def test_conflict_means_someone_else_won(client: Any) -> None:
    now = [0.0]
    released = {"holderIdentity": "", "leaseDurationSeconds": 1, "leaseTransitions": 3}
    await client.create(LEASES, {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                 "metadata": {"name": NAME, "namespace": NS}, "spec": released}, NS)
    racing = _RacingClient(client)
    el = LeaderElector(racing, NS, NAME, "me", **FAST, clock=lambda: now[0],
                       on_started_leading=lambda: None, on_stopped_leading=lambda: None)
    assert not await el.try_acquire_or_renew()
    assert racing.races == 1 and not el.is_leader()
    assert (await _lease(client))["holderIdentity"] == "rival"
    # next attempt observes the rival's record and backs off while it is fresh
    assert not await el.try_acquire_or_renew()
    assert racing.races == 1 and el.get_leader() == "rival"


async def test_loses_leadership_when_renewal_fails(client: Any) -> None:
    a = Candidate(client, "a").start()
    await asyncio.wait_for(a.started.wait(), 1)
    lease = await client.get(LEASES, NAME, NS)
    lease["spec"]["holderIdentity"] = "intruder"
    lease["spec"]["leaseDurationSeconds"] = 30
    await client.update(LEASES, lease)
    await asyncio.wait_for(a.stopped.wait(), 2)
    assert a.events == ["started", "stopped"]
    assert a.task is not None and a.task.done()
    # release did not touch a lease held by someone else
    assert (await _lease(client))["holderIdentity"] == "intruder"


async def test_async_leading_task_cancelled_on_stop(client: Any) -> None:
    running = asyncio.Event()
    cancelled: list[bool] = []

    async def lead() -> None:
        running.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    el = LeaderElector(client, NS, NAME, "a", **FAST, on_started_leading=lead, on_stopped_leading=lambda: None)
    task = asyncio.create_task(el.run())
    await asyncio.wait_for(running.wait(), 1)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert cancelled == [True]


class Flaky:
    """A client whose first ``fail`` calls cannot reach the API server."""

    def __init__(self, inner: Any, fail: int) -> None:
        self.inner = inner
        self.fail = fail
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in ("get", "create", "update"):
            return attr

        async def call(*args: Any, **kw: Any) -> Any:
            self.calls += 1
            if self.calls <= self.fail:
                raise ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 6443)")
            return await attr(*args, **kw)

        return call


async def test_unreachable_api_server_is_retried_not_fatal(client, caplog):
    flaky = Flaky(client, fail=3)
    c = Candidate(flaky, "a").start()
    await asyncio.wait_for(c.started.wait(), 10)  # it kept campaigning through the failures
    assert c.task is not None and not c.task.done()
    errors = [r for r in caplog.records if "error retrieving resource lock kube-system/kube-scheduler" in r.getMessage()]
    assert len(errors) == 3
    c.task.cancel()
    await asyncio.gather(c.task, return_exceptions=True)
