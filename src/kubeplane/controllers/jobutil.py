"""What the Job controller computes without the API: completion indexes and
their interval strings, the pod failure policy, the success policy, the pod
failure back-off and the order in which active pods are removed (after
upstream's ``pkg/controller/job``: indexed_job_utils.go, pod_failure_policy.go,
success_policy.go, backoff_utils.go).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import Any, Iterable

from kubeplane.api.meta import parse_time

Obj = dict[str, Any]

JOB_TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
INDEX_FAILURE_COUNT_ANNOTATION = "batch.kubernetes.io/job-index-failure-count"
INDEX_IGNORED_FAILURE_COUNT_ANNOTATION = "batch.kubernetes.io/job-index-ignored-failure-count"
COMPLETION_INDEX_ENV = "JOB_COMPLETION_INDEX"
JOB_CONTROLLER_NAME = "kubernetes.io/job-controller"
UNKNOWN_INDEX = -1
#: the API server's limit for a generateName prefix (63 minus 5 random characters)
MAX_GENERATED_NAME_LENGTH = 58
_INT32_MAX = 2**31 - 1


# ------------------------------------------------------------ small readers


def _md(obj: Obj) -> Obj:
    return obj.get("metadata") or {}


def _status(obj: Obj) -> Obj:
    return obj.get("status") or {}


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _time(value: Any) -> _dt.datetime | None:
    if not value or not isinstance(value, str):
        return None
    try:
        return parse_time(value)
    except ValueError:
        return None


def has_tracking_finalizer(pod: Obj) -> bool:
    return JOB_TRACKING_FINALIZER in (_md(pod).get("finalizers") or [])


def is_indexed(job: Obj) -> bool:
    return (job.get("spec") or {}).get("completionMode") == "Indexed"


def completions_of(job: Obj) -> int | None:
    c = (job.get("spec") or {}).get("completions")
    return None if c is None else _int(c)


def has_backoff_limit_per_index(job: Obj) -> bool:
    return (job.get("spec") or {}).get("backoffLimitPerIndex") is not None


def only_replace_failed_pods(job: Obj) -> bool:
    """podReplacementPolicy Failed (implied by a pod failure policy): a
    replacement waits until the old pod is fully terminal."""
    spec = job.get("spec") or {}
    return spec.get("podReplacementPolicy") == "Failed" or spec.get("podFailurePolicy") is not None


def is_pod_failed(pod: Obj, job: Obj) -> bool:
    """Failed, or (unless only failed pods are replaced) deleted before it ended."""
    phase = _status(pod).get("phase")
    if phase == "Failed":
        return True
    if only_replace_failed_pods(job):
        return False
    return bool(_md(pod).get("deletionTimestamp")) and phase != "Succeeded"


def is_terminating(pod: Obj) -> bool:
    return bool(_md(pod).get("deletionTimestamp")) and _status(pod).get("phase") not in ("Succeeded", "Failed")


def completion_index(pod: Obj) -> int:
    value = (_md(pod).get("annotations") or {}).get(COMPLETION_INDEX_ANNOTATION)
    if value is None:
        return UNKNOWN_INDEX
    try:
        ix = int(value)
    except (TypeError, ValueError):
        return UNKNOWN_INDEX
    return ix if ix >= 0 else UNKNOWN_INDEX


def _count_annotation(pod: Obj, name: str) -> int:
    value = (_md(pod).get("annotations") or {}).get(name)
    if value is None:
        return 0
    n = _int(value, -1)
    return n if 0 <= n <= _INT32_MAX else 0


def index_failure_count(pod: Obj) -> int:
    return _count_annotation(pod, INDEX_FAILURE_COUNT_ANNOTATION)


def index_absolute_failure_count(pod: Obj) -> int:
    return index_failure_count(pod) + _count_annotation(pod, INDEX_IGNORED_FAILURE_COUNT_ANNOTATION)


def pod_generate_name_with_index(job_name: str, index: int) -> str:
    suffix = f"-{index}-"
    prefix = job_name + suffix
    if len(prefix) > MAX_GENERATED_NAME_LENGTH:
        prefix = prefix[:MAX_GENERATED_NAME_LENGTH - len(suffix)] + suffix
    return prefix


# ------------------------------------------------------------- intervals


@dataclass(frozen=True)
class Intervals:
    """Ordered, disjoint, non-adjacent closed intervals of indexes, as
    ``status.completedIndexes`` writes them (``1,3-5,7``)."""

    spans: tuple[tuple[int, int], ...] = ()

    @classmethod
    def parse(cls, text: str | None, completions: int) -> "Intervals":
        """Upstream's parseIndexesFromString: corrupted parts are skipped,
        indexes at or above ``completions`` dropped."""
        if not text:
            return cls()
        out: list[list[int]] = []
        for part in text.split(","):
            limits = part.split("-")
            try:
                first = int(limits[0])
            except ValueError:
                continue
            if first >= completions:
                break
            if len(limits) > 1:
                try:
                    last = int(limits[1])
                except ValueError:
                    continue
                last = min(last, completions - 1)
            else:
                last = first
            if out and out[-1][1] == first - 1:
                out[-1][1] = last
            else:
                out.append([first, last])
        return cls(tuple((a, b) for a, b in out))

    def with_indexes(self, indexes: Iterable[int]) -> "Intervals":
        return self.merge(Intervals(tuple((i, i) for i in sorted(set(indexes)))))

    def merge(self, other: "Intervals") -> "Intervals":
        out: list[list[int]] = []
        for first, last in sorted(self.spans + other.spans):
            if not out or first > out[-1][1] + 1:
                out.append([first, last])
            elif out[-1][1] < last:
                out[-1][1] = last
        return Intervals(tuple((a, b) for a, b in out))

    def total(self) -> int:
        return sum(b - a + 1 for a, b in self.spans)

    def has(self, ix: int) -> bool:
        return any(a <= ix <= b for a, b in self.spans)

    def __bool__(self) -> bool:
        return bool(self.spans)

    def __str__(self) -> str:
        parts = []
        for a, b in self.spans:
            if b == a:
                parts.append(str(a))
            elif b == a + 1:
                parts.append(f"{a},{b}")
            else:
                parts.append(f"{a}-{b}")
        return ",".join(parts)


# ---------------------------------------------------- pod failure policy


@dataclass(frozen=True)
class PolicyMatch:
    """What the pod failure policy says about one failed pod: the FailJob
    message, whether the failure counts towards the back-off limit, and the
    action of the matching rule (None when no rule matched)."""

    message: str | None
    count: bool
    action: str | None


def _terminated(cs: Obj) -> Obj | None:
    t = (cs.get("state") or {}).get("terminated")
    return t if isinstance(t, dict) else None


def _match_exit_codes(status: Obj, req: Obj) -> Obj | None:
    for statuses in (status.get("containerStatuses") or [], status.get("initContainerStatuses") or []):
        for cs in statuses:
            term = _terminated(cs)
            if term is None:
                continue
            if req.get("containerName") not in (None, cs.get("name")):
                continue
            code = _int(term.get("exitCode"))
            if code == 0:
                continue
            values = req.get("values") or []
            op = req.get("operator")
            if (op == "In" and code in values) or (op == "NotIn" and code not in values):
                return cs
    return None


def _match_conditions(status: Obj, patterns: list[Obj]) -> Obj | None:
    for cond in status.get("conditions") or []:
        for pattern in patterns:
            if cond.get("type") == pattern.get("type") and cond.get("status") == (pattern.get("status") or "True"):
                return cond
    return None


def match_pod_failure_policy(policy: Obj | None, pod: Obj) -> PolicyMatch:
    if not policy:
        return PolicyMatch(None, True, None)
    md = _md(pod)
    status = _status(pod)
    for i, rule in enumerate(policy.get("rules") or []):
        action = rule.get("action")
        if rule.get("onExitCodes") is not None:
            cs = _match_exit_codes(status, rule["onExitCodes"])
            if cs is None:
                continue
            if action == "FailJob":
                code = _int((_terminated(cs) or {}).get("exitCode"))
                return PolicyMatch(f"Container {cs.get('name')} for pod {md.get('namespace')}/{md.get('name')} "
                                   f"failed with exit code {code} matching FailJob rule at index {i}", True, action)
        elif rule.get("onPodConditions") is not None:
            cond = _match_conditions(status, rule["onPodConditions"])
            if cond is None:
                continue
            if action == "FailJob":
                return PolicyMatch(f"Pod {md.get('namespace')}/{md.get('name')} has condition {cond.get('type')} "
                                   f"matching FailJob rule at index {i}", True, action)
        else:
            continue
        if action == "Ignore":
            return PolicyMatch(None, False, action)
        if action in ("Count", "FailIndex"):
            return PolicyMatch(None, True, action)
    return PolicyMatch(None, True, None)


# --------------------------------------------------------- success policy


def _overlap_count(rule: Intervals, succeeded: Intervals) -> int:
    n = 0
    for a, b in rule.spans:
        for c, d in succeeded.spans:
            n += max(0, min(b, d) - max(a, c) + 1)
    return n


def match_success_policy(policy: Obj | None, completions: int, succeeded: Intervals) -> str | None:
    """The SuccessCriteriaMet message when a rule of ``policy`` is met."""
    if not policy or not succeeded:
        return None
    for i, rule in enumerate(policy.get("rules") or []):
        count = rule.get("succeededCount")
        if rule.get("succeededIndexes") is not None:
            required = Intervals.parse(rule["succeededIndexes"], completions)
            if not required:
                continue
            contains = _overlap_count(required, succeeded)
            if contains == required.total() or (count is not None and contains >= _int(count)):
                return f"Matched rules at index {i}"
        elif count is not None and succeeded.total() >= _int(count):
            return f"Matched rules at index {i}"
    return None


# ---------------------------------------------------------------- back-off


def finished_time(pod: Obj) -> _dt.datetime:
    """When a pod finished: its containers' latest finishedAt, else the Ready
    condition turning False, else its deletion, else its creation."""
    spec = pod.get("spec") or {}
    status = _status(pod)
    sidecars = {c.get("name") for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"}
    latest: _dt.datetime | None = None
    complete = True
    for cs in list(status.get("containerStatuses") or []) + [
            c for c in status.get("initContainerStatuses") or [] if c.get("name") in sidecars]:
        t = _time((_terminated(cs) or {}).get("finishedAt"))
        if t is None:
            complete = False
            break
        latest = t if latest is None or t > latest else latest
    if complete and latest is not None:
        return latest
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Ready" and cond.get("status") == "False":
            t = _time(cond.get("lastTransitionTime"))
            if t is not None:
                return t
    deleted = _time(_md(pod).get("deletionTimestamp"))
    if deleted is not None:
        return deleted - _dt.timedelta(seconds=_int(_md(pod).get("deletionGracePeriodSeconds")))
    return _time(_md(pod).get("creationTimestamp")) or _dt.datetime.min.replace(tzinfo=_dt.timezone.utc)


@dataclass
class BackoffRecord:
    failures_after_last_success: int = 0
    last_failure_time: _dt.datetime | None = None


def new_backoff_record(old: BackoffRecord | None, succeeded: list[Obj], failed: list[Obj]) -> BackoffRecord:
    """Upstream's newBackoffRecord: failures since the last success and the
    time of the last of them."""
    rec = BackoffRecord(old.failures_after_last_success, old.last_failure_time) if old else BackoffRecord()
    succeeded = sorted(succeeded, key=finished_time)
    failed = sorted(failed, key=finished_time)
    if not succeeded:
        if failed:
            rec.failures_after_last_success += len(failed)
            rec.last_failure_time = finished_time(failed[-1])
        return rec
    rec = BackoffRecord()
    last_success = finished_time(succeeded[-1])
    for pod in reversed(failed):
        t = finished_time(pod)
        if t <= last_success:
            break
        if rec.last_failure_time is None:
            rec.last_failure_time = t
        rec.failures_after_last_success += 1
    return rec


def remaining_backoff(now: _dt.datetime, base: float, maximum: float, failures: int,
                      last_failure: _dt.datetime | None) -> float:
    """Seconds to wait before the next pod: ``base`` doubled per failure after
    the first, at most ``maximum``, counted from the last failure."""
    if failures == 0 or last_failure is None:
        return 0.0
    delay = base
    for _ in range(1, failures):
        delay *= 2
        if delay >= maximum:
            delay = maximum
            break
    elapsed = (now - last_failure).total_seconds()
    return 0.0 if delay < elapsed else delay - elapsed


# --------------------------------------------------------- pods to remove


def _ready_since(pod: Obj) -> _dt.datetime | None:
    for c in _status(pod).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") == "True":
            return _time(c.get("lastTransitionTime"))
    return None


def active_pods_order(pod: Obj) -> tuple:
    """Upstream's controller.ActivePods order (first = removed first):
    unassigned, pending < unknown < running, not ready, lower deletion cost,
    ready for less time, more restarts, created more recently."""
    spec = pod.get("spec") or {}
    status = _status(pod)
    phase = {"Pending": 0, "Unknown": 1, "Running": 2}.get(status.get("phase") or "", 0)
    since = _ready_since(pod)
    cost = _int((_md(pod).get("annotations") or {}).get("controller.kubernetes.io/pod-deletion-cost"))
    restarts = max((_int(c.get("restartCount")) for c in status.get("containerStatuses") or []), default=0)
    created = _time(_md(pod).get("creationTimestamp"))
    # Ready for less time first: a later "since" sorts first (negated timestamp).
    ready_key = -since.timestamp() if since is not None else float("-inf")
    created_key = -created.timestamp() if created is not None else float("-inf")
    return (1 if spec.get("nodeName") else 0, phase, 1 if since is not None else 0, cost, ready_key, -restarts,
            created_key)


def active_pods_for_removal(job: Obj, pods: list[Obj], at_least: int) -> list[Obj]:
    """Pods to remove: for an Indexed Job first those with a duplicate, an
    out-of-range or no index; then the least valuable, up to ``at_least``."""
    rm: list[Obj] = []
    left: list[Obj]
    if is_indexed(job):
        completions = completions_of(job) or 0
        left = []
        by_index: dict[int, list[Obj]] = {}
        for p in pods:
            ix = completion_index(p)
            if ix == UNKNOWN_INDEX or ix >= completions:
                rm.append(p)
            else:
                by_index.setdefault(ix, []).append(p)
        for ix in sorted(by_index):
            group = sorted(by_index[ix], key=active_pods_order)
            rm.extend(group[:-1])
            left.append(group[-1])
    else:
        left = list(pods)
    if len(rm) < at_least:
        left.sort(key=active_pods_order)
        rm.extend(left[:at_least - len(rm)])
    return rm


__all__ = [
    "BackoffRecord", "COMPLETION_INDEX_ANNOTATION", "COMPLETION_INDEX_ENV", "INDEX_FAILURE_COUNT_ANNOTATION",
    "INDEX_IGNORED_FAILURE_COUNT_ANNOTATION", "Intervals", "JOB_TRACKING_FINALIZER", "PolicyMatch",
    "active_pods_for_removal", "completion_index", "finished_time", "match_pod_failure_policy",
    "match_success_policy", "new_backoff_record", "remaining_backoff",
]
