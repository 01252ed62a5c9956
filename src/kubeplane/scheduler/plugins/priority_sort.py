"""PrioritySort: QueueSort by priority (higher first), then queue timestamp (earlier first)."""

from __future__ import annotations

from typing import Any

from kubeplane.scheduler.framework.plugin import Plugin


def pod_priority(pod: Any) -> int:
    """``spec.priority`` of a pod dict or a PodInfo (0 when unset)."""
    if isinstance(pod, dict):
        return int((pod.get("spec") or {}).get("priority") or 0)
    return int(getattr(pod, "priority", 0) or 0)


class PrioritySort(Plugin):
    name = "PrioritySort"

    def less(self, a: Any, b: Any) -> bool:
        p1, p2 = pod_priority(a.pod), pod_priority(b.pod)
        return p1 > p2 or (p1 == p2 and a.timestamp < b.timestamp)

    def sort_key(self, a: Any) -> tuple[int, float]:
        """The order of :meth:`less` as a key: ``less(a, b)`` iff ``sort_key(a) < sort_key(b)``."""
        return -pod_priority(a.pod), a.timestamp
