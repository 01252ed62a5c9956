"""Events expire ``--event-ttl`` after their last write, as upstream's etcd leases make them.

Upstream attaches every Event write to an etcd lease of the TTL, so an Event
disappears a TTL after it was last written. Here a task watches the Event
keys, remembers when each was last written, and deletes the ones whose TTL
has passed (with the revision it saw, so an Event rewritten meanwhile is
kept). Events already stored when the server starts count from the newest
timestamp they carry (an Event records when it was last observed).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

from kubeplane.api.meta import parse_time
from kubeplane.api.resources import resource
from kubeplane.storage.interface import (
    CompactedError,
    KeyNotFoundError,
    RevisionConflictError,
    Store,
    StorageError,
)

log = logging.getLogger("kubeplane.apiserver.eventttl")

DEFAULT_EVENT_TTL = 3600.0
"""Seconds an Event lives after its last write (upstream's ``--event-ttl`` default, 1h)."""


def _last_written(obj: dict[str, Any], fallback: float) -> float:
    """The newest time an Event carries (creation, last/series observation, field managers)."""
    md = obj.get("metadata") or {}
    stamps = [md.get("creationTimestamp"), obj.get("lastTimestamp"), obj.get("eventTime"),
              (obj.get("series") or {}).get("lastObservedTime")]
    stamps += [m.get("time") for m in md.get("managedFields") or () if isinstance(m, dict)]
    best: float | None = None
    for s in stamps:
        if not isinstance(s, str) or not s:
            continue
        try:
            t = parse_time(s).timestamp()
        except ValueError:
            continue
        best = t if best is None else max(best, t)
    return fallback if best is None else min(best, fallback)


class EventExpiry:
    """Deletes Events a TTL after their last write; ``clock`` is wall-clock seconds."""

    def __init__(self, store: Store, ttl: float = DEFAULT_EVENT_TTL, *, interval: float | None = None,
                 clock: Callable[[], float] = time.time, prefix: str | None = None) -> None:
        if ttl <= 0:
            raise ValueError("the event TTL must be positive")
        self.store = store
        self.ttl = ttl
        self.interval = interval if interval is not None else min(60.0, ttl / 10)
        self.clock = clock
        self.prefix = prefix if prefix is not None else resource("events").storage_prefix()
        #: key -> (revision last seen, time of that write)
        self._written: dict[str, tuple[int, float]] = {}
        self._task: asyncio.Task[None] | None = None
        #: total Events deleted (for tests and logs)
        self.expired = 0

    def revision_seen(self, key: str) -> int | None:
        """The revision of ``key``'s last write this expiry has taken into account."""
        seen = self._written.get(key)
        return seen[0] if seen is not None else None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="event-ttl")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while not getattr(self.store, "closed", False):
            watch = await self._relist()
            try:
                await self._follow(watch)
                return  # the watch ended: the store is closing
            except CompactedError:
                log.info("event expiry fell behind the history; relisting")
            finally:
                watch.close()

    async def _relist(self):
        result = await self.store.list(self.prefix)
        now = self.clock()
        known = self._written
        fresh: dict[str, tuple[int, float]] = {}
        for kv in result.items:
            seen = known.get(kv.key)
            if seen is not None and seen[0] == kv.mod_revision:
                fresh[kv.key] = seen
            else:
                fresh[kv.key] = (kv.mod_revision, _last_written(kv.value, now))
        self._written = fresh
        return self.store.watch(self.prefix, result.revision)

    async def _follow(self, watch) -> None:
        loop = asyncio.get_running_loop()
        next_sweep = loop.time() + self.interval
        while True:
            events = await watch.next_batch(max(0.0, next_sweep - loop.time()))
            if events is None:
                return
            if events:
                now = self.clock()
                for ev in events:
                    if ev.type == "DELETED":
                        self._written.pop(ev.key, None)
                    else:
                        self._written[ev.key] = (ev.revision, now)
            if loop.time() >= next_sweep:
                await self.sweep()
                next_sweep = loop.time() + self.interval

    async def sweep(self) -> int:
        """Delete every Event whose TTL has passed; returns how many were deleted."""
        deadline = self.clock() - self.ttl
        due = [(key, rev) for key, (rev, written) in self._written.items() if written <= deadline]
        deleted = 0
        for key, rev in due:
            try:
                await self.store.delete(key, expected_revision=rev)
            except (KeyNotFoundError, RevisionConflictError):
                continue  # deleted or rewritten meanwhile: the watch brings the news
            except StorageError as exc:
                log.warning("could not delete expired event %s: %s", key, exc)
                return deleted
            if self._written.get(key, (0, 0.0))[0] == rev:
                del self._written[key]
            deleted += 1
        self.expired += deleted
        if deleted:
            log.debug("deleted %d expired events", deleted)
        return deleted
