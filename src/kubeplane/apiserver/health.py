"""``/healthz``, ``/livez`` and ``/readyz`` with named checks, as kube-apiserver serves them.

Each path runs its checks; ``?verbose`` lists them (``[+]ping ok``), ``?exclude=NAME``
skips one, and ``/readyz/NAME`` runs a single check. A failing check makes the
path answer 500 with the listing, the reason withheld (it is logged instead),
as upstream does. The storage check is named ``etcd`` like upstream's: for
liveness it only asks whether the store is open (a full disk is no reason to
restart the server), for readiness whether it accepts writes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from aiohttp import web

from kubeplane.storage.interface import Store

log = logging.getLogger("kubeplane.apiserver.health")

#: a check returns None when healthy, else the reason it fails
CheckFn = Callable[[], Awaitable[str | None]]

CHECK_TIMEOUT = 5.0
"""Seconds a check may take before it counts as failed."""

_HEADERS = {"X-Content-Type-Options": "nosniff"}


async def _ping() -> str | None:
    return None


def storage_checks(store: Store) -> tuple[CheckFn, CheckFn]:
    """The liveness and readiness forms of the ``etcd`` check for ``store``."""

    async def alive() -> str | None:
        if getattr(store, "closed", False):
            return "the store is closed"
        return None

    async def ready() -> str | None:
        reason = await alive()
        if reason is not None:
            return reason
        check = getattr(store, "check_writable", None)
        if check is None:
            return None
        return await check()

    return alive, ready


async def _run(check: CheckFn) -> str | None:
    try:
        return await asyncio.wait_for(check(), CHECK_TIMEOUT)
    except asyncio.TimeoutError:
        return f"the check did not finish within {CHECK_TIMEOUT:g}s"
    except Exception as exc:  # noqa: BLE001 - a crashing check is a failing check
        return repr(exc)


def _text(body: str, status: int = 200) -> web.Response:
    return web.Response(text=body, status=status, content_type="text/plain", charset="utf-8", headers=_HEADERS)


def _root_handler(name: str, checks: list[tuple[str, CheckFn]]):
    async def handler(request: web.Request) -> web.Response:
        excluded = set()
        for value in request.query.getall("exclude", []):
            excluded.update(v.strip() for v in value.split(",") if v.strip())
        verbose = "verbose" in request.query
        lines: list[str] = []
        failed = False
        for check_name, fn in checks:
            if check_name in excluded:
                excluded.discard(check_name)
                lines.append(f"[+]{check_name} excluded: ok\n")
                continue
            reason = await _run(fn)
            if reason is None:
                lines.append(f"[+]{check_name} ok\n")
            else:
                failed = True
                log.warning("%s check %s failed: %s", name, check_name, reason)
                lines.append(f"[-]{check_name} failed: reason withheld\n")
        if excluded:
            quoted = ",".join(f'"{e}"' for e in sorted(excluded))
            lines.append(f"warn: some health checks cannot be excluded: no matches for {quoted}\n")
        if failed:
            return _text("".join(lines) + f"{name} check failed\n", 500)
        if not verbose:
            return _text("ok")
        return _text("".join(lines) + f"{name} check passed\n")

    return handler


def _single_handler(fn: CheckFn):
    async def handler(request: web.Request) -> web.Response:
        reason = await _run(fn)
        if reason is not None:
            return _text(f"internal server error: {reason}\n", 500)
        return _text("ok")

    return handler


def add_routes(router: web.UrlDispatcher, store: Store) -> None:
    """Serve the three health paths and one path per check under each."""
    alive, ready = storage_checks(store)
    paths = {
        "healthz": [("ping", _ping), ("etcd", alive)],
        "livez": [("ping", _ping), ("etcd", alive)],
        "readyz": [("ping", _ping), ("etcd", ready)],
    }
    for name, checks in paths.items():
        router.add_get(f"/{name}", _root_handler(name, checks))
        for check_name, fn in checks:
            router.add_get(f"/{name}/{check_name}", _single_handler(fn))
