"""The DRA validator: the resource.k8s.io checks that need this package
(CEL selectors compiled, semver versions) beside the structural ones, for
DeviceClass, ResourceClaim, ResourceClaimTemplate and ResourceSlice (field
paths as upstream).

The API's built-in checks live in :mod:`kubeplane.api.validation.resource`;
the api layer cannot import this package (it sits above api and below the
registry), so :func:`install` adds :func:`validate_resource` to the API
validation dispatch through its extra-validator hook, and the dispatch drops
the causes the built-in checks already reported. The registry installs it
when it builds its default validator; calling it again is harmless.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from kubeplane.api.errors import (
    Cause,
    duplicate,
    forbidden_field,
    invalid_value,
    not_supported,
    required,
    too_long,
    too_many,
)
from kubeplane.api.strings import is_dns1123_label, is_dns1123_subdomain
from kubeplane.api.validation import extra_validators, register_extra_validator, validate_node_selector
from kubeplane.api.validation.core import validate_unique_label_name
from kubeplane.api.validation.common import _d, _l

if TYPE_CHECKING:
    from kubeplane.api.resources import ResourceInfo

__all__ = ["DRA_RESOURCES", "install", "installed", "validate_dra", "validate_resource", "validate_selectors"]

#: resources (``ResourceInfo.qualified``) validated by :func:`validate_resource`
DRA_RESOURCES = (
    "deviceclasses.resource.k8s.io",
    "resourceclaims.resource.k8s.io",
    "resourceclaimtemplates.resource.k8s.io",
    "resourceslices.resource.k8s.io",
)

MAX_REQUESTS = 32
MAX_CONSTRAINTS = 32
MAX_SUBREQUESTS = 8
MAX_DEVICES_PER_SLICE = 128
MAX_SELECTORS = 32
MAX_ATTRIBUTES_AND_CAPACITY = 32
ALLOCATION_MODES = ("All", "ExactCount")
IMMUTABLE = "field is immutable"



def validate_selectors(selectors: Any, path: str) -> list[Cause]:
    """Each selector needs ``cel.expression`` that compiles."""
    # the CEL library loads with the first DRA object, not at start-up
    from kubeplane.dra.cel import CELCompileError, compile_selector

    out: list[Cause] = []
    sels = _l(selectors)
    if len(sels) > MAX_SELECTORS:
        out.append(too_many(path, len(sels), MAX_SELECTORS))
    for i, sel in enumerate(sels):
        p = f"{path}[{i}]"
        cel = _d(sel).get("cel")
        if cel is None:
            out.append(required(f"{p}.cel"))
            continue
        expr = _d(cel).get("expression")
        ep = f"{p}.cel.expression"
        if not isinstance(expr, str) or not expr:
            out.append(required(ep))
            continue
        try:
            compile_selector(expr)
        except CELCompileError as err:
            out.append(invalid_value(ep, expr, err.message))
    return out


def _validate_configs(configs: Any, path: str, request_names: set[str] | None) -> list[Cause]:
    out: list[Cause] = []
    for i, cfg in enumerate(_l(configs)):
        p = f"{path}[{i}]"
        cfg = _d(cfg)
        if request_names is not None:
            out += _validate_request_refs(cfg.get("requests"), f"{p}.requests", request_names)
        opaque = cfg.get("opaque")
        if opaque is None:
            out.append(required(f"{p}.opaque"))
            continue
        driver = _d(opaque).get("driver")
        if not driver:
            out.append(required(f"{p}.opaque.driver"))
        else:
            for msg in is_dns1123_subdomain(driver):
                out.append(invalid_value(f"{p}.opaque.driver", driver, msg))
        if _d(opaque).get("parameters") is None:
            out.append(required(f"{p}.opaque.parameters"))
    return out


def _validate_request_refs(refs: Any, path: str, names: set[str]) -> list[Cause]:
    out: list[Cause] = []
    seen: set[str] = set()
    for j, ref in enumerate(_l(refs)):
        rp = f"{path}[{j}]"
        if ref in seen:
            out.append(duplicate(rp, ref))
            continue
        seen.add(ref)
        if ref not in names:
            out.append(invalid_value(rp, ref, "must be the name of a request in the claim or the name of a request and a subrequest separated by '/'"))
    return out


def _validate_exact(spec: Mapping[str, Any], path: str, allow_admin: bool) -> list[Cause]:
    out: list[Cause] = []
    dc = spec.get("deviceClassName")
    if not dc:
        out.append(required(f"{path}.deviceClassName"))
    else:
        for msg in is_dns1123_subdomain(dc):
            out.append(invalid_value(f"{path}.deviceClassName", dc, msg))
    out += validate_selectors(spec.get("selectors"), f"{path}.selectors")
    mode = spec.get("allocationMode") or "ExactCount"
    count = spec.get("count")
    if mode == "ExactCount":
        if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
            out.append(invalid_value(f"{path}.count", count, "must be greater than zero"))
    elif mode == "All":
        if count:
            out.append(invalid_value(f"{path}.count", count, "must not be specified when allocationMode is 'All'"))
    else:
        out.append(not_supported(f"{path}.allocationMode", mode, list(ALLOCATION_MODES)))
    if not allow_admin and spec.get("adminAccess") is not None:
        out.append(forbidden_field(f"{path}.adminAccess", "admin access is not allowed for subrequests"))
    return out


def _validate_claim_spec(spec: Any, path: str) -> list[Cause]:
    out: list[Cause] = []
    devices = _d(_d(spec).get("devices"))
    dpath = f"{path}.devices"
    requests = _l(devices.get("requests"))
    if len(requests) > MAX_REQUESTS:
        out.append(too_many(f"{dpath}.requests", len(requests), MAX_REQUESTS))
    names: set[str] = set()
    ref_names: set[str] = set()
    for i, req in enumerate(requests):
        p = f"{dpath}.requests[{i}]"
        req = _d(req)
        name = req.get("name")
        out += validate_unique_label_name(name, f"{p}.name", names)
        if name:
            ref_names.add(name)
        exactly, first = req.get("exactly"), req.get("firstAvailable")
        if exactly is not None and first is not None:
            out.append(invalid_value(p, "", "exactly one of `exactly` or `firstAvailable` is required, but multiple fields are set"))
        elif exactly is None and first is None:
            out.append(required(p, "exactly one of `exactly` or `firstAvailable` is required"))
        elif exactly is not None:
            out += _validate_exact(_d(exactly), f"{p}.exactly", True)
        else:
            subs = _l(first)
            fp = f"{p}.firstAvailable"
            if not subs:
                out.append(required(fp))
            if len(subs) > MAX_SUBREQUESTS:
                out.append(too_many(fp, len(subs), MAX_SUBREQUESTS))
            sub_names: set[str] = set()
            for k, sub in enumerate(subs):
                sp = f"{fp}[{k}]"
                sub = _d(sub)
                sname = sub.get("name")
                out += validate_unique_label_name(sname, f"{sp}.name", sub_names)
                if sname and name:
                    ref_names.add(f"{name}/{sname}")
                out += _validate_exact(sub, sp, False)
    constraints = _l(devices.get("constraints"))
    if len(constraints) > MAX_CONSTRAINTS:
        out.append(too_many(f"{dpath}.constraints", len(constraints), MAX_CONSTRAINTS))
    for i, c in enumerate(constraints):
        p = f"{dpath}.constraints[{i}]"
        c = _d(c)
        out += _validate_request_refs(c.get("requests"), f"{p}.requests", ref_names)
        attr = c.get("matchAttribute")
        if attr is None:
            out.append(required(f"{p}.matchAttribute"))
        else:
            out += _validate_fully_qualified(attr, f"{p}.matchAttribute")
    out += _validate_configs(devices.get("config"), f"{dpath}.config", ref_names)
    return out


def _validate_fully_qualified(name: Any, path: str) -> list[Cause]:
    if not isinstance(name, str) or "/" not in name:
        return [invalid_value(path, name, "must include a domain")]
    domain, _, ident = name.partition("/")
    out: list[Cause] = []
    for msg in is_dns1123_subdomain(domain):
        out.append(invalid_value(path, domain, msg))
    if not ident or not (ident[0].isalpha() or ident[0] == "_") or not all(ch.isalnum() or ch == "_" for ch in ident):
        out.append(invalid_value(path, ident, "a C identifier must start with a letter or underscore, followed by letters, digits or underscores"))
    return out


def _validate_device(dev: Any, path: str) -> list[Cause]:
    out: list[Cause] = []
    dev = _d(dev)
    name = dev.get("name")
    if not name:
        out.append(required(f"{path}.name"))
    else:
        for msg in is_dns1123_label(name):
            out.append(invalid_value(f"{path}.name", name, msg))
    attrs, caps = _d(dev.get("attributes")), _d(dev.get("capacity"))
    if len(attrs) + len(caps) > MAX_ATTRIBUTES_AND_CAPACITY:
        out.append(too_many(path, len(attrs) + len(caps), MAX_ATTRIBUTES_AND_CAPACITY))
    for key, attr in attrs.items():
        ap = f"{path}.attributes[{key}]"
        set_fields = [k for k in ("bool", "int", "string", "version") if k in _d(attr)]
        if len(set_fields) != 1:
            out.append(invalid_value(ap, attr, "exactly one value must be specified"))
            continue
        kind = set_fields[0]
        value = attr[kind]
        if kind in ("string", "version") and isinstance(value, str) and len(value) > 64:
            out.append(too_long(f"{ap}.{kind}", value, 64))
        if kind == "version":
            from kubeplane.dra.cel import is_semver

            if not is_semver(str(value)):
                out.append(invalid_value(f"{ap}.version", value, "must be a string compatible with semver.org spec 2.0.0"))
    for key, cap in caps.items():
        if _d(cap).get("value") is None:
            out.append(required(f"{path}.capacity[{key}].value"))
    return out


def _validate_slice(obj: Mapping[str, Any]) -> list[Cause]:
    out: list[Cause] = []
    spec = _d(obj.get("spec"))
    driver = spec.get("driver")
    if not driver:
        out.append(required("spec.driver"))
    else:
        for msg in is_dns1123_subdomain(driver):
            out.append(invalid_value("spec.driver", driver, msg))
        if len(driver) > 63:
            out.append(too_long("spec.driver", driver, 63))
    pool = spec.get("pool")
    if pool is None:
        out.append(required("spec.pool"))
    else:
        pool = _d(pool)
        pname = pool.get("name")
        if not pname:
            out.append(required("spec.pool.name"))
        else:
            for part in str(pname).split("/"):
                for msg in is_dns1123_subdomain(part):
                    out.append(invalid_value("spec.pool.name", pname, msg))
        gen = pool.get("generation", 0)
        if not isinstance(gen, int) or isinstance(gen, bool) or gen < 0:
            out.append(invalid_value("spec.pool.generation", gen, "must be greater than or equal to 0"))
        count = pool.get("resourceSliceCount")
        if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
            out.append(invalid_value("spec.pool.resourceSliceCount", count, "must be greater than zero"))
    chosen = [f for f in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(f)]
    if not chosen:
        out.append(required("spec", "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"))
    elif len(chosen) > 1:
        out.append(invalid_value("spec", "{" + ", ".join(f"`{c}`" for c in chosen) + "}",
                            "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required, but multiple fields are set"))
    if spec.get("nodeName"):
        for msg in is_dns1123_subdomain(spec["nodeName"]):
            out.append(invalid_value("spec.nodeName", spec["nodeName"], msg))
    if spec.get("nodeSelector"):
        out += validate_node_selector(spec["nodeSelector"], "spec.nodeSelector")
        terms = _l(_d(spec["nodeSelector"]).get("nodeSelectorTerms"))
        if len(terms) != 1:
            out.append(invalid_value("spec.nodeSelector.nodeSelectorTerms", len(terms), "must have exactly one node selector term"))
    devices = _l(spec.get("devices"))
    if len(devices) > MAX_DEVICES_PER_SLICE:
        out.append(too_many("spec.devices", len(devices), MAX_DEVICES_PER_SLICE))
    seen: set[str] = set()
    for i, dev in enumerate(devices):
        p = f"spec.devices[{i}]"
        out += _validate_device(dev, p)
        name = _d(dev).get("name")
        if name:
            if name in seen:
                out.append(duplicate(f"{p}.name", name))
            seen.add(name)
    return out


def _immutable(new: Any, old: Any, path: str) -> list[Cause]:
    return [] if new == old else [invalid_value(path, "", IMMUTABLE)]


def validate_dra(res_kind: str, obj: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> list[Cause]:
    """Field errors for a resource.k8s.io object (``old`` set on update)."""
    if res_kind == "DeviceClass":
        spec = _d(obj.get("spec"))
        return validate_selectors(spec.get("selectors"), "spec.selectors") + _validate_configs(
            spec.get("config"), "spec.config", None
        )
    if res_kind == "ResourceClaim":
        out = _validate_claim_spec(obj.get("spec"), "spec")
        if old is not None:
            out += _immutable(obj.get("spec"), old.get("spec"), "spec")
        return out
    if res_kind == "ResourceClaimTemplate":
        spec = _d(obj.get("spec"))
        out = _validate_claim_spec(spec.get("spec"), "spec.spec")
        if old is not None:
            out += _immutable(obj.get("spec"), old.get("spec"), "spec")
        return out
    if res_kind == "ResourceSlice":
        out = _validate_slice(obj)
        if old is not None:
            out += _immutable(_d(obj.get("spec")).get("driver"), _d(old.get("spec")).get("driver"), "spec.driver")
        return out
    return []


def validate_resource(res: "ResourceInfo", obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[Cause]:
    """The DRA field errors of ``obj`` (``old`` set on update), as the API
    validation dispatch runs it after the built-in checks of ``res``."""
    return validate_dra(res.kind, obj, old)


def installed() -> bool:
    """Whether :func:`validate_resource` is registered for every DRA resource."""
    return all(validate_resource in extra_validators.get(q, ()) for q in DRA_RESOURCES)


def install() -> None:
    """Register :func:`validate_resource` for the DRA resources (idempotent)."""
    for qualified in DRA_RESOURCES:
        if validate_resource not in extra_validators.get(qualified, ()):
            register_extra_validator(qualified, validate_resource)
