"""Node lifecycle: nodes whose kubelet never posted a status, after upstream's
``pkg/controller/nodelifecycle``.

Upstream's controller treats a node without a Ready condition as if the
kubelet had reported ``Unknown`` at the node's creation time. Once the startup
grace period (``--node-startup-grace-period``, 1 minute) has passed since then,
it writes the Ready, MemoryPressure, DiskPressure and PIDPressure conditions as
``Unknown`` (reason ``NodeStatusNeverUpdated``, message ``Kubelet never posted
node status.``) and taints the node ``node.kubernetes.io/unreachable`` with
effects NoSchedule and NoExecute, which is what ``kubectl describe node``
then shows.

When the kubelet posts a Ready condition after all, the taints go again.
Nodes whose kubelet did post a Ready condition are otherwise left alone:
kubeplane's node agents keep their status themselves, so the "stopped
posting" half of upstream's health monitoring is not applied here.
"""

from __future__ import annotations

import datetime as _dt
import logging
from typing import Callable

from kubeplane.api.meta import deep_copy, format_time, parse_time, utcnow
from kubeplane.api.resources import resource
from kubeplane.client.informer import SharedInformerFactory, meta_namespace_key, unwrap_deleted
from kubeplane.client.interface import Client, Obj
from kubeplane.controllers.base import Controller

log = logging.getLogger(__name__)

NODES = resource("nodes")

UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
#: the condition types upstream marks Unknown (NetworkUnavailable is not its to change)
CONDITION_TYPES = ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure")
NEVER_UPDATED_REASON = "NodeStatusNeverUpdated"
NEVER_UPDATED_MESSAGE = "Kubelet never posted node status."
DEFAULT_STARTUP_GRACE = 60.0


def _conditions(node: Obj) -> list[Obj]:
    conds = (node.get("status") or {}).get("conditions")
    return conds if isinstance(conds, list) else []


def ready_condition(node: Obj) -> Obj | None:
    for c in _conditions(node):
        if isinstance(c, dict) and c.get("type") == "Ready":
            return c
    return None


def _never_updated(cond: Obj | None) -> bool:
    return cond is not None and cond.get("status") == "Unknown" and cond.get("reason") == NEVER_UPDATED_REASON


def _unreachable_taints(node: Obj) -> list[Obj]:
    return [t for t in (node.get("spec") or {}).get("taints") or []
            if isinstance(t, dict) and t.get("key") == UNREACHABLE_TAINT]


class NodeLifecycleController(Controller):
    def __init__(self, client: Client, factory: SharedInformerFactory | None = None, *,
                 startup_grace: float = DEFAULT_STARTUP_GRACE,
                 clock: Callable[[], _dt.datetime] = utcnow) -> None:
        super().__init__("node-lifecycle-controller", client, factory)
        self.startup_grace = startup_grace
        self.clock = clock
        self.nodes = self.factory.informer_for(NODES)
        self.nodes.add_event_handler(self._enqueue, lambda _old, new: self._enqueue(new), None)
        self.add_queue("nodes", self.sync)

    def _enqueue(self, obj: Obj) -> None:
        node = unwrap_deleted(obj)
        if not isinstance(node, dict):
            return
        ready = ready_condition(node)
        if ready is None or _never_updated(ready) or _unreachable_taints(node):
            self.queue("nodes").add(meta_namespace_key(node))

    async def sync(self, key: str) -> None:
        node = self.nodes.indexer.get_by_key(key)
        if node is None:
            return
        ready = ready_condition(node)
        now = self.clock()
        stamp = format_time(now)
        if ready is None:
            created_text = (node.get("metadata") or {}).get("creationTimestamp") or ""
            try:
                created = parse_time(created_text)
            except ValueError:
                created = now
            wait = (created - now).total_seconds() + self.startup_grace
            if wait > 0:
                self.queue("nodes").add_after(key, wait)
                return
            node = await self._mark_unknown(key, node, created_text or stamp, stamp)
            ready = ready_condition(node)
        if _never_updated(ready):
            await self._set_taints(node, add=True, stamp=stamp)
        elif ready is not None and ready.get("status") == "True" and _unreachable_taints(node):
            # The kubelet reported after all: the node is reachable.
            await self._set_taints(node, add=False, stamp=stamp)

    async def _mark_unknown(self, key: str, node: Obj, heartbeat: str, stamp: str) -> Obj:
        node = deep_copy(node)
        status = node.setdefault("status", {})
        conditions = status.setdefault("conditions", [])
        present = {c.get("type") for c in conditions if isinstance(c, dict)}
        for ctype in CONDITION_TYPES:
            if ctype not in present:
                conditions.append({
                    "type": ctype, "status": "Unknown",
                    "lastHeartbeatTime": heartbeat, "lastTransitionTime": stamp,
                    "reason": NEVER_UPDATED_REASON, "message": NEVER_UPDATED_MESSAGE,
                })
        log.info("node %s: kubelet never posted node status; conditions set to Unknown", key)
        return await self.client.update(NODES, node, subresource="status")

    async def _set_taints(self, node: Obj, *, add: bool, stamp: str) -> None:
        """Add (or remove) the unreachable taints, NoSchedule and NoExecute
        (the latter with timeAdded)."""
        taints = [t for t in (node.get("spec") or {}).get("taints") or [] if isinstance(t, dict)]
        if add:
            have = {(t.get("key"), t.get("effect")) for t in taints}
            wanted = [{"key": UNREACHABLE_TAINT, "effect": "NoSchedule"},
                      {"key": UNREACHABLE_TAINT, "effect": "NoExecute", "timeAdded": stamp}]
            new = taints + [t for t in wanted if (t["key"], t["effect"]) not in have]
        else:
            new = [t for t in taints if t.get("key") != UNREACHABLE_TAINT]
        if len(new) == len(taints):
            return
        rv = (node.get("metadata") or {}).get("resourceVersion")
        # Pinned to the version read: a conflict retries the sync on fresh data.
        await self.client.patch(NODES, node["metadata"]["name"],
                                {"metadata": {"resourceVersion": rv}, "spec": {"taints": new or None}})


__all__ = ["NodeLifecycleController", "NEVER_UPDATED_MESSAGE", "NEVER_UPDATED_REASON", "UNREACHABLE_TAINT"]
