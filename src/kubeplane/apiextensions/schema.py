"""Structural schemas of CustomResourceDefinitions: pruning, defaulting, validation.

A CRD version's ``openAPIV3Schema`` is first checked with
:func:`kubeplane.apiextensions.structural.check_crd_schema` (the checks the
API server makes when a CRD is created or updated). A schema that passed is
compiled once into a :class:`ResourceSchema`, which the caller caches per CRD
version and applies to every custom resource, as upstream does:

* ``prune(obj) -> list[str]`` removes, in place, every field the schema does
  not specify (``x-kubernetes-preserve-unknown-fields`` keeps a subtree,
  ``x-kubernetes-embedded-resource`` keeps ``apiVersion``, ``kind`` and
  ``metadata``; the root's ``apiVersion``/``kind``/``metadata`` are kept and
  unknown fields of ObjectMeta are removed). It returns the removed paths,
  sorted (``spec.foo``, ``spec.items[0].bar``), for the unknown-field
  warnings and ``fieldValidation=Strict`` errors
  (:func:`unknown_field_messages` gives upstream's wording).
* ``default(obj)`` applies ``default`` values in place (on create, update
  and when reading from storage), then drops ``null`` values of non-nullable
  fields that have no default, as upstream's defaulter does.
* ``validate(obj, old=None) -> list[Cause]`` checks the OpenAPI value
  validations (type, format, enum, pattern, lengths, bounds, multipleOf,
  required, nullable, allOf/anyOf/oneOf/not, list-type set/map uniqueness)
  with the messages of upstream's 422, then the ``x-kubernetes-validations``
  CEL rules (``old`` is the stored object on update: transition rules using
  ``oldSelf`` run only when an old value exists, unless
  ``optionalOldSelf``).

The expected call order on a write is ``prune``, ``default``, ``validate``;
on a read from storage ``default`` (upstream also prunes there).
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from kubeplane.api.errors import Cause, duplicate, go_repr, invalid_value, not_supported, required, too_long, too_many

from .formats import FORMAT_CHECKS
from . import regex

__all__ = [
    "ResourceSchema",
    "unknown_field_messages",
    "go_number",
    "json_type",
    "OBJECT_META_FIELDS",
]

# JSON field names of metav1.ObjectMeta (unknown ones are dropped at resource roots).
OBJECT_META_FIELDS = frozenset({
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
    "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations",
    "ownerReferences", "finalizers", "managedFields",
})
_META_KEYS = ("apiVersion", "kind", "metadata")
_MISSING = object()
NIL_PATH = "<nil>"


def unknown_field_messages(paths: Iterable[str]) -> list[str]:
    """Upstream's strict-decoding wording for pruned fields: ``unknown field "spec.foo"``."""
    return [f'unknown field "{p}"' for p in paths]


def json_type(value: Any) -> str:
    """The JSON schema type name of a decoded JSON value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def go_number(x: Any) -> str:
    """A float64 as Go's ``%v`` prints it (``10``, ``1.5``, ``1e+21``)."""
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, int):
        return str(x)
    if not isinstance(x, float):
        return str(x)
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    if math.isnan(x):
        return "NaN"
    if x == 0:
        return "0"
    r = repr(x)
    mant, _, exp = r.partition("e")
    e = int(exp) if exp else None
    digits = mant.replace("-", "").replace(".", "").lstrip("0").rstrip("0") or "0"
    # decimal exponent of the leading digit
    lead = math.floor(math.log10(abs(x))) if e is None else e + (len(mant.lstrip("-").split(".")[0]) - 1)
    if lead < -4 or lead >= 21:
        d = digits
        m = d[0] + ("." + d[1:] if len(d) > 1 else "")
        sign = "-" if x < 0 else ""
        return f"{sign}{m}e{'+' if lead >= 0 else '-'}{abs(lead):02d}"
    if x.is_integer():
        return str(int(x))
    s = format(x, "f") if e is not None else r
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return s


def _is_integral(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) or (isinstance(v, float) and v.is_integer())


def _child(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


class _Node:
    """One compiled schema: structural parts and value validations."""

    __slots__ = (
        "raw", "type", "format", "nullable", "default", "properties", "items", "additional",
        "additional_bool", "preserve", "embedded", "int_or_string", "list_type", "list_keys", "map_type",
        "enum", "pattern", "pattern_src", "min_length", "max_length", "min_items", "max_items",
        "min_props", "max_props", "minimum", "maximum", "excl_min", "excl_max", "multiple_of",
        "required", "unique", "all_of", "any_of", "one_of", "not_", "rules", "has_value_checks",
        "has_rules_below", "defaults_below", "structural", "cel_type",
    )

    def __init__(self, raw: dict[str, Any], structural: bool = True) -> None:
        if not isinstance(raw, dict):
            raw = {}
        self.raw = raw
        self.structural = structural
        t = raw.get("type")
        self.type = t if isinstance(t, str) else ""
        f = raw.get("format")
        self.format = f if isinstance(f, str) else ""
        self.nullable = raw.get("nullable") is True
        self.default = raw["default"] if "default" in raw else _MISSING
        props = raw.get("properties")
        self.properties: dict[str, _Node] = (
            {k: _Node(v, structural) for k, v in props.items() if isinstance(k, str)} if isinstance(props, dict) else {}
        )
        items = raw.get("items")
        self.items = _Node(items, structural) if isinstance(items, dict) else None
        ap = raw.get("additionalProperties")
        self.additional = _Node(ap, structural) if isinstance(ap, dict) else None
        self.additional_bool = ap if isinstance(ap, bool) else None
        self.preserve = raw.get("x-kubernetes-preserve-unknown-fields") is True
        self.embedded = raw.get("x-kubernetes-embedded-resource") is True
        self.int_or_string = raw.get("x-kubernetes-int-or-string") is True
        lt = raw.get("x-kubernetes-list-type")
        self.list_type = lt if isinstance(lt, str) else ""
        lk = raw.get("x-kubernetes-list-map-keys")
        self.list_keys = [k for k in lk if isinstance(k, str)] if isinstance(lk, list) else []
        mt = raw.get("x-kubernetes-map-type")
        self.map_type = mt if isinstance(mt, str) else ""
        enum = raw.get("enum")
        self.enum = enum if isinstance(enum, list) else None
        self.pattern_src = raw.get("pattern") if isinstance(raw.get("pattern"), str) else ""
        self.pattern = regex.compile_or_none(self.pattern_src) if self.pattern_src else None
        self.min_length = _int_or_none(raw.get("minLength"))
        self.max_length = _int_or_none(raw.get("maxLength"))
        self.min_items = _int_or_none(raw.get("minItems"))
        self.max_items = _int_or_none(raw.get("maxItems"))
        self.min_props = _int_or_none(raw.get("minProperties"))
        self.max_props = _int_or_none(raw.get("maxProperties"))
        self.minimum = _num_or_none(raw.get("minimum"))
        self.maximum = _num_or_none(raw.get("maximum"))
        self.excl_min = raw.get("exclusiveMinimum") is True
        self.excl_max = raw.get("exclusiveMaximum") is True
        self.multiple_of = _num_or_none(raw.get("multipleOf"))
        req = raw.get("required")
        self.required = [r for r in req if isinstance(r, str)] if isinstance(req, list) else []
        self.unique = raw.get("uniqueItems") is True
        self.all_of = [_Node(s, False) for s in _dicts(raw.get("allOf"))]
        self.any_of = [_Node(s, False) for s in _dicts(raw.get("anyOf"))]
        self.one_of = [_Node(s, False) for s in _dicts(raw.get("oneOf"))]
        n = raw.get("not")
        self.not_ = _Node(n, False) if isinstance(n, dict) else None
        rules = raw.get("x-kubernetes-validations")
        self.rules = [r for r in rules if isinstance(r, dict)] if isinstance(rules, list) and structural else []
        self.cel_type: Any = None
        self.has_value_checks = bool(
            self.format or self.enum is not None or self.pattern_src or self.min_length is not None
            or self.max_length is not None or self.min_items is not None or self.max_items is not None
            or self.min_props is not None or self.max_props is not None or self.minimum is not None
            or self.maximum is not None or self.multiple_of is not None or self.required or self.unique
            or self.all_of or self.any_of or self.one_of or self.not_ is not None
            or self.list_type in ("set", "map")
        )
        children = list(self.properties.values()) + [c for c in (self.items, self.additional) if c is not None]
        self.has_rules_below = bool(self.rules) or any(c.has_rules_below for c in children)
        self.defaults_below = any(c.default is not _MISSING or c.defaults_below for c in children)


def _dicts(v: Any) -> list[dict[str, Any]]:
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def _int_or_none(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None


def _num_or_none(v: Any) -> float | int | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return v


# ------------------------------------------------------------------ pruning


def _prune(x: Any, s: _Node | None, path: str, root: bool, out: list[str]) -> None:
    if s is not None and s.preserve:
        _skip_prune(x, s, path, out)
        return
    if isinstance(x, dict):
        if s is None:
            for k in list(x):
                out.append(_child(path, k))
            x.clear()
            return
        for k in list(x):
            v = x[k]
            kp = _child(path, k)
            prop = s.properties.get(k)
            if prop is not None:
                _prune_impl(v, prop, kp, out)
            elif s.additional is not None:
                _prune_impl(v, s.additional, kp, out)
            elif s.additional_bool is True:
                continue
            elif root and k in _META_KEYS:
                if k == "metadata":
                    _prune_meta(v, kp, out)
            else:
                out.append(kp)
                del x[k]
    elif isinstance(x, list):
        items = s.items if s is not None else None
        for i, v in enumerate(x):
            _prune_impl(v, items, f"{path}[{i}]", out)


def _prune_impl(x: Any, s: _Node | None, path: str, out: list[str]) -> None:
    if s is not None and s.embedded:
        _prune(x, s, path, True, out)
    else:
        _prune(x, s, path, False, out)


def _skip_prune(x: Any, s: _Node, path: str, out: list[str]) -> None:
    """Under preserve-unknown-fields: keep unknown keys but prune below specified ones."""
    if isinstance(x, dict):
        for k, v in x.items():
            kp = _child(path, k)
            prop = s.properties.get(k)
            if prop is not None:
                _prune_impl(v, prop, kp, out)
            elif s.additional is not None:
                _prune_impl(v, s.additional, kp, out)
            elif s.embedded and k == "metadata":
                _prune_meta(v, kp, out)
    elif isinstance(x, list) and s.items is not None:
        for i, v in enumerate(x):
            _prune_impl(v, s.items, f"{path}[{i}]", out)


def _prune_meta(meta: Any, path: str, out: list[str]) -> None:
    if isinstance(meta, dict):
        for k in list(meta):
            if k not in OBJECT_META_FIELDS:
                out.append(_child(path, k))
                del meta[k]


# ---------------------------------------------------------------- defaulting


def _copy(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _copy(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_copy(x) for x in v]
    return v


def _non_nullable_null(v: Any, s: _Node | None) -> bool:
    return v is None and s is not None and not s.nullable


def _default(x: Any, s: _Node) -> None:
    if isinstance(x, dict):
        if s.defaults_below:
            for k, prop in s.properties.items():
                if prop.default is _MISSING:
                    continue
                if k not in x or _non_nullable_null(x[k], prop):
                    x[k] = _copy(prop.default)
        ap = s.additional
        for k, v in x.items():
            prop = s.properties.get(k)
            if prop is not None:
                if prop.defaults_below:
                    _default(v, prop)
            elif ap is not None:
                if ap.default is not _MISSING and _non_nullable_null(v, ap):
                    v = x[k] = _copy(ap.default)
                if ap.defaults_below:
                    _default(v, ap)
    elif isinstance(x, list):
        it = s.items
        if it is None:
            return
        for i, v in enumerate(x):
            if it.default is not _MISSING and _non_nullable_null(v, it):
                x[i] = _copy(it.default)
            elif it.defaults_below:
                _default(v, it)


def _prune_nulls(x: Any, s: _Node) -> None:
    """Drop ``null`` values of non-nullable properties without default."""
    if isinstance(x, dict):
        if s.properties:
            for k in [k for k, v in x.items() if v is None]:
                prop = s.properties.get(k)
                if prop is not None and prop.default is _MISSING and not prop.nullable:
                    del x[k]
        ap = s.additional
        for k, v in x.items():
            if isinstance(v, (dict, list)):
                prop = s.properties.get(k)
                if prop is not None:
                    _prune_nulls(v, prop)
                elif ap is not None:
                    _prune_nulls(v, ap)
    elif isinstance(x, list) and s.items is not None:
        for v in x:
            if isinstance(v, (dict, list)):
                _prune_nulls(v, s.items)


# ---------------------------------------------------------------- validation


class _Errors:
    """Collected field errors, with the count of passed checks (for oneOf/anyOf)."""

    __slots__ = ("causes", "matched")

    def __init__(self) -> None:
        self.causes: list[Cause] = []
        self.matched = 0


def _field(path: str) -> str:
    return path if path else NIL_PATH


def _type_error(path: str, want: str, got: str) -> Cause:
    return Cause(
        "FieldValueTypeInvalid",
        f"Invalid value: {go_repr(got)}: {path} in body must be of type {want}: {go_repr(got)}",
        _field(path),
    )


def _invalid(path: str, value: Any, detail: str) -> Cause:
    c = invalid_value(_field(path), value, detail)
    return c


def _composite(message: str) -> Cause:
    return Cause("FieldValueInvalid", f'Invalid value: "": {message}', NIL_PATH)


def _check_type(s: _Node, v: Any, path: str, errs: _Errors) -> bool:
    """The type validator; False when the value has the wrong type."""
    if v is None:
        if s.type and s.type != "null" and not s.nullable:
            errs.causes.append(_type_error(path, s.type, "null"))
            return False
        return True
    if not s.type:
        return True
    got = json_type(v)
    t = s.type
    if got == t:
        return True
    if t == "integer" and got == "number" and v.is_integer():
        return True
    if t == "number" and got == "integer":
        return True
    if s.format and got in ("string", "array") and t not in ("number", "integer"):
        return True
    errs.causes.append(_type_error(path, t, got))
    return False


def _validate(s: _Node, v: Any, path: str, errs: _Errors) -> None:
    if s.structural:
        if not _check_type(s, v, path, errs):
            return
        errs.matched += 1
        if s.int_or_string and v is not None and not s.any_of and not (
            isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool))
        ):
            errs.causes.append(_composite(f'"{path}" must validate at least one schema (anyOf)'))
            errs.causes.append(_type_error(path, "integer", json_type(v)))
            return
    if v is None:
        return
    if s.has_value_checks:
        _value_checks(s, v, path, errs)
    if isinstance(v, dict):
        props = s.properties
        if props or s.additional is not None:
            ap = s.additional
            for k, x in v.items():
                prop = props.get(k)
                if prop is not None:
                    _validate(prop, x, _child(path, k), errs)
                elif ap is not None:
                    _validate(ap, x, f"{path}.{k}", errs)
    elif isinstance(v, list):
        it = s.items
        if it is not None:
            for i, x in enumerate(v):
                _validate(it, x, f"{path}[{i}]", errs)


def _value_checks(s: _Node, v: Any, path: str, errs: _Errors) -> None:
    c = errs.causes
    if s.all_of or s.any_of or s.one_of or s.not_ is not None:
        _junctors(s, v, path, errs)
    if isinstance(v, str):
        if s.max_length is not None or s.min_length is not None:
            n = len(v)
            if s.max_length is not None and n > s.max_length:
                c.append(too_long(_field(path), v, s.max_length))
            if s.min_length is not None and n < s.min_length:
                c.append(_invalid(path, v, f"{path} in body should be at least {s.min_length} chars long"))
        if s.pattern_src:
            if s.pattern is not None and not s.pattern.search(v):
                c.append(_invalid(path, v, f"{path} in body should match '{s.pattern_src}'"))
        if s.format:
            check = FORMAT_CHECKS.get(s.format)
            if check is not None and not check(v):
                c.append(Cause(
                    "FieldValueTypeInvalid",
                    f"Invalid value: {go_repr(v)}: {path} in body must be of type {s.format}: {go_repr(v)}",
                    _field(path),
                ))
    elif isinstance(v, (int, float)) and not isinstance(v, bool):
        if s.maximum is not None:
            if s.excl_max and v >= s.maximum:
                c.append(_invalid(path, v, f"{path} in body should be less than {go_number(s.maximum)}"))
            elif not s.excl_max and v > s.maximum:
                c.append(_invalid(path, v, f"{path} in body should be less than or equal to {go_number(s.maximum)}"))
        if s.minimum is not None:
            if s.excl_min and v <= s.minimum:
                c.append(_invalid(path, v, f"{path} in body should be greater than {go_number(s.minimum)}"))
            elif not s.excl_min and v < s.minimum:
                c.append(_invalid(path, v, f"{path} in body should be greater than or equal to {go_number(s.minimum)}"))
        if s.multiple_of is not None and s.multiple_of > 0 and not _multiple(v, s.multiple_of):
            c.append(_invalid(path, v, f"{path} in body should be a multiple of {go_number(s.multiple_of)}"))
    elif isinstance(v, list):
        n = len(v)
        if s.min_items is not None and n < s.min_items:
            c.append(_invalid(path, n, f"{path} in body should have at least {s.min_items} items"))
        if s.max_items is not None and n > s.max_items:
            c.append(too_many(_field(path), n, s.max_items))
        if s.unique and not _all_unique(v):
            c.append(_invalid(path, "", f"{path} in body shouldn't contain duplicates"))
        if s.list_type == "set":
            c.extend(_set_duplicates(v, path))
        elif s.list_type == "map" and s.list_keys:
            c.extend(_map_duplicates(v, s.list_keys, path))
    elif isinstance(v, dict):
        n = len(v)
        if s.min_props is not None and n < s.min_props:
            c.append(_invalid(path, n, f"{path} in body should have at least {s.min_props} properties"))
        if s.max_props is not None and n > s.max_props:
            c.append(too_many(_field(path), n, s.max_props))
        for k in s.required:
            if k not in v:
                c.append(required(_child(path, k)))
    if s.enum is not None:
        if not any(_enum_equal(v, e) for e in s.enum):
            allowed = [e if isinstance(e, str) else _json(e) for e in s.enum]
            c.append(not_supported(_field(path), v, allowed))


def _json(v: Any) -> str:
    import json

    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return json.dumps(v, separators=(",", ":"))


def _enum_equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if type(a) is not type(b):
        return False
    return a == b


def _multiple(v: float | int, factor: float | int) -> bool:
    if isinstance(v, int) and isinstance(factor, int):
        return v % factor == 0
    if isinstance(v, int) and isinstance(factor, float) and factor.is_integer():
        return v % int(factor) == 0
    mult = (1 / factor * v) if factor < 1 else (v / factor)
    return math.isfinite(mult) and mult == math.floor(mult)


def _hashable(v: Any) -> Any:
    if isinstance(v, dict):
        return ("o", tuple(sorted((k, _hashable(x)) for k, x in v.items())))
    if isinstance(v, list):
        return ("a", tuple(_hashable(x) for x in v))
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, (int, float)):
        return ("n", v)
    return ("s", v)


def _all_unique(v: list[Any]) -> bool:
    seen = set()
    for x in v:
        h = _hashable(x)
        if h in seen:
            return False
        seen.add(h)
    return True


def _set_duplicates(v: list[Any], path: str) -> list[Cause]:
    seen: set[Any] = set()
    out: list[Cause] = []
    for i, x in enumerate(v):
        h = _hashable(x)
        if h in seen:
            out.append(duplicate(f"{path}[{i}]", x))
        seen.add(h)
    return out


def _map_duplicates(v: list[Any], keys: list[str], path: str) -> list[Cause]:
    seen: set[Any] = set()
    out: list[Cause] = []
    for i, x in enumerate(v):
        if not isinstance(x, dict):
            continue
        kv = tuple(_hashable(x.get(k)) for k in keys)
        if kv in seen:
            shown = {k: x[k] for k in keys if k in x}
            out.append(Cause("FieldValueDuplicate", f"Duplicate value: {_go_map(shown)}", f"{path}[{i}]"))
        seen.add(kv)
    return out


def _go_map(m: dict[str, Any]) -> str:
    """A map[string]interface{} as Go's ``%#v`` prints it."""
    parts = []
    for k in sorted(m):
        x = m[k]
        if isinstance(x, str):
            parts.append(f'"{k}":"{x}"')
        elif isinstance(x, bool):
            parts.append(f'"{k}":{"true" if x else "false"}')
        elif isinstance(x, int):
            parts.append(f'"{k}":{x}')
        else:
            parts.append(f'"{k}":{go_repr(x)}')
    return "map[string]interface {}{" + ", ".join(parts) + "}"


def _run(s: _Node, v: Any, path: str) -> _Errors:
    e = _Errors()
    _validate(s, v, path, e)
    return e


def _junctors(s: _Node, v: Any, path: str, errs: _Errors) -> None:
    c = errs.causes
    if s.any_of and not (s.int_or_string and _is_int_or_str(v) and _int_or_string_pattern(s.any_of)):
        best: _Errors | None = None
        ok = False
        for sub in s.any_of:
            r = _run(sub, v, path)
            if not r.causes:
                ok = True
                break
            if best is None or r.matched > best.matched:
                best = r
        if not ok:
            c.append(_composite(f'"{path}" must validate at least one schema (anyOf)'))
            if best is not None:
                c.extend(best.causes)
    if s.one_of:
        valid = 0
        best = None
        for sub in s.one_of:
            r = _run(sub, v, path)
            if not r.causes:
                valid += 1
                continue
            if valid == 0 and (best is None or r.matched > best.matched):
                best = r
        if valid != 1:
            extra = "Found none valid" if valid == 0 else f"Found {valid} valid alternatives"
            c.append(_composite(f'"{path}" must validate one and only one schema (oneOf). {extra}'))
            if valid == 0 and best is not None:
                c.extend(best.causes)
    if s.all_of:
        valid = 0
        for sub in s.all_of:
            r = _run(sub, v, path)
            if not r.causes:
                valid += 1
            c.extend(r.causes)
        if valid != len(s.all_of):
            extra = ". None validated" if valid == 0 else ""
            c.append(_composite(f'"{path}" must validate all the schemas (allOf){extra}'))
    if s.not_ is not None:
        if not _run(s.not_, v, path).causes:
            c.append(_composite(f'"{path}" must not validate the schema (not)'))


def _is_int_or_str(v: Any) -> bool:
    return isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool))


def _int_or_string_pattern(any_of: list[_Node]) -> bool:
    return len(any_of) == 2 and {n.raw.get("type") for n in any_of} == {"integer", "string"}


# ------------------------------------------------------------------ public


class ResourceSchema:
    """A CRD version's structural schema compiled for pruning, defaulting and validation.

    Build once per CRD version (compiling the CEL rules costs milliseconds)
    and reuse for every object.
    """

    def __init__(self, openapi_v3_schema: dict[str, Any]) -> None:
        self.raw = openapi_v3_schema if isinstance(openapi_v3_schema, dict) else {}
        self.root = _Node(self.raw)
        self._cel = None
        if self.root.has_rules_below:
            from .celrules import RuleSet

            self._cel = RuleSet(self.root)

    # pruning
    def prune(self, obj: dict[str, Any]) -> list[str]:
        """Remove unknown fields in place; return their paths, sorted."""
        out: list[str] = []
        if isinstance(obj, dict):
            _prune(obj, self.root, "", True, out)
        out.sort()
        return out

    # defaulting
    def default(self, obj: dict[str, Any]) -> None:
        """Apply defaults in place, then drop non-nullable nulls without default."""
        if isinstance(obj, dict):
            _default(obj, self.root)
            _prune_nulls(obj, self.root)

    # validation
    def validate(self, obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[Cause]:
        """The field errors of ``obj`` (``old``: the stored object on update)."""
        errs = _Errors()
        root = self.root
        if isinstance(obj, dict):
            # the root's apiVersion/kind/metadata are not validated by the schema
            _validate_root(root, obj, errs)
        else:
            _validate(root, obj, "", errs)
        causes = errs.causes
        if self._cel is not None:
            causes.extend(self._cel.validate(obj, old))
        return causes

    @property
    def has_rules(self) -> bool:
        return self._cel is not None


def _validate_root(root: _Node, obj: dict[str, Any], errs: _Errors) -> None:
    view = {k: v for k, v in obj.items() if k not in _META_KEYS or k in root.properties and k != "metadata"}
    if "metadata" in obj and "metadata" in root.properties:
        # only name/generateName restrictions are allowed at the root metadata
        meta = obj["metadata"]
        if isinstance(meta, dict):
            sub = {k: meta[k] for k in ("name", "generateName") if k in meta}
            view["metadata"] = sub
    _validate(root, view, "", errs)
