"""Custom resources: what a CustomResourceDefinition makes the registry serve.

Each served version of an established CRD becomes one
:class:`~kubeplane.api.resources.ResourceInfo` whose ``custom`` is a
:class:`CustomResourceVersion`: the CRD's accepted names, scope, the
version's schema, subresources, printer columns and selectable fields. All
versions share one storage prefix (``/registry/<group>/<plural>/``) and
objects are stored in the storage version; with conversion strategy None a
read in another version only rewrites ``apiVersion`` (upstream's
nopConverter).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from kubeplane.api import errors
from kubeplane.api.resources import ResourceInfo
from kubeplane.registry.strategies import Strategy

Obj = dict[str, Any]

CRDS_GROUP = "apiextensions.k8s.io"
#: the finalizer that makes deleting a CRD delete its custom resources first
CLEANUP_FINALIZER = "customresourcecleanup.apiextensions.k8s.io"

_VERSION = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


def version_priority(name: str) -> tuple:
    """Sort key of upstream's kube-aware version ordering: GA before beta
    before alpha, higher numbers first, then anything else by name."""
    m = _VERSION.match(name)
    if m is None:
        return (3, 0, 0, name)
    major = int(m.group(1))
    stage = {None: 0, "beta": 1, "alpha": 2}[m.group(2)]
    minor = int(m.group(3) or 0)
    return (stage, -major, -minor, name)


@dataclass(eq=False)
class CustomResourceVersion:
    """One served version of a CRD, as the registry and the API server need it."""

    crd_name: str
    crd_uid: str
    group: str
    version: str
    storage_version: str
    kind: str
    list_kind: str
    #: the openAPIV3Schema of this version (None: none given)
    schema: Obj | None
    status: bool
    #: {"specReplicasPath", "statusReplicasPath", "labelSelectorPath"} or None
    scale: Obj | None
    printer_columns: list[Obj]
    #: jsonPaths of spec.versions[].selectableFields
    selectable_fields: tuple[str, ...]
    deprecated: bool = False
    deprecation_warning: str | None = None
    #: the CRD is being deleted: creates are refused
    terminating: bool = False
    #: served versions of the CRD, highest priority first
    versions: tuple[str, ...] = ()
    #: (CRD uid, generation, terminating): what this was made from
    source: tuple = ()
    #: per-version compiled state of the schema library (validator, pruner...)
    compiled: dict[str, Any] = field(default_factory=dict)

    @property
    def storage_api_version(self) -> str:
        return f"{self.group}/{self.storage_version}"


def _condition(crd: Obj, ctype: str) -> Obj | None:
    for c in (crd.get("status") or {}).get("conditions") or ():
        if isinstance(c, dict) and c.get("type") == ctype:
            return c
    return None


def is_established(crd: Obj) -> bool:
    c = _condition(crd, "Established")
    return c is not None and c.get("status") == "True"


def resources_for_crd(crd: Obj) -> list[ResourceInfo]:
    """The resources an established CRD serves (one per served version, in
    version priority order), named by its accepted names."""
    spec = crd.get("spec") or {}
    md = crd.get("metadata") or {}
    accepted = (crd.get("status") or {}).get("acceptedNames") or {}
    names = accepted if accepted.get("plural") and accepted.get("kind") else {}
    if not names:
        return []
    group = spec.get("group") or ""
    versions = [v for v in spec.get("versions") or () if isinstance(v, dict) and v.get("served")]
    versions.sort(key=lambda v: version_priority(str(v.get("name"))))
    storage = next((v.get("name") for v in spec.get("versions") or () if isinstance(v, dict) and v.get("storage")),
                   None)
    if storage is None:
        return []
    served = tuple(str(v.get("name")) for v in versions)
    terminating = bool(md.get("deletionTimestamp"))
    out = []
    plural = names["plural"]
    kind = names["kind"]
    singular = names.get("singular") or kind.lower()
    for v in versions:
        subs = v.get("subresources") or {}
        status = isinstance(subs.get("status"), dict)
        scale = subs.get("scale") if isinstance(subs.get("scale"), dict) else None
        schema = (v.get("schema") or {}).get("openAPIV3Schema")
        info = CustomResourceVersion(
            crd_name=md.get("name", ""), crd_uid=md.get("uid", ""), group=group, version=str(v.get("name")),
            storage_version=str(storage), kind=kind, list_kind=names.get("listKind") or kind + "List",
            schema=schema if isinstance(schema, dict) else None, status=status, scale=scale,
            printer_columns=[c for c in v.get("additionalPrinterColumns") or () if isinstance(c, dict)],
            selectable_fields=tuple(str(f.get("jsonPath")) for f in v.get("selectableFields") or ()
                                    if isinstance(f, dict) and f.get("jsonPath")),
            deprecated=bool(v.get("deprecated")), deprecation_warning=v.get("deprecationWarning"),
            terminating=terminating, versions=served,
            source=(md.get("uid"), md.get("generation"), terminating),
        )
        sub_names = tuple(s for s, on in (("status", status), ("scale", scale is not None)) if on)
        out.append(ResourceInfo(
            group, info.version, kind, plural, singular, spec.get("scope") == "Namespaced",
            short_names=tuple(names.get("shortNames") or ()), categories=tuple(names.get("categories") or ()),
            subresources=sub_names, custom=info,
        ))
    return out


# -- reading and writing in another version -------------------------------------------


def to_version(res: ResourceInfo, obj: Obj) -> Obj:
    """A stored object as ``res``'s version serves it (a shallow copy when its
    apiVersion changes; the stored dict otherwise)."""
    if obj.get("apiVersion") == res.api_version or not isinstance(obj, dict):
        return obj
    if obj.get("kind") == "Status":
        return obj
    return {**obj, "apiVersion": res.api_version}


def to_storage(res: ResourceInfo, obj: Obj) -> Obj:
    """An object of ``res``'s version as it is stored (in the storage version)."""
    api_version = res.custom.storage_api_version
    if obj.get("apiVersion") == api_version:
        return obj
    return {**obj, "apiVersion": api_version}


# -- strategy ---------------------------------------------------------------------------


class CustomResourceStrategy(Strategy):
    """Upstream's customResourceStrategy: with the status subresource, status is
    written through /status only and the generation moves on other changes;
    without it the main endpoint writes the whole object and any change but
    metadata moves the generation."""

    def __init__(self, res: ResourceInfo) -> None:
        super().__init__(res)
        self.custom: CustomResourceVersion = res.custom

    @property
    def has_status(self) -> bool:
        return self.custom.status

    def default(self, obj: Obj) -> None:
        """What decoding a request does upstream: unknown fields pruned, then
        the schema's defaults applied."""
        prune(self.res, obj)
        default(self.res, obj)

    def spec_changed(self, new: Obj, old: Obj) -> bool:
        skip = ("metadata", "status", "apiVersion", "kind") if self.custom.status else ("metadata", "apiVersion", "kind")
        for k in set(new) | set(old):
            if k in skip:
                continue
            if new.get(k) != old.get(k):
                return True
        return False


# -- scale -------------------------------------------------------------------------------


def _set_path(obj: Obj, names: list[str], value: Any) -> None:
    node = obj
    for n in names[:-1]:
        nxt = node.get(n)
        if not isinstance(nxt, dict):
            nxt = {}
        else:
            nxt = dict(nxt)
        node[n] = nxt
        node = nxt
    node[names[-1]] = value


def scale_of(res: ResourceInfo, obj: Obj) -> Obj:
    """The autoscaling/v1 Scale of a custom resource (upstream's scale REST for
    CRs: replicas read at the CRD's paths; a missing status value is 0)."""
    scale = res.custom.scale or {}
    md = obj.get("metadata") or {}
    from kubeplane.api.jsonpath import find_first

    found, spec_replicas = find_first(obj, scale.get("specReplicasPath") or ".spec.replicas")
    if found and not (isinstance(spec_replicas, int) and not isinstance(spec_replicas, bool)):
        raise errors.internal(f".spec.replicas accessor error: {spec_replicas!r} is of the type "
                              f"{type(spec_replicas).__name__}, expected int64")
    _, status_replicas = find_first(obj, scale.get("statusReplicasPath") or ".status.replicas")
    selector = ""
    if scale.get("labelSelectorPath"):
        ok, sel = find_first(obj, scale["labelSelectorPath"])
        if ok and isinstance(sel, str):
            selector = sel
    status: Obj = {"replicas": status_replicas if isinstance(status_replicas, int) else 0}
    if selector:
        status["selector"] = selector
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {k: md[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                     if k in md},
        "spec": {"replicas": spec_replicas if found else 0},
        "status": status,
    }


def with_replicas(res: ResourceInfo, obj: Obj, replicas: int) -> Obj:
    """``obj`` with its spec replicas path set (copied along that path)."""
    from kubeplane.api.jsonpath import field_steps

    path = (res.custom.scale or {}).get("specReplicasPath") or ".spec.replicas"
    new = dict(obj)
    _set_path(new, field_steps(path), replicas)
    return new


# -- the CustomResourceDefinition kind ---------------------------------------------------


def _storage_version(crd: Obj) -> str | None:
    for v in (crd.get("spec") or {}).get("versions") or ():
        if isinstance(v, dict) and v.get("storage") is True:
            return v.get("name")
    return None


class CRDStrategy(Strategy):
    """Upstream's CRD strategy: defaults (singular, listKind, conversion
    None), a fresh status holding the storage version in storedVersions, and
    every new storage version added to storedVersions on update."""

    def default(self, obj: Obj) -> None:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return
        names = spec.get("names")
        if isinstance(names, dict):
            kind = names.get("kind")
            if not names.get("singular") and isinstance(kind, str) and kind:
                names["singular"] = kind.lower()
            if not names.get("listKind") and isinstance(kind, str) and kind:
                names["listKind"] = kind + "List"
        conv = spec.get("conversion")
        if conv is None:
            spec["conversion"] = {"strategy": "None"}
        elif isinstance(conv, dict):
            webhook = conv.get("webhook")
            service = ((webhook or {}).get("clientConfig") or {}).get("service") if isinstance(webhook, dict) else None
            if isinstance(service, dict) and service.get("port") is None:
                service["port"] = 443

    def initial_status(self, obj: Obj) -> Obj | None:
        storage = _storage_version(obj)
        return {"conditions": None, "acceptedNames": {"plural": "", "kind": ""},
                "storedVersions": [storage] if storage else []}

    def prepare_for_update(self, new: Obj, old: Obj) -> None:
        super().prepare_for_update(new, old)
        storage = _storage_version(new)
        status = new.get("status") if isinstance(new.get("status"), dict) else {}
        stored = list(status.get("storedVersions") or ())
        if storage and storage not in stored:
            new["status"] = {**status, "storedVersions": stored + [storage]}


def _register() -> None:
    from kubeplane.registry import strategies

    strategies._STRATEGIES[(CRDS_GROUP, "customresourcedefinitions")] = CRDStrategy


_register()


def field_getters(res: ResourceInfo) -> dict[str, Any]:
    """Field selector name → getter: metadata.name, metadata.namespace and the
    version's selectableFields (``.spec.color`` selects as ``spec.color``)."""
    cached = res.custom.compiled.get("field_getters")
    if cached is None:
        from kubeplane.api import selectors
        from kubeplane.api.jsonpath import JSONPathError, field_steps

        cached = {
            "metadata.name": selectors._path_getter("metadata", "name"),
            "metadata.namespace": selectors._path_getter("metadata", "namespace"),
        }
        for jp in res.custom.selectable_fields:
            try:
                names = field_steps(jp)
            except JSONPathError:
                continue
            cached[".".join(names)] = selectors._path_getter(*names)
        res.custom.compiled["field_getters"] = cached
    return cached


# -- the structural schema: pruning, defaulting, validation -------------------------------


def resource_schema(res: ResourceInfo) -> Any:
    """The compiled schema of a custom resource version
    (kubeplane.apiextensions.schema.ResourceSchema), built once per version;
    None when the version has no schema."""
    compiled = res.custom.compiled
    if "schema" not in compiled:
        schema = res.custom.schema
        if schema is None:
            compiled["schema"] = None
        else:
            from kubeplane.apiextensions.schema import ResourceSchema

            compiled["schema"] = ResourceSchema(schema)
    return compiled["schema"]


def prune(res: ResourceInfo, obj: Obj) -> list[str]:
    """Drops, in place, the fields the schema does not specify; returns their paths."""
    schema = resource_schema(res)
    if schema is None or not isinstance(obj, dict):
        return []
    return schema.prune(obj)


def default(res: ResourceInfo, obj: Obj) -> None:
    schema = resource_schema(res)
    if schema is not None and isinstance(obj, dict):
        schema.default(obj)


def default_on_read(res: ResourceInfo, obj: Obj) -> Obj:
    """``obj`` with the schema's defaults applied (a copy when any applies):
    fields added to a schema after objects were stored show up on read."""
    compiled = res.custom.compiled
    schema = resource_schema(res)
    if schema is None:
        return obj
    has_defaults = compiled.get("has_defaults")
    if has_defaults is None:
        has_defaults = compiled["has_defaults"] = _has_default(res.custom.schema)
    if not has_defaults:
        return obj
    # Every watcher of a change reads the same stored dict: default it once.
    memo = compiled.get("read_memo")
    if memo is None:
        from collections import OrderedDict

        memo = compiled["read_memo"] = OrderedDict()
    hit = memo.get(id(obj))
    if hit is not None and hit[0] is obj:
        return hit[1]
    tree = compiled.get("defaults_tree", False)
    if tree is False:
        tree = compiled["defaults_tree"] = _defaults_tree(res.custom.schema)
    if not _needs_default(obj, tree):
        memo[id(obj)] = (obj, obj)
        if len(memo) > 1024:
            memo.popitem(last=False)
        return obj  # written under a schema with these defaults: nothing to add
    from kubeplane.api.meta import deep_copy

    copy = deep_copy(obj)
    schema.default(copy)
    out = obj if copy == obj else copy
    memo[id(obj)] = (obj, out)  # holding obj keeps its id unique
    if len(memo) > 1024:
        memo.popitem(last=False)
    return out


def _defaults_tree(schema: Any, depth: int = 0) -> Any:
    """The part of a schema defaulting can act on: for objects
    ``("o", {property: (has default, subtree)}, additionalProperties subtree)``,
    for arrays ``("a", items subtree)``; None where no default lies below."""
    if not isinstance(schema, dict) or depth > 64:
        return None
    props = schema.get("properties")
    out: dict[str, Any] = {}
    if isinstance(props, dict):
        for k, sub in props.items():
            if not isinstance(sub, dict):
                continue
            tree = _defaults_tree(sub, depth + 1)
            if "default" in sub or tree is not None:
                out[k] = ("default" in sub, tree)
    extra = _defaults_tree(schema.get("additionalProperties"), depth + 1)
    items = _defaults_tree(schema.get("items"), depth + 1)
    if items is not None:
        return ("a", items)
    if out or extra is not None:
        return ("o", out, extra)
    return None


def _needs_default(value: Any, tree: Any) -> bool:
    """Whether defaulting could change ``value``: a property with a default is
    missing or null somewhere. A quick walk over the defaulted paths only
    (no copy), so objects already defaulted are served as stored."""
    if tree is None:
        return False
    if tree[0] == "a":
        return isinstance(value, list) and any(_needs_default(v, tree[1]) for v in value)
    if not isinstance(value, dict):
        return False
    for k, (defaulted, sub) in tree[1].items():
        child = value.get(k)
        if child is None:
            if defaulted:
                return True
        elif sub is not None and _needs_default(child, sub):
            return True
    if tree[2] is not None:
        return any(_needs_default(v, tree[2]) for v in value.values())
    return False


def _has_default(node: Any) -> bool:
    if isinstance(node, dict):
        return "default" in node or any(_has_default(v) for k, v in node.items() if k != "default")
    if isinstance(node, list):
        return any(_has_default(v) for v in node)
    return False


def validate(res: ResourceInfo, obj: Obj, old: Obj | None) -> list[Any]:
    """The schema's errors (OpenAPI value validations, then CEL rules) of a
    write; on a status update only what the status change can break."""
    schema = resource_schema(res)
    if schema is None:
        return []
    return schema.validate(obj, old)


# -- apply: list types and map types from the schema ---------------------------------------


def apply_tables(schema: Obj | None) -> tuple[frozenset, dict]:
    """(atomic map paths, list strategies by path) of a CR schema, in the shape
    :mod:`kubeplane.api.patch` keeps them for server-side apply."""
    from kubeplane.api.patch import ListStrategy

    atomic: set[tuple[str, ...]] = set()
    lists: dict[tuple[str, ...], Any] = {}

    def walk(node: Any, path: tuple[str, ...], depth: int) -> None:
        if not isinstance(node, dict) or depth > 64:
            return
        typ = node.get("type")
        if typ == "object" or "properties" in node:
            if path and node.get("x-kubernetes-map-type") == "atomic":
                atomic.add(path)
            for k, child in (node.get("properties") or {}).items():
                walk(child, path + (k,), depth + 1)
        elif typ == "array":
            lt = node.get("x-kubernetes-list-type")
            items = node.get("items") if isinstance(node.get("items"), dict) else {}
            if lt == "map":
                keys = tuple(str(k) for k in node.get("x-kubernetes-list-map-keys") or ())
                props = items.get("properties") or {}
                defaults = tuple((k, props[k]["default"]) for k in keys
                                 if isinstance(props.get(k), dict) and "default" in props[k])
                lists[path] = ListStrategy(False, None, "map", keys, defaults)
            elif lt == "set":
                lists[path] = ListStrategy(False, None, "set")
            walk(items, path + ("*",), depth + 1)

    walk(schema or {}, (), 0)
    return frozenset(atomic), lists


def register_apply_tables(infos: list[ResourceInfo]) -> None:
    """Makes server-side apply merge these custom resources by their schema."""
    from kubeplane.api import apply as ssa
    from kubeplane.api import patch as patching

    for res in infos:
        if res.custom is None:
            continue
        atomic, lists = apply_tables(res.custom.schema)
        key = (res.group, res.kind)
        patching.LIST_STRATEGIES[key] = {**patching._META, **lists}
        patching.ATOMIC_MAPS[key] = atomic
        ssa._schemas.pop(key, None)


# -- deleting a CRD -------------------------------------------------------------------------


def set_condition(crd: Obj, ctype: str, status: str, reason: str, message: str, now: str) -> Obj:
    """``crd`` (copied at the status) with the condition set; the transition
    time moves only when the status does."""
    st = dict(crd.get("status") or {})
    conds = [dict(c) for c in st.get("conditions") or () if isinstance(c, dict)]
    for c in conds:
        if c.get("type") == ctype:
            if c.get("status") != status:
                c["lastTransitionTime"] = now
            c["status"], c["reason"], c["message"] = status, reason, message
            break
    else:
        conds.append({"type": ctype, "status": status, "lastTransitionTime": now, "reason": reason,
                      "message": message})
    st["conditions"] = conds
    return {**crd, "status": st}


def mark_crd_terminating(crd: Obj, now: str) -> Obj:
    """The first delete of a CRD: the cleanup finalizer and the Terminating
    condition (upstream's CRD REST Delete)."""
    md = dict(crd.get("metadata") or {})
    finalizers = list(md.get("finalizers") or [])
    if CLEANUP_FINALIZER not in finalizers:
        finalizers.append(CLEANUP_FINALIZER)
    md["finalizers"] = finalizers
    out = set_condition({**crd, "metadata": md}, "Terminating", "True", "InstanceDeletionPending",
                        "CustomResourceDefinition marked for deletion; CustomResource deletion will begin soon", now)
    return out
