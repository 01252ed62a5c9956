"""What a real node and its pods use, measured: the source of the usage report
a node agent sends with each Lease renewal (see :mod:`kubeplane.registry.metrics`,
which serves it as metrics.k8s.io, so ``kubectl top node`` and ``kubectl top pod``
show it).

Where the numbers come from:

* the node: the host's root cgroup, as cAdvisor reads it for the kubelet's node
  summary (cgroup v1: ``cpuacct.usage``, and ``memory.usage_in_bytes`` less
  ``total_inactive_file``; cgroup v2: ``cpu.stat``'s ``usage_usec``), and
  ``/proc/stat`` and ``/proc/meminfo`` where the cgroup file is not there
  (memory then is ``MemTotal - MemFree - Inactive(file)``, cAdvisor's number for
  a cgroup v2 root);
* the pods: the container runtime's CRI stats. ``ListContainerStats`` answers for
  every container (cumulative CPU time and the memory working set; containerd
  1.6 leaves ``usage_nano_cores`` empty there and fills it only in a single
  ``ContainerStats``, from its previous answer to anyone); ``ListPodSandboxStats``
  and ``PodSandboxStats`` in containerd 1.6 answer for sandboxes with a cgroup
  parent (the node's pod cgroups, :mod:`kubeplane.node.cgroups`) but fail
  ("cgroupPath is empty") for one run without, and the list fails for the
  whole node as soon as there is one such sandbox (the node's pod cgroups off,
  a runtime with the systemd driver, a pod started before), so neither is used.
  A pod's usage is, as with metrics-server, that of its running containers:
  cpu, and memory as the working set (usage less inactive file pages).

CPU is a rate: the cumulative counters are sampled and the usage is the
difference over the time between two samples (the report's window), as
metrics-server computes it from two scrapes. A sample is compared with the most
recent earlier one that is at least ``min_window`` old, so early renewals that
come close together do not shrink the window to noise; the first sample a
provider takes waits ``min_window`` for a second one. A container that appeared
since the earlier sample is rated over its life so far (its cumulative usage
since it was created), which is what it used, over a shorter window.

When the runtime cannot be asked, the report still has the node's usage and
no pods: their metrics are then unavailable, not zero.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable

from kubeplane.api.quantity import format_quantity
from kubeplane.api.usage import usage_report

log = logging.getLogger(__name__)

Obj = dict[str, Any]

#: the shortest window a CPU rate is measured over
MIN_WINDOW_SECONDS = 1.0
#: samples older than this are not kept (a rate over a longer window says little)
MAX_SAMPLE_AGE_SECONDS = 120.0
#: how long a sample answers node_usage()/pod_usage() asked right after each other
REUSE_SECONDS = 0.5
#: the deadline of the runtime's answers: a renewal waiting on a stuck runtime
#: would let the node's Lease expire
REQUEST_TIMEOUT_SECONDS = 5.0


# -- the host ------------------------------------------------------------------

def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _int_file(path: str) -> int | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def _keyed(text: str, sep: str | None = None) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split(sep) if sep else line.split()
        if len(parts) >= 2:
            try:
                out[parts[0].strip().rstrip(":")] = int(parts[1].split()[0])
            except (ValueError, IndexError):
                continue
    return out


class HostStats:
    """Cumulative CPU time and the memory working set of the whole host."""

    def __init__(self, *, cgroup_root: str = "/sys/fs/cgroup", proc_root: str = "/proc") -> None:
        self.cgroup_root = cgroup_root
        self.proc_root = proc_root
        try:
            self.clock_ticks = os.sysconf("SC_CLK_TCK")
        except (ValueError, OSError):
            self.clock_ticks = 100

    def _v1(self, controller: str, name: str) -> str | None:
        """The root cgroup's file of a cgroup v1 controller (its own or a joint mount)."""
        for d in (controller, "cpu,cpuacct", "cpuacct,cpu"):
            path = os.path.join(self.cgroup_root, d, name)
            if os.path.exists(path):
                return path
        return None

    def cpu_nanoseconds(self) -> tuple[int, str]:
        """(nanoseconds of CPU the host used since boot, where it was read)."""
        path = self._v1("cpuacct", "cpuacct.usage")
        if path is not None:
            value = _int_file(path)
            if value is not None:
                return value, "cgroup"
        text = _read(os.path.join(self.cgroup_root, "cpu.stat"))
        if text is not None:
            usec = _keyed(text).get("usage_usec")
            if usec is not None:
                return usec * 1000, "cgroup"
        text = _read(os.path.join(self.proc_root, "stat"))
        if text is None:
            raise OSError(f"cannot read {os.path.join(self.proc_root, 'stat')}")
        for line in text.splitlines():
            fields = line.split()
            if fields and fields[0] == "cpu":
                # user nice system idle iowait irq softirq steal (guest time is in user)
                values = [int(v) for v in fields[1:9]] + [0] * 8
                busy = values[0] + values[1] + values[2] + values[5] + values[6] + values[7]
                return busy * 10**9 // self.clock_ticks, "proc"
        raise OSError(f"no cpu line in {os.path.join(self.proc_root, 'stat')}")

    def memory_working_set(self) -> tuple[int, str]:
        """(bytes of memory in use that the host cannot easily reclaim, where it was read)."""
        usage_path = self._v1("memory", "memory.usage_in_bytes")
        if usage_path is not None:
            usage = _int_file(usage_path)
            stat = _read(os.path.join(os.path.dirname(usage_path), "memory.stat"))
            if usage is not None and stat is not None:
                inactive = _keyed(stat).get("total_inactive_file", 0)
                return max(usage - inactive, 0), "cgroup"
        text = _read(os.path.join(self.proc_root, "meminfo"))
        if text is None:
            raise OSError(f"cannot read {os.path.join(self.proc_root, 'meminfo')}")
        info = _keyed(text, ":")
        try:
            used = (info["MemTotal"] - info["MemFree"]) * 1024
        except KeyError:
            raise OSError(f"no MemTotal/MemFree in {os.path.join(self.proc_root, 'meminfo')}") from None
        return max(used - info.get("Inactive(file)", 0) * 1024, 0), "proc"


# -- samples -------------------------------------------------------------------

@dataclass
class ContainerSample:
    pod_uid: str
    name: str
    #: when the runtime created the container (ns since the epoch)
    created_ns: int
    #: when the runtime read the counters (ns since the epoch)
    timestamp_ns: int
    cpu_ns: int | None
    memory_bytes: int | None


@dataclass
class Sample:
    #: wall clock (ns since the epoch) and monotonic time of the sample
    wall_ns: int
    mono: float
    node_cpu_ns: int | None
    node_memory_bytes: int | None
    #: pod uid -> (namespace, name)
    pods: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: container id -> its sample
    containers: dict[str, ContainerSample] = field(default_factory=dict)
    #: whether the runtime answered
    runtime_ok: bool = True


@dataclass
class Usage:
    """One measurement: the node's usage and each running pod's, as the
    metrics report carries them (``{"cpu": "250m", "memory": "64Mi"}``)."""

    timestamp: _dt.datetime
    window_seconds: float
    node: dict[str, str]
    #: one entry per pod: namespace, name, uid, containers (name, usage)
    pods: list[Obj]

    def report(self) -> str:
        """The value of the Lease annotation (:data:`kubeplane.api.usage.USAGE_ANNOTATION`)."""
        return usage_report(self.timestamp, self.window_seconds, self.node, self.pods)


def format_cpu(nanocores: Fraction | int) -> str:
    return format_quantity(Fraction(max(round(nanocores), 0), 10**9), "DecimalSI")


def format_memory(num_bytes: int) -> str:
    return format_quantity(Fraction(max(int(num_bytes), 0)), "BinarySI")


def _value(wrapper: Any) -> int | None:
    """A CRI UInt64Value, None when the runtime left it out."""
    return int(wrapper.value) if wrapper is not None else None


class StatsProvider:
    """Measures the node and its pods for the node agent's Lease renewals:
    ``await provider.usage()`` (or ``node_usage()`` / ``pod_usage()``) and
    :meth:`Usage.report` for the annotation."""

    def __init__(self, cri: Any, *, host: HostStats | None = None, min_window: float = MIN_WINDOW_SECONDS,
                 max_sample_age: float = MAX_SAMPLE_AGE_SECONDS,
                 request_timeout: float = REQUEST_TIMEOUT_SECONDS,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], int] = time.time_ns) -> None:
        if min_window <= 0:
            raise ValueError("min_window must be positive")
        self.cri = cri
        self.host = host or HostStats()
        self.min_window = min_window
        self.max_sample_age = max_sample_age
        self.request_timeout = request_timeout
        self.clock = clock
        self.wall_clock = wall_clock
        self._samples: deque[Sample] = deque()
        self._last: Usage | None = None
        self._last_at = 0.0
        self._lock = asyncio.Lock()
        self._warned_runtime = False
        self._warned_host = False

    # -- measuring ---------------------------------------------------------------

    def _host(self) -> tuple[int | None, int | None]:
        try:
            cpu, _ = self.host.cpu_nanoseconds()
            mem, _ = self.host.memory_working_set()
            self._warned_host = False
            return cpu, mem
        except (OSError, ValueError) as err:
            if not self._warned_host:
                log.warning("node usage unavailable: %s", err)
                self._warned_host = True
            return None, None

    async def _runtime(self, sample: Sample) -> None:
        from kubeplane.node.cri.client import CRIError, pb

        t = self.request_timeout
        try:
            sandboxes, containers, stats = await asyncio.gather(
                self.cri.runtime("ListPodSandbox", pb.ListPodSandboxRequest(
                    filter=pb.PodSandboxFilter(state=pb.PodSandboxStateValue(state=pb.SANDBOX_READY))), timeout=t),
                self.cri.runtime("ListContainers", pb.ListContainersRequest(
                    filter=pb.ContainerFilter(state=pb.ContainerStateValue(state=pb.CONTAINER_RUNNING))), timeout=t),
                self.cri.runtime("ListContainerStats", pb.ListContainerStatsRequest(), timeout=t))
        except (CRIError, OSError) as err:
            sample.runtime_ok = False
            if not self._warned_runtime:
                log.warning("pod usage unavailable: %s", err)
                self._warned_runtime = True
            return
        self._warned_runtime = False
        by_sandbox: dict[str, str] = {}
        for s in sandboxes.items:
            md = s.metadata
            if md.uid:
                by_sandbox[s.id] = md.uid
                sample.pods[md.uid] = (md.namespace, md.name)
        measured = {st.attributes.id: st for st in stats.stats}
        for c in containers.containers:
            uid = by_sandbox.get(c.pod_sandbox_id)
            st = measured.get(c.id)
            if uid is None or st is None:
                continue
            cpu = st.cpu if st.HasField("cpu") else None
            mem = st.memory if st.HasField("memory") else None
            sample.containers[c.id] = ContainerSample(
                pod_uid=uid, name=c.metadata.name, created_ns=int(c.created_at),
                timestamp_ns=int(cpu.timestamp) if cpu is not None and cpu.timestamp else self.wall_clock(),
                cpu_ns=_value(cpu.usage_core_nano_seconds) if cpu is not None and cpu.HasField(
                    "usage_core_nano_seconds") else None,
                memory_bytes=_value(mem.working_set_bytes) if mem is not None and mem.HasField(
                    "working_set_bytes") else None)

    async def sample(self) -> Sample:
        """Read the counters now (and keep the sample)."""
        cpu, mem = self._host()
        s = Sample(wall_ns=self.wall_clock(), mono=self.clock(), node_cpu_ns=cpu, node_memory_bytes=mem)
        await self._runtime(s)
        self._samples.append(s)
        while self._samples and s.mono - self._samples[0].mono > self.max_sample_age:
            self._samples.popleft()
        return s

    def _baseline(self, now: Sample) -> Sample | None:
        """The most recent earlier sample at least ``min_window`` before ``now``."""
        for s in reversed(self._samples):
            if s is not now and now.mono - s.mono >= self.min_window - 1e-9:
                return s
        return None

    async def usage(self) -> Usage:
        """A measurement over the last window (waits for one when there is no
        sample ``min_window`` old yet)."""
        async with self._lock:
            if self._last is not None and self.clock() - self._last_at < REUSE_SECONDS:
                return self._last
            if not self._samples:
                await self.sample()
            oldest_useful = next((s for s in reversed(self._samples)
                                  if self.clock() - s.mono >= self.min_window - 1e-9), None)
            if oldest_useful is None:
                await asyncio.sleep(max(self._samples[0].mono + self.min_window - self.clock(), 0.0))
            now = await self.sample()
            base = self._baseline(now)
            assert base is not None
            out = self._usage(now, base)
            self._last, self._last_at = out, self.clock()
            return out

    def _usage(self, now: Sample, base: Sample) -> Usage:
        window = max(now.mono - base.mono, 1e-9)
        node: dict[str, str] = {}
        if now.node_cpu_ns is not None and base.node_cpu_ns is not None:
            node["cpu"] = format_cpu(Fraction(max(now.node_cpu_ns - base.node_cpu_ns, 0) * 10**9)
                                     / Fraction(round(window * 10**9)))
        if now.node_memory_bytes is not None:
            node["memory"] = format_memory(now.node_memory_bytes)
        per_pod: dict[str, dict[str, tuple[int, Obj]]] = {}
        for cid, c in now.containers.items():
            usage: Obj = {}
            prev = base.containers.get(cid)
            rate: Fraction | None = None
            if c.cpu_ns is not None:
                if prev is not None and prev.cpu_ns is not None and c.timestamp_ns > prev.timestamp_ns:
                    rate = Fraction(max(c.cpu_ns - prev.cpu_ns, 0) * 10**9, c.timestamp_ns - prev.timestamp_ns)
                elif prev is None and c.timestamp_ns > c.created_ns > 0:
                    rate = Fraction(c.cpu_ns * 10**9, c.timestamp_ns - c.created_ns)
            if rate is not None:
                usage["cpu"] = format_cpu(rate)
            if c.memory_bytes is not None:
                usage["memory"] = format_memory(c.memory_bytes)
            if not usage:
                continue
            containers = per_pod.setdefault(c.pod_uid, {})
            # two running containers of one name (a restart in progress): the newer one
            if c.name not in containers or containers[c.name][0] < c.created_ns:
                containers[c.name] = (c.created_ns, usage)
        pods: list[Obj] = []
        for uid, containers in per_pod.items():
            namespace, name = now.pods.get(uid, ("", ""))
            pods.append({"namespace": namespace, "name": name, "uid": uid,
                         "containers": [{"name": n, "usage": u} for n, (_, u) in sorted(containers.items())]})
        pods.sort(key=lambda p: (p["namespace"], p["name"], p["uid"]))
        stamp = _dt.datetime.fromtimestamp(now.wall_ns / 10**9, _dt.timezone.utc)
        return Usage(timestamp=stamp, window_seconds=round(window, 3), node=node, pods=pods)

    async def node_usage(self) -> dict[str, str]:
        """The node's usage: ``{"cpu": ..., "memory": ...}``."""
        return (await self.usage()).node

    async def pod_usage(self) -> list[Obj]:
        """Each running pod's usage, as the report lists them."""
        return (await self.usage()).pods

    async def report(self) -> str:
        """The Lease annotation's value for a renewal now."""
        return (await self.usage()).report()


__all__ = ["HostStats", "StatsProvider", "Usage", "format_cpu", "format_memory"]
