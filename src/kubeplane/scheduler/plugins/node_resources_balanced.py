"""NodeResourcesBalancedAllocation: favour nodes whose resource usage fractions are close.

score = (1 - std(fractions)) x 100, fractions = (node requested + pod
requests) / allocatable per configured resource (cpu and memory by default),
capped at 1. Best-effort pods (no requests) are not scored.
"""

from __future__ import annotations

import math
from typing import Any

from kubeplane.scheduler.framework.nodeinfo import NodeInfo, PodInfo
from kubeplane.scheduler.framework.plugin import Plugin
from kubeplane.scheduler.framework.types import (
    ActionType, ClusterEvent, ClusterEventWithHint, CycleState, EventResource, MAX_NODE_SCORE, Status,
)
from kubeplane.scheduler.plugins.node_resources_fit import DEFAULT_RESOURCES, ResourceAllocationScorer

_PRE_SCORE_KEY = "PreScoreNodeResourcesBalancedAllocation"


def balanced_resource_scorer(requested: list[int], allocatable: list[int]) -> int:
    fractions: list[float] = []
    total = 0.0
    for r, a in zip(requested, allocatable):
        if a == 0:
            continue
        f = min(r / a, 1.0)
        total += f
        fractions.append(f)
    std = 0.0
    if len(fractions) == 2:
        std = abs((fractions[0] - fractions[1]) / 2)
    elif len(fractions) > 2:
        mean = total / len(fractions)
        std = math.sqrt(sum((f - mean) ** 2 for f in fractions) / len(fractions))
    return int((1 - std) * MAX_NODE_SCORE)


class NodeResourcesBalancedAllocation(Plugin):
    name = "NodeResourcesBalancedAllocation"

    def __init__(self, args: dict | None, handle: Any) -> None:
        super().__init__(args, handle)
        resources = [dict(r) for r in (self.args.get("resources") or DEFAULT_RESOURCES)]
        self.scorer = ResourceAllocationScorer(resources, balanced_resource_scorer, use_requested=True)

    def pre_score(self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]) -> Status | None:
        reqs = self.scorer.pod_request_list(pod_info)
        if not any(reqs):
            return Status.skip()
        state.write(_PRE_SCORE_KEY, reqs)
        return None

    def pre_score_requests(self, state: CycleState, pod_info: PodInfo) -> list[int]:
        """The pod's request per scored resource (PreScore state, or computed)."""
        reqs = state.get(_PRE_SCORE_KEY)
        if reqs is None:
            reqs = self.scorer.pod_request_list(pod_info)
        return reqs

    def score(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> tuple[int, Status | None]:
        return self.scorer.score(node_info, self.pre_score_requests(state, pod_info)), None

    def events_to_register(self) -> list[ClusterEventWithHint]:
        return [
            ClusterEventWithHint(ClusterEvent(EventResource.POD, ActionType.DELETE)),
            ClusterEventWithHint(ClusterEvent(EventResource.NODE, ActionType.ADD | ActionType.UPDATE_NODE_ALLOCATABLE)),
        ]
