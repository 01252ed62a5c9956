"""Requests per second through the API server's HTTP stack (in-process server,
memory storage, keep-alive client): the per-request cost of the middleware
(metrics, limits) shows up here before it shows up in ``kubeplane bench api``.

    PYTHONPATH=src python benchmarks/apiserver_requests.py [--n 3000] [--runs 5]

Prints the median creates/s (POST configmaps) and gets/s (GET one configmap)
with 8 concurrent clients.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

import aiohttp


async def one_run(n: int, clients: int) -> tuple[float, float]:
    from kubeplane.apiserver.app import APIServer, APIServerConfig

    with tempfile.TemporaryDirectory() as d:
        server = APIServer(APIServerConfig(data_dir=d, listen="127.0.0.1:0", storage="memory"))
        await server.start()
        try:
            base = server.url + "/api/v1/namespaces/default/configmaps"
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

                t0 = time.perf_counter()
                await asyncio.gather(*(create(c) for c in range(clients)))
                t1 = time.perf_counter()
                await asyncio.gather(*(get(c) for c in range(clients)))
                t2 = time.perf_counter()
        finally:
            await server.stop()
    return n / (t1 - t0), n / (t2 - t1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--clients", type=int, default=8)
    args = ap.parse_args()
    creates, gets = [], []
    for _ in range(args.runs):
        c, g = asyncio.run(one_run(args.n, args.clients))
        creates.append(c)
        gets.append(g)
    print(f"creates/s median {statistics.median(creates):.0f} (runs: {', '.join(f'{x:.0f}' for x in creates)})")
    print(f"gets/s    median {statistics.median(gets):.0f} (runs: {', '.join(f'{x:.0f}' for x in gets)})")


if __name__ == "__main__":
    main()
