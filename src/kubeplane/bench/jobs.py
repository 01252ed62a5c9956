"""``kubeplane bench JobChurn``: Job completion throughput and latency.

A scheduler_perf-shaped workload for the Job controller, run on a whole
in-process cluster (the registry, the controllers of ``kubeplane up``, the
scheduler and simulated nodes, one event loop): Jobs of 10 pods
(``completions`` = ``parallelism`` = 10) whose containers exit after
``kubeplane.io/exit-after`` = 1 s are created so that ``in_flight`` of them
run at a time, and each one is deleted (Background propagation: the garbage
collector removes its pods) as soon as it is Complete, until ``jobs`` have
completed.

Measured, over all Jobs:

* ``jobs_per_s`` (and ``pods_per_s``): completed Jobs (pods) per second from
  the first creation to the last completion;
* ``latency_p50/p90/p99_ms``: per Job, from just before its create call to
  the moment the bench's informer delivers the update with the Complete
  condition (the 1 s the containers run is part of it);
* ``cpu_ms_per_job``: this process's CPU time per Job; ``peak_rss_mb``.

Time is the real clock: the controllers run as in ``kubeplane up``, with
upstream's 1 s Job sync batching.
"""

from __future__ import annotations

import asyncio
import resource as _resource
import time
from typing import Any, Callable

from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.bench.scheduler import percentile
from kubeplane.client.informer import SharedInformerFactory

JOBS = resource("jobs")
SERVICE_ACCOUNTS = resource("serviceaccounts")
NAMESPACES = resource("namespaces")

NAMESPACE = "job-churn"
PODS_PER_JOB = 10
EXIT_AFTER_S = 1
DEFAULT_JOBS = 200
DEFAULT_IN_FLIGHT = 20
DEFAULT_NODES = 10

Progress = Callable[[int, int], None]


def churn_job(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"completions": PODS_PER_JOB, "parallelism": PODS_PER_JOB, "template": {
            "metadata": {"annotations": {"kubeplane.io/exit-after": str(EXIT_AFTER_S)}},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "work", "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}},
    }


def _complete(job: dict[str, Any]) -> bool:
    return any(c.get("type") == "Complete" and c.get("status") == "True"
               for c in (job.get("status") or {}).get("conditions") or [])


async def run_job_churn(*, jobs: int = DEFAULT_JOBS, in_flight: int = DEFAULT_IN_FLIGHT, nodes: int = DEFAULT_NODES,
                        storage: str = "memory", progress: Progress | None = None,
                        stall_timeout_s: float = 60.0) -> dict[str, Any]:
    """Run the workload once; returns its measurements (``timed_out`` when no
    Job completed for ``stall_timeout_s``)."""
    import tempfile
    from contextlib import AsyncExitStack

    from kubeplane.apiserver.app import ensure_default_namespaces
    from kubeplane.client.inprocess import InProcessClient
    from kubeplane.cluster import Components, start_components
    from kubeplane.registry.registry import Registry
    from kubeplane.storage import open_store

    if jobs < 1 or in_flight < 1 or nodes < 1:
        raise ValueError("jobs, in_flight and nodes must be at least 1")
    history = 50_000 + 40 * jobs * PODS_PER_JOB
    async with AsyncExitStack() as stack:
        data_dir = None
        if storage == "sqlite":
            data_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="kubeplane-bench-"))
        store = await open_store(storage, data_dir, history=history, watch_queue=history)
        stack.push_async_callback(store.close)
        registry = Registry(store, CATALOGUE)
        stack.push_async_callback(registry.close)
        await ensure_default_namespaces(registry)
        client = InProcessClient(registry)
        stack.push_async_callback(client.close)
        comps = Components()
        stack.push_async_callback(comps.stop)
        t_setup = time.perf_counter()
        await start_components(comps, client, (nodes, "32", "256Gi", 110, 0, "node", 0), {})
        await client.create(NAMESPACES, {"metadata": {"name": NAMESPACE}})
        await _wait_for(lambda: _has_default_sa(client), 30.0)

        created_at: dict[str, float] = {}
        latencies: list[float] = []
        done = asyncio.Event()
        slot = asyncio.Semaphore(in_flight)
        last_progress = [time.perf_counter()]
        deleter = InProcessClient(registry)
        stack.push_async_callback(deleter.close)
        pending_deletes: set[asyncio.Task] = set()

        def on_job(job: dict[str, Any]) -> None:
            name = job["metadata"]["name"]
            if name not in created_at or not _complete(job):
                return
            latencies.append(time.perf_counter() - created_at.pop(name))
            last_progress[0] = time.perf_counter()
            slot.release()
            task = asyncio.get_running_loop().create_task(
                deleter.delete(JOBS, name, NAMESPACE, propagation_policy="Background"))
            pending_deletes.add(task)
            task.add_done_callback(pending_deletes.discard)
            if progress is not None:
                progress(len(latencies), jobs)
            if len(latencies) >= jobs:
                done.set()

        factory = SharedInformerFactory(client)
        stack.push_async_callback(factory.stop)
        factory.informer_for(JOBS, namespace=NAMESPACE).add_event_handler(
            on_job, lambda _old, new: on_job(new), None)
        factory.start()
        await factory.wait_for_cache_sync()
        setup_s = time.perf_counter() - t_setup

        cpu0 = time.process_time()
        t0 = time.perf_counter()

        async def create_all() -> None:
            for i in range(jobs):
                await slot.acquire()
                name = f"churn-{i}"
                created_at[name] = time.perf_counter()
                await client.create(JOBS, churn_job(name), NAMESPACE)

        creator = asyncio.get_running_loop().create_task(create_all())
        timed_out = False
        while not done.is_set():
            try:
                await asyncio.wait_for(done.wait(), 1.0)
            except asyncio.TimeoutError:
                if time.perf_counter() - last_progress[0] > stall_timeout_s:
                    timed_out = True
                    break
        end = time.perf_counter()
        cpu = time.process_time() - cpu0
        creator.cancel()
        await asyncio.gather(creator, return_exceptions=True)
        await asyncio.gather(*pending_deletes, return_exceptions=True)
        duration = end - t0
        n = len(latencies)
        ms = sorted(v * 1000 for v in latencies)
        return {
            "workload": "JobChurn", "nodes": nodes, "jobs": jobs, "pods_per_job": PODS_PER_JOB,
            "exit_after_s": EXIT_AFTER_S, "in_flight": in_flight, "completed": n, "timed_out": timed_out,
            "duration_s": round(duration, 2),
            "jobs_per_s": round(n / duration, 2) if duration > 0 else 0.0,
            "pods_per_s": round(n * PODS_PER_JOB / duration, 1) if duration > 0 else 0.0,
            "latency_p50_ms": round(percentile(ms, 50), 1) if ms else None,
            "latency_p90_ms": round(percentile(ms, 90), 1) if ms else None,
            "latency_p99_ms": round(percentile(ms, 99), 1) if ms else None,
            "cpu_ms_per_job": round(cpu * 1000 / n, 2) if n else None,
            "peak_rss_mb": round(_resource.getrusage(_resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "storage": storage, "setup_s": round(setup_s, 2),
        }


async def _has_default_sa(client: Any) -> bool:
    try:
        await client.get(SERVICE_ACCOUNTS, "default", NAMESPACE)
    except Exception:  # noqa: BLE001 - not there yet
        return False
    return True


async def _wait_for(check: Callable[[], Any], timeout: float) -> None:
    deadline = time.perf_counter() + timeout
    while not await check():
        if time.perf_counter() > deadline:
            raise TimeoutError("the benchmark namespace's default ServiceAccount did not appear")
        await asyncio.sleep(0.05)


async def run_cli(*, jobs: int | None = None, in_flight: int | None = None, nodes: int | None = None,
                  storage: str = "memory", as_json: bool = False) -> dict[str, Any]:
    """Run once and print the result (one JSON object with ``as_json``)."""
    import json
    import sys

    bar = None
    progress = None
    if not as_json and sys.stdout.isatty():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TimeElapsedColumn

        bar = Bar("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), transient=True)
        task = bar.add_task("JobChurn: Jobs complete", total=jobs or DEFAULT_JOBS)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        bar.start()
    try:
        out = await run_job_churn(jobs=jobs or DEFAULT_JOBS, in_flight=in_flight or DEFAULT_IN_FLIGHT,
                                  nodes=nodes or DEFAULT_NODES, storage=storage, progress=progress)
    finally:
        if bar is not None:
            bar.stop()
    if as_json:
        print(json.dumps(out))
    else:
        width = max(len(k) for k in out)
        for k, v in out.items():
            print(f"{k:<{width}}  {v}")
    return out


__all__ = ["churn_job", "run_cli", "run_job_churn"]
