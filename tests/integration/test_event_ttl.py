"""``--event-ttl``: the API server deletes Events that long after their last write."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from conftest import start_server


def test_event_ttl_flag_deletes_old_events(tmp_path):
    srv = start_server(tmp_path, storage="sqlite", extra=["--event-ttl", "1s"])
    try:
        async def run() -> float:
            async with srv.session() as s:
                ev = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e1"},
                      "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"},
                      "reason": "Test", "message": "hello", "type": "Normal"}
                async with s.post("/api/v1/namespaces/default/events", json=ev) as r:
                    assert r.status == 201, await r.text()
                async with s.post("/api/v1/namespaces/default/configmaps",
                                  json={"metadata": {"name": "keep"}}) as r:
                    assert r.status == 201
                start = time.monotonic()
                while True:
                    async with s.get("/api/v1/namespaces/default/events/e1") as r:
                        if r.status == 404:
                            break
                    assert time.monotonic() - start < 15, "the event was never deleted"
                    await asyncio.sleep(0.1)
                elapsed = time.monotonic() - start
                async with s.get("/api/v1/namespaces/default/configmaps/keep") as r:
                    assert r.status == 200
                return elapsed

        elapsed = asyncio.run(run())
        assert elapsed >= 0.8, f"deleted after {elapsed:.2f}s, before its TTL"
    finally:
        srv.stop()
