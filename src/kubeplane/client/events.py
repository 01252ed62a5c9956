"""Event recording for controllers and the scheduler, as upstream's recorders do it.

:meth:`EventRecorder.event` returns at once: a Kubernetes component never
waits for its events. A few background writers send them; a repeat of an
event (same object, type, reason and message) bumps the stored event's count
instead of creating another. At most :attr:`EventRecorder.max_queued` events
wait; further ones are dropped until the writers catch up, as upstream's
broadcaster drops when its queue is full. Events are best effort: a failed
write is logged, never raised.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import now_text
from kubeplane.api.resources import resource
from kubeplane.client.interface import Client, Obj
from kubeplane.runtime import cancel_and_wait

log = logging.getLogger(__name__)

EVENTS = resource("events")

_Key = tuple[str, str, str, str, str]


def _reference(obj: Obj, kind: str, api_version: str, field_path: str = "") -> dict[str, Any]:
    md = obj.get("metadata") or {}
    ref = {
        "kind": obj.get("kind") or kind, "apiVersion": obj.get("apiVersion") or api_version,
        "name": md.get("name", ""), "namespace": md.get("namespace", ""),
        "uid": md.get("uid", ""), "resourceVersion": md.get("resourceVersion", ""),
    }
    if field_path:
        ref["fieldPath"] = field_path
    return ref


class EventRecorder:
    """Records core/v1 Events about objects for ``component``.

    ``kind`` / ``api_version`` name objects that carry no type (list items);
    ``instance`` is the reporting instance (``host`` or the component when unset).
    """

    max_queued = 1000
    #: writes in flight at once
    writers = 4

    def __init__(self, client: Client, component: str, *, host: str = "", instance: str = "",
                 kind: str = "", api_version: str = "") -> None:
        self.client = client
        self.component = component
        self.host = host
        self.instance = instance or host or component
        self.kind = kind
        self.api_version = api_version
        self.dropped = 0
        self._seen: dict[_Key, tuple[str, str, int]] = {}
        self._pending: collections.deque[tuple[_Key, dict[str, Any], str]] = collections.deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def event(self, obj: Obj, type_: str, reason: str, message: str, action: str = "", *,
              field_path: str = "") -> None:
        """Record an event about ``obj`` (``field_path``: the part of it the
        event is about, as ``spec.containers{name}``)."""
        self._record(obj, None, type_, reason, action, message, field_path)

    def eventf(self, regarding: Obj, related: Obj | None, type_: str, reason: str, action: str,
               message: str) -> None:
        """Record an event about ``regarding`` caused by ``related`` (upstream's ``Eventf``)."""
        self._record(regarding, related, type_, reason, action, message)

    def _record(self, obj: Obj, related: Obj | None, type_: str, reason: str, action: str, message: str,
                field_path: str = "") -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop, nothing could write it
        md = obj.get("metadata") or {}
        if len(self._pending) >= self.max_queued:
            self.dropped += 1
            log.debug("%s: event queue full, dropping %s event for %s", self.component, reason, md.get("name"))
            return
        now = now_text()
        ev: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Event",
            # As upstream's recorder: the object's name and the time in nanoseconds, in hex.
            "metadata": {"name": f"{md.get('name') or 'unknown'}.{time.time_ns():x}",
                         "namespace": md.get("namespace") or "default"},
            "involvedObject": _reference(obj, self.kind, self.api_version, field_path),
            "reason": reason, "message": message, "type": type_,
            "source": {"component": self.component, **({"host": self.host} if self.host else {})},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            "reportingComponent": self.component, "reportingInstance": self.instance,
        }
        if action:
            ev["action"] = action
        if related is not None:
            ev["related"] = _reference(related, self.kind, self.api_version)
        key = (md.get("uid") or md.get("name") or "", field_path, type_, reason, message)
        self._pending.append((key, ev, now))
        if len(self._tasks) < self.writers:
            self._spawn(loop)

    def _spawn(self, loop: asyncio.AbstractEventLoop) -> None:
        task = loop.create_task(self._write_all(), name=f"{self.component}-events")
        self._tasks.add(task)
        task.add_done_callback(self._writer_done)

    def _writer_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        # An event recorded while this writer was finishing found no free writer.
        if self._pending and not self._closed and len(self._tasks) < self.writers:
            self._spawn(task.get_loop())

    async def _write_all(self) -> None:
        while self._pending:
            key, ev, now = self._pending.popleft()
            try:
                await self._write(key, ev, now)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - events are best effort
                log.warning("%s: could not record event %s for %s: %s", self.component, ev["reason"],
                            ev["involvedObject"]["name"], err)

    async def _write(self, key: _Key, ev: dict[str, Any], now: str) -> None:
        seen = self._seen.get(key)
        if seen is not None:
            name, ns, count = seen
            try:
                await self.client.patch(EVENTS, name, {"count": count + 1, "lastTimestamp": now}, ns)
                self._seen[key] = (name, ns, count + 1)
                return
            except StatusError as err:
                if err.code != 404:
                    raise
        namespace = ev["metadata"]["namespace"]
        await self.client.create(EVENTS, ev, namespace)
        if len(self._seen) > 4096:
            self._seen.clear()
        self._seen[key] = (ev["metadata"]["name"], namespace, 1)

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued event is written; False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while self._tasks:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            _, pending = await asyncio.wait(set(self._tasks), timeout=remaining)
            if pending:
                return False
            await asyncio.sleep(0)  # let done callbacks start writers for late events
        return True

    async def close(self, timeout: float = 5.0) -> None:
        """Write what is queued (for at most ``timeout`` seconds), then stop."""
        if not await self.flush(timeout):
            log.debug("%s: %d events not written at shutdown", self.component, len(self._pending))
        self._closed = True
        self._pending.clear()
        await cancel_and_wait(set(self._tasks), "event writer")
