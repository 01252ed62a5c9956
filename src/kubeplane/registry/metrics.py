"""The resource metrics API (metrics.k8s.io/v1beta1 NodeMetrics and PodMetrics),
served by the API server itself from the usage each node reports.

Upstream runs metrics-server, which scrapes every kubelet and keeps the last
sample in memory. Here the node pushes instead, on the heartbeat it sends
anyway: its Lease in ``kube-node-lease`` carries the annotation
:data:`kubeplane.api.usage.USAGE_ANNOTATION`, a JSON document of the node's usage and that of
each pod it runs (a :func:`kubeplane.api.usage.usage_report`). The report therefore needs no
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
from typing import Any, Callable

from kubeplane.api import errors
from kubeplane.api.meta import format_time, parse_time
from kubeplane.api.resources import ResourceInfo, resource
from kubeplane.api.selectors import parse_field_selector, parse_label_selector
from kubeplane.api.usage import USAGE_ANNOTATION, Report, parse_report

Obj = dict[str, Any]

GROUP = "metrics.k8s.io"
API_VERSION = "metrics.k8s.io/v1beta1"
LEASE_NAMESPACE = "kube-node-lease"

LEASES = resource("leases")
PODS = resource("pods")
NODES = resource("nodes")


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
