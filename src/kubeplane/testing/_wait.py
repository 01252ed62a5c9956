"""What :meth:`Cluster.wait_for` waits for, modelled on ``kubectl wait --for``:
``create`` (the object exists), ``delete``, ``condition=TYPE[=STATUS]`` and
``jsonpath={...}[=VALUE]``, plus any Python callable over the object."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

Condition = Callable[[dict], Any]


class WaitTimeout(TimeoutError):
    """The wanted state was not reached in time; ``last`` holds the objects
    last seen (an empty list when none existed)."""

    def __init__(self, message: str, last: list[dict]) -> None:
        super().__init__(message)
        self.last = last


@dataclass(frozen=True)
class Predicate:
    """One test applied to each watched object; ``delete`` waits for absence instead."""

    description: str
    test: Condition | None = None  # None: existing is enough
    delete: bool = False
    #: a caller's callable: lookup errors inside it mean "not yet"
    user: bool = False

    def met(self, obj: dict) -> bool:
        return True if self.test is None else bool(self.test(obj))


def make_predicate(*, for_: str | None, condition: str | Condition | None, jsonpath: str | None,
                   delete: bool) -> Predicate:
    chosen = [n for n, v in (("for_", for_), ("condition", condition), ("jsonpath", jsonpath)) if v is not None]
    if delete:
        chosen.append("delete")
    if len(chosen) > 1:
        raise ValueError(f"give one of for_, condition, jsonpath and delete, not {' and '.join(chosen)}")
    if for_ is not None:
        return parse_for(for_)
    if delete:
        return Predicate("delete", delete=True)
    if jsonpath is not None:
        return jsonpath_predicate(jsonpath)
    if condition is None:
        return Predicate("create")
    if callable(condition):
        return Predicate(getattr(condition, "__name__", "condition"), condition, user=True)
    if isinstance(condition, str):
        text = condition[len("condition="):] if condition.startswith("condition=") else condition
        return condition_predicate(text)
    raise TypeError(f"condition must be a string or a callable, not {type(condition).__name__}")


def parse_for(spec: str) -> Predicate:
    """kubectl's ``--for`` syntax."""
    if spec == "delete":
        return Predicate("delete", delete=True)
    if spec == "create":
        return Predicate("create")
    if spec.startswith("condition="):
        return condition_predicate(spec[len("condition="):])
    if spec.startswith("jsonpath="):
        return jsonpath_predicate(spec[len("jsonpath="):])
    raise ValueError(f"unrecognized condition: {spec!r} (give delete, create, condition=TYPE[=STATUS] "
                     "or jsonpath={...}[=VALUE])")


def condition_predicate(text: str) -> Predicate:
    """``Ready`` or ``Ready=False``: the condition of that type (case-insensitive,
    as kubectl) has that status (default ``True``), and is not older than the
    object's generation when the condition or the status says what it observed."""
    ctype, sep, want = text.partition("=")
    ctype = ctype.strip()
    want = want.strip() if sep else "True"
    if not ctype:
        raise ValueError("condition=... needs a condition type")

    def test(obj: dict) -> bool:
        status = obj.get("status")
        conditions = status.get("conditions") if isinstance(status, dict) else None
        for cond in conditions if isinstance(conditions, list) else ():
            if not isinstance(cond, dict) or str(cond.get("type", "")).lower() != ctype.lower():
                continue
            if "status" not in cond:
                continue
            generation = (obj.get("metadata") or {}).get("generation")
            if isinstance(generation, int):
                observed = cond.get("observedGeneration", status.get("observedGeneration"))
                if isinstance(observed, int) and observed < generation:
                    return False
            return str(cond["status"]).lower() == want.lower()
        return False

    return Predicate(f"condition={ctype}={want}", test)


def jsonpath_predicate(text: str) -> Predicate:
    """``{.status.phase}=Running`` (the single value the path finds, printed,
    equals VALUE) or ``{.status.podIP}`` (the path finds something)."""
    expr, value = _split_jsonpath(text)
    path = JsonPath(expr)

    def test(obj: dict) -> bool:
        found = path.find(obj)
        if not found:
            return False
        if value is None:
            return True
        if len(found) > 1:
            raise ValueError("given jsonpath expression matches more than one value")
        got = found[0]
        if isinstance(got, (dict, list)):
            raise ValueError("jsonpath leads to a nested object or list which is not supported")
        return format_value(got) == value

    return Predicate(f"jsonpath={text}", test)


def _split_jsonpath(text: str) -> tuple[str, str | None]:
    """The expression and the wanted value (None: any) of kubectl's
    ``{.path}=value`` / ``{.path}``; like kubectl, the braces and the leading
    dot may be left out (``.status.phase=Running``, ``status.phase``) and the
    value may be quoted."""
    text = text.strip()
    if text.startswith("{"):
        expr, rest = _braced(text)
        if rest and not rest.startswith("="):
            raise ValueError(f"jsonpath wait format must be {{.path}}=value or {{.path}}, got {text!r}")
        value = rest[1:] if rest else None
    else:
        parts = _split_single_equals(text)
        if len(parts) > 2:
            raise ValueError(f"jsonpath wait format must be {{.path}}=value or {{.path}}, got {text!r}")
        expr, value = parts[0], (parts[1] if len(parts) == 2 else None)
    expr = expr.strip()
    if not expr:
        raise ValueError("jsonpath expression cannot be empty")
    if not expr.startswith((".", "[")):
        expr = "." + expr
    if value is not None:
        value = value.strip("'\"")
        if not value:
            raise ValueError("jsonpath wait has to have a value after equal sign, like {.status.readyReplicas}=3")
    return expr, value


def _braced(text: str) -> tuple[str, str]:
    """``{...}rest`` to (inside, rest), minding quotes and nested braces."""
    depth = 0
    quote = ""
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[1:i], text[i + 1:]
    raise ValueError(f"unclosed jsonpath expression: {text!r}")


def _split_single_equals(text: str) -> list[str]:
    """Split on ``=`` but not on ``==`` (kubectl's splitJSONPathInput)."""
    parts: list[str] = []
    cur: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "=":
            if text[i + 1:i + 2] == "=":
                cur.append("==")
                i += 2
                continue
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(text[i])
        i += 1
    parts.append("".join(cur))
    return parts


def format_value(v: Any) -> str:
    """A primitive as kubectl prints it (Go's %v)."""
    if v is True:
        return "true"
    if v is False:
        return "false"
    if v is None:
        return "<nil>"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


_TOKEN = re.compile(r"""
    \.\.(?P<recurse>[A-Za-z0-9_\-/]+|\*)      # ..name (recursive descent)
  | \.(?P<field>[A-Za-z0-9_\-/]+|\*)?         # .name, .* or the root's dot
  | \[(?P<bracket>(?:'[^']*'|"[^"]*"|[^\]])*)\]
""", re.VERBOSE)

_FILTER = re.compile(r"""^\?\(\s*@(?P<path>(?:\.[A-Za-z0-9_\-/]+)*)\s*
    (?:(?P<op>==|!=|<=|>=|<|>)\s*(?P<lit>'[^']*'|"[^"]*"|-?\d+(?:\.\d+)?|true|false))?\s*\)$""", re.VERBOSE)


class JsonPath:
    """The part of Kubernetes JSONPath that waits use: fields, ``[n]``
    (negative from the end), ``[a:b]``, ``[*]``, ``.*``, ``..name``,
    ``['key.with.dots']`` and filters ``[?(@.a.b == "x")]`` (also ``!=``,
    ``<``, ``<=``, ``>``, ``>=``, or bare ``[?(@.a)]`` for presence)."""

    def __init__(self, expr: str) -> None:
        self.expr = expr
        self.steps: list[tuple[str, Any]] = []
        pos = 0
        text = expr.strip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                raise ValueError(f"unrecognized jsonpath at {text[pos:]!r} in {expr!r}")
            pos = m.end()
            if m.group("recurse") is not None:
                self.steps.append(("recurse", m.group("recurse")))
            elif m.group("bracket") is not None:
                self.steps.append(self._bracket(m.group("bracket").strip()))
            elif m.group("field") is not None:
                self.steps.append(("field", m.group("field")))
        if not self.steps:
            self.steps.append(("field", None))  # {.}: the object itself

    def _bracket(self, inner: str) -> tuple[str, Any]:
        if inner == "*":
            return ("field", "*")
        if inner[:1] in "'\"" and inner[-1:] == inner[:1] and len(inner) >= 2:
            return ("field", inner[1:-1])
        if inner.startswith("?"):
            m = _FILTER.match(inner)
            if m is None:
                raise ValueError(f"unsupported jsonpath filter [{inner}] in {self.expr!r}")
            sub = JsonPath(m.group("path") or "")
            lit = m.group("lit")
            value: Any = None
            if lit is not None:
                if lit[:1] in "'\"":
                    value = lit[1:-1]
                elif lit in ("true", "false"):
                    value = lit == "true"
                else:
                    value = float(lit) if "." in lit else int(lit)
            return ("filter", (sub, m.group("op"), value))
        if ":" in inner:
            parts = inner.split(":")
            if len(parts) > 3:
                raise ValueError(f"invalid slice [{inner}] in {self.expr!r}")
            try:
                nums = [int(p) if p.strip() else None for p in parts]
            except ValueError:
                raise ValueError(f"invalid slice [{inner}] in {self.expr!r}") from None
            return ("slice", slice(*nums))
        try:
            return ("index", int(inner))
        except ValueError:
            raise ValueError(f"unsupported jsonpath subscript [{inner}] in {self.expr!r}") from None

    def find(self, obj: Any) -> list[Any]:
        """Every value the path reaches (missing keys reach nothing)."""
        current = [obj]
        for kind, arg in self.steps:
            nxt: list[Any] = []
            for v in current:
                nxt.extend(_step(v, kind, arg))
            current = nxt
        return current


def _step(v: Any, kind: str, arg: Any) -> list[Any]:
    if kind == "field":
        if arg is None:
            return [v]
        if arg == "*":
            return list(v.values()) if isinstance(v, dict) else list(v) if isinstance(v, list) else []
        return [v[arg]] if isinstance(v, dict) and arg in v else []
    if kind == "index":
        if isinstance(v, list) and -len(v) <= arg < len(v):
            return [v[arg]]
        return []
    if kind == "slice":
        return list(v[arg]) if isinstance(v, list) else []
    if kind == "recurse":
        out: list[Any] = []
        _descend(v, arg, out)
        return out
    sub, op, value = arg
    items = v if isinstance(v, list) else list(v.values()) if isinstance(v, dict) else []
    return [item for item in items if _matches(sub.find(item), op, value)]


def _descend(v: Any, name: str, out: list[Any]) -> None:
    if isinstance(v, dict):
        for k, child in v.items():
            if name == "*" or k == name:
                out.append(child)
            _descend(child, name, out)
    elif isinstance(v, list):
        for child in v:
            _descend(child, name, out)


def _matches(found: list[Any], op: str | None, value: Any) -> bool:
    if op is None:
        return bool(found)
    for got in found:
        if isinstance(value, bool) or isinstance(got, bool):
            ok = {"==": got == value, "!=": got != value}.get(op, False)
        elif isinstance(value, (int, float)) and isinstance(got, (int, float)):
            ok = {"==": got == value, "!=": got != value, "<": got < value, "<=": got <= value,
                  ">": got > value, ">=": got >= value}[op]
        elif isinstance(value, str) and isinstance(got, str):
            ok = {"==": got == value, "!=": got != value, "<": got < value, "<=": got <= value,
                  ">": got > value, ">=": got >= value}[op]
        else:
            ok = op == "!="
        if ok:
            return True
    return False
