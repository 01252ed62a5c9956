"""CustomResourceDefinition validation (apiextensions-apiserver's
``pkg/apis/apiextensions/validation``) for apiextensions.k8s.io/v1.

The structure of the CRD (names, scope, versions, subresources, printer
columns, selectable fields, conversion) is checked here; the
openAPIV3Schema of each version by the structural-schema library
(:func:`kubeplane.apiextensions.structural.check_crd_schema`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import orjson

from kubeplane.api.errors import (
    Cause,
    duplicate,
    forbidden_field,
    invalid_value,
    not_supported,
    required,
    too_many,
)
from kubeplane.api.strings import is_dns1035_label, is_dns1123_subdomain
from kubeplane.api.validation.common import _d, _l, _s

PRINTER_COLUMN_TYPES = ("boolean", "date", "integer", "number", "string")
PRINTER_COLUMN_FORMATS = ("byte", "date", "date-time", "double", "float", "int32", "int64", "password")
MAX_SELECTABLE_FIELDS = 8
ESTABLISHED = "Established"



def _go_versions(versions: list[Any]) -> str:
    """How upstream prints spec.versions as a bad value: a Go value dump. The
    exact dump of a Go struct cannot be reproduced; the type name opens it."""
    return "[]apiextensions.CustomResourceDefinitionVersion{...}"


def _invalid_raw(path: str, text: str, detail: str) -> Cause:
    return Cause("FieldValueInvalid", f"Invalid value: {text}: {detail}", path)


def _names(names: dict[str, Any], path: str) -> list[Cause]:
    out: list[Cause] = []
    for key in ("plural", "singular"):
        v = _s(names.get(key))
        errs = is_dns1035_label(v)
        if v and errs:
            out.append(invalid_value(f"{path}.{key}", v, ",".join(errs)))
    for key in ("kind", "listKind"):
        v = _s(names.get(key))
        errs = is_dns1035_label(v.lower())
        if v and errs:
            out.append(invalid_value(f"{path}.{key}", v, "may have mixed case, but should otherwise match: "
                                     + ",".join(errs)))
    for i, short in enumerate(_l(names.get("shortNames"))):
        errs = is_dns1035_label(_s(short))
        if errs:
            out.append(invalid_value(f"{path}.shortNames[{i}]", short, ",".join(errs)))
    kind = _s(names.get("kind"))
    if kind and kind == names.get("listKind"):
        out.append(invalid_value(f"{path}.listKind", kind, "kind and listKind may not be the same"))
    for i, cat in enumerate(_l(names.get("categories"))):
        errs = is_dns1035_label(_s(cat))
        if errs:
            out.append(invalid_value(f"{path}.categories[{i}]", cat, ",".join(errs)))
    return out


def _replicas_path(value: str, path: str, under: str) -> list[Cause]:
    """``specReplicasPath``/``statusReplicasPath``: a simple JSON path below ``under``."""
    if not value:
        return [required(path)]
    bad = _simple_json_path(value, path)
    if bad:
        return bad
    if value == under or not value.startswith(under + "."):
        return [invalid_value(path, value, f"should be a json path under {under}")]
    return []


def _simple_json_path(value: str, path: str) -> list[Cause]:
    from kubeplane.api.jsonpath import JSONPathError, compile_path

    if not value.startswith("."):
        return [invalid_value(path, value, "must be a simple json path starting with .")]
    try:
        compile_path(value)
    except JSONPathError:
        return [invalid_value(path, value, "must be a simple json path starting with .")]
    return []


def _printer_column(col: dict[str, Any], path: str) -> list[Cause]:
    out: list[Cause] = []
    if not col.get("name"):
        out.append(required(f"{path}.name"))
    typ = _s(col.get("type"))
    allowed = "must be one of " + ",".join(PRINTER_COLUMN_TYPES)
    if not typ:
        out.append(required(f"{path}.type", allowed))
    elif typ not in PRINTER_COLUMN_TYPES:
        out.append(invalid_value(f"{path}.type", typ, allowed))
    fmt = _s(col.get("format"))
    if fmt and fmt not in PRINTER_COLUMN_FORMATS:
        out.append(invalid_value(f"{path}.format", fmt, "must be one of " + ",".join(PRINTER_COLUMN_FORMATS)))
    jp = _s(col.get("jsonPath"))
    if not jp:
        out.append(required(f"{path}.JSONPath"))
    else:
        out += _simple_json_path(jp, f"{path}.JSONPath")
    return out


def _subresources(sub: Any, path: str) -> list[Cause]:
    out: list[Cause] = []
    scale = _d(sub).get("scale")
    if not isinstance(scale, dict):
        return out
    for key, under in (("specReplicasPath", ".spec"), ("statusReplicasPath", ".status")):
        out += _replicas_path(_s(scale.get(key)), f"{path}.scale.{key}", under)
    selector = scale.get("labelSelectorPath")
    if selector is not None and selector != "":
        selector = _s(selector)
        bad = _simple_json_path(selector, f"{path}.scale.labelSelectorPath")
        if bad:
            out += bad
        elif not (selector.startswith(".spec.") or selector.startswith(".status.")):
            out.append(invalid_value(f"{path}.scale.labelSelectorPath", selector,
                                     "should be a json path under either .spec or .status"))
    return out


def _schema_at(schema: Any, names: list[str]) -> Any:
    node = schema
    for n in names:
        props = _d(node).get("properties")
        if not isinstance(props, dict) or n not in props:
            return None
        node = props[n]
    return node


def _selectable_fields(fields: list[Any], schema: Any, path: str) -> list[Cause]:
    from kubeplane.api.jsonpath import JSONPathError, field_steps

    out: list[Cause] = []
    seen: set[str] = set()
    for i, f in enumerate(fields):
        p = f"{path}[{i}].jsonPath"
        jp = _s(_d(f).get("jsonPath"))
        if not jp:
            out.append(required(p))
            continue
        try:
            names = field_steps(jp)
        except JSONPathError as exc:
            out.append(invalid_value(p, jp, f"is an invalid path: {exc}"))
            continue
        node = _schema_at(schema, names) if names else None
        if node is None:
            missing = names[-1] if names else jp
            out.append(invalid_value(p, jp, f"is an invalid path: does not refer to a valid field: {missing}"))
            continue
        if names[0] == "metadata":
            out.append(invalid_value(p, jp, "must not point to fields in metadata"))
        if _d(node).get("type") not in ("string", "boolean", "integer"):
            out.append(invalid_value(p, jp, "must point to a field of type string, boolean or integer. "
                                     "Enum string fields and strings with formats are allowed."))
        key = ".".join(names)
        if key in seen:
            out.append(duplicate(p, jp))
        seen.add(key)
    if len(seen) > MAX_SELECTABLE_FIELDS:
        out.append(too_many(path, len(seen), MAX_SELECTABLE_FIELDS))
    return out


def _conversion(conv: Any, path: str, preserve_unknown: bool) -> list[Cause]:
    out: list[Cause] = []
    if not isinstance(conv, dict):
        return out
    strategy = _s(conv.get("strategy"))
    if not strategy:
        out.append(required(f"{path}.strategy"))
    elif strategy not in ("None", "Webhook"):
        out.append(not_supported(f"{path}.strategy", strategy, ["None", "Webhook"]))
    if strategy == "Webhook":
        if preserve_unknown:
            out.append(invalid_value(f"{path}.strategy", strategy, "must be None if spec.preserveUnknownFields is true"))
        webhook = conv.get("webhook")
        if not isinstance(webhook, dict):
            out.append(required(f"{path}.webhook", "required when strategy is set to Webhook"))
        else:
            cc = _d(webhook.get("clientConfig"))
            if ("url" in cc) == ("service" in cc):
                out.append(required(f"{path}.webhook.clientConfig", "exactly one of url or service is required"))
            versions = _l(webhook.get("conversionReviewVersions"))
            if not versions:
                out.append(required(f"{path}.webhook.conversionReviewVersions"))
            elif not any(v in ("v1", "v1beta1") for v in versions):
                out.append(invalid_value(f"{path}.webhook.conversionReviewVersions", versions,
                                         "must include at least one of v1, v1beta1"))
    elif conv.get("webhook") is not None:
        out.append(forbidden_field(f"{path}.webhook", "should not be set when strategy is not set to Webhook"))
    return out


def _status_enabled(version: dict[str, Any]) -> bool:
    return isinstance(_d(version.get("subresources")).get("status"), dict)


_SCHEMA_MEMO: "OrderedDict[bytes, list[Cause]]" = OrderedDict()


def _schema_causes(schema: dict[str, Any], path: str, status: bool) -> list[Cause]:
    """The structural-schema library's errors for one version's schema,
    remembered for schemas seen lately (CEL rules cost milliseconds to
    compile; a CRD's status writes check the same schemas again)."""
    from kubeplane.apiextensions.structural import check_crd_schema

    try:
        key = orjson.dumps([schema, path, status], option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):  # e.g. an integer beyond 64 bits: not remembered
        return check_crd_schema(schema, path, status_subresource=status)
    hit = _SCHEMA_MEMO.get(key)
    if hit is None:
        hit = check_crd_schema(schema, path, status_subresource=status)
        _SCHEMA_MEMO[key] = hit
        if len(_SCHEMA_MEMO) > 256:
            _SCHEMA_MEMO.popitem(last=False)
    else:
        _SCHEMA_MEMO.move_to_end(key)
    return list(hit)


def validate_crd(obj: dict[str, Any]) -> list[Cause]:
    """Every problem of a CustomResourceDefinition (create and update alike)."""
    out: list[Cause] = []
    spec = _d(obj.get("spec"))
    names = _d(spec.get("names"))
    group = _s(spec.get("group"))
    md = _d(obj.get("metadata"))
    name = _s(md.get("name"))
    if name and name != f"{_s(names.get('plural'))}.{group}":
        out.append(invalid_value("metadata.name", name, 'must be spec.names.plural+"."+spec.group'))
    if not group:
        out.append(required("spec.group"))
    elif errs := is_dns1123_subdomain(group):
        out.append(invalid_value("spec.group", group, ",".join(errs)))
    elif len(group.split(".")) < 2:
        out.append(invalid_value("spec.group", group, "should be a domain with at least one dot"))
    scope = _s(spec.get("scope"))
    if not scope:
        out.append(required("spec.scope"))
    elif scope not in ("Cluster", "Namespaced"):
        out.append(not_supported("spec.scope", scope, ["Cluster", "Namespaced"]))
    preserve_unknown = spec.get("preserveUnknownFields") is True
    if preserve_unknown:
        out.append(invalid_value("spec.preserveUnknownFields", True, (
            "cannot set to true, set x-kubernetes-preserve-unknown-fields to true in spec.versions[*].schema "
            "instead")))
    versions = [_d(v) for v in _l(spec.get("versions"))]
    storage = 0
    seen: set[str] = set()
    unique = True
    for i, v in enumerate(versions):
        vp = f"spec.versions[{i}]"
        vname = _s(v.get("name"))
        if v.get("storage") is True:
            storage += 1
        if vname in seen:
            unique = False
        seen.add(vname)
        if errs := is_dns1035_label(vname):
            out.append(invalid_value(f"{vp}.name", vname, ",".join(errs)))
        dep_warning = v.get("deprecationWarning")
        if dep_warning is not None:
            if not v.get("deprecated"):
                out.append(invalid_value(f"{vp}.deprecationWarning", dep_warning, "can only be set for deprecated versions"))
            elif len(_s(dep_warning)) > 256:
                out.append(invalid_value(f"{vp}.deprecationWarning", dep_warning, "must be <= 256 characters long"))
            elif not _s(dep_warning):
                out.append(invalid_value(f"{vp}.deprecationWarning", dep_warning, "must not be an empty string"))
        schema = _d(v.get("schema")).get("openAPIV3Schema")
        if not isinstance(schema, dict):
            out.append(required(f"{vp}.schema.openAPIV3Schema", "schemas are required"))
        else:
            out += _schema_causes(schema, f"{vp}.schema.openAPIV3Schema", _status_enabled(v))
        out += _subresources(v.get("subresources"), f"{vp}.subresources")
        for j, col in enumerate(_l(v.get("additionalPrinterColumns"))):
            out += _printer_column(_d(col), f"{vp}.additionalPrinterColumns[{j}]")
        fields = _l(v.get("selectableFields"))
        if fields:
            if not isinstance(schema, dict):
                out.append(invalid_value(f"{vp}.selectableFields", "",
                                         "selectableFields may only be set when version.schema.openAPIV3Schema is not included"))
            else:
                out += _selectable_fields(fields, schema, f"{vp}.selectableFields")
    if not unique:
        out.append(_invalid_raw("spec.versions", _go_versions(versions), "must contain unique version names"))
    if storage != 1:
        out.append(_invalid_raw("spec.versions", _go_versions(versions),
                                "must have exactly one version marked as storage version"))
    for key in ("plural", "singular", "kind", "listKind"):
        if not names.get(key):
            out.append(required(f"spec.names.{key}"))
    out += _names(names, "spec.names")
    out += _conversion(spec.get("conversion"), "spec.conversion", preserve_unknown)
    out += _api_approval(group, _d(md.get("annotations")))
    status = _d(obj.get("status"))
    out += _names(_d(status.get("acceptedNames")), "status.acceptedNames")
    out += _stored_versions(_l(status.get("storedVersions")), versions)
    return out


APPROVAL_ANNOTATION = "api-approved.kubernetes.io"


def _api_approval(group: str, annotations: dict[str, Any]) -> list[Cause]:
    """Groups of the Kubernetes project (k8s.io, kubernetes.io) need the
    approval annotation: a URL, or a value starting with "unapproved"."""
    protected = group in ("k8s.io", "kubernetes.io") or group.endswith((".k8s.io", ".kubernetes.io"))
    if not protected:
        return []
    path = f"metadata.annotations[{APPROVAL_ANNOTATION}]"
    value = annotations.get(APPROVAL_ANNOTATION)
    if value is None:
        return [required(path, f'protected groups must have approval annotation "{APPROVAL_ANNOTATION}", '
                               "see https://github.com/kubernetes/enhancements/pull/1111")]
    value = _s(value)
    if value.startswith("unapproved"):
        return []
    from urllib.parse import urlparse

    parsed = urlparse(value)
    if not (parsed.scheme and parsed.netloc):
        return [invalid_value(path, value, 'protected groups must have approval annotation "'
                              f'{APPROVAL_ANNOTATION}" with either a URL or a reason starting with "unapproved", '
                              "see https://github.com/kubernetes/enhancements/pull/1111")]
    return []


def _stored_versions(stored: list[Any], versions: list[dict[str, Any]]) -> list[Cause]:
    path = "status.storedVersions"
    if not stored:
        return [invalid_value(path, stored, "must have at least one stored version")]
    out: list[Cause] = []
    remaining = {v: i for i, v in enumerate(stored)}
    for v in versions:
        name = v.get("name")
        if v.get("storage") is True and name not in remaining:
            out.append(invalid_value(path, stored, f"must have the storage version {name}"))
        remaining.pop(name, None)
    for v, i in remaining.items():
        out.append(invalid_value(f"{path}[{i}]", v, (
            f"missing from spec.versions; {v} was previously a storage version, and must remain in spec.versions "
            f"until a storage migration ensures no data remains persisted in {v} and removes {v} from "
            "status.storedVersions")))
    return out


def _established(obj: dict[str, Any]) -> bool:
    for c in _l(_d(obj.get("status")).get("conditions")):
        if _d(c).get("type") == ESTABLISHED and _d(c).get("status") == "True":
            return True
    return False


def validate_crd_update(obj: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    """What may not change once stored: group and plural always; scope and kind
    once the CRD is established."""
    out: list[Cause] = []
    spec, old_spec = _d(obj.get("spec")), _d(old.get("spec"))
    msg = "field is immutable"
    if _established(old):
        if spec.get("scope") != old_spec.get("scope"):
            out.append(invalid_value("spec.scope", spec.get("scope"), msg))
        if _d(spec.get("names")).get("kind") != _d(old_spec.get("names")).get("kind"):
            out.append(invalid_value("spec.names.kind", _d(spec.get("names")).get("kind"), msg))
    if spec.get("group") != old_spec.get("group"):
        out.append(invalid_value("spec.group", spec.get("group"), msg))
    if _d(spec.get("names")).get("plural") != _d(old_spec.get("names")).get("plural"):
        out.append(invalid_value("spec.names.plural", _d(spec.get("names")).get("plural"), msg))
    return out
