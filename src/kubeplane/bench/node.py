"""``kubeplane bench node``: pod start-up on one real node.

What upstream's node density test measures for the kubelet (test/e2e_node
density): a batch of pods, with their image already on the node, created at
once; for each pod the time from creation to Running and to Ready, as a watch
sees the status the node writes; and what the node agent itself costs.

The cluster is kubeplane's (API server, scheduler and controllers, in this
process); the node is ``kubeplane node`` in a process of its own, with the
containerd it starts and owns under a temporary data directory, so its CPU and
memory are its own, acting as ``system:node:bench-node``. The bench builds the busybox and pause image archives and
puts them in the node's images directory. Pods are busybox ``sleep`` with a
tiny request, scheduled by the scheduler onto the node, created ``in_flight``
at a time.

Measured for each batch size:

* ``running_p50/p99_ms``, ``ready_p50/p99_ms``: from just before the pod's
  create call to the watch event showing phase Running (condition Ready True);
  upstream's SLO is p99 <= 5 s for stateless pods with a pre-pulled image;
* ``pods_per_s``: pods Ready per second, from the first create to the last Ready;
* ``agent_cpu_ms_per_pod``: the agent's CPU time over the start-up, per pod;
  ``agent_idle_millicores_per_pod``: its CPU rate with every pod running
  (``steady_s`` measured), per pod;
* ``agent_rss_mb`` with every pod running and ``agent_rss_kb_per_pod``
  (its growth over the node with no pods, per pod);
* the runtime's share beside it: containerd's and the shims' CPU time over the
  start-up per pod (``runtime_cpu_ms_per_pod``: runc and the CNI plugins they
  ran included) and their RSS (``runtime_rss_mb``, ``shim_rss_kb_per_pod``);
  the control plane's (this process: API server, scheduler, controllers and
  the bench's watch: ``control_plane_cpu_ms_per_pod``);
  and how busy the host was meanwhile (``host_cores_busy``, all processes,
  and the 1-minute ``load_average`` at the end): on a shared machine the
  latencies follow the load;
* ``delete_s``: from the deletes to every pod gone from the API.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from kubeplane.api.resources import resource
from kubeplane.bench.scheduler import percentile

PODS = resource("pods")
NODES = resource("nodes")
NAMESPACES = resource("namespaces")
SERVICE_ACCOUNTS = resource("serviceaccounts")

BUSYBOX = "kubeplane.local/busybox:latest"
PAUSE = "kubeplane.local/pause:3.10"
DEFAULT_COUNTS = (50, 200)
NODE_NAME = "bench-node"

Progress = Callable[[str], None]


# -- processes -------------------------------------------------------------------

def _clock_ticks() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError):
        return 100


def proc_cpu_seconds(pid: int, *, children: bool = False) -> float | None:
    """User + system CPU time of a process (its threads included; with
    ``children``, also that of the children it waited for: runc for a shim, the
    CNI plugins for containerd)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / _clock_ticks()


def proc_rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return 0


def _cmdline(pid: str) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


@dataclass
class NodeProcesses:
    """The agent's process and the runtime processes that serve its data directory."""

    agent: int | None
    containerd: list[int] = field(default_factory=list)
    shims: list[int] = field(default_factory=list)


def node_processes(agent_pid: int | None, data_dir: str) -> NodeProcesses:
    out = NodeProcesses(agent_pid)
    key = os.path.abspath(data_dir).encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == agent_pid:
            continue
        argv = _cmdline(pid)
        if not argv or not any(key in a for a in argv):
            continue
        name = os.path.basename(argv[0])
        if name.startswith(b"containerd-shim"):
            out.shims.append(int(pid))
        elif name == b"containerd":
            out.containerd.append(int(pid))
    return out


def _sum(values: list[int | float | None]) -> float:
    return float(sum(v for v in values if v is not None))


# -- the node ----------------------------------------------------------------------

class RealNode:
    """``kubeplane node`` in its own process, with a containerd it owns."""

    def __init__(self, kubeconfig: str, work_dir: str, *, name: str = NODE_NAME, max_pods: int = 250,
                 pod_cidr: str | None = None, kubelet_port: int | None = None,
                 extra_args: list[str] | None = None) -> None:
        self.kubeconfig = kubeconfig
        self.pod_cidr = pod_cidr
        self.kubelet_port = kubelet_port
        self.name = name
        self.data_dir = os.path.join(work_dir, "node")
        self.images_dir = os.path.join(self.data_dir, "images")
        self.log_path = os.path.join(work_dir, "node.log")
        self.max_pods = max_pods
        self.extra_args = list(extra_args or [])
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        from kubeplane.node.images import build_busybox_image, build_pause_image

        os.makedirs(self.images_dir, exist_ok=True)
        build_busybox_image(os.path.join(self.images_dir, "busybox.tar"), BUSYBOX)
        build_pause_image(os.path.join(self.images_dir, "pause.tar"), PAUSE)
        cmd = [sys.executable, "-m", "kubeplane.cli.main", "node", "--kubeconfig", self.kubeconfig,
               "--name", self.name, "--data-dir", self.data_dir, "--images-dir", self.images_dir,
               "--max-pods", str(self.max_pods), "--pod-cidr", self.pod_cidr or free_pod_cidr(),
               "--kubelet-port", str(self.kubelet_port or free_port()),
               "--no-proxy",  # pod start-up needs no Service rules: the host's ruleset stays as it is
               *self.extra_args]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)

    def exited(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def tail_log(self, lines: int = 15) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")
        except OSError:
            return ""

    def processes(self) -> NodeProcesses:
        return node_processes(self.pid, self.data_dir)

    async def remove_sandboxes(self) -> int:
        """Stop and remove every pod sandbox left in the node's containerd (its
        CNI DEL included), before the node stops."""
        from kubeplane.node.cri.client import CRIClient, CRIError, pb

        removed = 0
        for sock in _find(self.data_dir, "containerd.sock"):
            async with CRIClient("unix://" + sock, timeout=30.0) as cri:
                try:
                    items = (await cri.runtime("ListPodSandbox", pb.ListPodSandboxRequest())).items
                    for sb in items:
                        await cri.runtime("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=sb.id))
                        await cri.runtime("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=sb.id))
                        removed += 1
                except CRIError:
                    continue
        return removed

    async def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM, then SIGKILL; then whatever the agent's runtime left is removed."""
        try:
            await self.remove_sandboxes()
        except Exception:  # noqa: BLE001 - what is left is removed below
            pass
        if self.proc is not None:
            from kubeplane.node.containerd import terminate

            await terminate(self.proc, timeout)
        self.cleanup()

    def cleanup(self) -> None:
        from kubeplane.node.containerd import kill_shims, unmount_under

        # containerd, and the shims that outlive it (the socket is gone once containerd stopped)
        for pid in node_processes(None, self.data_dir).containerd:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        kill_shims(self.data_dir)
        for bridge in _bridges(self.data_dir):
            subprocess.run(["ip", "link", "del", bridge], capture_output=True)
        unmount_under(self.data_dir)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_pod_cidr() -> str:
    """A /24 for the node's pods that no route of this host covers yet."""
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    start = os.getpid() % 200
    for i in range(200):
        n = (start + i) % 200 + 20
        if f"10.251.{n}." not in routes:
            return f"10.251.{n}.0/24"
    raise RuntimeError("no free 10.251.x.0/24 for the node's pods")


def node_kubeconfig(cluster: Any, name: str, path: str) -> str:
    """A kubeconfig for ``system:node:<name>`` in group ``system:nodes`` (a client
    certificate from the cluster's CA, as a joined node has), so the node's
    requests go through the Node authorizer and NodeRestriction as a real
    node's do."""
    from kubeplane.auth import pki
    from kubeplane.client.kubeconfig import write_kubeconfig

    own = pki.PKI(cluster._pki_dir)
    cert, key = pki.issue(own.ca_cert, own.ca_key, f"system:node:{name}", orgs=("system:nodes",))
    write_kubeconfig(path, cluster.url, ca_data=own.ca_pem, client_cert_data=pki.cert_pem(cert),
                     client_key_data=pki.key_pem(key))
    return path


def _find(base: str, name: str) -> list[str]:
    out = []
    for root, _dirs, files in os.walk(base):
        if name in files:
            out.append(os.path.join(root, name))
    return out


def _bridges(base: str) -> list[str]:
    """The bridges the node's CNI configuration names."""
    import json

    out = []
    for root, _dirs, files in os.walk(base):
        for f in files:
            if f.endswith((".conflist", ".conf")):
                try:
                    with open(os.path.join(root, f)) as fh:
                        doc = json.load(fh)
                except (OSError, ValueError):
                    continue
                for plugin in doc.get("plugins") or [doc]:
                    if isinstance(plugin, dict) and plugin.get("type") == "bridge" and plugin.get("bridge"):
                        out.append(str(plugin["bridge"]))
    return out


# -- the workload ----------------------------------------------------------------

def startup_pod(name: str, namespace: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "sleep", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"],
                "resources": {"requests": {"cpu": "1m", "memory": "4Mi"}},
            }],
        },
    }


def _ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _running(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


class _Tracker:
    def __init__(self) -> None:
        self.created: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self.changed = asyncio.Event()

    def seen(self, pod: Any) -> None:
        pod = getattr(pod, "obj", pod)
        name = (pod.get("metadata") or {}).get("name", "")
        if name not in self.created:
            return
        now = time.perf_counter()
        if _running(pod) and name not in self.running:
            self.running[name] = now
            self.changed.set()
        if _ready(pod) and name not in self.ready:
            self.ready[name] = now
            self.changed.set()


async def _wait(check: Callable[[], Any], timeout: float, what: str, node: RealNode | None = None) -> None:
    deadline = time.perf_counter() + timeout
    while True:
        if await check():
            return
        if node is not None and node.exited() is not None:
            raise RuntimeError(f"the node agent exited with {node.exited()} while waiting for {what}:\n"
                               f"{node.tail_log()}")
        if time.perf_counter() > deadline:
            tail = f":\n{node.tail_log()}" if node is not None else ""
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}{tail}")
        await asyncio.sleep(0.1)


async def _node_ready(client: Any, name: str) -> bool:
    from kubeplane.api.errors import StatusError

    try:
        node = await client.get(NODES, name)
    except StatusError:
        return False
    return _ready(node)


async def _count(client: Any, namespace: str) -> int:
    return len((await client.list(PODS, namespace))["items"])


def _host_cpu_seconds() -> float | None:
    from kubeplane.node.stats import HostStats

    try:
        return HostStats().cpu_nanoseconds()[0] / 1e9
    except OSError:
        return None


def _sample(node: RealNode | None) -> dict[str, float]:
    if node is None:
        return {}
    procs = node.processes()
    return {
        "t": time.perf_counter(),
        "self_cpu": time.process_time(),
        "host_cpu": _host_cpu_seconds() or 0.0,
        "runtime_cpu": _sum([proc_cpu_seconds(p, children=True) for p in procs.containerd + procs.shims]),
        "agent_cpu": proc_cpu_seconds(procs.agent) or 0.0 if procs.agent else 0.0,
        "agent_rss": float(proc_rss_bytes(procs.agent) or 0) if procs.agent else 0.0,
        "containerd_rss": _sum([proc_rss_bytes(p) for p in procs.containerd]),
        "shim_rss": _sum([proc_rss_bytes(p) for p in procs.shims]),
        "shims": float(len(procs.shims)),
    }


async def run_batch(client: Any, factory: Any, node_name: str, count: int, *, node: RealNode | None,
                    in_flight: int = 10, steady_s: float = 10.0, timeout_s: float = 600.0,
                    progress: Progress | None = None) -> dict[str, Any]:
    """Create ``count`` pods, wait until every one is Ready, measure, delete them."""
    namespace = f"bench-node-{count}"
    await client.create(NAMESPACES, {"metadata": {"name": namespace}})

    async def has_sa() -> bool:
        try:
            await client.get(SERVICE_ACCOUNTS, "default", namespace)
            return True
        except Exception:  # noqa: BLE001 - not there yet
            return False

    await _wait(has_sa, 30.0, f"the default ServiceAccount of {namespace}")
    tracker = _Tracker()
    informer = factory.informer_for(PODS, namespace=namespace)
    informer.add_event_handler(tracker.seen, lambda _old, new: tracker.seen(new), None)
    factory.start()
    await factory.wait_for_cache_sync()

    before = _sample(node)
    slot = asyncio.Semaphore(in_flight)
    errors: list[BaseException] = []

    async def create(i: int) -> None:
        name = f"pod-{i:04d}"
        async with slot:
            tracker.created[name] = time.perf_counter()
            try:
                await client.create(PODS, startup_pod(name, namespace, node_name), namespace)
            except Exception as err:  # noqa: BLE001 - reported below
                errors.append(err)

    t0 = time.perf_counter()
    creators = [asyncio.get_running_loop().create_task(create(i)) for i in range(count)]
    last = time.perf_counter()
    done = 0
    timed_out = False
    while len(tracker.ready) < count:
        tracker.changed.clear()
        try:
            await asyncio.wait_for(tracker.changed.wait(), 1.0)
        except asyncio.TimeoutError:
            pass
        if errors:
            break
        if len(tracker.ready) != done:
            step = max(count // 10, 1)
            if progress is not None and len(tracker.ready) // step != done // step:
                progress(f"{count} pods: {len(tracker.ready)} Ready")
            done, last = len(tracker.ready), time.perf_counter()
        if node is not None and node.exited() is not None:
            raise RuntimeError(f"the node agent exited with {node.exited()}:\n{node.tail_log()}")
        if time.perf_counter() - last > timeout_s:
            timed_out = True
            break
    await asyncio.gather(*creators, return_exceptions=True)
    if errors:
        raise RuntimeError(f"creating the pods failed: {errors[0]}")
    end = max(tracker.ready.values(), default=time.perf_counter())
    started = _sample(node)

    # every pod running: what the agent costs while nothing changes
    await asyncio.sleep(2.0)
    idle0 = _sample(node)
    t_idle = time.perf_counter()
    await asyncio.sleep(steady_s)
    idle1 = _sample(node)
    idle_s = time.perf_counter() - t_idle

    # delete them all, and wait until the API has none left
    t_del = time.perf_counter()
    await asyncio.gather(*(client.delete(PODS, name, namespace) for name in tracker.created),
                         return_exceptions=True)

    async def none_left() -> bool:
        return await _count(client, namespace) == 0

    delete_timed_out = False
    try:
        await _wait(none_left, timeout_s, f"the pods of {namespace} to be deleted", node)
    except TimeoutError:
        # the node did not finish them: remove them from the API so the next batch starts clean
        delete_timed_out = True
        await asyncio.gather(*(client.delete(PODS, name, namespace, grace_period_seconds=0)
                               for name in tracker.created), return_exceptions=True)
    delete_s = time.perf_counter() - t_del

    def ms(values: dict[str, float]) -> list[float]:
        return sorted((values[n] - tracker.created[n]) * 1000 for n in values)

    running, ready = ms(tracker.running), ms(tracker.ready)
    n = len(ready)
    out: dict[str, Any] = {
        "pods": count, "ready": n, "timed_out": timed_out,
        "running_p50_ms": round(percentile(running, 50), 1), "running_p99_ms": round(percentile(running, 99), 1),
        "ready_p50_ms": round(percentile(ready, 50), 1), "ready_p99_ms": round(percentile(ready, 99), 1),
        "ready_max_ms": round(ready[-1], 1) if ready else None,
        "pods_per_s": round(n / (end - t0), 2) if end > t0 else None,
        "delete_s": round(delete_s, 2), "delete_timed_out": delete_timed_out,
    }
    if node is not None and n:
        out.update({
            "agent_cpu_ms_per_pod": round((started["agent_cpu"] - before["agent_cpu"]) * 1000 / n, 2),
            "runtime_cpu_ms_per_pod": round((started["runtime_cpu"] - before["runtime_cpu"]) * 1000 / n, 1),
            "control_plane_cpu_ms_per_pod": round((started["self_cpu"] - before["self_cpu"]) * 1000 / n, 1),
            "host_cores_busy": round((started["host_cpu"] - before["host_cpu"]) / (started["t"] - before["t"]), 2),
            "load_average": round(os.getloadavg()[0], 1),
            "agent_idle_millicores_per_pod": round(
                (idle1["agent_cpu"] - idle0["agent_cpu"]) / idle_s * 1000 / n, 3),
            "agent_idle_millicores": round((idle1["agent_cpu"] - idle0["agent_cpu"]) / idle_s * 1000, 1),
            "agent_rss_mb": round(idle1["agent_rss"] / 2**20, 1),
            "agent_rss_kb_per_pod": round((idle1["agent_rss"] - before["agent_rss"]) / 1024 / n, 1),
            "runtime_rss_mb": round((idle1["containerd_rss"] + idle1["shim_rss"]) / 2**20, 1),
            "shim_rss_kb_per_pod": round(idle1["shim_rss"] / 1024 / max(idle1["shims"], 1), 1),
            "shims": int(idle1["shims"]),
        })
    return out


async def run_node_bench(*, counts: tuple[int, ...] = DEFAULT_COUNTS, simulated: bool = False,
                         in_flight: int = 10, steady_s: float = 10.0, timeout_s: float = 600.0,
                         node_args: list[str] | None = None, progress: Progress | None = None) -> dict[str, Any]:
    """Start a cluster and one node, run a batch per count (one after the
    other, the node emptied in between), stop everything. ``simulated`` runs
    the same workload on a simulated node (no agent process to measure)."""
    from kubeplane.client.http import HttpClient
    from kubeplane.client.informer import SharedInformerFactory
    from kubeplane.testing import Cluster

    if not counts or any(c < 1 for c in counts):
        raise ValueError("every pod count must be at least 1")
    work = tempfile.mkdtemp(prefix="kubeplane-bench-node-")
    node: RealNode | None = None
    results: list[dict[str, Any]] = []
    t_setup = time.perf_counter()
    try:
        async with Cluster(scheduler=True, controllers=True, nodes=1 if simulated else 0,
                           node_pods=max(counts) + 10) as cluster:
            client = HttpClient.from_kubeconfig(cluster.kubeconfig)
            factory = SharedInformerFactory(client)
            try:
                if simulated:
                    node_name = "node-0"
                else:
                    kubeconfig = node_kubeconfig(cluster, NODE_NAME, os.path.join(work, "node.kubeconfig"))
                    node = RealNode(kubeconfig, work, max_pods=max(counts) + 10, extra_args=node_args)
                    node.start()
                    node_name = node.name
                if progress is not None:
                    progress(f"waiting for node {node_name} to be Ready")
                await _wait(lambda: _node_ready(client, node_name), 180.0, f"node {node_name} Ready", node)
                setup_s = time.perf_counter() - t_setup
                # one pod first: the node's first sandbox sets up what the others reuse
                warm = await run_batch(client, factory, node_name, 1, node=node, in_flight=1, steady_s=0.1,
                                       timeout_s=timeout_s)
                if warm["ready"] != 1:
                    raise RuntimeError(f"the first pod on {node_name} did not become Ready within "
                                       f"{timeout_s:g}s" + (f":\n{node.tail_log()}" if node else ""))
                for count in counts:
                    if progress is not None:
                        progress(f"{count} pods: creating")
                    results.append(await run_batch(client, factory, node_name, count, node=node,
                                                   in_flight=in_flight, steady_s=steady_s,
                                                   timeout_s=timeout_s, progress=progress))
            finally:
                await factory.stop()
                await client.close()
                if node is not None:
                    await node.stop()
    finally:
        if node is not None:
            node.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    return {"workload": "node", "node": "simulated" if simulated else "real", "in_flight": in_flight,
            "setup_s": round(setup_s, 2), "batches": results}


async def run_cli(*, counts: tuple[int, ...] = DEFAULT_COUNTS, as_json: bool = False,
                  node_args: list[str] | None = None) -> dict[str, Any]:
    import json

    def progress(msg: str) -> None:
        if not as_json:
            print(msg, file=sys.stderr, flush=True)

    out = await run_node_bench(counts=counts, node_args=node_args, progress=progress)
    if as_json:
        print(json.dumps(out))
    else:
        print(f"kubeplane bench node (one real node, setup {out['setup_s']} s, {out['in_flight']} creates in flight)")
        keys = [k for k in out["batches"][0]] if out["batches"] else []
        width = max((len(k) for k in keys), default=0)
        for k in keys:
            print(f"{k:<{width}}  " + "  ".join(f"{str(b.get(k)):>10}" for b in out["batches"]))
    return out


__all__ = ["RealNode", "node_processes", "proc_cpu_seconds", "proc_rss_bytes", "run_batch", "run_cli",
           "run_node_bench", "startup_pod"]
