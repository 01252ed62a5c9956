"""The event-loop fairness helper."""

from __future__ import annotations

import asyncio

from kubeplane.runtime import yield_while_ready


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
