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
  authorization (:mod:`kubeplane.bench.authz`);
* creates/s of a custom resource (a CRD whose schema has 20 fields, a default
  and a CEL rule) over HTTP with neither authentication nor authorization,
  and over HTTPS with authentication (a bearer token) and RBAC (the user is
  allowed by a RoleBinding), alternating runs, and the ratio of the two: what
  authentication, authorization and admission cost together.
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

    def __init__(self, data_dir: str, storage: str = "sqlite", *, tls: bool = False,
                 extra: tuple[str, ...] = ()) -> None:
        self.data_dir = data_dir
        self.tls = tls
        kubeconfig = Path(data_dir) / "kubeconfig"
        self.log = open(Path(data_dir) / "server.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kubeplane.cli.main", "apiserver", "--listen", "127.0.0.1:0",
             "--storage", storage, "--data-dir", str(Path(data_dir) / "data"), "--kubeconfig", str(kubeconfig),
             *([] if tls else ["--insecure-http"]), *extra],
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

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the server process has used."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

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


async def _http_creates(url: str, ns: str, n: int, clients: int, ssl: Any = None, *,
                        path: str = "/api/v1/namespaces/{ns}/pods", body: Any = None,
                        headers: dict[str, str] | None = None, ensure_ns: bool = True) -> float:
    """creates/s of ``clients`` concurrent keep-alive sessions (each its own
    connection, so TLS is negotiated once per client) posting ``body(name)``
    (default: a pod) to ``path``; ``headers`` go with every request."""
    sessions = [aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(ssl=ssl if ssl is not None else False))
                for _ in range(clients)]
    make = body or pod_body
    try:
        if ensure_ns:
            await _ensure_ns(sessions[0], ns)
        per = n // clients
        path = path.format(ns=ns)
        headers = {"Content-Type": "application/json", **(headers or {})}

        async def client(c: int, s: aiohttp.ClientSession) -> None:
            for i in range(per):
                r = await s.post(path, data=orjson.dumps(make(f"p-{c}-{i}")), headers=headers)
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


# -- custom resources, plain and with authentication + RBAC -----------------

CR_GROUP = "bench.kubeplane.io"
CR_PLURAL = "widgets"
CR_PATH = f"/apis/{CR_GROUP}/v1/namespaces/{{ns}}/{CR_PLURAL}"
CR_USER = "bench-cr-user"
CR_TOKEN = "bench-cr-token-0123456789abcdef"


def cr_definition() -> dict[str, Any]:
    """The benchmark's CRD: 20 spec fields of assorted types and checks, a
    default (``tier``) and a CEL rule across two fields."""
    fields: dict[str, Any] = {
        "replicas": {"type": "integer", "minimum": 0, "maximum": 1000},
        "maxReplicas": {"type": "integer", "minimum": 1},
        "tier": {"type": "string", "enum": ["standard", "premium"], "default": "standard"},
        "image": {"type": "string", "maxLength": 253},
        "owner": {"type": "string", "pattern": "^[a-z][a-z0-9-]*$"},
        "paused": {"type": "boolean"},
        "weight": {"type": "number", "minimum": 0},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "ports": {"type": "array", "maxItems": 16, "items": {"type": "integer", "minimum": 1, "maximum": 65535}},
        "size": {"x-kubernetes-int-or-string": True},
    }
    for i in range(len(fields), 20):
        fields[f"note{i}"] = {"type": "string", "maxLength": 64}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{CR_PLURAL}.{CR_GROUP}"},
        "spec": {
            "group": CR_GROUP,
            "scope": "Namespaced",
            "names": {"plural": CR_PLURAL, "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {"spec": {
                    "type": "object",
                    "required": ["replicas", "maxReplicas"],
                    "properties": fields,
                    "x-kubernetes-validations": [{"rule": "self.replicas <= self.maxReplicas",
                                                  "message": "replicas must not exceed maxReplicas"}],
                }},
            }}}],
        },
    }


def cr_body(name: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": 3, "maxReplicas": 10, "image": "registry.example/widget:1.0", "owner": "team-a",
        "paused": False, "weight": 1.5, "labels": {"app": "bench"}, "ports": [80, 443], "size": "10Gi",
    }
    for i in range(10, 20):
        spec[f"note{i}"] = f"note {i}"
    return {"apiVersion": f"{CR_GROUP}/v1", "kind": "Widget",
            "metadata": {"name": name, "labels": {"app": "bench"}}, "spec": spec}


async def _cr_setup(url: str, ssl: Any, namespaces: list[str], *, user_ssl: Any = None, bind_user: bool) -> None:
    """As the admin: the CRD (waited for Established), the namespaces and,
    with ``bind_user``, a ClusterRole allowing creates of the custom resource
    bound to the token's user by a RoleBinding in each namespace; then waits
    until the user (if bound) may create, by creating one."""
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(ssl=ssl if ssl is not None else False)) as s:
        async def post(path: str, obj: dict) -> None:
            r = await s.post(path, data=orjson.dumps(obj), headers=headers)
            if r.status not in (201, 409):
                raise RuntimeError(f"POST {path}: {r.status} {await r.text()}")
            await r.read()

        crd = cr_definition()
        await post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        deadline = time.monotonic() + 30
        while True:
            r = await s.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}")
            conds = (orjson.loads(await r.read()).get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Established" and c.get("status") == "True" for c in conds):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the benchmark's CRD was not established: {conds}")
            await asyncio.sleep(0.05)
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        if bind_user:
            await post(f"{rbac}/clusterroles", {
                "metadata": {"name": "bench-widget-creator"},
                "rules": [{"apiGroups": [CR_GROUP], "resources": [CR_PLURAL], "verbs": ["create"]}]})
        for ns in namespaces:
            await post("/api/v1/namespaces", {"metadata": {"name": ns}})
            if bind_user:
                await post(f"{rbac}/namespaces/{ns}/rolebindings", {
                    "metadata": {"name": "bench-widget-creator"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                "name": "bench-widget-creator"},
                    "subjects": [{"kind": "User", "name": CR_USER, "apiGroup": "rbac.authorization.k8s.io"}]})
    user_headers = {**headers, **({"Authorization": f"Bearer {CR_TOKEN}"} if bind_user else {})}
    user_ssl = user_ssl if bind_user else ssl
    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(
            ssl=user_ssl if user_ssl is not None else False)) as s:
        for ns in namespaces:  # the grant is seen (the RBAC cache follows storage) before measuring
            deadline = time.monotonic() + 30
            while True:
                r = await s.post(CR_PATH.format(ns=ns), data=orjson.dumps(cr_body("warm-up")), headers=user_headers)
                text = await r.text()
                if r.status == 201:
                    break
                if r.status != 403 or time.monotonic() > deadline:
                    raise RuntimeError(f"warm-up create in {ns}: {r.status} {text}")
                await asyncio.sleep(0.05)


def _ca_only(ca_file: str) -> Any:
    """A client TLS context trusting the cluster CA, with no client
    certificate (the token authenticates)."""
    import ssl

    return ssl.create_default_context(cafile=ca_file)


def cr_creates(*, runs: int = 3, n: int = 2400, clients: int = 8, storage: str = "memory",
               progress=print) -> dict[str, Any]:
    """``creates_per_s_cr_http``: custom resource creates/s over plain HTTP
    (``--insecure-http --authorization-mode AlwaysAllow``: no authentication,
    no authorization) and ``creates_per_s_cr_https_authn_rbac`` over HTTPS as a
    token-auth-file user that an RBAC RoleBinding allows; the two servers
    are measured in alternation (run r of each back to back, so that a busy
    moment of the machine falls on both), medians and the cost in percent."""
    result: dict[str, Any] = {}
    namespaces = [f"cr-{r}" for r in range(runs)]
    with tempfile.TemporaryDirectory() as d:
        plain_dir, secure_dir = Path(d) / "plain", Path(d) / "secure"
        plain_dir.mkdir()
        secure_dir.mkdir()
        tokens = secure_dir / "tokens.csv"
        tokens.write_text(f'{CR_TOKEN},{CR_USER},1001,"bench-cr-group"\n')
        plain = secure = None
        try:
            plain = ServerProc(str(plain_dir), storage, extra=("--authorization-mode", "AlwaysAllow"))
            secure = ServerProc(str(secure_dir), storage, tls=True, extra=("--token-auth-file", str(tokens)))
            user_ssl = _ca_only(str(secure_dir / "data" / "pki" / "ca.crt"))
            runtime.run(_cr_setup(plain.url, None, namespaces, bind_user=False))
            runtime.run(_cr_setup(secure.url, secure.ssl_context(), namespaces, user_ssl=user_ssl, bind_user=True))
            auth = {"Authorization": f"Bearer {CR_TOKEN}"}
            progress(f"custom resource creates ({storage}, {clients} clients): plain HTTP / HTTPS with a token "
                     "and RBAC, alternating...")
            plain_vals, secure_vals, plain_cpu, secure_cpu = [], [], [], []
            for ns in namespaces:
                c0 = plain.cpu_s()
                plain_vals.append(runtime.run(_http_creates(plain.url, ns, n, clients, path=CR_PATH, body=cr_body,
                                                            ensure_ns=False)))
                plain_cpu.append((plain.cpu_s() - c0) / n * 1e6)
                c0 = secure.cpu_s()
                secure_vals.append(runtime.run(_http_creates(secure.url, ns, n, clients, user_ssl, path=CR_PATH,
                                                             body=cr_body, headers=auth, ensure_ns=False)))
                secure_cpu.append((secure.cpu_s() - c0) / n * 1e6)
        finally:
            for srv in (plain, secure):
                if srv is not None:
                    srv.stop()
    result["creates_per_s_cr_http"] = round(statistics.median(plain_vals))
    result["creates_per_s_cr_http_runs"] = [round(v) for v in plain_vals]
    result["creates_per_s_cr_https_authn_rbac"] = round(statistics.median(secure_vals))
    result["creates_per_s_cr_https_authn_rbac_runs"] = [round(v) for v in secure_vals]
    ratios = [sv / pv for pv, sv in zip(plain_vals, secure_vals)]
    result["cr_https_authn_rbac_ratio"] = round(statistics.median(ratios), 3)
    result["cr_https_authn_rbac_cost_pct"] = round(100 * (1 - statistics.median(ratios)), 1)
    # the server's own CPU time per create (the load generator shares the
    # machine, so this is the steadier figure of what the server pays)
    result["cr_server_cpu_us_per_create_http"] = round(statistics.median(plain_cpu))
    result["cr_server_cpu_us_per_create_https_authn_rbac"] = round(statistics.median(secure_cpu))
    if statistics.median(plain_cpu) > 0:
        result["cr_server_cpu_cost_pct"] = round(
            100 * (statistics.median(secure_cpu) / statistics.median(plain_cpu) - 1), 1)
    return result


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
    result.update(cr_creates(runs=runs, progress=progress))
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
