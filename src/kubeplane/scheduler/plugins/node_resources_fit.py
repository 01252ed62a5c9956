"""NodeResourcesFit: does the node have room for the pod's requests; resource scoring.

Filter reports every insufficient resource ("Too many pods", "Insufficient
cpu", ...). Scoring strategies: LeastAllocated (default, cpu and memory with
weight 1), MostAllocated and RequestedToCapacityRatio (broken-linear shape
over utilization, shape scores 0..10 scaled to 0..100).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import numpy as np

from kubeplane.scheduler.framework.fastpath import (
    A_PODS, COL_OF_ALLOC, COL_OF_NZ, COL_OF_REQ, N_PODS, SAFE_LIMIT, NodeArrays, OutOfRange, gather,
)
from kubeplane.scheduler.framework.nodeinfo import (
    CPU, EPHEMERAL_STORAGE, MEMORY, PODS, NodeInfo, PodInfo,
    is_extended_resource_name, is_scalar_resource_name, pod_requests, resource_list,
)
from kubeplane.scheduler.framework.plugin import Plugin
from kubeplane.scheduler.framework.types import (
    ActionType, ClusterEvent, ClusterEventWithHint, CycleState, EventResource, MAX_NODE_SCORE, MIN_NODE_SCORE, Obj,
    PreFilterResult, QueueingHint, Status,
)

LEAST_ALLOCATED = "LeastAllocated"
MOST_ALLOCATED = "MostAllocated"
REQUESTED_TO_CAPACITY_RATIO = "RequestedToCapacityRatio"
MAX_CUSTOM_PRIORITY_SCORE = 10
MAX_UTILIZATION = 100
DEFAULT_RESOURCES = [{"name": CPU, "weight": 1}, {"name": MEMORY, "weight": 1}]
DEFAULT_SHAPE = [{"utilization": 0, "score": 10}, {"utilization": 100, "score": 0}]
_PRE_FILTER_KEY = "PreFilterNodeResourcesFit"
_NATIVE = (CPU, MEMORY, EPHEMERAL_STORAGE)
TOO_MANY_PODS = "Too many pods"


def insufficient(name: str) -> str:
    """Filter's reason for a resource that does not fit."""
    return f"Insufficient {name}"


def _go_div(a: int, b: int) -> int:
    """Integer division truncating toward zero, as Go does."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def insufficient_resources(
    requests: Mapping[str, int], node_info: NodeInfo,
    ignored: frozenset[str] = frozenset(), ignored_groups: frozenset[str] = frozenset(),
) -> list[tuple[str, str, int, int, int]]:
    """``(resource, reason, requested, used, capacity)`` for every resource that does not fit."""
    out: list[tuple[str, str, int, int, int]] = []
    alloc, used = node_info.allocatable, node_info.requested
    allowed = alloc.get("pods", 0)
    if len(node_info.pods) + 1 > allowed:
        out.append(("pods", TOO_MANY_PODS, 1, len(node_info.pods), allowed))
    if not any(requests.values()):
        return out
    names = [n for n in (CPU, MEMORY, EPHEMERAL_STORAGE) if n in requests]
    names.extend(n for n in requests if n not in _NATIVE)
    for name in names:
        value = requests[name]
        if value == 0:
            continue
        if name not in _NATIVE and is_extended_resource_name(name):
            if name in ignored or (ignored_groups and name.split("/", 1)[0] in ignored_groups):
                continue
        if value > alloc.get(name, 0) - used.get(name, 0):
            out.append((name, insufficient(name), value, used.get(name, 0), alloc.get(name, 0)))
    return out


def fits_requests(pairs: tuple[tuple[str, int], ...], allocatable: Mapping[str, int],
                  requested: Mapping[str, int], pod_count: int) -> bool:
    """Filter's check: room for one more pod and for every checked ``(resource, value)``."""
    if not pod_count < allocatable.get(PODS, 0):
        return False
    for name, value in pairs:
        if value > allocatable.get(name, 0) - requested.get(name, 0):
            return False
    return True


def _fits_empty_node(pod: Obj, node: Obj | None) -> bool:
    if node is None:
        return False
    return not insufficient_resources(pod_requests(pod), NodeInfo(node))


# --------------------------------------------------------------------------- scorers


def least_requested_score(requested: int, capacity: int) -> int:
    if capacity == 0 or requested > capacity:
        return 0
    return (capacity - requested) * MAX_NODE_SCORE // capacity


def most_requested_score(requested: int, capacity: int) -> int:
    if capacity == 0:
        return 0
    if requested > capacity:
        requested = capacity
    return requested * MAX_NODE_SCORE // capacity


def broken_linear_function(shape: list[tuple[int, int]]) -> Callable[[int], int]:
    def f(p: int) -> int:
        for i, (u, s) in enumerate(shape):
            if p <= u:
                if i == 0:
                    return shape[0][1]
                pu, ps = shape[i - 1]
                return ps + _go_div((s - ps) * (p - pu), (u - pu))
        return shape[-1][1]
    return f


Scorer = Callable[[list[int], list[int]], int]


def weighted_scorer(per_resource: Callable[[int, int], int], weights: list[int]) -> Scorer:
    def score(requested: list[int], allocatable: list[int]) -> int:
        node_score = weight_sum = 0
        for i, alloc in enumerate(allocatable):
            if alloc == 0:
                continue
            node_score += per_resource(requested[i], alloc) * weights[i]
            weight_sum += weights[i]
        return node_score // weight_sum if weight_sum else 0
    return score


def requested_to_capacity_ratio_scorer(shape: list[Mapping[str, int]], weights: list[int]) -> Scorer:
    points = [(int(p["utilization"]), int(p["score"]) * (MAX_NODE_SCORE // MAX_CUSTOM_PRIORITY_SCORE)) for p in shape]
    raw = broken_linear_function(points)

    def resource_score(requested: int, capacity: int) -> int:
        if capacity == 0 or requested > capacity:
            return raw(MAX_UTILIZATION)
        return raw(requested * MAX_UTILIZATION // capacity)

    def score(requested: list[int], allocatable: list[int]) -> int:
        node_score = weight_sum = 0
        for i, alloc in enumerate(allocatable):
            if alloc == 0:
                continue
            rs = resource_score(requested[i], alloc)
            if rs > 0:
                node_score += rs * weights[i]
                weight_sum += weights[i]
        return int(math.floor(node_score / weight_sum + 0.5)) if weight_sum else 0
    return score


# --------------------------------------------------------------------------- vectorised scorers
#
# The same integer arithmetic as the scorers above, over ``len(names) x rows``
# int64 arrays of allocatable and requested values (``safe_alloc`` is
# ``alloc`` with zeros replaced by 1; ``present`` marks nonzero allocatable,
# None when every value is).


def least_allocated_scores(alloc: np.ndarray, req: np.ndarray, safe_alloc: np.ndarray) -> np.ndarray:
    """``least_requested_score`` per resource and row."""
    per = alloc - req
    fits = bool((per >= 0).all())
    per *= MAX_NODE_SCORE
    per //= safe_alloc
    return per if fits else np.where(req <= alloc, per, 0)


def most_allocated_scores(alloc: np.ndarray, req: np.ndarray, safe_alloc: np.ndarray) -> np.ndarray:
    """``most_requested_score`` per resource and row."""
    per = np.minimum(req, alloc)
    per *= MAX_NODE_SCORE
    per //= safe_alloc
    return per


def weighted_scores(per: np.ndarray, weights: list[int], present: np.ndarray | None) -> np.ndarray:
    """``weighted_scorer``'s sum over resources with nonzero allocatable, per row."""
    n = len(weights)
    if present is None:
        if len(set(weights)) == 1:
            return per.sum(axis=0) // n if n > 1 else per[0]
        wcol = np.array(weights, dtype=np.int64)[:, None]
        return (per * wcol).sum(axis=0) // sum(weights)
    wcol = np.array(weights, dtype=np.int64)[:, None]
    node_score = (per * wcol * present).sum(axis=0)
    weight_sum = (wcol * present).sum(axis=0)
    return np.where(weight_sum > 0, node_score // np.maximum(weight_sum, 1), 0)


def memoized_resource_scores(pl: Any, state: CycleState, pod_info: PodInfo, arr: NodeArrays, rows: np.ndarray,
                             sel: Any, scores: Callable[..., np.ndarray] | None, constant: int) -> Any:
    """Scores of a ``ResourceAllocationScorer`` plugin (``pl.scorer``) for ``rows``
    (``sel`` selects them in the arrays), memoized per pod requests: ``scores(alloc,
    req, present, safe_alloc)`` over the arrays, or ``constant`` when no resource
    is scored or ``scores`` is None (every row scores the same); None when the columns cannot
    hold the resources or values, or a score leaves the valid range (the
    plugin itself then reports it)."""
    names = pl.scorer.names
    if len(set(names)) != len(names) or any(nm not in COL_OF_NZ for nm in names):
        return None
    if arr.num_big and arr.big[rows].any():
        return None
    reqs = pl.pre_score_requests(state, pod_info)
    if any(not -SAFE_LIMIT < v < SAFE_LIMIT for v in reqs):
        return None
    if not names or scores is None:
        return constant
    key = ("score", id(pl), tuple(names), tuple(reqs))
    infos = arr.node_infos
    used_cols = COL_OF_REQ if pl.scorer.use_requested else COL_OF_NZ
    cols = arr.cols

    def compute(sel: Any) -> np.ndarray:
        alloc = gather(cols, [COL_OF_ALLOC[nm] for nm in names], sel)
        req = gather(cols, [used_cols[nm] for nm in names], sel) + np.array(reqs, dtype=np.int64)[:, None]
        if int(alloc.min()) > 0:
            present, safe_alloc = None, alloc
        else:
            present = alloc != 0
            safe_alloc = np.where(present, alloc, 1)
        out = scores(alloc, req, present, safe_alloc)
        if len(out) and (int(out.min()) < MIN_NODE_SCORE or int(out.max()) > MAX_NODE_SCORE):
            raise OutOfRange
        return out

    def compute_one(row: int) -> int:
        sc = pl.scorer.score(infos[row], reqs)
        if sc < MIN_NODE_SCORE or sc > MAX_NODE_SCORE:
            raise OutOfRange
        return sc

    try:
        return arr.memoized(key, np.int64, compute, compute_one, sel)
    except OutOfRange:
        return None


class ResourceAllocationScorer:
    """Shared by Fit scoring and BalancedAllocation: per-resource (requested, allocatable) lists."""

    def __init__(self, resources: list[Mapping[str, Any]], scorer: Callable[[list[int], list[int]], int],
                 use_requested: bool) -> None:
        self.names = [r["name"] for r in resources]
        self.scalar = [is_scalar_resource_name(n) for n in self.names]
        self.scorer = scorer
        self.use_requested = use_requested

    def pod_request_list(self, pod_info: PodInfo) -> list[int]:
        if self.use_requested:
            reqs = pod_info.requests
            return [reqs.get(n, 0) for n in self.names]
        out = []
        for n in self.names:
            if n == CPU:
                out.append(pod_info.non_zero_cpu)
            elif n == MEMORY:
                out.append(pod_info.non_zero_memory)
            else:
                out.append(pod_info.requests.get(n, 0))
        return out

    def score(self, node_info: NodeInfo, pod_requests_list: list[int]) -> int:
        requested = node_info.requested if self.use_requested else node_info.non_zero_requested
        alloc = node_info.allocatable
        req_out: list[int] = []
        alloc_out: list[int] = []
        for i, n in enumerate(self.names):
            pr = pod_requests_list[i]
            if pr == 0 and self.scalar[i]:
                req_out.append(0)
                alloc_out.append(0)
                continue
            if n == CPU or n == MEMORY:
                a, r = alloc.get(n, 0), requested.get(n, 0) + pr
            elif n in alloc:
                a, r = alloc[n], node_info.requested.get(n, 0) + pr
            else:
                a, r = 0, 0
            req_out.append(r)
            alloc_out.append(a)
        return self.scorer(req_out, alloc_out)


class NodeResourcesFit(Plugin):
    name = "NodeResourcesFit"

    def __init__(self, args: dict | None, handle: Any) -> None:
        super().__init__(args, handle)
        self.ignored = frozenset(self.args.get("ignoredResources") or ())
        self.ignored_groups = frozenset(self.args.get("ignoredResourceGroups") or ())
        strategy = self.args.get("scoringStrategy") or {}
        self.strategy = strategy.get("type") or LEAST_ALLOCATED
        resources = [dict(r) for r in (strategy.get("resources") or DEFAULT_RESOURCES)]
        for r in resources:
            r["weight"] = int(r.get("weight") or 1)
        weights = [r["weight"] for r in resources]
        if self.strategy == LEAST_ALLOCATED:
            scorer = weighted_scorer(least_requested_score, weights)
        elif self.strategy == MOST_ALLOCATED:
            scorer = weighted_scorer(most_requested_score, weights)
        elif self.strategy == REQUESTED_TO_CAPACITY_RATIO:
            shape = (strategy.get("requestedToCapacityRatio") or {}).get("shape") or DEFAULT_SHAPE
            scorer = requested_to_capacity_ratio_scorer(shape, weights)
        else:
            raise ValueError(f"scoring strategy {self.strategy} is not supported")
        self.resources = resources
        self.scorer = ResourceAllocationScorer(resources, scorer, use_requested=False)

    def pre_filter(
        self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]
    ) -> tuple[PreFilterResult | None, Status | None]:
        state.write(_PRE_FILTER_KEY, self._checked(pod_info.requests))
        return None, None

    def _checked(self, requests: Mapping[str, int]) -> tuple[Mapping[str, int], tuple[tuple[str, int], ...]]:
        """The requests and the (name, value) pairs the filter must check."""
        pairs = []
        for name, value in requests.items():
            if value == 0:
                continue
            if name not in _NATIVE and is_extended_resource_name(name) and (
                name in self.ignored or name.split("/", 1)[0] in self.ignored_groups
            ):
                continue
            pairs.append((name, value))
        return requests, tuple(pairs)

    def checked_requests(
        self, state: CycleState, pod_info: PodInfo
    ) -> tuple[Mapping[str, int], tuple[tuple[str, int], ...]]:
        """The PreFilter state: requests and the (name, value) pairs Filter checks."""
        checked = state.get(_PRE_FILTER_KEY)
        if checked is None:
            checked = self._checked(pod_info.requests)
        return checked

    def filter(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> Status | None:
        requests, pairs = self.checked_requests(state, pod_info)
        if fits_requests(pairs, node_info.allocatable, node_info.requested, len(node_info.pods)):
            return None
        return self._insufficient_status(requests, node_info)

    def _insufficient_status(self, requests: Mapping[str, int], usage: Any) -> Status:
        bad = insufficient_resources(requests, usage, self.ignored, self.ignored_groups)
        return Status.unschedulable(*(b[1] for b in bad))

    def fit_requests(
        self, state: CycleState, pod_info: PodInfo
    ) -> tuple[Mapping[str, int], tuple[tuple[str, int], ...]]:
        return self.checked_requests(state, pod_info)

    def fit_status(self, state: CycleState, pod_info: PodInfo, usage: Any) -> Status | None:
        requests, _ = self.checked_requests(state, pod_info)
        return self._insufficient_status(requests, usage).with_plugin(self.name)

    # ------------------------------------------------------------------ vectorised Filter

    def filter_mask(self, state: CycleState, pod_info: PodInfo, arr: NodeArrays) -> Any:
        """Filter's own check over the columns, memoized per checked requests."""
        _, pairs = self.checked_requests(state, pod_info)
        cols = arr.cols
        checks: list[tuple[int, int, int]] = []
        for name, value in pairs:
            col = COL_OF_ALLOC.get(name)
            if col is None or not -SAFE_LIMIT < value < SAFE_LIMIT:
                return None
            checks.append((col, COL_OF_REQ[name], value))
        big = arr.big
        key = ("fit", tuple(checks))
        infos = arr.node_infos

        def compute_one(row: int) -> bool:
            ni = infos[row]
            return not big[row] and fits_requests(pairs, ni.allocatable, ni.requested, len(ni.pods))

        def compute(sel: Any) -> Any:
            ok = cols[N_PODS, sel] < cols[A_PODS, sel]
            for a, r, value in checks:
                ok &= cols[a, sel] - cols[r, sel] >= value
            ok &= ~big[sel]
            return ok
        return lambda sel: arr.memoized(key, bool, compute, compute_one, sel)

    def filter_mask_certain(self, state: CycleState, pod_info: PodInfo, arr: NodeArrays) -> Any:
        # The mask is Filter's own check, except on rows with huge quantities.
        return True if arr.num_big == 0 else ~arr.big

    def filter_status_builder(self, state: CycleState, pod_info: PodInfo, arr: NodeArrays) -> Any:
        """Filter's reasons from the columns: one Status per distinct set of reasons."""
        _, pairs = self.checked_requests(state, pod_info)
        if any(name not in COL_OF_ALLOC for name, _ in pairs):
            return None
        # insufficient_resources' order: pods, then cpu, memory, ephemeral-storage
        checks = sorted(pairs, key=lambda nv: _NATIVE.index(nv[0]))
        cols, big = arr.cols, arr.big
        name = self.name

        def fit_statuses(rows: np.ndarray) -> tuple[Any, list[Status]]:
            code = (cols[N_PODS, rows] >= cols[A_PODS, rows]).astype(np.int64)
            for bit, (res, value) in enumerate(checks, 1):
                short = cols[COL_OF_ALLOC[res], rows] - cols[COL_OF_REQ[res], rows] < value
                code |= short.astype(np.int64) << bit
            code[big[rows]] = 0  # rows too big for the arrays: not stated here
            # One Status per distinct code, spread over the rows by numpy.
            distinct, where = np.unique(code, return_inverse=True)
            made = np.empty(len(distinct), dtype=object)
            for k, c in enumerate(distinct.tolist()):
                if not c:
                    continue  # None: passes, or not known
                reasons = [TOO_MANY_PODS] if c & 1 else []
                reasons.extend(insufficient(res) for bit, (res, _) in enumerate(checks, 1) if c >> bit & 1)
                made[k] = Status.unschedulable(*reasons, plugin=name)
            return made[where.reshape(-1)], [m for m in made.tolist() if m is not None]
        return fit_statuses

    def pre_score(self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]) -> Status | None:
        state.write("PreScore" + self.name, self.scorer.pod_request_list(pod_info))
        return None

    def pre_score_requests(self, state: CycleState, pod_info: PodInfo) -> list[int]:
        """The pod's request per scored resource (PreScore state, or computed)."""
        reqs = state.get("PreScore" + self.name)
        if reqs is None:
            reqs = self.scorer.pod_request_list(pod_info)
        return reqs

    def score(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> tuple[int, Status | None]:
        return self.scorer.score(node_info, self.pre_score_requests(state, pod_info)), None

    def score_vector(self, state: CycleState, pod_info: PodInfo, arr: NodeArrays, rows: np.ndarray,
                     nodes: list[NodeInfo], sel: Any) -> Any:
        if self.strategy not in (LEAST_ALLOCATED, MOST_ALLOCATED):
            return None
        weights = [int(r["weight"]) for r in self.resources]
        per_resource = least_allocated_scores if self.strategy == LEAST_ALLOCATED else most_allocated_scores

        def scores(alloc: np.ndarray, req: np.ndarray, present: np.ndarray | None, safe_alloc: np.ndarray) -> Any:
            return weighted_scores(per_resource(alloc, req, safe_alloc), weights, present)
        return memoized_resource_scores(self, state, pod_info, arr, rows, sel, scores, 0)

    def events_to_register(self) -> list[ClusterEventWithHint]:
        return [
            ClusterEventWithHint(ClusterEvent(EventResource.POD, ActionType.DELETE | ActionType.UPDATE_POD_SCALE_DOWN),
                                 self.is_schedulable_after_pod_event),
            ClusterEventWithHint(ClusterEvent(EventResource.NODE, ActionType.ADD | ActionType.UPDATE_NODE_ALLOCATABLE),
                                 self.is_schedulable_after_node_change),
        ]

    def is_schedulable_after_pod_event(self, pod: Obj, old: Any, new: Any) -> QueueingHint:
        if new is None:
            if not ((old or {}).get("spec") or {}).get("nodeName"):
                return QueueingHint.SKIP
            return QueueingHint.QUEUE
        if (new.get("metadata") or {}).get("uid") == (pod.get("metadata") or {}).get("uid"):
            return QueueingHint.QUEUE
        if not (new.get("spec") or {}).get("nodeName"):
            return QueueingHint.SKIP
        before, after = pod_requests(old or {}), pod_requests(new)
        for name, value in pod_requests(pod).items():
            if value and before.get(name, 0) > after.get(name, 0):
                return QueueingHint.QUEUE
        return QueueingHint.SKIP

    def is_schedulable_after_node_change(self, pod: Obj, old: Any, new: Any) -> QueueingHint:
        if not _fits_empty_node(pod, new):
            return QueueingHint.SKIP
        if old is None:
            return QueueingHint.QUEUE
        return QueueingHint.QUEUE if _requested_resources_increased(pod, old, new) else QueueingHint.SKIP


def _requested_resources_increased(pod: Obj, old: Obj, new: Obj) -> bool:
    a = resource_list((old.get("status") or {}).get("allocatable"))
    b = resource_list((new.get("status") or {}).get("allocatable"))
    if b.get("pods", 0) > a.get("pods", 0):
        return True
    return any(v and b.get(n, 0) > a.get(n, 0) for n, v in pod_requests(pod).items())
