"""The vectorised Filter and Score driver.

The generic framework runs every plugin once per node, which in Python costs
tens of microseconds per node. A plugin whose verdict only depends on a few
per-node numbers, a small set of distinct taint lists or the node's labels
may also define a vectorised form of its Filter or Score (the optional hooks
``filter_mask``, ``filter_mask_certain``, ``filter_status_builder``,
``score_vector`` and the name-based ``filter_pass_except`` family, declared
on :class:`~kubeplane.scheduler.framework.plugin.Plugin`), which evaluates
many nodes at once over the numpy column arrays of :class:`NodeArrays`, kept
in step with the snapshot. Per-node results that only depend on the node and
on the pod's shape (requests, node selector) are memoized across cycles
(``NodeArrays.memoized``) and recomputed for the nodes that changed, so
identical pods (the common case in bulk workloads) cost a few array
operations per cycle. This module knows no plugin: it calls those hooks and,
for a plugin without them, the plugin's own Filter and Score through the
framework.

Results are exactly those of the generic path:

* a Filter mask is only trusted when it says "passes"; every node a mask
  rejects (and every plugin without a mask) is run through the plugin itself,
  in profile order, so statuses, reasons and plugin attribution are the
  plugin's own, unless the plugin states those statuses in bulk
  (``filter_status_builder``, ``filter_known_statuses``);
* nodes with nominated pods go through the framework's nominated-pods filter;
* the rotating start index, the stop after ``num_to_find`` feasible nodes and
  the ``processed`` count follow the sequential generic loop;
* vectorised scores use the plugin's own integer arithmetic (floor
  divisions) and IEEE double operations; rows whose values are too large
  for exact int64/float64 arithmetic (``SAFE_LIMIT``) fall back to the plugin;
* in cycles that sample plugin metrics, every plugin that runs is recorded in
  scheduler_plugin_execution_duration_seconds as on the generic path: a
  vectorised Filter or Score as one call covering the nodes it decided, and
  each per-node Filter call on its own.
"""

from __future__ import annotations

from itertools import repeat
from time import perf_counter
from operator import is_not
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from kubeplane.scheduler.framework.nodeinfo import CPU, EPHEMERAL_STORAGE, MEMORY, PODS, NodeInfo, PodInfo
from kubeplane.scheduler.framework.types import (
    EVERY_NODE, Code, CycleState, MAX_NODE_SCORE, MIN_NODE_SCORE, Obj, PassOnly, Status, invalid_score_status,
)

if TYPE_CHECKING:
    from kubeplane.scheduler.framework.runtime import Framework

#: Integer values at or above this magnitude are not handled by the arrays:
#: sums of two stay below 2**53 (exact as float64) and products with 100 fit
#: in int64.
SAFE_LIMIT = 1 << 52

# Column indices of NodeArrays.cols.
A_CPU, A_MEM, A_EPH, A_PODS, R_CPU, R_MEM, R_EPH, N_PODS, NZ_CPU, NZ_MEM = range(10)
_NUM_COLS = 10
COL_OF_ALLOC = {CPU: A_CPU, MEMORY: A_MEM, EPHEMERAL_STORAGE: A_EPH}
COL_OF_REQ = {CPU: R_CPU, MEMORY: R_MEM, EPHEMERAL_STORAGE: R_EPH}
COL_OF_NZ = {CPU: NZ_CPU, MEMORY: NZ_MEM}


#: per-pod-shape memos kept per NodeArrays (oldest dropped first)
MAX_MEMOS = 32
#: at most this many stale memo rows are recomputed one by one in Python
SMALL_RECOMPUTE = 16
#: rejected rows in one window from which their statuses are computed in bulk
BULK_MIN_ROWS = 16


_UNSET = object()


class OutOfRange(Exception):
    """A vectorised score left [MIN_NODE_SCORE, MAX_NODE_SCORE]; the plugin's scalar Score reports it."""


class _Memo:
    """Per-row values of one memoized function, which rows hold one, and how to compute a row."""

    __slots__ = ("values", "valid", "num_valid", "compute_one")

    def __init__(self, values: np.ndarray, valid: np.ndarray, compute_one: Callable[[int], Any]) -> None:
        self.values = values
        self.valid = valid
        self.num_valid = 0
        self.compute_one = compute_one


def _taint_key(taints: list[Obj]) -> tuple[tuple[str, str, str], ...]:
    return tuple((t.get("key") or "", t.get("value") or "", t.get("effect") or "") for t in taints)


class NodeArrays:
    """Column view of a snapshot's NodeInfos; row ``i`` is ``node_infos[i]``.

    ``cols`` holds allocatable, requested and non-zero requested cpu/memory/
    ephemeral-storage, allowed and current pod counts. Taint lists are
    interned into groups (``taint_gid``; group 0 = no taints) so per-pod
    toleration checks run once per distinct taint list. ``num_*`` count the
    rows with each flag so common all-clear cases cost nothing per pod.
    """

    __slots__ = ("node_infos", "names", "index", "cols", "taint_gid", "unsched", "has_ports", "has_images", "big",
                 "taint_groups", "group_taints", "num_tainted", "num_unsched", "num_ports", "num_images",
                 "num_big", "memos", "row_inputs")

    def __init__(self, node_infos: list[NodeInfo]) -> None:
        n = len(node_infos)
        self.node_infos = node_infos
        self.names: list[str] = [ni.name for ni in node_infos]
        self.index: dict[str, int] = {name: i for i, name in enumerate(self.names)}
        self.cols = np.zeros((_NUM_COLS, n), dtype=np.int64)
        self.taint_gid = np.zeros(n, dtype=np.intp)
        self.unsched = np.zeros(n, dtype=bool)
        self.has_ports = np.zeros(n, dtype=bool)
        self.has_images = np.zeros(n, dtype=bool)
        self.big = np.zeros(n, dtype=bool)
        self.taint_groups: dict[tuple[tuple[str, str, str], ...], int] = {(): 0}
        self.group_taints: list[list[Obj]] = [[]]
        self.num_tainted = self.num_unsched = self.num_ports = self.num_images = self.num_big = 0
        self.memos: dict[Any, _Memo] = {}
        #: per row, what its memoized values were computed from: (column values, node object)
        self.row_inputs: list[tuple[tuple[int, ...], Any] | None] = [None] * n
        for i, ni in enumerate(node_infos):
            self.set_row(i, ni)

    def memoized(self, key: Any, dtype: Any, compute: Callable[[np.ndarray], np.ndarray],
                 compute_one: Callable[[int], Any], sel: Any) -> np.ndarray:
        """``compute(rows)`` for the rows ``sel``, reusing values of unchanged rows.

        Per-row results of a pure function of (row values, ``key``) are kept
        across cycles, where a row's values are its columns and its Node
        object; ``set_row`` recomputes a changed row in every memo with the
        memo's ``compute_one`` (the function is the same for the same key),
        rows never computed are filled on demand: a handful one by one with
        ``compute_one(row)``, more at once with ``compute``. The result may be
        a view: callers must not modify it.
        """
        m = self.memos.get(key)
        if m is None:
            if len(self.memos) >= MAX_MEMOS:
                del self.memos[next(iter(self.memos))]
            n = len(self.node_infos)
            m = self.memos[key] = _Memo(np.zeros(n, dtype=dtype), np.zeros(n, dtype=bool), compute_one)
        if m.num_valid < len(m.valid):
            valid = m.valid[sel]
            if not valid.all():
                rows = np.arange(sel.start, sel.stop) if isinstance(sel, slice) else np.asarray(sel)
                todo = rows[~valid]
                if len(todo) <= SMALL_RECOMPUTE:
                    values = m.values
                    for row in todo.tolist():
                        values[row] = compute_one(row)
                else:
                    m.values[todo] = compute(todo)
                m.valid[todo] = True
                m.num_valid += len(todo)
        return m.values[sel]

    def set_row(self, i: int, ni: NodeInfo) -> None:
        """Recompute row ``i`` from ``ni``."""
        alloc, req, nz = ni.allocatable, ni.requested, ni.non_zero_requested
        vals = (alloc.get(CPU, 0), alloc.get(MEMORY, 0), alloc.get(EPHEMERAL_STORAGE, 0), alloc.get(PODS, 0),
                req.get(CPU, 0), req.get(MEMORY, 0), req.get(EPHEMERAL_STORAGE, 0), len(ni.pods),
                nz.get(CPU, 0), nz.get(MEMORY, 0))
        inputs = self.row_inputs[i]
        if (inputs is not None and inputs[1] is ni.node and inputs[0] == vals
                and (len(ni.used_ports) > 0) == bool(self.has_ports[i])):
            # Same numbers, same Node object (so the same taints, flags and images) and
            # host ports still in use or not: nothing in the row changes (a confirmed
            # assumed pod, say), and every memo stays valid.
            return
        big = False
        for v in vals:
            if not -SAFE_LIMIT < v < SAFE_LIMIT:
                big = True
                break
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
        old_gid = int(self.taint_gid[i])
        if gid != old_gid:
            self.num_tainted += (gid != 0) - (old_gid != 0)
            self.taint_gid[i] = gid
        flag = bool(spec.get("unschedulable"))
        if flag != bool(self.unsched[i]):
            self.unsched[i] = flag
            self.num_unsched += 1 if flag else -1
        flag = len(ni.used_ports) > 0
        if flag != bool(self.has_ports[i]):
            self.has_ports[i] = flag
            self.num_ports += 1 if flag else -1
        flag = bool(ni.image_states)
        if flag != bool(self.has_images[i]):
            self.has_images[i] = flag
            self.num_images += 1 if flag else -1
        if big != bool(self.big[i]):
            self.big[i] = big
            self.num_big += 1 if big else -1
        if inputs is not None and inputs[1] is ni.node and inputs[0] == vals:
            # Nothing a memo reads changed: every memo stays valid.
            return
        self.row_inputs[i] = (vals, ni.node)
        for m in self.memos.values():
            if m.valid[i]:
                try:
                    m.values[i] = m.compute_one(i)
                except OutOfRange:
                    m.valid[i] = False
                    m.num_valid -= 1


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


#: a mask builder: rows (slice or index array) -> True (all pass), a bool array, or None (no vector form)
_MaskFn = Callable[[Any], Any]


def _present(statuses: list[Status | None]) -> int:
    """How many entries are not None (by identity: ``list.count(None)`` would call
    ``Status.__eq__`` on every status)."""
    return len(statuses) - list(map(id, statuses)).count(_NONE_ID)


_NONE_ID = id(None)


class Rejections:
    """The rows a Filter loop rejected: chunks ``(rows, statuses)`` where
    ``statuses[i]`` is the status of ``rows[i]`` (None for a row that passed),
    how many rows were rejected, and each distinct status object once (bulk
    statuses are shared by many rows), so that callers need not walk every row.

    When the loop found a feasible node, rows that a certain mask rejected
    are counted but keep None: upstream discards the statuses of a cycle
    that finds a host and reports only how many nodes it evaluated, so they
    are never computed. A loop that finds no node computes every status."""

    __slots__ = ("chunks", "count", "distinct")

    def __init__(self) -> None:
        self.chunks: list[tuple[list[int], list[Status | None]]] = []
        self.count = 0
        self.distinct: dict[int, Status] = {}

    def __bool__(self) -> bool:
        return bool(self.count)

    def add(self, rows: list[int], statuses: list[Status | None], count: int) -> None:
        if count:
            self.chunks.append((rows, statuses))
            self.count += count

    def pairs(self) -> list[tuple[int, Status]]:
        """(row, status) of every rejected row, in order."""
        return [(r, st) for rows, sts in self.chunks for r, st in zip(rows, sts) if st is not None]


class FastPath:
    """Vectorised Filter/Score for one framework (profile)."""

    def __init__(self, fw: "Framework") -> None:
        self.fw = fw

    # ------------------------------------------------------------------ filter

    def _mask_fn(self, pl: Any, state: CycleState, pod_info: PodInfo, arr: NodeArrays) -> _MaskFn | None:
        """A builder of the rows where ``pl.filter`` certainly succeeds (None: no vectorised form)."""
        f = pl.filter_mask(state, pod_info, arr)
        if f is not None:
            return f
        return _mask_from_exceptions(pl.filter_pass_except(state, pod_info), arr)

    def find_feasible(
        self, state: CycleState, pod_info: PodInfo, arr: NodeArrays, cand: np.ndarray | None, start: int,
        num_to_find: int, nominated_rows: set[int],
    ) -> tuple[np.ndarray, int, Rejections, Status | None]:
        """Feasible rows in evaluation order, nodes processed, rejected rows with statuses, Error status.

        ``cand`` restricts the candidates (rows, in snapshot order; None =
        all); evaluation starts at position ``start`` of the candidates and
        wraps around, stopping once ``num_to_find`` feasible nodes are found.
        Candidates are examined in windows so a cycle costs about
        ``num_to_find`` rows of array work, not the whole cluster.
        """
        fw = self.fw
        skip = state.skip_filter_plugins
        plugins = [pl for pl in fw.filter_plugins if not (skip and pl.name in skip)]
        record = state.record_metrics
        fns: list[_MaskFn | None] = []
        for pl in plugins:
            t0 = perf_counter() if record else 0.0
            f = self._mask_fn(pl, state, pod_info, arr)
            if t0 and f is not None:
                # the vectorised Filter of every node; rows it leaves to the plugin are timed per call
                fw.observe(pl.name, "Filter", None, t0)
            fns.append(f)
        certain = _certain_masks(plugins, fns, arr, state, pod_info)
        # Per window: (chunk statuses, indices into the chunk, the window's rows by index) of the
        # rows certainly rejected whose statuses were not computed.
        deferred: list[tuple[list[Status | None], list[int], list[int]]] = []
        builders: dict[int, Any] = {}  # status builders of this cycle by plugin index
        every_row = any(f is None for f in fns)
        nominated = np.fromiter(nominated_rows, dtype=np.intp, count=len(nominated_rows)) if nominated_rows else None
        active = [f for f in fns if f is not None and f is not ALL_PASS]
        n = len(arr.node_infos)
        m = n if cand is None else len(cand)
        infos = arr.node_infos
        found_parts: list[np.ndarray] = []
        found = 0
        processed = 0
        failed = Rejections()
        distinct = failed.distinct
        window = max(num_to_find, 1)
        pos = 0
        while pos < m and found < num_to_find:
            # One window of candidate positions, never crossing the wrap-around point.
            first = (start + pos) % m
            end = min(first + window, m, first + (m - pos))
            width = end - first
            sel: Any = slice(first, end) if cand is None else cand[first:end]
            rows = np.arange(first, end) if cand is None else sel
            window *= 2
            need = num_to_find - found
            definite: Any = True
            if every_row:
                definite = np.zeros(width, dtype=bool)
            else:
                for f in active:
                    mk = f(sel)
                    definite = mk if definite is True else definite & mk
                if nominated is not None:
                    # Rows with nominated pods take the per-row path.
                    if cand is None:
                        hit = nominated[(nominated >= first) & (nominated < end)] - first
                    else:
                        hit = np.flatnonzero(np.isin(sel, nominated))
                    if len(hit):
                        definite = np.ones(width, dtype=bool) if definite is True else definite.copy()
                        definite[hit] = False
            if definite is True or definite.all():
                if width >= need:
                    found_parts.append(rows[:need])
                    processed += need
                    found += need
                    break
                found_parts.append(rows)
                processed += width
                found += width
                pos += width
                continue
            cum = np.cumsum(definite)
            py_pos_arr = np.flatnonzero(~definite)
            py_positions = py_pos_arr.tolist()
            py_rows = np.asarray(rows[py_pos_arr], dtype=np.intp)
            py_rows_list = py_rows.tolist()
            extra: list[int] = []
            # Statuses of the rows needing more than the masks, in order; None = passes or not known yet.
            # The sequential loop stops at the first row p with (feasible rows before p) >= need;
            # ``before[i]`` counts the mask-feasible rows before py_positions[i] (non-decreasing).
            # Rows found feasible below only move that point earlier, so no row at or after
            # ``stop`` is ever examined: their statuses are not computed.
            before = np.concatenate(([0], cum))[py_pos_arr]
            stop = int(np.searchsorted(before, need, side="left"))
            statuses: list[Status | None] = [None] * len(py_positions)
            todo: Any = range(min(stop, len(py_positions)))
            deferred_here: list[int] = []  # indices of rows certainly rejected, status not computed
            if stop >= BULK_MIN_ROWS:
                statuses, todo, sure = self._bulk_statuses(plugins, fns, state, pod_info, arr, py_rows[:stop],
                                                           nominated, distinct, builders, certain)
                statuses.extend([None] * (len(py_positions) - len(statuses)))
                deferred_here.extend(sure)
            for i in todo:
                if i >= stop:
                    break
                p = py_positions[i]
                row = py_rows_list[i]
                ni = infos[row]
                if row in nominated_rows:
                    st = fw.run_filter_plugins_with_nominated_pods(state, pod_info, ni)
                else:
                    st = _filter_row(fw, plugins, fns, row, state, pod_info, ni, certain)
                if st.__class__ is int:
                    deferred_here.append(i)
                    continue
                if st is None or st.code == Code.SUCCESS:
                    extra.append(p)
                    stop = max(i + 1, int(np.searchsorted(before, need - len(extra), side="left")))
                    continue
                if not st.is_rejected():
                    failed.add(py_rows_list[:i], statuses[:i], _present(statuses[:i]))
                    return rows[:0], 0, failed, st
                statuses[i] = st
                distinct[id(st)] = st
            # Every row before ``stop`` got a status or was found feasible (``extra``).
            # A row found feasible may have moved ``stop`` before rows the bulk step
            # decided; their statuses stay in ``distinct``, which is only read when
            # no node is feasible, and then ``stop`` never moved.
            chunk = statuses[:stop]
            failed.add(py_rows_list[:stop], chunk, min(stop, len(py_positions)) - len(extra))
            if deferred_here:
                # Indices at or after ``stop`` only arise when a host was found (and the
                # deferred statuses are never computed).
                deferred.append((chunk, deferred_here, py_rows_list))
            if extra:
                definite = definite.copy()
                definite[extra] = True
                cum = np.cumsum(definite)
            total = int(cum[-1])
            if total >= need:
                stop = int(np.searchsorted(cum, need)) + 1
                found_parts.append(rows[:stop][definite[:stop]])
                processed += stop
                found += need
                break
            found_parts.append(rows[definite])
            found += total
            processed += width
            pos += width
        if found == 0 and deferred:
            # The cycle fails: the statuses are reported, so compute the deferred ones.
            drows = np.array([rl[i] for _, idx, rl in deferred for i in idx], dtype=np.intp)
            sts, todo, _ = self._bulk_statuses(plugins, fns, state, pod_info, arr, drows, nominated, distinct,
                                               builders)
            for k in todo:
                row = int(drows[k])
                sts[k] = _filter_row(fw, plugins, fns, row, state, pod_info, infos[row])
            it = iter(sts)
            for chunk, idx, _ in deferred:
                for i in idx:
                    st = chunk[i] = next(it)
                    if st is not None:
                        distinct[id(st)] = st
        if not found_parts:
            feasible = np.zeros(0, dtype=np.intp)
        elif len(found_parts) == 1:
            feasible = np.asarray(found_parts[0], dtype=np.intp)
        else:
            feasible = np.concatenate(found_parts).astype(np.intp, copy=False)
        return feasible, processed, failed, None

    def _bulk_statuses(
        self, plugins: list[Any], fns: list[_MaskFn | None], state: CycleState, pod_info: PodInfo,
        arr: NodeArrays, rows: np.ndarray, nominated: np.ndarray | None, distinct: dict[int, Status],
        builders: dict[int, Any], certain: list[Any] | None = None,
    ) -> tuple[list[Status | None], list[int], list[int]]:
        """Filter statuses of many rejected rows at once, None where the row needs the
        per-row path, the indices of those rows, and the indices of the rows a
        ``certain`` mask (see ``_certain_masks``) rejects, which get no status
        here (None: computed only if the cycle finds no node). The distinct
        statuses go to ``distinct``; ``builders`` keeps the cycle's status
        builders by plugin index.

        A row's status is the one of the first plugin (in profile order) that
        rejects it. Walking the plugins in order, the rows a plugin's mask
        rejects are decided by that plugin when it can state its status in
        bulk (``_status_builder``); a plugin without a mask stops the walk, as
        it might reject any row still undecided. Rows with nominated pods
        (``nominated``, an array, or None) always take the per-row path."""
        n = len(rows)
        # A list, not an object array: numpy would probe every Status assigned from a list.
        out: list[Status | None] = [None] * n
        decided = np.zeros(n, dtype=bool)
        undecided = np.arange(n)
        sure_parts: list[np.ndarray] = []
        for j, (pl, f) in enumerate(zip(plugins, fns)):
            if not len(undecided) or f is None:
                break
            if f is ALL_PASS:
                continue
            mk = f(rows[undecided])
            if mk is True:
                continue
            mk = np.asarray(mk, dtype=bool)
            rejected = undecided[~mk]
            if nominated is not None:
                rejected = rejected[~np.isin(rows[rejected], nominated)]
            c = False if certain is None else certain[j]
            if c is not False and len(rejected):
                if c is not True:
                    is_sure = c[rows[rejected]]
                    sure_parts.append(rejected[is_sure])
                    rejected = rejected[~is_sure]
                else:
                    sure_parts.append(rejected)
                    rejected = rejected[:0]
                decided[sure_parts[-1]] = True
            if len(rejected):
                builder = builders.get(j, _UNSET)
                if builder is _UNSET:
                    builder = builders[j] = self._status_builder(pl, state, pod_info, arr)
                if builder is not None:
                    values, made = builder(rows[rejected])
                    if isinstance(values, np.ndarray):
                        values = values.tolist()
                    for i, st in zip(rejected.tolist(), values):
                        out[i] = st
                    decided[rejected] = np.fromiter(map(is_not, values, repeat(None)), dtype=bool,
                                                    count=len(rejected))
                    for st in made:
                        distinct[id(st)] = st
            undecided = undecided[mk]
        sure = np.concatenate(sure_parts).tolist() if sure_parts else []
        return out, np.flatnonzero(~decided).tolist(), sure

    def _status_builder(self, pl: Any, state: CycleState, pod_info: PodInfo,
                        arr: NodeArrays) -> Callable[[np.ndarray], tuple[Any, list[Status]]] | None:
        """For rows ``pl``'s mask rejects: the plugin's own Filter status per row (None: unknown),
        and the distinct statuses among them.

        NodeResourcesFit's reasons follow from the column arrays; the
        statuses of NodeUnschedulable and TaintToleration only depend on the
        row's flag / taint list, so one Filter call per distinct group serves
        every row of the group. Equal statuses are one shared object.

        Other plugins may define ``filter_known_statuses(state, pod_info)``,
        called after their PreFilter (and ``filter_pass_except``) in the same
        cycle: a mapping node name -> the Status their Filter certainly
        returns for that node in this cycle, with ``plugin`` set to the
        plugin's name (nodes without such an entry take the per-row path), or
        None."""
        builder = pl.filter_status_builder(state, pod_info, arr)
        if builder is not None:
            return builder
        known = pl.filter_known_statuses(state, pod_info)
        if known is None:
            return None
        get = known.get
        name = pl.name
        names = arr.names

        def known_statuses(rows: np.ndarray) -> tuple[list[Status | None], list[Status]]:
            out = list(map(get, map(names.__getitem__, rows.tolist())))
            bad: set[int] = set()
            made = dict(zip(map(id, out), out))
            made.pop(_NONE_ID, None)
            for st in made.values():
                if not st.is_rejected() or st.plugin != name:
                    # only rejections are stated in bulk, attributed to the plugin (the
                    # statuses belong to the plugin: they are not modified here)
                    bad.add(id(st))
            if bad:
                out = [None if st is not None and id(st) in bad else st for st in out]
            return out, [st for k, st in made.items() if k not in bad]
        return known_statuses

    # ------------------------------------------------------------------ score

    def score(self, state: CycleState, pod_info: PodInfo, arr: NodeArrays, rows: np.ndarray,
              nodes: list[NodeInfo]) -> tuple[np.ndarray, Status | None]:
        """Weighted total score per row (same order), as ``Framework.run_score_plugins`` sums them."""
        fw = self.fw
        total = np.zeros(len(rows), dtype=np.int64)
        skip = state.skip_score_plugins
        sub = _selector(rows)
        record = state.record_metrics
        constant = 0
        for pl in fw.score_plugins:
            if pl.name in skip:
                continue
            t0 = perf_counter() if record else 0.0
            vec = pl.score_vector(state, pod_info, arr, rows, nodes, sub)
            if vec is None:
                pairs, s = fw.run_score_plugin(pl, state, pod_info, nodes)
                if s is not None:
                    return total, s
                vec = np.fromiter((sc for _, sc in pairs), dtype=np.int64, count=len(pairs))
            elif t0:
                fw.observe(pl.name, "Score", None, t0)
            if isinstance(vec, int):
                if vec > MAX_NODE_SCORE or vec < MIN_NODE_SCORE:
                    return total, invalid_score_status(pl.name, vec)
                constant += vec * fw.score_weights.get(pl.name, 1)
                continue
            # Vectorised scores are within range by construction (checked when computed).
            weight = fw.score_weights.get(pl.name, 1)
            if weight == 1:
                total += vec
            else:
                total += vec * weight
        if constant:
            total += constant
        return total, None


def statuses_by_group(pl: Any, state: CycleState, pod_info: PodInfo, infos: list[NodeInfo],
                      rows: np.ndarray, groups: np.ndarray) -> tuple[list[Status | None], list[Status]]:
    """A ``filter_status_builder`` for a Filter whose status only depends on a row's group
    (``groups[i]`` of ``rows[i]``): one Filter call per distinct group serves every row
    of the group."""
    made: dict[int, Status | None] = {}
    out: list[Status | None] = []
    for row, g in zip(rows.tolist(), groups.tolist()):
        if g not in made:
            st = pl.filter(state, pod_info, infos[row])
            if st is not None and st.is_rejected():
                st.plugin = pl.name
            else:
                st = None  # passes or errs: the per-row path reports it
            made[g] = st
        out.append(made[g])
    return out, [st for st in made.values() if st is not None]


def nodes_for_rows(infos: list[NodeInfo], rows: np.ndarray) -> list[NodeInfo]:
    """``[infos[r] for r in rows]``, by list slices when the rows are runs (the usual case)."""
    k = len(rows)
    if k == 0:
        return []
    first, last = int(rows[0]), int(rows[-1])
    if last - first == k - 1:
        return infos[first:last + 1]
    if last < first and (len(infos) - first) + last + 1 == k:
        return infos[first:] + infos[:last + 1]
    return [infos[r] for r in rows.tolist()]


def _selector(rows: np.ndarray) -> Any:
    """A slice for a contiguous ascending run of rows (a view, no copy), else the rows."""
    k = len(rows)
    if k and int(rows[-1]) - int(rows[0]) == k - 1:
        first = int(rows[0])
        return slice(first, first + k)
    return rows


def gather(cols: np.ndarray, which: list[int], sel: Any) -> np.ndarray:
    """A new ``len(which) x rows`` array of the columns ``which`` for the rows ``sel``."""
    if isinstance(sel, slice):
        if len(which) > 1 and all(y - x == 1 for x, y in zip(which, which[1:])):
            return cols[which[0]:which[-1] + 1, sel].copy()
        return cols[which, sel]
    return cols[np.ix_(which, sel)]


def _pass_all(sel: Any) -> bool:
    return True


#: ``filter_mask`` answer of a plugin that passes every row this cycle
ALL_PASS: _MaskFn = _pass_all


def _mask_from_exceptions(names: Any, arr: NodeArrays) -> _MaskFn | None:
    """Mask builder from a plugin's ``filter_pass_except`` answer.

    A plugin may define ``filter_pass_except(state, pod_info)``, called after
    its PreFilter in the same cycle: None means "no vectorised form" (its
    Filter runs on every node); otherwise a collection of node names outside
    which its Filter certainly succeeds (and need not be called: such a plugin
    must not rely on Filter having run for the node it is reserved on). The
    listed nodes still go through the plugin's Filter. ``EVERY_NODE``: no node
    passes for sure; ``PassOnly(names)``: only the nodes ``names`` do."""
    if names is None:
        return None
    if names is EVERY_NODE:
        none = np.zeros(len(arr.node_infos), dtype=bool)
        return lambda sel: none[sel]
    if isinstance(names, PassOnly):
        only = np.zeros(len(arr.node_infos), dtype=bool)
        only[_rows_of(names.names, arr)] = True
        return lambda sel: only[sel]
    if not names:
        return ALL_PASS
    mask = np.ones(len(arr.node_infos), dtype=bool)
    mask[_rows_of(names, arr)] = False
    return lambda sel: mask[sel]


def _rows_of(names: Any, arr: NodeArrays) -> np.ndarray:
    """The rows of the nodes ``names`` (a sized collection) that the arrays hold."""
    rows = np.fromiter(map(arr.index.get, names, repeat(-1)), dtype=np.intp, count=len(names))
    return rows[rows >= 0]


def _certain_masks(plugins: list[Any], fns: list[_MaskFn | None], arr: NodeArrays, state: CycleState,
                   pod_info: PodInfo) -> list[Any]:
    """Per plugin, whether a row its mask does not pass is certainly rejected by its
    Filter: True, a bool array by row, or False.

    Besides the in-tree masks that are the Filter's own checks, a plugin may
    define ``filter_known_rejections(state, pod_info, rows, n)``, called after
    its ``filter_pass_except`` in the same cycle: a bool array by row (``rows``
    maps node names to rows), True where its Filter certainly rejects the row
    with the status its ``filter_known_statuses`` gives, or None."""
    out: list[Any] = []
    for pl, f in zip(plugins, fns):
        out.append(False if f is None or f is ALL_PASS else pl.filter_mask_certain(state, pod_info, arr))
    return out


def _filter_row(fw: "Framework", plugins: list[Any], fns: list[_MaskFn | None], row: int, state: CycleState,
                pod_info: PodInfo, ni: NodeInfo, certain: list[Any] | None = None) -> Status | int | None:
    """The framework's per-node Filter, skipping plugins known to pass the row.

    With ``certain`` (see ``_certain_masks``), a row first rejected by a
    certain mask is not filtered: the index of that plugin is returned."""
    for j, (pl, f) in enumerate(zip(plugins, fns)):
        if f is ALL_PASS:
            continue
        if f is not None:
            mk = f(slice(row, row + 1))
            if mk is True or bool(mk[0]):
                continue
            if certain is not None:
                c = certain[j]
                if c is True or (c is not False and c[row]):
                    return j
        s = fw.run_filter_plugin(pl, state, pod_info, ni)
        if s is not None:
            return s
    return None


def select_host_index(totals: np.ndarray, rng: Any) -> int:
    """Index of a uniformly random entry among the highest totals (one draw when tied)."""
    best = totals.max()
    ties = np.flatnonzero(totals == best)
    if len(ties) == 1:
        return int(ties[0])
    return int(ties[rng.randrange(len(ties))])


__all__ = [
    "ALL_PASS", "COL_OF_ALLOC", "COL_OF_NZ", "COL_OF_REQ", "FastPath", "NodeArrays", "OutOfRange", "SAFE_LIMIT",
    "arrays_for", "gather", "nodes_for_rows", "select_host_index", "statuses_by_group",
]
