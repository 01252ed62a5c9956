"""Bounds on the work one connection or request can make the server do.

As upstream's kube-apiserver (its http.Server settings and the maxinflight,
timeout and request-deadline filters):

- request headers (request line included) must arrive within
  ``header_timeout`` (32 s) of their first byte, and may take at most
  ``max_header_bytes`` (1 MiB); more is answered 431;
- an idle keep-alive connection is closed after ``idle_timeout`` (90 s);
- a request that is not long-running (watches, logs, exec, ... are) ends at
  ``request_timeout`` (60 s, shortened by a ``?timeout=`` parameter) with a
  504 Status; a request whose body has not arrived by then is answered and
  its connection closed;
- at most ``max_requests_inflight`` read-only and
  ``max_mutating_requests_inflight`` mutating requests are served at once
  (long-running ones are not counted); the excess gets 429 with Retry-After.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong
from aiohttp.streams import EMPTY_PAYLOAD
from aiohttp.web_protocol import RequestHandler, _ErrInfo

from kubeplane.api import errors
from kubeplane.api.duration import parse_duration

log = logging.getLogger("kubeplane.apiserver")

#: set on a request whose connection must close once its response is sent
CLOSE_AFTER_RESPONSE: "web.RequestKey[bool]" = web.RequestKey("close_after_response", bool)

LONG_RUNNING_SUBRESOURCES = frozenset({"attach", "exec", "log", "portforward", "proxy"})
HEALTH_PATHS = ("/healthz", "/livez", "/readyz")


@dataclass
class ServingLimits:
    max_requests_inflight: int = 400
    max_mutating_requests_inflight: int = 200
    #: seconds a request that is not long-running may take (0: no limit)
    request_timeout: float = 60.0
    #: watches without timeoutSeconds end after a random time in [min, 2*min]
    min_request_timeout: float = 1800.0
    header_timeout: float = 32.0
    idle_timeout: float = 90.0
    max_header_bytes: int = 1 << 20


# -- which requests are long-running -----------------------------------------

def is_long_running(request: web.BaseRequest) -> bool:
    """Watches and the streaming subresources, as upstream's
    LongRunningRequestCheck (verbs watch and proxy; subresources attach, exec,
    log, portforward, proxy)."""
    parts = [p for p in request.path.split("/") if p]
    if parts[:1] == ["api"]:
        rest = parts[2:]
    elif parts[:1] == ["apis"]:
        rest = parts[3:]
    else:
        return False
    if not rest:
        return False
    if rest[0] in ("watch", "proxy"):
        return True
    if rest[0] == "namespaces" and len(rest) > 2:
        rest = rest[2:]
    if len(rest) == 1 and request.method == "GET":
        watch = request.query.get("watch")
        return watch is not None and watch.lower() in ("true", "1")
    return len(rest) >= 3 and rest[2] in LONG_RUNNING_SUBRESOURCES


def _is_health(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in HEALTH_PATHS)


# -- in-flight limit ------------------------------------------------------------

class InflightLimiter:
    """Upstream's maxinflight filter: a full pool answers 429 at once."""

    def __init__(self, max_readonly: int, max_mutating: int) -> None:
        self.max_readonly = max_readonly
        self.max_mutating = max_mutating
        self.readonly = 0
        self.mutating = 0

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        # Health probes are exempt, as upstream's default flow schemas make them.
        if is_long_running(request) or _is_health(request.path):
            return await handler(request)
        mutating = request.method not in ("GET", "HEAD")
        limit = self.max_mutating if mutating else self.max_readonly
        if limit <= 0:
            return await handler(request)
        if (self.mutating if mutating else self.readonly) >= limit:
            return too_many_requests()
        if mutating:
            self.mutating += 1
        else:
            self.readonly += 1
        try:
            return await handler(request)
        finally:
            if mutating:
                self.mutating -= 1
            else:
                self.readonly -= 1


def too_many_requests() -> web.Response:
    # Upstream answers with net/http's plain-text error, not a Status.
    return web.Response(
        status=429, text="Too many requests, please try again later.\n",
        headers={"Retry-After": "1", "Content-Type": "text/plain; charset=utf-8",
                 "X-Content-Type-Options": "nosniff"},
    )


# -- request deadline -------------------------------------------------------------

def _status(err: errors.StatusError, close: bool = False) -> web.Response:
    headers = {"Content-Type": "application/json"}
    if err.retry_after:
        headers["Retry-After"] = str(err.retry_after)
    resp = web.Response(body=orjson.dumps(err.to_status()), status=err.code, headers=headers)
    if close:
        resp.force_close()
    return resp


def deadline_middleware(request_timeout: float) -> Any:
    """Upstream's WithRequestDeadline and timeout filters for requests that
    are not long-running: 504 Timeout when the deadline passes.

    A handler that timed out after reading its whole body keeps running to
    its end (as upstream's handler goroutine does), so a write it started is
    not cut in half; one still waiting for its body is cancelled (it has done
    nothing yet) and the connection is closed after the 504."""

    @web.middleware
    async def middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        if is_long_running(request):
            return await handler(request)
        timeout = request_timeout
        asked = request.query.get("timeout")
        if asked:
            try:
                wanted = parse_duration(asked)
            except ValueError as exc:
                return _status(errors.bad_request(f"invalid timeout specified in the request URL - {exc}"))
            if 0 < wanted < timeout or timeout <= 0 < wanted:
                timeout = wanted
        if timeout <= 0:
            return await handler(request)
        task = asyncio.ensure_future(handler(request))
        try:
            done, _ = await asyncio.wait({task}, timeout=timeout)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if done:
            return task.result()
        body_pending = not request.content.is_eof()
        if body_pending:
            task.cancel()
            request[CLOSE_AFTER_RESPONSE] = True
        task.add_done_callback(_log_late_failure)
        return _status(errors.timeout("request did not complete within requested timeout - "
                                      "context deadline exceeded"), close=body_pending)

    return middleware


def _log_late_failure(task: asyncio.Future) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None and not isinstance(exc, errors.StatusError):
        log.error("request failed after it timed out", exc_info=exc)


# -- connections: header deadline, header size, idle timeout ----------------------

HEADER_TOO_LARGE = "431 Request Header Fields Too Large"


class BoundedRequestHandler(RequestHandler):
    """aiohttp's connection handler with Go's ReadHeaderTimeout and
    MaxHeaderBytes: the request line and headers must be complete within
    ``header_timeout`` of the request's first byte (of the connection, for its
    first request) and within ``max_header_bytes``. The idle keep-alive limit
    is aiohttp's ``keepalive_timeout``; while headers are arriving, the header
    deadline governs instead.

    This extends aiohttp's RequestHandler through some of its internals
    (the message queue, the waiter, _process_keepalive, _ErrInfo): aiohttp
    is pinned to one version for that, and the tests of this module exercise
    each of them."""

    def __init__(self, manager: Any, *, header_timeout: float = 32.0, max_header_bytes: int = 1 << 20,
                 **kwargs: Any) -> None:
        kwargs.setdefault("max_line_size", max_header_bytes)
        kwargs.setdefault("max_field_size", max_header_bytes)
        kwargs.setdefault("max_headers", 8192)
        super().__init__(manager, **kwargs)
        self._header_timeout = header_timeout
        self._max_header_bytes = max_header_bytes
        self._header_timer: asyncio.TimerHandle | None = None
        self._header_bytes = 0
        self._last_payload: Any = None
        self._rejected = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        self._header_bytes = 0
        if self._header_timeout > 0 and self._header_timer is None:
            self._header_timer = self._loop.call_later(self._header_timeout, self._header_timed_out)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        # As Go's server: the connection is closed without a response.
        self._header_timer = None
        self.force_close()

    def _process_keepalive(self) -> None:
        if self._header_timer is not None:
            return  # a request has begun: its header deadline applies
        super()._process_keepalive()

    def data_received(self, data: bytes) -> None:
        if self._rejected or self._force_close or self._close:
            return
        if (self._header_timer is None and self._payload_parser is None and not self._upgraded
                and (self._last_payload is None or self._last_payload.is_eof())):
            self._arm_header_timer()  # the first bytes of a new request
        before = self._request_count
        super().data_received(data)
        if self._request_count != before:
            self._disarm_header_timer()
            self._last_payload = self._messages[-1][1] if self._messages else None
        elif self._header_timer is not None:
            self._header_bytes += len(data)
            if self._header_bytes > self._max_header_bytes:
                self._reject(HEADER_TOO_LARGE)

    def _reject(self, message: str) -> None:
        self._rejected = True
        self._disarm_header_timer()
        self._messages.append((_ErrInfo(status=431, exc=LineTooLong(b"", self._max_header_bytes),
                                        message=message), EMPTY_PAYLOAD))
        self._request_count += 1
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        too_large = status == 431 or isinstance(exc, LineTooLong) or (
            isinstance(exc, BadHttpMessage) and "Too many headers" in str(exc))
        if not too_large:
            return super().handle_error(request, status, exc, message)
        self._rejected = True
        log.debug("request headers from %s are too large", request.remote)
        resp = web.Response(status=431, text=HEADER_TOO_LARGE,
                            headers={"Content-Type": "text/plain; charset=utf-8"})
        resp.force_close()
        return resp

    async def finish_response(self, request: Any, resp: web.StreamResponse,
                              start_time: float | None) -> tuple[web.StreamResponse, bool]:
        result = await super().finish_response(request, resp, start_time)
        if request.get(CLOSE_AFTER_RESPONSE):
            # The body never came: do not linger waiting for it.
            self.force_close()
        return result


class BoundedServer(web.Server):
    def __init__(self, *args: Any, header_timeout: float, max_header_bytes: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._bounds = {"header_timeout": header_timeout, "max_header_bytes": max_header_bytes}

    def __call__(self) -> RequestHandler:
        return BoundedRequestHandler(self, loop=self._loop, **self._bounds, **self._kwargs)


class BoundedSockSite(web.SockSite):
    """A SockSite whose TLS handshakes must finish within the header deadline
    (as Go's server bounds the handshake by its read-header timeout)."""

    def __init__(self, runner: web.BaseRunner, sock: Any, *, handshake_timeout: float, **kwargs: Any) -> None:
        super().__init__(runner, sock, **kwargs)
        self._handshake_timeout = handshake_timeout

    async def start(self) -> None:
        if self._ssl_context is None or self._handshake_timeout <= 0:
            await super().start()
            return
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            server, sock=self._sock, ssl=self._ssl_context, backlog=self._backlog,
            ssl_handshake_timeout=self._handshake_timeout)


class BoundedAppRunner(web.AppRunner):
    """An AppRunner whose connections are :class:`BoundedRequestHandler`."""

    def __init__(self, app: web.Application, limits: ServingLimits, **kwargs: Any) -> None:
        kwargs.setdefault("keepalive_timeout", limits.idle_timeout)
        super().__init__(app, **kwargs)
        self._limits = limits

    async def _make_server(self) -> web.Server:
        plain = await super()._make_server()
        return BoundedServer(
            plain.request_handler, request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation, loop=plain._loop,
            header_timeout=self._limits.header_timeout, max_header_bytes=self._limits.max_header_bytes,
            **plain._kwargs,
        )
