"""The usage report a node puts on its Lease (the annotation :data:`USAGE_ANNOTATION`): the
node's cpu and memory usage and that of each pod it runs. Node agents and simulated nodes write
it (:func:`usage_report`); the API server's resource metrics API reads it (:func:`parse_report`)."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import Any

import orjson

from kubeplane.api.meta import format_time, parse_time
from kubeplane.api.quantity import canonical_quantity

Obj = dict[str, Any]

#: the annotation of a node's Lease that carries its usage report
USAGE_ANNOTATION = "node.kubeplane.io/resource-usage"
#: the resources a report may name (what the resource metrics API serves)
RESOURCES = ("cpu", "memory")


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


__all__ = ["RESOURCES", "USAGE_ANNOTATION", "Report", "parse_report", "usage_report"]
