"""A full disk under a running API server (SQLite on a small tmpfs): writes fail with an
InternalError Status, /readyz fails its etcd check while /livez stays up, and once space
is freed writes work again without a restart; acknowledged data survives."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest

from conftest import start_server

CM = "/api/v1/namespaces/default/configmaps"


@pytest.fixture
def small_disk(tmp_path: Path):
    """An 8 MiB tmpfs mounted where the server keeps its data directory."""
    mnt = tmp_path / "data"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)]).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], check=True)


def _fill(path: Path) -> None:
    """Write ``path`` until the file system is full."""
    chunk = b"\0" * 65536
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                os.write(fd, chunk)
            except OSError:
                break
        chunk = b"\0" * 512
        while True:
            try:
                os.write(fd, chunk)
            except OSError:
                break
    finally:
        os.close(fd)


def _cm(name: str, pad: int) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"pad": "x" * pad}}


async def _get(s: aiohttp.ClientSession, path: str) -> tuple[int, str]:
    async with s.get(path) as r:
        return r.status, await r.text()


def test_full_disk_fails_writes_and_readiness_then_recovers(tmp_path: Path, small_disk: Path) -> None:
    srv = start_server(tmp_path, storage="sqlite")
    try:
        async def run() -> dict:
            out: dict = {}
            async with srv.session() as s:
                acked: list[str] = []
                for i in range(5):
                    async with s.post(CM, json=_cm(f"before-{i}", 1000)) as r:
                        assert r.status == 201
                        out["rv_before"] = (await r.json())["metadata"]["resourceVersion"]
                        acked.append(f"before-{i}")
                _fill(small_disk / "filler")
                failed = None
                for i in range(200):
                    async with s.post(CM, json=_cm(f"full-{i}", 50_000)) as r:
                        body = await r.json()
                        if r.status == 201:
                            acked.append(f"full-{i}")
                            continue
                        failed = (r.status, body, f"full-{i}")
                        break
                assert failed is not None, "the disk never filled up"
                status, body, lost = failed
                out["message"] = body.get("message")
                assert status == 500, body
                assert body["kind"] == "Status" and body["reason"] == "InternalError", body
                assert body["message"].startswith("Internal error occurred: "), body
                assert "full" in body["message"] or "disk" in body["message"], body

                started = time.monotonic()
                code, text = await _get(s, "/readyz")
                out["readyz_full"] = (code, text, time.monotonic() - started)
                assert code == 500 and "[-]etcd failed: reason withheld\n" in text, text
                assert await _get(s, "/livez") == (200, "ok")
                code, text = await _get(s, "/livez?verbose")
                assert code == 200 and "[+]etcd ok\n" in text
                # Still full: the probe keeps readiness failed.
                for _ in range(3):
                    await asyncio.sleep(0.4)
                    code, _ = await _get(s, "/readyz/etcd")
                    assert code == 500
                # Reads keep working.
                code, _ = await _get(s, f"{CM}/before-0")
                assert code == 200

                os.remove(small_disk / "filler")
                recovered = time.monotonic()
                deadline = recovered + 15
                while True:
                    code, text = await _get(s, "/readyz")
                    if code == 200:
                        break
                    assert time.monotonic() < deadline, f"/readyz never recovered: {text}"
                    await asyncio.sleep(0.2)
                out["ready_again_after"] = time.monotonic() - recovered
                # Writes, deletes included, work again without a restart.
                async with s.post(CM, json=_cm(lost, 50_000)) as r:
                    assert r.status == 201, await r.text()
                    acked.append(lost)
                async with s.delete(f"{CM}/before-4") as r:
                    assert r.status == 200, await r.text()
                    acked.remove("before-4")
                async with s.get(CM) as r:
                    body = await r.json()
                    names = sorted(i["metadata"]["name"] for i in body["items"])
                    out["rv_after"] = body["metadata"]["resourceVersion"]
                assert names == sorted(acked)
                out["acked"] = acked
            return out

        result = asyncio.run(run())
    except BaseException:
        print(srv.log())
        raise
    finally:
        srv.stop(signal.SIGKILL)

    # After a kill -9: acknowledged data is intact and a watch from before the full
    # disk resumes with exactly the acknowledged changes, in order.
    srv2 = start_server(tmp_path, storage="sqlite")
    try:
        async def check() -> None:
            async with srv2.session() as s:
                async with s.get(CM) as r:
                    body = await r.json()
                assert sorted(i["metadata"]["name"] for i in body["items"]) == sorted(result["acked"])
                async with s.get(CM, params={"watch": "1", "resourceVersion": result["rv_before"],
                                             "timeoutSeconds": "1"}) as r:
                    assert r.status == 200
                    events = [line for line in (await r.read()).splitlines() if line]
                import json

                seen = [(json.loads(e)["type"], json.loads(e)["object"]["metadata"]["name"]) for e in events]
                expected = [("ADDED", n) for n in result["acked"] if not n.startswith("before")]
                expected.append(("DELETED", "before-4"))
                assert seen == expected

        asyncio.run(check())
    finally:
        srv2.stop()
    print(f"write on the full disk: {result['message']!r}; "
          f"/readyz failed in {result['readyz_full'][2] * 1000:.0f} ms while full; "
          f"ready again {result['ready_again_after'] * 1000:.0f} ms after space was freed")
