"""Simulated nodes end containers after kubeplane.io/exit-after with
kubeplane.io/exit-code, as a kubelet reports it, on the agent's clock."""

from __future__ import annotations

import datetime as dt

import pytest

from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.nodeagent import NodeAgent, restart_backoff
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore
from helpers import eventually, settled

PODS = resource("pods")
NS = "default"


class Clock:
    def __init__(self) -> None:
        self.now = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


@pytest.fixture
async def env():
    store = MemoryStore(history=2000)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    clock = Clock()
    agent = NodeAgent(client, ["sim-0"], clock=clock, heartbeat_interval=3600)
    await agent.start(sync_timeout=1)
    yield client, agent, clock
    await agent.stop(timeout=1)
    await client.close()
    await registry.close()
    await store.close()


async def _pod(client, name: str, restart: str, after: str | None, code: str | None = None) -> None:
    ann = {}
    if after is not None:
        ann["kubeplane.io/exit-after"] = after
    if code is not None:
        ann["kubeplane.io/exit-code"] = code
    await client.create(PODS, {"metadata": {"name": name, "annotations": ann}, "spec": {
        "nodeName": "sim-0", "restartPolicy": restart,
        "containers": [{"name": "main", "image": "busybox"}]}}, NS)


async def _phase(client, name: str, phase: str) -> dict | None:
    pod = await client.get(PODS, name, NS)
    return pod if pod["status"].get("phase") == phase else None


async def test_exit_code_and_restart_policy(env) -> None:
    client, agent, clock = env
    await _pod(client, "ok", "Never", "5")
    await _pod(client, "bad", "Never", "5", "3")
    await _pod(client, "retry", "OnFailure", "5", "1")
    await _pod(client, "forever", "Always", None)
    for name in ("ok", "bad", "retry", "forever"):
        await eventually(lambda name=name: _phase(client, name, "Running"))
    clock.advance(4)
    agent.resync_pods()
    started = clock.now
    clock.advance(1)
    agent.resync_pods()
    ok = await eventually(lambda: _phase(client, "ok", "Succeeded"))
    term = ok["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 0 and term["reason"] == "Completed"
    assert term["finishedAt"] == "2030-01-01T00:00:05Z" and term["startedAt"] == "2030-01-01T00:00:00Z"
    ready = {c["type"]: c for c in ok["status"]["conditions"]}["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "PodCompleted"
    bad = await eventually(lambda: _phase(client, "bad", "Failed"))
    term = bad["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 3 and term["reason"] == "Error"
    assert {c["type"]: c for c in bad["status"]["conditions"]}["Ready"]["reason"] == "PodFailed"
    # OnFailure with a non-zero code: back-off, then the container runs again.
    async def backing_off():
        pod = await client.get(PODS, "retry", NS)
        cs = pod["status"]["containerStatuses"][0]
        return pod if "waiting" in cs["state"] else None
    retry = await backing_off() or await eventually(backing_off)
    cs = retry["status"]["containerStatuses"][0]
    assert retry["status"]["phase"] == "Running"
    assert cs["state"]["waiting"]["reason"] == "CrashLoopBackOff" and cs["lastState"]["terminated"]["exitCode"] == 1
    assert cs["restartCount"] == 0 and restart_backoff(0) == 10
    clock.advance(10)
    agent.resync_pods()

    async def restarted():
        pod = await client.get(PODS, "retry", NS)
        cs = pod["status"]["containerStatuses"][0]
        return cs if cs["restartCount"] == 1 and "running" in cs["state"] else None
    cs = await eventually(restarted)
    assert cs["state"]["running"]["startedAt"] == "2030-01-01T00:00:15Z"
    assert started  # the other pods keep running without exit-after
    assert (await client.get(PODS, "forever", NS))["status"]["phase"] == "Running"


async def test_deleted_pod_reported_failed_before_it_goes(env) -> None:
    client, agent, clock = env
    await _pod(client, "victim", "Always", None)
    await eventually(lambda: _phase(client, "victim", "Running"))
    await client.patch(PODS, "victim", {"metadata": {"finalizers": ["example.com/hold"]}}, NS)
    await client.delete(PODS, "victim", NS)
    pod = await eventually(lambda: _phase(client, "victim", "Failed"))
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 143 and term["reason"] == "Error"
    await client.patch(PODS, "victim", {"metadata": {"finalizers": None}}, NS)

    async def gone():
        return not [p for p in (await client.list(PODS, NS))["items"] if p["metadata"]["name"] == "victim"]
    await eventually(gone)


async def test_unusable_annotations_are_reported_on_the_pod(env) -> None:
    client, agent, clock = env
    await _pod(client, "odd", "Never", "soon")
    await _pod(client, "code", "Never", "0", "three")
    await eventually(lambda: _phase(client, "odd", "Running"))
    failed = await eventually(lambda: _phase(client, "code", "Failed"))
    assert failed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 1
    events = resource("events")

    async def warned() -> list[str]:
        return sorted(e["message"] for e in (await client.list(events, NS))["items"]
                      if e["reason"] == "InvalidAnnotation")
    msgs = await eventually(lambda: _two(warned()))
    assert msgs == ["kubeplane.io/exit-after 'soon' is not a number of seconds: the containers keep running",
                    "kubeplane.io/exit-code 'three' is not an integer: the containers exit with 1"]
    clock.advance(3600)
    agent.resync_pods()
    await settled(agent, client, (agent._pods, PODS), namespace=NS, delayed=True)
    assert (await client.get(PODS, "odd", NS))["status"]["phase"] == "Running"


async def _two(coro):
    msgs = await coro
    return msgs if len(msgs) == 2 else None
