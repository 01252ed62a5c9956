"""Structural schemas of CustomResourceDefinitions: pruning, defaulting, validation.

A CRD version's ``openAPIV3Schema`` is first checked with
:func:`kubeplane.apiextensions.structural.check_crd_schema` (the checks the
API server makes when a CRD is created or updated; it returns
``list[Cause]`` with upstream's messages and field paths under the prefix
given, e.g. ``spec.versions[0].schema.openAPIV3Schema``). A schema that
passed is compiled once into a :class:`ResourceSchema`, which the caller
caches per CRD version and applies to every custom resource, as upstream:

* ``prune(obj) -> list[str]`` removes, in place, every field the schema does
  not specify (``x-kubernetes-preserve-unknown-fields`` keeps a subtree;
  ``apiVersion``, ``kind`` and ``metadata`` of the root and of
  ``x-kubernetes-embedded-resource`` objects are kept, with unknown ObjectMeta
  fields removed). It returns the removed paths, sorted (``spec.foo``,
  ``spec.items[0].bar``, ``metadata.junk``), for the unknown-field warnings
  and ``fieldValidation=Strict`` errors (:func:`unknown_field_messages` gives
  upstream's wording, ``unknown field "spec.foo"``).
* ``default(obj) -> bool`` applies ``default`` values in place (on create,
  update and when reading from storage), then drops ``null`` values of
  non-nullable fields without default, as upstream's defaulter does; True
  when ``obj`` changed. ``has_defaults`` tells whether reads need it at all.
* ``validate(obj, old=None, warnings=None) -> list[Cause]``: the OpenAPI
  value validations (type, format, enum, pattern, lengths, bounds,
  multipleOf, required, nullable, allOf/anyOf/oneOf/not, list-type set/map
  uniqueness), TypeMeta/ObjectMeta of embedded resources, then the
  ``x-kubernetes-validations`` CEL rules, with the messages of upstream's
  422. ``old`` is the stored object on update: transition rules (using
  ``oldSelf``) run only then (unless ``optionalOldSelf``), and values equal
  to their correlated old value are not checked again (upstream's validation
  ratcheting; ratcheted CEL failures are appended to ``warnings`` when a list
  is given). The root's ``apiVersion``, ``kind`` and ``metadata`` (except
  ``name``/``generateName`` restrictions) are left to ObjectMeta validation.

Call order on a write: ``prune``, ``default``, ``validate``; on a read from
storage: ``default``. Nothing here raises on malformed input.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

from kubeplane.api.errors import Cause, duplicate, go_repr, invalid_value, not_supported, required, too_long, too_many

from .formats import FORMAT_CHECKS, supported_format
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
# errors after which the CEL rules are not evaluated (upstream's hasBlockingErr)
_BLOCKING = frozenset({"FieldValueNotSupported", "FieldValueRequired", "FieldValueTooLong", "FieldValueTooMany",
                       "FieldValueTypeInvalid"})
RULES_NOT_CHECKED = ("some validation rules were not checked because the object was invalid; "
                     "correct the existing errors to complete validation")


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
        "has_rules_below", "defaults_below", "structural", "cel_type", "ok", "fast", "prune_leaf",
        "default_props", "default_children", "cel_env", "checks", "junctors", "embedded_below",
        "cel_names", "cel_numbers", "list_types_below",
    )

    def __init__(self, raw: dict[str, Any], structural: bool = True) -> None:
        if not isinstance(raw, dict):
            raw = {}
        self.raw = raw
        self.structural = structural
        t = raw.get("type")
        self.type = t if isinstance(t, str) else ""
        f = raw.get("format")
        self.format = supported_format(f) if isinstance(f, str) else ""
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

        )
        children = list(self.properties.values()) + [c for c in (self.items, self.additional) if c is not None]
        self.has_rules_below = bool(self.rules) or any(c.has_rules_below for c in children)
        self.defaults_below = any(c.default is not _MISSING or c.defaults_below for c in children)
        self.embedded_below = any(c.embedded or c.embedded_below for c in children)
        self.list_types_below = any(c.list_type in ("set", "map") or c.list_types_below for c in children)
        self.cel_env: Any = None
        self.cel_names: dict[str, str] = {}  # CEL-escaped property name -> property name
        self.cel_numbers: tuple[str, ...] = ()  # properties of type number (doubles in CEL)
        self.junctors = bool(self.all_of or self.any_of or self.one_of or self.not_ is not None)
        self.checks = _build_checks(self)
        # Python types the type validator accepts as they are (None: any type)
        self.ok = _OK_TYPES.get(self.type) if structural and self.type else None
        leaf = not (self.properties or self.items is not None or self.additional is not None)
        # values of these types need no work at all below the parent (no checks, no children)
        if structural and leaf and not self.has_value_checks and not self.int_or_string and not self.rules:
            self.fast = self.ok if self.ok is not None else _ALL_TYPES
        else:
            self.fast = frozenset()
        self.prune_leaf = leaf and not self.preserve and not self.embedded and self.additional_bool is None
        self.default_props = [(k, p) for k, p in self.properties.items() if p.default is not _MISSING]
        self.default_children = [(k, p) for k, p in self.properties.items() if p.defaults_below]


_OK_TYPES = {
    "string": frozenset({str}),
    "integer": frozenset({int}),
    "number": frozenset({int, float}),
    "boolean": frozenset({bool}),
    "array": frozenset({list}),
    "object": frozenset({dict}),
}
_ALL_TYPES = frozenset({str, int, float, bool, list, dict, type(None)})
_PY_TYPE_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object",
                  type(None): "null"}


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
    if s is None:
        _prune_all(x, path, out)
        return
    if isinstance(x, dict):
        props = s.properties
        ap = s.additional
        for k in list(x):
            v = x[k]
            if root and k in _META_KEYS:
                # TypeMeta and ObjectMeta of a resource are not pruned by the schema;
                # unknown ObjectMeta fields are dropped as decoding ObjectMeta does
                if k == "metadata":
                    _prune_meta(v, _child(path, k), out)
                continue
            prop = props.get(k)
            if prop is not None:
                if prop.prune_leaf and type(v) is not dict and type(v) is not list:
                    continue
                _prune_impl(v, prop, f"{path}.{k}" if path else k, out)
            elif ap is not None:
                if ap.prune_leaf and type(v) is not dict and type(v) is not list:
                    continue
                _prune_impl(v, ap, f"{path}.{k}" if path else k, out)
            elif s.additional_bool is True:
                # additionalProperties: true has no schema: what is below a value is pruned
                _prune(v, None, _child(path, k), False, out)
            else:
                out.append(_child(path, k))
                del x[k]
    elif isinstance(x, list):
        items = s.items
        if items is None:
            _prune_all(x, path, out)
            return
        leaf = items.prune_leaf
        for i, v in enumerate(x):
            if leaf and type(v) is not dict and type(v) is not list:
                continue
            _prune_impl(v, items, f"{path}[{i}]", out)


def _prune_all(x: Any, path: str, out: list[str]) -> None:
    """Pruning without a schema: every object key goes (lists are walked without recursion)."""
    stack = [(x, path)]
    while stack:
        v, p = stack.pop()
        if type(v) is dict:
            out.extend(_child(p, k) for k in v)
            v.clear()
        elif type(v) is list:
            stack.extend((item, f"{p}[{i}]") for i, item in enumerate(v) if type(item) in (dict, list))


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
            if s.embedded and k in _META_KEYS:
                if k == "metadata":
                    _prune_meta(v, kp, out)
                continue
            prop = s.properties.get(k)
            if prop is not None:
                _prune_impl(v, prop, kp, out)
            elif s.additional is not None:
                _prune_impl(v, s.additional, kp, out)
    elif isinstance(x, list) and s.items is not None:
        for i, v in enumerate(x):
            _skip_prune(v, s.items, f"{path}[{i}]", out)


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


def _default(x: Any, s: _Node, ch: list[int]) -> None:
    if isinstance(x, dict):
        for k, prop in s.default_props:
            if k not in x or (x[k] is None and not prop.nullable):
                x[k] = _copy(prop.default)
                ch.append(1)
        for k, prop in s.default_children:
            v = x.get(k)
            if v is not None:
                _default(v, prop, ch)
        ap = s.additional
        if ap is not None and (ap.default is not _MISSING or ap.defaults_below):
            for k, v in x.items():
                if ap.default is not _MISSING and _non_nullable_null(v, ap):
                    v = x[k] = _copy(ap.default)
                    ch.append(1)
                if ap.defaults_below:
                    _default(v, ap, ch)
    elif isinstance(x, list):
        it = s.items
        if it is None or not (it.default is not _MISSING or it.defaults_below):
            return
        for i, v in enumerate(x):
            if it.default is not _MISSING and _non_nullable_null(v, it):
                x[i] = _copy(it.default)
                ch.append(1)
            elif it.defaults_below:
                _default(v, it, ch)


def _prune_nulls(x: Any, s: _Node, ch: list[int]) -> None:
    """Drop ``null`` values of non-nullable properties without default."""
    if type(x) is dict:
        props = s.properties
        if props:
            nulls = [k for k, v in x.items() if v is None] if None in x.values() else ()
            for k in nulls:
                prop = props.get(k)
                if prop is not None and prop.default is _MISSING and not prop.nullable:
                    del x[k]
                    ch.append(1)
            ap = s.additional
            for k, v in x.items():
                tv = type(v)
                if tv is dict or tv is list:
                    prop = props.get(k)
                    if prop is not None:
                        if not prop.prune_leaf:
                            _prune_nulls(v, prop, ch)
                    elif ap is not None:
                        _prune_nulls(v, ap, ch)
        elif s.additional is not None and not s.additional.prune_leaf:
            ap = s.additional
            for v in x.values():
                tv = type(v)
                if tv is dict or tv is list:
                    _prune_nulls(v, ap, ch)
    elif type(x) is list and s.items is not None and not s.items.prune_leaf:
        it = s.items
        for v in x:
            tv = type(v)
            if tv is dict or tv is list:
                _prune_nulls(v, it, ch)


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
    ok = s.ok
    t = type(v)
    if ok is None or t in ok:
        return True
    if v is None:
        if s.nullable:
            return True
        errs.causes.append(_type_error(path, s.type, "null"))
        return False
    if t is float and s.type == "integer" and v.is_integer():
        return True
    if s.format and (t is str or t is list) and s.type not in ("number", "integer"):
        return True
    errs.causes.append(_type_error(path, s.type, _PY_TYPE_NAMES.get(t) or json_type(v)))
    return False


def _node_checks(s: _Node, v: Any, path: str, errs: _Errors) -> bool:
    """The checks of one schema on one value; False when its children need no walk."""
    if s.structural:
        if not _check_type(s, v, path, errs):
            return False
        errs.matched += 1
        if s.int_or_string and not _is_int_or_str(v):
            # upstream validates x-kubernetes-int-or-string as type [integer, string]
            if v is None and s.nullable:
                return False
            if not (type(v) is float and v.is_integer()):
                errs.causes.append(_type_error(path, "integer,string", json_type(v)))
                return False
    if v is None:
        return False
    if s.has_value_checks:
        _value_checks(s, v, path, errs)
    return True


def _unchanged(v: Any, old: Any) -> bool:
    return type(v) is type(old) and v == old


def _validate_ratcheting(s: _Node, v: Any, old: Any, path: str, errs: _Errors) -> None:
    """Validation of an update: values equal to their correlated old value are
    not checked again (upstream's CRD validation ratcheting), so objects stored
    before a schema tightened can still be updated elsewhere."""
    if _unchanged(v, old):
        return
    if not _node_checks(s, v, path, errs):
        return
    t = type(v)
    if t is dict:
        props = s.properties
        ap = s.additional
        old_map = old if type(old) is dict else None
        if not props and ap is None:
            return
        for k, x in v.items():
            prop = props.get(k) if props else None
            if prop is None:
                prop = ap
                if prop is None:
                    continue
                kp = f"{path}.{k}"
            else:
                kp = f"{path}.{k}" if path else k
            if type(x) in prop.fast:
                continue
            if old_map is not None and k in old_map:
                _validate_ratcheting(prop, x, old_map[k], kp, errs)
            else:
                _validate(prop, x, kp, errs)
    elif t is list:
        it = s.items
        if it is None:
            return
        olds = _correlate_items(s, v, old)
        fast = it.fast
        for i, x in enumerate(v):
            if type(x) in fast:
                continue
            o = olds[i] if olds is not None else _MISSING
            if o is _MISSING:
                _validate(it, x, f"{path}[{i}]", errs)
            else:
                _validate_ratcheting(it, x, o, f"{path}[{i}]", errs)


def _correlate_items(s: _Node, v: list[Any], old: Any) -> list[Any] | None:
    """The old item of each new item: by map keys (list-type map) or by value (set)."""
    if type(old) is not list or not old:
        return None
    if s.list_type == "map" and s.list_keys:
        keys = s.list_keys
        index = {}
        for x in old:
            if type(x) is dict:
                index.setdefault(tuple(_hashable(x.get(k)) for k in keys), x)
        return [index.get(tuple(_hashable(x.get(k)) for k in keys), _MISSING) if type(x) is dict else _MISSING
                for x in v]
    if s.list_type == "set":
        seen = {_hashable(x) for x in old}
        return [x if _hashable(x) in seen else _MISSING for x in v]
    return None


def _validate(s: _Node, v: Any, path: str, errs: _Errors) -> None:
    if not _node_checks(s, v, path, errs):
        return
    t = type(v)
    if t is dict:
        props = s.properties
        ap = s.additional
        if props:
            for k, x in v.items():
                prop = props.get(k)
                if prop is not None:
                    if type(x) in prop.fast:
                        errs.matched += 1
                        continue
                    _validate(prop, x, f"{path}.{k}" if path else k, errs)
                elif ap is not None:
                    _validate(ap, x, f"{path}.{k}", errs)
        elif ap is not None:
            fast = ap.fast
            for k, x in v.items():
                if type(x) in fast:
                    continue
                _validate(ap, x, f"{path}.{k}", errs)
    elif t is list:
        it = s.items
        if it is not None:
            fast = it.fast
            for i, x in enumerate(v):
                if type(x) in fast:
                    continue
                _validate(it, x, f"{path}[{i}]", errs)


def _value_checks(s: _Node, v: Any, path: str, errs: _Errors) -> None:
    if s.junctors:
        _junctors(s, v, path, errs)
    c = errs.causes
    for check in s.checks:
        check(v, path, c)


def _build_checks(s: _Node) -> tuple[Callable[[Any, str, list[Cause]], None], ...]:
    """The value validations of a schema, each a small function guarding its own JSON type."""
    out: list[Callable[[Any, str, list[Cause]], None]] = []
    if s.max_length is not None:
        mx = s.max_length

        def max_length(v: Any, path: str, c: list[Cause]) -> None:
            if type(v) is str and len(v) > mx:
                c.append(too_long(_field(path), v, mx))
        out.append(max_length)
    if s.min_length is not None:
        mn = s.min_length

        def min_length(v: Any, path: str, c: list[Cause]) -> None:
            if type(v) is str and len(v) < mn:
                c.append(_invalid(path, v, f"{path} in body should be at least {mn} chars long"))
        out.append(min_length)
    if s.pattern is not None:
        search, src = s.pattern.search, s.pattern_src

        def pattern(v: Any, path: str, c: list[Cause]) -> None:
            if type(v) is str and not search(v):
                c.append(_invalid(path, v, f"{path} in body should match '{src}'"))
        out.append(pattern)
    fmt_check = (FORMAT_CHECKS.get(s.format) or FORMAT_CHECKS.get(s.format.replace("-", ""))) if s.format else None
    if fmt_check is not None:
        fmt = s.format

        def format_(v: Any, path: str, c: list[Cause]) -> None:
            if type(v) is str and not fmt_check(v):
                c.append(Cause("FieldValueTypeInvalid",
                               f"Invalid value: {go_repr(v)}: {path} in body must be of type {fmt}: {go_repr(v)}",
                               _field(path)))
        out.append(format_)
    if s.maximum is not None:
        hi, excl = s.maximum, s.excl_max
        shown = go_number(hi)

        def maximum(v: Any, path: str, c: list[Cause]) -> None:
            t = type(v)
            if t is int or t is float:
                if excl and v >= hi:
                    c.append(_invalid(path, v, f"{path} in body should be less than {shown}"))
                elif not excl and v > hi:
                    c.append(_invalid(path, v, f"{path} in body should be less than or equal to {shown}"))
        out.append(maximum)
    if s.minimum is not None:
        lo, excl_lo = s.minimum, s.excl_min
        shown_lo = go_number(lo)

        def minimum(v: Any, path: str, c: list[Cause]) -> None:
            t = type(v)
            if t is int or t is float:
                if excl_lo and v <= lo:
                    c.append(_invalid(path, v, f"{path} in body should be greater than {shown_lo}"))
                elif not excl_lo and v < lo:
                    c.append(_invalid(path, v, f"{path} in body should be greater than or equal to {shown_lo}"))
        out.append(minimum)
    if s.multiple_of is not None and s.multiple_of > 0:
        factor = s.multiple_of
        shown_f = go_number(factor)

        def multiple_of(v: Any, path: str, c: list[Cause]) -> None:
            t = type(v)
            if (t is int or t is float) and not _multiple(v, factor):
                c.append(_invalid(path, v, f"{path} in body should be a multiple of {shown_f}"))
        out.append(multiple_of)
    if s.min_items is not None or s.max_items is not None or s.unique:
        min_i, max_i, unique = s.min_items, s.max_items, s.unique

        def items_count(v: Any, path: str, c: list[Cause]) -> None:
            if type(v) is not list:
                return
            n = len(v)
            if min_i is not None and n < min_i:
                c.append(_invalid(path, n, f"{path} in body should have at least {min_i} items"))
            if max_i is not None and n > max_i:
                c.append(too_many(_field(path), n, max_i))
            if unique and not _all_unique(v):
                c.append(_invalid(path, "", f"{path} in body shouldn't contain duplicates"))
        out.append(items_count)
    if s.min_props is not None or s.max_props is not None or s.required:
        min_p, max_p, req = s.min_props, s.max_props, tuple(s.required)

        def object_checks(v: Any, path: str, c: list[Cause]) -> None:
            if type(v) is not dict:
                return
            n = len(v)
            if min_p is not None and n < min_p:
                c.append(_invalid(path, n, f"{path} in body should have at least {min_p} properties"))
            if max_p is not None and n > max_p:
                c.append(too_many(_field(path), n, max_p))
            for k in req:
                if k not in v:
                    c.append(required(f"{path}.{k}" if path else k))
        out.append(object_checks)
    if s.enum is not None:
        enum = s.enum
        allowed = [e if isinstance(e, str) else _json(e) for e in enum]

        def enum_(v: Any, path: str, c: list[Cause]) -> None:
            if not any(_enum_equal(v, e) for e in enum):
                c.append(not_supported(_field(path), v, allowed))
        out.append(enum_)
    return tuple(out)


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
    def default(self, obj: dict[str, Any]) -> bool:
        """Apply defaults in place, then drop non-nullable nulls without default;
        True when ``obj`` changed."""
        ch: list[int] = []
        if isinstance(obj, dict):
            _default(obj, self.root, ch)
            _prune_nulls(obj, self.root, ch)
        return bool(ch)

    # validation
    def validate(self, obj: dict[str, Any], old: dict[str, Any] | None = None,
                 warnings: list[str] | None = None) -> list[Cause]:
        """The field errors of ``obj`` (``old``: the stored object on update).

        On update, values equal to their correlated old value are not checked
        again (validation ratcheting); the failures of CEL rules on such values
        are appended to ``warnings`` when a list is given, as upstream warns."""
        errs = _Errors()
        root = self.root
        try:
            if isinstance(obj, dict):
                # the root's apiVersion/kind/metadata are not validated by the schema
                _validate_root(root, obj, errs, old if isinstance(old, dict) else None)
            else:
                _validate(root, obj, "", errs)
            causes = errs.causes
            if root.embedded_below:
                _validate_embedded(root, obj, "", causes)
            if root.list_types_below or root.list_type in ("set", "map"):
                _validate_list_types(root, obj, old if old is not None else _MISSING, "", causes)
            if self._cel is not None:
                if any(c.reason in _BLOCKING for c in causes):
                    # as upstream: rules are not run on an object of the wrong shape
                    causes.append(Cause("FieldValueInvalid", f"Invalid value: \"null\": {RULES_NOT_CHECKED}", NIL_PATH))
                else:
                    causes.extend(self._cel.validate(obj, old, warnings))
        except RecursionError:
            # only objects nested close to the JSON decoder's limit get here
            return errs.causes + [Cause("FieldValueInvalid", 'Invalid value: "object": object is nested too deeply to be validated', NIL_PATH)]
        return causes

    @property
    def has_rules(self) -> bool:
        """True when the schema has x-kubernetes-validations rules."""
        return self._cel is not None

    @property
    def has_defaults(self) -> bool:
        """True when some field has a default (reads from storage need defaulting)."""
        return self.root.defaults_below


def _root_view(root: _Node, obj: dict[str, Any]) -> dict[str, Any]:
    """The object as the schema validates it: the root's metadata reduced to
    name and generateName (the only parts a schema may restrict)."""
    meta = obj.get("metadata")
    if type(meta) is not dict:
        return obj
    view = dict(obj)
    view["metadata"] = {k: meta[k] for k in ("name", "generateName") if k in meta}
    return view


def _validate_root(root: _Node, obj: dict[str, Any], errs: _Errors, old: dict[str, Any] | None = None) -> None:
    view = _root_view(root, obj)
    if old is None:
        _validate(root, view, "", errs)
    else:
        _validate_ratcheting(root, view, _root_view(root, old), "", errs)


# ------------------------------------------------------- embedded resources


def _fchild(path: str, k: str) -> str:
    return f"{path}.{k}" if path else k


def _validate_embedded(s: _Node, x: Any, path: str, out: list[Cause]) -> None:
    """TypeMeta and ObjectMeta of embedded resources (upstream's objectmeta.Validate)."""
    if type(x) is dict:
        if s.embedded:
            out.extend(_embedded_resource_errors(x, path))
        for k, v in x.items():
            prop = s.properties.get(k)
            if prop is not None:
                if prop.embedded or prop.embedded_below:
                    _validate_embedded(prop, v, _fchild(path, k), out)
            elif s.additional is not None and (s.additional.embedded or s.additional.embedded_below):
                _validate_embedded(s.additional, v, f"{path}[{k}]", out)
    elif type(x) is list and s.items is not None and (s.items.embedded or s.items.embedded_below):
        for i, v in enumerate(x):
            _validate_embedded(s.items, v, f"{path}[{i}]", out)


def _path_segment_name(name: str, prefix: bool = False) -> list[str]:
    if not prefix and name in (".", ".."):
        return [f"may not be '{name}'"]
    errs = []
    for bad in ("/", "%"):
        if bad in name:
            errs.append(f"may not contain '{bad}'")
    return errs


def _embedded_resource_errors(x: dict[str, Any], path: str) -> list[Cause]:
    from kubeplane.api.strings import is_dns1035_label
    from kubeplane.api.validation.meta import validate_object_meta

    out: list[Cause] = []
    if "apiVersion" not in x:
        out.append(required(_fchild(path, "apiVersion")))
    if "kind" not in x:
        out.append(required(_fchild(path, "kind")))
    for k, v in x.items():
        if k == "apiVersion":
            p = _fchild(path, k)
            if not isinstance(v, str):
                out.append(invalid_value(p, v, "must be a string"))
            elif not v:
                out.append(required(p))
            elif v.count("/") > 1:
                out.append(invalid_value(p, v, f"unexpected GroupVersion string: {v}"))
        elif k == "kind":
            p = _fchild(path, k)
            if not isinstance(v, str):
                out.append(invalid_value(p, v, "must be a string"))
            elif not v:
                out.append(required(p))
            else:
                errs = is_dns1035_label(v.lower())
                if errs:
                    out.append(invalid_value(p, v, "may have mixed case, but should otherwise match: " + ",".join(errs)))
        elif k == "metadata":
            p = _fchild(path, k)
            if not isinstance(v, dict):
                out.append(invalid_value(p, v, "must be an object"))
                continue
            meta = dict(v)
            if not meta.get("name"):
                meta["name"] = "fakename"
            out.extend(validate_object_meta(meta, bool(meta.get("namespace")), _path_segment_name, p))
    return out


# -------------------------------------------------- list-type sets and maps


def _validate_list_types(s: _Node, x: Any, old: Any, path: str, out: list[Cause]) -> None:
    """Uniqueness of x-kubernetes-list-type set and map lists (upstream's
    listtype validation, with field paths: ``spec.m[key].l[1]``). Lists equal
    to their old value are not checked again."""
    if old is not _MISSING and _unchanged(x, old):
        return
    if type(x) is dict:
        old_map = old if type(old) is dict else None
        for k, v in x.items():
            prop = s.properties.get(k)
            if prop is not None:
                child, p = prop, _fchild(path, k)
            elif s.additional is not None:
                child, p = s.additional, f"{path}[{k}]"
            else:
                continue
            if child.list_type in ("set", "map") or child.list_types_below:
                _validate_list_types(child, v, old_map.get(k, _MISSING) if old_map is not None else _MISSING, p, out)
    elif type(x) is list:
        if len(x) > 1:
            if s.list_type == "set":
                out.extend(_set_duplicates(x, path))
            elif s.list_type == "map" and s.list_keys:
                out.extend(_map_duplicates(x, s.list_keys, path))
        it = s.items
        if it is not None and (it.list_types_below or it.list_type in ("set", "map")):
            for i, v in enumerate(x):
                _validate_list_types(it, v, _MISSING, f"{path}[{i}]", out)
