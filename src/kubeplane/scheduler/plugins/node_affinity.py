"""NodeAffinity: required nodeSelector/node affinity (filter), preferred terms (score).

The ``addedAffinity`` arg adds scheduler-enforced required and preferred
terms for every pod of the profile.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from kubeplane.scheduler.framework.fastpath import NodeArrays
from kubeplane.scheduler.framework.nodeinfo import NodeInfo, NodeSelector, NodeSelectorTerm, PodInfo, RequiredNodeAffinity
from kubeplane.scheduler.framework.plugin import Plugin, default_normalize_score
from kubeplane.scheduler.framework.types import (
    ActionType, ClusterEvent, ClusterEventWithHint, CycleState, EventResource, MAX_NODE_SCORE, Obj,
    PreFilterResult, QueueingHint, Status,
)

ERR_REASON_POD = "node(s) didn't match Pod's node affinity/selector"
ERR_REASON_ENFORCED = "node(s) didn't match scheduler-enforced node affinity"
ERR_REASON_CONFLICT = "pod affinity terms conflict"
_PRE_FILTER_KEY = "PreFilterNodeAffinity"
_PRE_SCORE_KEY = "PreScoreNodeAffinity"


def _preferred(terms: list[Any]) -> list[tuple[int, NodeSelectorTerm]]:
    return [(int(t.get("weight") or 0), NodeSelectorTerm(t.get("preference") or {})) for t in terms or ()
            if int(t.get("weight") or 0) != 0]


def _preferred_score(terms: list[tuple[int, NodeSelectorTerm]], node: Obj) -> int:
    meta = node.get("metadata") or {}
    name, labels = meta.get("name") or "", meta.get("labels") or {}
    return sum(w for w, t in terms if t.matches(name, labels))


class NodeAffinity(Plugin):
    name = "NodeAffinity"

    def __init__(self, args: dict | None, handle: Any) -> None:
        super().__init__(args, handle)
        added = self.args.get("addedAffinity") or {}
        required = added.get("requiredDuringSchedulingIgnoredDuringExecution")
        self.added_node_selector = NodeSelector(required) if required is not None else None
        self.added_pref_terms = _preferred(added.get("preferredDuringSchedulingIgnoredDuringExecution") or [])

    def pre_filter(
        self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]
    ) -> tuple[PreFilterResult | None, Status | None]:
        spec = pod_info.pod.get("spec") or {}
        required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                    .get("requiredDuringSchedulingIgnoredDuringExecution"))
        if required is None and self.added_node_selector is None and spec.get("nodeSelector") is None:
            return None, Status.skip()
        state.write(_PRE_FILTER_KEY, pod_info.required_node_affinity)
        terms = (required or {}).get("nodeSelectorTerms") or []
        if not terms:
            return None, None
        node_names: set[str] | None = None
        for t in terms:
            term_names: set[str] | None = None
            for r in t.get("matchFields") or ():
                if r.get("key") == "metadata.name" and r.get("operator") == "In":
                    s = set(r.get("values") or ())
                    term_names = s if term_names is None else term_names & s
            if term_names is None:
                # A term without a name pin allows every node (terms are ORed).
                return None, None
            node_names = term_names if node_names is None else node_names | term_names
        if node_names is not None and not node_names:
            return None, Status.unresolvable(ERR_REASON_CONFLICT)
        return PreFilterResult(node_names), None

    def required_for(self, state: CycleState, pod_info: PodInfo) -> RequiredNodeAffinity:
        """The pod's required node affinity (PreFilter state, or computed)."""
        return state.get(_PRE_FILTER_KEY) or pod_info.required_node_affinity

    def filter(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> Status | None:
        node = node_info.node
        if node is None:
            return Status.as_status(RuntimeError("node not found"))
        if self.added_node_selector is not None and not self.added_node_selector.matches(node):
            return Status.unresolvable(ERR_REASON_ENFORCED)
        required: RequiredNodeAffinity = self.required_for(state, pod_info)
        if not required.matches(node):
            return Status.unresolvable(ERR_REASON_POD)
        return None

    def filter_pod_view(self, pod_info: PodInfo) -> Any:
        spec = pod_info.pod.get("spec") or {}
        return orjson.dumps([spec.get("nodeSelector"), (spec.get("affinity") or {}).get("nodeAffinity")],
                            option=orjson.OPT_SORT_KEYS)

    def filter_mask(self, state: CycleState, pod_info: PodInfo, arr: NodeArrays) -> Any:
        """Filter's verdict per row, memoized per (nodeSelector, required affinity)."""
        spec = pod_info.pod.get("spec") or {}
        required_raw = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution")
        try:
            sig = orjson.dumps([spec.get("nodeSelector"), required_raw], option=orjson.OPT_SORT_KEYS)
        except TypeError:
            return None
        key = ("affinity", id(self), sig)
        added = self.added_node_selector
        required = self.required_for(state, pod_info)
        infos = arr.node_infos

        def matches(row: int) -> bool:
            node = infos[row].node
            if node is None:
                return False
            return (added is None or added.matches(node)) and required.matches(node)

        def compute_many(sel: Any) -> np.ndarray:
            rows = sel.tolist()
            return np.fromiter((matches(r) for r in rows), dtype=bool, count=len(rows))
        return lambda sel: arr.memoized(key, bool, compute_many, matches, sel)

    def pre_score(self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]) -> Status | None:
        terms = [(w, t) for w, t in pod_info.preferred_node_terms if w != 0]
        if not terms and not self.added_pref_terms:
            return Status.skip()
        state.write(_PRE_SCORE_KEY, terms)
        return None

    def score(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> tuple[int, Status | None]:
        node = node_info.node or {}
        terms = state.get(_PRE_SCORE_KEY)
        if terms is None:
            terms = [(w, t) for w, t in pod_info.preferred_node_terms if w != 0]
        total = _preferred_score(self.added_pref_terms, node) if self.added_pref_terms else 0
        return total + _preferred_score(terms, node), None

    def normalize_score(self, state: CycleState, pod_info: PodInfo, scores: list[list[Any]]) -> Status | None:
        default_normalize_score(MAX_NODE_SCORE, False, scores)
        return None

    def events_to_register(self) -> list[ClusterEventWithHint]:
        return [ClusterEventWithHint(ClusterEvent(EventResource.NODE, ActionType.ADD | ActionType.UPDATE_NODE_LABEL),
                                     self.is_schedulable_after_node_change)]

    def is_schedulable_after_node_change(self, pod: Obj, old: Any, new: Any) -> QueueingHint:
        if self.added_node_selector is not None and not self.added_node_selector.matches(new):
            return QueueingHint.SKIP
        required = RequiredNodeAffinity(pod)
        if not required.matches(new):
            return QueueingHint.SKIP
        if old is None or not required.matches(old):
            return QueueingHint.QUEUE
        return QueueingHint.SKIP
