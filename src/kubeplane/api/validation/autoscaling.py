"""Validation of autoscaling HorizontalPodAutoscalers (checked in the v2 shape,
upstream's internal version: a v1 object is converted before it gets here).

Upstream's pkg/apis/autoscaling/validation with the strategy's options: the
HPAScaleToZero gate is off, so minReplicas is at least 1 unless the stored
object already had 0; scaleTargetRef needs an API group (but a
ReplicationController's may be empty) and an object metric's described object
may name the core group.
"""

from __future__ import annotations

from typing import Any

from kubeplane.api.errors import Cause, forbidden_field, invalid_value, not_supported, required
from kubeplane.api.validation.common import _d, _is_int, _l, _quantity, _s
from kubeplane.api.validation.core import _validate_container_resource_name
from kubeplane.api.validation.rbac import name_is_path_segment
from kubeplane.api.strings import is_dns1123_label

#: upstream's MaxPeriodSeconds and MaxStabilizationWindowSeconds
MAX_PERIOD_SECONDS = 1800
MAX_STABILIZATION_WINDOW_SECONDS = 3600

METRIC_SOURCE_TYPES = ("ContainerResource", "External", "Object", "Pods", "Resource")
#: the spec field each metric source type fills
SOURCE_FIELD = {"Object": "object", "Pods": "pods", "Resource": "resource", "External": "external",
                "ContainerResource": "containerResource"}
SELECT_POLICIES = ("Disabled", "Max", "Min")
POLICY_TYPES = ("Percent", "Pods")


def _parse_group_version(text: str) -> tuple[str, str] | str:
    """(group, version), or upstream's error text for a malformed apiVersion."""
    if not text:
        return "", ""
    if text == "v1":
        return "", "v1"
    parts = text.split("/")
    if len(parts) == 1:
        return "", text
    if len(parts) == 2:
        return parts[0], parts[1]
    return f"unexpected GroupVersion string: {text}"


def api_version_error(ref: dict[str, Any], allow_empty_group: bool) -> str | None:
    gv = _parse_group_version(_s(ref.get("apiVersion")))
    if isinstance(gv, str):
        return gv
    if not allow_empty_group and gv[0] == "":
        return "apiVersion must specify API group"
    return None


def validate_cross_version_ref(ref: Any, path: str, *, allow_empty_group: bool,
                               allow_invalid_api_version: bool = False) -> list[Cause]:
    ref = _d(ref)
    out: list[Cause] = []
    for key in ("kind", "name"):
        value = _s(ref.get(key))
        if not value:
            out.append(required(f"{path}.{key}"))
        else:
            out += [invalid_value(f"{path}.{key}", value, m) for m in name_is_path_segment(value)]
    if not allow_invalid_api_version:
        err = api_version_error(ref, allow_empty_group)
        if err is not None:
            out.append(invalid_value(f"{path}.apiVersion", _s(ref.get("apiVersion")), err))
    return out


def _positive_quantity(value: Any, path: str) -> list[Cause]:
    q, bad = _quantity(value, path)
    if bad:
        return bad
    if q is not None and q <= 0:
        return [invalid_value(path, value, "must be positive")]
    return []


def _validate_target(target: Any, path: str) -> list[Cause]:
    t = _d(target)
    out: list[Cause] = []
    typ = _s(t.get("type"))
    if not typ:
        out.append(required(f"{path}.type", "must specify a metric target type"))
    if typ not in ("Utilization", "Value", "AverageValue"):
        out.append(invalid_value(f"{path}.type", typ, "must be either Utilization, Value, or AverageValue"))
    for key in ("value", "averageValue"):
        if t.get(key) is not None:
            out += _positive_quantity(t[key], f"{path}.{key}")
    util = t.get("averageUtilization")
    if util is not None and (not _is_int(util) or util < 1):
        out.append(invalid_value(f"{path}.averageUtilization", util, "must be greater than 0"))
    return out


def _validate_identifier(ident: Any, path: str) -> list[Cause]:
    name = _s(_d(ident).get("name"))
    if not name:
        return [required(f"{path}.name", "must specify a metric name")]
    return [invalid_value(f"{path}.name", name, m) for m in name_is_path_segment(name)]


def _validate_resource_target(src: dict[str, Any], path: str) -> list[Cause]:
    out = _validate_target(src.get("target"), f"{path}.target")
    t = _d(src.get("target"))
    if t.get("averageUtilization") is None and t.get("averageValue") is None:
        out.append(required(f"{path}.target.averageUtilization",
                            "must set either a target raw value or a target utilization"))
    if t.get("averageUtilization") is not None and t.get("averageValue") is not None:
        out.append(forbidden_field(f"{path}.target.averageValue",
                                   "may not set both a target raw value and a target utilization"))
    return out


def _validate_source(kind: str, src: dict[str, Any], path: str) -> list[Cause]:
    out: list[Cause] = []
    target = _d(src.get("target"))
    if kind == "object":
        out += validate_cross_version_ref(src.get("describedObject"), f"{path}.describedObject",
                                          allow_empty_group=True)
        out += _validate_identifier(src.get("metric"), f"{path}.metric")
        out += _validate_target(src.get("target"), f"{path}.target")
        if target.get("value") is None and target.get("averageValue") is None:
            out.append(required(f"{path}.target.averageValue", "must set either a target value or averageValue"))
    elif kind == "external":
        out += _validate_identifier(src.get("metric"), f"{path}.metric")
        out += _validate_target(src.get("target"), f"{path}.target")
        if target.get("value") is None and target.get("averageValue") is None:
            out.append(required(f"{path}.target.averageValue",
                                "must set either a target value for metric or a per-pod target"))
        if target.get("value") is not None and target.get("averageValue") is not None:
            out.append(forbidden_field(f"{path}.target.value",
                                       "may not set both a target value for metric and a per-pod target"))
    elif kind == "pods":
        out += _validate_identifier(src.get("metric"), f"{path}.metric")
        out += _validate_target(src.get("target"), f"{path}.target")
        if target.get("averageValue") is None:
            out.append(required(f"{path}.target.averageValue", "must specify a positive target averageValue"))
    elif kind == "resource":
        if not _s(src.get("name")):
            out.append(required(f"{path}.name", "must specify a resource name"))
        out += _validate_resource_target(src, path)
    elif kind == "containerResource":
        name = _s(src.get("name"))
        if not name:
            out.append(required(f"{path}.name", "must specify a resource name"))
        else:
            out += _validate_container_resource_name(name, f"{path}.name")
        container = _s(src.get("container"))
        if not container:
            out.append(required(f"{path}.container", "must specify a container"))
        else:
            out += [invalid_value(f"{path}.container", container, m) for m in is_dns1123_label(container)]
        out += _validate_resource_target(src, path)
    return out


def _validate_metric(spec: Any, path: str) -> list[Cause]:
    spec = _d(spec)
    out: list[Cause] = []
    typ = _s(spec.get("type"))
    if not typ:
        out.append(required(f"{path}.type", "must specify a metric source type"))
    if typ not in METRIC_SOURCE_TYPES:
        out.append(not_supported(f"{path}.type", typ, METRIC_SOURCE_TYPES))
    present = [f for f in ("object", "external", "pods", "resource", "containerResource")
               if spec.get(f) is not None]
    if present:
        # upstream checks only the first source present; the others are refused below
        out += _validate_source(present[0], _d(spec[present[0]]), f"{path}.{present[0]}")
    expected = SOURCE_FIELD.get(typ)
    if expected is not None and spec.get(expected) is None:
        out.append(required(f"{path}.{expected}", "must populate information for the given metric source"))
    if len(present) != 1:
        for f in present:
            if f != expected:
                out.append(forbidden_field(f"{path}.{f}", "must populate the given metric source only"))
    return out


def _validate_policy(policy: Any, path: str) -> list[Cause]:
    p = _d(policy)
    out: list[Cause] = []
    typ = _s(p.get("type"))
    if typ not in POLICY_TYPES:
        out.append(not_supported(f"{path}.type", typ, POLICY_TYPES))
    value = p.get("value", 0)
    if not _is_int(value) or value <= 0:
        out.append(invalid_value(f"{path}.value", value, "must be greater than zero"))
    period = p.get("periodSeconds", 0)
    if not _is_int(period) or period <= 0:
        out.append(invalid_value(f"{path}.periodSeconds", period, "must be greater than zero"))
    elif period > MAX_PERIOD_SECONDS:
        out.append(invalid_value(f"{path}.periodSeconds", period,
                                 f"must be less than or equal to {MAX_PERIOD_SECONDS}"))
    return out


def _validate_rules(rules: Any, path: str) -> list[Cause]:
    if rules is None:
        return []
    r = _d(rules)
    out: list[Cause] = []
    window = r.get("stabilizationWindowSeconds")
    if window is not None:
        if not _is_int(window) or window < 0:
            out.append(invalid_value(f"{path}.stabilizationWindowSeconds", window,
                                     "must be greater than or equal to zero"))
        elif window > MAX_STABILIZATION_WINDOW_SECONDS:
            out.append(invalid_value(f"{path}.stabilizationWindowSeconds", window,
                                     f"must be less than or equal to {MAX_STABILIZATION_WINDOW_SECONDS}"))
    select = r.get("selectPolicy")
    if select is not None and select not in SELECT_POLICIES:
        out.append(not_supported(f"{path}.selectPolicy", select, SELECT_POLICIES))
    policies = _l(r.get("policies"))
    if not policies:
        out.append(required(f"{path}.policies", "must specify at least one Policy"))
    for i, policy in enumerate(policies):
        out += _validate_policy(policy, f"{path}.policies[{i}]")
    if r.get("tolerance") is not None:
        q, bad = _quantity(r["tolerance"], f"{path}.tolerance")
        out += bad
        if q is not None and q < 0:
            out.append(invalid_value(f"{path}.tolerance", r["tolerance"], "must be greater than or equal to 0"))
    return out


def _validate_spec(spec: dict[str, Any], old_spec: dict[str, Any] | None = None) -> list[Cause]:
    out: list[Cause] = []
    old_min = None if old_spec is None else old_spec.get("minReplicas")
    lower = 0 if old_min == 0 else 1
    min_replicas = spec.get("minReplicas")
    if min_replicas is not None and (not _is_int(min_replicas) or min_replicas < lower):
        out.append(invalid_value("spec.minReplicas", min_replicas, f"must be greater than or equal to {lower}"))
    max_replicas = spec.get("maxReplicas")
    if max_replicas in (None, 0):
        out.append(required("spec.maxReplicas", "must be set and greater than 0"))
    elif not _is_int(max_replicas) or max_replicas < 0:
        out.append(invalid_value("spec.maxReplicas", max_replicas, "must be greater than or equal to 1"))
    if _is_int(min_replicas) and _is_int(max_replicas) and max_replicas < min_replicas:
        out.append(invalid_value("spec.maxReplicas", max_replicas, "must be greater than or equal to `minReplicas`"))
    ref = _d(spec.get("scaleTargetRef"))
    old_ref = _d((old_spec or {}).get("scaleTargetRef"))
    same_target = old_spec is not None and old_ref.get("apiVersion") == ref.get("apiVersion") \
        and old_ref.get("kind") == ref.get("kind")
    out += validate_cross_version_ref(ref, "spec.scaleTargetRef",
                                      allow_empty_group=ref.get("kind") == "ReplicationController",
                                      allow_invalid_api_version=same_target)
    metrics = _l(spec.get("metrics"))
    has_object_or_external = False
    for i, metric in enumerate(metrics):
        out += _validate_metric(metric, f"spec.metrics[{i}]")
        if _d(metric).get("type") in ("Object", "External"):
            has_object_or_external = True
    if min_replicas == 0 and not has_object_or_external:
        out.append(forbidden_field("spec.metrics", "must specify at least one Object or External metric to "
                                                   "support scaling to zero replicas"))
    behavior = spec.get("behavior")
    if behavior is not None:
        b = _d(behavior)
        out += _validate_rules(b.get("scaleUp"), "spec.behavior.scaleUp")
        out += _validate_rules(b.get("scaleDown"), "spec.behavior.scaleDown")
    return out


def validate_hpa(obj: dict[str, Any]) -> list[Cause]:
    """Every write's checks. The strategy's relaxations for a stored object
    (minReplicas 0, an unchanged scaleTargetRef with a bad apiVersion) cover
    objects kubeplane can never have stored: the HPAScaleToZero gate is off."""
    return _validate_spec(_d(obj.get("spec")), None) + validate_hpa_status(obj)


def validate_hpa_status(new: dict[str, Any]) -> list[Cause]:
    status = _d(new.get("status"))
    out: list[Cause] = []
    for key in ("currentReplicas", "desiredReplicas"):
        v = status.get(key)
        if v is not None and (not _is_int(v) or v < 0):
            out.append(invalid_value(f"status.{key}", v, "must be greater than or equal to 0"))
    return out
