"""A bounded-frequency runner in asyncio, after upstream's async.BoundedFrequencyRunner.

``fn`` runs when :meth:`run` asked for it, but never sooner than
``min_interval`` after its previous start (a change after a quiet period runs
at once; a burst of changes is batched into one run per ``min_interval``),
and at least every ``max_interval`` even when nothing asked. When ``fn``
returns False or raises, it runs again after ``retry_interval`` (or sooner
when asked and allowed).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable

log = logging.getLogger(__name__)


class BoundedFrequencyRunner:
    def __init__(self, name: str, fn: Callable[[], Awaitable[bool | None]], *, min_interval: float,
                 retry_interval: float, max_interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.fn = fn
        self.min_interval = min_interval
        self.retry_interval = retry_interval
        self.max_interval = max_interval
        self.clock = clock
        self._requested = False
        self._wake = asyncio.Event()
        self._last_run: float | None = None
        self._retry_at: float | None = None
        self.runs = 0

    def run(self) -> None:
        """Ask for a run (as soon as ``min_interval`` allows)."""
        self._requested = True
        self._wake.set()

    def retry_after(self, delay: float) -> None:
        """Run again in ``delay`` seconds at the latest."""
        at = self.clock() + delay
        if self._retry_at is None or at < self._retry_at:
            self._retry_at = at
        self._wake.set()

    def _next_due(self) -> float:
        now = self.clock()
        if self._last_run is None:
            return now if self._requested else now + self.max_interval
        due = self._last_run + self.max_interval
        if self._retry_at is not None:
            due = min(due, max(self._retry_at, self._last_run + self.min_interval))
        if self._requested:
            due = min(due, self._last_run + self.min_interval)
        return due

    async def loop(self) -> None:
        """Run until cancelled."""
        while True:
            delay = self._next_due() - self.clock()
            if delay > 0:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), delay)
                except asyncio.TimeoutError:
                    pass
                continue
            self._requested = False
            self._retry_at = None
            self._last_run = self.clock()
            self.runs += 1
            try:
                ok = await self.fn()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a failed run is retried
                log.exception("%s: run failed", self.name)
                ok = False
            if ok is False:
                self.retry_after(self.retry_interval)
