"""The in-flight log: popped pods and the cluster events received while they are in flight."""

from __future__ import annotations

import collections
from typing import Any

from kubeplane.scheduler.framework.types import ClusterEvent
from kubeplane.scheduler.queue.queued_pod_info import Obj

_POD, _EVENT = 0, 1


class InFlightLog:
    """Popped pods and the events received while any of them was in flight.

    Entries are ``(seq, kind, a, b, c)``: for a pod ``a`` is its UID and ``b``
    the pod; for an event ``a`` is the ClusterEvent, ``b``/``c`` old/new objects.
    A finished pod's entry is dropped lazily once it reaches the head.
    """

    def __init__(self) -> None:
        self._entries: collections.deque[tuple[int, int, Any, Any, Any]] = collections.deque()
        self._pods: dict[str, int] = {}
        self._seq = 0

    def __contains__(self, uid: str) -> bool:
        return uid in self._pods

    def __len__(self) -> int:
        return len(self._pods)

    def add_pod(self, uid: str, pod: Obj) -> None:
        self._seq += 1
        self._pods[uid] = self._seq
        self._entries.append((self._seq, _POD, uid, pod, None))

    def add_event(self, event: ClusterEvent, old: Any, new: Any) -> None:
        self._seq += 1
        self._entries.append((self._seq, _EVENT, event, old, new))

    def events_since(self, uid: str) -> list[tuple[ClusterEvent, Any, Any]] | None:
        start = self._pods.get(uid)
        if start is None:
            return None
        return [(e[2], e[3], e[4]) for e in self._entries if e[1] == _EVENT and e[0] > start]

    def done(self, uid: str) -> None:
        if self._pods.pop(uid, None) is None:
            return
        entries, pods = self._entries, self._pods
        while entries:
            seq, kind, a, _, _ = entries[0]
            if kind == _POD and pods.get(a) == seq:
                break
            entries.popleft()

    def pods(self) -> list[Obj]:
        return [e[3] for e in self._entries if e[1] == _POD and self._pods.get(e[2]) == e[0]]

    def events(self) -> list[tuple[ClusterEvent, Any, Any]]:
        return [(e[2], e[3], e[4]) for e in self._entries if e[1] == _EVENT]

    def clear(self) -> None:
        self._pods.clear()
        self._entries.clear()
