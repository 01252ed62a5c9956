"""CronJob controller against a real registry (MemoryStore + InProcessClient + informers),
its clock driven by the test."""

from __future__ import annotations

import datetime as dt

import pytest

from kubeplane.api.cron import load_location
from kubeplane.api.meta import format_time, parse_time, utcnow
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.cronjob import (
    SCHEDULED_TIMESTAMP_ANNOTATION,
    CronJobController,
    most_recent_schedule_time,
    next_schedule_delay,
)
from kubeplane.api.cron import parse_standard
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore
from helpers import eventually, settled

CRONJOBS = resource("cronjobs", "batch")
JOBS = resource("jobs", "batch")
EVENTS = resource("events")
NS = "default"
UTC = dt.timezone.utc


class Clock:
    """The controller's time, set by the test."""

    def __init__(self) -> None:
        self.now = utcnow()

    def __call__(self) -> dt.datetime:
        return self.now

    def set(self, t: dt.datetime) -> None:
        self.now = t


def make_cj(name: str, schedule: str, **spec: object) -> dict:
    body = {
        "schedule": schedule,
        "jobTemplate": {
            "metadata": {"labels": {"team": "a"}, "annotations": {"note": "x"}},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                                           "containers": [{"name": "c", "image": "busybox"}]}}},
        },
    }
    body.update(spec)
    return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name}, "spec": body}


def next_minute(t: dt.datetime) -> dt.datetime:
    return t.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)


def next_hour(t: dt.datetime) -> dt.datetime:
    return t.replace(minute=0, second=0, microsecond=0) + dt.timedelta(hours=1)


class Env:
    def __init__(self, client: InProcessClient, ctrl: CronJobController, clock: Clock) -> None:
        self.client = client
        self.ctrl = ctrl
        self.clock = clock

    async def create(self, cj: dict) -> tuple[dict, dt.datetime]:
        created = await self.client.create(CRONJOBS, cj, NS)
        return created, parse_time(created["metadata"]["creationTimestamp"])

    async def at(self, t: dt.datetime, name: str) -> None:
        """Move the clock to ``t`` and let the controller sync ``name`` there."""
        self.clock.set(t)
        await self.settle()
        self.ctrl.enqueue(f"{NS}/{name}")
        await self.settle()

    async def settle(self) -> None:
        ctrl = self.ctrl
        await settled(ctrl, self.client, (ctrl.cronjob_informer, CRONJOBS), (ctrl.job_informer, JOBS),
                      namespace=NS, delayed=True)

    async def cj(self, name: str) -> dict:
        return await self.client.get(CRONJOBS, name, NS)

    async def jobs(self) -> list[dict]:
        items = (await self.client.list(JOBS, NS))["items"]
        return sorted((j for j in items if not j["metadata"].get("deletionTimestamp")),
                      key=lambda j: j["metadata"]["name"])

    async def events(self, reason: str) -> list[dict]:
        return [e for e in (await self.client.list(EVENTS, NS))["items"] if e["reason"] == reason]

    async def finish(self, job: dict, how: str, *, started: dt.datetime, done: dt.datetime | None = None) -> None:
        """Write a finished Job status as the Job controller would."""
        if how == "Complete":
            conds = [{"type": "SuccessCriteriaMet", "status": "True"}, {"type": "Complete", "status": "True"}]
            status = {"succeeded": 1, "conditions": conds, "startTime": format_time(started),
                      "completionTime": format_time(done or started)}
        else:
            conds = [{"type": "FailureTarget", "status": "True"}, {"type": "Failed", "status": "True"}]
            status = {"failed": 1, "conditions": conds, "startTime": format_time(started)}
        fresh = await self.client.get(JOBS, job["metadata"]["name"], NS)
        fresh["status"] = status
        await self.client.update(JOBS, fresh, subresource="status")


@pytest.fixture
async def env():
    store = MemoryStore(history=2000)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    clock = Clock()
    ctrl = CronJobController(client, clock=clock)
    await ctrl.start(sync_timeout=1)
    yield Env(client, ctrl, clock)
    await ctrl.stop(timeout=1)
    await client.close()
    await registry.close()
    await store.close()


async def _count(env: Env, n: int) -> list[dict] | None:
    jobs = await env.jobs()
    return jobs if len(jobs) == n else None


async def test_starts_a_job_at_the_schedule_time_and_tracks_it(env: Env) -> None:
    cj, created = await env.create(make_cj("hourly", "0 * * * *"))
    h1 = next_hour(created)
    await env.settle()
    # Before the first schedule time: nothing, and a requeue for that time.
    assert await env.jobs() == []
    delay = env.ctrl.requeue_after[f"{NS}/hourly"]
    assert delay == pytest.approx((h1 - env.clock.now).total_seconds() + 0.1, abs=1e-6)

    await env.at(h1 + dt.timedelta(seconds=5), "hourly")
    (job,) = await eventually(lambda: _count(env, 1))
    md = job["metadata"]
    assert md["name"] == f"hourly-{int(h1.timestamp()) // 60}"
    assert md["labels"]["team"] == "a"
    assert md["annotations"] == {"note": "x", SCHEDULED_TIMESTAMP_ANNOTATION: h1.strftime("%Y-%m-%dT%H:%M:%SZ")}
    assert md["ownerReferences"] == [{"apiVersion": "batch/v1", "kind": "CronJob", "name": "hourly",
                                      "uid": cj["metadata"]["uid"], "controller": True,
                                      "blockOwnerDeletion": True}]
    got = await env.cj("hourly")
    assert got["status"]["lastScheduleTime"] == format_time(h1)
    (ref,) = got["status"]["active"]
    assert ref["kind"] == "Job" and ref["apiVersion"] == "batch/v1"
    assert (ref["name"], ref["namespace"], ref["uid"]) == (md["name"], NS, md["uid"])
    (ev,) = await eventually(lambda: env.events("SuccessfulCreate"))
    assert ev["message"] == f"Created job {md['name']}"
    assert ev["involvedObject"]["kind"] == "CronJob"
    # The next requeue aims at the next hour.
    assert env.ctrl.requeue_after[f"{NS}/hourly"] == pytest.approx(3595.1, abs=1e-6)

    # Syncing again at the same time creates nothing more.
    await env.at(h1 + dt.timedelta(seconds=30), "hourly")
    assert len(await env.jobs()) == 1

    # The Job completes: it leaves the active list and sets lastSuccessfulTime.
    done = h1 + dt.timedelta(seconds=40)
    await env.finish(job, "Complete", started=h1, done=done)

    async def completed() -> dict | None:
        c = await env.cj("hourly")
        return c if not c["status"].get("active") and c["status"].get("lastSuccessfulTime") else None

    got = await eventually(completed)
    assert "active" not in got["status"]
    assert got["status"]["lastSuccessfulTime"] == format_time(done)
    (ev,) = await eventually(lambda: env.events("SawCompletedJob"))
    assert ev["message"] == f"Saw completed job: {md['name']}, condition: Complete"


async def test_missed_schedules_start_only_the_most_recent_one(env: Env) -> None:
    _, created = await env.create(make_cj("often", "* * * * *"))
    late = next_minute(created) + dt.timedelta(minutes=9, seconds=20)
    await env.at(late, "often")
    (job,) = await eventually(lambda: _count(env, 1))
    most_recent = late.replace(second=0)
    assert job["metadata"]["name"] == f"often-{int(most_recent.timestamp()) // 60}"
    assert (await env.cj("often"))["status"]["lastScheduleTime"] == format_time(most_recent)


async def test_starting_deadline_skips_a_start_that_is_too_late(env: Env) -> None:
    _, created = await env.create(make_cj("deadline", "0 * * * *", startingDeadlineSeconds=60))
    h1 = next_hour(created)
    await env.at(h1 + dt.timedelta(seconds=120), "deadline")
    assert await env.jobs() == []
    # within the deadline of the next one, it starts
    await env.at(h1 + dt.timedelta(hours=1, seconds=30), "deadline")
    (job,) = await eventually(lambda: _count(env, 1))
    assert job["metadata"]["name"] == f"deadline-{int((h1 + dt.timedelta(hours=1)).timestamp()) // 60}"


async def test_forbid_skips_while_a_job_is_active(env: Env) -> None:
    _, created = await env.create(make_cj("forbid", "* * * * *", concurrencyPolicy="Forbid"))
    m1 = next_minute(created)
    await env.at(m1 + dt.timedelta(seconds=1), "forbid")
    (job1,) = await eventually(lambda: _count(env, 1))
    await env.at(m1 + dt.timedelta(minutes=1, seconds=1), "forbid")
    (ev,) = await eventually(lambda: env.events("JobAlreadyActive"))
    assert ev["type"] == "Normal"
    assert ev["message"] == "Not starting job because prior execution is running and concurrency policy is Forbid"
    assert len(await env.jobs()) == 1
    # Once it completes, the schedule time that was skipped is still the most
    # recent unmet one: its Job starts at once.
    await env.finish(job1, "Complete", started=m1, done=m1 + dt.timedelta(seconds=50))
    jobs = await eventually(lambda: _count(env, 2))
    assert jobs[1]["metadata"]["name"] == f"forbid-{int((m1 + dt.timedelta(minutes=1)).timestamp()) // 60}"


async def test_replace_deletes_the_active_job_first(env: Env) -> None:
    _, created = await env.create(make_cj("replace", "* * * * *", concurrencyPolicy="Replace"))
    m1 = next_minute(created)
    await env.at(m1 + dt.timedelta(seconds=1), "replace")
    (job1,) = await eventually(lambda: _count(env, 1))
    await env.at(m1 + dt.timedelta(minutes=1, seconds=1), "replace")

    async def replaced() -> list[dict] | None:
        jobs = await env.jobs()
        return jobs if [j["metadata"]["name"] for j in jobs] != [job1["metadata"]["name"]] and len(jobs) == 1 \
            else None

    (job2,) = await eventually(replaced)
    (ev,) = await eventually(lambda: env.events("SuccessfulDelete"))
    assert ev["message"] == f"Deleted job {job1['metadata']['name']}"
    active = (await env.cj("replace"))["status"]["active"]
    assert [a["uid"] for a in active] == [job2["metadata"]["uid"]]


async def test_allow_runs_jobs_side_by_side(env: Env) -> None:
    _, created = await env.create(make_cj("allow", "*/5 * * * *"))
    first = created.replace(minute=created.minute - created.minute % 5, second=0, microsecond=0) \
        + dt.timedelta(minutes=5)
    await env.at(first, "allow")
    await eventually(lambda: _count(env, 1))
    await env.at(first + dt.timedelta(minutes=5), "allow")
    await eventually(lambda: _count(env, 2))
    assert len((await env.cj("allow"))["status"]["active"]) == 2


async def test_suspended_cronjob_starts_nothing_until_resumed(env: Env) -> None:
    _, created = await env.create(make_cj("paused", "* * * * *", suspend=True))
    m1 = next_minute(created)
    await env.at(m1 + dt.timedelta(seconds=1), "paused")
    assert await env.jobs() == []
    assert env.ctrl.requeue_after[f"{NS}/paused"] is None
    await env.client.patch(CRONJOBS, "paused", {"spec": {"suspend": False}}, NS)
    await env.at(m1 + dt.timedelta(seconds=2), "paused")
    await eventually(lambda: _count(env, 1))


async def test_history_limits_delete_the_oldest_finished_jobs(env: Env) -> None:
    cj, created = await env.create(make_cj("history", "0 0 1 1 *", successfulJobsHistoryLimit=1,
                                           failedJobsHistoryLimit=0))
    owner = {"apiVersion": "batch/v1", "kind": "CronJob", "name": "history", "uid": cj["metadata"]["uid"],
             "controller": True, "blockOwnerDeletion": True}
    template = cj["spec"]["jobTemplate"]["spec"]
    names = ["history-1", "history-2", "history-3", "history-4"]
    for n in names:
        await env.client.create(JOBS, {"apiVersion": "batch/v1", "kind": "Job",
                                       "metadata": {"name": n, "ownerReferences": [owner]}, "spec": template}, NS)
    jobs = {j["metadata"]["name"]: j for j in await env.jobs()}
    base = created - dt.timedelta(hours=1)
    await env.finish(jobs["history-1"], "Complete", started=base + dt.timedelta(minutes=3))
    await env.finish(jobs["history-2"], "Complete", started=base + dt.timedelta(minutes=1))
    await env.finish(jobs["history-3"], "Complete", started=base + dt.timedelta(minutes=2))
    await env.finish(jobs["history-4"], "Failed", started=base)

    async def kept() -> list[str] | None:
        left = [j["metadata"]["name"] for j in await env.jobs()]
        return left if left == ["history-1"] else None

    await eventually(kept)
    deleted = {e["message"] for e in await eventually(lambda: _n_events(env, "SuccessfulDelete", 3))}
    assert deleted == {"Deleted job history-2", "Deleted job history-3", "Deleted job history-4"}


async def _n_events(env: Env, reason: str, n: int) -> list[dict] | None:
    evs = await env.events(reason)
    return evs if len(evs) >= n else None


async def test_time_zone_schedule_and_annotation(env: Env) -> None:
    ny = load_location("America/New_York")
    _, created = await env.create(make_cj("ny", "0 9 * * *", timeZone="America/New_York"))
    local = created.astimezone(ny)
    nine = local.replace(hour=9, minute=0, second=0, microsecond=0)
    if nine <= local:
        nine = (local + dt.timedelta(days=1)).replace(hour=9, minute=0, second=0, microsecond=0)
    nine = nine.astimezone(UTC).astimezone(ny)  # a real 09:00 New York time, as an instant
    await env.at(nine.astimezone(UTC) - dt.timedelta(seconds=1), "ny")
    assert await env.jobs() == []
    await env.at(nine.astimezone(UTC) + dt.timedelta(seconds=1), "ny")
    (job,) = await eventually(lambda: _count(env, 1))
    stamp = job["metadata"]["annotations"][SCHEDULED_TIMESTAMP_ANNOTATION]
    assert stamp.startswith(nine.strftime("%Y-%m-%dT09:00:00"))
    assert stamp[-6:] in ("-05:00", "-04:00")
    assert parse_time(stamp) == nine


async def test_missing_and_unexpected_jobs(env: Env) -> None:
    cj, created = await env.create(make_cj("watch", "* * * * *"))
    m1 = next_minute(created)
    await env.at(m1 + dt.timedelta(seconds=1), "watch")
    (job,) = await eventually(lambda: _count(env, 1))
    # An active Job deleted behind the controller's back leaves the active list.
    await env.client.delete(JOBS, job["metadata"]["name"], NS, propagation_policy="Background")
    (ev,) = await eventually(lambda: env.events("MissingJob"))
    assert ev["message"] == f"Active job went missing: {job['metadata']['name']}"
    assert "active" not in (await env.cj("watch"))["status"]
    # A Job someone else made for the CronJob (kubectl create job --from=cronjob/watch)
    owner = {"apiVersion": "batch/v1", "kind": "CronJob", "name": "watch", "uid": cj["metadata"]["uid"],
             "controller": True}
    await env.client.create(JOBS, {"apiVersion": "batch/v1", "kind": "Job",
                                   "metadata": {"name": "manual", "ownerReferences": [owner],
                                                "annotations": {"cronjob.kubernetes.io/instantiate": "manual"}},
                                   "spec": cj["spec"]["jobTemplate"]["spec"]}, NS)
    (ev,) = await eventually(lambda: env.events("UnexpectedJob"))
    assert ev["type"] == "Warning"
    assert ev["message"] == "Saw a job that the controller did not create or forgot: manual"


async def test_a_schedule_that_never_fires_is_reported(env: Env) -> None:
    await env.create(make_cj("never", "59 23 31 2 *"))
    (ev,) = await eventually(lambda: env.events("InvalidSchedule"))
    assert ev["message"] == "invalid schedule: 59 23 31 2 * : time difference between two schedules is less than 1 second"
    assert env.ctrl.requeue_after[f"{NS}/never"] is None


def test_most_recent_schedule_time_counts_missed_runs() -> None:
    sched = parse_standard("*/10 * * * *")
    base = dt.datetime(2024, 1, 1, 0, 0, 5, tzinfo=UTC)
    cj = {"metadata": {"creationTimestamp": format_time(base)}, "spec": {}, "status": {}}
    _, recent, missed = most_recent_schedule_time(cj, base + dt.timedelta(minutes=5), sched, True)
    assert (recent, missed.value) == (None, "none")
    _, recent, missed = most_recent_schedule_time(cj, base + dt.timedelta(minutes=15), sched, True)
    assert (recent, missed.value) == (dt.datetime(2024, 1, 1, 0, 10, tzinfo=UTC), "none")
    _, recent, missed = most_recent_schedule_time(cj, base + dt.timedelta(minutes=35), sched, True)
    assert (recent, missed.value) == (dt.datetime(2024, 1, 1, 0, 30, tzinfo=UTC), "few")
    _, recent, missed = most_recent_schedule_time(cj, base + dt.timedelta(days=1), sched, True)
    assert (recent, missed.value) == (dt.datetime(2024, 1, 2, 0, 0, tzinfo=UTC), "many")
    # the last schedule time, not the creation, is where counting starts
    cj["status"]["lastScheduleTime"] = "2024-01-01T23:50:00Z"
    _, recent, missed = most_recent_schedule_time(cj, base + dt.timedelta(days=1), sched, True)
    assert (recent, missed.value) == (dt.datetime(2024, 1, 2, 0, 0, tzinfo=UTC), "none")
    # next requeue: the next schedule time after the most recent one, plus 100 ms
    now = base + dt.timedelta(minutes=35)
    cj["status"] = {"lastScheduleTime": "2024-01-01T00:30:00Z"}
    assert next_schedule_delay(cj, now, sched) == pytest.approx((5 * 60 - 5) + 0.1)


async def test_too_many_missed_start_times_warn_and_start_the_latest(env: Env) -> None:
    _, created = await env.create(make_cj("stuck", "* * * * *"))
    late = next_minute(created) + dt.timedelta(minutes=150, seconds=3)
    await env.at(late, "stuck")
    (ev,) = await eventually(lambda: env.events("TooManyMissedTimes"))
    assert ev["type"] == "Warning"
    assert ev["message"] == ("too many missed start times. Set or decrease .spec.startingDeadlineSeconds or check "
                             "clock skew")
    (job,) = await eventually(lambda: _count(env, 1))
    assert job["metadata"]["name"] == f"stuck-{int(late.replace(second=0).timestamp()) // 60}"


async def test_a_new_schedule_requeues_for_its_first_time(env: Env) -> None:
    _, created = await env.create(make_cj("moved", "0 0 1 1 *"))
    await env.settle()
    delays: list[tuple[str, float]] = []
    real_add_after = env.ctrl.cronjobs.add_after

    def recording_add_after(key: str, delay: float) -> None:
        delays.append((key, delay))
        real_add_after(key, delay)

    env.ctrl.cronjobs.add_after = recording_add_after  # type: ignore[method-assign]
    env.clock.set(created)  # the first */30 time is strictly after this
    await env.client.patch(CRONJOBS, "moved", {"spec": {"schedule": "*/30 * * * *"}}, NS)
    first = created.replace(minute=0 if created.minute < 30 else 30, second=0, microsecond=0) \
        + dt.timedelta(minutes=30)
    want = (first - env.clock.now).total_seconds() + 0.1
    got = await eventually(lambda: [d for k, d in delays if k == f"{NS}/moved"])
    assert got[0] == pytest.approx(want, abs=1e-6)
