"""What authorization costs on the create path, for ``kubeplane bench api``.

An API server (memory storage, so that the CPU cost of authorization is not
hidden under fsync waits) is run in a subprocess in three ways and loaded with the same 8 concurrent HTTP clients creating pods:
with ``AlwaysAllow``; with RBAC, as a member of ``system:masters`` (the
privileged group: no rule is looked at); and with RBAC, as an ordinary user
allowed by the ``edit`` ClusterRole (aggregated, about 30 rules) through a
RoleBinding in the namespace, plus the bootstrap bindings of every
authenticated user. The request's user comes from a header that only this
benchmark's server reads (it stands for the authentication filter, which is
measured elsewhere).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


from kubeplane import runtime

USER_HEADER = "X-Bench-User"
BENCH_USER = "bench-user"


async def _serve(data_dir: str, mode: str, url_file: str) -> None:
    from aiohttp import web

    from kubeplane.api.resources import CATALOGUE, resource
    from kubeplane.apiserver.app import ensure_default_namespaces
    from kubeplane.apiserver.bootstrappolicy import reconcile
    from kubeplane.apiserver.clusterroleaggregation import ClusterRoleAggregator
    from kubeplane.apiserver.server import build_app
    from kubeplane.auth.authorizer import AlwaysAllow
    from kubeplane.auth.rbac import PolicyCache, RBACAuthorizer
    from kubeplane.auth.user import AUTHENTICATED, SYSTEM_MASTERS, UserInfo, acting_as
    from kubeplane.registry.registry import Registry
    from kubeplane.storage import open_store

    store = await open_store("memory", None)
    cache = PolicyCache(store)
    await cache.start()
    authorizer = RBACAuthorizer(cache) if mode == "RBAC" else AlwaysAllow()
    registry = Registry(store, CATALOGUE, authorizer=authorizer)
    await ensure_default_namespaces(registry)
    await reconcile(registry)
    aggregator = ClusterRoleAggregator(registry, cache)
    await aggregator.start()
    users = {
        BENCH_USER: UserInfo(BENCH_USER, groups=(AUTHENTICATED,)),
        "bench-admin": UserInfo("bench-admin", groups=(SYSTEM_MASTERS, AUTHENTICATED)),
    }

    @web.middleware
    async def as_user(request: web.Request, handler):
        user = users.get(request.headers.get(USER_HEADER, ""))
        if user is None:
            return await handler(request)
        with acting_as(user):
            return await handler(request)

    app = build_app(registry, CATALOGUE)
    app.middlewares.insert(0, as_user)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - the port 0 picked
    # the user's grant: edit in the namespaces the clients write to
    rb = resource("rolebindings", "rbac.authorization.k8s.io")
    for i in range(8):
        ns = f"authz-{i}"
        await registry.create(resource("namespaces"), {"metadata": {"name": ns}})
        await registry.create(rb, {"metadata": {"name": "bench-edit", "namespace": ns},
                                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                               "name": "edit"},
                                   "subjects": [{"kind": "User", "name": BENCH_USER,
                                                 "apiGroup": "rbac.authorization.k8s.io"}]})
    await cache.wait_for_revision(store.revision)
    # written whole, then moved into place: the parent waits for the file to exist
    tmp = Path(url_file + ".tmp")
    tmp.write_text(f"http://127.0.0.1:{port}")
    os.replace(tmp, url_file)
    await asyncio.Event().wait()


async def _creates(url: str, ns: str, n: int, clients: int, user: str) -> float:
    """Pod creates/s as ``user`` (the test server sets it from a header) in ``ns``."""
    from kubeplane.bench.api import _http_creates

    return await _http_creates(url, ns, n, clients, headers={USER_HEADER: user}, ensure_ns=False)


def _start(d: str, mode: str) -> tuple[subprocess.Popen, str]:
    url_file = Path(d) / "url"
    log = open(Path(d) / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "kubeplane.bench.authz", "--data-dir", str(Path(d) / "data"),
                             "--mode", mode, "--url-file", str(url_file)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while not url_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the benchmark's API server did not start")
        time.sleep(0.05)
    return proc, url_file.read_text()


def run(*, runs: int = 3, n: int = 2400, authorize_samples: int = 20_000, progress=print) -> dict[str, Any]:
    """creates/s with AlwaysAllow, RBAC as system:masters and RBAC as an ordinary user (medians)."""
    result: dict[str, Any] = {}
    cases = (("creates_per_s_http_authz_always_allow", "AlwaysAllow", BENCH_USER),
             ("creates_per_s_http_rbac_masters", "RBAC", "bench-admin"),
             ("creates_per_s_http_rbac_user", "RBAC", BENCH_USER))
    samples: dict[str, list[float]] = {key: [] for key, _, _ in cases}
    with tempfile.TemporaryDirectory() as d:
        procs = {}
        try:
            for key, mode, _user in cases:
                sub = Path(d) / key
                sub.mkdir()
                procs[key] = _start(str(sub), mode)
            progress("HTTP creates: AlwaysAllow / RBAC (masters) / RBAC (user bound to edit), interleaved...")
            for r in range(runs):
                for key, _mode, user in cases:
                    samples[key].append(runtime.run(_creates(procs[key][1], f"authz-{r % 8}", n, 8, user)))
        finally:
            for proc, _url in procs.values():
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
    for key, values in samples.items():
        result[key] = round(statistics.median(values))
        result[key + "_runs"] = [round(v) for v in values]
    base = result["creates_per_s_http_authz_always_allow"]
    if base:
        result["rbac_user_cost_pct"] = round(100 * (1 - result["creates_per_s_http_rbac_user"] / base), 1)
    result["authorize_us_rbac_user"] = round(_authorize_cost_us(authorize_samples), 2)
    return result


def _authorize_cost_us(n: int = 20_000) -> float:
    """Microseconds per request info + authorization of a pod create by the
    ordinary user (the decision cache warm, as it is under load)."""
    from kubeplane.auth.rbac import PolicyCache, RBACAuthorizer
    from kubeplane.auth.requestinfo import request_info
    from kubeplane.auth.user import AUTHENTICATED, UserInfo
    from kubeplane.storage.memory import MemoryStore

    async def measure() -> float:
        from kubeplane.api.resources import CATALOGUE
        from kubeplane.apiserver.bootstrappolicy import reconcile
        from kubeplane.apiserver.clusterroleaggregation import ClusterRoleAggregator
        from kubeplane.registry.registry import Registry

        store = MemoryStore()
        cache = PolicyCache(store)
        await cache.start()
        registry = Registry(store, CATALOGUE, authorizer=RBACAuthorizer(cache))
        await reconcile(registry)
        agg = ClusterRoleAggregator(registry, cache)
        while True:
            await cache.wait_for_revision(store.revision)
            if not await agg.sync():
                break
        authz = RBACAuthorizer(cache)
        user = UserInfo(BENCH_USER, groups=(AUTHENTICATED,))
        t0 = time.perf_counter()
        for i in range(n):  # what the filter does for a request, without its request-info memo
            authz.decide(user, request_info("POST", "/api/v1/namespaces/authz-0/pods", {}))
        took = time.perf_counter() - t0
        await cache.stop()
        await store.close()
        return took / n * 1e6

    return runtime.run(measure())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="the authorization benchmark's API server (not for use otherwise)")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--mode", choices=("RBAC", "AlwaysAllow"), required=True)
    p.add_argument("--url-file", required=True)
    args = p.parse_args(argv)
    runtime.run(_serve(args.data_dir, args.mode, args.url_file))


if __name__ == "__main__":
    main()
