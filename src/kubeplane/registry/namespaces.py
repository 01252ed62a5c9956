"""The namespace finalizer the API server runs on its own (as kubeplane's
users and tests expect namespaces to finish deleting with only the API server
running): once a namespace is terminating, delete everything in it, wait for
the last object (watching the store), then drop the ``kubernetes`` finalizer
and the namespace. Namespaces left terminating by a restart resume with
:meth:`NamespaceFinalizer.resume_namespace_finalization`."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import deep_copy
from kubeplane.api.resources import resource
from kubeplane.registry.retries import Retries
from kubeplane.storage.interface import CompactedError, KeyNotFoundError, RevisionConflictError

if TYPE_CHECKING:
    from kubeplane.api.resources import Catalogue
    from kubeplane.runtime import KeyedTurns
    from kubeplane.storage.interface import Store

Obj = dict[str, Any]

log = logging.getLogger("kubeplane.registry")

NAMESPACES = resource("namespaces")

#: every key the registry stores starts with this
STORAGE_ROOT = "/registry/"
#: while content lingers, count it again after this long without a delete
#: in the namespace (doubling up to the maximum)
NAMESPACE_RECHECK_SECONDS = 1.0
NAMESPACE_RECHECK_MAX_SECONDS = 30.0


class NamespaceFinalizer:
    """The namespace finalizer of :class:`~kubeplane.registry.registry.Registry`
    (which provides the store, the catalogue, delete, the per-key turns and
    the background task set)."""

    store: "Store"
    catalogue: "Catalogue"
    _turns: "KeyedTurns"
    _retry_seconds: float
    _finalizing: set[str]

    async def resume_namespace_finalization(self) -> None:
        """Finishes deleting the namespaces left terminating (by a restart
        while their contents were being deleted)."""
        for kv in (await self.store.list(NAMESPACES.storage_prefix())).items:
            md = kv.value.get("metadata") or {}
            if md.get("deletionTimestamp"):
                self._start_finalizing(md["name"])

    def _start_finalizing(self, name: str) -> None:
        """Runs :meth:`_finalize_namespace` unless it is already running."""
        if name not in self._finalizing:
            self._finalizing.add(name)
            self._spawn(self._finalize_namespace(name))

    async def _finalize_namespace(self, name: str) -> None:
        """The namespace controller's job: delete everything in the namespace,
        then drop the ``kubernetes`` finalizer and the namespace itself."""
        try:
            await self._empty_namespace(name)
            key = NAMESPACES.storage_key(name)
            await self._turns.acquire(key)
            try:
                await self._drop_namespace(key)
            finally:
                self._turns.release(key)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a background task: report, never lose silently
            log.exception("finalizing namespace %s failed", name)
        finally:
            self._finalizing.discard(name)

    async def _empty_namespace(self, name: str) -> None:
        prefixes = [res.storage_prefix(name) for res in self.catalogue.resources if res.namespaced]
        for res in self.catalogue.resources:
            if not res.namespaced:
                continue
            result = await self.store.list(res.storage_prefix(name))
            for kv in result.items:
                try:
                    await self.delete(res, kv.value["metadata"]["name"], name, grace_period_seconds=0)
                except StatusError:
                    pass
        # Objects with finalizers linger until their controllers let go: wait
        # for the last of them by watching the store, not by polling.
        await self._wait_until_empty(name, prefixes)

    async def _drop_namespace(self, key: str) -> None:
        retries = Retries(self._retry_seconds)
        kv = await self.store.get(key)
        # Only a terminating namespace: one created again under the name stays.
        while kv is not None and (kv.value.get("metadata") or {}).get("deletionTimestamp"):
            spec_finalizers = [f for f in ((kv.value.get("spec") or {}).get("finalizers") or []) if f != "kubernetes"]
            try:
                if spec_finalizers or (kv.value.get("metadata") or {}).get("finalizers"):
                    new = deep_copy(kv.value)
                    new.setdefault("spec", {})["finalizers"] = spec_finalizers
                    new["metadata"].pop("resourceVersion", None)
                    await self.store.update(key, new, expected_revision=kv.mod_revision)
                else:
                    await self.store.delete(key, expected_revision=kv.mod_revision)
                return
            except RevisionConflictError as exc:
                kv = exc.current
            except KeyNotFoundError:
                return
            await retries.again()

    async def _wait_until_empty(self, name: str, prefixes: list[str]) -> None:
        """Return once nothing is stored under ``prefixes`` (the namespace's
        content): count, then sleep on a store watch until a delete under one
        of them arrives (or a while passes, then count again)."""
        recheck = NAMESPACE_RECHECK_SECONDS
        while True:
            revision = self.store.revision
            if not await self._namespace_content_left(prefixes):
                return
            try:
                watch = self.store.watch(STORAGE_ROOT, revision)
            except CompactedError:
                continue  # the store moved on while counting: count again
            try:
                await self._next_delete_under(watch, tuple(prefixes), recheck)
            finally:
                watch.close()
            recheck = min(recheck * 2, NAMESPACE_RECHECK_MAX_SECONDS)

    async def _namespace_content_left(self, prefixes: list[str]) -> bool:
        for prefix in prefixes:
            if (await self.store.list(prefix, limit=1)).items:
                return True
        return False

    @staticmethod
    async def _next_delete_under(watch, prefixes: tuple[str, ...], timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            left = deadline - loop.time()
            if left <= 0:
                return
            try:
                events = await watch.next_batch(left)
            except CompactedError:
                return
            if events is None:
                return
            if any(ev.type == "DELETED" and ev.key.startswith(prefixes) for ev in events):
                return
