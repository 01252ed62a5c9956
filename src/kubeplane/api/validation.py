"""Object validation with upstream's field paths, reasons and messages.

:func:`validate_object` returns a list of :class:`~kubeplane.api.errors.Cause`
(empty when the object is valid); the registry turns a non-empty list into a
422 with :func:`~kubeplane.api.errors.invalid`. Each resource has one entry in
:data:`VALIDATORS`; other modules can add checks (for example CEL compilation
of DRA selectors) with :func:`register_extra_validator`.

The string checks (``is_dns1123_label`` and friends) return upstream's
messages as a list of strings, empty when the value is valid.
"""

from __future__ import annotations

import base64
import json
import re
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import orjson

from kubeplane.api import errors
from kubeplane.api.errors import Cause
from kubeplane.api.meta import same_json
from kubeplane.api.quantity import format_quantity, parse_quantity_with_format

if TYPE_CHECKING:
    from kubeplane.api.resources import ResourceInfo

# --------------------------------------------------------------------------- string checks

QUALIFIED_NAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
QUALIFIED_NAME_ERR = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character"
)
LABEL_VALUE_FMT = "(" + QUALIFIED_NAME_FMT + ")?"
LABEL_VALUE_ERR = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character"
)
DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_LABEL_ERR = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
    "start and end with an alphanumeric character"
)
DNS1123_SUBDOMAIN_FMT = DNS1123_LABEL_FMT + "(\\." + DNS1123_LABEL_FMT + ")*"
DNS1123_SUBDOMAIN_ERR = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character"
)
DNS1035_LABEL_FMT = "[a-z]([-a-z0-9]*[a-z0-9])?"
DNS1035_LABEL_ERR = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
    "alphabetic character, and end with an alphanumeric character"
)
CONFIG_MAP_KEY_FMT = "[-._a-zA-Z0-9]+"
CONFIG_MAP_KEY_ERR = "a valid config key must consist of alphanumeric characters, '-', '_' or '.'"

_QUALIFIED_NAME_RE = re.compile("^" + QUALIFIED_NAME_FMT + "$")
_LABEL_VALUE_RE = re.compile("^" + LABEL_VALUE_FMT + "$")
_DNS1123_LABEL_RE = re.compile("^" + DNS1123_LABEL_FMT + "$")
_DNS1123_SUBDOMAIN_RE = re.compile("^" + DNS1123_SUBDOMAIN_FMT + "$")
_DNS1035_LABEL_RE = re.compile("^" + DNS1035_LABEL_FMT + "$")
_CONFIG_MAP_KEY_RE = re.compile("^" + CONFIG_MAP_KEY_FMT + "$")
_PORT_NAME_CHARS_RE = re.compile("^[-a-z0-9]+$")
_PORT_NAME_LETTER_RE = re.compile("[a-z]")
_PERCENT_RE = re.compile("^[0-9]+%$")


def regex_error(msg: str, fmt: str, *examples: str) -> str:
    """Upstream's ``RegexError`` text, examples included."""
    if not examples:
        return f"{msg} (regex used for validation is '{fmt}')"
    shown = " or ".join(f"'{e}', " for e in examples)
    return f"{msg} (e.g. {shown}regex used for validation is '{fmt}')"


def max_len_error(n: int) -> str:
    return f"must be no more than {n} characters"


def is_dns1123_label(value: str) -> list[str]:
    out: list[str] = []
    if len(value) > 63:
        out.append(max_len_error(63))
    if not _DNS1123_LABEL_RE.match(value):
        out.append(regex_error(DNS1123_LABEL_ERR, DNS1123_LABEL_FMT, "my-name", "123-abc"))
    return out


def is_dns1123_subdomain(value: str) -> list[str]:
    out: list[str] = []
    if len(value) > 253:
        out.append(max_len_error(253))
    if not _DNS1123_SUBDOMAIN_RE.match(value):
        out.append(regex_error(DNS1123_SUBDOMAIN_ERR, DNS1123_SUBDOMAIN_FMT, "example.com"))
    return out


def is_dns1035_label(value: str) -> list[str]:
    out: list[str] = []
    if len(value) > 63:
        out.append(max_len_error(63))
    if not _DNS1035_LABEL_RE.match(value):
        out.append(regex_error(DNS1035_LABEL_ERR, DNS1035_LABEL_FMT, "my-name", "abc-123"))
    return out


def is_qualified_name(value: str) -> list[str]:
    """Label keys, annotation keys, finalizers: ``[prefix/]name``."""
    return list(_qualified_name_errors(value))


@lru_cache(maxsize=8192)
def _qualified_name_errors(value: str) -> tuple[str, ...]:
    out: list[str] = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            out.append("prefix part must be non-empty")
        else:
            out.extend("prefix part " + m for m in is_dns1123_subdomain(prefix))
    else:
        return (
            "a qualified name "
            + regex_error(QUALIFIED_NAME_ERR, QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
        )
    if not name:
        out.append("name part must be non-empty")
    elif len(name) > 63:
        out.append("name part " + max_len_error(63))
    if not _QUALIFIED_NAME_RE.match(name):
        out.append(
            "name part " + regex_error(QUALIFIED_NAME_ERR, QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
        )
    return tuple(out)


def is_valid_label_value(value: str) -> list[str]:
    if len(value) <= 63 and _LABEL_VALUE_RE.match(value):
        return []
    out: list[str] = []
    if len(value) > 63:
        out.append(max_len_error(63))
    if not _LABEL_VALUE_RE.match(value):
        out.append(regex_error(LABEL_VALUE_ERR, LABEL_VALUE_FMT, "MyValue", "my_value", "12345"))
    return out


def is_config_map_key(value: str) -> list[str]:
    out: list[str] = []
    if len(value) > 253:
        out.append(max_len_error(253))
    if not _CONFIG_MAP_KEY_RE.match(value):
        out.append(regex_error(CONFIG_MAP_KEY_ERR, CONFIG_MAP_KEY_FMT, "key.name", "KEY_NAME", "key-name"))
    if value == ".":
        out.append("must not be '.'")
    elif value == "..":
        out.append("must not be '..'")
    elif value.startswith(".."):
        out.append("must not start with '..'")
    return out


def is_valid_port_num(port: Any) -> list[str]:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        return ["must be between 1 and 65535, inclusive"]
    return []


def is_valid_port_name(name: str) -> list[str]:
    out: list[str] = []
    if len(name) > 15:
        out.append(max_len_error(15))
    if not _PORT_NAME_CHARS_RE.match(name):
        out.append("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    if not _PORT_NAME_LETTER_RE.search(name):
        out.append("must contain at least one letter (a-z)")
    if "--" in name:
        out.append("must not contain consecutive hyphens")
    if name.startswith("-") or name.endswith("-"):
        out.append("must not begin or end with a hyphen")
    return out


def _mask_trailing_dash(name: str) -> str:
    return name[:-1] + "a" if len(name) > 1 and name.endswith("-") else name


NameFn = Callable[[str, bool], list[str]]


def name_is_dns_subdomain(name: str, prefix: bool = False) -> list[str]:
    return is_dns1123_subdomain(_mask_trailing_dash(name) if prefix else name)


def name_is_dns_label(name: str, prefix: bool = False) -> list[str]:
    return is_dns1123_label(_mask_trailing_dash(name) if prefix else name)


def name_is_dns1035_label(name: str, prefix: bool = False) -> list[str]:
    return is_dns1035_label(_mask_trailing_dash(name) if prefix else name)


# --------------------------------------------------------------------------- causes

def _show(value: Any) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), sort_keys=False)
    except (TypeError, ValueError):
        return json.dumps(str(value))


def _required(path: str, detail: str = "") -> Cause:
    return errors.required(path, f"Required value: {detail}" if detail else "Required value")


def go_repr(value: Any) -> str:
    """A bad value as upstream prints it in field errors (``%q``, ``%v`` or ``%#v``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        inner = ", ".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in sorted(value.items()))
        return "map[string]string{" + inner + "}"
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return "[]string{" + ", ".join(json.dumps(v) for v in value) + "}"
    return _show(value)


def _invalid(path: str, value: Any, detail: str) -> Cause:
    return Cause("FieldValueInvalid", f"Invalid value: {go_repr(value)}: {detail}", path)


def _forbidden(path: str, detail: str) -> Cause:
    return errors.forbidden_field(path, detail)


def _not_supported(path: str, value: Any, allowed: Iterable[str]) -> Cause:
    return errors.not_supported(path, value, list(allowed))


def _duplicate(path: str, value: Any, detail: str = "") -> Cause:
    msg = f"Duplicate value: {_show(value)}"
    return Cause("FieldValueDuplicate", f"{msg}: {detail}" if detail else msg, path)


def _not_found(path: str, value: Any) -> Cause:
    return Cause("FieldValueNotFound", f"Not found: {_show(value)}", path)


def _too_long(path: str, limit: int) -> Cause:
    return errors.too_long(path, "", limit)


def _join(path: str, child: str) -> str:
    return f"{path}.{child}" if path else child


def _d(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _l(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _s(v: Any) -> str:
    return v if isinstance(v, str) else ("" if v is None else str(v))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


IMMUTABLE = "field is immutable"


def _immutable(new: Any, old: Any, path: str) -> list[Cause]:
    if same_json(new, old) or _norm(new) == _norm(old):
        return []
    return [_invalid(path, new, IMMUTABLE)]


def _norm(v: Any) -> Any:
    """Drop unset values so that ``None``, missing, ``[]``, ``{}``, ``""``, ``False`` compare equal."""
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            nx = _norm(x)
            if nx is None:
                continue
            out[k] = nx
        return out or None
    if isinstance(v, list):
        return [_norm(x) for x in v] or None
    if v == "" or v is False:
        return None
    return v


def _nonnegative(obj: Mapping[str, Any], key: str, path: str) -> list[Cause]:
    v = obj.get(key)
    if v is None:
        return []
    if not _is_int(v) or v < 0:
        return [_invalid(_join(path, key), v, "must be greater than or equal to 0")]
    return []


# --------------------------------------------------------------------------- metadata

STANDARD_FINALIZERS = frozenset({"kubernetes", "orphan", "foregroundDeletion"})
TOTAL_ANNOTATION_SIZE_LIMIT = 256 * 1024
MAX_SECRET_SIZE = 1024 * 1024


def validate_labels(labels: Any, path: str) -> list[Cause]:
    out: list[Cause] = []
    for k, v in _d(labels).items():
        for msg in is_qualified_name(k):
            out.append(_invalid(path, k, msg))
        for msg in is_valid_label_value(_s(v)):
            out.append(_invalid(path, v, msg))
    return out


def validate_annotations(annotations: Any, path: str) -> list[Cause]:
    out: list[Cause] = []
    total = 0
    for k, v in _d(annotations).items():
        for msg in is_qualified_name(k.lower()):
            out.append(_invalid(path, k, msg))
        total += len(k.encode()) + len(_s(v).encode())
    if total > TOTAL_ANNOTATION_SIZE_LIMIT:
        out.append(_too_long(path, TOTAL_ANNOTATION_SIZE_LIMIT))
    return out


def _validate_owner_references(refs: Any, path: str) -> list[Cause]:
    out: list[Cause] = []
    controller: str | None = None
    for ref in _l(refs):
        ref = _d(ref)
        api_version = _s(ref.get("apiVersion"))
        version = api_version.rpartition("/")[2]
        if not version:
            out.append(_invalid(f"{path}.apiVersion", api_version, "version must not be empty"))
        if not ref.get("kind"):
            out.append(_invalid(f"{path}.kind", _s(ref.get("kind")), "kind must not be empty"))
        if not ref.get("name"):
            out.append(_invalid(f"{path}.name", _s(ref.get("name")), "name must not be empty"))
        if not ref.get("uid"):
            out.append(_invalid(f"{path}.uid", _s(ref.get("uid")), "uid must not be empty"))
        if ref.get("controller") is True:
            this = f"{_s(ref.get('kind'))}/{_s(ref.get('name'))}"
            if controller is not None:
                out.append(_invalid(
                    path, refs,
                    f'Only one reference can have Controller set to true. Found "true" in references '
                    f"for {controller} and {this}",
                ))
            else:
                controller = this
    return out


def _validate_finalizers(finalizers: Any, path: str) -> list[Cause]:
    out: list[Cause] = []
    items = [_s(f) for f in _l(finalizers)]
    for f in items:
        msgs = is_qualified_name(f)
        for msg in msgs:
            out.append(_invalid(path, f, msg))
        if not msgs and "/" not in f and f not in STANDARD_FINALIZERS:
            out.append(_invalid(path, f, "name is neither a standard finalizer name nor is it fully qualified"))
    if "orphan" in items and "foregroundDeletion" in items:
        out.append(_invalid(path, items, "finalizer orphan and foregroundDeletion cannot be both set"))
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
            out.append(_invalid(f"{path}.generateName", generate_name, msg))
    if not name:
        out.append(_required(f"{path}.name", "name or generateName is required"))
    elif old is None or name != prev.get("name"):
        for msg in name_fn(name, False):
            out.append(_invalid(f"{path}.name", name, msg))
    ns = _s(meta.get("namespace"))
    if namespaced:
        if not ns:
            out.append(_required(f"{path}.namespace"))
        elif old is None or ns != prev.get("namespace"):
            for msg in is_dns1123_label(ns):
                out.append(_invalid(f"{path}.namespace", ns, msg))
    elif ns:
        out.append(_forbidden(f"{path}.namespace", "not allowed on this type"))
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
            out.append(_invalid(f"{path}.{key}", _s(new.get(key)), IMMUTABLE))
    for key in ("uid", "creationTimestamp"):
        if new.get(key) and old.get(key) and new.get(key) != old.get(key):
            out.append(_invalid(f"{path}.{key}", new.get(key), IMMUTABLE))
    return out


# --------------------------------------------------------------------------- selectors

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
                out.append(_required(f"{p}.values", "must be specified when `operator` is 'In' or 'NotIn'"))
        elif op in ("Exists", "DoesNotExist"):
            if values:
                out.append(_forbidden(f"{p}.values", "may not be specified when `operator` is 'Exists' or 'DoesNotExist'"))
        else:
            out.append(_invalid(f"{p}.operator", op if op is not None else "", "not a valid selector operator"))
        for msg in is_qualified_name(_s(expr.get("key"))):
            out.append(_invalid(f"{p}.key", _s(expr.get("key")), msg))
        for j, v in enumerate(values):
            for msg in is_valid_label_value(_s(v)):
                out.append(_invalid(f"{p}.values[{j}]", v, msg))
    return out


def _validate_node_selector_requirement(req: Any, path: str, allow_fields: bool = False) -> list[Cause]:
    req = _d(req)
    out: list[Cause] = []
    op = req.get("operator")
    values = _l(req.get("values"))
    if op in ("In", "NotIn"):
        if not values:
            out.append(_required(f"{path}.values", "must be specified when `operator` is 'In' or 'NotIn'"))
    elif op in ("Exists", "DoesNotExist"):
        if values:
            out.append(_forbidden(f"{path}.values", "may not be specified when `operator` is 'Exists' or 'DoesNotExist'"))
    elif op in ("Gt", "Lt"):
        if len(values) != 1:
            out.append(_required(f"{path}.values", "must be specified single value when `operator` is 'Lt' or 'Gt'"))
    else:
        out.append(_invalid(f"{path}.operator", op if op is not None else "", "not a valid selector operator"))
    if not allow_fields:
        for msg in is_qualified_name(_s(req.get("key"))):
            out.append(_invalid(f"{path}.key", _s(req.get("key")), msg))
    return out


def validate_node_selector(sel: Any, path: str) -> list[Cause]:
    """A core NodeSelector (``nodeSelectorTerms``), as in required node affinity and PV node affinity."""
    sel = _d(sel)
    terms = _l(sel.get("nodeSelectorTerms"))
    out: list[Cause] = []
    if not terms:
        out.append(_required(f"{path}.nodeSelectorTerms", "must have at least one node selector term"))
    for i, term in enumerate(terms):
        term = _d(term)
        for j, req in enumerate(_l(term.get("matchExpressions"))):
            out += _validate_node_selector_requirement(req, f"{path}.nodeSelectorTerms[{i}].matchExpressions[{j}]")
        for j, req in enumerate(_l(term.get("matchFields"))):
            p = f"{path}.nodeSelectorTerms[{i}].matchFields[{j}]"
            out += _validate_node_selector_requirement(req, p, allow_fields=True)
            req = _d(req)
            if req.get("key") != "metadata.name":
                out.append(_invalid(f"{p}.key", _s(req.get("key")), "not a valid field selector key"))
    return out


# --------------------------------------------------------------------------- quantities

def _quantity(value: Any, path: str) -> tuple[Any, list[Cause]]:
    """Parse a quantity field; returns (Fraction | None, causes)."""
    try:
        q, _ = parse_quantity_with_format(value)
    except ValueError as e:
        return None, [_invalid(path, value, str(e))]
    return q, []


def _canonical(value: Any) -> str:
    try:
        q, fmt = parse_quantity_with_format(value)
    except ValueError:
        return _s(value)
    return format_quantity(q, fmt)


# --------------------------------------------------------------------------- pods

RESTART_POLICIES = ("Always", "OnFailure", "Never")
PROTOCOLS = ("SCTP", "TCP", "UDP")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
DNS_POLICIES = ("ClusterFirstWithHostNet", "ClusterFirst", "Default", "None")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
STANDARD_CONTAINER_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})
VOLUME_SOURCES = (
    "hostPath", "emptyDir", "gcePersistentDisk", "awsElasticBlockStore", "gitRepo", "secret", "nfs",
    "iscsi", "glusterfs", "persistentVolumeClaim", "rbd", "flexVolume", "cinder", "cephfs", "flocker",
    "downwardAPI", "fc", "azureFile", "configMap", "vsphereVolume", "quobyte", "azureDisk",
    "photonPersistentDisk", "projected", "portworxVolume", "scaleIO", "storageos", "csi", "ephemeral",
    "image",
)
POD_UPDATE_FORBIDDEN = (
    "pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` "
    "(only additions to existing tolerations),`spec.terminationGracePeriodSeconds` "
    "(allow it to be set to 1 if it was previously negative)"
)


def _overcommit_allowed(name: str) -> bool:
    """Native resources other than hugepages may have requests below limits."""
    native = "/" not in name or "kubernetes.io/" in name
    return native and not name.startswith("hugepages-")


def _validate_resource_requirements(res: Any, path: str, pod_claims: set[str]) -> list[Cause]:
    res = _d(res)
    out: list[Cause] = []
    lim_path, req_path = f"{path}.limits", f"{path}.requests"
    limits: dict[str, Any] = {}
    for name, value in _d(res.get("limits")).items():
        p = f"{lim_path}[{name}]"
        out += _validate_container_resource_name(name, p)
        q, errs = _quantity(value, p)
        out += errs
        if q is not None:
            if q < 0:
                out.append(_invalid(p, _canonical(value), "must be greater than or equal to 0"))
            limits[name] = (q, value)
    for name, value in _d(res.get("requests")).items():
        p = f"{req_path}[{name}]"
        out += _validate_container_resource_name(name, p)
        q, errs = _quantity(value, p)
        out += errs
        if q is None:
            continue
        if q < 0:
            out.append(_invalid(p, _canonical(value), "must be greater than or equal to 0"))
        if name in limits:
            lq, lraw = limits[name]
            if not _overcommit_allowed(name) and q != lq:
                out.append(_invalid(req_path, _canonical(value),
                                    f"must be equal to {name} limit of {_canonical(lraw)}"))
            elif q > lq:
                out.append(_invalid(req_path, _canonical(value),
                                    f"must be less than or equal to {name} limit of {_canonical(lraw)}"))
        elif not _overcommit_allowed(name):
            out.append(_required(lim_path, "Limit must be set for non overcommitable resources"))
    seen: set[str] = set()
    for i, claim in enumerate(_l(res.get("claims"))):
        claim = _d(claim)
        p = f"{path}.claims[{i}]"
        cname = _s(claim.get("name"))
        if not cname:
            out.append(_required(f"{p}.name"))
            continue
        key = cname + "/" + _s(claim.get("request"))
        if key in seen:
            out.append(_duplicate(f"{p}.name", cname))
        seen.add(key)
        if cname not in pod_claims:
            out.append(_not_found(p, cname))
    return out


def _validate_container_resource_name(name: str, path: str) -> list[Cause]:
    out = [_invalid(path, name, m) for m in is_qualified_name(name)]
    if out:
        return out
    if "/" not in name and name not in STANDARD_CONTAINER_RESOURCES and not name.startswith("hugepages-"):
        out.append(_invalid(path, name, "must be a standard resource for containers"))
    return out


def _validate_container_ports(ports: Any, path: str) -> list[Cause]:
    out: list[Cause] = []
    names: set[str] = set()
    for i, port in enumerate(_l(ports)):
        port = _d(port)
        p = f"{path}[{i}]"
        name = _s(port.get("name"))
        if name:
            msgs = is_valid_port_name(name)
            if msgs:
                out += [_invalid(f"{p}.name", name, m) for m in msgs]
            elif name in names:
                out.append(_duplicate(f"{p}.name", name))
            else:
                names.add(name)
        cp = port.get("containerPort")
        if not cp:
            out.append(_required(f"{p}.containerPort"))
        else:
            out += [_invalid(f"{p}.containerPort", cp, m) for m in is_valid_port_num(cp)]
        hp = port.get("hostPort")
        if hp:
            out += [_invalid(f"{p}.hostPort", hp, m) for m in is_valid_port_num(hp)]
        if "protocol" in port:
            proto = port.get("protocol")
            if not proto:
                out.append(_required(f"{p}.protocol"))
            elif proto not in PROTOCOLS:
                out.append(_not_supported(f"{p}.protocol", proto, PROTOCOLS))
    return out


def _validate_container(
    ctr: Any, path: str, names: set[str], volumes: set[str], pod_claims: set[str]
) -> list[Cause]:
    ctr = _d(ctr)
    out: list[Cause] = []
    name = _s(ctr.get("name"))
    if not name:
        out.append(_required(f"{path}.name"))
    else:
        out += [_invalid(f"{path}.name", name, m) for m in is_dns1123_label(name)]
        if name in names:
            out.append(_duplicate(f"{path}.name", name))
        names.add(name)
    image = _s(ctr.get("image"))
    if not image:
        out.append(_required(f"{path}.image"))
    elif image != image.strip():
        out.append(_invalid(f"{path}.image", image, "must not have leading or trailing whitespace"))
    if "imagePullPolicy" in ctr:
        pp = ctr.get("imagePullPolicy")
        if not pp:
            out.append(_required(f"{path}.imagePullPolicy"))
        elif pp not in PULL_POLICIES:
            out.append(_not_supported(f"{path}.imagePullPolicy", pp, PULL_POLICIES))
    out += _validate_container_ports(ctr.get("ports"), f"{path}.ports")
    for i, env in enumerate(_l(ctr.get("env"))):
        env_name = _s(_d(env).get("name"))
        if not env_name:
            out.append(_required(f"{path}.env[{i}].name"))
        elif "=" in env_name:
            out.append(_invalid(
                f"{path}.env[{i}].name", env_name,
                "a valid environment variable name must consist only of printable ASCII characters other than '='",
            ))
    mount_paths: set[str] = set()
    for i, mnt in enumerate(_l(ctr.get("volumeMounts"))):
        mnt = _d(mnt)
        p = f"{path}.volumeMounts[{i}]"
        mname = _s(mnt.get("name"))
        if not mname:
            out.append(_required(f"{p}.name"))
        if mname not in volumes:
            out.append(_not_found(f"{p}.name", mname))
        mpath = _s(mnt.get("mountPath"))
        if not mpath:
            out.append(_required(f"{p}.mountPath"))
        elif mpath in mount_paths:
            out.append(_invalid(f"{p}.mountPath", mpath, "must be unique"))
        mount_paths.add(mpath)
    out += _validate_resource_requirements(ctr.get("resources"), f"{path}.resources", pod_claims)
    return out


def _validate_volumes(vols: Any, path: str) -> tuple[list[Cause], set[str]]:
    out: list[Cause] = []
    names: set[str] = set()
    for i, vol in enumerate(_l(vols)):
        vol = _d(vol)
        p = f"{path}[{i}]"
        sources = [k for k in vol if k != "name" and vol[k] is not None]
        if not sources:
            out.append(_required(p, "must specify a volume type"))
        elif len(sources) > 1:
            out.append(_forbidden(f"{p}.{sources[1]}", "may not specify more than 1 volume type"))
        else:
            out += _validate_volume_source(sources[0], _d(vol[sources[0]]), f"{p}.{sources[0]}")
        name = _s(vol.get("name"))
        if not name:
            out.append(_required(f"{p}.name"))
        else:
            out += [_invalid(f"{p}.name", name, m) for m in is_dns1123_label(name)]
        if name in names:
            out.append(_duplicate(f"{p}.name", name))
        names.add(name)
    return out, names


_VOLUME_REQUIRED_FIELDS = {
    "persistentVolumeClaim": ("claimName",),
    "hostPath": ("path",),
    "secret": (),
    "nfs": ("server", "path"),
    "csi": ("driver",),
    "local": ("path",),
}


def _validate_volume_source(kind: str, src: dict[str, Any], path: str) -> list[Cause]:
    out: list[Cause] = []
    for key in _VOLUME_REQUIRED_FIELDS.get(kind, ()):
        if not src.get(key):
            out.append(_required(f"{path}.{key}"))
    if kind == "ephemeral" and not src.get("volumeClaimTemplate"):
        out.append(_required(f"{path}.volumeClaimTemplate"))
    return out


def _validate_tolerations(tols: Any, path: str) -> list[Cause]:
    out: list[Cause] = []
    for i, tol in enumerate(_l(tols)):
        tol = _d(tol)
        p = f"{path}[{i}]"
        key = _s(tol.get("key"))
        op = tol.get("operator") or ""
        value = _s(tol.get("value"))
        effect = tol.get("effect") or ""
        if key:
            out += [_invalid(f"{p}.key", key, m) for m in is_qualified_name(key)]
        if not key and op != "Exists":
            out.append(_invalid(
                f"{p}.operator", op,
                'operator must be Exists when `key` is empty, which means "match all values and all keys"',
            ))
        if tol.get("tolerationSeconds") is not None and effect != "NoExecute":
            out.append(_invalid(f"{p}.effect", effect, "effect must be 'NoExecute' when `tolerationSeconds` is set"))
        if op in ("Equal", ""):
            msgs = is_valid_label_value(value)
            if msgs:
                out.append(_invalid(f"{p}.operator", value, ";".join(msgs)))
        elif op == "Exists":
            if value:
                out.append(_invalid(f"{p}.operator", tol, "value must be empty when `operator` is 'Exists'"))
        else:
            out.append(_not_supported(f"{p}.operator", op, ("Equal", "Exists")))
        if effect and effect not in TAINT_EFFECTS:
            out.append(_not_supported(f"{p}.effect", effect, TAINT_EFFECTS))
    return out


def _validate_affinity(aff: Any, path: str) -> list[Cause]:
    aff = _d(aff)
    out: list[Cause] = []
    na = _d(aff.get("nodeAffinity"))
    if na.get("requiredDuringSchedulingIgnoredDuringExecution") is not None:
        out += validate_node_selector(
            na["requiredDuringSchedulingIgnoredDuringExecution"],
            f"{path}.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution",
        )
    for i, term in enumerate(_l(na.get("preferredDuringSchedulingIgnoredDuringExecution"))):
        term = _d(term)
        p = f"{path}.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[{i}]"
        w = term.get("weight")
        if not _is_int(w) or not 1 <= w <= 100:
            out.append(_invalid(f"{p}.weight", w, "must be in the range 1-100"))
        for j, req in enumerate(_l(_d(term.get("preference")).get("matchExpressions"))):
            out += _validate_node_selector_requirement(req, f"{p}.preference.matchExpressions[{j}]")
    for kind in ("podAffinity", "podAntiAffinity"):
        pa = _d(aff.get(kind))
        for i, term in enumerate(_l(pa.get("requiredDuringSchedulingIgnoredDuringExecution"))):
            out += _validate_pod_affinity_term(term, f"{path}.{kind}.requiredDuringSchedulingIgnoredDuringExecution[{i}]")
        for i, wt in enumerate(_l(pa.get("preferredDuringSchedulingIgnoredDuringExecution"))):
            wt = _d(wt)
            p = f"{path}.{kind}.preferredDuringSchedulingIgnoredDuringExecution[{i}]"
            w = wt.get("weight")
            if not _is_int(w) or not 1 <= w <= 100:
                out.append(_invalid(f"{p}.weight", w, "must be in the range 1-100"))
            out += _validate_pod_affinity_term(wt.get("podAffinityTerm"), f"{p}.podAffinityTerm")
    return out


def _validate_pod_affinity_term(term: Any, path: str) -> list[Cause]:
    term = _d(term)
    out = validate_label_selector(term.get("labelSelector"), f"{path}.labelSelector")
    out += validate_label_selector(term.get("namespaceSelector"), f"{path}.namespaceSelector")
    for i, ns in enumerate(_l(term.get("namespaces"))):
        out += [_invalid(f"{path}.namespaces[{i}]", ns, m) for m in is_dns1123_label(_s(ns))]
    tk = _s(term.get("topologyKey"))
    if not tk:
        out.append(_required(f"{path}.topologyKey", "can not be empty"))
    else:
        out += [_invalid(f"{path}.topologyKey", tk, m) for m in is_qualified_name(tk)]
    return out


def _validate_topology_spread(constraints: Any, path: str) -> list[Cause]:
    out: list[Cause] = []
    seen: set[tuple[str, str]] = set()
    for i, c in enumerate(_l(constraints)):
        c = _d(c)
        p = f"{path}[{i}]"
        skew = c.get("maxSkew")
        if not _is_int(skew) or skew <= 0:
            out.append(_invalid(f"{p}.maxSkew", skew, "must be greater than zero"))
        tk = _s(c.get("topologyKey"))
        if not tk:
            out.append(_required(f"{p}.topologyKey", "can not be empty"))
        else:
            out += [_invalid(f"{p}.topologyKey", tk, m) for m in is_qualified_name(tk)]
        wu = c.get("whenUnsatisfiable")
        if wu not in ("DoNotSchedule", "ScheduleAnyway"):
            out.append(_not_supported(f"{p}.whenUnsatisfiable", wu or "", ("DoNotSchedule", "ScheduleAnyway")))
        if (tk, _s(wu)) in seen:
            out.append(_duplicate(p, f"{{{tk}, {_s(wu)}}}"))
        seen.add((tk, _s(wu)))
        md = c.get("minDomains")
        if md is not None and (not _is_int(md) or md <= 0):
            out.append(_invalid(f"{p}.minDomains", md, "must be greater than zero"))
        out += validate_label_selector(c.get("labelSelector"), f"{p}.labelSelector")
    return out


def validate_unique_label_name(name: str, path: str, seen: set[str]) -> list[Cause]:
    """A required, DNS-label ``name`` unique among ``seen`` (which it joins):
    the check list entries such as claims, requests and devices share."""
    if not name:
        return [_required(path)]
    out = [_invalid(path, name, m) for m in is_dns1123_label(name)]
    if name in seen:
        out.append(_duplicate(path, name))
    seen.add(name)
    return out


#: the causes of a pod spec but its volumes, by (path, JSON of the spec without volumes, volume
#: names): pods created from one template share them even when each mounts its own claim
_pod_spec_memo: dict[tuple[str, bytes, frozenset[str]], tuple[Cause, ...]] = {}
_POD_SPEC_MEMO_SIZE = 1024
_POD_SPEC_MEMO_MAX_BYTES = 65536


def validate_pod_spec(spec: Any, path: str = "spec") -> list[Cause]:
    """Upstream ``ValidatePodSpec`` (the commonly used parts); a pure function of
    ``spec``. The volumes are validated every time; the rest depends on them only
    through their names, and its causes are memoized by its JSON text."""
    if not isinstance(spec, dict):
        return _validate_pod_spec(spec, path)
    out, volumes = _validate_volumes(spec.get("volumes"), f"{path}.volumes")
    rest = {k: v for k, v in spec.items() if k != "volumes"}
    try:
        text = orjson.dumps(rest)
    except TypeError:
        return out + _validate_pod_spec_rest(spec, path, volumes)
    if len(text) > _POD_SPEC_MEMO_MAX_BYTES:
        return out + _validate_pod_spec_rest(spec, path, volumes)
    key = (path, text, frozenset(volumes))
    hit = _pod_spec_memo.get(key)
    if hit is None:
        hit = tuple(_validate_pod_spec_rest(spec, path, volumes))
        if len(_pod_spec_memo) >= _POD_SPEC_MEMO_SIZE:
            del _pod_spec_memo[next(iter(_pod_spec_memo))]
        _pod_spec_memo[key] = hit
    return out + list(hit)


def _validate_pod_spec(spec: Any, path: str) -> list[Cause]:
    spec = _d(spec)
    out, volumes = _validate_volumes(spec.get("volumes"), f"{path}.volumes")
    return out + _validate_pod_spec_rest(spec, path, volumes)


def _validate_pod_spec_rest(spec: Any, path: str, volumes: set[str]) -> list[Cause]:
    """Everything but the volumes, which it sees through their names."""
    spec = _d(spec)
    out: list[Cause] = []
    pod_claims: set[str] = set()
    for i, rc in enumerate(_l(spec.get("resourceClaims"))):
        rc = _d(rc)
        p = f"{path}.resourceClaims[{i}]"
        name = _s(rc.get("name"))
        out += validate_unique_label_name(name, f"{p}.name", pod_claims)
        sources = [k for k in ("resourceClaimName", "resourceClaimTemplateName") if rc.get(k)]
        if not sources:
            out.append(_required(p, "must specify one of: `resourceClaimName`, `resourceClaimTemplateName`"))
        elif len(sources) > 1:
            out.append(_invalid(p, rc, "at most one of `resourceClaimName` or `resourceClaimTemplateName` may be specified"))

    containers = _l(spec.get("containers"))
    names: set[str] = set()
    if not containers:
        out.append(_required(f"{path}.containers"))
    for i, ctr in enumerate(containers):
        out += _validate_container(ctr, f"{path}.containers[{i}]", names, volumes, pod_claims)
    for i, ctr in enumerate(_l(spec.get("initContainers"))):
        out += _validate_container(ctr, f"{path}.initContainers[{i}]", names, volumes, pod_claims)

    if "restartPolicy" in spec:
        rp = spec.get("restartPolicy")
        if not rp:
            out.append(_required(f"{path}.restartPolicy"))
        elif rp not in RESTART_POLICIES:
            out.append(_not_supported(f"{path}.restartPolicy", rp, RESTART_POLICIES))
    if "dnsPolicy" in spec and spec.get("dnsPolicy"):
        if spec["dnsPolicy"] not in DNS_POLICIES:
            out.append(_not_supported(f"{path}.dnsPolicy", spec["dnsPolicy"], DNS_POLICIES))
    out += validate_labels(spec.get("nodeSelector"), f"{path}.nodeSelector")
    for key, fn in (("serviceAccountName", is_dns1123_subdomain), ("nodeName", is_dns1123_subdomain),
                    ("priorityClassName", is_dns1123_subdomain), ("hostname", is_dns1123_label),
                    ("subdomain", is_dns1123_label)):
        v = spec.get(key)
        if v:
            out += [_invalid(f"{path}.{key}", v, m) for m in fn(_s(v))]
    ads = spec.get("activeDeadlineSeconds")
    if ads is not None and (not _is_int(ads) or not 1 <= ads <= 2147483647):
        out.append(_invalid(f"{path}.activeDeadlineSeconds", ads, "must be between 1 and 2147483647, inclusive"))
    out += _validate_tolerations(spec.get("tolerations"), f"{path}.tolerations")
    out += _validate_affinity(spec.get("affinity"), f"{path}.affinity")
    out += _validate_topology_spread(spec.get("topologySpreadConstraints"), f"{path}.topologySpreadConstraints")
    gates: set[str] = set()
    for i, gate in enumerate(_l(spec.get("schedulingGates"))):
        gname = _s(_d(gate).get("name"))
        p = f"{path}.schedulingGates[{i}].name"
        out += [_invalid(p, gname, m) for m in is_qualified_name(gname)]
        if gname in gates:
            out.append(_duplicate(p, gname))
        gates.add(gname)
    if "priority" in spec and spec["priority"] is not None and not _is_int(spec["priority"]):
        out.append(_invalid(f"{path}.priority", spec["priority"], "must be an integer"))
    return out


def validate_pod_template(template: Any, path: str) -> list[Cause]:
    """A PodTemplateSpec: template labels/annotations and the pod spec under ``path.spec``."""
    template = _d(template)
    meta = _d(template.get("metadata"))
    out = validate_labels(meta.get("labels"), f"{path}.metadata.labels")
    out += validate_annotations(meta.get("annotations"), f"{path}.metadata.annotations")
    out += validate_pod_spec(template.get("spec"), f"{path}.spec")
    return out


def _validate_pod(obj: dict[str, Any]) -> list[Cause]:
    return validate_pod_spec(obj.get("spec"), "spec")


def _toleration_key(t: Any) -> Any:
    t = dict(_d(t))
    t.pop("tolerationSeconds", None)
    return _norm(t)


def _validate_pod_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    nspec, ospec = _d(new.get("spec")), _d(old.get("spec"))
    out: list[Cause] = []
    if same_json(nspec, ospec):
        # An unchanged spec (status and metadata updates): only the range check can fail.
        nads = nspec.get("activeDeadlineSeconds")
        if nads is not None and (not _is_int(nads) or not 0 <= nads <= 2147483647):
            return [_invalid("spec.activeDeadlineSeconds", nads, "must be between 0 and 2147483647, inclusive")]
        return out
    munged = orjson.loads(orjson.dumps(nspec))
    for key in ("containers", "initContainers"):
        ncs, ocs = _l(munged.get(key)), _l(ospec.get(key))
        if len(ncs) != len(ocs):
            return [_forbidden(f"spec.{key}", "pod updates may not add or remove containers")]
        for nc, oc in zip(ncs, ocs):
            if isinstance(nc, dict) and isinstance(oc, dict):
                nc["image"] = oc.get("image")
                if nc["image"] is None:
                    del nc["image"]
    nads, oads = nspec.get("activeDeadlineSeconds"), ospec.get("activeDeadlineSeconds")
    if nads is not None:
        if not _is_int(nads) or not 0 <= nads <= 2147483647:
            return out + [_invalid("spec.activeDeadlineSeconds", nads, "must be between 0 and 2147483647, inclusive")]
        if _is_int(oads) and oads < nads:
            return out + [_invalid("spec.activeDeadlineSeconds", nads, "must be less than or equal to previous value")]
    elif oads is not None:
        out.append(_invalid("spec.activeDeadlineSeconds", None, "must not update from a positive integer to nil value"))
    munged.pop("activeDeadlineSeconds", None)
    if oads is not None:
        munged["activeDeadlineSeconds"] = oads
    new_tols = [_toleration_key(t) for t in _l(nspec.get("tolerations"))]
    for t in _l(ospec.get("tolerations")):
        if _toleration_key(t) not in new_tols:
            return out + [_forbidden("spec.tolerations", "existing toleration can not be modified except its tolerationSeconds")]
    munged["tolerations"] = ospec.get("tolerations")
    old_gates = {_s(_d(g).get("name")) for g in _l(ospec.get("schedulingGates"))}
    for g in _l(nspec.get("schedulingGates")):
        gname = _s(_d(g).get("name"))
        if gname not in old_gates:
            out.append(_forbidden("spec.schedulingGates",
                                  f"only deletion is allowed, but found new scheduling gate '{gname}'"))
    munged["schedulingGates"] = ospec.get("schedulingGates")
    otg, ntg = ospec.get("terminationGracePeriodSeconds"), nspec.get("terminationGracePeriodSeconds")
    if _is_int(otg) and otg < 0 and ntg == 1:
        munged["terminationGracePeriodSeconds"] = otg
    if _norm(munged) != _norm(ospec):
        out.append(_forbidden("spec", POD_UPDATE_FORBIDDEN))
    return out


# --------------------------------------------------------------------------- workloads

def _validate_int_or_percent(v: Any, path: str) -> list[Cause]:
    if v is None:
        return []
    if isinstance(v, str):
        if not _PERCENT_RE.match(v):
            return [_invalid(path, v, regex_error(
                "a valid percent string must be a numeric string followed by an ending '%'", "[0-9]+%", "1%", "93%"))]
        if int(v[:-1]) > 100:
            return [_invalid(path, v, "must not be greater than 100%")]
        return []
    if not _is_int(v) or v < 0:
        return [_invalid(path, v, "must be greater than or equal to 0")]
    return []


def _int_or_percent_is_zero(v: Any) -> bool:
    if v is None:
        return False
    if isinstance(v, str):
        return v.rstrip("%") in ("0", "")
    return v == 0


def _validate_replicated_spec(obj: dict[str, Any], what: str) -> list[Cause]:
    from kubeplane.api.selectors import label_selector_from_dict

    spec = _d(obj.get("spec"))
    out: list[Cause] = []
    out += _nonnegative(spec, "replicas", "spec")
    out += _nonnegative(spec, "minReadySeconds", "spec")
    sel = spec.get("selector")
    if sel is None:
        out.append(_required("spec.selector"))
    else:
        sel_errs = validate_label_selector(sel, "spec.selector")
        out += sel_errs
        sel_d = _d(sel)
        if not sel_d.get("matchLabels") and not sel_d.get("matchExpressions"):
            out.append(_invalid("spec.selector", sel, f"empty selector is invalid for {what}"))
    template = spec.get("template")
    if template is None:
        out.append(_required("spec.template"))
        return out
    selector = None
    if sel is not None:
        try:
            selector = label_selector_from_dict(_d(sel))
        except errors.StatusError:
            out.append(_invalid("spec.selector", sel, "invalid label selector"))
    labels = _d(_d(_d(template).get("metadata")).get("labels"))
    if selector is not None and not selector.empty and not selector.matches(labels):
        out.append(_invalid("spec.template.metadata.labels", labels, "`selector` does not match template `labels`"))
    out += validate_pod_template(template, "spec.template")
    tspec = _d(_d(template).get("spec"))
    if "restartPolicy" in tspec and tspec["restartPolicy"] != "Always":
        out.append(_not_supported("spec.template.spec.restartPolicy", tspec["restartPolicy"], ("Always",)))
    if tspec.get("activeDeadlineSeconds") is not None:
        out.append(_forbidden("spec.template.spec.activeDeadlineSeconds",
                              "activeDeadlineSeconds in ReplicaSet is not Supported"))
    return out


def _validate_deployment(obj: dict[str, Any]) -> list[Cause]:
    out = _validate_replicated_spec(obj, "deployment")
    spec = _d(obj.get("spec"))
    out += _nonnegative(spec, "revisionHistoryLimit", "spec")
    pds = spec.get("progressDeadlineSeconds")
    if pds is not None:
        if not _is_int(pds) or pds < 0:
            out.append(_invalid("spec.progressDeadlineSeconds", pds, "must be greater than or equal to 0"))
        elif pds <= (spec.get("minReadySeconds") or 0):
            out.append(_invalid("spec.progressDeadlineSeconds", pds, "must be greater than minReadySeconds"))
    strategy = _d(spec.get("strategy"))
    stype = strategy.get("type")
    if stype == "Recreate":
        if strategy.get("rollingUpdate") is not None:
            out.append(_forbidden("spec.strategy.rollingUpdate", "may not be specified when strategy `type` is 'Recreate'"))
    elif stype in ("RollingUpdate", None):
        ru = _d(strategy.get("rollingUpdate"))
        mu, ms = ru.get("maxUnavailable"), ru.get("maxSurge")
        out += _validate_int_or_percent(mu, "spec.strategy.rollingUpdate.maxUnavailable")
        out += _validate_int_or_percent(ms, "spec.strategy.rollingUpdate.maxSurge")
        if _int_or_percent_is_zero(mu) and _int_or_percent_is_zero(ms):
            out.append(_invalid("spec.strategy.rollingUpdate.maxUnavailable", mu, "may not be 0 when `maxSurge` is 0"))
    else:
        out.append(_not_supported("spec.strategy.type", stype, ("Recreate", "RollingUpdate")))
    return out


def _validate_replicaset(obj: dict[str, Any]) -> list[Cause]:
    return _validate_replicated_spec(obj, "deployment")


def _selector_immutable(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    return _immutable(_d(new.get("spec")).get("selector"), _d(old.get("spec")).get("selector"), "spec.selector")


def _validate_job(obj: dict[str, Any]) -> list[Cause]:
    spec = _d(obj.get("spec"))
    out: list[Cause] = []
    for key in ("parallelism", "completions", "backoffLimit"):
        out += _nonnegative(spec, key, "spec")
    ads = spec.get("activeDeadlineSeconds")
    if ads is not None and (not _is_int(ads) or ads <= 0):
        out.append(_invalid("spec.activeDeadlineSeconds", ads, "must be greater than 0"))
    if spec.get("selector") is not None:
        out += validate_label_selector(spec["selector"], "spec.selector")
    template = spec.get("template")
    if template is None:
        out.append(_required("spec.template"))
        return out
    out += validate_pod_template(template, "spec.template")
    rp = _d(_d(template).get("spec")).get("restartPolicy")
    if rp not in ("OnFailure", "Never"):
        out.append(_not_supported("spec.template.spec.restartPolicy", rp or "", ("OnFailure", "Never")))
    return out


def _validate_job_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    ns, os_ = _d(new.get("spec")), _d(old.get("spec"))
    out = _immutable(ns.get("selector"), os_.get("selector"), "spec.selector")
    out += _immutable(ns.get("template"), os_.get("template"), "spec.template")
    out += _immutable(ns.get("completions"), os_.get("completions"), "spec.completions")
    return out


def _validate_pdb(obj: dict[str, Any]) -> list[Cause]:
    spec = _d(obj.get("spec"))
    out: list[Cause] = []
    if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
        out.append(_invalid("spec", spec, "minAvailable and maxUnavailable cannot be both set"))
    out += _validate_int_or_percent(spec.get("minAvailable"), "spec.minAvailable")
    out += _validate_int_or_percent(spec.get("maxUnavailable"), "spec.maxUnavailable")
    out += validate_label_selector(spec.get("selector"), "spec.selector")
    uhp = spec.get("unhealthyPodEvictionPolicy")
    if uhp is not None and uhp not in ("AlwaysAllow", "IfHealthyBudget"):
        out.append(_not_supported("spec.unhealthyPodEvictionPolicy", uhp, ("AlwaysAllow", "IfHealthyBudget")))
    return out


# --------------------------------------------------------------------------- core resources

SERVICE_TYPES = ("ClusterIP", "ExternalName", "LoadBalancer", "NodePort")


def _validate_service(obj: dict[str, Any]) -> list[Cause]:
    spec = _d(obj.get("spec"))
    out: list[Cause] = []
    stype = spec.get("type") or "ClusterIP"
    if stype not in SERVICE_TYPES:
        out.append(_not_supported("spec.type", stype, SERVICE_TYPES))
    headless = spec.get("clusterIP") == "None"
    ports = _l(spec.get("ports"))
    if not ports and not headless and stype != "ExternalName":
        out.append(_required("spec.ports"))
    if stype == "ExternalName":
        ext = _s(spec.get("externalName"))
        if not ext:
            out.append(_required("spec.externalName"))
        else:
            out += [_invalid("spec.externalName", ext, m) for m in is_dns1123_subdomain(ext.rstrip("."))]
    names: set[str] = set()
    seen: set[tuple[Any, Any]] = set()
    for i, port in enumerate(ports):
        port = _d(port)
        p = f"spec.ports[{i}]"
        name = _s(port.get("name"))
        if len(ports) > 1 and not name:
            out.append(_required(f"{p}.name"))
        elif name:
            out += [_invalid(f"{p}.name", name, m) for m in is_dns1123_label(name)]
            if name in names:
                out.append(_duplicate(f"{p}.name", name))
            names.add(name)
        out += [_invalid(f"{p}.port", port.get("port"), m) for m in is_valid_port_num(port.get("port"))]
        proto = port.get("protocol", "TCP")
        if not proto:
            out.append(_required(f"{p}.protocol"))
        elif proto not in PROTOCOLS:
            out.append(_not_supported(f"{p}.protocol", proto, PROTOCOLS))
        tp = port.get("targetPort")
        if isinstance(tp, str):
            out += [_invalid(f"{p}.targetPort", tp, m) for m in is_valid_port_name(tp)]
        elif tp is not None and tp != 0:
            out += [_invalid(f"{p}.targetPort", tp, m) for m in is_valid_port_num(tp)]
        if port.get("nodePort") and stype == "ClusterIP":
            out.append(_forbidden(f"{p}.nodePort", "may not be used when `type` is 'ClusterIP'"))
        key = (port.get("port"), proto)
        if key in seen:
            out.append(_duplicate(p, {"port": port.get("port"), "protocol": proto}))
        seen.add(key)
    out += validate_labels(spec.get("selector"), "spec.selector")
    sa = spec.get("sessionAffinity")
    if sa and sa not in ("ClientIP", "None"):
        out.append(_not_supported("spec.sessionAffinity", sa, ("ClientIP", "None")))
    return out


def _validate_service_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    ns, os_ = _d(new.get("spec")), _d(old.get("spec"))
    nip, oip = ns.get("clusterIP"), os_.get("clusterIP")
    if oip and nip and nip != oip and (ns.get("type") or "ClusterIP") != "ExternalName":
        return [_invalid("spec.clusterIPs[0]", nip, "may not change once set")]
    return []


def _validate_namespace(obj: dict[str, Any]) -> list[Cause]:
    out: list[Cause] = []
    for i, f in enumerate(_l(_d(obj.get("spec")).get("finalizers"))):
        f = _s(f)
        p = f"spec.finalizers[{i}]"
        msgs = is_qualified_name(f)
        out += [_invalid(p, f, m) for m in msgs]
        if not msgs and "/" not in f and f not in STANDARD_FINALIZERS:
            out.append(_invalid(p, f, "name is neither a standard finalizer name nor is it fully qualified"))
    return out


def _validate_node(obj: dict[str, Any]) -> list[Cause]:
    spec = _d(obj.get("spec"))
    out: list[Cause] = []
    seen: set[tuple[str, str]] = set()
    for i, taint in enumerate(_l(spec.get("taints"))):
        taint = _d(taint)
        p = f"spec.taints[{i}]"
        key = _s(taint.get("key"))
        out += [_invalid(f"{p}.key", key, m) for m in is_qualified_name(key)]
        value = _s(taint.get("value"))
        msgs = is_valid_label_value(value)
        if msgs:
            out.append(_invalid(f"{p}.value", value, ";".join(msgs)))
        effect = _s(taint.get("effect"))
        if not effect:
            out.append(_required(f"{p}.effect"))
        elif effect not in TAINT_EFFECTS:
            out.append(_not_supported(f"{p}.effect", effect, TAINT_EFFECTS))
        if (key, effect) in seen:
            out.append(_duplicate(p, taint, "taints must be unique by key and effect pair"))
            continue
        seen.add((key, effect))
    return out


def _validate_config_map(obj: dict[str, Any]) -> list[Cause]:
    out: list[Cause] = []
    data, binary = _d(obj.get("data")), _d(obj.get("binaryData"))
    total = 0
    for key, value in data.items():
        out += [_invalid(f"data[{key}]", key, m) for m in is_config_map_key(key)]
        total += len(_s(value).encode())
    for key, value in binary.items():
        out += [_invalid(f"binaryData[{key}]", key, m) for m in is_config_map_key(key)]
        if key in data:
            out.append(_invalid(f"binaryData[{key}]", key, "duplicate of key present in data"))
        total += _decoded_len(value)
    if total > MAX_SECRET_SIZE:
        out.append(_too_long("", MAX_SECRET_SIZE))
    return out


def _decoded_len(value: Any) -> int:
    s = _s(value)
    try:
        return len(base64.b64decode(s, validate=True))
    except (ValueError, TypeError):
        return len(s)


def _immutable_data_update(new: dict[str, Any], old: dict[str, Any], keys: tuple[str, ...]) -> list[Cause]:
    out: list[Cause] = []
    if old.get("immutable") is True:
        if new.get("immutable") is not True:
            out.append(_forbidden("immutable", "field is immutable when `immutable` is set"))
        for key in keys:
            if _norm(new.get(key)) != _norm(old.get(key)):
                out.append(_forbidden(key, "field is immutable when `immutable` is set"))
    return out


def _validate_config_map_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    return _immutable_data_update(new, old, ("data", "binaryData"))


_SECRET_REQUIRED_KEYS = {
    "kubernetes.io/dockercfg": (".dockercfg",),
    "kubernetes.io/dockerconfigjson": (".dockerconfigjson",),
    "kubernetes.io/ssh-auth": ("ssh-privatekey",),
    "kubernetes.io/tls": ("tls.crt", "tls.key"),
}


def _validate_secret(obj: dict[str, Any]) -> list[Cause]:
    out: list[Cause] = []
    data = dict(_d(obj.get("data")))
    for k, v in _d(obj.get("stringData")).items():
        data[k] = base64.b64encode(_s(v).encode()).decode()
    total = 0
    for key, value in data.items():
        out += [_invalid(f"data[{key}]", key, m) for m in is_config_map_key(key)]
        total += _decoded_len(value)
    if total > MAX_SECRET_SIZE:
        out.append(_too_long("data", MAX_SECRET_SIZE))
    stype = _s(obj.get("type"))
    for key in _SECRET_REQUIRED_KEYS.get(stype, ()):
        if key not in data:
            out.append(_required(f"data[{key}]"))
    if stype == "kubernetes.io/basic-auth" and "username" not in data and "password" not in data:
        out.append(_required("data[username]"))
        out.append(_required("data[password]"))
    if stype == "kubernetes.io/service-account-token":
        ann = _d(_d(obj.get("metadata")).get("annotations"))
        if not ann.get("kubernetes.io/service-account.name"):
            out.append(_required("metadata.annotations[kubernetes.io/service-account.name]"))
    return out


def _validate_secret_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    out = _immutable(new.get("type") or "Opaque", old.get("type") or "Opaque", "type")
    return out + _immutable_data_update(new, old, ("data",))


def _validate_event(obj: dict[str, Any]) -> list[Cause]:
    ns = _s(_d(obj.get("metadata")).get("namespace"))
    involved = _d(obj.get("involvedObject"))
    ins = _s(involved.get("namespace"))
    if not ins:
        if ns not in ("", "default"):
            return [_invalid("involvedObject.namespace", ins, "does not match event.namespace")]
    elif ns != ins:
        return [_invalid("involvedObject.namespace", ins, "does not match event.namespace")]
    return []


def _validate_lease(obj: dict[str, Any]) -> list[Cause]:
    spec = _d(obj.get("spec"))
    out: list[Cause] = []
    lds = spec.get("leaseDurationSeconds")
    if lds is not None and (not _is_int(lds) or lds <= 0):
        out.append(_invalid("spec.leaseDurationSeconds", lds, "must be greater than 0"))
    out += _nonnegative(spec, "leaseTransitions", "spec")
    return out


def _validate_priority_class(obj: dict[str, Any]) -> list[Cause]:
    out: list[Cause] = []
    name = _s(_d(obj.get("metadata")).get("name"))
    value = obj.get("value")
    system = {"system-node-critical": 2000001000, "system-cluster-critical": 2000000000}
    if not _is_int(value):
        out.append(_required("value"))
    if name.startswith("system-"):
        if system.get(name) != value:
            out.append(_forbidden("metadata.name", "priority class names with 'system-' prefix are reserved for system use only"))
    elif _is_int(value) and value > 1000000000:
        out.append(_forbidden("value", "maximum allowed value of a user defined priority is 1000000000"))
    pp = obj.get("preemptionPolicy")
    if pp is not None and pp not in ("Never", "PreemptLowerPriority"):
        out.append(_not_supported("preemptionPolicy", pp, ("Never", "PreemptLowerPriority")))
    return out


def _validate_priority_class_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    out: list[Cause] = []
    if new.get("value") != old.get("value"):
        out.append(_forbidden("value", "may not be changed in an update."))
    out += _immutable(new.get("preemptionPolicy"), old.get("preemptionPolicy"), "preemptionPolicy")
    return out


# --------------------------------------------------------------------------- storage

ACCESS_MODES = ("ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod")
PV_RECLAIM_POLICIES = ("Delete", "Recycle", "Retain")
PV_SOURCES = (
    "gcePersistentDisk", "awsElasticBlockStore", "hostPath", "glusterfs", "nfs", "rbd", "iscsi", "cinder",
    "cephfs", "fc", "flocker", "flexVolume", "azureFile", "vsphereVolume", "quobyte", "azureDisk",
    "photonPersistentDisk", "portworxVolume", "scaleIO", "local", "storageos", "csi",
)
PVC_UPDATE_FORBIDDEN = (
    "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims"
)


def _validate_access_modes(modes: Any, path: str, detail: str) -> list[Cause]:
    modes = _l(modes)
    out: list[Cause] = []
    if not modes:
        out.append(_required(path, detail))
    for m in modes:
        if m not in ACCESS_MODES:
            out.append(_not_supported(path, m, ACCESS_MODES))
    if "ReadWriteOncePod" in modes and len(modes) > 1:
        out.append(_forbidden(path, "may not use ReadWriteOncePod with other access modes"))
    return out


def validate_pvc_spec(spec: Any, path: str = "spec") -> list[Cause]:
    spec = _d(spec)
    out = _validate_access_modes(spec.get("accessModes"), f"{path}.accessModes", "at least 1 access mode is required")
    out += validate_label_selector(spec.get("selector"), f"{path}.selector")
    requests = _d(_d(spec.get("resources")).get("requests"))
    if "storage" not in requests:
        out.append(_required(f"{path}.resources[storage]"))
    else:
        p = f"{path}.resources.requests[storage]"
        q, errs = _quantity(requests["storage"], p)
        out += errs
        if q is not None and q <= 0:
            out.append(_invalid(p, _canonical(requests["storage"]), "must be greater than zero"))
    scn = spec.get("storageClassName")
    if scn:
        out += [_invalid(f"{path}.storageClassName", scn, m) for m in is_dns1123_subdomain(_s(scn))]
    vm = spec.get("volumeMode")
    if vm is not None and vm not in ("Block", "Filesystem"):
        out.append(_not_supported(f"{path}.volumeMode", vm, ("Block", "Filesystem")))
    return out


def _validate_pvc(obj: dict[str, Any]) -> list[Cause]:
    return validate_pvc_spec(obj.get("spec"))


def _validate_pvc_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    ns, os_ = _d(new.get("spec")), _d(old.get("spec"))
    out: list[Cause] = []
    if same_json(ns, os_):
        return out
    munged = orjson.loads(orjson.dumps(ns))
    bound = _d(old.get("status")).get("phase") == "Bound"
    if not os_.get("volumeName"):
        munged["volumeName"] = os_.get("volumeName")
    if bound:
        new_req = _d(_d(ns.get("resources")).get("requests"))
        old_req = _d(_d(os_.get("resources")).get("requests"))
        try:
            if "storage" in new_req and "storage" in old_req:
                nq, _ = parse_quantity_with_format(new_req["storage"])
                oq, _ = parse_quantity_with_format(old_req["storage"])
                if nq < oq:
                    cap = _d(_d(old.get("status")).get("capacity")).get("storage")
                    if cap is None or nq <= parse_quantity_with_format(cap)[0]:
                        out.append(_forbidden("spec.resources.requests.storage",
                                              "field can not be less than status.capacity"
                                              if cap is not None else "field can not be less than previous value"))
        except ValueError:
            pass
        munged.setdefault("resources", {})
        if isinstance(munged["resources"], dict):
            munged["resources"]["requests"] = _d(os_.get("resources")).get("requests")
        munged["volumeAttributesClassName"] = os_.get("volumeAttributesClassName")
    if _norm(munged) != _norm(os_):
        out.append(_forbidden("spec", PVC_UPDATE_FORBIDDEN))
    return out


def _validate_pv(obj: dict[str, Any]) -> list[Cause]:
    spec = _d(obj.get("spec"))
    out = _validate_access_modes(spec.get("accessModes"), "spec.accessModes", "")
    capacity = _d(spec.get("capacity"))
    if not capacity:
        out.append(_required("spec.capacity"))
    if "storage" not in capacity or len(capacity) > 1:
        out.append(_not_supported("spec.capacity", capacity, ("storage",)))
    for name, value in capacity.items():
        p = f"spec.capacity[{name}]"
        q, errs = _quantity(value, p)
        out += errs
        if q is not None and q <= 0:
            out.append(_invalid(p, _canonical(value), "must be greater than zero"))
    rp = spec.get("persistentVolumeReclaimPolicy")
    if rp and rp not in PV_RECLAIM_POLICIES:
        out.append(_not_supported("spec.persistentVolumeReclaimPolicy", rp, PV_RECLAIM_POLICIES))
    sources = [k for k in PV_SOURCES if spec.get(k) is not None]
    if not sources:
        out.append(_required("spec", "must specify a volume type"))
    for extra in sources[1:]:
        out.append(_forbidden(f"spec.{extra}", "may not specify more than 1 volume type"))
    if sources:
        src = sources[0]
        out += _validate_volume_source(src, _d(spec.get(src)), f"spec.{src}")
        if src == "csi" and not _d(spec.get("csi")).get("volumeHandle"):
            out.append(_required("spec.csi.volumeHandle"))
    if "local" in sources and not _d(_d(spec.get("nodeAffinity")).get("required")):
        out.append(_required("spec.nodeAffinity", "Local volume requires node affinity"))
    na = _d(spec.get("nodeAffinity"))
    if na.get("required") is not None:
        out += validate_node_selector(na["required"], "spec.nodeAffinity.required")
    vm = spec.get("volumeMode")
    if vm is not None and vm not in ("Block", "Filesystem"):
        out.append(_not_supported("spec.volumeMode", vm, ("Block", "Filesystem")))
    scn = spec.get("storageClassName")
    if scn:
        out += [_invalid("spec.storageClassName", scn, m) for m in is_dns1123_subdomain(_s(scn))]
    return out


def _validate_pv_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    ns, os_ = _d(new.get("spec")), _d(old.get("spec"))
    out: list[Cause] = []
    nsrc = {k: ns.get(k) for k in PV_SOURCES if ns.get(k) is not None}
    osrc = {k: os_.get(k) for k in PV_SOURCES if os_.get(k) is not None}
    if _norm(nsrc) != _norm(osrc):
        out.append(_forbidden("spec.persistentvolumesource", "spec.persistentvolumesource is immutable after creation"))
    out += _immutable(ns.get("volumeMode"), os_.get("volumeMode"), "volumeMode")
    if os_.get("nodeAffinity") is not None:
        out += _immutable(ns.get("nodeAffinity"), os_.get("nodeAffinity"), "nodeAffinity")
    return out


def _validate_storage_class(obj: dict[str, Any]) -> list[Cause]:
    out: list[Cause] = []
    prov = _s(obj.get("provisioner"))
    if not prov:
        out.append(_required("provisioner"))
    else:
        out += [_invalid("provisioner", prov, m) for m in is_qualified_name(prov.lower())]
    params = _d(obj.get("parameters"))
    total = 0
    for k, v in params.items():
        if not k:
            out.append(_invalid("parameters", k, "field can not be empty."))
        total += len(k) + len(_s(v))
    if total > TOTAL_ANNOTATION_SIZE_LIMIT:
        out.append(_too_long("parameters", TOTAL_ANNOTATION_SIZE_LIMIT))
    rp = obj.get("reclaimPolicy")
    if rp and rp not in ("Delete", "Retain"):
        out.append(_not_supported("reclaimPolicy", rp, ("Delete", "Retain")))
    vbm = obj.get("volumeBindingMode")
    if vbm is not None and vbm not in ("Immediate", "WaitForFirstConsumer"):
        out.append(_not_supported("volumeBindingMode", vbm, ("Immediate", "WaitForFirstConsumer")))
    for i, term in enumerate(_l(obj.get("allowedTopologies"))):
        exprs = _l(_d(term).get("matchLabelExpressions"))
        if not exprs:
            out.append(_required(f"allowedTopologies[{i}].matchLabelExpressions", "must have at least one label expression"))
        for j, e in enumerate(exprs):
            e = _d(e)
            p = f"allowedTopologies[{i}].matchLabelExpressions[{j}]"
            out += [_invalid(f"{p}.key", _s(e.get("key")), m) for m in is_qualified_name(_s(e.get("key")))]
            if not _l(e.get("values")):
                out.append(_required(f"{p}.values", "must specify as least one value"))
    return out


def _validate_storage_class_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    out: list[Cause] = []
    if _norm(new.get("parameters")) != _norm(old.get("parameters")):
        out.append(_forbidden("parameters", "updates to parameters are forbidden."))
    if _s(new.get("provisioner")) != _s(old.get("provisioner")):
        out.append(_forbidden("provisioner", "updates to provisioner are forbidden."))
    if (new.get("reclaimPolicy") or "Delete") != (old.get("reclaimPolicy") or "Delete"):
        out.append(_forbidden("reclaimPolicy", "updates to reclaimPolicy are forbidden."))
    out += _immutable(new.get("volumeBindingMode") or "Immediate", old.get("volumeBindingMode") or "Immediate",
                      "volumeBindingMode")
    return out


def _validate_csi_node(obj: dict[str, Any]) -> list[Cause]:
    out: list[Cause] = []
    names: set[str] = set()
    for i, drv in enumerate(_l(_d(obj.get("spec")).get("drivers"))):
        drv = _d(drv)
        p = f"spec.drivers[{i}]"
        name = _s(drv.get("name"))
        if not name:
            out.append(_required(f"{p}.name"))
        elif name in names:
            out.append(_duplicate(f"{p}.name", name))
        names.add(name)
        if not drv.get("nodeID"):
            out.append(_required(f"{p}.nodeID"))
    return out


def _validate_csi_storage_capacity(obj: dict[str, Any]) -> list[Cause]:
    out: list[Cause] = []
    scn = _s(obj.get("storageClassName"))
    if not scn:
        out.append(_required("storageClassName"))
    else:
        out += [_invalid("storageClassName", scn, m) for m in is_dns1123_subdomain(scn)]
    for key in ("capacity", "maximumVolumeSize"):
        if obj.get(key) is not None:
            q, errs = _quantity(obj[key], key)
            out += errs
            if q is not None and q < 0:
                out.append(_invalid(key, _canonical(obj[key]), "must be greater than or equal to 0"))
    if obj.get("nodeTopology") is not None:
        out += validate_label_selector(obj["nodeTopology"], "nodeTopology")
    return out


# --------------------------------------------------------------------------- dynamic resource allocation

ALLOCATION_MODES = ("All", "ExactCount")


def _validate_device_selectors(selectors: Any, path: str) -> list[Cause]:
    out: list[Cause] = []
    for i, sel in enumerate(_l(selectors)):
        sel = _d(sel)
        p = f"{path}[{i}]"
        if sel.get("cel") is None:
            out.append(_required(f"{p}.cel"))
        elif not _s(_d(sel["cel"]).get("expression")):
            out.append(_required(f"{p}.cel.expression"))
    return out


def _validate_exact_request(req: Any, path: str) -> list[Cause]:
    req = _d(req)
    out: list[Cause] = []
    dcn = _s(req.get("deviceClassName"))
    if not dcn:
        out.append(_required(f"{path}.deviceClassName"))
    else:
        out += [_invalid(f"{path}.deviceClassName", dcn, m) for m in is_dns1123_subdomain(dcn)]
    out += _validate_device_selectors(req.get("selectors"), f"{path}.selectors")
    mode = req.get("allocationMode") or "ExactCount"
    count = req.get("count")
    if mode == "ExactCount":
        if count is not None and (not _is_int(count) or count <= 0):
            out.append(_invalid(f"{path}.count", count, "must be greater than zero"))
    elif mode == "All":
        if count:
            out.append(_invalid(f"{path}.count", count, "must not be specified when allocationMode is 'All'"))
    else:
        out.append(_not_supported(f"{path}.allocationMode", mode, ALLOCATION_MODES))
    out += _validate_tolerations(req.get("tolerations"), f"{path}.tolerations")
    return out


def validate_device_claim_spec(spec: Any, path: str = "spec") -> list[Cause]:
    """ResourceClaimSpec (``devices.requests``, ``constraints``, ``config``)."""
    devices = _d(_d(spec).get("devices"))
    dpath = f"{path}.devices"
    out: list[Cause] = []
    names: set[str] = set()
    refs: set[str] = set()
    for i, req in enumerate(_l(devices.get("requests"))):
        req = _d(req)
        p = f"{dpath}.requests[{i}]"
        name = _s(req.get("name"))
        out += validate_unique_label_name(name, f"{p}.name", names)
        if name:
            refs.add(name)
        first = _l(req.get("firstAvailable"))
        exactly = req.get("exactly")
        kinds = int(bool(first)) + int(exactly is not None)
        if kinds == 0:
            out.append(_required(p, "exactly one of `exactly` or `firstAvailable` is required"))
        elif kinds > 1:
            out.append(_invalid(p, None, "exactly one of `exactly` or `firstAvailable` is required, but multiple fields are set"))
        if exactly is not None:
            out += _validate_exact_request(exactly, f"{p}.exactly")
        sub_names: set[str] = set()
        for j, sub in enumerate(first):
            sub = _d(sub)
            sp = f"{p}.firstAvailable[{j}]"
            sname = _s(sub.get("name"))
            if not sname:
                out.append(_required(f"{sp}.name"))
            else:
                out += [_invalid(f"{sp}.name", sname, m) for m in is_dns1123_label(sname)]
                if sname in sub_names:
                    out.append(_duplicate(f"{sp}.name", sname))
                sub_names.add(sname)
                refs.add(f"{name}/{sname}")
            out += _validate_exact_request(sub, sp)
    ref_msg = "must be the name of a request in the claim or the name of a request and a subrequest separated by '/'"
    for i, c in enumerate(_l(devices.get("constraints"))):
        for j, r in enumerate(_l(_d(c).get("requests"))):
            if r not in refs:
                out.append(_invalid(f"{dpath}.constraints[{i}].requests[{j}]", r, ref_msg))
    for i, c in enumerate(_l(devices.get("config"))):
        c = _d(c)
        for j, r in enumerate(_l(c.get("requests"))):
            if r not in refs:
                out.append(_invalid(f"{dpath}.config[{i}].requests[{j}]", r, ref_msg))
        if c.get("opaque") is None:
            out.append(_required(f"{dpath}.config[{i}].opaque"))
        else:
            opaque = _d(c["opaque"])
            if not opaque.get("driver"):
                out.append(_required(f"{dpath}.config[{i}].opaque.driver"))
            if opaque.get("parameters") is None:
                out.append(_required(f"{dpath}.config[{i}].opaque.parameters"))
    return out


def _validate_resource_claim(obj: dict[str, Any]) -> list[Cause]:
    return validate_device_claim_spec(obj.get("spec"), "spec")


def _validate_resource_claim_template(obj: dict[str, Any]) -> list[Cause]:
    spec = _d(obj.get("spec"))
    meta = _d(spec.get("metadata"))
    out = validate_labels(meta.get("labels"), "spec.metadata.labels")
    out += validate_annotations(meta.get("annotations"), "spec.metadata.annotations")
    return out + validate_device_claim_spec(spec.get("spec"), "spec.spec")


def _spec_immutable(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    return _immutable(new.get("spec"), old.get("spec"), "spec")


def _validate_device_class(obj: dict[str, Any]) -> list[Cause]:
    spec = _d(obj.get("spec"))
    out = _validate_device_selectors(spec.get("selectors"), "spec.selectors")
    for i, c in enumerate(_l(spec.get("config"))):
        opaque = _d(c).get("opaque")
        if opaque is None:
            out.append(_required(f"spec.config[{i}].opaque"))
        elif not _d(opaque).get("driver"):
            out.append(_required(f"spec.config[{i}].opaque.driver"))
    return out


NODE_SELECTION_FIELDS = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")


def _validate_resource_slice(obj: dict[str, Any]) -> list[Cause]:
    spec = _d(obj.get("spec"))
    out: list[Cause] = []
    driver = _s(spec.get("driver"))
    if not driver:
        out.append(_required("spec.driver"))
    else:
        out += [_invalid("spec.driver", driver, m) for m in is_dns1123_subdomain(driver)]
    pool = spec.get("pool")
    if pool is None:
        out.append(_required("spec.pool"))
    else:
        pool = _d(pool)
        if not pool.get("name"):
            out.append(_required("spec.pool.name"))
        rsc = pool.get("resourceSliceCount")
        if not _is_int(rsc) or rsc <= 0:
            out.append(_invalid("spec.pool.resourceSliceCount", rsc, "must be greater than zero"))
        out += _nonnegative(pool, "generation", "spec.pool")
    set_fields = [f for f in NODE_SELECTION_FIELDS if spec.get(f) not in (None, False, "")]
    msg = "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"
    if not set_fields:
        out.append(_required("spec", msg))
    elif len(set_fields) > 1:
        out.append(_invalid("spec", "{`" + "`, `".join(set_fields) + "`}", msg + ", but multiple fields are set"))
    if spec.get("nodeName"):
        out += [_invalid("spec.nodeName", spec["nodeName"], m) for m in is_dns1123_subdomain(_s(spec["nodeName"]))]
    if spec.get("nodeSelector") is not None:
        out += validate_node_selector(spec["nodeSelector"], "spec.nodeSelector")
    names: set[str] = set()
    for i, dev in enumerate(_l(spec.get("devices"))):
        dev = _d(dev)
        p = f"spec.devices[{i}]"
        name = _s(dev.get("name"))
        out += validate_unique_label_name(name, f"{p}.name", names)
        for cname, value in _d(dev.get("capacity")).items():
            cp = f"{p}.capacity[{cname}].value"
            _, errs = _quantity(_d(value).get("value"), cp)
            out += errs
    return out


def _validate_resource_slice_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    ns, os_ = _d(new.get("spec")), _d(old.get("spec"))
    out = _immutable(ns.get("nodeName"), os_.get("nodeName"), "spec.nodeName")
    out += _immutable(ns.get("driver"), os_.get("driver"), "spec.driver")
    out += _immutable(_d(ns.get("pool")).get("name"), _d(os_.get("pool")).get("name"), "spec.pool.name")
    return out


# --------------------------------------------------------------------------- registry

Check = Callable[[dict[str, Any]], list[Cause]]
UpdateCheck = Callable[[dict[str, Any], dict[str, Any]], list[Cause]]
ExtraValidator = Callable[["ResourceInfo", dict[str, Any], "dict[str, Any] | None"], list[Cause]]

# Keyed by ResourceInfo.qualified (``pods``, ``deployments.apps``, ...):
# (name rule, checks on every write, extra checks on update).
VALIDATORS: dict[str, tuple[NameFn, Check | None, UpdateCheck | None]] = {
    "namespaces": (name_is_dns_label, _validate_namespace, None),
    "nodes": (name_is_dns_subdomain, _validate_node, None),
    "pods": (name_is_dns_subdomain, _validate_pod, _validate_pod_update),
    "persistentvolumes": (name_is_dns_subdomain, _validate_pv, _validate_pv_update),
    "persistentvolumeclaims": (name_is_dns_subdomain, _validate_pvc, _validate_pvc_update),
    "events": (name_is_dns_subdomain, _validate_event, None),
    "configmaps": (name_is_dns_subdomain, _validate_config_map, _validate_config_map_update),
    "secrets": (name_is_dns_subdomain, _validate_secret, _validate_secret_update),
    "services": (name_is_dns1035_label, _validate_service, _validate_service_update),
    "storageclasses.storage.k8s.io": (name_is_dns_subdomain, _validate_storage_class, _validate_storage_class_update),
    "csinodes.storage.k8s.io": (name_is_dns_subdomain, _validate_csi_node, None),
    "csistoragecapacities.storage.k8s.io": (name_is_dns_subdomain, _validate_csi_storage_capacity, None),
    "leases.coordination.k8s.io": (name_is_dns_subdomain, _validate_lease, None),
    "deployments.apps": (name_is_dns_subdomain, _validate_deployment, _selector_immutable),
    "replicasets.apps": (name_is_dns_subdomain, _validate_replicaset, _selector_immutable),
    "jobs.batch": (name_is_dns_subdomain, _validate_job, _validate_job_update),
    "poddisruptionbudgets.policy": (name_is_dns_subdomain, _validate_pdb, None),
    "priorityclasses.scheduling.k8s.io": (name_is_dns_subdomain, _validate_priority_class, _validate_priority_class_update),
    "deviceclasses.resource.k8s.io": (name_is_dns_subdomain, _validate_device_class, None),
    "resourceslices.resource.k8s.io": (name_is_dns_subdomain, _validate_resource_slice, _validate_resource_slice_update),
    "resourceclaims.resource.k8s.io": (name_is_dns_subdomain, _validate_resource_claim, _spec_immutable),
    "resourceclaimtemplates.resource.k8s.io": (name_is_dns_subdomain, _validate_resource_claim_template, _spec_immutable),
}

# Kinds whose every-write check reads nothing but ``spec``: an update that
# leaves the spec as stored (a status or metadata update) passes it as the
# stored object did.
SPEC_ONLY_CHECKS = frozenset({
    "pods", "nodes", "persistentvolumes", "persistentvolumeclaims", "resourceclaims.resource.k8s.io",
})

# Hook for checks owned elsewhere (e.g. CEL compilation of DRA selectors):
# qualified resource name → callables run after the built-in checks.
extra_validators: dict[str, list[ExtraValidator]] = {}


def register_extra_validator(qualified: str, fn: ExtraValidator) -> None:
    """Add ``fn(res, obj, old)`` to the checks of resource ``qualified`` (e.g. ``deviceclasses.resource.k8s.io``)."""
    extra_validators.setdefault(qualified, []).append(fn)


def validate_object(res: "ResourceInfo", obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[Cause]:
    """All validation errors of ``obj`` (a create when ``old`` is None, else an update)."""
    name_fn, check, update_check = VALIDATORS.get(res.qualified, (name_is_dns_subdomain, None, None))
    meta = obj.get("metadata")
    old_meta = None if old is None else _d(old.get("metadata"))
    out = validate_object_meta(meta, res.namespaced, name_fn, old=old_meta)
    if old is not None:
        out += validate_object_meta_update(meta, old_meta)
    if check is not None and not (old is not None and res.qualified in SPEC_ONLY_CHECKS
                                  and same_json(obj.get("spec"), old.get("spec"))):
        out += check(obj)
    if old is not None and update_check is not None:
        out += update_check(obj, old)
    for fn in extra_validators.get(res.qualified, ()):
        out += fn(res, obj, old)
    return out


__all__ = [
    "ExtraValidator",
    "VALIDATORS",
    "extra_validators",
    "go_repr",
    "is_config_map_key",
    "is_dns1035_label",
    "is_dns1123_label",
    "is_dns1123_subdomain",
    "is_qualified_name",
    "is_valid_label_value",
    "is_valid_port_name",
    "is_valid_port_num",
    "name_is_dns1035_label",
    "name_is_dns_label",
    "name_is_dns_subdomain",
    "register_extra_validator",
    "validate_annotations",
    "validate_device_claim_spec",
    "validate_label_selector",
    "validate_labels",
    "validate_node_selector",
    "validate_object",
    "validate_object_meta",
    "validate_object_meta_update",
    "validate_pod_spec",
    "validate_pod_template",
    "validate_pvc_spec",
]
