"""Validation of batch/v1 Jobs.
"""

from __future__ import annotations

from typing import Any

from kubeplane.api.errors import Cause, invalid_value, not_supported, required
from kubeplane.api.validation.common import _d, _immutable, _is_int, _nonnegative
from kubeplane.api.validation.core import validate_pod_template
from kubeplane.api.validation.meta import validate_label_selector


def _validate_job(obj: dict[str, Any]) -> list[Cause]:
    spec = _d(obj.get("spec"))
    out: list[Cause] = []
    for key in ("parallelism", "completions", "backoffLimit"):
        out += _nonnegative(spec, key, "spec")
    ads = spec.get("activeDeadlineSeconds")
    if ads is not None and (not _is_int(ads) or ads <= 0):
        out.append(invalid_value("spec.activeDeadlineSeconds", ads, "must be greater than 0"))
    if spec.get("selector") is not None:
        out += validate_label_selector(spec["selector"], "spec.selector")
    template = spec.get("template")
    if template is None:
        out.append(required("spec.template"))
        return out
    out += validate_pod_template(template, "spec.template")
    rp = _d(_d(template).get("spec")).get("restartPolicy")
    if rp not in ("OnFailure", "Never"):
        out.append(not_supported("spec.template.spec.restartPolicy", rp or "", ("OnFailure", "Never")))
    return out


def _validate_job_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    ns, os_ = _d(new.get("spec")), _d(old.get("spec"))
    out = _immutable(ns.get("selector"), os_.get("selector"), "spec.selector")
    out += _immutable(ns.get("template"), os_.get("template"), "spec.template")
    out += _immutable(ns.get("completions"), os_.get("completions"), "spec.completions")
    return out
