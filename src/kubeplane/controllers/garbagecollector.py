"""The garbage collector, after upstream's ``pkg/controller/garbagecollector``.

Informers on every resource that can own or depend on another keep a graph
of ``uid -> node`` (identity, ownerReferences) and ``owner uid -> dependent
uids``. Two queues of uids:

* attempt-to-delete: a dependent whose owners may all be gone is deleted
  (with the policy its own finalizers ask for, Background otherwise); an
  owner being deleted in the foreground (finalizer ``foregroundDeletion``)
  has its blocking dependents deleted first, then loses the finalizer;
* attempt-to-orphan: an owner deleted with the ``orphan`` finalizer has its
  ownerReferences stripped from every dependent, then loses the finalizer.

Owners missing from the graph are looked up live before anything is deleted.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Iterable

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import deep_copy
from kubeplane.api.resources import CATALOGUE, ResourceInfo, resource
from kubeplane.client.discovery import ServedResources, is_custom, served_resources
from kubeplane.client.informer import SharedInformerFactory, unwrap_deleted
from kubeplane.client.interface import Client, Obj
from kubeplane.controllers.base import Controller

log = logging.getLogger(__name__)

FOREGROUND = "foregroundDeletion"
ORPHAN = "orphan"

#: Resources watched by default: what can own or be owned in the catalogue.
DEFAULT_RESOURCES: tuple[str, ...] = (
    "pods", "replicasets", "deployments", "jobs", "resourceclaims", "configmaps", "secrets", "services",
    "persistentvolumeclaims", "cronjobs", "replicationcontrollers", "statefulsets", "daemonsets",
    "controllerrevisions", "endpointslices",
)


@dataclass
class Node:
    """One object in the ownership graph."""

    res: ResourceInfo
    namespace: str | None
    name: str
    uid: str
    owners: list[Obj] = field(default_factory=list)
    finalizers: list[str] = field(default_factory=list)
    deleting: bool = False

    @property
    def deleting_dependents(self) -> bool:
        return self.deleting and FOREGROUND in self.finalizers

    @property
    def orphaning(self) -> bool:
        return self.deleting and ORPHAN in self.finalizers


class GarbageCollector(Controller):
    """Cascading deletion through ownerReferences."""

    def __init__(
        self,
        client: Client,
        factory: SharedInformerFactory | None = None,
        *,
        resources: Iterable[ResourceInfo] | None = None,
        workers: int = 1,
        name: str = "garbage-collector-controller",
    ) -> None:
        super().__init__(name, client, factory, workers=workers)
        self.resources = list(resources) if resources is not None else [resource(r) for r in DEFAULT_RESOURCES]
        self.nodes: dict[str, Node] = {}
        self.dependents: dict[str, set[str]] = {}
        self.attempt_to_delete = self.add_queue("delete", self.attempt_delete)
        self.attempt_to_orphan = self.add_queue("orphan", self.attempt_orphan)
        for res in self.resources:
            inf = self.factory.informer_for(res)
            self._handle(inf, res)
        #: the served resources (the registry's catalogue in process, discovery
        #: over HTTP and the wire): custom resources are watched from the
        #: moment they are served until they go, as upstream's monitors
        self._catalogue = served_resources(client) if resources is None else None
        self._watched = {r.key for r in self.resources}
        self._custom: dict[tuple[str, str], Any] = {}
        self._unsubscribe: Any = None

    def _handle(self, inf: Any, res: ResourceInfo) -> None:
        inf.add_event_handler(
            lambda obj, res=res: self._observe(res, obj),
            lambda old, new, res=res: self._observe(res, new),
            lambda obj, res=res: self._forget(unwrap_deleted(obj)),
        )

    async def start(self, sync_timeout: float | None = 30.0) -> None:
        await super().start(sync_timeout)
        if self._catalogue is not None and self._unsubscribe is None:
            self._unsubscribe = self._catalogue.subscribe(self._custom_changed)
            if isinstance(self._catalogue, ServedResources):
                await self._catalogue.start()
            self._custom_changed()

    async def stop(self, timeout: float = 5.0) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if isinstance(self._catalogue, ServedResources):
            await self._catalogue.stop()
        informers, self._custom = list(self._custom.values()), {}
        for inf in informers:
            await inf.stop()
        await super().stop(timeout)

    def _custom_changed(self) -> None:
        """Watch the custom resources now served (one version of each), stop
        watching those no longer served."""
        from kubeplane.client.informer import SharedInformer

        served: dict[tuple[str, str], ResourceInfo] = {}
        for r in self._catalogue.resources:
            # Upstream monitors what it can list, watch and delete.
            if (is_custom(r) and r.key not in served and r.key not in self._watched
                    and {"list", "watch", "delete"} <= set(r.verbs)):
                served[r.key] = r
        for key in [k for k in self._custom if k not in served]:
            asyncio.get_running_loop().create_task(self._custom.pop(key).stop())
        for key, res in served.items():
            if key in self._custom:
                continue
            inf = SharedInformer(self.client, res, None, None, None, 0)
            self._handle(inf, res)
            self._custom[key] = inf
            inf.start()

    # ---------------------------------------------------------------- graph

    def _observe(self, res: ResourceInfo, obj: Obj) -> None:
        md = obj.get("metadata") or {}
        uid = md.get("uid")
        if not uid:
            return
        owners = list(md.get("ownerReferences") or [])
        node = self.nodes.get(uid)
        was_deleting_deps = node is not None and node.deleting_dependents
        was_orphaning = node is not None and node.orphaning
        old_owners = node.owners if node is not None else []
        if node is None:
            node = Node(res, md.get("namespace") if res.namespaced else None, md.get("name", ""), uid)
            self.nodes[uid] = node
        node.owners = owners
        node.finalizers = list(md.get("finalizers") or [])
        node.deleting = bool(md.get("deletionTimestamp"))
        old_uids = {r.get("uid") for r in old_owners}
        new_uids = {r.get("uid") for r in owners}
        for gone in old_uids - new_uids:
            self._unlink(gone, uid)
        for added in new_uids - old_uids:
            if added:
                self.dependents.setdefault(added, set()).add(uid)
        # An owner waiting on this dependent may proceed when the reference
        # goes away or stops blocking.
        blocking_before = {r.get("uid") for r in old_owners if r.get("blockOwnerDeletion")}
        blocking_now = {r.get("uid") for r in owners if r.get("blockOwnerDeletion")}
        for owner_uid in blocking_before - blocking_now:
            owner = self.nodes.get(owner_uid or "")
            if owner is not None and owner.deleting_dependents:
                self.attempt_to_delete.add(owner.uid)
        if owners and any(r.get("uid") not in self.nodes or self.nodes[r["uid"]].deleting for r in owners):
            self.attempt_to_delete.add(uid)
        if node.orphaning and not was_orphaning:
            self.attempt_to_orphan.add(uid)
        if node.deleting_dependents and not was_deleting_deps:
            for dep in self.dependents.get(uid, ()):
                self.attempt_to_delete.add(dep)
            self.attempt_to_delete.add(uid)

    def _unlink(self, owner_uid: str | None, dep_uid: str) -> None:
        deps = self.dependents.get(owner_uid or "")
        if deps is not None:
            deps.discard(dep_uid)
            if not deps:
                del self.dependents[owner_uid or ""]

    def _forget(self, obj: Obj) -> None:
        uid = (obj.get("metadata") or {}).get("uid")
        node = self.nodes.pop(uid or "", None)
        if node is None:
            return
        for ref in node.owners:
            self._unlink(ref.get("uid"), node.uid)
            owner = self.nodes.get(ref.get("uid") or "")
            if owner is not None and owner.deleting_dependents:
                self.attempt_to_delete.add(owner.uid)
        for dep in self.dependents.get(node.uid, ()):
            self.attempt_to_delete.add(dep)

    def blocking_dependents(self, owner_uid: str) -> list[Node]:
        out: list[Node] = []
        for dep_uid in self.dependents.get(owner_uid, ()):
            dep = self.nodes.get(dep_uid)
            if dep is None:
                continue
            if any(r.get("uid") == owner_uid and r.get("blockOwnerDeletion") for r in dep.owners):
                out.append(dep)
        return out

    # ------------------------------------------------------------- deleting

    async def _get_live(self, node: Node) -> Obj | None:
        try:
            obj = await self.client.get(node.res, node.name, node.namespace)
        except StatusError as err:
            if err.code == 404:
                return None
            raise
        return obj if (obj.get("metadata") or {}).get("uid") == node.uid else None

    async def _owner_state(self, ref: Obj, namespace: str | None) -> str:
        """``solid``, ``dangling`` (gone) or ``waiting`` (foreground-deleting)."""
        owner = self.nodes.get(ref.get("uid") or "")
        if owner is not None:
            return "waiting" if owner.deleting_dependents else "solid"
        catalogue = self._catalogue or getattr(self.client, "catalogue", None) or CATALOGUE
        res = catalogue.by_api_version_kind(ref.get("apiVersion", ""), ref.get("kind", ""))
        if res is None:
            # Unknown kinds cannot be checked: never delete on their account.
            return "solid"
        try:
            live = await self.client.get(res, ref.get("name", ""), namespace if res.namespaced else None)
        except StatusError as err:
            if err.code == 404:
                return "dangling"
            raise
        md = live.get("metadata") or {}
        if md.get("uid") != ref.get("uid"):
            return "dangling"
        if md.get("deletionTimestamp") and FOREGROUND in (md.get("finalizers") or []):
            return "waiting"
        return "solid"

    async def attempt_delete(self, uid: str) -> None:
        node = self.nodes.get(uid)
        if node is None:
            return
        latest = await self._get_live(node)
        if latest is None:
            return
        md = latest.get("metadata") or {}
        finalizers = md.get("finalizers") or []
        if md.get("deletionTimestamp"):
            if FOREGROUND in finalizers:
                await self._process_deleting_dependents(node)
            return
        refs = md.get("ownerReferences") or []
        if not refs:
            return
        states: dict[str, str] = {}
        for ref in refs:
            states[ref.get("uid", "")] = await self._owner_state(ref, node.namespace)
        solid = [r for r in refs if states[r.get("uid", "")] == "solid"]
        waiting = [r for r in refs if states[r.get("uid", "")] == "waiting"]
        if solid:
            if len(solid) == len(refs):
                return
            # Keep the object, drop references to owners that are gone or going.
            new = deep_copy(latest)
            new["metadata"]["ownerReferences"] = solid
            await self._write(node.res, new)
            return
        if waiting and self.dependents.get(uid):
            policy = "Foreground"
        elif ORPHAN in finalizers:
            policy = "Orphan"
        elif FOREGROUND in finalizers:
            policy = "Foreground"
        else:
            policy = "Background"
        try:
            await self.client.delete(node.res, node.name, node.namespace, propagation_policy=policy,
                                     preconditions={"uid": uid})
        except StatusError as err:
            if err.code not in (404, 409):
                raise

    async def _process_deleting_dependents(self, node: Node) -> None:
        blocking = self.blocking_dependents(node.uid)
        if not blocking:
            await self._remove_finalizer(node, FOREGROUND)
            return
        for dep in blocking:
            if not dep.deleting_dependents:
                self.attempt_to_delete.add(dep.uid)

    async def _remove_finalizer(self, node: Node, finalizer: str) -> None:
        latest = await self._get_live(node)
        if latest is None:
            return
        finalizers = (latest.get("metadata") or {}).get("finalizers") or []
        if finalizer not in finalizers:
            return
        latest["metadata"]["finalizers"] = [f for f in finalizers if f != finalizer]
        await self._write(node.res, latest)

    async def _write(self, res: ResourceInfo, obj: Obj) -> None:
        try:
            await self.client.update(res, obj)
        except StatusError as err:
            if err.code != 404:
                raise

    # ------------------------------------------------------------ orphaning

    async def attempt_orphan(self, uid: str) -> None:
        node = self.nodes.get(uid)
        if node is None:
            return
        for dep_uid in list(self.dependents.get(uid, ())):
            dep = self.nodes.get(dep_uid)
            if dep is None:
                continue
            latest = await self._get_live(dep)
            if latest is None:
                continue
            refs = (latest.get("metadata") or {}).get("ownerReferences") or []
            kept = [r for r in refs if r.get("uid") != uid]
            if len(kept) == len(refs):
                continue
            if kept:
                latest["metadata"]["ownerReferences"] = kept
            else:
                latest["metadata"].pop("ownerReferences", None)
            await self._write(dep.res, latest)
        await self._remove_finalizer(node, ORPHAN)


__all__ = ["DEFAULT_RESOURCES", "FOREGROUND", "GarbageCollector", "Node", "ORPHAN"]
