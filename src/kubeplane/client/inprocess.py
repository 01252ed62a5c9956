"""The in-process client: the Client protocol straight onto the registry.

What ``kubeplane up`` uses internally: no HTTP, no JSON, but the same
semantics and errors as over the wire. Objects are copied on the way in and
out so callers can never modify stored state.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from kubeplane.api import errors
from kubeplane.api.resources import ResourceInfo
from kubeplane.client.interface import Obj, PatchType, WatchEvent
from kubeplane.registry.registry import Registry, WatchOptions


def _copy(obj: Any) -> Any:
    # orjson round-trip: much faster than copy.deepcopy for JSON-shaped data.
    return orjson.loads(orjson.dumps(obj))


def _typed(res: ResourceInfo, obj: Obj) -> Obj:
    out = _copy(obj)
    if out.get("kind") != "Status":
        out.setdefault("apiVersion", res.api_version)
        out.setdefault("kind", res.kind)
    return out


def typed_view(res: ResourceInfo, obj: Obj) -> Obj:
    """``obj`` with apiVersion and kind, never modified: for callers that only read
    the result (e.g. to serialise it)."""
    if obj.get("kind") == "Status" or ("apiVersion" in obj and "kind" in obj):
        return obj
    return {"apiVersion": res.api_version, "kind": res.kind, **obj}


def _same(obj: Any) -> Any:
    return obj


class InProcessWatch:
    def __init__(self, registry: Registry, res: ResourceInfo, namespace: str | None, opts: WatchOptions,
                 typed: Any = _typed) -> None:
        self._res = res
        self._typed = typed
        self._gen = registry.watch(res, namespace, opts)
        self._closed = False
        self._error: errors.StatusError | None = None

    def __aiter__(self) -> "InProcessWatch":
        return self

    async def __anext__(self) -> WatchEvent:
        if self._closed:
            raise StopAsyncIteration
        try:
            typ, obj = await self._gen.__anext__()
        except errors.StatusError as err:
            # Errors at watch start travel as ERROR events, as on the wire.
            self._closed = True
            return WatchEvent("ERROR", err.to_status())
        except StopAsyncIteration:
            self._closed = True
            raise
        if typ == "ERROR":
            return WatchEvent(typ, _copy(obj))
        return WatchEvent(typ, self._typed(self._res, obj))

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._gen.aclose()


class InProcessClient:
    """Implements :class:`kubeplane.client.interface.Client` over a Registry.

    With ``copies=False`` arguments are handed over to the registry, which may
    keep and modify them, and results share structure with stored objects
    (which are never modified in place): only for callers that do not touch
    what they passed and never modify what they receive (the wire server,
    which decodes fresh arguments and encodes results; a read-only informer).
    """

    #: the API server's work runs in the caller's event loop
    shares_event_loop = True

    def __init__(self, registry: Registry, *, field_manager: str = "kubeplane", copies: bool = True) -> None:
        self.registry = registry
        self.field_manager = field_manager
        self._copy = _copy if copies else _same
        self._typed = _typed if copies else typed_view
        self._owned = not copies

    @property
    def catalogue(self):
        """The resources the registry serves now (custom resources included)."""
        return self.registry.catalogue

    async def get(self, res: ResourceInfo, name: str, namespace: str | None = None, *,
                  subresource: str | None = None) -> Obj:
        if subresource == "scale":
            return self._copy(await self.registry.get_scale(res, name, namespace))
        if subresource not in (None, "status"):
            raise errors.bad_request(f"subresource {subresource!r} cannot be read")
        return self._typed(res, await self.registry.get(res, name, namespace))

    async def list(self, res: ResourceInfo, namespace: str | None = None, *, label_selector: str | None = None,
                   field_selector: str | None = None, limit: int | None = None, continue_token: str | None = None,
                   resource_version: str | None = None, resource_version_match: str | None = None) -> Obj:
        result = await self.registry.list(
            res, namespace, label_selector=label_selector or "", field_selector=field_selector or "",
            limit=limit or 0, continue_token=continue_token or "", resource_version=resource_version or "",
            resource_version_match=resource_version_match or "",
        )
        return self._copy(result)

    async def create(self, res: ResourceInfo, obj: Obj, namespace: str | None = None, *,
                     subresource: str | None = None, name: str | None = None, field_manager: str | None = None,
                     dry_run: bool = False) -> Obj:
        if subresource == "binding":
            if not name:
                raise errors.bad_request("binding requires the pod name")
            return await self.registry.bind(name, namespace or "", self._copy(obj), dry_run=dry_run)
        if subresource == "eviction" and res.key == ("", "pods"):
            from kubeplane.registry.eviction import evict

            if not name:
                raise errors.bad_request("eviction requires the pod name")
            status, code = await evict(self.registry, name, namespace or "", self._copy(obj), dry_run=dry_run)
            if code >= 400:
                raise errors.StatusError.from_status(status, code)
            return status
        if subresource is not None:
            raise errors.method_not_allowed(f"cannot create subresource {subresource!r}")
        if namespace is None and res.namespaced:
            namespace = (obj.get("metadata") or {}).get("namespace")
        created = await self.registry.create(res, obj, namespace, dry_run=dry_run,
                                             field_manager=field_manager or self.field_manager, owned=self._owned)
        return self._typed(res, created)

    async def update(self, res: ResourceInfo, obj: Obj, *, subresource: str | None = None,
                     field_manager: str | None = None, dry_run: bool = False) -> Obj:
        md = obj.get("metadata") or {}
        if subresource == "scale":
            scale = self._copy(obj)
            out = await self.registry.update_scale(res, md.get("name", ""), md.get("namespace"), lambda _c: scale,
                                                   dry_run=dry_run)
            return self._copy(out)
        updated = await self.registry.update(
            res, obj, name=md.get("name"), namespace=md.get("namespace"), subresource=subresource,
            dry_run=dry_run, field_manager=field_manager or self.field_manager, owned=self._owned,
        )
        return self._typed(res, updated)

    async def patch(self, res: ResourceInfo, name: str, patch: Any, namespace: str | None = None, *,
                    patch_type: PatchType = "merge", subresource: str | None = None,
                    field_manager: str | None = None, force: bool | None = None, dry_run: bool = False) -> Obj:
        if subresource == "scale":
            from kubeplane.api import patch as patching

            p = self._copy(patch)

            def scale_of(current: Obj) -> Obj:
                return patching.json_patch(current, p) if patch_type == "json" else patching.merge_patch(current, p)

            return self._copy(await self.registry.update_scale(res, name, namespace or "", scale_of, dry_run=dry_run))
        if subresource == "finalize":
            raise errors.method_not_allowed("the server does not allow this method on the requested resource")
        obj, _created = await self.registry.patch(
            res, name, self._copy(patch), namespace, patch_type=patch_type, subresource=subresource, dry_run=dry_run,
            field_manager=field_manager or self.field_manager, force=force,
        )
        return self._typed(res, obj)

    async def delete(self, res: ResourceInfo, name: str, namespace: str | None = None, *,
                     grace_period_seconds: int | None = None, propagation_policy: str | None = None,
                     preconditions: dict[str, str] | None = None, dry_run: bool = False) -> Obj:
        obj, _finished = await self.registry.delete(
            res, name, namespace, grace_period_seconds=grace_period_seconds,
            propagation_policy=propagation_policy, preconditions=preconditions, dry_run=dry_run,
        )
        return self._typed(res, obj)

    async def delete_collection(self, res: ResourceInfo, namespace: str | None = None, *,
                                label_selector: str | None = None, field_selector: str | None = None,
                                grace_period_seconds: int | None = None, propagation_policy: str | None = None,
                                dry_run: bool = False) -> Obj:
        """deletecollection, as the API server serves it: every object the
        selectors match is deleted; returns the List of those deleted."""
        if "deletecollection" not in res.verbs:
            raise errors.method_not_allowed("the server does not allow this method on the requested resource")
        result = await self.registry.list(res, namespace, label_selector=label_selector or "",
                                          field_selector=field_selector or "")
        deleted = []
        for obj in result["items"]:
            md = obj["metadata"]
            try:
                await self.registry.delete(res, md["name"], md.get("namespace"),
                                           grace_period_seconds=grace_period_seconds,
                                           propagation_policy=propagation_policy, dry_run=dry_run, collection=True)
            except errors.StatusError as err:
                if err.code == 404:
                    continue
                raise
            deleted.append(obj)
        return self._copy({"kind": res.list_kind, "apiVersion": res.api_version,
                           "metadata": {"resourceVersion": str(self.registry.store.revision)}, "items": deleted})

    def watch(self, res: ResourceInfo, namespace: str | None = None, *, resource_version: str | None = None,
              label_selector: str | None = None, field_selector: str | None = None, allow_bookmarks: bool = True,
              timeout_seconds: int | None = None, send_initial_events: bool = False) -> InProcessWatch:
        opts = WatchOptions(
            resource_version=resource_version or "",
            resource_version_match="NotOlderThan" if send_initial_events else "",
            label_selector=label_selector or "",
            field_selector=field_selector or "",
            allow_bookmarks=allow_bookmarks,
            send_initial_events=True if send_initial_events else None,
            timeout_seconds=float(timeout_seconds) if timeout_seconds else None,
        )
        return InProcessWatch(self.registry, res, namespace, opts, self._typed)

    async def close(self) -> None:
        await asyncio.sleep(0)
