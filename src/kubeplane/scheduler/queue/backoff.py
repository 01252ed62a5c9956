"""backoffQ's policy: how long a pod backs off and how backing-off pods are ordered."""

from __future__ import annotations

import math
from typing import Callable

from kubeplane.scheduler.queue.queued_pod_info import LessFn, QueuedPodInfo

#: Backoff expiries are grouped in windows of this size when popping from backoffQ is enabled.
BACKOFF_ORDERING_WINDOW = 1.0


class Backoff:
    """Exponential per-pod backoff (upstream backoffQueue's durations and ordering).

    ``pop_from_backoff``: expiries are aligned to :data:`BACKOFF_ORDERING_WINDOW`
    and, within a window, pods are ordered by the QueueSort ``less``.
    """

    __slots__ = ("initial", "max", "clock", "pop_from_backoff", "less")

    def __init__(self, initial: float, maximum: float, clock: Callable[[], float],
                 pop_from_backoff: bool, less: LessFn) -> None:
        self.initial = float(initial)
        self.max = float(maximum)
        self.clock = clock
        self.pop_from_backoff = pop_from_backoff
        self.less = less

    def duration(self, pinfo: QueuedPodInfo) -> float:
        """``min(initial * 2**(count-1), max)``; count = consecutive errors if any, else unschedulable count."""
        count = pinfo.consecutive_errors_count if pinfo.consecutive_errors_count > 0 else pinfo.unschedulable_count
        if count <= 0 or self.max <= 0:
            return 0.0
        duration = self.initial
        for _ in range(count - 1):
            if duration >= self.max - duration:
                return self.max
            duration += duration
        return min(duration, self.max)

    def align(self, t: float) -> float:
        if not self.pop_from_backoff:
            return t
        return math.floor(t / BACKOFF_ORDERING_WINDOW) * BACKOFF_ORDERING_WINDOW

    def expiry(self, pinfo: QueuedPodInfo) -> float:
        """When the pod's backoff completes (cached in ``pinfo.backoff_expiration``)."""
        duration = self.duration(pinfo)
        if duration <= 0:
            return -math.inf
        if pinfo.backoff_expiration is None:
            pinfo.backoff_expiration = self.align(pinfo.timestamp + duration)
        return pinfo.backoff_expiration

    def is_backing_off(self, pinfo: QueuedPodInfo) -> bool:
        """Whether the pod must still wait before being retried."""
        expiry = self.expiry(pinfo)
        if expiry == -math.inf:
            return False
        now = self.clock()
        if self.pop_from_backoff:
            # Same window as now (or later) still counts as backing off.
            return expiry >= self.align(now)
        return expiry > now

    def lt(self, a: QueuedPodInfo, b: QueuedPodInfo) -> bool:
        ea, eb = self.expiry(a), self.expiry(b)
        if ea != eb:
            return ea < eb
        return a.seq < b.seq

    def lt_with_priority(self, a: QueuedPodInfo, b: QueuedPodInfo) -> bool:
        ea, eb = self.expiry(a), self.expiry(b)
        if ea != eb:
            return ea < eb
        if self.less(a, b):
            return True
        if self.less(b, a):
            return False
        return a.seq < b.seq
