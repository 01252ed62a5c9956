"""``kubeplane bench WORKLOAD``: scheduler throughput, latency and memory.

Embedded mode, as upstream's scheduler_perf runs it: the registry, the
in-process client, the scheduler (and the controllers a workload needs) share
one process and one event loop. With ``split`` the scheduler and the
controllers run in a second process (:mod:`kubeplane.bench.worker`) that
reaches the registry over the local wire, so that two cores do the work, as
an API server and a scheduler do in a real cluster. Nodes are plain Node
objects; bound pods stay Pending (no node agent).

Measured phase only (the measured ``createPods`` op):

* throughput as upstream's throughputCollector computes SchedulingThroughput
  (see :class:`ThroughputCollector`): ``throughput_avg`` is the mean of the
  1-second samples, ``throughput_p50/p90/p99`` their percentiles;
  ``throughput_overall`` is the stricter scheduled / duration, where duration
  runs from the first measured pod's creation to the last measured pod's
  binding (it also counts the time before the first binding and the last,
  partial second, which upstream's samples leave out);
* per-pod latency from just before the create call to the moment the pod
  informer delivers the update that carries ``spec.nodeName``;
* ``cpu_ms_per_pod``: this process's user + system CPU time over the
  measured phase per measured pod, and with ``split``
  ``scheduler_process_cpu_ms_per_pod`` for the scheduler-side process (read
  from /proc): far steadier than throughput on a shared machine, and it
  shows which process bounds a workload;
* ``peak_rss_mb``: ``ru_maxrss`` of the process (the sum of both processes'
  with ``split``).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import resource as _resource
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Callable

from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.bench.workloads import (
    ALIASES,
    DYNAMIC_CLASS,
    STATIC_CLASS,
    WORKLOADS,
    Churn,
    ChurnPVs,
    CreateAny,
    CreateNamespaces,
    CreateNodes,
    CreatePods,
    SteadyState,
    Workload,
    get_workload,
    node_default,
    pod_with_claim,
    pv_static,
    pvc_wffc,
    resource_slice,
)
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.interface import Client

__all__ = ["WORKLOADS", "ALIASES", "Workload", "run_workload", "main", "percentile"]

PODS = resource("pods")
NODES = resource("nodes")
NAMESPACES = resource("namespaces")
PVS = resource("persistentvolumes")
PVCS = resource("persistentvolumeclaims")
SLICES = resource("resourceslices")

Progress = Callable[[int, int], None]

#: give up when no measured pod was bound for this long
DEFAULT_STALL_S = 60.0
#: sampling interval of the throughput collector (upstream: 1 s)
SAMPLE_INTERVAL_S = 1.0
#: creations between two yields to the event loop (so scheduling overlaps)
CREATE_BATCH = 20


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated ``q``-th percentile (0..100) of ``values``; 0 when empty."""
    if not values:
        return 0.0
    s = sorted(values)
    if len(s) == 1:
        return float(s[0])
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return float(s[lo] + (s[hi] - s[lo]) * (pos - lo))


def process_cpu_s(pid: int | None = None) -> float | None:
    """User + system CPU seconds of this process, or of the child ``pid`` (read
    from /proc; None where that cannot be read)."""
    if pid is None:
        return time.process_time()
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def count_held(indexer: Any, settled: bool = False) -> int:
    """Objects in an informer's indexer; with ``settled`` only those whose
    ``status.phase`` a controller has moved past Pending."""
    if not settled:
        return len(indexer)
    return sum(1 for o in indexer.list() if (o.get("status") or {}).get("phase") not in (None, "", "Pending"))


@dataclass
class PodTracker:
    """Creation and binding times of pods, fed by the shared pod informer."""

    created: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    phase_of: dict[str, str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=lambda: {"init": 0, "measure": 0, "churn": 0})
    unschedulable_seen: set[str] = field(default_factory=set)
    on_measured_bound: Callable[[str], None] | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def expect(self, key: str, phase: str) -> None:
        self.phase_of[key] = phase
        self.created[key] = time.perf_counter()

    def _key_of(self, pod: dict) -> str:
        md = pod.get("metadata") or {}
        return _key(md.get("namespace") or "default", md.get("name") or "")

    def _bound(self, pod: dict) -> None:
        key = self._key_of(pod)
        if key in self.bound:
            return
        self.bound[key] = time.perf_counter()
        phase = self.phase_of.get(key)
        if phase is not None:
            self.counts[phase] += 1
            self.changed.set()
            if phase == "measure" and self.on_measured_bound is not None:
                self.on_measured_bound(key)

    def on_add(self, pod: dict) -> None:
        if (pod.get("spec") or {}).get("nodeName"):
            self._bound(pod)

    def on_update(self, old: dict, new: dict) -> None:
        if (new.get("spec") or {}).get("nodeName"):
            if not (old.get("spec") or {}).get("nodeName"):
                self._bound(new)
            return
        for c in (new.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False":
                key = self._key_of(new)
                if key not in self.unschedulable_seen:
                    self.unschedulable_seen.add(key)
                    self.changed.set()

    def on_delete(self, obj: Any) -> None:
        return None

    def latencies_ms(self, phase: str) -> list[float]:
        return [(self.bound[k] - self.created[k]) * 1000.0
                for k, p in self.phase_of.items() if p == phase and k in self.bound and k in self.created]


class ThroughputCollector:
    """Pods/s sampled each second over the measured phase, as upstream's
    scheduler_perf throughputCollector samples it.

    A ticker fires every ``interval``. Ticks before the first measured pod is
    bound are ignored, and so is the first tick after it (sampling and pod
    creation start independently, so that interval is partial). A tick with
    no new binding is not a sample of its own: the next tick that sees new
    bindings divides them by the time since the last sample and records that
    rate once per interval it spans. The interval in progress when the phase
    ends is dropped. ``average`` and the percentiles are upstream's (the mean
    of the samples; nearest-rank percentiles).
    """

    def __init__(self, count: Callable[[], int], interval: float = SAMPLE_INTERVAL_S,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.count = count
        self.interval = interval
        self.clock = clock
        self.samples: list[float] = []
        self._task: asyncio.Task | None = None
        self._last_t = 0.0
        self._last_n = 0
        self._started = False
        self._skipped = 0

    def start(self) -> None:
        self._last_t = self.clock()
        self._last_n = self.count()
        self._task = asyncio.get_running_loop().create_task(self._run(self._last_t))

    async def _run(self, t0: float) -> None:
        k = 0
        while True:
            k += 1
            await asyncio.sleep(max(0.0, t0 + k * self.interval - self.clock()))
            self.tick(self.clock())

    def tick(self, now: float) -> None:
        """One tick of the ticker at time ``now``."""
        n = self.count()
        if n == 0:
            return
        if not self._started:
            self._started = True
            self._last_n, self._last_t = n, now
            return
        new = n - self._last_n
        if new == 0:
            self._skipped += 1
            return
        rate = new / (now - self._last_t)
        self.samples.extend([rate] * (self._skipped + 1))
        self._skipped = 0
        self._last_n, self._last_t = n, now

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def average(self) -> float:
        return sum(self.samples) / len(self.samples) if self.samples else 0.0

    def percentile(self, q: float) -> float:
        if not self.samples:
            return 0.0
        s = sorted(self.samples)
        return s[math.ceil(len(s) * q / 100.0) - 1]


class _Runner:
    def __init__(self, w: Workload, nodes: int, pods: int, client: Client, tracker: PodTracker,
                 progress: Progress | None, stall_s: float) -> None:
        self.w = w
        self.nodes = nodes
        self.pods = pods
        self.init_pods = w.init_count(nodes)
        self.client = client
        self.tracker = tracker
        self.progress = progress
        self.stall_s = stall_s
        self.node_names: list[str] = []
        self.measure_start = 0.0
        self.timed_out = False
        self.pv_created: dict[str, float] = {}
        self.churn_created = 0
        self.collector = ThroughputCollector(lambda: tracker.counts["measure"])
        self._seq = 0
        self.factory: SharedInformerFactory | None = None
        #: with ``split``: waits until the scheduler process's informer of a
        #: resource holds a number of objects (settled ones)
        self.remote_catch_up: Callable[[Any, int, bool, float], Any] | None = None
        #: overrides the churn workloads' PV creation interval
        self.pv_interval_s: float | None = None
        #: the scheduler-side process with ``split``, whose CPU time is reported too
        self.child_pid: int | None = None
        self.cpu_start: tuple[float | None, float | None] = (None, None)
        self.cpu_end: tuple[float | None, float | None] = (None, None)
        self.pv_interval_used = 0.0
        #: with a profile: cProfile of this process over the measured phase,
        #: and the scheduler process (``split``) told to profile its own
        self.profiler: Any = None
        self.profile_child: _SchedulerProcess | None = None

    async def _informer_catch_up(self, res: Any, settled: bool = False, timeout: float = 30.0) -> None:
        """Wait until the scheduler's shared informer of ``res`` holds every stored
        object (with ``settled``: each past phase Pending, see :func:`count_held`)."""
        want = len((await self.client.list(res))["items"])
        if self.remote_catch_up is not None:
            # like the local wait below: after the timeout, go on regardless
            await self.remote_catch_up(res, want, settled, timeout)
        if self.factory is None:
            return
        inf = self.factory.informer_for(res)
        deadline = time.perf_counter() + timeout
        while count_held(inf.indexer, settled) < want and time.perf_counter() < deadline:
            await asyncio.sleep(0.01)

    # -- setup ops (before the scheduler runs) ------------------------------

    async def setup(self) -> None:
        for op in self.w.ops:
            if isinstance(op, CreateNodes):
                await self._create_nodes(op)
            elif isinstance(op, CreateNamespaces):
                for i in range(op.count):
                    await self.client.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                                          "metadata": {"name": f"{op.prefix}-{i}"}})
            elif isinstance(op, CreateAny):
                obj = op.make()
                res = resource(_plural_of(obj))
                if op.namespaces:
                    for ns in op.namespaces:
                        await self.client.create(res, op.make(), ns)
                else:
                    await self.client.create(res, obj)

    async def _create_nodes(self, op: CreateNodes) -> None:
        for i in range(self.nodes):
            name = f"scheduler-perf-{i:05d}"
            labels = {op.label_key: op.label_values[i % len(op.label_values)]} if op.label_key else None
            await self.client.create(NODES, node_default(name, labels))
            if op.resource_slices:
                await self.client.create(SLICES, resource_slice(name))
            self.node_names.append(name)
            if i % 200 == 199:
                await asyncio.sleep(0)

    # -- pod ops (with the scheduler running) --------------------------------

    async def run_pod_ops(self) -> None:
        churns: list[asyncio.Task] = []
        try:
            await self._run_pod_ops(churns)
        finally:
            for t in churns:
                t.cancel()
            await asyncio.gather(*churns, return_exceptions=True)

    async def _run_pod_ops(self, churns: list[asyncio.Task]) -> None:
        for op in self.w.ops:
            if isinstance(op, Churn):
                churns.append(asyncio.get_running_loop().create_task(self._churn(op)))
            elif isinstance(op, CreatePods):
                count = self.init_pods if op.phase == "init" else self.pods
                if op.phase == "measure":
                    await self._begin_measure()
                await self._create_pods(op, count)
                if op.phase == "init" and not op.skip_wait:
                    await self._wait(lambda: self.tracker.counts["init"] >= count, "init")
                elif op.phase == "measure":
                    await self._wait(lambda: self.tracker.counts["measure"] >= count, "measure")
            elif isinstance(op, ChurnPVs):
                await self._churn_pvs(op)
            elif isinstance(op, SteadyState):
                await self._steady_state(op)

    async def _begin_measure(self) -> None:
        if self.profile_child is not None:
            await self.profile_child.profile("start")
        if self.profiler is not None:
            self.profiler.enable()
        self.measure_start = time.perf_counter()
        self.collector.start()
        self.cpu_start = (process_cpu_s(), process_cpu_s(self.child_pid) if self.child_pid else None)

    def end_measure(self) -> None:
        """Called once the measured phase is over: takes the CPU time it used
        and stops this process's profiler."""
        self.cpu_end = (process_cpu_s(), process_cpu_s(self.child_pid) if self.child_pid else None)
        if self.profiler is not None:
            self.profiler.disable()

    def _next_name(self, phase: str) -> str:
        self._seq += 1
        return f"{phase}-pod-{self._seq:06d}"

    async def _create_pod(self, op_template: Callable[[str], dict], namespace: str, phase: str,
                          volumes: str = "none") -> str:
        name = self._next_name(phase)
        body = op_template(name)
        if volumes != "none":
            claim = f"{name}-pvc"
            if volumes == "static":
                await self.client.create(PVCS, pvc_wffc(claim, STATIC_CLASS), namespace)
            else:
                await self.client.create(PVCS, pvc_wffc(claim, DYNAMIC_CLASS), namespace)
            body = {**body, "spec": {**body["spec"], **pod_with_claim(name, claim)["spec"],
                                     "containers": body["spec"]["containers"]}}
        key = _key(namespace, name)
        self.tracker.expect(key, phase)
        await self.client.create(PODS, body, namespace)
        return key

    async def _create_pods(self, op: CreatePods, count: int) -> None:
        if op.volumes == "static":
            # All PVs first, seen by the scheduler's informer past phase
            # Pending (the PV controller's first write) before the pods
            # arrive: a pod must not race its own volume.
            first = self._seq + 1
            for i in range(count):
                await self.client.create(PVS, pv_static(f"pv-{op.namespace}-{op.phase}-{first + i}", STATIC_CLASS))
                if i % CREATE_BATCH == CREATE_BATCH - 1:
                    await asyncio.sleep(0)
            await self._informer_catch_up(PVS, settled=True)
        for i in range(count):
            await self._create_pod(op.template, op.namespace, op.phase, op.volumes)
            if i % CREATE_BATCH == CREATE_BATCH - 1:
                await asyncio.sleep(0)

    async def _wait(self, done: Callable[[], bool], phase: str, stall_s: float | None = None) -> bool:
        """Wait for ``done``; False (and timed_out) when ``phase`` made no progress for the stall time."""
        stall = self.stall_s if stall_s is None else stall_s
        last = self.tracker.counts.get(phase, 0)
        last_t = time.perf_counter()
        while not done():
            self.tracker.changed.clear()
            try:
                await asyncio.wait_for(self.tracker.changed.wait(), 0.25)
            except asyncio.TimeoutError:
                pass
            cur = self.tracker.counts.get(phase, 0) + len(self.tracker.unschedulable_seen)
            if cur != last:
                last, last_t = cur, time.perf_counter()
            elif time.perf_counter() - last_t > stall:
                self.timed_out = True
                return False
        return True

    async def _churn(self, op: Churn) -> None:
        """Create one unmeasured pod every ``op.interval_ms`` until cancelled."""
        interval = op.interval_ms / 1000.0
        n = 0
        next_t = time.perf_counter()
        while True:
            n += 1
            name = f"churn-pod-{n:06d}"
            self.tracker.expect(_key(op.namespace, name), "churn")
            await self.client.create(PODS, op.template(name), op.namespace)
            self.churn_created = n
            next_t += interval
            await asyncio.sleep(max(0.0, next_t - time.perf_counter()))

    async def _churn_pvs(self, op: ChurnPVs) -> None:
        """Pods whose claims select one PV each wait unschedulable; then the PVs appear."""
        names = [self._next_name("measure") for _ in range(self.pods)]
        # Claims before pods, so claim events do not retry (and back off) the pods.
        for name in names:
            await self.client.create(PVCS, pvc_wffc(f"{name}-pvc", STATIC_CLASS, selector_label=name), "default")
        await self._informer_catch_up(PVCS)
        for name in names:
            self.tracker.expect(_key("default", name), "measure")
            await self.client.create(PODS, pod_with_claim(name, f"{name}-pvc"), "default")
        keys = [("default", n) for n in names]
        await self._wait(lambda: len(self.tracker.unschedulable_seen) >= len(keys), "unschedulable", 30.0)
        # Past the pods' initial backoff: the PV event alone must bring each pod back.
        await asyncio.sleep(op.settle_s)
        await self._begin_measure()
        interval = op.interval_s if self.pv_interval_s is None else self.pv_interval_s
        self.pv_interval_used = interval
        for i, (ns, name) in enumerate(keys):
            self.pv_created[_key(ns, name)] = time.perf_counter()
            await self.client.create(PVS, pv_static(f"pv-{name}", STATIC_CLASS, label=name))
            await asyncio.sleep(interval)
        await self._wait(lambda: self.tracker.counts["measure"] >= len(keys), "measure")

    async def _steady_state(self, op: SteadyState) -> None:
        """Keep ``in_flight`` pods pending; delete each bound pod and create the next."""
        bound_q: asyncio.Queue[str] = asyncio.Queue()
        self.tracker.on_measured_bound = bound_q.put_nowait
        await self._begin_measure()
        created = 0
        for _ in range(min(op.in_flight, self.pods)):
            await self._create_pod(op.template, op.namespace, "measure")
            created += 1
        while created < self.pods:
            try:
                key = await asyncio.wait_for(bound_q.get(), self.stall_s)
            except asyncio.TimeoutError:
                self.timed_out = True
                return
            ns, name = key.split("/", 1)
            await self.client.delete(PODS, name, ns, grace_period_seconds=0)
            await self._create_pod(op.template, op.namespace, "measure")
            created += 1
        await self._wait(lambda: self.tracker.counts["measure"] >= self.pods, "measure")

    # -- results ---------------------------------------------------------------

    def result(self, end: float) -> dict[str, Any]:
        t = self.tracker
        measured = [k for k, p in t.phase_of.items() if p == "measure"]
        bound_times = [t.bound[k] for k in measured if k in t.bound]
        scheduled = len(bound_times)
        last = max(bound_times) if bound_times else end
        duration = max(last - self.measure_start, 1e-9) if self.measure_start else 0.0
        lat = t.latencies_ms("measure")
        c = self.collector
        overall = scheduled / duration if duration else 0.0
        out: dict[str, Any] = {
            "workload": self.w.name,
            "nodes": self.nodes,
            "init_pods": self.init_pods,
            "pods": self.pods,
            "scheduled": scheduled,
            "init_scheduled": t.counts["init"],
            "duration_s": round(duration, 4),
            # Upstream's Average when there are samples; a run too short for any
            # (under about two seconds) reports the overall rate instead.
            "throughput_avg": round(c.average() if c.samples else overall, 2),
            "throughput_p50": round(c.percentile(50) if c.samples else overall, 2),
            "throughput_p90": round(c.percentile(90) if c.samples else overall, 2),
            "throughput_p99": round(c.percentile(99) if c.samples else overall, 2),
            "throughput_samples": len(c.samples),
            "throughput_overall": round(overall, 2),
            "latency_p50_ms": round(percentile(lat, 50), 2),
            "latency_p90_ms": round(percentile(lat, 90), 2),
            "latency_p99_ms": round(percentile(lat, 99), 2),
            "peak_rss_mb": round(_resource.getrusage(_resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
            "timed_out": self.timed_out,
        }
        for k, (a, b) in zip(("cpu_ms_per_pod", "scheduler_process_cpu_ms_per_pod"),
                             zip(self.cpu_start, self.cpu_end)):
            if a is not None and b is not None and scheduled:
                out[k] = round((b - a) * 1000.0 / scheduled, 3)
        if any(isinstance(op, Churn) for op in self.w.ops):
            out["churn_created"] = self.churn_created
            out["churn_scheduled"] = t.counts["churn"]
        if self.pv_created:
            pv_lat = [(t.bound[k] - c) * 1000.0 for k, c in self.pv_created.items() if k in t.bound]
            out["pv_to_binding_p50_ms"] = round(percentile(pv_lat, 50), 2)
            out["pv_to_binding_p99_ms"] = round(percentile(pv_lat, 99), 2)
            out["pv_interval_ms"] = round(self.pv_interval_used * 1000.0, 3)
        return out


def _plural_of(obj: dict) -> str:
    info = CATALOGUE.by_api_version_kind(obj["apiVersion"], obj["kind"])
    if info is None:
        raise KeyError(f"{obj['apiVersion']} {obj['kind']}")
    return info.plural


def _controllers(names: tuple[str, ...], client: Client, factory: SharedInformerFactory) -> list[Any]:
    out: list[Any] = []
    if "pv" in names:
        from kubeplane.controllers.pv.binder import PersistentVolumeController
        out.append(PersistentVolumeController(client, factory, resync_period=0))
    if "provisioner" in names:
        from kubeplane.controllers.pv.provisioner import LocalProvisioner
        out.append(LocalProvisioner(client, factory))
    if "resourceclaim" in names:
        from kubeplane.controllers.resourceclaim import ResourceClaimController
        out.append(ResourceClaimController(client, factory))
    return out


async def start_scheduler_side(stack: AsyncExitStack, client: Client, factory: SharedInformerFactory,
                               controllers: tuple[str, ...], seed: int) -> Any:
    """Start the workload's controllers and a scheduler on ``client``; returns
    once the scheduler's caches are synced. Stopping is left on ``stack``."""
    from kubeplane.scheduler.scheduler import Scheduler

    sched = Scheduler(client, informer_factory=factory, rng=random.Random(seed))
    for c in _controllers(controllers, client, factory):
        await c.start(sync_timeout=120)
        stack.push_async_callback(c.stop)
    sched_task = asyncio.create_task(sched.run())

    async def _stop_sched() -> None:
        await sched.stop()
        await asyncio.wait_for(sched_task, 30)

    stack.push_async_callback(_stop_sched)
    await sched.start()  # idempotent with run(): returns once caches are synced
    return sched


class _SchedulerProcess:
    """The scheduler side in a child process (:mod:`kubeplane.bench.worker`)."""

    def __init__(self, socket_path: str, controllers: tuple[str, ...], seed: int) -> None:
        from kubeplane.cluster import ComponentProcess

        self.child = ComponentProcess(
            [sys.executable, "-m", "kubeplane.bench.worker", socket_path, "--seed", str(seed),
             "--controllers", ",".join(controllers)], "scheduler process")
        self.peak_rss_mb = 0.0

    async def catch_up(self, res: Any, want: int, settled: bool = False, timeout: float = 30.0) -> None:
        line = await self.child.request(f"catchup {res.plural} {want} {timeout:g}{' settled' if settled else ''}",
                                        timeout + 30.0)
        if line not in ("ok", "timeout"):
            raise RuntimeError(f"scheduler process: {line}")

    async def profile(self, command: str) -> None:
        """``start``, or ``stop PATH``: the process's cProfile (written to PATH)."""
        line = await self.child.request(f"profile {command}", 120.0)
        if line != "ok":
            raise RuntimeError(f"scheduler process: {line}")

    async def stop(self) -> None:
        for line in await self.child.stop():
            if line.startswith("{"):
                self.peak_rss_mb = float(json.loads(line).get("peak_rss_mb", 0.0))


async def run_workload(
    name: str,
    *,
    nodes: int | None = None,
    pods: int | None = None,
    storage: str = "memory",
    progress: Progress | None = None,
    stall_timeout_s: float = DEFAULT_STALL_S,
    seed: int = 0,
    split: bool = False,
    pv_interval_ms: float | None = None,
    profile_prefix: str | None = None,
) -> dict[str, Any]:
    """Run workload ``name`` once and return its measurements.

    ``nodes`` / ``pods`` override the node count and the measured pod count
    (initial pods, and measured pods when ``pods`` is None, scale with the nodes). ``storage`` is "memory" or "sqlite"
    (a temporary directory). ``progress(scheduled, total)`` is called about ten
    times a second during the measured phase. ``split`` runs the scheduler and
    the controllers in a second process. ``pv_interval_ms`` sets the time
    between two PV creations of SchedulingPVsChurn (default 10 ms).
    ``profile_prefix``: cProfile each process over the measured phase and
    write ``PREFIXapi.prof`` and ``PREFIXscheduler.prof`` (split) or
    ``PREFIXbench.prof``; ``profile`` in the result names them with each
    one's :func:`kubeplane.bench.profile.shares` (``shares_percent`` of the
    busy time, ``idle_percent``).
    """
    from kubeplane.apiserver.app import ensure_default_namespaces
    from kubeplane.client.inprocess import InProcessClient
    from kubeplane.registry.admission import default_chain
    from kubeplane.registry.registry import Registry
    from kubeplane.storage import open_store

    w = get_workload(name)
    n_nodes = w.nodes if nodes is None else nodes
    n_pods = w.measure_count(n_nodes) if pods is None else pods
    if n_nodes < 0 or n_pods < 0:
        raise ValueError("nodes and pods must not be negative")
    history = 50_000 + 20 * (n_nodes + n_pods + w.init_count(n_nodes))

    async with AsyncExitStack() as stack:
        data_dir = None
        if storage == "sqlite":
            data_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="kubeplane-bench-"))
        store = await open_store(storage, data_dir, history=history, watch_queue=history)
        stack.push_async_callback(store.close)
        # pods name their priority outright, so Priority admission is off, as
        # in upstream's scheduler_perf API server
        registry = Registry(store, CATALOGUE, admission=default_chain(store, disabled=("Priority",)))
        stack.push_async_callback(registry.close)
        await ensure_default_namespaces(registry)
        client = InProcessClient(registry)
        stack.push_async_callback(client.close)

        tracker = PodTracker()
        # The workload's own writes: its templates build fresh objects and it only
        # counts what it lists, so it hands them over and reads without copies.
        feeder = InProcessClient(registry, copies=False)
        runner = _Runner(w, n_nodes, n_pods, feeder, tracker, progress, stall_timeout_s)
        if pv_interval_ms is not None:
            runner.pv_interval_s = pv_interval_ms / 1000.0
        t0 = time.perf_counter()
        await runner.setup()

        # Split, this factory only feeds the tracker, which never modifies what it
        # reads: it may share the stored objects instead of copying each event.
        factory = SharedInformerFactory(InProcessClient(registry, copies=False) if split else client)
        stack.push_async_callback(factory.stop)
        factory.informer_for(PODS).add_event_handler(tracker.on_add, tracker.on_update, tracker.on_delete)
        worker: _SchedulerProcess | None = None
        if split:
            from kubeplane.client.wireserver import WireServer

            sock_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="kubeplane-wire-"))
            server = WireServer(registry, os.path.join(sock_dir, "api.sock"))
            await server.start()
            stack.push_async_callback(server.stop)
            worker = _SchedulerProcess(server.path, w.controllers, seed)
            stack.push_async_callback(worker.stop)
            await worker.child.start()
            runner.remote_catch_up = worker.catch_up
            runner.child_pid = worker.child.proc.pid if worker.child.proc is not None else None
            factory.start()
            await factory.wait_for_cache_sync()
        else:
            runner.factory = factory
            await start_scheduler_side(stack, client, factory, w.controllers, seed)
        setup_s = time.perf_counter() - t0
        if profile_prefix is not None:
            import cProfile

            runner.profiler = cProfile.Profile()
            runner.profile_child = worker

        ticker = None
        if progress is not None:
            async def _tick() -> None:
                while True:
                    progress(tracker.counts["measure"], n_pods)
                    await asyncio.sleep(0.1)
            ticker = asyncio.create_task(_tick())
        try:
            await runner.run_pod_ops()
            runner.end_measure()
        finally:
            if runner.profiler is not None:
                runner.profiler.disable()
            await runner.collector.stop()
            if ticker is not None:
                ticker.cancel()
                await asyncio.gather(ticker, return_exceptions=True)
                progress(tracker.counts["measure"], n_pods)
        out = runner.result(time.perf_counter())
        if profile_prefix is not None:
            out["profile"] = await _write_profiles(runner, profile_prefix, split)
        out["storage"] = storage
        out["setup_s"] = round(setup_s, 2)
        out["split"] = split
        if worker is not None:
            await worker.stop()
            out["scheduler_peak_rss_mb"] = worker.peak_rss_mb
            out["peak_rss_mb"] = round(out["peak_rss_mb"] + worker.peak_rss_mb, 1)
        return out


async def _write_profiles(runner: _Runner, prefix: str, split: bool) -> dict[str, Any]:
    """Write the measured phase's profiles; their files and :func:`shares`, by process."""
    from kubeplane.bench.profile import shares

    here = "api" if split else "bench"
    paths = {here: os.path.abspath(f"{prefix}{here}.prof")}
    runner.profiler.dump_stats(paths[here])
    if runner.profile_child is not None:
        paths["scheduler"] = os.path.abspath(f"{prefix}scheduler.prof")
        await runner.profile_child.profile(f"stop {paths['scheduler']}")
    out: dict[str, Any] = {}
    for name, path in paths.items():
        parts, idle = shares(path)
        out[name] = {"file": path, "shares_percent": parts, "idle_percent": idle}
    return out


# -- command line --------------------------------------------------------------


def _parse(argv: list[str]) -> Any:
    import argparse

    p = argparse.ArgumentParser(prog="scheduler_perf", description="scheduler_perf workloads, embedded mode")
    p.add_argument("workload", help=f"one of: {', '.join(sorted(WORKLOADS))}")
    p.add_argument("--nodes", type=int, default=None)
    p.add_argument("--pods", type=int, default=None, help="measured pods")
    p.add_argument("--storage", choices=("memory", "sqlite"), default="memory")
    p.add_argument("--json", action="store_true", help="print one JSON object, no progress bar")
    p.add_argument("--split", action="store_true", help="scheduler and controllers in a second process")
    p.add_argument("--pv-interval-ms", type=float, default=None, help="SchedulingPVsChurn: ms between PV creations")
    p.add_argument("--runs", type=int, default=1, help="repetitions; the run with the median average is reported")
    p.add_argument("--profile", metavar="DIR", default=None,
                   help="cProfile each process over the measured phase into DIR and report where the time went")
    return p.parse_args(argv)


def median_run(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The run whose ``throughput_avg`` is the median of ``results`` (the lower
    of the middle two for an even count), with every run's throughput figures
    (``throughput_avg_runs``, ``throughput_overall_runs``, in run order) and
    ``timed_out`` if any run timed out. One whole run is reported rather than
    medians taken key by key, so its figures stay consistent with each other
    (but runs in one process share its peak RSS: ``peak_rss_mb`` is the
    process's peak up to that run)."""
    if not results:
        raise ValueError("no runs")
    order = sorted(range(len(results)), key=lambda i: results[i]["throughput_avg"])
    out = dict(results[order[(len(order) - 1) // 2]])
    out["runs"] = len(results)
    out["throughput_avg_runs"] = [r["throughput_avg"] for r in results]
    out["throughput_overall_runs"] = [r["throughput_overall"] for r in results]
    out["timed_out"] = any(r["timed_out"] for r in results)
    return out


async def run_cli(workload: str, *, nodes: int | None = None, pods: int | None = None, storage: str = "memory",
                  as_json: bool = False, split: bool = False, pv_interval_ms: float | None = None,
                  runs: int = 1, profile_dir: str | None = None) -> dict[str, Any]:
    """Run ``runs`` times with a rich progress bar on a terminal (none with
    ``as_json``) and print the result (with several runs, :func:`median_run`).
    With ``profile_dir`` every run writes its profiles there (``runN-`` before
    the file names when there are several runs)."""
    if runs < 1:
        raise ValueError("runs must be at least 1")
    if profile_dir is not None:
        os.makedirs(profile_dir, exist_ok=True)
    use_bar = not as_json and sys.stdout.isatty()
    results: list[dict[str, Any]] = []

    async def once(progress: Progress | None) -> None:
        prefix = None
        if profile_dir is not None:
            prefix = os.path.join(profile_dir, f"run{len(results) + 1}-" if runs > 1 else "")
        results.append(await run_workload(workload, nodes=nodes, pods=pods, storage=storage, progress=progress,
                                          split=split, pv_interval_ms=pv_interval_ms, profile_prefix=prefix))

    for i in range(runs):
        if not use_bar:
            await once(None)
            continue
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TimeElapsedColumn

        label = f"{workload}: pods scheduled" + (f" (run {i + 1}/{runs})" if runs > 1 else "")
        with Bar("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                 TimeElapsedColumn(), transient=True) as bar:
            task = bar.add_task(label, total=None)

            def cb(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            await once(cb)
    out = results[0] if runs == 1 else median_run(results)
    if as_json:
        print(json.dumps(out))
    else:
        from kubeplane.bench.profile import format_shares

        scalars = {k: v for k, v in out.items() if k != "profile"}
        width = max(len(k) for k in scalars)
        for k, v in scalars.items():
            print(f"{k:<{width}}  {v}")
        for name, prof in out.get("profile", {}).items():
            print(format_shares(f"{name} process ({prof['file']})", prof["shares_percent"], prof["idle_percent"]))
    return out


def main(argv: list[str] | None = None) -> int:
    """``scheduler_perf WORKLOAD [--nodes N] [--pods M] [--storage S] [--json]``; 1 if pods were left unscheduled."""
    args = _parse(sys.argv[1:] if argv is None else argv)
    try:
        get_workload(args.workload)
    except KeyError as err:
        print(err.args[0], file=sys.stderr)
        return 2
    if args.runs < 1:
        print("--runs must be at least 1", file=sys.stderr)
        return 2
    from kubeplane.runtime import configure_gc, run

    configure_gc()
    out = run(run_cli(args.workload, nodes=args.nodes, pods=args.pods, storage=args.storage,
                      as_json=args.json, split=args.split, pv_interval_ms=args.pv_interval_ms,
                      runs=args.runs, profile_dir=args.profile))
    return 1 if out["timed_out"] else 0
