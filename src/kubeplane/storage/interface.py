"""The storage contract (the etcd model), shared by every backend.

* One global revision counter; every create, update and delete bumps it by one.
* Values are JSON-compatible dicts holding Kubernetes objects. The store owns a
  value once it has been handed to ``create``/``update``: it stamps
  ``metadata.resourceVersion`` with the write's revision (the "versioner") and
  never changes it again. Callers must treat every dict they get back as
  read-only and copy before modifying.
* Watches deliver every change after a revision, in revision order, exactly
  once. A revision older than the compacted one is "too old" (HTTP 410).
* An acknowledged write (the awaited call returned) survives kill -9 on a
  durable backend.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, AsyncIterator, Literal, Protocol

Obj = dict[str, Any]


def parse_revision(value: Any) -> int:
    """The store revision a ``resourceVersion`` names (a decimal string or an int).

    ``ValueError`` unless it is a non-negative integer. Revisions are ordered
    numbers only in this layer: above it a resourceVersion is an opaque string
    compared for equality, and whatever needs its order asks here.
    """
    try:
        revision = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"not a revision: {value!r}") from None
    if revision < 0:
        raise ValueError(f"not a revision: {value!r}")
    return revision


def latest_revision(*revisions: int) -> int:
    """The newest of ``revisions``."""
    return max(revisions)


async def wait_for_revision(store: "Store", revision: int, timeout: float, poll: float = 0.01) -> bool:
    """Wait until ``store`` has reached ``revision``; False if ``timeout`` seconds pass first."""
    if store.revision >= revision:
        return True
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while store.revision < revision:
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(poll)
    return True


class StorageError(Exception):
    """Base class of storage failures; the registry maps each to a Status."""


class WriteFailedError(StorageError):
    """The backend could not store a write (e.g. the disk is full).

    Nothing of the write is kept and the store stays usable: later writes are
    tried again. The API server answers 500 InternalError with this text.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class KeyExistsError(StorageError):
    def __init__(self, key: str) -> None:
        super().__init__(f"key exists: {key}")
        self.key = key


class KeyNotFoundError(StorageError):
    def __init__(self, key: str) -> None:
        super().__init__(f"key not found: {key}")
        self.key = key


class RevisionConflictError(StorageError):
    """The expected revision did not match.

    ``current`` is the state the write was checked against: the latest write
    accepted for the key, which a durable backend may still be committing (a
    read can return the previous committed state until then). A writer that
    retries starts from ``current``, as etcd's failed transaction returns the
    fresh value; re-reading would see the stale state and conflict again.
    """

    def __init__(self, key: str, expected: int, current: "KeyValue") -> None:
        super().__init__(f"revision conflict on {key}: expected {expected}, have {current.mod_revision}")
        self.key = key
        self.expected = expected
        self.current = current


class CompactedError(StorageError):
    """The requested revision has been compacted away (HTTP 410 Gone)."""

    def __init__(self, requested: int, compacted: int, current: int) -> None:
        super().__init__(f"too old resource version: {requested} ({current})")
        self.requested = requested
        self.compacted = compacted
        self.current = current


class FutureRevisionError(StorageError):
    """A revision newer than the store's current one was requested."""

    def __init__(self, requested: int, current: int) -> None:
        super().__init__(f"Too large resource version: {requested}, current resource version: {current}")
        self.requested = requested
        self.current = current


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: Obj
    create_revision: int
    mod_revision: int
    #: read through a transformer other than the one that writes now (an older
    #: encryption key or provider): writing the same object again is not a no-op
    stale: bool = False


@dataclass(frozen=True, slots=True)
class ListResult:
    items: list[KeyValue]
    revision: int  # the revision the list is consistent at
    more: bool  # True when ``limit`` cut the result short


@dataclass(frozen=True, slots=True)
class Event:
    """One change. ``type`` is ADDED (create), MODIFIED (update) or DELETED.

    For DELETED, ``value`` is the last stored object re-stamped with the
    delete's revision (as the API server sends it) and ``prev_value`` is the
    object as it was stored before.
    """

    type: Literal["ADDED", "MODIFIED", "DELETED"]
    key: str
    value: Obj
    prev_value: Obj | None
    revision: int


class Watch(Protocol):
    """An open watch. Iterate it for events; ``close`` ends it from either side.

    Iteration ends normally when the watch is closed; it raises
    :class:`CompactedError` if the watcher fell so far behind that the events
    it needs were dropped.
    """

    def __aiter__(self) -> AsyncIterator[Event]: ...

    async def __anext__(self) -> Event: ...

    async def next_batch(self, timeout: float | None = None) -> list[Event] | None:
        """All events ready now (waiting up to ``timeout`` for the first):
        ``[]`` on timeout, ``None`` when closed."""

    @property
    def waiting(self) -> bool:
        """True while a reader is parked waiting for the next event."""

    def close(self) -> None: ...


class Store(Protocol):
    @property
    def revision(self) -> int:
        """The current (latest committed) revision."""

    @property
    def compacted_revision(self) -> int:
        """Revisions at or below this one can no longer be watched or listed at."""

    async def get(self, key: str) -> KeyValue | None: ...

    async def list(
        self, prefix: str, *, revision: int = 0, limit: int = 0, start_after: str = ""
    ) -> ListResult:
        """Keys under ``prefix`` in key order, consistent at ``revision``.

        ``revision`` 0 means the current revision. ``start_after`` (exclusive)
        continues a previous page; ``limit`` 0 means no limit. Raises
        CompactedError for a compacted revision and FutureRevisionError for one
        not yet reached.
        """

    async def create(self, key: str, value: Obj) -> KeyValue:
        """Create ``key``; raises KeyExistsError if present."""

    async def update(self, key: str, value: Obj, expected_revision: int | None = None) -> KeyValue:
        """Replace ``key``; raises KeyNotFoundError, or RevisionConflictError when
        ``expected_revision`` is given and differs from the stored mod_revision."""

    async def delete(self, key: str, expected_revision: int | None = None) -> KeyValue:
        """Delete ``key``; returns the deleted value re-stamped with the delete's
        revision (``mod_revision`` is the delete's revision)."""

    def watch(self, prefix: str, revision: int) -> Watch:
        """Every change under ``prefix`` with a revision strictly greater than
        ``revision``, in order. Raises CompactedError synchronously when
        ``revision`` < ``compacted_revision``."""

    async def compact(self, revision: int) -> None:
        """Forget history at or below ``revision``."""

    async def close(self) -> None: ...
