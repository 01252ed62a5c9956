"""Watch: the changes after a resourceVersion, filtered by selectors, with
bookmarks, initial events and timeouts (upstream's watch semantics over the
store's watch)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

from kubeplane.api import errors
from kubeplane.api.resources import ResourceInfo
from kubeplane.api.selectors import parse_label_selector
from kubeplane.storage.interface import CompactedError, latest_revision, parse_revision
from kubeplane.storage.transformer import TransformError

if TYPE_CHECKING:
    from kubeplane.storage.interface import Store

Obj = dict[str, Any]


@dataclass(slots=True)
class WatchOptions:
    resource_version: str = ""
    resource_version_match: str = ""
    label_selector: str = ""
    field_selector: str = ""
    allow_bookmarks: bool = False
    send_initial_events: bool | None = None
    timeout_seconds: float | None = None
    bookmark_interval: float = 5.0
    #: yield one empty batch once the watch is established (every error that
    #: can come before it has been raised), so a server can send its headers
    announce_start: bool = False
    #: called if the store drops the watcher for not reading its backlog
    on_overflow: Callable[[], None] | None = None


def parse_resource_version(value: str, what: str = "resourceVersion") -> int:
    """A request's resourceVersion as the store's revision; 400 when it is not one."""
    try:
        return parse_revision(value)
    except ValueError:
        raise errors.bad_request(f"invalid {what}: {value!r}") from None


#: how often a custom resource's idle watch checks that its CRD is still served
CUSTOM_GONE_CHECK_SECONDS = 1.0


class WatchMixin:
    """The watch verbs of :class:`~kubeplane.registry.registry.Registry`
    (which provides ``store`` and ``_wait_for_revision``)."""

    store: "Store"
    _field_selector: Any
    _out: Any
    catalogue: Any

    async def watch(
        self, res: ResourceInfo, namespace: str | None, opts: WatchOptions
    ) -> AsyncIterator[tuple[str, Obj]]:
        """Yields ``(type, object)``; ERROR carries a Status. Ends at the timeout."""
        batches = self.watch_batches(res, namespace, opts)
        try:
            async for batch in batches:
                for ev in batch:
                    yield ev
        finally:
            await batches.aclose()

    async def watch_batches(
        self, res: ResourceInfo, namespace: str | None, opts: WatchOptions
    ) -> AsyncIterator[list[tuple[str, Obj]]]:
        """Like :meth:`watch`, but yields every event ready at once as a list."""
        from kubeplane.registry import hpa_conversion

        if hpa_conversion.is_v1(res):
            async for converted in hpa_conversion.V1View(self, res).watch_batches(namespace, opts):
                yield converted
            return
        lsel = parse_label_selector(opts.label_selector) if opts.label_selector else None
        fsel = self._field_selector(res, opts.field_selector) if opts.field_selector else None

        def matches(obj: Obj | None) -> bool:
            if obj is None:
                return False
            if lsel is not None and not lsel.matches((obj.get("metadata") or {}).get("labels")):
                return False
            return fsel is None or fsel.matches(obj)

        prefix = res.storage_prefix(namespace if res.namespaced else None)
        rv = opts.resource_version or ""
        initial: list[Obj] = []
        send_initial = opts.send_initial_events
        if send_initial is None:
            send_initial = rv in ("", "0")
        if send_initial and opts.send_initial_events and opts.resource_version_match not in ("NotOlderThan",):
            raise errors.invalid("ListOptions", "", [errors.forbidden_field(
                "resourceVersionMatch", "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan")],
                group=errors.META_GROUP)
        if rv in ("", "0") or send_initial:
            if rv not in ("", "0"):
                await self._wait_for_revision(parse_resource_version(rv))
            result = await self.store.list(prefix)
            start = result.revision
            if send_initial:
                initial = [self._out(res, kv.value) for kv in result.items if matches(kv.value)]
        else:
            start = parse_resource_version(rv)
            await self._wait_for_revision(start)
        try:
            stream = self.store.watch(prefix, start)
        except CompactedError as exc:
            yield [("ERROR", errors.gone(str(exc)).to_status())]
            return
        if opts.on_overflow is not None and hasattr(stream, "on_overflow"):
            stream.on_overflow = opts.on_overflow
        loop = asyncio.get_running_loop()
        deadline = loop.time() + opts.timeout_seconds if opts.timeout_seconds else None
        last_rv = start
        try:
            if opts.announce_start:
                yield []
            first: list[tuple[str, Obj]] = [("ADDED", obj) for obj in initial]
            if opts.send_initial_events and opts.allow_bookmarks:
                first.append(("BOOKMARK", self._bookmark(res, last_rv, initial_end=True)))
            if first:
                yield first
            # A custom resource's watch ends once its CRD is no longer served
            # (upstream tears the resource's storage down): checked every second.
            custom = res.custom is not None
            next_bookmark = loop.time() + opts.bookmark_interval
            while True:
                timeout = opts.bookmark_interval if opts.allow_bookmarks else None
                if deadline is not None:
                    left = deadline - loop.time()
                    if left <= 0:
                        break
                    timeout = left if timeout is None else min(timeout, left)
                if custom:
                    timeout = CUSTOM_GONE_CHECK_SECONDS if timeout is None else min(timeout, CUSTOM_GONE_CHECK_SECONDS)
                try:
                    events = await stream.next_batch(timeout)
                except CompactedError as exc:
                    yield [("ERROR", errors.gone(str(exc)).to_status())]
                    return
                except TransformError as exc:
                    # An event's value cannot be decrypted: the watch ends with an internal error.
                    yield [("ERROR", errors.internal(f"Internal error occurred: {exc}").to_status())]
                    return
                if events is None:
                    break
                if custom and not events:
                    if self.catalogue.by_gvr(res.group, res.version, res.plural) is None:
                        break
                    if loop.time() < next_bookmark and (deadline is None or loop.time() < deadline):
                        continue
                    next_bookmark = loop.time() + opts.bookmark_interval
                if not events:
                    if opts.allow_bookmarks and (deadline is None or loop.time() < deadline):
                        progress = getattr(stream, "progress_revision", None)
                        if callable(progress):
                            last_rv = latest_revision(last_rv, progress())
                        yield [("BOOKMARK", self._bookmark(res, last_rv))]
                    continue
                out: list[tuple[str, Obj]] = []
                for ev in events:
                    last_rv = ev.revision
                    if ev.type == "ADDED":
                        if matches(ev.value):
                            out.append(("ADDED", ev.value))
                    elif ev.type == "MODIFIED":
                        now_match = matches(ev.value)
                        was = matches(ev.prev_value)
                        if now_match and was:
                            out.append(("MODIFIED", ev.value))
                        elif now_match:
                            out.append(("ADDED", ev.value))
                        elif was:
                            # Left the selection: the watcher sees it go, at this revision.
                            out.append(("DELETED", ev.value))
                    elif matches(ev.prev_value):
                        out.append(("DELETED", ev.value))
                if out:
                    if res.custom is not None:
                        out = [(t, self._out(res, o)) for t, o in out]
                    yield out
        finally:
            stream.close()

    def _bookmark(self, res: ResourceInfo, rv: int, initial_end: bool = False) -> Obj:
        md: Obj = {"resourceVersion": str(rv)}
        if initial_end:
            md["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {"kind": res.kind, "apiVersion": res.api_version, "metadata": md}
