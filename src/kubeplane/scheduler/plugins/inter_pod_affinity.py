"""InterPodAffinity: required pod (anti-)affinity (filter) and preferred terms (score).

Filter enforces the incoming pod's required affinity and anti-affinity
terms and the required anti-affinity terms of pods already running
(symmetry). Score sums, per topology value, the weights of matching
preferred terms of the incoming pod and of existing pods, plus
``hardPodAffinityWeight`` for existing pods' required affinity terms that
match the incoming pod.

Args (``InterPodAffinityArgs``): ``hardPodAffinityWeight`` (default 1,
0..100) and ``ignorePreferredTermsOfExistingPods`` (default false).

Namespace labels (for ``namespaceSelector``): taken from
``args["namespaceLabels"]`` or ``handle.namespace_labels``, a callable
``(namespace name) -> labels dict | None``; failing both, from
``handle.list_objects("namespaces", None)``. Without any of them a
non-empty namespaceSelector selects no namespace (an empty one, ``{}``,
still selects all).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from kubeplane.api.selectors import LabelSelector
from kubeplane.scheduler.framework.labelgroups import (
    NodeTotals, add_contribution, nodes_not_passing, shape_key, totals_for,
)
from kubeplane.scheduler.framework.nodeinfo import AffinityTerm, NodeInfo, PodInfo
from kubeplane.scheduler.framework.plugin import Plugin
from kubeplane.scheduler.framework.types import (
    ActionType, ClusterEvent, ClusterEventWithHint, CycleState, EventResource, MAX_NODE_SCORE, Obj,
    PreFilterResult, QueueingHint, Status,
)

NAME = "InterPodAffinity"
ERR_REASON_EXISTING_ANTI_AFFINITY_RULES_NOT_MATCH = "node(s) didn't satisfy existing pods anti-affinity rules"
ERR_REASON_AFFINITY_RULES_NOT_MATCH = "node(s) didn't match pod affinity rules"
ERR_REASON_ANTI_AFFINITY_RULES_NOT_MATCH = "node(s) didn't match pod anti-affinity rules"
DEFAULT_HARD_POD_AFFINITY_WEIGHT = 1

_PRE_FILTER_KEY = "PreFilter" + NAME
_PRE_SCORE_KEY = "PreScore" + NAME

NamespaceLabels = Callable[[str], "Mapping[str, str] | None"]
TopologyPair = tuple[str, str]


class _ResolvedTerm:
    """An incoming pod's term with its namespaceSelector resolved against namespace labels.

    Upstream merges the namespaces selected by a non-empty selector into the
    term's namespace set; here selection is evaluated lazily per namespace
    with the same result.
    """

    __slots__ = ("term", "topology_key", "weight", "_ns_labels", "_cache")

    def __init__(self, term: AffinityTerm, ns_labels: NamespaceLabels | None, weight: int = 0) -> None:
        self.term = term
        self.topology_key = term.topology_key
        self.weight = weight
        self._ns_labels = ns_labels
        self._cache: dict[str, bool] = {}

    def _ns_selected(self, ns: str) -> bool:
        t = self.term
        if ns in t.namespaces:
            return True
        sel: LabelSelector | None = t.namespace_selector
        if sel is None or sel.matches_nothing:
            return False
        if sel.empty:
            return True
        hit = self._cache.get(ns)
        if hit is None:
            labels = self._ns_labels(ns) if self._ns_labels is not None else None
            hit = labels is not None and sel.matches(labels)
            self._cache[ns] = hit
        return hit

    def matches(self, pod: Obj) -> bool:
        meta = pod.get("metadata") or {}
        if not self._ns_selected(meta.get("namespace") or "default"):
            return False
        return self.term.selector.matches(meta.get("labels") or {})


def _matches_all(terms: list[_ResolvedTerm], pod: Obj) -> bool:
    """``podMatchesAllAffinityTerms``: false for no terms."""
    if not terms:
        return False
    return all(t.matches(pod) for t in terms)


def _node_labels(node: Obj | None) -> dict[str, str]:
    return ((node or {}).get("metadata") or {}).get("labels") or {}


def _bump(counts: dict[TopologyPair, int], pair: TopologyPair, delta: int) -> None:
    n = counts.get(pair, 0) + delta
    if n == 0:
        counts.pop(pair, None)
    else:
        counts[pair] = n


@dataclass
class PreFilterState:
    """Topology pair counts computed once per cycle (cloned for preemption)."""

    pod_info: PodInfo
    affinity_terms: list[_ResolvedTerm]
    anti_affinity_terms: list[_ResolvedTerm]
    namespace_labels: dict[str, str]
    existing_anti_affinity_counts: dict[TopologyPair, int] = field(default_factory=dict)
    affinity_counts: dict[TopologyPair, int] = field(default_factory=dict)
    anti_affinity_counts: dict[TopologyPair, int] = field(default_factory=dict)
    #: (node list, rejected nodes) of ``InterPodAffinity._anti_failures`` for this cycle
    anti_failures: tuple[Any, dict[str, Status | None]] | None = None

    def clone(self) -> "PreFilterState":
        return PreFilterState(
            self.pod_info, self.affinity_terms, self.anti_affinity_terms, self.namespace_labels,
            dict(self.existing_anti_affinity_counts), dict(self.affinity_counts), dict(self.anti_affinity_counts),
        )

    def update_with_pod(self, pi: PodInfo, node: Obj | None, delta: int) -> None:
        """Account a pod added to (``delta`` 1) or removed from (-1) ``node``."""
        self.anti_failures = None
        if node is None:
            return
        labels = _node_labels(node)
        for term in pi.required_anti_affinity_terms:
            if term.matches(self.pod_info.pod, self.namespace_labels) and term.topology_key in labels:
                _bump(self.existing_anti_affinity_counts, (term.topology_key, labels[term.topology_key]), delta)
        if _matches_all(self.affinity_terms, pi.pod):
            for t in self.affinity_terms:
                if t.topology_key in labels:
                    _bump(self.affinity_counts, (t.topology_key, labels[t.topology_key]), delta)
        for t in self.anti_affinity_terms:
            if t.matches(pi.pod) and t.topology_key in labels:
                _bump(self.anti_affinity_counts, (t.topology_key, labels[t.topology_key]), delta)


@dataclass
class PreScoreState:
    topology_score: dict[str, dict[str, int]] = field(default_factory=dict)

    def clone(self) -> "PreScoreState":
        return self


class InterPodAffinity(Plugin):
    name = NAME

    def __init__(self, args: dict | None, handle: Any) -> None:
        super().__init__(args, handle)
        w = self.args.get("hardPodAffinityWeight", DEFAULT_HARD_POD_AFFINITY_WEIGHT)
        w = DEFAULT_HARD_POD_AFFINITY_WEIGHT if w is None else int(w)
        if w < 0 or w > 100:
            raise ValueError(f"hardPodAffinityWeight: Invalid value: {w}: not in valid range [0-100]")
        self.hard_pod_affinity_weight = w
        self.ignore_preferred_terms_of_existing_pods = bool(self.args.get("ignorePreferredTermsOfExistingPods"))
        #: keep per-node PreFilter/PreScore totals across cycles (per pod shape)
        self.keep_totals = True
        self._filter_totals: dict[bytes, NodeTotals] = {}
        self._label_indexes: tuple[list[NodeInfo], int, dict[str, dict[str, list[str]]]] | None = None
        self._score_totals: dict[bytes, NodeTotals] = {}

    # ------------------------------------------------------------------ helpers

    def namespace_labels_fn(self) -> NamespaceLabels | None:
        """The configured namespace -> labels lookup, if any."""
        fn = self.args.get("namespaceLabels") or self.handle.namespace_labels
        if fn is not None:
            return fn
        lister = self.handle.list_objects
        if lister is None:
            return None

        def from_list(ns: str) -> Mapping[str, str] | None:
            for obj in lister("namespaces", None) or ():
                meta = obj.get("metadata") or {}
                if meta.get("name") == ns:
                    return meta.get("labels") or {}
            return None
        return from_list

    def _snapshot_lists(self, nodes: list[NodeInfo]) -> tuple[list[NodeInfo], list[NodeInfo], list[NodeInfo]]:
        snap = self.handle.snapshot
        if snap is not None:
            return snap.node_info_list, snap.have_pods_with_affinity_list, snap.have_pods_with_required_anti_affinity_list
        return (nodes, [n for n in nodes if n.pods_with_affinity],
                [n for n in nodes if n.pods_with_required_anti_affinity])

    def _resolve(self, terms: Iterable[AffinityTerm], fn: NamespaceLabels | None) -> list[_ResolvedTerm]:
        return [_ResolvedTerm(t, fn) for t in terms]

    # ------------------------------------------------------------------ filtering

    def pre_filter(
        self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]
    ) -> tuple[PreFilterResult | None, Status | None]:
        all_nodes, _, with_anti = self._snapshot_lists(nodes)
        fn = self.namespace_labels_fn()
        ns_labels = dict((fn(pod_info.namespace) if fn is not None else None) or {})
        s = PreFilterState(
            pod_info,
            self._resolve(pod_info.required_affinity_terms, fn),
            self._resolve(pod_info.required_anti_affinity_terms, fn),
            ns_labels,
        )
        pod = pod_info.pod
        shape = None
        # Without terms of its own the pod only meets existing pods' anti-affinity: the few
        # nodes holding such pods are visited directly.
        if (s.affinity_terms or s.anti_affinity_terms) and self.keep_totals and self.handle.snapshot is not None \
                and not any(t.term.namespace_selector is not None for t in (*s.affinity_terms, *s.anti_affinity_terms)):
            spec_aff = (pod.get("spec") or {}).get("affinity") or {}
            shape = shape_key(pod_info.namespace, (pod.get("metadata") or {}).get("labels"), ns_labels,
                               (spec_aff.get("podAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution"),
                               (spec_aff.get("podAntiAffinity") or {}).get(
                                   "requiredDuringSchedulingIgnoredDuringExecution"))
        if shape is not None:
            totals = totals_for(self._filter_totals, shape)
            totals.update(all_nodes, lambda ni: self._filter_contribution(s, ni))
            for (which, pair), (amount, _) in totals.totals.items():
                (s.existing_anti_affinity_counts if which == 0 else
                 s.affinity_counts if which == 1 else s.anti_affinity_counts)[pair] = amount
        else:
            for ni in with_anti:
                self._existing_anti_contribution(s, ni, s.existing_anti_affinity_counts)
            if s.affinity_terms or s.anti_affinity_terms:
                for ni in all_nodes:
                    self._own_terms_contribution(s, ni, s.affinity_counts, s.anti_affinity_counts)
        if not s.existing_anti_affinity_counts and not s.affinity_terms and not s.anti_affinity_terms:
            return None, Status.skip()
        state.write(_PRE_FILTER_KEY, s)
        return None, None

    @staticmethod
    def _existing_anti_contribution(s: PreFilterState, ni: NodeInfo, out: dict[TopologyPair, int]) -> None:
        """Required anti-affinity terms of the pods on ``ni`` that the incoming pod matches."""
        if not ni.pods_with_required_anti_affinity:
            return
        labels = _node_labels(ni.node)
        pod, ns_labels = s.pod_info.pod, s.namespace_labels
        for existing in ni.pods_with_required_anti_affinity:
            for term in existing.required_anti_affinity_terms:
                if term.topology_key in labels and term.matches(pod, ns_labels):
                    _bump(out, (term.topology_key, labels[term.topology_key]), 1)

    @staticmethod
    def _own_terms_contribution(s: PreFilterState, ni: NodeInfo, affinity: dict[TopologyPair, int],
                                anti: dict[TopologyPair, int]) -> None:
        """Pods on ``ni`` matched by the incoming pod's required (anti-)affinity terms."""
        if ni.node is None:
            return
        labels = _node_labels(ni.node)
        for existing in ni.pods:
            if _matches_all(s.affinity_terms, existing.pod):
                for t in s.affinity_terms:
                    if t.topology_key in labels:
                        _bump(affinity, (t.topology_key, labels[t.topology_key]), 1)
            for t in s.anti_affinity_terms:
                if t.topology_key in labels and t.matches(existing.pod):
                    _bump(anti, (t.topology_key, labels[t.topology_key]), 1)

    def _filter_contribution(self, s: PreFilterState, ni: NodeInfo) -> dict[Any, list[int]]:
        """One node's share of the three PreFilter counts, keyed (0|1|2, topology pair)."""
        ea: dict[TopologyPair, int] = {}
        aff: dict[TopologyPair, int] = {}
        anti: dict[TopologyPair, int] = {}
        self._existing_anti_contribution(s, ni, ea)
        if s.affinity_terms or s.anti_affinity_terms:
            self._own_terms_contribution(s, ni, aff, anti)
        out: dict[Any, list[int]] = {}
        for which, counts in ((0, ea), (1, aff), (2, anti)):
            for pair, n in counts.items():
                out[(which, pair)] = [n, n]
        return out

    def add_pod(self, state: CycleState, pod_info: PodInfo, pod_info_to_add: PodInfo,
                node_info: NodeInfo) -> Status | None:
        s: PreFilterState | None = state.get(_PRE_FILTER_KEY)
        if s is None:
            return Status.as_status(RuntimeError(f"reading {_PRE_FILTER_KEY!r} from cycleState: not found"))
        s.update_with_pod(pod_info_to_add, node_info.node, 1)
        return None

    def remove_pod(self, state: CycleState, pod_info: PodInfo, pod_info_to_remove: PodInfo,
                   node_info: NodeInfo) -> Status | None:
        s: PreFilterState | None = state.get(_PRE_FILTER_KEY)
        if s is None:
            return Status.as_status(RuntimeError(f"reading {_PRE_FILTER_KEY!r} from cycleState: not found"))
        s.update_with_pod(pod_info_to_remove, node_info.node, -1)
        return None

    @staticmethod
    def _satisfy_existing_anti_affinity(s: PreFilterState, labels: Mapping[str, str]) -> bool:
        if s.existing_anti_affinity_counts:
            for k, v in labels.items():
                if s.existing_anti_affinity_counts.get((k, v), 0) > 0:
                    return False
        return True

    @staticmethod
    def _satisfy_anti_affinity(s: PreFilterState, labels: Mapping[str, str]) -> bool:
        if s.anti_affinity_counts:
            for t in s.anti_affinity_terms:
                v = labels.get(t.topology_key)
                if v is not None and s.anti_affinity_counts.get((t.topology_key, v), 0) > 0:
                    return False
        return True

    @staticmethod
    def _satisfy_affinity(s: PreFilterState, labels: Mapping[str, str]) -> bool:
        pods_exist = True
        for t in s.affinity_terms:
            v = labels.get(t.topology_key)
            if v is None:
                # Every topology key must be present on the node.
                return False
            if s.affinity_counts.get((t.topology_key, v), 0) <= 0:
                pods_exist = False
        if not pods_exist:
            # The first pod of a group with affinity to itself: allowed when no
            # pod anywhere matches and the pod matches its own terms.
            return not s.affinity_counts and _matches_all(s.affinity_terms, s.pod_info.pod)
        return True

    def filter(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> Status | None:
        if node_info.node is None:
            return Status.as_status(RuntimeError("node not found"))
        s: PreFilterState | None = state.get(_PRE_FILTER_KEY)
        if s is None:
            return Status.as_status(RuntimeError(f"reading {_PRE_FILTER_KEY!r} from cycleState: not found"))
        labels = _node_labels(node_info.node)
        if not self._satisfy_affinity(s, labels):
            return Status.unresolvable(ERR_REASON_AFFINITY_RULES_NOT_MATCH)
        if not self._satisfy_anti_affinity(s, labels):
            return Status.unschedulable(ERR_REASON_ANTI_AFFINITY_RULES_NOT_MATCH)
        if not self._satisfy_existing_anti_affinity(s, labels):
            return Status.unschedulable(ERR_REASON_EXISTING_ANTI_AFFINITY_RULES_NOT_MATCH)
        return None

    def filter_pass_except(self, state: CycleState, pod_info: PodInfo) -> list[str] | None:
        """Nodes Filter may reject this cycle (see ``framework.fastpath``): the verdict only
        depends on the node's values for the topology keys of the counted terms."""
        s: PreFilterState | None = state.get(_PRE_FILTER_KEY)
        snap = self.handle.snapshot
        if s is None or snap is None:
            return None
        if not s.affinity_terms:
            return list(self._anti_failures(s, snap.node_info_list))
        keys = {t.topology_key for t in s.affinity_terms}
        keys.update(t.topology_key for t in s.anti_affinity_terms)
        keys.update(k for k, _ in s.existing_anti_affinity_counts)
        return nodes_not_passing(snap.node_info_list, tuple(sorted(keys)),
                                 lambda ni: self.filter(state, pod_info, ni) is None)

    def filter_known_statuses(self, state: CycleState, pod_info: PodInfo) -> dict[str, Status] | None:
        """Filter's status for each node it rejects this cycle, when the pod has no required
        affinity terms (then a node is rejected only for a counted anti-affinity pair)."""
        s: PreFilterState | None = state.get(_PRE_FILTER_KEY)
        snap = self.handle.snapshot
        if s is None or snap is None or s.affinity_terms:
            return None
        return {name: st for name, st in self._anti_failures(s, snap.node_info_list).items() if st is not None}

    def _label_index(self, nodes: list[NodeInfo], key: str) -> dict[str, list[str]] | None:
        """Label value -> names of the nodes with it, for ``key``; kept while the snapshot's
        node list and Node objects are unchanged (None without a snapshot version)."""
        version = getattr(self.handle.snapshot, "node_objects_version", None)
        if version is None:
            return None
        cached = self._label_indexes
        if cached is None or cached[0] is not nodes or cached[1] != version:
            cached = self._label_indexes = (nodes, version, {})
        index = cached[2].get(key)
        if index is None:
            index = {}
            for ni in nodes:
                v = _node_labels(ni.node).get(key)
                if v is not None:
                    index.setdefault(v, []).append(ni.name)
            cached[2][key] = index
        return index

    def _anti_failures(self, s: PreFilterState, nodes: list[NodeInfo]) -> dict[str, Status | None]:
        """Nodes Filter rejects for a pod without required affinity terms, with the status
        (None: the node has no Node object; Filter reports that itself). Computed once per
        cycle: only (topology key, value) pairs with a positive count can reject a node."""
        cached = s.anti_failures
        if cached is not None and cached[0] is nodes:
            return cached[1]
        anti_keys = {t.topology_key for t in s.anti_affinity_terms}
        anti = {p for p, n in s.anti_affinity_counts.items() if n > 0 and p[0] in anti_keys}
        existing = {p for p, n in s.existing_anti_affinity_counts.items() if n > 0}
        anti_status = Status.unschedulable(ERR_REASON_ANTI_AFFINITY_RULES_NOT_MATCH, plugin=NAME)
        existing_status = Status.unschedulable(ERR_REASON_EXISTING_ANTI_AFFINITY_RULES_NOT_MATCH, plugin=NAME)
        out: dict[str, Status | None] = {}
        indexes = {k: self._label_index(nodes, k) for k, _ in anti | existing}
        if all(ix is not None for ix in indexes.values()):
            # Existing-pod rejections first: a node rejected by both reports anti-affinity.
            for pairs, st in ((existing, existing_status), (anti, anti_status)):
                for k, v in pairs:
                    for name in indexes[k].get(v, ()):  # type: ignore[union-attr]
                        out[name] = st
            for ni in nodes:
                if ni.node is None:
                    out[ni.name] = None
            s.anti_failures = (nodes, out)
            return out
        anti_by_key = sorted({k for k, _ in anti})
        existing_by_key = sorted({k for k, _ in existing})
        for ni in nodes:
            node = ni.node
            if node is None:
                out[ni.name] = None
                continue
            labels = _node_labels(node)
            if anti and any((k, labels.get(k)) in anti for k in anti_by_key):
                out[ni.name] = anti_status
            elif existing and any((k, labels.get(k)) in existing for k in existing_by_key):
                out[ni.name] = existing_status
        s.anti_failures = (nodes, out)
        return out

    # ------------------------------------------------------------------ scoring

    def pre_score(self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]) -> Status | None:
        if not nodes:
            return None
        has_constraints = bool(pod_info.preferred_affinity_terms or pod_info.preferred_anti_affinity_terms)
        if self.ignore_preferred_terms_of_existing_pods and not has_constraints:
            return Status.skip()
        all_nodes, with_affinity, _ = self._snapshot_lists(nodes)
        to_visit = all_nodes if has_constraints else with_affinity
        fn = self.namespace_labels_fn()
        ns_labels = dict((fn(pod_info.namespace) if fn is not None else None) or {})
        pref = [_ResolvedTerm(w.term, fn, w.weight) for w in pod_info.preferred_affinity_terms]
        pref_anti = [_ResolvedTerm(w.term, fn, w.weight) for w in pod_info.preferred_anti_affinity_terms]
        scores: dict[str, dict[str, int]] = {}
        pod = pod_info.pod

        def contribution(ni: NodeInfo) -> dict[Any, list[int]]:
            out: dict[Any, list[int]] = {}
            labels = _node_labels(ni.node)
            if not labels:
                return out

            def add(key: str, amount: int) -> None:
                v = labels.get(key)
                if v is not None:
                    add_contribution(out, (key, v), amount)

            for existing in (ni.pods if has_constraints else ni.pods_with_affinity):
                for t in pref:
                    if t.matches(existing.pod):
                        add(t.topology_key, t.weight)
                for t in pref_anti:
                    if t.matches(existing.pod):
                        add(t.topology_key, -t.weight)
                if self.hard_pod_affinity_weight > 0:
                    for term in existing.required_affinity_terms:
                        if term.matches(pod, ns_labels):
                            add(term.topology_key, self.hard_pod_affinity_weight)
                if not self.ignore_preferred_terms_of_existing_pods:
                    for w in existing.preferred_affinity_terms:
                        if w.term.matches(pod, ns_labels):
                            add(w.term.topology_key, w.weight)
                    for w in existing.preferred_anti_affinity_terms:
                        if w.term.matches(pod, ns_labels):
                            add(w.term.topology_key, -w.weight)
            return out

        shape = None
        # Kept totals walk every node; visiting a few nodes with affinity pods is cheaper.
        if (has_constraints or 8 * len(to_visit) >= len(all_nodes)) and self.keep_totals \
                and self.handle.snapshot is not None \
                and not any(t.term.namespace_selector is not None for t in pref + pref_anti):
            spec_aff = (pod.get("spec") or {}).get("affinity") or {}
            shape = shape_key(pod_info.namespace, (pod.get("metadata") or {}).get("labels"), ns_labels,
                               has_constraints,
                               (spec_aff.get("podAffinity") or {}).get("preferredDuringSchedulingIgnoredDuringExecution"),
                               (spec_aff.get("podAntiAffinity") or {}).get(
                                   "preferredDuringSchedulingIgnoredDuringExecution"))
        if shape is not None:
            totals = totals_for(self._score_totals, shape)
            totals.update(all_nodes, contribution)
            items: Iterable[tuple[Any, list[int]]] = totals.totals.items()
        else:
            merged: dict[Any, list[int]] = {}
            for ni in to_visit:
                for key, (amount, n) in contribution(ni).items():
                    e = merged.setdefault(key, [0, 0])
                    e[0] += amount
                    e[1] += n
            items = merged.items()
        for (key, v), (amount, _) in items:
            scores.setdefault(key, {})[v] = amount
        if not scores:
            return Status.skip()
        state.write(_PRE_SCORE_KEY, PreScoreState(scores))
        return None

    def score(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> tuple[int, Status | None]:
        s: PreScoreState | None = state.get(_PRE_SCORE_KEY)
        if s is None:
            return 0, Status.as_status(RuntimeError(f"reading {_PRE_SCORE_KEY!r} from cycleState: not found"))
        labels = _node_labels(node_info.node)
        total = 0
        for key, values in s.topology_score.items():
            v = labels.get(key)
            if v is not None:
                total += values.get(v, 0)
        return total, None

    def normalize_score(self, state: CycleState, pod_info: PodInfo, scores: list[list[Any]]) -> Status | None:
        s: PreScoreState | None = state.get(_PRE_SCORE_KEY)
        if s is None or not s.topology_score or not scores:
            return None
        lo = min(e[1] for e in scores)
        hi = max(e[1] for e in scores)
        diff = hi - lo
        for e in scores:
            e[1] = int(MAX_NODE_SCORE * ((e[1] - lo) / diff)) if diff > 0 else 0
        return None

    # ------------------------------------------------------------------ queueing hints

    def events_to_register(self) -> list[ClusterEventWithHint]:
        return [
            ClusterEventWithHint(
                ClusterEvent(EventResource.POD, ActionType.ADD | ActionType.UPDATE_POD_LABEL | ActionType.DELETE),
                self.is_schedulable_after_pod_change),
            ClusterEventWithHint(
                ClusterEvent(EventResource.NODE, ActionType.ADD | ActionType.UPDATE_NODE_LABEL),
                self.is_schedulable_after_node_change),
        ]

    def is_schedulable_after_pod_change(self, pod: Obj, old: Any, new: Any) -> QueueingHint:
        for o in (old, new):
            if o is not None and not (o.get("spec") or {}).get("nodeName"):
                return QueueingHint.SKIP
        pi = PodInfo(pod)
        fn = self.namespace_labels_fn()
        terms = self._resolve(pi.required_affinity_terms, fn)
        anti = self._resolve(pi.required_anti_affinity_terms, fn)
        if old is not None and new is not None:
            if not _matches_all(terms, old) and _matches_all(terms, new):
                return QueueingHint.QUEUE
            if _matches_all(anti, old) and not _matches_all(anti, new):
                return QueueingHint.QUEUE
            return QueueingHint.SKIP
        if new is not None:
            return QueueingHint.QUEUE if _matches_all(terms, new) else QueueingHint.SKIP
        if old is None:
            return QueueingHint.SKIP
        if _matches_all(anti, old):
            return QueueingHint.QUEUE
        # A deleted pod whose own required anti-affinity rejected this pod.
        ns_labels = dict((fn(pi.namespace) if fn is not None else None) or {})
        for term in PodInfo(old).required_anti_affinity_terms:
            if term.matches(pod, ns_labels):
                return QueueingHint.QUEUE
        return QueueingHint.SKIP

    def is_schedulable_after_node_change(self, pod: Obj, old: Any, new: Any) -> QueueingHint:
        pi = PodInfo(pod)
        new_labels = _node_labels(new)
        old_labels = _node_labels(old) if old is not None else None
        for t in pi.required_affinity_terms:
            key = t.topology_key
            if old_labels is None:
                if key in new_labels:
                    return QueueingHint.QUEUE
                continue
            if key in new_labels and (key not in old_labels or old_labels[key] != new_labels[key]):
                return QueueingHint.QUEUE
        for t in pi.required_anti_affinity_terms:
            key = t.topology_key
            if old_labels is None:
                return QueueingHint.QUEUE
            if key in old_labels and (key not in new_labels or old_labels[key] != new_labels[key]):
                return QueueingHint.QUEUE
        return QueueingHint.SKIP
