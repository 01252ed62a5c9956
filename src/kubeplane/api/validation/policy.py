"""Validation of policy/v1 PodDisruptionBudgets.
"""

from __future__ import annotations

from typing import Any

from kubeplane.api.errors import Cause, invalid_value, not_supported
from kubeplane.api.validation.common import _d, _validate_int_or_percent
from kubeplane.api.validation.meta import validate_label_selector


def _validate_pdb(obj: dict[str, Any]) -> list[Cause]:
    spec = _d(obj.get("spec"))
    out: list[Cause] = []
    if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
        out.append(invalid_value("spec", spec, "minAvailable and maxUnavailable cannot be both set"))
    out += _validate_int_or_percent(spec.get("minAvailable"), "spec.minAvailable")
    out += _validate_int_or_percent(spec.get("maxUnavailable"), "spec.maxUnavailable")
    out += validate_label_selector(spec.get("selector"), "spec.selector")
    uhp = spec.get("unhealthyPodEvictionPolicy")
    if uhp is not None and uhp not in ("AlwaysAllow", "IfHealthyBudget"):
        out.append(not_supported("spec.unhealthyPodEvictionPolicy", uhp, ("AlwaysAllow", "IfHealthyBudget")))
    return out


def _validate_pdb_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    """upstream's ValidatePodDisruptionBudgetStatusUpdate (policy/v1): the
    counts of the status are never negative."""
    status = _d(new.get("status"))
    out: list[Cause] = []
    for name in ("disruptionsAllowed", "currentHealthy", "desiredHealthy", "expectedPods"):
        value = status.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            out.append(invalid_value(f"status.{name}", value, "must be greater than or equal to 0"))
    return out
