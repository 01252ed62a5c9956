"""Generic preemption evaluator, as upstream kube-scheduler's ``preemption`` package.

``Evaluator.preempt`` runs when no node fits a pod:

1. eligibility: ``preemptionPolicy: Never`` pods never preempt; a pod whose
   nominated node still hosts lower-priority pods terminating because of
   preemption waits for them instead;
2. candidate nodes: nodes whose filter status is ``Unschedulable`` (not
   ``UnschedulableAndUnresolvable``), visited from a random offset;
3. dry run per node: remove every lower-priority pod, check the pod fits,
   then reprieve victims one by one (PDB-violating ones first, each group
   from the most important pod down) while the pod still fits; stop once
   enough candidates are found (``minCandidateNodesPercentage`` /
   ``minCandidateNodesAbsolute``);
4. pick the best candidate (fewest PDB violations, lowest highest-victim
   priority, smallest priority sum, fewest victims, latest start of the
   highest-priority victims, then the first);
5. prepare it: reject waiting victims, mark and delete the others, clear the
   nomination of lower-priority pods nominated on that node.

Step 5 talks to the API server, so it runs as an asyncio task on the running
loop (or to completion when no loop runs); :meth:`Evaluator.wait_for_preparations`
awaits the pending ones.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from kubeplane.api.meta import meta_of as _meta
from kubeplane.api.resources import resource
from kubeplane.api.selectors import label_selector_from_dict
from kubeplane.scheduler.framework.nodeinfo import NodeInfo, PodInfo, pod_start_time
from kubeplane.scheduler.framework.types import Code, CycleState, Obj, Status

NO_NODE_AVAILABLE_MSG = "0/{} nodes are available"
MSG_NO_VICTIMS = "No preemption victims found for incoming pod"
MSG_NOT_HELPFUL = "Preemption is not helpful for scheduling"
MSG_NOT_ELIGIBLE_NEVER = "not eligible due to preemptionPolicy=Never."
MSG_NOT_ELIGIBLE_TERMINATING = "not eligible due to a terminating pod on the nominated node."
DISRUPTION_TARGET = "DisruptionTarget"
REASON_PREEMPTION_BY_SCHEDULER = "PreemptionByScheduler"
_MAX_INT32 = 2**31 - 1

#: pdb_lister() -> PodDisruptionBudget objects (policy/v1) of all namespaces
PDBLister = Callable[[], list[Obj]]


class NodeToStatus(dict):
    """Filter statuses by node name; nodes not present have ``absent_status``.

    A plain dict works too (absent nodes then count as
    ``UnschedulableAndUnresolvable``, as upstream's default).
    """

    def __init__(self, statuses: Mapping[str, Status] | None = None, absent_status: Status | None = None) -> None:
        super().__init__(statuses or {})
        self.absent_status: Status = absent_status or Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE)


def absent_status_of(statuses: Mapping[str, Status]) -> Status:
    return getattr(statuses, "absent_status", None) or Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE)


# --------------------------------------------------------------------------- pod helpers


def pod_priority(pod: Obj | PodInfo) -> int:
    if isinstance(pod, PodInfo):
        return pod.priority
    return int((pod.get("spec") or {}).get("priority") or 0)


def more_important_pod(a: Obj, b: Obj) -> bool:
    """Higher priority first; on equal priority the one started earlier."""
    pa, pb = pod_priority(a), pod_priority(b)
    if pa != pb:
        return pa > pb
    return pod_start_time(a) < pod_start_time(b)


def _importance_key(pi: PodInfo) -> tuple[int, float]:
    return (-pi.priority, pi.start_time)


def earliest_pod_start_time(victims: list[PodInfo]) -> float | None:
    """Earliest start time among the highest-priority victims."""
    if not victims:
        return None
    best_prio = victims[0].priority
    earliest = victims[0].start_time
    for v in victims:
        if v.priority == best_prio:
            earliest = min(earliest, v.start_time)
        elif v.priority > best_prio:
            best_prio = v.priority
            earliest = v.start_time
    return earliest


def pod_terminating_by_preemption(pod: Obj) -> bool:
    """Terminating, with condition ``DisruptionTarget=True`` reason ``PreemptionByScheduler``."""
    if not _meta(pod).get("deletionTimestamp"):
        return False
    for c in (pod.get("status") or {}).get("conditions") or ():
        if c.get("type") == DISRUPTION_TARGET:
            return c.get("status") == "True" and c.get("reason") == REASON_PREEMPTION_BY_SCHEDULER
    return False


def filter_pods_with_pdb_violation(
    pods: Iterable[PodInfo], pdbs: list[Obj]
) -> tuple[list[PodInfo], list[PodInfo]]:
    """Split pods into (violating, non-violating) if all of them were evicted, in order.

    Each matching PDB's ``status.disruptionsAllowed`` is decremented per pod
    (pods already listed in ``status.disruptedPods`` do not count); a pod is
    violating when any of its PDBs goes below zero. Empty selectors match
    nothing.
    """
    if not pdbs:
        return [], list(pods)
    allowed = [int((p.get("status") or {}).get("disruptionsAllowed") or 0) for p in pdbs]
    selectors = []
    for p in pdbs:
        try:
            selectors.append(label_selector_from_dict((p.get("spec") or {}).get("selector")))
        except Exception:  # noqa: BLE001 - an invalid PDB selector is skipped, as upstream
            selectors.append(None)
    violating: list[PodInfo] = []
    non_violating: list[PodInfo] = []
    for pi in pods:
        labels = _meta(pi.pod).get("labels") or {}
        violated = False
        if labels:
            for i, pdb in enumerate(pdbs):
                if (_meta(pdb).get("namespace") or "default") != pi.namespace:
                    continue
                sel = selectors[i]
                if sel is None or sel.empty or not sel.matches(labels):
                    continue
                if pi.name in ((pdb.get("status") or {}).get("disruptedPods") or {}):
                    continue
                allowed[i] -= 1
                if allowed[i] < 0:
                    violated = True
        (violating if violated else non_violating).append(pi)
    return violating, non_violating


# --------------------------------------------------------------------------- candidates


class _Usage:
    """What ``insufficient_resources`` reads of a node: allocatable, requested, pod count."""

    __slots__ = ("allocatable", "requested", "pods")

    def __init__(self, allocatable: Mapping[str, int], requested: Mapping[str, int], count: int) -> None:
        self.allocatable = allocatable
        self.requested = requested
        self.pods = range(count)


@dataclass
class Victims:
    pods: list[PodInfo] = field(default_factory=list)
    num_pdb_violations: int = 0


@dataclass
class Candidate:
    name: str
    victims: Victims


def pick_one_node_for_preemption(candidates: list[Candidate]) -> Candidate | None:
    """Upstream ``pickOneNodeForPreemption`` over candidates (ties keep candidate order)."""
    if not candidates:
        return None

    def min_pdb(c: Candidate) -> float:
        return -c.victims.num_pdb_violations

    def min_highest_priority(c: Candidate) -> float:
        return -c.victims.pods[0].priority

    def min_sum_priorities(c: Candidate) -> float:
        # Shift every priority to be non-negative so more negative-priority pods never win.
        return -sum(p.priority + _MAX_INT32 + 1 for p in c.victims.pods)

    def min_num_pods(c: Candidate) -> float:
        return -len(c.victims.pods)

    def latest_start_time(c: Candidate) -> float:
        t = earliest_pod_start_time(c.victims.pods)
        return -math.inf if t is None else t

    remaining = list(candidates)
    for f in (min_pdb, min_highest_priority, min_sum_priorities, min_num_pods, latest_start_time):
        scores = [f(c) for c in remaining]
        best = max(scores)
        remaining = [c for c, score in zip(remaining, scores) if score == best]
        if len(remaining) == 1:
            return remaining[0]
    return remaining[0]


def fit_error_message(num_all_nodes: int, statuses: Mapping[str, Status],
                      absent_status: Status | None = None) -> str:
    """``0/N nodes are available: <count> <reason>, ....`` as upstream ``FitError.Error``.

    Reasons are counted over explicit statuses plus ``absent_status`` for the
    remaining nodes, formatted ``"<count> <reason>"`` and sorted as strings.
    """
    histogram: dict[str, int] = {}
    for st in statuses.values():
        for r in st.reasons:
            histogram[r] = histogram.get(r, 0) + 1
    absent = num_all_nodes - len(statuses)
    if absent > 0:
        st = absent_status if absent_status is not None else absent_status_of(statuses)
        for r in st.reasons:
            histogram[r] = histogram.get(r, 0) + absent
    reasons = sorted(f"{n} {r}" for r, n in histogram.items())
    return NO_NODE_AVAILABLE_MSG.format(num_all_nodes) + ": " + ", ".join(reasons) + "."


def preemption_message(num_all_nodes: int, statuses: Mapping[str, Status]) -> str:
    """The ``preemption: ...`` suffix of a failed preemption: nodes not evaluated are "not helpful"."""
    return "preemption: " + fit_error_message(num_all_nodes, statuses, Status(
        Code.UNSCHEDULABLE_AND_UNRESOLVABLE, [MSG_NOT_HELPFUL]))


# --------------------------------------------------------------------------- evaluator


class Evaluator:
    """Preemption logic shared by PostFilter plugins; the policy hooks are overridable methods."""

    def __init__(
        self,
        plugin_name: str,
        handle: Any,
        *,
        pdb_lister: PDBLister | None = None,
        min_candidate_nodes_percentage: int = 10,
        min_candidate_nodes_absolute: int = 100,
    ) -> None:
        self.plugin_name = plugin_name
        self.handle = handle
        self.pdb_lister = pdb_lister
        self.min_candidate_nodes_percentage = min_candidate_nodes_percentage
        self.min_candidate_nodes_absolute = min_candidate_nodes_absolute
        self._tasks: set[asyncio.Task[Any]] = set()
        self.errors: list[BaseException] = []
        #: node name -> (NodeInfo generation, pod shape, (victims, PDB violations, status)) of
        #: resource-only dry runs: failed ones, and successful ones while there are no PDBs
        self._dry_run_memo: dict[str, tuple[int, Any, tuple[list[PodInfo], int, Status]]] = {}

    # ------------------------------------------------------------------ policy hooks

    def pod_eligible_to_preempt_others(self, pod_info: PodInfo, nominated_node_status: Status | None) -> tuple[bool, str]:
        pod = pod_info.pod
        if (pod.get("spec") or {}).get("preemptionPolicy") == "Never":
            return False, MSG_NOT_ELIGIBLE_NEVER
        nominated = (pod.get("status") or {}).get("nominatedNodeName") or ""
        if nominated:
            if nominated_node_status is not None and nominated_node_status.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE:
                return True, ""
            ni = self._node_info(nominated)
            if ni is not None:
                for p in ni.pods:
                    if p.priority < pod_info.priority and pod_terminating_by_preemption(p.pod):
                        return False, MSG_NOT_ELIGIBLE_TERMINATING
        return True, ""

    def calculate_num_candidates(self, num_nodes: int) -> int:
        n = num_nodes * self.min_candidate_nodes_percentage // 100
        n = max(n, self.min_candidate_nodes_absolute)
        return min(n, num_nodes)

    def get_offset_and_num_candidates(self, num_nodes: int) -> tuple[int, int]:
        return self.handle.rng.randrange(num_nodes), self.calculate_num_candidates(num_nodes)

    def is_preemption_allowed(self, victim: PodInfo, preemptor: PodInfo) -> bool:
        return victim.priority < preemptor.priority

    # ------------------------------------------------------------------ helpers

    def _node_infos(self) -> list[NodeInfo]:
        snap = self.handle.snapshot
        return list(snap.node_info_list) if snap is not None else []

    def _node_info(self, name: str) -> NodeInfo | None:
        snap = self.handle.snapshot
        if snap is None:
            return None
        try:
            return snap.get(name)
        except KeyError:
            return None

    def _pdbs(self) -> list[Obj]:
        if self.pdb_lister is not None:
            return list(self.pdb_lister() or ())
        lister = self.handle.list_objects
        if lister is not None:
            return list(lister("poddisruptionbudgets", None) or ())
        return []

    # ------------------------------------------------------------------ main flow

    def preempt(
        self, state: CycleState, pod_info: PodInfo, statuses: Mapping[str, Status]
    ) -> tuple[str | None, Status]:
        """Returns (nominated node, status). ``""`` as node means "clear the nomination"."""
        pod = pod_info.pod
        nominated = (pod.get("status") or {}).get("nominatedNodeName") or ""
        ok, msg = self.pod_eligible_to_preempt_others(pod_info, statuses.get(nominated) if nominated else None)
        if not ok:
            return None, Status.unschedulable(msg)
        all_nodes = self._node_infos()
        try:
            candidates, node_statuses = self.find_candidates(state, pod_info, statuses, all_nodes)
        except Exception as e:  # noqa: BLE001 - surfaced as an Error status
            return None, Status.as_status(e)
        if not candidates:
            absent = Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, [MSG_NOT_HELPFUL])
            return "", Status.unschedulable(fit_error_message(len(all_nodes), node_statuses, absent))
        best = self.select_candidate(candidates)
        if best is None or not best.name:
            return None, Status.unschedulable("no candidate node for preemption")
        self._run(self.prepare_candidate(best, pod_info))
        return best.name, Status.success()

    def find_candidates(
        self, state: CycleState, pod_info: PodInfo, statuses: Mapping[str, Status], all_nodes: list[NodeInfo]
    ) -> tuple[list[Candidate], dict[str, Status]]:
        if not all_nodes:
            raise RuntimeError("no nodes available")
        absent = absent_status_of(statuses)
        by_name = getattr(statuses, "by_name", None)  # the scheduler's NodeStatuses: one plain dict
        lookup = (by_name() if by_name is not None else statuses).get
        potential = [ni for ni in all_nodes if lookup(ni.name, absent).code == Code.UNSCHEDULABLE]
        if not potential:
            if (pod_info.pod.get("status") or {}).get("nominatedNodeName"):
                self._run(self.clear_nominated_node_name([pod_info.pod]))
            return [], {}
        offset, num = self.get_offset_and_num_candidates(len(potential))
        return self.dry_run_preemption(state, pod_info, potential, self._pdbs(), offset, num)

    def dry_run_preemption(
        self, state: CycleState, pod_info: PodInfo, potential: list[NodeInfo], pdbs: list[Obj],
        offset: int, num_candidates: int,
    ) -> tuple[list[Candidate], dict[str, Status]]:
        non_violating: list[Candidate] = []
        violating: list[Candidate] = []
        node_statuses: dict[str, Status] = {}
        errors: list[str] = []
        allowed = self.is_preemption_allowed
        no_victims: Status | None = None
        arithmetic = self._resource_only_filters(state, pod_info)
        nominator = self.handle.nominator
        memo = self._dry_run_memo
        if len(memo) > 2 * len(potential) + 1024:
            memo.clear()
        # With PDBs a dry run's outcome also depends on them: only failures (the pod
        # does not fit even with every lower-priority pod gone) are reused then.
        reuse_found = not pdbs
        shape = arithmetic[3] if arithmetic is not None else None
        nominated_nodes: set[str] | None = None
        listing = getattr(nominator, "nominated_nodes", None)
        if nominator is not None and listing is not None:
            nominated_nodes = {n for n, pods in listing().items() if pods} if len(nominator) else set()
        for i in range(len(potential)):
            original = potential[(offset + i) % len(potential)]
            if nominated_nodes is not None:
                nominated_here = original.name in nominated_nodes
            else:
                nominated_here = nominator is not None and bool(nominator.nominated_pods_for_node(original.name))
            if shape is not None and not nominated_here:
                hit = memo.get(original.name)
                if hit is not None and hit[0] == original.generation and hit[1] == shape:
                    # Same node state, same kind of preemptor: the same dry run.
                    victims, n_violations, status = hit[2]
                    if not status.is_success():
                        node_statuses[original.name] = status
                        continue
                    c = Candidate(original.name, Victims(list(victims), n_violations))
                    (non_violating if n_violations == 0 else violating).append(c)
                    if non_violating and len(non_violating) + len(violating) >= num_candidates:
                        break
                    continue
            if not any(allowed(p, pod_info) for p in original.pods):
                # Nothing to remove: the node stays as it is and cannot become feasible
                # (the dry run's own first check, without cloning state and node).
                if no_victims is None:
                    no_victims = Status.unresolvable(MSG_NO_VICTIMS)
                node_statuses[original.name] = no_victims
                continue
            ni = original
            found = None
            if arithmetic is not None and not nominated_here:
                found = self._select_victims_by_resources(state, pod_info, ni, pdbs, *arithmetic[:3])
                if found is not None and (not found[2].is_success() or (reuse_found and found[0])):
                    memo[ni.name] = (ni.generation, shape, (list(found[0]), found[1], found[2]))
            if found is None:
                ni = original.clone()
                found = self.select_victims_on_node(state.clone(), pod_info, ni, pdbs)
            victims, n_violations, status = found
            if status.is_success() and victims:
                c = Candidate(ni.name, Victims(victims, n_violations))
                (non_violating if n_violations == 0 else violating).append(c)
                if non_violating and len(non_violating) + len(violating) >= num_candidates:
                    break
                continue
            if status.is_success():
                status = Status.as_status(RuntimeError(f"expected at least one victim pod on node {ni.name!r}"))
            if status.code == Code.ERROR:
                errors.append(status.message())
            node_statuses[ni.name] = status
        candidates = non_violating[:num_candidates] + violating[:num_candidates]
        if errors and not candidates:
            raise RuntimeError(errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]")
        return candidates, node_statuses

    def select_victims_on_node(
        self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo, pdbs: list[Obj]
    ) -> tuple[list[PodInfo], int, Status]:
        """Minimal victims on a (cloned) node, their PDB violation count, and a status."""
        fw = self.handle.framework

        def remove(p: PodInfo) -> None:
            node_info.remove_pod(p)
            s = fw.run_pre_filter_extension_remove_pod(state, pod_info, p, node_info)
            if s is not None and not s.is_success():
                raise RuntimeError(s.message())

        def add(p: PodInfo) -> None:
            node_info.add_pod(p)
            s = fw.run_pre_filter_extension_add_pod(state, pod_info, p, node_info)
            if s is not None and not s.is_success():
                raise RuntimeError(s.message())

        def fits() -> Status | None:
            return fw.run_filter_plugins_with_nominated_pods(state, pod_info, node_info)

        try:
            potential = [p for p in list(node_info.pods) if self.is_preemption_allowed(p, pod_info)]
            for p in potential:
                remove(p)
            if not potential:
                return [], 0, Status.unresolvable(MSG_NO_VICTIMS)
            s = fits()
            if s is not None and not s.is_success():
                return [], 0, s
            potential.sort(key=_importance_key)
            violating, non_violating = filter_pods_with_pdb_violation(potential, pdbs)
            victims: list[PodInfo] = []
            num_violating = 0
            for group, counts in ((violating, True), (non_violating, False)):
                for p in group:
                    add(p)
                    s = fits()
                    if s is None or s.is_success():
                        continue
                    remove(p)
                    victims.append(p)
                    if counts:
                        num_violating += 1
            if violating and non_violating:
                victims.sort(key=_importance_key)
            return victims, num_violating, Status.success()
        except Exception as e:  # noqa: BLE001
            return [], 0, Status.as_status(e)

    def _resource_only_filters(self, state: CycleState, pod_info: PodInfo) -> tuple[Any, Any, list[Any], Any] | None:
        """(NodeResourcesFit, its checked requests, node-only filter plugins, shape key) when, for
        this pod and cycle, no other Filter plugin runs: then whether the pod fits a node after some
        pods are removed is resource arithmetic (plus node-only checks, independent of the pods).

        The shape key holds everything of the pod such a dry run depends on (priority, requests,
        the fields node-only plugins read), so a failed dry run can be reused for another pod of
        the same shape while the node is unchanged (same NodeInfo generation).

        The plugins say what they are: ``fit_requests`` (Filter is resource arithmetic) and
        ``filter_pod_view`` (Filter reads only the node object and that view of the pod)."""
        fw = self.handle.framework
        if fw is None:
            return None
        skip = state.skip_filter_plugins
        fit = checked = None
        node_only: list[Any] = []
        views: list[Any] = []
        for pl in fw.filter_plugins:
            if skip and pl.name in skip:
                continue
            if fit is None:
                checked = pl.fit_requests(state, pod_info)
                if checked is not None:
                    fit = pl
                    continue
            try:
                view = pl.filter_pod_view(pod_info)
            except TypeError:
                return None
            if view is None:
                return None
            node_only.append(pl)
            views.append(view)
        if fit is None or checked is None:
            return None
        requests, pairs = checked
        shape = (pod_info.priority, tuple(sorted(requests.items())), pairs, tuple(views),
                 tuple(id(pl) for pl in node_only), id(fit))
        return fit, pairs, node_only, shape

    def _select_victims_by_resources(
        self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo, pdbs: list[Obj],
        fit: Any, pairs: tuple[tuple[str, int], ...], node_only: list[Any],
    ) -> tuple[list[PodInfo], int, Status] | None:
        """:meth:`select_victims_on_node` when only NodeResourcesFit depends on the node's pods.

        Same victims, order, violation count and status, computed on request
        sums without cloning the node or the cycle state. None when a
        node-only plugin rejects the pod: the caller then runs the general
        dry run, which reports that plugin's status."""
        if type(self).is_preemption_allowed is Evaluator.is_preemption_allowed:
            prio = pod_info.priority
            potential = [p for p in node_info.pods if p.priority < prio]
        else:
            potential = [p for p in node_info.pods if self.is_preemption_allowed(p, pod_info)]
        if not potential:
            return [], 0, Status.unresolvable(MSG_NO_VICTIMS)
        for pl in node_only:
            s = pl.filter(state, pod_info, node_info)
            if s is not None and s.code != Code.SUCCESS:
                return None
        allowed_pods = node_info.allocatable.get("pods", 0)
        alloc = node_info.allocatable
        used = dict(node_info.requested)
        for p in potential:
            for k, v in p.requests.items():
                used[k] = used.get(k, 0) - v
        count = len(node_info.pods) - len(potential)

        def fits() -> bool:
            if not count < allowed_pods:
                return False
            for name, value in pairs:
                if value > alloc.get(name, 0) - used.get(name, 0):
                    return False
            return True

        if not fits():
            # The general dry run's verdict: the fit plugin's status on the node without the
            # removable pods (the node-only plugins pass, so it is the first to reject).
            return [], 0, fit.fit_status(state, pod_info, _Usage(alloc, used, count))
        potential.sort(key=_importance_key)
        violating, non_violating = filter_pods_with_pdb_violation(potential, pdbs)
        victims: list[PodInfo] = []
        num_violating = 0
        for group, counts in ((violating, True), (non_violating, False)):
            for p in group:
                count += 1
                for k, v in p.requests.items():
                    used[k] = used.get(k, 0) + v
                if fits():
                    continue
                count -= 1
                for k, v in p.requests.items():
                    used[k] -= v
                victims.append(p)
                if counts:
                    num_violating += 1
        if violating and non_violating:
            victims.sort(key=_importance_key)
        return victims, num_violating, Status.success()

    def select_candidate(self, candidates: list[Candidate]) -> Candidate | None:
        if not candidates:
            return None
        if len(candidates) == 1:
            return candidates[0]
        return pick_one_node_for_preemption(candidates)

    # ------------------------------------------------------------------ API side effects

    def _run(self, coro: Any) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None:
            try:
                asyncio.run(coro)
            except Exception as e:  # noqa: BLE001 - recorded, preemption is best effort
                self.errors.append(e)
            return
        task = loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: "asyncio.Task[Any]") -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.errors.append(task.exception())  # type: ignore[arg-type]

    async def wait_for_preparations(self) -> None:
        """Wait until every background preparation task has finished."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def prepare_candidate(self, candidate: Candidate, pod_info: PodInfo) -> None:
        """Evict the victims and clear lower-priority nominations on the candidate node."""
        errs: list[BaseException] = []
        for victim in candidate.victims.pods:
            try:
                await self.preempt_pod(candidate, pod_info, victim)
            except Exception as e:  # noqa: BLE001
                errs.append(e)
        if errs:
            raise errs[0]
        nominator = self.handle.nominator
        if nominator is None:
            return
        lower: list[Obj] = []
        for np_ in nominator.nominated_pods_for_node(candidate.name):
            p = np_ if isinstance(np_, dict) else np_.pod
            if pod_priority(p) < pod_info.priority:
                lower.append(p)
        await self.clear_nominated_node_name(lower)

    async def preempt_pod(self, candidate: Candidate, preemptor: PodInfo, victim: PodInfo) -> None:
        """Reject a waiting victim, or mark it as a disruption target and delete it."""
        fw = self.handle.framework
        if fw is not None and fw.get_waiting_pod(victim.uid) is not None:
            fw.reject_waiting_pod(victim.uid, self.plugin_name, "preempted")
            return
        client = self.handle.client
        if client is None:
            raise RuntimeError("no client configured for preemption")
        scheduler_name = (preemptor.pod.get("spec") or {}).get("schedulerName") or "default-scheduler"
        condition = {
            "type": DISRUPTION_TARGET,
            "status": "True",
            "reason": REASON_PREEMPTION_BY_SCHEDULER,
            "message": f"{scheduler_name}: preempting to accommodate a higher priority pod",
        }
        try:
            if _condition_changes((victim.pod.get("status") or {}).get("conditions") or [], condition):
                await client.patch(resource("pods"), victim.name, {"status": {"conditions": [condition]}},
                                   victim.namespace, patch_type="strategic", subresource="status")
            await client.delete(resource("pods"), victim.name, victim.namespace)
        except Exception as e:  # noqa: BLE001 - a victim that is already gone is fine
            if getattr(e, "code", None) != 404:
                raise
        recorder = self.handle.event_recorder
        if recorder is not None:
            recorder.eventf(victim.pod, preemptor.pod, "Normal", "Preempted", "Preempting",
                            f"Preempted by pod {preemptor.uid} on node {candidate.name}")

    async def clear_nominated_node_name(self, pods: Iterable[Obj]) -> None:
        """Patch ``status.nominatedNodeName`` away on pods that have one."""
        client = self.handle.client
        if client is None:
            return
        errs: list[BaseException] = []
        for p in pods:
            if not (p.get("status") or {}).get("nominatedNodeName"):
                continue
            meta = _meta(p)
            try:
                await client.patch(resource("pods"), meta.get("name"), {"status": {"nominatedNodeName": None}},
                                   meta.get("namespace"), patch_type="merge", subresource="status")
            except Exception as e:  # noqa: BLE001
                errs.append(e)
        if errs:
            raise errs[0]


def _condition_changes(conditions: list[Obj], cond: Obj) -> bool:
    for c in conditions:
        if c.get("type") == cond["type"]:
            return any(c.get(k) != cond[k] for k in ("status", "reason", "message"))
    return True
