"""Validation of rbac.authorization.k8s.io/v1: Roles, ClusterRoles and their bindings.

Upstream's pkg/apis/rbac/validation: names are path segments (not DNS
names: ``system:node`` is a valid role name), every rule names verbs, a
resource rule names API groups and resources, a non-resource rule nothing but
URLs (and only in a cluster-wide role), a binding's ``roleRef`` is immutable and
its subjects are Users, Groups or ServiceAccounts.
"""

from __future__ import annotations

from typing import Any

from kubeplane.api.errors import Cause, invalid_value, not_supported, required
from kubeplane.api.strings import name_is_dns_subdomain
from kubeplane.api.validation.common import _d, _l
from kubeplane.api.validation.meta import validate_label_selector

GROUP = "rbac.authorization.k8s.io"


def name_is_path_segment(name: str, prefix: bool = False) -> list[str]:
    """Upstream's ValidatePathSegmentName: the name ends up in a URL path."""
    if not prefix and name in (".", ".."):
        return [f"may not be '{name}'"]
    return [f"may not contain '{c}'" for c in ("/", "%") if c in name]


def _strings(value: Any) -> list:
    return value if isinstance(value, list) else []


def validate_policy_rule(rule: Any, namespaced: bool, path: str) -> list[Cause]:
    rule = _d(rule)
    out: list[Cause] = []
    if not _strings(rule.get("verbs")):
        out.append(required(f"{path}.verbs", "verbs must contain at least one value"))
    urls = _strings(rule.get("nonResourceURLs"))
    if urls:
        if namespaced:
            out.append(invalid_value(f"{path}.nonResourceURLs", urls,
                                     "namespaced rules cannot apply to non-resource URLs"))
        if _strings(rule.get("apiGroups")) or _strings(rule.get("resources")) or _strings(rule.get("resourceNames")):
            out.append(invalid_value(f"{path}.nonResourceURLs", urls,
                                     "rules cannot apply to both regular resources and non-resource URLs"))
        return out
    if not _strings(rule.get("apiGroups")):
        out.append(required(f"{path}.apiGroups", "resource rules must supply at least one api group"))
    if not _strings(rule.get("resources")):
        out.append(required(f"{path}.resources", "resource rules must supply at least one resource"))
    return out


def _validate_rules(obj: dict[str, Any], namespaced: bool) -> list[Cause]:
    out: list[Cause] = []
    for i, rule in enumerate(_l(obj.get("rules"))):
        out += validate_policy_rule(rule, namespaced, f"rules[{i}]")
    return out


def _validate_role(obj: dict[str, Any]) -> list[Cause]:
    return _validate_rules(obj, True)


def _validate_cluster_role(obj: dict[str, Any]) -> list[Cause]:
    out = _validate_rules(obj, False)
    agg = obj.get("aggregationRule")
    if agg is not None:
        selectors = _l(_d(agg).get("clusterRoleSelectors"))
        if not selectors:
            out.append(required("aggregationRule.clusterRoleSelectors",
                                "at least one clusterRoleSelector required if aggregationRule is non-nil"))
        for i, sel in enumerate(selectors):
            out += validate_label_selector(sel, f"aggregationRule.clusterRoleSelectors[{i}]")
    return out


def _validate_subject(subject: Any, namespaced: bool, path: str) -> list[Cause]:
    s = _d(subject)
    out: list[Cause] = []
    name = s.get("name") if isinstance(s.get("name"), str) else ""
    kind = s.get("kind") if isinstance(s.get("kind"), str) else ""
    api_group = s.get("apiGroup") if isinstance(s.get("apiGroup"), str) else ""
    if not name:
        out.append(required(f"{path}.name"))
    if kind == "ServiceAccount":
        if name:
            out += [invalid_value(f"{path}.name", name, m) for m in name_is_dns_subdomain(name)]
        if api_group:
            out.append(not_supported(f"{path}.apiGroup", api_group, [""]))
        if not namespaced and not s.get("namespace"):
            out.append(required(f"{path}.namespace"))
    elif kind in ("User", "Group"):
        if api_group != GROUP:
            out.append(not_supported(f"{path}.apiGroup", api_group, [GROUP]))
    else:
        out.append(not_supported(f"{path}.kind", kind, ["ServiceAccount", "User", "Group"]))
    return out


def _validate_binding(obj: dict[str, Any], namespaced: bool) -> list[Cause]:
    out: list[Cause] = []
    ref = _d(obj.get("roleRef"))
    if ref.get("apiGroup") != GROUP:
        out.append(not_supported("roleRef.apiGroup", ref.get("apiGroup") or "", [GROUP]))
    kinds = ["Role", "ClusterRole"] if namespaced else ["ClusterRole"]
    if ref.get("kind") not in kinds:
        out.append(not_supported("roleRef.kind", ref.get("kind") or "", kinds))
    name = ref.get("name") if isinstance(ref.get("name"), str) else ""
    if not name:
        out.append(required("roleRef.name"))
    else:
        out += [invalid_value("roleRef.name", name, m) for m in name_is_path_segment(name)]
    for i, subject in enumerate(_l(obj.get("subjects"))):
        out += _validate_subject(subject, namespaced, f"subjects[{i}]")
    return out


def _validate_role_binding(obj: dict[str, Any]) -> list[Cause]:
    return _validate_binding(obj, True)


def _validate_cluster_role_binding(obj: dict[str, Any]) -> list[Cause]:
    return _validate_binding(obj, False)


def role_ref_repr(ref: Any) -> str:
    """A roleRef as Go's ``%#v`` prints upstream's internal rbac.RoleRef."""
    ref = _d(ref)

    def q(v: Any) -> str:
        return '"' + (v if isinstance(v, str) else "").replace("\\", "\\\\").replace('"', '\\"') + '"'

    return (f"rbac.RoleRef{{APIGroup:{q(ref.get('apiGroup'))}, Kind:{q(ref.get('kind'))}, "
            f"Name:{q(ref.get('name'))}}}")


def _role_ref_immutable(obj: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    new_ref, old_ref = _d(obj.get("roleRef")), _d(old.get("roleRef"))
    keys = ("apiGroup", "kind", "name")
    if any(new_ref.get(k) != old_ref.get(k) for k in keys):
        return [Cause("FieldValueInvalid", f"Invalid value: {role_ref_repr(new_ref)}: cannot change roleRef",
                      "roleRef")]
    return []
