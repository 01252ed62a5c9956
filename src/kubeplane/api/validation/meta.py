"""ObjectMeta and label selector validation (apimachinery's metav1 and api/validation).
"""

from __future__ import annotations

from typing import Any, Callable

from kubeplane.api.errors import Cause, forbidden_field, invalid_value, required, too_long
from kubeplane.api.meta import same_json
from kubeplane.api.strings import (
    NameFn,
    is_dns1123_label,
    is_qualified_name,
    is_valid_label_value,
    name_is_dns_subdomain,
)
from kubeplane.api.validation.common import IMMUTABLE, _d, _l, _nonnegative, _s


STANDARD_FINALIZERS = frozenset({"kubernetes", "orphan", "foregroundDeletion"})
TOTAL_ANNOTATION_SIZE_LIMIT = 256 * 1024


def validate_labels(labels: Any, path: str) -> list[Cause]:
    out: list[Cause] = []
    for k, v in _d(labels).items():
        for msg in is_qualified_name(k):
            out.append(invalid_value(path, k, msg))
        for msg in is_valid_label_value(_s(v)):
            out.append(invalid_value(path, v, msg))
    return out


def validate_annotations(annotations: Any, path: str) -> list[Cause]:
    out: list[Cause] = []
    total = 0
    for k, v in _d(annotations).items():
        for msg in is_qualified_name(k.lower()):
            out.append(invalid_value(path, k, msg))
        total += len(k.encode()) + len(_s(v).encode())
    if total > TOTAL_ANNOTATION_SIZE_LIMIT:
        out.append(too_long(path, None, TOTAL_ANNOTATION_SIZE_LIMIT))
    return out


def _validate_owner_references(refs: Any, path: str) -> list[Cause]:
    out: list[Cause] = []
    controller: str | None = None
    for ref in _l(refs):
        ref = _d(ref)
        api_version = _s(ref.get("apiVersion"))
        version = api_version.rpartition("/")[2]
        if not version:
            out.append(invalid_value(f"{path}.apiVersion", api_version, "version must not be empty"))
        if not ref.get("kind"):
            out.append(invalid_value(f"{path}.kind", _s(ref.get("kind")), "kind must not be empty"))
        if not ref.get("name"):
            out.append(invalid_value(f"{path}.name", _s(ref.get("name")), "name must not be empty"))
        if not ref.get("uid"):
            out.append(invalid_value(f"{path}.uid", _s(ref.get("uid")), "uid must not be empty"))
        if ref.get("controller") is True:
            this = f"{_s(ref.get('kind'))}/{_s(ref.get('name'))}"
            if controller is not None:
                out.append(invalid_value(
                    path, refs,
                    f'Only one reference can have Controller set to true. Found "true" in references '
                    f"for {controller} and {this}",
                ))
            else:
                controller = this
    return out


def validate_finalizer_name(name: str, path: str) -> list[Cause]:
    """A finalizer (of an object or of a namespace's spec): a qualified name,
    either one of the standard ones or with a domain prefix."""
    msgs = is_qualified_name(name)
    out = [invalid_value(path, name, m) for m in msgs]
    if not msgs and "/" not in name and name not in STANDARD_FINALIZERS:
        out.append(invalid_value(path, name, "name is neither a standard finalizer name nor is it fully qualified"))
    return out


def _validate_finalizers(finalizers: Any, path: str) -> list[Cause]:
    out: list[Cause] = []
    items = [_s(f) for f in _l(finalizers)]
    for f in items:
        out += validate_finalizer_name(f, path)
    if "orphan" in items and "foregroundDeletion" in items:
        out.append(invalid_value(path, items, "finalizer orphan and foregroundDeletion cannot be both set"))
    return out


def validate_object_meta(
    meta: Any, namespaced: bool, name_fn: NameFn = name_is_dns_subdomain, path: str = "metadata",
    old: Any = None,
) -> list[Cause]:
    """Upstream ``ValidateObjectMeta``: name/generateName, namespace, labels, annotations,
    owner references, finalizers. With ``old`` (the stored metadata of an update)
    the parts equal to the stored ones, which passed when they were stored, are
    not checked again."""
    meta = _d(meta)
    prev = _d(old)
    out: list[Cause] = []
    name = _s(meta.get("name"))
    generate_name = _s(meta.get("generateName"))
    if generate_name and (old is None or generate_name != prev.get("generateName")):
        for msg in name_fn(generate_name, True):
            out.append(invalid_value(f"{path}.generateName", generate_name, msg))
    if not name:
        out.append(required(f"{path}.name", "name or generateName is required"))
    elif old is None or name != prev.get("name"):
        for msg in name_fn(name, False):
            out.append(invalid_value(f"{path}.name", name, msg))
    ns = _s(meta.get("namespace"))
    if namespaced:
        if not ns:
            out.append(required(f"{path}.namespace"))
        elif old is None or ns != prev.get("namespace"):
            for msg in is_dns1123_label(ns):
                out.append(invalid_value(f"{path}.namespace", ns, msg))
    elif ns:
        out.append(forbidden_field(f"{path}.namespace", "not allowed on this type"))
    if "generation" in meta:
        out += _nonnegative(meta, "generation", path)
    for key, check in _META_CHECKS:
        value = meta.get(key)
        # Absent (or empty) maps and lists have nothing to check.
        if value and (old is None or not same_json(value, prev.get(key))):
            out += check(value, f"{path}.{key}")
    return out


#: metadata fields checked on their own, by :func:`validate_object_meta`
_META_CHECKS: tuple[tuple[str, Callable[[Any, str], list[Cause]]], ...] = (
    ("labels", validate_labels),
    ("annotations", validate_annotations),
    ("ownerReferences", _validate_owner_references),
    ("finalizers", _validate_finalizers),
)


def validate_object_meta_update(new: Any, old: Any, path: str = "metadata") -> list[Cause]:
    """Name and namespace may not change; uid and creationTimestamp neither, once both are set."""
    new, old = _d(new), _d(old)
    out: list[Cause] = []
    for key in ("name", "namespace"):
        if _s(new.get(key)) != _s(old.get(key)):
            out.append(invalid_value(f"{path}.{key}", _s(new.get(key)), IMMUTABLE))
    for key in ("uid", "creationTimestamp"):
        if new.get(key) and old.get(key) and new.get(key) != old.get(key):
            out.append(invalid_value(f"{path}.{key}", new.get(key), IMMUTABLE))
    return out


def validate_label_selector(sel: Any, path: str) -> list[Cause]:
    """Upstream ``ValidateLabelSelector`` for a metav1.LabelSelector object."""
    if sel is None:
        return []
    sel = _d(sel)
    out = validate_labels(sel.get("matchLabels"), f"{path}.matchLabels")
    for i, expr in enumerate(_l(sel.get("matchExpressions"))):
        expr = _d(expr)
        p = f"{path}.matchExpressions[{i}]"
        op = expr.get("operator")
        values = _l(expr.get("values"))
        if op in ("In", "NotIn"):
            if not values:
                out.append(required(f"{p}.values", "must be specified when `operator` is 'In' or 'NotIn'"))
        elif op in ("Exists", "DoesNotExist"):
            if values:
                out.append(forbidden_field(f"{p}.values", "may not be specified when `operator` is 'Exists' or 'DoesNotExist'"))
        else:
            out.append(invalid_value(f"{p}.operator", op if op is not None else "", "not a valid selector operator"))
        for msg in is_qualified_name(_s(expr.get("key"))):
            out.append(invalid_value(f"{p}.key", _s(expr.get("key")), msg))
        for j, v in enumerate(values):
            for msg in is_valid_label_value(_s(v)):
                out.append(invalid_value(f"{p}.values[{j}]", v, msg))
    return out
