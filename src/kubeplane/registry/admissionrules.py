"""Which requests an admission rule covers (upstream's
``admission/plugin/webhook/predicates/rules`` matcher), shared by the
admission webhooks and ValidatingAdmissionPolicy: operations, API groups and
versions, resources with ``name/sub`` and ``*`` wildcards, scope, and for
policies resourceNames; plus the objectSelector test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubeplane.api.resources import ResourceInfo, resource
from kubeplane.api.selectors import LabelSelector

NAMESPACES = resource("namespaces")

#: the older groups a resource is also served under upstream, for
#: ``matchPolicy: Equivalent`` (kubeplane serves each resource in one version)
EQUIVALENT_GROUPS = {
    ("apps", "deployments"): ("extensions",), ("apps", "replicasets"): ("extensions",),
    ("apps", "daemonsets"): ("extensions",), ("networking.k8s.io", "networkpolicies"): ("extensions",),
    ("policy", "podsecuritypolicies"): ("extensions",),
}


@dataclass(slots=True, frozen=True)
class Rule:
    operations: tuple[str, ...]
    groups: tuple[str, ...]
    versions: tuple[str, ...]
    resources: tuple[tuple[str, str], ...]
    scope: str
    resource_names: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, raw: Any) -> "Rule":
        raw = raw if isinstance(raw, dict) else {}

        def strs(key: str) -> tuple[str, ...]:
            v = raw.get(key)
            return tuple(x for x in v if isinstance(x, str)) if isinstance(v, list) else ()

        resources = tuple((name, sub) for name, _, sub in (r.partition("/") for r in strs("resources")))
        return cls(strs("operations"), strs("apiGroups"), strs("apiVersions"), resources,
                   str(raw.get("scope") or "*"), strs("resourceNames"))

    def matches(self, operation: str, res: ResourceInfo, namespace: str, subresource: str, name: str = "",
                *, equivalent: bool = False) -> bool:
        if "*" not in self.operations and operation not in self.operations:
            return False
        if self.resource_names and name not in self.resource_names:
            return False
        cluster_scoped = res.key == NAMESPACES.key or not namespace
        if self.scope == "Namespaced" and cluster_scoped:
            return False
        if self.scope == "Cluster" and not cluster_scoped:
            return False
        group_ok = "*" in self.groups or res.group in self.groups
        version_ok = "*" in self.versions or res.version in self.versions
        if not (group_ok and version_ok):
            if not equivalent:
                return False
            # the same resource under another version or an older group
            if not (group_ok or any(g in self.groups for g in EQUIVALENT_GROUPS.get(res.key, ()))):
                return False
        for r, s in self.resources:
            if (r == "*" or r == res.plural) and (s == "*" or s == subresource):
                return True
        return False


def labels_of(obj: Any) -> dict[str, str]:
    md = obj.get("metadata") if isinstance(obj, dict) else None
    labels = md.get("labels") if isinstance(md, dict) else None
    return labels if isinstance(labels, dict) else {}


def object_selector_matches(selector: LabelSelector, obj: Any, old_obj: Any) -> bool:
    """The new or the old object (whichever the request has) carries matching labels."""
    return selector.empty or any(isinstance(o, dict) and selector.matches(labels_of(o)) for o in (obj, old_obj))
