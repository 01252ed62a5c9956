"""The scheduler process of ``kubeplane bench --split``.

Runs the scheduler (and, when asked, the workload's controllers) against the
benchmark's registry over the local wire, and takes line commands on stdin:

* ``catchup PLURAL COUNT SECONDS [settled]``: answer ``ok`` once the shared
  informer of that resource holds at least COUNT objects (with ``settled``:
  objects past phase Pending), or ``timeout`` after SECONDS;
* ``profile start`` / ``profile stop PATH``: cProfile this process from now
  on / write what it profiled to PATH (``ok``);
* ``stop`` (or end of input): stop everything, print one JSON line with the
  process's peak RSS and exit.

It prints ``ready`` once the scheduler's caches are synced.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource as _resource
import sys
import time
from contextlib import AsyncExitStack
from typing import Any

from kubeplane.api.resources import resource
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.wire import WireClient
from kubeplane.cluster import read_commands, say


async def serve(socket_path: str, seed: int, controllers: tuple[str, ...]) -> None:
    from kubeplane.bench.scheduler import count_held, start_scheduler_side

    async with AsyncExitStack() as stack:
        client = WireClient(socket_path, managed_fields=False)
        stack.push_async_callback(client.close)
        factory = SharedInformerFactory(client)
        stack.push_async_callback(factory.stop)
        await start_scheduler_side(stack, client, factory, controllers, seed)

        profiler: Any = None

        async def command(words: list[str]) -> None:
            nonlocal profiler
            if words[:2] == ["profile", "start"] and len(words) == 2:
                import cProfile

                profiler = cProfile.Profile()
                profiler.enable()
                say("ok")
            elif words[:2] == ["profile", "stop"] and len(words) >= 3 and profiler is not None:
                profiler.disable()
                profiler.dump_stats(" ".join(words[2:]))
                profiler = None
                say("ok")
            elif words[0] == "catchup" and len(words) in (4, 5):
                inf = factory.informer_for(resource(words[1]))
                want = int(words[2])
                deadline = time.monotonic() + float(words[3])
                settled = len(words) == 5 and words[4] == "settled"
                while count_held(inf.indexer, settled) < want:
                    if time.monotonic() > deadline:
                        say("timeout")
                        return
                    await asyncio.sleep(0.005)
                say("ok")
            else:
                say(f"error unknown command {' '.join(words)!r}")

        say("ready")
        await read_commands(command)
    say(json.dumps({"peak_rss_mb": round(_resource.getrusage(_resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kubeplane-bench-worker")
    p.add_argument("socket")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--controllers", default="", help="comma-separated: pv, provisioner, resourceclaim")
    args = p.parse_args(argv)
    controllers = tuple(c for c in args.controllers.split(",") if c)
    from kubeplane.runtime import configure_gc, run

    configure_gc()
    run(serve(args.socket, args.seed, controllers))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
