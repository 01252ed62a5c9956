"""Kubernetes' CEL libraries common to every kubeplane CEL environment
(``k8s.io/apiserver/pkg/cel/library``): lists (``isSorted``, ``sum``,
``min``, ``max``), regex (``find``, ``findAll``, RE2 semantics), URLs, IPs
and CIDRs (:mod:`kubeplane.cel.net`) and quantities (shared with DRA), plus
the error-text cleaning both environments apply.
"""

from __future__ import annotations

import re
from typing import Any

from cel_expr_python import cel as _cel

from kubeplane.apiextensions.regex import compile_full
from kubeplane.cel import net
from kubeplane.dra import cel as _dracel

T = _cel.Type

_STATUS_PREFIX = re.compile(r"^(INVALID_ARGUMENT|NOT_FOUND|OUT_OF_RANGE|UNKNOWN|INTERNAL|UNIMPLEMENTED|"
                            r"FAILED_PRECONDITION): ")
_STATUS_SUFFIX = re.compile(r"\s*\[[A-Z_]+\]$")
_KEY_NOT_FOUND = re.compile(r'Key not found in map\s*:\s*"?(.*?)"?$')


def clean_error(text: str) -> str:
    """The runtime's error text without its status code decorations."""
    return _STATUS_SUFFIX.sub("", _STATUS_PREFIX.sub("", text.strip()))


def runtime_message(text: str) -> str:
    """An evaluation error in cel-go's words where the runtime's differ."""
    text = clean_error(text)
    m = _KEY_NOT_FOUND.match(text)
    if m:
        return f"no such key: {m.group(1)}"
    if text.startswith("No matching overloads found"):
        return "no such overload"
    lower = text.lower()
    if lower.startswith("index out of range") or "index out of bounds" in lower:
        m = re.search(r"(-?\d+)", text)
        return f"index out of bounds: {m.group(1)}" if m else "index out of bounds"
    if "divide by zero" in lower or "division by zero" in lower:
        return "division by zero"
    if "modulus by zero" in lower:
        return "modulus by zero"
    if "overflow" in lower:
        return "integer overflow"
    return text


# ------------------------------------------------------------------ lists

def _comparable(items: list) -> list:
    # quantities are maps at run time; compare their values
    return [_dracel._qval(x) if isinstance(x, dict) and _dracel._QKEY in x else x for x in items]


def list_is_sorted(items: list) -> bool:
    vals = _comparable(list(items))
    try:
        return all(not (vals[i + 1] < vals[i]) for i in range(len(vals) - 1))
    except TypeError:
        raise ValueError("no such overload") from None


def list_sum(items: list) -> Any:
    # int, uint, double or duration (upstream's overloads); 0 for an empty list
    total: Any = 0
    for i, x in enumerate(items):
        if isinstance(x, (bool, str, bytes, list, dict)):
            raise ValueError("no such overload")
        try:
            total = x if i == 0 else total + x
        except TypeError:
            raise ValueError("no such overload") from None
    return total


def list_min(items: list) -> Any:
    if not items:
        raise ValueError("min called on empty list")
    try:
        return min(items)
    except TypeError:
        raise ValueError("no such overload") from None


def list_max(items: list) -> Any:
    if not items:
        raise ValueError("max called on empty list")
    try:
        return max(items)
    except TypeError:
        raise ValueError("no such overload") from None


# ------------------------------------------------------------------ regex

def _regex(pattern: str) -> Any:
    r = compile_full(pattern)
    if r is None:
        raise ValueError(f"invalid regex: {pattern}")
    return r


def regex_find(s: str, pattern: str) -> str:
    m = _regex(pattern).search(s)
    return m.group(0) if m else ""


def regex_find_all(s: str, pattern: str, limit: int = -1) -> list[str]:
    out: list[str] = []
    for m in _regex(pattern).finditer(s):
        if 0 <= limit <= len(out):
            break
        out.append(m.group(0))
    return out


def decls() -> list[Any]:
    """The declarations of the libraries above, for ``cel.NewEnv(functions=...)``."""
    F, O = _cel.FunctionDecl, _cel.Overload
    S, I, B, D = T.STRING, T.INT, T.BOOL, T.DYN
    L = T.List(T.DYN)
    return [
        *_dracel._decls(),
        *net.decls(),
        F("find", [O("k8s_find", S, [S, S], is_member=True, impl=regex_find)]),
        F("findAll", [
            O("k8s_find_all", T.List(S), [S, S], is_member=True, impl=regex_find_all),
            O("k8s_find_all_n", T.List(S), [S, S, I], is_member=True, impl=regex_find_all),
        ]),
        F("isSorted", [O("k8s_list_is_sorted", B, [L], is_member=True, impl=list_is_sorted)]),
        F("sum", [O("k8s_list_sum", D, [L], is_member=True, impl=list_sum)]),
        F("min", [O("k8s_list_min", D, [L], is_member=True, impl=list_min)]),
        F("max", [O("k8s_list_max", D, [L], is_member=True, impl=list_max)]),
    ]
