"""Validation of scheduling.k8s.io/v1 PriorityClasses.
"""

from __future__ import annotations

from typing import Any

from kubeplane.api.errors import Cause, forbidden_field, not_supported, required
from kubeplane.api.validation.common import _d, _immutable, _is_int, _s


def _validate_priority_class(obj: dict[str, Any]) -> list[Cause]:
    out: list[Cause] = []
    name = _s(_d(obj.get("metadata")).get("name"))
    value = obj.get("value")
    system = {"system-node-critical": 2000001000, "system-cluster-critical": 2000000000}
    if not _is_int(value):
        out.append(required("value"))
    if name.startswith("system-"):
        if system.get(name) != value:
            out.append(forbidden_field("metadata.name", "priority class names with 'system-' prefix are reserved for system use only"))
    elif _is_int(value) and value > 1000000000:
        out.append(forbidden_field("value", "maximum allowed value of a user defined priority is 1000000000"))
    pp = obj.get("preemptionPolicy")
    if pp is not None and pp not in ("Never", "PreemptLowerPriority"):
        out.append(not_supported("preemptionPolicy", pp, ("Never", "PreemptLowerPriority")))
    return out


def _validate_priority_class_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    out: list[Cause] = []
    if new.get("value") != old.get("value"):
        out.append(forbidden_field("value", "may not be changed in an update."))
    out += _immutable(new.get("preemptionPolicy"), old.get("preemptionPolicy"), "preemptionPolicy")
    return out
