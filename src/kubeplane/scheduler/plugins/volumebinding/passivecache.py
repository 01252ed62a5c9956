"""The passive assume cache used by VolumeBinding for PVs and PVCs.

It stores nothing but *assumed* objects: in-memory versions the scheduler
decided on in Reserve and has not sent to the API server yet. Every read
goes to the informer's own indexer and returns the assumed version only
while its resourceVersion still equals the indexer's; once the informer
holds anything else, that newer object wins. Because the indexer is updated
before any informer handler runs, a reader triggered by an informer event
(the scheduling queue requeueing a pod) always sees that event's object,
whatever order the handlers run in.

Rules (after upstream's passive assume cache for volume binding):

* ``assume(obj)``: the indexer must hold the key with exactly
  ``obj``'s resourceVersion, otherwise :class:`AssumeError` (not found /
  out of sync). Only objects not yet written to the API may be assumed.
* ``restore(obj)``: forget the assumption only if its resourceVersion equals
  ``obj``'s. A late cleanup by one pod therefore never removes another pod's
  newer assumption made after the informer moved on.
* informer add/update/delete of an assumed key: the assumption is dropped
  unless the *current indexer content* (not the event payload) still has the
  assumed resourceVersion (a resync or a stale event), so memory is bounded.

resourceVersions are opaque: compared for equality, never for order. The
cache emits no events and is driven from one event loop (no method awaits),
so it needs no lock.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Generic, Protocol, TypeVar

from kubeplane.api import errors
from kubeplane.client.informer import (
    HandlerRegistration,
    IndexFunc,
    Indexer,
    KeyFunc,
    meta_namespace_key,
    resource_version_of,
)

__all__ = [
    "AssumeError",
    "NotFoundError",
    "OutOfSyncError",
    "PassiveAssumeCache",
    "PV_CLAIM_REF_INDEX",
    "PV_STORAGE_CLASS_INDEX",
    "PV_UNCLAIMED_CLASS_INDEX",
    "PV_UNCLAIMED_GENERATION_INDEX",
    "UnclaimedGenerations",
    "InformerLike",
    "new_pv_assume_cache",
    "new_pvc_assume_cache",
    "pv_storage_class_index",
]

T = TypeVar("T", bound=dict[str, Any])

#: Index of the PV informer: storageClassName (empty string for none).
PV_STORAGE_CLASS_INDEX = "storageclass"
#: Index of the PV informer: storageClassName of PVs without ``spec.claimRef``.
PV_UNCLAIMED_CLASS_INDEX = "storageclass-unclaimed"
#: Index of the PV informer: ``namespace/name`` of the claim in ``spec.claimRef``.
PV_CLAIM_REF_INDEX = "claimref"
#: Pseudo-index of the PV informer (no values): counts unclaimed PVs entering the store.
PV_UNCLAIMED_GENERATION_INDEX = "storageclass-unclaimed-generation"


#: :meth:`PVAssumeCache.candidate_state`: the informer still holds that very
#: object and no assumed version shadows it
CANDIDATE = 0
#: a visible assumed version shadows it (which may be restored later)
SHADOWED = 1
#: the informer holds another object or none
GONE = 2


class InformerLike(Protocol):
    """What the cache needs from an informer: its indexer and a handler hook."""

    @property
    def indexer(self) -> Indexer: ...

    def add_event_handler(
        self,
        on_add: Callable[..., Any] | None = None,
        on_update: Callable[..., Any] | None = None,
        on_delete: Callable[..., Any] | None = None,
    ) -> HandlerRegistration | Any: ...


class AssumeError(Exception):
    """An assume-cache operation failed (missing object or version mismatch)."""

    def __init__(self, description: str, key: str, message: str) -> None:
        super().__init__(f"{description} {key!r}: {message}" if description else f"{key!r}: {message}")
        self.description = description
        self.key = key


class NotFoundError(AssumeError):
    """The informer does not hold the key. :attr:`status_error` is the API-style 404."""

    def __init__(self, description: str, key: str, resource: str = "") -> None:
        super().__init__(description, key, "not found")
        name = key.rpartition("/")[2]
        self.status_error = errors.not_found(resource or description or "objects", name)


class OutOfSyncError(AssumeError):
    """The object to assume does not carry the informer's resourceVersion."""

    def __init__(self, description: str, key: str, stored: str, assumed: str) -> None:
        super().__init__(description, key, f"out of sync (stored resourceVersion {stored!r}, assume {assumed!r})")
        self.stored = stored
        self.assumed = assumed


class PassiveAssumeCache(Generic[T]):
    """Assumed objects layered over an informer's indexer; see the module doc."""

    def __init__(
        self,
        informer: InformerLike,
        *,
        description: str = "",
        resource: str = "",
        indexers: dict[str, IndexFunc] | None = None,
        key_func: KeyFunc = meta_namespace_key,
    ) -> None:
        """``indexers`` are added to the informer's indexer; a name that is
        already registered is accepted (several caches may share one informer)."""
        self.description = description
        self.resource = resource
        self._informer = informer
        self._store: Indexer = informer.indexer
        self._key_func = key_func
        self._assumed: dict[str, T] = {}
        if indexers:
            for name, fn in indexers.items():
                try:
                    self._store.add_indexers({name: fn})
                except ValueError:
                    pass  # already present on the shared informer
        self.registration = informer.add_event_handler(
            on_add=self._on_add, on_update=self._on_update, on_delete=self._on_delete
        )

    # -- reads

    def _key(self, obj_or_key: T | str) -> str:
        return obj_or_key if isinstance(obj_or_key, str) else self._key_func(obj_or_key)

    def _not_found(self, key: str) -> NotFoundError:
        return NotFoundError(self.description, key, self.resource)

    def _pick(self, key: str, stored: T) -> T:
        assumed = self._assumed.get(key)
        if assumed is not None and resource_version_of(assumed) == resource_version_of(stored):
            return assumed
        return stored

    def get(self, key: str) -> T:
        """The assumed object while it matches the indexer's version, else the indexer's."""
        stored = self._store.get_by_key(key)
        if stored is None:
            raise self._not_found(key)
        return self._pick(key, stored)  # type: ignore[arg-type]

    def get_api_obj(self, key: str) -> T:
        """Always the indexer's (the API server's latest known) object."""
        stored = self._store.get_by_key(key)
        if stored is None:
            raise self._not_found(key)
        return stored  # type: ignore[return-value]

    def list(self, index_name: str | None = None, index_value: str | None = None) -> list[T]:
        """All objects, or one index's members (the index is evaluated on the
        indexer's objects); assumed versions substitute under the read rule."""
        if index_name is None:
            keys = self._store.list_keys()
        else:
            keys = self._store.index_keys(index_name, index_value or "")
        out: list[T] = []
        for key in keys:
            stored = self._store.get_by_key(key)
            if stored is not None:
                out.append(self._pick(key, stored))  # type: ignore[arg-type]
        return out

    def by_index(self, index_name: str, index_value: str) -> list[T]:
        return self.list(index_name, index_value)

    def is_assumed(self, key: str) -> bool:
        """True while an assumption is visible through :meth:`get`."""
        stored = self._store.get_by_key(key)
        assumed = self._assumed.get(key)
        return (
            stored is not None and assumed is not None
            and resource_version_of(assumed) == resource_version_of(stored)
        )

    def __len__(self) -> int:
        """Number of assumed entries held (visible or awaiting expiry)."""
        return len(self._assumed)

    # -- writes

    def assume(self, obj: T) -> None:
        """Record ``obj`` (a modified copy of the indexer's object, same resourceVersion)."""
        key = self._key_func(obj)
        stored = self._store.get_by_key(key)
        if stored is None:
            raise self._not_found(key)
        stored_rv, rv = resource_version_of(stored), resource_version_of(obj)
        if stored_rv != rv:
            raise OutOfSyncError(self.description, key, stored_rv, rv)
        self._forget(key)
        self._assumed[key] = obj
        self._remember(key, obj)

    def restore(self, obj_or_key: T | str, resource_version: str | None = None) -> None:
        """Forget the assumption iff its resourceVersion equals the given one.

        With an object, its resourceVersion is used. A bare key needs
        ``resource_version``: dropping by key alone could discard another
        pod's newer assumption, which is exactly what this rule prevents."""
        if isinstance(obj_or_key, str):
            if resource_version is None:
                raise ValueError("restore by key needs the resourceVersion that was assumed")
            key, rv = obj_or_key, resource_version
        else:
            key = self._key_func(obj_or_key)
            rv = resource_version if resource_version is not None else resource_version_of(obj_or_key)
        assumed = self._assumed.get(key)
        if assumed is not None and resource_version_of(assumed) == rv:
            self._forget(key)

    # -- informer handler: expire assumptions only

    def _may_expire(self, key: str) -> None:
        assumed = self._assumed.get(key)
        if assumed is None:
            return
        stored = self._store.get_by_key(key)
        if stored is not None and resource_version_of(stored) == resource_version_of(assumed):
            return  # resync or a stale event: the assumption is still current
        self._forget(key)

    def _remember(self, key: str, obj: T) -> None:
        """Hook: ``obj`` was just assumed under ``key``."""

    def _forget(self, key: str) -> None:
        """Drop the assumption under ``key`` (if any)."""
        self._assumed.pop(key, None)

    def _on_add(self, obj: T) -> None:
        self._may_expire(self._key_func(obj))

    def _on_update(self, old: T, new: T) -> None:
        self._may_expire(self._key_func(new))

    def _on_delete(self, obj: T) -> None:
        # meta_namespace_key understands DeletedFinalStateUnknown tombstones.
        self._may_expire(self._key_func(obj))


def pv_storage_class_index(pv: dict[str, Any]) -> list[str]:
    """Index value of a PV: its storage class ("" when none)."""
    return [str((pv.get("spec") or {}).get("storageClassName") or "")]


def pv_unclaimed_class_index(pv: dict[str, Any]) -> list[str]:
    """Index value of a PV without claimRef: its storage class; none when claimed."""
    spec = pv.get("spec") or {}
    return [] if spec.get("claimRef") else [str(spec.get("storageClassName") or "")]


def pv_claim_ref_index(pv: dict[str, Any]) -> list[str]:
    """Index value of a claimed PV: ``namespace/name`` of its claimRef."""
    ref = (pv.get("spec") or {}).get("claimRef")
    return [f"{ref.get('namespace') or ''}/{ref.get('name') or ''}"] if ref else []


def _claim_ref_key(pv: dict[str, Any]) -> str | None:
    ref = (pv.get("spec") or {}).get("claimRef")
    return f"{ref.get('namespace') or ''}/{ref.get('name') or ''}" if ref else None


class UnclaimedGenerations:
    """Per storage class, a counter that grows whenever an unclaimed PV enters
    the informer's store (added, or replacing an older version of its key).

    It is the index function of :data:`PV_UNCLAIMED_GENERATION_INDEX`, so it runs
    inside the indexer's own add/update/replace, before any event handler: a
    reader that sees the new object in the indexer also sees the new count,
    whatever order handlers are delivered in. Those are the only changes that
    can add a matching candidate or alter an unclaimed candidate's facts;
    claiming and deleting a PV only remove candidates. The indexer evaluates
    index functions on the outgoing object too; that object is recognised
    (the one last seen under its key) and not counted."""

    def __init__(self, store: Indexer) -> None:
        self._store = store
        self._seen: dict[str, Any] = {}
        self._counts: dict[str, int] = {}

    def get(self, storage_class: str) -> int:
        return self._counts.get(storage_class, 0)

    def __call__(self, pv: dict[str, Any]) -> list[str]:
        key = self._store.key_of(pv)
        if self._seen.get(key) is pv:
            if self._store.get_by_key(key) is not pv:
                del self._seen[key]  # deleted
            return []
        if len(self._seen) > 2 * len(self._store) + 1024:
            # keys dropped by a relist; unknown objects only cause extra counts
            self._seen = {k: v for k, v in self._seen.items() if self._store.get_by_key(k) is v}
        self._seen[key] = pv
        if not (pv.get("spec") or {}).get("claimRef"):
            cls = pv_storage_class_index(pv)[0]
            self._counts[cls] = self._counts.get(cls, 0) + 1
        return []


_GENERATIONS: "weakref.WeakKeyDictionary[Indexer, UnclaimedGenerations]" = weakref.WeakKeyDictionary()


def unclaimed_generations(store: Indexer) -> UnclaimedGenerations:
    """The counters of ``store`` (registered on first use, shared by every cache on it)."""
    gens = _GENERATIONS.get(store)
    if gens is None:
        gens = _GENERATIONS[store] = UnclaimedGenerations(store)
        store.add_indexers({PV_UNCLAIMED_GENERATION_INDEX: gens})
    return gens


class PVAssumeCache(PassiveAssumeCache[dict[str, Any]]):
    """Passive cache of PersistentVolumes with storage-class and claimRef indexes.

    Indexes are evaluated on the informer's objects; reads substitute assumed
    versions under the usual rule. :meth:`unclaimed_generation` and
    :meth:`may_be_prebound` support caching candidate lists across pods."""

    def __init__(self, informer: InformerLike, **kw: Any) -> None:
        #: claim key -> keys of assumed PVs whose claimRef names it
        self._assumed_refs: dict[str, set[str]] = {}
        #: keys of assumed PVs without claimRef
        self._assumed_unclaimed: set[str] = set()
        indexers = {PV_STORAGE_CLASS_INDEX: pv_storage_class_index,
                    PV_UNCLAIMED_CLASS_INDEX: pv_unclaimed_class_index, PV_CLAIM_REF_INDEX: pv_claim_ref_index}
        indexers.update(kw.pop("indexers", None) or {})
        super().__init__(informer, indexers=indexers, **kw)
        self._generations = unclaimed_generations(self._store)

    def _remember(self, key: str, obj: dict[str, Any]) -> None:
        ref = _claim_ref_key(obj)
        if ref is None:
            self._assumed_unclaimed.add(key)
        else:
            self._assumed_refs.setdefault(ref, set()).add(key)

    def _forget(self, key: str) -> None:
        old = self._assumed.pop(key, None)
        if old is None:
            return
        ref = _claim_ref_key(old)
        if ref is None:
            self._assumed_unclaimed.discard(key)
            return
        keys = self._assumed_refs.get(ref)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._assumed_refs[ref]

    # -- support for candidate lists kept across pods (see VolumeBinder)

    #: :meth:`candidate_state` results
    CANDIDATE = CANDIDATE
    SHADOWED = SHADOWED
    GONE = GONE

    def candidate_state(self, key: str, informer_obj: dict[str, Any]) -> int:
        """How a PV remembered as the informer's ``informer_obj`` reads now:
        :attr:`CANDIDATE` (the informer still holds that very object and no
        assumption is visible), :attr:`SHADOWED` (a visible assumed version,
        which may be restored later) or :attr:`GONE` (the informer holds
        another object or none)."""
        stored = self._store.get_by_key(key)
        if stored is not informer_obj:
            return self.GONE
        assumed = self._assumed.get(key)
        if assumed is not None and resource_version_of(assumed) == resource_version_of(stored):
            return self.SHADOWED
        return self.CANDIDATE

    def informer_unclaimed(self, storage_class: str) -> list[dict[str, Any]]:
        """The informer's PVs of the class without claimRef, sorted by name (no assumed versions)."""
        return self._store.by_index(PV_UNCLAIMED_CLASS_INDEX, storage_class)

    @property
    def has_unclaimed_assumptions(self) -> bool:
        """Some assumed PV version has no claimRef (VolumeBinding never assumes one)."""
        return bool(self._assumed_unclaimed)

    def unclaimed_generation(self, storage_class: str) -> int:
        """Grows whenever an unclaimed PV of the class enters the informer's store
        (see :class:`UnclaimedGenerations`)."""
        return self._generations.get(storage_class)

    def may_be_prebound(self, claim_key: str) -> bool:
        """True when some PV (informer or assumed version) has a claimRef naming ``claim_key``."""
        return bool(self._store.index_keys(PV_CLAIM_REF_INDEX, claim_key)) or claim_key in self._assumed_refs

    def list_pvs(self, storage_class: str) -> list[dict[str, Any]]:
        return self.list(PV_STORAGE_CLASS_INDEX, storage_class)

    def list_pvs_for_claims(self, storage_class: str, claim_keys: list[str]) -> list[dict[str, Any]]:
        """The PVs of ``list_pvs(storage_class)`` (same order) that the informer
        holds without claimRef or with a claimRef naming one of ``claim_keys``.

        Every other PV of the class is claimed by another claim in the informer
        (an assumed version, having the same resourceVersion, only adds a claimRef)."""
        store = self._store
        keys = set(store.index_keys(PV_UNCLAIMED_CLASS_INDEX, storage_class))
        for ck in claim_keys:
            for key in store.index_keys(PV_CLAIM_REF_INDEX, ck):
                stored = store.get_by_key(key)
                if stored is not None and pv_storage_class_index(stored)[0] == storage_class:
                    keys.add(key)
        out: list[dict[str, Any]] = []
        for key in sorted(keys):
            stored = store.get_by_key(key)
            if stored is not None:
                out.append(self._pick(key, stored))  # type: ignore[arg-type]
        return out


def new_pv_assume_cache(informer: InformerLike) -> PVAssumeCache:
    return PVAssumeCache(informer, description="v1.PersistentVolume", resource="persistentvolumes")


def new_pvc_assume_cache(informer: InformerLike) -> PassiveAssumeCache[dict[str, Any]]:
    return PassiveAssumeCache(informer, description="v1.PersistentVolumeClaim", resource="persistentvolumeclaims")
