"""Label and field selectors, with upstream's syntax, canonical text and errors.

Label selectors come either as the query-string syntax (``app=web,tier in
(a,b),!canary``) or as a ``metav1.LabelSelector`` object (``matchLabels`` and
``matchExpressions``). Both compile to the same immutable
:class:`LabelSelector`, whose :meth:`LabelSelector.matches` does no parsing
and no allocation beyond a dict lookup per requirement.

Field selectors support ``=``, ``==`` and ``!=`` on the fields each resource
exposes (see :data:`SELECTABLE_FIELDS`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any, Callable, Mapping

from kubeplane.api import errors
from kubeplane.api.errors import go_repr
from kubeplane.api.strings import is_qualified_name, is_valid_label_value

__all__ = [
    "FieldRequirement",
    "FieldSelector",
    "LabelSelector",
    "Requirement",
    "SELECTABLE_FIELDS",
    "everything",
    "field_value",
    "label_selector_from_dict",
    "label_selector_from_set",
    "nothing",
    "parse_field_selector",
    "parse_label_selector",
    "selectable_fields",
]

# Operators, spelled as in the string syntax (and upstream's selection.Operator).
EQUALS = "="
DOUBLE_EQUALS = "=="
NOT_EQUALS = "!="
IN = "in"
NOT_IN = "notin"
EXISTS = "exists"
DOES_NOT_EXIST = "!"
GREATER_THAN = "gt"
LESS_THAN = "lt"

_BINARY_OPERATORS = ("in", "notin", "=", "==", "!=", "gt", "lt")

_MISSING = object()


# --------------------------------------------------------------------------- labels


@dataclass(frozen=True, slots=True)
class Requirement:
    """One ``key op values`` term. ``values`` are kept sorted and de-duplicated."""

    key: str
    operator: str
    values: tuple[str, ...] = ()
    _set: frozenset[str] = dc_field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        uniq = tuple(sorted(set(self.values)))
        object.__setattr__(self, "values", uniq)
        object.__setattr__(self, "_set", frozenset(uniq))

    def matches(self, labels: Mapping[str, str]) -> bool:
        op = self.operator
        val = labels.get(self.key, _MISSING)
        if op in (EQUALS, DOUBLE_EQUALS, IN):
            return val is not _MISSING and val in self._set
        if op in (NOT_EQUALS, NOT_IN):
            return val is _MISSING or val not in self._set
        if op == EXISTS:
            return val is not _MISSING
        if op == DOES_NOT_EXIST:
            return val is _MISSING
        if op in (GREATER_THAN, LESS_THAN):
            if val is _MISSING:
                return False
            try:
                have, want = int(val), int(self.values[0])  # type: ignore[arg-type]
            except (ValueError, IndexError):
                return False
            return have > want if op == GREATER_THAN else have < want
        return False

    def __str__(self) -> str:
        op = self.operator
        if op == EXISTS:
            return self.key
        if op == DOES_NOT_EXIST:
            return "!" + self.key
        joined = ",".join(self.values)
        if op in (IN, NOT_IN):
            return f"{self.key} {op} ({joined})"
        sym = {GREATER_THAN: ">", LESS_THAN: "<"}.get(op, op)
        return f"{self.key}{sym}{joined}"


def _make_requirement(key: str, op: str, values: list[str] | tuple[str, ...]) -> Requirement:
    return Requirement(key, op, tuple(values))


def _field_err(path: str, value: Any, detail: str) -> str:
    return f"{path}: Invalid value: {go_repr(value)}: {detail}"


def _requirement_errors(key: str, op: str, values: list[str]) -> list[str]:
    """Upstream ``NewRequirement`` checks, as field-error strings (path relative to the term)."""
    out: list[str] = []
    key_errs = is_qualified_name(key)
    if key_errs:
        out.append(_field_err("key", key, "; ".join(key_errs)))
    if op in (IN, NOT_IN):
        if not values:
            out.append(_field_err("values", values, "for 'in', 'notin' operators, values set can't be empty"))
    elif op in (EQUALS, DOUBLE_EQUALS, NOT_EQUALS):
        if len(values) != 1:
            out.append(_field_err("values", values, "exact-match compatibility requires one single value"))
    elif op in (EXISTS, DOES_NOT_EXIST):
        if values:
            out.append(_field_err("values", values, "values set must be empty for exists and does not exist"))
    elif op in (GREATER_THAN, LESS_THAN):
        if len(values) != 1:
            out.append(_field_err("values", values, "for 'Gt', 'Lt' operators, exactly one value is required"))
        for i, v in enumerate(values):
            try:
                int(v)
            except ValueError:
                out.append(_field_err(f"values[{i}]", v, "for 'Gt', 'Lt' operators, the value must be an integer"))
    for i, v in enumerate(values):
        v_errs = is_valid_label_value(v)
        if v_errs:
            out.append(_field_err(f"values[{i}][{key}]", v, "; ".join(v_errs)))
    return out


def _aggregate(msgs: list[str]) -> str:
    return msgs[0] if len(msgs) == 1 else "[" + ", ".join(msgs) + "]"


class LabelSelector:
    """A compiled label selector: the AND of its requirements.

    ``LabelSelector.nothing()`` (from a ``None`` metav1 selector) matches no
    object; a selector with no requirements matches every object.
    """

    __slots__ = ("requirements", "_match_nothing", "_fast", "_slow")

    def __init__(self, requirements: tuple[Requirement, ...] = (), *, match_nothing: bool = False) -> None:
        self.requirements: tuple[Requirement, ...] = tuple(sorted(requirements, key=lambda r: r.key))
        self._match_nothing = match_nothing
        # Single-value equality terms are checked as plain (key, value) pairs.
        fast: list[tuple[str, str]] = []
        slow: list[Requirement] = []
        for r in self.requirements:
            if r.operator in (EQUALS, DOUBLE_EQUALS, IN) and len(r.values) == 1:
                fast.append((r.key, r.values[0]))
            else:
                slow.append(r)
        self._fast = tuple(fast)
        self._slow = tuple(slow)

    @property
    def empty(self) -> bool:
        """True when the selector does not restrict anything (matches everything)."""
        return not self._match_nothing and not self.requirements

    @property
    def matches_nothing(self) -> bool:
        return self._match_nothing

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        if self._match_nothing:
            return False
        if labels is None:
            labels = {}
        get = labels.get
        for key, value in self._fast:
            if get(key, _MISSING) != value:
                return False
        for r in self._slow:
            if not r.matches(labels):
                return False
        return True

    __call__ = matches

    def requires_exact_match(self, key: str) -> str | None:
        """The single value ``key`` must have, if the selector pins it."""
        for r in self.requirements:
            if r.key == key:
                if r.operator in (EQUALS, DOUBLE_EQUALS, IN) and len(r.values) == 1:
                    return r.values[0]
                return None
        return None

    def add(self, *reqs: Requirement) -> "LabelSelector":
        return LabelSelector(self.requirements + reqs, match_nothing=self._match_nothing)

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)

    def __repr__(self) -> str:
        if self._match_nothing:
            return "LabelSelector(<nothing>)"
        return f"LabelSelector({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, LabelSelector)
            and self._match_nothing == other._match_nothing
            and self.requirements == other.requirements
        )

    def __hash__(self) -> int:
        return hash((self._match_nothing, self.requirements))


_EVERYTHING = LabelSelector()
_NOTHING = LabelSelector(match_nothing=True)


def everything() -> LabelSelector:
    return _EVERYTHING


def nothing() -> LabelSelector:
    return _NOTHING


# Lexer for the string syntax.
_T_ERROR, _T_EOS, _T_CLOSE, _T_COMMA, _T_NOT, _T_DEQ, _T_EQ, _T_GT, _T_ID, _T_IN, _T_LT, _T_NEQ, _T_NOTIN, _T_OPEN = range(14)
_LITERALS = {
    ")": _T_CLOSE, ",": _T_COMMA, "!": _T_NOT, "==": _T_DEQ, "=": _T_EQ, ">": _T_GT,
    "in": _T_IN, "<": _T_LT, "!=": _T_NEQ, "notin": _T_NOTIN, "(": _T_OPEN,
}
_SPECIAL = frozenset("=!(),><")
_WHITESPACE = frozenset(" \t\r\n")


def _lex(s: str) -> list[tuple[int, str]]:
    items: list[tuple[int, str]] = []
    i, n = 0, len(s)
    while True:
        while i < n and s[i] in _WHITESPACE:
            i += 1
        if i >= n:
            items.append((_T_EOS, ""))
            return items
        ch = s[i]
        if ch in _SPECIAL:
            buf = ""
            last: tuple[int, str] | None = None
            while i < n and s[i] in _SPECIAL:
                cand = buf + s[i]
                if cand in _LITERALS:
                    buf = cand
                    last = (_LITERALS[cand], cand)
                    i += 1
                elif last is not None:
                    break
                else:
                    buf = cand
                    i += 1
            if last is None:
                items.append((_T_ERROR, f"error expected: keyword found '{buf}'"))
            else:
                items.append(last)
        else:
            start = i
            while i < n and s[i] not in _SPECIAL and s[i] not in _WHITESPACE:
                i += 1
            word = s[start:i]
            items.append((_LITERALS.get(word, _T_ID), word))


class _SelectorParseError(Exception):
    pass


class _Parser:
    def __init__(self, s: str) -> None:
        self.items = _lex(s)
        self.pos = 0

    def _look(self, values: bool = True) -> tuple[int, str]:
        tok, lit = self.items[self.pos]
        if values and tok in (_T_IN, _T_NOTIN):
            tok = _T_ID
        return tok, lit

    def _next(self, values: bool = True) -> tuple[int, str]:
        tok, lit = self._look(values)
        self.pos += 1
        return tok, lit

    def parse(self) -> list[Requirement]:
        reqs: list[Requirement] = []
        while True:
            tok, lit = self._look()
            if tok in (_T_ID, _T_NOT):
                try:
                    reqs.append(self._requirement())
                except _SelectorParseError as e:
                    raise _SelectorParseError(f"unable to parse requirement: {e}") from None
                t, l = self._next()
                if t == _T_EOS:
                    return reqs
                if t == _T_COMMA:
                    t2, l2 = self._look()
                    if t2 not in (_T_ID, _T_NOT):
                        raise _SelectorParseError(f"found '{l2}', expected: identifier after ','")
                else:
                    raise _SelectorParseError(f"found '{l}', expected: ',' or 'end of string'")
            elif tok == _T_EOS:
                return reqs
            else:
                raise _SelectorParseError(f"found '{lit}', expected: !, identifier, or 'end of string'")

    def _requirement(self) -> Requirement:
        op: str | None = None
        tok, lit = self._next()
        if tok == _T_NOT:
            op = DOES_NOT_EXIST
            tok, lit = self._next()
        if tok != _T_ID:
            raise _SelectorParseError(f"found '{lit}', expected: identifier")
        key_errs = is_qualified_name(lit)
        if key_errs:
            raise _SelectorParseError(_field_err("<nil>", lit, "; ".join(key_errs)))
        key = lit
        t, _ = self._look()
        if t in (_T_EOS, _T_COMMA):
            return self._build(key, op or EXISTS, [])
        if op == DOES_NOT_EXIST:
            # "!key" takes no operator; what follows is reported by the caller
            return self._build(key, op, [])
        tok, lit = self._next(values=False)
        ops = {_T_IN: IN, _T_EQ: EQUALS, _T_DEQ: DOUBLE_EQUALS, _T_GT: GREATER_THAN,
               _T_LT: LESS_THAN, _T_NOTIN: NOT_IN, _T_NEQ: NOT_EQUALS}
        if tok not in ops:
            raise _SelectorParseError(f"found '{lit}', expected: {', '.join(_BINARY_OPERATORS)}")
        op = ops[tok]
        values = self._set_values() if op in (IN, NOT_IN) else self._exact_value()
        return self._build(key, op, values)

    @staticmethod
    def _build(key: str, op: str, values: list[str]) -> Requirement:
        errs = _requirement_errors(key, op, values)
        if errs:
            raise _SelectorParseError(_aggregate(errs))
        return _make_requirement(key, op, values)

    def _set_values(self) -> list[str]:
        tok, lit = self._next()
        if tok != _T_OPEN:
            raise _SelectorParseError(f"found '{lit}' expected: '('")
        tok, lit = self._look()
        if tok == _T_CLOSE:
            self._next()
            return [""]
        if tok not in (_T_ID, _T_COMMA):
            raise _SelectorParseError(f"found '{lit}', expected: ',', ')' or identifier")
        out: set[str] = set()
        while True:
            t, l = self._next()
            if t == _T_ID:
                out.add(l)
                t2, l2 = self._look()
                if t2 == _T_COMMA:
                    continue
                if t2 == _T_CLOSE:
                    break
                raise _SelectorParseError(f"found '{l2}', expected: ',' or ')'")
            if t == _T_COMMA:
                if not out:
                    out.add("")
                t2, _ = self._look()
                if t2 == _T_CLOSE:
                    out.add("")
                    break
                if t2 == _T_COMMA:
                    out.add("")
                continue
            raise _SelectorParseError(f"found '{l}', expected: ',', or identifier")
        t, _ = self._next()
        if t != _T_CLOSE:  # pragma: no cover - guarded by the loop above
            raise _SelectorParseError(f"found '{lit}', expected: ')'")
        return sorted(out)

    def _exact_value(self) -> list[str]:
        tok, _ = self._look()
        if tok in (_T_EOS, _T_COMMA):
            return [""]
        tok, lit = self._next()
        if tok == _T_ID:
            return [lit]
        raise _SelectorParseError(f"found '{lit}', expected: identifier")


_PARSE_CACHE: dict[str, LabelSelector] = {}


def parse_label_selector(s: str) -> LabelSelector:
    """Parse the string syntax (``a=b,c!=d,e in (f,g),h notin (i),j,!k,l>3``).

    Raises a 400 :class:`~kubeplane.api.errors.StatusError` with upstream's
    message on bad input. An empty string selects everything.
    """
    hit = _PARSE_CACHE.get(s)
    if hit is not None:
        return hit
    try:
        reqs = _Parser(s).parse()
    except _SelectorParseError as e:
        raise errors.bad_request(str(e)) from None
    sel = LabelSelector(tuple(reqs)) if reqs else _EVERYTHING
    if len(_PARSE_CACHE) > 2048:
        _PARSE_CACHE.clear()
    _PARSE_CACHE[s] = sel
    return sel


def label_selector_from_set(labels: Mapping[str, str] | None) -> LabelSelector:
    """Selector matching exactly the given labels (no validation); empty → everything."""
    if not labels:
        return _EVERYTHING
    return LabelSelector(tuple(_make_requirement(k, EQUALS, (v,)) for k, v in labels.items()))


_EXPR_OPS = {"In": IN, "NotIn": NOT_IN, "Exists": EXISTS, "DoesNotExist": DOES_NOT_EXIST}


def label_selector_from_dict(sel: Mapping[str, Any] | None) -> LabelSelector:
    """Compile a ``metav1.LabelSelector``, as upstream ``LabelSelectorAsSelector``.

    ``None`` matches nothing; ``{}`` (no matchLabels, no matchExpressions)
    matches everything. Invalid selectors raise a 400 StatusError.
    """
    if sel is None:
        return _NOTHING
    match_labels = sel.get("matchLabels") or {}
    exprs = sel.get("matchExpressions") or []
    if not match_labels and not exprs:
        return _EVERYTHING
    try:
        key: Any = (
            tuple(match_labels.items()),
            tuple((e.get("key"), e.get("operator"), tuple(e.get("values") or ())) for e in exprs),
        )
        hit = _DICT_CACHE.get(key)
    except (TypeError, AttributeError):  # unhashable or malformed: compile without caching
        key, hit = None, None
    if hit is not None:
        return hit
    compiled = _compile_dict(match_labels, exprs)
    if key is not None:
        if len(_DICT_CACHE) > 4096:
            _DICT_CACHE.clear()
        _DICT_CACHE[key] = compiled
    return compiled


_DICT_CACHE: dict[Any, LabelSelector] = {}


def _compile_dict(match_labels: Mapping[str, Any], exprs: list[Any]) -> LabelSelector:
    reqs: list[Requirement] = []
    for k, v in match_labels.items():
        v = "" if v is None else v
        errs = _requirement_errors(k, EQUALS, [v])
        if errs:
            raise errors.bad_request(_aggregate(errs))
        reqs.append(_make_requirement(k, EQUALS, (v,)))
    for expr in exprs:
        if expr is None:  # a JSON null decodes to the zero requirement, as upstream
            expr = {}
        raw_op = expr.get("operator")
        op = _EXPR_OPS.get(raw_op)  # type: ignore[arg-type]
        if op is None:
            raise errors.bad_request(f"{json.dumps(raw_op if raw_op is not None else '')} is not a valid label selector operator")
        key = expr.get("key") or ""
        values = ["" if v is None else v for v in expr.get("values") or ()]
        if op in (EXISTS, DOES_NOT_EXIST):
            values = []
        errs = _requirement_errors(key, op, values)
        if errs:
            raise errors.bad_request(_aggregate(errs))
        reqs.append(_make_requirement(key, op, values))
    return LabelSelector(tuple(reqs))


# --------------------------------------------------------------------------- fields


def _bool(v: Any) -> str:
    return "true" if v else "false"


def _str(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return _bool(v)
    return str(v)


def _path_getter(*path: str) -> Callable[[Mapping[str, Any]], str]:
    def get(obj: Mapping[str, Any]) -> str:
        cur: Any = obj
        for p in path:
            if not isinstance(cur, Mapping):
                return ""
            cur = cur.get(p)
        return _str(cur)

    return get


def _pod_ip(obj: Mapping[str, Any]) -> str:
    status = obj.get("status") or {}
    ips = status.get("podIPs") or []
    if ips and isinstance(ips[0], Mapping):
        return _str(ips[0].get("ip"))
    return _str(status.get("podIP"))


def _bool_getter(*path: str) -> Callable[[Mapping[str, Any]], str]:
    def get(obj: Mapping[str, Any]) -> str:
        cur: Any = obj
        for p in path:
            if not isinstance(cur, Mapping):
                return "false"
            cur = cur.get(p)
        return _bool(cur)

    return get


def _int_getter(*path: str) -> Callable[[Mapping[str, Any]], str]:
    def get(obj: Mapping[str, Any]) -> str:
        cur: Any = obj
        for p in path:
            if not isinstance(cur, Mapping):
                return "0"
            cur = cur.get(p)
        return str(int(cur or 0))

    return get


_COMMON_FIELDS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "metadata.name": _path_getter("metadata", "name"),
    "metadata.namespace": _path_getter("metadata", "namespace"),
}

_EXTRA_FIELDS: dict[str, dict[str, Callable[[Mapping[str, Any]], str]]] = {
    "pods": {
        "spec.nodeName": _path_getter("spec", "nodeName"),
        "spec.restartPolicy": _path_getter("spec", "restartPolicy"),
        "spec.schedulerName": _path_getter("spec", "schedulerName"),
        "spec.serviceAccountName": _path_getter("spec", "serviceAccountName"),
        "spec.hostNetwork": _bool_getter("spec", "hostNetwork"),
        "status.phase": _path_getter("status", "phase"),
        "status.podIP": _pod_ip,
        "status.nominatedNodeName": _path_getter("status", "nominatedNodeName"),
    },
    "events": {
        "involvedObject.kind": _path_getter("involvedObject", "kind"),
        "involvedObject.namespace": _path_getter("involvedObject", "namespace"),
        "involvedObject.name": _path_getter("involvedObject", "name"),
        "involvedObject.uid": _path_getter("involvedObject", "uid"),
        "involvedObject.apiVersion": _path_getter("involvedObject", "apiVersion"),
        "involvedObject.resourceVersion": _path_getter("involvedObject", "resourceVersion"),
        "involvedObject.fieldPath": _path_getter("involvedObject", "fieldPath"),
        "reason": _path_getter("reason"),
        "reportingComponent": _path_getter("reportingComponent"),
        "source": _path_getter("source", "component"),
        "type": _path_getter("type"),
    },
    "nodes": {"spec.unschedulable": _bool_getter("spec", "unschedulable")},
    "namespaces": {"status.phase": _path_getter("status", "phase")},
    "secrets": {"type": _path_getter("type")},
    "replicasets": {"status.replicas": _int_getter("status", "replicas")},
    "jobs": {"status.successful": _int_getter("status", "succeeded")},
}

SELECTABLE_FIELDS: dict[str, dict[str, Callable[[Mapping[str, Any]], str]]] = {
    plural: {**_COMMON_FIELDS, **extra} for plural, extra in _EXTRA_FIELDS.items()
}


def selectable_fields(plural: str) -> dict[str, Callable[[Mapping[str, Any]], str]]:
    """Field name → getter for a resource (every resource has name and namespace)."""
    return SELECTABLE_FIELDS.get(plural, _COMMON_FIELDS)


def field_value(obj: Mapping[str, Any], field_name: str, plural: str | None = None) -> str:
    """The string a field selector compares against (``""`` when absent).

    Without ``plural`` the field is looked up in every resource's table.
    """
    if plural is not None:
        getter = selectable_fields(plural).get(field_name)
    else:
        getter = _COMMON_FIELDS.get(field_name)
        if getter is None:
            for fields in _EXTRA_FIELDS.values():
                getter = fields.get(field_name)
                if getter is not None:
                    break
    if getter is None:
        return _path_getter(*field_name.split("."))(obj)
    return getter(obj)


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    field: str
    operator: str  # "=", "==" or "!="
    value: str
    getter: Callable[[Mapping[str, Any]], str] = dc_field(compare=False, repr=False, default=_path_getter())

    def matches(self, obj: Mapping[str, Any]) -> bool:
        have = self.getter(obj)
        return have != self.value if self.operator == "!=" else have == self.value

    def __str__(self) -> str:
        return f"{self.field}{self.operator}{_escape_field_value(self.value)}"


class FieldSelector:
    """A parsed field selector: the AND of its terms."""

    __slots__ = ("requirements",)

    def __init__(self, requirements: tuple[FieldRequirement, ...] = ()) -> None:
        self.requirements = requirements

    @property
    def empty(self) -> bool:
        return not self.requirements

    def matches(self, obj: Mapping[str, Any]) -> bool:
        for r in self.requirements:
            if not r.matches(obj):
                return False
        return True

    __call__ = matches

    def requires_exact_match(self, field_name: str) -> str | None:
        """The value ``field_name`` must equal, if a term pins it."""
        for r in self.requirements:
            if r.field == field_name and r.operator in ("=", "=="):
                return r.value
        return None

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)

    def __repr__(self) -> str:
        return f"FieldSelector({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FieldSelector) and self.requirements == other.requirements

    def __hash__(self) -> int:
        return hash(self.requirements)


def _escape_field_value(v: str) -> str:
    return v.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")


def _split_terms(s: str) -> list[str]:
    terms: list[str] = []
    start, i, n = 0, 0, len(s)
    while i < n:
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == ",":
            terms.append(s[start:i])
            start = i + 1
        i += 1
    terms.append(s[start:])
    return terms


def _split_term(term: str) -> tuple[str, str, str] | None:
    i, n = 0, len(term)
    while i < n:
        c = term[i]
        if c == "\\":
            i += 2
            continue
        for op in ("!=", "==", "="):
            if term.startswith(op, i):
                return term[:i], op, term[i + len(op):]
        i += 1
    return None


def _unescape(v: str) -> str:
    if "\\" not in v:
        return v
    out: list[str] = []
    i, n = 0, len(v)
    while i < n:
        c = v[i]
        if c == "\\":
            if i + 1 >= n:
                raise errors.bad_request(f"invalid field selector: invalid escape sequence: {v}")
            nxt = v[i + 1]
            if nxt not in "\\,=":
                raise errors.bad_request(f"invalid field selector: invalid escape sequence: \\{nxt}")
            out.append(nxt)
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def parse_field_selector(
    s: str, plural: str, fields: Mapping[str, Callable[[Mapping[str, Any]], str]] | None = None, *,
    check_fields: bool = True,
) -> FieldSelector:
    """Parse ``spec.nodeName=n,status.phase!=Failed`` for resource ``plural``
    (or over ``fields``, field name → getter, when given).

    Unknown fields raise 400 ``field label not supported: <field>``; with ``check_fields`` false
    any field is taken (read by its dotted path), as upstream's generic ``fields.ParseSelector``.
    """
    if not s:
        return FieldSelector()
    if fields is None:
        fields = selectable_fields(plural) if check_fields else {}
    reqs: list[FieldRequirement] = []
    for term in _split_terms(s):
        if not term:
            continue
        parts = _split_term(term)
        if parts is None:
            raise errors.bad_request(f"invalid selector: '{s}'; can't understand '{term}'")
        lhs, op, rhs = parts
        getter = fields.get(lhs)
        if getter is None:
            if check_fields:
                raise errors.bad_request(f"field label not supported: {lhs}")
            getter = _path_getter(*lhs.split("."))
        reqs.append(FieldRequirement(lhs, op, _unescape(rhs), getter))
    return FieldSelector(tuple(reqs))
