"""autoscaling/v1 <-> autoscaling/v2 HorizontalPodAutoscalers, as upstream
converts them (pkg/apis/autoscaling/v1/conversion.go).

v1 knows one metric, ``targetCPUUtilizationPercentage``. Everything else a
v2 object holds travels in v1 through annotations so that a round trip loses
nothing: the other metrics (``autoscaling.alpha.kubernetes.io/metrics``, in
v1's MetricSpec shape), the current metrics (``.../current-metrics``), the
behavior (``.../behavior``) and the conditions (``.../conditions``).
Reading a v1 object back turns the annotations into fields again.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson

Obj = dict[str, Any]

METRICS_ANNOTATION = "autoscaling.alpha.kubernetes.io/metrics"
CURRENT_METRICS_ANNOTATION = "autoscaling.alpha.kubernetes.io/current-metrics"
CONDITIONS_ANNOTATION = "autoscaling.alpha.kubernetes.io/conditions"
BEHAVIOR_ANNOTATION = "autoscaling.alpha.kubernetes.io/behavior"
ROUND_TRIP = (METRICS_ANNOTATION, CURRENT_METRICS_ANNOTATION, CONDITIONS_ANNOTATION, BEHAVIOR_ANNOTATION)

DEFAULT_CPU_UTILIZATION = 80


def _d(v: Any) -> Obj:
    return v if isinstance(v, dict) else {}


def _set(out: Obj, key: str, value: Any) -> None:
    if value is not None:
        out[key] = value


def _is_cpu_utilization(metric: Obj) -> bool:
    res = _d(metric.get("resource"))
    return metric.get("type") == "Resource" and res.get("name") == "cpu" \
        and _d(res.get("target")).get("averageUtilization") is not None


# -- metric specs -----------------------------------------------------------


def _spec_to_v1(m: Obj) -> Obj:
    typ = m.get("type")
    out: Obj = {"type": typ}
    if typ == "Object" and isinstance(m.get("object"), dict):
        src = m["object"]
        t = _d(src.get("target"))
        o: Obj = {"target": src.get("describedObject"), "metricName": _d(src.get("metric")).get("name", "")}
        _set(o, "selector", _d(src.get("metric")).get("selector"))
        _set(o, "targetValue", t.get("value"))
        _set(o, "averageValue", t.get("averageValue"))
        out["object"] = o
    elif typ == "Pods" and isinstance(m.get("pods"), dict):
        src = m["pods"]
        o = {"metricName": _d(src.get("metric")).get("name", "")}
        _set(o, "selector", _d(src.get("metric")).get("selector"))
        _set(o, "targetAverageValue", _d(src.get("target")).get("averageValue"))
        out["pods"] = o
    elif typ in ("Resource", "ContainerResource"):
        key = "resource" if typ == "Resource" else "containerResource"
        src = _d(m.get(key))
        t = _d(src.get("target"))
        o = {"name": src.get("name", "")}
        if key == "containerResource":
            o["container"] = src.get("container", "")
        _set(o, "targetAverageUtilization", t.get("averageUtilization"))
        _set(o, "targetAverageValue", t.get("averageValue"))
        out[key] = o
    elif typ == "External" and isinstance(m.get("external"), dict):
        src = m["external"]
        t = _d(src.get("target"))
        o = {"metricName": _d(src.get("metric")).get("name", "")}
        _set(o, "metricSelector", _d(src.get("metric")).get("selector"))
        _set(o, "targetValue", t.get("value"))
        _set(o, "targetAverageValue", t.get("averageValue"))
        out["external"] = o
    return out


def _metric_id(name: Any, selector: Any) -> Obj:
    out: Obj = {"name": name or ""}
    _set(out, "selector", selector)
    return out


def _target(utilization: Any = None, value: Any = None, average: Any = None) -> Obj:
    if utilization is not None:
        out: Obj = {"type": "Utilization", "averageUtilization": utilization}
    elif value is not None:
        out = {"type": "Value", "value": value}
    else:
        out = {"type": "AverageValue"}
    _set(out, "averageValue", average)
    return out


def _spec_from_v1(m: Obj) -> Obj:
    typ = m.get("type")
    out: Obj = {"type": typ}
    if typ == "Object" and isinstance(m.get("object"), dict):
        src = m["object"]
        out["object"] = {"describedObject": src.get("target") or {},
                         "metric": _metric_id(src.get("metricName"), src.get("selector")),
                         "target": _target(value=src.get("targetValue"), average=src.get("averageValue"))}
    elif typ == "Pods" and isinstance(m.get("pods"), dict):
        src = m["pods"]
        out["pods"] = {"metric": _metric_id(src.get("metricName"), src.get("selector")),
                       "target": _target(average=src.get("targetAverageValue"))}
    elif typ in ("Resource", "ContainerResource"):
        key = "resource" if typ == "Resource" else "containerResource"
        src = _d(m.get(key))
        o: Obj = {"name": src.get("name", "")}
        if key == "containerResource":
            o["container"] = src.get("container", "")
        o["target"] = _target(utilization=src.get("targetAverageUtilization"),
                              average=src.get("targetAverageValue"))
        out[key] = o
    elif typ == "External" and isinstance(m.get("external"), dict):
        src = m["external"]
        out["external"] = {"metric": _metric_id(src.get("metricName"), src.get("metricSelector")),
                           "target": _target(value=src.get("targetValue"), average=src.get("targetAverageValue"))}
    return out


# -- metric statuses ----------------------------------------------------------


def _status_to_v1(m: Obj) -> Obj:
    typ = m.get("type")
    out: Obj = {"type": typ}
    if typ == "Object" and isinstance(m.get("object"), dict):
        src = m["object"]
        cur = _d(src.get("current"))
        o: Obj = {"target": src.get("describedObject") or {}, "metricName": _d(src.get("metric")).get("name", ""),
                  "currentValue": cur.get("value") if cur.get("value") is not None else "0"}
        _set(o, "selector", _d(src.get("metric")).get("selector"))
        _set(o, "averageValue", cur.get("averageValue"))
        out["object"] = o
    elif typ == "Pods" and isinstance(m.get("pods"), dict):
        src = m["pods"]
        o = {"metricName": _d(src.get("metric")).get("name", ""),
             "currentAverageValue": _d(src.get("current")).get("averageValue") or "0"}
        _set(o, "selector", _d(src.get("metric")).get("selector"))
        out["pods"] = o
    elif typ in ("Resource", "ContainerResource"):
        key = "resource" if typ == "Resource" else "containerResource"
        src = _d(m.get(key))
        cur = _d(src.get("current"))
        o = {"name": src.get("name", "")}
        if key == "containerResource":
            o["container"] = src.get("container", "")
        _set(o, "currentAverageUtilization", cur.get("averageUtilization"))
        o["currentAverageValue"] = cur.get("averageValue") or "0"
        out[key] = o
    elif typ == "External" and isinstance(m.get("external"), dict):
        src = m["external"]
        cur = _d(src.get("current"))
        o = {"metricName": _d(src.get("metric")).get("name", ""),
             "currentValue": cur.get("value") if cur.get("value") is not None else "0"}
        _set(o, "metricSelector", _d(src.get("metric")).get("selector"))
        _set(o, "currentAverageValue", cur.get("averageValue"))
        out["external"] = o
    return out


def _current(value: Any = None, average: Any = None, utilization: Any = None) -> Obj:
    out: Obj = {}
    _set(out, "value", value)
    _set(out, "averageValue", average)
    _set(out, "averageUtilization", utilization)
    return out


def _status_from_v1(m: Obj) -> Obj:
    typ = m.get("type")
    out: Obj = {"type": typ}
    if typ == "Object" and isinstance(m.get("object"), dict):
        src = m["object"]
        out["object"] = {"describedObject": src.get("target") or {},
                         "metric": _metric_id(src.get("metricName"), src.get("selector")),
                         "current": _current(value=src.get("currentValue"), average=src.get("averageValue"))}
    elif typ == "Pods" and isinstance(m.get("pods"), dict):
        src = m["pods"]
        out["pods"] = {"metric": _metric_id(src.get("metricName"), src.get("selector")),
                       "current": _current(average=src.get("currentAverageValue"))}
    elif typ in ("Resource", "ContainerResource"):
        key = "resource" if typ == "Resource" else "containerResource"
        src = _d(m.get(key))
        o: Obj = {"name": src.get("name", "")}
        if key == "containerResource":
            o["container"] = src.get("container", "")
        o["current"] = _current(average=src.get("currentAverageValue"),
                                utilization=src.get("currentAverageUtilization"))
        out[key] = o
    elif typ == "External" and isinstance(m.get("external"), dict):
        src = m["external"]
        out["external"] = {"metric": _metric_id(src.get("metricName"), src.get("metricSelector")),
                           "current": _current(value=src.get("currentValue"), average=src.get("currentAverageValue"))}
    return out


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


def _loads(text: Any) -> Any:
    if not isinstance(text, str):
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


# -- objects ----------------------------------------------------------------------


def to_v1(obj: Obj) -> Obj:
    """A v2 object as autoscaling/v1 serves it."""
    if obj.get("kind") == "Status":
        return obj
    md = copy.deepcopy(_d(obj.get("metadata")))
    spec = _d(obj.get("spec"))
    status = obj.get("status")
    annotations = {k: v for k, v in _d(md.get("annotations")).items() if k not in ROUND_TRIP}
    metrics = [m for m in spec.get("metrics") or [] if isinstance(m, dict)]
    out_spec: Obj = {"scaleTargetRef": spec.get("scaleTargetRef") or {}}
    _set(out_spec, "minReplicas", spec.get("minReplicas"))
    out_spec["maxReplicas"] = spec.get("maxReplicas", 0)
    cpu = next((m for m in metrics if _is_cpu_utilization(m)), None)
    if cpu is not None:
        out_spec["targetCPUUtilizationPercentage"] = cpu["resource"]["target"]["averageUtilization"]
    others = [_spec_to_v1(m) for m in metrics if not _is_cpu_utilization(m)]
    if others:
        annotations[METRICS_ANNOTATION] = _json(others)
    if spec.get("behavior") is not None:
        annotations[BEHAVIOR_ANNOTATION] = _json(spec["behavior"])
    out: Obj = {"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler", "metadata": md,
                "spec": out_spec}
    if isinstance(status, dict):
        st: Obj = {}
        _set(st, "observedGeneration", status.get("observedGeneration"))
        _set(st, "lastScaleTime", status.get("lastScaleTime"))
        st["currentReplicas"] = status.get("currentReplicas", 0)
        st["desiredReplicas"] = status.get("desiredReplicas", 0)
        current = [m for m in status.get("currentMetrics") or [] if isinstance(m, dict)]
        for m in current:
            res = _d(m.get("resource"))
            if m.get("type") == "Resource" and res.get("name") == "cpu" \
                    and _d(res.get("current")).get("averageUtilization") is not None:
                st["currentCPUUtilizationPercentage"] = res["current"]["averageUtilization"]
        if current:
            annotations[CURRENT_METRICS_ANNOTATION] = _json([_status_to_v1(m) for m in current])
        if status.get("conditions"):
            annotations[CONDITIONS_ANNOTATION] = _json(status["conditions"])
        out["status"] = st
    if annotations:
        md["annotations"] = annotations
    else:
        md.pop("annotations", None)
    return out


def to_v2(obj: Obj) -> Obj:
    """A v1 object in the v2 shape kubeplane stores."""
    if obj.get("kind") == "Status":
        return obj
    md = copy.deepcopy(_d(obj.get("metadata")))
    spec = _d(obj.get("spec"))
    status = obj.get("status")
    annotations = _d(md.get("annotations"))
    out_spec: Obj = {"scaleTargetRef": spec.get("scaleTargetRef") or {}}
    _set(out_spec, "minReplicas", spec.get("minReplicas"))
    out_spec["maxReplicas"] = spec.get("maxReplicas", 0)
    metrics: list[Obj] = []
    others = _loads(annotations.get(METRICS_ANNOTATION))
    if isinstance(others, list):
        metrics += [_spec_from_v1(m) for m in others if isinstance(m, dict)]
    target = spec.get("targetCPUUtilizationPercentage")
    if target is not None:
        metrics.append({"type": "Resource", "resource": {
            "name": "cpu", "target": {"type": "Utilization", "averageUtilization": target}}})
    if not metrics:
        metrics = [{"type": "Resource", "resource": {
            "name": "cpu", "target": {"type": "Utilization", "averageUtilization": DEFAULT_CPU_UTILIZATION}}}]
    out_spec["metrics"] = metrics
    behavior = _loads(annotations.get(BEHAVIOR_ANNOTATION))
    if isinstance(behavior, dict) and behavior:
        out_spec["behavior"] = behavior
    out: Obj = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": md,
                "spec": out_spec}
    if isinstance(status, dict):
        st: Obj = {}
        _set(st, "observedGeneration", status.get("observedGeneration"))
        _set(st, "lastScaleTime", status.get("lastScaleTime"))
        st["currentReplicas"] = status.get("currentReplicas", 0)
        st["desiredReplicas"] = status.get("desiredReplicas", 0)
        current = _loads(annotations.get(CURRENT_METRICS_ANNOTATION))
        if isinstance(current, list):
            st["currentMetrics"] = [_status_from_v1(m) for m in current if isinstance(m, dict)]
        elif status.get("currentCPUUtilizationPercentage") is not None:
            st["currentMetrics"] = [{"type": "Resource", "resource": {
                "name": "cpu", "current": {"averageUtilization": status["currentCPUUtilizationPercentage"]}}}]
        conditions = _loads(annotations.get(CONDITIONS_ANNOTATION))
        if isinstance(conditions, list):
            st["conditions"] = conditions
        out["status"] = st
    rest = {k: v for k, v in annotations.items() if k not in ROUND_TRIP}
    if rest:
        md["annotations"] = rest
    else:
        md.pop("annotations", None)
    return out


# -- serving autoscaling/v1 through the v2 storage --------------------------------


def is_v1(res: Any) -> bool:
    """``res`` is autoscaling/v1 HorizontalPodAutoscalers (served by converting)."""
    return res.group == "autoscaling" and res.version == "v1" and res.plural == "horizontalpodautoscalers"


def _v2(registry: Any) -> Any:
    return registry.catalogue.by_gvr("autoscaling", "v2", "horizontalpodautoscalers")


def _out(obj: Obj) -> Obj:
    return to_v1(obj) if isinstance(obj, dict) and obj.get("kind", "HorizontalPodAutoscaler") != "Status" else obj


class V1View:
    """The registry's verbs for autoscaling/v1: each request is converted to
    v2, served by the v2 resource (its strategy, validation, admission and
    storage) and the answer converted back, as upstream serves every version
    of a kind from one storage version."""

    def __init__(self, registry: Any, res: Any) -> None:
        self.registry = registry
        self.res = res
        self.v2 = _v2(registry)

    def _incoming(self, obj: Any) -> Obj:
        from kubeplane.api import errors

        if not isinstance(obj, dict):
            raise errors.bad_request("the body of the request must be a JSON object")
        self.registry._check_type_meta(self.res, obj)
        return copy.deepcopy(to_v2(obj))  # shares nothing with the caller's object

    async def get(self, name: str, namespace: str | None) -> Obj:
        return to_v1(await self.registry.get(self.v2, name, namespace))

    async def list(self, namespace: str | None, **kw: Any) -> Obj:
        result = await self.registry.list(self.v2, namespace, **kw)
        return {**result, "apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscalerList",
                "items": [to_v1(o) for o in result.get("items") or []]}

    async def create(self, obj: Obj, namespace: str | None, **kw: Any) -> Obj:
        kw["owned"] = True
        return _out(await self.registry.create(self.v2, self._incoming(obj), namespace, **kw))

    async def update(self, obj: Obj, **kw: Any) -> Obj:
        kw["owned"] = True
        return _out(await self.registry.update(self.v2, self._incoming(obj), **kw))

    async def patch(self, name: str, patch: Any, namespace: str | None, *, patch_type: str = "merge",
                    subresource: str | None = None, dry_run: bool = False, field_manager: str | None = None,
                    force: bool | None = None, prune: Any = None) -> tuple[Obj, bool]:
        """A patch of the v1 form: applied to the object as v1 shows it, then
        written as an update that expects the version it was applied to (and
        tried again on the newer one when another writer came first)."""
        from kubeplane.api import errors
        from kubeplane.api import patch as patching

        if patch_type == "apply":
            raise errors.unsupported_media_type(
                "application/apply-patch+yaml",
                ["application/json-patch+json", "application/merge-patch+json",
                 "application/strategic-merge-patch+json"])
        pinned = isinstance(patch, dict) and bool(_d(patch.get("metadata")).get("resourceVersion"))
        for _attempt in range(20):
            current = to_v1(await self.registry.get(self.v2, name, namespace))
            if patch_type == "json":
                new = patching.json_patch(current, patch)
            else:
                if not isinstance(patch, dict):
                    raise errors.bad_request("patch must be a JSON object")
                new = patching.merge_patch(current, patch)
            if not isinstance(new, dict):
                raise errors.bad_request("the patched object must be a JSON object")
            if prune is not None:
                prune(new)
            md = new.setdefault("metadata", {})
            if isinstance(md, dict) and not pinned:
                md["resourceVersion"] = current["metadata"].get("resourceVersion")
            try:
                updated = await self.registry.update(
                    self.v2, self._incoming(new), name=name, namespace=namespace, subresource=subresource,
                    dry_run=dry_run, field_manager=field_manager, owned=True)
            except errors.StatusError as err:
                if err.code == 409 and not pinned:
                    continue
                raise
            return _out(updated), False
        raise errors.conflict("horizontalpodautoscalers", name, "autoscaling")

    async def delete(self, name: str, namespace: str | None, **kw: Any) -> tuple[Obj, bool]:
        obj, finished = await self.registry.delete(self.v2, name, namespace, **kw)
        return _out(obj), finished

    async def watch_batches(self, namespace: str | None, opts: Any):
        batches = self.registry.watch_batches(self.v2, namespace, opts)
        try:
            async for batch in batches:
                yield [(t, o if t in ("ERROR", "BOOKMARK") else _out(o)) for t, o in batch]
        finally:
            await batches.aclose()
