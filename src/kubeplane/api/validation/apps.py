"""Validation of apps/v1: Deployments, ReplicaSets, StatefulSets, ControllerRevisions, DaemonSets (and the workload helpers they share).
"""

from __future__ import annotations

from typing import Any

from kubeplane.api import errors
from kubeplane.api.errors import Cause, forbidden_field, invalid_value, not_supported, required
from kubeplane.api.selectors import label_selector_from_dict
from kubeplane.api.validation.common import (
    _d,
    _l,
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


# ------------------------------------------------------------------ StatefulSets

_STS_MUTABLE = ("replicas", "ordinals", "template", "updateStrategy", "revisionHistoryLimit",
                "persistentVolumeClaimRetentionPolicy", "minReadySeconds")


def _template_for_statefulset(spec: dict[str, Any]) -> dict[str, Any]:
    """The pod template as upstream validates it: hostname and subdomain are the
    controller's to set, and every volumeClaimTemplate is a volume of the pod
    (replacing a template volume of the same name)."""
    template = _d(spec.get("template"))
    tspec = _d(template.get("spec"))
    claims = [c for c in _l(spec.get("volumeClaimTemplates")) if isinstance(c, dict)]
    if not (tspec.get("hostname") or tspec.get("subdomain") or claims):
        return template
    tspec = dict(tspec)
    tspec.pop("hostname", None)
    tspec.pop("subdomain", None)
    if claims:
        names = [_d(c.get("metadata")).get("name", "") for c in claims]
        added = [{"name": n, "persistentVolumeClaim": {"claimName": n}} for n in dict.fromkeys(names)]
        kept = [v for v in _l(tspec.get("volumes")) if not (isinstance(v, dict) and v.get("name") in names)]
        tspec["volumes"] = added + kept
    return {**template, "spec": tspec}


def _validate_statefulset_spec(spec: dict[str, Any], *, update: bool = False,
                               skip_template: bool = False) -> list[Cause]:
    from kubeplane.api.strings import is_dns1123_label
    from kubeplane.api.validation.core import validate_pvc_spec

    out: list[Cause] = []
    pmp = spec.get("podManagementPolicy")
    if not pmp:
        out.append(required("spec.podManagementPolicy"))
    elif pmp not in ("OrderedReady", "Parallel"):
        out.append(invalid_value("spec.podManagementPolicy", pmp, "must be 'OrderedReady' or 'Parallel'"))
    strategy = _d(spec.get("updateStrategy"))
    stype = strategy.get("type")
    ru = strategy.get("rollingUpdate")
    if not stype:
        out.append(required("spec.updateStrategy"))
    elif stype == "OnDelete":
        if ru is not None:
            out.append(invalid_value("spec.updateStrategy.rollingUpdate", ru,
                                     "only allowed for updateStrategy 'RollingUpdate'"))
    elif stype == "RollingUpdate":
        if ru is not None and not isinstance(ru, dict):
            out.append(invalid_value("spec.updateStrategy.rollingUpdate", ru, "must be an object"))
        elif ru is not None:
            out += _nonnegative(ru, "partition", "spec.updateStrategy.rollingUpdate")
            mu = ru.get("maxUnavailable")
            if mu is not None:
                path = "spec.updateStrategy.rollingUpdate.maxUnavailable"
                errs = _validate_int_or_percent(mu, path)
                out += errs
                if not errs and _int_or_percent_is_zero(mu):
                    out.append(invalid_value(path, mu, "cannot be 0"))
    else:
        out.append(invalid_value("spec.updateStrategy", strategy, "must be 'RollingUpdate' or 'OnDelete'"))
    policy = spec.get("persistentVolumeClaimRetentionPolicy")
    if policy is not None:
        policy = _d(policy)
        for key in ("whenDeleted", "whenScaled"):
            if policy.get(key) not in ("Retain", "Delete"):
                out.append(not_supported(f"spec.persistentVolumeClaimRetentionPolicy.{key}", policy.get(key) or "",
                                         ("Retain", "Delete")))
    if not update:
        claims = spec.get("volumeClaimTemplates")
        if claims is not None and not isinstance(claims, list):
            out.append(invalid_value("spec.volumeClaimTemplates", claims, "must be a list"))
        for i, claim in enumerate(_l(claims)):
            out += validate_pvc_spec(_d(_d(claim).get("spec")), f"spec.volumeClaimTemplates[{i}].spec")
    out += _nonnegative(spec, "replicas", "spec")
    out += _nonnegative(spec, "minReadySeconds", "spec")
    rhl = spec.get("revisionHistoryLimit")
    if rhl is not None and not _is_int(rhl):
        out.append(invalid_value("spec.revisionHistoryLimit", rhl, "must be an integer"))
    ordinals = spec.get("ordinals")
    if ordinals is not None and not isinstance(ordinals, dict):
        out.append(invalid_value("spec.ordinals", ordinals, "must be an object"))
    elif ordinals is not None:
        start = ordinals.get("start", 0)
        if not _is_int(start) or start < 0:
            out.append(invalid_value("spec.ordinals.start", start, "must be greater than or equal to 0"))
    service = spec.get("serviceName")
    if not update and service:
        if not isinstance(service, str):
            out.append(invalid_value("spec.serviceName", service, "must be a string"))
        else:
            out += [invalid_value("spec.serviceName", service, m) for m in is_dns1123_label(service)]
    sel = spec.get("selector")
    selector = None
    if sel is None:
        out.append(required("spec.selector"))
    else:
        out += validate_label_selector(sel, "spec.selector")
        sel_d = _d(sel)
        if not sel_d.get("matchLabels") and not sel_d.get("matchExpressions"):
            out.append(invalid_value("spec.selector", sel, "empty selector is invalid for statefulset"))
        try:
            selector = label_selector_from_dict(sel_d)
        except errors.StatusError:
            out.append(invalid_value("spec.selector", sel, ""))
    template = spec.get("template")
    if template is None:
        out.append(required("spec.template"))
        return out
    if selector is not None or sel is None:
        labels = _d(_d(_d(template).get("metadata")).get("labels"))
        if selector is not None and not selector.empty and not selector.matches(labels):
            out.append(invalid_value("spec.template.metadata.labels", labels,
                                     "`selector` does not match template `labels`"))
        if not skip_template:
            out += validate_pod_template(_template_for_statefulset(spec), "spec.template")
    tspec = _d(_d(template).get("spec"))
    if tspec.get("restartPolicy", "Always") != "Always":
        out.append(not_supported("spec.template.spec.restartPolicy", tspec["restartPolicy"], ("Always",)))
    if tspec.get("activeDeadlineSeconds") is not None:
        out.append(forbidden_field("spec.template.spec.activeDeadlineSeconds",
                                   "activeDeadlineSeconds in StatefulSet is not Supported"))
    return out


def _validate_statefulset(obj: dict[str, Any]) -> list[Cause]:
    """Create (and the spec rules of every write: an update adds
    :func:`_validate_statefulset_update`, which the registry calls after this)."""
    return _validate_statefulset_spec(_d(obj.get("spec")))


def _validate_statefulset_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    """Only replicas, ordinals, template, updateStrategy, revisionHistoryLimit,
    persistentVolumeClaimRetentionPolicy and minReadySeconds may change."""
    spec, old_spec = _d(new.get("spec")), _d(old.get("spec"))
    rest = {k: v for k, v in spec.items() if k not in _STS_MUTABLE}
    old_rest = {k: v for k, v in old_spec.items() if k not in _STS_MUTABLE}
    if _immutable(rest, old_rest, "spec"):
        return [forbidden_field("spec", "updates to statefulset spec for fields other than 'replicas', 'ordinals', "
                                "'template', 'updateStrategy', 'revisionHistoryLimit', "
                                "'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden")]
    return []


def _validate_statefulset_status(obj: dict[str, Any]) -> list[Cause]:
    status = _d(obj.get("status"))
    out: list[Cause] = []
    for key in ("replicas", "readyReplicas", "currentReplicas", "updatedReplicas", "availableReplicas",
                "observedGeneration", "collisionCount"):
        out += _nonnegative(status, key, "status")
    if out:
        return out

    def n(key: str) -> int:
        return status.get(key) or 0

    msg = "cannot be greater than status.replicas"
    for key in ("readyReplicas", "currentReplicas", "updatedReplicas", "availableReplicas"):
        if n(key) > n("replicas"):
            out.append(invalid_value(f"status.{key}", n(key), msg))
    if n("availableReplicas") > n("readyReplicas"):
        out.append(invalid_value("status.availableReplicas", n("availableReplicas"),
                                 "cannot be greater than status.readyReplicas"))
    return out
