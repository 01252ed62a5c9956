"""The real kubectl against `kubeplane up`: CronJobs (create, get with upstream's
columns, describe, `create job --from=cronjob/x`, suspend, a schedule that
fires, cascading delete), ReplicationControllers (create, get, describe,
scale, cascading delete) and PodTemplates."""

from __future__ import annotations

import json
import uuid

import pytest

from helpers import eventually_sync


@pytest.fixture
def ns(cluster_kubectl):
    name = f"cj-{uuid.uuid4().hex[:8]}"
    cluster_kubectl("create", "namespace", name)
    yield name
    cluster_kubectl("delete", "namespace", name, "--wait=false", check=False)


def get_json(kubectl, *args: str) -> dict:
    return json.loads(kubectl("get", *args, "-o", "json").out)


def header(out: str) -> list[str]:
    return out.splitlines()[0].split()


def test_cronjob_with_kubectl(cluster_kubectl, ns) -> None:
    k = cluster_kubectl
    # February 31st never comes (upstream's own kubectl tests use this schedule): nothing starts by itself
    k("create", "cronjob", "nightly", "-n", ns, "--image=busybox", "--schedule=59 23 31 2 *", "--", "date")
    out = k("get", "cronjobs", "-n", ns).out
    assert out.splitlines()[0].split() == ["NAME", "SCHEDULE", "TIMEZONE", "SUSPEND", "ACTIVE", "LAST", "SCHEDULE",
                                           "AGE"]
    row = out.splitlines()[1].split()
    assert row[:1] == ["nightly"] and row[1:6] == ["59", "23", "31", "2", "*"]
    assert row[6:10] == ["<none>", "False", "0", "<none>"]
    wide = k("get", "cj", "nightly", "-n", ns, "-o", "wide").out
    assert header(wide)[-3:] == ["CONTAINERS", "IMAGES", "SELECTOR"]
    assert wide.splitlines()[1].split()[-3:] == ["nightly", "busybox", "<none>"]
    cj = get_json(k, "cronjob", "nightly", "-n", ns)
    assert cj["spec"]["concurrencyPolicy"] == "Allow"
    assert cj["spec"]["successfulJobsHistoryLimit"] == 3 and cj["spec"]["failedJobsHistoryLimit"] == 1
    described = k("describe", "cronjob", "nightly", "-n", ns).out
    assert "Schedule:                      59 23 31 2 *" in described
    assert "Concurrency Policy:            Allow" in described

    # A Job from the CronJob's template, owned by it; the controller notices it.
    k("create", "job", "by-hand", "-n", ns, "--from=cronjob/nightly")
    job = get_json(k, "job", "by-hand", "-n", ns)
    assert job["metadata"]["annotations"]["cronjob.kubernetes.io/instantiate"] == "manual"
    (ref,) = job["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"]) == ("CronJob", "nightly", cj["metadata"]["uid"])
    events = eventually_sync(lambda: get_json(k, "events", "-n", ns, "--field-selector",
                                              "reason=UnexpectedJob")["items"], timeout=20)
    assert events[0]["message"] == "Saw a job that the controller did not create or forgot: by-hand"
    invalid = get_json(k, "events", "-n", ns, "--field-selector", "reason=InvalidSchedule")["items"]
    assert invalid[0]["message"] == ("invalid schedule: 59 23 31 2 * : time difference between two schedules is "
                                     "less than 1 second")

    k("patch", "cronjob", "nightly", "-n", ns, "-p", '{"spec":{"suspend":true}}')
    assert k("get", "cj", "nightly", "-n", ns, "--no-headers").out.split()[7] == "True"

    bad = k("create", "cronjob", "bad", "-n", ns, "--image=busybox", "--schedule=61 * * * *", check=False)
    assert bad.rc != 0
    assert bad.err == ('error: failed to create cronjob: CronJob.batch "bad" is invalid: spec.schedule: Invalid '
                       'value: "61 * * * *": end of range (61) above maximum (59): 61\n')

    # Deleting the CronJob deletes the Jobs it owns.
    k("delete", "cronjob", "nightly", "-n", ns)
    eventually_sync(lambda: not get_json(k, "jobs", "-n", ns)["items"], timeout=20)


def test_cronjob_schedule_fires(cluster_kubectl, ns) -> None:
    k = cluster_kubectl
    # Forbid: one Job at a time, whichever minute the test runs in
    k("apply", "-n", ns, "-f", "-", stdin=TICK)

    def started() -> dict | None:
        cj = get_json(k, "cronjob", "tick", "-n", ns)
        return cj if cj.get("status", {}).get("active") else None

    cj = eventually_sync(started, timeout=30)
    (active,) = cj["status"]["active"]
    job = get_json(k, "job", active["name"], "-n", ns)
    assert job["metadata"]["ownerReferences"][0]["name"] == "tick"
    assert job["metadata"]["annotations"]["batch.kubernetes.io/cronjob-scheduled-timestamp"].endswith("Z")
    assert cj["status"]["lastScheduleTime"]
    row = k("get", "cj", "tick", "-n", ns, "--no-headers").out.split()
    assert row[:6] == ["tick", "@every", "2s", "<none>", "False", "1"]
    events = get_json(k, "events", "-n", ns, "--field-selector", "reason=SuccessfulCreate")["items"]
    assert any(e["message"] == f"Created job {active['name']}" and e["source"]["component"] == "cronjob-controller"
               for e in events)
    k("delete", "cronjob", "tick", "-n", ns)
    eventually_sync(lambda: not get_json(k, "jobs", "-n", ns)["items"], timeout=20)


TICK = """\
apiVersion: batch/v1
kind: CronJob
metadata:
  name: tick
spec:
  schedule: "@every 2s"
  concurrencyPolicy: Forbid
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Never
          containers:
          - name: tick
            image: busybox
"""

RC = """\
apiVersion: v1
kind: ReplicationController
metadata:
  name: web
spec:
  replicas: 2
  template:
    metadata:
      labels:
        app: web
    spec:
      containers:
      - name: nginx
        image: nginx:1.27
"""

POD_TEMPLATE = """\
apiVersion: v1
kind: PodTemplate
metadata:
  name: tmpl
template:
  metadata:
    labels:
      app: tmpl
  spec:
    containers:
    - name: c
      image: busybox
"""


def test_replication_controller_with_kubectl(cluster_kubectl, ns) -> None:
    k = cluster_kubectl
    k("apply", "-n", ns, "-f", "-", stdin=RC)
    rc = get_json(k, "rc", "web", "-n", ns)
    assert rc["spec"]["selector"] == {"app": "web"}

    def ready(n: int):
        def check() -> list[str] | None:
            row = k("get", "replicationcontrollers", "web", "-n", ns, "--no-headers").out.split()
            return row if row[1:4] == [str(n)] * 3 else None
        return check

    eventually_sync(ready(2), timeout=30)
    out = k("get", "rc", "-n", ns, "-o", "wide").out
    assert header(out) == ["NAME", "DESIRED", "CURRENT", "READY", "AGE", "CONTAINERS", "IMAGES", "SELECTOR"]
    assert out.splitlines()[1].split()[-3:] == ["nginx", "nginx:1.27", "app=web"]
    pods = get_json(k, "pods", "-n", ns, "-l", "app=web")["items"]
    assert {p["metadata"]["ownerReferences"][0]["kind"] for p in pods} == {"ReplicationController"}
    described = k("describe", "rc", "web", "-n", ns).out
    assert "Selector:     app=web" in described
    assert "2 current / 2 desired" in described

    k("scale", "rc", "web", "-n", ns, "--replicas=3")
    eventually_sync(ready(3), timeout=30)
    assert "replicationcontroller/web" in k("get", "all", "-n", ns, "-o", "name").out

    k("delete", "rc", "web", "-n", ns)
    eventually_sync(lambda: not get_json(k, "pods", "-n", ns, "-l", "app=web")["items"], timeout=30)


def test_pod_template_with_kubectl(cluster_kubectl, ns) -> None:
    k = cluster_kubectl
    k("apply", "-n", ns, "-f", "-", stdin=POD_TEMPLATE)
    out = k("get", "podtemplates", "-n", ns).out
    assert header(out) == ["NAME", "CONTAINERS", "IMAGES", "POD", "LABELS"]
    assert out.splitlines()[1].split() == ["tmpl", "c", "busybox", "app=tmpl"]
    k("delete", "podtemplate", "tmpl", "-n", ns)
    assert "No resources found" in k("get", "podtemplates", "-n", ns).err
