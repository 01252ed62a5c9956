"""Validation of admissionregistration.k8s.io/v1 MutatingWebhookConfigurations
and ValidatingWebhookConfigurations, with upstream's field paths and messages.

An update is checked with the rules relaxed exactly where upstream relaxes
them for what the stored object already held (side effects, review versions,
duplicate names), so an object stored under older rules can still be changed.
The CEL compilation of ``matchConditions`` is registered by the webhook
plugin (registry layer), which owns the CEL environment.
"""

from __future__ import annotations

from typing import Any, Callable
from urllib.parse import urlsplit

from kubeplane.api.errors import Cause, duplicate, invalid_value, not_supported, required, too_many
from kubeplane.api.strings import is_dns1035_label, is_dns1123_subdomain, is_qualified_name, is_valid_port_num
from kubeplane.api.validation.common import _d, _is_int, _l, _s
from kubeplane.api.validation.meta import validate_label_selector

ACCEPTED_REVIEW_VERSIONS = ("v1", "v1beta1")
NO_SIDE_EFFECTS = ("None", "NoneOnDryRun")
OPERATIONS = ("*", "CONNECT", "CREATE", "DELETE", "UPDATE")
SCOPES = ("*", "Cluster", "Namespaced")
FAILURE_POLICIES = ("Fail", "Ignore")
MATCH_POLICIES = ("Equivalent", "Exact")
REINVOCATION_POLICIES = ("IfNeeded", "Never")
MAX_MATCH_CONDITIONS = 64


def _fully_qualified(name: str, path: str) -> list[Cause]:
    if not name:
        return [required(path)]
    errs = is_dns1123_subdomain(name)
    if errs:
        return [invalid_value(path, name, ",".join(errs))]
    if len(name.split(".")) < 3:
        return [invalid_value(path, name, "should be a domain with at least three segments separated by dots")]
    return []


def validate_resources(resources: list[Any], path: str) -> list[Cause]:
    """A rule's ``resources`` (upstream's validateResources), for webhooks and policies alike."""
    out: list[Cause] = []
    if not resources:
        out.append(required(path))
    with_wild_sub: set[str] = set()
    sub_with_wild_res: set[str] = set()
    double = single = plain = False
    for i, rs in enumerate(resources):
        rs = _s(rs)
        if rs == "":
            out.append(required(f"{path}[{i}]"))
            continue
        if rs == "*/*":
            double = True
        if rs == "*":
            single = True
        if "/" not in rs:
            plain = rs != "*"
            continue
        res, sub = rs.split("/", 1)
        if res in with_wild_sub:
            out.append(invalid_value(f"{path}[{i}]", rs, f"if '{res}/*' is present, must not specify {rs}"))
        if sub in sub_with_wild_res:
            out.append(invalid_value(f"{path}[{i}]", rs, f"if '*/{sub}' is present, must not specify {rs}"))
        if sub == "*":
            with_wild_sub.add(res)
        if res == "*":
            sub_with_wild_res.add(sub)
    if len(resources) > 1 and double:
        out.append(invalid_value(path, resources, "if '*/*' is present, must not specify other resources"))
    if single and plain:
        out.append(invalid_value(path, resources, "if '*' is present, must not specify other resources without "
                                                  "subresources"))
    return out


def validate_rule(rule: Any, path: str) -> list[Cause]:
    """upstream's validateRule (operations included): webhook rules and the
    resource rules of ValidatingAdmissionPolicy matchConstraints/matchResources."""
    rule = _d(rule)
    out: list[Cause] = []
    ops = _l(rule.get("operations"))
    if not ops:
        out.append(required(f"{path}.operations"))
    if len(ops) > 1 and "*" in ops:
        out.append(invalid_value(f"{path}.operations", ops, "if '*' is present, must not specify other operations"))
    for i, op in enumerate(ops):
        if op not in OPERATIONS:
            out.append(not_supported(f"{path}.operations[{i}]", op, OPERATIONS))
    groups = _l(rule.get("apiGroups"))
    if not groups:
        out.append(required(f"{path}.apiGroups"))
    if len(groups) > 1 and "*" in groups:
        out.append(invalid_value(f"{path}.apiGroups", groups, "if '*' is present, must not specify other API groups"))
    versions = _l(rule.get("apiVersions"))
    if not versions:
        out.append(required(f"{path}.apiVersions"))
    if len(versions) > 1 and "*" in versions:
        out.append(invalid_value(f"{path}.apiVersions", versions,
                                 "if '*' is present, must not specify other API versions"))
    for i, v in enumerate(versions):
        if v == "":
            out.append(required(f"{path}.apiVersions[{i}]"))
    out += validate_resources(_l(rule.get("resources")), f"{path}.resources")
    scope = rule.get("scope")
    if scope is not None and scope not in SCOPES:
        out.append(not_supported(f"{path}.scope", scope, SCOPES))
    return out


def _url(url: str, path: str) -> list[Cause]:
    form = "; desired format: https://host[/path]"
    out: list[Cause] = []
    try:
        u = urlsplit(url)
        _ = u.port
    except ValueError as exc:
        return [required(path, f"url must be a valid URL: {exc}{form}")]
    if u.scheme != "https":
        out.append(invalid_value(path, u.scheme, "'https' is the only allowed URL scheme" + form))
    host = u.netloc.rpartition("@")[2]
    if not host:
        out.append(invalid_value(path, host, "host must be specified" + form))
    if "@" in u.netloc:
        out.append(invalid_value(path, u.netloc.rpartition("@")[0], "user information is not permitted in the URL"))
    if u.fragment or url.endswith("#"):
        out.append(invalid_value(path, u.fragment, "fragments are not permitted in the URL"))
    if u.query:
        out.append(invalid_value(path, u.query, "query parameters are not permitted in the URL"))
    return out


def _service(svc: Any, path: str) -> list[Cause]:
    svc = _d(svc)
    out: list[Cause] = []
    if not _s(svc.get("name")):
        out.append(required(f"{path}.name", "service name is required"))
    if not _s(svc.get("namespace")):
        out.append(required(f"{path}.namespace", "service namespace is required"))
    port = svc.get("port", 443)
    errs = is_valid_port_num(port) if _is_int(port) else ["must be between 1 and 65535, inclusive"]
    if errs:
        out.append(invalid_value(f"{path}.port", port, "port is not valid: " + ", ".join(errs)))
    p = svc.get("path")
    if p is None:
        return out
    p = _s(p)
    if p in ("", "/"):
        return out
    if p == "//":
        out.append(invalid_value(f"{path}.path", p, "segment[0] may not be empty"))
        return out
    if not p.startswith("/"):
        out.append(invalid_value(f"{path}.path", p, "must start with a '/'"))
    check = p[1:]
    if check.endswith("/"):
        check = check[:-1]
    for i, step in enumerate(check.split("/")):
        if not step:
            out.append(invalid_value(f"{path}.path", p, f"segment[{i}] may not be empty"))
            continue
        for failure in is_dns1123_subdomain(step):
            out.append(invalid_value(f"{path}.path", p, f"segment[{i}]: {failure}"))
    return out


def validate_match_conditions(conditions: list[Any], path: str,
                              compile_expression: Callable[[str, str], list[Cause]] | None = None) -> list[Cause]:
    """``matchConditions`` of a webhook or a ValidatingAdmissionPolicy: count,
    names, expressions; ``compile_expression(path, expression)`` adds the CEL
    compilation checks where the caller owns the environment."""
    out: list[Cause] = []
    if len(conditions) > MAX_MATCH_CONDITIONS:
        out.append(too_many(path, len(conditions), MAX_MATCH_CONDITIONS))
    names: set[str] = set()
    for i, mc in enumerate(conditions):
        mc = _d(mc)
        p = f"{path}[{i}]"
        expr = _s(mc.get("expression")).strip()
        if not expr:
            out.append(required(f"{p}.expression"))
        elif compile_expression is not None:
            out += compile_expression(f"{p}.expression", expr)
        name = _s(mc.get("name"))
        if not name:
            out.append(required(f"{p}.name"))
        else:
            for msg in is_qualified_name(name):
                out.append(invalid_value(f"{p}.name", name, msg))
            if name in names:
                out.append(duplicate(f"{p}.name", name))
            names.add(name)
    return out


def _review_versions(versions: list[Any], path: str, require_known: bool) -> list[Cause]:
    out: list[Cause] = []
    if not versions:
        return [required(path, "must specify one of " + ", ".join(ACCEPTED_REVIEW_VERSIONS))]
    seen: set[str] = set()
    known = False
    for i, v in enumerate(versions):
        v = _s(v)
        if v in seen:
            out.append(invalid_value(f"{path}[{i}]", v, "duplicate version"))
            continue
        seen.add(v)
        for msg in is_dns1035_label(v):
            out.append(invalid_value(f"{path}[{i}]", v, msg))
        known = known or v in ACCEPTED_REVIEW_VERSIONS
    if require_known and not known:
        out.append(invalid_value(path, versions, "must include at least one of " + ", ".join(ACCEPTED_REVIEW_VERSIONS)))
    return out


def _webhook(hook: Any, path: str, mutating: bool, require_no_side_effects: bool) -> list[Cause]:
    hook = _d(hook)
    out = _fully_qualified(_s(hook.get("name")), f"{path}.name")
    for i, rule in enumerate(_l(hook.get("rules"))):
        out += validate_rule(rule, f"{path}.rules[{i}]")
    fp = hook.get("failurePolicy")
    if fp is not None and fp not in FAILURE_POLICIES:
        out.append(not_supported(f"{path}.failurePolicy", fp, FAILURE_POLICIES))
    mp = hook.get("matchPolicy")
    if mp is not None and mp not in MATCH_POLICIES:
        out.append(not_supported(f"{path}.matchPolicy", mp, MATCH_POLICIES))
    allowed = NO_SIDE_EFFECTS if require_no_side_effects else ("None", "NoneOnDryRun", "Some", "Unknown")
    se = hook.get("sideEffects")
    if se is None:
        out.append(required(f"{path}.sideEffects", "must specify one of " + ", ".join(allowed)))
    elif se not in allowed:
        out.append(not_supported(f"{path}.sideEffects", se, allowed))
    ts = hook.get("timeoutSeconds")
    if ts is not None and (not _is_int(ts) or ts > 30 or ts < 1):
        out.append(invalid_value(f"{path}.timeoutSeconds", ts, "the timeout value must be between 1 and 30 seconds"))
    for key in ("namespaceSelector", "objectSelector"):
        if hook.get(key) is not None:
            out += validate_label_selector(hook.get(key), f"{path}.{key}")
    if mutating:
        rp = hook.get("reinvocationPolicy")
        if rp is not None and rp not in REINVOCATION_POLICIES:
            out.append(not_supported(f"{path}.reinvocationPolicy", rp, REINVOCATION_POLICIES))
    cc = _d(hook.get("clientConfig"))
    url, svc = cc.get("url"), cc.get("service")
    if (url is None) == (svc is None):
        out.append(required(f"{path}.clientConfig", "exactly one of url or service is required"))
    elif url is not None:
        out += _url(_s(url), f"{path}.clientConfig.url")
    else:
        out += _service(svc, f"{path}.clientConfig.service")
    out += validate_match_conditions(_l(hook.get("matchConditions")), f"{path}.matchConditions")
    return out


def _configuration(obj: dict[str, Any], mutating: bool, old: dict[str, Any] | None) -> list[Cause]:
    old_hooks = [_d(h) for h in _l(old.get("webhooks"))] if old is not None else []
    if old is None:
        no_side_effects = known_versions = unique = True
    else:
        no_side_effects = all(h.get("sideEffects") in NO_SIDE_EFFECTS for h in old_hooks)
        known_versions = all(
            not _l(h.get("admissionReviewVersions"))
            or any(v in ACCEPTED_REVIEW_VERSIONS for v in _l(h.get("admissionReviewVersions")))
            for h in old_hooks)
        old_names = [h.get("name") for h in old_hooks]
        unique = len(old_names) == len(set(map(str, old_names)))
    out: list[Cause] = []
    names: set[str] = set()
    for i, hook in enumerate(_l(obj.get("webhooks"))):
        path = f"webhooks[{i}]"
        out += _webhook(hook, path, mutating, no_side_effects)
        out += _review_versions(_l(_d(hook).get("admissionReviewVersions")), f"{path}.admissionReviewVersions",
                                known_versions)
        name = _s(_d(hook).get("name"))
        if unique and name:
            if name in names:
                out.append(duplicate(f"{path}.name", name))
            names.add(name)
    return out


def validate_webhook_configuration(res: Any, obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """The checks of both kinds (``old`` for an update), for the validator table."""
    return _configuration(obj, res.kind == "MutatingWebhookConfiguration", old)
