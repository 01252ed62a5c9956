"""Validation of the core group's namespace policy kinds: ResourceQuotas and
LimitRanges (upstream's ValidateResourceQuota and ValidateLimitRange)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from kubeplane.api.errors import Cause, duplicate, forbidden_field, invalid_value, required
from kubeplane.api.quantity import format_quantity, parse_quantity_with_format
from kubeplane.api.quota import INTEGER_RESOURCES, SCOPES, STANDARD_QUOTA_RESOURCES
from kubeplane.api.strings import is_qualified_name
from kubeplane.api.validation.common import _d, _l, _s

#: resource names usable without a domain (upstream's standard resources)
STANDARD_RESOURCES = frozenset(STANDARD_QUOTA_RESOURCES | {"storage"})
STANDARD_CONTAINER_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})
LIMIT_TYPES = ("Pod", "Container", "PersistentVolumeClaim")
#: the scope pairs a quota may not hold both of
CONFLICTING_SCOPES = (("BestEffort", "NotBestEffort"), ("Terminating", "NotTerminating"))
_POD_COUNT = frozenset({"pods"})
_POD_COMPUTE = frozenset({"cpu", "memory", "limits.cpu", "limits.memory", "requests.cpu", "requests.memory"})
_PVC_RESOURCES = frozenset({"persistentvolumeclaims", "requests.storage"})
EXISTS_ONLY_SCOPES = frozenset({"BestEffort", "NotBestEffort", "Terminating", "NotTerminating",
                                "CrossNamespacePodAffinity"})


def _quota_hugepages(name: str) -> bool:
    return name.startswith("hugepages-") or name.startswith("requests.hugepages-")


def _is_native(name: str) -> bool:
    return "/" not in name or "kubernetes.io/" in name


def _is_extended(name: str) -> bool:
    if _is_native(name) or name.startswith("requests."):
        return False
    return not is_qualified_name("requests." + name)


def scope_valid_for(scope: str, name: str) -> bool:
    """upstream's IsResourceQuotaScopeValidForResource."""
    if scope in ("Terminating", "NotTerminating", "NotBestEffort", "PriorityClass", "CrossNamespacePodAffinity"):
        return name in _POD_COUNT or name in _POD_COMPUTE
    if scope == "BestEffort":
        return name in _POD_COUNT
    if scope == "VolumeAttributesClass":
        return name in _PVC_RESOURCES
    return True


def _quantity_text(value: Any) -> str:
    v, fmt = parse_quantity_with_format(value)
    return format_quantity(v, fmt)


def _invalid_quantity(path: str, value: Any, detail: str) -> Cause:
    """A quantity printed as upstream prints a Quantity value (its String(), unquoted)."""
    return Cause("FieldValueInvalid", f"Invalid value: {_quantity_text(value)}: {detail}", path)


def _resource_name(name: str, path: str) -> list[Cause]:
    out = [invalid_value(path, name, m) for m in is_qualified_name(name)]
    if out:
        return out
    if "/" not in name and name not in STANDARD_RESOURCES and not _quota_hugepages(name):
        out.append(invalid_value(path, name, "must be a standard resource type or fully qualified"))
    return out


def _quota_resource_name(name: str, path: str) -> list[Cause]:
    out = _resource_name(name, path)
    if "/" not in name and name not in STANDARD_QUOTA_RESOURCES and not _quota_hugepages(name):
        out.append(invalid_value(path, name, "must be a standard resource for quota"))
    return out


def _container_resource_name(name: str, path: str) -> list[Cause]:
    out = _resource_name(name, path)
    if "/" not in name:
        if name not in STANDARD_CONTAINER_RESOURCES and not name.startswith("hugepages-"):
            out.append(invalid_value(path, name, "must be a standard resource for containers"))
    elif not _is_native(name) and not _is_extended(name):
        out.append(invalid_value(path, name, "doesn't follow extended resource name standard"))
    return out


def _parse(value: Any, path: str) -> tuple[Fraction | None, list[Cause]]:
    try:
        return parse_quantity_with_format(value)[0], []
    except (TypeError, ValueError) as err:
        return None, [invalid_value(path, value, str(err))]


def _quantity_value(name: str, value: Any, path: str) -> list[Cause]:
    v, out = _parse(value, path)
    if v is None:
        return out
    if v < 0:
        out.append(invalid_value(path, _quantity_text(value), "must be greater than or equal to 0"))
    if (name in INTEGER_RESOURCES or _is_extended(name)) and (v * 1000).__ceil__() % 1000 != 0:
        out.append(_invalid_quantity(path, value, "must be an integer"))
    return out


def _resource_map(raw: Any, path: str) -> list[Cause]:
    out: list[Cause] = []
    for name, value in _d(raw).items():
        p = f"{path}[{name}]"
        out += _quota_resource_name(name, p)
        out += _quantity_value(name, value, p)
    return out


def _scope_list(spec: dict[str, Any]) -> list[str]:
    return [_s(s) for s in _l(spec.get("scopes"))]


def _validate_scopes(spec: dict[str, Any]) -> list[Cause]:
    scopes = _scope_list(spec)
    if not scopes:
        return []
    out: list[Cause] = []
    hard = sorted(_d(spec.get("hard")))
    for scope in scopes:
        if scope not in SCOPES:
            out.append(invalid_value("spec.scopes", scopes, "unsupported scope"))
        for name in hard:
            if name in STANDARD_QUOTA_RESOURCES and not scope_valid_for(scope, name):
                out.append(invalid_value("spec.scopes", scopes, "unsupported scope applied to resource"))
    for a, b in CONFLICTING_SCOPES:
        if a in scopes and b in scopes:
            out.append(invalid_value("spec.scopes", scopes, "conflicting scopes"))
    return out


def _validate_scope_selector(spec: dict[str, Any]) -> list[Cause]:
    sel = spec.get("scopeSelector")
    if sel is None:
        return []
    path = "spec.scopeSelector.matchExpressions"
    out: list[Cause] = []
    hard = sorted(_d(spec.get("hard")))
    seen: set[str] = set()
    for req in _l(_d(sel).get("matchExpressions")):
        req = _d(req)
        scope, op = _s(req.get("scopeName")), _s(req.get("operator"))
        values = _l(req.get("values"))
        if scope not in SCOPES:
            out.append(invalid_value(f"{path}.scopeName", scope, "unsupported scope"))
        for name in hard:
            if name in STANDARD_QUOTA_RESOURCES and not scope_valid_for(scope, name):
                out.append(invalid_value(path, sel, "unsupported scope applied to resource"))
        if scope in EXISTS_ONLY_SCOPES and op != "Exists":
            out.append(invalid_value(f"{path}.operator", op,
                                     "must be 'Exists' when scope is any of ResourceQuotaScopeTerminating, "
                                     "ResourceQuotaScopeNotTerminating, ResourceQuotaScopeBestEffort, "
                                     "ResourceQuotaScopeNotBestEffort or ResourceQuotaScopeCrossNamespacePodAffinity"))
        if op in ("In", "NotIn"):
            if not values:
                out.append(required(f"{path}.values",
                                    "must be at least one value when `operator` is 'In' or 'NotIn' for scope selector"))
        elif op in ("Exists", "DoesNotExist"):
            if values:
                out.append(invalid_value(f"{path}.values", [_s(v) for v in values],
                                         "must be no value when `operator` is 'Exist' or 'DoesNotExist' for "
                                         "scope selector"))
        else:
            out.append(invalid_value(f"{path}.operator", op, "not a valid selector operator"))
        seen.add(scope)
    for a, b in CONFLICTING_SCOPES:
        if a in seen and b in seen:
            out.append(invalid_value(path, _scope_list(spec), "conflicting scopes"))
    return out


def _validate_quota_spec(obj: dict[str, Any]) -> list[Cause]:
    spec = _d(obj.get("spec"))
    return _resource_map(spec.get("hard"), "spec.hard") + _validate_scopes(spec) + _validate_scope_selector(spec)


def _validate_quota_status(obj: dict[str, Any]) -> list[Cause]:
    status = _d(obj.get("status"))
    return _resource_map(status.get("hard"), "status.hard") + _resource_map(status.get("used"), "status.used")


def _validate_resource_quota(obj: dict[str, Any]) -> list[Cause]:
    return _validate_quota_spec(obj) + _validate_quota_status(obj)


def _validate_resource_quota_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    """Scopes are fixed once created."""
    new_scopes, old_scopes = _scope_list(_d(new.get("spec"))), _scope_list(_d(old.get("spec")))
    if set(new_scopes) != set(old_scopes):
        return [invalid_value("spec.scopes", new_scopes, "field is immutable")]
    return []


def _limit_resource_name(kind: str, name: str, path: str) -> list[Cause]:
    if kind in ("Pod", "Container"):
        return _container_resource_name(name, path)
    return _resource_name(name, path)


def _milli(v: Fraction) -> int:
    return int((v * 1000).__ceil__())


def _validate_limit_range(obj: dict[str, Any]) -> list[Cause]:
    out: list[Cause] = []
    types: set[str] = set()
    for i, item in enumerate(_l(_d(obj.get("spec")).get("limits"))):
        item = _d(item)
        p = f"spec.limits[{i}]"
        kind = _s(item.get("type"))
        type_errs = [invalid_value(f"{p}.type", kind, m) for m in is_qualified_name(kind)]
        if not type_errs and "/" not in kind and kind not in LIMIT_TYPES:
            type_errs.append(invalid_value(f"{p}.type", kind, "must be a standard limit type or fully qualified"))
        out += type_errs
        if kind in types:
            out.append(duplicate(f"{p}.type", kind))
        types.add(kind)
        maps: dict[str, dict[str, tuple[Fraction, Any]]] = {}
        fields = ["max", "min"]
        if kind == "Pod":
            if _d(item.get("default")):
                out.append(forbidden_field(f"{p}.default", "may not be specified when `type` is 'Pod'"))
            if _d(item.get("defaultRequest")):
                out.append(forbidden_field(f"{p}.defaultRequest", "may not be specified when `type` is 'Pod'"))
        else:
            fields += ["default", "defaultRequest"]
        fields.append("maxLimitRequestRatio")
        keys: set[str] = set()
        for f in fields:
            maps[f] = {}
            for name, value in _d(item.get(f)).items():
                fp = f"{p}.{f}[{name}]"
                out += _limit_resource_name(kind, name, fp)
                v, errs = _parse(value, fp)
                out += errs
                keys.add(name)
                if v is not None:
                    maps[f][name] = (v, value)
        if kind == "PersistentVolumeClaim" and "storage" not in _d(item.get("min")) \
                and "storage" not in _d(item.get("max")):
            out.append(required(f"{p}.limits",
                                "either minimum or maximum storage value is required, but neither was provided"))
        for k in sorted(keys):
            mn, mx = maps["min"].get(k), maps["max"].get(k)
            df, dr = maps.get("default", {}).get(k), maps.get("defaultRequest", {}).get(k)
            ratio = maps["maxLimitRequestRatio"].get(k)
            t = _quantity_text
            if mn and mx and mn[0] > mx[0]:
                out.append(_invalid_quantity(f"{p}.min[{k}]", mn[1],
                                             f"min value {t(mn[1])} is greater than max value {t(mx[1])}"))
            if dr and mn and mn[0] > dr[0]:
                out.append(_invalid_quantity(f"{p}.defaultRequest[{k}]", dr[1],
                                             f"min value {t(mn[1])} is greater than default request value {t(dr[1])}"))
            if dr and mx and dr[0] > mx[0]:
                out.append(_invalid_quantity(f"{p}.defaultRequest[{k}]", dr[1],
                                             f"default request value {t(dr[1])} is greater than max value {t(mx[1])}"))
            if dr and df and dr[0] > df[0]:
                out.append(_invalid_quantity(f"{p}.defaultRequest[{k}]", dr[1],
                                             f"default request value {t(dr[1])} is greater than default limit "
                                             f"value {t(df[1])}"))
            if df and mn and mn[0] > df[0]:
                out.append(_invalid_quantity(f"{p}.default[{k}]", mn[1],
                                             f"min value {t(mn[1])} is greater than default value {t(df[1])}"))
            if df and mx and df[0] > mx[0]:
                out.append(_invalid_quantity(f"{p}.default[{k}]", mx[1],
                                             f"default value {t(df[1])} is greater than max value {t(mx[1])}"))
            if ratio and ratio[0] < 1:
                out.append(_invalid_quantity(f"{p}.maxLimitRequestRatio[{k}]", ratio[1],
                                             f"ratio {t(ratio[1])} is less than 1"))
            if ratio and mn and mx and mn[0] != 0:
                limit = _milli(mx[0]) / _milli(mn[0]) if _milli(mn[0]) else float("inf")
                if _milli(ratio[0]) / 1000 > limit:
                    out.append(_invalid_quantity(f"{p}.maxLimitRequestRatio[{k}]", ratio[1],
                                                 f"ratio {t(ratio[1])} is greater than max/min = {limit:f}"))
            native = _is_native(k) and not k.startswith("hugepages-")
            if not native and df and dr and df[0] != dr[0]:
                out.append(_invalid_quantity(f"{p}.defaultRequest[{k}]", dr[1],
                                             f"default value {t(df[1])} must equal to defaultRequest value "
                                             f"{t(dr[1])} in {k}"))
    return out
