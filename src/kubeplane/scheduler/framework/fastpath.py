"""Vectorised Filter and Score for the built-in node-local plugins.

The generic framework runs every plugin once per node, which in Python costs
tens of microseconds per node. For the plugins whose verdict only depends on
a few per-node numbers or on a small set of distinct taint lists
(NodeUnschedulable, NodeName, TaintToleration, NodePorts, NodeResourcesFit;
scores of TaintToleration, NodeResourcesFit LeastAllocated/MostAllocated,
NodeResourcesBalancedAllocation and ImageLocality) this module evaluates all
nodes at once over numpy column arrays kept in step with the snapshot.

Results are exactly those of the generic path:

* a Filter mask is only trusted when it says "passes"; every node a mask
  rejects (and every plugin without a mask) is run through the plugin itself,
  in profile order, so statuses, reasons and plugin attribution are the
  plugin's own;
* nodes with nominated pods go through the framework's nominated-pods filter;
* the rotating start index, the stop after ``num_to_find`` feasible nodes and
  the ``processed`` count follow the sequential generic loop;
* scores use upstream's integer arithmetic (floor divisions) and, for
  BalancedAllocation, the same IEEE double operations; rows whose values are
  too large for exact int64/float64 arithmetic fall back to the plugin.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from kubeplane.scheduler.framework.nodeinfo import CPU, EPHEMERAL_STORAGE, MEMORY, PODS, NodeInfo, PodInfo
from kubeplane.scheduler.framework.plugin import implements
from kubeplane.scheduler.framework.types import Code, CycleState, MAX_NODE_SCORE, MIN_NODE_SCORE, Obj, Status
from kubeplane.scheduler.plugins.image_locality import ImageLocality, calculate_priority
from kubeplane.scheduler.plugins.node_name import NodeName
from kubeplane.scheduler.plugins.node_ports import NodePorts
from kubeplane.scheduler.plugins.node_resources_balanced import NodeResourcesBalancedAllocation
from kubeplane.scheduler.plugins.node_resources_fit import LEAST_ALLOCATED, MOST_ALLOCATED, NodeResourcesFit
from kubeplane.scheduler.plugins.node_unschedulable import UNSCHEDULABLE_TAINT, NodeUnschedulable
from kubeplane.scheduler.plugins.taint_toleration import (
    TaintToleration, find_untolerated_taint, tolerations_tolerate_taint,
)

if TYPE_CHECKING:
    from kubeplane.scheduler.framework.runtime import Framework

#: Integer values at or above this magnitude are not handled by the arrays
#: (products with 100 must stay in int64 and conversions to float exact).
SAFE_LIMIT = 1 << 53

# Column indices of NodeArrays.cols.
A_CPU, A_MEM, A_EPH, A_PODS, R_CPU, R_MEM, R_EPH, N_PODS, NZ_CPU, NZ_MEM = range(10)
_NUM_COLS = 10
_COL_OF_ALLOC = {CPU: A_CPU, MEMORY: A_MEM, EPHEMERAL_STORAGE: A_EPH}
_COL_OF_REQ = {CPU: R_CPU, MEMORY: R_MEM, EPHEMERAL_STORAGE: R_EPH}
_COL_OF_NZ = {CPU: NZ_CPU, MEMORY: NZ_MEM}


def _taint_key(taints: list[Obj]) -> tuple[tuple[str, str, str], ...]:
    return tuple((t.get("key") or "", t.get("value") or "", t.get("effect") or "") for t in taints)


class NodeArrays:
    """Column view of a snapshot's NodeInfos; row ``i`` is ``node_infos[i]``.

    ``cols`` holds allocatable, requested and non-zero requested cpu/memory/
    ephemeral-storage, allowed and current pod counts. Taint lists are
    interned into groups (``taint_gid``; group 0 = no taints) so per-pod
    toleration checks run once per distinct taint list.
    """

    __slots__ = ("node_infos", "index", "cols", "taint_gid", "unsched", "has_ports", "has_images", "big",
                 "taint_groups", "group_taints")

    def __init__(self, node_infos: list[NodeInfo]) -> None:
        n = len(node_infos)
        self.node_infos = node_infos
        self.index: dict[str, int] = {ni.name: i for i, ni in enumerate(node_infos)}
        self.cols = np.zeros((_NUM_COLS, n), dtype=np.int64)
        self.taint_gid = np.zeros(n, dtype=np.intp)
        self.unsched = np.zeros(n, dtype=bool)
        self.has_ports = np.zeros(n, dtype=bool)
        self.has_images = np.zeros(n, dtype=bool)
        self.big = np.zeros(n, dtype=bool)
        self.taint_groups: dict[tuple[tuple[str, str, str], ...], int] = {(): 0}
        self.group_taints: list[list[Obj]] = [[]]
        for i, ni in enumerate(node_infos):
            self.set_row(i, ni)

    def set_row(self, i: int, ni: NodeInfo) -> None:
        """Recompute row ``i`` from ``ni``."""
        alloc, req, nz = ni.allocatable, ni.requested, ni.non_zero_requested
        vals = (alloc.get(CPU, 0), alloc.get(MEMORY, 0), alloc.get(EPHEMERAL_STORAGE, 0), alloc.get(PODS, 0),
                req.get(CPU, 0), req.get(MEMORY, 0), req.get(EPHEMERAL_STORAGE, 0), len(ni.pods),
                nz.get(CPU, 0), nz.get(MEMORY, 0))
        big = False
        for v in vals:
            if not -SAFE_LIMIT < v < SAFE_LIMIT:
                big = True
                break
        self.big[i] = big
        self.cols[:, i] = (0,) * _NUM_COLS if big else vals
        node = ni.node or {}
        spec = node.get("spec") or {}
        taints = spec.get("taints") or []
        gid = 0
        if taints:
            key = _taint_key(taints)
            gid = self.taint_groups.get(key, -1)
            if gid < 0:
                gid = self.taint_groups[key] = len(self.group_taints)
                self.group_taints.append(list(taints))
        self.taint_gid[i] = gid
        self.unsched[i] = bool(spec.get("unschedulable"))
        self.has_ports[i] = len(ni.used_ports) > 0
        self.has_images[i] = bool(ni.image_states)


def arrays_for(snapshot: Any) -> NodeArrays:
    """The NodeArrays of ``snapshot``, built or brought up to date.

    The cache records names of NodeInfos it changed in
    ``snapshot.fast_changed``; a new node list (nodes added or removed)
    means a rebuild.
    """
    arr: NodeArrays | None = getattr(snapshot, "fast_arrays", None)
    changed: set[str] | None = getattr(snapshot, "fast_changed", None)
    if arr is None or arr.node_infos is not snapshot.node_info_list:
        arr = NodeArrays(snapshot.node_info_list)
        snapshot.fast_arrays = arr
        if changed is not None:
            changed.clear()
        else:
            snapshot.fast_changed = set()
        return arr
    if changed:
        index, infos = arr.index, arr.node_infos
        for name in changed:
            i = index.get(name)
            if i is not None:
                arr.set_row(i, infos[i])
        changed.clear()
    return arr


class FastPath:
    """Vectorised Filter/Score for one framework (profile)."""

    def __init__(self, fw: "Framework") -> None:
        self.fw = fw

    # ------------------------------------------------------------------ filter

    def _filter_mask(self, pl: Any, state: CycleState, pod_info: PodInfo, arr: NodeArrays) -> np.ndarray | None:
        """Rows where ``pl.filter`` certainly succeeds (None: no vectorised form)."""
        cls = type(pl)
        n = len(arr.node_infos)
        if cls is NodeResourcesFit:
            _, pairs = pl.checked_requests(state, pod_info)
            cols = arr.cols
            ok = cols[N_PODS] < cols[A_PODS]
            for name, value in pairs:
                if not -SAFE_LIMIT < value < SAFE_LIMIT:
                    return np.zeros(n, dtype=bool)
                col = _COL_OF_ALLOC.get(name)
                if col is not None:
                    free = cols[col] - cols[_COL_OF_REQ[name]]
                else:
                    free = np.fromiter((ni.allocatable.get(name, 0) - ni.requested.get(name, 0)
                                        for ni in arr.node_infos), dtype=object, count=n)
                ok &= (free >= value).astype(bool)
            ok &= ~arr.big
            return ok
        if cls is TaintToleration:
            tols = pod_info.tolerations
            gpass = np.fromiter((find_untolerated_taint(taints, tols) is None for taints in arr.group_taints),
                                dtype=bool, count=len(arr.group_taints))
            return gpass[arr.taint_gid]
        if cls is NodeUnschedulable:
            if tolerations_tolerate_taint(pod_info.tolerations, UNSCHEDULABLE_TAINT):
                return np.ones(n, dtype=bool)
            return ~arr.unsched
        if cls is NodeName:
            if not pod_info.node_name:
                return np.ones(n, dtype=bool)
            mask = np.zeros(n, dtype=bool)
            i = arr.index.get(pod_info.node_name)
            if i is not None:
                mask[i] = True
            return mask
        if cls is NodePorts:
            return ~arr.has_ports
        return None

    def find_feasible(
        self, state: CycleState, pod_info: PodInfo, arr: NodeArrays, cand: np.ndarray | None, start: int,
        num_to_find: int, nominated_rows: set[int],
    ) -> tuple[np.ndarray, int, list[tuple[int, Status]], Status | None]:
        """Feasible rows in evaluation order, nodes processed, rejected rows with statuses, Error status.

        ``cand`` restricts the candidates (rows, in snapshot order; None =
        all); evaluation starts at position ``start`` of the candidates and
        wraps around, stopping once ``num_to_find`` feasible nodes are found.
        """
        fw = self.fw
        skip = state.skip_filter_plugins
        plugins = [pl for pl in fw.filter_plugins if not (skip and pl.name in skip)]
        n = len(arr.node_infos)
        masks: list[np.ndarray | None] = []
        all_ok = np.ones(n, dtype=bool)
        every_row = False
        for pl in plugins:
            m = self._filter_mask(pl, state, pod_info, arr)
            masks.append(m)
            if m is None:
                every_row = True
            else:
                all_ok &= m
        if cand is None:
            cand = np.arange(n)
        m_cand = len(cand)
        rot = np.concatenate((cand[start:], cand[:start])) if start else cand
        if every_row:
            definite = np.zeros(m_cand, dtype=bool)
        else:
            definite = all_ok[rot]
            if nominated_rows:
                for r in nominated_rows:
                    definite[rot == r] = False
        cum_def = np.cumsum(definite)
        py_positions = np.flatnonzero(~definite).tolist()
        feasible_py: list[int] = []
        failed: list[tuple[int, Status]] = []
        infos = arr.node_infos
        for p in py_positions:
            before = (int(cum_def[p - 1]) if p else 0) + len(feasible_py)
            if before >= num_to_find:
                break
            row = int(rot[p])
            ni = infos[row]
            if row in nominated_rows:
                st = fw.run_filter_plugins_with_nominated_pods(state, pod_info, ni)
            else:
                st = self._filter_row(plugins, masks, row, state, pod_info, ni)
            if st is None or st.code == Code.SUCCESS:
                feasible_py.append(p)
                continue
            if not st.is_rejected():
                return rot[:0], 0, failed, st
            failed.append((row, st))
        if feasible_py:
            definite[feasible_py] = True
            cum = np.cumsum(definite)
        else:
            cum = cum_def
        total = int(cum[-1]) if m_cand else 0
        processed = int(np.searchsorted(cum, num_to_find)) + 1 if total >= num_to_find else m_cand
        feasible = rot[:processed][definite[:processed]]
        return feasible, processed, failed, None

    @staticmethod
    def _filter_row(plugins: list[Any], masks: list[np.ndarray | None], row: int, state: CycleState,
                    pod_info: PodInfo, ni: NodeInfo) -> Status | None:
        """The framework's per-node Filter, skipping plugins whose mask passes the row."""
        from kubeplane.scheduler.framework.runtime import _as_error

        for pl, m in zip(plugins, masks):
            if m is not None and m[row]:
                continue
            s = pl.filter(state, pod_info, ni)
            if s is None or s.code == Code.SUCCESS:
                continue
            if not s.is_rejected():
                return _as_error(s, f"running {pl.name!r} filter plugin", pl.name)
            s.plugin = pl.name
            return s
        return None

    # ------------------------------------------------------------------ score

    def _score_vector(self, pl: Any, state: CycleState, pod_info: PodInfo, arr: NodeArrays,
                      rows: np.ndarray, nodes: list[NodeInfo]) -> np.ndarray | None:
        """Final (normalized) scores of ``pl`` for ``rows``; None when not vectorised."""
        cls = type(pl)
        if cls is TaintToleration:
            tols = pl.pre_score_tolerations(state, pod_info)
            gcount = np.fromiter(
                (sum(1 for t in taints if t.get("effect") == "PreferNoSchedule"
                     and not tolerations_tolerate_taint(tols, t)) for taints in arr.group_taints),
                dtype=np.int64, count=len(arr.group_taints))
            counts = gcount[arr.taint_gid[rows]]
            max_count = int(counts.max()) if len(counts) else 0
            if max_count == 0:
                return np.full(len(rows), MAX_NODE_SCORE, dtype=np.int64)
            return MAX_NODE_SCORE - (MAX_NODE_SCORE * counts) // max_count
        if cls is NodeResourcesFit or cls is NodeResourcesBalancedAllocation:
            scorer = pl.scorer
            names = scorer.names
            if len(set(names)) != len(names) or any(nm not in _COL_OF_NZ for nm in names):
                return None
            if arr.big[rows].any():
                return None
            reqs = pl.pre_score_requests(state, pod_info)
            if any(not -SAFE_LIMIT < v < SAFE_LIMIT for v in reqs):
                return None
            cols = arr.cols
            if cls is NodeResourcesFit:
                if pl.strategy not in (LEAST_ALLOCATED, MOST_ALLOCATED):
                    return None
                weights = [r["weight"] for r in pl.resources]
                node_score = np.zeros(len(rows), dtype=np.int64)
                weight_sum = np.zeros(len(rows), dtype=np.int64)
                for nm, pr, w in zip(names, reqs, weights):
                    a = cols[_COL_OF_ALLOC[nm]][rows]
                    r = cols[_COL_OF_NZ[nm]][rows] + pr
                    nonzero = a != 0
                    safe_a = np.where(nonzero, a, 1)
                    if pl.strategy == LEAST_ALLOCATED:
                        s = np.where(nonzero & (r <= a), (a - r) * MAX_NODE_SCORE // safe_a, 0)
                    else:
                        s = np.where(nonzero, np.minimum(r, a) * MAX_NODE_SCORE // safe_a, 0)
                    node_score += s * w * nonzero
                    weight_sum += w * nonzero
                return np.where(weight_sum > 0, node_score // np.maximum(weight_sum, 1), 0)
            if len(names) > 2:
                return None
            fracs: list[np.ndarray] = []
            present: list[np.ndarray] = []
            for nm, pr in zip(names, reqs):
                a = cols[_COL_OF_ALLOC[nm]][rows]
                r = cols[_COL_OF_REQ[nm]][rows] + pr
                nonzero = a != 0
                fracs.append(np.minimum(r / np.where(nonzero, a, 1), 1.0))
                present.append(nonzero)
            if len(names) == 2:
                std = np.where(present[0] & present[1], np.abs((fracs[0] - fracs[1]) / 2), 0.0)
            else:
                std = np.zeros(len(rows))
            return ((1 - std) * MAX_NODE_SCORE).astype(np.int64)
        if cls is ImageLocality:
            out = np.full(len(rows), calculate_priority(0, len(pod_info.images)), dtype=np.int64)
            with_images = np.flatnonzero(arr.has_images[rows])
            for k in with_images.tolist():
                sc, s = pl.score(state, pod_info, nodes[k])
                if s is not None and not s.is_success():
                    return None
                out[k] = sc
            return out
        return None

    def score(self, state: CycleState, pod_info: PodInfo, arr: NodeArrays, rows: np.ndarray,
              nodes: list[NodeInfo]) -> tuple[np.ndarray, Status | None]:
        """Weighted total score per row (same order), as ``Framework.run_score_plugins`` sums them."""
        from kubeplane.scheduler.framework.runtime import _as_error

        fw = self.fw
        total = np.zeros(len(rows), dtype=np.int64)
        skip = state.skip_score_plugins
        for pl in fw.score_plugins:
            if pl.name in skip:
                continue
            vec = self._score_vector(pl, state, pod_info, arr, rows, nodes)
            if vec is None:
                pairs: list[list[Any]] = []
                for ni in nodes:
                    sc, s = pl.score(state, pod_info, ni)
                    if s is not None and not s.is_success():
                        return total, _as_error(s, f"running Score plugin {pl.name!r}", pl.name)
                    pairs.append([ni.name, sc])
                if implements(pl, "normalize_score"):
                    s = pl.normalize_score(state, pod_info, pairs)
                    if s is not None and not s.is_success():
                        return total, _as_error(s, f"running Normalize on Score plugin {pl.name!r}", pl.name)
                for _, sc in pairs:
                    if sc > MAX_NODE_SCORE or sc < MIN_NODE_SCORE:
                        return total, _invalid_score(pl.name, sc)
                vec = np.fromiter((sc for _, sc in pairs), dtype=np.int64, count=len(pairs))
            elif len(vec):
                lo, hi = int(vec.min()), int(vec.max())
                if hi > MAX_NODE_SCORE or lo < MIN_NODE_SCORE:
                    bad = next(int(v) for v in vec.tolist() if v > MAX_NODE_SCORE or v < MIN_NODE_SCORE)
                    return total, _invalid_score(pl.name, bad)
            total += vec * fw.score_weights.get(pl.name, 1)
        return total, None


def _invalid_score(plugin: str, sc: int) -> Status:
    msg = (f"plugin {plugin!r} returns an invalid score {sc}, it should in the range of "
           f"[{MIN_NODE_SCORE}, {MAX_NODE_SCORE}] after normalizing")
    return Status(Code.ERROR, [msg], plugin, ValueError(msg))


def select_host_index(totals: np.ndarray, rng: Any) -> int:
    """Index of a uniformly random entry among the highest totals (one draw when tied)."""
    best = totals.max()
    ties = np.flatnonzero(totals == best)
    if len(ties) == 1:
        return int(ties[0])
    return int(ties[rng.randrange(len(ties))])


__all__ = ["FastPath", "NodeArrays", "SAFE_LIMIT", "arrays_for", "select_host_index"]
