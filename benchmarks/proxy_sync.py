"""The Service proxy's programming latency at size: 1,000 Services of 10 endpoints each.

An in-process API server holds the Services and EndpointSlices; a ServiceProxy
programs nftables in a network namespace made for the run (removed after).
Then, one at a time, an endpoint of a random Service turns not ready (or ready
again) and the run measures, from the EndpointSlice write:

* ``sync``: until the proxier's sync that carries the change has completed;
* ``visible``: until ``nft list chain`` shows the service chain changed.

Each change waits out ``--min-sync-period`` first, so it goes at once (the
runner's immediate path). A last burst changes ``--burst`` Services at once
(batched into one sync). Needs root (a network namespace, nftables).

    PYTHONPATH=src python benchmarks/proxy_sync.py [--services 1000] [--endpoints 10] [--changes 50]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import time

from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.client.inprocess import InProcessClient
from kubeplane.proxy import ProxyConfig, ServiceProxy
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

SERVICES = resource("services")
SLICES = resource("endpointslices", "discovery.k8s.io")
NS = "default"


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def ms(v: float) -> str:
    return f"{v * 1000:.1f} ms"


async def run(args) -> None:
    netns = f"kpbench{os.getpid()}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    store = MemoryStore(history=100000)
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    client = InProcessClient(registry)
    proxy = None
    try:
        subprocess.run(["ip", "netns", "exec", netns, "ip", "link", "set", "lo", "up"], check=True)
        t = time.monotonic()
        slices = {}
        for i in range(args.services):
            name = f"svc-{i}"
            await client.create(SERVICES, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                                           "spec": {"ports": [{"port": 80, "protocol": "TCP"}]}}, NS)
            base = f"10.{100 + i // 250}.{i % 250}"
            sl = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                  "metadata": {"name": f"{name}-1", "labels": {"kubernetes.io/service-name": name}},
                  "addressType": "IPv4", "ports": [{"name": "", "port": 8080, "protocol": "TCP"}],
                  "endpoints": [{"addresses": [f"{base}.{j + 1}"], "conditions": {"ready": True}, "nodeName": "n"}
                                for j in range(args.endpoints)]}
            slices[name] = await client.create(SLICES, sl, NS)
        print(f"made {args.services} Services and EndpointSlices of {args.endpoints} endpoints "
              f"in {time.monotonic() - t:.1f}s")

        config = ProxyConfig(node_name="bench", min_sync_period=args.min_sync_period,
                             command_prefix=["ip", "netns", "exec", netns])
        proxy = ServiceProxy(client, config)
        t = time.monotonic()
        await proxy.start(sync_timeout=300)
        proxier = proxy.proxier("ipv4")
        first = proxier.syncs[0]
        print(f"first (full) sync: {ms(first.duration)} for {first.ops} nft operations; "
              f"proxy started in {time.monotonic() - t:.1f}s")

        done: dict[tuple[str, str], float] = {}
        proxier.on_sync.append(lambda r: [done.__setitem__(k, time.monotonic()) for k in r.services])

        async def chain_has(name: str, ip: str) -> bool:
            chain = next(iter(proxier._rules[(NS, name)].chains))
            proc = await asyncio.create_subprocess_exec(
                "ip", "netns", "exec", netns, "nft", "list", "chain", "ip", "kube-proxy", chain,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
            out, _ = await proc.communicate()
            return f" {ip} " in out.decode()

        async def list_table() -> str:
            proc = await asyncio.create_subprocess_exec(
                "ip", "netns", "exec", netns, "nft", "list", "table", "ip", "kube-proxy",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
            out, _ = await proc.communicate()
            return out.decode()

        async def flip(name: str) -> tuple[str, bool]:
            sl = slices[name]
            ep = random.choice(sl["endpoints"])
            ep["conditions"]["ready"] = not ep["conditions"]["ready"]
            done.pop((NS, name), None)
            slices[name] = await client.update(SLICES, sl)
            return ep["addresses"][0], ep["conditions"]["ready"]

        async def visible(name: str, ip: str, ready: bool, t0: float) -> tuple[float, float]:
            while (NS, name) not in done:
                await asyncio.sleep(0.001)
            synced = done[(NS, name)] - t0
            while await chain_has(name, ip) != ready:
                await asyncio.sleep(0.002)
            return synced, time.monotonic() - t0

        rng = random.Random(1)
        sync_lat, vis_lat = [], []
        for _ in range(args.changes):
            await asyncio.sleep(args.min_sync_period + 0.05)
            name = f"svc-{rng.randrange(args.services)}"
            t0 = time.monotonic()
            ip, ready = await flip(name)
            s, v = await visible(name, ip, ready, t0)
            sync_lat.append(s)
            vis_lat.append(v)
        t = time.monotonic()
        for _ in range(10):
            await chain_has("svc-0", "10.100.0.1")
        listing = (time.monotonic() - t) / 10
        partial = [r.duration for r in proxier.syncs[1:] if not r.full]
        print(f"endpoint change -> sync done: p50 {ms(pct(sync_lat, .5))}, p99 {ms(pct(sync_lat, .99))}, "
              f"max {ms(max(sync_lat))} ({len(sync_lat)} changes)")
        print(f"endpoint change -> visible in nft list: p50 {ms(pct(vis_lat, .5))}, p99 {ms(pct(vis_lat, .99))}, "
              f"max {ms(max(vis_lat))} (one nft list chain takes {ms(listing)} at this size)")
        print(f"partial sync duration: median {ms(statistics.median(partial))}, max {ms(max(partial))} "
              f"({len(partial)} syncs)")

        await asyncio.sleep(args.min_sync_period + 0.05)
        names = [f"svc-{i}" for i in rng.sample(range(args.services), args.burst)]
        before = len(proxier.syncs)
        t0 = time.monotonic()
        flips = [await flip(n) for n in names]
        written = time.monotonic() - t0
        while not all((NS, n) in done for n in names):
            await asyncio.sleep(0.001)
        all_synced = max(done[(NS, n)] for n in names) - t0
        table = await list_table()
        assert all((f" {ip} " in table) == ready for ip, ready in flips), "a burst change is not in the table"
        bursts = proxier.syncs[before:]
        print(f"burst of {args.burst} changes (written in {ms(written)}): all synced {ms(all_synced)} after the "
              f"first write, in {len(bursts)} syncs; table checked {ms(time.monotonic() - t0)} after")
        full_t = time.monotonic()
        proxier._need_full = True
        proxier.runner.run()
        while proxier.syncs[-1].full is False or (NS, names[0]) not in done or done[(NS, names[0])] < full_t:
            await asyncio.sleep(0.005)
        print(f"a full resync: {ms(proxier.syncs[-1].duration)} ({proxier.syncs[-1].ops} nft operations)")
    finally:
        if proxy is not None:
            await proxy.stop()
        await client.close()
        await registry.close()
        await store.close()
        subprocess.run(["ip", "netns", "del", netns])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--services", type=int, default=1000)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--changes", type=int, default=50)
    ap.add_argument("--burst", type=int, default=50)
    ap.add_argument("--min-sync-period", type=float, default=1.0)
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
