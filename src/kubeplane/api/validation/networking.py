"""Validation of networking.k8s.io/v1 Ingresses, IngressClasses and
NetworkPolicies (upstream's ``pkg/apis/networking/validation``).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from kubeplane.api.errors import Cause, forbidden_field, invalid_value, not_supported, required, too_long
from kubeplane.api.strings import (
    DNS1123_SUBDOMAIN_FMT,
    is_dns1123_label,
    is_dns1123_subdomain,
    is_valid_port_name,
    is_valid_port_num,
    max_len_error,
    name_is_dns1035_label,
    regex_error,
)
from kubeplane.api.validation.common import _d, _immutable, _is_int, _l, _s
from kubeplane.api.validation.ip import parse_ip, validate_cidr, validate_ip
from kubeplane.api.validation.meta import validate_label_selector
from kubeplane.api.validation.rbac import name_is_path_segment

INGRESS_CLASS_ANNOTATION = "kubernetes.io/ingress.class"
MAX_CONTROLLER_LEN = 250
PATH_TYPES = ("Exact", "ImplementationSpecific", "Prefix")
INVALID_PATH_SEQUENCES = ("//", "/./", "/../", "%2f", "%2F")
INVALID_PATH_SUFFIXES = ("/..", "/.")
PARAMETER_SCOPES = ("Cluster", "Namespace")
POLICY_PROTOCOLS = ("TCP", "UDP", "SCTP")
POLICY_TYPES = ("Ingress", "Egress")

_WILDCARD_FMT = "\\*\\." + DNS1123_SUBDOMAIN_FMT
_WILDCARD_RE = re.compile("^" + _WILDCARD_FMT + "$")
_WILDCARD_ERR = ("a wildcard DNS-1123 subdomain must start with '*.', followed by a valid DNS subdomain, which "
                 "must consist of lower case alphanumeric characters, '-' or '.' and end with an alphanumeric "
                 "character")
_HTTP_PATH_FMT = "[A-Za-z0-9/\\-._~%!$&'()*+,;=:]+"
_HTTP_PATH_RE = re.compile("^" + _HTTP_PATH_FMT + "$")


def is_wildcard_dns1123_subdomain(value: str) -> list[str]:
    errs: list[str] = []
    if len(value) > 253:
        errs.append(max_len_error(253))
    if not _WILDCARD_RE.match(value):
        errs.append(regex_error(_WILDCARD_ERR, _WILDCARD_FMT, "*.example.com"))
    return errs


def _validate_domain_prefixed_path(value: str, path: str) -> list[Cause]:
    if not value:
        return [required(path)]
    host, sep, rest = value.partition("/")
    if not sep or not host or not rest:
        return [invalid_value(path, value, 'must be a domain-prefixed path (such as "acme.io/foo")')]
    out = [invalid_value(path, host, m) for m in is_dns1123_subdomain(host)]
    if not _HTTP_PATH_RE.match(rest):
        out.append(invalid_value(path, rest, regex_error("must be a valid path", _HTTP_PATH_FMT)))
    return out


# ------------------------------------------------------------------ Ingress


def _validate_backend(backend: dict[str, Any], path: str) -> list[Cause]:
    resource, service = backend.get("resource"), backend.get("service")
    if resource is not None and service is not None:
        return [invalid_value(path, "", "cannot set both resource and service backends")]
    if resource is not None:
        return _validate_typed_reference(_d(resource), f"{path}.resource")
    if service is None:
        return [invalid_value(path, "", "resource or service backend is required")]
    service = _d(service)
    out: list[Cause] = []
    name = _s(service.get("name"))
    if not name:
        out.append(required(f"{path}.service.name"))
    else:
        out += [invalid_value(f"{path}.service.name", name, m) for m in name_is_dns1035_label(name)]
    port = _d(service.get("port"))
    pname, number = _s(port.get("name")), port.get("number")
    has_number = number not in (None, 0)
    if pname and has_number:
        out.append(invalid_value(path, "", "cannot set both port name & port number"))
    elif pname:
        out += [invalid_value(f"{path}.service.port.name", pname, m) for m in is_valid_port_name(pname)]
    elif has_number:
        out += [invalid_value(f"{path}.service.port.number", number, m) for m in is_valid_port_num(number)]
    else:
        out.append(required(path, "port name or number is required"))
    return out


def _validate_typed_reference(ref: dict[str, Any], path: str) -> list[Cause]:
    out: list[Cause] = []
    group = ref.get("apiGroup")
    if group is not None:
        out += [invalid_value(f"{path}.apiGroup", group, m) for m in is_dns1123_subdomain(_s(group))]
    for key in ("kind", "name"):
        value = _s(ref.get(key))
        if not value:
            out.append(required(f"{path}.{key}"))
        else:
            out += [invalid_value(f"{path}.{key}", value, m) for m in name_is_path_segment(value)]
    return out


def _validate_http_path(entry: dict[str, Any], path: str) -> list[Cause]:
    ptype = entry.get("pathType")
    if ptype is None:
        return [required(f"{path}.pathType", "pathType must be specified")]
    out: list[Cause] = []
    value = _s(entry.get("path"))
    if ptype in ("Exact", "Prefix"):
        if not value.startswith("/"):
            out.append(invalid_value(f"{path}.path", value, "must be an absolute path"))
        if value:
            out += [invalid_value(f"{path}.path", value, f"must not contain '{seq}'")
                    for seq in INVALID_PATH_SEQUENCES if seq in value]
            out += [invalid_value(f"{path}.path", value, f"cannot end with '{suffix}'")
                    for suffix in INVALID_PATH_SUFFIXES if value.endswith(suffix)]
    elif ptype == "ImplementationSpecific":
        if value and not value.startswith("/"):
            out.append(invalid_value(f"{path}.path", value, "must be an absolute path"))
    else:
        out.append(not_supported(f"{path}.pathType", ptype, PATH_TYPES))
    return out + _validate_backend(_d(entry.get("backend")), f"{path}.backend")


def _validate_rules(rules: list[Any], path: str) -> list[Cause]:
    out: list[Cause] = []
    for i, rule in enumerate(rules):
        rule = _d(rule)
        p = f"{path}[{i}]"
        host = _s(rule.get("host"))
        if host:
            if parse_ip(host) is not None:
                out.append(invalid_value(f"{p}.host", host, "must be a DNS name, not an IP address"))
            check = is_wildcard_dns1123_subdomain if "*" in host else is_dns1123_subdomain
            out += [invalid_value(f"{p}.host", host, m) for m in check(host)]
        http = rule.get("http")
        if http is not None:
            paths = _l(_d(http).get("paths"))
            if not paths:
                out.append(required(f"{p}.http.paths"))
            for j, entry in enumerate(paths):
                out += _validate_http_path(_d(entry), f"{p}.http.paths[{j}]")
    return out


def _validate_ingress(obj: dict[str, Any]) -> list[Cause]:
    spec = _d(obj.get("spec"))
    out: list[Cause] = []
    rules = _l(spec.get("rules"))
    default = spec.get("defaultBackend")
    if not rules and default is None:
        out.append(invalid_value("spec", spec.get("rules"), "either `defaultBackend` or `rules` must be specified"))
    if default is not None:
        out += _validate_backend(_d(default), "spec.defaultBackend")
    out += _validate_rules(rules, "spec.rules")
    for i, tls in enumerate(_l(spec.get("tls"))):
        tls = _d(tls)
        for j, host in enumerate(_l(tls.get("hosts"))):
            host = _s(host)
            check = is_wildcard_dns1123_subdomain if "*" in host else is_dns1123_subdomain
            out += [invalid_value(f"spec.tls[{i}].hosts[{j}]", host, m) for m in check(host)]
        secret = _s(tls.get("secretName"))
        if secret:
            out += [invalid_value(f"spec.tls[{i}].secretName", secret, m) for m in is_dns1123_subdomain(secret)]
    cls = spec.get("ingressClassName")
    if cls is not None:
        out += [invalid_value("spec.ingressClassName", cls, m) for m in is_dns1123_subdomain(_s(cls))]
    for i, lb in enumerate(_l(_d(_d(obj.get("status")).get("loadBalancer")).get("ingress"))):
        lb = _d(lb)
        p = f"status.loadBalancer.ingress[{i}]"
        if lb.get("ip"):
            out += validate_ip(lb["ip"], f"{p}.ip")
        hostname = _s(lb.get("hostname"))
        if hostname:
            out += [invalid_value(f"{p}.hostname", hostname, m) for m in is_dns1123_subdomain(hostname)]
            if parse_ip(hostname) is not None:
                out.append(invalid_value(f"{p}.hostname", hostname, "must be a DNS name, not an IP address"))
    return out


def validate_ingress_class_annotation(res: Any, obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """On create only (an extra validator): the deprecated class annotation,
    when given with ``spec.ingressClassName``, names the same class."""
    if old is not None:
        return []
    annotations = _d(_d(obj.get("metadata")).get("annotations"))
    cls = _d(obj.get("spec")).get("ingressClassName")
    if INGRESS_CLASS_ANNOTATION in annotations and cls is not None and annotations[INGRESS_CLASS_ANNOTATION] != cls:
        return [invalid_value(f"annotations.{INGRESS_CLASS_ANNOTATION}", annotations[INGRESS_CLASS_ANNOTATION],
                              "must match `ingressClassName` when both are specified")]
    return []


# -------------------------------------------------------------- IngressClass


def _validate_ingress_class(obj: dict[str, Any]) -> list[Cause]:
    spec = _d(obj.get("spec"))
    out: list[Cause] = []
    controller = _s(spec.get("controller"))
    if len(controller) > MAX_CONTROLLER_LEN:
        out.append(too_long("spec.controller", "", MAX_CONTROLLER_LEN))
    out += _validate_domain_prefixed_path(controller, "spec.controller")
    params = spec.get("parameters")
    if params is not None:
        out += _validate_parameters(_d(params), "spec.parameters")
    return out


def _validate_parameters(params: dict[str, Any], path: str) -> list[Cause]:
    out = _validate_typed_reference(params, path)
    scope = params.get("scope")
    if scope is None:
        return out + [required(f"{path}.scope")]
    if scope not in PARAMETER_SCOPES:
        return out + [not_supported(f"{path}.scope", scope, PARAMETER_SCOPES)]
    namespace = params.get("namespace")
    if scope == "Namespace":
        if namespace is None:
            out.append(required(f"{path}.namespace", "`parameters.scope` is set to 'Namespace'"))
        else:
            out += [invalid_value(f"{path}.namespace", namespace, m) for m in is_dns1123_label(_s(namespace))]
    if scope == "Cluster" and namespace is not None:
        out.append(forbidden_field(f"{path}.namespace", "`parameters.scope` is set to 'Cluster'"))
    return out


def _validate_ingress_class_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    return _immutable(_d(new.get("spec")).get("controller"), _d(old.get("spec")).get("controller"),
                      "spec.controller")


# ------------------------------------------------------------- NetworkPolicy


def _validate_policy_port(port: dict[str, Any], path: str) -> list[Cause]:
    out: list[Cause] = []
    proto = port.get("protocol")
    if proto is not None and proto not in POLICY_PROTOCOLS:
        out.append(not_supported(f"{path}.protocol", proto, POLICY_PROTOCOLS))
    value, end = port.get("port"), port.get("endPort")
    if value is None:
        if end is not None:
            out.append(invalid_value(f"{path}.endPort", end, "may not be specified when `port` is not specified"))
    elif isinstance(value, str):
        if end is not None:
            out.append(invalid_value(f"{path}.endPort", end, "may not be specified when `port` is non-numeric"))
        out += [invalid_value(f"{path}.port", value, m) for m in is_valid_port_name(value)]
    else:
        out += [invalid_value(f"{path}.port", value, m) for m in is_valid_port_num(value)]
        if end is not None:
            if _is_int(end) and _is_int(value) and end < value:
                out.append(invalid_value(f"{path}.endPort", value, "must be greater than or equal to `port`"))
            out += [invalid_value(f"{path}.endPort", end, m) for m in is_valid_port_num(end)]
    return out


def _validate_ip_block(block: dict[str, Any], path: str) -> list[Cause]:
    cidr = _s(block.get("cidr"))
    if not cidr:
        return [required(f"{path}.cidr")]
    out = validate_cidr(cidr, f"{path}.cidr")
    if out:
        return out
    outer = ipaddress.ip_network(cidr, strict=False)
    for i, ex in enumerate(_l(block.get("except"))):
        ep = f"{path}.except[{i}]"
        errs = validate_cidr(ex, ep)
        if errs:
            out += errs
            continue
        inner = ipaddress.ip_network(ex, strict=False)
        if inner.version != outer.version or not inner.subnet_of(outer) or inner.prefixlen <= outer.prefixlen:  # type: ignore[arg-type]
            out.append(invalid_value(ep, ex, "must be a strict subset of `cidr`"))
    return out


def _validate_peer(peer: dict[str, Any], path: str) -> list[Cause]:
    out: list[Cause] = []
    count = 0
    for key in ("podSelector", "namespaceSelector"):
        if peer.get(key) is not None:
            count += 1
            out += validate_label_selector(peer[key], f"{path}.{key}")
    if peer.get("ipBlock") is not None:
        count += 1
        out += _validate_ip_block(_d(peer["ipBlock"]), f"{path}.ipBlock")
    if count == 0:
        out.append(required(path, "must specify a peer"))
    elif count > 1 and peer.get("ipBlock") is not None:
        out.append(forbidden_field(path, "may not specify both ipBlock and another peer"))
    return out


def _validate_network_policy(obj: dict[str, Any]) -> list[Cause]:
    spec = _d(obj.get("spec"))
    out = validate_label_selector(spec.get("podSelector"), "spec.podSelector")
    for direction, peers in (("ingress", "from"), ("egress", "to")):
        for i, rule in enumerate(_l(spec.get(direction))):
            rule = _d(rule)
            p = f"spec.{direction}[{i}]"
            for j, port in enumerate(_l(rule.get("ports"))):
                out += _validate_policy_port(_d(port), f"{p}.ports[{j}]")
            for j, peer in enumerate(_l(rule.get(peers))):
                out += _validate_peer(_d(peer), f"{p}.{peers}[{j}]")
    types = _l(spec.get("policyTypes"))
    if len(types) > len(POLICY_TYPES):
        return out + [invalid_value("spec.policyTypes", types, "may not specify more than two policyTypes")]
    for i, t in enumerate(types):
        if t not in POLICY_TYPES:
            out.append(not_supported(f"spec.policyTypes[{i}]", t, POLICY_TYPES))
    return out
