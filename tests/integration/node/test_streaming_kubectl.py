"""Real kubectl against a kubeplane API server proxying to a kubelet API
served over a real containerd: logs, exec (with a pseudo-terminal too), cp
both ways, port-forward, and the kubelet's authentication and authorization.

The pods' containers are started through the CRI directly (labelled as
upstream's kuberuntime labels them) for Pod objects bound to a Node whose
address is the kubelet API's.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import ssl
import struct
import termios

import aiohttp
import pytest

from kubeplane.auth import pki
from kubeplane.client.http import HttpClient
from kubeplane.node.cri.client import CRIClient, pb
from kubeplane.node.server import KubeletServer
from kubeplane.testing import Cluster

from _streaming import CRIPod, held_streaming_bytes, rss_bytes

KUBECTL = "/usr/bin/kubectl"
NODE = "stream-n1"


def kubectl_env(spdy: bool) -> dict[str, str]:
    """kubectl's environment; ``spdy``: the SPDY/3.1 protocols instead of the WebSocket ones."""
    env = dict(os.environ)
    if spdy:
        env.update(KUBECTL_REMOTE_COMMAND_WEBSOCKETS="false", KUBECTL_PORT_FORWARD_WEBSOCKETS="false")
    return env


class Env:
    def __init__(self, cluster, client, cri, server, tmp):
        self.cluster, self.client, self.cri, self.server, self.tmp = cluster, client, cri, server, tmp
        self.pods: list[CRIPod] = []

    async def kubectl(self, *args: str, stdin: bytes | None = None, timeout: float = 60.0, spdy: bool = False):
        p = await asyncio.create_subprocess_exec(
            KUBECTL, "--kubeconfig", self.cluster.kubeconfig, *args, env=kubectl_env(spdy),
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(p.communicate(stdin), timeout)
        except asyncio.TimeoutError:
            p.kill()
            await p.wait()
            raise
        return p.returncode, out.decode(), err.decode()

    async def pod(self, name: str, containers: dict[str, list[str]], *, running: bool = True,
                  stdin: bool = False, stdin_once: bool = False) -> CRIPod:
        """A Pod bound to the node and its containers started through the CRI."""
        from kubeplane.api.resources import resource

        obj = await self.client.create(resource("pods"), {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": NODE, "containers": [
                {"name": c, "image": "kubeplane.local/busybox:latest", "command": cmd, "stdin": stdin,
                 "stdinOnce": stdin_once}
                for c, cmd in containers.items()]}}, "default")
        cp = CRIPod(self.cri, name, "default", str(self.tmp / name))
        cp.uid = obj["metadata"]["uid"]
        self.pods.append(cp)
        await cp.start()
        for c, cmd in containers.items():
            await cp.container(c, cmd, stdin=stdin, stdin_once=stdin_once)
        if running:
            obj["status"] = {"phase": "Running"}
            await self.client.update(resource("pods"), obj, subresource="status")
        return cp


@pytest.fixture
async def env(containerd, tmp_path):
    async with Cluster() as cluster:
        client = HttpClient.from_kubeconfig(cluster.kubeconfig)
        ca_file = os.path.join(cluster._pki_dir, "ca.crt")
        crt, key = pki.ensure_self_signed_pair(str(tmp_path / "pki" / "kubelet.crt"), str(tmp_path / "pki" / "kubelet.key"),
                                               NODE, (NODE, "localhost", "127.0.0.1"))
        async with CRIClient(containerd.endpoint) as cri:
            server = KubeletServer(cri, node_name=NODE, client=client, tls_cert_file=crt, tls_key_file=key,
                                   client_ca_file=ca_file, host="127.0.0.1", port=0)
            await server.start()
            e = Env(cluster, client, cri, server, tmp_path)
            try:
                from kubeplane.api.resources import resource

                await client.create(resource("nodes"), {
                    "apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
                    "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                               "daemonEndpoints": {"kubeletEndpoint": {"Port": server.port}}}})
                yield e
            finally:
                for p in e.pods:
                    await p.remove()
                await server.stop()
                await client.close()


async def _wait_exited(cri, cid, timeout=10.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (await cri.runtime("ContainerStatus", pb.ContainerStatusRequest(container_id=cid))).status.state \
            != pb.CONTAINER_EXITED:
        assert loop.time() < deadline
        await asyncio.sleep(0.05)


async def test_kubectl_logs(env):
    p = await env.pod("printer", {"main": ["sh", "-c", "echo one; echo two; echo three"]})
    cid = list(await env.server.find_containers("default", "printer", "main"))[0].id
    await _wait_exited(env.cri, cid)
    assert await env.kubectl("logs", "printer") == (0, "one\ntwo\nthree\n", "")
    assert await env.kubectl("logs", "printer", "--tail=1") == (0, "three\n", "")
    assert (await env.kubectl("logs", "printer", "--limit-bytes=5"))[1] == "one\nt"
    rc, out, _ = await env.kubectl("logs", "printer", "--timestamps", "--tail=1")
    assert rc == 0 and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z three\n", out)
    rc, _, err = await env.kubectl("logs", "printer", "--previous")
    assert rc == 1 and 'previous terminated container "main" in pod "printer" not found' in err
    cid2 = await p.container("main", ["sh", "-c", "echo again; sleep 1; echo done"])
    rc, out, _ = await env.kubectl("logs", "-f", "printer", timeout=20)
    assert (rc, out) == (0, "again\ndone\n")
    await _wait_exited(env.cri, cid2)
    assert (await env.kubectl("logs", "printer", "-p"))[1] == "one\ntwo\nthree\n"
    rc, _, err = await env.kubectl("logs", "printer", "-c", "nope")
    assert rc == 1 and "container nope is not valid for pod printer" in err
    rc, _, err = await env.kubectl("logs", "printer", "--tail=-2", "--limit-bytes=0")
    assert rc == 1


async def test_kubectl_exec_output_and_exit_code(env):
    await env.pod("shell", {"main": ["sleep", "3600"]})
    assert await env.kubectl("exec", "shell", "--", "sh", "-c", "echo hi; echo err >&2") == (0, "hi\n", "err\n")
    rc, out, err = await env.kubectl("exec", "shell", "--", "sh", "-c", "echo before; exit 42")
    assert (rc, out) == (42, "before\n") and "command terminated with exit code 42" in err
    rc, out, _ = await env.kubectl("exec", "-i", "shell", "--", "sh", "-c", "tr a-z A-Z", stdin=b"shout\n")
    assert (rc, out) == (0, "SHOUT\n")
    rc, _, err = await env.kubectl("exec", "shell", "-c", "other", "--", "true")
    assert rc == 1 and "container other is not valid for pod shell" in err


@pytest.mark.parametrize("spdy", [False, True], ids=["websocket", "spdy"])
async def test_kubectl_exec_interactive_through_a_pty(env, spdy):
    await env.pod("tty", {"main": ["sleep", "3600"]})
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 111, 0, 0))
    p = await asyncio.create_subprocess_exec(
        KUBECTL, "--kubeconfig", env.cluster.kubeconfig, "exec", "-it", "tty", "--", "sh",
        stdin=slave, stdout=slave, stderr=slave, start_new_session=True, env=kubectl_env(spdy))
    os.close(slave)
    loop = asyncio.get_running_loop()
    seen = bytearray()

    async def read_until(pattern: bytes, timeout: float = 20.0):
        deadline = loop.time() + timeout
        while pattern not in seen:
            assert loop.time() < deadline, f"no {pattern!r} in {bytes(seen)!r}"
            try:
                data = await asyncio.wait_for(loop.run_in_executor(None, os.read, master, 4096), 2)
            except asyncio.TimeoutError:
                continue
            except OSError:
                break
            seen.extend(data)

    try:
        await asyncio.sleep(1.0)
        os.write(master, b"stty size; echo mark-$((6*7))\n")
        await read_until(b"mark-42")
        assert b"33 111" in seen
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 132, 0, 0))
        os.kill(p.pid, 28)  # SIGWINCH: kubectl sends the new size
        await asyncio.sleep(0.5)
        os.write(master, b"stty size; exit 5\n")
        await read_until(b"50 132")
        assert await asyncio.wait_for(p.wait(), 20) == 5
    finally:
        if p.returncode is None:
            p.kill()
            await p.wait()
        os.close(master)


async def test_kubectl_cp_both_ways(env):
    await env.pod("files", {"main": ["sleep", "3600"]})
    src = env.tmp / "upload.bin"
    payload = os.urandom(300_000)
    src.write_bytes(payload)
    rc, out, err = await env.kubectl("cp", str(src), "files:/tmp/upload.bin")
    assert rc == 0, err
    rc, out, _ = await env.kubectl("exec", "files", "--", "sh", "-c", "wc -c < /tmp/upload.bin")
    assert out.strip() == str(len(payload))
    dst = env.tmp / "download.bin"
    rc, out, err = await env.kubectl("cp", "files:/tmp/upload.bin", str(dst))
    assert rc == 0, err
    assert dst.read_bytes() == payload


async def test_kubectl_port_forward_to_httpd(env):
    await env.pod("web", {"main": ["sh", "-c", "mkdir -p /www && echo served-by-httpd > /www/index.html && "
                                               "exec httpd -f -p 8080 -h /www"]})
    await asyncio.sleep(0.3)
    p = await asyncio.create_subprocess_exec(
        KUBECTL, "--kubeconfig", env.cluster.kubeconfig, "port-forward", "pod/web", ":8080",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        line = (await asyncio.wait_for(p.stdout.readline(), 20)).decode()
        m = re.match(r"Forwarding from 127\.0\.0\.1:(\d+) -> 8080", line)
        assert m, line
        port = int(m.group(1))
        async with aiohttp.ClientSession() as http:
            for _ in range(3):  # one connection each
                async with http.get(f"http://127.0.0.1:{port}/index.html") as r:
                    assert r.status == 200 and await r.text() == "served-by-httpd\n"
    finally:
        p.terminate()
        await p.wait()


async def test_kubelet_authenticates_and_authorizes(env):
    url = f"https://127.0.0.1:{env.server.port}/healthz"
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as http:
        async with http.get(url) as r:
            assert (r.status, await r.text()) == (401, "Unauthorized")
        async with http.get(url, headers={"Authorization": "Bearer not-a-token"}) as r:
            assert r.status == 401
        # a ServiceAccount's token: authenticated by TokenReview, refused by SubjectAccessReview
        from kubeplane.api.resources import resource

        await env.client.create(resource("serviceaccounts"), {
            "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "nobody"}}, "default")
        tr = await env.client.create(resource("serviceaccounts"), {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
            "default", subresource="token", name="nobody")
        token = tr["status"]["token"]
        async with http.get(url, headers={"Authorization": f"Bearer {token}"}) as r:
            assert r.status == 403
            assert await r.text() == ("Forbidden (user=system:serviceaccount:default:nobody, verb=get, "
                                      "resource=nodes, subresource=healthz)")
    # the admin's client certificate (system:masters) is allowed
    ca_dir = env.cluster._pki_dir
    ctx.load_cert_chain(os.path.join(ca_dir, "admin.crt"), os.path.join(ca_dir, "admin.key"))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as http:
        async with http.get(url) as r:
            assert (r.status, await r.text()) == (200, "ok")
    # a certificate of another CA is not a user
    other_ca, other_key = pki.make_ca("other")
    cert, key = pki.issue(other_ca, other_key, "mallory", orgs=("system:masters",))
    (env.tmp / "m.crt").write_bytes(pki.cert_pem(cert))
    (env.tmp / "m.key").write_bytes(pki.key_pem(key))
    bad = ssl.create_default_context()
    bad.check_hostname = False
    bad.verify_mode = ssl.CERT_NONE
    bad.load_cert_chain(str(env.tmp / "m.crt"), str(env.tmp / "m.key"))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=bad)) as http:
        try:
            async with http.get(url) as r:
                assert r.status == 401
        except aiohttp.ClientError:
            pass  # the TLS handshake refused the certificate


async def test_exec_errors_through_the_api_server(env):
    rc, _, err = await env.kubectl("exec", "missing", "--", "true")
    assert rc == 1 and 'pods "missing" not found' in err
    from kubeplane.api.resources import resource

    await env.client.create(resource("pods"), {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "unbound"},
        "spec": {"containers": [{"name": "c", "image": "x"}]}}, "default")
    rc, _, err = await env.kubectl("exec", "unbound", "--", "true")
    assert rc == 1 and "pod unbound does not have a host assigned" in err
    # bound, but no container runs (yet)
    await env.pod("idle", {"main": ["sleep", "3600"]})
    await env.cri.runtime("StopContainer", pb.StopContainerRequest(
        container_id=(await env.server.find_containers("default", "idle", "main"))[0].id, timeout=0))
    rc, _, err = await env.kubectl("exec", "idle", "--", "true")
    assert rc == 1 and 'container not found ("main")' in err


async def test_official_client_exec_and_port_forward(env):
    """The official Python client speaks v4.channel.k8s.io (exec) and the
    channel port-forward protocol (one channel pair per port)."""
    await env.pod("pyclient", {"main": ["sh", "-c", "mkdir -p /www && echo from-python > /www/index.html && "
                                                    "exec httpd -f -p 8080 -h /www"]})
    await asyncio.sleep(0.3)

    def use_client():
        from kubernetes import client as k8s, config
        from kubernetes.stream import portforward, stream

        api = k8s.CoreV1Api(config.new_client_from_config(config_file=env.cluster.kubeconfig))
        try:
            out = stream(api.connect_get_namespaced_pod_exec, "pyclient", "default",
                         command=["sh", "-c", "echo $((40+2))"], stderr=True, stdin=False, stdout=True, tty=False)
            resp = stream(api.connect_get_namespaced_pod_exec, "pyclient", "default",
                          command=["sh", "-c", "exit 9"], stderr=True, stdin=False, stdout=True, tty=False,
                          _preload_content=False)
            resp.run_forever(timeout=10)
            code = resp.returncode
            pf = portforward(api.connect_get_namespaced_pod_portforward, "pyclient", "default", ports="8080")
            sock = pf.socket(8080)
            sock.setblocking(True)
            sock.sendall(b"GET /index.html HTTP/1.0\r\n\r\n")
            data = b""
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
            sock.close()
            return out, code, data, pf.error(8080)
        finally:
            api.api_client.close()

    out, code, data, pf_error = await asyncio.wait_for(asyncio.to_thread(use_client), 60)
    assert out == "42\n"
    assert code == 9
    assert data.startswith(b"HTTP/1.") and data.endswith(b"from-python\n"), data
    assert pf_error is None


async def test_kubectl_attach(env):
    # With stdinOnce the end of the attached stdin is the container's (without,
    # containerd detaches when the client's stdin ends, as docker does). The
    # runtime attaches stdin before stdout: the answer comes a moment later.
    await env.pod("attached", {"main": ["sh", "-c", "read x; sleep 1; echo got $x; cat; echo stdin closed"]},
                  stdin=True, stdin_once=True)
    await asyncio.sleep(0.3)
    rc, out, err = await env.kubectl("attach", "-i", "attached", stdin=b"hello\nmore\n", timeout=30)
    assert (rc, out) == (0, "got hello\nmore\nstdin closed\n"), err


async def test_kubectl_over_spdy(env):
    """kubectl with its WebSocket protocols turned off speaks SPDY/3.1 to the API server."""
    await env.pod("legacy", {"main": ["sh", "-c", "mkdir -p /www && echo over-spdy > /www/index.html && "
                                                  "exec httpd -f -p 8080 -h /www"]})
    await asyncio.sleep(0.3)
    assert await env.kubectl("exec", "legacy", "--", "sh", "-c", "echo a; echo b >&2", spdy=True) == (0, "a\n", "b\n")
    rc, out, err = await env.kubectl("-v=8", "exec", "legacy", "--", "echo", "c", spdy=True)
    assert (rc, out) == (0, "c\n") and "SPDY/3.1" in err and "sec-websocket" not in err.lower()
    rc, out, err = await env.kubectl("exec", "legacy", "--", "sh", "-c", "exit 4", spdy=True)
    assert rc == 4 and "command terminated with exit code 4" in err
    rc, out, _ = await env.kubectl("exec", "-i", "legacy", "--", "wc", "-c", stdin=b"x" * 70000, spdy=True)
    assert (rc, out.strip()) == (0, "70000")
    src = env.tmp / "spdy.bin"
    src.write_bytes(os.urandom(50_000))
    rc, _, err = await env.kubectl("cp", str(src), "legacy:/tmp/spdy.bin", spdy=True)
    assert rc == 0, err
    back = env.tmp / "spdy-back.bin"
    rc, _, err = await env.kubectl("cp", "legacy:/tmp/spdy.bin", str(back), spdy=True)
    assert rc == 0 and back.read_bytes() == src.read_bytes(), err
    rc, _, err = await env.kubectl("exec", "legacy", "-c", "nope", "--", "true", spdy=True)
    assert rc == 1 and "container nope is not valid for pod legacy" in err
    p = await asyncio.create_subprocess_exec(
        KUBECTL, "--kubeconfig", env.cluster.kubeconfig, "port-forward", "pod/legacy", ":8080", env=kubectl_env(True),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        line = (await asyncio.wait_for(p.stdout.readline(), 20)).decode()
        m = re.match(r"Forwarding from 127\.0\.0\.1:(\d+) -> 8080", line)
        assert m, line
        async with aiohttp.ClientSession() as http:
            for _ in range(2):
                async with http.get(f"http://127.0.0.1:{m.group(1)}/index.html") as r:
                    assert await r.text() == "over-spdy\n"
    finally:
        p.terminate()
        await p.wait()


@pytest.mark.parametrize("spdy", [True, False], ids=["spdy", "websocket"])
async def test_kubectl_exec_whose_output_is_not_read(env, spdy):
    """kubectl's output not read for a while: the API server and the kubelet
    hold the process back (it blocks writing) instead of buffering its output;
    reading afterwards gets all of it."""
    total = 96 * 1024 * 1024
    await env.pod("zeros", {"main": ["sleep", "3600"]})
    p = await asyncio.create_subprocess_exec(
        KUBECTL, "--kubeconfig", env.cluster.kubeconfig, "exec", "zeros", "--", "head", "-c", str(total),
        "/dev/zero", env=kubectl_env(spdy), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        first = await asyncio.wait_for(p.stdout.readexactly(4096), 30)
        rss0 = rss_bytes()
        await asyncio.sleep(3.0)  # nothing read
        held = held_streaming_bytes()
        grown = rss_bytes() - rss0
        assert held < 4 * 1024 * 1024, held
        assert grown < 32 * 1024 * 1024, grown
        got = len(first)
        while chunk := await asyncio.wait_for(p.stdout.read(1 << 20), 30):
            assert chunk == bytes(len(chunk))
            got += len(chunk)
        err = await p.stderr.read()
        assert await asyncio.wait_for(p.wait(), 30) == 0, err
        assert got == total
    finally:
        if p.returncode is None:
            p.kill()
            await p.wait()


@pytest.mark.parametrize("spdy", [True, False], ids=["spdy", "websocket"])
async def test_kubectl_port_forward_download_not_read(env, spdy):
    """A forwarded connection whose client stops reading a big download: the
    API server and the kubelet hold the server in the pod back."""
    total = 64 * 1024 * 1024
    await env.pod("bigfile", {"main": ["sh", "-c", f"mkdir -p /www && head -c {total} /dev/zero > /www/big && "
                                                   "touch /ready && exec httpd -f -p 8080 -h /www"]})
    for _ in range(100):  # kubectl port-forward ends at the first connection the pod refuses
        if (await env.kubectl("exec", "bigfile", "--", "test", "-e", "/ready"))[0] == 0:
            break
        await asyncio.sleep(0.2)
    await asyncio.sleep(0.3)
    p = await asyncio.create_subprocess_exec(
        KUBECTL, "--kubeconfig", env.cluster.kubeconfig, "port-forward", "pod/bigfile", ":8080",
        env=kubectl_env(spdy), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    writer = None
    try:
        line = (await asyncio.wait_for(p.stdout.readline(), 20)).decode()
        m = re.match(r"Forwarding from 127\.0\.0\.1:(\d+) -> 8080", line)
        assert m, line
        reader, writer = await asyncio.open_connection("127.0.0.1", int(m.group(1)))
        writer.write(b"GET /big HTTP/1.0\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
        assert f"Content-Length: {total}".encode() in head, head
        rss0 = rss_bytes()
        await asyncio.sleep(3.0)  # nothing read
        held = held_streaming_bytes()
        grown = rss_bytes() - rss0
        assert held < 4 * 1024 * 1024, held
        assert grown < 32 * 1024 * 1024, grown
        got = 0
        while got < total:
            chunk = await asyncio.wait_for(reader.read(1 << 20), 30)
            assert chunk and chunk == bytes(len(chunk))
            got += len(chunk)
    finally:
        if writer is not None:
            writer.close()
        if p.returncode is None:
            p.terminate()
        await p.wait()
