"""The resource metrics API (metrics.k8s.io/v1beta1 NodeMetrics and PodMetrics),
served by the API server itself from the usage each node reports.

Upstream runs metrics-server, which scrapes every kubelet and keeps the last
sample in memory. Here the node pushes instead, on the heartbeat it sends
anyway: its Lease in ``kube-node-lease`` carries the annotation
:data:`USAGE_ANNOTATION`, a JSON document of the node's usage and that of
each pod it runs (a :func:`usage_report`). The report therefore needs no
route, identity or permission of its own (a kubelet may already write its
Lease), lives as long as the heartbeat does, and every API server of a
cluster sees it. A simulated node reports what its usage model says
(:mod:`kubeplane.controllers.nodeagent`); a real node agent reports what its
cgroups measured, through the same Lease.

As with metrics-server, a report is served only while it is fresh: once the
node's Lease has expired (``renewTime + leaseDurationSeconds`` is past), the
node and its pods have no metrics. PodMetrics exist for the pods that exist
now, carry their labels (label selectors select by them, as upstream) and
come from the report of the node the pod runs on, matched by uid.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import Any, Callable

import orjson

from kubeplane.api import errors
from kubeplane.api.meta import format_time, parse_time
from kubeplane.api.quantity import canonical_quantity
from kubeplane.api.resources import ResourceInfo, resource
from kubeplane.api.selectors import parse_field_selector, parse_label_selector

Obj = dict[str, Any]

GROUP = "metrics.k8s.io"
API_VERSION = "metrics.k8s.io/v1beta1"
#: the annotation of a node's Lease that carries its usage report
USAGE_ANNOTATION = "node.kubeplane.io/resource-usage"
LEASE_NAMESPACE = "kube-node-lease"
#: the resources a report may name (what the resource metrics API serves)
RESOURCES = ("cpu", "memory")

LEASES = resource("leases")
PODS = resource("pods")
NODES = resource("nodes")


def _usage(values: Any) -> dict[str, str]:
    """``{"cpu": "250m", "memory": "64Mi"}`` with canonical quantities; anything
    else (an unknown resource, a malformed quantity) is left out."""
    out: dict[str, str] = {}
    if not isinstance(values, dict):
        return out
    for name in RESOURCES:
        v = values.get(name)
        if v is None:
            continue
        try:
            out[name] = canonical_quantity(str(v))
        except ValueError:
            continue
    return out


def usage_report(timestamp: _dt.datetime, window_seconds: float, node: dict[str, str],
                 pods: list[Obj]) -> str:
    """The annotation value: ``node`` is the node's usage, ``pods`` one entry per
    running pod (``namespace``, ``name``, ``uid``, ``containers``: each a
    ``name`` and its usage)."""
    return orjson.dumps({
        "timestamp": format_time(timestamp),
        "window": f"{window_seconds:g}s",
        "node": node,
        "pods": pods,
    }).decode()


@dataclass
class Report:
    timestamp: str
    window: str
    node: dict[str, str]
    #: pod uid -> (namespace, name, [(container, usage)])
    pods: dict[str, tuple[str, str, list[tuple[str, dict[str, str]]]]]


def parse_report(text: Any) -> Report | None:
    """A report as :func:`usage_report` writes it; None when it is not one."""
    if not isinstance(text, str):
        return None
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("timestamp"), str):
        return None
    try:
        parse_time(doc["timestamp"])
    except ValueError:
        return None
    window = doc.get("window") if isinstance(doc.get("window"), str) else "0s"
    pods: dict[str, tuple[str, str, list[tuple[str, dict[str, str]]]]] = {}
    for p in doc.get("pods") or []:
        if not isinstance(p, dict) or not isinstance(p.get("uid"), str):
            continue
        containers = [(c["name"], _usage(c.get("usage"))) for c in p.get("containers") or []
                      if isinstance(c, dict) and isinstance(c.get("name"), str)]
        pods[p["uid"]] = (str(p.get("namespace", "")), str(p.get("name", "")), containers)
    return Report(doc["timestamp"], window, _usage(doc.get("node")), pods)


def _lease_fresh(lease: Obj, now: _dt.datetime) -> bool:
    spec = lease.get("spec") or {}
    renew = spec.get("renewTime")
    duration = spec.get("leaseDurationSeconds")
    if not isinstance(renew, str) or not isinstance(duration, int) or isinstance(duration, bool):
        return False
    try:
        renewed = parse_time(renew)
    except ValueError:
        return False
    return renewed + _dt.timedelta(seconds=duration) > now


class ResourceMetrics:
    """get and list of NodeMetrics and PodMetrics over a registry (its leases,
    nodes and pods)."""

    def __init__(self, registry: Any, clock: Callable[[], _dt.datetime]) -> None:
        self.registry = registry
        self.clock = clock

    async def _reports(self) -> dict[str, Report]:
        """node name -> its fresh report."""
        leases = await self.registry.list(LEASES, LEASE_NAMESPACE)
        now = self.clock()
        out: dict[str, Report] = {}
        for lease in leases["items"]:
            md = lease.get("metadata") or {}
            report = parse_report((md.get("annotations") or {}).get(USAGE_ANNOTATION))
            if report is not None and _lease_fresh(lease, now):
                out[md.get("name", "")] = report
        return out

    def _created(self) -> str:
        return format_time(self.clock())

    def _node_metrics(self, node: Obj, report: Report) -> Obj:
        md = node.get("metadata") or {}
        meta: Obj = {"name": md.get("name", ""), "creationTimestamp": self._created()}
        if md.get("labels"):
            meta["labels"] = dict(md["labels"])
        return {"kind": "NodeMetrics", "apiVersion": API_VERSION, "metadata": meta,
                "timestamp": report.timestamp, "window": report.window, "usage": dict(report.node)}

    def _pod_metrics(self, pod: Obj, reports: dict[str, Report]) -> Obj | None:
        md = pod.get("metadata") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        report = reports.get(node) if node else None
        if report is None:
            return None
        entry = report.pods.get(md.get("uid", ""))
        if entry is None:
            return None
        meta: Obj = {"name": md.get("name", ""), "namespace": md.get("namespace", ""),
                     "creationTimestamp": self._created()}
        if md.get("labels"):
            meta["labels"] = dict(md["labels"])
        return {"kind": "PodMetrics", "apiVersion": API_VERSION, "metadata": meta,
                "timestamp": report.timestamp, "window": report.window,
                "containers": [{"name": name, "usage": dict(usage)} for name, usage in entry[2]]}

    @staticmethod
    def _not_found(res: ResourceInfo, name: str) -> errors.StatusError:
        # metrics-server names the kind in its NotFound (and a pod as namespace/name)
        return errors.not_found("nodemetrics" if res.plural == "nodes" else "podmetrics", name, GROUP)

    async def get(self, res: ResourceInfo, name: str, namespace: str | None) -> Obj:
        reports = await self._reports()
        if res.plural == "nodes":
            try:
                node = await self.registry.get(NODES, name)
            except errors.StatusError as err:
                if err.code == 404:
                    raise self._not_found(res, name) from None
                raise
            report = reports.get(name)
            if report is None:
                raise self._not_found(res, name)
            return self._node_metrics(node, report)
        try:
            pod = await self.registry.get(PODS, name, namespace)
        except errors.StatusError as err:
            if err.code == 404:
                raise self._not_found(res, f"{namespace}/{name}") from None
            raise
        out = self._pod_metrics(pod, reports)
        if out is None:
            raise self._not_found(res, f"{namespace}/{name}")
        return out

    async def list(self, res: ResourceInfo, namespace: str | None, *, label_selector: str = "",
                   field_selector: str = "") -> Obj:
        # a malformed selector is the client's error before anything is read
        if label_selector:
            parse_label_selector(label_selector)
        fsel = parse_field_selector(field_selector, res.plural + "." + GROUP) if field_selector else None
        reports = await self._reports()
        items: list[Obj] = []
        if res.plural == "nodes":
            nodes = await self.registry.list(NODES, label_selector=label_selector)
            for node in nodes["items"]:
                report = reports.get((node.get("metadata") or {}).get("name", ""))
                if report is not None:
                    items.append(self._node_metrics(node, report))
            kind = "NodeMetricsList"
        else:
            pods = await self.registry.list(PODS, namespace, label_selector=label_selector)
            for pod in pods["items"]:
                m = self._pod_metrics(pod, reports)
                if m is not None:
                    items.append(m)
            kind = "PodMetricsList"
        if fsel is not None:
            items = [m for m in items if fsel.matches(m)]
        return {"kind": kind, "apiVersion": API_VERSION, "metadata": {}, "items": items}
