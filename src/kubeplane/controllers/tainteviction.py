"""Taint-based eviction, after upstream's ``pkg/controller/tainteviction``.

A pod bound to a node with NoExecute taints is deleted:

- at once, when it does not tolerate every one of them;
- after the smallest ``tolerationSeconds`` of the tolerations that match them,
  counted from when the controller saw the taint (a toleration without
  ``tolerationSeconds`` tolerates forever);
- never, when the taints go first or the pod's tolerations change to tolerate
  them forever (the scheduled deletion is cancelled).

Before the delete the pod gets the ``DisruptionTarget`` condition (reason
``DeletionByTaintManager``); ``TaintManagerEviction`` events say "Marking for
deletion Pod ns/name" and "Cancelling deletion of Pod ns/name". This is how
the pods of a node that stopped reporting go once the node lifecycle
controller has tainted it ``node.kubernetes.io/unreachable``, 300 seconds
later with the tolerations DefaultTolerationSeconds adds.

Time is read from ``clock`` (injectable); :meth:`TaintEvictionController.fire_due`
hands the deletions that are due by that clock to the workers at once.
"""

from __future__ import annotations

import datetime as _dt
import logging
from typing import Callable

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import deep_copy, utcnow
from kubeplane.api.resources import resource
from kubeplane.client.informer import SharedInformerFactory, meta_namespace_key, unwrap_deleted
from kubeplane.client.interface import Client, Obj
from kubeplane.controllers.base import Controller
from kubeplane.controllers.nodelifecycle import NODE_NAME_INDEX, pod_node_index
from kubeplane.registry.eviction import set_pod_condition

log = logging.getLogger(__name__)

PODS = resource("pods")
NODES = resource("nodes")

#: attempts at one deletion (upstream's retries)
RETRIES = 5


def tolerates(toleration: Obj, taint: Obj) -> bool:
    """upstream's Toleration.ToleratesTaint."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if key and key != taint.get("key"):
        return False
    if operator == "Exists":
        return True
    if operator == "Equal":
        return key != "" and (toleration.get("value") or "") == (taint.get("value") or "")
    return False


def matching_tolerations(taints: list[Obj], tolerations: list[Obj]) -> tuple[bool, list[Obj]]:
    """upstream's GetMatchingTolerations: whether every taint is tolerated, and
    the first toleration matching each."""
    if not taints:
        return True, []
    used = []
    for taint in taints:
        found = next((t for t in tolerations if isinstance(t, dict) and tolerates(t, taint)), None)
        if found is None:
            return False, []
        used.append(found)
    return True, used


def min_toleration_seconds(tolerations: list[Obj]) -> float:
    """The smallest tolerationSeconds (0 for none or one at most 0), -1 when they tolerate forever."""
    if not tolerations:
        return 0.0
    least: int | None = None
    for t in tolerations:
        secs = t.get("tolerationSeconds")
        if isinstance(secs, int) and not isinstance(secs, bool):
            if secs <= 0:
                return 0.0
            least = secs if least is None else min(least, secs)
    return -1.0 if least is None else float(least)


def no_execute_taints(node: Obj | None) -> list[Obj]:
    if not node:
        return []
    return [t for t in (node.get("spec") or {}).get("taints") or []
            if isinstance(t, dict) and t.get("effect") == "NoExecute"]


class TaintEvictionController(Controller):
    def __init__(self, client: Client, factory: SharedInformerFactory | None = None, *,
                 clock: Callable[[], _dt.datetime] = utcnow) -> None:
        super().__init__("taint-eviction-controller", client, factory)
        self.clock = clock
        #: node name -> its NoExecute taints
        self.tainted: dict[str, list[Obj]] = {}
        #: pod key -> (when the deletion was first scheduled, when it is due)
        self.scheduled: dict[str, tuple[_dt.datetime, _dt.datetime]] = {}
        self.pods = self.factory.informer_for(PODS)
        self.nodes = self.factory.informer_for(NODES)
        try:
            self.pods.add_indexers({NODE_NAME_INDEX: pod_node_index})
        except ValueError:
            pass
        self.nodes.add_event_handler(lambda n: self._node_changed(None, n), self._node_changed,
                                     lambda n: self._node_changed(n, None))
        self.pods.add_event_handler(lambda p: self._pod_changed(None, p), self._pod_changed,
                                    lambda p: self._pod_changed(p, None))
        self.add_queue("nodes", self.sync_node)
        self.add_queue("pods", self.sync_pod)
        self.add_queue("evictions", self.sync_eviction)

    # -- events ------------------------------------------------------------------

    def _node_changed(self, old: Obj | None, new: Obj | None) -> None:
        old, new = (unwrap_deleted(old) if old else None), (unwrap_deleted(new) if new else None)
        if old is not None and new is not None and no_execute_taints(old) == no_execute_taints(new):
            return
        node = new or old
        if isinstance(node, dict):
            self.queue("nodes").add((node.get("metadata") or {}).get("name", ""))

    def _pod_changed(self, old: Obj | None, new: Obj | None) -> None:
        old, new = (unwrap_deleted(old) if old else None), (unwrap_deleted(new) if new else None)
        if old is not None and new is not None:
            os_, ns_ = old.get("spec") or {}, new.get("spec") or {}
            if os_.get("tolerations") == ns_.get("tolerations") and os_.get("nodeName") == ns_.get("nodeName"):
                return
        pod = new or old
        if isinstance(pod, dict):
            self.queue("pods").add(meta_namespace_key(pod))

    # -- decisions -----------------------------------------------------------------

    async def sync_node(self, name: str) -> None:
        node = self.nodes.indexer.get_by_key(name)
        if node is None:
            self.tainted.pop(name, None)
            return
        taints = no_execute_taints(node)
        if taints:
            self.tainted[name] = taints
        else:
            self.tainted.pop(name, None)
        pods = self.pods.indexer.by_index(NODE_NAME_INDEX, name)
        if not taints:
            for pod in pods:
                self._cancel(meta_namespace_key(pod))
            return
        now = self.clock()
        for pod in pods:
            self._process_pod(pod, taints, now)

    async def sync_pod(self, key: str) -> None:
        pod = self.pods.indexer.get_by_key(key)
        if pod is None:
            self._cancel(key)
            return
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            return
        taints = self.tainted.get(node)
        if taints is None:
            return
        self._process_pod(pod, taints, self.clock())

    def _process_pod(self, pod: Obj, taints: list[Obj], now: _dt.datetime) -> None:
        """upstream's processPodOnNode."""
        key = meta_namespace_key(pod)
        tolerations = [t for t in (pod.get("spec") or {}).get("tolerations") or [] if isinstance(t, dict)]
        if not taints:
            self._cancel(key)
        ok, used = matching_tolerations(taints, tolerations)
        if not ok:
            self._cancel(key)
            self._schedule(key, now, now)
            return
        wait = min_toleration_seconds(used)
        if wait < 0:
            self._cancel(key)
            return
        start = now
        trigger = now + _dt.timedelta(seconds=wait)
        existing = self.scheduled.get(key)
        if existing is not None:
            start = existing[0]
            if start + _dt.timedelta(seconds=wait) < trigger:
                return
            self._cancel(key)
        self._schedule(key, start, trigger)

    def _schedule(self, key: str, created: _dt.datetime, fire_at: _dt.datetime) -> None:
        self.scheduled[key] = (created, fire_at)
        self.queue("evictions").add_after(key, max(0.0, (fire_at - self.clock()).total_seconds()))

    def _cancel(self, key: str) -> None:
        if self.scheduled.pop(key, None) is not None:
            ns, _, name = key.partition("/")
            self.recorder.event(_pod_ref(ns, name), "Normal", "TaintManagerEviction",
                                f"Cancelling deletion of Pod {key}")

    def fire_due(self) -> int:
        """Queue every deletion due by the controller's clock; how many."""
        now = self.clock()
        due = [k for k, (_c, at) in self.scheduled.items() if at <= now]
        for key in due:
            self.queue("evictions").add(key)
        return len(due)

    async def sync_eviction(self, key: str) -> None:
        entry = self.scheduled.get(key)
        if entry is None:
            return
        remaining = (entry[1] - self.clock()).total_seconds()
        if remaining > 0:
            self.queue("evictions").add_after(key, remaining)
            return
        ns, _, name = key.partition("/")
        log.info("deleting pod %s: its node has a NoExecute taint it does not tolerate", key)
        self.recorder.event(_pod_ref(ns, name), "Normal", "TaintManagerEviction", f"Marking for deletion Pod {key}")
        err: StatusError | None = None
        for _ in range(RETRIES):
            try:
                await self._add_condition_and_delete(ns, name)
                err = None
                break
            except StatusError as e:
                if e.code == 404:
                    err = None
                    break
                err = e
        if self.scheduled.get(key) is entry:
            del self.scheduled[key]
        if err is not None:
            raise err

    async def _add_condition_and_delete(self, namespace: str, name: str) -> None:
        pod = await self.client.get(PODS, name, namespace)
        status = deep_copy(pod.get("status") or {})
        if set_pod_condition(status, "DisruptionTarget", "True", "DeletionByTaintManager",
                             "Taint manager: deleting due to NoExecute taint"):
            cond = [c for c in status["conditions"] if c.get("type") == "DisruptionTarget"]
            # upstream's PatchPodStatus: a strategic merge patch (conditions merge by type)
            await self.client.patch(PODS, name, {"status": {"conditions": cond}},
                                    namespace, patch_type="strategic", subresource="status")
        await self.client.delete(PODS, name, namespace)


def _pod_ref(namespace: str, name: str) -> Obj:
    return {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": name, "namespace": namespace}}


__all__ = ["TaintEvictionController", "matching_tolerations", "min_toleration_seconds", "tolerates"]
