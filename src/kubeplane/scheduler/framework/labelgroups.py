"""Filter verdicts per group of nodes with equal values for a few labels.

Some Filter plugins (InterPodAffinity, PodTopologySpread) decide a node from
counts computed in PreFilter and the node's values for a handful of
topology label keys only. For such a plugin, the nodes its Filter can reject
in a cycle follow from one Filter call per distinct combination of those
values, which is what :func:`nodes_not_passing` computes for the vectorised
Filter's ``filter_pass_except`` hook.

The same plugins sum, in PreFilter and PreScore, what each node's pods
contribute; :class:`NodeTotals` keeps those sums across cycles and recomputes
only the nodes that changed.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import orjson

from kubeplane.scheduler.framework.nodeinfo import NodeInfo

__all__ = ["NodeTotals", "add_contribution", "nodes_not_passing", "shape_key", "totals_for"]


def nodes_not_passing(nodes: Iterable[NodeInfo], keys: tuple[str, ...],
                      passes: Callable[[NodeInfo], bool]) -> list[str]:
    """Names of the nodes for which ``passes`` is false, or that have no Node object.

    ``passes(node_info)`` must depend only on the node's values for ``keys``
    (a missing label is a value of its own); it is called once per distinct
    combination of values."""
    verdicts: dict[tuple[str | None, ...], bool] = {}
    out: list[str] = []
    for ni in nodes:
        node = ni.node
        if node is None:
            out.append(ni.name)
            continue
        labels = (node.get("metadata") or {}).get("labels") or {}
        group = tuple(labels.get(k) for k in keys)
        ok = verdicts.get(group)
        if ok is None:
            ok = verdicts[group] = passes(ni)
        if not ok:
            out.append(ni.name)
    return out


class NodeTotals:
    """Sums over a node list of per-node contributions ``key -> (amount, additions)``,
    kept across cycles: only nodes whose NodeInfo generation changed are recomputed.

    Valid for one node list object (a snapshot replaces its list when nodes come
    or go) and one contribution function (the caller keys instances by pod shape)."""

    __slots__ = ("nodes", "per_node", "totals")

    def __init__(self) -> None:
        self.nodes: list[NodeInfo] | None = None
        self.per_node: dict[str, tuple[int, dict[Any, list[int]]]] = {}
        self.totals: dict[Any, list[int]] = {}

    def update(self, nodes: list[NodeInfo], contribution: Callable[[NodeInfo], dict[Any, list[int]]]) -> None:
        if self.nodes is not nodes:
            self.nodes, self.per_node, self.totals = nodes, {}, {}
        per_node, totals = self.per_node, self.totals
        for ni in nodes:
            hit = per_node.get(ni.name)
            if hit is not None and hit[0] == ni.generation:
                continue
            if hit is not None:
                for key, (amount, n) in hit[1].items():
                    t = totals[key]
                    t[0] -= amount
                    t[1] -= n
                    if not t[1]:
                        del totals[key]
            c = contribution(ni)
            for key, (amount, n) in c.items():
                t = totals.get(key)
                if t is None:
                    totals[key] = [amount, n]
                else:
                    t[0] += amount
                    t[1] += n
            per_node[ni.name] = (ni.generation, c)


def add_contribution(c: dict[Any, list[int]], key: Any, amount: int) -> None:
    """Add ``amount`` under ``key`` to a node's contribution (counting the addition)."""
    e = c.get(key)
    if e is None:
        c[key] = [amount, 1]
    else:
        e[0] += amount
        e[1] += 1


#: pod shapes whose per-node totals a plugin keeps (oldest dropped first)
MAX_SHAPES = 16


def shape_key(*parts: Any) -> bytes | None:
    """A key for JSON-shaped ``parts`` (None when they are not JSON)."""
    try:
        return orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return None


def totals_for(memo: dict[bytes, NodeTotals], key: bytes) -> NodeTotals:
    """The NodeTotals kept under ``key`` (created, dropping the oldest beyond MAX_SHAPES)."""
    t = memo.get(key)
    if t is None:
        if len(memo) >= MAX_SHAPES:
            del memo[next(iter(memo))]
        t = memo[key] = NodeTotals()
    return t
