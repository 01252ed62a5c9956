"""An acknowledged write survives SIGKILL of the API server (SQLite storage)."""

from __future__ import annotations

import asyncio
import signal

import aiohttp

from conftest import start_server


async def _write(srv, n: int) -> list[str]:
    acked: list[str] = []
    async with srv.session() as s:
        async def one(i: int) -> None:
            body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm-{i}"}, "data": {"i": str(i)}}
            r = await s.post("/api/v1/namespaces/default/configmaps", json=body)
            if r.status == 201:
                acked.append(f"cm-{i}")
            await r.read()

        await asyncio.gather(*(one(i) for i in range(n)))
    return acked


def test_acknowledged_writes_survive_sigkill(tmp_path):
    srv = start_server(tmp_path, storage="sqlite")
    try:
        acked = asyncio.run(_write(srv, 300))
        assert len(acked) == 300
    finally:
        srv.stop(signal.SIGKILL)
    assert srv.proc.returncode == -signal.SIGKILL
    srv2 = start_server(tmp_path, storage="sqlite")
    try:
        async def read() -> tuple[set[str], int]:
            async with srv2.session() as s:
                r = await s.get("/api/v1/namespaces/default/configmaps")
                body = await r.json()
                return {i["metadata"]["name"] for i in body["items"]}, int(body["metadata"]["resourceVersion"])

        names, rv = asyncio.run(read())
        assert set(acked) <= names
        # Revisions keep growing after the restart.
        async def write_one() -> int:
            async with srv2.session() as s:
                r = await s.post("/api/v1/namespaces/default/configmaps",
                                 json={"metadata": {"name": "after-restart"}})
                return int((await r.json())["metadata"]["resourceVersion"])

        assert asyncio.run(write_one()) > rv
    finally:
        srv2.stop()
