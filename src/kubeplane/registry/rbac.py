"""The registry's RBAC rules: escalation prevention on roles and bindings, and
the authorization.k8s.io reviews.

Escalation prevention (upstream's registry/rbac policybased storage): a user
may create or update a Role or ClusterRole only with rules it already holds
(where the role applies), unless it is in ``system:masters`` or has the
``escalate`` verb on the role kind; and may bind a role only if it holds the
role's rules or has the ``bind`` verb on that role. A ClusterRole with an
aggregationRule can come to hold anything, so creating one needs full
authority.

The reviews (SubjectAccessReview, SelfSubjectAccessReview,
LocalSubjectAccessReview, SelfSubjectRulesReview) are create-only: the
answer is computed from the authorizer and returned, nothing is stored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kubeplane.api import errors
from kubeplane.api.errors import StatusError
from kubeplane.api.resources import ResourceInfo
from kubeplane.auth.authorizer import Attributes, Decision
from kubeplane.auth.rbac import FULL_AUTHORITY, GROUP, escalation_message, uncovered
from kubeplane.auth.user import SYSTEM_MASTERS, UserInfo, current_user

if TYPE_CHECKING:
    from kubeplane.registry.registry import Registry

Obj = dict[str, Any]

AUTHORIZATION_GROUP = "authorization.k8s.io"
_GC_METADATA = ("ownerReferences", "finalizers", "resourceVersion", "managedFields", "generation",
                "creationTimestamp", "uid", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink")


def _forbidden(res: ResourceInfo, name: str, message: str) -> StatusError:
    return StatusError(403, "Forbidden", f'{res.plural}.{res.group} "{name}" is forbidden: {message}',
                       name=name, group=res.group, kind=res.plural)


def _rules_of(registry: "Registry", user: UserInfo, namespace: str) -> tuple[list[Obj], list[str]]:
    rules_for = getattr(registry.authorizer, "rules_for", None)
    if rules_for is None:
        return [], []
    return rules_for(user, namespace)


def _allowed(registry: "Registry", attrs: Attributes) -> bool:
    decision, _ = registry.authorizer.authorize(attrs)
    return decision is Decision.ALLOW


def _role_rules(obj: Obj, old: Obj | None) -> list[Any]:
    """The rules a role write asks to hold (full authority for a new aggregation)."""
    agg = obj.get("aggregationRule")
    if isinstance(agg, dict) and agg.get("clusterRoleSelectors"):
        if old is None or old.get("aggregationRule") != agg:
            return list(FULL_AUTHORITY)
    rules = obj.get("rules")
    return rules if isinstance(rules, list) else []


def _only_gc_fields(new: Obj, old: Obj) -> bool:
    """Upstream's IsOnlyMutatingGCFields (with the server-set metadata left out)."""
    def strip(o: Obj) -> Obj:
        md = o.get("metadata") if isinstance(o.get("metadata"), dict) else {}
        return {**{k: v for k, v in o.items() if k not in ("metadata", "apiVersion", "kind")},
                "metadata": {k: v for k, v in md.items() if k not in _GC_METADATA}}

    return strip(new) == strip(old)


def _confirm_no_escalation(registry: "Registry", res: ResourceInfo, name: str, user: UserInfo, namespace: str,
                           requested: list[Any]) -> None:
    owned, errs = _rules_of(registry, user, namespace)
    missing = uncovered(owned, requested)
    if missing:
        raise _forbidden(res, name, escalation_message(user, missing, errs))


def check_write(registry: "Registry", res: ResourceInfo, obj: Obj, old: Obj | None, url_name: str) -> None:
    """Refuses a create (``old`` None) or update of an RBAC object that would
    grant what the requesting user does not hold. ``url_name`` is the name the
    request's URL carries (none for a create), as upstream's authorizer
    attributes for ``escalate`` carry it."""
    user = current_user()
    if SYSTEM_MASTERS in user.groups:
        return
    if old is not None and _only_gc_fields(obj, old):
        return
    md = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    name = md.get("name") or md.get("generateName") or ""
    namespace = (md.get("namespace") or "") if res.namespaced else ""
    if res.plural in ("roles", "clusterroles"):
        attrs = Attributes(user, "escalate", True, namespace, GROUP, "*", res.plural, "", url_name)
        if _allowed(registry, attrs):
            return
        _confirm_no_escalation(registry, res, name, user, namespace, _role_rules(obj, old))
        return
    if res.plural in ("rolebindings", "clusterrolebindings"):
        ref = obj.get("roleRef") if isinstance(obj.get("roleRef"), dict) else {}
        kind, ref_name = ref.get("kind"), ref.get("name")
        if not isinstance(ref_name, str) or kind not in ("Role", "ClusterRole"):
            return  # validation refuses it
        plural = "roles" if kind == "Role" else "clusterroles"
        attrs = Attributes(user, "bind", True, namespace, ref.get("apiGroup") or "", "", plural, "", ref_name)
        if _allowed(registry, attrs):
            return
        cache = getattr(registry.authorizer, "cache", None)
        rules = cache.role_rules(kind, ref_name, namespace) if cache is not None else None
        if rules is None and cache is not None:
            return  # a role that does not exist grants nothing (upstream binds it)
        requested = [r.raw for r in rules] if rules is not None else list(FULL_AUTHORITY)
        _confirm_no_escalation(registry, res, name, user, namespace, requested)


# -- reviews ---------------------------------------------------------------------


def _meta_must_be_empty(obj: Obj) -> list[errors.Cause]:
    md = obj.get("metadata")
    if not isinstance(md, dict):
        return []
    rest = {k: v for k, v in md.items() if k not in ("managedFields", "namespace") and v not in (None, "", {}, [])}
    if rest:
        return [errors.invalid_value("metadata", rest, "must be empty")]
    return []


def _spec(obj: Obj) -> Obj:
    spec = obj.get("spec")
    return spec if isinstance(spec, dict) else {}


def _attributes_from_spec(user: UserInfo, spec: Obj) -> Attributes:
    ra = spec.get("resourceAttributes")
    if isinstance(ra, dict):
        def s(key: str) -> str:
            v = ra.get(key)
            return v if isinstance(v, str) else ""

        return Attributes(user, s("verb"), True, s("namespace"), s("group"), s("version"), s("resource"),
                          s("subresource"), s("name"))
    nra = spec.get("nonResourceAttributes") if isinstance(spec.get("nonResourceAttributes"), dict) else {}
    return Attributes(user, str(nra.get("verb") or ""), resource_request=False, path=str(nra.get("path") or ""))


def _check_attribute_choice(spec: Obj, out: list[errors.Cause]) -> None:
    ra, nra = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    if ra is not None and nra is not None:
        out.append(errors.invalid_value("spec.nonResourceAttributes", nra,
                                        "cannot be specified in combination with resourceAttributes"))
    if ra is None and nra is None:
        out.append(errors.invalid_value("spec.resourceAttributes", None,
                                        "exactly one of nonResourceAttributes or resourceAttributes must be specified"))


def _user_from_spec(spec: Obj) -> UserInfo:
    groups = spec.get("groups")
    extra = spec.get("extra")
    return UserInfo(
        str(spec.get("user") or ""), str(spec.get("uid") or ""),
        tuple(g for g in groups if isinstance(g, str)) if isinstance(groups, list) else (),
        {k: tuple(v) for k, v in extra.items() if isinstance(v, list)} if isinstance(extra, dict) else {},
    )


def _answer(registry: "Registry", attrs: Attributes) -> Obj:
    decision, reason = registry.authorizer.authorize(attrs)
    status: Obj = {"allowed": decision is Decision.ALLOW}
    if decision is Decision.DENY:
        status["denied"] = True
    if reason:
        status["reason"] = reason
    return status


async def review(registry: "Registry", res: ResourceInfo, obj: Obj, namespace: str | None) -> Obj:
    """The answered review ``obj`` (a create of an authorization.k8s.io kind)."""
    spec = _spec(obj)
    causes = _meta_must_be_empty(obj) if res.kind != "LocalSubjectAccessReview" else []
    kind = res.kind
    if kind == "SelfSubjectRulesReview":
        ns = spec.get("namespace") if isinstance(spec.get("namespace"), str) else ""
        if causes:
            raise errors.invalid(kind, "", causes, group=res.group)
        return {**obj, "status": rules_review_status(registry, current_user(), ns)}
    _check_attribute_choice(spec, causes)
    if kind in ("SubjectAccessReview", "LocalSubjectAccessReview"):
        if not spec.get("user") and not spec.get("groups"):
            causes.append(errors.invalid_value("spec.user", spec.get("user") or "",
                                               "at least one of user or group must be specified"))
    if kind == "LocalSubjectAccessReview":
        ra = spec.get("resourceAttributes")
        if not namespace:
            raise errors.bad_request(f"namespace is required on this type: {namespace or ''}")
        if not isinstance(ra, dict) or ra.get("namespace") != namespace:
            raise errors.bad_request(f"spec.resourceAttributes.namespace must match namespace: {namespace}")
    if causes:
        raise errors.invalid(kind, "", causes, group=res.group)
    user = current_user() if kind == "SelfSubjectAccessReview" else _user_from_spec(spec)
    if kind == "SelfSubjectAccessReview":
        spec = {**spec}
    return {**obj, "spec": spec, "status": _answer(registry, _attributes_from_spec(user, spec))}


def rules_review_status(registry: "Registry", user: UserInfo, namespace: str) -> Obj:
    """SelfSubjectRulesReview's status: the rules the user holds in ``namespace``."""
    if getattr(registry.authorizer, "rules_for", None) is None:
        rules, errs = list(FULL_AUTHORITY), []  # an authorizer that allows everything holds every rule
    else:
        rules, errs = _rules_of(registry, user, namespace)
    resource_rules: list[Obj] = []
    non_resource_rules: list[Obj] = []
    for r in rules:
        urls = r.get("nonResourceURLs")
        if urls:
            non_resource_rules.append({"verbs": list(r.get("verbs") or []), "nonResourceURLs": list(urls)})
        else:
            out: Obj = {"verbs": list(r.get("verbs") or [])}
            for field in ("apiGroups", "resources", "resourceNames"):
                if r.get(field):
                    out[field] = list(r[field])
            resource_rules.append(out)
    status: Obj = {"resourceRules": resource_rules, "nonResourceRules": non_resource_rules, "incomplete": False}
    if errs:
        from kubeplane.auth.rbac import aggregate_errors

        status["evaluationError"] = aggregate_errors(errs)
    return status


def is_review(res: ResourceInfo) -> bool:
    return res.group == AUTHORIZATION_GROUP


def is_rbac(res: ResourceInfo) -> bool:
    return res.group == GROUP


__all__ = ["check_write", "is_rbac", "is_review", "review", "rules_review_status"]
