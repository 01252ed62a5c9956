"""The kubelet API of a node: HTTPS, authenticated and authorized as upstream's.

Endpoints (the paths upstream's kubelet serves):

- ``GET /containerLogs/{namespace}/{pod}/{container}`` with ``follow``,
  ``previous``, ``timestamps``, ``tailLines``, ``limitBytes``,
  ``sinceSeconds``, ``sinceTime``: read from the CRI log files;
- ``/exec/{namespace}/{pod}[/{uid}]/{container}?command=..&input=1&output=1&error=1&tty=1``
  and ``/attach/...`` over a WebSocket of ``v5.channel.k8s.io`` (or v4):
  bridged to the runtime's streaming server (the URL of CRI ``Exec``/``Attach``),
  which speaks SPDY (containerd 1.6 serves the v1-v4 protocols; its WebSocket
  side cannot half-close stdin, SPDY can);
- ``/portForward/{namespace}/{pod}[/{uid}]`` over a WebSocket tunnelling
  SPDY (``SPDY/3.1+portforward.k8s.io``, as kubectl 1.32 dials it): each
  forwarded connection (an error and a data stream) gets its own CRI
  ``PortForward`` URL and SPDY session to the runtime;
- ``GET /healthz``.

Authentication: a client certificate verified against ``client_ca_file``
(user from the CN, groups from the O's), else a bearer token checked with a
TokenReview. Authorization: a SubjectAccessReview of the verb (from the
HTTP method) on ``nodes/<subresource>`` of this node, the subresource from
the path as upstream's kubelet maps it (``proxy`` for exec, attach,
port-forward and logs of containers). Results are cached briefly as
upstream's webhook authenticator and authorizer do.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import WSMsgType, web

from kubeplane.api.meta import parse_timestamp
from kubeplane.node.cri import CONTAINER_NAME_LABEL, POD_NAME_LABEL, POD_NAMESPACE_LABEL, POD_UID_LABEL
from kubeplane.node.cri.client import CRIClient, CRIError, pb
from kubeplane.streaming import channels, spdy

log = logging.getLogger(__name__)

#: seconds an allowed (denied) authorization and an authenticated token are cached
AUTHZ_ALLOW_TTL = 300.0
AUTHZ_DENY_TTL = 30.0
TOKEN_TTL = 120.0
#: how often a followed log checks whether its container still runs
FOLLOW_POLL = 0.1
#: upstream's --streaming-connection-idle-timeout default
STREAMING_IDLE_TIMEOUT = 4 * 3600.0

_SUBRESOURCES = (("/stats", "stats"), ("/metrics", "metrics"), ("/logs", "log"), ("/spec", "spec"),
                 ("/pods", "pods"), ("/healthz", "healthz"), ("/configz", "configz"),
                 ("/checkpoint", "checkpoint"))
_VERBS = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


class HTTPError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


def _error(code: int, reason: str, message: str) -> web.Response:
    return web.json_response(status_body(code, reason, message), status=code)


def bad_request(message: str) -> HTTPError:
    return HTTPError(400, "BadRequest", message)


def not_found(message: str) -> HTTPError:
    return HTTPError(404, "NotFound", message)


@dataclass
class User:
    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: dict[str, list[str]] | None = None


def subresource_of(path: str) -> str:
    for prefix, sub in _SUBRESOURCES:
        if path == prefix or path.startswith(prefix + "/"):
            return sub
    return "proxy"


# -- CRI log files ---------------------------------------------------------


@dataclass
class LogEntry:
    timestamp: str
    stream: str
    partial: bool
    content: bytes

    @property
    def time(self) -> float:
        return parse_timestamp(self.timestamp)


def parse_log_line(line: bytes) -> LogEntry | None:
    """One line of a CRI log file: ``<RFC3339Nano> <stdout|stderr> <P|F> <content>``."""
    parts = line.rstrip(b"\n").split(b" ", 3)
    if len(parts) < 3:
        return None
    ts, stream, tag = parts[0].decode("ascii", "replace"), parts[1].decode("ascii", "replace"), parts[2]
    content = parts[3] if len(parts) > 3 else b""
    if stream not in ("stdout", "stderr") or tag not in (b"P", b"F"):
        return None
    return LogEntry(ts, stream, tag == b"P", content)


@dataclass
class LogOptions:
    follow: bool = False
    previous: bool = False
    timestamps: bool = False
    tail_lines: int | None = None
    limit_bytes: int | None = None
    since_seconds: int | None = None
    since_time: str | None = None

    @property
    def since(self) -> float | None:
        if self.since_seconds is not None:
            return time.time() - self.since_seconds
        if self.since_time is not None:
            return parse_timestamp(self.since_time)
        return None


def _bool(q: Any, name: str) -> bool:
    v = q.get(name)
    if v is None:
        return False
    if v in ("", "1", "true", "True", "TRUE", "t", "T"):
        return True
    if v in ("0", "false", "False", "FALSE", "f", "F"):
        return False
    raise bad_request(f"invalid value {v!r} for {name}: want true or false")


def _int(q: Any, name: str) -> int | None:
    v = q.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise bad_request(f"invalid value {v!r} for {name}: not an integer") from None


def log_options(q: Any) -> LogOptions:
    """Upstream's PodLogOptions from a query, with its validation and wording."""
    o = LogOptions(follow=_bool(q, "follow"), previous=_bool(q, "previous"), timestamps=_bool(q, "timestamps"),
                   tail_lines=_int(q, "tailLines"), limit_bytes=_int(q, "limitBytes"),
                   since_seconds=_int(q, "sinceSeconds"), since_time=q.get("sinceTime") or None)
    problems = []
    if o.tail_lines is not None and o.tail_lines < 0:
        problems.append("tailLines: Invalid value: %d: must be greater than or equal to 0" % o.tail_lines)
    if o.limit_bytes is not None and o.limit_bytes < 1:
        problems.append("limitBytes: Invalid value: %d: must be greater than 0" % o.limit_bytes)
    if o.since_seconds is not None and o.since_time is not None:
        problems.append("sinceSeconds: Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified")
    elif o.since_seconds is not None and o.since_seconds < 1:
        problems.append("sinceSeconds: Invalid value: %d: must be greater than 0" % o.since_seconds)
    if o.since_time is not None:
        try:
            parse_timestamp(o.since_time)
        except ValueError:
            problems.append(f"sinceTime: Invalid value: {o.since_time!r}: not an RFC 3339 time")
    if problems:
        raise bad_request("PodLogOptions is invalid: " + ", ".join(problems) if len(problems) > 1
                          else problems[0])
    return o


class LogRenderer:
    """Turns CRI log entries into the bytes ``kubectl logs`` prints, as upstream's kubelet does."""

    def __init__(self, opts: LogOptions) -> None:
        self.opts = opts
        self.since = opts.since
        self.remaining = opts.limit_bytes
        self._in_line = False  # the previous entry was partial: no timestamp before this one

    def render(self, e: LogEntry) -> bytes:
        if self.since is not None and not self._in_line:
            try:
                if e.time < self.since:
                    return b""
            except ValueError:
                pass
        out = e.content + (b"" if e.partial else b"\n")
        if self.opts.timestamps and not self._in_line:
            out = e.timestamp.encode() + b" " + out
        self._in_line = e.partial
        if self.remaining is not None:
            out = out[:self.remaining]
            self.remaining -= len(out)
        return out

    @property
    def done(self) -> bool:
        return self.remaining is not None and self.remaining <= 0


#: the block size ``tail_offset`` reads a log file backwards in
TAIL_BLOCK = 64 * 1024


def tail_offset(path: str, lines: int) -> int:
    """The file offset where the last ``lines`` log lines start (a line of
    partial entries counts once).

    The file is read backwards from its end, a block at a time, until enough
    lines are found: a tail of a big log reads only about what it returns.
    """
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        if lines == 0:
            return size
        found = 0
        # the offset of the entry after the one at hand (the last one seen):
        # it starts a line when the entry before it is not partial
        later: int | None = None
        pos = size  # the offset of buf[0]
        buf = b""
        end = 0  # where the raw line at hand ends in buf (without its newline)
        while True:
            nl = buf.rfind(b"\n", 0, end)
            if nl < 0 and pos > 0:
                # the line at hand starts before buf: read the block before it
                n = min(TAIL_BLOCK, pos)
                pos -= n
                f.seek(pos)
                buf = f.read(n) + buf[:end]
                end = len(buf)
                continue
            raw = buf[nl + 1:end]
            e = parse_log_line(raw) if raw else None
            if e is not None:
                if later is not None and not e.partial:
                    found += 1
                    if found == lines:
                        return later
                later = pos + nl + 1
            if nl < 0:  # the first line of the file
                if later is not None and found + 1 == lines:
                    return later
                return 0
            end = nl


# -- the server --------------------------------------------------------------


class KubeletServer:
    """The kubelet API of one node over ``cri``; :meth:`start` listens."""

    def __init__(self, cri: CRIClient, *, node_name: str, client: Any = None,
                 tls_cert_file: str | None = None, tls_key_file: str | None = None,
                 client_ca_file: str | None = None, host: str = "0.0.0.0", port: int = 10250,
                 authorize: bool = True, streaming_idle_timeout: float = STREAMING_IDLE_TIMEOUT) -> None:
        self.cri = cri
        self.node_name = node_name
        self.client = client
        self.tls_cert_file, self.tls_key_file, self.client_ca_file = tls_cert_file, tls_key_file, client_ca_file
        self.host, self.port = host, port
        #: False: every request is allowed (no authentication, for a server on loopback in tests)
        self.authorize = authorize
        #: an exec, attach or port-forward with no data either way for that long is closed
        #: (upstream's --streaming-connection-idle-timeout)
        self.streaming_idle_timeout = streaming_idle_timeout
        self._token_cache: dict[str, tuple[float, User | None]] = {}
        self._authz_cache: dict[tuple, tuple[float, bool, str]] = {}
        self._runner: web.AppRunner | None = None
        self._sessions: set[asyncio.Task] = set()
        self.app = self._build_app()

    # -- lifecycle -----------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls_cert_file:
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        if self.client_ca_file:
            ctx.load_verify_locations(cafile=self.client_ca_file)
            ctx.verify_mode = ssl.CERT_OPTIONAL
        ctx.set_alpn_protocols(["http/1.1"])
        return ctx

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=self.ssl_context())
        await site.start()
        server = getattr(site, "_server", None)
        if server is not None and server.sockets:
            self.port = server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        for t in list(self._sessions):
            t.cancel()
        if self._sessions:
            await asyncio.gather(*self._sessions, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors, self._auth])
        r = app.router
        r.add_get("/healthz", self.healthz)
        r.add_get("/containerLogs/{namespace}/{pod}/{container}", self.container_logs)
        for verb in ("exec", "attach"):
            for path in (f"/{verb}/{{namespace}}/{{pod}}/{{container}}",
                         f"/{verb}/{{namespace}}/{{pod}}/{{uid}}/{{container}}"):
                r.add_route("GET", path, self.exec if verb == "exec" else self.attach)
                r.add_route("POST", path, self.exec if verb == "exec" else self.attach)
        for path in ("/portForward/{namespace}/{pod}", "/portForward/{namespace}/{pod}/{uid}"):
            r.add_route("GET", path, self.port_forward)
            r.add_route("POST", path, self.port_forward)
        return app

    # -- middlewares -----------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler):
        try:
            return await handler(request)
        except HTTPError as e:
            return _error(e.code, e.reason, e.message)
        except CRIError as e:
            code = 404 if e.not_found else 500
            return _error(code, "NotFound" if e.not_found else "InternalError", str(e))
        except web.HTTPException as e:
            if e.status == 404:
                return _error(404, "NotFound", "the server could not find the requested resource")
            if e.status == 405:
                return _error(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
            raise

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        if not self.authorize:
            return await handler(request)
        user = await self._authenticate(request)
        if user is None:
            return web.Response(status=401, text="Unauthorized")
        verb = _VERBS.get(request.method, request.method.lower())
        sub = subresource_of(request.path)
        allowed, reason = await self._authorized(user, verb, sub)
        if not allowed:
            msg = f"Forbidden (user={user.name}, verb={verb}, resource=nodes, subresource={sub})"
            log.info("kubelet API: %s%s", msg, f": {reason}" if reason else "")
            return web.Response(status=403, text=msg)
        return await handler(request)

    async def _authenticate(self, request: web.Request) -> User | None:
        transport = request.transport
        cert = transport.get_extra_info("peercert") if transport is not None else None
        if cert:
            cn, orgs = "", []
            for rdn in cert.get("subject", ()):
                for key, value in rdn:
                    if key == "commonName":
                        cn = value
                    elif key == "organizationName":
                        orgs.append(value)
            if cn:
                return User(cn, tuple(orgs))
        auth = request.headers.get("Authorization", "")
        if auth[:7].lower() == "bearer " and auth[7:].strip() and self.client is not None:
            return await self._token_user(auth[7:].strip())
        return None

    async def _token_user(self, token: str) -> User | None:
        now = time.monotonic()
        hit = self._token_cache.get(token)
        if hit is not None and hit[0] > now:
            return hit[1]
        from kubeplane.api.resources import resource

        try:
            review = await self.client.create(resource("tokenreviews"), {
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}})
        except Exception as exc:  # the API server is unreachable: not authenticated, not cached
            log.warning("TokenReview failed: %s", exc)
            return None
        st = review.get("status") or {}
        user = None
        if st.get("authenticated"):
            u = st.get("user") or {}
            user = User(u.get("username", ""), tuple(u.get("groups") or ()), u.get("uid", ""), u.get("extra"))
        if len(self._token_cache) > 1000:
            self._token_cache.clear()
        self._token_cache[token] = (now + TOKEN_TTL, user)
        return user

    async def _authorized(self, user: User, verb: str, sub: str) -> tuple[bool, str]:
        key = (user.name, user.groups, user.uid, verb, sub)
        now = time.monotonic()
        hit = self._authz_cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1], hit[2]
        if self.client is None:
            return False, "no API server to authorize with"
        from kubeplane.api.resources import resource

        spec: dict[str, Any] = {"user": user.name, "groups": list(user.groups),
                                "resourceAttributes": {"verb": verb, "resource": "nodes", "subresource": sub,
                                                       "name": self.node_name}}
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = user.extra
        try:
            review = await self.client.create(resource("subjectaccessreviews"), {
                "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec})
        except Exception as exc:
            log.warning("SubjectAccessReview failed: %s", exc)
            return False, str(exc)
        st = review.get("status") or {}
        allowed, reason = bool(st.get("allowed")), st.get("reason", "")
        if len(self._authz_cache) > 1000:
            self._authz_cache.clear()
        self._authz_cache[key] = (now + (AUTHZ_ALLOW_TTL if allowed else AUTHZ_DENY_TTL), allowed, reason)
        return allowed, reason

    # -- finding pods and containers -------------------------------------

    async def find_sandbox(self, namespace: str, pod: str, uid: str | None = None) -> Any | None:
        labels = {POD_NAMESPACE_LABEL: namespace, POD_NAME_LABEL: pod}
        if uid:
            labels[POD_UID_LABEL] = uid
        items = (await self.cri.runtime("ListPodSandbox", pb.ListPodSandboxRequest(
            filter=pb.PodSandboxFilter(label_selector=labels)))).items
        if not items:
            return None
        return max(items, key=lambda s: (s.state == pb.SANDBOX_READY, s.created_at))

    async def find_containers(self, namespace: str, pod: str, container: str,
                              uid: str | None = None) -> list[Any]:
        """The containers of that name of the pod, newest first."""
        sandbox = await self.find_sandbox(namespace, pod, uid)
        if sandbox is None:
            return []
        pod_uid = sandbox.labels.get(POD_UID_LABEL) or sandbox.metadata.uid
        selector = {POD_UID_LABEL: pod_uid, CONTAINER_NAME_LABEL: container}
        items = (await self.cri.runtime("ListContainers", pb.ListContainersRequest(
            filter=pb.ContainerFilter(label_selector=selector)))).containers
        return sorted(items, key=lambda c: c.created_at, reverse=True)

    async def running_container(self, namespace: str, pod: str, container: str, uid: str | None = None) -> Any:
        for c in await self.find_containers(namespace, pod, container, uid):
            if c.state == pb.CONTAINER_RUNNING:
                return c
        raise not_found(f'container not found ("{container}")')

    # -- handlers --------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def container_logs(self, request: web.Request) -> web.StreamResponse:
        ns, pod, name = (request.match_info[k] for k in ("namespace", "pod", "container"))
        opts = log_options(request.query)
        containers = await self.find_containers(ns, pod, name)
        if opts.previous:
            if len(containers) < 2:
                raise bad_request(f'previous terminated container "{name}" in pod "{pod}" not found')
            target = containers[1]
        elif containers:
            target = containers[0]
        else:
            raise bad_request(await self._waiting_message(ns, pod, name))
        st = (await self.cri.runtime("ContainerStatus", pb.ContainerStatusRequest(container_id=target.id))).status
        path = st.log_path
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        if not path or not os.path.exists(path):
            await resp.write_eof()
            return resp
        renderer = LogRenderer(opts)
        offset = tail_offset(path, opts.tail_lines) if opts.tail_lines is not None else 0
        follow = opts.follow and not opts.previous
        pending = b""
        f = open(path, "rb")
        try:
            f.seek(offset)
            last_check = 0.0
            draining = False
            while True:
                chunk = f.read(65536)
                if chunk:
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    out = []
                    for line in lines:
                        e = parse_log_line(line)
                        if e is not None:
                            out.append(renderer.render(e))
                        if renderer.done:
                            break
                    if out:
                        await resp.write(b"".join(out))
                    if renderer.done:
                        break
                    continue
                if not follow:
                    break
                if _rotated_away(f, path):
                    # the log manager renamed the file and the runtime reopened the log: once
                    # what the runtime wrote to the old file up to its switch is read, on with
                    # the new one
                    if not draining:
                        draining = True
                        await asyncio.sleep(FOLLOW_POLL)
                        continue
                    draining = False
                    f.close()
                    try:
                        f = open(path, "rb")
                    except FileNotFoundError:
                        f = open(os.devnull, "rb")
                    continue
                now = time.monotonic()
                if now - last_check > 0.5:
                    last_check = now
                    if not await self._still_running(target.id):
                        if not f.read(1):
                            break
                        f.seek(-1, os.SEEK_CUR)
                        continue
                await asyncio.sleep(FOLLOW_POLL)
        finally:
            f.close()
        await resp.write_eof()
        return resp

    async def _waiting_message(self, namespace: str, pod: str, name: str) -> str:
        """Why a container has no log yet, from the pod's status as upstream's kubelet
        says it (its waiting reason; the common image failures in words)."""
        reason = "ContainerCreating"
        if self.client is not None:
            from kubeplane.api.errors import StatusError
            from kubeplane.api.resources import resource

            try:
                obj = await self.client.get(resource("pods"), pod, namespace)
            except (StatusError, OSError):
                obj = None
            st = (obj or {}).get("status") or {}
            for c in (st.get("containerStatuses") or []) + (st.get("initContainerStatuses") or []):
                if c.get("name") == name:
                    reason = ((c.get("state") or {}).get("waiting") or {}).get("reason") or reason
                    break
        if reason == "ErrImagePull":
            reason = "image can't be pulled"
        elif reason == "ImagePullBackOff":
            reason = "trying and failing to pull image"
        return f'container "{name}" in pod "{pod}" is waiting to start: {reason}'

    async def _still_running(self, container_id: str) -> bool:
        try:
            st = (await self.cri.runtime("ContainerStatus", pb.ContainerStatusRequest(container_id=container_id))).status
        except CRIError:
            return False
        return st.state in (pb.CONTAINER_RUNNING, pb.CONTAINER_CREATED)

    async def exec(self, request: web.Request) -> web.StreamResponse:
        return await self._remote_command(request, attach=False)

    async def attach(self, request: web.Request) -> web.StreamResponse:
        return await self._remote_command(request, attach=True)

    async def _remote_command(self, request: web.Request, *, attach: bool) -> web.StreamResponse:
        q = request.query
        mi = request.match_info
        stdin, stdout, stderr, tty = (_flag(q, k) for k in ("input", "output", "error", "tty"))
        if tty and stderr:
            stderr = False  # a terminal has one output stream
        if not (stdin or stdout or stderr):
            raise bad_request("you must specify at least 1 of stdin, stdout, stderr")
        command = q.getall("command", [])
        if not attach and not command:
            raise bad_request("you must specify at least 1 command")
        protocol = _websocket_protocol(request, channels.REMOTE_COMMAND_WEBSOCKET)
        c = await self.running_container(mi["namespace"], mi["pod"], mi["container"], mi.get("uid"))
        if attach:
            url = (await self.cri.runtime("Attach", pb.AttachRequest(
                container_id=c.id, stdin=stdin, tty=tty, stdout=stdout, stderr=stderr))).url
        else:
            url = (await self.cri.runtime("Exec", pb.ExecRequest(
                container_id=c.id, cmd=command, tty=tty, stdin=stdin, stdout=stdout, stderr=stderr))).url
        backend = await RemoteCommand.dial(url, stdin=stdin, stdout=stdout, stderr=stderr, tty=tty)
        ws = _StreamSocket(protocols=(protocol,), autoping=True, max_msg_size=0)
        try:
            await ws.prepare(request)
        except BaseException:
            await backend.close()
            raise
        try:
            await self._session(ws, backend.bridge(ws, v5=protocol == channels.V5))
        finally:
            await backend.close()
        return ws

    async def _session(self, ws: "_StreamSocket", work: Any) -> None:
        """Run a streaming session, closed when idle for ``streaming_idle_timeout``."""
        task = asyncio.ensure_future(work)
        self._sessions.add(task)
        try:
            while True:
                left = ws.last_activity + self.streaming_idle_timeout - time.monotonic()
                if left <= 0:
                    log.info("closing a streaming connection idle for %.0fs", self.streaming_idle_timeout)
                    task.cancel()
                    break
                done, _ = await asyncio.wait({task}, timeout=left)
                if done:
                    break
            try:
                await task
            except asyncio.CancelledError:
                if not task.cancelled():
                    raise
        finally:
            self._sessions.discard(task)
            if not task.done():
                task.cancel()
            if not ws.closed:
                await ws.close(code=1000)

    async def port_forward(self, request: web.Request) -> web.StreamResponse:
        """kubectl's SPDY session tunnelled in a WebSocket, or (``v4.channel.k8s.io``
        with ``?port=``, as the official clients dial) one channel pair per port."""
        mi = request.match_info
        protocol = _websocket_protocol(request, (channels.PORT_FORWARD_TUNNEL, channels.V4), allow_none=True)
        ports: list[int] = []
        if protocol != channels.PORT_FORWARD_TUNNEL:
            for value in request.query.getall("port", []):
                for part in value.split(","):
                    if not part.isdigit() or not 0 < int(part) < 65536:
                        raise bad_request(f'unable to parse "{part}" as a port')
                    ports.append(int(part))
            if not ports:
                raise bad_request('query parameter "port" is required')
        sandbox = await self.find_sandbox(mi["namespace"], mi["pod"], mi.get("uid"))
        if sandbox is None or sandbox.state != pb.SANDBOX_READY:
            raise not_found(f'pod not found ("{mi["pod"]}")')
        ws = _StreamSocket(protocols=(protocol,) if protocol else (), autoping=True, max_msg_size=0)
        await ws.prepare(request)
        if protocol == channels.PORT_FORWARD_TUNNEL:
            await self._session(ws, PortForwardTunnel(self.cri, sandbox.id).serve(ws))
        else:
            await self._session(ws, serve_port_channels(self.cri, sandbox.id, ws, ports))
        return ws


def _rotated_away(f: Any, path: str) -> bool:
    """Whether ``path`` now names another file than the open ``f`` (log rotation)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False  # renamed, the new one not made yet: look again
    own = os.fstat(f.fileno())
    return (st.st_ino, st.st_dev) != (own.st_ino, own.st_dev)


def _flag(q: Any, name: str) -> bool:
    return q.get(name, "") in ("1", "true", "True")


def offered_protocols(request: web.Request) -> list[str]:
    return [p.strip() for h in request.headers.getall("Sec-WebSocket-Protocol", [])
            for p in h.split(",") if p.strip()]


def _websocket_protocol(request: web.Request, supported: tuple[str, ...], *, allow_none: bool = False) -> str:
    """The first of ``supported`` the client offers (a 400 otherwise; "" when
    the client offers none and ``allow_none``)."""
    if request.headers.get("Upgrade", "").lower() != "websocket":
        if "spdy" in request.headers.get("Upgrade", "").lower():
            raise bad_request("upgrading to SPDY is not supported: use a WebSocket of " + ", ".join(supported))
        raise bad_request("Upgrade request required")
    offered = offered_protocols(request)
    for p in supported:
        if p in offered:
            return p
    if allow_none and not offered:
        return ""
    raise bad_request(f"requested protocol(s) are not supported: {offered}; supports {list(supported)}")


class _StreamSocket(web.WebSocketResponse):
    """A streaming session's WebSocket, which notes when data last went either way."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.last_activity = time.monotonic()

    async def send_bytes(self, data: bytes, *args: Any, **kw: Any) -> None:
        self.last_activity = time.monotonic()
        await super().send_bytes(data, *args, **kw)

    async def receive(self, *args: Any, **kw: Any) -> Any:
        msg = await super().receive(*args, **kw)
        self.last_activity = time.monotonic()
        return msg


class _WSWriter:
    """Serialized binary sends on one WebSocket."""

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws
        self.lock = asyncio.Lock()

    async def send(self, data: bytes) -> None:
        async with self.lock:
            if not self.ws.closed:
                await self.ws.send_bytes(data)


class RemoteCommand:
    """One exec or attach session with the runtime's streaming server (SPDY, v4.channel.k8s.io)."""

    def __init__(self, session: spdy.Session, reader: asyncio.Task, streams: dict[int, spdy.Stream]) -> None:
        self.session, self.reader, self.streams = session, reader, streams

    @classmethod
    async def dial(cls, url: str, *, stdin: bool, stdout: bool, stderr: bool, tty: bool) -> "RemoteCommand":
        session, protocol, reader = await spdy.dial(url, [channels.V4, channels.V3, channels.V2, channels.V1])
        try:
            streams: dict[int, spdy.Stream] = {}
            wanted = [channels.ERROR] + [ch for ch, on in ((channels.STDIN, stdin), (channels.STDOUT, stdout),
                                                           (channels.STDERR, stderr), (channels.RESIZE, tty)) if on]
            for ch in wanted:
                streams[ch] = await session.open_stream({"streamtype": [channels.STREAM_NAMES[ch]]})
            if channels.ERROR in streams:
                await streams[channels.ERROR].close()  # only read
            if channels.STDOUT in streams:
                await streams[channels.STDOUT].close()
            if channels.STDERR in streams:
                await streams[channels.STDERR].close()
        except BaseException:
            reader.cancel()
            raise
        return cls(session, reader, streams)

    async def close(self) -> None:
        self.reader.cancel()
        try:
            await self.reader
        except BaseException:
            pass

    async def bridge(self, ws: web.WebSocketResponse, *, v5: bool) -> None:
        out = _WSWriter(ws)

        async def relay(ch: int) -> None:
            s = self.streams[ch]
            while chunk := await s.read():
                await out.send(bytes([ch]) + chunk)

        async def relay_error() -> None:
            data = await self.streams[channels.ERROR].read_all()
            if data:
                await out.send(bytes([channels.ERROR]) + data)

        async def from_client() -> None:
            stdin, resize = self.streams.get(channels.STDIN), self.streams.get(channels.RESIZE)
            async for msg in ws:
                if msg.type != WSMsgType.BINARY or not msg.data:
                    continue
                ch, data = msg.data[0], msg.data[1:]
                try:
                    if ch == channels.STDIN and stdin is not None and data:
                        await stdin.write(data)
                    elif ch == channels.RESIZE and resize is not None and data:
                        await resize.write(data)
                    elif ch == channels.CLOSE and v5 and data[:1] == bytes([channels.STDIN]) and stdin is not None:
                        await stdin.close()
                except (spdy.StreamReset, BrokenPipeError, ConnectionError):
                    pass

        outputs = [asyncio.ensure_future(relay(ch)) for ch in (channels.STDOUT, channels.STDERR)
                   if ch in self.streams]
        outputs.append(asyncio.ensure_future(relay_error()))
        client = asyncio.ensure_future(from_client())
        done_out = asyncio.gather(*outputs)
        # cancelled with its outputs when the session ends early: its outcome is not wanted then
        done_out.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            await asyncio.wait({done_out, client}, return_when=asyncio.FIRST_COMPLETED)
            if done_out.done():
                done_out.result()
            else:
                # the client went away: stop the session (the runtime ends an attach, an
                # exec's process gets EOF on its stdin)
                done_out.cancel()
        except (ConnectionError, RuntimeError) as exc:
            log.debug("remote command bridge ended: %s", exc)
        finally:
            client.cancel()
            for t in outputs:
                t.cancel()
            await self.close()
            if not ws.closed:
                await ws.close(code=1000)


async def _dial_port(cri: CRIClient, sandbox_id: str, port: int) -> tuple[spdy.Stream, spdy.Stream, asyncio.Task]:
    """The error and data streams of one connection to ``port`` of the pod, through the runtime."""
    url = (await cri.runtime("PortForward", pb.PortForwardRequest(pod_sandbox_id=sandbox_id, port=[port]))).url
    session, _proto, reader = await spdy.dial(url, [channels.PORT_FORWARD_SPDY])
    try:
        headers = {"port": [str(port)], "requestid": ["0"]}
        b_err = await session.open_stream({**headers, "streamtype": ["error"]})
        await b_err.close()
        b_data = await session.open_stream({**headers, "streamtype": ["data"]})
    except BaseException:
        reader.cancel()
        raise
    return b_err, b_data, reader


async def serve_port_channels(cri: CRIClient, sandbox_id: str, ws: web.WebSocketResponse, ports: list[int]) -> None:
    """Port-forward over ``v4.channel.k8s.io``: for the i-th port, channel 2i
    carries the data and 2i+1 the errors; each starts with the port number
    (two bytes, little-endian); one connection per port."""
    out = _WSWriter(ws)
    backends: dict[int, tuple[spdy.Stream, spdy.Stream, asyncio.Task]] = {}
    tasks: list[asyncio.Task] = []

    async def down(i: int, b_err: spdy.Stream, b_data: spdy.Stream) -> None:
        async def errors_() -> None:
            msg = await b_err.read_all()
            if msg:
                await out.send(bytes([2 * i + 1]) + msg)

        et = asyncio.ensure_future(errors_())
        try:
            while chunk := await b_data.read():
                await out.send(bytes([2 * i]) + chunk)
            await et
        finally:
            et.cancel()

    try:
        for i, port in enumerate(ports):
            head = port.to_bytes(2, "little")
            await out.send(bytes([2 * i]) + head)
            await out.send(bytes([2 * i + 1]) + head)
            try:
                backends[i] = await _dial_port(cri, sandbox_id, port)
            except (CRIError, ConnectionError, OSError, spdy.StreamReset, asyncio.TimeoutError) as exc:
                await out.send(bytes([2 * i + 1]) + f"error forwarding port {port}: {exc}".encode())
                continue
            b_err, b_data, _ = backends[i]
            tasks.append(asyncio.ensure_future(down(i, b_err, b_data)))

        async def up() -> None:
            async for msg in ws:
                if msg.type != WSMsgType.BINARY or not msg.data:
                    continue
                ch, data = msg.data[0], msg.data[1:]
                if ch % 2 == 0 and ch // 2 in backends and data:
                    try:
                        await backends[ch // 2][1].write(data)
                    except (spdy.StreamReset, BrokenPipeError, ConnectionError):
                        pass

        client = asyncio.ensure_future(up())
        downs = asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.wait({client, downs}, return_when=asyncio.FIRST_COMPLETED)
        client.cancel()
        downs.cancel()
    finally:
        for t in tasks:
            t.cancel()
        for _e, _d, reader in backends.values():
            reader.cancel()
        if not ws.closed:
            await ws.close(code=1000)


class PortForwardTunnel:
    """kubectl's SPDY port-forward session (tunnelled in a WebSocket), each
    connection bridged to the runtime's streaming server."""

    def __init__(self, cri: CRIClient, sandbox_id: str) -> None:
        self.cri = cri
        self.sandbox_id = sandbox_id
        self.pairs: dict[str, dict[str, spdy.Stream]] = {}
        self.tasks: set[asyncio.Task] = set()

    async def serve(self, ws: web.WebSocketResponse) -> None:
        out = _WSWriter(ws)
        session = spdy.Session(out.send, server=True, on_stream=self._on_stream)
        try:
            async for msg in ws:
                if msg.type == WSMsgType.BINARY:
                    await session.feed(msg.data)
                elif msg.type in (WSMsgType.CLOSE, WSMsgType.ERROR):
                    break
        except spdy.ProtocolError as exc:
            log.info("port-forward: %s", exc)
        finally:
            session.feed_eof()
            session.cancel_tasks()
            for t in list(self.tasks):
                t.cancel()
            if self.tasks:
                await asyncio.gather(*self.tasks, return_exceptions=True)
            if not ws.closed:
                await ws.close(code=1000)

    async def _on_stream(self, s: spdy.Stream) -> None:
        port_text = s.header("port")
        kind = s.header(channels.STREAM_TYPE)
        problem = None
        if not port_text:
            problem = '"port" header is required'
        elif not port_text.isdigit() or not 0 < int(port_text) < 65536:
            problem = f'unable to parse "{port_text}" as a port'
        elif kind not in ("error", "data"):
            problem = f'invalid stream type "{kind}"' if kind else '"streamType" header is required'
        if problem is not None:
            log.info("port-forward stream refused: %s", problem)
            await s.reset(spdy.REFUSED_STREAM)
            return
        await s.reply()
        request_id = s.header("requestID") or str(s.id if kind == "error" else s.id - 2)
        pair = self.pairs.setdefault(request_id, {})
        if kind in pair:
            await s.reset(spdy.PROTOCOL_ERROR)
            return
        pair[kind] = s
        if len(pair) == 2:
            del self.pairs[request_id]
            t = asyncio.ensure_future(self._forward(pair["error"], pair["data"], int(port_text)))
            self.tasks.add(t)
            t.add_done_callback(self.tasks.discard)

    async def _forward(self, err: spdy.Stream, data: spdy.Stream, port: int) -> None:
        reader = None
        try:
            try:
                b_err, b_data, reader = await _dial_port(self.cri, self.sandbox_id, port)
            except (CRIError, ConnectionError, OSError, spdy.StreamReset, asyncio.TimeoutError) as exc:
                await err.write(f"error forwarding port {port} to pod {self.sandbox_id}: {exc}".encode())
                return

            async def up() -> None:
                while chunk := await data.read():
                    await b_data.write(chunk)
                await b_data.close()

            async def down() -> None:
                while chunk := await b_data.read():
                    await data.write(chunk)

            async def errors() -> None:
                msg = await b_err.read_all()
                if msg:
                    await err.write(msg)

            upt = asyncio.ensure_future(up())
            try:
                await asyncio.gather(down(), errors())
            finally:
                upt.cancel()
        except (spdy.StreamReset, BrokenPipeError, ConnectionError):
            pass
        finally:
            # nothing reads the client's streams any more: what still comes is
            # dropped, not left to hold up the other connections of the session
            data.discard()
            err.discard()
            if reader is not None:
                reader.cancel()
            for s in (data, err):
                try:
                    await s.close()
                except (ConnectionError, BrokenPipeError, spdy.StreamReset):
                    pass
