"""Run etcd members from the ``etcd`` binary: one, or a cluster of several on loopback."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class EtcdMember:
    name: str
    data_dir: str
    client_port: int = field(default_factory=free_port)
    peer_port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"


class EtcdCluster:
    """``size`` etcd members on 127.0.0.1, each with its data directory under ``base_dir``."""

    def __init__(self, base_dir: str, size: int = 1, *, binary: str = "etcd", log_dir: str | None = None,
                 progress_notify_interval: str | None = None) -> None:
        #: etcd's --experimental-watch-progress-notify-interval (its default: 10m)
        self.progress_notify_interval = progress_notify_interval
        self.binary = shutil.which(binary) or binary
        self.base_dir = base_dir
        self.log_dir = log_dir or base_dir
        self.members = [EtcdMember(f"m{i}", os.path.join(base_dir, f"m{i}")) for i in range(size)]

    @property
    def client_urls(self) -> list[str]:
        return [m.client_url for m in self.members]

    def _initial_cluster(self) -> str:
        return ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    def start_member(self, m: EtcdMember, *, new: bool = True) -> None:
        os.makedirs(self.log_dir, exist_ok=True)
        args = [
            self.binary, "--name", m.name, "--data-dir", m.data_dir,
            "--listen-client-urls", m.client_url, "--advertise-client-urls", m.client_url,
            "--listen-peer-urls", m.peer_url, "--initial-advertise-peer-urls", m.peer_url,
            "--initial-cluster", self._initial_cluster(),
            "--initial-cluster-state", "new" if new else "existing",
            "--initial-cluster-token", "kubeplane",
            "--heartbeat-interval", "50", "--election-timeout", "500",
            "--logger", "zap", "--log-outputs", "stderr",
        ]
        if self.progress_notify_interval:
            args += ["--experimental-watch-progress-notify-interval", self.progress_notify_interval]
        log = open(os.path.join(self.log_dir, f"etcd-{m.name}.log"), "ab")
        try:
            m.process = subprocess.Popen(args, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        finally:
            log.close()

    def start(self, timeout: float = 30.0) -> "EtcdCluster":
        for m in self.members:
            self.start_member(m)
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until every running member accepts client connections."""
        deadline = time.monotonic() + timeout
        for m in self.members:
            if m.process is None:
                continue
            while True:
                if m.process.poll() is not None:
                    raise RuntimeError(f"etcd member {m.name} exited with {m.process.returncode}")
                try:
                    with socket.create_connection(("127.0.0.1", m.client_port), timeout=0.5):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"etcd member {m.name} did not start in {timeout} s") from None
                    time.sleep(0.02)

    def kill(self, m: EtcdMember, sig: int = signal.SIGKILL) -> None:
        if m.process is not None and m.process.poll() is None:
            m.process.send_signal(sig)
            m.process.wait(10)
        m.process = None

    def stop(self) -> None:
        for m in self.members:
            if m.process is not None and m.process.poll() is None:
                m.process.terminate()
                try:
                    m.process.wait(5)
                except subprocess.TimeoutExpired:
                    m.process.kill()
                    m.process.wait(5)
            m.process = None

    def __enter__(self) -> "EtcdCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
