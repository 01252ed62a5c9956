"""DefaultPreemption: the PostFilter plugin that evicts lower-priority pods.

The work is done by :class:`kubeplane.scheduler.preemption.Evaluator`. On
success PostFilter returns the nominated node with a Success status (the
scheduling attempt itself still fails as Unschedulable and the scheduler
records the nomination); when preemption cannot help it returns ``""`` (clear
any nomination) and an Unschedulable status whose message starts with
``preemption: ``.

Args (``DefaultPreemptionArgs``): ``minCandidateNodesPercentage`` (default
10, 0..100) and ``minCandidateNodesAbsolute`` (default 100, >= 0; not both 0).

PodDisruptionBudgets come from ``args["pdbLister"]`` or
``handle.pdb_lister``, a callable ``() -> list of policy/v1
PodDisruptionBudget dicts``; failing both, from
``handle.list_objects("poddisruptionbudgets", None)``; otherwise none.
"""

from __future__ import annotations

from typing import Any

from kubeplane.scheduler.framework.nodeinfo import PodInfo
from kubeplane.scheduler.framework.plugin import Plugin
from kubeplane.scheduler.framework.types import CycleState, Status
from kubeplane.scheduler.preemption import Evaluator

NAME = "DefaultPreemption"


class DefaultPreemption(Plugin):
    name = NAME

    def __init__(self, args: dict | None, handle: Any) -> None:
        super().__init__(args, handle)
        pct = self.args.get("minCandidateNodesPercentage")
        pct = 10 if pct is None else int(pct)
        absolute = self.args.get("minCandidateNodesAbsolute")
        absolute = 100 if absolute is None else int(absolute)
        if pct < 0 or pct > 100:
            raise ValueError(f"minCandidateNodesPercentage: Invalid value: {pct}: not in valid range [0, 100]")
        if absolute < 0:
            raise ValueError(f"minCandidateNodesAbsolute: Invalid value: {absolute}: not in valid range [0, inf)")
        if pct == 0 and absolute == 0:
            raise ValueError("minCandidateNodesPercentage, minCandidateNodesAbsolute: Invalid value: "
                             "both minCandidateNodesPercentage and minCandidateNodesAbsolute cannot be zero")
        lister = self.args.get("pdbLister") or handle.pdb_lister
        self.evaluator = Evaluator(
            NAME, handle, pdb_lister=lister,
            min_candidate_nodes_percentage=pct, min_candidate_nodes_absolute=absolute,
        )

    def post_filter(
        self, state: CycleState, pod_info: PodInfo, filtered_statuses: dict[str, Status]
    ) -> tuple[str | None, Status]:
        node, status = self.evaluator.preempt(state, pod_info, filtered_statuses)
        msg = status.message()
        if msg:
            return node, Status(status.code, ["preemption: " + msg], status.plugin, status.error)
        return node, status
