"""A pod's quality of service class (upstream's ``GetPodQOS``): what the API server writes into
``status.qosClass`` and what the node agent sizes the pod's cgroups by."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from kubeplane.api.quantity import parse_quantity

Obj = dict[str, Any]


def _positive_quantities(resources: Any) -> dict[str, Fraction]:
    """The cpu and memory quantities above zero in a requests or limits map
    (values that do not parse are left out: validation rejects them)."""
    out: dict[str, Fraction] = {}
    if isinstance(resources, dict):
        for name in ("cpu", "memory"):
            if name in resources:
                try:
                    value = parse_quantity(resources[name])
                except (TypeError, ValueError):
                    continue
                if value.numerator > 0:
                    out[name] = value
    return out


def _sums(per_container: list[dict[str, Fraction]]) -> dict[str, Fraction]:
    if len(per_container) == 1:
        return per_container[0]  # one container: no Fraction arithmetic
    out: dict[str, Fraction] = {}
    for found in per_container:
        for name, value in found.items():
            out[name] = out[name] + value if name in out else value
    return out


def pod_qos_class(spec: Obj) -> str:
    """Guaranteed / Burstable / BestEffort as upstream computes it: from the cpu
    and memory requests and limits above zero, summed over the containers and
    init containers. Guaranteed needs every container to limit both, and the
    summed requests to equal the summed limits."""
    all_requests: list[dict[str, Fraction]] = []
    all_limits: list[dict[str, Fraction]] = []
    for c in list(spec.get("containers") or []) + list(spec.get("initContainers") or []):
        res = c.get("resources") if isinstance(c, dict) else None
        res = res if isinstance(res, dict) else {}
        all_requests.append(_positive_quantities(res.get("requests")))
        all_limits.append(_positive_quantities(res.get("limits")))
    requests, limits = _sums(all_requests), _sums(all_limits)
    if not requests and not limits:
        return "BestEffort"
    guaranteed = all(len(found) == 2 for found in all_limits)
    if guaranteed and len(requests) == len(limits) and all(limits.get(n) == v for n, v in requests.items()):
        return "Guaranteed"
    return "Burstable"


__all__ = ["pod_qos_class"]
