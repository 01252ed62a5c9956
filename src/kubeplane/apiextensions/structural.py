"""The checks the API server makes on a CRD version's ``openAPIV3Schema``.

:func:`check_crd_schema` returns upstream's field errors for one schema,
with field paths under the given prefix (for example
``spec.versions[0].schema.openAPIV3Schema``):

* OpenAPI keywords CRDs do not support (``$ref``, ``id``, ``definitions``,
  ``dependencies``, ``patternProperties``, ``additionalItems``,
  ``uniqueItems``, ``type: null``, item arrays), unknown types, and
  ``additionalProperties`` next to ``properties``;
* structurality: a type everywhere a field or item is specified, nothing but
  value validations under ``allOf``/``anyOf``/``oneOf``/``not`` and only for
  fields specified outside of them, the two int-or-string patterns,
  metadata restricted to ``name``/``generateName`` at the root;
* the ``x-kubernetes-*`` extensions: embedded resources, int-or-string,
  preserve-unknown-fields, list types and map keys, map types;
* defaults: forbidden in metadata, valid against their schema and equal to
  their pruned value;
* ``x-kubernetes-validations``: rule, message, messageExpression, reason and
  fieldPath; rules that do not compile, exceed the cost limits or use
  ``oldSelf`` where old and new values cannot be correlated.
"""

from __future__ import annotations

import copy
from typing import Any

from kubeplane.api.errors import Cause, forbidden_field, go_repr, invalid_value, not_supported, required

from . import regex
from .schema import NIL_PATH, ResourceSchema, _Node, _prune_impl

__all__ = ["check_crd_schema", "OPENAPI_V3_TYPES"]

OPENAPI_V3_TYPES = ("array", "boolean", "integer", "number", "object", "string")
_META = ("apiVersion", "kind", "metadata")
SUPPORTED_REASONS = ("FieldValueDuplicate", "FieldValueForbidden", "FieldValueInvalid", "FieldValueRequired")
# keys a nested value validation (under allOf/anyOf/oneOf/not) may carry
_VALUE_VALIDATION_KEYS = frozenset({
    "format", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum", "maxLength", "minLength",
    "pattern", "maxItems", "minItems", "uniqueItems", "multipleOf", "enum", "maxProperties",
    "minProperties", "required", "allOf", "oneOf", "anyOf", "not", "items", "properties",
})


def _key(path: str, k: str) -> str:
    return f"{path}[{k}]"


def check_crd_schema(
    openapi_v3_schema: Any,
    path: str = "spec.versions[0].schema.openAPIV3Schema",
    *,
    allow_defaults: bool = True,
    status_subresource: bool = False,
) -> list[Cause]:
    """Every error upstream's CRD validation reports for one version's schema."""
    schema = openapi_v3_schema
    if not isinstance(schema, dict):
        return [invalid_value(path, go_repr(schema), "must be an object")]
    if _depth(schema) > MAX_SCHEMA_DEPTH:
        return [forbidden_field(path, f"must not be nested more than {MAX_SCHEMA_DEPTH} levels deep")]
    try:
        return _check(schema, path, allow_defaults, status_subresource)
    except RecursionError:
        return [forbidden_field(path, f"must not be nested more than {MAX_SCHEMA_DEPTH} levels deep")]


MAX_SCHEMA_DEPTH = 128


def _depth(schema: Any) -> int:
    """How deeply schemas nest (properties, items, additionalProperties, junctors), counted without recursion."""
    best = 0
    stack = [(schema, 1)]
    while stack:
        s, d = stack.pop()
        if not isinstance(s, dict):
            continue
        best = max(best, d)
        if d > MAX_SCHEMA_DEPTH:
            return d
        props = s.get("properties")
        if isinstance(props, dict):
            stack.extend((v, d + 1) for v in props.values())
        for k in ("items", "additionalProperties", "not"):
            stack.append((s.get(k), d + 1))
        for k in ("allOf", "anyOf", "oneOf"):
            subs = s.get(k)
            if isinstance(subs, list):
                stack.extend((v, d + 1) for v in subs)
    return best


def _check(schema: dict[str, Any], path: str, allow_defaults: bool, status_subresource: bool) -> list[Cause]:
    errs: list[Cause] = []
    if status_subresource:
        errs.extend(_status_root_checks(schema, path))
    if schema.get("nullable") is True:
        errs.append(forbidden_field(f"{path}.nullable", "nullable cannot be true at the root"))

    schema_errs: list[Cause] = []
    _openapi(schema, path, schema_errs, root=True, allow_defaults=allow_defaults,
             defaults_reason="", inside_meta=False, old_self_forbidden=None)
    structural = _structural_checks(schema, path)
    if not structural:
        structural = _check_defaults(schema, path)
    errs.extend(structural)
    errs.extend(schema_errs)
    if not errs:
        errs.extend(_cel_checks(schema, path))
    return errs


# -------------------------------------------------------- OpenAPI keyword checks


def _openapi(s: dict[str, Any], path: str, errs: list[Cause], *, root: bool, allow_defaults: bool,
             defaults_reason: str, inside_meta: bool, old_self_forbidden: str | None) -> None:
    t = s.get("type")
    if isinstance(t, str) and t and t not in OPENAPI_V3_TYPES:
        errs.append(not_supported(f"{path}.type", t, OPENAPI_V3_TYPES))
    if "default" in s and not allow_defaults:
        detail = "must not be set" + (f" {defaults_reason}" if defaults_reason else "")
        errs.append(forbidden_field(f"{path}.default", detail))
    if s.get("id"):
        errs.append(forbidden_field(f"{path}.id", "id is not supported"))
    if "additionalItems" in s:
        errs.append(forbidden_field(f"{path}.additionalItems", "additionalItems is not supported"))
    if s.get("patternProperties"):
        errs.append(forbidden_field(f"{path}.patternProperties", "patternProperties is not supported"))
    if s.get("definitions"):
        errs.append(forbidden_field(f"{path}.definitions", "definitions is not supported"))
    if "dependencies" in s:
        errs.append(forbidden_field(f"{path}.dependencies", "dependencies is not supported"))
    if "$ref" in s:
        errs.append(forbidden_field(f"{path}.$ref", "$ref is not supported"))
    if t == "null":
        errs.append(forbidden_field(f"{path}.type", "type cannot be set to null, use nullable as an alternative"))
    items = s.get("items")
    if isinstance(items, list) and items:
        errs.append(forbidden_field(f"{path}.items", "items must be a schema object and not an array"))
    if inside_meta and s.get("x-kubernetes-embedded-resource") is True:
        errs.append(forbidden_field(f"{path}.x-kubernetes-embedded-resource", "must not be used inside of resource meta"))
    if s.get("uniqueItems") is True:
        errs.append(forbidden_field(f"{path}.uniqueItems",
                                    "uniqueItems cannot be set to true since the runtime complexity becomes quadratic"))
    props = s.get("properties") if isinstance(s.get("properties"), dict) else {}
    ap = s.get("additionalProperties")
    if ap is not None:
        if props and (ap is False or isinstance(ap, dict)):
            errs.append(forbidden_field(f"{path}.additionalProperties", "additionalProperties and properties are mutual exclusive"))
        if isinstance(ap, dict):
            sub_allow, sub_reason = allow_defaults, defaults_reason
            if inside_meta:
                sub_allow, sub_reason = False, "inside additionalProperties applying to object metadata"
            _openapi(ap, f"{path}.additionalProperties", errs, root=False, allow_defaults=sub_allow,
                     defaults_reason=sub_reason, inside_meta=inside_meta, old_self_forbidden=old_self_forbidden)
    embedded = s.get("x-kubernetes-embedded-resource") is True
    map_type = s.get("x-kubernetes-map-type")
    for k, sub in props.items():
        if not isinstance(sub, dict):
            continue
        sub_allow, sub_reason, sub_meta = allow_defaults, defaults_reason, inside_meta
        osf = old_self_forbidden
        if map_type == "atomic" and osf is None:
            osf = path
        if (root or embedded) and k in _META:
            sub_meta = True
            if root:
                sub_allow, sub_reason = False, f"in top-level {k}"
        _openapi(sub, _key(f"{path}.properties", k), errs, root=False, allow_defaults=sub_allow,
                 defaults_reason=sub_reason, inside_meta=sub_meta, old_self_forbidden=osf)
    if isinstance(s.get("not"), dict):
        _openapi(s["not"], f"{path}.not", errs, root=False, allow_defaults=allow_defaults,
                 defaults_reason=defaults_reason, inside_meta=inside_meta, old_self_forbidden=old_self_forbidden)
    for junctor in ("allOf", "oneOf", "anyOf"):
        subs = s.get(junctor)
        if isinstance(subs, list):
            for i, sub in enumerate(subs):
                if isinstance(sub, dict):
                    _openapi(sub, f"{path}.{junctor}[{i}]", errs, root=False, allow_defaults=allow_defaults,
                             defaults_reason=defaults_reason, inside_meta=inside_meta,
                             old_self_forbidden=old_self_forbidden)
    if isinstance(items, dict):
        osf = old_self_forbidden
        if s.get("x-kubernetes-list-type") != "map" and osf is None:
            osf = path
        _openapi(items, f"{path}.items", errs, root=False, allow_defaults=allow_defaults,
                 defaults_reason=defaults_reason, inside_meta=inside_meta, old_self_forbidden=osf)
    _extension_checks(s, path, errs)
    _rule_field_checks(s, path, errs)


def _extension_checks(s: dict[str, Any], path: str, errs: list[Cause]) -> None:
    t = s.get("type") if isinstance(s.get("type"), str) else ""
    if s.get("x-kubernetes-preserve-unknown-fields") is False:
        errs.append(invalid_value(f"{path}.x-kubernetes-preserve-unknown-fields", False, "must be true or undefined"))
    mt = s.get("x-kubernetes-map-type")
    if mt is not None and t != "object":
        if not t:
            errs.append(required(f"{path}.type", "must be object if x-kubernetes-map-type is specified"))
        else:
            errs.append(invalid_value(f"{path}.type", t, "must be object if x-kubernetes-map-type is specified"))
    if mt is not None and mt not in ("atomic", "granular"):
        errs.append(not_supported(f"{path}.x-kubernetes-map-type", mt, ("atomic", "granular")))
    lt = s.get("x-kubernetes-list-type")
    items = s.get("items") if isinstance(s.get("items"), dict) else None
    if lt is not None and t != "array":
        if not t:
            errs.append(required(f"{path}.type", "must be array if x-kubernetes-list-type is specified"))
        else:
            errs.append(invalid_value(f"{path}.type", t, "must be array if x-kubernetes-list-type is specified"))
    elif lt == "set" and items is not None:
        it = items.get("type")
        if it == "array":
            ilt = items.get("x-kubernetes-list-type")
            if ilt is not None and ilt != "atomic":
                errs.append(invalid_value(f"{path}.items.x-kubernetes-list-type", ilt,
                                          "must be atomic as item of a list with x-kubernetes-list-type=set"))
        elif it == "object":
            if items.get("x-kubernetes-map-type") != "atomic":
                errs.append(invalid_value(f"{path}.items.x-kubernetes-map-type", None,
                                          "must be atomic as item of a list with x-kubernetes-list-type=set"))
    if lt is not None and lt not in ("atomic", "set", "map"):
        errs.append(not_supported(f"{path}.x-kubernetes-list-type", lt, ("atomic", "set", "map")))
    keys = s.get("x-kubernetes-list-map-keys")
    keys = keys if isinstance(keys, list) else []
    if keys:
        if lt is None:
            errs.append(required(f"{path}.x-kubernetes-list-type", "must be map if x-kubernetes-list-map-keys is non-empty"))
        elif lt != "map":
            errs.append(invalid_value(f"{path}.x-kubernetes-list-type", lt, "must be map if x-kubernetes-list-map-keys is non-empty"))
    if lt == "map":
        if not keys:
            errs.append(required(f"{path}.x-kubernetes-list-map-keys", "must not be empty if x-kubernetes-list-type is map"))
        if "items" not in s:
            errs.append(required(f"{path}.items", "must have a schema if x-kubernetes-list-type is map"))
        elif items is None:
            errs.append(invalid_value(f"{path}.items", s.get("items"), "must only have a single schema if x-kubernetes-list-type is map"))
        else:
            it = items.get("type") if isinstance(items.get("type"), str) else ""
            if it != "object":
                errs.append(invalid_value(f"{path}.items.type", it, "must be object if parent array's x-kubernetes-list-type is map"))
            else:
                iprops = items.get("properties") if isinstance(items.get("properties"), dict) else {}
                seen: set[str] = set()
                for k in keys:
                    sub = iprops.get(k)
                    if isinstance(sub, dict):
                        if sub.get("type") in ("array", "object"):
                            errs.append(invalid_value(_key(f"{path}.items.properties", str(k)) + ".type", it,
                                                      "must be a scalar type if parent array's x-kubernetes-list-type is map"))
                    else:
                        errs.append(invalid_value(f"{path}.x-kubernetes-list-map-keys", keys,
                                                  "entries must all be names of item properties"))
                    if k in seen:
                        errs.append(invalid_value(f"{path}.x-kubernetes-list-map-keys", keys,
                                                  "must not contain duplicate entries"))
                    seen.add(k)
    # list sets and maps: items not nullable, map keys required or defaulted
    if items is not None and lt in ("set", "map"):
        if items.get("nullable") is True:
            errs.append(forbidden_field(f"{path}.items.nullable", f"cannot be nullable when x-kubernetes-list-type is {lt}"))
        if lt == "map":
            req = items.get("required") if isinstance(items.get("required"), list) else []
            iprops = items.get("properties") if isinstance(items.get("properties"), dict) else {}
            for k in keys:
                sub = iprops.get(k)
                if not isinstance(sub, dict):
                    continue
                kp = _key(f"{path}.items.properties", str(k))
                if k not in req and "default" not in sub:
                    errs.append(required(f"{kp}.default", "this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property"))
                if sub.get("nullable") is True:
                    errs.append(forbidden_field(f"{kp}.nullable", "this property is in x-kubernetes-list-map-keys, so it cannot be nullable"))


def _has_newline(s: str) -> bool:
    return "\n" in s or "\r" in s


def _rule_field_checks(s: dict[str, Any], path: str, errs: list[Cause]) -> None:
    rules = s.get("x-kubernetes-validations")
    if not isinstance(rules, list):
        return
    for i, rule in enumerate(rules):
        rp = f"{path}.x-kubernetes-validations[{i}]"
        if not isinstance(rule, dict):
            errs.append(required(f"{rp}.rule", "rule is not specified"))
            continue
        text = rule.get("rule") if isinstance(rule.get("rule"), str) else ""
        msg = rule.get("message") if isinstance(rule.get("message"), str) else ""
        mexpr = rule.get("messageExpression") if isinstance(rule.get("messageExpression"), str) else ""
        if not text.strip():
            errs.append(required(f"{rp}.rule", "rule is not specified"))
        elif msg and not msg.strip():
            errs.append(invalid_value(f"{rp}.message", msg, "message must be non-empty if specified"))
        elif _has_newline(msg.strip()):
            errs.append(invalid_value(f"{rp}.message", msg, "message must not contain line breaks"))
        elif _has_newline(text.strip()) and not msg.strip():
            errs.append(required(f"{rp}.message", "message must be specified if rule contains line breaks"))
        if mexpr and not mexpr.strip():
            errs.append(required(f"{rp}.messageExpression", "messageExpression must be non-empty if specified"))
        reason = rule.get("reason")
        if reason is not None and reason not in SUPPORTED_REASONS:
            errs.append(not_supported(f"{rp}.reason", reason, SUPPORTED_REASONS))
        fp = rule.get("fieldPath") if isinstance(rule.get("fieldPath"), str) else ""
        if fp and not fp.strip():
            errs.append(invalid_value(f"{rp}.fieldPath", fp, "fieldPath must be non-empty if specified"))
        if _has_newline(fp):
            errs.append(invalid_value(f"{rp}.fieldPath", fp, "fieldPath must not contain line breaks"))
        if fp:
            from .celrules import valid_field_path

            try:
                valid_field_path(fp, _Node(s))
            except ValueError:
                errs.append(invalid_value(f"{rp}.fieldPath", fp, "fieldPath must be a valid path"))


def _status_root_checks(schema: dict[str, Any], path: str) -> list[Cause]:
    allowed = {
        "description", "type", "format", "title", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
        "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems", "multipleOf", "required",
        "items", "properties", "externalDocs", "example", "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-validations",
    }
    for k, v in schema.items():
        if v in (None, False, "", [], {}, 0):
            continue
        if k == "type":
            if v != "object":
                return [invalid_value(f"{path}.type", v, 'only "object" is allowed as the type at the root of the schema if the status subresource is enabled')]
            continue
        if k not in allowed:
            fields = "[Description Type Format Title Maximum ExclusiveMaximum Minimum ExclusiveMinimum MaxLength MinLength Pattern MaxItems MinItems UniqueItems MultipleOf Required Items Properties ExternalDocs Example XPreserveUnknownFields XValidations]"
            return [Cause("FieldValueInvalid",
                          f"Invalid value: \"object\": only {fields} fields are allowed at the root of the schema if the status subresource is enabled",
                          path)]
    return []


# ---------------------------------------------------------- structurality


_ROOT, _ITEM, _FIELD = 0, 1, 2


def _structural_checks(schema: dict[str, Any], path: str) -> list[Cause]:
    errs: list[Cause] = []
    _invariants(schema, _ROOT, path, errs)
    _completeness(schema, schema, path, path, errs)
    errs.sort(key=lambda c: f"{c.field}: {c.message}")
    return errs


def _type(s: dict[str, Any]) -> str:
    t = s.get("type")
    return t if isinstance(t, str) else ""


def _sub(s: dict[str, Any], k: str) -> dict[str, Any] | None:
    v = s.get(k)
    return v if isinstance(v, dict) else None


def _props(s: dict[str, Any]) -> dict[str, Any]:
    p = s.get("properties")
    return {k: v for k, v in p.items() if isinstance(v, dict)} if isinstance(p, dict) else {}


def _is_int_or_string_any_of(any_of: Any) -> bool:
    if not isinstance(any_of, list) or len(any_of) != 2:
        return False
    return any_of[0] == {"type": "integer"} and any_of[1] == {"type": "string"}


def _invariants(s: dict[str, Any] | None, lvl: int, path: str, errs: list[Cause]) -> None:
    if s is None:
        return
    t = _type(s)
    items = _sub(s, "items")
    if t == "array" and items is None:
        errs.append(required(f"{path}.items", "must be specified"))
    _invariants(items, _ITEM, f"{path}.items", errs)
    props = _props(s)
    for k, v in props.items():
        _invariants(v, _FIELD, _key(f"{path}.properties", k), errs)
    ap = s.get("additionalProperties")
    if ap is not None and ap is not False:
        if lvl == _ROOT:
            errs.append(forbidden_field(f"{path}.additionalProperties", "must not be used at the root"))
        if isinstance(ap, dict):
            _invariants(ap, _FIELD, f"{path}.additionalProperties", errs)
    ios = s.get("x-kubernetes-int-or-string") is True
    pres = s.get("x-kubernetes-preserve-unknown-fields") is True
    emb = s.get("x-kubernetes-embedded-resource") is True
    if ios and pres:
        errs.append(invalid_value(f"{path}.x-kubernetes-preserve-unknown-fields", True, "must be false if x-kubernetes-int-or-string is true"))
    if ios and emb:
        errs.append(invalid_value(f"{path}.x-kubernetes-embedded-resource", True, "must be false if x-kubernetes-int-or-string is true"))
    skip_any_of = _is_int_or_string_any_of(s.get("anyOf"))
    all_of = s.get("allOf")
    skip_first_all_of = isinstance(all_of, list) and len(all_of) >= 1 and isinstance(all_of[0], dict) and _is_int_or_string_any_of(all_of[0].get("anyOf"))
    _value_validation(s, skip_any_of, skip_first_all_of, lvl, path, errs)
    check_meta = lvl == _ROOT or emb
    if emb and t != "object":
        if not t:
            errs.append(required(f"{path}.type", "must be object if x-kubernetes-embedded-resource is true"))
        else:
            errs.append(invalid_value(f"{path}.type", t, "must be object if x-kubernetes-embedded-resource is true"))
    elif not t and not ios and not pres:
        detail = {
            _ROOT: "must not be empty at the root",
            _ITEM: "must not be empty for specified array items",
            _FIELD: "must not be empty for specified object fields",
        }[lvl]
        errs.append(required(f"{path}.type", detail))
    if emb and ap is not None and ap is not False:
        errs.append(forbidden_field(f"{path}.additionalProperties", "must not be used if x-kubernetes-embedded-resource is set"))
    if lvl == _ROOT and t and t != "object":
        errs.append(invalid_value(f"{path}.type", t, "must be object at the root"))
    for name in ("kind", "apiVersion"):
        sub = props.get(name)
        if sub is not None and check_meta and _type(sub) != "string":
            errs.append(invalid_value(_key(f"{path}.properties", name) + ".type", _type(sub), "must be string"))
    meta = props.get("metadata")
    if meta is not None:
        mp = _key(f"{path}.properties", "metadata")
        if check_meta and _type(meta) != "object":
            errs.append(invalid_value(f"{mp}.type", _type(meta), "must be object"))
        if lvl == _ROOT and not _meta_only_names(meta):
            errs.append(forbidden_field(mp, "must not specify anything other than name and generateName, but metadata is implicitly specified"))
    if emb and not pres and not props:
        errs.append(required(f"{path}.properties", "must not be empty if x-kubernetes-embedded-resource is true without x-kubernetes-preserve-unknown-fields"))


_IGNORED_META_KEYS = frozenset({"type", "default", "description", "title", "example", "externalDocs"})


def _meta_only_names(meta: dict[str, Any]) -> bool:
    """Root metadata may only restrict name and generateName (with value validations only)."""
    props = _props(meta)
    names = set(props)
    if names - {"name", "generateName"}:
        return False
    for k, v in meta.items():
        if k in ("properties", "type", "default"):
            continue
        # descriptions and other generic fields make the schema differ from the empty one
        return False
    return True


def _value_validation(s: dict[str, Any], skip_any_of: bool, skip_first_all_of: bool, lvl: int, path: str,
                      errs: list[Cause]) -> None:
    if not skip_any_of:
        for i, sub in enumerate(_list(s.get("anyOf"))):
            _nested(sub, False, lvl, f"{path}.anyOf[{i}]", errs)
    for i, sub in enumerate(_list(s.get("allOf"))):
        _nested(sub, skip_first_all_of and i == 0, lvl, f"{path}.allOf[{i}]", errs)
    for i, sub in enumerate(_list(s.get("oneOf"))):
        _nested(sub, False, lvl, f"{path}.oneOf[{i}]", errs)
    n = _sub(s, "not")
    if n is not None:
        _nested(n, False, lvl, f"{path}.not", errs)
    pat = s.get("pattern")
    if isinstance(pat, str) and pat:
        try:
            regex.compile_pattern(pat)
        except regex.PatternError as err:
            errs.append(invalid_value(f"{path}.pattern", pat, f"must be a valid regular expression, but isn't: {err}"))


def _list(v: Any) -> list[dict[str, Any]]:
    return [x if isinstance(x, dict) else {} for x in v] if isinstance(v, list) else []


_NESTED_FORBIDDEN = (
    ("type", lambda v: bool(v), "must be empty to be structural"),
    ("additionalProperties", lambda v: v is not None, "must be undefined to be structural"),
    ("default", lambda v: True, "must be undefined to be structural"),
    ("title", lambda v: bool(v), "must be empty to be structural"),
    ("description", lambda v: bool(v), "must be empty to be structural"),
    ("nullable", lambda v: v is True, "must be false to be structural"),
    ("externalDocs", lambda v: v is not None, "must be undefined to be structural"),
    ("x-kubernetes-preserve-unknown-fields", lambda v: v is True, "must be false to be structural"),
    ("x-kubernetes-embedded-resource", lambda v: v is True, "must be false to be structural"),
    ("x-kubernetes-int-or-string", lambda v: v is True, "must be false to be structural"),
    ("x-kubernetes-list-map-keys", lambda v: bool(v), "must be empty to be structural"),
    ("x-kubernetes-list-type", lambda v: v is not None, "must be undefined to be structural"),
    ("x-kubernetes-map-type", lambda v: v is not None, "must be undefined to be structural"),
    ("x-kubernetes-validations", lambda v: bool(v), "must be empty to be structural"),
)


def _nested(v: dict[str, Any], skip_any_of: bool, lvl: int, path: str, errs: list[Cause]) -> None:
    _value_validation(v, skip_any_of, False, lvl, path, errs)
    items = _sub(v, "items")
    if items is not None:
        _nested(items, False, lvl, f"{path}.items", errs)
    props = _props(v)
    for k, sub in props.items():
        _nested(sub, False, _FIELD, _key(f"{path}.properties", k), errs)
    for key, bad, detail in _NESTED_FORBIDDEN:
        if key in v and bad(v[key]):
            errs.append(forbidden_field(f"{path}.{key}", detail))
    if "metadata" in props:
        errs.append(forbidden_field(_key(f"{path}.properties", "metadata"), "must not be specified in a nested context"))


def _completeness(v: dict[str, Any], s: dict[str, Any] | None, s_path: str, v_path: str, errs: list[Cause]) -> None:
    """Every field or item a value validation mentions is specified in the structural schema."""
    n = _sub(v, "not")
    if n is not None:
        _nested_completeness(n, s, s_path, f"{v_path}.not", errs)
    for junctor in ("allOf", "anyOf", "oneOf"):
        for i, sub in enumerate(_list(v.get(junctor))):
            _nested_completeness(sub, s, s_path, f"{v_path}.{junctor}[{i}]", errs)


def _nested_completeness(v: dict[str, Any], s: dict[str, Any] | None, s_path: str, v_path: str,
                         errs: list[Cause]) -> None:
    if s is None:
        errs.append(required(s_path, f"because it is defined in {v_path}"))
        return
    _completeness(v, s, s_path, v_path, errs)
    vi = _sub(v, "items")
    if vi is not None:
        _nested_completeness(vi, _sub(s, "items"), f"{s_path}.items", f"{v_path}.items", errs)
    sprops = _props(s)
    for k, vf in _props(v).items():
        sf = sprops.get(k)
        if sf is None:
            errs.append(required(_key(f"{s_path}.properties", k), f"because it is defined in {_key(f'{v_path}.properties', k)}"))
        else:
            _nested_completeness(vf, sf, _key(f"{s_path}.properties", k), _key(f"{v_path}.properties", k), errs)


# ---------------------------------------------------------------- defaults


def _reprefix(causes: list[Cause], prefix: str) -> list[Cause]:
    out = []
    for c in causes:
        f = prefix if c.field == NIL_PATH else f"{prefix}.{c.field}"
        out.append(Cause(c.reason, c.message, f))
    return out


def _check_defaults(schema: dict[str, Any], path: str) -> list[Cause]:
    errs: list[Cause] = []
    _defaults(schema, path, schema, errs, inside_meta=False)
    return errs


def _defaults(s: dict[str, Any], path: str, root: dict[str, Any], errs: list[Cause], *, inside_meta: bool) -> None:
    if s.get("x-kubernetes-embedded-resource") is True:
        inside_meta = False
        root = s
    if "default" in s and not inside_meta:
        value = s["default"]
        node = _Node(s)
        dpath = f"{path}.default"
        if value is not None or not s.get("nullable"):
            pruned = copy.deepcopy(value)
            _prune_impl(pruned, node, "", [])
            if pruned != value:
                errs.append(invalid_value(dpath, value, "must not have unknown fields"))
            # validation of the default against its own schema (the defaults below it applied)
            rs = ResourceSchema.__new__(ResourceSchema)
            rs.raw, rs.root, rs._cel = s, node, None
            from .schema import _Errors, _validate

            e = _Errors()
            _validate(node, value, "", e)
            if e.causes:
                errs.extend(_reprefix(e.causes, dpath))
            elif node.rules or node.has_rules_below:
                try:
                    from .celrules import RuleSet

                    rules = RuleSet(node, root_is_resource=s is root and s.get("x-kubernetes-embedded-resource") is True)
                    errs.extend(_reprefix_cel(rules.validate(value, value, ratcheting=False), dpath))
                except Exception:  # a rule that does not compile is reported by the CEL checks
                    pass
    items = _sub(s, "items")
    if items is not None:
        _defaults(items, f"{path}.items", root, errs, inside_meta=inside_meta)
    for k, sub in _props(s).items():
        sub_meta = inside_meta or (s is root and k in _META)
        _defaults(sub, _key(f"{path}.properties", k), root, errs, inside_meta=sub_meta)


def _reprefix_cel(causes: list[Cause], prefix: str) -> list[Cause]:
    return _reprefix(causes, prefix)


# -------------------------------------------------------------------- CEL


def _cel_checks(schema: dict[str, Any], path: str) -> list[Cause]:
    from .celrules import check_rules

    return check_rules(schema, path)
