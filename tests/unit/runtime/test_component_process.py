"""ComponentProcess: the line-driven child processes of ``up --split`` and ``bench --split``."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap

import pytest

from kubeplane.cluster import ComponentProcess

CHILD = textwrap.dedent("""
    import asyncio
    from kubeplane.cluster import read_commands, say

    async def main():
        async def command(words):
            if words[0] == "echo":
                say(" ".join(words[1:]))
            elif words[0] == "hang":
                await asyncio.sleep(3600)
        say("ready")
        await read_commands(command)
        say("bye")

    asyncio.run(main())
""")


@pytest.fixture
def argv(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return [sys.executable, str(script)]


async def test_requests_blank_lines_and_stop(argv):
    child = ComponentProcess(argv, "test child")
    await child.start()
    assert await child.request("echo hi there") == "hi there"
    assert child.proc is not None and child.proc.stdin is not None
    child.proc.stdin.write(b"\n")  # a blank line is not a stop
    assert await child.request("echo still") == "still"
    assert await child.stop() == ["bye"]
    assert child.proc.returncode == 0


async def test_a_request_without_answer_kills_the_child(argv):
    child = ComponentProcess(argv, "test child")
    await child.start()
    with pytest.raises(RuntimeError, match="did not answer"):
        await child.request("hang", timeout=0.3)
    assert await asyncio.wait_for(child.proc.wait(), 5) != 0
    await child.stop()


async def test_supervise_restarts_until_stopped(argv):
    child = ComponentProcess(argv, "test child")
    await child.start()
    first = child.proc
    task = asyncio.create_task(child.supervise(restart_delay=0.05))
    os.kill(first.pid, signal.SIGKILL)
    for _ in range(200):
        if child.proc is not first and child.running:
            break
        await asyncio.sleep(0.02)
    assert child.proc is not first and child.running
    assert await child.request("echo again") == "again"
    assert await child.stop() == ["bye"]
    assert task.done()  # stop() ended the supervisor
    assert not child.running


async def test_stop_during_a_restart(argv):
    child = ComponentProcess(argv, "test child")
    await child.start()
    task = asyncio.create_task(child.supervise(restart_delay=0.0))
    os.kill(child.proc.pid, signal.SIGKILL)
    await asyncio.sleep(0.05)  # the supervisor is (re)starting it
    await asyncio.wait_for(child.stop(), 10)
    await asyncio.gather(task, return_exceptions=True)
    assert not child.running
