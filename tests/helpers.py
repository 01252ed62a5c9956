"""Polling helpers shared by every test (importable through pytest's ``pythonpath``).

``eventually`` (async) and ``eventually_sync`` poll a predicate until it returns
something truthy and return that value. A lookup error raised by the predicate
(an assertion, a StatusError such as 404, a missing key or index) means "not
yet"; when time runs out the last such error is chained to the AssertionError.

One default timeout for all of them: generous, since a loaded machine can be
slow, and free when the condition holds (polling returns at once). Pass
``timeout=`` to override it for one call.
"""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from kubeplane.api.errors import StatusError

#: seconds any polling helper waits unless told otherwise
DEFAULT_TIMEOUT = 10.0
#: seconds between two polls
DEFAULT_INTERVAL = 0.01

NOT_YET: tuple[type[BaseException], ...] = (AssertionError, StatusError, KeyError, IndexError)


async def eventually(fn: Callable[[], Awaitable[Any] | Any], *, timeout: float | None = None,
                     interval: float = DEFAULT_INTERVAL, what: str = "condition") -> Any:
    """Await ``fn()`` (a coroutine function or a plain callable) until its result is truthy."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (DEFAULT_TIMEOUT if timeout is None else timeout)
    last: BaseException | None = None
    while True:
        try:
            result = fn()
            if inspect.isawaitable(result):
                result = await result
        except NOT_YET as err:
            last, result = err, None
        if result:
            return result
        if loop.time() > deadline:
            raise AssertionError(f"{what} not met in time") from last
        await asyncio.sleep(interval)


def eventually_sync(fn: Callable[[], Any], *, timeout: float | None = None,
                    interval: float = 0.05, what: str = "condition") -> Any:
    """Call ``fn()`` until its result is truthy (blocking; for tests without an event loop)."""
    deadline = time.monotonic() + (DEFAULT_TIMEOUT if timeout is None else timeout)
    last: BaseException | None = None
    while True:
        try:
            result = fn()
        except NOT_YET as err:
            last, result = err, None
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met in time") from last
        time.sleep(interval)


def caught_up(controller: Any, informer: Any, resource_version: str, *, delayed: bool = False) -> bool:
    """A positive sync point for "the controller did nothing": ``informer`` has
    seen ``resource_version`` (or later), delivered every notification to its
    handlers, and every work queue of ``controller`` is idle. With
    ``delayed=True`` delayed adds may remain (``quiet`` instead of ``idle``),
    for controllers that always keep a periodic re-check scheduled."""
    seen = informer.last_sync_resource_version
    done = controller.quiet if delayed else controller.idle
    return bool(seen) and int(seen) >= int(resource_version) and informer.pending == 0 and done


async def settled(controller: Any, client: Any, *watched: tuple[Any, Any], namespace: str | None = None,
                  timeout: float | None = None, delayed: bool = False) -> None:
    """Wait until ``controller`` has caught up (see :func:`caught_up`) with the
    newest stored object of each watched ``(informer, resource)`` pair."""
    targets = []
    for informer, res in watched:
        items = (await client.list(res, namespace))["items"]
        newest = max((int(o["metadata"]["resourceVersion"]) for o in items), default=0)
        targets.append((informer, str(newest)))
    await eventually(lambda: all(caught_up(controller, inf, rv, delayed=delayed) for inf, rv in targets),
                     timeout=timeout,
                     what=f"{type(controller).__name__} settled")


class ManualClock:
    """A clock a test moves by hand: ``clock()`` reads it, ``advance(seconds)`` moves it."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def make_cert(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (PEM files)."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", f"/CN={name}", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    return cert, key


def node_kubeconfig(cluster, name: str, path: str) -> str:
    """A kubeconfig for ``system:node:<name>`` (group system:nodes): a client
    certificate from the cluster's CA, as a joined node ends up with."""
    from kubeplane.auth import pki
    from kubeplane.client.kubeconfig import write_kubeconfig

    own = pki.PKI(cluster._pki_dir)
    cert, key = pki.issue(own.ca_cert, own.ca_key, f"system:node:{name}", orgs=("system:nodes",))
    write_kubeconfig(path, cluster.url, ca_data=own.ca_pem, client_cert_data=pki.cert_pem(cert),
                     client_key_data=pki.key_pem(key))
    return path
