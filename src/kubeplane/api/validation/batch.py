"""Validation of batch/v1 Jobs and CronJobs.
"""

from __future__ import annotations

import re
from typing import Any

from kubeplane.api.cron import CronError, UnknownTimeZone, load_location, parse_schedule
from kubeplane.api.errors import Cause, invalid_value, not_supported, required
from kubeplane.api.validation.common import _d, _immutable, _is_int, _nonnegative
from kubeplane.api.validation.core import validate_pod_template
from kubeplane.api.validation.meta import validate_label_selector


def _validate_job(obj: dict[str, Any]) -> list[Cause]:
    spec = _d(obj.get("spec"))
    out = validate_job_spec(spec, "spec")
    if spec.get("selector") is not None:
        out += validate_label_selector(spec["selector"], "spec.selector")
    return out


def validate_job_spec(spec: dict[str, Any], path: str) -> list[Cause]:
    """Upstream's validateJobSpec: a Job's spec or a CronJob's job template
    (whose selector is generated later, so it is not checked here)."""
    out: list[Cause] = []
    for key in ("parallelism", "completions", "backoffLimit"):
        out += _nonnegative(spec, key, path)
    ads = spec.get("activeDeadlineSeconds")
    if ads is not None and (not _is_int(ads) or ads <= 0):
        out.append(invalid_value(f"{path}.activeDeadlineSeconds", ads, "must be greater than 0"))
    template = spec.get("template")
    if template is None:
        out.append(required(f"{path}.template"))
        return out
    out += validate_pod_template(template, f"{path}.template")
    rp = _d(_d(template).get("spec")).get("restartPolicy")
    if rp not in ("OnFailure", "Never"):
        out.append(not_supported(f"{path}.template.spec.restartPolicy", rp or "", ("OnFailure", "Never")))
    return out


def _validate_job_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    ns, os_ = _d(new.get("spec")), _d(old.get("spec"))
    out = _immutable(ns.get("selector"), os_.get("selector"), "spec.selector")
    out += _immutable(ns.get("template"), os_.get("template"), "spec.template")
    out += _immutable(ns.get("completions"), os_.get("completions"), "spec.completions")
    return out


# ---------------------------------------------------------------- CronJobs

#: one component of an IANA time zone name (upstream tolerates digits and +)
_TIME_ZONE_PART = re.compile(r"[A-Za-z.\-_0-9+]{1,14}")
#: the controller names a CronJob's Jobs ``<name>-<minutes since the epoch>``
#: (11 characters): the name leaves room for them in a 63-character label
CRONJOB_NAME_MAX = 63 - 11


def _validate_schedule(schedule: str, allow_tz: bool, time_zone: Any, path: str) -> list[Cause]:
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
