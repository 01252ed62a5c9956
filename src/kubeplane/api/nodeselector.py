"""Node selectors (``nodeSelectorTerms``), as the scheduler, DRA pools and
PV node affinity evaluate them: terms are ORed, requirements within a term
ANDed; matchFields supports ``metadata.name``."""

from __future__ import annotations

from typing import Any, Mapping

Obj = dict[str, Any]


class NodeSelectorTerm:
    """One ``nodeSelectorTerm``: matchExpressions on labels AND matchFields on the name.

    A term with no requirements, or with an invalid one, matches nothing.
    """

    __slots__ = ("label_reqs", "name_in", "name_not_in", "valid", "empty")

    def __init__(self, term: Mapping[str, Any]) -> None:
        self.label_reqs: list[tuple[str, str, tuple[str, ...]]] = []
        self.name_in: list[str] = []
        self.name_not_in: list[str] = []
        self.valid = True
        exprs = term.get("matchExpressions") or []
        fields = term.get("matchFields") or []
        self.empty = not exprs and not fields
        for e in exprs:
            op = e.get("operator")
            key = e.get("key") or ""
            vals = tuple(str(v) for v in (e.get("values") or ()))
            if op in ("In", "NotIn"):
                if not vals:
                    self.valid = False
            elif op in ("Exists", "DoesNotExist"):
                if vals:
                    self.valid = False
            elif op in ("Gt", "Lt"):
                if len(vals) != 1:
                    self.valid = False
                else:
                    try:
                        int(vals[0])
                    except ValueError:
                        self.valid = False
            else:
                self.valid = False
            self.label_reqs.append((key, op or "", vals))
        for f in fields:
            vals = tuple(f.get("values") or ())
            op = f.get("operator")
            if f.get("key") != "metadata.name" or op not in ("In", "NotIn") or len(vals) != 1:
                self.valid = False
                continue
            (self.name_in if op == "In" else self.name_not_in).append(vals[0])

    def matches(self, node_name: str, labels: Mapping[str, str]) -> bool:
        if self.empty or not self.valid:
            return False
        for key, op, vals in self.label_reqs:
            val = labels.get(key)
            if op == "In":
                if val is None or val not in vals:
                    return False
            elif op == "NotIn":
                if val is not None and val in vals:
                    return False
            elif op == "Exists":
                if val is None:
                    return False
            elif op == "DoesNotExist":
                if val is not None:
                    return False
            else:
                if val is None:
                    return False
                try:
                    have = int(val)
                except ValueError:
                    return False
                want = int(vals[0])
                if (op == "Gt" and not have > want) or (op == "Lt" and not have < want):
                    return False
        for v in self.name_in:
            if node_name != v:
                return False
        for v in self.name_not_in:
            if node_name == v:
                return False
        return True


class NodeSelector:
    """A ``nodeSelector`` object (terms ORed). No terms matches nothing."""

    __slots__ = ("terms",)

    def __init__(self, selector: Mapping[str, Any] | None) -> None:
        self.terms = [NodeSelectorTerm(t or {}) for t in ((selector or {}).get("nodeSelectorTerms") or ())]

    def matches(self, node: Obj) -> bool:
        meta = node.get("metadata") or {}
        name = meta.get("name") or ""
        labels = meta.get("labels") or {}
        return any(t.matches(name, labels) for t in self.terms)
