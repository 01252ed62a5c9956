"""Generate the OpenAPI component schemas kubeplane serves.

The schemas are derived from the model classes of the official Python client
(``kubernetes`` package, a test-only dependency): each model's field table,
pydantic annotations and descriptions become an OpenAPI v3 schema named as
upstream names it (``io.k8s.api.core.v1.Pod``). Only the models reachable
from the kinds in the resource catalogue (plus their lists, ``Status``,
``DeleteOptions``, ``Scale``, ``Binding`` and ``WatchEvent``) are emitted.

Run it after changing the catalogue or upgrading the client::

    python -m kubeplane.apiserver.gen_schemas            # rewrite the data file
    python -m kubeplane.apiserver.gen_schemas --check    # exit 1 if out of date

The output is ``schemas/components.json`` next to this module; it is package
data read by :mod:`kubeplane.apiserver.openapi`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
import typing
from pathlib import Path
from typing import Any

from kubeplane.api.resources import RESOURCES

OUTPUT = Path(__file__).with_name("schemas") / "components.json"

META = "io.k8s.apimachinery.pkg.apis.meta.v1"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
TIME = f"{META}.Time"
MICRO_TIME = f"{META}.MicroTime"
RAW_EXTENSION = "io.k8s.apimachinery.pkg.runtime.RawExtension"
FIELDS_V1 = f"{META}.FieldsV1"
PATCH = f"{META}.Patch"

# Upstream package (io.k8s.api.<pkg>.v1) per API group.
GROUP_PACKAGE = {
    "": "core",
    "apps": "apps",
    "batch": "batch",
    "policy": "policy",
    "autoscaling": "autoscaling",
    "storage.k8s.io": "storage",
    "coordination.k8s.io": "coordination",
    "scheduling.k8s.io": "scheduling",
    "resource.k8s.io": "resource",
    "rbac.authorization.k8s.io": "rbac",
    "authorization.k8s.io": "authorization",
    "certificates.k8s.io": "certificates",
    "authentication.k8s.io": "authentication",
    "admissionregistration.k8s.io": "admissionregistration",
    # -- job --

    # -- cronjob --

    # -- statefulset --

    # -- daemonset --

    # -- endpoints --
    "discovery.k8s.io": "discovery",
    "networking.k8s.io": "networking",

    # -- hpa --
    # no client models: hand-written (kubeplane.apiserver.schemas_metrics), named as metrics-server's
    "metrics.k8s.io": "io.k8s.metrics.pkg.apis.metrics",

    # -- maintenance --

    # -- quota --

    # not in k8s.io/api: upstream names these after their Go package
    "apiextensions.k8s.io": "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions",
}

# Models that live in meta/v1 upstream (client class names).
META_MODELS = {
    "V1ObjectMeta", "V1ListMeta", "V1LabelSelector", "V1LabelSelectorRequirement",
    "V1ManagedFieldsEntry", "V1OwnerReference", "V1Status", "V1StatusDetails",
    "V1StatusCause", "V1DeleteOptions", "V1Preconditions", "V1Condition", "V1WatchEvent",
    "V1FieldSelectorRequirement",
}

# Client version prefixes of models outside the catalogue's group-versions
# (alpha workload types referenced from batch/v1 Job).
VERSIONED_PACKAGES = {"V1alpha3": "io.k8s.api.scheduling.v1alpha3"}

# Core/v1 models first reached from a non-core root.
CORE_MODELS = {
    "V1PodTemplateSpec", "V1TopologySelectorTerm", "V1TopologySelectorLabelRequirement",
    "V1TypedLocalObjectReference", "V1TypedObjectReference", "V1ObjectReference",
    "V1NodeSelector", "V1NodeSelectorTerm", "V1NodeSelectorRequirement",
}

# Client class for a catalogue kind when it is not simply "V1" + kind.
CLASS_OVERRIDES = {
    ("", "Event"): "CoreV1Event",
    ("", "EventList"): "CoreV1EventList",
    ("resource.k8s.io", "ResourceClaim"): "ResourceV1ResourceClaim",
}

# Extra top-level kinds: (group, version, kind, client class).
EXTRA_KINDS = (
    ("", "v1", "Binding", "V1Binding"),
    ("autoscaling", "v1", "Scale", "V1Scale"),
    ("", "v1", "Status", "V1Status"),
    ("", "v1", "DeleteOptions", "V1DeleteOptions"),
    ("", "v1", "WatchEvent", "V1WatchEvent"),
    # the body of serviceaccounts/<name>/token
    ("authentication.k8s.io", "v1", "TokenRequest", "AuthenticationV1TokenRequest"),
    # the body of pods/<name>/eviction
    ("policy", "v1", "Eviction", "V1Eviction"),
)

# Fields whose upstream type is resource.Quantity; the client types them as str.
# Keys are client class names, values the Python attribute names.
QUANTITY_FIELDS: dict[str, set[str]] = {
    "V1ResourceRequirements": {"limits", "requests"},
    "V1VolumeResourceRequirements": {"limits", "requests"},
    "V1EmptyDirVolumeSource": {"size_limit"},
    "V1ResourceFieldSelector": {"divisor"},
    "V1PodSpec": {"overhead"},
    "V1ContainerStatus": {"allocated_resources"},
    "V1PersistentVolumeSpec": {"capacity"},
    "V1PersistentVolumeClaimStatus": {"capacity", "allocated_resources"},
    "V1NodeStatus": {"capacity", "allocatable"},
    "V1CSIStorageCapacity": {"capacity", "maximum_volume_size"},
    "V1DeviceCapacity": {"value"},
    "V1Counter": {"value"},
    "V1CapacityRequirements": {"requests"},
    "V1DeviceRequestAllocationResult": {"consumed_capacity"},
    "V1CapacityRequestPolicy": {"default", "valid_values"},
    "V1CapacityRequestPolicyRange": {"min", "max", "step"},
    "V1PodStatus": {"allocated_resources"},
    "V1NodeAllocatableMapping": {"capacity_multiplier", "device_multiplier"},
    "V1NodeAllocatableOverhead": {"per_container", "per_pod"},
    "V1NodeAllocatableMappedResources": {"quantity"},
    "V1NodeAllocatableOverheadResources": {"per_container", "per_pod"},
    "V2MetricTarget": {"value", "average_value"},
    "V2MetricValueStatus": {"value", "average_value"},
    "V2HPAScalingRules": {"tolerance"},
}

# MicroTime fields (the client types them as datetime, like Time).
MICRO_TIME_FIELDS: dict[str, set[str]] = {
    "CoreV1Event": {"event_time"},
    "V1LeaseSpec": {"acquire_time", "renew_time"},
}

# Free-form "object" fields: which upstream type they are.
OBJECT_FIELDS: dict[tuple[str, str], str] = {
    ("V1ManagedFieldsEntry", "fields_v1"): FIELDS_V1,
    ("V1AllocatedDeviceStatus", "data"): RAW_EXTENSION,
    ("V1OpaqueDeviceConfiguration", "parameters"): RAW_EXTENSION,
    ("V1WatchEvent", "object"): RAW_EXTENSION,
}

SPECIAL_SCHEMAS: dict[str, dict[str, Any]] = {
    QUANTITY: {
        "description": (
            "Quantity is a fixed-point representation of a number, serialized as a string "
            "such as \"100m\", \"2Gi\" or \"1.5\"; plain JSON numbers are accepted too."
        ),
        "oneOf": [{"type": "string"}, {"type": "number"}],
    },
    INT_OR_STRING: {
        "description": (
            "IntOrString is a type that can hold an int32 or a string. When used in JSON "
            "or YAML marshalling and unmarshalling, it produces or consumes the inner type."
        ),
        "format": "int-or-string",
        "oneOf": [{"type": "integer"}, {"type": "string"}],
        "x-kubernetes-int-or-string": True,
    },
    TIME: {
        "description": "Time is a wrapper around time.Time serialized as an RFC 3339 date and time.",
        "type": "string",
        "format": "date-time",
    },
    MICRO_TIME: {
        "description": "MicroTime is a version of Time with microsecond level precision.",
        "type": "string",
        "format": "date-time",
    },
    RAW_EXTENSION: {
        "description": "RawExtension holds an arbitrary embedded JSON object.",
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
    },
    PATCH: {
        "description": (
            "Patch is provided to give a concrete name and type to the Kubernetes PATCH request body."
        ),
        "type": "object",
    },
    FIELDS_V1: {
        "description": "FieldsV1 stores a set of fields in a data structure like a Trie, in JSON format.",
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
    },
}

_PREFIX = re.compile(r"^(?:[A-Z][a-z]+)*?V\d+(?:alpha\d+|beta\d+)?(?=[A-Z])")
_LIST = re.compile(r"^List\[(.+)\]$")
_DICT = re.compile(r"^Dict\[str, (.+)\]$")


def _models() -> Any:
    return importlib.import_module("kubernetes.client.models")


def short_name(cls_name: str) -> str:
    """``V1Pod`` -> ``Pod``, ``CoreV1Event`` -> ``Event``."""
    return _PREFIX.sub("", cls_name, count=1)


def _class_for(group: str, kind: str, version: str = "v1") -> str:
    return CLASS_OVERRIDES.get((group, kind), "V" + version[1:] + kind)


#: groups whose schemas are written by hand (the client has no models for them)
HANDWRITTEN_GROUPS = frozenset({"metrics.k8s.io"})


def _version_of(prefix: str) -> str:
    """``V2`` -> ``v2``, ``AuthenticationV1`` -> ``v1``: the version a client class belongs to."""
    m = re.search(r"V(\d+(?:alpha\d+|beta\d+)?)$", prefix)
    return "v" + m.group(1) if m else "v1"


def _doc(cls: type) -> str:
    text = (cls.__doc__ or "").split("Attributes:")[0]
    return " ".join(text.split())


def _model_refs(type_str: str) -> list[str]:
    return re.findall(r"\b((?:[A-Z][a-z]+)*V\d+[A-Za-z0-9]+)\b", type_str)


class Generator:
    """Walks client models from the roots and emits component schemas."""

    def __init__(self) -> None:
        self.models = _models()
        self.names: dict[str, str] = {}  # client class -> schema name
        self.schemas: dict[str, dict[str, Any]] = {}
        self.gvks: dict[str, list[dict[str, str]]] = {}

    def _assign(self, root: str, package: str) -> None:
        stack = [(root, False)]
        while stack:
            cls_name, in_meta = stack.pop()
            if cls_name in self.names:
                continue
            versioned = _PREFIX.match(cls_name)
            prefix = versioned.group(0) if versioned else ""
            if in_meta or cls_name in META_MODELS:
                in_meta = True
                self.names[cls_name] = f"{META}.{short_name(cls_name)}"
            elif prefix in VERSIONED_PACKAGES:
                self.names[cls_name] = f"{VERSIONED_PACKAGES[prefix]}.{short_name(cls_name)}"
            elif cls_name in CORE_MODELS or cls_name.startswith("CoreV1"):
                self.names[cls_name] = f"io.k8s.api.core.v1.{short_name(cls_name)}"
            else:
                base = package if package.startswith("io.") else f"io.k8s.api.{package}"
                self.names[cls_name] = f"{base}.{_version_of(prefix)}.{short_name(cls_name)}"
            cls = getattr(self.models, cls_name)
            for type_str in cls.openapi_types.values():
                stack.extend((r, in_meta) for r in _model_refs(type_str) if r not in self.names)

    def _add_gvk(self, cls_name: str, group: str, version: str, kind: str) -> None:
        self.gvks.setdefault(cls_name, []).append({"group": group, "kind": kind, "version": version})

    def collect(self) -> None:
        roots: list[tuple[str, str, str, str]] = []
        for r in RESOURCES:
            if r.group in HANDWRITTEN_GROUPS:
                continue
            roots.append((r.group, r.version, r.kind, _class_for(r.group, r.kind, r.version)))
            if "list" in r.verbs:  # create-only kinds (reviews) have no list
                roots.append((r.group, r.version, r.list_kind, _class_for(r.group, r.list_kind, r.version)))
        roots.extend(EXTRA_KINDS)
        # Core roots first so shared types land in core/v1.
        roots.sort(key=lambda t: t[0] != "")
        for group, version, kind, cls_name in roots:
            self._assign(cls_name, GROUP_PACKAGE[group])
            self._add_gvk(cls_name, group, version, kind)
        for group, version in sorted({(r.group, r.version) for r in RESOURCES if r.group not in HANDWRITTEN_GROUPS}):
            if group:
                self._add_gvk("V1DeleteOptions", group, version, "DeleteOptions")

    def _field(self, cls_name: str, attr: str, type_str: str, annotation: Any) -> dict[str, Any]:
        if attr in QUANTITY_FIELDS.get(cls_name, ()):
            # The innermost element type is the Quantity: str, List[str], Dict[str, str].
            quantity_type = re.sub(r"\bstr(\]?)$", r"Quantity\1", type_str)
            return self._convert(quantity_type, cls_name, attr, annotation)
        if attr in MICRO_TIME_FIELDS.get(cls_name, ()):
            return {"$ref": MICRO_TIME}
        return self._convert(type_str, cls_name, attr, annotation)

    def _convert(self, type_str: str, cls_name: str, attr: str, annotation: Any) -> dict[str, Any]:
        m = _LIST.match(type_str)
        if m:
            return {"type": "array", "items": self._convert(m.group(1), cls_name, attr, annotation)}
        m = _DICT.match(type_str)
        if m:
            return {"type": "object",
                    "additionalProperties": self._convert(m.group(1), cls_name, attr, annotation)}
        if type_str == "Quantity":
            return {"$ref": QUANTITY}
        if type_str == "str":
            return {"type": "string"}
        if type_str == "int":
            return {"type": "integer", "format": _int_format(attr)}
        if type_str == "float":
            return {"type": "number", "format": "double"}
        if type_str == "bool":
            return {"type": "boolean"}
        if type_str == "bytes":
            return {"type": "string", "format": "byte"}
        if type_str == "datetime":
            return {"$ref": TIME}
        if type_str == "object":
            special = OBJECT_FIELDS.get((cls_name, attr))
            if special:
                return {"$ref": special}
            args = typing.get_args(annotation)
            has_int = any(a is int or _is_annotated(a, int) for a in args)
            has_str = any(a is str or _is_annotated(a, str) for a in args)
            if has_int and has_str:
                return {"$ref": INT_OR_STRING}
            return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        if type_str in self.names:
            return {"$ref": self.names[type_str]}
        raise ValueError(f"unhandled type {type_str!r} on {cls_name}.{attr}")

    def _check_tables(self) -> None:
        """Fail loudly when a hand-kept field table names a field the client lacks."""
        for table in (QUANTITY_FIELDS, MICRO_TIME_FIELDS):
            for cls_name, attrs in table.items():
                if cls_name not in self.names:
                    continue
                missing = attrs - set(getattr(self.models, cls_name).openapi_types)
                if missing:
                    raise ValueError(f"{cls_name} has no field(s) {sorted(missing)}")

    def build(self) -> None:
        self._check_tables()
        for cls_name, schema_name in self.names.items():
            cls = getattr(self.models, cls_name)
            props: dict[str, Any] = {}
            required: list[str] = []
            by_wire = {(f.serialization_alias or n): f for n, f in cls.model_fields.items()}
            for attr, wire in cls.attribute_map.items():
                finfo = cls.model_fields.get(attr) or by_wire[wire]
                prop = self._field(cls_name, attr, cls.openapi_types[attr], finfo.annotation)
                desc = " ".join((finfo.description or "").split())
                if "$ref" in prop:
                    prop = {"allOf": [{"$ref": "#/components/schemas/" + prop["$ref"]}]}
                else:
                    _expand_refs(prop)
                if desc:
                    prop["description"] = desc
                props[wire] = prop
                if finfo.is_required():
                    required.append(wire)
            schema: dict[str, Any] = {"description": _doc(cls), "type": "object",
                                      "properties": dict(sorted(props.items()))}
            if required:
                schema["required"] = required
            if cls_name in self.gvks:
                schema["x-kubernetes-group-version-kind"] = self.gvks[cls_name]
            self.schemas[schema_name] = schema
        for name, schema in SPECIAL_SCHEMAS.items():
            self.schemas[name] = schema
        from kubeplane.apiserver.schemas_metrics import SCHEMAS as METRICS_SCHEMAS

        self.schemas.update(METRICS_SCHEMAS)

    def output(self) -> dict[str, Any]:
        return {
            "source": "kubernetes python client " + _client_version(),
            "schemas": dict(sorted(self.schemas.items())),
        }


def _is_annotated(a: Any, base: type) -> bool:
    return typing.get_origin(a) is typing.Annotated and typing.get_args(a)[0] is base


def _expand_refs(node: dict[str, Any]) -> None:
    """Turn the internal short ``$ref`` form into a JSON pointer, recursively."""
    if "$ref" in node:
        node["$ref"] = "#/components/schemas/" + node["$ref"]
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            _expand_refs(node[key])


_INT64_NAMES = {
    "generation", "observedGeneration", "runAsUser", "runAsGroup", "fsGroup",
    "supplementalGroups", "expirationSeconds", "count", "value",
}


def _int_format(attr: str) -> str:
    """Best guess at int32/int64; the client does not keep the format."""
    camel = re.sub(r"_([a-z])", lambda m: m.group(1).upper(), attr)
    if camel in _INT64_NAMES or camel.endswith("Seconds") or camel.endswith("Generation"):
        return "int64"
    return "int32"


def _client_version() -> str:
    try:
        return importlib.import_module("kubernetes").__version__
    except Exception:  # pragma: no cover - version is informational only
        return "unknown"


def generate() -> dict[str, Any]:
    gen = Generator()
    gen.collect()
    gen.build()
    return gen.output()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if the data file is stale")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    text = json.dumps(generate(), sort_keys=False, separators=(",", ":")) + "\n"
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is out of date", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(f"wrote {args.output} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
