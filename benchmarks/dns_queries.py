"""Queries per second of the cluster DNS server (kubeplane.dns) for A lookups.

The server runs in this process on 127.0.0.1 over stores of ``--services``
ClusterIP Services (plus one headless Service of 10 endpoints per 100
Services); a client in a second process keeps ``--window`` UDP queries in
flight for ``--seconds`` and counts the answers (each checked for NOERROR and
one A record). Three runs:

* ``cached``: A lookups of random Services, the answer cache on (the steady
  state: a pod resolves the same names again and again);
* ``uncached``: the same with the cache off, so every query is parsed,
  resolved and rendered;
* ``headless``: A lookups of the headless Services (10 records each), cache off.

Usage::

    python benchmarks/dns_queries.py [--services 1000] [--seconds 5] [--window 32] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import select
import socket
import struct
import time

import dns.message
import dns.rdatatype

from kubeplane.client.informer import Indexer
from kubeplane.dns.records import ClusterRecords
from kubeplane.dns.server import DNSServer


def build_stores(n: int) -> tuple[Indexer, Indexer, Indexer]:
    services, slices, namespaces = Indexer(), Indexer(), Indexer()
    for ns in range(10):
        namespaces.add({"metadata": {"name": f"ns-{ns}"}})
    for i in range(n):
        ip = f"10.96.{(i + 100) // 250}.{(i + 100) % 250 + 1}"
        services.add({"metadata": {"name": f"svc-{i}", "namespace": f"ns-{i % 10}"},
                      "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                               "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}})
    for h in range(max(1, n // 100)):
        services.add({"metadata": {"name": f"headless-{h}", "namespace": "ns-0"},
                      "spec": {"type": "ClusterIP", "clusterIP": "None", "clusterIPs": ["None"],
                               "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}})
        slices.add({"metadata": {"name": f"headless-{h}-1", "namespace": "ns-0",
                                 "labels": {"kubernetes.io/service-name": f"headless-{h}"}},
                    "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                    "endpoints": [{"addresses": [f"10.244.{h % 250}.{e + 1}"], "conditions": {"ready": True}}
                                  for e in range(10)]})
    return services, slices, namespaces


def client(port: int, names: list[str], seconds: float, window: int, expect: int, out: "multiprocessing.Queue") -> None:
    """Keeps ``window`` queries in flight; reports answers per second and failures."""
    rng = random.Random(1)
    wires = [dns.message.make_query(rng.choice(names), dns.rdatatype.A).to_wire() for _ in range(4096)]
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    ident = 0
    inflight: dict[int, float] = {}
    ok = bad = lost = 0
    deadline = time.monotonic() + seconds
    start = time.monotonic()
    while time.monotonic() < deadline:
        while len(inflight) < window:
            ident = (ident + 1) & 0xFFFF
            wire = struct.pack("!H", ident) + wires[ident % len(wires)][2:]
            sock.send(wire)
            inflight[ident] = time.monotonic()
        ready, _, _ = select.select([sock], [], [], 0.5)
        if not ready:
            lost += len(inflight)  # nothing came back in half a second: count them as lost, go on
            inflight.clear()
            continue
        while True:
            try:
                data = sock.recv(65535)
            except BlockingIOError:
                break
            (rid,) = struct.unpack("!H", data[:2])
            if inflight.pop(rid, None) is None:
                continue
            ancount = struct.unpack("!H", data[6:8])[0]
            if data[3] & 0x0F == 0 and ancount == expect:
                ok += 1
            else:
                bad += 1
    elapsed = time.monotonic() - start
    out.put({"answers": ok, "bad": bad, "lost": lost, "seconds": round(elapsed, 3), "qps": round(ok / elapsed)})


async def run(kind: str, services: int, seconds: float, window: int) -> dict:
    stores = build_stores(services)
    records = ClusterRecords(stores[0], stores[1], namespaces=stores[2])
    server = DNSServer(records, "127.0.0.1", 0, cache_size=0 if kind != "cached" else 10000)
    await server.start()
    try:
        if kind == "headless":
            names = [f"headless-{h}.ns-0.svc.cluster.local" for h in range(max(1, services // 100))]
            expect = 10  # ANCOUNT counts records
        else:
            names = [f"svc-{i}.ns-{i % 10}.svc.cluster.local" for i in range(services)]
            expect = 1
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        proc = ctx.Process(target=client, args=(server.port, names, seconds, window, expect, out))
        proc.start()
        loop = asyncio.get_running_loop()
        cpu0 = time.process_time()
        result = await loop.run_in_executor(None, out.get)
        cpu = time.process_time() - cpu0
        await loop.run_in_executor(None, proc.join)
    finally:
        await server.stop()
    result.update(kind=kind, services=services, window=window,
                  server_cpu_us_per_answer=round(cpu * 1e6 / max(1, result["answers"]), 1))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--services", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--window", type=int, default=32)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = []
    for kind in ("cached", "uncached", "headless"):
        from kubeplane import runtime

        results.append(runtime.run(run(kind, args.services, args.seconds, args.window)))
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        print(f"{r['kind']:>9}: {r['qps']:>7} answers/s ({r['answers']} in {r['seconds']} s, bad {r['bad']}, "
              f"lost {r['lost']}), server CPU {r['server_cpu_us_per_answer']} us/answer")


if __name__ == "__main__":
    main()
