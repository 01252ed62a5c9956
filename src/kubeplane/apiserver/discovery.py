"""Discovery documents: aggregated (apidiscovery.k8s.io/v2) and legacy.

kubectl asks for the aggregated form and must get it with its own
Content-Type; the Python DynamicClient uses the legacy per-group-version
lists. Both are built from the resource catalogue.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from kubeplane.api.resources import Catalogue, ResourceInfo

Obj = dict[str, Any]

AGGREGATED_CONTENT_TYPE = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
AGGREGATED_V2BETA1_CONTENT_TYPE = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"

_SUB_VERBS = {
    "status": ["get", "patch", "update"],
    "scale": ["get", "patch", "update"],
    "binding": ["create"],
    "log": ["get"],
    "finalize": ["update"],
    "approval": ["get", "patch", "update"],
    "token": ["create"],
    "eviction": ["create"],
    "exec": ["create", "get"],
    "attach": ["create", "get"],
    "portforward": ["create", "get"],
}

#: the options kinds of the connect subresources
_CONNECT_KINDS = {"exec": "PodExecOptions", "attach": "PodAttachOptions", "portforward": "PodPortForwardOptions"}


def _sub_kind(res: ResourceInfo, sub: str) -> Obj:
    if sub == "scale":
        return {"group": "autoscaling", "version": "v1", "kind": "Scale"}
    if sub == "binding":
        return {"group": "", "version": "v1", "kind": "Binding"}
    if sub == "token":
        return {"group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest"}
    if sub == "eviction":
        return {"group": "policy", "version": "v1", "kind": "Eviction"}
    if sub in _CONNECT_KINDS and res.key == ("", "pods"):
        return {"group": "", "version": "v1", "kind": _CONNECT_KINDS[sub]}
    return {"group": res.group, "version": res.version, "kind": res.kind}


def _aggregated_resource(res: ResourceInfo) -> Obj:
    out: Obj = {
        "resource": res.plural,
        "responseKind": {"group": res.group, "version": res.version, "kind": res.kind},
        "scope": "Namespaced" if res.namespaced else "Cluster",
        "singularResource": res.singular,
        "verbs": list(res.verbs),
    }
    if res.short_names:
        out["shortNames"] = list(res.short_names)
    if res.categories:
        out["categories"] = list(res.categories)
    if res.subresources:
        out["subresources"] = [
            {"subresource": s, "responseKind": _sub_kind(res, s), "verbs": _SUB_VERBS.get(s, ["get"])}
            for s in res.subresources
        ]
    return out


def aggregated(catalogue: Catalogue, core: bool, api_version: str = "apidiscovery.k8s.io/v2") -> Obj:
    """The APIGroupDiscoveryList for ``/api`` (core) or ``/apis``."""
    groups: dict[str, list[tuple[str, list[ResourceInfo]]]] = {}
    for group, version in catalogue.group_versions():
        if (group == "") != core:
            continue
        groups.setdefault(group, []).append((version, catalogue.in_group_version(group, version)))
    items = []
    for group, versions in groups.items():
        items.append({
            "metadata": {"name": group, "creationTimestamp": None},
            "versions": [
                {"version": v, "freshness": "Current", "resources": [_aggregated_resource(r) for r in rs]}
                for v, rs in versions
            ],
        })
    return {"kind": "APIGroupDiscoveryList", "apiVersion": api_version, "metadata": {}, "items": items}


def storage_version_hash(group: str, version: str, kind: str) -> str:
    """Upstream's opaque storage version hash: base64 of the first 8 bytes of
    sha256("group/version/kind") of the version objects are stored in. Clients
    (the storage version migrator, garbage collectors) compare it for equality
    to notice a change of storage version."""
    digest = hashlib.sha256(f"{group}/{version}/{kind}".encode()).digest()
    return base64.b64encode(digest[:8]).decode("ascii")


def api_versions(server_address: str) -> Obj:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def _group(catalogue: Catalogue, group: str) -> Obj | None:
    versions = [v for g, v in catalogue.group_versions() if g == group]
    if not versions:
        return None
    gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": gvs, "preferredVersion": gvs[0]}


def api_group_list(catalogue: Catalogue) -> Obj:
    names: list[str] = []
    for g, _ in catalogue.group_versions():
        if g and g not in names:
            names.append(g)
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group(catalogue, g) for g in names]}


def api_group(catalogue: Catalogue, group: str) -> Obj | None:
    g = _group(catalogue, group)
    if g is None:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **g}


def api_resource_list(catalogue: Catalogue, group: str, version: str) -> Obj | None:
    resources = catalogue.in_group_version(group, version)
    if not resources:
        return None
    out = []
    for r in resources:
        entry: Obj = {
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": list(r.verbs),
        }
        if r.short_names:
            entry["shortNames"] = list(r.short_names)
        if r.categories:
            entry["categories"] = list(r.categories)
        # Each resource is served and stored in its one version. Only the
        # legacy APIResource has the field; aggregated discovery (v2) does not.
        stored_in = r.custom.storage_version if r.custom is not None else r.version
        entry["storageVersionHash"] = storage_version_hash(r.group, stored_in, r.kind)
        out.append(entry)
        for s in r.subresources:
            kind = _sub_kind(r, s)
            sub: Obj = {"name": f"{r.plural}/{s}", "singularName": "", "namespaced": r.namespaced,
                        "kind": kind["kind"], "verbs": _SUB_VERBS.get(s, ["get"])}
            if kind["group"] != r.group or kind["version"] != r.version:
                sub["group"], sub["version"] = kind["group"], kind["version"]
            out.append(sub)
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": out}
