"""Jobs with real kubectl against `kubeplane up` (the shared cluster): the Job
controller runs pods on simulated nodes that finish them after
``kubeplane.io/exit-after``; get/describe show upstream's columns and fields;
deletion cascades to the pods; the TTL controller removes finished Jobs."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from conftest import Kubectl
from helpers import eventually_sync

NS = "job-e2e"


def job_manifest(name: str, *, completions: int = 1, parallelism: int = 1, exit_code: int = 0,
                 **spec) -> str:
    annotations = {"kubeplane.io/exit-after": "1"}
    if exit_code:
        annotations["kubeplane.io/exit-code"] = str(exit_code)
    body = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": NS},
            "spec": {"completions": completions, "parallelism": parallelism, **spec,
                     "template": {"metadata": {"annotations": annotations},
                                  "spec": {"restartPolicy": "Never",
                                           "containers": [{"name": "pi", "image": "perl:5.34"}]}}}}
    return yaml.safe_dump(body)


@pytest.fixture(scope="module")
def kubectl(cluster_kubectl: Kubectl) -> Kubectl:
    cluster_kubectl("create", "namespace", NS)
    yield cluster_kubectl
    cluster_kubectl("delete", "namespace", NS, "--wait=false", check=False)


def _pods(kubectl: Kubectl, job: str) -> list[dict]:
    out = kubectl("get", "pods", "-n", NS, "-l", f"batch.kubernetes.io/job-name={job}", "-o", "json").out
    return json.loads(out)["items"]


def test_job_runs_to_completion_and_cascades_on_delete(kubectl: Kubectl) -> None:
    kubectl("apply", "-f", "-", stdin=job_manifest("pi", completions=3, parallelism=2))
    started = time.monotonic()
    kubectl("wait", "-n", NS, "--for=condition=complete", "job/pi", "--timeout=60s", timeout=90)
    assert time.monotonic() - started < 60
    table = kubectl("get", "job", "pi", "-n", NS).out.splitlines()
    assert table[0].split() == ["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"]
    assert table[1].split()[:3] == ["pi", "Complete", "3/3"]
    wide = kubectl("get", "job", "pi", "-n", NS, "-o", "wide").out.splitlines()
    assert wide[0].split() == ["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE", "CONTAINERS", "IMAGES",
                               "SELECTOR"]
    assert wide[1].split()[5:7] == ["pi", "perl:5.34"]
    assert wide[1].split()[7].startswith("batch.kubernetes.io/controller-uid=")
    job = json.loads(kubectl("get", "job", "pi", "-n", NS, "-o", "json").out)
    st = job["status"]
    assert st["succeeded"] == 3 and st["ready"] == 0 and st["terminating"] == 0
    assert [c["type"] for c in st["conditions"]] == ["SuccessCriteriaMet", "Complete"]
    assert st["uncountedTerminatedPods"] == {} and st["completionTime"] >= st["startTime"]
    described = kubectl("describe", "job", "pi", "-n", NS).out
    for line in ("Parallelism:", "Completions:", "Completion Mode:  NonIndexed", "Start Time:",
                 "Completed At:", "Pods Statuses:    0 Active (0 Ready) / 3 Succeeded / 0 Failed"):
        assert line in described, described
    assert "SuccessfulCreate" in described and "Completed" in described and "Job completed" in described
    pods = _pods(kubectl, "pi")
    assert len(pods) == 3 and all(p["status"]["phase"] == "Succeeded" for p in pods)
    assert all("batch.kubernetes.io/job-tracking" not in (p["metadata"].get("finalizers") or []) for p in pods)
    assert all(p["status"]["containerStatuses"][0]["state"]["terminated"]["reason"] == "Completed" for p in pods)
    kubectl("delete", "job", "pi", "-n", NS)
    eventually_sync(lambda: not _pods(kubectl, "pi"), timeout=30, what="the Job's pods deleted")


def test_failed_job_and_indexed_job_with_ttl(kubectl: Kubectl) -> None:
    kubectl("apply", "-f", "-", stdin=job_manifest("boom", exit_code=3, backoffLimit=0))
    kubectl("apply", "-f", "-", stdin=job_manifest("idx", completions=2, parallelism=2, completionMode="Indexed"))
    kubectl("wait", "-n", NS, "--for=condition=failed", "job/boom", "--timeout=60s", timeout=90)
    row = kubectl("get", "job", "boom", "-n", NS, "--no-headers").out.split()
    assert row[:3] == ["boom", "Failed", "0/1"]
    failed = json.loads(kubectl("get", "job", "boom", "-n", NS, "-o", "json").out)["status"]
    cond = {c["type"]: c for c in failed["conditions"]}["Failed"]
    assert cond["reason"] == "BackoffLimitExceeded" and failed["failed"] == 1
    events = kubectl("get", "events", "-n", NS, "--field-selector", "involvedObject.name=boom").out
    assert "BackoffLimitExceeded" in events
    pod = _pods(kubectl, "boom")[0]
    assert pod["status"]["phase"] == "Failed"
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
    kubectl("wait", "-n", NS, "--for=condition=complete", "job/idx", "--timeout=60s", timeout=90)
    done = json.loads(kubectl("get", "job", "idx", "-n", NS, "-o", "json").out)["status"]
    assert done["completedIndexes"] == "0,1" and done["succeeded"] == 2
    pods = _pods(kubectl, "idx")
    assert sorted(p["spec"]["hostname"] for p in pods) == ["idx-0", "idx-1"]
    assert sorted(p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] for p in pods) == ["0", "1"]
    # A TTL set once finished: the TTL controller deletes the Job with its pods.
    kubectl("patch", "job", "idx", "-n", NS, "--type=merge", "-p", '{"spec":{"ttlSecondsAfterFinished":1}}')
    eventually_sync(lambda: kubectl("get", "job", "idx", "-n", NS, check=False).rc != 0, timeout=60,
                    what="the Job deleted after its TTL")
    eventually_sync(lambda: not _pods(kubectl, "idx"), timeout=30, what="the Job's pods deleted")
