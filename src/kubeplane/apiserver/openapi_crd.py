"""OpenAPI documents of custom resources, built from their CRDs' schemas.

Each group-version of custom resources gets an OpenAPI 3.0 document of its
own (what ``kubectl explain`` reads, with the schema's descriptions) and is
merged into the Swagger 2.0 document of ``/openapi/v2``. Documents depend
on the catalogue only, so they are cached by the catalogue's generation: a
CRD that becomes established (or goes) changes the generation, and the
next request sees the new documents.
"""

from __future__ import annotations

import copy
import hashlib
import threading
from typing import Any

import orjson

from kubeplane.api.resources import Catalogue, ResourceInfo
from kubeplane.apiserver import openapi

Obj = dict[str, Any]

_OBJECT_META = f"{openapi.META}.ObjectMeta"
_LIST_META = f"{openapi.META}.ListMeta"
_API_VERSION_DOC = (
    "APIVersion defines the versioned schema of this representation of an object. Servers should convert "
    "recognized schemas to the latest internal value, and may reject unrecognized values. More info: "
    "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources")
_KIND_DOC = (
    "Kind is a string value representing the REST resource this object represents. Servers may infer this from "
    "the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: "
    "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds")
_METADATA_DOC = ("Standard object's metadata. More info: "
                 "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata")
_LIST_METADATA_DOC = ("Standard list metadata. More info: "
                      "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#lists-and-slices")


def component_name(group: str, version: str, kind: str) -> str:
    """``com.example.stable.v1.CronTab`` for group stable.example.com (the
    group's labels reversed, as upstream names CRD components)."""
    return ".".join(reversed(group.split("."))) + f".{version}.{kind}"


def _schema_for(r: ResourceInfo) -> Obj:
    raw = copy.deepcopy(r.custom.schema) if r.custom.schema else {"type": "object",
                                                                 "x-kubernetes-preserve-unknown-fields": True}
    props = raw.setdefault("properties", {}) if raw.get("type", "object") == "object" else {}
    props["apiVersion"] = {"description": _API_VERSION_DOC, "type": "string"}
    props["kind"] = {"description": _KIND_DOC, "type": "string"}
    props["metadata"] = {"allOf": [openapi._ref(_OBJECT_META)], "description": _METADATA_DOC}
    raw.setdefault("type", "object")
    raw["x-kubernetes-group-version-kind"] = [openapi._gvk(r.group, r.version, r.kind)]
    return raw


def _list_schema_for(r: ResourceInfo, item: str) -> Obj:
    return {
        "description": f"{r.list_kind} is a list of {r.kind}",
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": {"description": _API_VERSION_DOC, "type": "string"},
            "items": {"description": f"List of {r.plural}. More info: "
                                     "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md",
                      "type": "array", "items": openapi._ref(item)},
            "kind": {"description": _KIND_DOC, "type": "string"},
            "metadata": {"allOf": [openapi._ref(_LIST_META)], "description": _LIST_METADATA_DOC},
        },
        "x-kubernetes-group-version-kind": [openapi._gvk(r.group, r.version, r.list_kind)],
    }


#: media types custom resources are not served in
_NOT_FOR_CUSTOM = frozenset({"application/vnd.kubernetes.protobuf", "application/strategic-merge-patch+json"})


def _json_only(paths: Obj) -> None:
    """Custom resources have no protobuf form and take no strategic merge
    patch: their operations list neither (in place)."""
    for item in paths.values():
        for op in item.values():
            if not isinstance(op, dict):
                continue
            body = op.get("requestBody")
            holders = [body] if isinstance(body, dict) else []
            holders += [r for r in (op.get("responses") or {}).values() if isinstance(r, dict)]
            for holder in holders:
                content = holder.get("content")
                if isinstance(content, dict):
                    holder["content"] = {k: v for k, v in content.items() if k not in _NOT_FOR_CUSTOM}


def build_document(resources: list[ResourceInfo]) -> Obj:
    paths: Obj = {}
    used: set[str] = {_OBJECT_META, _LIST_META}
    own: Obj = {}
    for r in resources:
        name = component_name(r.group, r.version, r.kind)
        list_name = component_name(r.group, r.version, r.list_kind)
        more_paths, more_used = openapi._resource_paths(r, (name, list_name))
        more_paths = copy.deepcopy(more_paths)
        _json_only(more_paths)
        paths.update(more_paths)
        used |= more_used
        own[name] = _schema_for(r)
        own[list_name] = _list_schema_for(r, name)
    components = openapi._closure(used - set(own))
    components.update(own)
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes CRD Swagger", "version": "v0.1.0"},
        "paths": dict(sorted(paths.items())),
        "components": {"schemas": dict(sorted(components.items()))},
    }


class CustomDocuments:
    """The OpenAPI documents of one catalogue's custom resources, rebuilt
    after the catalogue changes."""

    def __init__(self, catalogue: Catalogue) -> None:
        self.catalogue = catalogue
        self._lock = threading.Lock()
        self._generation = -1
        self._v3: dict[tuple[str, str], tuple[Obj, bytes, str]] = {}
        self._v2: dict[str, tuple[bytes, str]] = {}

    def _custom_gvs(self) -> dict[tuple[str, str], list[ResourceInfo]]:
        gvs: dict[tuple[str, str], list[ResourceInfo]] = {}
        for r in self.catalogue.resources:
            if r.custom is not None:
                gvs.setdefault((r.group, r.version), []).append(r)
        return gvs

    def _fresh(self) -> None:
        if self._generation == self.catalogue.generation:
            return
        with self._lock:
            generation = self.catalogue.generation
            v3 = {}
            for gv, rs in self._custom_gvs().items():
                doc = build_document(rs)
                body = orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)
                v3[gv] = (doc, body, hashlib.sha512(body).hexdigest().upper())
            self._v3, self._v2, self._generation = v3, {}, generation

    def group_versions(self) -> list[tuple[str, str]]:
        self._fresh()
        return list(self._v3)

    def v3(self, group: str, version: str) -> tuple[Obj, bytes, str] | None:
        self._fresh()
        return self._v3.get((group, version))

    def v3_index(self) -> Obj:
        index = openapi.v3_index()
        for (group, version), (_, _, digest) in sorted(self._v3_items()):
            key = openapi._gv_path(group, version)
            index["paths"][key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash={digest}"}
        return index

    def _v3_items(self):
        self._fresh()
        return [(gv, entry) for gv, entry in self._v3.items()]

    def v2(self, fmt: str) -> tuple[bytes, str]:
        """The Swagger 2.0 document with the custom resources merged in: "json" or "protobuf"."""
        self._fresh()
        if not self._v3:
            return openapi.v2_document_bytes() if fmt == "json" else openapi.v2_document_protobuf()
        cached = self._v2.get(fmt)
        if cached is not None:
            return cached
        doc = openapi.v2_document()
        for _, (v3doc, _, _) in sorted(self._v3.items()):
            for path, item in v3doc["paths"].items():
                doc["paths"][path] = {key: ([openapi._v2_parameter(p) for p in value] if key == "parameters"
                                            else openapi._v2_operation(value)) for key, value in item.items()}
            for name, schema in v3doc["components"]["schemas"].items():
                doc["definitions"].setdefault(name, openapi._v2_schema(schema))
        doc["paths"] = dict(sorted(doc["paths"].items()))
        doc["definitions"] = dict(sorted(doc["definitions"].items()))
        if fmt == "json":
            body = orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)
        else:
            from kubeplane.apiserver.openapi_v2pb import encode_document

            body = encode_document(doc)
        entry = (body, hashlib.sha512(body).hexdigest().upper())
        self._v2[fmt] = entry
        return entry
