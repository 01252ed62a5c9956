"""ValidatingAdmissionPolicy and ValidatingAdmissionPolicyBinding
(admissionregistration.k8s.io/v1): defaults and validation, as upstream's
``pkg/apis/admissionregistration`` (v1 defaults, validation messages and
field paths, the binding's ``spec.matchResouces`` spelling included).

Every expression of a policy is compiled when the policy is written, so a
policy that is stored compiles; :func:`install` adds the checks to the API
validation dispatch (the api layer cannot import the CEL environment).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kubeplane.api.errors import (
    Cause, duplicate, forbidden_field, invalid_value, not_supported, required,
)
from kubeplane.api.strings import is_dns1035_label, is_dns1123_subdomain, is_qualified_name, name_is_dns_subdomain
from kubeplane.api.validation import register_extra_validator, validate_label_selector
from kubeplane.api.validation.admissionregistration import FAILURE_POLICIES, MATCH_POLICIES, validate_rule
from kubeplane.api.validation.admissionregistration import validate_match_conditions as validate_webhook_match_conditions
from kubeplane.api.validation.common import _d, _l

if TYPE_CHECKING:
    from kubeplane.api.resources import ResourceInfo

GROUP = "admissionregistration.k8s.io"
POLICIES = f"validatingadmissionpolicies.{GROUP}"
BINDINGS = f"validatingadmissionpolicybindings.{GROUP}"

ACTIONS = ("Audit", "Deny", "Warn")
REASONS = ("Forbidden", "Invalid", "RequestEntityTooLarge", "Unauthorized")
PARAM_ACTIONS = ("Allow", "Deny")
MAX_AUDIT_ANNOTATIONS = 20
MAX_AUDIT_VALUE_EXPRESSION = 5 * 1024


# ---------------------------------------------------------------- defaults

def _default_rules(rules: Any) -> None:
    for rule in _l(rules):
        if isinstance(rule, dict) and rule.get("scope") in (None, ""):
            rule["scope"] = "*"


def default_match_resources(mr: Any) -> None:
    """SetDefaults_MatchResources: matchPolicy Equivalent, empty selectors, rule scope ``*``."""
    if not isinstance(mr, dict):
        return
    if mr.get("matchPolicy") in (None, ""):
        mr["matchPolicy"] = "Equivalent"
    for key in ("namespaceSelector", "objectSelector"):
        if mr.get(key) is None:
            mr[key] = {}
    _default_rules(mr.get("resourceRules"))
    _default_rules(mr.get("excludeResourceRules"))


def default_policy(obj: dict) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    if spec.get("failurePolicy") in (None, ""):
        spec["failurePolicy"] = "Fail"
    default_match_resources(spec.get("matchConstraints"))


def default_binding(obj: dict) -> None:
    spec = obj.get("spec")
    if isinstance(spec, dict):
        default_match_resources(spec.get("matchResources"))


# -------------------------------------------------------------- validation

def _path_segment_errors(name: str) -> list[str]:
    if name in (".", ".."):
        return [f"may not be '{name}'"]
    return [f"may not contain '{c}'" for c in ("/", "%") if c in name]


def _validate_named_rule(rule: Any, path: str) -> list[Cause]:
    rule = _d(rule)
    out: list[Cause] = []
    seen: set[str] = set()
    for i, name in enumerate(_l(rule.get("resourceNames"))):
        for msg in _path_segment_errors(str(name)):
            out.append(invalid_value(f"{path}.resourceNames[{i}]", name, msg))
        if name in seen:
            out.append(duplicate(f"{path}.resourceNames[{i}]", name))
        seen.add(name)
    return out + validate_rule(rule, path)


def _validate_match_resources(mr: Any, path: str) -> list[Cause]:
    if mr is None:
        return []
    mr = _d(mr)
    out: list[Cause] = []
    mp = mr.get("matchPolicy")
    if mp in (None, ""):
        out.append(required(f"{path}.matchPolicy"))
    elif mp not in MATCH_POLICIES:
        out.append(not_supported(f"{path}.matchPolicy", mp, MATCH_POLICIES))
    for key in ("namespaceSelector", "objectSelector"):
        if mr.get(key) is None:
            out.append(required(f"{path}.{key}"))
        else:
            out += validate_label_selector(mr.get(key), f"{path}.{key}")
    for key in ("resourceRules", "excludeResourceRules"):
        for i, rule in enumerate(_l(mr.get(key))):
            out += _validate_named_rule(rule, f"{path}.{key}[{i}]")
    return out


def _validate_param_kind(pk: Any, path: str) -> list[Cause]:
    pk = _d(pk)
    out: list[Cause] = []
    av = pk.get("apiVersion") or ""
    if not av:
        out.append(required(f"{path}.apiVersion"))
    elif not isinstance(av, str) or av.count("/") > 1:
        out.append(invalid_value(f"{path}.apiVersion", av, f"unexpected GroupVersion string: {av}"))
    else:
        group, _, version = av.rpartition("/")
        if group:
            errs = is_dns1123_subdomain(group)
            if errs:
                out.append(invalid_value(f"{path}.apiVersion", group, ",".join(errs)))
        if not version:
            out.append(invalid_value(f"{path}.apiVersion", av, "version must be specified"))
        else:
            errs = is_dns1035_label(version)
            if errs:
                out.append(invalid_value(f"{path}.apiVersion", version, ",".join(errs)))
    kind = pk.get("kind") or ""
    if not kind:
        out.append(required(f"{path}.kind"))
    else:
        errs = is_dns1035_label(str(kind).lower())
        if errs:
            out.append(invalid_value(f"{path}.kind", kind,
                                     "may have mixed case, but should otherwise match: " + ",".join(errs)))
    return out


def _compile_cause(path: str, expr: str, returns: tuple[str, ...], **kw: Any) -> list[Cause]:
    from kubeplane.admission import cel  # with the first policy, not at start-up

    try:
        cel.compile_expression(expr, returns, **kw)
    except cel.CELCompileError as err:
        return [invalid_value(path, expr, err.message)]
    return []


def _has_newlines(s: str) -> bool:
    return "\n" in s or "\r" in s


def _is_cel_identifier(name: str) -> bool:
    import re

    if not re.fullmatch(r"[_a-zA-Z][_a-zA-Z0-9]*", name):
        return False
    return name not in _CEL_RESERVED


_CEL_RESERVED = frozenset({
    "true", "false", "null", "in", "as", "break", "const", "continue", "else", "for", "function", "if",
    "import", "let", "loop", "package", "namespace", "return", "var", "void", "while",
})


def validate_policy_spec(meta: dict, spec: Any, path: str = "spec") -> list[Cause]:
    from kubeplane.admission import cel  # with the first policy, not at start-up

    spec = _d(spec)
    out: list[Cause] = []
    fp = spec.get("failurePolicy")
    if fp in (None, ""):
        out.append(required(f"{path}.failurePolicy"))
    elif fp not in FAILURE_POLICIES:
        out.append(not_supported(f"{path}.failurePolicy", fp, FAILURE_POLICIES))
    has_params = spec.get("paramKind") is not None
    if has_params:
        out += _validate_param_kind(spec.get("paramKind"), f"{path}.paramKind")
    mc = spec.get("matchConstraints")
    if mc is None:
        out.append(required(f"{path}.matchConstraints"))
    else:
        out += _validate_match_resources(mc, f"{path}.matchConstraints")
        if not _l(_d(mc).get("resourceRules")):
            out.append(required(f"{path}.matchConstraints.resourceRules"))
    out += validate_match_conditions(spec.get("matchConditions"), f"{path}.matchConditions", has_params=has_params)
    declared: list[str] = []
    for i, var in enumerate(_l(spec.get("variables"))):
        var = _d(var)
        p = f"{path}.variables[{i}]"
        name = var.get("name")
        if not isinstance(name, str) or not name.strip():
            out.append(required(f"{p}.name", "name is not specified"))
        elif not _is_cel_identifier(name):
            out.append(invalid_value(f"{p}.name", name, "name is not a valid CEL identifier"))
        expr = var.get("expression")
        if not isinstance(expr, str) or not expr.strip():
            out.append(required(f"{p}.expression", "expression is not specified"))
        else:
            out += _compile_cause(f"{p}.expression", expr, (cel.ANY,), has_params=has_params, variables=declared)
        if isinstance(name, str) and name:
            declared = declared + [name]
    validations = _l(spec.get("validations"))
    audits = spec.get("auditAnnotations")
    if not validations and not _l(audits):
        msg = "validations or auditAnnotations must contain at least one item"
        out.append(required(f"{path}.validations", msg))
        out.append(required(f"{path}.auditAnnotations", msg))
        return out
    for i, v in enumerate(validations):
        out += _validate_validation(_d(v), f"{path}.validations[{i}]", has_params, declared)
    if audits is not None:
        audits = _l(audits)
        if len(audits) > MAX_AUDIT_ANNOTATIONS:
            out.append(invalid_value(f"{path}.auditAnnotations", audits,
                                     f"must not have more than {MAX_AUDIT_ANNOTATIONS} auditAnnotations"))
        keys: set[str] = set()
        for i, a in enumerate(audits):
            a = _d(a)
            p = f"{path}.auditAnnotations[{i}]"
            key = a.get("key") or ""
            name = _d(meta).get("name") or ""
            if name:
                for msg in is_qualified_name(f"{name}/{key}"):
                    out.append(invalid_value(f"{p}.key", f"{name}/{key}", msg))
            else:
                out.append(invalid_value(f"{p}.key", key, "requires metadata.name be non-empty"))
            ve = a.get("valueExpression") or ""
            trimmed = ve.strip() if isinstance(ve, str) else ""
            if not trimmed:
                out.append(required(f"{p}.valueExpression", "valueExpression is not specified"))
            elif len(trimmed) > MAX_AUDIT_VALUE_EXPRESSION:
                out.append(required(f"{p}.valueExpression",
                                    f"must not exceed {MAX_AUDIT_VALUE_EXPRESSION} bytes in length"))
            else:
                try:
                    cel.compile_expression(trimmed, (cel.STRING, cel.NULL), has_params=has_params,
                                           variables=declared)
                except cel.CELCompileError as err:
                    out.append(invalid_value(f"{p}.valueExpression", ve, err.message))
            if key in keys:
                out.append(duplicate(f"{p}.key", key))
            keys.add(key)
    return out


def _validate_validation(v: dict, path: str, has_params: bool, declared: list[str]) -> list[Cause]:
    from kubeplane.admission import cel  # with the first policy, not at start-up

    out: list[Cause] = []
    expr = v.get("expression") if isinstance(v.get("expression"), str) else ""
    msg = v.get("message") if isinstance(v.get("message"), str) else ""
    mexpr = v.get("messageExpression") if isinstance(v.get("messageExpression"), str) else ""
    if not expr.strip():
        out.append(required(f"{path}.expression", "expression is not specified"))
    else:
        out += _compile_cause(f"{path}.expression", expr, (cel.BOOL,), has_params=has_params, variables=declared)
    if mexpr and not mexpr.strip():
        out.append(invalid_value(f"{path}.messageExpression", mexpr, "must be non-empty if specified"))
    elif mexpr.strip():
        out += _compile_cause(f"{path}.messageExpression", mexpr, (cel.STRING,), has_params=has_params,
                              has_authorizer=False, variables=declared)
    if msg and not msg.strip():
        out.append(invalid_value(f"{path}.message", msg, "message must be non-empty if specified"))
    elif _has_newlines(msg.strip()):
        out.append(invalid_value(f"{path}.message", msg, "message must not contain line breaks"))
    reason = v.get("reason")
    if reason is not None and reason not in REASONS:
        out.append(not_supported(f"{path}.reason", reason, REASONS))
    return out


def validate_match_conditions(conditions: Any, path: str, *, has_params: bool) -> list[Cause]:
    from kubeplane.admission import cel  # with the first policy, not at start-up

    def compile_expression(p: str, expr: str) -> list[Cause]:
        return _compile_cause(p, expr, (cel.BOOL,), has_params=has_params)

    return validate_webhook_match_conditions(_l(conditions), path, compile_expression)


def validate_policy(res: "ResourceInfo", obj: dict, old: dict | None) -> list[Cause]:
    if old is not None and obj.get("spec") == old.get("spec") and obj.get("status") != old.get("status"):
        return validate_policy_status(obj.get("status"))
    return validate_policy_spec(_d(obj.get("metadata")), obj.get("spec"))


def validate_policy_status(status: Any, path: str = "status") -> list[Cause]:
    out: list[Cause] = []
    tc = _d(_d(status).get("typeChecking"))
    for i, w in enumerate(_l(tc.get("expressionWarnings"))):
        w = _d(w)
        if not w.get("fieldRef"):
            out.append(required(f"{path}.typeChecking.expressionWarnings[{i}].fieldRef"))
        if not w.get("warning"):
            out.append(required(f"{path}.typeChecking.expressionWarnings[{i}].warning"))
    return out


def validate_binding(res: "ResourceInfo", obj: dict, old: dict | None) -> list[Cause]:
    spec = _d(obj.get("spec"))
    out: list[Cause] = []
    pn = spec.get("policyName") or ""
    if not pn:
        out.append(required("spec.policyName"))
    else:
        for msg in name_is_dns_subdomain(str(pn)):
            out.append(invalid_value("spec.policyName", pn, msg))
    out += _validate_param_ref(spec.get("paramRef"), "spec.paramRef")
    out += _validate_match_resources(spec.get("matchResources"), "spec.matchResouces")
    out += _validate_actions(spec.get("validationActions"), "spec.validationActions")
    return out


def _validate_param_ref(pr: Any, path: str) -> list[Cause]:
    if pr is None:
        return []
    pr = _d(pr)
    out: list[Cause] = []
    name = pr.get("name") or ""
    selector = pr.get("selector")
    if name:
        for msg in _path_segment_errors(str(name)):
            out.append(invalid_value(f"{path}.name", name, msg))
        if selector is not None:
            out.append(forbidden_field(f"{path}.name", "name and selector are mutually exclusive"))
    if selector is not None:
        out += validate_label_selector(selector, f"{path}.selector")
        if name:
            out.append(forbidden_field(f"{path}.selector", "name and selector are mutually exclusive"))
    if not name and selector is None:
        out.append(required(path, "one of name or selector must be specified"))
    action = pr.get("parameterNotFoundAction")
    if action in (None, ""):
        out.append(required(f"{path}.parameterNotFoundAction"))
    elif action not in PARAM_ACTIONS:
        out.append(not_supported(f"{path}.parameterNotFoundAction", action, PARAM_ACTIONS))
    return out


def _validate_actions(actions: Any, path: str) -> list[Cause]:
    actions = _l(actions)
    out: list[Cause] = []
    seen: set[str] = set()
    for i, a in enumerate(actions):
        if a not in ACTIONS:
            out.append(not_supported(f"{path}[{i}]", a, ACTIONS))
        if a in seen:
            out.append(duplicate(f"{path}[{i}]", a))
        seen.add(a)
    if "Deny" in seen and "Warn" in seen:
        out.append(invalid_value(path, actions, "must not contain both Deny and Warn (repeating the same validation "
                                 "failure information in the API response and headers serves no purpose)"))
    if not seen:
        out.append(required(path, "at least one validation action is required"))
    return out


_installed = False


def install() -> None:
    """Add the policy and binding checks to the API validation (idempotent)."""
    global _installed
    if not _installed:
        register_extra_validator(POLICIES, validate_policy)
        register_extra_validator(BINDINGS, validate_binding)
        _installed = True
