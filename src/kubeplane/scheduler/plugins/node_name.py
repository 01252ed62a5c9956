"""NodeName: a pod with ``spec.nodeName`` only fits that node."""

from __future__ import annotations

from typing import Any

import numpy as np

from kubeplane.scheduler.framework.fastpath import ALL_PASS, NodeArrays
from kubeplane.scheduler.framework.nodeinfo import NodeInfo, PodInfo
from kubeplane.scheduler.framework.plugin import Plugin
from kubeplane.scheduler.framework.types import (
    ActionType, ClusterEvent, ClusterEventWithHint, CycleState, EventResource, Obj, QueueingHint, Status,
)

ERR_REASON = "node(s) didn't match the requested node name"


class NodeName(Plugin):
    name = "NodeName"

    def filter(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> Status | None:
        if pod_info.node_name and pod_info.node_name != node_info.name:
            return Status.unresolvable(ERR_REASON)
        return None

    def filter_pod_view(self, pod_info: PodInfo) -> Any:
        return pod_info.node_name

    def filter_mask(self, state: CycleState, pod_info: PodInfo, arr: NodeArrays) -> Any:
        if not pod_info.node_name:
            return ALL_PASS
        mask = np.zeros(len(arr.node_infos), dtype=bool)
        i = arr.index.get(pod_info.node_name)
        if i is not None:
            mask[i] = True
        return lambda sel: mask[sel]

    def events_to_register(self) -> list[ClusterEventWithHint]:
        return [ClusterEventWithHint(ClusterEvent(EventResource.NODE, ActionType.ADD), self.is_schedulable_after_node_add)]

    def is_schedulable_after_node_add(self, pod: Obj, old: Any, new: Any) -> QueueingHint:
        want = (pod.get("spec") or {}).get("nodeName") or ""
        name = ((new or {}).get("metadata") or {}).get("name")
        return QueueingHint.QUEUE if not want or want == name else QueueingHint.SKIP
