"""Process-wide runtime settings of the long-running kubeplane commands, and
an event-loop fairness helper."""

from __future__ import annotations

import asyncio
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
