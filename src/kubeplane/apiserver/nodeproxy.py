"""pods/log, pods/exec, pods/attach and pods/portforward of pods on real nodes,
proxied to the node's kubelet API.

The kubelet's address is the Node's (``InternalIP``, else ``ExternalIP``,
else ``Hostname``) and its ``status.daemonEndpoints.kubeletEndpoint.Port``;
the API server authenticates with its own kubelet client certificate
(``apiserver-kubelet-client`` of its PKI). As upstream's API server does
without ``--kubelet-certificate-authority``, it does not verify the
kubelet's serving certificate unless given a CA.

The kubelet serves the WebSocket protocols itself (as upstream's nodes with
``ExtendWebSocketsToKubelet``), so exec, attach and port-forward are relayed
message by message: the client's WebSocket is accepted with the
subprotocol the kubelet chose. Simulated nodes (label
``type=kubeplane-simulated``) run no containers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import WSMsgType, web

from kubeplane.api import errors

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


def go_list(items: list[str]) -> str:
    return "[" + " ".join(items) + "]"


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


async def relay_websocket(request: web.Request, kubelet: KubeletClient, host: str, port: int,
                          path: str, params: list[tuple[str, str]], pod_name: str) -> web.StreamResponse:
    """Relay the client's WebSocket to the kubelet's, message by message.

    kubectl retries a refused WebSocket upgrade over SPDY, which this server
    does not serve: the retry gets the kubelet's refusal of the first
    attempt, so the user reads why (the container is not running...).
    """
    from kubeplane.auth.user import current_user

    key = (current_user().name, request.path, request.query_string)
    if not is_websocket(request):
        if "spdy" in request.headers.get("Upgrade", "").lower():
            refused = kubelet.recent_refusal(key)
            if refused is not None:
                raise refused
            raise errors.bad_request("upgrading to SPDY/3.1 is not supported by this server: "
                                     "use the WebSocket protocols (kubectl 1.30 or later)")
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

    async def up() -> None:
        async for msg in ws:
            if msg.type == WSMsgType.BINARY:
                await backend.send_bytes(msg.data)
            elif msg.type == WSMsgType.TEXT:
                await backend.send_str(msg.data)
            elif msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING):
                break
        await backend.close(code=ws.close_code or 1000)

    async def down() -> None:
        async for msg in backend:
            if msg.type == WSMsgType.BINARY:
                await ws.send_bytes(msg.data)
            elif msg.type == WSMsgType.TEXT:
                await ws.send_str(msg.data)
            elif msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING):
                break
        await ws.close(code=backend.close_code or 1000)

    tasks = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
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
