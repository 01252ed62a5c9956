"""Process-wide runtime settings of the long-running kubeplane commands, an
event-loop fairness helper and per-key turn-taking for coroutines."""

from __future__ import annotations

import asyncio
import collections
import gc

#: allocations between two young-generation collections, and how many
#: collections of a generation make one of the next. CPython's defaults
#: (700, 10, 10) suit small programs; a control plane holds hundreds of
#: thousands of long-lived API objects, and its young collections keep
#: re-examining them. Reference counting still frees everything at once;
#: only reference cycles wait longer.
GC_THRESHOLDS = (50_000, 50, 100)


def configure_gc() -> None:
    """Apply :data:`GC_THRESHOLDS` (idempotent)."""
    gc.set_threshold(*GC_THRESHOLDS)


async def yield_while_ready(max_passes: int) -> int:
    """Yield to the event loop while other callbacks are ready to run, at
    most ``max_passes`` passes; returns how many passes were yielded.

    A coroutine that does long stretches of CPU work between awaits (the
    scheduler's cycles) and yields one pass after each lets every chain of
    dependent steps elsewhere (a reply resolves a future, the waiting task
    resumes and sends the next request, ...) advance one step per stretch.
    Yielding again while work is ready lets such chains catch up; it stops as
    soon as nothing else is ready, so an idle loop costs nothing, and
    ``max_passes`` bounds how long a busy loop can hold the caller back. The
    ready queue read is CPython asyncio's (its base event loop's ``_ready``);
    on a loop without one this yields nothing.
    """
    ready = getattr(asyncio.get_running_loop(), "_ready", None)
    if ready is None:
        return 0
    passes = 0
    while ready and passes < max_passes:
        passes += 1
        await asyncio.sleep(0)
    return passes


class KeyedTurns:
    """Per-key mutual exclusion for coroutines, first come first served.

    ``await turns.acquire(key)`` returns once the caller's turn for ``key``
    has come; ``turns.release(key)`` hands the turn to the next waiter (or
    forgets the key). The common case, nobody else on the key, allocates
    nothing but a dict entry: no lock object, no context manager. A waiter
    cancelled before its turn leaves the line; one cancelled just after its
    turn was handed over passes the turn on.
    """

    __slots__ = ("_held",)

    def __init__(self) -> None:
        #: key -> waiters (None while held with nobody waiting)
        self._held: dict[object, "collections.deque[asyncio.Future[None]] | None"] = {}

    def __len__(self) -> int:
        return len(self._held)

    async def acquire(self, key: object) -> None:
        held = self._held
        if key not in held:
            held[key] = None
            return
        waiters = held[key]
        if waiters is None:
            waiters = held[key] = collections.deque()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(key)  # the turn had come: pass it on
            else:
                try:
                    waiters.remove(fut)
                except ValueError:
                    pass
            raise

    def release(self, key: object) -> None:
        held = self._held
        waiters = held.get(key)
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        del held[key]
