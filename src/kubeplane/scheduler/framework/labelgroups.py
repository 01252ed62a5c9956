"""Filter verdicts per group of nodes with equal values for a few labels.

Some Filter plugins (InterPodAffinity, PodTopologySpread) decide a node from
counts computed in PreFilter and the node's values for a handful of
topology label keys only. For such a plugin, the nodes its Filter can reject
in a cycle follow from one Filter call per distinct combination of those
values, which is what :func:`nodes_not_passing` computes for the vectorised
Filter's ``filter_pass_except`` hook.
"""

from __future__ import annotations

from typing import Callable, Iterable

from kubeplane.scheduler.framework.nodeinfo import NodeInfo

__all__ = ["nodes_not_passing"]


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
