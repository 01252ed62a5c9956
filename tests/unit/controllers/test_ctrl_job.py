"""Job controller against a real registry (MemoryStore + InProcessClient +
informers); the kubelet's part (pods ending) is played by status patches, and
the controller's clock is moved by the tests."""

from __future__ import annotations

import datetime as dt

import pytest

from kubeplane.api.meta import format_time
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.job import JobController
from kubeplane.controllers.jobutil import (
    JOB_TRACKING_FINALIZER,
    Intervals,
    active_pods_for_removal,
    match_pod_failure_policy,
    match_success_policy,
    remaining_backoff,
)
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore
from helpers import eventually, settled

PODS = resource("pods")
JOBS = resource("jobs")
EVENTS = resource("events")
NS = "default"
INDEX = "batch.kubernetes.io/job-completion-index"


class DateClock:
    """A wall clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


def make_job(name: str, **spec) -> dict:
    restart = spec.pop("restartPolicy", "Never")
    body = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"template": {"spec": {"restartPolicy": restart,
                                           "containers": [{"name": "main", "image": "busybox"}]}}, **spec}}
    return body


class Env:
    def __init__(self, client: InProcessClient, ctrl: JobController, clock: DateClock) -> None:
        self.client = client
        self.ctrl = ctrl
        self.clock = clock

    async def pods(self, job: str, *, active_only: bool = False) -> list[dict]:
        items = (await self.client.list(PODS, NS, label_selector=f"batch.kubernetes.io/job-name={job}"))["items"]
        if active_only:
            items = [p for p in items if not p["metadata"].get("deletionTimestamp")
                     and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
        return sorted(items, key=lambda p: p["metadata"]["name"])

    async def n_pods(self, job: str, n: int, **kw) -> list[dict] | bool:
        """The pods once there are ``n`` (True for none)."""
        items = await self.pods(job, **kw)
        if len(items) != n:
            return False
        return items or True

    async def job(self, name: str) -> dict:
        return await self.client.get(JOBS, name, NS)

    async def conditions(self, name: str) -> list[tuple[str, str, str]]:
        st = (await self.job(name)).get("status") or {}
        return [(c["type"], c["status"], c.get("reason", "")) for c in st.get("conditions") or []]

    async def has_condition(self, name: str, type_: str, reason: str | None = None) -> dict | None:
        for c in ((await self.job(name)).get("status") or {}).get("conditions") or []:
            if c["type"] == type_ and c["status"] == "True" and (reason is None or c.get("reason") == reason):
                return c
        return None

    async def finish(self, pod: dict, phase: str = "Succeeded", exit_code: int | None = None,
                     conditions: list[dict] | None = None) -> None:
        """What a kubelet reports when the pod's containers end."""
        code = exit_code if exit_code is not None else (0 if phase == "Succeeded" else 1)
        stamp = format_time(self.clock())
        status = {"phase": phase, "containerStatuses": [{
            "name": "main", "image": "busybox", "imageID": "", "ready": False, "restartCount": 0,
            "state": {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                     "startedAt": stamp, "finishedAt": stamp}}}]}
        if conditions:
            status["conditions"] = conditions
        await self.client.patch(PODS, pod["metadata"]["name"], {"status": status}, NS, subresource="status")

    async def run(self, pod: dict, ready: bool = True) -> None:
        stamp = format_time(self.clock())
        await self.client.patch(PODS, pod["metadata"]["name"], {"status": {
            "phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                                "lastTransitionTime": stamp}]}}, NS, subresource="status")

    async def bind(self, pods: list[dict], node: str = "n1") -> None:
        """Schedule the pods: deleted, they then linger until the kubelet ends them."""
        for p in pods:
            name = p["metadata"]["name"]
            await self.client.create(PODS, {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                                            "target": {"apiVersion": "v1", "kind": "Node", "name": node}},
                                     NS, subresource="binding", name=name)

    async def events(self, reason: str) -> list[dict]:
        return [e for e in (await self.client.list(EVENTS, NS))["items"] if e["reason"] == reason]

    async def settle(self) -> None:
        c = self.ctrl
        await settled(c, self.client, (c.pod_informer, PODS), (c.job_informer, JOBS), namespace=NS, delayed=True)


@pytest.fixture
async def env():
    store = MemoryStore(history=5000)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    clock = DateClock()
    ctrl = JobController(client, clock=clock, sync_batch_period=0)
    await ctrl.start(sync_timeout=1)
    yield Env(client, ctrl, clock)
    await ctrl.stop(timeout=1)
    await client.close()
    await registry.close()
    await store.close()


# ------------------------------------------------------------------ helpers


def test_intervals_parse_merge_and_format() -> None:
    iv = Intervals.parse("0,2-4,7", 10)
    assert str(iv) == "0,2-4,7" and iv.total() == 5
    assert str(iv.with_indexes([1, 5, 9])) == "0-5,7,9"
    assert str(Intervals().with_indexes([3, 4])) == "3,4"
    assert str(Intervals.parse("1-20", 5)) == "1-4"
    assert str(Intervals.parse("x,3", 5)) == "3"
    assert not Intervals.parse("", 3) and Intervals.parse("2", 3).has(2) and not iv.has(5)


def _failed_pod(code: int, conditions: list[dict] | None = None) -> dict:
    return {"metadata": {"name": "p", "namespace": "ns"},
            "status": {"phase": "Failed", "conditions": conditions or [], "containerStatuses": [
                {"name": "main", "state": {"terminated": {"exitCode": code}}}]}}


def test_pod_failure_policy_rules_in_order() -> None:
    policy = {"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}},
        {"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [1]}},
    ]}
    m = match_pod_failure_policy(policy, _failed_pod(42))
    assert m.action == "FailJob" and m.count
    assert m.message == "Container main for pod ns/p failed with exit code 42 matching FailJob rule at index 1"
    ignored = match_pod_failure_policy(policy, _failed_pod(42, [{"type": "DisruptionTarget", "status": "True"}]))
    assert ignored.action == "Ignore" and not ignored.count
    assert match_pod_failure_policy(policy, _failed_pod(3)).action == "Count"
    assert match_pod_failure_policy(policy, _failed_pod(1)).action is None
    cond = match_pod_failure_policy({"rules": [{"action": "FailJob", "onPodConditions": [
        {"type": "ConfigIssue", "status": "True"}]}]}, _failed_pod(1, [{"type": "ConfigIssue", "status": "True"}]))
    assert cond.message == "Pod ns/p has condition ConfigIssue matching FailJob rule at index 0"


def test_success_policy_and_backoff() -> None:
    policy = {"rules": [{"succeededIndexes": "0-2", "succeededCount": 2}, {"succeededCount": 4}]}
    assert match_success_policy(policy, 5, Intervals.parse("0", 5)) is None
    assert match_success_policy(policy, 5, Intervals.parse("0,2", 5)) == "Matched rules at index 0"
    assert match_success_policy(policy, 5, Intervals.parse("0,3-4,1", 5)) == "Matched rules at index 0"
    assert match_success_policy({"rules": [{"succeededCount": 4}]}, 5,
                                Intervals.parse("0,2-4", 5)) == "Matched rules at index 0"
    t0 = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
    assert remaining_backoff(t0, 10, 600, 0, None) == 0
    assert remaining_backoff(t0 + dt.timedelta(seconds=4), 10, 600, 1, t0) == 6
    assert remaining_backoff(t0 + dt.timedelta(seconds=4), 10, 600, 3, t0) == 36
    assert remaining_backoff(t0, 10, 600, 30, t0) == 600


def test_pods_for_removal_prefer_duplicates_and_unready() -> None:
    def pod(name: str, ix: int | None, ready: bool) -> dict:
        ann = {INDEX: str(ix)} if ix is not None else {}
        return {"metadata": {"name": name, "annotations": ann, "creationTimestamp": "2030-01-01T00:00:00Z"},
                "spec": {"nodeName": "n"}, "status": {"phase": "Running", "conditions": [
                    {"type": "Ready", "status": "True" if ready else "False",
                     "lastTransitionTime": "2030-01-01T00:00:00Z"}]}}
    job = {"spec": {"completionMode": "Indexed", "completions": 3}}
    pods = [pod("a", 0, True), pod("b", 0, False), pod("c", 5, True), pod("d", None, True), pod("e", 1, True)]
    assert sorted(p["metadata"]["name"] for p in active_pods_for_removal(job, pods, 0)) == ["b", "c", "d"]
    plain = {"spec": {}}
    assert [p["metadata"]["name"] for p in active_pods_for_removal(plain, pods[:2], 1)] == ["b"]


# --------------------------------------------------------------- NonIndexed


async def test_runs_completions_with_parallelism_and_tracking(env: Env) -> None:
    job = await env.client.create(JOBS, make_job("pi", completions=3, parallelism=2), NS)
    uid = job["metadata"]["uid"]
    pods = await eventually(lambda: env.n_pods("pi", 2))
    for p in pods:
        md = p["metadata"]
        assert md["generateName"] == "pi-"
        assert JOB_TRACKING_FINALIZER in md["finalizers"]
        assert md["ownerReferences"] == [{"apiVersion": "batch/v1", "kind": "Job", "name": "pi", "uid": uid,
                                          "controller": True, "blockOwnerDeletion": True}]
        assert md["labels"]["batch.kubernetes.io/controller-uid"] == uid
    got = await eventually(lambda: _status(env, "pi", active=2, ready=0, terminating=0))
    assert got["status"]["startTime"] == format_time(env.clock())
    assert got["status"]["uncountedTerminatedPods"] == {}
    await env.run(pods[0])
    await eventually(lambda: _status(env, "pi", active=2, ready=1))
    await env.finish(pods[0])
    # Counted once: a replacement starts, the finished pod loses its finalizer.
    await eventually(lambda: _status(env, "pi", succeeded=1, active=2))
    done = await env.client.get(PODS, pods[0]["metadata"]["name"], NS)
    assert JOB_TRACKING_FINALIZER not in (done["metadata"].get("finalizers") or [])
    env.clock.advance(5)
    for p in await env.pods("pi", active_only=True):
        await env.finish(p)
    final = await eventually(lambda: env.has_condition("pi", "Complete", "CompletionsReached"))
    assert final["message"] == "Reached expected number of succeeded pods"
    job = await env.job("pi")
    st = job["status"]
    assert st["succeeded"] == 3 and "active" not in st and "failed" not in st
    assert st["completionTime"] == final["lastTransitionTime"] == format_time(env.clock())
    assert [c["type"] for c in st["conditions"]] == ["SuccessCriteriaMet", "Complete"]
    assert len(await env.pods("pi")) == 3
    assert [e["message"] for e in await env.events("Completed")] == ["Job completed"]
    created = await env.events("SuccessfulCreate")
    assert len(created) == 3 and all(e["message"].startswith("Created pod: pi-") for e in created)


async def test_without_completions_first_success_ends_the_job(env: Env) -> None:
    await env.client.create(JOBS, make_job("work", parallelism=2), NS)
    pods = await eventually(lambda: env.n_pods("work", 2))
    await env.finish(pods[0])
    await eventually(lambda: _status(env, "work", succeeded=1, active=1))
    await env.settle()
    assert len(await env.pods("work")) == 2  # no new pod once one succeeded
    await env.finish(pods[1])
    await eventually(lambda: env.has_condition("work", "Complete"))
    assert (await env.job("work"))["status"]["succeeded"] == 2


# ---------------------------------------------------------------- failures


async def test_backoff_limit_with_exponential_pod_backoff(env: Env) -> None:
    await env.client.create(JOBS, make_job("flaky", backoffLimit=1), NS)
    first = (await eventually(lambda: env.n_pods("flaky", 1)))[0]
    await env.finish(first, "Failed")
    await eventually(lambda: _status(env, "flaky", failed=1))
    # Back-off: no replacement for 10 s of controller time.
    await env.settle()
    assert len(await env.pods("flaky")) == 1
    env.clock.advance(11)
    env.ctrl.resync()
    second = await eventually(lambda: _new_pod(env, "flaky", {first["metadata"]["name"]}))
    await env.finish(second, "Failed")
    failed = await eventually(lambda: env.has_condition("flaky", "Failed", "BackoffLimitExceeded"))
    assert failed["message"] == "Job has reached the specified backoff limit"
    st = (await env.job("flaky"))["status"]
    assert st["failed"] == 2 and [c["type"] for c in st["conditions"]] == ["FailureTarget", "Failed"]
    assert "completionTime" not in st
    ev = await env.events("BackoffLimitExceeded")
    assert ev and ev[0]["type"] == "Warning" and ev[0]["message"] == "Job has reached the specified backoff limit"


async def test_pod_failure_policy_fail_job_ignore_and_count(env: Env) -> None:
    policy = {"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
        {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}},
    ]}
    await env.client.create(JOBS, make_job("pfp", completions=2, parallelism=2, podFailurePolicy=policy), NS)
    job = await env.job("pfp")
    assert job["spec"]["podReplacementPolicy"] == "Failed"
    pods = await eventually(lambda: env.n_pods("pfp", 2))
    await env.bind(pods)
    # A disrupted pod is ignored: not counted towards the limit, replaced after the back-off.
    await env.finish(pods[0], "Failed", 137, [{"type": "DisruptionTarget", "status": "True"}])
    await eventually(lambda: _without_finalizer(env, pods[0]["metadata"]["name"]))
    env.clock.advance(11)
    env.ctrl.resync()
    third = await eventually(lambda: _new_pod(env, "pfp", {p["metadata"]["name"] for p in pods}))
    await env.bind([third])
    st = (await env.job("pfp"))["status"]
    assert "failed" not in st
    await env.finish(third, "Failed", 42)
    # FailureTarget at once; the other active pod is deleted, and once the
    # kubelet reports it Failed the Job is Failed.
    target = await eventually(lambda: env.has_condition("pfp", "FailureTarget", "PodFailurePolicy"))
    assert target["message"] == (f"Container main for pod {NS}/{third['metadata']['name']} failed with exit "
                                 "code 42 matching FailJob rule at index 1")
    await eventually(lambda: _status(env, "pfp", terminating=1))
    assert await env.has_condition("pfp", "Failed") is None
    await env.finish(pods[1], "Failed", 143)
    cond = await eventually(lambda: env.has_condition("pfp", "Failed", "PodFailurePolicy"))
    assert cond["message"] == target["message"]
    st = (await env.job("pfp"))["status"]
    assert st["failed"] == 2 and st["terminating"] == 0
    assert [c["type"] for c in st["conditions"]] == ["FailureTarget", "Failed"]
    assert st["conditions"][0]["reason"] == "PodFailurePolicy"


async def test_failure_target_waits_for_terminating_pods(env: Env) -> None:
    await env.client.create(JOBS, make_job("dl", parallelism=2, completions=4, backoffLimit=0,
                                           podReplacementPolicy="Failed"), NS)
    pods = await eventually(lambda: env.n_pods("dl", 2))
    await env.bind(pods)
    await env.finish(pods[0], "Failed")
    # FailureTarget first; the other pod is being deleted but not yet terminal.
    await eventually(lambda: env.has_condition("dl", "FailureTarget", "BackoffLimitExceeded"))
    await eventually(lambda: _status(env, "dl", terminating=1))
    assert await env.has_condition("dl", "Failed") is None
    await env.finish(pods[1], "Failed", 143)
    await eventually(lambda: env.has_condition("dl", "Failed", "BackoffLimitExceeded"))
    st = (await env.job("dl"))["status"]
    assert st["terminating"] == 0 and st["failed"] == 2


async def test_active_deadline(env: Env) -> None:
    await env.client.create(JOBS, make_job("slow", activeDeadlineSeconds=30), NS)
    await eventually(lambda: env.n_pods("slow", 1))
    env.clock.advance(31)
    env.ctrl.resync()
    cond = await eventually(lambda: env.has_condition("slow", "Failed", "DeadlineExceeded"))
    assert cond["message"] == "Job was active longer than specified deadline"
    # The running pod was deleted and counted as failed.
    st = (await env.job("slow"))["status"]
    assert st["failed"] == 1 and "active" not in st
    assert [c["type"] for c in st["conditions"]] == ["FailureTarget", "Failed"]


async def test_restart_policy_on_failure_counts_restarts(env: Env) -> None:
    await env.client.create(JOBS, make_job("crash", backoffLimit=2, restartPolicy="OnFailure"), NS)
    pod = (await eventually(lambda: env.n_pods("crash", 1)))[0]
    await env.client.patch(PODS, pod["metadata"]["name"], {"status": {"phase": "Running", "containerStatuses": [
        {"name": "main", "image": "busybox", "imageID": "", "ready": False, "restartCount": 2,
         "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}}, NS, subresource="status")
    await eventually(lambda: env.has_condition("crash", "Failed", "BackoffLimitExceeded"))


# ------------------------------------------------------------------ Indexed


async def test_indexed_job_indexes_env_hostname_and_completed_indexes(env: Env) -> None:
    await env.client.create(JOBS, make_job("idx", completions=3, parallelism=3, completionMode="Indexed"), NS)
    pods = await eventually(lambda: env.n_pods("idx", 3))
    by_index = {p["metadata"]["annotations"][INDEX]: p for p in pods}
    assert sorted(by_index) == ["0", "1", "2"]
    p1 = by_index["1"]
    assert p1["metadata"]["labels"][INDEX] == "1"
    assert p1["metadata"]["generateName"] == "idx-1-"
    assert p1["spec"]["hostname"] == "idx-1"
    env_var = p1["spec"]["containers"][0]["env"]
    assert {"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
        "apiVersion": "v1", "fieldPath": f"metadata.labels['{INDEX}']"}}} in env_var
    await env.finish(p1)
    await env.finish(by_index["2"])
    got = await eventually(lambda: _status(env, "idx", succeeded=2, active=1))
    assert got["status"]["completedIndexes"] == "1,2"
    # A failed index is retried with a pod of the same index.
    await env.finish(by_index["0"], "Failed")
    env.clock.advance(11)
    env.ctrl.resync()
    retry = await eventually(lambda: _new_pod(env, "idx", {p["metadata"]["name"] for p in pods}))
    assert retry["metadata"]["annotations"][INDEX] == "0"
    await env.finish(retry)
    await eventually(lambda: env.has_condition("idx", "Complete"))
    st = (await env.job("idx"))["status"]
    assert st["completedIndexes"] == "0-2" and st["succeeded"] == 3 and st["failed"] == 1


async def test_backoff_limit_per_index_and_max_failed_indexes(env: Env) -> None:
    await env.client.create(JOBS, make_job("bpi", completions=4, parallelism=4, completionMode="Indexed",
                                           backoffLimitPerIndex=1, maxFailedIndexes=1), NS)
    job = await env.job("bpi")
    assert job["spec"]["backoffLimit"] == 2147483647
    pods = {p["metadata"]["annotations"][INDEX]: p for p in await eventually(lambda: env.n_pods("bpi", 4))}
    assert pods["0"]["metadata"]["annotations"]["batch.kubernetes.io/job-index-failure-count"] == "0"
    await env.finish(pods["0"], "Failed")
    env.clock.advance(11)
    env.ctrl.resync()
    retry = await eventually(lambda: _new_pod(env, "bpi", {p["metadata"]["name"] for p in pods.values()}))
    assert retry["metadata"]["annotations"][INDEX] == "0"
    assert retry["metadata"]["annotations"]["batch.kubernetes.io/job-index-failure-count"] == "1"
    await env.finish(retry, "Failed")
    got = await eventually(lambda: _status(env, "bpi", failed=2))
    assert got["status"]["failedIndexes"] == "0"
    assert await env.has_condition("bpi", "Failed") is None  # one failed index is allowed
    await env.finish(pods["1"])
    await env.finish(pods["2"], "Failed")
    env.clock.advance(11)
    env.ctrl.resync()
    retry2 = await eventually(lambda: _new_pod(env, "bpi", {p["metadata"]["name"] for p in pods.values()}
                                               | {retry["metadata"]["name"]}))
    await env.finish(retry2, "Failed")
    cond = await eventually(lambda: env.has_condition("bpi", "Failed", "MaxFailedIndexesExceeded"))
    assert cond["message"] == "Job has exceeded the specified maximal number of failed indexes"
    st = (await env.job("bpi"))["status"]
    assert st["failedIndexes"] == "0,2" and st["completedIndexes"] == "1"


async def test_fail_index_action(env: Env) -> None:
    policy = {"rules": [{"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [3]}}]}
    await env.client.create(JOBS, make_job("fi", completions=2, parallelism=2, completionMode="Indexed",
                                           backoffLimitPerIndex=5, podFailurePolicy=policy), NS)
    pods = {p["metadata"]["annotations"][INDEX]: p for p in await eventually(lambda: env.n_pods("fi", 2))}
    await env.finish(pods["0"], "Failed", 3)
    await env.finish(pods["1"])
    cond = await eventually(lambda: env.has_condition("fi", "Failed", "FailedIndexes"))
    assert cond["message"] == "Job has failed indexes"
    st = (await env.job("fi"))["status"]
    assert st["failedIndexes"] == "0" and st["completedIndexes"] == "1"


async def test_success_policy_ends_job_early(env: Env) -> None:
    policy = {"rules": [{"succeededIndexes": "0"}]}
    await env.client.create(JOBS, make_job("leader", completions=3, parallelism=3, completionMode="Indexed",
                                           successPolicy=policy), NS)
    listed = await eventually(lambda: env.n_pods("leader", 3))
    await env.bind(listed)
    pods = {p["metadata"]["annotations"][INDEX]: p for p in listed}
    await env.finish(pods["0"])
    met = await eventually(lambda: env.has_condition("leader", "SuccessCriteriaMet", "SuccessPolicy"))
    assert met["message"] == "Matched rules at index 0"
    # The other pods are deleted; once terminal the Job is Complete.
    await eventually(lambda: _status(env, "leader", terminating=2))
    for ix in ("1", "2"):
        await env.finish(pods[ix], "Failed", 143)
    done = await eventually(lambda: env.has_condition("leader", "Complete", "SuccessPolicy"))
    assert done["message"] == "Matched rules at index 0"
    st = (await env.job("leader"))["status"]
    assert st["completedIndexes"] == "0" and st["succeeded"] == 1
    assert [c["type"] for c in st["conditions"]] == ["SuccessCriteriaMet", "Complete"]


# ------------------------------------------------ suspend and replacement


async def test_suspend_and_resume(env: Env) -> None:
    await env.client.create(JOBS, make_job("later", suspend=True, parallelism=2, completions=2), NS)
    cond = await eventually(lambda: env.has_condition("later", "Suspended", "JobSuspended"))
    assert cond["message"] == "Job suspended"
    await env.settle()
    assert await env.pods("later") == []
    assert "startTime" not in (await env.job("later"))["status"]
    env.clock.advance(60)
    await env.client.patch(JOBS, "later", {"spec": {"suspend": False}}, NS)
    await eventually(lambda: env.n_pods("later", 2))
    await eventually(lambda: _has_cond_status(env, "later", "Suspended", "False", "JobResumed"))
    assert (await env.job("later"))["status"]["startTime"] == format_time(env.clock())
    # Suspending a running Job deletes its pods (they are not counted as failed).
    await env.client.patch(JOBS, "later", {"spec": {"suspend": True}}, NS)
    await eventually(lambda: env.n_pods("later", 0, active_only=True))
    await eventually(lambda: env.has_condition("later", "Suspended"))
    st = (await env.job("later"))["status"]
    assert "failed" not in st and "active" not in st
    assert [e["message"] for e in await env.events("Resumed")] == ["Job resumed"]


async def test_pod_replacement_policy(env: Env) -> None:
    await env.client.create(JOBS, make_job("rep", podReplacementPolicy="Failed"), NS)
    pod = (await eventually(lambda: env.n_pods("rep", 1)))[0]
    await env.bind([pod])
    await env.client.delete(PODS, pod["metadata"]["name"], NS)
    await eventually(lambda: _status(env, "rep", terminating=1))
    await env.settle()
    assert len(await env.pods("rep")) == 1  # no replacement while it terminates
    await env.finish(pod, "Failed", 143)
    env.clock.advance(11)  # the failure's back-off
    env.ctrl.resync()
    await eventually(lambda: _new_pod(env, "rep", {pod["metadata"]["name"]}))
    # TerminatingOrFailed (the default): replaced as soon as it is deleted.
    await env.client.create(JOBS, make_job("eager"), NS)
    first = (await eventually(lambda: env.n_pods("eager", 1)))[0]
    await env.bind([first])
    await env.client.delete(PODS, first["metadata"]["name"], NS)
    await eventually(lambda: _status(env, "eager", failed=1))
    env.clock.advance(11)
    env.ctrl.resync()
    await eventually(lambda: _new_pod(env, "eager", {first["metadata"]["name"]}))


async def test_deleted_job_releases_pod_finalizers_and_adopts_orphans(env: Env) -> None:
    await env.client.create(JOBS, make_job("gone", parallelism=2, completions=2), NS)
    pods = await eventually(lambda: env.n_pods("gone", 2))
    await env.client.delete(JOBS, "gone", NS, propagation_policy="Orphan")
    for p in pods:
        await eventually(lambda p=p: _without_finalizer(env, p["metadata"]["name"]))
    # An orphan matching a Job's selector is adopted, with the finalizer.
    body = make_job("adopt", manualSelector=True, selector={"matchLabels": {"app": "a"}})
    body["spec"]["template"]["metadata"] = {"labels": {"app": "a"}}
    await env.client.create(PODS, {"metadata": {"name": "stray", "labels": {"app": "a"}},
                                   "spec": {"restartPolicy": "Never",
                                            "containers": [{"name": "main", "image": "busybox"}]}}, NS)
    created = await env.client.create(JOBS, body, NS)
    stray = await eventually(lambda: _owned(env, "stray", created["metadata"]["uid"]))
    assert JOB_TRACKING_FINALIZER in stray["metadata"]["finalizers"]
    await env.settle()
    assert (await env.job("adopt"))["status"]["active"] == 1


async def _status(env: Env, name: str, **want: int) -> dict | None:
    job = await env.job(name)
    st = job.get("status") or {}
    return job if all(st.get(k, 0) == v for k, v in want.items()) else None


async def _has_cond_status(env: Env, name: str, type_: str, status: str, reason: str) -> bool:
    return (type_, status, reason) in await env.conditions(name)


async def _new_pod(env: Env, job: str, known: set[str]) -> dict | None:
    fresh = [p for p in await env.pods(job, active_only=True) if p["metadata"]["name"] not in known]
    return fresh[0] if fresh else None


async def _without_finalizer(env: Env, name: str) -> bool:
    try:
        pod = await env.client.get(PODS, name, NS)
    except Exception:  # noqa: BLE001 - gone is fine too
        return True
    return JOB_TRACKING_FINALIZER not in (pod["metadata"].get("finalizers") or [])


async def _owned(env: Env, name: str, uid: str) -> dict | None:
    pod = await env.client.get(PODS, name, NS)
    refs = pod["metadata"].get("ownerReferences") or []
    return pod if any(r["uid"] == uid for r in refs) else None


async def test_pod_that_stops_matching_is_released_and_replaced(env: Env) -> None:
    job = await env.client.create(JOBS, make_job("rel"), NS)
    uid = job["metadata"]["uid"]
    pod = (await eventually(lambda: env.n_pods("rel", 1)))[0]
    name = pod["metadata"]["name"]
    await env.client.patch(PODS, name, {"metadata": {"labels": {"batch.kubernetes.io/controller-uid": "other"}}},
                           NS)

    async def released() -> dict | None:
        p = await env.client.get(PODS, name, NS)
        md = p["metadata"]
        gone = not any(r["uid"] == uid for r in md.get("ownerReferences") or [])
        return p if gone and JOB_TRACKING_FINALIZER not in (md.get("finalizers") or []) else None

    await eventually(released)  # no owner, and the orphan's tracking finalizer removed

    async def replaced() -> bool:
        owned = [p for p in (await env.client.list(PODS, NS))["items"]
                 if any(r["uid"] == uid for r in p["metadata"].get("ownerReferences") or [])]
        return len(owned) == 1 and owned[0]["metadata"]["name"] != name

    await eventually(replaced)


async def test_delete_without_a_policy_orphans_the_pods(env: Env) -> None:
    """batch/v1's default garbage collection policy is Orphan (upstream keeps it for old clients)."""
    await env.client.create(JOBS, make_job("old", parallelism=2, completions=2), NS)
    pods = await eventually(lambda: env.n_pods("old", 2))
    await env.client.delete(JOBS, "old", NS)
    job = await env.job("old")
    assert job["metadata"]["deletionTimestamp"] and job["metadata"]["finalizers"] == ["orphan"]
    for p in pods:  # a Job being deleted lets go of its pods' tracking finalizers
        await eventually(lambda p=p: _without_finalizer(env, p["metadata"]["name"]))
    await env.client.delete(JOBS, "old", NS, propagation_policy="Background")
    assert (await env.job("old"))["metadata"]["finalizers"] == ["orphan"]  # already terminating: unchanged
