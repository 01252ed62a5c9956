"""NodeResourcesBalancedAllocation: favour nodes whose resource usage fractions are close.

score = (1 - std(fractions)) x 100, fractions = (node requested + pod
requests) / allocatable per configured resource (cpu and memory by default),
capped at 1. Best-effort pods (no requests) are not scored.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kubeplane.scheduler.framework.fastpath import NodeArrays
from kubeplane.scheduler.framework.nodeinfo import NodeInfo, PodInfo
from kubeplane.scheduler.framework.plugin import Plugin
from kubeplane.scheduler.framework.types import (
    ActionType, ClusterEvent, ClusterEventWithHint, CycleState, EventResource, MAX_NODE_SCORE, Status,
)
from kubeplane.scheduler.plugins.node_resources_fit import (
    DEFAULT_RESOURCES, ResourceAllocationScorer, memoized_resource_scores,
)

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


def balanced_scores(alloc: np.ndarray, req: np.ndarray, present: np.ndarray | None, safe_alloc: np.ndarray) -> Any:
    """``balanced_resource_scorer`` for two resources per row, with the same IEEE double operations."""
    fracs = req / safe_alloc
    np.minimum(fracs, 1.0, out=fracs)
    std = fracs[0] - fracs[1]
    std /= 2
    np.abs(std, out=std)
    if present is not None:
        # a resource the node lacks leaves one fraction: no deviation
        std = np.where(present[0] & present[1], std, 0.0)
    std = 1 - std
    std *= MAX_NODE_SCORE
    return std.astype(np.int64)


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

    def score_vector(self, state: CycleState, pod_info: PodInfo, arr: NodeArrays, rows: np.ndarray,
                     nodes: list[NodeInfo], sel: Any) -> Any:
        n = len(self.scorer.names)
        if n > 2:
            return None  # the population standard deviation stays scalar
        # one resource (or none): no deviation, every row scores MAX_NODE_SCORE
        return memoized_resource_scores(self, state, pod_info, arr, rows, sel,
                                        balanced_scores if n == 2 else None, MAX_NODE_SCORE)

    def events_to_register(self) -> list[ClusterEventWithHint]:
        return [
            ClusterEventWithHint(ClusterEvent(EventResource.POD, ActionType.DELETE)),
            ClusterEventWithHint(ClusterEvent(EventResource.NODE, ActionType.ADD | ActionType.UPDATE_NODE_ALLOCATABLE)),
        ]
