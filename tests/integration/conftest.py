"""Fixtures that run a real kubeplane API server as a subprocess.

kubectl and the official Python client are blocking, so the server under test
runs in its own process, on 127.0.0.1 with a free port, and is stopped after.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    kubeconfig: Path
    data_dir: Path
    url: str
    log_path: Path

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    # The server serves HTTPS with a CA made in <data-dir>/pki; the admin's
    # client certificate (system:masters) is there too, as in the kubeconfig.
    @property
    def ca_file(self) -> str:
        return str(self.data_dir / "pki" / "ca.crt")

    @property
    def cert(self) -> tuple[str, str]:
        """The admin client certificate and key (for requests' ``cert=``)."""
        return str(self.data_dir / "pki" / "admin.crt"), str(self.data_dir / "pki" / "admin.key")

    @property
    def host_port(self) -> tuple[str, int]:
        host, port = self.url.split("//", 1)[1].rsplit(":", 1)
        return host.strip("[]"), int(port)

    def ssl_context(self, client_cert: bool = True) -> ssl.SSLContext | None:
        """A client TLS context verifying the server (with the admin's
        certificate unless ``client_cert=False``); None for plain HTTP."""
        if not self.url.startswith("https://"):
            return None
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if client_cert:
            ctx.load_cert_chain(*self.cert)
        return ctx

    def session(self, client_cert: bool = True, **kw):
        """An aiohttp session on the server, verifying TLS, as the admin."""
        import aiohttp

        ctx = self.ssl_context(client_cert)
        return aiohttp.ClientSession(self.url, connector=aiohttp.TCPConnector(ssl=ctx if ctx else False), **kw)

    def connect(self, timeout: float | None = None) -> socket.socket:
        """A raw connection (TLS handshake done, as the admin) for byte-level tests."""
        raw = socket.create_connection(self.host_port, timeout=timeout)
        ctx = self.ssl_context()
        return ctx.wrap_socket(raw, server_hostname=self.host_port[0]) if ctx else raw

    async def open_connection(self):
        """asyncio streams on a raw connection (TLS, as the admin)."""
        import asyncio

        host, port = self.host_port
        ctx = self.ssl_context()
        return await asyncio.open_connection(host, port, ssl=ctx, server_hostname=host if ctx else None)

    def http_connection(self, timeout: float = 30):
        import http.client

        host, port = self.host_port
        ctx = self.ssl_context()
        if ctx is None:
            return http.client.HTTPConnection(host, port, timeout=timeout)
        return http.client.HTTPSConnection(host, port, timeout=timeout, context=ctx)


def start_server(tmp: Path, storage: str = "memory", extra: list[str] | None = None,
                 command: str = "apiserver") -> ServerProcess:
    tmp.mkdir(parents=True, exist_ok=True)
    kubeconfig = tmp / "kubeconfig"
    if kubeconfig.exists():
        kubeconfig.unlink()
    data_dir = tmp / "data"
    log_path = tmp / "server.log"
    logf = open(log_path, "ab")
    # `up` serves the components' metrics on 127.0.0.1:10259 and DNS on 127.0.0.1:10053 by default:
    # tests take free ports. It runs a real node where the host can: these tests want simulated nodes only.
    own = ["--metrics-listen", "127.0.0.1:0", "--dns-addr", "127.0.0.1:0", "--real-node", "off"] \
        if command == "up" else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "kubeplane.cli.main", command, "--listen", "127.0.0.1:0",
         "--kubeconfig", str(kubeconfig), "--storage", storage, "--data-dir", str(data_dir), *own,
         *(extra or [])],
        stdout=logf, stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while not kubeconfig.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("API server did not start:\n" + log_path.read_text(errors="replace"))
        time.sleep(0.05)
    cfg = yaml.safe_load(kubeconfig.read_text())
    url = cfg["clusters"][0]["cluster"]["server"]
    return ServerProcess(proc, kubeconfig, data_dir, url, log_path)


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("apiserver"))
    yield srv
    srv.stop()


@dataclass
class KubectlResult:
    rc: int
    out: str
    err: str


class Kubectl:
    def __init__(self, kubeconfig: Path, cache_dir: Path) -> None:
        self.kubeconfig = kubeconfig
        self.cache_dir = cache_dir

    def __call__(self, *args: str, stdin: str | None = None, timeout: float = 60, check: bool = True) -> KubectlResult:
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), HOME=str(self.cache_dir))
        p = subprocess.run(
            [KUBECTL, "--cache-dir", str(self.cache_dir / "cache"), *args],
            input=stdin, capture_output=True, text=True, timeout=timeout, env=env,
        )
        res = KubectlResult(p.returncode, p.stdout, p.stderr)
        if check and p.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed rc={p.returncode}\nstdout:{p.stdout}\nstderr:{p.stderr}")
        return res

    def popen(self, *args: str) -> subprocess.Popen:
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), HOME=str(self.cache_dir))
        return subprocess.Popen([KUBECTL, "--cache-dir", str(self.cache_dir / "cache"), *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.fixture(scope="session")
def kubectl(server, tmp_path_factory) -> Kubectl:
    if not os.path.exists(KUBECTL):
        pytest.fail("kubectl is required for these tests")
    return Kubectl(server.kubeconfig, tmp_path_factory.mktemp("kubectl-home"))


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """One whole cluster (`kubeplane up`: API server, scheduler, controllers and
    three simulated nodes) shared by the workload tests; each test works in a
    namespace of its own and leaves the nodes as it found them."""
    srv = start_server(tmp_path_factory.mktemp("cluster"), command="up", extra=["--nodes", "3"])
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def cluster_kubectl(cluster, tmp_path_factory) -> Kubectl:
    if not os.path.exists(KUBECTL):
        pytest.fail("kubectl is required for these tests")
    return Kubectl(cluster.kubeconfig, tmp_path_factory.mktemp("cluster-kubectl-home"))
