"""Micro benchmark of the API server's write path (registry, in-process).

Replays, per pod, the writes the dynamically provisioned volume flow makes
(SchedulingCSIPVs): the pod and its claim are created; the scheduler
annotates the claim with the selected node; the PV controller records the
provisioner on the claim; the provisioner creates the PV; the PV controller
sets the PV's phase, the claim's volumeName and the claim's phase; the
scheduler binds the pod; five Events are recorded along the way. Every write
goes through an ``InProcessClient(copies=False)``, as the wire server serves
them, onto a Registry over a MemoryStore, so the time is the registry's:
validation, managed fields, storage and watch fan-out preparation.

Reports microseconds per write, per kind of write and per pod (the sum of
the timed writes; building the requests is not counted), as the median over
``--runs`` repetitions (each a fresh registry).

Usage::

    python benchmarks/registry_writes.py [--pods 2000] [--runs 5] [--json] [--profile FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import statistics
import sys
import time
from collections import defaultdict
from typing import Any

from kubeplane.api.meta import deep_copy
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.bench.workloads import pod_with_claim, pvc_wffc
from kubeplane.client.inprocess import InProcessClient
from kubeplane.registry.registry import Registry
from kubeplane.runtime import configure_gc
from kubeplane.storage.memory import MemoryStore

PODS = resource("pods")
PVCS = resource("persistentvolumeclaims")
PVS = resource("persistentvolumes")
EVENTS = resource("events")
SELECTED = "volume.kubernetes.io/selected-node"
PROVISIONER = "kubeplane.io/local"


def _event(obj: dict[str, Any], reason: str, i: int) -> dict[str, Any]:
    md = obj["metadata"]
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{md['name']}.{i:016x}", "namespace": "default"},
        "involvedObject": {"kind": obj["kind"], "apiVersion": "v1", "name": md["name"],
                           "namespace": "default", "uid": md["uid"], "resourceVersion": md["resourceVersion"]},
        "reason": reason, "message": f"{reason} for {md['name']}", "type": "Normal",
        "source": {"component": "bench"}, "firstTimestamp": "2026-01-01T00:00:00Z",
        "lastTimestamp": "2026-01-01T00:00:00Z", "count": 1,
        "reportingComponent": "bench", "reportingInstance": "bench",
    }


async def _flow(client: InProcessClient, i: int, timings: dict[str, list[float]]) -> None:
    clock = time.perf_counter

    async def timed(kind: str, coro: Any) -> Any:
        t = clock()
        out = await coro
        timings[kind].append(clock() - t)
        return out

    node = f"node-{i % 100}"
    claim = await timed("create pvc", client.create(PVCS, pvc_wffc(f"pvc-{i}", "csi"), "default"))
    pod = await timed("create pod", client.create(PODS, pod_with_claim(f"pod-{i}", f"pvc-{i}"), "default"))
    await timed("create event", client.create(EVENTS, _event(claim, "WaitForFirstConsumer", 5 * i), "default"))

    c = deep_copy(claim)
    c["metadata"].setdefault("annotations", {})[SELECTED] = node
    claim = await timed("update pvc", client.update(PVCS, c, field_manager="scheduler"))
    c = deep_copy(claim)
    c["metadata"]["annotations"]["volume.kubernetes.io/storage-provisioner"] = PROVISIONER
    claim = await timed("update pvc", client.update(PVCS, c, field_manager="pv-controller"))
    await timed("create event", client.create(EVENTS, _event(claim, "ExternalProvisioning", 5 * i + 1), "default"))
    await timed("create event", client.create(EVENTS, _event(claim, "Provisioning", 5 * i + 2), "default"))

    md = claim["metadata"]
    pv = {
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": f"pv-{i}", "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
        "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
            "storageClassName": "csi", "persistentVolumeReclaimPolicy": "Delete",
            "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": "default",
                         "name": md["name"], "uid": md["uid"], "resourceVersion": md["resourceVersion"]},
            "csi": {"driver": PROVISIONER, "volumeHandle": f"pv-{i}"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}},
        },
    }
    pv = await timed("create pv", client.create(PVS, pv, field_manager="provisioner"))
    await timed("create event", client.create(EVENTS, _event(claim, "ProvisioningSucceeded", 5 * i + 3), "default"))
    v = deep_copy(pv)
    v["status"] = {"phase": "Bound"}
    await timed("update pv status", client.update(PVS, v, subresource="status", field_manager="pv-controller"))
    c = deep_copy(claim)
    c["spec"]["volumeName"] = f"pv-{i}"
    c["metadata"]["annotations"]["pv.kubernetes.io/bind-completed"] = "yes"
    claim = await timed("update pvc", client.update(PVCS, c, field_manager="pv-controller"))
    c = deep_copy(claim)
    c["status"] = {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}}
    await timed("update pvc status", client.update(PVCS, c, subresource="status", field_manager="pv-controller"))
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": f"pod-{i}", "namespace": "default"},
               "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    await timed("bind pod", client.create(PODS, binding, "default", subresource="binding", name=f"pod-{i}"))
    await timed("create event", client.create(EVENTS, _event(pod, "Scheduled", 5 * i + 4), "default"))


async def run_once(pods: int) -> dict[str, Any]:
    store = MemoryStore(history=50_000 + 20 * pods)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry, copies=False)
    timings: dict[str, list[float]] = defaultdict(list)
    gc.collect()
    for i in range(pods):
        await _flow(client, i, timings)
    total = sum(sum(v) for v in timings.values())
    await registry.close()
    await store.close()
    writes = sum(len(v) for v in timings.values())
    return {
        "us_per_pod": total / pods * 1e6,
        "us_per_write": total / writes * 1e6,
        "by_kind_us": {k: statistics.median(v) * 1e6 for k, v in sorted(timings.items())},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--profile", metavar="FILE", help="profile one run into FILE (cProfile)")
    args = ap.parse_args(argv)
    configure_gc()  # as the server runs
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        asyncio.run(run_once(args.pods))
        prof.disable()
        prof.dump_stats(args.profile)
        return 0
    runs = [asyncio.run(run_once(args.pods)) for _ in range(args.runs)]
    out = {
        "pods": args.pods,
        "runs": args.runs,
        "us_per_pod": round(statistics.median(r["us_per_pod"] for r in runs), 1),
        "us_per_write": round(statistics.median(r["us_per_write"] for r in runs), 1),
        "by_kind_us": {k: round(statistics.median(r["by_kind_us"][k] for r in runs), 1)
                       for k in runs[0]["by_kind_us"]},
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{out['us_per_pod']:.0f} µs per pod flow, {out['us_per_write']:.0f} µs per write "
              f"(median of {args.runs} runs, {args.pods} pods)")
        for k, v in out["by_kind_us"].items():
            print(f"  {k:20s} {v:8.1f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
