"""Validation of storage.k8s.io/v1: StorageClasses, CSINodes, CSIStorageCapacities.
"""

from __future__ import annotations

from typing import Any

from kubeplane.api.errors import (
    Cause,
    duplicate,
    forbidden_field,
    invalid_value,
    not_supported,
    required,
    too_long,
)
from kubeplane.api.strings import is_dns1123_subdomain, is_qualified_name
from kubeplane.api.validation.common import _canonical, _d, _immutable, _l, _norm, _quantity, _s
from kubeplane.api.validation.meta import TOTAL_ANNOTATION_SIZE_LIMIT, validate_label_selector


def _validate_storage_class(obj: dict[str, Any]) -> list[Cause]:
    out: list[Cause] = []
    prov = _s(obj.get("provisioner"))
    if not prov:
        out.append(required("provisioner"))
    else:
        out += [invalid_value("provisioner", prov, m) for m in is_qualified_name(prov.lower())]
    params = _d(obj.get("parameters"))
    total = 0
    for k, v in params.items():
        if not k:
            out.append(invalid_value("parameters", k, "field can not be empty."))
        total += len(k) + len(_s(v))
    if total > TOTAL_ANNOTATION_SIZE_LIMIT:
        out.append(too_long("parameters", None, TOTAL_ANNOTATION_SIZE_LIMIT))
    rp = obj.get("reclaimPolicy")
    if rp and rp not in ("Delete", "Retain"):
        out.append(not_supported("reclaimPolicy", rp, ("Delete", "Retain")))
    vbm = obj.get("volumeBindingMode")
    if vbm is not None and vbm not in ("Immediate", "WaitForFirstConsumer"):
        out.append(not_supported("volumeBindingMode", vbm, ("Immediate", "WaitForFirstConsumer")))
    for i, term in enumerate(_l(obj.get("allowedTopologies"))):
        exprs = _l(_d(term).get("matchLabelExpressions"))
        if not exprs:
            out.append(required(f"allowedTopologies[{i}].matchLabelExpressions", "must have at least one label expression"))
        for j, e in enumerate(exprs):
            e = _d(e)
            p = f"allowedTopologies[{i}].matchLabelExpressions[{j}]"
            out += [invalid_value(f"{p}.key", _s(e.get("key")), m) for m in is_qualified_name(_s(e.get("key")))]
            if not _l(e.get("values")):
                out.append(required(f"{p}.values", "must specify as least one value"))
    return out


def _validate_storage_class_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    out: list[Cause] = []
    if _norm(new.get("parameters")) != _norm(old.get("parameters")):
        out.append(forbidden_field("parameters", "updates to parameters are forbidden."))
    if _s(new.get("provisioner")) != _s(old.get("provisioner")):
        out.append(forbidden_field("provisioner", "updates to provisioner are forbidden."))
    if (new.get("reclaimPolicy") or "Delete") != (old.get("reclaimPolicy") or "Delete"):
        out.append(forbidden_field("reclaimPolicy", "updates to reclaimPolicy are forbidden."))
    out += _immutable(new.get("volumeBindingMode") or "Immediate", old.get("volumeBindingMode") or "Immediate",
                      "volumeBindingMode")
    return out


def _validate_csi_node(obj: dict[str, Any]) -> list[Cause]:
    out: list[Cause] = []
    names: set[str] = set()
    for i, drv in enumerate(_l(_d(obj.get("spec")).get("drivers"))):
        drv = _d(drv)
        p = f"spec.drivers[{i}]"
        name = _s(drv.get("name"))
        if not name:
            out.append(required(f"{p}.name"))
        elif name in names:
            out.append(duplicate(f"{p}.name", name))
        names.add(name)
        if not drv.get("nodeID"):
            out.append(required(f"{p}.nodeID"))
    return out


def _validate_csi_storage_capacity(obj: dict[str, Any]) -> list[Cause]:
    out: list[Cause] = []
    scn = _s(obj.get("storageClassName"))
    if not scn:
        out.append(required("storageClassName"))
    else:
        out += [invalid_value("storageClassName", scn, m) for m in is_dns1123_subdomain(scn)]
    for key in ("capacity", "maximumVolumeSize"):
        if obj.get(key) is not None:
            q, errs = _quantity(obj[key], key)
            out += errs
            if q is not None and q < 0:
                out.append(invalid_value(key, _canonical(obj[key]), "must be greater than or equal to 0"))
    if obj.get("nodeTopology") is not None:
        out += validate_label_selector(obj["nodeTopology"], "nodeTopology")
    return out
