"""The kubelet API against a real containerd: logs, exec, attach and
port-forward bridged to containerd's streaming server."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from kubeplane.node.cri.client import CRIClient, pb
from kubeplane.node.logs import ContainerLogManager, rotated_logs
from kubeplane.node.server import KubeletServer
from kubeplane.streaming import channels, spdy

from _streaming import cri_pod, held_streaming_bytes, rss_bytes


@pytest.fixture
async def kubelet(containerd):
    async with CRIClient(containerd.endpoint) as cri:
        server = KubeletServer(cri, node_name="n1", host="127.0.0.1", port=0, authorize=False)
        await server.start()
        try:
            yield server, cri
        finally:
            await server.stop()


async def _wait_state(cri, cid, state, timeout=10.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        st = (await cri.runtime("ContainerStatus", pb.ContainerStatusRequest(container_id=cid))).status
        if st.state == state:
            return st
        assert loop.time() < deadline, f"container still {pb.ContainerState.Name(st.state)}"
        await asyncio.sleep(0.05)


async def _session(server, path, protocols, *, stdin: bytes | None = None, close_stdin=False,
                   resize=None):
    """Run one exec/attach over the WebSocket; returns (stdout, stderr, status, protocol)."""
    out = {channels.STDOUT: b"", channels.STDERR: b""}
    status = None
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(f"http://127.0.0.1:{server.port}{path}", protocols=protocols) as ws:
            if resize is not None:
                await ws.send_bytes(bytes([channels.RESIZE]) + channels.encode_resize(*resize))
            if stdin is not None:
                await ws.send_bytes(bytes([channels.STDIN]) + stdin)
            if close_stdin:
                await ws.send_bytes(bytes([channels.CLOSE, channels.STDIN]))
            async for msg in ws:
                assert msg.type == aiohttp.WSMsgType.BINARY
                ch, data = msg.data[0], msg.data[1:]
                if ch == channels.ERROR:
                    status = json.loads(data)
                else:
                    out[ch] += data
            proto = ws.protocol
            assert ws.close_code == 1000
    return out[channels.STDOUT], out[channels.STDERR], status, proto


async def test_exec_output_and_exit_code(kubelet, tmp_path):
    server, cri = kubelet
    async with cri_pod(cri, "ex", str(tmp_path)) as pod:
        await pod.container("main", ["sleep", "60"])
        q = "command=sh&command=-c&command=echo+out%3B+echo+err+%3E%262%3B+exit+3&output=1&error=1"
        stdout, stderr, status, proto = await _session(server, f"/exec/default/ex/main?{q}",
                                                       [channels.V5, channels.V4])
        assert proto == channels.V5
        assert (stdout, stderr) == (b"out\n", b"err\n")
        assert channels.exit_code_of(status) == 3 and status["reason"] == "NonZeroExitCode"
        stdout, _, status, _ = await _session(server, "/exec/default/ex/main?command=true&output=1", [channels.V4])
        assert stdout == b"" and status["status"] == "Success"


async def test_exec_stdin_close_reaches_the_process(kubelet, tmp_path):
    server, cri = kubelet
    async with cri_pod(cri, "cat", str(tmp_path)) as pod:
        await pod.container("main", ["sleep", "60"])
        stdout, _, status, _ = await _session(
            server, "/exec/default/cat/main?command=sh&command=-c&command=wc+-c&input=1&output=1&error=1",
            [channels.V5], stdin=b"x" * 100_000, close_stdin=True)
        assert stdout.strip() == b"100000" and status["status"] == "Success"


async def test_exec_tty_gets_the_terminal_size(kubelet, tmp_path):
    server, cri = kubelet
    async with cri_pod(cri, "tty", str(tmp_path)) as pod:
        await pod.container("main", ["sleep", "60"])
        stdout, _, status, _ = await _session(
            server, "/exec/default/tty/main?command=sh&command=-c&command=sleep+0.5%3B+stty+size&output=1&tty=1&input=1",
            [channels.V5], resize=(123, 45))
        assert stdout.strip() == b"45 123" and status["status"] == "Success"


async def test_attach_to_a_running_container(kubelet, tmp_path):
    server, cri = kubelet
    async with cri_pod(cri, "att", str(tmp_path)) as pod:
        cid = await pod.container("main", ["sh", "-c", "read line; echo got $line; exit 7"], stdin=True)
        await asyncio.sleep(0.2)
        stdout, _, _status, _ = await _session(server, "/attach/default/att/main?input=1&output=1&error=1",
                                               [channels.V5], stdin=b"hello\n")
        assert b"got hello" in stdout
        st = await _wait_state(cri, cid, pb.CONTAINER_EXITED)
        assert st.exit_code == 7


async def test_exec_errors_are_statuses(kubelet, tmp_path):
    server, cri = kubelet
    async with aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{server.port}/exec/default/nope/main?command=true&output=1"
        async with http.get(url, headers={"Upgrade": "websocket", "Connection": "Upgrade",
                                          "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                                          "Sec-WebSocket-Version": "13",
                                          "Sec-WebSocket-Protocol": channels.V5}) as r:
            assert r.status == 404
            assert (await r.json())["message"] == 'container not found ("main")'
        async with http.get(f"http://127.0.0.1:{server.port}/exec/default/nope/main?command=true") as r:
            assert r.status == 400
            assert (await r.json())["message"] == "you must specify at least 1 of stdin, stdout, stderr"
        async with http.get(f"http://127.0.0.1:{server.port}/exec/default/nope/main?output=1") as r:
            assert r.status == 400 and (await r.json())["message"] == "you must specify at least 1 command"


async def _logs(server, path):
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{server.port}{path}") as r:
            return r.status, await r.text()


async def test_container_logs_options(kubelet, tmp_path):
    server, cri = kubelet
    async with cri_pod(cri, "logs", str(tmp_path)) as pod:
        cid = await pod.container("main", ["sh", "-c", "for i in 1 2 3 4 5; do echo line $i; done; printf tail"])
        await _wait_state(cri, cid, pb.CONTAINER_EXITED)
        base = "/containerLogs/default/logs/main"
        # a last line without its newline stays partial, as the runtime wrote it
        assert await _logs(server, base) == (200, "line 1\nline 2\nline 3\nline 4\nline 5\ntail")
        assert await _logs(server, base + "?tailLines=2") == (200, "line 5\ntail")
        assert await _logs(server, base + "?tailLines=0") == (200, "")
        assert await _logs(server, base + "?limitBytes=9") == (200, "line 1\nli")
        code, text = await _logs(server, base + "?timestamps=true&tailLines=1")
        ts, _, rest = text.partition(" ")
        assert code == 200 and rest == "tail" and ts.endswith("Z") and "T" in ts
        assert await _logs(server, base + f"?sinceTime={ts}") == (200, "tail")
        assert (await _logs(server, base + "?sinceSeconds=3600"))[1].startswith("line 1\n")
        code, text = await _logs(server, base + "?previous=true")
        assert code == 400 and 'previous terminated container \\"main\\" in pod \\"logs\\" not found' in text
        # a second attempt: previous shows the first
        cid2 = await pod.container("main", ["sh", "-c", "echo second"])
        await _wait_state(cri, cid2, pb.CONTAINER_EXITED)
        assert await _logs(server, base) == (200, "second\n")
        assert (await _logs(server, base + "?previous=true"))[1].startswith("line 1\n")
        code, text = await _logs(server, base + "?tailLines=-1")
        assert code == 400 and "tailLines: Invalid value: -1: must be greater than or equal to 0" in text
        code, _ = await _logs(server, base + "?sinceSeconds=1&sinceTime=2020-01-01T00:00:00Z")
        assert code == 400


async def test_container_logs_follow_ends_with_the_container(kubelet, tmp_path):
    server, cri = kubelet
    async with cri_pod(cri, "follow", str(tmp_path)) as pod:
        await pod.container("main", ["sh", "-c", "echo a; sleep 1; echo b"])
        await asyncio.sleep(0.3)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        code, text = await asyncio.wait_for(_logs(server, "/containerLogs/default/follow/main?follow=true"), 10)
        assert (code, text) == (200, "a\nb\n")
        assert loop.time() - t0 > 0.5


async def test_a_follow_goes_on_across_log_rotation(kubelet, tmp_path):
    """The runtime reopens a rotated log (CRI ReopenContainerLog); a follower reads the
    old file to its end, then the new one: every line once, in order."""
    server, cri = kubelet
    n = 3000
    script = f"i=0; while [ $i -lt {n} ]; do echo line-$i; i=$((i+1)); [ $((i % 100)) = 0 ] && sleep 0.05; done"
    async with cri_pod(cri, "rot", str(tmp_path)) as pod:
        cid = await pod.container("main", ["sh", "-c", script])
        follow = asyncio.create_task(_logs(server, "/containerLogs/default/rot/main?follow=true"))
        manager = ContainerLogManager(cri, max_size=1, max_files=3)
        rotations = 0
        for _ in range(6):
            await asyncio.sleep(0.25)
            rotations += len(await manager.rotate_running())
        code, text = await asyncio.wait_for(follow, 30)
        assert rotations >= 3
        assert code == 200 and text.split() == [f"line-{i}" for i in range(n)]
        path = (await cri.runtime("ContainerStatus", pb.ContainerStatusRequest(container_id=cid))).status.log_path
        rotated = rotated_logs(path)
        assert len(rotated) == 2 and rotated[0].endswith(".gz")


async def test_an_idle_streaming_session_is_closed_and_a_busy_one_is_not(kubelet, tmp_path):
    server, cri = kubelet
    server.streaming_idle_timeout = 1.0
    loop = asyncio.get_running_loop()
    async with cri_pod(cri, "idle", str(tmp_path)) as pod:
        await pod.container("main", ["sleep", "60"])
        t0 = loop.time()
        stdout, _, status, _ = await asyncio.wait_for(
            _session(server, "/exec/default/idle/main?command=sleep&command=30&output=1", [channels.V5]), 10)
        assert 0.9 < loop.time() - t0 < 5 and status is None
        # output every 0.3 s keeps a session of 2.5 s open past the 1 s timeout
        q = "command=sh&command=-c&command=for+i+in+1+2+3+4+5+6+7+8%3B+do+echo+%24i%3B+sleep+0.3%3B+done&output=1"
        stdout, _, status, _ = await asyncio.wait_for(_session(server, f"/exec/default/idle/main?{q}",
                                                               [channels.V5]), 10)
        assert stdout.split() == [str(i).encode() for i in range(1, 9)] and status["status"] == "Success"


async def _tunnel(server, path):
    """A SPDY client session tunnelled through a WebSocket, as kubectl's port-forward dials."""
    http = aiohttp.ClientSession()
    ws = await http.ws_connect(f"http://127.0.0.1:{server.port}{path}", protocols=[channels.PORT_FORWARD_TUNNEL])
    assert ws.protocol == channels.PORT_FORWARD_TUNNEL
    session = spdy.Session(ws.send_bytes, server=False)

    async def pump():
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.BINARY:
                await session.feed(msg.data)
        session.feed_eof()

    task = asyncio.ensure_future(pump())

    async def close():
        await ws.close()
        task.cancel()
        await http.close()

    return session, close


async def test_port_forward_to_httpd(kubelet, tmp_path):
    server, cri = kubelet
    async with cri_pod(cri, "web", str(tmp_path)) as pod:
        await pod.container("main", ["sh", "-c", "mkdir -p /www && echo hello-pf > /www/index.html && "
                                                 "exec httpd -f -p 8080 -h /www"])
        await asyncio.sleep(0.3)
        session, close = await _tunnel(server, "/portForward/default/web")
        try:
            for request_id in ("0", "1"):  # two connections over one session
                h = {"port": ["8080"], "requestid": [request_id]}
                err = await session.open_stream({**h, "streamtype": ["error"]})
                await err.close()
                data = await session.open_stream({**h, "streamtype": ["data"]})
                await data.write(b"GET /index.html HTTP/1.0\r\n\r\n")
                body = await asyncio.wait_for(data.read_all(), 10)
                assert body.startswith(b"HTTP/1.") and body.endswith(b"hello-pf\n")
                assert await asyncio.wait_for(err.read_all(), 10) == b""
            # nothing listens on 9: the error stream says so
            h = {"port": ["9"], "requestid": ["2"]}
            err = await session.open_stream({**h, "streamtype": ["error"]})
            await err.close()
            data = await session.open_stream({**h, "streamtype": ["data"]})
            message = await asyncio.wait_for(err.read_all(), 10)
            assert b"9" in message and message
            with pytest.raises(spdy.StreamReset):
                await session.open_stream({"port": ["x"], "streamtype": ["data"]})
        finally:
            await close()


async def test_a_stalled_reader_holds_the_process_back(kubelet, tmp_path):
    """An exec whose output is not read: the kubelet stops reading the runtime's
    stream (the process blocks writing) instead of buffering its output."""
    server, cri = kubelet
    total = 96 * 1024 * 1024
    async with cri_pod(cri, "zero", str(tmp_path)) as pod:
        await pod.container("main", ["sleep", "60"])
        async with aiohttp.ClientSession() as http:
            q = f"command=head&command=-c&command={total}&command=/dev/zero&output=1"
            async with http.ws_connect(f"http://127.0.0.1:{server.port}/exec/default/zero/main?{q}",
                                       protocols=[channels.V5], max_msg_size=0) as ws:
                rss0 = rss_bytes()
                await asyncio.sleep(2.0)  # nothing read
                held = held_streaming_bytes()
                grown = rss_bytes() - rss0
                assert held < 4 * 1024 * 1024, held
                assert grown < 32 * 1024 * 1024, grown
                got, status = 0, None
                async for msg in ws:
                    ch, data = msg.data[0], msg.data[1:]
                    if ch == channels.STDOUT:
                        assert data == bytes(len(data))
                        got += len(data)
                    elif ch == channels.ERROR:
                        status = json.loads(data)
                assert got == total and status["status"] == "Success"
