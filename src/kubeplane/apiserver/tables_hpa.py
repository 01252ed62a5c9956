"""Tables of HorizontalPodAutoscalers (upstream's printers.go columns) and of
the resource metrics (metrics-server's: Name, CPU, Memory, Window)."""

from __future__ import annotations

import datetime as _dt
from typing import Any

from kubeplane.api.quantity import canonical_quantity
from kubeplane.apiserver.tables import Column, Printer, _age, _age_col, _name, _name_col

Obj = dict[str, Any]


def _q(value: Any) -> str:
    """A quantity as upstream's Quantity.String() prints it."""
    if value is None:
        return "<unknown>"
    try:
        return canonical_quantity(str(value))
    except ValueError:
        return str(value)


def _d(v: Any) -> Obj:
    return v if isinstance(v, dict) else {}


def format_hpa_metrics(specs: list, statuses: list) -> str:
    """The Targets cell: ``current/target`` per metric, the first two and a count of the rest."""
    if not specs:
        return "<none>"
    parts: list[str] = []
    for i, spec in enumerate(specs):
        spec = _d(spec)
        status = _d(statuses[i]) if i < len(statuses) else {}
        typ = spec.get("type")
        if typ == "External" or typ == "Object":
            key = typ.lower()
            target = _d(_d(spec.get(key)).get("target"))
            current = _d(_d(status.get(key)).get("current"))
            if target.get("averageValue") is not None:
                cur = _q(current["averageValue"]) if status.get(key) and current.get("averageValue") is not None \
                    else "<unknown>"
                parts.append(f"{cur}/{_q(target['averageValue'])} (avg)")
            else:
                cur = _q(current.get("value")) if status.get(key) else "<unknown>"
                parts.append(f"{cur}/{_q(target.get('value'))}")
        elif typ == "Pods":
            target = _d(_d(spec.get("pods")).get("target"))
            cur = _q(_d(_d(status.get("pods")).get("current")).get("averageValue")) if status.get("pods") \
                else "<unknown>"
            parts.append(f"{cur}/{_q(target.get('averageValue'))}")
        elif typ in ("Resource", "ContainerResource"):
            key = "resource" if typ == "Resource" else "containerResource"
            src = _d(spec.get(key))
            target = _d(src.get("target"))
            st = _d(status.get(key))
            current = _d(st.get("current"))
            name = src.get("name", "")
            if target.get("averageValue") is not None:
                cur = _q(current.get("averageValue")) if st else "<unknown>"
                parts.append(f"{name}: {cur}/{_q(target['averageValue'])}")
            else:
                cur = f"{current['averageUtilization']}%" if st and current.get("averageUtilization") is not None \
                    else "<unknown>"
                util = target.get("averageUtilization")
                parts.append(f"{name}: {cur}/{f'{util}%' if util is not None else '<auto>'}")
        else:
            parts.append("<unknown type>")
    if len(parts) > 2:
        return f"{', '.join(parts[:2])} + {len(parts) - 2} more..."
    return ", ".join(parts)


def _hpa_row(hpa: Obj, now: _dt.datetime) -> list:
    from kubeplane.registry.hpa_conversion import to_v2

    if hpa.get("apiVersion") == "autoscaling/v1":
        hpa = to_v2(hpa)
    spec = _d(hpa.get("spec"))
    status = _d(hpa.get("status"))
    ref = _d(spec.get("scaleTargetRef"))
    min_pods = spec.get("minReplicas")
    return [
        _name(hpa), f"{ref.get('kind', '')}/{ref.get('name', '')}",
        format_hpa_metrics(spec.get("metrics") or [], status.get("currentMetrics") or []),
        "<unset>" if min_pods is None else str(min_pods),
        int(spec.get("maxReplicas") or 0), int(status.get("currentReplicas") or 0), _age(hpa, now),
    ]


HPA = Printer(
    (
        _name_col(),
        Column("Reference", description="scaleTargetRef points to the target resource to scale, and is used to "
                                        "the pods for which metrics should be collected, as well as to actually "
                                        "change the replica count."),
        Column("Targets", description=(
            "metrics contains the specifications for which to use to calculate the desired replica count (the "
            "maximum replica count across all metrics will be used).  The desired replica count is calculated "
            "multiplying the ratio between the target value and the current value by the current number of pods.  "
            "Ergo, metrics used must decrease as the pod count is increased, and vice-versa.  See the individual "
            "metric source types for more information about how each type of metric must respond. If not set, the "
            "default metric will be set to 80% average CPU utilization.")),
        Column("MinPods", description=(
            "minReplicas is the lower limit for the number of replicas to which the autoscaler can scale down.  It "
            "defaults to 1 pod.  minReplicas is allowed to be 0 if the alpha feature gate HPAScaleToZero is enabled "
            "and at least one Object or External metric is configured.  Scaling is active as long as at least one "
            "metric value is available.")),
        Column("MaxPods", description="maxReplicas is the upper limit for the number of replicas to which the "
                                      "autoscaler can scale up. It cannot be less that minReplicas."),
        Column("Replicas", description="currentReplicas is current number of replicas of pods managed by this "
                                       "autoscaler, as last seen by the autoscaler."),
        _age_col(),
    ),
    _hpa_row,
)


def _metrics_row(obj: Obj, now: _dt.datetime) -> list:
    if obj.get("kind") == "PodMetrics":
        usage: dict[str, Any] = {}
        from fractions import Fraction

        from kubeplane.api.quantity import format_quantity, parse_quantity

        totals: dict[str, Fraction] = {}
        for c in obj.get("containers") or []:
            for k, v in _d(_d(c).get("usage")).items():
                totals[k] = totals.get(k, Fraction(0)) + parse_quantity(v)
        usage = {k: format_quantity(v, "BinarySI" if k == "memory" else "DecimalSI") for k, v in totals.items()}
    else:
        usage = _d(obj.get("usage"))
    return [_name(obj), _q(usage.get("cpu")) if "cpu" in usage else "0",
            _q(usage.get("memory")) if "memory" in usage else "0", obj.get("window", "")]


METRICS = Printer(
    (
        _name_col(),
        Column("CPU", description="CPU usage"),
        Column("Memory", description="Memory usage"),
        Column("Window", description="Interval of the measurement"),
    ),
    _metrics_row,
)
