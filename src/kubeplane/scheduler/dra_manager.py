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
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Mapping

from kubeplane.api.resources import resource
from kubeplane.dra.allocator import DeviceMatchCache, claim_device_ids
from kubeplane.dra.pools import DeviceID, PoolIndex
from kubeplane.scheduler.assumecache import AssumeCache, AssumeCacheError

log = logging.getLogger(__name__)

Obj = dict[str, Any]

RESOURCE_CLAIMS = resource("resourceclaims")
RESOURCE_SLICES = resource("resourceslices")
DEVICE_CLASSES = resource("deviceclasses")

__all__ = ["AllocatedDevices", "DRAManager", "DEVICE_CLASSES", "RESOURCE_CLAIMS", "RESOURCE_SLICES"]


def _allocated(claim: Mapping[str, Any] | None) -> bool:
    return bool(claim and (claim.get("status") or {}).get("allocation"))


class AllocatedDevices:
    """Devices of allocated claims (a set, no reference counts), fed by claim events."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: set[DeviceID] = set()

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

    def _remove(self, claim: Obj) -> None:
        ids = claim_device_ids(claim)
        with self._lock:
            self._ids.difference_update(ids)

    def snapshot(self) -> set[DeviceID]:
        """A copy of the current set."""
        with self._lock:
            return set(self._ids)

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
        self.allocated = AllocatedDevices()
        self.match_cache = DeviceMatchCache()
        self._lock = threading.Lock()
        self._in_flight: dict[str, Obj] = {}
        self._pool_index: PoolIndex | None = None
        self._pool_index_ids: tuple[int, ...] = ()
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
            return True

    def remove_claim_pending_allocation(self, uid: str) -> bool:
        """Forget an in-flight allocation; True when there was one."""
        with self._lock:
            return self._in_flight.pop(uid, None) is not None

    def claim_has_pending_allocation(self, uid: str) -> bool:
        with self._lock:
            return uid in self._in_flight

    def in_flight(self) -> dict[str, Obj]:
        """A copy of the in-flight map (claim UID -> claim with allocation)."""
        with self._lock:
            return dict(self._in_flight)

    def list_all_allocated_devices(self) -> set[DeviceID]:
        """Devices taken by allocated claims or by in-flight allocations."""
        out = self.allocated.snapshot()
        with self._lock:
            pending = list(self._in_flight.values())
        for claim in pending:
            out.update(claim_device_ids(claim))
        return out

    # ------------------------------------------------------- slices, classes

    def list_slices(self) -> list[Obj]:
        if self.slice_source is None:
            return []
        return self.slice_source.indexer.list()

    def pool_index(self) -> PoolIndex:
        """A :class:`PoolIndex` of the current slices, rebuilt only when the
        slice objects changed (the index keeps the objects it saw alive, so
        comparing their ids is exact)."""
        slices = self.list_slices()
        ids = tuple(map(id, slices))
        with self._lock:
            if self._pool_index is None or ids != self._pool_index_ids:
                self._pool_index = PoolIndex(slices)
                self._pool_index_ids = ids
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
