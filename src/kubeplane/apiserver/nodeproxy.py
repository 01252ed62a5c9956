"""pods/log, pods/exec, pods/attach and pods/portforward of pods on real nodes,
proxied to the node's kubelet API.

The kubelet's address is the Node's (``InternalIP``, else ``ExternalIP``,
else ``Hostname``) and its ``status.daemonEndpoints.kubeletEndpoint.Port``;
the API server authenticates with its own kubelet client certificate
(``apiserver-kubelet-client`` of its PKI). As upstream's API server does
without ``--kubelet-certificate-authority``, it does not verify the
kubelet's serving certificate unless given a CA.

The kubelet serves the WebSocket protocols itself (as upstream's nodes with
``ExtendWebSocketsToKubelet``), so exec, attach and port-forward over a
WebSocket are relayed message by message: the client's WebSocket is
accepted with the subprotocol the kubelet chose. A client that upgrades to
SPDY/3.1 instead (kubectl's fallback, older kubectl, client-go's SPDY
executor) is answered in SPDY here and spoken for to the kubelet over its
WebSocket: port-forward's SPDY session passes through the kubelet's
tunnel as it is; an exec's or attach's streams become ``v5.channel.k8s.io``
channels (stdin's end included). Simulated nodes (label
``type=kubeplane-simulated``) run no containers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import WSMsgType, web

from kubeplane.api import errors
from kubeplane.api.gofmt import go_list

log = logging.getLogger("kubeplane.apiserver")

SIMULATED_LABEL = ("type", "kubeplane-simulated")
DEFAULT_KUBELET_PORT = 10250
ADDRESS_TYPES = ("InternalIP", "ExternalIP", "Hostname")
#: seconds the kubelet's refusal of a WebSocket upgrade is kept for the
#: client's SPDY retry of the same request (kubectl falls back at once)
REFUSAL_MEMORY = 10.0
LOG_PARAMS = ("follow", "previous", "timestamps", "tailLines", "limitBytes", "sinceSeconds", "sinceTime")
#: the WebSocket headers passed on to the kubelet untouched
_HOP_HEADERS = frozenset({"connection", "upgrade", "sec-websocket-key", "sec-websocket-version",
                          "sec-websocket-extensions", "sec-websocket-protocol", "host", "authorization",
                          "content-length", "transfer-encoding", "keep-alive", "impersonate-user",
                          "impersonate-group", "impersonate-uid"})


class KubeletClient:
    """HTTPS to kubelets with the API server's client certificate.

    ``credentials`` is ``(cert_file, key_file)`` or a function returning it
    (or None), called when the first request is made, so a server that never
    talks to a kubelet spends nothing on it at start.
    """

    def __init__(self, credentials: Any = None, ca_file: str | None = None) -> None:
        self.credentials = credentials
        self.ca_file = ca_file
        self._ssl: ssl.SSLContext | None = None
        self._session: aiohttp.ClientSession | None = None
        #: (user, path, query) -> (monotonic expiry, error) of upgrades the kubelet refused
        self._refused: dict[tuple[str, str, str], tuple[float, errors.StatusError]] = {}

    def remember_refusal(self, key: tuple[str, str, str], error: errors.StatusError) -> None:
        now = time.monotonic()
        if len(self._refused) > 256:
            self._refused = {k: v for k, v in self._refused.items() if v[0] > now}
        self._refused[key] = (now + REFUSAL_MEMORY, error)

    def recent_refusal(self, key: tuple[str, str, str]) -> errors.StatusError | None:
        hit = self._refused.pop(key, None)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        return None

    @property
    def ssl(self) -> ssl.SSLContext:
        if self._ssl is None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False  # kubelets are addressed by IP
            if self.ca_file:
                ctx.load_verify_locations(cafile=self.ca_file)
            else:
                ctx.verify_mode = ssl.CERT_NONE
            creds = self.credentials() if callable(self.credentials) else self.credentials
            if creds:
                ctx.load_cert_chain(*creds)
            self._ssl = ctx
        return self._ssl

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self.ssl, limit=0),
                timeout=aiohttp.ClientTimeout(total=None, connect=10, sock_connect=10))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def all_container_names(pod: dict[str, Any]) -> list[str]:
    spec = pod.get("spec") or {}
    names = []
    for key in ("initContainers", "containers", "ephemeralContainers"):
        names += [c.get("name", "") for c in spec.get(key) or []]
    return names


def pick_container(pod: dict[str, Any], container: str | None) -> str:
    """Upstream's validateContainer: the named container, or the only one."""
    name = (pod.get("metadata") or {}).get("name", "")
    if not container:
        containers = [c.get("name", "") for c in (pod.get("spec") or {}).get("containers") or []]
        if len(containers) == 1:
            return containers[0]
        if not containers:
            raise errors.bad_request(f"a container name must be specified for pod {name}")
        raise errors.bad_request(f"a container name must be specified for pod {name}, "
                                 f"choose one of: {go_list(all_container_names(pod))}")
    if container not in all_container_names(pod):
        raise errors.bad_request(f"container {container} is not valid for pod {name}")
    return container


def is_simulated(node: dict[str, Any]) -> bool:
    k, v = SIMULATED_LABEL
    return ((node.get("metadata") or {}).get("labels") or {}).get(k) == v


def kubelet_address(node: dict[str, Any]) -> tuple[str, int]:
    status = node.get("status") or {}
    addresses = status.get("addresses") or []
    host = None
    for kind in ADDRESS_TYPES:
        for a in addresses:
            if a.get("type") == kind and a.get("address"):
                host = a["address"]
                break
        if host:
            break
    name = (node.get("metadata") or {}).get("name", "")
    if not host:
        raise errors.internal(f"no preferred addresses found; known addresses: {addresses}"
                              if addresses else f"node {name} has no addresses")
    port = ((status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}).get("Port") or DEFAULT_KUBELET_PORT
    return host, int(port)


def _url(host: str, port: int, path: str) -> str:
    h = f"[{host}]" if ":" in host else host
    return f"https://{h}:{port}{path}"


def _message_of(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(text)
    except ValueError:
        return text
    if isinstance(obj, dict) and obj.get("kind") == "Status":
        return str(obj.get("message", ""))
    return text


def backend_error(code: int, body: bytes, pod_name: str) -> errors.StatusError:
    """Upstream's GenericHttpResponseChecker: the kubelet's answer as the API server's error."""
    text = _message_of(body)
    if code == 400:
        return errors.bad_request(text)
    if code == 500:
        return errors.internal(f"Internal error occurred: {text}")
    if code == 404:
        return errors.StatusError(404, "NotFound", text or f'pods "{pod_name}" not found',
                                  name=pod_name, kind="pods")
    if code in (401, 403):
        reason = "Unauthorized" if code == 401 else "Forbidden"
        return errors.StatusError(code, reason, f"{text} ( pods/log {pod_name})" if text else reason)
    return errors.StatusError(code, "InternalError" if code >= 500 else "BadRequest",
                              text or f"the server responded with the status code {code} but did not "
                                      "return more information")


async def stream_logs(request: web.Request, kubelet: KubeletClient, host: str, port: int,
                      pod: dict[str, Any], container: str) -> web.StreamResponse:
    meta = pod.get("metadata") or {}
    path = "/containerLogs/{}/{}/{}".format(*(quote(x, safe="") for x in (
        meta.get("namespace", ""), meta.get("name", ""), container)))
    params = {k: request.query[k] for k in LOG_PARAMS if k in request.query}
    url = _url(host, port, path)
    try:
        r = await kubelet.session().get(url, params=params)
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
        raise errors.internal(f'Get "{url}": {exc}') from None
    try:
        if r.status != 200:
            raise backend_error(r.status, await r.content.read(64 * 1024), meta.get("name", ""))
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        async for chunk in r.content.iter_any():
            await resp.write(chunk)
        await resp.write_eof()
        return resp
    finally:
        r.release()


def is_spdy(request: web.Request) -> bool:
    return (request.headers.get("Upgrade", "").lower().startswith("spdy/3.1")
            and "upgrade" in request.headers.get("Connection", "").lower())


def offered_protocols(request: web.Request) -> list[str]:
    return [p.strip() for h in request.headers.getall("Sec-WebSocket-Protocol", [])
            for p in h.split(",") if p.strip()]


def is_websocket(request: web.Request) -> bool:
    return (request.headers.get("Upgrade", "").lower() == "websocket"
            and "upgrade" in request.headers.get("Connection", "").lower())


async def _handshake_error(kubelet: KubeletClient, url: str, params: list[tuple[str, str]],
                           protocols: list[str], pod_name: str, code: int) -> errors.StatusError:
    """The kubelet refused the upgrade: ask again to read why (aiohttp drops the body)."""
    headers = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
               "Sec-WebSocket-Key": "a3ViZXBsYW5lLWVycm9yIQ==", "Sec-WebSocket-Protocol": ", ".join(protocols)}
    try:
        async with kubelet.session().get(url, params=params, headers=headers) as r:
            if r.status == 101:
                return errors.internal(f"Internal error occurred: error upgrading connection to {url}")
            return backend_error(r.status, await r.content.read(64 * 1024), pod_name)
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
        return backend_error(code, b"", pod_name)


async def _pump_websocket(src: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
                          dst: web.WebSocketResponse | aiohttp.ClientWebSocketResponse) -> None:
    """Forward ``src``'s data messages to ``dst`` until ``src`` closes, then close
    ``dst`` with ``src``'s close code (either side is a server or a client WebSocket)."""
    async for msg in src:
        if msg.type == WSMsgType.BINARY:
            await dst.send_bytes(msg.data)
        elif msg.type == WSMsgType.TEXT:
            await dst.send_str(msg.data)
        elif msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING):
            break
    await dst.close(code=src.close_code or 1000)


async def relay_websocket(request: web.Request, kubelet: KubeletClient, host: str, port: int,
                          path: str, params: list[tuple[str, str]], pod_name: str,
                          spdy_options: "SpdyOptions | None" = None) -> web.StreamResponse:
    """Relay the client's WebSocket to the kubelet's, message by message; an
    upgrade to SPDY/3.1 instead is translated (:func:`serve_spdy`).

    kubectl retries a refused WebSocket upgrade over SPDY: the retry gets the
    kubelet's refusal of the first attempt without asking again (an exec
    would run twice), so the user reads why (the container is not running...).
    """
    from kubeplane.auth.user import current_user

    key = (current_user().name, request.path, request.query_string)
    if not is_websocket(request):
        if is_spdy(request) and spdy_options is not None:
            refused = kubelet.recent_refusal(key)
            if refused is not None:
                raise refused
            return await serve_spdy(request, kubelet, host, port, path, params, pod_name, spdy_options)
        raise errors.bad_request("Upgrade request required")
    protocols = offered_protocols(request)
    url = _url(host, port, path)
    try:
        backend = await kubelet.session().ws_connect(url, params=params, protocols=protocols,
                                                     max_msg_size=0, autoping=True, autoclose=False)
    except aiohttp.WSServerHandshakeError as exc:
        error = await _handshake_error(kubelet, url, params, protocols, pod_name, exc.status)
        kubelet.remember_refusal(key, error)
        raise error from None
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
        error = errors.internal(f"error dialing backend: {exc}")
        kubelet.remember_refusal(key, error)
        raise error from None
    try:
        ws = web.WebSocketResponse(protocols=(backend.protocol,) if backend.protocol else (),
                                   autoping=True, max_msg_size=0, autoclose=False)
        await ws.prepare(request)
    except BaseException:
        await backend.close()
        raise

    # up: the client to the kubelet; down: the kubelet to the client
    tasks = [asyncio.ensure_future(_pump_websocket(ws, backend)),
             asyncio.ensure_future(_pump_websocket(backend, ws))]
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if tasks[0] in done:
            # the client is gone or closed: give the kubelet a moment to finish its side
            await asyncio.wait({tasks[1]}, timeout=5)
        for t in done:
            if not t.cancelled() and t.exception() is not None:
                log.debug("streaming relay of %s ended: %r", path, t.exception())
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if not backend.closed:
            await backend.close()
        if not ws.closed:
            await ws.close()
    return ws


# -- SPDY clients -------------------------------------------------------------


@dataclass
class SpdyOptions:
    """What a SPDY client asked for: port-forward, or the streams of an exec/attach."""

    port_forward: bool = False
    stdin: bool = False
    stdout: bool = False
    stderr: bool = False
    tty: bool = False


#: unread bytes from an upgraded client connection above which it is no longer
#: read (aiohttp's stream reader pauses the transport above twice this)
UPGRADED_READ_LIMIT = 64 * 1024


class _RawParser:
    """Takes the bytes of an upgraded connection (aiohttp's parser slot) into a
    flow-controlled reader: the connection stops being read while the reader
    holds more than its limit."""

    def __init__(self, reader: aiohttp.StreamReader) -> None:
        self.reader = reader

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        self.reader.feed_data(bytes(data))
        return False, b""

    def feed_eof(self) -> None:
        self.reader.feed_eof()


class _UpgradedConnection:
    """The client's side of an upgraded connection: reads (``b""`` at its end)
    and writes that wait while the transport's buffer is full."""

    def __init__(self, request: web.Request) -> None:
        self.protocol = request.protocol
        self.transport = request.transport
        self.reader = aiohttp.StreamReader(self.protocol, UPGRADED_READ_LIMIT,
                                           loop=asyncio.get_running_loop())

    async def read(self) -> bytes:
        return await self.reader.readany()

    async def write(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing() or self.protocol.transport is None:
            return  # the client is gone: its end of the connection ends the session
        self.transport.write(data)
        # the protocol is paused above the transport's high-water mark: wait until it drained
        try:
            await self.protocol._drain_helper()
        except ConnectionError:
            pass

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


async def _upgrade(request: web.Request, protocol: str) -> tuple[web.StreamResponse, _UpgradedConnection]:
    resp = web.StreamResponse(status=101, headers={"Connection": "Upgrade", "Upgrade": "SPDY/3.1",
                                                   "X-Stream-Protocol-Version": protocol})
    await resp.prepare(request)
    conn = _UpgradedConnection(request)
    request.protocol.set_parser(_RawParser(conn.reader))  # type: ignore[arg-type]
    request.protocol.keep_alive(False)
    return resp, conn


async def serve_spdy(request: web.Request, kubelet: KubeletClient, host: str, port: int, path: str,
                     params: list[tuple[str, str]], pod_name: str, opts: SpdyOptions) -> web.StreamResponse:
    """A SPDY/3.1 client (kubectl's fallback, client-go's SPDY executor): the
    kubelet is spoken to over its WebSocket. Port-forward's SPDY session goes
    through as it is (the kubelet tunnels SPDY); an exec's or attach's SPDY
    streams become the channels of ``v5.channel.k8s.io``."""
    from kubeplane.streaming import channels

    offered = [v.strip() for h in request.headers.getall("X-Stream-Protocol-Version", []) for v in h.split(",")
               if v.strip()]
    supported = [channels.PORT_FORWARD_SPDY] if opts.port_forward else [channels.V5, channels.V4]
    chosen = next((p for p in offered if p in supported), None)
    if chosen is None:
        raise errors.StatusError(403, "Forbidden", f"unable to upgrade: unable to negotiate protocol: client "
                                                   f"supports {go_list(offered)}, server supports {go_list(supported)}")
    url = _url(host, port, path)
    backend_protocol = channels.PORT_FORWARD_TUNNEL if opts.port_forward else channels.V5
    try:
        backend = await kubelet.session().ws_connect(url, params=params, protocols=[backend_protocol],
                                                     max_msg_size=0, autoping=True)
    except aiohttp.WSServerHandshakeError as exc:
        raise await _handshake_error(kubelet, url, params, [backend_protocol], pod_name, exc.status) from None
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
        raise errors.internal(f"error dialing backend: {exc}") from None
    try:
        resp, conn = await _upgrade(request, chosen)
    except BaseException:
        await backend.close()
        raise
    try:
        if opts.port_forward:
            await _relay_raw(conn, backend)
        else:
            await _translate_remote_command(conn, backend, opts)
    finally:
        if not backend.closed:
            await backend.close()
        conn.close()
    return resp


async def _relay_raw(conn: _UpgradedConnection, backend: Any) -> None:
    async def up() -> None:
        while data := await conn.read():
            await backend.send_bytes(data)

    async def down() -> None:
        async for msg in backend:
            if msg.type == WSMsgType.BINARY:
                await conn.write(msg.data)

    tasks = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _translate_remote_command(conn: _UpgradedConnection, backend: Any, opts: SpdyOptions) -> None:
    from kubeplane.streaming import channels, spdy

    names = {v: k for k, v in channels.STREAM_NAMES.items()}
    wanted = {channels.ERROR} | {ch for ch, on in ((channels.STDIN, opts.stdin), (channels.STDOUT, opts.stdout),
                                                   (channels.STDERR, opts.stderr and not opts.tty),
                                                   (channels.RESIZE, opts.tty)) if on}
    streams: dict[int, spdy.Stream] = {}
    ready = asyncio.Event()
    pumps: list[asyncio.Task] = []

    async def on_stream(s: spdy.Stream) -> None:
        ch = names.get(s.header(channels.STREAM_TYPE))
        if ch is None or ch in streams:
            await s.reset(spdy.PROTOCOL_ERROR)
            return
        await s.reply()
        streams[ch] = s
        if ch in (channels.STDIN, channels.RESIZE):
            pumps.append(asyncio.ensure_future(client_stream(ch, s)))
        if wanted <= set(streams):
            ready.set()

    async def client_stream(ch: int, s: spdy.Stream) -> None:
        while chunk := await s.read():
            await backend.send_bytes(bytes([ch]) + chunk)
        if ch == channels.STDIN and not s.reset_by_peer:
            await backend.send_bytes(bytes([channels.CLOSE, channels.STDIN]))

    session = spdy.Session(conn.write, server=True, on_stream=on_stream)

    async def read_client() -> None:
        while data := await conn.read():
            await session.feed(data)
        session.feed_eof()

    async def from_kubelet() -> None:
        await asyncio.wait_for(ready.wait(), 30)
        async for msg in backend:
            if msg.type != WSMsgType.BINARY or not msg.data:
                continue
            s = streams.get(msg.data[0])
            if s is not None and msg.data[0] in (channels.STDOUT, channels.STDERR, channels.ERROR):
                await s.write(msg.data[1:])
        for ch in (channels.STDOUT, channels.STDERR, channels.ERROR):
            if ch in streams:
                await streams[ch].close()
        await session.goaway()

    reader = asyncio.ensure_future(read_client())
    down = asyncio.ensure_future(from_kubelet())
    try:
        await asyncio.wait({reader, down}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.TimeoutError:
        pass
    finally:
        for t in (reader, down, *pumps):
            t.cancel()
        await asyncio.gather(reader, down, *pumps, return_exceptions=True)
        session.cancel_tasks()
