"""Fakes shared by the unit tests: an in-memory Client for informer tests, a
hand-driven FakeInformer, and a RecordingClient that only logs writes.

FakeClient:

Faithful where informers care: one global revision, lists with limit/continue
at a revision, watches from a revision (history replay, 410 once compacted),
and knobs to misbehave: suspend delivery to open watches (a silent
disconnect), expire them with a 410 ERROR event, break them with an exception,
end them normally, or send bookmarks.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from kubeplane.api import errors
from kubeplane.api.resources import ResourceInfo
from kubeplane.client.informer import Indexer
from kubeplane.client.interface import Obj, WatchEvent

_END = object()


def _labels_match(obj: Obj, selector: str | None) -> bool:
    if not selector:
        return True
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in selector.split(","):
        term = term.strip()
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.split("=", 1)
            if labels.get(k.strip()) != v.strip().lstrip("="):
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _fields_match(obj: Obj, selector: str | None) -> bool:
    if not selector:
        return True
    meta = obj.get("metadata") or {}
    for term in selector.split(","):
        k, v = term.split("=", 1)
        value = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace")}.get(k)
        if value != v:
            return False
    return True


def _merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = _merge_patch(result.get(k), v)
    return result


class FakeWatch:
    def __init__(self, client: "FakeClient", res: ResourceInfo, namespace: str | None,
                 label_selector: str | None, field_selector: str | None, resource_version: str | None,
                 allow_bookmarks: bool) -> None:
        self.client = client
        self.res = res
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.resource_version = resource_version
        self.allow_bookmarks = allow_bookmarks
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.suspended = False
        self.closed = False

    def matches(self, res: ResourceInfo, obj: Obj) -> bool:
        if res.key != self.res.key:
            return False
        if self.namespace and (obj.get("metadata") or {}).get("namespace") != self.namespace:
            return False
        return _labels_match(obj, self.label_selector) and _fields_match(obj, self.field_selector)

    def __aiter__(self) -> "FakeWatch":
        return self

    async def __anext__(self) -> WatchEvent:
        if self.closed:
            raise StopAsyncIteration
        item = await self.queue.get()
        if item is _END:
            self.closed = True
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self.closed = True
            raise item
        return item

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.queue.put_nowait(_END)
        self.client.watches.discard(self)


class FakeClient:
    def __init__(self) -> None:
        self.revision = 0
        self.compacted = 0
        self.objects: dict[tuple[tuple[str, str], str, str], Obj] = {}
        self.history: list[tuple[int, ResourceInfo, WatchEvent]] = []
        self.watches: set[FakeWatch] = set()
        self.list_calls: list[dict[str, Any]] = []
        self.watch_calls: list[dict[str, Any]] = []

    # -- helpers

    def _key(self, res: ResourceInfo, name: str, namespace: str | None) -> tuple[tuple[str, str], str, str]:
        return (res.key, (namespace or "") if res.namespaced else "", name)

    def _emit(self, res: ResourceInfo, type_: str, obj: Obj) -> None:
        event = WatchEvent(type_, obj)
        self.history.append((self.revision, res, event))
        for w in list(self.watches):
            if not w.suspended and not w.closed and w.matches(res, obj):
                w.queue.put_nowait(WatchEvent(type_, copy.deepcopy(obj)))

    def _bump(self, obj: Obj) -> None:
        self.revision += 1
        obj["metadata"]["resourceVersion"] = str(self.revision)

    # -- misbehaviour knobs

    def suspend_watches(self) -> None:
        """Open watches stop receiving events (changes still happen)."""
        for w in self.watches:
            w.suspended = True

    def compact(self) -> None:
        """Forget history: watches from an older revision now get 410."""
        self.compacted = self.revision
        self.history.clear()

    def expire_watches(self) -> None:
        """Compact and send a 410 ERROR event to every open watch."""
        self.compact()
        for w in list(self.watches):
            w.queue.put_nowait(WatchEvent("ERROR", errors.gone(
                f"too old resource version: {w.resource_version} ({self.revision})").to_status()))

    def break_watches(self, exc: BaseException | None = None) -> None:
        for w in list(self.watches):
            w.queue.put_nowait(exc or ConnectionResetError("watch stream broken"))
            self.watches.discard(w)

    def end_watches(self) -> None:
        """End open watches normally, as a server timeout does."""
        for w in list(self.watches):
            w.queue.put_nowait(_END)
            self.watches.discard(w)

    def send_bookmark(self, res: ResourceInfo) -> None:
        for w in list(self.watches):
            if w.res.key == res.key and w.allow_bookmarks and not w.suspended:
                w.queue.put_nowait(WatchEvent("BOOKMARK", {
                    "kind": res.kind, "apiVersion": res.api_version,
                    "metadata": {"resourceVersion": str(self.revision)},
                }))

    # -- Client protocol

    async def get(self, res: ResourceInfo, name: str, namespace: str | None = None, *,
                  subresource: str | None = None) -> Obj:
        obj = self.objects.get(self._key(res, name, namespace))
        if obj is None:
            raise errors.not_found(res.plural, name, res.group)
        return copy.deepcopy(obj)

    async def list(self, res: ResourceInfo, namespace: str | None = None, *, label_selector: str | None = None,
                   field_selector: str | None = None, limit: int | None = None,
                   continue_token: str | None = None, resource_version: str | None = None,
                   resource_version_match: str | None = None) -> Obj:
        self.list_calls.append({"namespace": namespace, "limit": limit, "continue": continue_token,
                                "label_selector": label_selector})
        await asyncio.sleep(0)
        items = [
            o for (rkey, ns, _), o in sorted(self.objects.items())
            if rkey == res.key and (not namespace or ns == namespace)
            and _labels_match(o, label_selector) and _fields_match(o, field_selector)
        ]
        rv = str(self.revision)
        start = 0
        if continue_token:
            tok_rv, _, offset = continue_token.partition(":")
            if int(tok_rv) < self.compacted:
                raise errors.gone("the provided continue parameter is too old")
            start = int(offset)
            rv = tok_rv  # a real store lists every page at the first page's revision
        meta: dict[str, Any] = {"resourceVersion": rv}
        page = items[start:]
        if limit and len(page) > limit:
            page = page[:limit]
            meta["continue"] = f"{rv}:{start + limit}"
        return {"kind": res.list_kind, "apiVersion": res.api_version, "metadata": meta,
                "items": [copy.deepcopy(o) for o in page]}

    async def create(self, res: ResourceInfo, obj: Obj, namespace: str | None = None, *,
                     subresource: str | None = None, name: str | None = None,
                     field_manager: str | None = None, dry_run: bool = False) -> Obj:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if res.namespaced:
            meta["namespace"] = namespace or meta.get("namespace") or "default"
        key = self._key(res, meta["name"], meta.get("namespace"))
        if key in self.objects:
            raise errors.already_exists(res.plural, meta["name"], res.group)
        obj.setdefault("apiVersion", res.api_version)
        obj.setdefault("kind", res.kind)
        self._bump(obj)
        self.objects[key] = obj
        self._emit(res, "ADDED", obj)
        return copy.deepcopy(obj)

    async def update(self, res: ResourceInfo, obj: Obj, *, subresource: str | None = None,
                     field_manager: str | None = None, dry_run: bool = False) -> Obj:
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        key = self._key(res, meta["name"], meta.get("namespace"))
        cur = self.objects.get(key)
        if cur is None:
            raise errors.not_found(res.plural, meta["name"], res.group)
        if meta.get("resourceVersion") and meta["resourceVersion"] != cur["metadata"]["resourceVersion"]:
            raise errors.conflict(res.plural, meta["name"], res.group)
        self._bump(obj)
        self.objects[key] = obj
        self._emit(res, "MODIFIED", obj)
        return copy.deepcopy(obj)

    async def patch(self, res: ResourceInfo, name: str, patch: Any, namespace: str | None = None, *,
                    patch_type: str = "merge", subresource: str | None = None,
                    field_manager: str | None = None, force: bool | None = None, dry_run: bool = False) -> Obj:
        key = self._key(res, name, namespace)
        cur = self.objects.get(key)
        if cur is None:
            raise errors.not_found(res.plural, name, res.group)
        new = _merge_patch(cur, patch)
        new["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
        return await self.update(res, new)

    async def delete(self, res: ResourceInfo, name: str, namespace: str | None = None, *,
                     grace_period_seconds: int | None = None, propagation_policy: str | None = None,
                     preconditions: dict[str, str] | None = None, dry_run: bool = False) -> Obj:
        key = self._key(res, name, namespace)
        cur = self.objects.pop(key, None)
        if cur is None:
            raise errors.not_found(res.plural, name, res.group)
        cur = copy.deepcopy(cur)
        self._bump(cur)
        self._emit(res, "DELETED", cur)
        return {"kind": "Status", "apiVersion": "v1", "status": "Success",
                "details": {"name": name, "kind": res.plural}}

    def watch(self, res: ResourceInfo, namespace: str | None = None, *, resource_version: str | None = None,
              label_selector: str | None = None, field_selector: str | None = None,
              allow_bookmarks: bool = True, timeout_seconds: int | None = None,
              send_initial_events: bool = False) -> FakeWatch:
        self.watch_calls.append({"resource_version": resource_version, "namespace": namespace,
                                 "allow_bookmarks": allow_bookmarks})
        w = FakeWatch(self, res, namespace, label_selector, field_selector, resource_version, allow_bookmarks)
        if resource_version and int(resource_version) < self.compacted:
            w.queue.put_nowait(WatchEvent("ERROR", errors.gone(
                f"too old resource version: {resource_version} ({self.compacted})").to_status()))
            w.queue.put_nowait(_END)
            return w
        start = int(resource_version) if resource_version else self.revision
        for rev, r, ev in self.history:
            if rev > start and w.matches(r, ev.object):
                w.queue.put_nowait(WatchEvent(ev.type, copy.deepcopy(ev.object)))
        self.watches.add(w)
        return w

    async def close(self) -> None:
        self.end_watches()


class FakeInformer:
    """An indexer plus event handlers, driven by hand. A change updates the
    indexer first, then (unless ``notify=False``) calls the handlers, as an
    informer does; ``deliver`` replays one change to one handler later."""

    def __init__(self) -> None:
        self.indexer = Indexer()
        self.handlers: list[tuple[Any, Any, Any]] = []

    def add_event_handler(self, on_add: Any = None, on_update: Any = None, on_delete: Any = None) -> int:
        self.handlers.append((on_add, on_update, on_delete))
        return len(self.handlers) - 1

    def put(self, obj: Obj, notify: bool = True) -> Obj:
        old = self.indexer.add(obj)
        if notify:
            for i in range(len(self.handlers)):
                self.deliver(i, old, obj)
        return obj

    add = put

    def deliver(self, i: int, old: Obj | None, new: Obj) -> None:
        on_add, on_update, _ = self.handlers[i]
        if old is None:
            if on_add:
                on_add(new)
        elif on_update:
            on_update(old, new)

    def remove(self, obj: Obj, notify: bool = True) -> None:
        self.indexer.delete(obj)
        if notify:
            for _, _, on_delete in self.handlers:
                if on_delete:
                    on_delete(obj)

    delete = remove


class RecordingClient:
    """Accepts deletes and patches of any object and logs them in ``calls``:
    ("delete", plural, namespace, name) and ("patch", subresource, namespace, name, patch)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    async def delete(self, res: Any, name: str, namespace: str | None = None, **kw: Any) -> dict:
        self.calls.append(("delete", res.plural, namespace, name))
        return {}

    async def patch(self, res: Any, name: str, patch: Any, namespace: str | None = None, **kw: Any) -> dict:
        self.calls.append(("patch", kw.get("subresource"), namespace, name, patch))
        return {}

    def deleted(self) -> list[str]:
        return sorted(c[3] for c in self.calls if c[0] == "delete")
