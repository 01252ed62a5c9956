"""Validation of apps/v1: Deployments, ReplicaSets, StatefulSets, ControllerRevisions, DaemonSets (and the workload helpers they share).
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


# ----------------------------------------------------------------- DaemonSets


def _int_or_percent_value(v: Any) -> int:
    """Upstream ``getIntOrPercentValue``: the number, or the percent's number (0 when unreadable)."""
    if _is_int(v):
        return v
    if isinstance(v, str) and v.endswith("%"):
        try:
            return int(v[:-1])
        except ValueError:
            return 0
    return 0


def _go_update_strategy(strategy: dict[str, Any]) -> str:
    """A DaemonSetUpdateStrategy as Go's ``%#v`` prints the internal struct."""
    ru = strategy.get("rollingUpdate")
    if isinstance(ru, dict):
        inner = ", ".join(f"{k[0].upper()}{k[1:]}:{errors.go_repr(ru[k])}" for k in ("maxUnavailable", "maxSurge")
                          if k in ru)
        ru_s = f"&apps.RollingUpdateDaemonSet{{{inner}}}"
    else:
        ru_s = "(*apps.RollingUpdateDaemonSet)(nil)"
    return f"apps.DaemonSetUpdateStrategy{{Type:{errors.go_repr(str(strategy.get('type') or ''))}, RollingUpdate:{ru_s}}}"


def _validate_daemonset_update_strategy(strategy: Any, path: str) -> list[Cause]:
    strategy = _d(strategy)
    stype = strategy.get("type")
    if stype == "OnDelete":
        return []
    if stype == "RollingUpdate":
        ru = strategy.get("rollingUpdate")
        if not isinstance(ru, dict):
            return [required(f"{path}.rollingUpdate")]
        out: list[Cause] = []
        mu, ms = ru.get("maxUnavailable"), ru.get("maxSurge")
        out += _validate_int_or_percent(mu, f"{path}.rollingUpdate.maxUnavailable")
        out += _validate_int_or_percent(ms, f"{path}.rollingUpdate.maxSurge")
        has_unavailable = _int_or_percent_value(mu) != 0
        has_surge = _int_or_percent_value(ms) != 0
        if has_unavailable and has_surge:
            out.append(invalid_value(f"{path}.rollingUpdate.maxSurge", ms, "may not be set when maxUnavailable is non-zero"))
        elif not has_unavailable and not has_surge:
            out.append(required(f"{path}.rollingUpdate.maxUnavailable", "cannot be 0 when maxSurge is 0"))
        return out
    quoted = '"RollingUpdate", "OnDelete"'
    return [Cause("FieldValueNotSupported",
                  f"Unsupported value: {_go_update_strategy(strategy)}: supported values: {quoted}", path)]


def _validate_daemonset(obj: dict[str, Any]) -> list[Cause]:
    """Upstream ``ValidateDaemonSetSpec`` (the name and metadata are checked by the
    registry) and, since a status write runs these checks too, the status counters."""
    return _validate_daemonset_spec(obj) + _validate_daemonset_status(obj)


def _validate_daemonset_spec(obj: dict[str, Any]) -> list[Cause]:
    spec = _d(obj.get("spec"))
    out: list[Cause] = []
    sel = spec.get("selector")
    out += validate_label_selector(sel, "spec.selector")
    template = _d(spec.get("template"))
    labels = _d(_d(template.get("metadata")).get("labels"))
    selector = None
    if isinstance(sel, dict):
        try:
            selector = label_selector_from_dict(sel)
        except errors.StatusError:
            selector = None
    # a missing selector selects nothing, so no template matches it
    if selector is None and sel is None or selector is not None and not selector.matches(labels):
        out.append(invalid_value("spec.template.metadata.labels", labels, "`selector` does not match template `labels`"))
    if isinstance(sel, dict) and not sel.get("matchLabels") and not sel.get("matchExpressions"):
        # the bad value as metav1.LabelSelector's String() prints an empty one
        out.append(Cause("FieldValueInvalid", "Invalid value: &LabelSelector{MatchLabels:map[string]string{},"
                         "MatchExpressions:[]LabelSelectorRequirement{},}: empty selector is invalid for daemonset",
                         "spec.selector"))
    out += validate_pod_template(template, "spec.template")
    tspec = _d(template.get("spec"))
    restart = tspec.get("restartPolicy", "Always")
    if restart != "Always":
        out.append(not_supported("spec.template.spec.restartPolicy", restart, ("Always",)))
    if tspec.get("activeDeadlineSeconds") is not None:
        out.append(forbidden_field("spec.template.spec.activeDeadlineSeconds",
                                   "activeDeadlineSeconds in DaemonSet is not Supported"))
    out += _nonnegative(spec, "minReadySeconds", "spec")
    out += _validate_daemonset_update_strategy(spec.get("updateStrategy"), "spec.updateStrategy")
    out += _nonnegative(spec, "revisionHistoryLimit", "spec")
    return out


def _validate_daemonset_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    return _selector_immutable(new, old) + _collision_count_not_decremented(new, old)


def _validate_daemonset_status(obj: dict[str, Any]) -> list[Cause]:
    """Upstream ``validateDaemonSetStatus``: every counter non-negative."""
    status = _d(obj.get("status"))
    out: list[Cause] = []
    for key in ("currentNumberScheduled", "numberMisscheduled", "desiredNumberScheduled", "numberReady",
                "observedGeneration", "updatedNumberScheduled", "numberAvailable", "numberUnavailable",
                "collisionCount"):
        out += _nonnegative(status, key, "status")
    return out


def _collision_count_not_decremented(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    out: list[Cause] = []
    new_cc, old_cc = _d(new.get("status")).get("collisionCount"), _d(old.get("status")).get("collisionCount")
    if _is_int(old_cc) and (new_cc is None or (_is_int(new_cc) and new_cc < old_cc)):
        out.append(invalid_value("status.collisionCount", new_cc if new_cc is not None else 0, "cannot be decremented"))
    return out
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
