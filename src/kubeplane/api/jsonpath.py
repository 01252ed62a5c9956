"""The JSONPath subset CustomResourceDefinitions use (client-go's
``util/jsonpath``, as printer columns, scale subresource paths and
selectable fields write it): ``.a.b``, ``.a[0]``, ``.a[*].b``,
``.a['x.y']``, ``.a[?(@.type=="Ready")].status``, optionally inside ``{}``.

Paths are parsed once (:func:`compile_path`) into steps and then evaluated
over plain JSON dicts; a parse error is a :class:`JSONPathError` whose text
says what is wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any


class JSONPathError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class _Field:
    name: str


@dataclass(frozen=True, slots=True)
class _Index:
    index: int | None  # None: every element ([*])


@dataclass(frozen=True, slots=True)
class _Filter:
    path: tuple[Any, ...]
    op: str
    value: Any


_IDENT = re.compile(r"[A-Za-z0-9_\-$/]+")
_FILTER = re.compile(r"\?\(@((?:\.[A-Za-z0-9_\-$/]+)+)\s*(==|!=)\s*(\"[^\"]*\"|'[^']*'|-?\d+(?:\.\d+)?|true|false)\s*\)")


@lru_cache(maxsize=1024)
def compile_path(text: str) -> tuple[Any, ...]:
    """The steps of a path; raises :class:`JSONPathError` when it is not one."""
    s = text.strip()
    if s.startswith("{") and s.endswith("}"):
        s = s[1:-1].strip()
    if s.startswith("$"):
        s = s[1:]
    if not s.startswith("."):
        raise JSONPathError("must be a simple json path starting with .")
    steps: list[Any] = []
    i = 0
    while i < len(s):
        c = s[i]
        if c == ".":
            m = _IDENT.match(s, i + 1)
            if m is None:
                if i + 1 == len(s) and not steps:
                    return ()
                raise JSONPathError(f"unrecognized character in action: {s[i + 1:i + 2]!r}")
            steps.append(_Field(m.group(0)))
            i = m.end()
        elif c == "[":
            end = s.find("]", i)
            if end < 0:
                raise JSONPathError("unterminated array")
            inner = s[i + 1:end].strip()
            if inner.startswith("?"):
                end = s.find(")]", i)
                if end < 0:
                    raise JSONPathError("unterminated filter")
                inner = s[i + 1:end + 1].strip()
                m = _FILTER.fullmatch(inner)
                if m is None:
                    raise JSONPathError(f"unsupported filter: {inner}")
                fpath = tuple(_Field(p) for p in m.group(1).split(".")[1:])
                raw = m.group(3)
                if raw[0] in "\"'":
                    value: Any = raw[1:-1]
                elif raw in ("true", "false"):
                    value = raw == "true"
                else:
                    value = float(raw) if "." in raw else int(raw)
                steps.append(_Filter(fpath, m.group(2), value))
                i = end + 2
                continue
            if inner == "*":
                steps.append(_Index(None))
            elif inner[:1] in ("'", '"') and inner[-1:] == inner[:1] and len(inner) >= 2:
                steps.append(_Field(inner[1:-1]))
            else:
                try:
                    steps.append(_Index(int(inner)))
                except ValueError:
                    raise JSONPathError(f"invalid array index {inner}") from None
            i = end + 1
        else:
            raise JSONPathError(f"unrecognized character in action: {c!r}")
    return tuple(steps)


def _step(values: list[Any], step: Any) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if isinstance(step, _Field):
            if isinstance(v, dict) and step.name in v:
                out.append(v[step.name])
        elif isinstance(step, _Index):
            if isinstance(v, list):
                if step.index is None:
                    out.extend(v)
                elif -len(v) <= step.index < len(v):
                    out.append(v[step.index])
        else:
            if isinstance(v, list):
                for item in v:
                    got = find(item, step.path)
                    if not got:
                        continue
                    equal = got[0] == step.value
                    if equal == (step.op == "=="):
                        out.append(item)
    return out


def find(obj: Any, steps: tuple[Any, ...]) -> list[Any]:
    """Every value the path reaches in ``obj`` (empty when none)."""
    values = [obj]
    for step in steps:
        values = _step(values, step)
        if not values:
            return []
    return values


def find_first(obj: Any, path: str) -> tuple[bool, Any]:
    """(found, value) of a simple path such as ``.spec.replicas``."""
    got = find(obj, compile_path(path))
    return (True, got[0]) if got else (False, None)


def field_steps(path: str) -> list[str]:
    """The field names of a path made of fields only (``.spec.replicas`` →
    ``["spec", "replicas"]``); raises :class:`JSONPathError` otherwise."""
    steps = compile_path(path)
    names = []
    for s in steps:
        if not isinstance(s, _Field):
            raise JSONPathError("must be a path of fields only")
        names.append(s.name)
    return names
