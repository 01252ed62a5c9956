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
from kubeplane.api.meta import now_text
from kubeplane.client.discovery import ServedResources, served_resources
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


DISCOVERY_FAILURE = "NamespaceDeletionDiscoveryFailure"
GV_PARSING_FAILURE = "NamespaceDeletionGroupVersionParsingFailure"
CONTENT_FAILURE = "NamespaceDeletionContentFailure"
CONTENT_REMAINING = "NamespaceContentRemaining"
FINALIZERS_REMAINING = "NamespaceFinalizersRemaining"
#: upstream's namespace deletion conditions, in its order, each with its
#: healthy reason and message
CONDITIONS: tuple[tuple[str, str, str], ...] = (
    (DISCOVERY_FAILURE, "ResourcesDiscovered", "All resources successfully discovered"),
    (GV_PARSING_FAILURE, "ParsedGroupVersions", "All legacy kube types successfully parsed"),
    (CONTENT_FAILURE, "ContentDeleted", "All content successfully deleted, may be waiting on finalization"),
    (CONTENT_REMAINING, "ContentRemoved", "All content successfully removed"),
    (FINALIZERS_REMAINING, "ContentHasNoFinalizers", "All content-preserving finalizers finished"),
)


def _condition(typ: str, status: str, reason: str, message: str) -> Obj:
    return {"type": typ, "status": status, "lastTransitionTime": now_text(), "reason": reason,
            "message": message}


def _aggregate(messages: list[str]) -> str:
    """Several errors as upstream's aggregate prints them."""
    return messages[0] if len(messages) == 1 else "[" + ", ".join(messages) + "]"


def _merge_conditions(current: list[Obj], given: list[Obj]) -> bool:
    """Brings ``current`` (modified in place) to ``given`` plus the healthy
    state of the others; True when something changed."""
    changed = False
    by_type = {c.get("type"): c for c in given}
    for typ, reason, message in CONDITIONS:
        new = by_type.get(typ) or _condition(typ, "False", reason, message)
        old = next((c for c in current if c.get("type") == typ), None)
        if old is None:
            current.append(new)
            changed = True
        elif (old.get("status"), old.get("reason"), old.get("message")) != (
                new["status"], new["reason"], new["message"]):
            old.update(new)
            changed = True
    return changed


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
        #: the served resources, custom ones included: the registry's catalogue
        #: in process, discovery (re-read at each sync, as upstream) otherwise
        self._catalogue = served_resources(client) or CATALOGUE
        self.namespaces = self.factory.informer_for(NAMESPACES)
        self.work = self.add_queue("namespace", self.sync, base_delay=retry_seconds, max_delay=retry_max_seconds)
        self.namespaces.add_event_handler(self._enqueue, lambda _old, new: self._enqueue(new), None)

    @property
    def resources(self) -> list[ResourceInfo]:
        """The namespaced resources to empty a namespace of: one version of
        each that can be listed and deleted (upstream's deletable resources)."""
        if self._fixed is not None:
            return self._fixed
        seen: set[tuple[str, str]] = set()
        out = []
        for r in self._catalogue.resources:
            if r.namespaced and r.key not in seen and {"list", "delete"} <= set(r.verbs):
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
        conditions: list[Obj] = []
        if isinstance(self._catalogue, ServedResources):
            try:
                await self._catalogue.refresh()
            except StatusError as err:
                # As upstream: carry on with what is known, and say so.
                conditions.append(_condition(DISCOVERY_FAILURE, "True", "DiscoveryFailed",
                                             f"Discovery failed for some groups, 1 failing: {err}"))
        remaining: dict[str, int] = {}
        finalizers: dict[str, int] = {}
        failures: list[str] = []
        for res in self.resources:
            try:
                left = await self._delete_content(res, name)
            except StatusError as err:
                failures.append(str(err))
                continue
            if left:
                remaining[f"{res.plural}.{res.group}"] = len(left)
                for obj in left:
                    for f in (obj.get("metadata") or {}).get("finalizers") or ():
                        finalizers[f] = finalizers.get(f, 0) + 1
        if failures:
            conditions.append(_condition(CONTENT_FAILURE, "True", "ContentDeletionFailed",
                                         f"Failed to delete all resource types, {len(failures)} remaining: "
                                         + _aggregate(failures)))
        if remaining:
            conditions.append(_condition(CONTENT_REMAINING, "True", "SomeResourcesRemain",
                                         "Some resources are remaining: " + ", ".join(
                                             f"{k} has {n} resource instances" for k, n in sorted(remaining.items()))))
        if finalizers:
            conditions.append(_condition(FINALIZERS_REMAINING, "True", "SomeFinalizersRemain",
                                         "Some content in the namespace has finalizers remaining: " + ", ".join(
                                             f"{f} in {n} resource instances" for f, n in sorted(finalizers.items()))))
        ns = await self._set_conditions(ns, conditions)
        if ns is None:
            return
        if failures:
            raise RetryLater(f"deleting the content of namespace {name} failed: {_aggregate(failures)}")
        if remaining:
            raise ContentRemaining(name, sum(remaining.values()))
        await self._finalize(ns)

    async def _delete_content(self, res: ResourceInfo, namespace: str) -> list[Obj]:
        """Deletes every ``res`` in ``namespace`` (one deletecollection where the
        resource serves it, as upstream; else one by one); returns what remains."""
        collection = getattr(self.client, "delete_collection", None)
        if "deletecollection" in res.verbs and collection is not None:
            # At once, as kubeplane's API server has always emptied
            # namespaces (with the API server alone no node ends pods).
            # background propagation, as upstream's deleter (a Job's own default would orphan)
            await collection(res, namespace, grace_period_seconds=0, propagation_policy="Background")
            return list((await self.client.list(res, namespace)).get("items") or ())
        listed = await self.client.list(res, namespace)
        lingering = False
        for obj in listed.get("items") or ():
            md = obj.get("metadata") or {}
            try:
                out = await self.client.delete(res, md.get("name", ""), namespace, grace_period_seconds=0,
                                               propagation_policy="Background")
            except StatusError as err:
                if err.code == 404:
                    continue
                raise
            lingering = lingering or out.get("kind") != "Status"
        if not lingering:
            return []
        # Some answer was not a plain Success: see what is still there.
        return list((await self.client.list(res, namespace)).get("items") or ())

    async def _set_conditions(self, ns: Obj, conditions: list[Obj]) -> Obj | None:
        """Writes the deletion conditions into the namespace's status when they
        changed (upstream's updateConditions: every one of the five, those not
        given in their healthy state; lastTransitionTime moves on change only);
        returns the namespace as it now is (None once it is gone)."""
        for _ in range(10):
            new = deep_copy(ns)
            status = new.get("status") if isinstance(new.get("status"), dict) else {}
            current = [c for c in status.get("conditions") or () if isinstance(c, dict)]
            if not _merge_conditions(current, conditions):
                return ns
            new["status"] = {**status, "conditions": current}
            try:
                return await self.client.update(NAMESPACES, new, subresource="status")
            except StatusError as err:
                if err.code == 404:
                    return None
                if err.code != 409:
                    raise
            fresh = await self._terminating((ns.get("metadata") or {}).get("name", ""))
            if fresh is None:
                return None
            ns = fresh
        raise RetryLater("updating the namespace's conditions kept conflicting")

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
