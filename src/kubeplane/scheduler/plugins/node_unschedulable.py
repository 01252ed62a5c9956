"""NodeUnschedulable: reject nodes with ``spec.unschedulable`` unless the pod tolerates it."""

from __future__ import annotations

from typing import Any

import numpy as np

from kubeplane.scheduler.framework.fastpath import ALL_PASS, NodeArrays, statuses_by_group
from kubeplane.scheduler.framework.nodeinfo import NodeInfo, PodInfo
from kubeplane.scheduler.framework.plugin import Plugin
from kubeplane.scheduler.framework.types import (
    ActionType, ClusterEvent, ClusterEventWithHint, CycleState, EventResource, Obj, QueueingHint, Status,
)
from kubeplane.scheduler.plugins.taint_toleration import tolerations_tolerate_taint

TAINT_NODE_UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
ERR_REASON_UNSCHEDULABLE = "node(s) were unschedulable"
#: the taint a pod must tolerate to land on an unschedulable node
UNSCHEDULABLE_TAINT = {"key": TAINT_NODE_UNSCHEDULABLE, "effect": "NoSchedule"}
_UNSCHEDULABLE_TAINT = UNSCHEDULABLE_TAINT


def _unschedulable(node: Obj | None) -> bool:
    return bool(((node or {}).get("spec") or {}).get("unschedulable"))


class NodeUnschedulable(Plugin):
    name = "NodeUnschedulable"

    def filter(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> Status | None:
        if not _unschedulable(node_info.node):
            return None
        if tolerations_tolerate_taint(pod_info.tolerations, _UNSCHEDULABLE_TAINT):
            return None
        return Status.unresolvable(ERR_REASON_UNSCHEDULABLE)

    def filter_pod_view(self, pod_info: PodInfo) -> Any:
        return tolerations_tolerate_taint(pod_info.tolerations, _UNSCHEDULABLE_TAINT)

    def filter_mask(self, state: CycleState, pod_info: PodInfo, arr: NodeArrays) -> Any:
        if arr.num_unsched == 0 or tolerations_tolerate_taint(pod_info.tolerations, _UNSCHEDULABLE_TAINT):
            return ALL_PASS
        unsched = arr.unsched
        return lambda sel: ~unsched[sel]

    def filter_mask_certain(self, state: CycleState, pod_info: PodInfo, arr: NodeArrays) -> Any:
        return True

    def filter_status_builder(self, state: CycleState, pod_info: PodInfo, arr: NodeArrays) -> Any:
        # Every rejected row has the same status.
        return lambda rows: statuses_by_group(self, state, pod_info, arr.node_infos, rows, np.zeros(len(rows)))

    def events_to_register(self) -> list[ClusterEventWithHint]:
        return [
            ClusterEventWithHint(ClusterEvent(EventResource.NODE, ActionType.ADD | ActionType.UPDATE_NODE_TAINT),
                                 self.is_schedulable_after_node_change),
            ClusterEventWithHint(ClusterEvent(EventResource.POD, ActionType.UPDATE_POD_TOLERATIONS),
                                 self.is_schedulable_after_pod_toleration_change),
        ]

    def is_schedulable_after_node_change(self, pod: Obj, old: Any, new: Any) -> QueueingHint:
        was_schedulable = False if old is None else not _unschedulable(old)
        if not was_schedulable and not _unschedulable(new):
            return QueueingHint.QUEUE
        return QueueingHint.SKIP

    def is_schedulable_after_pod_toleration_change(self, pod: Obj, old: Any, new: Any) -> QueueingHint:
        if ((new or {}).get("metadata") or {}).get("uid") != (pod.get("metadata") or {}).get("uid"):
            return QueueingHint.SKIP
        tols = ((new or {}).get("spec") or {}).get("tolerations") or []
        return QueueingHint.QUEUE if tolerations_tolerate_taint(tols, _UNSCHEDULABLE_TAINT) else QueueingHint.SKIP
