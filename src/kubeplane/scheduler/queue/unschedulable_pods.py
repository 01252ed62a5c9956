"""unschedulablePods: pods waiting for a cluster event (or the periodic flush) to be retried."""

from __future__ import annotations

from typing import Hashable, Iterable

from kubeplane.scheduler.framework.hintscope import HintScope
from kubeplane.scheduler.queue.queued_pod_info import QueuedPodInfo, scheduler_name

#: (scheduler name, rejector plugins): pods of a group share their event handling
Group = tuple[str, frozenset[str]]


class UnschedulablePods:
    """Map key -> pod info, counting gated pods separately for metrics.

    For event handling, pods are also filed by group (scheduler name,
    rejector plugins) and, per hint scope, under the keys the scope gives
    them (see :class:`HintScope`). ``order`` numbers keys in insertion order
    (the order of ``pods``). Pod infos in the map may only change through
    the queue, which calls :meth:`refresh` after changing one in place.
    """

    __slots__ = ("pods", "gated", "scopes", "order", "groups", "by_key", "unkeyed", "_seq", "_filed")

    def __init__(self, scopes: Iterable[HintScope] = ()) -> None:
        self.pods: dict[str, QueuedPodInfo] = {}
        self.gated: set[str] = set()
        self.scopes: tuple[HintScope, ...] = tuple(scopes)
        self.order: dict[str, int] = {}
        self.groups: dict[Group, set[str]] = {}
        #: (scope position, key) -> pod keys
        self.by_key: dict[tuple[int, Hashable], set[str]] = {}
        #: pods whose scope keys could not be computed (always candidates)
        self.unkeyed: set[str] = set()
        self._seq = 0
        self._filed: dict[str, tuple[Group, list[tuple[int, Hashable]] | None]] = {}

    def __len__(self) -> int:
        return len(self.pods)

    def get(self, key: str) -> QueuedPodInfo | None:
        return self.pods.get(key)

    def add_or_update(self, pinfo: QueuedPodInfo) -> None:
        key = pinfo.key
        if key in self.pods:
            self._unfile(key)
        else:
            self._seq += 1
            self.order[key] = self._seq
        self.pods[key] = pinfo
        if pinfo.gated:
            self.gated.add(key)
        else:
            self.gated.discard(key)
        self._file(key, pinfo)

    def delete(self, key: str) -> QueuedPodInfo | None:
        self.gated.discard(key)
        pinfo = self.pods.pop(key, None)
        if pinfo is not None:
            self._unfile(key)
            del self.order[key]
        return pinfo

    def refresh(self, pinfo: QueuedPodInfo) -> None:
        """File ``pinfo`` again if it is the info held for its key (it changed in place)."""
        key = pinfo.key
        if self.pods.get(key) is pinfo:
            self._unfile(key)
            self._file(key, pinfo)

    def _file(self, key: str, pinfo: QueuedPodInfo) -> None:
        group = (scheduler_name(pinfo.pod), frozenset(pinfo.unschedulable_plugins | pinfo.pending_plugins))
        self.groups.setdefault(group, set()).add(key)
        keys: list[tuple[int, Hashable]] | None = None
        if self.scopes:
            keys = []
            try:
                for i, scope in enumerate(self.scopes):
                    for k in scope.pod_keys(pinfo.pod):
                        hash(k)
                        keys.append((i, k))
            except Exception:  # malformed pod or unhashable key: never left out
                keys = None
                self.unkeyed.add(key)
            else:
                for k in keys:
                    self.by_key.setdefault(k, set()).add(key)
        self._filed[key] = (group, keys)

    def _unfile(self, key: str) -> None:
        filed = self._filed.pop(key, None)
        if filed is None:
            return
        group, keys = filed
        members = self.groups.get(group)
        if members is not None:
            members.discard(key)
            if not members:
                del self.groups[group]
        if keys is None:
            self.unkeyed.discard(key)
            return
        for k in keys:
            members = self.by_key.get(k)
            if members is not None:
                members.discard(key)
                if not members:
                    del self.by_key[k]

