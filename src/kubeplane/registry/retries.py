"""Bounded retries of a write that lost an optimistic race it did not cause."""

from __future__ import annotations

import asyncio

from kubeplane.api import errors

#: how long a write that keeps losing optimistic races it did not cause is
#: retried against the fresh object before the request gives up (upstream's
#: GuaranteedUpdate retries for as long as the request lasts)
RETRY_SECONDS = 30.0


class Retries:
    """The retries of one write that lost a race with another writer.

    Bounded in time, not in count: ordinary contention always ends, but a
    writer may lose many races in a row on a hot key. Every few attempts it
    lets the event loop run so the writers it races with can finish.
    """

    __slots__ = ("_limit", "_deadline", "_count")

    def __init__(self, limit: float) -> None:
        self._limit = limit
        self._deadline: float | None = None
        self._count = 0

    async def again(self) -> None:
        """Called before each retry; a 504 Timeout once the time is up."""
        now = asyncio.get_running_loop().time()
        if self._deadline is None:
            self._deadline = now + self._limit
        elif now >= self._deadline:
            raise errors.StatusError(
                504, "Timeout",
                "Timeout: request did not complete within requested timeout - context deadline exceeded",
                retry_after=1,
            )
        self._count += 1
        if self._count % 4 == 0:
            await asyncio.sleep(0)
