"""Per-key exponential back-off, as client-go's ``flowcontrol.Backoff`` (the kubelet's crash-loop
and image-pull back-off, the DaemonSet controller's failed-pod back-off). Times are seconds on
the clock given (``time.time`` by default)."""

from __future__ import annotations

import time
from typing import Callable


class Backoff:
    """Per key, a delay starting at ``initial`` and doubling up to ``maximum`` with each
    failure; an entry not updated for twice the maximum is forgotten (starts over)."""

    def __init__(self, initial: float, maximum: float, clock: Callable[[], float] = time.time):
        self.initial, self.maximum, self.clock = initial, maximum, clock
        self._entries: dict[str, list[float]] = {}   # key -> [backoff, last_update]

    def _expired(self, event_time: float, last_update: float) -> bool:
        return event_time - last_update > 2 * self.maximum

    def get(self, key: str) -> float:
        e = self._entries.get(key)
        return e[0] if e else 0.0

    def next(self, key: str, event_time: float) -> None:
        e = self._entries.get(key)
        if e is None or self._expired(event_time, e[1]):
            self._entries[key] = [self.initial, event_time]
        else:
            self._entries[key] = [min(e[0] * 2, self.maximum), event_time]

    def in_backoff_since(self, key: str, event_time: float) -> bool:
        e = self._entries.get(key)
        if e is None:
            return False
        now = self.clock()
        if self._expired(now, e[1]):
            return False
        return now - event_time < e[0]

    def in_backoff_since_update(self, key: str, event_time: float) -> bool:
        e = self._entries.get(key)
        if e is None or self._expired(event_time, e[1]):
            return False
        return event_time - e[1] < e[0]

    def ends(self, key: str) -> float | None:
        """When the back-off started at the last update ends."""
        e = self._entries.get(key)
        return e[1] + e[0] if e else None

    def forget(self, key: str) -> None:
        self._entries.pop(key, None)

    def gc(self, now: float | None = None) -> None:
        """Forget the entries that have expired at ``now`` (the clock's time if not given)."""
        now = self.clock() if now is None else now
        for k in [k for k, e in self._entries.items() if self._expired(now, e[1])]:
            del self._entries[k]


__all__ = ["Backoff"]
