"""The event-dispatching assume cache (upstream ``pkg/scheduler/util/assumecache``).

Per key it keeps the object last delivered by the informer (``api object``)
and the latest object, which is either that one or an object assumed by the
scheduler (typically returned by the API server after a write, before the
informer has delivered it).

* ``assume(obj)`` replaces the latest object unless ``obj`` has an older
  resourceVersion than the stored one.
* An informer add/update replaces both objects only when its resourceVersion
  is strictly newer than the latest object's, so a stale informer event never
  overwrites a newer assumed object. A delete always applies.
* ``restore(key)`` makes the latest object the informer's again.

Every change is turned into add/update/delete events for the cache's own
handlers, queued under the lock and delivered after it is released, strictly
in the order of the changes. A handler may read or modify the cache; events it
causes are delivered after the current one, by the same drain loop.

This module is the only place where resourceVersions are compared for order,
in :func:`compare_resource_versions`.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any, Callable, Protocol

from kubeplane.client.informer import (
    DeletedFinalStateUnknown,
    Indexer,
    IndexFunc,
    SharedInformer,
    meta_namespace_key,
    unwrap_deleted,
)

log = logging.getLogger(__name__)

Obj = dict[str, Any]

__all__ = [
    "AssumeCache",
    "AssumeCacheError",
    "EventHandler",
    "InvalidResourceVersionError",
    "NotFoundError",
    "ObjectVersionError",
    "compare_resource_versions",
]


class AssumeCacheError(Exception):
    """Base class of the cache's errors."""


class NotFoundError(AssumeCacheError):
    """No object with that key is in the cache."""


class ObjectVersionError(AssumeCacheError):
    """An assumed object is older than the stored one."""


class InvalidResourceVersionError(AssumeCacheError, ValueError):
    """A resourceVersion that does not parse as an integer."""


def compare_resource_versions(a: str, b: str) -> int:
    """-1, 0 or 1 comparing two resourceVersions; the project's only order comparison of them."""
    try:
        x = int(a)
        y = int(b)
    except (TypeError, ValueError):
        raise InvalidResourceVersionError(f"invalid resourceVersion: {a!r} or {b!r}") from None
    return (x > y) - (x < y)


def _newer_or_equal(a: str, b: str) -> bool:
    """True when resourceVersion ``a`` is not older than ``b``."""
    return compare_resource_versions(a, b) >= 0


def _rv(obj: Obj) -> str:
    return (obj.get("metadata") or {}).get("resourceVersion") or ""


class EventHandler(Protocol):
    """What :meth:`AssumeCache.add_event_handler` accepts (any method may be missing)."""

    def on_add(self, obj: Obj) -> None: ...

    def on_update(self, old: Obj, new: Obj) -> None: ...

    def on_delete(self, obj: Obj) -> None: ...


class _Handler:
    __slots__ = ("on_add", "on_update", "on_delete")

    def __init__(self, on_add: Any, on_update: Any, on_delete: Any) -> None:
        self.on_add = on_add
        self.on_update = on_update
        self.on_delete = on_delete


class AssumeCache:
    """Informer objects plus assumed versions, with ordered synchronous events."""

    def __init__(
        self,
        informer: SharedInformer | None = None,
        *,
        description: str = "object",
        indexers: dict[str, IndexFunc] | None = None,
        key_func: Callable[[Obj], str] = meta_namespace_key,
    ) -> None:
        self.description = description
        self._key_func = key_func
        self._latest = Indexer(indexers, key_func=key_func)
        self._api: dict[str, Obj] = {}
        self._lock = threading.Lock()
        self._emit_lock = threading.Lock()
        self._draining = threading.local()
        self._queue: deque[Callable[[], None]] = deque()
        self._handlers: list[_Handler] = []
        if informer is not None:
            informer.add_event_handler(
                on_add=self.informer_add,
                on_update=self.informer_update,
                on_delete=self.informer_delete,
            )

    # ------------------------------------------------------------ informer side

    def informer_add(self, obj: Obj) -> None:
        """An object added (or updated) by the informer."""
        if isinstance(obj, DeletedFinalStateUnknown):
            obj = obj.obj
        key = self._key_func(obj)
        with self._lock:
            old = self._latest.get_by_key(key)
            if old is not None:
                try:
                    if _newer_or_equal(_rv(old), _rv(obj)):
                        # Not newer than what we have (informer resync, or an
                        # echo of an assumed object): keep the stored object.
                        return
                except InvalidResourceVersionError as err:
                    log.error("%s %s: %s; event ignored", self.description, key, err)
                    return
            self._latest.add(obj)
            self._api[key] = obj
            self._push_locked("update" if old is not None else "add", old, obj)
        self._emit()

    def informer_update(self, old: Obj, new: Obj) -> None:
        """An informer update; handled like an add of the new object."""
        self.informer_add(new)

    def informer_delete(self, obj: Obj) -> None:
        """An object deleted by the informer (always applied)."""
        obj = unwrap_deleted(obj)
        key = self._key_func(obj)
        with self._lock:
            old = self._latest.delete_key(key)
            self._api.pop(key, None)
            if old is None:
                return
            self._push_locked("delete", old, None)
        self._emit()

    # ------------------------------------------------------------- scheduler side

    def assume(self, obj: Obj) -> None:
        """Make ``obj`` the latest object of its key.

        Raises :class:`NotFoundError` for an unknown key and
        :class:`ObjectVersionError` when ``obj`` is older than the stored object."""
        key = self._key_func(obj)
        with self._lock:
            old = self._latest.get_by_key(key)
            if old is None:
                raise NotFoundError(f"{self.description} {key!r} not found")
            new_rv, stored_rv = _rv(obj), _rv(old)
            if not _newer_or_equal(new_rv, stored_rv):
                raise ObjectVersionError(
                    f"{self.description} {key!r} is out of sync "
                    f"(stored resourceVersion {stored_rv}, assumed {new_rv})"
                )
            self._latest.add(obj)
            self._push_locked("update", old, obj)
        self._emit()

    def restore(self, key: str) -> None:
        """Drop an assumed object: the informer's object becomes the latest again."""
        with self._lock:
            api = self._api.get(key)
            if api is None:
                return
            old = self._latest.get_by_key(key)
            if old is api:
                return
            self._latest.add(api)
            self._push_locked("update", old, api)
        self._emit()

    # -------------------------------------------------------------------- reads

    def get(self, key: str) -> Obj:
        """The latest object; :class:`NotFoundError` if unknown."""
        with self._lock:
            obj = self._latest.get_by_key(key)
        if obj is None:
            raise NotFoundError(f"{self.description} {key!r} not found")
        return obj

    def get_api_obj(self, key: str) -> Obj:
        """The informer's object; :class:`NotFoundError` if unknown."""
        with self._lock:
            obj = self._api.get(key)
        if obj is None:
            raise NotFoundError(f"{self.description} {key!r} not found")
        return obj

    def list(self, index_name: str | None = None, index_value: str | None = None) -> list[Obj]:
        """Latest objects, optionally those whose index ``index_name`` yields ``index_value``."""
        with self._lock:
            if index_name is None:
                return self._latest.list()
            return self._latest.by_index(index_name, index_value or "")

    def __len__(self) -> int:
        with self._lock:
            return len(self._latest)

    # ------------------------------------------------------------------- events

    def add_event_handler(
        self,
        handler: EventHandler | None = None,
        *,
        on_add: Callable[[Obj], Any] | None = None,
        on_update: Callable[[Obj, Obj], Any] | None = None,
        on_delete: Callable[[Obj], Any] | None = None,
    ) -> None:
        """Register a handler (an object with ``on_add``/``on_update``/``on_delete``
        or the callables). It first receives an add for every cached object."""
        if handler is not None:
            on_add = on_add or getattr(handler, "on_add", None)
            on_update = on_update or getattr(handler, "on_update", None)
            on_delete = on_delete or getattr(handler, "on_delete", None)
        h = _Handler(on_add, on_update, on_delete)
        with self._lock:
            self._handlers.append(h)
            if h.on_add is not None:
                for obj in self._latest.list():
                    self._queue.append(_bind(h.on_add, obj))
        self._emit()

    def _push_locked(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        for h in self._handlers:
            if kind == "add" and h.on_add is not None:
                self._queue.append(_bind(h.on_add, new))
            elif kind == "update" and h.on_update is not None:
                self._queue.append(_bind(h.on_update, old, new))
            elif kind == "delete" and h.on_delete is not None:
                self._queue.append(_bind(h.on_delete, old))

    def _emit(self) -> None:
        """Deliver queued events in order, outside the state lock.

        A call made by a handler (same thread, already draining) returns at
        once: the running drain delivers its events next. Another thread waits
        until the queue, including its own events, has been delivered."""
        if getattr(self._draining, "active", False):
            return
        with self._emit_lock:
            self._draining.active = True
            try:
                while True:
                    with self._lock:
                        if not self._queue:
                            return
                        deliver = self._queue.popleft()
                    try:
                        deliver()
                    except Exception:  # noqa: BLE001 - one failing handler must not stop the others
                        log.exception("%s assume cache: event handler failed", self.description)
            finally:
                self._draining.active = False


def _bind(fn: Callable[..., Any], *args: Any) -> Callable[[], None]:
    def call() -> None:
        fn(*args)

    return call

