"""TaintToleration: filter on NoSchedule/NoExecute taints, score PreferNoSchedule ones."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np
import orjson

from kubeplane.scheduler.framework.fastpath import ALL_PASS, NodeArrays, statuses_by_group
from kubeplane.scheduler.framework.nodeinfo import NodeInfo, PodInfo
from kubeplane.scheduler.framework.plugin import Plugin, default_normalize_score, normalized_score
from kubeplane.scheduler.framework.types import (
    ActionType, ClusterEvent, ClusterEventWithHint, CycleState, EventResource, MAX_NODE_SCORE, Obj,
    QueueingHint, Status,
)

_DO_NOT_SCHEDULE = ("NoSchedule", "NoExecute")
_PRE_SCORE_KEY = "PreScoreTaintToleration"


def tolerates_taint(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Upstream ``Toleration.ToleratesTaint``: empty key with Exists matches every key."""
    effect = toleration.get("effect") or ""
    if effect and effect != (taint.get("effect") or ""):
        return False
    key = toleration.get("key") or ""
    if key and key != (taint.get("key") or ""):
        return False
    op = toleration.get("operator") or "Equal"
    if op == "Exists":
        return True
    if op == "Equal":
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return False


def tolerations_tolerate_taint(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    return any(tolerates_taint(t, taint) for t in tolerations)


def find_untolerated_taint(
    taints: Iterable[Mapping[str, Any]], tolerations: list[Mapping[str, Any]], effects: tuple[str, ...] = _DO_NOT_SCHEDULE
) -> Mapping[str, Any] | None:
    """The first taint with one of ``effects`` that no toleration tolerates."""
    for taint in taints:
        if (taint.get("effect") or "") not in effects:
            continue
        if not tolerations_tolerate_taint(tolerations, taint):
            return taint
    return None


def _taints(node: Obj | None) -> list[Obj]:
    return ((node or {}).get("spec") or {}).get("taints") or []


def _intolerable_count(taints: list[Obj], tolerations: list[Obj]) -> int:
    """Score: how many PreferNoSchedule taints the (scoring) tolerations leave untolerated."""
    return sum(1 for t in taints if t.get("effect") == "PreferNoSchedule" and not tolerations_tolerate_taint(tolerations, t))


class TaintToleration(Plugin):
    name = "TaintToleration"

    def filter(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> Status | None:
        if node_info.node is None:
            return Status.as_status(RuntimeError("node not found"))
        taint = find_untolerated_taint(_taints(node_info.node), pod_info.tolerations)
        if taint is None:
            return None
        return Status.unresolvable(
            f"node(s) had untolerated taint {{{taint.get('key') or ''}: {taint.get('value') or ''}}}"
        )

    def filter_pod_view(self, pod_info: PodInfo) -> Any:
        return orjson.dumps(pod_info.tolerations, option=orjson.OPT_SORT_KEYS)

    def filter_mask(self, state: CycleState, pod_info: PodInfo, arr: NodeArrays) -> Any:
        """Filter once per distinct taint list."""
        if arr.num_tainted == 0:
            return ALL_PASS
        tols = pod_info.tolerations
        gpass = np.fromiter((find_untolerated_taint(taints, tols) is None for taints in arr.group_taints),
                            dtype=bool, count=len(arr.group_taints))
        if gpass.all():
            return ALL_PASS
        gid = arr.taint_gid
        return lambda sel: gpass[gid[sel]]

    def filter_mask_certain(self, state: CycleState, pod_info: PodInfo, arr: NodeArrays) -> Any:
        return True

    def filter_status_builder(self, state: CycleState, pod_info: PodInfo, arr: NodeArrays) -> Any:
        gid = arr.taint_gid
        return lambda rows: statuses_by_group(self, state, pod_info, arr.node_infos, rows, gid[rows])

    def pre_score(self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]) -> Status | None:
        tols = [t for t in pod_info.tolerations if (t.get("effect") or "") in ("", "PreferNoSchedule")]
        state.write(_PRE_SCORE_KEY, tols)
        return None

    def pre_score_tolerations(self, state: CycleState, pod_info: PodInfo) -> list[Obj]:
        """Tolerations that count for scoring (PreScore state, or computed)."""
        tols = state.get(_PRE_SCORE_KEY)
        if tols is None:
            tols = [t for t in pod_info.tolerations if (t.get("effect") or "") in ("", "PreferNoSchedule")]
        return tols

    def score(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> tuple[int, Status | None]:
        return _intolerable_count(_taints(node_info.node), self.pre_score_tolerations(state, pod_info)), None

    def normalize_score(self, state: CycleState, pod_info: PodInfo, scores: list[list[Any]]) -> Status | None:
        default_normalize_score(MAX_NODE_SCORE, True, scores)
        return None

    def score_vector(self, state: CycleState, pod_info: PodInfo, arr: NodeArrays, rows: np.ndarray,
                     nodes: list[NodeInfo], sel: Any) -> Any:
        """Score and NormalizeScore once per distinct taint list."""
        if arr.num_tainted == 0:
            return MAX_NODE_SCORE
        tols = self.pre_score_tolerations(state, pod_info)
        gcount = np.fromiter((_intolerable_count(taints, tols) for taints in arr.group_taints),
                             dtype=np.int64, count=len(arr.group_taints))
        counts = gcount[arr.taint_gid[rows]]
        max_count = int(counts.max())
        if max_count == 0:
            return MAX_NODE_SCORE
        return normalized_score(MAX_NODE_SCORE, True, counts, max_count)

    def events_to_register(self) -> list[ClusterEventWithHint]:
        return [
            ClusterEventWithHint(ClusterEvent(EventResource.NODE, ActionType.ADD | ActionType.UPDATE_NODE_TAINT),
                                 self.is_schedulable_after_node_change),
            ClusterEventWithHint(ClusterEvent(EventResource.POD, ActionType.UPDATE_POD_TOLERATIONS),
                                 self.is_schedulable_after_pod_toleration_change),
        ]

    def is_schedulable_after_node_change(self, pod: Obj, old: Any, new: Any) -> QueueingHint:
        tols = (pod.get("spec") or {}).get("tolerations") or []
        was_untolerated = True if old is None else find_untolerated_taint(_taints(old), tols) is not None
        is_untolerated = find_untolerated_taint(_taints(new), tols) is not None
        return QueueingHint.QUEUE if was_untolerated and not is_untolerated else QueueingHint.SKIP

    def is_schedulable_after_pod_toleration_change(self, pod: Obj, old: Any, new: Any) -> QueueingHint:
        uid = ((new or {}).get("metadata") or {}).get("uid")
        return QueueingHint.QUEUE if uid == (pod.get("metadata") or {}).get("uid") else QueueingHint.SKIP
