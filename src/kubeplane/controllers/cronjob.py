"""The CronJob controller, after upstream's ``pkg/controller/cronjob`` (v2).

One queue of CronJob keys. A sync:

* reconciles ``status.active`` with the Jobs the CronJob controls (finished
  ones leave it with a ``SawCompletedJob`` event, vanished ones with
  ``MissingJob``), and keeps ``status.lastSuccessfulTime``;
* deletes the oldest finished Jobs beyond ``successfulJobsHistoryLimit`` /
  ``failedJobsHistoryLimit``;
* unless suspended, finds the most recent unmet schedule time since the last
  one (or the CronJob's creation), honouring ``startingDeadlineSeconds``, and
  starts a Job named ``<cronjob>-<minutes since the epoch>`` for it — or does
  not, as ``concurrencyPolicy`` says (``Forbid`` skips while one is active,
  ``Replace`` deletes the active ones first);
* requeues itself for the next schedule time.

Time comes from the injected ``clock`` (an aware ``datetime``): schedules
without ``timeZone`` run in the zone of the clock's times, as upstream's run in
the controller manager's local zone. Requeues wait on the event loop; a test
that moves the clock enqueues the CronJob itself (:meth:`CronJobController.enqueue`).
"""

from __future__ import annotations

import datetime as _dt
import enum
import logging
from typing import Any, Callable

from kubeplane.api.cron import CronError, Schedule, UnknownTimeZone, load_location, local_zone, parse_schedule
from kubeplane.api.errors import StatusError
from kubeplane.api.gofmt import go_quote
from kubeplane.api.meta import deep_copy, format_time, parse_time
from kubeplane.api.resources import resource
from kubeplane.client.informer import SharedInformerFactory, unwrap_deleted
from kubeplane.client.interface import Client, Obj
from kubeplane.controllers.base import Controller
from kubeplane.controllers.replicaset import (
    NAMESPACE_INDEX,
    add_indexers,
    controller_ref,
    key_of,
    md_of,
    name_of,
    namespace_index,
    new_controller_ref,
    ns_of,
    uid_of,
)

log = logging.getLogger(__name__)

CRONJOBS = resource("cronjobs", "batch")
JOBS = resource("jobs", "batch")

#: upstream's CronJobScheduledTimestampAnnotation
SCHEDULED_TIMESTAMP_ANNOTATION = "batch.kubernetes.io/cronjob-scheduled-timestamp"
#: padding after a schedule time before the requeue, against clock skew (upstream's nextScheduleDelta)
NEXT_SCHEDULE_DELTA = 0.1
#: more missed start times than this and the controller warns (TooManyMissedTimes)
MANY_MISSED = 100


class Missed(enum.Enum):
    NONE = "none"
    FEW = "few"
    MANY = "many"


class InvalidSchedule(ValueError):
    """A schedule that parses but never yields two distinct times."""


# --------------------------------------------------------------- job helpers


def _conditions(job: Obj) -> list[Obj]:
    return [c for c in (job.get("status") or {}).get("conditions") or [] if isinstance(c, dict)]


def finished_condition(job: Obj) -> str | None:
    """``Complete`` or ``Failed`` when the Job has finished (upstream FinishedCondition)."""
    for c in _conditions(job):
        if c.get("type") in ("Complete", "Failed") and c.get("status") == "True":
            return c["type"]
    return None


def _time(value: Any, tz: _dt.tzinfo) -> _dt.datetime | None:
    if not value or not isinstance(value, str):
        return None
    try:
        return parse_time(value).astimezone(tz)
    except ValueError:
        return None


def rfc3339(t: _dt.datetime) -> str:
    """Go's ``time.RFC3339`` in the time's own zone (``Z`` for UTC)."""
    off = t.utcoffset() or _dt.timedelta(0)
    text = t.replace(microsecond=0, tzinfo=None).isoformat()
    if off == _dt.timedelta(0):
        return text + "Z"
    total = int(off.total_seconds())
    sign = "+" if total >= 0 else "-"
    total = abs(total)
    return f"{text}{sign}{total // 3600:02d}:{total % 3600 // 60:02d}"


def rfc1123z(t: _dt.datetime) -> str:
    """Go's ``time.RFC1123Z`` of the time in UTC."""
    return t.astimezone(_dt.timezone.utc).strftime("%a, %d %b %Y %H:%M:%S +0000")


def job_name(cj: Obj, scheduled: _dt.datetime) -> str:
    """``<cronjob>-<minutes since the epoch>``: one name per schedule time, so a
    Job is never created twice for it."""
    return f"{name_of(cj)}-{int(scheduled.timestamp()) // 60}"


def job_from_template(cj: Obj, scheduled: _dt.datetime) -> Obj:
    """The Job for one schedule time (upstream getJobFromTemplate2)."""
    spec = cj.get("spec") or {}
    template = spec.get("jobTemplate") or {}
    tmd = template.get("metadata") or {}
    zone = load_location(spec.get("timeZone") or "")
    annotations = dict(tmd.get("annotations") or {})
    annotations[SCHEDULED_TIMESTAMP_ANNOTATION] = rfc3339(scheduled.astimezone(zone))
    md: Obj = {
        "name": job_name(cj, scheduled),
        "namespace": ns_of(cj),
        "annotations": annotations,
        "ownerReferences": [new_controller_ref(cj, "batch/v1", "CronJob")],
    }
    if tmd.get("labels"):
        md["labels"] = dict(tmd["labels"])
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": md, "spec": deep_copy(template.get("spec") or {})}


def job_reference(job: Obj) -> Obj:
    """The ObjectReference of a Job, as ``status.active`` lists it."""
    md = md_of(job)
    return {"kind": "Job", "namespace": md.get("namespace", ""), "name": md.get("name", ""),
            "uid": md.get("uid", ""), "apiVersion": "batch/v1", "resourceVersion": md.get("resourceVersion", "")}


def _start_key(job: Obj) -> tuple[int, str, str]:
    """Oldest start first, Jobs without a start last, then by name (upstream byJobStartTime)."""
    start = (job.get("status") or {}).get("startTime")
    t = _time(start, _dt.timezone.utc)
    return (1, "", name_of(job)) if t is None else (0, format_time(t), name_of(job))


# ------------------------------------------------------------ schedule times


def format_schedule(cj: Obj) -> str:
    """The schedule with the CronJob's time zone as a ``TZ=`` prefix, when it has a
    valid one and the schedule names none itself."""
    spec = cj.get("spec") or {}
    schedule = spec.get("schedule") or ""
    if "TZ" in schedule:
        return schedule
    tz = spec.get("timeZone")
    if tz is not None:
        try:
            load_location(tz)
        except UnknownTimeZone:
            return schedule
        return f"TZ={tz} {schedule}"
    return schedule


def most_recent_schedule_time(cj: Obj, now: _dt.datetime, sched: Schedule, include_deadline: bool
                              ) -> tuple[_dt.datetime, _dt.datetime | None, Missed]:
    """The earliest time considered (last schedule time or creation), the most
    recent schedule time not after ``now`` (None if none is due) and how many
    were missed (upstream mostRecentScheduleTime); :class:`InvalidSchedule`
    for a schedule that never fires twice."""
    tz = now.tzinfo or _dt.timezone.utc
    spec = cj.get("spec") or {}
    status = cj.get("status") or {}
    earliest = _time(md_of(cj).get("creationTimestamp"), tz) or now
    last = _time(status.get("lastScheduleTime"), tz)
    if last is not None:
        earliest = last
    deadline_s = spec.get("startingDeadlineSeconds")
    if include_deadline and isinstance(deadline_s, int) and not isinstance(deadline_s, bool):
        deadline = now - _dt.timedelta(seconds=deadline_s)
        if deadline > earliest:
            earliest = deadline
    t1 = sched.next(earliest)
    t2 = sched.next(t1) if t1 is not None else None
    if t1 is not None and now < t1:
        return earliest, None, Missed.NONE
    if t1 is not None and t2 is not None and now < t2:
        return earliest, t1, Missed.NONE
    between = 0 if t1 is None or t2 is None else _go_round((t2 - t1).total_seconds())
    if between < 1:
        raise InvalidSchedule("time difference between two schedules is less than 1 second")
    assert t1 is not None
    elapsed = int((now - t1).total_seconds())
    missed_count = elapsed // between + 1
    # Start one interval before the estimate, so schedules with irregular
    # gaps (e.g. "30 6-16/4 * * 1-5") are still found exactly.
    t = sched.next(t1 + _dt.timedelta(seconds=(missed_count - 2) * between))
    most_recent = None
    while t is not None and t <= now:
        most_recent = t
        t = sched.next(t)
    missed = Missed.MANY if missed_count > MANY_MISSED else Missed.FEW if missed_count > 0 else Missed.NONE
    return earliest, most_recent, missed


def _go_round(seconds: float) -> int:
    """``Duration.Round(time.Second)``: halves away from zero."""
    return int(seconds + 0.5) if seconds >= 0 else -int(-seconds + 0.5)


def next_schedule_delay(cj: Obj, now: _dt.datetime, sched: Schedule) -> float | None:
    """Seconds until the next schedule time plus a little padding (upstream
    nextScheduleTimeDuration); None for a schedule that never fires."""
    try:
        earliest, most_recent, missed = most_recent_schedule_time(cj, now, sched, False)
    except InvalidSchedule:
        most_recent = now
    else:
        if most_recent is None:
            most_recent = earliest if missed is Missed.NONE else now
    nxt = sched.next(most_recent)
    if nxt is None:
        return None
    return (nxt - now).total_seconds() + NEXT_SCHEDULE_DELTA


# ----------------------------------------------------------------- controller


class CronJobController(Controller):
    """Starts Jobs on the schedules of CronJobs."""

    def __init__(
        self,
        client: Client,
        factory: SharedInformerFactory | None = None,
        *,
        clock: Callable[[], _dt.datetime] | None = None,
        workers: int = 1,
        name: str = "cronjob-controller",
    ) -> None:
        super().__init__(name, client, factory, workers=workers)
        zone = local_zone()
        self.clock: Callable[[], _dt.datetime] = clock or (lambda: _dt.datetime.now(zone))
        self.cronjob_informer = self.factory.informer_for(CRONJOBS)
        self.job_informer = self.factory.informer_for(JOBS)
        add_indexers(self.job_informer, {NAMESPACE_INDEX: namespace_index})
        self.cronjobs = self.add_queue("cronjob", self.sync)
        #: key -> seconds the last sync asked to wait before the next one (None: no requeue)
        self.requeue_after: dict[str, float | None] = {}
        self.cronjob_informer.add_event_handler(self._cj_added, self._cj_updated, self._cj_deleted)
        self.job_informer.add_event_handler(self._job_added, self._job_updated, self._job_deleted)

    def enqueue(self, key: str) -> None:
        """Sync ``namespace/name`` now (e.g. after a test moved the clock)."""
        self.cronjobs.add(key)

    # ------------------------------------------------------------- handlers

    def _cj_added(self, cj: Obj) -> None:
        self.cronjobs.add(key_of(cj))

    def _cj_deleted(self, cj: Obj) -> None:
        self.cronjobs.add(key_of(unwrap_deleted(cj)))

    def _cj_updated(self, old: Obj, new: Obj) -> None:
        os_, ns_ = old.get("spec") or {}, new.get("spec") or {}
        if os_.get("schedule") != ns_.get("schedule") or os_.get("timeZone") != ns_.get("timeZone"):
            try:
                sched = parse_schedule(format_schedule(new))
            except CronError:
                self.recorder.event(new, "Warning", "UnParseableCronJobSchedule",
                                    f"unparseable schedule for cronjob: {ns_.get('schedule')}")
                return
            delay = next_schedule_delay(new, self.clock(), sched)
            if delay is not None:
                self.cronjobs.add_after(key_of(new), delay)
            return
        self.cronjobs.add(key_of(new))

    def _resolve(self, namespace: str, ref: Obj | None) -> Obj | None:
        if not ref or ref.get("kind") != "CronJob":
            return None
        cj = self.cronjob_informer.indexer.get_by_key(f"{namespace}/{ref.get('name', '')}")
        if cj is None or uid_of(cj) != ref.get("uid"):
            return None
        return cj

    def _job_added(self, job: Obj) -> None:
        cj = self._resolve(ns_of(job), controller_ref(job))
        if cj is not None:
            self.cronjobs.add(key_of(cj))

    def _job_updated(self, old: Obj, new: Obj) -> None:
        if md_of(old).get("resourceVersion") == md_of(new).get("resourceVersion"):
            return
        old_ref, new_ref = controller_ref(old), controller_ref(new)
        if old_ref != new_ref and old_ref is not None:
            cj = self._resolve(ns_of(old), old_ref)
            if cj is not None:
                self.cronjobs.add(key_of(cj))
        cj = self._resolve(ns_of(new), new_ref)
        if cj is not None:
            self.cronjobs.add(key_of(cj))

    def _job_deleted(self, job: Obj) -> None:
        job = unwrap_deleted(job)
        cj = self._resolve(ns_of(job), controller_ref(job))
        if cj is not None:
            self.cronjobs.add(key_of(cj))

    # ----------------------------------------------------------------- sync

    async def sync(self, key: str) -> None:
        cj = self.cronjob_informer.indexer.get_by_key(key)
        if cj is None:
            self.requeue_after.pop(key, None)
            return
        jobs = [j for j in self.job_informer.indexer.by_index(NAMESPACE_INDEX, ns_of(cj))
                if (controller_ref(j) or {}).get("name") == name_of(cj)]
        cj = deep_copy(cj)
        cj["status"] = dict(cj.get("status") or {})
        changed = await self._cleanup_finished_jobs(cj, jobs)
        sync_err: Exception | None = None
        requeue: float | None = None
        try:
            requeue, synced = await self._sync_cronjob(cj, jobs)
        except _SyncFailed as failed:
            synced, sync_err = failed.changed, failed.error
        changed = changed or synced
        if changed:
            status = cj["status"]
            if status.get("active") == []:
                status.pop("active")
            try:
                await self.client.update(CRONJOBS, cj, subresource="status")
            except StatusError as err:
                if err.code != 404:
                    raise
        self.requeue_after[key] = requeue
        if sync_err is not None:
            raise sync_err
        if requeue is not None:
            self.cronjobs.add_after(key, requeue)

    async def _sync_cronjob(self, cj: Obj, jobs: list[Obj]) -> tuple[float | None, bool]:
        """Upstream syncCronJob on ``cj`` (a copy, updated in place): the
        requeue delay and whether the status changed. Errors after a status
        change come as :class:`_SyncFailed` so that the change is still written."""
        now = self.clock()
        changed = False
        status = cj["status"]
        children: set[str] = set()
        for job in jobs:
            children.add(uid_of(job))
            found = _in_active(status, uid_of(job))
            finished = finished_condition(job)
            if not found and finished is None:
                try:
                    fresh = await self.client.get(CRONJOBS, name_of(cj), ns_of(cj))
                except StatusError as err:
                    raise _SyncFailed(changed, err) from None
                if _in_active(fresh.get("status") or {}, uid_of(job)):
                    # our informer is behind our own status write: go on with the fresh copy
                    cj.clear()
                    cj.update(fresh)
                    cj["status"] = status = dict(fresh.get("status") or {})
                    continue
                self.recorder.event(cj, "Warning", "UnexpectedJob",
                                    f"Saw a job that the controller did not create or forgot: {name_of(job)}")
            elif finished is not None:
                if found:
                    _remove_active(status, uid_of(job))
                    self.recorder.event(cj, "Normal", "SawCompletedJob",
                                        f"Saw completed job: {name_of(job)}, condition: {finished}")
                    changed = True
                if finished == "Complete":
                    completion = (job.get("status") or {}).get("completionTime")
                    last_ok = _time(status.get("lastSuccessfulTime"), _dt.timezone.utc)
                    done = _time(completion, _dt.timezone.utc)
                    if status.get("lastSuccessfulTime") is None and completion is not None:
                        status["lastSuccessfulTime"] = completion
                        changed = True
                    elif done is not None and last_ok is not None and done > last_ok:
                        status["lastSuccessfulTime"] = completion
                        changed = True

        # Active Jobs gone from the informer: ask the API server before dropping them.
        for ref in list(status.get("active") or []):
            if ref.get("uid") in children:
                continue
            try:
                await self.client.get(JOBS, ref.get("name", ""), ref.get("namespace") or ns_of(cj))
            except StatusError as err:
                if err.code != 404:
                    raise _SyncFailed(changed, err) from None
                self.recorder.event(cj, "Normal", "MissingJob", f"Active job went missing: {ref.get('name', '')}")
                _remove_active(status, ref.get("uid", ""))
                changed = True

        if md_of(cj).get("deletionTimestamp"):
            return None, changed

        spec = cj.get("spec") or {}
        tz = spec.get("timeZone")
        if tz is not None:
            try:
                load_location(tz)
            except UnknownTimeZone as err:
                self.recorder.event(cj, "Warning", "UnknownTimeZone", f"invalid timeZone: {go_quote(tz)}: {err}")
                return None, changed

        if spec.get("suspend") is True:
            return None, changed

        schedule = spec.get("schedule") or ""
        if "TZ" in schedule:
            self.recorder.event(cj, "Warning", "UnsupportedSchedule",
                                f"CRON_TZ or TZ used in schedule {go_quote(schedule)} is not officially supported, "
                                "see https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/ for more "
                                "details")
        try:
            sched = parse_schedule(format_schedule(cj))
        except CronError as err:
            self.recorder.event(cj, "Warning", "UnparseableSchedule",
                                f"unparseable schedule: {go_quote(schedule)} : {err}")
            return None, changed

        try:
            _, scheduled, missed = most_recent_schedule_time(cj, now, sched, True)
        except InvalidSchedule as err:
            self.recorder.event(cj, "Warning", "InvalidSchedule", f"invalid schedule: {schedule} : {err}")
            return None, changed
        if scheduled is None or scheduled > now:
            return next_schedule_delay(cj, now, sched), changed
        if missed is Missed.MANY:
            self.recorder.event(cj, "Warning", "TooManyMissedTimes",
                                "too many missed start times. Set or decrease .spec.startingDeadlineSeconds or "
                                "check clock skew")

        deadline_s = spec.get("startingDeadlineSeconds")
        if isinstance(deadline_s, int) and scheduled + _dt.timedelta(seconds=deadline_s) < now:
            self.recorder.event(cj, "Warning", "MissSchedule",
                                f"Missed scheduled time to start a job: {rfc1123z(scheduled)}")
            return next_schedule_delay(cj, now, sched), changed

        name = job_name(cj, scheduled)
        last = _time(status.get("lastScheduleTime"), _dt.timezone.utc)
        if any(r.get("name") == name and r.get("namespace") == ns_of(cj) for r in status.get("active") or []) \
                or (last is not None and last == scheduled):
            return next_schedule_delay(cj, now, sched), changed

        policy = spec.get("concurrencyPolicy")
        if policy == "Forbid" and status.get("active"):
            self.recorder.event(cj, "Normal", "JobAlreadyActive",
                                "Not starting job because prior execution is running and concurrency policy is Forbid")
            return next_schedule_delay(cj, now, sched), changed
        if policy == "Replace":
            for ref in list(status.get("active") or []):
                try:
                    job = await self.client.get(JOBS, ref.get("name", ""), ref.get("namespace") or ns_of(cj))
                except StatusError as err:
                    self.recorder.event(cj, "Warning", "FailedGet", f"Get job: {err.message}")
                    raise _SyncFailed(changed, err) from None
                if not await self._delete_job(cj, job):
                    raise _SyncFailed(changed, RuntimeError(
                        f"could not replace job {ns_of(job)}/{name_of(job)}"))
                changed = True

        request = job_from_template(cj, scheduled)
        try:
            created = await self.client.create(JOBS, request, ns_of(cj))
        except StatusError as err:
            if err.reason == "Forbidden" and "being terminated" in err.message:
                raise _SyncFailed(changed, err) from None
            if err.code == 409 and err.reason == "AlreadyExists":
                try:
                    existing = await self.client.get(JOBS, name, ns_of(cj))
                except StatusError as get_err:
                    raise _SyncFailed(changed, get_err) from None
                ref = controller_ref(existing) or {}
                if ref.get("uid") != uid_of(cj) or _in_active(status, uid_of(existing)):
                    # another actor's Job, or one already recorded
                    return None, changed
                log.info("cronjob %s: job %s already exists", key_of(cj), name)
                created = existing
            else:
                self.recorder.event(cj, "Warning", "FailedCreate", f"Error creating job: {err.message}")
                raise _SyncFailed(changed, err) from None
        else:
            self.recorder.event(cj, "Normal", "SuccessfulCreate", f"Created job {name_of(created)}")

        status.setdefault("active", []).append(job_reference(created))
        status["lastScheduleTime"] = format_time(scheduled)
        return next_schedule_delay(cj, now, sched), True

    # -------------------------------------------------------------- cleanup

    async def _cleanup_finished_jobs(self, cj: Obj, jobs: list[Obj]) -> bool:
        spec = cj.get("spec") or {}
        ok_limit, failed_limit = spec.get("successfulJobsHistoryLimit"), spec.get("failedJobsHistoryLimit")
        if ok_limit is None and failed_limit is None:
            return False
        succeeded = [j for j in jobs if finished_condition(j) == "Complete"]
        failed = [j for j in jobs if finished_condition(j) == "Failed"]
        changed = False
        for group, limit in ((succeeded, ok_limit), (failed, failed_limit)):
            if not isinstance(limit, int) or len(group) <= limit:
                continue
            for job in sorted(group, key=_start_key)[:len(group) - limit]:
                if await self._delete_job(cj, job):
                    changed = True
        return changed

    async def _delete_job(self, cj: Obj, job: Obj) -> bool:
        """Delete a Job (its pods in the background) and drop it from the active list."""
        try:
            await self.client.delete(JOBS, name_of(job), ns_of(job), propagation_policy="Background")
        except StatusError as err:
            self.recorder.event(cj, "Warning", "FailedDelete", f"Deleted job: {err.message}")
            log.warning("cronjob %s: deleting job %s: %s", key_of(cj), name_of(job), err)
            return False
        _remove_active(cj["status"], uid_of(job))
        self.recorder.event(cj, "Normal", "SuccessfulDelete", f"Deleted job {name_of(job)}")
        return True


class _SyncFailed(Exception):
    def __init__(self, changed: bool, error: Exception) -> None:
        super().__init__(str(error))
        self.changed = changed
        self.error = error


def _in_active(status: Obj, uid: str) -> bool:
    return any(r.get("uid") == uid for r in status.get("active") or [])


def _remove_active(status: Obj, uid: str) -> None:
    status["active"] = [r for r in status.get("active") or [] if r.get("uid") != uid]


__all__ = [
    "CronJobController", "InvalidSchedule", "Missed", "SCHEDULED_TIMESTAMP_ANNOTATION", "format_schedule",
    "job_from_template", "job_name", "most_recent_schedule_time", "next_schedule_delay",
]
