"""TTL-after-finished controller against a real registry, its clock moved by the test."""

from __future__ import annotations

import datetime as dt

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import format_time
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.ttlafterfinished import TTLAfterFinishedController
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore
from helpers import eventually, settled

JOBS = resource("jobs")
NS = "default"
T0 = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> dt.datetime:
        return self.now


@pytest.fixture
async def env():
    store = MemoryStore(history=2000)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    clock = Clock()
    ctrl = TTLAfterFinishedController(client, clock=clock)
    await ctrl.start(sync_timeout=1)
    yield client, ctrl, clock
    await ctrl.stop(timeout=1)
    await client.close()
    await registry.close()
    await store.close()


async def _job(client: InProcessClient, name: str, ttl: int | None, finished: str | None) -> None:
    spec = {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}
    if ttl is not None:
        spec["ttlSecondsAfterFinished"] = ttl
    await client.create(JOBS, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec}, NS)
    if finished:
        stamp = format_time(T0)
        cond = {"type": finished, "status": "True", "lastTransitionTime": stamp, "lastProbeTime": stamp}
        status = {"conditions": [cond], "startTime": stamp}
        if finished == "Complete":
            status["completionTime"] = stamp
        await client.patch(JOBS, name, {"status": status}, NS, subresource="status")


async def _gone(client: InProcessClient, name: str) -> bool:
    """Deleted with Foreground propagation (the garbage collector, not run
    here, would remove the pods and then the Job)."""
    try:
        job = await client.get(JOBS, name, NS)
    except StatusError as err:
        return err.code == 404
    md = job["metadata"]
    return bool(md.get("deletionTimestamp")) and "foregroundDeletion" in (md.get("finalizers") or [])


async def test_finished_jobs_deleted_after_their_ttl(env) -> None:
    client, ctrl, clock = env
    await _job(client, "done", 60, "Complete")
    await _job(client, "broken", 0, "Failed")
    await _job(client, "running", 60, None)
    await _job(client, "kept", None, "Complete")
    await eventually(lambda: _gone(client, "broken"))  # ttl 0: at once
    await settled(ctrl, client, (ctrl.job_informer, JOBS), namespace=NS, delayed=True)
    assert not await _gone(client, "done")
    clock.now = T0 + dt.timedelta(seconds=61)
    ctrl.resync()
    await eventually(lambda: _gone(client, "done"))
    await settled(ctrl, client, (ctrl.job_informer, JOBS), namespace=NS, delayed=True)
    assert not await _gone(client, "running") and not await _gone(client, "kept")
    # A TTL set on a finished Job later counts from when it finished.
    await client.patch(JOBS, "kept", {"spec": {"ttlSecondsAfterFinished": 30}}, NS)
    await eventually(lambda: _gone(client, "kept"))


async def test_fresh_read_decides(env) -> None:
    client, ctrl, clock = env
    await _job(client, "late", 10, "Complete")
    await settled(ctrl, client, (ctrl.job_informer, JOBS), namespace=NS, delayed=True)
    # The TTL grows before it would have expired: the Job stays.
    await client.patch(JOBS, "late", {"spec": {"ttlSecondsAfterFinished": 1000}}, NS)
    clock.now = T0 + dt.timedelta(seconds=11)
    ctrl.resync()
    await settled(ctrl, client, (ctrl.job_informer, JOBS), namespace=NS, delayed=True)
    assert not await _gone(client, "late")


def test_job_controllers_in_the_controller_table() -> None:
    from kubeplane.apiserver.bootstrappolicy import controller_roles
    from kubeplane.cluster import CONTROLLERS
    from kubeplane.controllers.manager import select_controllers

    defs = {d.name: d for d in CONTROLLERS}
    assert (defs["job-controller"].aliases, defs["job-controller"].account) == (("job",), "job-controller")
    ttl = defs["ttl-after-finished-controller"]
    assert (ttl.aliases, ttl.account) == (("ttl-after-finished",), "ttl-after-finished-controller")
    chosen = {d.name for d in select_controllers(CONTROLLERS, ["*", "-job", "-ttl-after-finished"])}
    assert "job-controller" not in chosen and "ttl-after-finished-controller" not in chosen
    assert "replicaset-controller" in chosen
    roles = {r["metadata"]["name"]: r["rules"] for r in controller_roles()}
    assert "system:controller:job-controller" in roles
    assert {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["delete", "get", "list", "watch"]} in \
        roles["system:controller:ttl-after-finished-controller"]
