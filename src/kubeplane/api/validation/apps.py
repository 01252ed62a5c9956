"""Validation of apps/v1: Deployments, ReplicaSets, StatefulSets, ControllerRevisions (and the workload helpers they share).
"""

from __future__ import annotations

from typing import Any

from kubeplane.api import errors
from kubeplane.api.errors import Cause, forbidden_field, invalid_value, not_supported, required
from kubeplane.api.selectors import label_selector_from_dict
from kubeplane.api.validation.common import (
    _d,
    _immutable,
    _int_or_percent_is_zero,
    _is_int,
    _nonnegative,
    _validate_int_or_percent,
)
from kubeplane.api.validation.core import validate_pod_template
from kubeplane.api.validation.meta import validate_label_selector


def _validate_replicated_spec(obj: dict[str, Any], what: str) -> list[Cause]:
    spec = _d(obj.get("spec"))
    out: list[Cause] = []
    out += _nonnegative(spec, "replicas", "spec")
    out += _nonnegative(spec, "minReadySeconds", "spec")
    sel = spec.get("selector")
    if sel is None:
        out.append(required("spec.selector"))
    else:
        sel_errs = validate_label_selector(sel, "spec.selector")
        out += sel_errs
        sel_d = _d(sel)
        if not sel_d.get("matchLabels") and not sel_d.get("matchExpressions"):
            out.append(invalid_value("spec.selector", sel, f"empty selector is invalid for {what}"))
    template = spec.get("template")
    if template is None:
        out.append(required("spec.template"))
        return out
    selector = None
    if sel is not None:
        try:
            selector = label_selector_from_dict(_d(sel))
        except errors.StatusError:
            out.append(invalid_value("spec.selector", sel, "invalid label selector"))
    labels = _d(_d(_d(template).get("metadata")).get("labels"))
    if selector is not None and not selector.empty and not selector.matches(labels):
        out.append(invalid_value("spec.template.metadata.labels", labels, "`selector` does not match template `labels`"))
    out += validate_pod_template(template, "spec.template")
    tspec = _d(_d(template).get("spec"))
    if "restartPolicy" in tspec and tspec["restartPolicy"] != "Always":
        out.append(not_supported("spec.template.spec.restartPolicy", tspec["restartPolicy"], ("Always",)))
    if tspec.get("activeDeadlineSeconds") is not None:
        out.append(forbidden_field("spec.template.spec.activeDeadlineSeconds",
                              "activeDeadlineSeconds in ReplicaSet is not Supported"))
    return out


def _validate_deployment(obj: dict[str, Any]) -> list[Cause]:
    out = _validate_replicated_spec(obj, "deployment")
    spec = _d(obj.get("spec"))
    out += _nonnegative(spec, "revisionHistoryLimit", "spec")
    pds = spec.get("progressDeadlineSeconds")
    if pds is not None:
        if not _is_int(pds) or pds < 0:
            out.append(invalid_value("spec.progressDeadlineSeconds", pds, "must be greater than or equal to 0"))
        elif pds <= (spec.get("minReadySeconds") or 0):
            out.append(invalid_value("spec.progressDeadlineSeconds", pds, "must be greater than minReadySeconds"))
    strategy = _d(spec.get("strategy"))
    stype = strategy.get("type")
    if stype == "Recreate":
        if strategy.get("rollingUpdate") is not None:
            out.append(forbidden_field("spec.strategy.rollingUpdate", "may not be specified when strategy `type` is 'Recreate'"))
    elif stype in ("RollingUpdate", None):
        ru = _d(strategy.get("rollingUpdate"))
        mu, ms = ru.get("maxUnavailable"), ru.get("maxSurge")
        out += _validate_int_or_percent(mu, "spec.strategy.rollingUpdate.maxUnavailable")
        out += _validate_int_or_percent(ms, "spec.strategy.rollingUpdate.maxSurge")
        if _int_or_percent_is_zero(mu) and _int_or_percent_is_zero(ms):
            out.append(invalid_value("spec.strategy.rollingUpdate.maxUnavailable", mu, "may not be 0 when `maxSurge` is 0"))
    else:
        out.append(not_supported("spec.strategy.type", stype, ("Recreate", "RollingUpdate")))
    return out


def _validate_replicaset(obj: dict[str, Any]) -> list[Cause]:
    return _validate_replicated_spec(obj, "deployment")


def _selector_immutable(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    return _immutable(_d(new.get("spec")).get("selector"), _d(old.get("spec")).get("selector"), "spec.selector")


def _validate_controller_revision(obj: dict[str, Any]) -> list[Cause]:
    """``revision`` not negative, ``data`` a JSON object."""
    out: list[Cause] = []
    revision = obj.get("revision")
    if revision is not None and (not _is_int(revision) or revision < 0):
        out.append(invalid_value("revision", revision, "must be greater than or equal to 0"))
    data = obj.get("data")
    if data is None:
        out.append(required("data", "data is mandatory"))
    elif not isinstance(data, dict):
        out.append(required("data", "data must be a valid JSON object"))
    return out


def _validate_controller_revision_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    return _immutable(new.get("data"), old.get("data"), "data")
