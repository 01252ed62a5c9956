"""Running the API server: store + registry + HTTP listener + kubeconfig."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from dataclasses import dataclass, field

from aiohttp import web

from kubeplane.api.resources import CATALOGUE, Catalogue
from kubeplane.apiserver.eventttl import DEFAULT_EVENT_TTL, EventExpiry
from kubeplane.apiserver.server import MAX_BODY_BYTES, build_app
from kubeplane.registry.registry import Registry
from kubeplane.storage import open_store
from kubeplane.storage.memory import DEFAULT_HISTORY_BYTES
from kubeplane.storage.interface import Store

log = logging.getLogger("kubeplane.apiserver")


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6); port 0 picks a free port."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--listen must be HOST:PORT, got {listen!r}")
    host = host.strip("[]") or "127.0.0.1"
    p = int(port)
    if not 0 <= p <= 65535:
        raise ValueError(f"port out of range in --listen {listen!r}")
    return host, p


@dataclass
class APIServerConfig:
    data_dir: str = "data"
    listen: str = "127.0.0.1:6443"
    storage: str = "sqlite"
    kubeconfig: str | None = None
    max_body: int = MAX_BODY_BYTES
    #: how many revisions of history watches and lists can reach back into
    history_revisions: int = 10_000
    #: how many bytes of history (estimated from encoded sizes) are kept
    history_bytes: int = DEFAULT_HISTORY_BYTES
    #: seconds an Event lives after its last write (0: forever)
    event_ttl: float = DEFAULT_EVENT_TTL


@dataclass
class APIServer:
    """An API server running in this process's event loop."""

    config: APIServerConfig
    store: Store | None = None
    registry: Registry | None = None
    url: str = ""
    _runner: web.AppRunner | None = field(default=None, repr=False)
    _event_expiry: EventExpiry | None = field(default=None, repr=False)

    async def start(self) -> None:
        cfg = self.config
        host, port = parse_listen(cfg.listen)
        if cfg.storage == "sqlite":
            os.makedirs(cfg.data_dir, exist_ok=True)
        self.store = await open_store(cfg.storage, cfg.data_dir if cfg.storage == "sqlite" else None,
                                      history=cfg.history_revisions, history_bytes=cfg.history_bytes)
        self.registry = Registry(self.store, CATALOGUE)
        await ensure_default_namespaces(self.registry)
        if cfg.event_ttl > 0:
            self._event_expiry = EventExpiry(self.store, cfg.event_ttl)
            self._event_expiry.start()
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
        sock.setblocking(False)
        bound_port = sock.getsockname()[1]
        shown_host = f"[{host}]" if ":" in host else host
        address = f"{shown_host}:{bound_port}"
        app = build_app(self.registry, CATALOGUE, max_body=cfg.max_body, server_address=address)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.SockSite(self._runner, sock, shutdown_timeout=1.0)
        await site.start()
        self.url = f"http://{address}"
        if cfg.kubeconfig:
            from kubeplane.client.kubeconfig import write_kubeconfig

            write_kubeconfig(cfg.kubeconfig, self.url)
        log.info("API server listening on %s (storage %s)", self.url, cfg.storage)

    async def stop(self) -> None:
        if self._event_expiry is not None:
            await self._event_expiry.stop()
            self._event_expiry = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.registry is not None:
            await self.registry.close()
        if self.store is not None:
            await self.store.close()
            self.store = None


async def ensure_default_namespaces(registry: Registry, catalogue: Catalogue = CATALOGUE) -> None:
    """Creates ``default``, ``kube-system``, ``kube-public`` and ``kube-node-lease`` if missing."""
    from kubeplane.api.errors import StatusError
    from kubeplane.api.resources import resource

    ns = resource("namespaces")
    for name in ("default", "kube-system", "kube-public", "kube-node-lease"):
        try:
            await registry.create(ns, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        except StatusError as err:
            if err.code != 409:
                raise


async def serve_forever(server: APIServer, stop: asyncio.Event) -> None:
    await server.start()
    try:
        await stop.wait()
    finally:
        await server.stop()
