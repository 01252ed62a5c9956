"""Process-wide runtime settings of the long-running kubeplane commands (the
event loop they run on, garbage collection), an event-loop fairness helper,
per-key turn-taking for coroutines, a periodic task and the cancellation of
a component's tasks."""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import os
from typing import Any, Callable, Coroutine, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)

#: environment variable choosing the event loop of the long-running commands:
#: ``uvloop`` (the default when it is installed) or ``asyncio`` (the standard
#: library's selector loop)
EVENT_LOOP_ENV = "KUBEPLANE_EVENT_LOOP"


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop factory for :func:`run`: uvloop's (libuv; its callbacks,
    timers and socket transports are native code, a large share of a busy
    control plane's time with the standard loop) unless ``KUBEPLANE_EVENT_LOOP``
    says ``asyncio``. None means the standard library's loop."""
    choice = os.environ.get(EVENT_LOOP_ENV, "").strip().lower()
    if choice not in ("", "uvloop", "asyncio"):
        raise ValueError(f"{EVENT_LOOP_ENV} must be 'uvloop' or 'asyncio', not {choice!r}")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the loop :func:`loop_factory` picks."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)

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
    a loop that does not show it (uvloop) is yielded ``max_passes`` times,
    a few microseconds each when nothing else is ready.
    """
    ready = getattr(asyncio.get_running_loop(), "_ready", None)
    if ready is None:
        for _ in range(max_passes):
            await asyncio.sleep(0)
        return max_passes
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
        if not (waiters and wake_first(waiters)):
            del held[key]


def wake_first(waiters: "collections.deque[asyncio.Future[None]]") -> bool:
    """Resolve the first waiting future of ``waiters`` (removing it and any
    cancelled ones before it); False when none was waiting."""
    while waiters:
        fut = waiters.popleft()
        if not fut.done():
            fut.set_result(None)
            return True
    return False


async def every(interval: float, fn: Callable[[], Coroutine[Any, Any, Any]], what: str) -> None:
    """Run ``fn`` every ``interval`` seconds (the first after one interval) until
    cancelled; a round that fails is logged (``what`` failed: ...) and the next
    one tries again."""
    while True:
        await asyncio.sleep(interval)
        try:
            await fn()
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - the next round tries again
            log.warning("%s failed: %s", what, err)


async def cancel_and_wait(tasks: "Any", what: str = "task") -> None:
    """Cancel ``tasks`` and wait until each has ended; one that had failed is
    logged (``what`` failed), not raised: a component stopping stops them all."""
    tasks = [t for t in tasks if t is not None]
    for t in tasks:
        t.cancel()
    for res in await asyncio.gather(*tasks, return_exceptions=True):
        if isinstance(res, Exception):
            log.error("%s failed", what, exc_info=res)
