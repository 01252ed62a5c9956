"""Validation of coordination.k8s.io/v1 Leases.
"""

from __future__ import annotations

from typing import Any

from kubeplane.api.errors import Cause, invalid_value
from kubeplane.api.validation.common import _d, _is_int, _nonnegative


def _validate_lease(obj: dict[str, Any]) -> list[Cause]:
    spec = _d(obj.get("spec"))
    out: list[Cause] = []
    lds = spec.get("leaseDurationSeconds")
    if lds is not None and (not _is_int(lds) or lds <= 0):
        out.append(invalid_value("spec.leaseDurationSeconds", lds, "must be greater than 0"))
    out += _nonnegative(spec, "leaseTransitions", "spec")
    return out
