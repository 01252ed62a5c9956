"""Validation of batch/v1 Jobs.
"""

from __future__ import annotations

import json
import re
from typing import Any

from kubeplane.api.errors import (
    Cause,
    StatusError,
    duplicate,
    invalid_value,
    not_supported,
    required,
    too_long,
    too_many,
)
from kubeplane.api.selectors import label_selector_from_dict
from kubeplane.api.strings import is_dns1123_label, is_dns1123_subdomain, is_qualified_name
from kubeplane.api.validation.common import _d, _immutable, _is_int, _l, _nonnegative, same_json
from kubeplane.api.validation.core import validate_pod_template
from kubeplane.api.validation.meta import validate_label_selector


_MAX_PARALLELISM_INDEXED = 100_000
_MAX_FAILED_INDEXES = 100_000
_COMPLETIONS_SOFT_LIMIT = 100_000
_PARALLELISM_LIMIT_HIGH_COMPLETIONS = 10_000
_MAX_FAILED_INDEXES_HIGH_COMPLETIONS = 10_000
_MAX_POD_FAILURE_POLICY_RULES = 20
_MAX_EXIT_CODE_VALUES = 255
_MAX_POD_CONDITION_PATTERNS = 20
_MAX_MANAGED_BY_LENGTH = 63
_MAX_SUCCEEDED_INDEXES_LENGTH = 64 * 1024
_MAX_SUCCESS_POLICY_RULES = 20
_ACTIONS = ("Count", "FailIndex", "FailJob", "Ignore")
_EXIT_CODE_OPERATORS = ("In", "NotIn")
_CONDITION_STATUSES = ("False", "True", "Unknown")
_REPLACEMENT_POLICIES = ("Failed", "TerminatingOrFailed")
_LEGACY_LABELS = (("controller-uid", "uid"), ("job-name", "name"))
_BATCH_LABELS = (("batch.kubernetes.io/controller-uid", "uid"), ("batch.kubernetes.io/job-name", "name"))


def _go_quoted(values: tuple[str, ...]) -> str:
    """Go's %q of a string slice: ``["a" "b"]``."""
    return "[" + " ".join(f'"{v}"' for v in values) + "]"


def _validate_generated_selector(obj: dict[str, Any]) -> list[Cause]:
    """Without manualSelector the selector and the template's labels are the
    ones the API server generated from the Job's name and uid."""
    spec = _d(obj.get("spec"))
    if spec.get("manualSelector") is True or not isinstance(spec.get("selector"), dict):
        return []
    md = _d(obj.get("metadata"))
    out: list[Cause] = []
    if not md.get("uid"):
        out.append(required("metadata.uid"))
    labels = _d(_d(_d(spec.get("template")).get("metadata")).get("labels"))
    expected: dict[str, str] = {}
    for key, attr in _LEGACY_LABELS + _BATCH_LABELS:
        want = str(md.get(attr) or "")
        expected[key] = want
        path = f"spec.template.metadata.labels[{key}]"
        if key not in labels:
            out.append(required(path))
        elif labels[key] != want:
            out.append(invalid_value(path, labels[key], f"must be '{want}'"))
    selector = spec["selector"]
    try:
        matches = label_selector_from_dict(selector).matches(expected)
    except StatusError:
        matches = True  # a malformed selector is reported by its own checks
    if not matches:
        out.append(invalid_value("spec.selector", selector, "`selector` not auto-generated"))
    return out


def _indexes_total(text: str, completions: int) -> tuple[int, str | None]:
    """Upstream's validateIndexesFormat: the number of indexes, or the error."""
    if not text:
        return 0, None
    last: int | None = None
    total = 0
    for part in text.split(","):
        limits = part.split("-")
        if len(limits) > 2:
            return 0, (f"the fragment {json.dumps(part)} violates the requirement that an index interval can have "
                       "at most two parts separated by '-'")
        bounds = []
        for raw in limits:
            try:
                v = int(raw)
            except ValueError:
                return 0, f"cannot convert string to integer for index: {json.dumps(raw)}"
            if v >= completions:
                return 0, f"too large index: {json.dumps(raw)}"
            bounds.append(v)
        x, y = bounds[0], bounds[-1]
        if len(bounds) == 2 and x >= y:
            return 0, f"non-increasing order, previous: {x}, current: {y}"
        if last is not None and last >= x:
            return 0, f"non-increasing order, previous: {last}, current: {x}"
        total += y - x + 1
        last = y
    return total, None


def _validate_pod_failure_policy(spec: dict[str, Any], path: str) -> list[Cause]:
    policy = _d(spec.get("podFailurePolicy"))
    rules = policy.get("rules")
    out: list[Cause] = []
    if not isinstance(rules, list):
        return [required(f"{path}.rules")] if rules is None else [invalid_value(f"{path}.rules", rules, "must be a list")]
    if len(rules) > _MAX_POD_FAILURE_POLICY_RULES:
        out.append(too_many(f"{path}.rules", len(rules), _MAX_POD_FAILURE_POLICY_RULES))
    pod_spec = _d(_d(spec.get("template")).get("spec"))
    names = {_d(c).get("name") for c in (_l(pod_spec.get("containers")) + _l(pod_spec.get("initContainers")))}
    for i, rule in enumerate(rules):
        rp = f"{path}.rules[{i}]"
        rule = _d(rule)
        action = rule.get("action")
        if not action:
            out.append(required(f"{rp}.action", f"valid values: {_go_quoted(_ACTIONS)}"))
        elif action == "FailIndex":
            if spec.get("backoffLimitPerIndex") is None:
                out.append(invalid_value(f"{rp}.action", action, "requires the backoffLimitPerIndex to be set"))
        elif action not in _ACTIONS:
            out.append(not_supported(f"{rp}.action", action, _ACTIONS))
        on_codes = rule.get("onExitCodes")
        on_conds = _l(rule.get("onPodConditions"))
        if on_codes is not None:
            out += _validate_on_exit_codes(_d(on_codes), f"{rp}.onExitCodes", names)
        if on_conds:
            if len(on_conds) > _MAX_POD_CONDITION_PATTERNS:
                out.append(too_many(f"{rp}.onPodConditions", len(on_conds), _MAX_POD_CONDITION_PATTERNS))
            for j, pattern in enumerate(on_conds):
                pp = f"{rp}.onPodConditions[{j}]"
                pattern = _d(pattern)
                for msg in is_qualified_name(str(pattern.get("type") or "")):
                    out.append(invalid_value(f"{pp}.type", pattern.get("type") or "", msg))
                status = pattern.get("status")
                if not status:
                    out.append(required(f"{pp}.status", f"valid values: {_go_quoted(_CONDITION_STATUSES)}"))
                elif status not in _CONDITION_STATUSES:
                    out.append(not_supported(f"{pp}.status", status, _CONDITION_STATUSES))
        if on_codes is not None and on_conds:
            out.append(Cause("FieldValueInvalid", "Invalid value: \"object\": specifying both OnExitCodes and "
                             "OnPodConditions is not supported", rp))
        if on_codes is None and not on_conds:
            out.append(Cause("FieldValueInvalid", "Invalid value: \"object\": specifying one of OnExitCodes and "
                             "OnPodConditions is required", rp))
    return out


def _validate_on_exit_codes(req: dict[str, Any], path: str, names: set[Any]) -> list[Cause]:
    out: list[Cause] = []
    op = req.get("operator")
    if not op:
        out.append(required(f"{path}.operator", f"valid values: {_go_quoted(_EXIT_CODE_OPERATORS)}"))
    elif op not in _EXIT_CODE_OPERATORS:
        out.append(not_supported(f"{path}.operator", op, _EXIT_CODE_OPERATORS))
    name = req.get("containerName")
    if name is not None and name not in names:
        out.append(invalid_value(f"{path}.containerName", name,
                                 "must be one of the container or initContainer names in the pod template"))
    values = req.get("values")
    vp = f"{path}.values"
    if not isinstance(values, list) or not values:
        out.append(invalid_value(vp, values if values is not None else [], "at least one value is required"))
        return out
    if len(values) > _MAX_EXIT_CODE_VALUES:
        out.append(too_many(vp, len(values), _MAX_EXIT_CODE_VALUES))
    seen: set[int] = set()
    ordered = True
    for j, v in enumerate(values):
        if not _is_int(v):
            out.append(invalid_value(f"{vp}[{j}]", v, "must be an integer"))
            continue
        if op == "In" and v == 0:
            out.append(invalid_value(f"{vp}[{j}]", v, "must not be 0 for the In operator"))
        if v in seen:
            out.append(duplicate(f"{vp}[{j}]", v))
        seen.add(v)
        if j > 0 and _is_int(values[j - 1]) and values[j - 1] > v:
            ordered = False
    if not ordered:
        out.append(invalid_value(vp, values, "must be ordered"))
    return out


def _validate_success_policy(spec: dict[str, Any], path: str) -> list[Cause]:
    rules = _l(_d(spec.get("successPolicy")).get("rules"))
    out: list[Cause] = []
    if not rules:
        out.append(required(f"{path}.rules", "at least one rules must be specified when the successPolicy is specified"))
    if len(rules) > _MAX_SUCCESS_POLICY_RULES:
        out.append(too_many(f"{path}.rules", len(rules), _MAX_SUCCESS_POLICY_RULES))
    completions = spec.get("completions") if _is_int(spec.get("completions")) else 0
    for i, rule in enumerate(rules):
        rp = f"{path}.rules[{i}]"
        rule = _d(rule)
        indexes, count = rule.get("succeededIndexes"), rule.get("succeededCount")
        if indexes is None and count is None:
            out.append(required(rp, "at least one of succeededCount or succeededIndexes must be specified"))
        total = 0
        if indexes is not None:
            ip = f"{rp}.succeededIndexes"
            if len(str(indexes)) > _MAX_SUCCEEDED_INDEXES_LENGTH:
                out.append(too_long(ip, indexes, _MAX_SUCCEEDED_INDEXES_LENGTH))
            total, err = _indexes_total(str(indexes), completions)
            if err is not None:
                out.append(invalid_value(ip, indexes, f"error parsing succeededIndexes: {err}"))
        if count is not None:
            cp = f"{rp}.succeededCount"
            if not _is_int(count) or count < 0:
                out.append(invalid_value(cp, count, "must be greater than or equal to 0"))
                continue
            if count > completions:
                out.append(invalid_value(cp, count, f"must be less than or equal to {completions} "
                                                    "(the number of specified completions)"))
            if indexes is not None and count > total:
                out.append(invalid_value(cp, count, f"must be less than or equal to {total} "
                                                    "(the number of indexes in the specified succeededIndexes field)"))
    return out


def validate_job_spec(spec: dict[str, Any], path: str = "spec") -> list[Cause]:
    """Upstream's ValidateJobSpec (also what a CronJob's jobTemplate must pass)."""
    out: list[Cause] = []
    for key in ("parallelism", "completions", "activeDeadlineSeconds", "backoffLimit", "ttlSecondsAfterFinished",
                "backoffLimitPerIndex", "maxFailedIndexes"):
        out += _nonnegative(spec, key, path)
    completions, parallelism = spec.get("completions"), spec.get("parallelism")
    per_index, max_failed = spec.get("backoffLimitPerIndex"), spec.get("maxFailedIndexes")
    if max_failed is not None and per_index is None:
        out.append(required(f"{path}.backoffLimitPerIndex", "when maxFailedIndexes is specified"))
    managed_by = spec.get("managedBy")
    if managed_by is not None:
        out += _validate_managed_by(managed_by, f"{path}.managedBy")
    mode = spec.get("completionMode")
    ints = all(v is None or _is_int(v) for v in (completions, parallelism, max_failed))
    if mode is not None:
        if mode not in ("NonIndexed", "Indexed"):
            out.append(not_supported(f"{path}.completionMode", mode, ("NonIndexed", "Indexed")))
        if mode == "Indexed" and ints:
            if completions is None:
                out.append(required(f"{path}.completions", "when completion mode is Indexed"))
            if parallelism is not None and parallelism > _MAX_PARALLELISM_INDEXED:
                out.append(invalid_value(f"{path}.parallelism", parallelism,
                                         f"must be less than or equal to {_MAX_PARALLELISM_INDEXED} "
                                         "when completion mode is Indexed"))
            if completions is not None and max_failed is not None and max_failed > completions:
                out.append(invalid_value(f"{path}.maxFailedIndexes", max_failed,
                                         "must be less than or equal to completions"))
            if max_failed is not None and max_failed > _MAX_FAILED_INDEXES:
                out.append(invalid_value(f"{path}.maxFailedIndexes", max_failed,
                                         f"must be less than or equal to {_MAX_FAILED_INDEXES}"))
            if completions is not None and completions > _COMPLETIONS_SOFT_LIMIT and per_index is not None:
                tail = (f"when completions are above {_COMPLETIONS_SOFT_LIMIT} and used with backoff limit per "
                        "index")
                if max_failed is None:
                    out.append(required(f"{path}.maxFailedIndexes",
                                        f"must be specified when completions is above {_COMPLETIONS_SOFT_LIMIT}"))
                if parallelism is not None and parallelism > _PARALLELISM_LIMIT_HIGH_COMPLETIONS:
                    out.append(invalid_value(f"{path}.parallelism", parallelism, "must be less than or equal to "
                                             f"{_PARALLELISM_LIMIT_HIGH_COMPLETIONS} {tail}"))
                if max_failed is not None and max_failed > _MAX_FAILED_INDEXES_HIGH_COMPLETIONS:
                    out.append(invalid_value(f"{path}.maxFailedIndexes", max_failed, "must be less than or equal "
                                             f"to {_MAX_FAILED_INDEXES_HIGH_COMPLETIONS} {tail}"))
    if mode in (None, "NonIndexed"):
        if per_index is not None:
            out.append(invalid_value(f"{path}.backoffLimitPerIndex", per_index, "requires indexed completion mode"))
        if max_failed is not None:
            out.append(invalid_value(f"{path}.maxFailedIndexes", max_failed, "requires indexed completion mode"))
    if spec.get("podFailurePolicy") is not None:
        out += _validate_pod_failure_policy(spec, f"{path}.podFailurePolicy")
    if spec.get("successPolicy") is not None:
        if mode != "Indexed":
            out.append(invalid_value(f"{path}.successPolicy", spec["successPolicy"],
                                     "requires indexed completion mode"))
        else:
            out += _validate_success_policy(spec, f"{path}.successPolicy")
    replacement = spec.get("podReplacementPolicy")
    if replacement is not None:
        if spec.get("podFailurePolicy") is not None:
            if replacement != "Failed":
                out.append(not_supported(f"{path}.podReplacementPolicy", replacement, ("Failed",)))
        elif replacement not in _REPLACEMENT_POLICIES:
            out.append(not_supported(f"{path}.podReplacementPolicy", replacement, _REPLACEMENT_POLICIES))
    if spec.get("selector") is not None:
        out += validate_label_selector(spec["selector"], f"{path}.selector")
    template = spec.get("template")
    if template is None:
        out.append(required(f"{path}.template"))
        return out
    out += validate_pod_template(template, f"{path}.template")
    rp = _d(_d(template).get("spec")).get("restartPolicy")
    rp_path = f"{path}.template.spec.restartPolicy"
    if rp in ("Always", "", None):
        out.append(required(rp_path, 'valid values: "OnFailure", "Never"'))
    elif rp not in ("OnFailure", "Never"):
        out.append(not_supported(rp_path, rp, ("OnFailure", "Never")))
    elif spec.get("podFailurePolicy") is not None and rp != "Never":
        out.append(invalid_value(rp_path, rp, 'only "Never" is supported when podFailurePolicy is specified'))
    return out


def _validate_managed_by(value: Any, path: str) -> list[Cause]:
    """A domain-prefixed path (``example.com/name``) of at most 63 characters."""
    if not isinstance(value, str):
        return [invalid_value(path, value, "must be a string")]
    out: list[Cause] = []
    domain, sep, rest = value.partition("/")
    if not sep or not domain or not rest:
        out.append(invalid_value(path, value, "must be a domain-prefixed path (such as \"acme.io/foo\")"))
    else:
        for msg in is_dns1123_subdomain(domain):
            out.append(invalid_value(path, domain, msg))
        if not re.fullmatch(r"[A-Za-z0-9/\-._~%!$&'()*+,;=:]+", rest):
            out.append(invalid_value(path, rest, "Invalid path"))
    if len(value) > _MAX_MANAGED_BY_LENGTH:
        out.append(too_long(path, value, _MAX_MANAGED_BY_LENGTH))
    return out


def _validate_job(obj: dict[str, Any]) -> list[Cause]:
    spec = _d(obj.get("spec"))
    out = _validate_generated_selector(obj)
    out += validate_job_spec(spec)
    completions = spec.get("completions")
    if spec.get("completionMode") == "Indexed" and _is_int(completions) and completions > 0:
        name = str(_d(obj.get("metadata")).get("name") or "")
        hostname = f"{name}-{completions - 1}"
        if is_dns1123_label(hostname):
            out.append(invalid_value("metadata.name", name,
                                     f"will not able to create pod with invalid DNS label: {hostname}"))
    return out


#: what a suspended Job that never started may change in its pod template
_SCHEDULING_DIRECTIVES = ("nodeSelector", "tolerations", "schedulingGates")


def _validate_job_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    ns, os_ = _d(new.get("spec")), _d(old.get("spec"))
    out = _immutable(ns.get("selector"), os_.get("selector"), "spec.selector")
    out += _validate_template_update(ns, os_, _d(old.get("status")))
    if ns.get("completionMode") == "Indexed":
        if ns.get("completions") is not None and not same_json(ns.get("completions"), os_.get("completions")) \
                and ns.get("completions") != ns.get("parallelism"):
            out.append(invalid_value("spec.completions", ns.get("completions"),
                                     "can only be modified in tandem with spec.parallelism"))
    else:
        out += _immutable(ns.get("completions"), os_.get("completions"), "spec.completions")
    for key in ("completionMode", "podFailurePolicy", "backoffLimitPerIndex", "managedBy", "successPolicy"):
        out += _immutable(ns.get(key), os_.get(key), f"spec.{key}")
    return out


def _validate_template_update(ns: dict[str, Any], os_: dict[str, Any], old_status: dict[str, Any]) -> list[Cause]:
    """The template is immutable, except that a suspended Job that never
    started may change its scheduling directives (node selector and affinity,
    tolerations, scheduling gates) and the template's labels and annotations."""
    new_t, old_t = _d(ns.get("template")), _d(os_.get("template"))
    if os_.get("suspend") is True and not old_status.get("startTime"):
        old_t = json.loads(json.dumps(old_t))
        new_spec, old_spec = _d(new_t.get("spec")), old_t.setdefault("spec", {})
        for key in _SCHEDULING_DIRECTIVES:
            if key in new_spec:
                old_spec[key] = new_spec[key]
            else:
                old_spec.pop(key, None)
        new_affinity = _d(new_spec.get("affinity"))
        old_affinity = _d(old_spec.get("affinity"))
        if "nodeAffinity" in new_affinity:
            old_affinity["nodeAffinity"] = new_affinity["nodeAffinity"]
        else:
            old_affinity.pop("nodeAffinity", None)
        if old_affinity:
            old_spec["affinity"] = old_affinity
        else:
            old_spec.pop("affinity", None)
        new_md, old_md = _d(new_t.get("metadata")), old_t.setdefault("metadata", {})
        for key in ("labels", "annotations"):
            if key in new_md:
                old_md[key] = new_md[key]
            else:
                old_md.pop(key, None)
    return _immutable(new_t, old_t, "spec.template")


# ---------------------------------------------------------------- CronJobs

#: one component of an IANA time zone name (upstream tolerates digits and +)
_TIME_ZONE_PART = re.compile(r"[A-Za-z.\-_0-9+]{1,14}")
#: the controller names a CronJob's Jobs ``<name>-<minutes since the epoch>``
#: (11 characters): the name leaves room for them in a 63-character label
CRONJOB_NAME_MAX = 63 - 11


def _validate_schedule(schedule: str, allow_tz: bool, time_zone: Any, path: str) -> list[Cause]:
    from kubeplane.api.cron import CronError, parse_schedule  # with the first CronJob

    out: list[Cause] = []
    try:
        parse_schedule(schedule)
    except CronError as err:
        out.append(invalid_value(path, schedule, str(err)))
    if allow_tz and "TZ" in schedule and time_zone is not None:
        out.append(invalid_value(path, schedule, "cannot use both timeZone field and TZ or CRON_TZ in schedule"))
    elif not allow_tz and "TZ" in schedule:
        out.append(invalid_value(path, schedule, "cannot use TZ or CRON_TZ in schedule, use timeZone field instead"))
    return out


def _validate_time_zone(tz: Any, path: str) -> list[Cause]:
    if tz is None:
        return []
    if not isinstance(tz, str) or not tz:
        return [invalid_value(path, tz, "timeZone must be nil or non-empty string")]
    for part in tz.split("/"):
        if part in (".", "..") or part.startswith("-") or not _TIME_ZONE_PART.fullmatch(part):
            return [invalid_value(path, tz, f"unknown time zone {tz}")]
    out: list[Cause] = []
    if tz.lower() == "local":
        out.append(invalid_value(path, tz, "timeZone must be an explicit time zone as defined in "
                                           "https://www.iana.org/time-zones"))
    from kubeplane.api.cron import UnknownTimeZone, load_location

    try:
        load_location(tz)
    except UnknownTimeZone as err:
        out.append(invalid_value(path, tz, str(err)))
    return out


def validate_job_template_spec(template: Any, path: str) -> list[Cause]:
    """Upstream's ValidateJobTemplateSpec: the selector is always generated."""
    spec = _d(_d(template).get("spec"))
    out = validate_job_spec(spec, f"{path}.spec")
    if spec.get("selector") is not None:
        out.append(invalid_value(f"{path}.spec.selector", spec["selector"], "`selector` will be auto-generated"))
    if spec.get("manualSelector") is True:
        out.append(not_supported(f"{path}.spec.manualSelector", True, ("nil", "false")))
    return out


def _validate_cronjob_spec(spec: dict[str, Any], old_spec: dict[str, Any] | None) -> list[Cause]:
    out: list[Cause] = []
    schedule = spec.get("schedule")
    if not schedule:
        out.append(required("spec.schedule"))
    elif not isinstance(schedule, str):
        out.append(invalid_value("spec.schedule", schedule, "must be a string"))
    else:
        old_schedule = (old_spec or {}).get("schedule")
        allow_tz = isinstance(old_schedule, str) and "TZ" in old_schedule
        out += _validate_schedule(schedule, allow_tz, spec.get("timeZone"), "spec.schedule")
    out += _nonnegative(spec, "startingDeadlineSeconds", "spec")
    if old_spec is None or old_spec.get("timeZone") != spec.get("timeZone"):
        out += _validate_time_zone(spec.get("timeZone"), "spec.timeZone")
    policy = spec.get("concurrencyPolicy")
    if not policy:
        out.append(required("spec.concurrencyPolicy"))
    elif policy not in ("Allow", "Forbid", "Replace"):
        out.append(not_supported("spec.concurrencyPolicy", policy, ("Allow", "Forbid", "Replace")))
    out += validate_job_template_spec(spec.get("jobTemplate"), "spec.jobTemplate")
    out += _nonnegative(spec, "successfulJobsHistoryLimit", "spec")
    out += _nonnegative(spec, "failedJobsHistoryLimit", "spec")
    return out


def validate_cronjob(res: Any, obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """Upstream's ValidateCronJobCreate (``old`` None) and ValidateCronJobUpdate:
    a schedule with ``TZ=`` stays allowed on an object that already had one,
    the time zone is checked when it changes, and the name's length only on
    create (older CronJobs with longer names must stay updatable)."""
    if old is None:
        out = _validate_cronjob_spec(_d(obj.get("spec")), None)
        name = _d(obj.get("metadata")).get("name")
        if isinstance(name, str) and len(name) > CRONJOB_NAME_MAX:
            out.append(invalid_value("metadata.name", name, f"must be no more than {CRONJOB_NAME_MAX} characters"))
        return out
    return _validate_cronjob_spec(_d(obj.get("spec")), _d(old.get("spec")))
