"""HorizontalPodAutoscalers (autoscaling/v2, the storage version): upstream's
v2 defaults (pkg/apis/autoscaling/v2/defaults.go) on top of the generic
status handling (status is reset on create and owned by the status
subresource)."""

from __future__ import annotations

import copy
from typing import Any

from kubeplane.registry.strategies import Strategy

Obj = dict[str, Any]

#: upstream's DefaultCPUUtilization: the metric of an HPA that names none
DEFAULT_CPU_UTILIZATION = 80

#: the scale-up rules of an HPA whose behavior leaves them out: the larger of
#: 4 pods or doubling every 15 s, right away
DEFAULT_SCALE_UP: Obj = {
    "stabilizationWindowSeconds": 0,
    "selectPolicy": "Max",
    "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15},
                 {"type": "Percent", "value": 100, "periodSeconds": 15}],
}
#: the scale-down rules: everything at once every 15 s; the window is left unset
#: (the controller's --horizontal-pod-autoscaler-downscale-stabilization applies)
DEFAULT_SCALE_DOWN: Obj = {
    "selectPolicy": "Max",
    "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
}


def _rules(given: Any, defaults: Obj) -> Obj:
    out = copy.deepcopy(defaults)
    if isinstance(given, dict):
        for key in ("selectPolicy", "stabilizationWindowSeconds", "policies", "tolerance"):
            if given.get(key) is not None:
                out[key] = given[key]
    return out


def default_hpa_spec(spec: Obj) -> None:
    if spec.get("minReplicas") is None:
        spec["minReplicas"] = 1
    if not spec.get("metrics"):
        spec["metrics"] = [{"type": "Resource", "resource": {
            "name": "cpu", "target": {"type": "Utilization", "averageUtilization": DEFAULT_CPU_UTILIZATION}}}]
    behavior = spec.get("behavior")
    if isinstance(behavior, dict):
        behavior["scaleUp"] = _rules(behavior.get("scaleUp"), DEFAULT_SCALE_UP)
        behavior["scaleDown"] = _rules(behavior.get("scaleDown"), DEFAULT_SCALE_DOWN)


class HorizontalPodAutoscalerStrategy(Strategy):
    def default(self, obj: Obj) -> None:
        spec = obj.get("spec")
        if isinstance(spec, dict):
            default_hpa_spec(spec)

    def initial_status(self, obj: Obj) -> Obj | None:
        # an empty status, as upstream's JSON of it shows (desiredReplicas has no omitempty)
        return {"desiredReplicas": 0}
