"""A watcher that never reads is closed once its unread backlog passes the bound, and the
server's memory stays bounded; a client that re-watches from its last revision resumes."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time

import aiohttp

from conftest import start_server


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_watcher_that_never_reads_is_closed(tmp_path):
    srv = start_server(tmp_path, storage="sqlite", extra=["--history-bytes", "16Mi"])
    host, port = srv.url.split("//", 1)[1].rsplit(":", 1)
    try:
        async def run() -> tuple[float, float, int, float]:
            async with srv.session() as s:
                async with s.post("/api/v1/namespaces/default/configmaps",
                                  json={"metadata": {"name": "big"}}) as r:
                    assert r.status == 201
                    start_rv = (await r.json())["metadata"]["resourceVersion"]
                idle = srv.connect()
                idle.sendall(f"GET /api/v1/namespaces/default/configmaps?watch=1&resourceVersion={start_rv} "
                             f"HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
                before = _rss_mb(srv.proc.pid)
                started = time.monotonic()
                for i in range(240):
                    body = {"metadata": {"name": "big"}, "data": {"pad": f"{i:08d}" * (256 * 1024 // 8)}}
                    async with s.put("/api/v1/namespaces/default/configmaps/big", json=body) as r:
                        assert r.status == 200
                elapsed = time.monotonic() - started
                after = _rss_mb(srv.proc.pid)
                # The server has given up on the idle watcher: reading now finds the end of
                # the connection after far less than the 60 MB of events written.
                idle.settimeout(10)
                received = 0
                try:
                    while True:
                        chunk = idle.recv(1 << 20)
                        if not chunk:
                            break
                        received += len(chunk)
                except (ConnectionResetError, ssl.SSLError):
                    pass
                idle.close()
                assert received < 40 * 1024 * 1024
                # A fresh watch from the last revision still works.
                async with s.get("/api/v1/namespaces/default/configmaps",
                                 params={"watch": "1", "timeoutSeconds": "1"}) as r:
                    assert r.status == 200
                    await r.read()
                return before, after, received, elapsed

        before, after, received, elapsed = asyncio.run(run())
        print(f"server RSS {before:.0f} MB -> {after:.0f} MB over 240 updates of 256 KiB ({elapsed:.1f}s) "
              f"with a watcher that never reads; it got {received / 1e6:.1f} MB before the server closed it")
        assert after - before < 150, f"RSS grew from {before:.0f} to {after:.0f} MB"
        assert "closing the watch" in srv.log()
    finally:
        srv.stop()
