"""Validation of resource.k8s.io (dynamic resource allocation): the built-in checks of
DeviceClasses, ResourceClaims, ResourceClaimTemplates and ResourceSlices.
"""

from __future__ import annotations

from typing import Any

from kubeplane.api.errors import Cause, invalid_value, not_supported, required
from kubeplane.api.strings import is_dns1123_subdomain
from kubeplane.api.validation.common import _d, _immutable, _is_int, _l, _nonnegative, _quantity, _s
from kubeplane.api.validation.core import (
    _validate_tolerations,
    validate_node_selector,
    validate_unique_label_name,
)
from kubeplane.api.validation.meta import validate_annotations, validate_labels


ALLOCATION_MODES = ("All", "ExactCount")


def _validate_device_selectors(selectors: Any, path: str) -> list[Cause]:
    out: list[Cause] = []
    for i, sel in enumerate(_l(selectors)):
        sel = _d(sel)
        p = f"{path}[{i}]"
        if sel.get("cel") is None:
            out.append(required(f"{p}.cel"))
        elif not _s(_d(sel["cel"]).get("expression")):
            out.append(required(f"{p}.cel.expression"))
    return out


def _validate_exact_request(req: Any, path: str) -> list[Cause]:
    req = _d(req)
    out: list[Cause] = []
    dcn = _s(req.get("deviceClassName"))
    if not dcn:
        out.append(required(f"{path}.deviceClassName"))
    else:
        out += [invalid_value(f"{path}.deviceClassName", dcn, m) for m in is_dns1123_subdomain(dcn)]
    out += _validate_device_selectors(req.get("selectors"), f"{path}.selectors")
    mode = req.get("allocationMode") or "ExactCount"
    count = req.get("count")
    if mode == "ExactCount":
        if count is not None and (not _is_int(count) or count <= 0):
            out.append(invalid_value(f"{path}.count", count, "must be greater than zero"))
    elif mode == "All":
        if count:
            out.append(invalid_value(f"{path}.count", count, "must not be specified when allocationMode is 'All'"))
    else:
        out.append(not_supported(f"{path}.allocationMode", mode, ALLOCATION_MODES))
    out += _validate_tolerations(req.get("tolerations"), f"{path}.tolerations")
    return out


def validate_device_claim_spec(spec: Any, path: str = "spec") -> list[Cause]:
    """ResourceClaimSpec (``devices.requests``, ``constraints``, ``config``)."""
    devices = _d(_d(spec).get("devices"))
    dpath = f"{path}.devices"
    out: list[Cause] = []
    names: set[str] = set()
    refs: set[str] = set()
    for i, req in enumerate(_l(devices.get("requests"))):
        req = _d(req)
        p = f"{dpath}.requests[{i}]"
        name = _s(req.get("name"))
        out += validate_unique_label_name(name, f"{p}.name", names)
        if name:
            refs.add(name)
        first = _l(req.get("firstAvailable"))
        exactly = req.get("exactly")
        kinds = int(bool(first)) + int(exactly is not None)
        if kinds == 0:
            out.append(required(p, "exactly one of `exactly` or `firstAvailable` is required"))
        elif kinds > 1:
            out.append(invalid_value(p, None, "exactly one of `exactly` or `firstAvailable` is required, but multiple fields are set"))
        if exactly is not None:
            out += _validate_exact_request(exactly, f"{p}.exactly")
        sub_names: set[str] = set()
        for j, sub in enumerate(first):
            sub = _d(sub)
            sp = f"{p}.firstAvailable[{j}]"
            sname = _s(sub.get("name"))
            out += validate_unique_label_name(sname, f"{sp}.name", sub_names)
            if sname:
                refs.add(f"{name}/{sname}")
            out += _validate_exact_request(sub, sp)
    ref_msg = "must be the name of a request in the claim or the name of a request and a subrequest separated by '/'"
    for i, c in enumerate(_l(devices.get("constraints"))):
        for j, r in enumerate(_l(_d(c).get("requests"))):
            if r not in refs:
                out.append(invalid_value(f"{dpath}.constraints[{i}].requests[{j}]", r, ref_msg))
    for i, c in enumerate(_l(devices.get("config"))):
        c = _d(c)
        for j, r in enumerate(_l(c.get("requests"))):
            if r not in refs:
                out.append(invalid_value(f"{dpath}.config[{i}].requests[{j}]", r, ref_msg))
        if c.get("opaque") is None:
            out.append(required(f"{dpath}.config[{i}].opaque"))
        else:
            opaque = _d(c["opaque"])
            if not opaque.get("driver"):
                out.append(required(f"{dpath}.config[{i}].opaque.driver"))
            if opaque.get("parameters") is None:
                out.append(required(f"{dpath}.config[{i}].opaque.parameters"))
    return out


def _validate_resource_claim(obj: dict[str, Any]) -> list[Cause]:
    return validate_device_claim_spec(obj.get("spec"), "spec")


def _validate_resource_claim_template(obj: dict[str, Any]) -> list[Cause]:
    spec = _d(obj.get("spec"))
    meta = _d(spec.get("metadata"))
    out = validate_labels(meta.get("labels"), "spec.metadata.labels")
    out += validate_annotations(meta.get("annotations"), "spec.metadata.annotations")
    return out + validate_device_claim_spec(spec.get("spec"), "spec.spec")


def _spec_immutable(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    return _immutable(new.get("spec"), old.get("spec"), "spec")


def _validate_device_class(obj: dict[str, Any]) -> list[Cause]:
    spec = _d(obj.get("spec"))
    out = _validate_device_selectors(spec.get("selectors"), "spec.selectors")
    for i, c in enumerate(_l(spec.get("config"))):
        opaque = _d(c).get("opaque")
        if opaque is None:
            out.append(required(f"spec.config[{i}].opaque"))
        elif not _d(opaque).get("driver"):
            out.append(required(f"spec.config[{i}].opaque.driver"))
    return out


NODE_SELECTION_FIELDS = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")


def _validate_resource_slice(obj: dict[str, Any]) -> list[Cause]:
    spec = _d(obj.get("spec"))
    out: list[Cause] = []
    driver = _s(spec.get("driver"))
    if not driver:
        out.append(required("spec.driver"))
    else:
        out += [invalid_value("spec.driver", driver, m) for m in is_dns1123_subdomain(driver)]
    pool = spec.get("pool")
    if pool is None:
        out.append(required("spec.pool"))
    else:
        pool = _d(pool)
        if not pool.get("name"):
            out.append(required("spec.pool.name"))
        rsc = pool.get("resourceSliceCount")
        if not _is_int(rsc) or rsc <= 0:
            out.append(invalid_value("spec.pool.resourceSliceCount", rsc, "must be greater than zero"))
        out += _nonnegative(pool, "generation", "spec.pool")
    set_fields = [f for f in NODE_SELECTION_FIELDS if spec.get(f) not in (None, False, "")]
    msg = "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"
    if not set_fields:
        out.append(required("spec", msg))
    elif len(set_fields) > 1:
        out.append(invalid_value("spec", "{`" + "`, `".join(set_fields) + "`}", msg + ", but multiple fields are set"))
    if spec.get("nodeName"):
        out += [invalid_value("spec.nodeName", spec["nodeName"], m) for m in is_dns1123_subdomain(_s(spec["nodeName"]))]
    if spec.get("nodeSelector") is not None:
        out += validate_node_selector(spec["nodeSelector"], "spec.nodeSelector")
    names: set[str] = set()
    for i, dev in enumerate(_l(spec.get("devices"))):
        dev = _d(dev)
        p = f"spec.devices[{i}]"
        name = _s(dev.get("name"))
        out += validate_unique_label_name(name, f"{p}.name", names)
        for cname, value in _d(dev.get("capacity")).items():
            cp = f"{p}.capacity[{cname}].value"
            _, errs = _quantity(_d(value).get("value"), cp)
            out += errs
    return out


def _validate_resource_slice_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    ns, os_ = _d(new.get("spec")), _d(old.get("spec"))
    out = _immutable(ns.get("nodeName"), os_.get("nodeName"), "spec.nodeName")
    out += _immutable(ns.get("driver"), os_.get("driver"), "spec.driver")
    out += _immutable(_d(ns.get("pool")).get("name"), _d(os_.get("pool")).get("name"), "spec.pool.name")
    return out
