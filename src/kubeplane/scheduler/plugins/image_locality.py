"""ImageLocality: favour nodes that already have the pod's container images.

Each image present on the node contributes its size scaled by the fraction
of nodes that have it (spread), the sum is clamped to
``[23MB, 1000MB x containers]`` and mapped linearly onto 0..100.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kubeplane.scheduler.framework.fastpath import NodeArrays
from kubeplane.scheduler.framework.nodeinfo import ImageStateSummary, NodeInfo, PodInfo
from kubeplane.scheduler.framework.plugin import Plugin
from kubeplane.scheduler.framework.types import ClusterEventWithHint, CycleState, MAX_NODE_SCORE, MIN_NODE_SCORE, Status

MB = 1024 * 1024
MIN_THRESHOLD = 23 * MB
MAX_CONTAINER_THRESHOLD = 1000 * MB


def normalized_image_name(name: str) -> str:
    """Append ``:latest`` when the image reference has no tag."""
    if name.rfind(":") <= name.rfind("/"):
        return name + ":latest"
    return name


def scaled_image_score(state: ImageStateSummary, total_num_nodes: int) -> int:
    spread = state.num_nodes / total_num_nodes if total_num_nodes else 0.0
    return int(state.size * spread)


def calculate_priority(sum_scores: int, num_containers: int) -> int:
    max_threshold = MAX_CONTAINER_THRESHOLD * num_containers
    if sum_scores < MIN_THRESHOLD:
        sum_scores = MIN_THRESHOLD
    elif sum_scores > max_threshold:
        sum_scores = max_threshold
    if max_threshold == MIN_THRESHOLD:
        return 0
    return MAX_NODE_SCORE * (sum_scores - MIN_THRESHOLD) // (max_threshold - MIN_THRESHOLD)


class ImageLocality(Plugin):
    name = "ImageLocality"

    def score(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> tuple[int, Status | None]:
        snap = self.handle.snapshot
        total = snap.num_nodes() if snap is not None else 1
        images = node_info.image_states
        total_score = 0
        if images:
            for image in pod_info.images:
                st = images.get(normalized_image_name(image))
                if st is not None:
                    total_score += scaled_image_score(st, total)
        return calculate_priority(total_score, len(pod_info.images)), None

    def score_vector(self, state: CycleState, pod_info: PodInfo, arr: NodeArrays, rows: np.ndarray,
                     nodes: list[NodeInfo], sel: Any) -> Any:
        """Nodes without images score the same; the others are scored one by one."""
        base = calculate_priority(0, len(pod_info.images))
        if arr.num_images == 0:
            return base
        out = np.full(len(rows), base, dtype=np.int64)
        for j in np.flatnonzero(arr.has_images[rows]).tolist():
            sc, s = self.score(state, pod_info, nodes[j])
            if (s is not None and not s.is_success()) or not MIN_NODE_SCORE <= sc <= MAX_NODE_SCORE:
                return None
            out[j] = sc
        return out

    def events_to_register(self) -> list[ClusterEventWithHint]:
        return []
