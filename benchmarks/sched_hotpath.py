"""Micro benchmark of the scheduling hot path (SchedulingBasic shape), embedded mode.

The real :class:`~kubeplane.scheduler.scheduler.Scheduler` runs over an
in-process registry (MemoryStore) and the in-process client, all in one
process and one event loop. Nodes follow scheduler_perf's node-default
template (4 CPU, 32Gi, 110 pods), pods its pod-default template (one pause
container requesting 100m cpu and 500Mi memory).

Modes:

* ``precreate``: nodes and pods exist before the scheduler starts; the clock
  runs from the first scheduling cycle until every pod is bound.
* ``concurrent``: the scheduler is running; pods are created in batches while
  it schedules (as scheduler_perf does); the clock runs from the first create.

Usage::

    python benchmarks/sched_hotpath.py --nodes 5000 --pods 10000 [--runs 3]
        [--mode precreate|concurrent] [--generic] [--profile FILE] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import logging
import statistics
import sys
import time
from typing import Any

from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.inprocess import InProcessClient
from kubeplane.registry.registry import Registry
from kubeplane.scheduler.scheduler import Scheduler
from kubeplane.storage.memory import MemoryStore

PODS = resource("pods")
NODES = resource("nodes")


def node_default(name: str) -> dict[str, Any]:
    """scheduler_perf's node-default template (allocatable defaults to capacity)."""
    cap = {"pods": "110", "cpu": "4", "memory": "32Gi"}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {"capacity": dict(cap), "allocatable": dict(cap),
                   "conditions": [{"type": "Ready", "status": "True"}], "phase": "Running"},
    }


def pod_default(name: str) -> dict[str, Any]:
    """scheduler_perf's pod-default template."""
    res = {"cpu": "100m", "memory": "500Mi"}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{
            "name": "pause", "image": "registry.k8s.io/pause:3.10.1",
            "ports": [{"containerPort": 80}],
            "resources": {"limits": dict(res), "requests": dict(res)},
        }]},
    }


async def _create_all(client: InProcessClient, res: Any, objs: list[dict], namespace: str | None,
                      batch: int = 200) -> None:
    for i in range(0, len(objs), batch):
        await asyncio.gather(*(client.create(res, o, namespace) for o in objs[i:i + batch]))


async def run_once(nodes: int, pods: int, mode: str, profiler: cProfile.Profile | None,
                   generic: bool = False) -> dict[str, float]:
    store = MemoryStore()
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    await _create_all(client, NODES, [node_default(f"node-{i}") for i in range(nodes)], None)
    pod_objs = [pod_default(f"pod-{i}") for i in range(pods)]
    if mode == "precreate":
        await _create_all(client, PODS, pod_objs, "default")
    sched = Scheduler(client)
    sched.use_fast_path = not generic
    bound = 0
    done = asyncio.Event()
    first_bound_at = 0.0

    def on_update(old: dict, new: dict) -> None:
        nonlocal bound, first_bound_at
        if new["spec"].get("nodeName") and not old["spec"].get("nodeName"):
            bound += 1
            if bound == 1:
                first_bound_at = time.perf_counter()
            if bound >= pods:
                done.set()

    sched._pods_informer.add_event_handler(None, on_update, None)
    await sched.start()
    gc.collect()
    gc.freeze()
    if profiler is not None:
        profiler.enable()
    t0 = time.perf_counter()
    c0 = time.process_time()
    task = asyncio.create_task(sched.run())
    creator = None
    if mode == "concurrent":
        creator = asyncio.create_task(_create_all(client, PODS, pod_objs, "default", batch=50))
    await done.wait()
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - c0
    if profiler is not None:
        profiler.disable()
    if creator is not None:
        await creator
    await sched.stop()
    await asyncio.wait_for(task, 10)
    await registry.close()
    await store.close()
    gc.unfreeze()
    return {"elapsed_s": elapsed, "pods_per_s": pods / elapsed, "pods_per_cpu_s": pods / cpu,
            "first_bound_s": first_bound_at - t0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, default=10000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--mode", choices=("precreate", "concurrent"), default="precreate")
    ap.add_argument("--profile", help="write cProfile stats of the last run to this file")
    ap.add_argument("--generic", action="store_true", help="disable the vectorised Filter/Score path")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    results = []
    for i in range(args.runs):
        prof = cProfile.Profile() if args.profile and i == args.runs - 1 else None
        r = asyncio.run(run_once(args.nodes, args.pods, args.mode, prof, args.generic))
        results.append(r)
        if prof is not None:
            prof.dump_stats(args.profile)
        if not args.json:
            print(f"run {i + 1}: {r['pods_per_s']:.0f} pods/s ({r['elapsed_s']:.2f} s, "
                  f"{r['pods_per_cpu_s']:.0f} pods per CPU second)", file=sys.stderr)
    med = statistics.median(r["pods_per_s"] for r in results)
    med_cpu = statistics.median(r["pods_per_cpu_s"] for r in results)
    out = {"workload": "SchedulingBasic", "mode": args.mode, "path": "generic" if args.generic else "fast",
           "nodes": args.nodes, "pods": args.pods, "runs": args.runs, "pods_per_s_median": round(med, 1),
           "pods_per_cpu_s_median": round(med_cpu, 1),
           "pods_per_s_all": [round(r["pods_per_s"], 1) for r in results]}
    print(json.dumps(out) if args.json else
          f"SchedulingBasic {args.mode} {'generic' if args.generic else 'fast'} {args.nodes} nodes / {args.pods} pods: "
          f"{med:.0f} pods/s, {med_cpu:.0f} pods per CPU second (median of {args.runs})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
