"""Requests per second through the API server's HTTP stack (in-process server,
memory storage, keep-alive client): the per-request cost of the middleware
(metrics, limits) shows up here before it shows up in ``kubeplane bench api``.

    PYTHONPATH=src python benchmarks/apiserver_requests.py [--n 3000] [--runs 5]

Prints the median creates/s (POST configmaps) and gets/s (GET one configmap)
with 8 concurrent clients, and the CPU time per request of this process
(server and client together): on a shared machine the CPU time varies far
less than the wall-clock rate.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

import aiohttp


async def one_run(n: int, clients: int) -> tuple[float, float, float, float]:
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

                t0, c0 = time.perf_counter(), time.process_time()
                await asyncio.gather(*(create(c) for c in range(clients)))
                t1, c1 = time.perf_counter(), time.process_time()
                await asyncio.gather(*(get(c) for c in range(clients)))
                t2, c2 = time.perf_counter(), time.process_time()
        finally:
            await server.stop()
    return n / (t1 - t0), n / (t2 - t1), (c1 - c0) / n * 1e6, (c2 - c1) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--clients", type=int, default=8)
    args = ap.parse_args()
    creates, gets, create_cpu, get_cpu = [], [], [], []
    for _ in range(args.runs):
        c, g, cc, gc = asyncio.run(one_run(args.n, args.clients))
        creates.append(c)
        gets.append(g)
        create_cpu.append(cc)
        get_cpu.append(gc)
    print(f"creates/s median {statistics.median(creates):.0f} (runs: {', '.join(f'{x:.0f}' for x in creates)}); "
          f"CPU per create median {statistics.median(create_cpu):.1f} us, min {min(create_cpu):.1f} us")
    print(f"gets/s    median {statistics.median(gets):.0f} (runs: {', '.join(f'{x:.0f}' for x in gets)}); "
          f"CPU per get median {statistics.median(get_cpu):.1f} us, min {min(get_cpu):.1f} us")


if __name__ == "__main__":
    main()
