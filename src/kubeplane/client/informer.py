"""Informers in asyncio, after client-go's ``tools/cache``.

Layers, each with one job:

* :class:`Indexer` — the local store keyed by ``namespace/name`` with named
  secondary indexes.
* :class:`Reflector` — lists (paginated), then watches from the list's
  resourceVersion, and feeds a :class:`ReflectorSink`. On a 410 or a broken
  stream it relists and the sink receives the full new state.
* :class:`SharedInformer` — one reflector and one indexer per resource, many
  handlers. The indexer is updated *before* any handler is notified, and each
  handler has its own queue and task (client-go's processorListener), so a slow
  handler delays only itself and two handlers may observe a change at
  different times.

Deletions detected by a relist (the object vanished while the watch was
down) reach ``on_delete`` as a :class:`DeletedFinalStateUnknown`, as in
client-go. Here that wrapper *is* a dict equal to the last known object, so
handlers that only read fields need no special case; those that care test
``isinstance(obj, DeletedFinalStateUnknown)``.

resourceVersions are opaque strings, compared for equality only.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import random
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Protocol, Union

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import ResourceInfo
from kubeplane.client.interface import Client, Obj
from kubeplane.runtime import cancel_and_wait

log = logging.getLogger(__name__)

IndexFunc = Callable[[Obj], list[str]]
KeyFunc = Callable[[Obj], str]


def meta_namespace_key(obj: Obj) -> str:
    """``namespace/name``, or ``name`` for cluster-scoped objects."""
    if isinstance(obj, DeletedFinalStateUnknown):
        return obj.key
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    name = meta.get("name", "")
    return f"{ns}/{name}" if ns else name


def split_meta_namespace_key(key: str) -> tuple[str | None, str]:
    """``(namespace, name)``; namespace is ``None`` for cluster-scoped keys."""
    ns, sep, name = key.partition("/")
    return (ns, name) if sep else (None, ns)


def resource_version_of(obj: Obj) -> str:
    """``metadata.resourceVersion`` ("" when absent)."""
    return (obj.get("metadata") or {}).get("resourceVersion") or ""


class DeletedFinalStateUnknown(dict):
    """An object deleted while the watch was down, noticed by a relist.

    The dict content is the last state the indexer knew; the actual final
    state is unknown (later changes may have been missed)."""

    def __init__(self, key: str, obj: Obj) -> None:
        super().__init__(obj)
        self.key = key
        self.obj = obj

    def __repr__(self) -> str:
        return f"DeletedFinalStateUnknown({self.key!r})"


def unwrap_deleted(obj: Obj) -> Obj:
    """The object inside a :class:`DeletedFinalStateUnknown`, or ``obj`` itself."""
    return obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj


# ---------------------------------------------------------------- Indexer


class Indexer:
    """Store with named indexes. Not thread-safe; safe within one event loop
    because no method awaits. Stored dicts are shared: do not mutate them.

    ``version`` grows on every add, update, delete of a stored key and
    replace, so readers can detect "the contents may have changed" in O(1)."""

    def __init__(self, indexers: dict[str, IndexFunc] | None = None, key_func: KeyFunc = meta_namespace_key) -> None:
        self._key_func = key_func
        self._items: dict[str, Obj] = {}
        self._index_funcs: dict[str, IndexFunc] = {}
        # index name -> index value -> set of keys
        self._indices: dict[str, dict[str, set[str]]] = {}
        self.resource_version = ""
        #: change counter (see the class docstring)
        self.version = 0
        if indexers:
            self.add_indexers(indexers)

    def key_of(self, obj: Obj) -> str:
        return self._key_func(obj)

    def add_indexers(self, indexers: dict[str, IndexFunc]) -> None:
        """Register index functions; existing items are indexed right away."""
        for name in indexers:
            if name in self._index_funcs:
                raise ValueError(f"indexer {name!r} already exists")
        for name, fn in indexers.items():
            self._index_funcs[name] = fn
            index: dict[str, set[str]] = {}
            self._indices[name] = index
            for key, obj in self._items.items():
                for value in fn(obj):
                    index.setdefault(value, set()).add(key)

    def _index_add(self, key: str, obj: Obj) -> None:
        for name, fn in self._index_funcs.items():
            index = self._indices[name]
            for value in fn(obj):
                index.setdefault(value, set()).add(key)

    def _index_remove(self, key: str, obj: Obj) -> None:
        for name, fn in self._index_funcs.items():
            index = self._indices[name]
            for value in fn(obj):
                keys = index.get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[value]

    def _set(self, key: str, obj: Obj) -> Obj | None:
        old = self._items.get(key)
        if old is not None:
            self._index_remove(key, old)
        self._items[key] = obj
        self._index_add(key, obj)
        self.version += 1
        return old

    def add(self, obj: Obj) -> Obj | None:
        """Insert or replace; returns the previous object under that key."""
        return self._set(self._key_func(obj), obj)

    update = add

    def delete(self, obj: Obj) -> Obj | None:
        return self.delete_key(self._key_func(obj))

    def delete_key(self, key: str) -> Obj | None:
        old = self._items.pop(key, None)
        if old is not None:
            self._index_remove(key, old)
            self.version += 1
        return old

    def get(self, obj_or_key: Obj | str) -> Obj | None:
        key = obj_or_key if isinstance(obj_or_key, str) else self._key_func(obj_or_key)
        return self._items.get(key)

    def get_by_key(self, key: str) -> Obj | None:
        return self._items.get(key)

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def list(self) -> list[Obj]:
        return list(self._items.values())

    def list_keys(self) -> list[str]:
        return list(self._items)

    def _index(self, index_name: str) -> dict[str, set[str]]:
        try:
            return self._indices[index_name]
        except KeyError:
            raise KeyError(f"index {index_name!r} does not exist") from None

    def index_keys(self, index_name: str, value: str) -> list[str]:
        return sorted(self._index(index_name).get(value, ()))

    def by_index(self, index_name: str, value: str) -> list[Obj]:
        keys = self._index(index_name).get(value, ())
        return [self._items[k] for k in sorted(keys)]

    def list_index_func_values(self, index_name: str) -> list[str]:
        return list(self._index(index_name))

    def replace(self, objs: Iterable[Obj], resource_version: str) -> None:
        """Make the store hold exactly ``objs``."""
        self._items = {}
        self._indices = {name: {} for name in self._index_funcs}
        for obj in objs:
            self._set(self._key_func(obj), obj)
        self.version += 1
        self.resource_version = resource_version


# -------------------------------------------------------------- Reflector


class ReflectorSink(Protocol):
    """Where a reflector delivers what it learns. Methods must not block."""

    def replace(self, objs: list[Obj], resource_version: str) -> None: ...

    def on_added(self, obj: Obj) -> None: ...

    def on_modified(self, obj: Obj) -> None: ...

    def on_deleted(self, obj: Obj) -> None: ...


class _Expired(Exception):
    """The watch's resourceVersion is gone (410): relist."""


class Reflector:
    """List, then watch from the list's resourceVersion, forever.

    * A watch that ends normally (server timeout) restarts from the last seen
      resourceVersion, without a list.
    * A 410 ERROR event, any other ERROR event or a broken stream triggers a
      relist after a backoff (``backoff_initial`` doubling to ``backoff_max``,
      with jitter), reset once a watch has delivered events; a watch that
      ends without events is also paced by it.
    * Bookmarks only advance the last seen resourceVersion.
    """

    def __init__(
        self,
        client: Client,
        res: ResourceInfo,
        sink: ReflectorSink,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        min_watch_timeout: int = 300,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.client = client
        self.res = res
        self.sink = sink
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.page_size = page_size
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.min_watch_timeout = min_watch_timeout
        self._rng = rng or random.Random()
        self._sleep = sleep
        self.last_sync_resource_version = ""
        self.list_count = 0
        self._backoff = backoff_initial
        self._stream: Any = None

    async def run(self) -> None:
        """Run until cancelled."""
        try:
            while True:
                try:
                    await self._list()
                    await self._watch_until_failure()
                except asyncio.CancelledError:
                    raise
                except _Expired:
                    log.debug("%s: watch expired, relisting", self.res.qualified)
                except Exception as exc:  # noqa: BLE001 - any failure means relist
                    log.warning("%s: list/watch failed, relisting: %r", self.res.qualified, exc)
                await self._sleep(self._next_backoff())
        finally:
            await self._close_stream()

    def _next_backoff(self) -> float:
        delay = self._backoff * (1.0 + 0.5 * self._rng.random())
        self._backoff = min(self._backoff * 2, self.backoff_max)
        return min(delay, self.backoff_max)

    async def _list(self) -> None:
        items: list[Obj] = []
        token: str | None = None
        limit: int | None = self.page_size or None
        rv = ""
        while True:
            try:
                page = await self.client.list(
                    self.res,
                    self.namespace,
                    label_selector=self.label_selector,
                    field_selector=self.field_selector,
                    limit=limit,
                    continue_token=token,
                )
            except StatusError as err:
                if err.code == 410 and token is not None:
                    # The continue token expired mid-way: fall back to one full list.
                    items, token, limit = [], None, None
                    continue
                raise
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            rv = meta.get("resourceVersion") or rv
            token = meta.get("continue") or None
            if not token:
                break
        # List items may omit kind/apiVersion; fill them in like the typed clients do.
        for obj in items:
            obj.setdefault("apiVersion", self.res.api_version)
            obj.setdefault("kind", self.res.kind)
        self.list_count += 1
        self.last_sync_resource_version = rv
        self.sink.replace(items, rv)

    async def _watch_until_failure(self) -> None:
        while True:
            timeout = int(self.min_watch_timeout * (1.0 + self._rng.random()))
            stream = self.client.watch(
                self.res,
                self.namespace,
                resource_version=self.last_sync_resource_version,
                label_selector=self.label_selector,
                field_selector=self.field_selector,
                allow_bookmarks=True,
                timeout_seconds=timeout,
            )
            self._stream = stream
            events = 0
            try:
                async for event in stream:
                    events += 1
                    self._handle(event.type, event.object)
            finally:
                await self._close_stream()
            if events == 0:
                # A watch that ends at once repeatedly would spin; pace it.
                await self._sleep(self._next_backoff())
            else:
                self._backoff = self.backoff_initial

    def _handle(self, type_: str, obj: Obj) -> None:
        if type_ == "ERROR":
            code = obj.get("code")
            if code == 410:
                raise _Expired(obj.get("message", ""))
            raise StatusError.from_status(obj)
        rv = resource_version_of(obj)
        if type_ == "BOOKMARK":
            if rv:
                self.last_sync_resource_version = rv
            return
        obj.setdefault("apiVersion", self.res.api_version)
        obj.setdefault("kind", self.res.kind)
        if type_ == "ADDED":
            self.sink.on_added(obj)
        elif type_ == "MODIFIED":
            self.sink.on_modified(obj)
        elif type_ == "DELETED":
            self.sink.on_deleted(obj)
        else:
            log.warning("%s: unknown watch event type %r", self.res.qualified, type_)
            return
        if rv:
            self.last_sync_resource_version = rv

    async def _close_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                await stream.close()
            except Exception:  # noqa: BLE001 - closing a dead stream may fail
                log.debug("closing watch stream failed", exc_info=True)


# ------------------------------------------------------- Shared informer

Handler = Callable[..., Union[None, Awaitable[None]]]


@dataclass(slots=True)
class _Notification:
    kind: str  # "add", "update", "delete", "synced"
    old: Obj | None = None
    new: Obj | None = None


class HandlerRegistration:
    """One handler's queue and delivery task."""

    def __init__(
        self,
        on_add: Handler | None,
        on_update: Handler | None,
        on_delete: Handler | None,
    ) -> None:
        self.on_add = on_add
        self.on_update = on_update
        self.on_delete = on_delete
        # A deque with one waiting future: delivery drains whatever has
        # arrived, and a burst costs one wake-up instead of one per event.
        self._queue: collections.deque[_Notification] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._synced = False
        self._sync_queued = False
        self._synced_event = asyncio.Event()

    def has_synced(self) -> bool:
        """True once this handler has processed every object of the initial list."""
        return self._synced

    async def wait_for_sync(self, timeout: float | None = None) -> bool:
        try:
            await asyncio.wait_for(self._synced_event.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    @property
    def pending(self) -> int:
        """Notifications queued and not yet delivered."""
        return len(self._queue)

    def _put(self, n: _Notification) -> None:
        self._queue.append(n)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _mark_sync(self) -> None:
        if not self._sync_queued:
            self._sync_queued = True
            self._put(_Notification("synced"))

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def _run(self) -> None:
        queue = self._queue
        loop = asyncio.get_running_loop()
        while True:
            if not queue:
                waiter = self._waiter = loop.create_future()
                try:
                    await waiter
                finally:
                    if self._waiter is waiter:
                        self._waiter = None
                continue
            n = queue.popleft()
            try:
                if n.kind == "synced":
                    self._synced = True
                    self._synced_event.set()
                    continue
                if n.kind == "add":
                    fn, args = self.on_add, (n.new,)
                elif n.kind == "update":
                    fn, args = self.on_update, (n.old, n.new)
                else:
                    fn, args = self.on_delete, (n.old,)
                if fn is None:
                    continue
                result = fn(*args)
                if result is not None and inspect.isawaitable(result):
                    await result
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a failing handler must not stop delivery
                log.exception("informer event handler failed")


class SharedInformer:
    """One resource's reflector + indexer, fanned out to many handlers."""

    def __init__(
        self,
        client: Client,
        res: ResourceInfo,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        resync_period: float = 0,
        *,
        indexers: dict[str, IndexFunc] | None = None,
        reflector_options: dict[str, Any] | None = None,
    ) -> None:
        self.client = client
        self.res = res
        self.resync_period = resync_period
        self._indexer = Indexer(indexers)
        self._handlers: list[HandlerRegistration] = []
        self._reflector = Reflector(
            client, res, self,
            namespace=namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            **(reflector_options or {}),
        )
        self._synced = False
        self._synced_event: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._started = False

    # -- public API

    @property
    def indexer(self) -> Indexer:
        return self._indexer

    @property
    def reflector(self) -> Reflector:
        return self._reflector

    @property
    def last_sync_resource_version(self) -> str:
        return self._reflector.last_sync_resource_version

    @property
    def pending(self) -> int:
        """Notifications queued for this informer's handlers and not yet delivered."""
        return sum(reg.pending for reg in self._handlers)

    def add_indexers(self, indexers: dict[str, IndexFunc]) -> None:
        self._indexer.add_indexers(indexers)

    def add_event_handler(
        self,
        on_add: Handler | None = None,
        on_update: Handler | None = None,
        on_delete: Handler | None = None,
    ) -> HandlerRegistration:
        """Register callbacks (plain or async). A handler added after the
        initial list first receives an add for every object already known."""
        reg = HandlerRegistration(on_add, on_update, on_delete)
        self._handlers.append(reg)
        if self._synced:
            for obj in self._indexer.list():
                reg._put(_Notification("add", new=obj))
            reg._mark_sync()
        if self._started:
            reg._start()
        return reg

    async def remove_event_handler(self, reg: HandlerRegistration) -> None:
        if reg in self._handlers:
            self._handlers.remove(reg)
        await reg._stop()

    def has_synced(self) -> bool:
        """True once the initial list is in the indexer."""
        return self._synced

    async def wait_for_sync(self, timeout: float | None = None) -> bool:
        if self._synced:
            return True
        if self._synced_event is None:
            self._synced_event = asyncio.Event()
        try:
            await asyncio.wait_for(self._synced_event.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    @property
    def started(self) -> bool:
        return self._started

    def start(self) -> None:
        """Start the reflector and the handlers' tasks (idempotent)."""
        if self._started:
            return
        self._started = True
        loop = asyncio.get_running_loop()
        if self._synced_event is None:
            self._synced_event = asyncio.Event()
        for reg in self._handlers:
            reg._start()
        self._tasks.append(loop.create_task(self._reflector.run(), name=f"reflector-{self.res.qualified}"))
        if self.resync_period > 0:
            self._tasks.append(loop.create_task(self._resync_loop(), name=f"resync-{self.res.qualified}"))

    async def stop(self) -> None:
        """Cancel the reflector (closing its watch) and every handler task."""
        tasks, self._tasks = self._tasks, []
        await cancel_and_wait(tasks, "informer task")
        for reg in self._handlers:
            await reg._stop()
        self._started = False

    # -- ReflectorSink

    def _distribute(self, n: _Notification) -> None:
        for reg in self._handlers:
            reg._put(n)

    def replace(self, objs: list[Obj], resource_version: str) -> None:
        """A (re)list result: update the indexer, then notify the difference."""
        idx = self._indexer
        key_of = idx.key_of
        new_keys = {key_of(o) for o in objs}
        notes: list[_Notification] = []
        for key in idx.list_keys():
            if key not in new_keys:
                old = idx.get_by_key(key)
                assert old is not None
                notes.append(_Notification("delete", old=DeletedFinalStateUnknown(key, old)))
        for obj in objs:
            old = idx.get_by_key(key_of(obj))
            if old is None:
                notes.append(_Notification("add", new=obj))
            elif resource_version_of(old) != resource_version_of(obj):
                notes.append(_Notification("update", old=old, new=obj))
        idx.replace(objs, resource_version)
        for n in notes:
            self._distribute(n)
        if not self._synced:
            self._synced = True
            for reg in self._handlers:
                reg._mark_sync()
            if self._synced_event is not None:
                self._synced_event.set()

    def on_added(self, obj: Obj) -> None:
        old = self._indexer.add(obj)
        if old is None:
            self._distribute(_Notification("add", new=obj))
        else:
            self._distribute(_Notification("update", old=old, new=obj))

    def on_modified(self, obj: Obj) -> None:
        self.on_added(obj)

    def on_deleted(self, obj: Obj) -> None:
        self._indexer.delete(obj)
        self._distribute(_Notification("delete", old=obj))

    # -- resync

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.resync_period)
            if self._synced:
                for obj in self._indexer.list():
                    self._distribute(_Notification("update", old=obj, new=obj))



def _informer_key(
    res: ResourceInfo, namespace: str | None, label_selector: str | None, field_selector: str | None
) -> tuple[Any, ...]:
    return (res.group, res.version, res.plural, namespace or "", label_selector or "", field_selector or "")


@dataclass
class SharedInformerFactory:
    """Hands out one shared informer per resource (and namespace/selectors)."""

    client: Client
    resync_period: float = 0
    namespace: str | None = None
    reflector_options: dict[str, Any] | None = None
    _informers: dict[tuple[Any, ...], SharedInformer] = field(default_factory=dict)

    def informer_for(
        self,
        res: ResourceInfo,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        resync_period: float | None = None,
    ) -> SharedInformer:
        ns = namespace if namespace is not None else self.namespace
        key = _informer_key(res, ns, label_selector, field_selector)
        inf = self._informers.get(key)
        if inf is None:
            inf = SharedInformer(
                self.client, res, ns, label_selector, field_selector,
                self.resync_period if resync_period is None else resync_period,
                reflector_options=self.reflector_options,
            )
            self._informers[key] = inf
        return inf

    @property
    def informers(self) -> list[SharedInformer]:
        return list(self._informers.values())

    def start(self) -> None:
        """Start every informer not yet started (call again after adding more)."""
        for inf in self._informers.values():
            inf.start()

    async def wait_for_cache_sync(self, timeout: float | None = None) -> dict[ResourceInfo, bool]:
        """Wait for every started informer; returns each one's synced state."""
        started = [i for i in self._informers.values() if i.started]

        async def one(inf: SharedInformer) -> bool:
            return await inf.wait_for_sync(timeout)

        results = await asyncio.gather(*(one(i) for i in started))
        return {i.res: ok for i, ok in zip(started, results)}

    async def stop(self) -> None:
        for inf in self._informers.values():
            await inf.stop()
