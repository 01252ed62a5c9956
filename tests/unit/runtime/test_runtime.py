"""The event loop of the long-running commands, the event-loop fairness helper
and per-key turn-taking."""

from __future__ import annotations

import asyncio

import pytest

from kubeplane.runtime import EVENT_LOOP_ENV, KeyedTurns, loop_factory, run, yield_while_ready


async def _chain(steps: int, done: list[int]) -> None:
    """A chain of dependent steps, each needing one more pass of the loop."""
    for i in range(steps):
        await asyncio.sleep(0)
        done.append(i)


async def test_a_chain_of_ready_steps_catches_up():
    done: list[int] = []
    task = asyncio.create_task(_chain(5, done))
    await asyncio.sleep(0)  # the task starts and queues its first step
    assert done == []
    passes = await yield_while_ready(8)
    assert done == [0, 1, 2, 3, 4]
    # It stops once nothing else is ready, well before the bound.
    assert passes <= 6
    await task


async def test_one_pass_advances_a_chain_one_step():
    done: list[int] = []
    task = asyncio.create_task(_chain(5, done))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert done == [0]
    await task


async def test_a_busy_loop_holds_the_caller_back_at_most_max_passes():
    stop = False

    async def spin() -> None:
        while not stop:
            await asyncio.sleep(0)

    task = asyncio.create_task(spin())
    await asyncio.sleep(0)
    assert await yield_while_ready(3) == 3
    stop = True
    await task


async def test_an_idle_loop_costs_no_pass():
    assert await yield_while_ready(8) == 0


def test_run_uses_uvloop_unless_asyncio_is_asked_for(monkeypatch):
    import uvloop

    async def loop_type() -> type:
        return type(asyncio.get_running_loop())

    monkeypatch.delenv(EVENT_LOOP_ENV, raising=False)
    assert run(loop_type()) is uvloop.Loop
    monkeypatch.setenv(EVENT_LOOP_ENV, "uvloop")
    assert run(loop_type()) is uvloop.Loop
    monkeypatch.setenv(EVENT_LOOP_ENV, "asyncio")
    assert loop_factory() is None
    assert not issubclass(run(loop_type()), uvloop.Loop)
    monkeypatch.setenv(EVENT_LOOP_ENV, "tokio")
    with pytest.raises(ValueError, match="KUBEPLANE_EVENT_LOOP"):
        loop_factory()


def test_on_uvloop_a_chain_catches_up_in_max_passes(monkeypatch):
    """uvloop does not show its ready queue: every pass is yielded."""
    monkeypatch.delenv(EVENT_LOOP_ENV, raising=False)

    async def main() -> tuple[int, list[int], int]:
        done: list[int] = []
        task = asyncio.create_task(_chain(5, done))
        await asyncio.sleep(0)
        passes = await yield_while_ready(8)
        await task
        return passes, done, await yield_while_ready(2)

    assert run(main()) == (8, [0, 1, 2, 3, 4], 2)


async def test_keyed_turns_one_holder_per_key_in_arrival_order():
    turns = KeyedTurns()
    log: list[str] = []

    async def worker(key: str, name: str) -> None:
        await turns.acquire(key)
        try:
            log.append(f"{name}+")
            await asyncio.sleep(0.001)
            log.append(f"{name}-")
        finally:
            turns.release(key)

    await asyncio.gather(*(worker("a", f"a{i}") for i in range(4)), worker("b", "b0"))
    a_events = [e for e in log if e.startswith("a")]
    assert a_events == ["a0+", "a0-", "a1+", "a1-", "a2+", "a2-", "a3+", "a3-"]
    # another key does not wait for "a"
    assert log.index("b0+") < log.index("a0-")
    assert len(turns) == 0  # every key forgotten


async def _two_waiters_behind_a_holder() -> tuple[KeyedTurns, list[str], asyncio.Task, asyncio.Task]:
    """Key "k" held; tasks "first" and "second" waiting for it, in that order
    (each records its name once its turn comes, then releases)."""
    turns = KeyedTurns()
    await turns.acquire("k")
    got: list[str] = []

    async def wait(name: str) -> None:
        await turns.acquire("k")
        got.append(name)
        turns.release("k")

    first = asyncio.create_task(wait("first"))
    second = asyncio.create_task(wait("second"))
    await asyncio.sleep(0)
    return turns, got, first, second


async def test_keyed_turns_a_waiter_cancelled_before_its_turn_leaves_the_line():
    turns, got, first, second = await _two_waiters_behind_a_holder()
    first.cancel()
    await asyncio.sleep(0)
    turns.release("k")
    await asyncio.wait_for(second, 2)
    with pytest.raises(asyncio.CancelledError):
        await first
    assert got == ["second"] and len(turns) == 0


async def test_keyed_turns_a_waiter_cancelled_after_its_turn_came_passes_it_on():
    turns, got, first, second = await _two_waiters_behind_a_holder()
    turns.release("k")  # the turn goes to "first" ...
    first.cancel()  # ... which is cancelled before it runs
    await asyncio.wait_for(second, 2)
    with pytest.raises(asyncio.CancelledError):
        await first
    assert got == ["second"] and len(turns) == 0


async def test_every_runs_after_each_interval_and_survives_a_failing_round(caplog):
    import asyncio

    from kubeplane.runtime import every

    calls = []

    async def work():
        calls.append(len(calls))
        if len(calls) == 2:
            raise RuntimeError("boom")

    task = asyncio.create_task(every(0.02, work, "the work"))
    await asyncio.sleep(0.01)
    assert calls == []  # the first round comes after one interval
    while len(calls) < 4:
        await asyncio.sleep(0.01)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    assert task.cancelled()
    assert any(r.getMessage() == "the work failed: boom" for r in caplog.records)


async def test_cancel_and_wait_ends_every_task_and_logs_one_that_failed(caplog):
    import asyncio

    from kubeplane.runtime import cancel_and_wait

    async def forever():
        await asyncio.sleep(3600)

    async def fails():
        raise RuntimeError("broken")

    tasks = [asyncio.create_task(forever()), asyncio.create_task(fails()), None]
    await asyncio.sleep(0)
    await cancel_and_wait(tasks, "the worker")
    assert tasks[0].cancelled() and tasks[1].done()
    assert [r.getMessage() for r in caplog.records] == ["the worker failed"]
