"""Shared DRA state of the scheduler (upstream ``dynamicresources/dra_manager.go``).

* The ResourceClaim :class:`~kubeplane.scheduler.assumecache.AssumeCache`,
  layered on the claim informer, holds claims written by PreBind before the
  informer delivers them.
* :class:`AllocatedDevices` is a set of devices of allocated claims, kept up
  to date by the assume cache's synchronous, ordered events.
* In-flight allocations: claims allocated in Reserve whose status has not
  been written yet (claim UID -> claim copy with ``status.allocation``).

``list_all_allocated_devices()`` is the union of the tracker and the in-flight
claims' devices (admin-access results never count). PreBind must assume the
written claim *before* dropping its in-flight entry, so the devices are never
seen as free in between.

Every change of that union is also appended to a change log of pools
(``(driver, pool)``), numbered from 0. :meth:`DRAManager.allocated_snapshot`
returns the log position together with the devices, read under one lock, so
a consumer caching per-node results computed from a snapshot knows that any
later change of a pool appears in the log at or after that position
(:meth:`DRAManager.changes_since`). :class:`NodeVerdictCache` uses this to
keep per-node allocation verdicts across pods of the same shape.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Set as AbstractSetABC
from typing import AbstractSet, Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from kubeplane.api.resources import resource
from kubeplane.dra.allocator import DeviceMatchCache, claim_device_ids
from kubeplane.dra.pools import DeviceID, PoolIndex
from kubeplane.scheduler.assumecache import AssumeCache, AssumeCacheError
from kubeplane.scheduler.framework.types import PassOnly

log = logging.getLogger(__name__)

Obj = dict[str, Any]

RESOURCE_CLAIMS = resource("resourceclaims")
RESOURCE_SLICES = resource("resourceslices")
DEVICE_CLASSES = resource("deviceclasses")

__all__ = [
    "AllocatedDevices", "DeviceSetView", "DRAManager", "NodeVerdictCache", "DEVICE_CLASSES", "RESOURCE_CLAIMS",
    "RESOURCE_SLICES",
]


def _allocated(claim: Mapping[str, Any] | None) -> bool:
    return bool(claim and (claim.get("status") or {}).get("allocation"))


#: the change log keeps at least this many entries before dropping old ones
CHANGE_LOG_KEEP = 50_000
#: snapshot views are rebuilt from scratch after this many changes
VIEW_DELTA_MAX = 64


class DeviceSetView(AbstractSetABC):
    """An immutable set ``(base - removed) | added`` (``added`` disjoint from
    ``base``, ``removed`` a subset of it): a snapshot that costs the size of
    the deltas, not of the whole set."""

    __slots__ = ("_base", "_added", "_removed")

    def __init__(self, base: frozenset[DeviceID], added: AbstractSet[DeviceID],
                 removed: AbstractSet[DeviceID]) -> None:
        self._base = base
        self._added = added
        self._removed = removed

    def __contains__(self, dev: object) -> bool:
        return dev in self._added or (dev in self._base and dev not in self._removed)

    def __iter__(self) -> Iterator[DeviceID]:
        removed = self._removed
        for dev in self._base:
            if dev not in removed:
                yield dev
        yield from self._added

    def __len__(self) -> int:
        return len(self._base) - len(self._removed) + len(self._added)

    def with_devices(self, devs: Iterable[DeviceID]) -> "DeviceSetView":
        """This set plus ``devs``."""
        added, removed = set(self._added), set(self._removed)
        base = self._base
        for dev in devs:
            if dev in base:
                removed.discard(dev)
            else:
                added.add(dev)
        return DeviceSetView(base, added, removed)


class AllocatedDevices:
    """Devices of allocated claims (a set, no reference counts), fed by claim events.

    ``on_change`` is called with the device IDs of every add or removal, after
    the set was changed and while ``lock`` (the set's lock) is held. Besides
    the set, a frozen base plus small deltas are kept so that
    :meth:`view_locked` is cheap."""

    def __init__(self, on_change: Callable[[list[DeviceID]], None] | None = None,
                 lock: threading.Lock | None = None) -> None:
        self._lock = lock if lock is not None else threading.Lock()
        self._ids: set[DeviceID] = set()
        self._on_change = on_change
        self._base: frozenset[DeviceID] = frozenset()
        self._added: set[DeviceID] = set()
        self._removed: set[DeviceID] = set()

    def on_add(self, claim: Obj) -> None:
        if _allocated(claim):
            self._add(claim)

    def on_update(self, old: Obj, new: Obj) -> None:
        # An allocation is immutable: only nil->set and set->nil matter.
        if not _allocated(old) and _allocated(new):
            self._add(new)
        elif _allocated(old) and not _allocated(new):
            self._remove(old)

    def on_delete(self, claim: Obj) -> None:
        if _allocated(claim):
            self._remove(claim)

    def _add(self, claim: Obj) -> None:
        ids = claim_device_ids(claim)
        with self._lock:
            self._ids.update(ids)
            base, added, removed = self._base, self._added, self._removed
            for dev in ids:
                if dev in base:
                    removed.discard(dev)
                else:
                    added.add(dev)
            self._compact_locked()
            if self._on_change is not None and ids:
                self._on_change(ids)

    def _remove(self, claim: Obj) -> None:
        ids = claim_device_ids(claim)
        with self._lock:
            self._ids.difference_update(ids)
            base, added, removed = self._base, self._added, self._removed
            for dev in ids:
                if dev in base:
                    removed.add(dev)
                else:
                    added.discard(dev)
            self._compact_locked()
            if self._on_change is not None and ids:
                self._on_change(ids)

    def _compact_locked(self) -> None:
        if len(self._added) + len(self._removed) > VIEW_DELTA_MAX:
            self._base = frozenset(self._ids)
            self._added = set()
            self._removed = set()

    def snapshot(self) -> set[DeviceID]:
        """A copy of the current set."""
        with self._lock:
            return set(self._ids)

    def view_locked(self) -> DeviceSetView:
        """An immutable snapshot of the set; the caller holds the set's lock."""
        return DeviceSetView(self._base, frozenset(self._added), frozenset(self._removed))

    def __contains__(self, dev: DeviceID) -> bool:
        with self._lock:
            return dev in self._ids

    def __len__(self) -> int:
        with self._lock:
            return len(self._ids)


class DRAManager:
    """Claims (assume cache), slices, classes, allocated and in-flight devices.

    ``slice_source`` and ``class_source`` are informers (or anything with an
    ``indexer`` offering ``list()`` / ``get_by_key()``)."""

    def __init__(self, claim_cache: AssumeCache, slice_source: Any = None, class_source: Any = None) -> None:
        self.claim_cache = claim_cache
        self.slice_source = slice_source
        self.class_source = class_source
        self._lock = threading.Lock()
        # The tracker shares the manager's lock: its changes and their log
        # entries are atomic with respect to allocated_snapshot().
        self.allocated = AllocatedDevices(self._log_locked, self._lock)
        self.match_cache = DeviceMatchCache()
        self._in_flight: dict[str, Obj] = {}
        # Pools whose allocated devices changed; entry i has number _log_base + i.
        self._log: list[tuple[str, str]] = []
        self._log_base = 0
        self._pool_index: PoolIndex | None = None
        self._pool_index_ids: tuple[int, ...] = ()
        # (id of the slice indexer, its version) the pool index was built from;
        # the indexer itself is kept so its id stays unique.
        self._pool_index_stamp: tuple[int, int] | None = None
        self._pool_index_source: Any = None
        claim_cache.add_event_handler(self.allocated)

    @classmethod
    def from_informer_factory(cls, factory: Any) -> "DRAManager":
        """Build the manager on a SharedInformerFactory's claim, slice and class informers."""
        claims = factory.informer_for(RESOURCE_CLAIMS)
        slices = factory.informer_for(RESOURCE_SLICES)
        classes = factory.informer_for(DEVICE_CLASSES)
        return cls(AssumeCache(claims, description="ResourceClaim"), slices, classes)

    # ------------------------------------------------------------------ claims

    def get_claim(self, namespace: str, name: str) -> Obj | None:
        """The latest (possibly assumed) claim, or None."""
        try:
            return self.claim_cache.get(f"{namespace}/{name}")
        except AssumeCacheError:
            return None

    def list_claims(self) -> list[Obj]:
        return self.claim_cache.list()

    def assume_claim_after_api_call(self, claim: Obj) -> None:
        """Store a claim returned by the API server; stale objects are ignored (logged)."""
        try:
            self.claim_cache.assume(claim)
        except AssumeCacheError as err:
            log.info("not assuming ResourceClaim: %s", err)

    def assumed_claim_restore(self, namespace: str, name: str) -> None:
        self.claim_cache.restore(f"{namespace}/{name}")

    # -------------------------------------------------------------- in flight

    def signal_claim_pending_allocation(self, uid: str, claim: Obj) -> bool:
        """Record an allocation made in Reserve. False if the claim is already in flight."""
        with self._lock:
            if uid in self._in_flight:
                return False
            self._in_flight[uid] = claim
            self._log_locked(claim_device_ids(claim))
            return True

    def remove_claim_pending_allocation(self, uid: str) -> bool:
        """Forget an in-flight allocation; True when there was one."""
        with self._lock:
            claim = self._in_flight.pop(uid, None)
            if claim is None:
                return False
            self._log_locked(claim_device_ids(claim))
            return True

    def claim_has_pending_allocation(self, uid: str) -> bool:
        with self._lock:
            return uid in self._in_flight

    def in_flight(self) -> dict[str, Obj]:
        """A copy of the in-flight map (claim UID -> claim with allocation)."""
        with self._lock:
            return dict(self._in_flight)

    def list_all_allocated_devices(self) -> set[DeviceID]:
        """Devices taken by allocated claims or by in-flight allocations."""
        return set(self.allocated_snapshot()[1])

    def allocated_snapshot(self) -> tuple[int, DeviceSetView]:
        """The change-log position, then the devices of allocated or in-flight claims.

        Both are read under one lock: the set contains exactly the changes
        logged before the returned position."""
        with self._lock:
            pos = self._log_base + len(self._log)
            out = self.allocated.view_locked()
            pending = list(self._in_flight.values())
        if pending:
            out = out.with_devices(d for claim in pending for d in claim_device_ids(claim))
        return pos, out

    # ------------------------------------------------------------- change log

    def _log_locked(self, ids: list[DeviceID]) -> None:
        log_ = self._log
        for d in ids:
            log_.append((d.driver, d.pool))
        if len(log_) > 2 * CHANGE_LOG_KEEP:
            drop = len(log_) - CHANGE_LOG_KEEP
            del log_[:drop]
            self._log_base += drop

    def log_position(self) -> int:
        """The number of the next change-log entry."""
        with self._lock:
            return self._log_base + len(self._log)

    def changes_since(self, pos: int) -> tuple[int, list[tuple[str, str]] | None]:
        """The current log position and the pools changed from ``pos`` on;
        None when those entries were already dropped."""
        with self._lock:
            end = self._log_base + len(self._log)
            if pos < self._log_base:
                return end, None
            return end, self._log[pos - self._log_base:]

    # ------------------------------------------------------- slices, classes

    def list_slices(self) -> list[Obj]:
        if self.slice_source is None:
            return []
        return self.slice_source.indexer.list()

    def pool_index(self) -> PoolIndex:
        """A :class:`PoolIndex` of the current slices, rebuilt only when the
        slices changed.

        With an indexer that has a change counter (``version``) the check is
        O(1): the counter is read before the list, so a change racing with
        the rebuild only causes another rebuild later. Other sources are
        compared by the ids of their objects (the index keeps the objects it
        saw alive, so that is exact too)."""
        indexer = getattr(self.slice_source, "indexer", None)
        version = getattr(indexer, "version", None)
        if isinstance(version, int):
            with self._lock:
                index = self._pool_index
                if index is not None and self._pool_index_stamp == (id(indexer), version):
                    return index
            slices = self.list_slices()
            with self._lock:
                self._pool_index = PoolIndex(slices)
                self._pool_index_ids = tuple(map(id, slices))
                self._pool_index_stamp = (id(indexer), version)
                self._pool_index_source = indexer
                return self._pool_index
        slices = self.list_slices()
        ids = tuple(map(id, slices))
        with self._lock:
            if self._pool_index is None or ids != self._pool_index_ids:
                self._pool_index = PoolIndex(slices)
                self._pool_index_ids = ids
                self._pool_index_stamp = None
            return self._pool_index

    def get_class(self, name: str) -> Obj | None:
        if self.class_source is None:
            return None
        return self.class_source.indexer.get_by_key(name)

    def classes(self) -> dict[str, Obj]:
        """DeviceClasses by name."""
        if self.class_source is None:
            return {}
        return {(c.get("metadata") or {}).get("name") or "": c for c in self.class_source.indexer.list()}


#: per-shape verdict sets kept per pool index (all dropped when exceeded)
MAX_SHAPES = 64


class _ShapeVerdicts:
    __slots__ = ("passing", "failing", "statuses", "made", "make", "rows", "mask")

    def __init__(self) -> None:
        self.passing: set[str] = set()
        self.failing: dict[str, str] = {}  # node name -> failure reason
        # Mirror of ``failing`` as node -> make(reason), once requested (see failing_statuses).
        self.statuses: dict[str, Any] | None = None
        self.made: dict[str, Any] = {}
        self.make: Callable[[str], Any] | None = None
        # Mirror of ``failing`` as a bool array by row of ``rows`` (see failing_mask).
        self.rows: Mapping[str, int] | None = None
        self.mask: np.ndarray | None = None

    def fail(self, node: str, reason: str) -> None:
        self.failing[node] = reason
        if self.statuses is not None:
            self.statuses[node] = self.status_for(reason)
        if self.mask is not None:
            i = self.rows.get(node)  # type: ignore[union-attr]
            if i is not None:
                self.mask[i] = True

    def status_for(self, reason: str) -> Any:
        st = self.made.get(reason)
        if st is None:
            assert self.make is not None
            st = self.made[reason] = self.make(reason)
        return st

    def drop(self, node: str) -> None:
        if self.failing.pop(node, None) is None:
            return
        if self.statuses is not None:
            self.statuses.pop(node, None)
        if self.mask is not None:
            i = self.rows.get(node)  # type: ignore[union-attr]
            if i is not None:
                self.mask[i] = False


class NodeVerdictCache:
    """Allocation verdicts per (allocator shape, node), for one pool index.

    Only for pool indexes whose per-node pools depend on the node name alone
    (``PoolIndex.per_node_name``). A verdict computed from an allocated-device
    snapshot taken at change-log position ``p`` stays valid until a change of
    one of the node's pools is logged at or after ``p``: :meth:`sync` reads
    the log and drops the verdicts of the nodes it names, :meth:`record`
    refuses a verdict whose node changed since its snapshot."""

    def __init__(self, index: PoolIndex, pos: int) -> None:
        self._lock = threading.Lock()
        self._pos = pos  # log consumed up to here
        self._floor = pos  # verdicts from older snapshots are not trusted
        self._last_change: dict[str, int] = {}
        self._pool_nodes: dict[tuple[str, str], tuple[str, ...]] = {}
        for key, slices in index.by_pool.items():
            names = {(s.get("spec") or {}).get("nodeName") for s in slices}
            self._pool_nodes[key] = tuple(n for n in names if n)
        self._shapes: dict[Any, _ShapeVerdicts] = {}

    @classmethod
    def for_index(cls, index: PoolIndex, manager: "DRAManager") -> "NodeVerdictCache":
        """The cache kept in ``index.cache`` (created on first use), synced with ``manager``'s log."""
        vc = index.cache.get("dra-node-verdicts")
        if vc is None:
            vc = index.cache.setdefault("dra-node-verdicts", cls(index, manager.log_position()))
        vc.sync(manager)
        return vc

    def sync(self, manager: "DRAManager") -> None:
        """Drop the verdicts of nodes whose pools changed since the last sync."""
        with self._lock:
            end, changes = manager.changes_since(self._pos)
            if changes is None:
                self._shapes.clear()
                self._last_change.clear()
                self._floor = end
            elif changes:
                touched: dict[str, int] = {}
                pool_nodes = self._pool_nodes
                for i, key in enumerate(changes, self._pos):
                    for node in pool_nodes.get(key, ()):
                        touched[node] = i
                self._last_change.update(touched)
                for shape in self._shapes.values():
                    shape.passing.difference_update(touched)
                    for node in touched:
                        shape.drop(node)
            self._pos = end

    def _shape(self, key: Any) -> _ShapeVerdicts:
        shape = self._shapes.get(key)
        if shape is None:
            if len(self._shapes) >= MAX_SHAPES:
                self._shapes.clear()
            shape = self._shapes[key] = _ShapeVerdicts()
        return shape

    def record(self, key: Any, node: str, snapshot_pos: int, ok: bool, reason: str = "") -> None:
        """Store the verdict on ``node`` of an allocator of shape ``key``
        whose allocated devices were read at log position ``snapshot_pos``."""
        with self._lock:
            if snapshot_pos < self._floor or self._last_change.get(node, -1) >= snapshot_pos:
                return
            shape = self._shape(key)
            if ok:
                shape.passing.add(node)
                shape.drop(node)
            else:
                shape.fail(node, reason)
                shape.passing.discard(node)

    def not_passing(self, key: Any, names: AbstractSet[str]) -> set[str]:
        """The nodes of ``names`` without a valid successful verdict for ``key``."""
        with self._lock:
            shape = self._shapes.get(key)
            return set(names) if shape is None else names - shape.passing

    def begin(self, key: Any, names: AbstractSet[str]) -> tuple[set[str] | PassOnly, Mapping[str, str]]:
        """For a cycle of shape ``key`` (after :meth:`sync`): the nodes of
        ``names`` without a valid successful verdict (as ``PassOnly`` of the
        nodes with one when those are the fewer: a full cluster), and the
        valid failed verdicts (node -> reason). The mapping is live: it may
        gain verdicts recorded later in the cycle, and is only pruned by later
        syncs."""
        with self._lock:
            shape = self._shape(key)
            passing = shape.passing
            if 2 * len(passing) < len(names):
                return PassOnly(set(filter(names.__contains__, passing))), shape.failing
            return names - passing, shape.failing

    def failing_statuses(self, key: Any, make: Callable[[str], Any]) -> Mapping[str, Any]:
        """The valid failed verdicts for ``key`` as node -> ``make(reason)``, one
        object per distinct reason (``make`` is only used on the first call for
        the shape). Live like the mapping of :meth:`begin`, and kept equal to it."""
        with self._lock:
            shape = self._shape(key)
            if shape.statuses is None:
                shape.make = make
                shape.statuses = {node: shape.status_for(reason) for node, reason in shape.failing.items()}
            return shape.statuses

    def failing_mask(self, key: Any, rows: Mapping[str, int], n: int) -> np.ndarray:
        """The valid failed verdicts for ``key`` as a bool array of length ``n``:
        True at ``rows[node]`` for each failing node. Built on the first call
        for ``rows`` (by identity), then kept equal to the mapping of
        :meth:`begin`; live and read-only for callers."""
        with self._lock:
            shape = self._shape(key)
            if shape.rows is not rows or shape.mask is None or len(shape.mask) != n:
                mask = np.zeros(n, dtype=bool)
                mask[[i for i in map(rows.get, shape.failing) if i is not None]] = True
                shape.rows, shape.mask = rows, mask
            return shape.mask

    def failure(self, key: Any, node: str) -> str | None:
        """The reason of a valid failed verdict for ``key`` on ``node``, if any."""
        with self._lock:
            shape = self._shapes.get(key)
            return None if shape is None else shape.failing.get(node)
