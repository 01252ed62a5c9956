"""The TTL-after-finished controller, after upstream's
``pkg/controller/ttlafterfinished``: a finished Job (Complete or Failed) with
``spec.ttlSecondsAfterFinished`` is deleted, with its pods (Foreground
propagation, UID precondition), that many seconds after the condition's
``lastTransitionTime``.

Before deleting, the TTL is checked again on a fresh read of the Job: the
cached one may be stale (the TTL changed, the Job was replaced). Time comes
from ``clock``; a Job not yet expired is looked at again when it should be
(a wake-up, after which the clock is read again).
"""

from __future__ import annotations

import datetime as _dt
import logging
from typing import Callable

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import utcnow
from kubeplane.api.resources import resource
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.interface import Client, Obj
from kubeplane.controllers.base import Controller
from kubeplane.controllers.jobutil import _time
from kubeplane.controllers.replicaset import key_of, md_of, name_of, ns_of, uid_of

log = logging.getLogger(__name__)

JOBS = resource("jobs")


class FinishTimeUnknown(Exception):
    """A finished Job whose condition carries no usable time."""


def needs_cleanup(job: Obj) -> bool:
    ttl = (job.get("spec") or {}).get("ttlSecondsAfterFinished")
    return ttl is not None and finish_condition(job) is not None


def finish_condition(job: Obj) -> Obj | None:
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") in ("Complete", "Failed") and c.get("status") == "True":
            return c
    return None


def finish_and_expire_time(job: Obj) -> tuple[_dt.datetime, _dt.datetime]:
    cond = finish_condition(job)
    md = md_of(job)
    if cond is None:
        raise FinishTimeUnknown(f"unable to find the status of the finished Job {md.get('namespace')}/{md.get('name')}")
    finished = _time(cond.get("lastTransitionTime"))
    if finished is None:
        raise FinishTimeUnknown(f"unable to find the time when the Job {md.get('namespace')}/{md.get('name')} finished")
    ttl = int((job.get("spec") or {}).get("ttlSecondsAfterFinished") or 0)
    return finished, finished + _dt.timedelta(seconds=ttl)


class TTLAfterFinishedController(Controller):
    """Deletes finished Jobs once their ttlSecondsAfterFinished has passed."""

    def __init__(
        self,
        client: Client,
        factory: SharedInformerFactory | None = None,
        *,
        workers: int = 5,
        clock: Callable[[], _dt.datetime] = utcnow,
        name: str = "ttl-after-finished-controller",
    ) -> None:
        super().__init__(name, client, factory, workers=workers)
        self.clock = clock
        self.job_informer = self.factory.informer_for(JOBS)
        self.jobs = self.add_queue("jobs", self.sync)
        self.job_informer.add_event_handler(self._enqueue, lambda _old, new: self._enqueue(new), None)

    def _enqueue(self, job: Obj) -> None:
        if not md_of(job).get("deletionTimestamp") and needs_cleanup(job):
            self.jobs.add(key_of(job))

    def resync(self) -> None:
        """Look at every Job again (e.g. after a test moved the clock)."""
        for job in self.job_informer.indexer.list():
            self._enqueue(job)

    def _expired(self, job: Obj) -> bool:
        """Whether the TTL has run out; if not, a wake-up is scheduled for then."""
        if md_of(job).get("deletionTimestamp") or not needs_cleanup(job):
            return False
        now = self.clock()
        finished, expire = finish_and_expire_time(job)
        if finished > now:
            log.info("Warning: Found Job finished in the future. This is likely due to time skew in the cluster. "
                     "Job cleanup will be deferred. job=%s", key_of(job))
        left = (expire - now).total_seconds()
        if left <= 0:
            return True
        self.jobs.add_after(key_of(job), left)
        return False

    async def sync(self, key: str) -> None:
        job = self.job_informer.indexer.get_by_key(key)
        if job is None:
            return
        try:
            if not self._expired(job):
                return
            try:
                fresh = await self.client.get(JOBS, name_of(job), ns_of(job))
            except StatusError as err:
                if err.code == 404:
                    return
                raise
            if not self._expired(fresh):
                return
        except FinishTimeUnknown as err:
            log.error("%s", err)
            return
        try:
            await self.client.delete(JOBS, name_of(fresh), ns_of(fresh), propagation_policy="Foreground",
                                     preconditions={"uid": uid_of(fresh)})
        except StatusError as err:
            if err.code != 404:
                raise


__all__ = ["TTLAfterFinishedController", "needs_cleanup"]
