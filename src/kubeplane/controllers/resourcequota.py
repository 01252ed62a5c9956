"""The resource quota controller, after upstream's ``pkg/controller/resourcequota``.

One queue of ResourceQuota keys (``namespace/name``). A sync sets
``status.hard`` to ``spec.hard`` and recounts ``status.used`` for every
resource the quota limits from the informers' objects in its namespace (the
same evaluators as the ResourceQuota admission: :mod:`kubeplane.api.quota`),
writing the status only when it changed.

A quota is synced when it is created or its spec changes, every
``resync_period`` seconds (kube-controller-manager's
``--resource-quota-sync-period``, 5 minutes), and, as upstream's
replenishment, when an object it counts is deleted or stops counting (a pod
that finished): every quota of the namespace that limits a resource of that
kind is queued. Object counts of other kinds (``count/deployments.apps``,
custom resources too) are kept by an informer per kind, started when a quota
first names it.
"""

from __future__ import annotations

import datetime as _dt
import logging
from typing import Any, Callable

from kubeplane.api import quota as q
from kubeplane.api.meta import utcnow
from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, ResourceInfo, resource
from kubeplane.client.discovery import ServedResources, served_resources
from kubeplane.client.informer import SharedInformer, SharedInformerFactory, meta_namespace_key, unwrap_deleted
from kubeplane.client.interface import Client, Obj
from kubeplane.controllers.base import Controller, RetryLater
from kubeplane.controllers.replicaset import NAMESPACE_INDEX, add_indexers, namespace_index

log = logging.getLogger(__name__)

RESOURCE_QUOTAS = resource("resourcequotas")
PODS = resource("pods")
SERVICES = resource("services")
PVCS = resource("persistentvolumeclaims")

#: kube-controller-manager's --resource-quota-sync-period
DEFAULT_RESYNC_PERIOD = 300.0


def _hard(rq: Obj) -> dict[str, Any]:
    hard = (rq.get("spec") or {}).get("hard")
    return hard if isinstance(hard, dict) else {}


class ResourceQuotaController(Controller):
    """Keeps every ResourceQuota's ``status`` (hard, used) current."""

    def __init__(self, client: Client, factory: SharedInformerFactory | None = None, *,
                 resync_period: float = DEFAULT_RESYNC_PERIOD,
                 clock: Callable[[], _dt.datetime] = utcnow, workers: int = 1,
                 name: str = "resourcequota-controller") -> None:
        super().__init__(name, client, factory, workers=workers)
        self.resync_period = resync_period
        self.clock = clock
        #: what the server serves, custom resources included (for ``count/<plural>.<group>``)
        self.served = served_resources(client) or CATALOGUE
        self.quotas = self.factory.informer_for(RESOURCE_QUOTAS)
        add_indexers(self.quotas, {NAMESPACE_INDEX: namespace_index})
        self.queue_ = self.add_queue("resourcequotas", self.sync)
        self.quotas.add_event_handler(self._quota_added, self._quota_updated, self._quota_deleted)
        #: (group, plural) -> the informer counting that kind
        self._counted: dict[tuple[str, str], SharedInformer] = {}
        for res in (PODS, SERVICES, PVCS):
            self._watch_kind(res)

    # ------------------------------------------------------------- handlers

    def _quota_added(self, rq: Obj) -> None:
        self.queue_.add(meta_namespace_key(rq))

    def _quota_updated(self, old: Obj, new: Obj) -> None:
        # as upstream, only a change of spec.hard queues the quota: status
        # changes are this controller's own (or the admission's charges), and
        # anything else waits for the periodic resync
        if not q.equal_values(q.parse_list(_hard(old)), q.parse_list(_hard(new))):
            self.queue_.add(meta_namespace_key(new))

    def _quota_deleted(self, rq: Obj) -> None:
        pass

    def _watch_kind(self, res: ResourceInfo) -> SharedInformer:
        inf = self._counted.get(res.key)
        if inf is None:
            inf = self._counted[res.key] = self.factory.informer_for(res)
            add_indexers(inf, {NAMESPACE_INDEX: namespace_index})
            ev = q.evaluator_for(res.group, res.plural)
            inf.add_event_handler(None, lambda old, new: self._object_updated(ev, old, new),
                                  lambda obj: self._replenish(ev, unwrap_deleted(obj)))
            if self.running:
                inf.start()
        return inf

    def _object_updated(self, ev: q.Evaluator, old: Obj, new: Obj) -> None:
        """Replenish when an update frees what the object used: a pod that
        finished, a Service of another type (upstream's replenishment filters)."""
        if ev.group:
            return
        if ev.plural == "pods":
            now = self.clock()
            if q.pod_counts(old, now) and not q.pod_counts(new, now):
                self._replenish(ev, new)
        elif ev.plural == "services":
            if (old.get("spec") or {}).get("type") != (new.get("spec") or {}).get("type"):
                self._replenish(ev, new)

    def _replenish(self, ev: q.Evaluator, obj: Any) -> None:
        if not isinstance(obj, dict):
            return
        namespace = (obj.get("metadata") or {}).get("namespace") or ""
        for rq in self.quotas.indexer.by_index(NAMESPACE_INDEX, namespace):
            if ev.matching_resources(_hard(rq)):
                self.queue_.add(meta_namespace_key(rq))

    async def start(self, sync_timeout: float | None = 30.0) -> None:
        await super().start(sync_timeout)
        for rq in self.quotas.indexer.list():
            self.queue_.add(meta_namespace_key(rq))

    # ----------------------------------------------------------------- sync

    def _lookup(self, group: str, plural: str) -> ResourceInfo | None:
        for r in self.served.resources:
            if r.key == (group, plural) and r.namespaced and "list" in r.verbs and "watch" in r.verbs:
                return r
        return None

    async def _kind_for(self, group: str, plural: str) -> ResourceInfo | None:
        """The served resource a quota counts (discovery read again when it names one not known yet)."""
        r = self._lookup(group, plural)
        if r is None and isinstance(self.served, ServedResources):
            try:
                await self.served.refresh()
            except StatusError as err:
                log.info("discovery failed: %s", err)
            r = self._lookup(group, plural)
        return r

    async def _objects(self, res: ResourceInfo, namespace: str) -> list[Obj] | None:
        inf = self._watch_kind(res)
        if not inf.has_synced():
            inf.start()
            if not await inf.wait_for_sync(10.0):
                raise RetryLater(f"the {res.qualified} informer has not synced")
        return inf.indexer.by_index(NAMESPACE_INDEX, namespace)

    async def usage(self, rq: Obj) -> q.ResourceList:
        """The quota's usage of every resource it limits (upstream's CalculateUsage)."""
        namespace = (rq.get("metadata") or {}).get("namespace") or ""
        names = set(_hard(rq))
        now = self.clock()
        kinds: dict[tuple[str, str], q.Evaluator] = {}
        for key in ((PODS.group, PODS.plural), (SERVICES.group, SERVICES.plural), (PVCS.group, PVCS.plural)):
            kinds[key] = q.evaluator_for(*key)
        for name in names:
            kind = q.resource_of_count(name)
            if kind is not None and kind not in kinds:
                kinds[kind] = q.evaluator_for(*kind)
        used: q.ResourceList = {}
        for (group, plural), ev in kinds.items():
            matched = ev.matching_resources(names)
            if not matched:
                continue
            res = await self._kind_for(group, plural)
            if res is None:
                continue  # nothing served of that name is counted
            objects = await self._objects(res, namespace)
            used = q.add(used, q.usage_stats(ev, rq, objects or [], matched, now))
        return q.mask(used, names)

    async def sync(self, key: str) -> None:
        rq = self.quotas.indexer.get_by_key(key)
        if rq is None:
            return
        status = rq.get("status") or {}
        hard_raw = _hard(rq)
        hard = q.parse_list(hard_raw)
        used = q.parse_list(status.get("used"))
        used.update(await self.usage(rq))
        used = q.mask(used, hard)
        # hard and used are left out when empty, as upstream serialises them
        new_status = {k: v for k, v in (("hard", q.to_raw(hard)), ("used", q.to_raw(used))) if v}
        old_hard = q.parse_list(status.get("hard"))
        dirty = (not q.equal_values(hard, old_hard) or "hard" not in status or "used" not in status
                 or not q.equal_values(used, q.parse_list(status.get("used"))))
        if dirty and new_status != status:
            obj = {**rq, "status": new_status}
            await self.client.update(RESOURCE_QUOTAS, obj, subresource="status")
        if self.resync_period > 0:
            self.queue_.add_after(key, self.resync_period)


__all__ = ["DEFAULT_RESYNC_PERIOD", "ResourceQuotaController"]
