"""The cost of encryption at rest: Secret creates/s and list time, per provider.

First the transformer alone: microseconds to encrypt and to decrypt one
Secret of 1 KiB of data (the stable figure on a noisy machine).

In-process registry over SQLite (fsync on), 8 concurrent writers creating
Secrets with 1 KiB of data, then one list of all of them. Configurations run
in alternating order, several rounds; the figures are medians.

    PYTHONPATH=src python benchmarks/encryption_at_rest.py [--n 2000] [--rounds 5] [--http]

With ``--http``: Secret creates/s over HTTP against an API server subprocess
(SQLite) started without and with ``--encryption-provider-config`` (aesgcm),
8 concurrent clients, alternating.
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


def _server(tmp: str, config_file: str | None):
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    kubeconfig = Path(tmp) / "kubeconfig"
    extra = ["--encryption-provider-config", config_file] if config_file else []
    proc = subprocess.Popen([sys.executable, "-m", "kubeplane.cli.main", "apiserver", "--listen", "127.0.0.1:0",
                             "--data-dir", str(Path(tmp) / "data"), "--kubeconfig", str(kubeconfig), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not kubeconfig.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("API server did not start")
        time.sleep(0.05)
    return proc, yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]


async def http_creates(url: str, n: int, clients: int = 8) -> float:
    import aiohttp
    import orjson

    sessions = [aiohttp.ClientSession(url) for _ in range(clients)]
    try:
        per = n // clients

        async def client(c: int, s) -> None:
            for i in range(per):
                r = await s.post("/api/v1/namespaces/default/secrets", data=orjson.dumps(body(f"s-{c}-{i}")),
                                 headers={"Content-Type": "application/json"})
                if r.status != 201:
                    raise RuntimeError(f"create failed: {r.status} {await r.text()}")
                await r.read()

        t0 = time.perf_counter()
        await asyncio.gather(*(client(c, s) for c, s in enumerate(sessions)))
        return per * clients / (time.perf_counter() - t0)
    finally:
        for s in sessions:
            await s.close()


def http(n: int, rounds: int) -> None:
    results: dict[str, list[float]] = {"without": [], "aesgcm": []}
    with tempfile.TemporaryDirectory() as d:
        cfg = os.path.join(d, "enc.yaml")
        with open(cfg, "w") as f:
            f.write(f"""apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
  - resources: [secrets]
    providers:
      - aesgcm: {{keys: [{{name: k1, secret: {KEY}}}]}}
""")
        for r in range(rounds):
            for name in ("without", "aesgcm") if r % 2 == 0 else ("aesgcm", "without"):
                with tempfile.TemporaryDirectory() as tmp:
                    proc, url = _server(tmp, cfg if name == "aesgcm" else None)
                    try:
                        results[name].append(asyncio.run(http_creates(url, n)))
                    finally:
                        proc.terminate()
                        proc.wait(10)
    for name, vals in results.items():
        print(f"HTTP secret creates/s {name:8} median {statistics.median(vals):7.0f}  runs {[round(v) for v in vals]}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--http", action="store_true")
    args = ap.parse_args()
    if args.http:
        http(args.n, args.rounds)
    else:
        asyncio.run(main(args.n, args.rounds))
