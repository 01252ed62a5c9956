"""An acknowledged write to the SQLite store survives kill -9 of the writing process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from kubeplane.storage import open_store

CHILD = Path(__file__).with_name("storage_writer_child.py")
ACKS = 400


async def test_acknowledged_writes_survive_sigkill(tmp_path: Path) -> None:
    acked: dict[str, int] = {}
    with subprocess.Popen(
        [sys.executable, str(CHILD), str(tmp_path), "8"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        try:
            first = proc.stdout.readline().strip()
            assert first == "ready", proc.stderr.read()
            while len(acked) < ACKS:
                line = proc.stdout.readline()
                assert line, f"writer exited early: {proc.stderr.read()}"
                key, revision = line.split()
                acked[key] = int(revision)
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL

    store = await open_store("sqlite", str(tmp_path))
    try:
        stored = {kv.key: kv for kv in (await store.list("/registry/core/pods/")).items}
        missing = [k for k in acked if k not in stored]
        assert not missing, f"{len(missing)} acknowledged writes lost, e.g. {missing[:3]}"
        for key, revision in acked.items():
            # Later unacknowledged updates may have committed too, never older states.
            assert stored[key].mod_revision >= revision
        assert store.revision >= max(acked.values())
        assert store.revision >= max(kv.mod_revision for kv in stored.values())
        # The store keeps working after recovery, with revisions continuing upward.
        kv = await store.create("/registry/core/pods/after/p", {"metadata": {"name": "p"}})
        assert kv.mod_revision == store.revision > max(acked.values())
    finally:
        await store.close()
