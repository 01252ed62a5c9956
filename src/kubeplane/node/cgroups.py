"""Pod cgroups under the QoS hierarchy, as upstream kubelet's container
manager makes them with its cgroupfs driver (``pkg/kubelet/cm``).

Under the node's cgroup root (``--cgroup-root``, ``/`` by default):

- ``kubepods``: every pod, limited to the node's allocatable (capacity less
  ``--system-reserved``: cpu shares and the memory limit, upstream's
  enforcement of node allocatable for pods);
- ``kubepods/burstable`` (cpu shares: the summed cpu requests of its pods) and
  ``kubepods/besteffort`` (the least cpu shares there are);
- one cgroup per pod, ``pod<uid>``, under ``kubepods`` for a Guaranteed pod and
  under its QoS class's cgroup otherwise, limited as upstream's
  ResourceConfigForPod says: cpu shares from the pod's requests, the CFS quota
  and the memory limit from its limits (for a Burstable pod only when every
  container declares that limit), huge page limits from its requests.

The pod's cgroup is the sandbox's ``cgroup_parent``: the runtime (runc)
makes the sandbox's and every container's cgroup under it. It is removed
once the pod is done and runs nothing any more, or is gone (any process left
in it killed first).

cgroup v1 (each controller its own hierarchy, or several joined) and cgroup
v2 (one unified hierarchy, the controllers enabled down the path) are both
handled; on a hybrid host the unified hierarchy only holds the cgroups (no
controllers are managed there), as runc does. The systemd driver (cgroups as
systemd slices) is not: :func:`runtime_cgroup_driver` tells which one the
runtime uses.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import signal
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from kubeplane.api.qos import pod_qos_class
from kubeplane.api.quantity import parse_quantity
from kubeplane.api.quota import pod_aggregate

log = logging.getLogger(__name__)

Obj = dict[str, Any]

MOUNTS = "/proc/self/mounts"
KUBEPODS = "kubepods"
BURSTABLE = "burstable"
BESTEFFORT = "besteffort"
POD_PREFIX = "pod"

#: upstream's cm constants (helpers_linux.go)
MIN_SHARES = 2
MAX_SHARES = 262144
SHARES_PER_CPU = 1024
QUOTA_PERIOD = 100000
MIN_QUOTA_PERIOD = 1000

V1_CONTROLLERS = frozenset({"cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids",
                            "hugetlb", "net_cls", "net_prio", "perf_event", "rdma", "misc"})


class CgroupError(Exception):
    pass


def milli_cpu_to_shares(milli: int) -> int:
    """upstream's MilliCPUToShares."""
    if milli == 0:
        return MIN_SHARES
    return max(MIN_SHARES, min(MAX_SHARES, milli * SHARES_PER_CPU // 1000))


def milli_cpu_to_quota(milli: int, period: int = QUOTA_PERIOD) -> int:
    """upstream's MilliCPUToQuota (0: no limit)."""
    if milli == 0:
        return 0
    return max(MIN_QUOTA_PERIOD, milli * period // 1000)


def shares_to_weight(shares: int) -> int:
    """cgroup v1 cpu shares as a cgroup v2 cpu.weight (runc's conversion)."""
    return 1 + ((shares - 2) * 9999) // 262142


# -- what a pod gets --------------------------------------------------------------

@dataclass
class ResourceConfig:
    """Limits of one cgroup; None leaves the runtime's default."""

    cpu_shares: int | None = None
    cpu_quota: int | None = None
    cpu_period: int | None = None
    memory: int | None = None
    #: page size in bytes -> limit in bytes, every size left out limited to 0;
    #: None leaves the huge page limits alone
    hugepages: dict[int, int] | None = None


def qos_class(pod: Obj) -> str:
    return (pod.get("status") or {}).get("qosClass") or pod_qos_class(pod.get("spec") or {})


def _hugepage_size(name: str) -> int | None:
    try:
        return int(parse_quantity(name[len("hugepages-"):]))
    except (TypeError, ValueError):
        return None


def pod_resource_config(pod: Obj) -> ResourceConfig:
    """The pod cgroup's limits (upstream's ResourceConfigForPod, CFS quota enforced)."""
    spec = pod.get("spec") or {}
    requests = pod_aggregate(spec, "requests")
    limits = pod_aggregate(spec, "limits")
    cpu_declared = memory_declared = True
    for c in list(spec.get("containers") or []) + list(spec.get("initContainers") or []):
        lim = ((c.get("resources") or {}).get("limits") or {}) if isinstance(c, dict) else {}
        if not lim.get("cpu") or parse_quantity(lim["cpu"]) == 0:
            cpu_declared = False
        if not lim.get("memory") or parse_quantity(lim["memory"]) == 0:
            memory_declared = False
    pod_limits = (spec.get("resources") or {}).get("limits") or {}
    if pod_limits.get("cpu") and parse_quantity(pod_limits["cpu"]) != 0:
        cpu_declared = True
    if pod_limits.get("memory") and parse_quantity(pod_limits["memory"]) != 0:
        memory_declared = True
    cpu_request = math.ceil(requests["cpu"][0] * 1000) if "cpu" in requests else 0
    cpu_limit = math.ceil(limits["cpu"][0] * 1000) if "cpu" in limits else 0
    memory_limit = math.ceil(limits["memory"][0]) if "memory" in limits else 0
    shares = milli_cpu_to_shares(cpu_request)
    quota = milli_cpu_to_quota(cpu_limit)
    out = ResourceConfig(hugepages={})
    qos = qos_class(pod)
    if qos == "Guaranteed":
        out.cpu_shares, out.cpu_quota, out.cpu_period, out.memory = shares, quota, QUOTA_PERIOD, memory_limit
    elif qos == "Burstable":
        out.cpu_shares = shares
        if cpu_declared:
            out.cpu_quota, out.cpu_period = quota, QUOTA_PERIOD
        if memory_declared:
            out.memory = memory_limit
    else:
        out.cpu_shares = MIN_SHARES
    for name, (value, _) in requests.items():
        if name.startswith("hugepages-"):
            size = _hugepage_size(name)
            if size:
                out.hugepages[size] = math.ceil(value)
    return out


def node_allocatable_config(capacity: Mapping[str, Any], reserved: Mapping[str, Any]) -> ResourceConfig:
    """The ``kubepods`` cgroup's limits: capacity less the reservations (cpu
    shares and memory; upstream's getNodeAllocatableAbsolute)."""
    def left(name: str) -> int | None:
        if name not in capacity:
            return None
        value = parse_quantity(capacity[name]) - (parse_quantity(reserved[name]) if name in reserved else 0)
        return max(0, math.ceil(value * 1000 if name == "cpu" else value))

    out = ResourceConfig()
    cpu = left("cpu")
    if cpu is not None:
        out.cpu_shares = milli_cpu_to_shares(cpu)
    out.memory = left("memory")
    return out


# -- the host's hierarchies ------------------------------------------------------------

@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy: ``path`` its mount point, ``controllers``
    those it has (v1: its own; v2: those the root offers), ``v2`` whether it is
    the unified hierarchy of a cgroup v2 host (managed through it)."""

    path: str
    controllers: frozenset[str]
    v2: bool = False


def _unescape(path: str) -> str:
    """A mount point as /proc/mounts writes it (octal escapes for spaces and the like)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def mounted_hierarchies(mounts: str = MOUNTS) -> list[Hierarchy]:
    """The cgroup hierarchies mounted on this host, v1 ones first."""
    v1: dict[str, Hierarchy] = {}
    v2: list[str] = []
    with open(mounts) as f:
        for line in f:
            fields = line.split()
            if len(fields) < 4:
                continue
            path, fstype, options = _unescape(fields[1]), fields[2], fields[3].split(",")
            if fstype == "cgroup":
                ctrls = frozenset(o for o in options if o in V1_CONTROLLERS or o.startswith("name="))
                if ctrls and path not in v1:
                    v1[path] = Hierarchy(path, ctrls)
            elif fstype == "cgroup2" and path not in v2:
                v2.append(path)
    out = list(v1.values())
    for path in v2:
        if v1:
            out.append(Hierarchy(path, frozenset()))  # hybrid: the unified hierarchy only holds the cgroups
        else:
            try:
                with open(os.path.join(path, "cgroup.controllers")) as f:
                    ctrls = frozenset(f.read().split())
            except OSError:
                ctrls = frozenset()
            out.append(Hierarchy(path, ctrls, v2=True))
    return out


def _write(path: str, value: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError as err:
        raise CgroupError(f"writing {value!r} to {path}: {err.strerror or err}") from None


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _hugepage_sizes(h: Hierarchy) -> dict[int, str]:
    """page size in bytes -> the name the hugetlb controller gives it (``2MB``)."""
    out: dict[int, str] = {}
    try:
        names = os.listdir(h.path)
    except OSError:
        return out
    units = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}
    for n in names:
        parts = n.split(".")
        if len(parts) == 3 and parts[0] == "hugetlb" and parts[2] in ("limit_in_bytes", "max"):
            size = parts[1]
            if size[-2:] in units and size[:-2].isdigit():
                out[int(size[:-2]) * units[size[-2:]]] = size
    return out


class PodCgroups:
    """The node's pod cgroups (cgroupfs driver): ``root`` is the cgroup root
    (``/``: ``/kubepods/...``), ``node_config`` the ``kubepods`` cgroup's limits."""

    def __init__(self, root: str = "/", *, node_config: ResourceConfig | None = None,
                 hierarchies: Iterable[Hierarchy] | None = None) -> None:
        root = "/" + root.strip("/")
        self.root = root
        self.node_config = node_config or ResourceConfig()
        self.hierarchies = list(hierarchies) if hierarchies is not None else mounted_hierarchies()
        if not self.hierarchies:
            raise CgroupError("no cgroup hierarchy is mounted")
        #: uid -> the pod, for the pods whose cgroups exist (the burstable cgroup's shares)
        self.pods: dict[str, Obj] = {}
        self._made_root: set[str] = set()
        self._ready = False

    # -- names

    def _name(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), KUBEPODS, *parts])

    def pod_name(self, pod: Obj) -> str:
        """The cgroupfs name of the pod's cgroup (the sandbox's cgroup parent)."""
        uid = (pod.get("metadata") or {}).get("uid") or ""
        qos = qos_class(pod)
        if qos == "Guaranteed":
            return self._name(POD_PREFIX + uid)
        return self._name(BURSTABLE if qos == "Burstable" else BESTEFFORT, POD_PREFIX + uid)

    def _paths(self, name: str) -> list[tuple[Hierarchy, str]]:
        return [(h, os.path.join(h.path, name.lstrip("/"))) for h in self.hierarchies]

    def _candidates(self, uid: str) -> list[str]:
        pod = POD_PREFIX + uid
        return [self._name(pod), self._name(BURSTABLE, pod), self._name(BESTEFFORT, pod)]

    # -- making and limiting

    def _make(self, name: str) -> None:
        for h, path in self._paths(name):
            if os.path.isdir(path):
                continue
            parent = os.path.dirname(path)
            if not os.path.isdir(parent):
                self._make(os.path.dirname(name))
            try:
                os.mkdir(path)
            except FileExistsError:
                continue
            except OSError as err:
                raise CgroupError(f"making cgroup {path}: {err.strerror or err}") from None
            if h.v2:
                self._enable_controllers(h, parent)
            elif "cpuset" in h.controllers:
                # a v1 cpuset cgroup takes no task before it has cpus and memory nodes
                for f in ("cpuset.cpus", "cpuset.mems"):
                    if not _read(os.path.join(path, f)):
                        _write(os.path.join(path, f), _read(os.path.join(parent, f)))

    def _enable_controllers(self, h: Hierarchy, parent: str) -> None:
        """v2: what the parent offers its children, so the child's limits can be set."""
        offered = set(_read(os.path.join(parent, "cgroup.controllers")).split())
        enabled = set(_read(os.path.join(parent, "cgroup.subtree_control")).split())
        wanted = offered & {"cpu", "cpuset", "memory", "hugetlb", "pids", "io"}
        missing = sorted(wanted - enabled)
        if missing:
            _write(os.path.join(parent, "cgroup.subtree_control"), " ".join("+" + c for c in missing))

    def _apply(self, name: str, cfg: ResourceConfig) -> None:
        for h, path in self._paths(name):
            if h.v2:
                self._apply_v2(h, path, cfg)
            else:
                self._apply_v1(h, path, cfg)

    def _apply_v1(self, h: Hierarchy, path: str, cfg: ResourceConfig) -> None:
        if "cpu" in h.controllers:
            if cfg.cpu_shares is not None:
                _write(os.path.join(path, "cpu.shares"), str(cfg.cpu_shares))
            if cfg.cpu_period is not None:
                _write(os.path.join(path, "cpu.cfs_period_us"), str(cfg.cpu_period))
            if cfg.cpu_quota is not None:
                _write(os.path.join(path, "cpu.cfs_quota_us"), str(cfg.cpu_quota or -1))
        if "memory" in h.controllers and cfg.memory is not None:
            _write(os.path.join(path, "memory.limit_in_bytes"), str(cfg.memory or -1))
        if "hugetlb" in h.controllers and cfg.hugepages is not None:
            for size, suffix in _hugepage_sizes(h).items():
                _write(os.path.join(path, f"hugetlb.{suffix}.limit_in_bytes"), str(cfg.hugepages.get(size, 0)))

    def _apply_v2(self, h: Hierarchy, path: str, cfg: ResourceConfig) -> None:
        if "cpu" in h.controllers:
            if cfg.cpu_shares is not None:
                _write(os.path.join(path, "cpu.weight"), str(shares_to_weight(cfg.cpu_shares)))
            if cfg.cpu_quota is not None or cfg.cpu_period is not None:
                quota = str(cfg.cpu_quota) if cfg.cpu_quota else "max"
                _write(os.path.join(path, "cpu.max"), f"{quota} {cfg.cpu_period or QUOTA_PERIOD}")
        if "memory" in h.controllers and cfg.memory is not None:
            _write(os.path.join(path, "memory.max"), str(cfg.memory) if cfg.memory else "max")
        if "hugetlb" in h.controllers and cfg.hugepages is not None:
            for size, suffix in _hugepage_sizes(h).items():
                _write(os.path.join(path, f"hugetlb.{suffix}.max"), str(cfg.hugepages.get(size, 0)))

    def setup(self) -> None:
        """The node-level cgroups: ``kubepods`` (node allocatable) and the QoS ones."""
        for h in self.hierarchies:
            path = h.path
            for part in self.root.strip("/").split("/") if self.root != "/" else ():
                path = os.path.join(path, part)
                if not os.path.isdir(path):
                    self._made_root.add(path)
        self._make(self._name())
        self._apply(self._name(), self.node_config)
        self._make(self._name(BURSTABLE))
        self._make(self._name(BESTEFFORT))
        self._apply(self._name(BESTEFFORT), ResourceConfig(cpu_shares=MIN_SHARES))
        self._update_qos()
        self._ready = True

    def _update_qos(self) -> None:
        """The burstable cgroup's cpu shares: its pods' summed cpu requests (upstream's setCPUCgroupConfig)."""
        milli = 0
        for pod in self.pods.values():
            if qos_class(pod) == "Burstable":
                req = pod_aggregate(pod.get("spec") or {}, "requests").get("cpu")
                if req is not None:
                    milli += math.ceil(req[0] * 1000)
        self._apply(self._name(BURSTABLE), ResourceConfig(cpu_shares=milli_cpu_to_shares(milli)))

    def exists(self, pod: Obj) -> bool:
        return all(os.path.isdir(p) for _, p in self._paths(self.pod_name(pod)))

    def ensure_pod(self, pod: Obj) -> str:
        """The pod's cgroup, made with its limits when missing; its cgroupfs name."""
        if not self._ready:
            self.setup()
        uid = (pod.get("metadata") or {}).get("uid") or ""
        name = self.pod_name(pod)
        known = uid in self.pods
        self.pods[uid] = pod
        if not known:
            self._update_qos()
        if not self.exists(pod):
            self._make(name)
            self._apply(name, pod_resource_config(pod))
        return name

    # -- removing

    def _pids(self, path: str) -> list[int]:
        out: list[int] = []
        for d, _, _ in os.walk(path):
            for line in _read(os.path.join(d, "cgroup.procs")).split():
                if line.isdigit():
                    out.append(int(line))
        return out

    def _rmdir_tree(self, path: str) -> None:
        for d, dirs, _ in os.walk(path, topdown=False):
            try:
                os.rmdir(d)
            except FileNotFoundError:
                pass

    def remove_pod(self, uid: str, *, wait: float = 5.0) -> None:
        """:meth:`destroy` and :meth:`forget`."""
        self.destroy(uid, wait=wait)
        self.forget(uid)

    def forget(self, uid: str) -> None:
        """The pod is gone: it counts no more in the burstable cgroup's shares."""
        if self.pods.pop(uid, None) is not None and self._ready:
            self._update_qos()

    def destroy(self, uid: str, *, wait: float = 5.0) -> None:
        """Remove the pod's cgroup (upstream's pod container manager Destroy):
        any process still in it is killed, then the cgroups go, the runtime's
        leftovers under it too. Only file system work: it may run in a thread."""
        for name in self._candidates(uid):
            paths = [p for _, p in self._paths(name) if os.path.isdir(p)]
            if not paths:
                continue
            deadline = time.monotonic() + wait
            while True:
                pids = sorted({pid for p in paths for pid in self._pids(p)})
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                try:
                    for p in paths:
                        self._rmdir_tree(p)
                    break
                except OSError as err:
                    if time.monotonic() > deadline:
                        raise CgroupError(f"removing the cgroup of pod {uid}: {err.strerror or err}") from None
                    time.sleep(0.05)

    def pod_uids(self) -> set[str]:
        """The uids of the pods that have a cgroup here."""
        out: set[str] = set()
        for name in (self._name(), self._name(BURSTABLE), self._name(BESTEFFORT)):
            for _, path in self._paths(name):
                try:
                    entries = os.listdir(path)
                except OSError:
                    continue
                out.update(e[len(POD_PREFIX):] for e in entries
                           if e.startswith(POD_PREFIX) and os.path.isdir(os.path.join(path, e)))
        return out

    def remove_all(self) -> None:
        """Remove the node's cgroups (no pod left): the QoS ones, ``kubepods``,
        and the cgroup root when it was made here."""
        for name in (self._name(BURSTABLE), self._name(BESTEFFORT), self._name()):
            for _, path in self._paths(name):
                try:
                    os.rmdir(path)
                except FileNotFoundError:
                    pass
                except OSError as err:  # still holding pods (of another node with this cgroup root)
                    log.info("cgroup %s stays: %s", path, err.strerror or err)
        for path in sorted(self._made_root, key=len, reverse=True):
            try:
                os.rmdir(path)
            except OSError:
                pass
        self._ready = False


# -- which driver the runtime uses ----------------------------------------------------

def runtime_cgroup_driver(status_info: Mapping[str, str]) -> str:
    """``systemd`` or ``cgroupfs``: what containerd's verbose CRI status says
    its default runtime uses (``SystemdCgroup`` in the runc options)."""
    try:
        cfg = json.loads(status_info.get("config") or "{}")
    except ValueError:
        return "cgroupfs"
    if cfg.get("systemdCgroup"):
        return "systemd"
    ctd = cfg.get("containerd") or {}
    runtimes = ctd.get("runtimes") or {}
    default = runtimes.get(ctd.get("defaultRuntimeName") or "runc") or {}
    options = default.get("options") or {}
    if options.get("SystemdCgroup") or options.get("systemd_cgroup"):
        return "systemd"
    return "cgroupfs"
