"""install(): DRA validation wired into the API server's validation."""

from __future__ import annotations

import pytest

from kubeplane.api import validation
from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.inprocess import InProcessClient
from kubeplane.dra.validation import DRA_RESOURCES, install, installed, validate_resource
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

CLASSES = resource("deviceclasses")
CLAIMS = resource("resourceclaims")
SLICES = resource("resourceslices")


@pytest.fixture
def restore_validators():
    saved = {k: list(v) for k, v in validation.extra_validators.items()}
    yield
    validation.extra_validators.clear()
    validation.extra_validators.update(saved)


@pytest.fixture
async def client(restore_validators):
    store = MemoryStore(history=50)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    c = InProcessClient(registry)
    yield c
    await c.close()
    await registry.close()
    await store.close()


def test_install_is_idempotent(restore_validators) -> None:
    install()
    install()
    assert installed()
    for q in DRA_RESOURCES:
        assert validation.extra_validators[q].count(validate_resource) == 1


async def test_bad_cel_rejected_with_field_after_install(client) -> None:
    bad = {"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": "device.driver =="}}]}}
    for q in DRA_RESOURCES:
        validation.extra_validators.pop(q, None)
    assert not installed()
    bad_before = {**bad, "metadata": {"name": "before"}}
    assert (await client.create(CLASSES, bad_before))["metadata"]["name"] == "before"  # not compiled yet
    install()
    with pytest.raises(StatusError) as exc:
        await client.create(CLASSES, bad)
    err = exc.value
    assert err.code == 422
    fields = [c["field"] for c in err.to_status()["details"]["causes"]]
    assert fields == ["spec.selectors[0].cel.expression"]
    good = {"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": 'device.driver == "a.b"'}}]}}
    assert (await client.create(CLASSES, good))["metadata"]["name"] == "gpu"


async def test_claim_selector_compiled_and_causes_not_duplicated(client) -> None:
    install()
    claim = {"metadata": {"name": "c"}, "spec": {"devices": {"requests": [{"name": "r", "exactly": {
        "deviceClassName": "", "selectors": [{"cel": {"expression": "1 +"}}]}}]}}}
    with pytest.raises(StatusError) as exc:
        await client.create(CLAIMS, claim, "default")
    fields = sorted(c["field"] for c in exc.value.to_status()["details"]["causes"])
    assert fields == ["spec.devices.requests[0].exactly.deviceClassName",
                      "spec.devices.requests[0].exactly.selectors[0].cel.expression"]
    dup = {"metadata": {"name": "s"}, "spec": {
        "driver": "d.example.com", "nodeName": "n", "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": "a"}, {"name": "a"}]}}
    with pytest.raises(StatusError) as exc:
        await client.create(SLICES, dup)
    assert [c["field"] for c in exc.value.to_status()["details"]["causes"]] == ["spec.devices[1].name"]
