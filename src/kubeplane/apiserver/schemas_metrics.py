"""OpenAPI schemas of metrics.k8s.io/v1beta1 (k8s.io/metrics' types), written
by hand: the Python client the other schemas come from has no models for
them. Named as metrics-server publishes them."""

from __future__ import annotations

from typing import Any

PACKAGE = "io.k8s.metrics.pkg.apis.metrics.v1beta1"
_META = "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1."
_QUANTITY = "#/components/schemas/io.k8s.apimachinery.pkg.api.resource.Quantity"

_TYPE_META = {
    "apiVersion": {"description": "APIVersion defines the versioned schema of this representation of an object. "
                                  "Servers should convert recognized schemas to the latest internal value, and may "
                                  "reject unrecognized values.", "type": "string"},
    "kind": {"description": "Kind is a string value representing the REST resource this object represents. "
                            "Servers may infer this from the endpoint the client submits requests to.",
             "type": "string"},
}
_USAGE = {"description": "The memory and CPU usage.", "type": "object",
          "additionalProperties": {"allOf": [{"$ref": _QUANTITY}]}}
_SAMPLE = {
    "timestamp": {"description": "The following fields define time interval from which metrics were collected "
                                 "from the interval [Timestamp-Window, Timestamp].",
                  "allOf": [{"$ref": _META + "Time"}]},
    "window": {"description": "The interval over which the usage was measured.", "type": "string"},
}


def _gvk(kind: str) -> list[dict[str, str]]:
    return [{"group": "metrics.k8s.io", "kind": kind, "version": "v1beta1"}]


def _list(kind: str) -> dict[str, Any]:
    return {
        "description": f"{kind}List is a list of {kind}.", "type": "object",
        "properties": {**_TYPE_META,
                       "items": {"description": f"List of {kind.lower()} metrics.", "type": "array",
                                 "items": {"allOf": [{"$ref": f"#/components/schemas/{PACKAGE}.{kind}"}]}},
                       "metadata": {"description": "Standard list metadata.",
                                    "allOf": [{"$ref": _META + "ListMeta"}]}},
        "required": ["items"], "x-kubernetes-group-version-kind": _gvk(kind + "List"),
    }


SCHEMAS: dict[str, dict[str, Any]] = {
    f"{PACKAGE}.NodeMetrics": {
        "description": "NodeMetrics sets resource usage metrics of a node.", "type": "object",
        "properties": {**_TYPE_META, "metadata": {"description": "Standard object's metadata.",
                                                  "allOf": [{"$ref": _META + "ObjectMeta"}]},
                       **_SAMPLE, "usage": _USAGE},
        "required": ["timestamp", "window", "usage"], "x-kubernetes-group-version-kind": _gvk("NodeMetrics"),
    },
    f"{PACKAGE}.NodeMetricsList": _list("NodeMetrics"),
    f"{PACKAGE}.PodMetrics": {
        "description": "PodMetrics sets resource usage metrics of a pod.", "type": "object",
        "properties": {**_TYPE_META, "metadata": {"description": "Standard object's metadata.",
                                                  "allOf": [{"$ref": _META + "ObjectMeta"}]},
                       **_SAMPLE,
                       "containers": {"description": "Metrics for all containers are collected within the same "
                                                     "time window.", "type": "array",
                                      "items": {"allOf": [{"$ref": f"#/components/schemas/{PACKAGE}.ContainerMetrics"}]},
                                      "x-kubernetes-list-type": "atomic"}},
        "required": ["timestamp", "window", "containers"], "x-kubernetes-group-version-kind": _gvk("PodMetrics"),
    },
    f"{PACKAGE}.PodMetricsList": _list("PodMetrics"),
    f"{PACKAGE}.ContainerMetrics": {
        "description": "ContainerMetrics sets resource usage metrics of a container.", "type": "object",
        "properties": {"name": {"description": "Container name corresponding to the one from pod.spec.containers.",
                                "type": "string"}, "usage": _USAGE},
        "required": ["name", "usage"],
    },
}
