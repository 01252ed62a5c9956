"""The API server's per-request metric cost, A/B in one process: the same
creates and gets through the HTTP stack with the metrics middleware and the
storage timings switched off and on, alternating, so both sides see the same
machine load. Reports the CPU time per request (server and client).

    PYTHONPATH=src python benchmarks/apiserver_metrics_ab.py [--rounds 8] [--n 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

import aiohttp
from aiohttp import web

import kubeplane.apiserver.app as appmod
from kubeplane.apiserver.metrics import APIServerMetrics

_INSTRUMENT = appmod.instrument_store
_MIDDLEWARE = APIServerMetrics.middleware


@web.middleware
async def _passthrough(request, handler):
    return await handler(request)


def _metrics(on: bool) -> None:
    appmod.instrument_store = _INSTRUMENT if on else (lambda store, metrics: None)
    APIServerMetrics.middleware = _MIDDLEWARE if on else (lambda self: _passthrough)


async def _one(n: int, clients: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as d:
        srv = appmod.APIServer(appmod.APIServerConfig(data_dir=d, listen="127.0.0.1:0", storage="memory"))
        await srv.start()
        base = srv.url + "/api/v1/namespaces/default/configmaps"
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as s:
                async def create(c: int) -> None:
                    for i in range(c, n, clients):
                        async with s.post(base, json={"metadata": {"name": f"cm-{i}"}, "data": {"k": "v"}}) as r:
                            assert r.status == 201, r.status
                            await r.read()

                async def get(c: int) -> None:
                    for i in range(c, n, clients):
                        async with s.get(f"{base}/cm-{i}") as r:
                            assert r.status == 200, r.status
                            await r.read()

                c0 = time.process_time()
                await asyncio.gather(*(create(c) for c in range(clients)))
                c1 = time.process_time()
                await asyncio.gather(*(get(c) for c in range(clients)))
                c2 = time.process_time()
        finally:
            await srv.stop()
    return (c1 - c0) / n * 1e6, (c2 - c1) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=8)
    args = ap.parse_args()
    results: dict[bool, tuple[list[float], list[float]]] = {False: ([], []), True: ([], [])}
    for _ in range(args.rounds):
        for on in (False, True):
            _metrics(on)
            c, g = asyncio.run(_one(args.n, args.clients))
            results[on][0].append(c)
            results[on][1].append(g)
    for on in (False, True):
        c, g = results[on]
        print(f"metrics {'on ' if on else 'off'}: CPU per create median {statistics.median(c):.1f} us "
              f"(min {min(c):.1f}), per get median {statistics.median(g):.1f} us (min {min(g):.1f})")


if __name__ == "__main__":
    main()
