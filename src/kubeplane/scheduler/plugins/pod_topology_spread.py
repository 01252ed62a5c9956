"""PodTopologySpread: spread matching pods evenly across topology domains.

Hard constraints (``whenUnsatisfiable: DoNotSchedule``) are enforced by
PreFilter/Filter; soft ones (``ScheduleAnyway``) drive PreScore/Score/
NormalizeScore. A pod without constraints gets the profile's default
constraints; with ``defaultingType: System`` (the default) those are
hostname maxSkew 3 and zone maxSkew 5, both ScheduleAnyway, and their
selector is built from the Services, ReplicationControllers, ReplicaSets
and StatefulSets selecting the pod.

Args (``PodTopologySpreadArgs``): ``defaultConstraints`` (list of
constraints, no labelSelector) and ``defaultingType`` (``System`` or
``List``).

Workload lookup (optional): ``args["listObjects"]`` or
``handle.list_objects``, a callable ``(plural, namespace)`` returning the objects of ``services``, ``replicationcontrollers``,
``replicasets`` or ``statefulsets`` in a namespace. Without it the default
constraints have an empty selector and so are not applied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from kubeplane.api.selectors import LabelSelector, label_selector_from_dict, label_selector_from_set
from kubeplane.scheduler.framework.labelgroups import add_contribution, nodes_not_passing, shape_key, totals_for
from kubeplane.scheduler.framework.nodeinfo import NodeInfo, PodInfo, RequiredNodeAffinity
from kubeplane.scheduler.framework.plugin import Plugin
from kubeplane.scheduler.framework.types import (
    ActionType, ClusterEvent, ClusterEventWithHint, CycleState, EventResource, MAX_NODE_SCORE, Obj,
    PreFilterResult, QueueingHint, Status,
)
from kubeplane.scheduler.plugins.taint_toleration import find_untolerated_taint

NAME = "PodTopologySpread"
ERR_REASON_CONSTRAINTS_NOT_MATCH = "node(s) didn't match pod topology spread constraints"
ERR_REASON_NODE_LABEL_NOT_MATCH = ERR_REASON_CONSTRAINTS_NOT_MATCH + " (missing required label)"

LABEL_HOSTNAME = "kubernetes.io/hostname"
LABEL_TOPOLOGY_ZONE = "topology.kubernetes.io/zone"
DO_NOT_SCHEDULE = "DoNotSchedule"
SCHEDULE_ANYWAY = "ScheduleAnyway"
HONOR = "Honor"
IGNORE = "Ignore"
SYSTEM_DEFAULTING = "System"
LIST_DEFAULTING = "List"

SYSTEM_DEFAULT_CONSTRAINTS: list[Obj] = [
    {"topologyKey": LABEL_HOSTNAME, "whenUnsatisfiable": SCHEDULE_ANYWAY, "maxSkew": 3},
    {"topologyKey": LABEL_TOPOLOGY_ZONE, "whenUnsatisfiable": SCHEDULE_ANYWAY, "maxSkew": 5},
]

_PRE_FILTER_KEY = "PreFilter" + NAME
_PRE_SCORE_KEY = "PreScore" + NAME
_INVALID_SCORE = -1
_MAX_INT32 = 2**31 - 1

#: list_objects(plural, namespace) -> objects
ObjectLister = Callable[[str, "str | None"], list[Obj]]


@dataclass(slots=True)
class Constraint:
    """A parsed ``topologySpreadConstraint`` (selector compiled, defaults applied)."""

    max_skew: int
    topology_key: str
    selector: LabelSelector
    min_domains: int = 1
    node_affinity_policy: str = HONOR
    node_taints_policy: str = IGNORE

    def match_node_inclusion_policies(self, pod: Obj, node: Obj, required: RequiredNodeAffinity) -> bool:
        """Whether ``node`` counts as a domain member under the inclusion policies."""
        if self.node_affinity_policy == HONOR and not required.matches(node):
            return False
        if self.node_taints_policy == HONOR:
            tols = (pod.get("spec") or {}).get("tolerations") or []
            if find_untolerated_taint(((node.get("spec") or {}).get("taints") or []), tols) is not None:
                return False
        return True


def _labels(obj: Obj | None) -> dict[str, str]:
    return ((obj or {}).get("metadata") or {}).get("labels") or {}


def _namespace(obj: Obj) -> str:
    return (obj.get("metadata") or {}).get("namespace") or "default"


def node_labels_match_constraints(labels: Mapping[str, str], constraints: list[Constraint]) -> bool:
    """Whether the node carries every constraint's topology key."""
    return all(c.topology_key in labels for c in constraints)


def count_pods_match_selector(pods: list[PodInfo], selector: LabelSelector, namespace: str) -> int:
    """Matching pods in ``namespace``; terminating pods are not counted."""
    n = 0
    for pi in pods:
        meta = pi.pod.get("metadata") or {}
        if meta.get("deletionTimestamp") or pi.namespace != namespace:
            continue
        if selector.matches(meta.get("labels") or {}):
            n += 1
    return n


def filter_constraints(raw: list[Obj], pod_labels: Mapping[str, str], action: str) -> list[Constraint]:
    """Parse the constraints with ``whenUnsatisfiable == action``, merging ``matchLabelKeys``."""
    out: list[Constraint] = []
    for c in raw or ():
        if (c.get("whenUnsatisfiable") or DO_NOT_SCHEDULE) != action:
            continue
        selector = label_selector_from_dict(c.get("labelSelector"))
        match_labels = {k: pod_labels[k] for k in c.get("matchLabelKeys") or () if k in pod_labels}
        if match_labels:
            # As upstream: the pod's values first, then the selector's own
            # requirements (a nil selector contributes none).
            selector = label_selector_from_set(match_labels).add(*selector.requirements)
        min_domains = c.get("minDomains")
        out.append(Constraint(
            max_skew=int(c.get("maxSkew") or 0),
            topology_key=c.get("topologyKey") or "",
            selector=selector,
            min_domains=int(min_domains) if min_domains is not None else 1,
            node_affinity_policy=c.get("nodeAffinityPolicy") or HONOR,
            node_taints_policy=c.get("nodeTaintsPolicy") or IGNORE,
        ))
    return out


def _controller_of(pod: Obj) -> Obj | None:
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("controller"):
            return ref
    return None


def default_selector(pod: Obj, list_objects: ObjectLister | None) -> LabelSelector:
    """Upstream ``DefaultSelector``: selectors of the workloads and services owning the pod."""
    if list_objects is None:
        return label_selector_from_set(None)
    ns = _namespace(pod)
    labels = _labels(pod)
    merged: dict[str, str] = {}
    for svc in list_objects("services", ns) or ():
        sel = (svc.get("spec") or {}).get("selector")
        if sel is None:
            continue
        if label_selector_from_set(sel).matches(labels):
            merged.update(sel)
    selector = label_selector_from_set(merged)
    owner = _controller_of(pod)
    if owner is None:
        return selector
    api_version, kind, name = owner.get("apiVersion") or "", owner.get("kind") or "", owner.get("name") or ""
    if kind == "ReplicationController" and api_version == "v1":
        for rc in list_objects("replicationcontrollers", ns) or ():
            if (rc.get("metadata") or {}).get("name") == name:
                merged.update((rc.get("spec") or {}).get("selector") or {})
                selector = label_selector_from_set(merged)
                break
    elif (kind, api_version) in (("ReplicaSet", "apps/v1"), ("StatefulSet", "apps/v1")):
        plural = "replicasets" if kind == "ReplicaSet" else "statefulsets"
        for obj in list_objects(plural, ns) or ():
            if (obj.get("metadata") or {}).get("name") == name:
                try:
                    other = label_selector_from_dict((obj.get("spec") or {}).get("selector"))
                except Exception:  # noqa: BLE001 - an invalid selector adds nothing, as upstream
                    break
                if not other.matches_nothing:
                    selector = selector.add(*other.requirements)
                break
    return selector


class _CriticalPaths:
    """The two topology values with the fewest matching pods (index 0 is the minimum)."""

    __slots__ = ("paths",)

    def __init__(self) -> None:
        self.paths: list[list[Any]] = [["", _MAX_INT32], ["", _MAX_INT32]]

    def update(self, value: str, num: int) -> None:
        p = self.paths
        i = 0 if value == p[0][0] else 1 if value == p[1][0] else -1
        if i >= 0:
            p[i][1] = num
            if p[0][1] > p[1][1]:
                p[0], p[1] = p[1], p[0]
        elif num < p[0][1]:
            p[1] = list(p[0])
            p[0] = [value, num]
        elif num < p[1][1]:
            p[1] = [value, num]

    def clone(self) -> "_CriticalPaths":
        c = _CriticalPaths()
        c.paths = [list(self.paths[0]), list(self.paths[1])]
        return c


@dataclass
class PreFilterState:
    """Matching pod counts per topology value and critical paths, per hard constraint."""

    constraints: list[Constraint] = field(default_factory=list)
    critical_paths: list[_CriticalPaths] = field(default_factory=list)
    tp_value_to_match_num: list[dict[str, int]] = field(default_factory=list)

    def min_match_num(self, i: int, min_domains: int) -> int:
        if len(self.tp_value_to_match_num[i]) < min_domains:
            return 0
        return self.critical_paths[i].paths[0][1]

    def clone(self) -> "PreFilterState":
        return PreFilterState(
            self.constraints,
            [cp.clone() for cp in self.critical_paths],
            [dict(m) for m in self.tp_value_to_match_num],
        )


@dataclass
class PreScoreState:
    constraints: list[Constraint] = field(default_factory=list)
    ignored_nodes: set[str] = field(default_factory=set)
    topology_value_to_pod_counts: list[dict[str, int]] = field(default_factory=list)
    topology_normalizing_weight: list[float] = field(default_factory=list)

    def clone(self) -> "PreScoreState":
        return self


def topology_normalizing_weight(size: int) -> float:
    """Weight of a topology by its number of domains: ``ln(size + 2)``."""
    return math.log(size + 2)


def score_for_count(cnt: int, max_skew: int, tp_weight: float) -> float:
    return cnt * tp_weight + (max_skew - 1)


def _go_round(x: float) -> int:
    """Round half away from zero, as Go's ``math.Round``."""
    return int(math.floor(x + 0.5)) if x >= 0 else -int(math.floor(-x + 0.5))


class PodTopologySpread(Plugin):
    name = NAME

    def __init__(self, args: dict | None, handle: Any) -> None:
        super().__init__(args, handle)
        defaulting = self.args.get("defaultingType") or SYSTEM_DEFAULTING
        if defaulting not in (SYSTEM_DEFAULTING, LIST_DEFAULTING):
            raise ValueError(f'defaultingType: Unsupported value: "{defaulting}"')
        self.system_defaulted = defaulting == SYSTEM_DEFAULTING
        #: keep per-node PreFilter counts across cycles (per pod shape)
        self.keep_totals = True
        self._filter_totals: dict[bytes, Any] = {}
        if self.system_defaulted:
            if self.args.get("defaultConstraints"):
                raise ValueError("defaultConstraints: Invalid value: when .defaultingType is \"System\"")
            self.default_constraints: list[Obj] = SYSTEM_DEFAULT_CONSTRAINTS
        else:
            self.default_constraints = list(self.args.get("defaultConstraints") or ())
            for c in self.default_constraints:
                if c.get("labelSelector") is not None:
                    raise ValueError("defaultConstraints[*].labelSelector: Forbidden: constraint must not define a selector, as they deduced for each pod")

    # ------------------------------------------------------------------ helpers

    def _list_objects(self) -> ObjectLister | None:
        return self.args.get("listObjects") or self.handle.list_objects

    def _build_default_constraints(self, pod: Obj, action: str) -> list[Constraint]:
        # Cheap answers first: no default constraint with this action (the system
        # defaults are all ScheduleAnyway), or no selector to give them.
        if not any((c.get("whenUnsatisfiable") or DO_NOT_SCHEDULE) == action for c in self.default_constraints):
            return []
        selector = default_selector(pod, self._list_objects())
        if selector.empty:
            return []
        constraints = filter_constraints(self.default_constraints, _labels(pod), action)
        for c in constraints:
            c.selector = selector
        return constraints

    def get_constraints(self, pod: Obj, action: str = DO_NOT_SCHEDULE) -> list[Constraint]:
        """The pod's own constraints for ``action``, or the default ones when it has none."""
        raw = (pod.get("spec") or {}).get("topologySpreadConstraints") or []
        if raw:
            return filter_constraints(raw, _labels(pod), action)
        return self._build_default_constraints(pod, action)

    def _all_nodes(self, fallback: list[NodeInfo]) -> list[NodeInfo]:
        snap = self.handle.snapshot
        return snap.node_info_list if snap is not None else fallback

    # ------------------------------------------------------------------ filtering

    def calc_pre_filter_state(self, pod_info: PodInfo, nodes: list[NodeInfo]) -> PreFilterState:
        pod = pod_info.pod
        constraints = self.get_constraints(pod, DO_NOT_SCHEDULE)
        if not constraints:
            return PreFilterState()
        s = PreFilterState(constraints, [], [dict() for _ in constraints])
        required = pod_info.required_node_affinity

        def contribution(ni: NodeInfo) -> dict[Any, list[int]]:
            out: dict[Any, list[int]] = {}
            node = ni.node
            if node is None:
                return out
            labels = _labels(node)
            if not node_labels_match_constraints(labels, constraints):
                return out
            for i, c in enumerate(constraints):
                if not c.match_node_inclusion_policies(pod, node, required):
                    continue
                add_contribution(out, (i, labels[c.topology_key]),
                                 count_pods_match_selector(ni.pods, c.selector, pod_info.namespace))
            return out

        shape = self._shape(pod_info, constraints) if nodes is self._all_nodes(nodes) else None
        if shape is not None:
            totals = totals_for(self._filter_totals, shape)
            totals.update(nodes, contribution)
            items = totals.totals.items()
        else:
            merged: dict[Any, list[int]] = {}
            for ni in nodes:
                for key, (amount, n) in contribution(ni).items():
                    e = merged.setdefault(key, [0, 0])
                    e[0] += amount
                    e[1] += n
            items = merged.items()
        for (i, value), (amount, _) in items:
            s.tp_value_to_match_num[i][value] = amount
        for i in range(len(constraints)):
            cp = _CriticalPaths()
            for value, num in s.tp_value_to_match_num[i].items():
                cp.update(value, num)
            s.critical_paths.append(cp)
        return s

    def _shape(self, pod_info: PodInfo, constraints: list[Constraint]) -> bytes | None:
        """What a node's PreFilter contribution depends on besides the node: the pod's
        namespace, the constraints (as counted) and the fields the inclusion policies read."""
        if not self.keep_totals:
            return None
        spec = pod_info.pod.get("spec") or {}
        sel = [[c.topology_key, c.node_affinity_policy, c.node_taints_policy, c.selector.matches_nothing,
                [[r.key, r.operator, list(r.values)] for r in c.selector.requirements]] for c in constraints]
        return shape_key(pod_info.namespace, sel, spec.get("nodeSelector"),
                         (spec.get("affinity") or {}).get("nodeAffinity"), spec.get("tolerations"))

    def pre_filter(
        self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]
    ) -> tuple[PreFilterResult | None, Status | None]:
        try:
            s = self.calc_pre_filter_state(pod_info, nodes)
        except Exception as e:  # noqa: BLE001 - invalid selectors surface as an Error status
            return None, Status.as_status(RuntimeError(f"get constraints from pod: {e}"))
        if not s.constraints:
            return None, Status.skip()
        state.write(_PRE_FILTER_KEY, s)
        return None, None

    def _update_with_pod(self, s: PreFilterState, updated: PodInfo, preemptor: PodInfo,
                         node: Obj | None, delta: int) -> None:
        if node is None or updated.namespace != preemptor.namespace:
            return
        labels = _labels(node)
        if not node_labels_match_constraints(labels, s.constraints):
            return
        pod_labels = _labels(updated.pod)
        for i, c in enumerate(s.constraints):
            if not c.selector.matches(pod_labels):
                continue
            if not c.match_node_inclusion_policies(preemptor.pod, node, preemptor.required_node_affinity):
                continue
            v = labels[c.topology_key]
            m = s.tp_value_to_match_num[i]
            m[v] = m.get(v, 0) + delta
            s.critical_paths[i].update(v, m[v])

    def add_pod(self, state: CycleState, pod_info: PodInfo, pod_info_to_add: PodInfo,
                node_info: NodeInfo) -> Status | None:
        s = state.get(_PRE_FILTER_KEY)
        if s is None:
            return Status.as_status(RuntimeError(f"reading {_PRE_FILTER_KEY!r} from cycleState: not found"))
        self._update_with_pod(s, pod_info_to_add, pod_info, node_info.node, 1)
        return None

    def remove_pod(self, state: CycleState, pod_info: PodInfo, pod_info_to_remove: PodInfo,
                   node_info: NodeInfo) -> Status | None:
        s = state.get(_PRE_FILTER_KEY)
        if s is None:
            return Status.as_status(RuntimeError(f"reading {_PRE_FILTER_KEY!r} from cycleState: not found"))
        self._update_with_pod(s, pod_info_to_remove, pod_info, node_info.node, -1)
        return None

    def filter(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> Status | None:
        node = node_info.node
        if node is None:
            return Status.as_status(RuntimeError("node not found"))
        s: PreFilterState | None = state.get(_PRE_FILTER_KEY)
        if s is None:
            return Status.as_status(RuntimeError(f"reading {_PRE_FILTER_KEY!r} from cycleState: not found"))
        if not s.constraints:
            return None
        labels = _labels(node)
        pod_labels = _labels(pod_info.pod)
        for i, c in enumerate(s.constraints):
            tp_val = labels.get(c.topology_key)
            if tp_val is None:
                return Status.unresolvable(ERR_REASON_NODE_LABEL_NOT_MATCH)
            min_match = s.min_match_num(i, c.min_domains)
            self_match = 1 if c.selector.matches(pod_labels) else 0
            match_num = s.tp_value_to_match_num[i].get(tp_val, 0)
            if match_num + self_match - min_match > c.max_skew:
                return Status.unschedulable(ERR_REASON_CONSTRAINTS_NOT_MATCH)
        return None

    def filter_pass_except(self, state: CycleState, pod_info: PodInfo) -> list[str] | None:
        """Nodes Filter may reject this cycle (see ``framework.fastpath``): the verdict only
        depends on the node's values for the constraints' topology keys."""
        s: PreFilterState | None = state.get(_PRE_FILTER_KEY)
        snap = self.handle.snapshot
        if s is None or snap is None:
            return None
        keys = tuple(sorted({c.topology_key for c in s.constraints}))
        return nodes_not_passing(snap.node_info_list, keys, lambda ni: self.filter(state, pod_info, ni) is None)

    # ------------------------------------------------------------------ scoring

    def pre_score(self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]) -> Status | None:
        all_nodes = self._all_nodes(nodes)
        if not all_nodes:
            return Status.skip()
        pod = pod_info.pod
        has_own = bool((pod.get("spec") or {}).get("topologySpreadConstraints"))
        require_all = has_own or not self.system_defaulted
        try:
            constraints = self.get_constraints(pod, SCHEDULE_ANYWAY)
        except Exception as e:  # noqa: BLE001
            return Status.as_status(RuntimeError(f"calculating preScoreState: {e}"))
        if not constraints:
            return Status.skip()
        s = PreScoreState(constraints)
        s.topology_value_to_pod_counts = [dict() for _ in constraints]
        topo_size = [0] * len(constraints)
        for ni in nodes:
            labels = _labels(ni.node)
            if require_all and not node_labels_match_constraints(labels, constraints):
                s.ignored_nodes.add(ni.name)
                continue
            for i, c in enumerate(constraints):
                if c.topology_key == LABEL_HOSTNAME:
                    continue
                value = labels.get(c.topology_key, "")
                if value not in s.topology_value_to_pod_counts[i]:
                    s.topology_value_to_pod_counts[i][value] = 0
                    topo_size[i] += 1
        for i, c in enumerate(constraints):
            size = topo_size[i]
            if c.topology_key == LABEL_HOSTNAME:
                size = len(nodes) - len(s.ignored_nodes)
            s.topology_normalizing_weight.append(topology_normalizing_weight(size))
        required = pod_info.required_node_affinity
        for ni in all_nodes:
            node = ni.node
            if node is None:
                continue
            labels = _labels(node)
            if require_all and not node_labels_match_constraints(labels, constraints):
                continue
            for i, c in enumerate(constraints):
                if not c.match_node_inclusion_policies(pod, node, required):
                    continue
                value = labels.get(c.topology_key, "")
                counts = s.topology_value_to_pod_counts[i]
                if value not in counts:
                    continue
                counts[value] += count_pods_match_selector(ni.pods, c.selector, pod_info.namespace)
        state.write(_PRE_SCORE_KEY, s)
        return None

    def score(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> tuple[int, Status | None]:
        s: PreScoreState | None = state.get(_PRE_SCORE_KEY)
        if s is None:
            return 0, Status.as_status(RuntimeError(f"reading {_PRE_SCORE_KEY!r} from cycleState: not found"))
        if node_info.name in s.ignored_nodes:
            return 0, None
        labels = _labels(node_info.node)
        total = 0.0
        for i, c in enumerate(s.constraints):
            tp_val = labels.get(c.topology_key)
            if tp_val is None:
                continue
            if c.topology_key == LABEL_HOSTNAME:
                cnt = count_pods_match_selector(node_info.pods, c.selector, pod_info.namespace)
            else:
                cnt = s.topology_value_to_pod_counts[i].get(tp_val, 0)
            total += score_for_count(cnt, c.max_skew, s.topology_normalizing_weight[i])
        return _go_round(total), None

    def normalize_score(self, state: CycleState, pod_info: PodInfo, scores: list[list[Any]]) -> Status | None:
        s: PreScoreState | None = state.get(_PRE_SCORE_KEY)
        if s is None:
            return None
        min_score: int | None = None
        max_score = 0
        for entry in scores:
            if entry[0] in s.ignored_nodes:
                entry[1] = _INVALID_SCORE
                continue
            min_score = entry[1] if min_score is None else min(min_score, entry[1])
            max_score = max(max_score, entry[1])
        lo = min_score if min_score is not None else 0
        for entry in scores:
            if entry[1] == _INVALID_SCORE:
                entry[1] = 0
                continue
            if max_score == 0:
                entry[1] = MAX_NODE_SCORE
                continue
            entry[1] = MAX_NODE_SCORE * (max_score + lo - entry[1]) // max_score
        return None

    # ------------------------------------------------------------------ queueing hints

    def events_to_register(self) -> list[ClusterEventWithHint]:
        return [
            ClusterEventWithHint(
                ClusterEvent(EventResource.POD, ActionType.ADD | ActionType.UPDATE_POD_LABEL | ActionType.DELETE),
                self.is_schedulable_after_pod_change),
            ClusterEventWithHint(
                ClusterEvent(EventResource.NODE, ActionType.ADD | ActionType.DELETE | ActionType.UPDATE_NODE_LABEL
                             | ActionType.UPDATE_NODE_TAINT),
                self.is_schedulable_after_node_change),
        ]

    @staticmethod
    def _involved(other: Obj, pod: Obj) -> bool:
        om, pm = other.get("metadata") or {}, pod.get("metadata") or {}
        if om.get("uid") and om.get("uid") == pm.get("uid"):
            return True
        return bool((other.get("spec") or {}).get("nodeName")) and _namespace(other) == _namespace(pod)

    def is_schedulable_after_pod_change(self, pod: Obj, old: Any, new: Any) -> QueueingHint:
        if (new is not None and not self._involved(new, pod)) or (old is not None and not self._involved(old, pod)):
            return QueueingHint.SKIP
        constraints = self.get_constraints(pod, DO_NOT_SCHEDULE)
        if old is not None and new is not None:
            if _labels(old) == _labels(new):
                return QueueingHint.SKIP
            for c in constraints:
                if c.selector.matches(_labels(old)) != c.selector.matches(_labels(new)):
                    return QueueingHint.QUEUE
            return QueueingHint.SKIP
        target = new if new is not None else old
        if target is None:
            return QueueingHint.SKIP
        for c in constraints:
            if c.selector.matches(_labels(target)):
                return QueueingHint.QUEUE
        return QueueingHint.SKIP

    def is_schedulable_after_node_change(self, pod: Obj, old: Any, new: Any) -> QueueingHint:
        constraints = self.get_constraints(pod, DO_NOT_SCHEDULE)
        old_match = old is not None and node_labels_match_constraints(_labels(old), constraints)
        new_match = new is not None and node_labels_match_constraints(_labels(new), constraints)
        if old_match != new_match:
            return QueueingHint.QUEUE
        if new_match and old is not None:
            ol, nl = _labels(old), _labels(new)
            if any(ol.get(c.topology_key) != nl.get(c.topology_key) for c in constraints):
                return QueueingHint.QUEUE
            if ((old.get("spec") or {}).get("taints") or []) != ((new.get("spec") or {}).get("taints") or []):
                return QueueingHint.QUEUE
        return QueueingHint.SKIP
