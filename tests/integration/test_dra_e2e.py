"""Dynamic resource allocation end to end: kubectl against ``kubeplane up`` with
simulated GPUs, and an invariant test over every ResourceClaim version the store
holds while pods, slices and scheduler instances come and go."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, ResourceInfo, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.resourceclaim import ResourceClaimController
from kubeplane.registry.registry import Registry
from kubeplane.scheduler.scheduler import Scheduler
from kubeplane.storage.interface import Event
from kubeplane.storage.memory import MemoryStore

from conftest import Kubectl, start_server
from helpers import eventually_sync as wait_for

GPU = "gpu.kubeplane.io"
NS = "default"

# ---------------------------------------------------------------- kubectl against kubeplane up


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("up-dra")
    srv = start_server(tmp, command="up", extra=["--nodes", "2", "--gpus-per-node", "2"])
    try:
        yield Kubectl(srv.kubeconfig, tmp / "home")
    finally:
        srv.stop()


def get_json(kubectl: Kubectl, *args: str) -> dict:
    return json.loads(kubectl("get", *args, "-o", "json").out)


def running_pod(kubectl: Kubectl, name: str) -> dict | None:
    p = get_json(kubectl, "pod", name)
    return p if (p.get("status") or {}).get("phase") == "Running" else None


def claim_table(kubectl: Kubectl) -> dict[str, str]:
    """``kubectl get resourceclaims``: claim name -> STATE column."""
    lines = kubectl("get", "resourceclaims").out.splitlines()
    if not lines:
        return {}
    assert lines[0].split() == ["NAME", "STATE", "AGE"], lines[0]
    return {parts[0]: parts[1] for parts in (line.split() for line in lines[1:])}


def gone(kubectl: Kubectl, *args: str) -> bool:
    r = kubectl("get", *args, check=False)
    return r.rc == 1 and "NotFound" in r.err


def devices(claim: dict) -> list[tuple[str, str, str]]:
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or ()
    return sorted((r["driver"], r["pool"], r["device"]) for r in results)


def reserved_uids(claim: dict) -> set[str]:
    return {r["uid"] for r in (claim.get("status") or {}).get("reservedFor") or ()}


def gpu_pod(name: str, claim_ref: dict) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "containers": [{"name": "c", "image": "nginx", "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": [{"name": "gpu", **claim_ref}]}})


TEMPLATE = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: one-gpu
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.kubeplane.io
"""


def test_template_claim_allocated_reserved_and_released(up: Kubectl) -> None:
    kubectl = up
    kubectl("apply", "-f", "-", stdin=TEMPLATE)
    kubectl("apply", "-f", "-", stdin=gpu_pod("trainer", {"resourceClaimTemplateName": "one-gpu"}))
    pod = wait_for(lambda: running_pod(kubectl, "trainer"), what="pod Running")
    statuses = pod["status"]["resourceClaimStatuses"]
    assert [s["name"] for s in statuses] == ["gpu"]
    claim_name = statuses[0]["resourceClaimName"]
    assert claim_name.startswith("trainer-gpu-")
    assert wait_for(lambda: claim_table(kubectl).get(claim_name) == "allocated,reserved", what="claim state")
    claim = get_json(kubectl, "resourceclaim", claim_name)
    node = pod["spec"]["nodeName"]
    assert [(d, p) for d, p, _ in devices(claim)] == [(GPU, node)]  # the pool is named after the node
    assert reserved_uids(claim) == {pod["metadata"]["uid"]}
    owner = claim["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", "trainer", pod["metadata"]["uid"])
    # The allocation is pinned to the node the pod runs on.
    terms = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"]
    assert node in json.dumps(terms)
    kubectl("delete", "pod", "trainer", "--wait", "--timeout=20s")
    wait_for(lambda: gone(kubectl, "resourceclaim", claim_name), what="template claim deleted")
    kubectl("delete", "resourceclaimtemplate", "one-gpu")


SHARED = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: shared-gpu
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.kubeplane.io
"""


def test_shared_claim_two_pods_then_released(up: Kubectl) -> None:
    kubectl = up
    kubectl("apply", "-f", "-", stdin=SHARED)
    assert claim_table(kubectl).get("shared-gpu") == "pending"
    for name in ("reader-a", "reader-b"):
        kubectl("apply", "-f", "-", stdin=gpu_pod(name, {"resourceClaimName": "shared-gpu"}))
    pods = [wait_for(lambda: running_pod(kubectl, n), what=f"{n} Running") for n in ("reader-a", "reader-b")]
    claim = get_json(kubectl, "resourceclaim", "shared-gpu")
    assert len(devices(claim)) == 1  # one allocation, used by both
    assert reserved_uids(claim) == {p["metadata"]["uid"] for p in pods}
    # Both pods run where the one device is.
    assert {p["spec"]["nodeName"] for p in pods} == {devices(claim)[0][1]}
    assert claim_table(kubectl)["shared-gpu"] == "allocated,reserved"
    first_alloc = claim["status"]["allocation"]

    kubectl("delete", "pod", "reader-a", "--wait", "--timeout=20s")

    def shrunk() -> dict | None:
        c = get_json(kubectl, "resourceclaim", "shared-gpu")
        return c if reserved_uids(c) == {pods[1]["metadata"]["uid"]} else None

    claim = wait_for(shrunk, what="reservedFor shrinks")
    assert claim["status"]["allocation"] == first_alloc  # still in use: still allocated
    kubectl("delete", "pod", "reader-b", "--wait", "--timeout=20s")

    def released() -> dict | None:
        c = get_json(kubectl, "resourceclaim", "shared-gpu")
        st = c.get("status") or {}
        return c if not st.get("reservedFor") and st.get("allocation") is None else None

    claim = wait_for(released, what="allocation cleared")
    assert "resource.kubernetes.io/delete-protection" not in (claim["metadata"].get("finalizers") or ())
    assert claim_table(kubectl)["shared-gpu"] == "pending"
    kubectl("delete", "resourceclaim", "shared-gpu", "--wait", "--timeout=20s")


H100_CLAIM = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: needs-h100
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.kubeplane.io
        selectors:
        - cel:
            expression: device.attributes["gpu.kubeplane.io"].model == "KP-H100"
"""


def h100_slice(node: str) -> str:
    return json.dumps({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-h100"},
        "spec": {"driver": GPU, "nodeName": node,
                 "pool": {"name": f"{node}-h100", "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "h100-0", "attributes": {"model": {"string": "KP-H100"}},
                              "capacity": {"memory": {"value": "80Gi"}}}]}})


def test_pod_waits_until_a_new_slice_appears(up: Kubectl) -> None:
    kubectl = up
    kubectl("apply", "-f", "-", stdin=H100_CLAIM)
    kubectl("apply", "-f", "-", stdin=gpu_pod("h100-job", {"resourceClaimName": "needs-h100"}))

    def unschedulable_message() -> str | None:
        p = get_json(kubectl, "pod", "h100-job")
        cond = next((c for c in (p.get("status") or {}).get("conditions") or () if c["type"] == "PodScheduled"), None)
        return cond.get("message") if cond and cond["status"] == "False" else None

    msg = wait_for(unschedulable_message, what="PodScheduled=False")
    assert msg.startswith("0/2 nodes are available: 2 cannot allocate all claims"), msg
    assert not get_json(kubectl, "pod", "h100-job")["spec"].get("nodeName")
    assert claim_table(kubectl)["needs-h100"] == "pending"
    kubectl("apply", "-f", "-", stdin=h100_slice("node-1"))
    pod = wait_for(lambda: running_pod(kubectl, "h100-job"), what="pod Running after the slice")
    assert pod["spec"]["nodeName"] == "node-1"
    claim = get_json(kubectl, "resourceclaim", "needs-h100")
    assert devices(claim) == [(GPU, "node-1-h100", "h100-0")]
    kubectl("delete", "pod", "h100-job", "--wait", "--timeout=20s")
    wait_for(lambda: (get_json(kubectl, "resourceclaim", "needs-h100").get("status") or {}).get("allocation") is None,
             what="deallocated")
    kubectl("delete", "resourceclaim", "needs-h100", "--wait", "--timeout=20s")
    kubectl("delete", "resourceslice", "node-1-h100")


# ---------------------------------------------------------------- the invariant test (in process)

PODS = resource("pods")
NODES = resource("nodes")
CLAIMS = resource("resourceclaims")
TEMPLATES = resource("resourceclaimtemplates")
SLICES = resource("resourceslices")
CLASSES = resource("deviceclasses")


def node(name: str) -> dict:
    alloc = {"cpu": "64", "memory": "64Gi", "pods": "110"}
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"capacity": alloc, "allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]}}


def slice_body(node_name: str, device_names: list[str], generation: int) -> dict:
    return {"metadata": {"name": f"{node_name}-gpus"},
            "spec": {"driver": GPU, "nodeName": node_name,
                     "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
                     "devices": [{"name": d, "attributes": {"model": {"string": "KP-A100"}}} for d in device_names]}}


def template_pod(name: str) -> dict:
    return {"metadata": {"name": name}, "spec": {
        "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "10m"}}}],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]}}


class ClaimWriteTrap:
    """The scheduler's client: once armed, the first ResourceClaim write (update or patch)
    goes through and then parks its caller until the caller is cancelled, so the test can
    kill the scheduler at exactly that point of a binding cycle."""

    def __init__(self, inner: InProcessClient) -> None:
        self.inner = inner
        self.armed = True
        self.caught = asyncio.Event()
        self.written: dict = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def update(self, res: ResourceInfo, obj: dict, **kw: Any) -> dict:
        out = await self.inner.update(res, obj, **kw)
        await self._trap(res, out)
        return out

    async def patch(self, res: ResourceInfo, name: str, patch: Any, namespace: str | None = None, **kw: Any) -> dict:
        out = await self.inner.patch(res, name, patch, namespace, **kw)
        await self._trap(res, out)
        return out

    async def _trap(self, res: ResourceInfo, out: dict) -> None:
        if res.plural == "resourceclaims" and self.armed:
            self.armed = False
            self.written = out
            self.caught.set()
            await asyncio.Event().wait()  # until cancelled


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
    return events


def check_no_device_shared(events: list[Event]) -> int:
    """Replays claim versions in revision order: no (driver, pool, device) is ever held by two
    claims at once. Returns the number of allocations seen."""
    assert all(a.revision < b.revision for a, b in zip(events, events[1:]))
    holder: dict[tuple[str, str, str], str] = {}
    held: dict[str, set[tuple[str, str, str]]] = {}
    allocations = 0
    for ev in events:
        uid = ev.value["metadata"]["uid"]
        now = set() if ev.type == "DELETED" else set(devices(ev.value))
        before = held.get(uid, set())
        if now and not before:
            allocations += 1
        for d in before - now:
            del holder[d]
        for d in now - before:
            assert d not in holder, (f"device {d} allocated to claim {ev.value['metadata']['name']} at revision "
                                     f"{ev.revision} while claim uid {holder[d]} holds it")
            holder[d] = uid
        held[uid] = now
    return allocations


async def test_no_device_is_ever_allocated_twice() -> None:
    """Pods with template claims are created and deleted concurrently while slices gain and
    lose devices and the scheduler is killed in the middle of binding three times. Every
    ResourceClaim version the store held is checked, and every pod that fits runs."""
    rng = random.Random(5)
    store = MemoryStore(history=200_000)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    c = InProcessClient(registry)
    nodes = ["n0", "n1", "n2"]
    for n in nodes:
        await c.create(NODES, node(n))
    await c.create(CLASSES, {"metadata": {"name": GPU},
                             "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{GPU}"'}}]}})
    await c.create(TEMPLATES, {"metadata": {"name": "one-gpu"}, "spec": {"spec": {
        "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": GPU}}]}}}}, NS)
    # Each node starts with gpu-0..gpu-2; the churn adds gpu-3/gpu-4 and removes free devices.
    inventory = {n: [f"gpu-{i}" for i in range(3)] for n in nodes}
    generation = {n: 1 for n in nodes}
    for n in nodes:
        await c.create(SLICES, slice_body(n, inventory[n], 1))
    start_rev = store.revision
    ctrl = ResourceClaimController(c)
    await ctrl.start(sync_timeout=2)
    sched_box: dict[str, Any] = {}
    kills_mid_binding: list[str] = []

    def start_scheduler(trap: bool) -> None:
        client = ClaimWriteTrap(c) if trap else c
        s = Scheduler(client, pod_initial_backoff=0.01, pod_max_backoff=0.05, rng=random.Random(rng.random()))
        sched_box.update(s=s, t=asyncio.create_task(s.run()), client=client)

    async def kill_scheduler() -> None:
        """What a killed process leaves behind: binding cycles abandoned where they are."""
        s, t = sched_box["s"], sched_box["t"]
        for bt in list(s._binding_tasks):
            bt.cancel()
        await s.stop()
        t.cancel()  # in case the trap parked the scheduling loop itself
        await asyncio.gather(t, return_exceptions=True)

    async def used_devices() -> set[tuple[str, str]]:
        out = set()
        for cl in (await c.list(CLAIMS, NS))["items"]:
            out |= {(p, d) for _, p, d in devices(cl)}
        return out

    async def fitting() -> int:
        """How many one-device pods can run: devices published now, plus devices claims
        still hold after the churn removed them from a slice while they were being allocated."""
        published = {(n, d) for n, ds in inventory.items() for d in ds}
        return len(published | await used_devices())

    async def update_slice(n: str) -> None:
        generation[n] += 1
        body = slice_body(n, inventory[n], generation[n])
        cur = await c.get(SLICES, body["metadata"]["name"])
        cur["spec"] = body["spec"]
        await c.update(SLICES, cur)

    async def churn_slices() -> None:
        """Adds a device somewhere, or removes one nobody holds (a driver would not remove an
        allocated device; removing a free one shrinks what the scheduler may use)."""
        for step in range(12):
            n = rng.choice(nodes)
            if step % 2 == 0 and len(inventory[n]) < 5:
                inventory[n].append(f"gpu-{max(int(d.split('-')[1]) for d in inventory[n]) + 1}")
            else:
                used = await used_devices()
                free = [d for d in inventory[n] if (n, d) not in used]
                if not free or len(inventory[n]) <= 1:
                    continue
                inventory[n].remove(rng.choice(free))
            await update_slice(n)
            await asyncio.sleep(rng.uniform(0.01, 0.05))

    created: list[str] = []
    deleted: set[str] = set()

    async def churn_pods() -> None:
        for i in range(40):
            name = f"p{i}"
            await c.create(PODS, template_pod(name), NS)
            created.append(name)
            if i % 3 == 2:  # delete an earlier pod, bound or not
                victim = rng.choice([p for p in created if p not in deleted])
                deleted.add(victim)
                # No kubelet here to finish a graceful deletion: delete right away.
                await c.delete(PODS, victim, NS, grace_period_seconds=0)
            await asyncio.sleep(rng.uniform(0.0, 0.02))

    async def restarts() -> None:
        for i in range(3):
            # Kill the scheduler right after its first ResourceClaim write of a binding
            # cycle, before that cycle finished.
            trap: ClaimWriteTrap = sched_box["client"]
            await asyncio.wait_for(trap.caught.wait(), 5)
            written = trap.written
            refs = (written.get("status") or {}).get("reservedFor") or written["metadata"]["ownerReferences"]
            await kill_scheduler()
            pod_name = refs[0]["name"]
            try:
                p = await c.get(PODS, pod_name, NS)
                kills_mid_binding.append(f"{pod_name} on {p['spec'].get('nodeName')}")
            except StatusError:
                kills_mid_binding.append(f"{pod_name} deleted")
            await asyncio.sleep(0.05)
            start_scheduler(trap=i < 2)
            await asyncio.sleep(0.05)

    start_scheduler(trap=True)
    try:
        await asyncio.gather(churn_pods(), churn_slices(), restarts())

        async def settled() -> tuple[dict[str, str], set[str]] | None:
            items = (await c.list(PODS, NS))["items"]
            live = {p["metadata"]["name"]: p for p in items}
            if set(live) != set(created) - deleted:
                return None
            bound = {n: p["spec"]["nodeName"] for n, p in live.items() if p["spec"].get("nodeName")}
            if len(bound) != min(len(live), await fitting()):
                return None
            return bound, set(live) - set(bound)

        deadline = asyncio.get_running_loop().time() + 6
        result = None
        while result is None and asyncio.get_running_loop().time() < deadline:
            result = await settled()
            await asyncio.sleep(0.05)
        history = await stored_history(store, CLAIMS, start_rev)
        allocations = check_no_device_shared(history)
        capacity = await fitting()
        live = (await c.list(PODS, NS))["items"]
        assert result is not None, (
            f"not every pod that fits runs: capacity {capacity}, "
            f"bound {sum(1 for p in live if p['spec'].get('nodeName'))} of {len(live)} live pods")
        bound, waiting = result
        assert len(live) > capacity  # the cluster is full, so pods really competed
        assert allocations >= len(bound)
        # Every bound pod holds exactly the devices of its own claim, on its node.
        claims = {cl["metadata"]["name"]: cl for cl in (await c.list(CLAIMS, NS))["items"]}
        for p in live:
            name = p["metadata"]["name"]
            if name not in bound:
                continue
            cname = p["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
            devs = devices(claims[cname])
            assert len(devs) == 1 and devs[0][1] == bound[name], (name, devs)
            assert reserved_uids(claims[cname]) == {p["metadata"]["uid"]}
        assert waiting
        # Three kills, each leaving the trapped pod unbound (or deleted by the churn meanwhile).
        assert len(kills_mid_binding) == 3
        assert all(k.endswith((" on None", " deleted")) for k in kills_mid_binding), kills_mid_binding
    finally:
        await sched_box["s"].stop()
        await asyncio.wait_for(sched_box["t"], 5)
        await ctrl.stop()
        await c.close()
        await registry.close()
        await store.close()


def test_invariant_checker_detects_overlap() -> None:
    """The replay used above fails on a device held by two claims at once, and accepts a
    device that moves to another claim after the first released it."""

    def claim_version(uid: str, *devs: str) -> dict:
        results = [{"driver": GPU, "pool": "n0", "device": d, "request": "gpu"} for d in devs]
        return {"metadata": {"name": f"c-{uid}", "uid": uid},
                "status": {"allocation": {"devices": {"results": results}}} if devs else {}}

    def ev(rev: int, typ: str, obj: dict) -> Event:
        return Event(typ, f"/registry/resource.k8s.io/resourceclaims/default/{obj['metadata']['name']}", obj, None, rev)

    handover = [ev(1, "MODIFIED", claim_version("a", "gpu-0")), ev(2, "MODIFIED", claim_version("a")),
                ev(3, "MODIFIED", claim_version("b", "gpu-0")), ev(4, "DELETED", claim_version("b", "gpu-0")),
                ev(5, "MODIFIED", claim_version("a", "gpu-0"))]
    assert check_no_device_shared(handover) == 3
    overlap = [ev(1, "MODIFIED", claim_version("a", "gpu-0")), ev(2, "MODIFIED", claim_version("b", "gpu-1", "gpu-0"))]
    with pytest.raises(AssertionError, match="gpu-0"):
        check_no_device_shared(overlap)
