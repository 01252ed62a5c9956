"""DaemonSets through the registry: defaults, the template generation, validation errors."""

from __future__ import annotations

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.inprocess import InProcessClient
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

DS = resource("daemonsets")
NS = "default"
GEN = "deprecated.daemonset.template.generation"


def make_ds(name: str = "agent", **spec) -> dict:
    base = {"selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                         "spec": {"containers": [{"name": "c", "image": "agent:1"}]}}}
    base.update(spec)
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name}, "spec": base}


@pytest.fixture
async def client():
    store = MemoryStore()
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    c = InProcessClient(registry)
    yield c
    await c.close()
    await registry.close()
    await store.close()


async def _invalid(client: InProcessClient, obj: dict) -> list[tuple[str, str]]:
    with pytest.raises(StatusError) as err:
        await client.create(DS, obj, NS)
    assert err.value.code == 422
    assert err.value.message.startswith(f'DaemonSet.apps "{obj["metadata"]["name"]}" is invalid: ')
    return [(c.field, c.message) for c in err.value.causes]


async def test_defaults_initial_status_and_template_generation(client: InProcessClient) -> None:
    ds = await client.create(DS, make_ds(), NS)
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                            "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
    assert ds["spec"]["revisionHistoryLimit"] == 10
    assert ds["spec"]["template"]["spec"]["restartPolicy"] == "Always"
    assert ds["status"] == {"currentNumberScheduled": 0, "numberMisscheduled": 0, "desiredNumberScheduled": 0,
                            "numberReady": 0}
    assert ds["metadata"]["generation"] == 1
    assert ds["metadata"]["annotations"][GEN] == "1"
    # a spec change outside the template: generation bumps, template generation stays
    ds = await client.patch(DS, "agent", {"spec": {"minReadySeconds": 5}}, NS)
    assert (ds["metadata"]["generation"], ds["metadata"]["annotations"][GEN]) == (2, "1")
    # a template change bumps both; a client cannot set the annotation
    ds = await client.patch(DS, "agent", {"metadata": {"annotations": {GEN: "40"}},
                                          "spec": {"template": {"spec": {"containers": [
                                              {"name": "c", "image": "agent:2"}]}}}}, NS)
    assert (ds["metadata"]["generation"], ds["metadata"]["annotations"][GEN]) == (3, "2")
    ds = await client.patch(DS, "agent", {"metadata": {"annotations": {GEN: "1"}}}, NS)
    assert ds["metadata"]["annotations"][GEN] == "2"
    # status is the status endpoint's
    ds = await client.patch(DS, "agent", {"status": {"numberReady": 4}}, NS)
    assert ds["status"]["numberReady"] == 0
    ds = await client.patch(DS, "agent", {"status": {"numberReady": 4}}, NS, subresource="status")
    assert ds["status"]["numberReady"] == 4 and ds["metadata"]["generation"] == 3


async def test_on_delete_gets_no_rolling_update_defaults(client: InProcessClient) -> None:
    ds = await client.create(DS, make_ds(updateStrategy={"type": "OnDelete"}), NS)
    assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}


async def test_unreadable_template_generation_is_a_bad_request(client: InProcessClient) -> None:
    obj = make_ds()
    obj["metadata"]["annotations"] = {GEN: "one"}
    with pytest.raises(StatusError) as err:
        await client.create(DS, obj, NS)
    assert err.value.code == 400
    assert err.value.message == 'strconv.ParseInt: parsing "one": invalid syntax'


async def test_validation_errors_name_the_field(client: InProcessClient) -> None:
    bad = make_ds()
    bad["spec"]["template"]["metadata"]["labels"] = {"app": "other"}
    assert await _invalid(client, bad) == [(
        "spec.template.metadata.labels",
        'Invalid value: map[string]string{"app":"other"}: `selector` does not match template `labels`')]
    bad = make_ds()
    del bad["spec"]["selector"]
    assert ("spec.template.metadata.labels",
            'Invalid value: map[string]string{"app":"agent"}: `selector` does not match template `labels`') in \
        await _invalid(client, bad)
    bad = make_ds(updateStrategy={"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 1}})
    assert await _invalid(client, bad) == [
        ("spec.updateStrategy.rollingUpdate.maxSurge", "Invalid value: 1: may not be set when maxUnavailable is non-zero")]
    bad = make_ds(updateStrategy={"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "0%", "maxSurge": 0}})
    assert await _invalid(client, bad) == [
        ("spec.updateStrategy.rollingUpdate.maxUnavailable", "Required value: cannot be 0 when maxSurge is 0")]
    bad = make_ds(updateStrategy={"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "150%"}})
    assert await _invalid(client, bad) == [
        ("spec.updateStrategy.rollingUpdate.maxUnavailable", 'Invalid value: "150%": must not be greater than 100%')]
    bad = make_ds(updateStrategy={"type": "Sometimes"})
    assert await _invalid(client, bad) == [(
        "spec.updateStrategy",
        'Unsupported value: apps.DaemonSetUpdateStrategy{Type:"Sometimes", RollingUpdate:'
        '(*apps.RollingUpdateDaemonSet)(nil)}: supported values: "RollingUpdate", "OnDelete"')]
    bad = make_ds(minReadySeconds=-1, revisionHistoryLimit=-2)
    assert await _invalid(client, bad) == [
        ("spec.minReadySeconds", "Invalid value: -1: must be greater than or equal to 0"),
        ("spec.revisionHistoryLimit", "Invalid value: -2: must be greater than or equal to 0")]
    bad = make_ds()
    bad["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    bad["spec"]["template"]["spec"]["activeDeadlineSeconds"] = 10
    assert await _invalid(client, bad) == [
        ("spec.template.spec.restartPolicy", 'Unsupported value: "OnFailure": supported values: "Always"'),
        ("spec.template.spec.activeDeadlineSeconds", "Forbidden: activeDeadlineSeconds in DaemonSet is not Supported")]
    bad = make_ds(selector={})
    assert ("spec.selector", "Invalid value: &LabelSelector{MatchLabels:map[string]string{},"
            "MatchExpressions:[]LabelSelectorRequirement{},}: empty selector is invalid for daemonset") in \
        await _invalid(client, bad)


async def test_update_checks(client: InProcessClient) -> None:
    await client.create(DS, make_ds(), NS)
    with pytest.raises(StatusError) as err:
        await client.patch(DS, "agent", {"spec": {"selector": {"matchLabels": {"app": "agent", "x": "y"}},
                                                  "template": {"metadata": {"labels": {"x": "y"}}}}}, NS)
    assert err.value.code == 422
    assert any(c.field == "spec.selector" and "field is immutable" in c.message
               for c in err.value.causes)
    await client.patch(DS, "agent", {"status": {"collisionCount": 2}}, NS, subresource="status")
    with pytest.raises(StatusError) as err:
        await client.patch(DS, "agent", {"status": {"collisionCount": 1}}, NS, subresource="status")
    assert [(c.field, c.message) for c in err.value.causes] == [
        ("status.collisionCount", "Invalid value: 1: cannot be decremented")]
    with pytest.raises(StatusError) as err:
        await client.patch(DS, "agent", {"status": {"numberReady": -1}}, NS, subresource="status")
    assert [(c.field, c.message) for c in err.value.causes] == [
        ("status.numberReady", "Invalid value: -1: must be greater than or equal to 0")]
