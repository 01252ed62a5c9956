"""CronJobs, ReplicationControllers and PodTemplates through the registry:
upstream's defaults, validation messages, status and scale, and Table rows."""

from __future__ import annotations

import copy
import datetime as dt

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.apiserver.tables import build_table, column_definitions
from kubeplane.client.inprocess import InProcessClient
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

CRONJOBS = resource("cronjobs", "batch")
RCS = resource("replicationcontrollers", "")
PODTEMPLATES = resource("podtemplates", "")
NS = "default"
NOW = dt.datetime(2026, 11, 29, 12, 0, 0, tzinfo=dt.timezone.utc)


@pytest.fixture
async def client():
    store = MemoryStore(history=500)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    c = InProcessClient(registry)
    yield c
    await c.close()
    await registry.close()
    await store.close()


def cronjob(name: str = "nightly", **spec: object) -> dict:
    body: dict = {
        "schedule": "0 3 * * *",
        "jobTemplate": {"spec": {"template": {"spec": {
            "restartPolicy": "OnFailure", "containers": [{"name": "c", "image": "busybox"}]}}}},
    }
    body.update(spec)
    return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name}, "spec": body}


def rc(name: str = "web", **spec: object) -> dict:
    body: dict = {"template": {"metadata": {"labels": {"app": name}},
                               "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}
    body.update(spec)
    return {"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": name}, "spec": body}


async def invalid(client: InProcessClient, res, obj: dict) -> str:
    with pytest.raises(StatusError) as err:
        await client.create(res, obj, NS)
    assert err.value.code == 422
    return err.value.message


# ---------------------------------------------------------------- CronJob


async def test_cronjob_defaults_and_empty_status(client: InProcessClient) -> None:
    got = await client.create(CRONJOBS, cronjob(), NS)
    spec = got["spec"]
    assert (spec["concurrencyPolicy"], spec["suspend"]) == ("Allow", False)
    assert (spec["successfulJobsHistoryLimit"], spec["failedJobsHistoryLimit"]) == (3, 1)
    assert spec["jobTemplate"]["metadata"] == {}
    pod = spec["jobTemplate"]["spec"]["template"]["spec"]
    assert (pod["dnsPolicy"], pod["schedulerName"], pod["terminationGracePeriodSeconds"]) == (
        "ClusterFirst", "default-scheduler", 30)
    assert got["status"] == {}
    assert got["metadata"]["generation"] == 1
    # a client may not set status on create; a spec change bumps the generation
    body = cronjob("other")
    body["status"] = {"lastScheduleTime": "2020-01-01T00:00:00Z"}
    assert (await client.create(CRONJOBS, body, NS))["status"] == {}
    got = await client.patch(CRONJOBS, "nightly", {"spec": {"suspend": True}}, NS)
    assert got["metadata"]["generation"] == 2


@pytest.mark.parametrize("spec, message", [
    ({"schedule": "61 * * * *"},
     'spec.schedule: Invalid value: "61 * * * *": end of range (61) above maximum (59): 61'),
    ({"schedule": "* * *"},
     'spec.schedule: Invalid value: "* * *": expected exactly 5 fields, found 3: [* * *]'),
    ({"schedule": ""}, "spec.schedule: Required value"),
    ({"schedule": "TZ=UTC 0 3 * * *"},
     'spec.schedule: Invalid value: "TZ=UTC 0 3 * * *": cannot use TZ or CRON_TZ in schedule, use timeZone field '
     "instead"),
    ({"timeZone": "Mars/Olympus"}, 'spec.timeZone: Invalid value: "Mars/Olympus": unknown time zone Mars/Olympus'),
    ({"timeZone": "America/New York"},
     'spec.timeZone: Invalid value: "America/New York": unknown time zone America/New York'),
    ({"timeZone": ""}, 'spec.timeZone: Invalid value: "": timeZone must be nil or non-empty string'),
    ({"timeZone": "Local"},
     'spec.timeZone: Invalid value: "Local": timeZone must be an explicit time zone as defined in '
     "https://www.iana.org/time-zones"),
    ({"concurrencyPolicy": "Sometimes"},
     'spec.concurrencyPolicy: Unsupported value: "Sometimes": supported values: "Allow", "Forbid", "Replace"'),
    ({"startingDeadlineSeconds": -1},
     "spec.startingDeadlineSeconds: Invalid value: -1: must be greater than or equal to 0"),
    ({"successfulJobsHistoryLimit": -2},
     "spec.successfulJobsHistoryLimit: Invalid value: -2: must be greater than or equal to 0"),
])
async def test_cronjob_validation(client: InProcessClient, spec: dict, message: str) -> None:
    text = await invalid(client, CRONJOBS, cronjob(**spec))
    assert text == f'CronJob.batch "nightly" is invalid: {message}'


async def test_cronjob_job_template_checks(client: InProcessClient) -> None:
    body = cronjob()
    tmpl = body["spec"]["jobTemplate"]["spec"]
    tmpl["selector"] = {"matchLabels": {"a": "b"}}
    tmpl["manualSelector"] = True
    tmpl["template"]["spec"].pop("restartPolicy")
    tmpl["backoffLimit"] = -1
    text = await invalid(client, CRONJOBS, body)
    assert "spec.jobTemplate.spec.backoffLimit: Invalid value: -1: must be greater than or equal to 0" in text
    assert ('spec.jobTemplate.spec.template.spec.restartPolicy: Required value: valid values: '
            '"OnFailure", "Never"') in text
    assert "spec.jobTemplate.spec.selector: Invalid value:" in text and "`selector` will be auto-generated" in text
    assert 'spec.jobTemplate.spec.manualSelector: Unsupported value: true: supported values: "nil", "false"' in text
    no_template = cronjob()
    del no_template["spec"]["jobTemplate"]
    assert "spec.jobTemplate.spec.template: Required value" in await invalid(client, CRONJOBS, no_template)


async def test_cronjob_name_length_checked_on_create(client: InProcessClient) -> None:
    name = "a" * 53
    text = await invalid(client, CRONJOBS, cronjob(name))
    assert text == f'CronJob.batch "{name}" is invalid: metadata.name: Invalid value: "{name}": must be no more ' \
                   "than 52 characters"
    assert (await client.create(CRONJOBS, cronjob("a" * 52), NS))["metadata"]["name"] == "a" * 52


async def test_cronjob_update_rechecks_the_spec(client: InProcessClient) -> None:
    await client.create(CRONJOBS, cronjob(timeZone="Europe/Paris"), NS)
    with pytest.raises(StatusError) as err:
        await client.patch(CRONJOBS, "nightly", {"spec": {"schedule": "@sometimes"}}, NS)
    assert err.value.message.endswith('spec.schedule: Invalid value: "@sometimes": unrecognized descriptor: '
                                      "@sometimes")
    got = await client.patch(CRONJOBS, "nightly", {"spec": {"schedule": "@every 2h", "timeZone": "Asia/Tokyo"}}, NS)
    assert got["spec"]["timeZone"] == "Asia/Tokyo"


def test_cronjob_table() -> None:
    obj = {
        "metadata": {"name": "nightly", "namespace": NS, "creationTimestamp": "2026-11-29T11:00:00Z"},
        "spec": {"schedule": "0 3 * * *", "suspend": False, "jobTemplate": {"spec": {"template": {"spec": {
            "containers": [{"name": "a", "image": "busybox"}, {"name": "b", "image": "alpine"}]}}}}},
        "status": {"active": [{"name": "j1"}, {"name": "j2"}], "lastScheduleTime": "2026-11-29T11:55:00Z"},
    }
    cols = [c["name"] for c in column_definitions(CRONJOBS)]
    assert cols == ["Name", "Schedule", "Timezone", "Suspend", "Active", "Last Schedule", "Age", "Containers",
                    "Images", "Selector"]
    row = build_table(CRONJOBS, [obj], now=NOW)["rows"][0]["cells"]
    assert row == ["nightly", "0 3 * * *", "<none>", "False", 2, "5m", "60m", "a,b", "busybox,alpine", "<none>"]
    obj["spec"]["timeZone"] = "Europe/Paris"
    del obj["spec"]["suspend"]
    del obj["status"]
    row = build_table(CRONJOBS, [obj], now=NOW)["rows"][0]["cells"]
    assert row[2:6] == ["Europe/Paris", "<unset>", 0, "<none>"]


# ------------------------------------------------- ReplicationController


async def test_rc_defaults_from_the_template(client: InProcessClient) -> None:
    got = await client.create(RCS, rc(), NS)
    assert got["spec"]["selector"] == {"app": "web"}
    assert got["metadata"]["labels"] == {"app": "web"}
    assert got["spec"]["replicas"] == 1
    assert got["spec"]["template"]["spec"]["restartPolicy"] == "Always"
    assert got["status"] == {"replicas": 0}
    scale = await client.get(RCS, "web", NS, subresource="scale")
    assert scale["kind"] == "Scale" and scale["apiVersion"] == "autoscaling/v1"
    assert scale["spec"] == {"replicas": 1}
    assert scale["status"] == {"replicas": 0, "selector": "app=web"}


async def test_rc_validation(client: InProcessClient) -> None:
    text = await invalid(client, RCS, rc(selector={"app": "other"}))
    assert text == ('ReplicationController "web" is invalid: spec.template.metadata.labels: Invalid value: '
                    'map[string]string{"app":"web"}: `selector` does not match template `labels`')
    body = rc()
    body["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    body["spec"]["template"]["spec"]["activeDeadlineSeconds"] = 5
    body["spec"]["replicas"] = -1
    text = await invalid(client, RCS, body)
    assert "spec.replicas: Invalid value: -1: must be greater than or equal to 0" in text
    assert 'spec.template.spec.restartPolicy: Unsupported value: "OnFailure": supported values: "Always"' in text
    assert ("spec.template.spec.activeDeadlineSeconds: Forbidden: activeDeadlineSeconds in ReplicationController "
            "is not Supported") in text
    bare = {"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": "bare"}, "spec": {}}
    text = await invalid(client, RCS, bare)
    assert text == ('ReplicationController "bare" is invalid: [spec.selector: Required value, '
                    "spec.template: Required value]")
    # the selector is mutable, unlike a ReplicaSet's
    await client.create(RCS, rc(), NS)
    got = await client.patch(RCS, "web", {"spec": {"selector": {"app": "web", "tier": "fe"},
                                                   "template": {"metadata": {"labels": {"tier": "fe"}}}}}, NS)
    assert got["spec"]["selector"] == {"app": "web", "tier": "fe"}


async def test_rc_status_writes_are_checked(client: InProcessClient) -> None:
    got = await client.create(RCS, rc(), NS)
    got["status"] = {"replicas": 1, "readyReplicas": 2, "availableReplicas": 1}
    with pytest.raises(StatusError) as err:
        await client.update(RCS, got, subresource="status")
    assert err.value.message == ('ReplicationController "web" is invalid: status.readyReplicas: Invalid value: 2: '
                                 "cannot be greater than status.replicas")
    got["status"] = {"replicas": 2, "readyReplicas": 2, "availableReplicas": 1, "fullyLabeledReplicas": 2}
    assert (await client.update(RCS, got, subresource="status"))["status"]["readyReplicas"] == 2


def test_rc_table() -> None:
    obj = {"metadata": {"name": "web", "namespace": NS, "creationTimestamp": "2026-11-29T11:58:00Z"},
           "spec": {"replicas": 3, "selector": {"tier": "fe", "app": "web"},
                    "template": {"spec": {"containers": [{"name": "c", "image": "nginx"}]}}},
           "status": {"replicas": 2, "readyReplicas": 1}}
    assert [c["name"] for c in column_definitions(RCS)] == ["Name", "Desired", "Current", "Ready", "Age",
                                                            "Containers", "Images", "Selector"]
    assert build_table(RCS, [obj], now=NOW)["rows"][0]["cells"] == ["web", 3, 2, 1, "2m", "c", "nginx",
                                                                   "app=web,tier=fe"]


# ------------------------------------------------------------ PodTemplate


async def test_pod_template(client: InProcessClient) -> None:
    body = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "tmpl"},
            "template": {"metadata": {"labels": {"b": "2", "a": "1"}},
                         "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}
    got = await client.create(PODTEMPLATES, copy.deepcopy(body), NS)
    assert got["template"]["spec"]["restartPolicy"] == "Always"
    assert got["metadata"]["generation"] == 1
    got = await client.patch(PODTEMPLATES, "tmpl", {"template": {"metadata": {"labels": {"c": "3"}}}}, NS)
    assert got["metadata"]["generation"] == 2
    assert [c["name"] for c in column_definitions(PODTEMPLATES)] == ["Name", "Containers", "Images", "Pod Labels"]
    assert build_table(PODTEMPLATES, [got], now=NOW)["rows"][0]["cells"] == ["tmpl", "c", "nginx", "a=1,b=2,c=3"]
    body["metadata"]["name"] = "empty"
    body["template"]["spec"] = {}
    text = await invalid(client, PODTEMPLATES, body)
    assert text.startswith('PodTemplate "empty" is invalid: template.spec.containers: Required value')
