"""The cost of evaluating an admission expression, known before it runs.

Upstream's CEL runtime counts the cost of an evaluation as it goes and
cancels it past a limit: ``PerCallLimit`` (1,000,000) for one expression and
``RuntimeCELCostBudget`` (10,000,000) for everything one policy evaluates
for one request. The runtime kubeplane uses has no such counter and cannot be
interrupted, so the cost is bounded before evaluation instead: the checked
tree is walked with the sizes of the actual inputs (the length of every list,
map and string the expression reaches through its variables), charging as
upstream's cost model does (one per node visited, string and list traversals
by their length, each comprehension's body once per element of its range).
The result is an upper bound of upstream's actual cost for the same
evaluation: an expression that short-circuits may be charged for work it
would have skipped, never the reverse, so no request can make an evaluation
run unbounded.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Mapping

from kubeplane.admission.ast import Node

#: upstream's celconfig.PerCallLimit and celconfig.RuntimeCELCostBudget
PER_CALL_LIMIT = 1_000_000
RUNTIME_BUDGET = 10_000_000

#: upstream's traversal factor: one unit per ten characters or elements walked
_TRAVERSAL = 0.1


class Shape:
    """The largest sizes found under one place of the inputs.

    ``values`` are the concrete values that may stand at that place (for a
    comprehension variable, every element of its range): sizes are the largest
    among them, found lazily and only for the places an expression reaches."""

    __slots__ = ("values", "_size", "_elem", "_fields")

    def __init__(self, values: Iterable[Any]) -> None:
        self.values = list(values)
        self._size: int | None = None
        self._elem: Shape | None = None
        self._fields: dict[str, Shape] = {}

    @property
    def size(self) -> int:
        if self._size is None:
            best = 0
            for v in self.values:
                if isinstance(v, (str, bytes, list, dict)):
                    best = max(best, len(v))
            self._size = best
        return self._size

    def elem(self) -> "Shape":
        if self._elem is None:
            out: list[Any] = []
            for v in self.values:
                if isinstance(v, list):
                    out.extend(v)
                elif isinstance(v, dict):
                    out.extend(v.values())
            self._elem = Shape(out)
        return self._elem

    def keys(self) -> "Shape":
        out: list[Any] = []
        for v in self.values:
            if isinstance(v, dict):
                out.extend(v)
        return Shape(out)

    def field(self, name: str) -> "Shape":
        s = self._fields.get(name)
        if s is None:
            s = self._fields[name] = Shape(v[name] for v in self.values if isinstance(v, dict) and name in v)
        return s


class Bound:
    """A value of unknown content whose size is at most ``size`` and whose
    elements are :class:`Bound` of ``elem_size``."""

    __slots__ = ("size", "elem_size")

    def __init__(self, size: int, elem_size: int) -> None:
        self.size = size
        self.elem_size = elem_size

    def elem(self) -> "Bound":
        return Bound(self.elem_size, self.elem_size)

    def keys(self) -> "Bound":
        return Bound(self.elem_size, self.elem_size)

    def field(self, name: str) -> "Bound":
        return Bound(self.elem_size, self.elem_size)


class Unknown(Bound):
    """A computed value bounded only by the size of all inputs, found when
    (and only if) a cost needs it."""

    __slots__ = ("_estimator",)

    def __init__(self, estimator: "Estimator") -> None:
        self._estimator = estimator

    @property
    def size(self) -> int:  # type: ignore[override]
        return self._estimator.unknown

    @property
    def elem_size(self) -> int:  # type: ignore[override]
        return self._estimator.unknown

    def elem(self) -> "Bound":
        return self

    def keys(self) -> "Bound":
        return self

    def field(self, name: str) -> "Bound":
        return self


SCALAR = Bound(0, 0)

Abstract = Shape | Bound


def _trav(n: int) -> int:
    return math.ceil(n * _TRAVERSAL)


#: functions whose cost is one traversal of their receiver / first argument
_STRING_SCANS = frozenset({
    "contains", "startsWith", "endsWith", "lowerAscii", "upperAscii", "trim", "charAt", "indexOf",
    "lastIndexOf", "substring", "replace", "split", "string", "bytes", "base64.encode", "base64.decode",
    "quote", "reverse", "url", "isURL", "getScheme", "getHost", "getHostname", "getPort", "getEscapedPath",
    "getQuery", "ip", "isIP", "cidr", "isCIDR", "quantity", "isQuantity", "semver", "isSemver",
})
_LIST_SCANS = frozenset({"isSorted", "sum", "min", "max", "join", "@in", "format", "sets.contains",
                         "sets.equivalent", "sets.intersects", "math.greatest", "math.least"})
_REGEX = frozenset({"matches", "find", "findAll"})
#: operators and functions whose result has no size
_SCALAR_RESULTS = frozenset({
    "!_", "-_", "_&&_", "_||_", "_%_", "_*_", "_/_", "_-_", "@not_strictly_false", "not_strictly_false",
    "isSorted", "sign", "isInteger", "asInteger", "asApproximateFloat", "compareTo", "isLessThan",
    "isGreaterThan", "major", "minor", "patch", "allowed", "errored", "isQuantity", "isSemver",
})


class Estimator:
    """Walks one tree; ``variables`` map each name to its abstract value."""

    def __init__(self, variables: Mapping[str, Abstract] | Callable[[str], Abstract | None],
                 unknown: Callable[[], int]) -> None:
        #: comprehension variables in scope
        self.scope: dict[str, Abstract] = {}
        self._roots = variables.get if isinstance(variables, Mapping) else variables
        self._unknown = unknown
        self._unknown_value: int | None = None
        self._unknown_bound = Unknown(self)

    @property
    def unknown(self) -> int:
        """The size bound of a value no input bounds better (computed results),
        found only if an expression needs it."""
        if self._unknown_value is None:
            self._unknown_value = max(self._unknown(), 1)
        return self._unknown_value

    def _bound(self) -> Bound:
        return self._unknown_bound

    def cost(self, node: Node) -> tuple[int, Abstract]:
        kind = node[0]
        if kind == "const":
            v = node[1]
            n = len(v) if isinstance(v, (str, bytes)) else 0
            return 0, Shape([v]) if n else Bound(0, 0)
        if kind == "ident":
            found = self.scope.get(node[1])
            if found is None:
                found = self._roots(node[1])
            return 1, found if found is not None else self._bound()
        if kind == "select":
            c, v = self.cost(node[1])
            return c + 1, v.field(node[2])
        if kind == "list":
            total, biggest = 10, 0
            for e in node[1]:
                c, v = self.cost(e)
                total += c
                biggest = max(biggest, v.size)
            return total, Bound(len(node[1]), max(biggest, 0))
        if kind == "map":
            total, biggest = 30, 0
            for k, e in node[1]:
                if isinstance(k, tuple):
                    total += self.cost(k)[0]
                c, v = self.cost(e)
                total += c
                biggest = max(biggest, v.size)
            return total, Bound(len(node[1]), biggest)
        if kind == "comp":
            return self._comprehension(node)
        return self._call(node)

    def _comprehension(self, node: Node) -> tuple[int, Abstract]:
        _, iter_var, rng, accu_var, init, cond, step, result = node
        c_range, v_range = self.cost(rng)
        c_init, v_init = self.cost(init)
        n = v_range.size
        saved = {k: self.scope.get(k) for k in (iter_var, accu_var)}
        self.scope[iter_var] = v_range.elem() if not isinstance(v_range, Shape) or \
            any(isinstance(x, list) for x in v_range.values) else v_range.keys()
        # A map or filter accumulates at most one element per iteration.
        self.scope[accu_var] = v_init if n == 0 else Bound(max(n, v_init.size), self.unknown)
        c_cond, _ = self.cost(cond)
        c_step, _ = self.cost(step)
        c_result, v_result = self.cost(result)
        for k, v in saved.items():
            if v is None:
                self.scope.pop(k, None)
            else:
                self.scope[k] = v
        return c_range + c_init + n * (c_cond + c_step) + c_result, v_result

    def _call(self, node: Node) -> tuple[int, Abstract]:
        _, fn, target, args = node
        total = 1
        vals: list[Abstract] = []
        if target is not None:
            c, v = self.cost(target)
            total += c
            vals.append(v)
        for a in args:
            c, v = self.cost(a)
            total += c
            vals.append(v)
        sizes = [v.size for v in vals]
        if fn == "_+_" and len(vals) == 2:
            size = sizes[0] + sizes[1]
            return total + _trav(size), Bound(size, max(_elem_size(vals[0]), _elem_size(vals[1])))
        if fn in ("_==_", "_!=_", "_<_", "_<=_", "_>_", "_>=_") and vals:
            return total + _trav(min(sizes) if fn not in ("_==_", "_!=_") else max(sizes)), Bound(0, 0)
        if fn == "@in" and len(vals) == 2:
            return total + sizes[1], Bound(0, 0)
        if fn in _REGEX and vals:
            pattern = sizes[-1] if len(vals) > 1 else 1
            return total + _trav(sizes[0]) * max(pattern, 1), Bound(sizes[0], sizes[0])
        if fn in _STRING_SCANS and vals:
            biggest = max(sizes)
            return total + _trav(biggest) + (_trav(sum(sizes[1:])) if fn == "replace" else 0), \
                Bound(biggest * (max(sizes[2], 1) if fn == "replace" and len(sizes) > 2 else 1), biggest)
        if fn.startswith("sets.") and len(vals) == 2:
            return total + sizes[0] * max(sizes[1], 1), SCALAR
        if fn in _LIST_SCANS and vals:
            return total + vals[0].size, Bound(self.unknown, self.unknown)
        if fn == "_[_]" and len(vals) == 2:
            key = node[3][1] if len(node[3]) > 1 else None
            base = vals[0]
            if key is not None and key[0] == "const" and isinstance(key[1], str):
                return total, base.field(key[1])
            return total, base.elem()
        if fn in _SCALAR_RESULTS:
            return total, SCALAR
        if fn == "_?_:_" and len(vals) == 3:
            a, b = vals[1], vals[2]
            return total, a if a.size >= b.size else b
        if fn in ("size", "type", "has", "dyn", "int", "uint", "double", "bool", "duration", "timestamp"):
            return total, Bound(0, 0) if fn != "dyn" else (vals[0] if vals else self._bound())
        if fn in ("optional.of", "optional.ofNonZeroValue", "value", "orValue", "or", "_?._", "_[?_]"):
            if fn in ("_?._", "_[?_]") and len(node[3]) > 1 and node[3][1][0] == "const" \
                    and isinstance(node[3][1][1], str):
                return total, vals[0].field(node[3][1][1])
            return total, vals[0] if vals else self._bound()
        return total, Bound(self.unknown, self.unknown)


def _elem_size(v: Abstract) -> int:
    return v.elem().size if isinstance(v, Shape) else v.elem_size


def unknown_bound(values: Iterable[Any], cap: int = 1 << 40) -> int:
    """A size no list, map or string computed from ``values`` can exceed
    without concatenation: the number of nodes and characters they hold."""
    total = 0
    stack = list(values)
    while stack and total < cap:
        v = stack.pop()
        if isinstance(v, dict):
            total += len(v) + 1
            stack.extend(v.values())
            total += sum(len(k) for k in v if isinstance(k, str))
        elif isinstance(v, list):
            total += len(v) + 1
            stack.extend(v)
        elif isinstance(v, (str, bytes)):
            total += len(v) + 1
        else:
            total += 1
    return total


def estimate(root: Node, variables: Mapping[str, Abstract] | Callable[[str], Abstract | None],
             unknown: Callable[[], int]) -> int:
    return Estimator(variables, unknown).cost(root)[0]
