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

from aiohttp import web
from apiserver_requests import one_run

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
    """CPU microseconds per create and per get (the figures apiserver_requests.py measures)."""
    *_, create_cpu, get_cpu = await one_run(n, clients)
    return create_cpu, get_cpu


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
