"""The heaps behind activeQ and backoffQ (upstream backend/heap), keyed by ``namespace/name``."""

from __future__ import annotations

import heapq
from typing import Callable

from kubeplane.scheduler.queue.queued_pod_info import QueuedPodInfo


class Heap:
    """Binary heap ordered by ``lt``, with O(log n) update/delete by key (see
    :class:`KeyedHeap` for activeQ under a QueueSort plugin with a sort key)."""

    __slots__ = ("_items", "_pos", "_lt")

    def __init__(self, lt: Callable[[QueuedPodInfo, QueuedPodInfo], bool]) -> None:
        self._items: list[QueuedPodInfo] = []
        self._pos: dict[str, int] = {}
        self._lt = lt

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: str) -> bool:
        return key in self._pos

    def get(self, key: str) -> QueuedPodInfo | None:
        i = self._pos.get(key)
        return None if i is None else self._items[i]

    def peek(self) -> QueuedPodInfo | None:
        return self._items[0] if self._items else None

    def list(self) -> list[QueuedPodInfo]:
        return list(self._items)

    def add_or_update(self, item: QueuedPodInfo) -> None:
        key = item.key
        i = self._pos.get(key)
        if i is None:
            self._items.append(item)
            i = len(self._items) - 1
            self._pos[key] = i
            self._up(i)
        else:
            self._items[i] = item
            self._fix(i)

    def pop(self) -> QueuedPodInfo | None:
        if not self._items:
            return None
        return self._remove_at(0)

    def delete(self, key: str) -> QueuedPodInfo | None:
        i = self._pos.get(key)
        return None if i is None else self._remove_at(i)

    def _remove_at(self, i: int) -> QueuedPodInfo:
        items = self._items
        item = items[i]
        del self._pos[item.key]
        last = items.pop()
        if i < len(items):
            items[i] = last
            self._pos[last.key] = i
            self._fix(i)
        return item

    def _fix(self, i: int) -> None:
        if not self._up(i):
            self._down(i)

    def _up(self, i: int) -> bool:
        items, pos, lt = self._items, self._pos, self._lt
        item = items[i]
        moved = False
        while i > 0:
            parent = (i - 1) >> 1
            if not lt(item, items[parent]):
                break
            items[i] = items[parent]
            pos[items[i].key] = i
            i = parent
            moved = True
        items[i] = item
        pos[item.key] = i
        return moved

    def _down(self, i: int) -> None:
        items, pos, lt = self._items, self._pos, self._lt
        n = len(items)
        item = items[i]
        while True:
            child = 2 * i + 1
            if child >= n:
                break
            right = child + 1
            if right < n and lt(items[right], items[child]):
                child = right
            if not lt(items[child], item):
                break
            items[i] = items[child]
            pos[items[i].key] = i
            i = child
        items[i] = item
        pos[item.key] = i


class KeyedHeap:
    """activeQ when the QueueSort plugin offers a sort key: a heapq of
    ``(key, n, pod key, item)`` entries, so sifting runs in C. An update or a
    delete leaves the old entry behind; it is skipped when it reaches the top
    and dropped when stale entries come to outnumber live ones. Same interface
    as :class:`Heap` (``list`` in no particular order)."""

    __slots__ = ("_heap", "_live", "_keyfn", "_n")

    def __init__(self, keyfn: Callable[[QueuedPodInfo], tuple]) -> None:
        self._heap: list[tuple[tuple, int, str, QueuedPodInfo]] = []
        self._live: dict[str, tuple[tuple, int, str, QueuedPodInfo]] = {}
        self._keyfn = keyfn
        self._n = 0

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, key: str) -> bool:
        return key in self._live

    def get(self, key: str) -> QueuedPodInfo | None:
        e = self._live.get(key)
        return None if e is None else e[3]

    def peek(self) -> QueuedPodInfo | None:
        heap, live = self._heap, self._live
        while heap and live.get(heap[0][2]) is not heap[0]:
            heapq.heappop(heap)
        return heap[0][3] if heap else None

    def list(self) -> list[QueuedPodInfo]:
        return [e[3] for e in self._live.values()]

    def add_or_update(self, item: QueuedPodInfo) -> None:
        k = self._keyfn(item)
        self._n += 1
        e = (k, self._n, item.key, item)
        self._live[item.key] = e
        heapq.heappush(self._heap, e)
        self._compact()

    def pop(self) -> QueuedPodInfo | None:
        heap, live = self._heap, self._live
        while heap:
            e = heapq.heappop(heap)
            if live.get(e[2]) is e:
                del live[e[2]]
                return e[3]
        return None

    def delete(self, key: str) -> QueuedPodInfo | None:
        e = self._live.pop(key, None)
        if e is None:
            return None
        self._compact()
        return e[3]

    def _compact(self) -> None:
        if len(self._heap) > 2 * len(self._live) + 64:
            self._heap = list(self._live.values())
            heapq.heapify(self._heap)
