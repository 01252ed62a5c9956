"""The pod garbage collector, after upstream's ``pkg/controller/podgc``.

Every ``check_period`` (20 s) it force-deletes (grace period 0), first setting
phase Failed on a pod that has not finished:

- terminated pods (phase neither Pending, Running nor Unknown) above
  ``--terminated-pod-gc-threshold`` (12500; 0 turns this off), evicted ones
  first, then the oldest;
- orphaned pods: bound to a node that does not exist, once the node has been
  missing for the quarantine time (40 s) and the API confirms it is gone; they
  get the ``DisruptionTarget`` condition (reason ``DeletionByPodGC``, "PodGC:
  node no longer exists");
- terminating pods that were never scheduled (nothing else would finish them);
- terminating pods on a node that is not Ready and carries the
  ``node.kubernetes.io/out-of-service`` taint.

Time is read from ``clock`` (injectable) and a pass can be run directly
(:meth:`PodGCController.gc`).
"""

from __future__ import annotations

import datetime as _dt
import logging
from typing import Callable

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import deep_copy, utcnow
from kubeplane.api.resources import resource
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.interface import Client, Obj
from kubeplane.controllers.base import Controller
from kubeplane.controllers.nodelifecycle import ready_condition
from kubeplane.registry.eviction import set_pod_condition

log = logging.getLogger(__name__)

PODS = resource("pods")
NODES = resource("nodes")

DEFAULT_TERMINATED_POD_THRESHOLD = 12500
GC_CHECK_PERIOD = 20.0
QUARANTINE_TIME = 40.0
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"


def is_terminated(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Pending", "Running", "Unknown")


def is_evicted(pod: Obj) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Failed" and status.get("reason") == "Evicted"


def _order(pod: Obj) -> tuple:
    md = pod.get("metadata") or {}
    return (not is_evicted(pod), md.get("creationTimestamp") or "", md.get("name") or "")


class PodGCController(Controller):
    def __init__(self, client: Client, factory: SharedInformerFactory | None = None, *,
                 terminated_pod_threshold: int = DEFAULT_TERMINATED_POD_THRESHOLD,
                 check_period: float = GC_CHECK_PERIOD, quarantine_time: float = QUARANTINE_TIME,
                 clock: Callable[[], _dt.datetime] = utcnow) -> None:
        super().__init__("pod-garbage-collector", client, factory)
        self.threshold = terminated_pod_threshold
        self.check_period = check_period
        self.quarantine_time = quarantine_time
        self.clock = clock
        #: missing node name -> when a pod bound to it was first seen
        self.quarantine: dict[str, _dt.datetime] = {}
        self.pods = self.factory.informer_for(PODS)
        self.nodes = self.factory.informer_for(NODES)
        self.add_queue("gc", self._gc_loop)

    async def start(self, sync_timeout: float | None = 30.0) -> None:
        await super().start(sync_timeout)
        self.queue("gc").add("all")

    async def _gc_loop(self, key: str) -> None:
        try:
            await self.gc()
        finally:
            if self.running:
                self.queue("gc").add_after(key, self.check_period)

    async def gc(self) -> None:
        """One pass (upstream's gc)."""
        pods = self.pods.indexer.list()
        nodes = {n["metadata"]["name"]: n for n in self.nodes.indexer.list()}
        if self.threshold > 0:
            await self._gc_terminated(pods)
        await self._gc_terminating(pods, nodes)
        await self._gc_orphaned(pods, nodes)
        await self._gc_unscheduled_terminating(pods)

    async def _gc_terminated(self, pods: list[Obj]) -> None:
        terminated = [p for p in pods if is_terminated(p)]
        excess = len(terminated) - self.threshold
        if excess <= 0:
            return
        log.info("garbage collecting %d terminated pods", excess)
        for pod in sorted(terminated, key=_order)[:excess]:
            await self._delete_quietly(pod, "terminated")

    async def _gc_terminating(self, pods: list[Obj], nodes: dict[str, Obj]) -> None:
        doomed = []
        for pod in pods:
            if not (pod.get("metadata") or {}).get("deletionTimestamp"):
                continue
            node = nodes.get((pod.get("spec") or {}).get("nodeName") or "")
            if node is None:
                continue
            ready = ready_condition(node)
            out_of_service = any(isinstance(t, dict) and t.get("key") == OUT_OF_SERVICE_TAINT
                                 for t in (node.get("spec") or {}).get("taints") or [])
            if not (ready is not None and ready.get("status") == "True") and out_of_service:
                doomed.append(pod)
        for pod in sorted(doomed, key=_order):
            await self._delete_quietly(pod, "terminating on an out-of-service node")

    async def _gc_orphaned(self, pods: list[Obj], nodes: dict[str, Obj]) -> None:
        now = self.clock()
        missing = {(p.get("spec") or {}).get("nodeName") for p in pods} - set(nodes) - {None, ""}
        for name in missing:
            self.quarantine.setdefault(name, now)
        for name in [n for n in self.quarantine if n not in missing]:
            del self.quarantine[name]  # back, or no pod is bound to it any more
        deleted: set[str] = set()
        for name, since in list(self.quarantine.items()):
            if (now - since).total_seconds() < self.quarantine_time:
                continue
            try:
                await self.client.get(NODES, name)
            except StatusError as err:
                if err.code == 404:
                    deleted.add(name)
                else:
                    log.warning("checking node %s failed: %s", name, err)
        for pod in pods:
            if (pod.get("spec") or {}).get("nodeName") not in deleted:
                continue
            md = pod["metadata"]
            log.info("pod %s/%s is bound to node %s, which no longer exists: deleting it", md.get("namespace"),
                     md.get("name"), pod["spec"]["nodeName"])
            await self._delete_quietly(pod, "orphaned", condition=(
                "DisruptionTarget", "True", "DeletionByPodGC", "PodGC: node no longer exists"))

    async def _gc_unscheduled_terminating(self, pods: list[Obj]) -> None:
        for pod in pods:
            if (pod.get("metadata") or {}).get("deletionTimestamp") and not (pod.get("spec") or {}).get("nodeName"):
                await self._delete_quietly(pod, "unscheduled and terminating")

    async def _delete_quietly(self, pod: Obj, why: str, condition: tuple[str, str, str, str] | None = None) -> None:
        md = pod.get("metadata") or {}
        try:
            await self.mark_failed_and_delete(pod, condition)
        except StatusError as err:
            if err.code != 404:
                log.warning("failed to delete %s pod %s/%s: %s", why, md.get("namespace"), md.get("name"), err)

    async def mark_failed_and_delete(self, pod: Obj, condition: tuple[str, str, str, str] | None = None) -> None:
        """Phase Failed first (no kubelet may be left to set it), then a delete with grace period 0."""
        md = pod["metadata"]
        if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            status = deep_copy(pod.get("status") or {})
            patch: Obj = {"phase": "Failed"}
            if condition is not None:
                set_pod_condition(status, *condition)
                patch["conditions"] = [c for c in status["conditions"] if c.get("type") == condition[0]]
            # upstream's PatchPodStatus: a strategic merge patch (conditions merge by type)
            await self.client.patch(PODS, md["name"], {"status": patch},
                                    md.get("namespace"), patch_type="strategic", subresource="status")
        await self.client.delete(PODS, md["name"], md.get("namespace"), grace_period_seconds=0,
                                 preconditions={"uid": md.get("uid", "")} if md.get("uid") else None)


__all__ = ["DEFAULT_TERMINATED_POD_THRESHOLD", "PodGCController", "is_terminated"]
