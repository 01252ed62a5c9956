"""The cost of encryption at rest: Secret creates/s and list time, per provider.

First the transformer alone: microseconds to encrypt and to decrypt one
Secret of 1 KiB of data (the stable figure on a noisy machine).

In-process registry over SQLite (fsync on), 8 concurrent writers creating
Secrets with 1 KiB of data, then one list of all of them. Configurations run
in alternating order, several rounds; the figures are medians.

    PYTHONPATH=src python benchmarks/encryption_at_rest.py [--n 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import statistics
import tempfile
import time

from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.apiserver.encryptionconfig import NO_ENCRYPTION, parse
from kubeplane.client.inprocess import InProcessClient
from kubeplane.registry.registry import Registry
from kubeplane.storage import open_store
from kubeplane.storage.transformer import TransformingStore

SECRETS = resource("secrets")
KEY = base64.b64encode(os.urandom(32)).decode()


def config(provider: str):
    return parse(f"""apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
  - resources: [secrets]
    providers:
      - {provider}: {{keys: [{{name: k1, secret: {KEY}}}]}}
      - identity: {{}}
""")


CONFIGS = {
    "no wrapper": None,
    "identity (no file)": NO_ENCRYPTION,
    "aesgcm": config("aesgcm"),
    "aescbc": config("aescbc"),
    "secretbox": config("secretbox"),
}


def body(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
            "data": {"blob": base64.b64encode(os.urandom(768)).decode()}}


async def one(cfg, n: int, writers: int = 8) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as d:
        store = await open_store("sqlite", d)
        if cfg is not None:
            store = TransformingStore(store, cfg.transformer_for)
        registry = Registry(store, CATALOGUE)
        await ensure_default_namespaces(registry)
        client = InProcessClient(registry)
        per = n // writers

        async def writer(w: int) -> None:
            for i in range(per):
                await client.create(SECRETS, body(f"s-{w}-{i}"), "default")

        t0 = time.perf_counter()
        await asyncio.gather(*(writer(w) for w in range(writers)))
        creates = per * writers / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        listed = await client.list(SECRETS, "default")
        list_s = time.perf_counter() - t0
        assert len(listed["items"]) == per * writers
        await registry.close()
        await store.close()
    return creates, list_s


def micro(count: int = 20000) -> None:
    import timeit

    key = "/registry/core/secrets/default/s"
    obj = {**body("s"), "metadata": {"name": "s", "namespace": "default", "uid": "0" * 36,
                                      "creationTimestamp": "2026-01-01T00:00:00Z", "resourceVersion": "5"}}
    print(f"{'provider':22} {'encrypt (us)':>12} {'decrypt (us)':>12}")
    for name, cfg in CONFIGS.items():
        if cfg is None or cfg is NO_ENCRYPTION:
            continue
        t = cfg.transformer_for(key)
        stored = t.to_storage(obj, key)
        stored["metadata"]["resourceVersion"] = "5"
        enc = timeit.timeit(lambda: t.to_storage(obj, key), number=count) / count * 1e6
        dec = timeit.timeit(lambda: t.from_storage(stored, key), number=count) / count * 1e6
        print(f"{name:22} {enc:12.1f} {dec:12.1f}")
    print()


async def main(n: int, rounds: int) -> None:
    micro()
    creates: dict[str, list[float]] = {k: [] for k in CONFIGS}
    lists: dict[str, list[float]] = {k: [] for k in CONFIGS}
    names = list(CONFIGS)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            c, ls = await one(CONFIGS[name], n)
            creates[name].append(c)
            lists[name].append(ls)
    base = statistics.median(creates["no wrapper"])
    print(f"{'configuration':22} {'creates/s':>10} {'vs none':>8} {'list ' + str(n) + ' (ms)':>14}")
    for name in names:
        c = statistics.median(creates[name])
        print(f"{name:22} {c:10.0f} {100 * (c / base - 1):+7.1f}% {1000 * statistics.median(lists[name]):14.1f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    asyncio.run(main(args.n, args.rounds))
