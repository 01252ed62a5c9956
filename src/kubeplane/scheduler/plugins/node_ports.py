"""NodePorts: reject nodes where a requested host port is already used."""

from __future__ import annotations

from typing import Any

from kubeplane.scheduler.framework.fastpath import ALL_PASS, NodeArrays
from kubeplane.scheduler.framework.nodeinfo import HostPortInfo, NodeInfo, PodInfo, host_ports
from kubeplane.scheduler.framework.plugin import Plugin
from kubeplane.scheduler.framework.types import (
    ActionType, ClusterEvent, ClusterEventWithHint, CycleState, EventResource, Obj, PreFilterResult,
    QueueingHint, Status,
)

ERR_REASON = "node(s) didn't have free ports for the requested pod ports"


def fits_ports(want: list[tuple[str, str, int]], used: HostPortInfo) -> bool:
    return not any(used.check_conflict(ip, proto, port) for ip, proto, port in want)


class NodePorts(Plugin):
    name = "NodePorts"

    def pre_filter(
        self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]
    ) -> tuple[PreFilterResult | None, Status | None]:
        if not pod_info.host_ports:
            return None, Status.skip()
        return None, None

    def filter(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> Status | None:
        if not fits_ports(pod_info.host_ports, node_info.used_ports):
            return Status.unschedulable(ERR_REASON)
        return None

    def filter_mask(self, state: CycleState, pod_info: PodInfo, arr: NodeArrays) -> Any:
        """Nodes with no host port in use pass."""
        if arr.num_ports == 0:
            return ALL_PASS
        ports = arr.has_ports
        return lambda sel: ~ports[sel]

    def events_to_register(self) -> list[ClusterEventWithHint]:
        return [
            ClusterEventWithHint(ClusterEvent(EventResource.POD, ActionType.DELETE), self.is_schedulable_after_pod_deleted),
            ClusterEventWithHint(ClusterEvent(EventResource.NODE, ActionType.ADD)),
        ]

    def is_schedulable_after_pod_deleted(self, pod: Obj, old: Any, new: Any) -> QueueingHint:
        deleted = old or {}
        if not (deleted.get("spec") or {}).get("nodeName") and not (deleted.get("status") or {}).get("nominatedNodeName"):
            return QueueingHint.SKIP
        ports = host_ports(deleted)
        if not ports:
            return QueueingHint.SKIP
        used = HostPortInfo()
        for ip, proto, port in ports:
            used.add(ip, proto, port)
        return QueueingHint.SKIP if fits_ports(host_ports(pod), used) else QueueingHint.QUEUE
