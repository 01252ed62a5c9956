"""/healthz, /livez and /readyz with named checks; a storage failure fails readiness only,
and a failed write answers an InternalError Status."""

from __future__ import annotations

from pathlib import Path
from typing import AsyncIterator

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from kubeplane.api.resources import CATALOGUE
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.apiserver.server import build_app
from kubeplane.registry.registry import Registry
from kubeplane.storage import MemoryStore, SQLiteStore, sqlite as sqlite_backend


class Env:
    def __init__(self, store, session: aiohttp.ClientSession, base: str) -> None:
        self.store = store
        self.session = session
        self.base = base

    async def get(self, path: str) -> tuple[int, str]:
        async with self.session.get(self.base + path) as r:
            return r.status, await r.text()

    async def create_configmap(self, name: str, pad: int = 0) -> tuple[int, dict]:
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"pad": "x" * pad}}
        async with self.session.post(self.base + "/api/v1/namespaces/default/configmaps", json=body) as r:
            return r.status, await r.json()


async def _env(store) -> AsyncIterator[Env]:
    registry = Registry(store, CATALOGUE)
    await ensure_default_namespaces(registry)
    server = TestServer(build_app(registry, CATALOGUE), host="127.0.0.1")
    await server.start_server()
    async with aiohttp.ClientSession() as session:
        yield Env(store, session, str(server.make_url("")).rstrip("/"))
    await server.close()
    await registry.close()
    await store.close()


@pytest.fixture
async def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Env]:
    monkeypatch.setattr(sqlite_backend, "PROBE_INTERVAL", 0.0)
    async for e in _env(await SQLiteStore.open(str(tmp_path / "db"))):
        yield e


@pytest.fixture
async def memory_env() -> AsyncIterator[Env]:
    async for e in _env(MemoryStore()):
        yield e


def _fill(store: SQLiteStore, full: bool) -> None:
    conn = store._conn
    if full:
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        conn.execute(f"PRAGMA max_page_count = {pages}")
    else:
        conn.execute("PRAGMA max_page_count = 1073741823")


@pytest.mark.parametrize("path", ["/healthz", "/livez", "/readyz"])
async def test_health_paths_list_their_checks(memory_env: Env, path: str) -> None:
    assert await memory_env.get(path) == (200, "ok")
    status, text = await memory_env.get(path + "?verbose")
    name = path.strip("/")
    assert status == 200 and text == f"[+]ping ok\n[+]etcd ok\n{name} check passed\n"
    assert await memory_env.get(path + "/etcd") == (200, "ok")
    assert await memory_env.get(path + "/ping") == (200, "ok")
    status, text = await memory_env.get(path + "?verbose&exclude=etcd&exclude=nope")
    assert status == 200
    assert text == (f"[+]ping ok\n[+]etcd excluded: ok\n"
                    f'warn: some health checks cannot be excluded: no matches for "nope"\n{name} check passed\n')


async def test_full_database_fails_readiness_not_liveness_and_recovers(env: Env) -> None:
    assert (await env.create_configmap("before"))[0] == 201
    _fill(env.store, True)
    status, body = await env.create_configmap("big", pad=100_000)
    assert status == 500
    assert body["kind"] == "Status" and body["reason"] == "InternalError" and body["code"] == 500
    assert body["message"] == "Internal error occurred: database or disk is full"

    status, text = await env.get("/readyz")
    assert status == 500
    assert text == "[+]ping ok\n[-]etcd failed: reason withheld\nreadyz check failed\n"
    status, text = await env.get("/readyz/etcd")
    assert status == 500 and text.startswith("internal server error: ") and "full" in text
    assert await env.get("/livez") == (200, "ok")
    assert await env.get("/healthz") == (200, "ok")
    # Reads keep working.
    async with env.session.get(env.base + "/api/v1/namespaces/default/configmaps/before") as r:
        assert r.status == 200

    _fill(env.store, False)
    assert await env.get("/readyz") == (200, "ok")
    assert (await env.create_configmap("big", pad=100_000))[0] == 201
    async with env.session.get(env.base + "/api/v1/namespaces/default/configmaps") as r:
        names = [i["metadata"]["name"] for i in (await r.json())["items"]]
    assert names == ["before", "big"]
