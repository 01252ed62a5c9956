"""The namespace controller, after upstream's ``pkg/controller/namespace``.

A namespace being deleted (a deletionTimestamp, and the ``kubernetes``
finalizer still in spec.finalizers) is emptied through the API: every
namespaced resource of the catalogue is listed in it and each object deleted
(as upstream's namespaced-resources deleter does where deletecollection is
not used). While something remains (objects held by their own finalizers)
the sync fails with "some content remains" and the work queue retries it
with a rate-limited backoff. Once nothing is left, the ``kubernetes``
finalizer is dropped through ``namespaces/{name}/finalize`` and the registry
deletes the namespace when no finalizer is left.

Namespaces left terminating by a restart are in the informer's initial list,
so they are picked up like any other.
"""

from __future__ import annotations

import logging
from typing import Iterable

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import deep_copy
from kubeplane.api.resources import CATALOGUE, ResourceInfo, resource
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.interface import Client, Obj
from kubeplane.controllers.base import Controller, RetryLater

log = logging.getLogger(__name__)

NAMESPACES = resource("namespaces")
#: the finalizer this controller owns in a namespace's spec.finalizers
FINALIZER = "kubernetes"
#: first retry of a namespace whose content remains, doubling up to the maximum
#: (upstream retries at least every minute; kubeplane's API server rechecked
#: lingering content at least every 30 s, which this keeps)
RETRY_SECONDS = 1.0
RETRY_MAX_SECONDS = 30.0


class ContentRemaining(RetryLater):
    """Objects are still in the namespace (e.g. held by their finalizers)."""

    def __init__(self, namespace: str, remaining: int) -> None:
        super().__init__(f"some content remains in namespace {namespace}: {remaining} object(s)")
        self.remaining = remaining


def _deleting(ns: Obj) -> bool:
    md = ns.get("metadata") or {}
    spec = ns.get("spec") if isinstance(ns.get("spec"), dict) else {}
    return bool(md.get("deletionTimestamp")) and FINALIZER in (spec.get("finalizers") or ())


class NamespaceController(Controller):
    """Empties terminating namespaces and finalizes them."""

    def __init__(
        self,
        client: Client,
        factory: SharedInformerFactory | None = None,
        *,
        resources: Iterable[ResourceInfo] | None = None,
        retry_seconds: float = RETRY_SECONDS,
        retry_max_seconds: float = RETRY_MAX_SECONDS,
        workers: int = 2,
        name: str = "namespace-controller",
    ) -> None:
        super().__init__(name, client, factory, workers=workers)
        self._fixed = [r for r in resources if r.namespaced] if resources is not None else None
        #: the served resources, custom ones included, when the client knows them
        self._catalogue = getattr(client, "catalogue", None) or CATALOGUE
        self.namespaces = self.factory.informer_for(NAMESPACES)
        self.work = self.add_queue("namespace", self.sync, base_delay=retry_seconds, max_delay=retry_max_seconds)
        self.namespaces.add_event_handler(self._enqueue, lambda _old, new: self._enqueue(new), None)

    @property
    def resources(self) -> list[ResourceInfo]:
        """The namespaced resources to empty a namespace of: one version of each."""
        if self._fixed is not None:
            return self._fixed
        seen: set[tuple[str, str]] = set()
        out = []
        for r in self._catalogue.resources:
            if r.namespaced and r.key not in seen:
                seen.add(r.key)
                out.append(r)
        return out

    def _enqueue(self, ns: Obj) -> None:
        if _deleting(ns):
            self.work.add((ns.get("metadata") or {}).get("name", ""))

    async def _terminating(self, name: str) -> Obj | None:
        """The namespace while it is being deleted; None once it is gone or not deleting."""
        try:
            ns = await self.client.get(NAMESPACES, name)
        except StatusError as err:
            if err.code == 404:
                return None
            raise
        return ns if _deleting(ns) else None

    async def sync(self, name: str) -> None:
        ns = await self._terminating(name)
        if ns is None:
            return
        remaining = 0
        for res in self.resources:
            remaining += await self._delete_content(res, name)
        if remaining:
            raise ContentRemaining(name, remaining)
        await self._finalize(ns)

    async def _delete_content(self, res: ResourceInfo, namespace: str) -> int:
        """Deletes every ``res`` in ``namespace``; returns how many remain."""
        listed = await self.client.list(res, namespace)
        lingering = False
        for obj in listed.get("items") or ():
            md = obj.get("metadata") or {}
            try:
                # At once, as kubeplane's API server has always emptied
                # namespaces (with the API server alone no node ends pods).
                out = await self.client.delete(res, md.get("name", ""), namespace, grace_period_seconds=0)
            except StatusError as err:
                if err.code == 404:
                    continue
                raise
            lingering = lingering or out.get("kind") != "Status"
        if not lingering:
            return 0
        # Some answer was not a plain Success: count what is still there.
        return len((await self.client.list(res, namespace)).get("items") or ())

    async def _finalize(self, ns: Obj) -> None:
        """Drop this controller's finalizer through ``finalize``; a conflict is
        retried on the fresh namespace, as upstream's retryOnConflictError."""
        name = (ns.get("metadata") or {}).get("name", "")
        for _ in range(10):
            new = deep_copy(ns)
            spec = new.get("spec") if isinstance(new.get("spec"), dict) else {}
            new["spec"] = {**spec, "finalizers": [f for f in spec.get("finalizers") or () if f != FINALIZER]}
            try:
                await self.client.update(NAMESPACES, new, subresource="finalize")
                return
            except StatusError as err:
                if err.code == 404:
                    return
                if err.code != 409:
                    raise
            fresh = await self._terminating(name)
            if fresh is None:
                return
            ns = fresh
        raise RetryLater(f"finalizing namespace {name} kept conflicting")


__all__ = ["ContentRemaining", "FINALIZER", "NamespaceController"]
