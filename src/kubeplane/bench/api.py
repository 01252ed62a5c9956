"""``kubeplane bench api``: API machinery throughput, latency and memory.

Run on demand (never as a timed test). Every figure is the median of several
runs; the machine is shared and noisy, so single runs mean little.

Measured:

* creates/s through the in-process client, SQLite storage (fsync on), 8
  concurrent writers;
* creates/s over HTTP against an API server subprocess (SQLite), 8 concurrent
  clients;
* time to list 10,000 pods over HTTP (JSON);
* watch delivery latency (p50/p99) with 10 watchers at a steady write rate;
* resident memory of a process holding 10,000 pods in storage and in an
  informer cache;
* what authorization costs: creates/s over HTTP with AlwaysAllow, with RBAC
  as system:masters and with RBAC as an ordinary user, and microseconds per
  authorization (:mod:`kubeplane.bench.authz`).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from kubeplane import runtime
from kubeplane.api.resources import CATALOGUE, resource

PODS = resource("pods")
NAMESPACES = resource("namespaces")


def pod_body(name: str, extra_annotations: dict[str, str] | None = None) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "labels": {"app": "bench", "tier": "web"}}
    if extra_annotations:
        md["annotations"] = extra_annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": md,
        "spec": {"containers": [{
            "name": "app",
            "image": "nginx:1.27",
            "ports": [{"containerPort": 80}],
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        }]},
    }


# -- in-process -----------------------------------------------------------


async def _inprocess_creates(n: int, writers: int) -> float:
    from kubeplane.apiserver.app import ensure_default_namespaces
    from kubeplane.client.inprocess import InProcessClient
    from kubeplane.registry.registry import Registry
    from kubeplane.storage import open_store

    with tempfile.TemporaryDirectory() as d:
        store = await open_store("sqlite", d)
        registry = Registry(store, CATALOGUE)
        await ensure_default_namespaces(registry)
        client = InProcessClient(registry)
        per = n // writers

        async def writer(w: int) -> None:
            for i in range(per):
                await client.create(PODS, pod_body(f"p-{w}-{i}"), "default")

        await asyncio.gather(*(client.create(PODS, pod_body(f"warm-{i}"), "default") for i in range(50)))
        t0 = time.perf_counter()
        await asyncio.gather(*(writer(w) for w in range(writers)))
        elapsed = time.perf_counter() - t0
        await registry.close()
        await store.close()
    return per * writers / elapsed


# -- over HTTP --------------------------------------------------------------


class ServerProc:
    """``kubeplane apiserver`` in a subprocess: plain HTTP (``--insecure-http``,
    no authentication) unless ``tls``, then HTTPS with the admin certificate."""

    def __init__(self, data_dir: str, storage: str = "sqlite", *, tls: bool = False) -> None:
        self.data_dir = data_dir
        self.tls = tls
        kubeconfig = Path(data_dir) / "kubeconfig"
        self.log = open(Path(data_dir) / "server.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kubeplane.cli.main", "apiserver", "--listen", "127.0.0.1:0",
             "--storage", storage, "--data-dir", str(Path(data_dir) / "data"), "--kubeconfig", str(kubeconfig),
             *([] if tls else ["--insecure-http"])],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while not kubeconfig.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("API server did not start")
            time.sleep(0.05)
        import yaml

        cfg = yaml.safe_load(kubeconfig.read_text())
        self.url = cfg["clusters"][0]["cluster"]["server"]

    def ssl_context(self) -> Any:
        """The client TLS context (the cluster CA, the admin certificate), or None."""
        if not self.tls:
            return None
        import ssl

        pki = Path(self.data_dir) / "data" / "pki"
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        return ctx

    def rss_mb(self) -> float:
        return _rss_mb(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def _rss_mb(pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def _ensure_ns(s: aiohttp.ClientSession, ns: str) -> None:
    r = await s.post("/api/v1/namespaces", data=orjson.dumps({"metadata": {"name": ns}}),
                     headers={"Content-Type": "application/json"})
    await r.read()


async def _http_creates(url: str, ns: str, n: int, clients: int, ssl: Any = None) -> float:
    sessions = [aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(ssl=ssl if ssl is not None else False))
                for _ in range(clients)]
    try:
        await _ensure_ns(sessions[0], ns)
        per = n // clients
        path = f"/api/v1/namespaces/{ns}/pods"
        headers = {"Content-Type": "application/json"}

        async def client(c: int, s: aiohttp.ClientSession) -> None:
            for i in range(per):
                r = await s.post(path, data=orjson.dumps(pod_body(f"p-{c}-{i}")), headers=headers)
                if r.status != 201:
                    raise RuntimeError(f"create failed: {r.status} {await r.text()}")
                await r.read()

        t0 = time.perf_counter()
        await asyncio.gather(*(client(c, s) for c, s in enumerate(sessions)))
        return per * clients / (time.perf_counter() - t0)
    finally:
        for s in sessions:
            await s.close()


async def _fill(url: str, ns: str, n: int, concurrency: int = 16) -> None:
    async with aiohttp.ClientSession(url) as s:
        await _ensure_ns(s, ns)
        headers = {"Content-Type": "application/json"}
        it = iter(range(n))

        async def worker() -> None:
            for i in it:
                r = await s.post(f"/api/v1/namespaces/{ns}/pods", data=orjson.dumps(pod_body(f"p-{i}")),
                                 headers=headers)
                await r.read()

        await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _list_time(url: str, ns: str, runs: int) -> tuple[float, float, int]:
    """(median seconds until the whole response is received, median client
    JSON decode seconds, item count)."""
    times, decode = [], []
    count = 0
    async with aiohttp.ClientSession(url) as s:
        for _ in range(runs):
            t0 = time.perf_counter()
            r = await s.get(f"/api/v1/namespaces/{ns}/pods")
            body = await r.read()
            t1 = time.perf_counter()
            data = orjson.loads(body)
            decode.append(time.perf_counter() - t1)
            times.append(t1 - t0)
            count = len(data["items"])
    return statistics.median(times), statistics.median(decode), count


_WATCHER_CHILD = r"""
import asyncio, sys, time
import aiohttp, orjson

async def main(url, ns, rv, n, seconds):
    lat = []
    ready = 0
    async def watch():
        nonlocal ready
        async with aiohttp.ClientSession(url, timeout=aiohttp.ClientTimeout(total=None)) as s:
            r = await s.get(f"/api/v1/namespaces/{ns}/configmaps",
                            params={"watch": "true", "resourceVersion": rv, "timeoutSeconds": str(int(seconds) + 30)})
            ready += 1
            if ready == n:
                print("ready", flush=True)
            async for line in r.content:
                now = time.time()
                ev = orjson.loads(line)
                t = (ev["object"].get("data") or {}).get("t")
                if t == "stop":
                    return
                if t and t != "0":
                    lat.append((now - float(t)) * 1000)
    await asyncio.gather(*(watch() for _ in range(n)))
    sys.stdout.write(orjson.dumps(lat).decode() + "\n")

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])))
"""


async def _watch_latency(watchers: int, rate: float, seconds: float) -> list[float]:
    """Watch delivery latency: writes enter through the in-process client (as
    kubeplane's own controllers write) at a steady rate, with SQLite fsync on;
    ``watchers`` HTTP watch streams in a separate process record arrival time
    minus the send time stamped into each object."""
    from kubeplane.apiserver.app import APIServer, APIServerConfig
    from kubeplane.client.inprocess import InProcessClient

    cms = resource("configmaps")
    with tempfile.TemporaryDirectory() as d:
        server = APIServer(APIServerConfig(insecure_http=True, data_dir=d, listen="127.0.0.1:0", storage="sqlite"))
        await server.start()
        try:
            client = InProcessClient(server.registry)
            for i in range(10):
                await client.create(cms, {"metadata": {"name": f"cm-{i}"}, "data": {"t": "0"}}, "default")
            rv = (await client.list(cms, "default"))["metadata"]["resourceVersion"]
            child = await asyncio.create_subprocess_exec(
                sys.executable, "-c", _WATCHER_CHILD, server.url, "default", rv, str(watchers), str(seconds),
                stdout=asyncio.subprocess.PIPE,
            )
            line = await asyncio.wait_for(child.stdout.readline(), 30)
            if line.strip() != b"ready":
                raise RuntimeError(f"watchers did not start: {line!r}")
            await asyncio.sleep(0.2)
            interval = 1.0 / rate
            total = int(rate * seconds)
            t_start = time.perf_counter()
            inflight: set[asyncio.Task] = set()

            async def write(i: int) -> None:
                await client.patch(cms, f"cm-{i % 10}", {"data": {"t": repr(time.time())}}, "default")

            for i in range(total):
                delay = t_start + i * interval - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(write(i))
                inflight.add(task)
                task.add_done_callback(inflight.discard)
            await asyncio.gather(*inflight)
            await client.patch(cms, "cm-0", {"data": {"t": "stop"}}, "default")
            out, _ = await asyncio.wait_for(child.communicate(), 60)
            return orjson.loads(out.strip().splitlines()[-1])
        finally:
            await server.stop()


def _percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = min(len(values) - 1, max(0, int(round(p / 100 * (len(values) - 1)))))
    return values[k]


# -- memory -----------------------------------------------------------------

_RSS_CHILD = r"""
import asyncio, json, sys, tempfile
from kubeplane.bench.api import pod_body, _rss_mb, PODS
from kubeplane.api.resources import CATALOGUE
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.inprocess import InProcessClient
from kubeplane.client.informer import SharedInformer
from kubeplane.registry.registry import Registry
from kubeplane.storage import open_store

async def main(n):
    with tempfile.TemporaryDirectory() as d:
        base = _rss_mb()
        store = await open_store("sqlite", d)
        registry = Registry(store, CATALOGUE)
        await ensure_default_namespaces(registry)
        client = InProcessClient(registry)
        sem = asyncio.Semaphore(64)
        async def one(i):
            async with sem:
                await client.create(PODS, pod_body(f"p-{i}"), "default")
        await asyncio.gather(*(one(i) for i in range(n)))
        inf = SharedInformer(client, PODS)
        inf.add_event_handler(lambda o: None, lambda a, b: None, lambda o: None)
        inf.start()
        await inf.wait_for_sync(60)
        assert len(inf.indexer.list()) == n
        import gc; gc.collect()
        print(json.dumps({"rss_mb": _rss_mb(), "base_mb": base}))
        await inf.stop()
        await registry.close(); await store.close()

asyncio.run(main(int(sys.argv[1])))
"""


def _rss_with_informer(n: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(n)], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- driver -----------------------------------------------------------------


def run(*, runs: int = 3, progress=print) -> dict[str, Any]:
    result: dict[str, Any] = {"runs": runs}
    progress("in-process creates (SQLite, 8 writers)...")
    vals = [runtime.run(_inprocess_creates(4000, 8)) for _ in range(runs)]
    result["creates_per_s_inprocess"] = round(statistics.median(vals))
    result["creates_per_s_inprocess_runs"] = [round(v) for v in vals]
    with tempfile.TemporaryDirectory() as d:
        srv = ServerProc(d)
        try:
            progress("HTTP creates (SQLite, 8 clients)...")
            vals = [runtime.run(_http_creates(srv.url, f"http-{i}", 2400, 8)) for i in range(runs)]
            result["creates_per_s_http"] = round(statistics.median(vals))
            result["creates_per_s_http_runs"] = [round(v) for v in vals]
            progress("filling 10,000 pods...")
            runtime.run(_fill(srv.url, "list", 10_000))
            progress("listing 10,000 pods...")
            t, dec, count = runtime.run(_list_time(srv.url, "list", max(runs, 5)))
            if count != 10_000:
                raise RuntimeError(f"listed {count} pods, expected 10000")
            result["list_10k_pods_s"] = round(t, 4)
            result["list_10k_pods_client_decode_s"] = round(dec, 4)
            result["server_rss_mb_after_list"] = round(srv.rss_mb(), 1)
        finally:
            srv.stop()
    with tempfile.TemporaryDirectory() as d:
        srv = ServerProc(d, tls=True)
        try:
            progress("HTTPS creates with authentication (SQLite, 8 clients, client certificates)...")
            vals = [runtime.run(_http_creates(srv.url, f"https-{i}", 2400, 8, srv.ssl_context()))
                    for i in range(runs)]
            result["creates_per_s_https"] = round(statistics.median(vals))
            result["creates_per_s_https_runs"] = [round(v) for v in vals]
        finally:
            srv.stop()
    progress("watch latency (10 watchers, 1000 writes/s)...")
    p50s, p99s, events = [], [], 0
    for _ in range(runs):
        lat = runtime.run(_watch_latency(10, 1000.0, 5.0))
        p50s.append(_percentile(lat, 50))
        p99s.append(_percentile(lat, 99))
        events += len(lat)
    result["watch_p50_ms"] = round(statistics.median(p50s), 2)
    result["watch_p99_ms"] = round(statistics.median(p99s), 2)
    result["watch_events_received"] = events
    progress("memory with 10,000 pods stored and cached by an informer...")
    mem = [_rss_with_informer(10_000) for _ in range(max(1, runs // 2))]
    result["rss_mb_10k_pods"] = round(statistics.median(m["rss_mb"] for m in mem), 1)
    result["rss_mb_baseline"] = round(statistics.median(m["base_mb"] for m in mem), 1)
    from kubeplane.bench import authz

    result.update(authz.run(runs=max(runs, 3), progress=progress))
    result["cpu_count"] = os.cpu_count()
    return result
