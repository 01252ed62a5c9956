"""SchedulingGates: keep pods with ``spec.schedulingGates`` out of the active queue."""

from __future__ import annotations

from typing import Any

from kubeplane.scheduler.framework.plugin import Plugin
from kubeplane.scheduler.framework.types import (
    ActionType, ClusterEvent, ClusterEventWithHint, EventResource, Obj, QueueingHint, Status,
)


def _uid(pod: Any) -> str | None:
    return ((pod or {}).get("metadata") or {}).get("uid") if isinstance(pod, dict) else None


class SchedulingGates(Plugin):
    name = "SchedulingGates"

    def pre_enqueue(self, pod: Obj) -> Status | None:
        gates = (pod.get("spec") or {}).get("schedulingGates") or []
        if not gates:
            return None
        names = " ".join(g.get("name") or "" for g in gates)
        return Status.unresolvable(f"waiting for scheduling gates: [{names}]")

    def events_to_register(self) -> list[ClusterEventWithHint]:
        return [ClusterEventWithHint(
            ClusterEvent(EventResource.POD, ActionType.UPDATE_POD_SCHEDULING_GATES_ELIMINATED),
            self.is_schedulable_after_gates_eliminated,
        )]

    def is_schedulable_after_gates_eliminated(self, pod: Obj, old: Any, new: Any) -> QueueingHint:
        return QueueingHint.QUEUE if _uid(new) == _uid(pod) else QueueingHint.SKIP
