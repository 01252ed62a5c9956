"""The HorizontalPodAutoscaler controller (upstream's pkg/controller/podautoscaler).

Every sync period (``--horizontal-pod-autoscaler-sync-period``, 15 s) each
HPA is reconciled: the target's ``scale`` subresource gives the current
replica count and the pod selector; the resource metrics API
(metrics.k8s.io PodMetrics) and the pods' requests give each metric's
proposal (utilization or average value, with upstream's handling of unready,
missing and ignored pods and the tolerance); the largest proposal is
normalized (min/max, then the behavior's stabilization windows and scaling
policies, or without a behavior the legacy limits and the downscale
stabilization window) and written back through ``scale``. Status carries the
current and desired replicas, the current metrics, lastScaleTime and the
conditions AbleToScale, ScalingActive and ScalingLimited with upstream's
reasons and messages; events are upstream's too.

Time comes from ``clock`` (a callable returning an aware datetime), so tests
drive the stabilization windows and policy periods without waiting.
"""

from __future__ import annotations

import copy
import datetime as _dt
import logging
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import format_time, parse_time, utcnow
from kubeplane.api.quantity import format_quantity, parse_quantity
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.api.selectors import LabelSelector, parse_label_selector
from kubeplane.client.informer import SharedInformerFactory, meta_namespace_key, unwrap_deleted
from kubeplane.client.interface import Client, Obj
from kubeplane.controllers.base import Controller
from kubeplane.controllers.replicaset import NAMESPACE_INDEX, add_indexers, namespace_index

log = logging.getLogger(__name__)

HPAS = CATALOGUE.by_gvr("autoscaling", "v2", "horizontalpodautoscalers")
PODS = resource("pods")
POD_METRICS = CATALOGUE.by_gvr("metrics.k8s.io", "v1beta1", "pods")

#: the legacy scale-up limit (no behavior): twice the replicas, at least 4
SCALE_UP_LIMIT_FACTOR = 2.0
SCALE_UP_LIMIT_MINIMUM = 4.0


class MetricError(Exception):
    """A metric that gave no proposal; the message is upstream's."""


@dataclass
class Tolerances:
    scale_down: float
    scale_up: float

    def within(self, ratio: float) -> bool:
        return (1.0 - self.scale_down) <= ratio <= (1.0 + self.scale_up)


@dataclass
class PodMetric:
    timestamp: _dt.datetime
    window: _dt.timedelta
    value: int  # milli-units


@dataclass
class _State:
    """What the controller remembers of one HPA between syncs."""

    recommendations: list[list[Any]] = field(default_factory=list)  # [replicas, time]
    scale_up_events: list[list[Any]] = field(default_factory=list)  # [change, time, outdated]
    scale_down_events: list[list[Any]] = field(default_factory=list)
    selector: LabelSelector | None = None


def _milli(q: Any) -> int:
    """Quantity.MilliValue(): rounded up to a whole milli-unit."""
    return math.ceil(parse_quantity(q) * 1000)


def _quantity(resource_name: str, milli: int) -> str:
    """buildQuantity: memory in binary units, the rest decimal."""
    return format_quantity(Fraction(milli, 1000), "BinarySI" if resource_name == "memory" else "DecimalSI")


def _parse_duration(text: Any) -> _dt.timedelta:
    if isinstance(text, str) and text.endswith("s"):
        try:
            return _dt.timedelta(seconds=float(text[:-1]))
        except ValueError:
            pass
    return _dt.timedelta(0)


def _time(text: Any) -> _dt.datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return parse_time(text)
    except ValueError:
        return None


def _go_selector(sel: Any) -> str:
    """A metric selector as Go's %+v prints a *LabelSelector (nil: <nil>)."""
    if sel is None:
        return "<nil>"
    labels = " ".join(f"{k}:{v}" for k, v in sorted((sel.get("matchLabels") or {}).items()))
    exprs = " ".join(f"{{Key:{e.get('key')} Operator:{e.get('operator')} Values:[{' '.join(e.get('values') or [])}]}}"
                     for e in sel.get("matchExpressions") or [])
    return f"&LabelSelector{{MatchLabels:map[string]string{{{labels}}},MatchExpressions:[]LabelSelectorRequirement{{{exprs}}},}}"


class HorizontalController(Controller):
    def __init__(
        self,
        client: Client,
        factory: SharedInformerFactory | None = None,
        *,
        clock: Callable[[], _dt.datetime] = utcnow,
        sync_period: float = 15.0,
        tolerance: float = 0.1,
        downscale_stabilization: float = 300.0,
        cpu_initialization_period: float = 300.0,
        initial_readiness_delay: float = 30.0,
        catalogue: Any = None,
    ) -> None:
        super().__init__("horizontal-pod-autoscaler", client, factory)
        self.clock = clock
        self.sync_period = sync_period
        self.tolerance = tolerance
        self.downscale_stabilization = downscale_stabilization
        self.cpu_initialization_period = _dt.timedelta(seconds=cpu_initialization_period)
        self.initial_readiness_delay = _dt.timedelta(seconds=initial_readiness_delay)
        self._catalogue = catalogue
        self.hpa_informer = self.factory.informer_for(HPAS)
        self.pod_informer = self.factory.informer_for(PODS)
        add_indexers(self.pod_informer, {NAMESPACE_INDEX: namespace_index})
        self.hpa_informer.add_event_handler(self._enqueue, lambda _old, new: self._enqueue(new), self._deleted)
        self._queue = self.add_queue("hpa", self._sync)
        self._state: dict[str, _State] = {}

    # -- queue ---------------------------------------------------------------

    def _enqueue(self, obj: Obj) -> None:
        # As upstream: every HPA is processed once per sync period, the first
        # time one period after it appears (an earlier pending add wins).
        key = meta_namespace_key(obj)
        self._state.setdefault(key, _State())
        self._queue.add_after(key, self.sync_period)

    def _deleted(self, obj: Obj) -> None:
        key = meta_namespace_key(unwrap_deleted(obj))
        self._queue.forget(key)
        self._state.pop(key, None)

    async def _sync(self, key: str) -> None:
        deleted = await self.reconcile_key(key)
        if not deleted:
            self._queue.add_after(key, self.sync_period)

    async def reconcile_key(self, key: str) -> bool:
        """Reconcile one HPA now; True when it no longer exists."""
        hpa = self.hpa_informer.indexer.get_by_key(key)
        if hpa is None:
            self._state.pop(key, None)
            return True
        try:
            await self.reconcile(hpa, key)
        except (MetricError, StatusError) as err:
            log.info("horizontal-pod-autoscaler %s: %s", key, err)
        return False

    # -- helpers --------------------------------------------------------------

    def _now(self) -> _dt.datetime:
        return self.clock()

    def _set_condition(self, hpa: Obj, typ: str, status: str, reason: str, message: str) -> None:
        conds = hpa.setdefault("status", {}).setdefault("conditions", [])
        cond = next((c for c in conds if c.get("type") == typ), None)
        if cond is None:
            cond = {"type": typ}
            conds.append(cond)
        if cond.get("status") != status:
            cond["lastTransitionTime"] = format_time(self._now())
        cond["status"] = status
        cond["reason"] = reason
        cond["message"] = message

    def _remove_condition(self, hpa: Obj, typ: str) -> None:
        status = hpa.get("status") or {}
        if status.get("conditions"):
            status["conditions"] = [c for c in status["conditions"] if c.get("type") != typ]

    def _unable_condition(self, hpa: Obj, reason: str, err: str) -> tuple[str, str, str]:
        self.recorder.event(hpa, "Warning", reason, err)
        return reason, "the HPA was unable to compute the replica count: " + err, "False"

    def _tolerances(self, hpa: Obj) -> Tolerances:
        t = Tolerances(self.tolerance, self.tolerance)
        behavior = (hpa.get("spec") or {}).get("behavior")
        if isinstance(behavior, dict):
            down = (behavior.get("scaleDown") or {}).get("tolerance")
            up = (behavior.get("scaleUp") or {}).get("tolerance")
            if down is not None:
                t.scale_down = float(parse_quantity(down))
            if up is not None:
                t.scale_up = float(parse_quantity(up))
        return t

    def _mappings(self, group: str, kind: str) -> list[Any]:
        from kubeplane.client.discovery import served_resources

        catalogue = self._catalogue or served_resources(self.client) or CATALOGUE
        return [r for r in catalogue.resources if r.group == group and r.kind == kind]

    async def _update_status(self, hpa: Obj, original: Obj) -> None:
        if hpa.get("status") == original:
            return
        try:
            await self.client.update(HPAS, hpa, subresource="status")
        except StatusError as err:
            self.recorder.event(hpa, "Warning", "FailedUpdateStatus", err.message)
            raise MetricError(f"failed to update status for {hpa['metadata']['name']}: {err.message}") from None

    # -- reconcile ---------------------------------------------------------------

    async def reconcile(self, shared: Obj, key: str) -> None:
        hpa = copy.deepcopy(shared)
        md = hpa["metadata"]
        namespace = md.get("namespace", "")
        spec = hpa.setdefault("spec", {})
        status = hpa.setdefault("status", {})
        original = copy.deepcopy(status)
        state = self._state.setdefault(key, _State())
        ref = spec.get("scaleTargetRef") or {}
        reference = f"{ref.get('kind', '')}/{namespace}/{ref.get('name', '')}"

        async def fail_get_scale(message: str, err: str) -> None:
            self.recorder.event(hpa, "Warning", "FailedGetScale", message)
            self._set_condition(hpa, "AbleToScale", "False", "FailedGetScale",
                                f"the HPA controller was unable to get the target's current scale: {message}")
            try:
                await self._update_status(hpa, original)
            except MetricError as e:
                log.info("%s", e)
            raise MetricError(err)

        api_version = str(ref.get("apiVersion") or "")
        parts = api_version.split("/") if api_version else []
        if len(parts) > 2:
            msg = f"unexpected GroupVersion string: {api_version}"
            await fail_get_scale(msg, f"invalid API version in scale target reference: {msg}")
        group = parts[0] if len(parts) == 2 else ""
        mappings = self._mappings(group, str(ref.get("kind") or ""))
        if not mappings:
            msg = f'no matches for kind "{ref.get("kind", "")}" in group "{group}"'
            await fail_get_scale(msg, f"unable to determine resource for scale target reference: {msg}")
        scale = None
        target = None
        first_err = ""
        scalable = [r for r in mappings if "scale" in r.subresources]
        if not scalable:
            first_err = "the server could not find the requested resource"
        for i, res in enumerate(scalable):
            try:
                scale = await self.client.get(res, ref.get("name", ""), namespace, subresource="scale")
                target = res
                break
            except StatusError as err:
                if i == 0:
                    first_err = err.message
        if scale is None:
            await fail_get_scale(first_err or "unrecognized resource",
                                 f"failed to query scale subresource for {reference}: {first_err}")
        self._set_condition(hpa, "AbleToScale", "True", "SucceededGetScale",
                            "the HPA controller was able to get the target's current scale")
        current = int((scale.get("spec") or {}).get("replicas") or 0)
        if not state.recommendations:
            state.recommendations.append([current, self._now()])

        min_replicas = spec.get("minReplicas")
        min_replicas = 1 if min_replicas is None else int(min_replicas)
        max_replicas = int(spec.get("maxReplicas") or 0)
        desired = 0
        reason = ""
        rescale = True
        metric_statuses: list[Obj] = []
        needs_metrics = True
        if current == 0:
            # the HPAScaleToZero gate is off: a target scaled to zero by hand stays there
            desired = 0
            rescale = False
            needs_metrics = False
            self._set_condition(hpa, "ScalingActive", "False", "ScalingDisabled",
                                "scaling is disabled since the replica count of the target is zero")
            self._remove_condition(hpa, "ScaledToZero")
        elif current > max_replicas:
            reason = "Current number of replicas above Spec.MaxReplicas"
            desired = max_replicas
            needs_metrics = False
        elif current < min_replicas:
            reason = "Current number of replicas below Spec.MinReplicas"
            desired = min_replicas
            needs_metrics = False

        if needs_metrics:
            proposal, metric_name, metric_statuses, partial = await self._compute_metrics(
                hpa, key, scale, spec.get("metrics") or [], namespace)
            if proposal == -1:
                self._set_status(hpa, current, status.get("desiredReplicas", 0), metric_statuses, False)
                try:
                    await self._update_status(hpa, original)
                except MetricError as e:
                    log.info("%s", e)
                self.recorder.event(hpa, "Warning", "FailedComputeMetricsReplicas", partial)
                raise MetricError(f"failed to compute desired number of replicas based on listed metrics for "
                                  f"{reference}: {partial}")
            rescale_metric = ""
            if proposal > desired:
                desired = proposal
                rescale_metric = metric_name
            if desired > current:
                reason = f"{rescale_metric} above target"
            if desired < current:
                reason = "All metrics below target"
            if spec.get("behavior") is None:
                desired = self._normalize(hpa, state, current, desired, min_replicas, max_replicas)
            else:
                desired = self._normalize_with_behavior(hpa, state, current, desired, min_replicas, max_replicas)
            rescale = desired != current

        if rescale:
            error = ""
            for _attempt in range(5):
                scale = {**scale, "spec": {**(scale.get("spec") or {}), "replicas": desired}}
                try:
                    await self.client.update(target, scale, subresource="scale")
                    error = ""
                    break
                except StatusError as err:
                    error = err.message
                    if err.code != 409:
                        break
                    try:
                        scale = await self.client.get(target, ref.get("name", ""), namespace, subresource="scale")
                    except StatusError:
                        pass
            if error:
                self.recorder.event(hpa, "Warning", "FailedRescale",
                                    f"New size: {desired}; reason: {reason}; error: {error}")
                self._set_condition(hpa, "AbleToScale", "False", "FailedUpdateScale",
                                    f"the HPA controller was unable to update the target scale: {error}")
                self._set_status(hpa, current, status.get("desiredReplicas", 0), metric_statuses, False)
                try:
                    await self._update_status(hpa, original)
                except MetricError as e:
                    log.info("%s", e)
                raise MetricError(f"failed to rescale {reference}: {error}")
            self._set_condition(hpa, "AbleToScale", "True", "SucceededRescale",
                                f"the HPA controller was able to update the target scale to {desired}")
            self.recorder.event(hpa, "Normal", "SuccessfulRescale", f"New size: {desired}; reason: {reason}")
            self._store_scale_event(spec.get("behavior"), state, current, desired)
            self._remove_condition(hpa, "ScaledToZero")
            log.info("rescaled %s from %d to %d: %s", reference, current, desired, reason)
        else:
            desired = current
        self._set_status(hpa, current, desired, metric_statuses, rescale)
        await self._update_status(hpa, original)

    def _set_status(self, hpa: Obj, current: int, desired: int, metrics: list[Obj], rescale: bool) -> None:
        old = hpa.get("status") or {}
        status: Obj = {"desiredReplicas": desired}
        if current:
            status["currentReplicas"] = current
        if old.get("lastScaleTime"):
            status["lastScaleTime"] = old["lastScaleTime"]
        if metrics:
            status["currentMetrics"] = metrics
        if old.get("conditions"):
            status["conditions"] = old["conditions"]
        if old.get("observedGeneration") is not None:
            status["observedGeneration"] = old["observedGeneration"]
        if rescale:
            status["lastScaleTime"] = format_time(self._now())
        hpa["status"] = status

    # -- metrics -------------------------------------------------------------------

    def _pods(self, namespace: str, selector: LabelSelector) -> list[Obj]:
        return [p for p in self.pod_informer.indexer.by_index(NAMESPACE_INDEX, namespace)
                if selector.matches((p.get("metadata") or {}).get("labels") or {})]

    def _parse_selector(self, hpa: Obj, key: str, text: str) -> LabelSelector:
        if not text:
            self.recorder.event(hpa, "Warning", "SelectorRequired", "selector is required")
            self._set_condition(hpa, "ScalingActive", "False", "InvalidSelector",
                                "the HPA target's scale is missing a selector")
            raise MetricError("selector is required")
        try:
            selector = parse_label_selector(text)
        except StatusError as err:
            msg = f"couldn't convert selector into a corresponding internal selector object: {err.message}"
            self.recorder.event(hpa, "Warning", "InvalidSelector", msg)
            self._set_condition(hpa, "ScalingActive", "False", "InvalidSelector", msg)
            raise MetricError(msg) from None
        state = self._state.setdefault(key, _State())
        state.selector = selector
        namespace = hpa["metadata"].get("namespace", "")
        pods = self._pods(namespace, selector)
        controlling: set[str] = set()
        for pod in pods:
            labels = (pod.get("metadata") or {}).get("labels") or {}
            for other_key, other in self._state.items():
                if other.selector is not None and other_key.startswith(namespace + "/") \
                        and other.selector.matches(labels):
                    controlling.add(other_key)
        if len(controlling) > 1:
            msg = f"pods by selector {text} are controlled by multiple HPAs: [{' '.join(sorted(controlling))}]"
            self.recorder.event(hpa, "Warning", "AmbiguousSelector", msg)
            self._set_condition(hpa, "ScalingActive", "False", "AmbiguousSelector", msg)
            raise MetricError(msg)
        return selector

    async def _compute_metrics(self, hpa: Obj, key: str, scale: Obj, specs: list, namespace: str
                               ) -> tuple[int, str, list[Obj], str]:
        """(replicas, or -1 when nothing can be decided; the metric that
        proposed them; the statuses; the error text, also when some metrics
        failed but a decision is still made)."""
        try:
            selector = self._parse_selector(hpa, key, str((scale.get("status") or {}).get("selector") or ""))
        except MetricError as err:
            return -1, "", [], str(err)
        spec_replicas = int((scale.get("spec") or {}).get("replicas") or 0)
        status_replicas = int((scale.get("status") or {}).get("replicas") or 0)
        # as upstream, a metric that failed leaves an empty MetricStatus in its place
        statuses: list[Obj] = [{"type": ""} for _ in specs]
        replicas = 0
        metric = ""
        invalid = 0
        first_error = ""
        first_condition: tuple[str, str, str] | None = None
        for i, spec in enumerate(specs):
            try:
                proposal, name, statuses[i] = await self._compute_metric(
                    hpa, spec, spec_replicas, status_replicas, selector, namespace)
            except _Unable as err:
                if invalid == 0:
                    first_error = err.error
                    first_condition = err.condition
                invalid += 1
                continue
            if replicas == 0 or proposal > replicas:
                replicas = proposal
                metric = name
        error = ""
        if first_error:
            error = f"invalid metrics ({invalid} invalid out of {len(specs)}), first error is: {first_error}"
        if invalid >= len(specs) or (invalid > 0 and replicas < spec_replicas):
            if first_condition is not None:
                reason, message, status = first_condition
                self._set_condition(hpa, "ScalingActive", status, reason, message)
            return -1, "", statuses, error
        self._set_condition(hpa, "ScalingActive", "True", "ValidMetricFound",
                            f"the HPA was able to successfully calculate a replica count from {metric}")
        return replicas, metric, statuses, error

    async def _compute_metric(self, hpa: Obj, spec: Any, spec_replicas: int, status_replicas: int,
                              selector: LabelSelector, namespace: str) -> tuple[int, str, Obj]:
        spec = spec if isinstance(spec, dict) else {}
        typ = spec.get("type")
        tolerances = self._tolerances(hpa)
        if typ in ("Resource", "ContainerResource"):
            key = "resource" if typ == "Resource" else "containerResource"
            src = spec.get(key) or {}
            name = str(src.get("name") or "")
            container = str(src.get("container") or "") if key == "containerResource" else ""
            reason = "FailedGetResourceMetric" if key == "resource" else "FailedGetContainerResourceMetric"
            try:
                proposal, current, metric_name = await self._resource_proposal(
                    spec_replicas, src.get("target") or {}, name, tolerances, namespace, selector, container,
                    container_source=key == "containerResource")
            except MetricError as err:
                condition = self._unable_condition(hpa, reason, str(err))
                what = f"{name} resource metric value" if key == "resource" else f"{container} container metric value"
                raise _Unable(f"failed to get {what}: {err}", condition) from None
            status: Obj = {"name": name}
            if container:
                status["container"] = container
            status["current"] = current
            return proposal, metric_name, {"type": typ, key: status}
        if typ == "Pods":
            metric = ((spec.get("pods") or {}).get("metric") or {}).get("name", "")
            err = (f"unable to get metric {metric}: unable to fetch metrics from custom metrics API: "
                   f"the server could not find the requested resource (get pods.custom.metrics.k8s.io *)")
            condition = self._unable_condition(hpa, "FailedGetPodsMetric", err)
            raise _Unable(f"failed to get pods metric value: {err}", condition)
        if typ == "Object":
            src = spec.get("object") or {}
            metric = (src.get("metric") or {}).get("name", "")
            obj = src.get("describedObject") or {}
            err = (f"unable to get metric {metric}: {obj.get('kind', '')} on {namespace} {obj.get('name', '')}/"
                   f"unable to fetch metrics from custom metrics API: the server could not find the requested "
                   f"resource")
            condition = self._unable_condition(hpa, "FailedGetObjectMetric", err)
            raise _Unable(f"failed to get object metric value: {err}", condition)
        if typ == "External":
            src = spec.get("external") or {}
            metric = (src.get("metric") or {}).get("name", "")
            err = (f"unable to get external metric {namespace}/{metric}/{_go_selector((src.get('metric') or {}).get('selector'))}: "
                   f"unable to fetch metrics from external metrics API: the server could not find the requested "
                   f"resource (get {metric}.external.metrics.k8s.io)")
            condition = self._unable_condition(hpa, "FailedGetExternalMetric", err)
            raise _Unable(f"failed to get {metric} external metric value: {err}", condition)
        err = f'unknown metric source type "{typ}"'
        condition = self._unable_condition(hpa, "InvalidMetricSourceType", err)
        raise _Unable(err, condition)

    async def _resource_metrics(self, resource_name: str, namespace: str, selector: LabelSelector,
                                container: str) -> tuple[dict[str, PodMetric], _dt.datetime | None]:
        try:
            result = await self.client.list(POD_METRICS, namespace, label_selector=str(selector))
        except StatusError as err:
            raise MetricError(f"unable to get metrics for resource {resource_name}: unable to fetch metrics from "
                              f"resource metrics API: {err.message}") from None
        items = result.get("items") or []
        if not items:
            raise MetricError(f"unable to get metrics for resource {resource_name}: no metrics returned from "
                              f"resource metrics API")
        out: dict[str, PodMetric] = {}
        for m in items:
            name = (m.get("metadata") or {}).get("name", "")
            ts = _time(m.get("timestamp")) or self._now()
            window = _parse_duration(m.get("window"))
            containers = m.get("containers") or []
            if container:
                c = next((c for c in containers if c.get("name") == container), None)
                if c is not None and resource_name in (c.get("usage") or {}):
                    out[name] = PodMetric(ts, window, _milli(c["usage"][resource_name]))
                continue
            if not containers or any(resource_name not in (c.get("usage") or {}) for c in containers):
                continue
            out[name] = PodMetric(ts, window, sum(_milli(c["usage"][resource_name]) for c in containers))
        return out, _time(items[0].get("timestamp"))

    def _group_pods(self, pods: list[Obj], metrics: dict[str, PodMetric], resource_name: str
                    ) -> tuple[int, set[str], set[str], set[str]]:
        """upstream's groupPods: (ready count, unready, missing, ignored)."""
        unready: set[str] = set()
        missing: set[str] = set()
        ignored: set[str] = set()
        ready = 0
        now = self._now()
        for pod in pods:
            md = pod.get("metadata") or {}
            status = pod.get("status") or {}
            name = md.get("name", "")
            if md.get("deletionTimestamp") or status.get("phase") == "Failed":
                ignored.add(name)
                continue
            if status.get("phase", "Pending") == "Pending":
                unready.add(name)
                continue
            metric = metrics.get(name)
            if metric is None:
                missing.add(name)
                continue
            if resource_name == "cpu":
                cond = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
                start = _time(status.get("startTime"))
                transition = _time((cond or {}).get("lastTransitionTime"))
                if cond is None or start is None or transition is None:
                    is_unready = True
                elif start + self.cpu_initialization_period > now:
                    is_unready = cond.get("status") == "False" or metric.timestamp < transition + metric.window
                else:
                    is_unready = cond.get("status") == "False" and start + self.initial_readiness_delay > transition
                if is_unready:
                    unready.add(name)
                    continue
            ready += 1
        return ready, unready, missing, ignored

    @staticmethod
    def _requests(pods: list[Obj], container: str, resource_name: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for pod in pods:
            md = pod.get("metadata") or {}
            spec = pod.get("spec") or {}
            containers = list(spec.get("containers") or [])
            containers += [c for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"]
            request = 0
            found = False
            for c in containers:
                if not container or container == c.get("name"):
                    requests = (c.get("resources") or {}).get("requests") or {}
                    if resource_name not in requests:
                        raise MetricError(f"missing request for {resource_name} in container {c.get('name')} "
                                          f"of Pod {md.get('name')}")
                    request += _milli(requests[resource_name])
                if container and container == c.get("name"):
                    found = True
                    break
            if container and not found:
                raise MetricError(f"container {container} not found in Pod {md.get('name')}")
            out[md.get("name", "")] = request
        return out

    async def _resource_proposal(self, current: int, target: Obj, resource_name: str, tolerances: Tolerances,
                                 namespace: str, selector: LabelSelector, container: str, *,
                                 container_source: bool) -> tuple[int, Obj, str]:
        """(replicas, the current MetricValueStatus, the metric's name)."""
        if target.get("averageValue") is not None:
            try:
                replicas, usage = await self._raw_replicas(current, _milli(target["averageValue"]), resource_name,
                                                           tolerances, namespace, selector, container)
            except MetricError as err:
                raise MetricError(f"failed to get {resource_name} usage: {err}") from None
            return replicas, {"averageValue": _quantity(resource_name, usage)}, f"{resource_name} resource"
        utilization = target.get("averageUtilization")
        if utilization is None:
            raise MetricError("invalid resource metric source: neither an average utilization target nor an "
                              "average value (usage) target was set")
        try:
            replicas, percent, raw = await self._utilization_replicas(
                current, int(utilization), resource_name, tolerances, namespace, selector, container)
        except MetricError as err:
            raise MetricError(f"failed to get {resource_name} utilization: {err}") from None
        kind = "container resource" if container_source else "resource"
        return (replicas, {"averageUtilization": percent, "averageValue": _quantity(resource_name, raw)},
                f"{resource_name} {kind} utilization (percentage of request)")

    async def _utilization_replicas(self, current: int, target: int, resource_name: str, tolerances: Tolerances,
                                    namespace: str, selector: LabelSelector, container: str
                                    ) -> tuple[int, int, int]:
        metrics, _ts = await self._resource_metrics(resource_name, namespace, selector, container)
        pods = self._pods(namespace, selector)
        if not pods:
            raise MetricError("no pods returned by selector while calculating replica count")
        ready, unready, missing, ignored = self._group_pods(pods, metrics, resource_name)
        for name in ignored | unready:
            metrics.pop(name, None)
        if not metrics:
            raise MetricError("did not receive metrics for targeted pods (pods might be unready)")
        requests = self._requests(pods, container, resource_name)

        def ratio(ms: dict[str, PodMetric]) -> tuple[float, int, int]:
            total = sum(m.value for n, m in ms.items() if n in requests)
            asked = sum(requests[n] for n in ms if n in requests)
            entries = sum(1 for n in ms if n in requests)
            if asked == 0:
                raise MetricError("no metrics returned matched known pods")
            util = int(total * 100 / asked)
            return util / target, util, total // entries

        usage_ratio, utilization, raw = ratio(metrics)
        scale_up_with_unready = bool(unready) and usage_ratio > 1.0
        if not scale_up_with_unready and not missing:
            if tolerances.within(usage_ratio):
                return current, utilization, raw
            return math.ceil(usage_ratio * ready), utilization, raw
        if missing:
            if usage_ratio < 1.0:
                fallback = max(100, target)
                for name in missing:
                    metrics[name] = PodMetric(self._now(), _dt.timedelta(0), requests[name] * fallback // 100)
            elif usage_ratio > 1.0:
                for name in missing:
                    metrics[name] = PodMetric(self._now(), _dt.timedelta(0), 0)
        if scale_up_with_unready:
            for name in unready:
                metrics[name] = PodMetric(self._now(), _dt.timedelta(0), 0)
        new_ratio, _, _ = ratio(metrics)
        if tolerances.within(new_ratio) or (usage_ratio < 1.0 < new_ratio) or (usage_ratio > 1.0 > new_ratio):
            return current, utilization, raw
        new_replicas = math.ceil(new_ratio * len(metrics))
        if (new_ratio < 1.0 and new_replicas > current) or (new_ratio > 1.0 and new_replicas < current):
            return current, utilization, raw
        return new_replicas, utilization, raw

    async def _raw_replicas(self, current: int, target: int, resource_name: str, tolerances: Tolerances,
                            namespace: str, selector: LabelSelector, container: str) -> tuple[int, int]:
        metrics, _ts = await self._resource_metrics(resource_name, namespace, selector, container)
        pods = self._pods(namespace, selector)
        if not pods:
            raise MetricError("no pods returned by selector while calculating replica count")
        ready, unready, missing, ignored = self._group_pods(pods, metrics, resource_name)
        for name in ignored | unready:
            metrics.pop(name, None)
        if not metrics:
            raise MetricError("did not receive metrics for targeted pods (pods might be unready)")

        def ratio(ms: dict[str, PodMetric]) -> tuple[float, int]:
            usage = sum(m.value for m in ms.values()) // len(ms)
            return usage / target, usage

        usage_ratio, usage = ratio(metrics)
        scale_up_with_unready = bool(unready) and usage_ratio > 1.0
        if not scale_up_with_unready and not missing:
            if tolerances.within(usage_ratio):
                return current, usage
            return math.ceil(usage_ratio * ready), usage
        if missing:
            for name in missing:
                value = target if usage_ratio < 1.0 else 0
                if usage_ratio != 1.0:
                    metrics[name] = PodMetric(self._now(), _dt.timedelta(0), value)
        if scale_up_with_unready:
            for name in unready:
                metrics[name] = PodMetric(self._now(), _dt.timedelta(0), 0)
        new_ratio, _ = ratio(metrics)
        if tolerances.within(new_ratio) or (usage_ratio < 1.0 < new_ratio) or (usage_ratio > 1.0 > new_ratio):
            return current, usage
        new_replicas = math.ceil(new_ratio * len(metrics))
        if (new_ratio < 1.0 and new_replicas > current) or (new_ratio > 1.0 and new_replicas < current):
            return current, usage
        return new_replicas, usage

    # -- normalization ---------------------------------------------------------------

    def _normalize(self, hpa: Obj, state: _State, current: int, desired: int, min_replicas: int,
                   max_replicas: int) -> int:
        """Without a behavior: the downscale stabilization window, then the
        legacy limits (no more than twice the replicas, at least 4, per sync)."""
        stabilized = self._stabilize(state, desired)
        if stabilized != desired:
            self._set_condition(hpa, "AbleToScale", "True", "ScaleDownStabilized",
                                "recent recommendations were higher than current one, applying the highest recent "
                                "recommendation")
        else:
            self._set_condition(hpa, "AbleToScale", "True", "ReadyForNewScale",
                                "recommended size matches current size")
        limit = int(max(SCALE_UP_LIMIT_FACTOR * current, SCALE_UP_LIMIT_MINIMUM))
        if max_replicas > limit:
            maximum, reason, message = limit, "ScaleUpLimit", \
                "the desired replica count is increasing faster than the maximum scale rate"
        else:
            maximum, reason, message = max_replicas, "TooManyReplicas", \
                "the desired replica count is more than the maximum replica count"
        if stabilized < min_replicas:
            result, reason, message = min_replicas, "TooFewReplicas", \
                "the desired replica count is less than the minimum replica count"
        elif stabilized > maximum:
            result = maximum
        else:
            result, reason, message = stabilized, "DesiredWithinRange", "the desired count is within the acceptable range"
        self._set_condition(hpa, "ScalingLimited", "False" if result == stabilized else "True", reason, message)
        return result

    def _stabilize(self, state: _State, desired: int) -> int:
        now = self._now()
        cutoff = now - _dt.timedelta(seconds=self.downscale_stabilization)
        best = desired
        old_index = -1
        for i, (replicas, ts) in enumerate(state.recommendations):
            if ts < cutoff:
                old_index = i
            elif replicas > best:
                best = replicas
        if old_index >= 0:
            state.recommendations[old_index] = [desired, now]
        else:
            state.recommendations.append([desired, now])
        return best

    def _normalize_with_behavior(self, hpa: Obj, state: _State, current: int, desired: int, min_replicas: int,
                                 max_replicas: int) -> int:
        behavior = hpa["spec"]["behavior"]
        up = behavior.get("scaleUp") or {}
        down = behavior.get("scaleDown") or {}
        up_window = int(up.get("stabilizationWindowSeconds") or 0)
        down_window = down.get("stabilizationWindowSeconds")
        down_window = int(self.downscale_stabilization) if down_window is None else int(down_window)
        stabilized, reason, message = self._stabilize_with_behavior(state, current, desired, up_window, down_window)
        if stabilized != desired:
            self._set_condition(hpa, "AbleToScale", "True", reason, message)
        else:
            self._set_condition(hpa, "AbleToScale", "True", "ReadyForNewScale",
                                "recommended size matches current size")
        result, reason, message = self._rate_limit(state, current, stabilized, min_replicas, max_replicas, up, down)
        self._set_condition(hpa, "ScalingLimited", "False" if result == stabilized else "True", reason, message)
        return result

    def _stabilize_with_behavior(self, state: _State, current: int, desired: int, up_window: int,
                                 down_window: int) -> tuple[int, str, str]:
        now = self._now()
        up_cutoff = now - _dt.timedelta(seconds=up_window)
        down_cutoff = now - _dt.timedelta(seconds=down_window)
        up_rec = desired
        down_rec = desired
        old_index = -1
        for i, (replicas, ts) in enumerate(state.recommendations):
            if ts > up_cutoff:
                up_rec = min(replicas, up_rec)
            if ts > down_cutoff:
                down_rec = max(replicas, down_rec)
            if ts < up_cutoff and ts < down_cutoff:
                old_index = i
        recommendation = max(current, up_rec)
        recommendation = min(recommendation, down_rec)
        if old_index >= 0:
            state.recommendations[old_index] = [desired, now]
        else:
            state.recommendations.append([desired, now])
        if desired >= current:
            return (recommendation, "ScaleUpStabilized",
                    "recent recommendations were lower than current one, applying the lowest recent recommendation")
        return (recommendation, "ScaleDownStabilized",
                "recent recommendations were higher than current one, applying the highest recent recommendation")

    def _changed_in_period(self, period: int, events: list[list[Any]]) -> int:
        cutoff = self._now() - _dt.timedelta(seconds=period)
        return sum(e[0] for e in events if e[1] > cutoff)

    def _rate_limit(self, state: _State, current: int, desired: int, min_replicas: int, max_replicas: int,
                    up: Obj, down: Obj) -> tuple[int, str, str]:
        if desired > current:
            limit = self._scale_up_limit(state, current, up)
            limit = max(limit, current)
            if max_replicas > limit:
                maximum, reason, message = limit, "ScaleUpLimit", \
                    "the desired replica count is increasing faster than the maximum scale rate"
            else:
                maximum, reason, message = max_replicas, "TooManyReplicas", \
                    "the desired replica count is more than the maximum replica count"
            if desired > maximum:
                return maximum, reason, message
        elif desired < current:
            limit = self._scale_down_limit(state, current, down)
            limit = min(limit, current)
            if min_replicas < limit:
                minimum, reason, message = limit, "ScaleDownLimit", \
                    "the desired replica count is decreasing faster than the maximum scale rate"
            else:
                minimum, reason, message = min_replicas, "TooFewReplicas", \
                    "the desired replica count is less than the minimum replica count"
            if desired < minimum:
                return minimum, reason, message
        return desired, "DesiredWithinRange", "the desired count is within the acceptable range"

    def _scale_up_limit(self, state: _State, current: int, rules: Obj) -> int:
        select = rules.get("selectPolicy") or "Max"
        if select == "Disabled":
            return current
        pick = min if select == "Min" else max
        result: int | None = None
        for policy in rules.get("policies") or []:
            period = int(policy.get("periodSeconds") or 0)
            start = current - self._changed_in_period(period, state.scale_up_events) \
                + self._changed_in_period(period, state.scale_down_events)
            if policy.get("type") == "Pods":
                proposed = start + int(policy.get("value") or 0)
            else:
                proposed = math.ceil(start * (1 + int(policy.get("value") or 0) / 100))
            result = proposed if result is None else pick(result, proposed)
        return current if result is None else result

    def _scale_down_limit(self, state: _State, current: int, rules: Obj) -> int:
        select = rules.get("selectPolicy") or "Max"
        if select == "Disabled":
            return current
        # for scaling down the smallest change is the largest count
        pick = max if select == "Min" else min
        result: int | None = None
        for policy in rules.get("policies") or []:
            period = int(policy.get("periodSeconds") or 0)
            start = current - self._changed_in_period(period, state.scale_up_events) \
                + self._changed_in_period(period, state.scale_down_events)
            if policy.get("type") == "Pods":
                proposed = start - int(policy.get("value") or 0)
            else:
                proposed = int(start * (1 - int(policy.get("value") or 0) / 100))
            result = proposed if result is None else pick(result, proposed)
        return current if result is None else result

    def _store_scale_event(self, behavior: Any, state: _State, previous: int, new: int) -> None:
        if not isinstance(behavior, dict):
            return
        now = self._now()
        if new > previous:
            rules, events, change = behavior.get("scaleUp") or {}, state.scale_up_events, new - previous
        else:
            rules, events, change = behavior.get("scaleDown") or {}, state.scale_down_events, previous - new
        longest = max((int(p.get("periodSeconds") or 0) for p in rules.get("policies") or []), default=0)
        cutoff = now - _dt.timedelta(seconds=longest)
        old_index = -1
        for i, e in enumerate(events):
            if e[1] < cutoff:
                e[2] = True
            if e[2]:
                old_index = i
        if old_index >= 0:
            events[old_index] = [change, now, False]
        else:
            events.append([change, now, False])


class _Unable(Exception):
    """A metric's failure: the error text and the ScalingActive condition it sets."""

    def __init__(self, error: str, condition: tuple[str, str, str]) -> None:
        super().__init__(error)
        self.error = error
        self.condition = condition
