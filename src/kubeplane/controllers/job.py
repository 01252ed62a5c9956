"""The Job controller, after upstream's ``pkg/controller/job``.

A sync of a Job (``namespace/name``):

* claims its pods (adopting matching orphans, adding the
  ``batch.kubernetes.io/job-tracking`` finalizer, releasing pods that stopped
  matching);
* decides whether the Job has reached an end, in upstream's order: a
  SuccessCriteriaMet or FailureTarget condition from an earlier sync, the pod
  failure policy (FailJob), the back-off limit, the active deadline, then for
  Indexed Jobs the per-index back-off limit (maxFailedIndexes, failed
  indexes) and the success policy;
* otherwise creates or deletes pods towards ``parallelism`` and the remaining
  ``completions`` (Indexed Jobs: one pod per pending index, with the
  completion index annotation, label, hostname and ``JOB_COMPLETION_INDEX``),
  honouring suspension, the pod failure back-off (10 s doubling up to
  10 minutes, globally or per index) and ``podReplacementPolicy``;
* counts finished pods exactly once: their UIDs first go to
  ``status.uncountedTerminatedPods``, then their tracking finalizers are
  removed, then they move to ``succeeded``/``failed`` (or, for Indexed Jobs,
  to ``completedIndexes``/``failedIndexes``);
* adds the interim condition (SuccessCriteriaMet, FailureTarget) and, once no
  pod is uncounted or terminating any more, the final one (Complete with
  ``completionTime``, Failed).

Time is read from ``clock`` only; the delayed re-syncs it schedules (active
deadline, back-off) are wake-ups after which the clock is read again.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import deep_copy, format_time, utcnow
from kubeplane.api.resources import resource
from kubeplane.client.informer import SharedInformerFactory, unwrap_deleted
from kubeplane.client.interface import Client, Obj
from kubeplane.controllers.base import Controller
from kubeplane.controllers.jobutil import (
    COMPLETION_INDEX_ANNOTATION,
    COMPLETION_INDEX_ENV,
    INDEX_FAILURE_COUNT_ANNOTATION,
    INDEX_IGNORED_FAILURE_COUNT_ANNOTATION,
    JOB_CONTROLLER_NAME,
    JOB_TRACKING_FINALIZER,
    UNKNOWN_INDEX,
    BackoffRecord,
    Intervals,
    _time,
    active_pods_for_removal,
    completion_index,
    completions_of,
    finished_time,
    has_backoff_limit_per_index,
    has_tracking_finalizer,
    index_absolute_failure_count,
    index_failure_count,
    is_indexed,
    is_pod_failed,
    is_terminating,
    match_pod_failure_policy,
    match_success_policy,
    new_backoff_record,
    only_replace_failed_pods,
    pod_generate_name_with_index,
    remaining_backoff,
)
from kubeplane.controllers.replicaset import (
    CONTROLLER_UID_INDEX,
    NAMESPACE_INDEX,
    Expectations,
    add_indexers,
    controller_ref,
    controller_uid_index,
    is_pod_active,
    is_pod_ready,
    key_of,
    md_of,
    name_of,
    namespace_index,
    new_controller_ref,
    ns_of,
    selector_of,
    uid_of,
)

log = logging.getLogger(__name__)

PODS = resource("pods")
JOBS = resource("jobs")

#: informer index on pods: the namespace of pods without a controller
ORPHAN_INDEX = "job-orphans"

#: upstream's SyncJobBatchPeriod: pod events and status updates sync a Job this much later, together
SYNC_BATCH_PERIOD = 1.0
#: upstream's DefaultJobPodFailureBackOff and MaxJobPodFailureBackOff
POD_FAILURE_BACKOFF = 10.0
MAX_POD_FAILURE_BACKOFF = 600.0
#: upstream's MaxUncountedPods and MaxPodCreateDeletePerSync
MAX_UNCOUNTED_PODS = 500
MAX_POD_CREATE_DELETE_PER_SYNC = 500


def orphan_index(pod: Obj) -> list[str]:
    return [ns_of(pod)] if controller_ref(pod) is None else []


def is_finished(job: Obj) -> bool:
    """Complete or Failed is True."""
    return any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
               for c in (job.get("status") or {}).get("conditions") or [])


def find_condition(job: Obj, type_: str) -> Obj | None:
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c
    return None


def is_suspended(job: Obj) -> bool:
    return (job.get("spec") or {}).get("suspend") is True


def managed_elsewhere(job: Obj) -> bool:
    managed_by = (job.get("spec") or {}).get("managedBy")
    return managed_by is not None and managed_by != JOB_CONTROLLER_NAME


def _set_count(status: Obj, key: str, value: int) -> None:
    """Counters upstream leaves out when zero."""
    if value:
        status[key] = value
    else:
        status.pop(key, None)


@dataclass
class _SyncContext:
    job: Obj
    pods: list[Obj]
    active_pods: list[Obj]
    uncounted_succeeded: set[str]
    uncounted_failed: set[str]
    expected_rm_finalizers: set[str]
    ready: int = 0
    terminating: int = 0
    succeeded: int = 0
    failed: int = 0
    finished_condition: Obj | None = None
    prev_succeeded_indexes: Intervals = field(default_factory=Intervals)
    succeeded_indexes: Intervals = field(default_factory=Intervals)
    failed_indexes: Intervals | None = None
    backoff: BackoffRecord = field(default_factory=BackoffRecord)
    delayed_deletion: dict[int, Obj] = field(default_factory=dict)


class JobController(Controller):
    """Runs every Job's pods to completion (or failure)."""

    def __init__(
        self,
        client: Client,
        factory: SharedInformerFactory | None = None,
        *,
        workers: int = 5,
        clock: Callable[[], _dt.datetime] = utcnow,
        sync_batch_period: float = SYNC_BATCH_PERIOD,
        pod_failure_backoff: float = POD_FAILURE_BACKOFF,
        max_pod_failure_backoff: float = MAX_POD_FAILURE_BACKOFF,
        name: str = "job-controller",
    ) -> None:
        super().__init__(name, client, factory, workers=workers)
        self.clock = clock
        self.sync_batch_period = sync_batch_period
        self.pod_failure_backoff = pod_failure_backoff
        self.max_pod_failure_backoff = max_pod_failure_backoff
        self.expectations = Expectations()
        #: pod UIDs whose tracking finalizer removal this controller waits to see, per Job key
        self.finalizer_expectations: dict[str, set[str]] = {}
        #: UIDs of Jobs this controller marked finished before its informer saw it
        self.finished_jobs: set[str] = set()
        self.backoff: dict[str, BackoffRecord] = {}
        self.job_informer = self.factory.informer_for(JOBS)
        self.pod_informer = self.factory.informer_for(PODS)
        add_indexers(self.job_informer, {NAMESPACE_INDEX: namespace_index})
        add_indexers(self.pod_informer, {NAMESPACE_INDEX: namespace_index, CONTROLLER_UID_INDEX: controller_uid_index,
                                         ORPHAN_INDEX: orphan_index})
        self.jobs = self.add_queue("jobs", self.sync, base_delay=1.0, max_delay=60.0)
        self.orphans = self.add_queue("orphan-pods", self.sync_orphan_pod, base_delay=1.0, max_delay=60.0)
        self.job_informer.add_event_handler(self._job_added, self._job_updated, self._job_deleted)
        self.pod_informer.add_event_handler(self._pod_added, self._pod_updated, self._pod_deleted_final)

    # ----------------------------------------------------------- enqueueing

    def _now(self) -> _dt.datetime:
        return self.clock()

    def enqueue_batched(self, key: str) -> None:
        if self.sync_batch_period > 0:
            self.jobs.add_after(key, self.sync_batch_period)
        else:
            self.jobs.add(key)

    def enqueue_with_delay(self, key: str, delay: float) -> None:
        self.jobs.add_after(key, max(delay, self.sync_batch_period))

    def resync(self) -> None:
        """Sync every Job now (e.g. after a test moved the clock)."""
        for job in self.job_informer.indexer.list():
            self.jobs.add(key_of(job))

    def _enqueue_selector_orphans(self, job: Obj) -> None:
        """Pods the Job's selector matches that still carry the tracking
        finalizer, for the orphan worker to release."""
        selector = selector_of(job)
        for pod in self.pod_informer.indexer.by_index(NAMESPACE_INDEX, ns_of(job)):
            if has_tracking_finalizer(pod) and selector.matches(md_of(pod).get("labels") or {}):
                self.orphans.add(key_of(pod))

    # ------------------------------------------------------------- handlers

    def _job_added(self, job: Obj) -> None:
        self.jobs.add(key_of(job))

    def _job_updated(self, old: Obj, new: Obj) -> None:
        key = key_of(new)
        if is_finished(new):
            self._enqueue_selector_orphans(new)
            return
        if md_of(old).get("generation") == md_of(new).get("generation"):
            self.enqueue_batched(key)
        else:
            self.jobs.add(key)
        start = _time((new.get("status") or {}).get("startTime"))
        new_ads = (new.get("spec") or {}).get("activeDeadlineSeconds")
        old_ads = (old.get("spec") or {}).get("activeDeadlineSeconds")
        if start is not None and new_ads is not None and new_ads != old_ads:
            passed = (self._now() - start).total_seconds()
            self.jobs.add_after(key, float(new_ads) - passed)

    def _job_deleted(self, job: Obj) -> None:
        job = unwrap_deleted(job)
        key = key_of(job)
        self.jobs.add(key)
        self.finished_jobs.discard(uid_of(job))
        self._enqueue_selector_orphans(job)
        self.backoff.pop(key, None)

    def _resolve(self, namespace: str, ref: Obj | None) -> Obj | None:
        if not ref or ref.get("kind") != "Job":
            return None
        job = self.job_informer.indexer.get_by_key(f"{namespace}/{ref.get('name', '')}")
        if job is None or uid_of(job) != ref.get("uid"):
            return None
        return job

    def _matching_jobs(self, pod: Obj) -> list[Obj]:
        labels = md_of(pod).get("labels") or {}
        if not labels:
            return []
        return [j for j in self.job_informer.indexer.by_index(NAMESPACE_INDEX, ns_of(pod))
                if selector_of(j).matches(labels)]

    def _finalizer_removal_observed(self, key: str, uid: str) -> None:
        uids = self.finalizer_expectations.get(key)
        if uids is not None:
            uids.discard(uid)

    def _pod_added(self, pod: Obj) -> None:
        if md_of(pod).get("deletionTimestamp"):
            self._pod_deleted(pod, final=False)
            return
        ref = controller_ref(pod)
        if ref is not None:
            job = self._resolve(ns_of(pod), ref)
            if job is None:
                return
            self.expectations.creation_observed(key_of(job))
            self.enqueue_batched(key_of(job))
            return
        if has_tracking_finalizer(pod):
            self.orphans.add(key_of(pod))
        for job in self._matching_jobs(pod):
            self.enqueue_batched(key_of(job))

    def _pod_updated(self, old: Obj, new: Obj) -> None:
        if md_of(old).get("resourceVersion") == md_of(new).get("resourceVersion"):
            return
        if md_of(new).get("deletionTimestamp"):
            self._pod_deleted(new, final=False)
            return
        finalizer_removed = not has_tracking_finalizer(new)
        old_ref, new_ref = controller_ref(old), controller_ref(new)
        if old_ref != new_ref and old_ref is not None:
            job = self._resolve(ns_of(old), old_ref)
            if job is not None:
                if finalizer_removed:
                    self._finalizer_removal_observed(key_of(job), uid_of(new))
                self.enqueue_batched(key_of(job))
        if new_ref is not None:
            job = self._resolve(ns_of(new), new_ref)
            if job is None:
                return
            if finalizer_removed:
                self._finalizer_removal_observed(key_of(job), uid_of(new))
            self.enqueue_batched(key_of(job))
            return
        if has_tracking_finalizer(new):
            self.orphans.add(key_of(new))
        if (md_of(old).get("labels") or {}) != (md_of(new).get("labels") or {}) or old_ref != new_ref:
            for job in self._matching_jobs(new):
                self.enqueue_batched(key_of(job))

    def _pod_deleted_final(self, pod: Obj) -> None:
        self._pod_deleted(unwrap_deleted(pod), final=True)

    def _pod_deleted(self, pod: Obj, *, final: bool) -> None:
        ref = controller_ref(pod)
        has_finalizer = has_tracking_finalizer(pod)
        if ref is None:
            if has_finalizer:
                self.orphans.add(key_of(pod))
            return
        job = self._resolve(ns_of(pod), ref)
        if job is None or is_finished(job):
            if has_finalizer:
                self.orphans.add(key_of(pod))
            return
        key = key_of(job)
        self.expectations.deletion_observed(key, key_of(pod))
        if final or not has_finalizer:
            self._finalizer_removal_observed(key, uid_of(pod))
        self.enqueue_batched(key)

    # ---------------------------------------------------------- orphan pods

    async def sync_orphan_pod(self, key: str) -> None:
        """Remove the tracking finalizer of a pod no unfinished Job controls."""
        pod = self.pod_informer.indexer.get_by_key(key)
        if pod is None or not has_tracking_finalizer(pod):
            return
        ref = controller_ref(pod)
        if ref is not None:
            if ref.get("kind") != "Job" or ref.get("apiVersion") != "batch/v1":
                return  # another controller's pod: not ours to touch
            job = self._resolve(ns_of(pod), ref)
            if job is not None and managed_elsewhere(job):
                return
            if job is not None and not is_finished(job):
                return  # adopted
        await self._remove_finalizer(pod)

    async def _remove_finalizer(self, pod: Obj) -> None:
        try:
            await self.client.patch(PODS, name_of(pod), {"metadata": {
                "$deleteFromPrimitiveList/finalizers": [JOB_TRACKING_FINALIZER]}}, ns_of(pod),
                patch_type="strategic")
        except StatusError as err:
            if err.code != 404:
                raise

    # ----------------------------------------------------------------- pods

    async def pods_for_job(self, job: Obj) -> list[Obj]:
        """The Job's pods after adopting matching orphans (adding the tracking
        finalizer) and releasing owned pods that no longer match."""
        selector = selector_of(job)
        uid = uid_of(job)
        deleting = bool(md_of(job).get("deletionTimestamp"))
        owned = self.pod_informer.indexer.by_index(CONTROLLER_UID_INDEX, uid)
        out: list[Obj] = []
        for pod in owned:
            if selector.matches(md_of(pod).get("labels") or {}):
                out.append(pod)
            elif not deleting:
                await self._release(pod, uid)
        orphans = [p for p in self.pod_informer.indexer.by_index(ORPHAN_INDEX, ns_of(job))
                   if not md_of(p).get("deletionTimestamp") and selector.matches(md_of(p).get("labels") or {})]
        if orphans and not deleting and await self._can_adopt(job):
            for pod in orphans:
                adopted = await self._adopt(pod, job)
                if adopted is not None:
                    out.append(adopted)
        return out

    async def _can_adopt(self, job: Obj) -> bool:
        try:
            fresh = await self.client.get(JOBS, name_of(job), ns_of(job))
        except StatusError as err:
            if err.code == 404:
                return False
            raise
        return uid_of(fresh) == uid_of(job) and not md_of(fresh).get("deletionTimestamp")

    async def _adopt(self, pod: Obj, job: Obj) -> Obj | None:
        """Upstream's adoption patch: the controller reference and the
        tracking finalizer, guarded by the pod's UID."""
        patch = {"metadata": {"ownerReferences": [new_controller_ref(job, "batch/v1", "Job")],
                              "uid": uid_of(pod), "finalizers": [JOB_TRACKING_FINALIZER]}}
        try:
            return await self.client.patch(PODS, name_of(pod), patch, ns_of(pod), patch_type="strategic")
        except StatusError as err:
            if err.code in (404, 409, 422):
                return None
            raise

    async def _release(self, pod: Obj, uid: str) -> None:
        patch = {"metadata": {"ownerReferences": [{"$patch": "delete", "uid": uid}], "uid": uid_of(pod)}}
        try:
            await self.client.patch(PODS, name_of(pod), patch, ns_of(pod), patch_type="strategic")
        except StatusError as err:
            if err.code not in (404, 409, 422):
                raise

    # ----------------------------------------------------------------- sync

    async def sync(self, key: str) -> None:
        shared = self.job_informer.indexer.get_by_key(key)
        if shared is None:
            self.expectations.delete(key)
            self.finalizer_expectations.pop(key, None)
            self.backoff.pop(key, None)
            return
        if managed_elsewhere(shared):
            return
        if is_finished(shared):
            self.backoff.pop(key, None)
            self.finished_jobs.discard(uid_of(shared))
            return
        if uid_of(shared) in self.finished_jobs:
            return  # marked finished; the informer has not shown it yet
        mode = (shared.get("spec") or {}).get("completionMode")
        if mode not in (None, "NonIndexed", "Indexed"):
            self.recorder.event(shared, "Warning", "UnknownCompletionMode",
                                "Skipped Job sync because completion mode is unknown")
            return
        job = deep_copy(shared)
        spec = job.setdefault("spec", {})
        status = job.setdefault("status", {})
        uncounted = status.get("uncountedTerminatedPods")
        if not isinstance(uncounted, dict):
            uncounted = status["uncountedTerminatedPods"] = {}
        satisfied = self.expectations.satisfied(key)
        pods = await self.pods_for_job(job)
        active_pods = [p for p in pods if is_pod_active(p)]
        ctx = _SyncContext(
            job=job, pods=pods, active_pods=active_pods,
            uncounted_succeeded=set(uncounted.get("succeeded") or []),
            uncounted_failed=set(uncounted.get("failed") or []),
            expected_rm_finalizers=set(self.finalizer_expectations.get(key) or ()),
            ready=sum(1 for p in active_pods if is_pod_ready(p)),
            terminating=sum(1 for p in pods if is_terminating(p)),
        )
        active = len(active_pods)
        new_succeeded = self._valid_pods(ctx, ctx.uncounted_succeeded,
                                         lambda p: (p.get("status") or {}).get("phase") == "Succeeded")
        new_failed = self._valid_pods(ctx, ctx.uncounted_failed, lambda p: is_pod_failed(p, job))
        policy = spec.get("podFailurePolicy")
        ctx.succeeded = int(status.get("succeeded") or 0) + len(new_succeeded) + len(ctx.uncounted_succeeded)
        ctx.failed = (int(status.get("failed") or 0) + len(ctx.uncounted_failed)
                      + sum(1 for p in new_failed if match_pod_failure_policy(policy, p).count))
        now = self._now()
        if not status.get("startTime") and not is_suspended(job):
            status["startTime"] = format_time(now)
        ctx.backoff = new_backoff_record(self.backoff.get(key), new_succeeded, new_failed)

        manage_err: Exception | None = None
        backoff_limit = int(spec.get("backoffLimit") if spec.get("backoffLimit") is not None else 6)
        ctx.finished_condition = self._condition_if_true(job, "SuccessCriteriaMet")
        if ctx.finished_condition is None:
            target = self._condition_if_true(job, "FailureTarget")
            if target is not None:
                ctx.finished_condition = _condition("Failed", target.get("reason", ""), target.get("message", ""),
                                                    now)
            else:
                message = self._fail_job_message(job, pods)
                if message is not None:
                    ctx.finished_condition = _condition("FailureTarget", "PodFailurePolicy", message, now)
        if ctx.finished_condition is None:
            if ctx.failed > backoff_limit or self._past_backoff_limit_on_failure(job, pods, backoff_limit):
                ctx.finished_condition = _condition("FailureTarget", "BackoffLimitExceeded",
                                                    "Job has reached the specified backoff limit", now)
            elif self._past_active_deadline(job, now):
                ctx.finished_condition = _condition("FailureTarget", "DeadlineExceeded",
                                                    "Job was active longer than specified deadline", now)
            elif spec.get("activeDeadlineSeconds") is not None and not is_suspended(job):
                start = _time(status.get("startTime")) or now
                left = float(spec["activeDeadlineSeconds"]) - (now - start).total_seconds()
                self.jobs.add_after(key, left)

        if is_indexed(job):
            completions = completions_of(job) or 0
            ctx.prev_succeeded_indexes, ctx.succeeded_indexes = self._succeeded_indexes(job, pods, completions)
            ctx.succeeded = ctx.succeeded_indexes.total()
            if has_backoff_limit_per_index(job):
                ctx.failed_indexes = self._failed_indexes(job, pods, completions)
                if ctx.finished_condition is None:
                    max_failed = spec.get("maxFailedIndexes")
                    failed_total = ctx.failed_indexes.total()
                    if max_failed is not None and failed_total > int(max_failed):
                        ctx.finished_condition = _condition(
                            "FailureTarget", "MaxFailedIndexesExceeded",
                            "Job has exceeded the specified maximal number of failed indexes", now)
                    elif failed_total > 0 and failed_total + ctx.succeeded_indexes.total() >= completions:
                        ctx.finished_condition = _condition("FailureTarget", "FailedIndexes",
                                                            "Job has failed indexes", now)
                ctx.delayed_deletion = self._pods_with_delayed_deletion(ctx, completions)
            if ctx.finished_condition is None:
                msg = match_success_policy(spec.get("successPolicy"), completions, ctx.succeeded_indexes)
                if msg is not None:
                    ctx.finished_condition = _condition("SuccessCriteriaMet", "SuccessPolicy", msg, now)

        suspend_changed = False
        if ctx.finished_condition is not None:
            deleted_ready, deleted, manage_err = await self._delete_active_pods(job, ctx.active_pods)
            if deleted != active or not satisfied:
                ctx.finished_condition = None  # pods still to go, or not all of them seen yet
            active -= deleted
            ctx.terminating += deleted
            ctx.ready -= deleted_ready
        else:
            manage_called = False
            if satisfied and not md_of(job).get("deletionTimestamp"):
                try:
                    active = await self.manage_job(job, ctx)
                except _ManageError as err:
                    active, manage_err = err.active, err.cause
                manage_called = True
            completions = completions_of(job)
            if completions is None:
                complete = ctx.succeeded > 0 and active == 0
            else:
                complete = ctx.succeeded >= completions and active == 0
            if complete:
                ctx.finished_condition = _condition("SuccessCriteriaMet", "CompletionsReached",
                                                    "Reached expected number of succeeded pods", now)
            elif manage_called:
                if is_suspended(job):
                    if _ensure_condition(status, "Suspended", "True", "JobSuspended", "Job suspended", now):
                        suspend_changed = True
                        self.recorder.event(job, "Normal", "Suspended", "Job suspended")
                        status.pop("startTime", None)
                elif _ensure_condition(status, "Suspended", "False", "JobResumed", "Job resumed", now):
                    suspend_changed = True
                    self.recorder.event(job, "Normal", "Resumed", "Job resumed")
                    status["startTime"] = format_time(now)

        needs_update = (suspend_changed or active != int(status.get("active") or 0)
                        or status.get("ready") != ctx.ready or status.get("terminating") != ctx.terminating)
        _set_count(status, "active", active)
        status["ready"] = ctx.ready
        status["terminating"] = ctx.terminating
        await self._track_status_and_remove_finalizers(key, ctx, needs_update)
        if manage_err is not None:
            raise manage_err

    # -------------------------------------------------------- end criteria

    @staticmethod
    def _condition_if_true(job: Obj, type_: str) -> Obj | None:
        c = find_condition(job, type_)
        return c if c is not None and c.get("status") == "True" else None

    @staticmethod
    def _fail_job_message(job: Obj, pods: list[Obj]) -> str | None:
        policy = (job.get("spec") or {}).get("podFailurePolicy")
        if not policy:
            return None
        for p in pods:
            if is_pod_failed(p, job):
                msg = match_pod_failure_policy(policy, p).message
                if msg is not None:
                    return msg
        return None

    @staticmethod
    def _past_backoff_limit_on_failure(job: Obj, pods: list[Obj], limit: int) -> bool:
        """restartPolicy OnFailure: the containers' restarts reach the back-off limit."""
        template_spec = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
        if template_spec.get("restartPolicy") != "OnFailure":
            return False
        restarts = 0
        for p in pods:
            st = p.get("status") or {}
            if st.get("phase") in ("Running", "Pending"):
                for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
                    restarts += int(cs.get("restartCount") or 0)
        return restarts > 0 if limit == 0 else restarts >= limit

    @staticmethod
    def _past_active_deadline(job: Obj, now: _dt.datetime) -> bool:
        ads = (job.get("spec") or {}).get("activeDeadlineSeconds")
        start = _time((job.get("status") or {}).get("startTime"))
        if ads is None or start is None or is_suspended(job):
            return False
        return (now - start).total_seconds() >= float(ads)

    def _valid_pods(self, ctx: _SyncContext, uncounted: set[str], keep: Callable[[Obj], bool]) -> list[Obj]:
        """Pods still carrying the finalizer, not yet counted, with a valid
        index for Indexed Jobs, that ``keep`` accepts."""
        completions = completions_of(ctx.job) or 0
        out = []
        for p in ctx.pods:
            uid = uid_of(p)
            if not has_tracking_finalizer(p) or uid in uncounted or uid in ctx.expected_rm_finalizers:
                continue
            if is_indexed(ctx.job):
                ix = completion_index(p)
                if ix == UNKNOWN_INDEX or ix >= completions:
                    continue
            if keep(p):
                out.append(p)
        return out

    @staticmethod
    def _succeeded_indexes(job: Obj, pods: list[Obj], completions: int) -> tuple[Intervals, Intervals]:
        prev = Intervals.parse((job.get("status") or {}).get("completedIndexes"), completions)
        new = {completion_index(p) for p in pods
               if (p.get("status") or {}).get("phase") == "Succeeded" and has_tracking_finalizer(p)
               and 0 <= completion_index(p) < completions}
        return prev, prev.with_indexes(new)

    @staticmethod
    def _failed_indexes(job: Obj, pods: list[Obj], completions: int) -> Intervals:
        spec = job.get("spec") or {}
        prev = Intervals.parse((job.get("status") or {}).get("failedIndexes"), completions)
        limit = int(spec.get("backoffLimitPerIndex") or 0)
        policy = spec.get("podFailurePolicy")
        new = set()
        for p in pods:
            ix = completion_index(p)
            if ix == UNKNOWN_INDEX or ix >= completions or not has_tracking_finalizer(p) or not is_pod_failed(p, job):
                continue
            match = match_pod_failure_policy(policy, p)
            if match.action == "FailIndex" or (match.count and index_failure_count(p) >= limit):
                new.add(ix)
        return prev.with_indexes(new)

    def _pods_with_delayed_deletion(self, ctx: _SyncContext, completions: int) -> dict[int, Obj]:
        """Per index still to retry, the last failed pod: its finalizer stays
        until the replacement carries its failure count on."""
        active_indexes = {completion_index(p) for p in ctx.active_pods}
        failed = ctx.failed_indexes or Intervals()
        out: dict[int, Obj] = {}
        for p in self._valid_pods(ctx, set(), lambda p: is_pod_failed(p, ctx.job)):
            ix = completion_index(p)
            if ctx.succeeded_indexes.has(ix) or failed.has(ix) or ix in active_indexes:
                continue
            last = out.get(ix)
            if last is None or (index_absolute_failure_count(last) <= index_absolute_failure_count(p)
                                and finished_time(p) >= finished_time(last)):
                out[ix] = p
        return out

    # --------------------------------------------------------- manage pods

    async def manage_job(self, job: Obj, ctx: _SyncContext) -> int:
        """Create or delete pods; returns the number of active pods after."""
        key = key_of(job)
        spec = job.get("spec") or {}
        active = len(ctx.active_pods)
        parallelism = int(spec.get("parallelism") if spec.get("parallelism") is not None else 1)
        if is_suspended(job):
            victims = active_pods_for_removal(job, ctx.active_pods, active)
            self.expectations.expect_deletions(key, [key_of(p) for p in victims])
            removed_ready, removed, err = await self._delete_job_pods(job, key, victims)
            ctx.terminating += removed
            ctx.ready -= removed_ready
            if err is not None:
                raise _ManageError(active - removed, err)
            return active - removed
        completions = completions_of(job)
        if completions is None:
            want = active if ctx.succeeded > 0 else parallelism
        else:
            want = max(0, min(completions - ctx.succeeded, parallelism))
        victims = active_pods_for_removal(job, ctx.active_pods, max(0, active - want))
        victims = victims[:MAX_POD_CREATE_DELETE_PER_SYNC]
        if victims:
            self.expectations.expect_deletions(key, [key_of(p) for p in victims])
            removed_ready, removed, err = await self._delete_job_pods(job, key, victims)
            ctx.terminating += removed
            ctx.ready -= removed_ready
            if err is not None:
                raise _ManageError(active - removed, err)
            return active - removed
        terminating = ctx.terminating if only_replace_failed_pods(job) else 0
        diff = want - terminating - active
        if diff <= 0:
            return active
        now = self._now()
        if not has_backoff_limit_per_index(job):
            left = remaining_backoff(now, self.pod_failure_backoff, self.max_pod_failure_backoff,
                                     ctx.backoff.failures_after_last_success, ctx.backoff.last_failure_time)
            if left > 0:
                self.enqueue_with_delay(key, left)
                return 0
        diff = min(diff, MAX_POD_CREATE_DELETE_PER_SYNC)
        indexes: list[int] = []
        if is_indexed(job):
            indexes = self._first_pending_indexes(ctx, diff, completions or 0)
            if has_backoff_limit_per_index(job):
                indexes, left = self._indexes_ready_to_create(indexes, ctx.delayed_deletion, now)
                if left > 0:
                    self.enqueue_with_delay(key, left)
                    return 0
            diff = len(indexes)
        if diff <= 0:
            return active
        self.expectations.expect_creations(key, diff)
        created, err = await self._create_pods(job, ctx, diff, indexes)
        skipped = diff - created
        if skipped:
            self.expectations.creation_observed(key, skipped)
        if err is not None:
            raise _ManageError(active + created, err)
        return active + created

    def _first_pending_indexes(self, ctx: _SyncContext, count: int, completions: int) -> list[int]:
        busy = ctx.succeeded_indexes.with_indexes(
            completion_index(p) for p in ctx.active_pods if completion_index(p) != UNKNOWN_INDEX)
        if only_replace_failed_pods(ctx.job):
            busy = busy.with_indexes(completion_index(p) for p in ctx.pods
                                     if is_terminating(p) and completion_index(p) != UNKNOWN_INDEX)
        if ctx.failed_indexes is not None:
            busy = busy.merge(ctx.failed_indexes)
        out = []
        for ix in range(completions):
            if len(out) >= count:
                break
            if not busy.has(ix):
                out.append(ix)
        return out

    def _indexes_ready_to_create(self, indexes: list[int], delayed: dict[int, Obj],
                                 now: _dt.datetime) -> tuple[list[int], float]:
        ready: list[int] = []
        least: float | None = None
        for ix in indexes:
            last = delayed.get(ix)
            left = 0.0
            if last is not None:
                left = remaining_backoff(now, self.pod_failure_backoff, self.max_pod_failure_backoff,
                                         index_absolute_failure_count(last) + 1, finished_time(last))
            if left == 0:
                ready.append(ix)
            elif least is None or left < least:
                least = left
        return (ready, 0.0) if ready else (ready, least or 0.0)

    def pod_template(self, job: Obj, index: int | None, ctx: _SyncContext) -> tuple[Obj, str]:
        """The pod to create (and its generateName) for ``index`` (None: NonIndexed)."""
        spec = job.get("spec") or {}
        tmpl = deep_copy(spec.get("template") or {})
        tmd = tmpl.get("metadata") or {}
        pod_spec = tmpl.get("spec") or {}
        labels = dict(tmd.get("labels") or {})
        annotations = dict(tmd.get("annotations") or {})
        finalizers = list(tmd.get("finalizers") or [])
        if JOB_TRACKING_FINALIZER not in finalizers:
            finalizers.append(JOB_TRACKING_FINALIZER)
        generate_name = f"{name_of(job)}-"
        if index is not None:
            for c in (pod_spec.get("initContainers") or []) + (pod_spec.get("containers") or []):
                env = c.setdefault("env", [])
                if not any(e.get("name") == COMPLETION_INDEX_ENV for e in env):
                    env.append({"name": COMPLETION_INDEX_ENV, "valueFrom": {"fieldRef": {
                        "apiVersion": "v1", "fieldPath": f"metadata.labels['{COMPLETION_INDEX_ANNOTATION}']"}}})
            annotations[COMPLETION_INDEX_ANNOTATION] = str(index)
            labels[COMPLETION_INDEX_ANNOTATION] = str(index)
            pod_spec["hostname"] = f"{name_of(job)}-{index}"
            generate_name = pod_generate_name_with_index(name_of(job), index)
            if has_backoff_limit_per_index(job):
                failures, ignored = self._new_index_failure_counts(job, ctx.delayed_deletion.get(index))
                annotations[INDEX_FAILURE_COUNT_ANNOTATION] = str(failures)
                if ignored > 0:
                    annotations[INDEX_IGNORED_FAILURE_COUNT_ANNOTATION] = str(ignored)
        md: Obj = {"generateName": generate_name, "namespace": ns_of(job),
                   "ownerReferences": [new_controller_ref(job, "batch/v1", "Job")], "finalizers": finalizers}
        if labels:
            md["labels"] = labels
        if annotations:
            md["annotations"] = annotations
        return {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": pod_spec}, generate_name

    @staticmethod
    def _new_index_failure_counts(job: Obj, replaced: Obj | None) -> tuple[int, int]:
        if replaced is None:
            return 0, 0
        failures = index_failure_count(replaced)
        ignored = index_absolute_failure_count(replaced) - failures
        policy = (job.get("spec") or {}).get("podFailurePolicy")
        if policy and not match_pod_failure_policy(policy, replaced).count:
            ignored += 1
        else:
            failures += 1
        return failures, ignored

    async def _create_pods(self, job: Obj, ctx: _SyncContext, count: int,
                           indexes: list[int]) -> tuple[int, Exception | None]:
        """Slow start: batches of 1, 2, 4, ... concurrently, stopping after a
        batch with a failure. Returns the pods created and the first error."""
        pending: list[int | None] = list(indexes) if indexes else [None] * count
        created = 0
        batch = 1
        while pending:
            now_batch, pending = pending[:batch], pending[batch:]
            results = await asyncio.gather(*(self._create_one(job, ctx, ix) for ix in now_batch),
                                           return_exceptions=True)
            created += sum(1 for r in results if r is True)
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                if not isinstance(errors[0], Exception):
                    raise errors[0]
                return created, errors[0]
            batch *= 2
        return created, None

    async def _create_one(self, job: Obj, ctx: _SyncContext, index: int | None) -> bool:
        body, _ = self.pod_template(job, index, ctx)
        try:
            pod = await self.client.create(PODS, body, ns_of(job))
        except StatusError as err:
            if err.reason == "Forbidden" and "being terminated" in err.message:
                return False
            self.recorder.event(job, "Warning", "FailedCreate", f"Error creating: {err.message}")
            raise
        self.recorder.event(job, "Normal", "SuccessfulCreate", f"Created pod: {name_of(pod)}")
        return True

    async def _delete_pod(self, job: Obj, pod: Obj) -> None:
        try:
            await self.client.delete(PODS, name_of(pod), ns_of(pod))
        except StatusError as err:
            if err.code == 404:
                return
            self.recorder.event(job, "Warning", "FailedDelete", f"Error deleting: {err.message}")
            raise
        self.recorder.event(job, "Normal", "SuccessfulDelete", f"Deleted pod: {name_of(pod)}")

    async def _delete_active_pods(self, job: Obj, pods: list[Obj]) -> tuple[int, int, Exception | None]:
        """Delete the pods, finalizers kept (the tracking counts them later)."""
        results = await asyncio.gather(*(self._delete_pod(job, p) for p in pods), return_exceptions=True)
        return self._deletion_counts(pods, results)

    async def _delete_job_pods(self, job: Obj, key: str, pods: list[Obj]) -> tuple[int, int, Exception | None]:
        """Remove the tracking finalizer, then delete (the pod is not counted)."""

        async def one(pod: Obj) -> None:
            try:
                if has_tracking_finalizer(pod):
                    await self._remove_finalizer(pod)
                await self._delete_pod(job, pod)
            except Exception:
                self.expectations.deletion_observed(key, key_of(pod))
                raise

        results = await asyncio.gather(*(one(p) for p in pods), return_exceptions=True)
        return self._deletion_counts(pods, results)

    @staticmethod
    def _deletion_counts(pods: list[Obj], results: list[Any]) -> tuple[int, int, Exception | None]:
        ready = deleted = 0
        first: Exception | None = None
        for pod, r in zip(pods, results):
            if isinstance(r, BaseException):
                if not isinstance(r, Exception):
                    raise r
                first = first or r
                continue
            deleted += 1
            if is_pod_ready(pod):
                ready += 1
        return ready, deleted, first

    # ------------------------------------------------------------- tracking

    async def _track_status_and_remove_finalizers(self, key: str, ctx: _SyncContext, needs_flush: bool) -> None:
        job = ctx.job
        status = job["status"]
        uncounted = status["uncountedTerminatedPods"]
        indexed = is_indexed(job)
        completions = completions_of(job) or 0
        policy = (job.get("spec") or {}).get("podFailurePolicy")
        if indexed:
            ctx.pods.sort(key=completion_index)
        with_finalizer = {uid_of(p) for p in ctx.pods
                          if has_tracking_finalizer(p) and uid_of(p) not in ctx.expected_rm_finalizers}
        if _clean_uncounted(status, with_finalizer):
            needs_flush = True
        to_remove: list[Obj] = []
        new_succeeded_indexes: list[int] = []
        reached_max = False
        for pod in ctx.pods:
            uid = uid_of(pod)
            if not has_tracking_finalizer(pod) or uid in ctx.expected_rm_finalizers:
                continue
            failed = is_pod_failed(pod, job)
            if not self._can_remove_finalizer(ctx, pod, failed):
                continue
            to_remove.append(pod)
            phase = (pod.get("status") or {}).get("phase")
            if phase == "Succeeded" and uid not in ctx.uncounted_failed:
                if indexed:
                    ix = completion_index(pod)
                    if ix != UNKNOWN_INDEX and ix < completions and not ctx.prev_succeeded_indexes.has(ix):
                        new_succeeded_indexes.append(ix)
                        needs_flush = True
                elif uid not in ctx.uncounted_succeeded:
                    needs_flush = True
                    uncounted.setdefault("succeeded", []).append(uid)
                    ctx.uncounted_succeeded.add(uid)
            elif failed or (ctx.finished_condition is not None
                            and ctx.finished_condition.get("type") != "SuccessCriteriaMet"):
                ix = completion_index(pod)
                if uid not in ctx.uncounted_failed and (not indexed or (ix != UNKNOWN_INDEX and ix < completions)):
                    if match_pod_failure_policy(policy, pod).count:
                        needs_flush = True
                        uncounted.setdefault("failed", []).append(uid)
                        ctx.uncounted_failed.add(uid)
            if (len(new_succeeded_indexes) + len(uncounted.get("succeeded") or [])
                    + len(uncounted.get("failed") or [])) >= MAX_UNCOUNTED_PODS:
                reached_max = True
                break
        if indexed:
            ctx.succeeded_indexes = ctx.succeeded_indexes.with_indexes(new_succeeded_indexes)
            text = str(ctx.succeeded_indexes)
            if text != (status.get("completedIndexes") or ""):
                needs_flush = True
            _set_count(status, "succeeded", ctx.succeeded_indexes.total())
            if text:
                status["completedIndexes"] = text
            else:
                status.pop("completedIndexes", None)
            failed_text = str(ctx.failed_indexes) if ctx.failed_indexes is not None else None
            if status.get("failedIndexes") != failed_text:
                needs_flush = True
                if failed_text is None:
                    status.pop("failedIndexes", None)
                else:
                    status["failedIndexes"] = failed_text
        now = self._now()
        cond = ctx.finished_condition
        if cond is not None and cond["type"] == "FailureTarget":
            status.setdefault("conditions", []).append(cond)
            needs_flush = True
            cond = ctx.finished_condition = _condition("Failed", cond["reason"], cond["message"], now)
        if cond is not None and cond["type"] == "SuccessCriteriaMet":
            if self._condition_if_true(job, "SuccessCriteriaMet") is None:
                status.setdefault("conditions", []).append(cond)
                needs_flush = True
            cond = ctx.finished_condition = _condition("Complete", cond["reason"], cond["message"], now)
        needs_flush = await self._flush_and_remove_finalizers(key, ctx, to_remove, with_finalizer, needs_flush)
        finished = not reached_max and self._enact_finished(ctx, now)
        if finished:
            needs_flush = True
        if needs_flush:
            await self._update_status(ctx)
            if finished:
                self._record_finished(ctx.job, ctx.finished_condition or {})
                self.finished_jobs.add(uid_of(ctx.job))

    @staticmethod
    def _can_remove_finalizer(ctx: _SyncContext, pod: Obj, failed: bool) -> bool:
        if (md_of(ctx.job).get("deletionTimestamp") or ctx.finished_condition is not None
                or (pod.get("status") or {}).get("phase") == "Succeeded"):
            return True
        if not failed:
            return False
        if has_backoff_limit_per_index(ctx.job):
            ix = completion_index(pod)
            delayed = ctx.delayed_deletion.get(ix)
            if ix != UNKNOWN_INDEX and delayed is not None and uid_of(delayed) == uid_of(pod):
                return False
        return True

    async def _flush_and_remove_finalizers(self, key: str, ctx: _SyncContext, pods: list[Obj],
                                           with_finalizer: set[str], needs_flush: bool) -> bool:
        if needs_flush:
            await self._update_status(ctx)
            self.backoff[key] = ctx.backoff
            needs_flush = False
        err: Exception | None = None
        if pods:
            expected = self.finalizer_expectations.setdefault(key, set())
            expected.update(uid_of(p) for p in pods)
            results = await asyncio.gather(*(self._remove_finalizer(p) for p in pods), return_exceptions=True)
            for pod, r in zip(pods, results):
                if isinstance(r, BaseException):
                    self._finalizer_removal_observed(key, uid_of(pod))
                    if not isinstance(r, Exception):
                        raise r
                    err = err or r
                else:
                    with_finalizer.discard(uid_of(pod))
        if _clean_uncounted(ctx.job["status"], with_finalizer):
            needs_flush = True
        if err is not None:
            if needs_flush:
                await self._update_status(ctx)
            raise err
        return needs_flush

    def _enact_finished(self, ctx: _SyncContext, now: _dt.datetime) -> bool:
        cond = ctx.finished_condition
        if cond is None:
            return False
        status = ctx.job["status"]
        uncounted = status.get("uncountedTerminatedPods") or {}
        if uncounted.get("succeeded") or uncounted.get("failed"):
            return False
        if ctx.terminating > 0:
            return False
        _ensure_condition(status, cond["type"], cond["status"], cond["reason"], cond["message"], now)
        if cond["type"] == "Complete":
            status["completionTime"] = cond["lastTransitionTime"]
        return True

    def _record_finished(self, job: Obj, cond: Obj) -> None:
        if cond.get("type") == "Complete":
            completions = completions_of(job)
            if completions is not None and int((job.get("status") or {}).get("succeeded") or 0) > completions:
                self.recorder.event(job, "Warning", "TooManySucceededPods",
                                    "Too many succeeded pods running after completion count reached")
            self.recorder.event(job, "Normal", "Completed", "Job completed")
        else:
            self.recorder.event(job, "Warning", cond.get("reason", ""), cond.get("message", ""))

    async def _update_status(self, ctx: _SyncContext) -> None:
        updated = await self.client.update(JOBS, ctx.job, subresource="status")
        # The next write of this sync goes on from the version just stored.
        ctx.job["metadata"]["resourceVersion"] = md_of(updated).get("resourceVersion")


class _ManageError(Exception):
    """A failed create/delete in manage_job, with the active count it left."""

    def __init__(self, active: int, cause: Exception) -> None:
        super().__init__(str(cause))
        self.active = active
        self.cause = cause


def _condition(type_: str, reason: str, message: str, now: _dt.datetime, status: str = "True") -> Obj:
    stamp = format_time(now)
    return {"type": type_, "status": status, "lastProbeTime": stamp, "lastTransitionTime": stamp,
            "reason": reason, "message": message}


def _ensure_condition(status: Obj, type_: str, value: str, reason: str, message: str, now: _dt.datetime) -> bool:
    """Upstream's ensureJobConditionStatus: update the condition of that type
    or append it (a False condition is never appended)."""
    conds = status.setdefault("conditions", [])
    for i, c in enumerate(conds):
        if c.get("type") == type_:
            if c.get("status") != value or c.get("reason") != reason or c.get("message") != message:
                conds[i] = _condition(type_, reason, message, now, value)
                return True
            return False
    if value != "False":
        conds.append(_condition(type_, reason, message, now, value))
        return True
    if not conds:
        status.pop("conditions", None)
    return False


def _clean_uncounted(status: Obj, with_finalizer: set[str]) -> bool:
    """Move uncounted pods whose finalizer is gone to the counters."""
    uncounted = status["uncountedTerminatedPods"]
    changed = False
    for field_, counter in (("succeeded", "succeeded"), ("failed", "failed")):
        uids = uncounted.get(field_) or []
        keep = [u for u in uids if u in with_finalizer]
        if len(keep) != len(uids):
            changed = True
            _set_count(status, counter, int(status.get(counter) or 0) + len(uids) - len(keep))
            if keep:
                uncounted[field_] = keep
            else:
                uncounted.pop(field_, None)
    return changed


__all__ = ["JOB_TRACKING_FINALIZER", "JobController", "is_finished"]
