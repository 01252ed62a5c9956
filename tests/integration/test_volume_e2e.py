"""Volume binding end to end: races for the last PV, a scheduler restart in the
middle of binding (both over an in-process registry, so every stored version
can be checked), and ``kubectl`` against ``kubeplane up``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, ResourceInfo, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.pv import DEFAULT_PROVISIONER, LocalProvisioner, PersistentVolumeController
from kubeplane.volume.matching import ANN_SELECTED_NODE, hostname_affinity, pinned_hostnames
from kubeplane.registry.registry import Registry
from kubeplane.scheduler.scheduler import Scheduler
from kubeplane.storage.interface import Event
from kubeplane.storage.memory import MemoryStore

from conftest import Kubectl, start_server
from helpers import eventually, eventually_sync as _wait

PODS = resource("pods")
NODES = resource("nodes")
PVS = resource("persistentvolumes")
PVCS = resource("persistentvolumeclaims")
SCS = resource("storageclasses")
NS = "default"


def node(name: str) -> dict:
    alloc = {"cpu": "4", "memory": "8Gi", "pods": "110"}
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"capacity": alloc, "allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]}}


def storage_class(name: str, provisioner: str) -> dict:
    return {"metadata": {"name": name}, "provisioner": provisioner, "volumeBindingMode": "WaitForFirstConsumer",
            "reclaimPolicy": "Delete"}


def claim(name: str, cls: str, size: str = "1Gi") -> dict:
    return {"metadata": {"name": name}, "spec": {"storageClassName": cls, "accessModes": ["ReadWriteOnce"],
                                                 "resources": {"requests": {"storage": size}}}}


def pod(name: str, claim_name: str, scheduler: str = "default-scheduler") -> dict:
    return {"metadata": {"name": name}, "spec": {
        "schedulerName": scheduler,
        "containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "10m"}}}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}]}}


def static_pv(name: str, cls: str, node_name: str, size: str = "1Gi") -> dict:
    return {"metadata": {"name": name}, "spec": {
        "capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"], "storageClassName": cls,
        "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": f"/data/{name}"},
        "nodeAffinity": hostname_affinity(node_name)}}


async def stored_history(store: MemoryStore, res: ResourceInfo, after: int) -> list[Event]:
    """Every change the store made under ``res`` after revision ``after``: a watch from that
    revision replays the store's change log (nothing is compacted with this history size)."""
    w = store.watch(res.storage_prefix(), after)
    events: list[Event] = []
    try:
        while batch := await w.next_batch(timeout=0.01):
            events.extend(batch)
    finally:
        w.close()
    assert all(a.revision < b.revision for a, b in zip(events, events[1:]))
    return events


def claim_ref_key(pv: dict) -> str | None:
    ref = (pv.get("spec") or {}).get("claimRef")
    if not ref:
        return None
    return f"{ref.get('namespace')}/{ref.get('name')}/{ref.get('uid') or ''}"


def assert_no_pv_bound_twice(events: list[Event]) -> dict[str, str]:
    """claimRef of every stored PV version never moves from one claim to another, and no
    claim is referenced by two PVs at once. Returns PV name -> claim namespace/name."""
    first_ref: dict[str, str] = {}  # PV key -> "ns/name" of the first claim it referenced
    live: dict[str, str] = {}  # PV key -> "ns/name" now
    for ev in events:
        if ev.type == "DELETED":
            live.pop(ev.key, None)
            continue
        ref = claim_ref_key(ev.value)
        if ref is None:
            live.pop(ev.key, None)
            continue
        who = ref.rsplit("/", 1)[0]
        if ev.key in first_ref:
            assert first_ref[ev.key] == who, f"{ev.key} moved from {first_ref[ev.key]} to {who} (rev {ev.revision})"
        first_ref[ev.key] = who
        live[ev.key] = who
        holders = [k for k, v in live.items() if v == who]
        assert len(holders) == 1, f"claim {who} referenced by {holders} at revision {ev.revision}"
    return {k.rsplit("/", 1)[1]: v for k, v in live.items()}


async def pod_condition(client: InProcessClient, name: str) -> str | None:
    """The PodScheduled=False message, once the scheduler has written one."""
    p = await client.get(PODS, name, NS)
    cond = next((x for x in (p.get("status") or {}).get("conditions") or () if x["type"] == "PodScheduled"), None)
    return cond["message"] if cond and cond["status"] == "False" else None


class Env:
    """A registry with two nodes; schedulers and volume controllers started on demand."""

    def __init__(self) -> None:
        self.store = MemoryStore(history=100_000)
        self.registry = Registry(self.store, CATALOGUE)
        self.client = InProcessClient(self.registry)
        self.start_rev = 0
        self.factory: SharedInformerFactory | None = None
        self.controllers: list[Any] = []
        self.schedulers: list[tuple[Scheduler, asyncio.Task]] = []

    async def setup(self) -> None:
        await ensure_default_namespaces(self.registry)
        for n in ("n1", "n2"):
            await self.client.create(NODES, node(n))
        self.start_rev = self.store.revision

    async def start_volume_controllers(self) -> None:
        self.factory = SharedInformerFactory(self.client)
        self.controllers = [PersistentVolumeController(self.client, self.factory, resync_period=0),
                            LocalProvisioner(self.client, self.factory)]
        for c in self.controllers:
            await c.start(sync_timeout=2)

    async def stop_volume_controllers(self) -> None:
        for c in reversed(self.controllers):
            await c.stop(timeout=1)
        self.controllers = []
        if self.factory is not None:
            await self.factory.stop()
            self.factory = None

    async def pvs_available(self, *names: str) -> bool:
        phases = [(await self.client.get(PVS, n)).get("status", {}).get("phase") for n in names]
        return phases == ["Available"] * len(names)

    def start_scheduler(self, client: Any = None, name: str = "default-scheduler") -> Scheduler:
        sched = Scheduler(client or self.client, profiles=[{"schedulerName": name}],
                          pod_initial_backoff=0.05, pod_max_backoff=0.2)
        self.schedulers.append((sched, asyncio.create_task(sched.run())))
        return sched

    async def crash_scheduler(self, sched: Scheduler) -> None:
        """Stop a scheduler the way a killed process stops: in-flight binding cycles are
        abandoned where they are (no Unreserve, no status write), then everything ends."""
        for t in list(sched._binding_tasks):
            t.cancel()
        await self.stop_scheduler(sched)

    async def stop_scheduler(self, sched: Scheduler) -> None:
        for i, (s, task) in enumerate(self.schedulers):
            if s is sched:
                await s.stop()
                await asyncio.wait_for(task, 5)
                del self.schedulers[i]
                return

    async def close(self) -> None:
        for s, task in list(self.schedulers):
            await s.stop()
            await asyncio.wait_for(task, 5)
        await self.stop_volume_controllers()
        await self.client.close()
        await self.registry.close()
        await self.store.close()

    async def node_of(self, pod_name: str) -> str | None:
        return (await self.client.get(PODS, pod_name, NS))["spec"].get("nodeName")

    async def bound_pvc(self, name: str) -> dict | None:
        c = await self.client.get(PVCS, name, NS)
        return c if (c.get("status") or {}).get("phase") == "Bound" else None

    async def pv_history(self) -> list[Event]:
        return await stored_history(self.store, PVS, self.start_rev)


@pytest.fixture
async def env():
    e = Env()
    await e.setup()
    try:
        yield e
    finally:
        await e.close()


class PVWriteBarrier:
    """Holds every PV write until ``parties`` writers are waiting, then lets them all through."""

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.waiting = 0
        self.open = asyncio.Event()

    async def arrive(self) -> None:
        if self.open.is_set():
            return
        self.waiting += 1
        if self.waiting >= self.parties:
            self.open.set()
        await asyncio.wait_for(self.open.wait(), 5)


class BarrierClient:
    """A client whose PersistentVolume updates pass through a :class:`PVWriteBarrier`."""

    def __init__(self, inner: InProcessClient, barrier: PVWriteBarrier) -> None:
        self.inner = inner
        self.barrier = barrier
        self.pv_results: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def update(self, res: ResourceInfo, obj: dict, **kw: Any) -> dict:
        if res.plural != "persistentvolumes":
            return await self.inner.update(res, obj, **kw)
        await self.barrier.arrive()
        try:
            out = await self.inner.update(res, obj, **kw)
        except StatusError as err:
            self.pv_results.append(f"{err.code}")
            raise
        self.pv_results.append("ok")
        return out


# ---------------------------------------------------------------- the race for the last PV


async def test_two_schedulers_race_for_the_last_pv(env: Env) -> None:
    """Two schedulers both assume the only matching PV for their own pod; the PV writes are
    held until both are in PreBind, so one write must lose with a Conflict. The loser is
    retried, stays pending with the binder's reason, and runs once a new PV appears."""
    c = env.client
    await c.create(SCS, storage_class("static", "kubernetes.io/no-provisioner"))
    await c.create(PVS, static_pv("last", "static", "n1"))
    await env.start_volume_controllers()
    await eventually(lambda: env.pvs_available("last"))
    barrier = PVWriteBarrier(2)
    clients = {name: BarrierClient(c, barrier) for name in ("sched-a", "sched-b")}
    for name, cl in clients.items():
        env.start_scheduler(cl, name)
    for p, cl, sched in (("pa", "ca", "sched-a"), ("pb", "cb", "sched-b")):
        await c.create(PVCS, claim(cl, "static"), NS)
        await c.create(PODS, pod(p, cl, sched), NS)

    async def one_running() -> str | None:
        nodes = {p: await env.node_of(p) for p in ("pa", "pb")}
        placed = [p for p, n in nodes.items() if n]
        return placed[0] if len(placed) == 1 else None

    winner = await eventually(one_running)
    loser, loser_claim = ("pb", "cb") if winner == "pa" else ("pa", "ca")
    winner_claim = "ca" if winner == "pa" else "cb"
    assert await env.node_of(winner) == "n1"
    await eventually(lambda: env.bound_pvc(winner_claim))
    # Both PreBinds wrote the same PV version: exactly one write won, the other got 409.
    results = sorted(clients["sched-a"].pv_results[:1] + clients["sched-b"].pv_results[:1])
    assert results == ["409", "ok"]
    msg = await eventually(lambda: _message_containing(c, loser, "persistent volumes to bind"))
    assert msg.startswith("0/2 nodes are available:")
    assert "didn't find available persistent volumes to bind" in msg
    assert await env.node_of(loser) is None
    assert (await c.get(PVCS, loser_claim, NS))["status"].get("phase") == "Pending"
    # A new matching PV is created: the loser is rescheduled onto its node.
    await c.create(PVS, static_pv("late", "static", "n2"))
    assert await eventually(lambda: env.node_of(loser)) == "n2"
    await eventually(lambda: env.bound_pvc(loser_claim))
    final = assert_no_pv_bound_twice(await env.pv_history())
    assert final == {"last": f"{NS}/{winner_claim}", "late": f"{NS}/{loser_claim}"}


async def test_many_pods_race_for_fewer_pvs(env: Env) -> None:
    """Six pods, four PVs: exactly four pods run, each on its PV's node; two stay pending
    with the binder's reason; no stored PV version ever re-points its claimRef."""
    c = env.client
    await c.create(SCS, storage_class("static", "kubernetes.io/no-provisioner"))
    for i in range(4):
        await c.create(PVS, static_pv(f"pv{i}", "static", f"n{i % 2 + 1}"))
    await env.start_volume_controllers()
    env.start_scheduler()
    for i in range(6):
        await c.create(PVCS, claim(f"c{i}", "static"), NS)
        await c.create(PODS, pod(f"p{i}", f"c{i}"), NS)

    async def placed() -> dict[str, str] | None:
        out = {f"p{i}": await env.node_of(f"p{i}") for i in range(6)}
        done = {p: n for p, n in out.items() if n}
        return done if len(done) == 4 else None

    running = await eventually(placed)
    pending = sorted({f"p{i}" for i in range(6)} - set(running))
    for p in pending:
        msg = await eventually(lambda: _message_containing(c, p, "persistent volumes to bind"))
        assert "2 node(s) didn't find available persistent volumes to bind" in msg
    for p, host in running.items():
        pvc = await eventually(lambda: env.bound_pvc(f"c{p[1:]}"))
        pv = await c.get(PVS, pvc["spec"]["volumeName"])
        assert pinned_hostnames(pv) == {host}
    final = assert_no_pv_bound_twice(await env.pv_history())
    assert sorted(final.values()) == sorted(f"{NS}/c{p[1:]}" for p in running)
    assert [await env.node_of(p) for p in pending] == [None, None]


async def _message_containing(client: InProcessClient, pod_name: str, text: str) -> str | None:
    msg = await pod_condition(client, pod_name)
    return msg if msg and text in msg else None


# ---------------------------------------------------------------- a restart in the middle of binding


async def test_scheduler_restart_mid_static_binding(env: Env) -> None:
    """The first scheduler writes PV.claimRef and waits in PreBind for the PV controller,
    which is not running; it dies there. A new scheduler must finish the job on the node
    of the PV already pre-bound to the claim (not bind the other free PV)."""
    c = env.client
    await c.create(SCS, storage_class("static", "kubernetes.io/no-provisioner"))
    await c.create(PVS, static_pv("pv-n1", "static", "n1"))
    await c.create(PVS, static_pv("pv-n2", "static", "n2"))
    await c.create(PVCS, claim("data", "static"), NS)
    # The PV controller makes the new PVs Available (the scheduler only considers
    # Available PVs), then is held stopped so the scheduler's PreBind has to wait.
    await env.start_volume_controllers()
    await eventually(lambda: env.pvs_available("pv-n1", "pv-n2"))
    await env.stop_volume_controllers()
    first = env.start_scheduler()
    await c.create(PODS, pod("app", "data"), NS)

    async def prebound() -> str | None:
        for name in ("pv-n1", "pv-n2"):
            pv = await c.get(PVS, name)
            if claim_ref_key(pv):
                return name
        return None

    chosen = await eventually(prebound)
    # PreBind is waiting for the PV controller: the pod is not bound, the claim Pending.
    await asyncio.sleep(0.1)
    assert await env.node_of("app") is None
    assert (await c.get(PVCS, "data", NS))["status"].get("phase") == "Pending"
    await env.crash_scheduler(first)
    env.start_scheduler()
    await asyncio.sleep(0.1)  # the new scheduler runs its cycle; PreBind waits again
    await env.start_volume_controllers()
    host = await eventually(lambda: env.node_of("app"))
    pvc = await eventually(lambda: env.bound_pvc("data"))
    assert pvc["spec"]["volumeName"] == chosen
    assert pinned_hostnames(await c.get(PVS, chosen)) == {host}
    other = "pv-n2" if chosen == "pv-n1" else "pv-n1"
    other_pv = await c.get(PVS, other)
    assert claim_ref_key(other_pv) is None and other_pv["status"]["phase"] == "Available"
    assert assert_no_pv_bound_twice(await env.pv_history()) == {chosen: f"{NS}/data"}


async def test_scheduler_restart_mid_dynamic_provisioning(env: Env) -> None:
    """The first scheduler writes the selected-node annotation and dies while waiting for
    the provisioner. The new scheduler keeps that node; exactly one PV is provisioned."""
    c = env.client
    await c.create(SCS, storage_class("local", DEFAULT_PROVISIONER))
    await c.create(PVCS, claim("data", "local"), NS)
    first = env.start_scheduler()
    await c.create(PODS, pod("app", "data"), NS)

    async def selected() -> str | None:
        return ((await c.get(PVCS, "data", NS))["metadata"].get("annotations") or {}).get(ANN_SELECTED_NODE)

    chosen = await eventually(selected)
    await env.crash_scheduler(first)
    assert await env.node_of("app") is None
    env.start_scheduler()
    await asyncio.sleep(0.1)
    await env.start_volume_controllers()
    assert await eventually(lambda: env.node_of("app")) == chosen
    pvc = await eventually(lambda: env.bound_pvc("data"))
    assert pvc["metadata"]["annotations"][ANN_SELECTED_NODE] == chosen
    pvs = (await c.list(PVS))["items"]
    assert [pv["metadata"]["name"] for pv in pvs] == [pvc["spec"]["volumeName"]]
    assert pinned_hostnames(pvs[0]) == {chosen}
    created = [ev for ev in await env.pv_history() if ev.type == "ADDED"]
    assert len(created) == 1
    assert assert_no_pv_bound_twice(await env.pv_history()) == {pvs[0]["metadata"]["name"]: f"{NS}/data"}


# ---------------------------------------------------------------- kubectl against kubeplane up


MANIFEST = """
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: local-wffc
provisioner: kubeplane.io/local
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: data
spec:
  storageClassName: local-wffc
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 2Gi
---
apiVersion: v1
kind: Pod
metadata:
  name: app
spec:
  containers:
  - name: app
    image: nginx
    volumeMounts:
    - name: data
      mountPath: /data
  volumes:
  - name: data
    persistentVolumeClaim:
      claimName: data
"""


@pytest.fixture(scope="module")
def up_cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("up-volumes")
    srv = start_server(tmp, command="up", extra=["--nodes", "3"])
    try:
        yield srv, Kubectl(srv.kubeconfig, tmp / "home")
    finally:
        srv.stop()


def test_kubectl_wait_for_first_consumer(up_cluster) -> None:
    srv, kubectl = up_cluster
    out = kubectl("apply", "-f", "-", stdin=MANIFEST).out
    assert "storageclass.storage.k8s.io/local-wffc created" in out
    assert "persistentvolumeclaim/data created" in out and "pod/app created" in out

    def running() -> dict | None:
        p = json.loads(kubectl("get", "pod", "app", "-o", "json").out)
        return p if (p.get("status") or {}).get("phase") == "Running" else None

    p = _wait(running)
    pvc = _wait(lambda: (lambda o: o if o["status"].get("phase") == "Bound" else None)(
        json.loads(kubectl("get", "pvc", "data", "-o", "json").out)))
    pv_name = pvc["spec"]["volumeName"]
    pv = json.loads(kubectl("get", "pv", pv_name, "-o", "json").out)
    terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    pinned = {v for t in terms for e in t.get("matchExpressions") or () for v in e.get("values") or ()}
    assert pinned == {p["spec"]["nodeName"]}
    assert pvc["metadata"]["annotations"][ANN_SELECTED_NODE] == p["spec"]["nodeName"]

    table = kubectl("get", "pv,pvc").out
    blocks = [b for b in table.strip().split("\n\n") if b.strip()]
    assert len(blocks) == 2, table
    pv_lines, pvc_lines = (b.splitlines() for b in blocks)
    pv_header = ["NAME", "CAPACITY", "ACCESS", "MODES", "RECLAIM", "POLICY", "STATUS", "CLAIM", "STORAGECLASS",
                 "VOLUMEATTRIBUTESCLASS", "REASON", "AGE"]
    pvc_header = ["NAME", "STATUS", "VOLUME", "CAPACITY", "ACCESS", "MODES", "STORAGECLASS",
                  "VOLUMEATTRIBUTESCLASS", "AGE"]
    assert pv_lines[0].split() == pv_header, pv_lines[0]
    assert pvc_lines[0].split() == pvc_header, pvc_lines[0]
    assert len(pv_lines) == 2 and len(pvc_lines) == 2, table
    # ``kubectl get pv,pvc`` prefixes names with the resource when listing several kinds.
    pv_row = pv_lines[1].split()
    assert pv_row[0] == f"persistentvolume/{pv_name}"
    assert pv_row[1:] [:5] == ["2Gi", "RWO", "Delete", "Bound", "default/data"]
    assert pv_row[6:8] == ["local-wffc", "<unset>"]
    pvc_row = pvc_lines[1].split()
    assert pvc_row[:7] == ["persistentvolumeclaim/data", "Bound", pv_name, "2Gi", "RWO", "local-wffc", "<unset>"]
    kubectl("delete", "pod", "app", "--wait", "--timeout=20s")
    kubectl("delete", "pvc", "data", "--wait", "--timeout=20s")
    # reclaimPolicy Delete: the provisioned PV goes away with its claim.
    _wait(lambda: kubectl("get", "pv", pv_name, check=False).rc == 1)


def test_pv_history_checker_detects_rebinding() -> None:
    """The replay used above fails when a PV's claimRef moves to another claim, or when two
    PVs reference one claim at the same time."""

    def pv_version(name: str, claim_name: str | None) -> dict:
        spec = {"claimRef": {"namespace": NS, "name": claim_name, "uid": f"uid-{claim_name}"}} if claim_name else {}
        return {"metadata": {"name": name}, "spec": spec}

    def ev(rev: int, obj: dict) -> Event:
        return Event("MODIFIED", f"/registry/core/persistentvolumes/{obj['metadata']['name']}", obj, None, rev)

    ok = [ev(1, pv_version("a", None)), ev(2, pv_version("a", "x")), ev(3, pv_version("b", "y"))]
    assert assert_no_pv_bound_twice(ok) == {"a": f"{NS}/x", "b": f"{NS}/y"}
    with pytest.raises(AssertionError, match="moved"):
        assert_no_pv_bound_twice([ev(1, pv_version("a", "x")), ev(2, pv_version("a", "y"))])
    with pytest.raises(AssertionError, match="referenced by"):
        assert_no_pv_bound_twice([ev(1, pv_version("a", "x")), ev(2, pv_version("b", "x"))])


async def test_stop_does_not_wait_for_a_waiting_volume_prebind(env: Env) -> None:
    """Scheduler.stop() while VolumeBinding's PreBind waits for the PV controller returns
    promptly (upstream cancels the binding cycle's context on shutdown)."""
    c = env.client
    await c.create(SCS, storage_class("static", "kubernetes.io/no-provisioner"))
    await c.create(PVS, static_pv("pv-n1", "static", "n1"))
    await c.create(PVCS, claim("data", "static"), NS)
    await env.start_volume_controllers()
    await eventually(lambda: env.pvs_available("pv-n1"))
    await env.stop_volume_controllers()  # nobody will complete the binding
    sched = env.start_scheduler()
    await c.create(PODS, pod("app", "data"), NS)

    async def prebind_wrote_claim_ref() -> str | None:
        return claim_ref_key(await c.get(PVS, "pv-n1"))

    await eventually(prebind_wrote_claim_ref)
    await asyncio.wait_for(env.stop_scheduler(sched), 3)  # would hang until bindTimeoutSeconds (600 s)
