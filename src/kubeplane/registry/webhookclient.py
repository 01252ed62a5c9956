"""The HTTPS client admission webhooks are called with (upstream's
``util/webhook`` ClientManager and the REST client under it).

* ``clientConfig.url`` is called as given; ``clientConfig.service`` is
  resolved as upstream's default (non-aggregator-routing) resolver does: the
  Service's ``spec.clusterIP`` (or, for an ExternalName Service, its
  ``externalName``) and the ``port`` of the reference (default 443), with the
  certificate checked for ``<name>.<namespace>.svc``. A Service without a
  cluster IP, or missing, is a call failure (failurePolicy decides). Whether
  the address is reachable is the network's business: kubeplane's simulated
  nodes do not route cluster IPs, so webhooks served in a cluster need the
  node proxy, or an ExternalName/URL that reaches them.
* TLS is verified against ``caBundle`` (PEM), or the system's roots when it
  is empty; contexts are cached per bundle.
* Connections are pooled (one aiohttp session per event loop, bounded
  connector); each call is bounded by the webhook's ``timeoutSeconds`` (the
  URL carries ``?timeout=<n>s``, as upstream's client sends it) and its
  response body by :data:`MAX_RESPONSE_BYTES`.

Failures become :class:`CallError` with the text of upstream's
``ErrCallingWebhook`` (``failed calling webhook "x": failed to call webhook:
Post "https://...": ...``).
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import ssl
from collections import OrderedDict
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import orjson

from kubeplane.api.resources import resource
from kubeplane.storage.interface import Store

if TYPE_CHECKING:
    import aiohttp

    from kubeplane.registry.webhooks import Hook

Obj = dict[str, Any]

#: the largest webhook response read (an AdmissionReview with a patch of an
#: object of the 3 MiB request limit fits several times)
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
#: pooled connections in all, and per webhook host
MAX_CONNECTIONS = 100
MAX_CONNECTIONS_PER_HOST = 20

SERVICES = resource("services")


class CallError(Exception):
    """Calling a webhook failed (upstream's ErrCallingWebhook): the failure
    policy decides whether the request goes on."""

    def __init__(self, webhook: str, reason: str) -> None:
        super().__init__(f'failed calling webhook "{webhook}": {reason}')
        self.webhook = webhook
        self.reason = reason


def _go_status_text(code: int, body: bytes) -> str:
    """What client-go says of a non-2xx answer that is not a Status."""
    text = body[:1024].decode("utf-8", errors="replace").strip()
    if code == 500 or not text:
        if code == 500:
            return f'an error on the server ("{text}") has prevented the request from succeeding'
        return f"the server responded with the status code {code} but did not return more information"
    return f'an error on the server ("{text}") has prevented the request from succeeding'


class WebhookClient:
    def __init__(self, store: Store | None = None) -> None:
        self.store = store
        self._sessions: dict[int, tuple[asyncio.AbstractEventLoop, "aiohttp.ClientSession"]] = {}
        self._contexts: OrderedDict[str, ssl.SSLContext] = OrderedDict()

    async def close(self) -> None:
        """Close this loop's pool (a pool of another loop can only be dropped)."""
        loop = asyncio.get_running_loop()
        sessions, self._sessions = self._sessions, {}
        for owner, s in sessions.values():
            if owner is loop and not s.closed:
                await s.close()

    def _session(self) -> "aiohttp.ClientSession":
        import aiohttp

        loop = asyncio.get_running_loop()
        entry = self._sessions.get(id(loop))
        if entry is None or entry[0] is not loop or entry[1].closed:
            # pools of event loops that have ended go with them
            for key in [k for k, (owner, _) in self._sessions.items() if owner.is_closed()]:
                del self._sessions[key]
            connector = aiohttp.TCPConnector(limit=MAX_CONNECTIONS, limit_per_host=MAX_CONNECTIONS_PER_HOST)
            entry = self._sessions[id(loop)] = (loop, aiohttp.ClientSession(
                connector=connector, auto_decompress=True, skip_auto_headers=("User-Agent",),
                headers={"User-Agent": "kube-apiserver-admission"}))
        return entry[1]

    def ssl_context(self, ca_bundle: Any) -> ssl.SSLContext:
        """A verifying context for the PEM ``caBundle`` (base64 in the API,
        decoded here); the system roots when it is empty."""
        import base64

        pem = b""
        if isinstance(ca_bundle, str) and ca_bundle:
            pem = base64.b64decode(ca_bundle)
        elif isinstance(ca_bundle, (bytes, bytearray)):
            pem = bytes(ca_bundle)
        key = hashlib.sha256(pem).hexdigest()
        ctx = self._contexts.get(key)
        if ctx is None:
            ctx = ssl.create_default_context()
            if pem:
                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                ctx.check_hostname = True
                ctx.verify_mode = ssl.CERT_REQUIRED
                ctx.load_verify_locations(cadata=pem.decode("ascii", errors="replace"))
            self._contexts[key] = ctx
            if len(self._contexts) > 64:
                self._contexts.popitem(last=False)
        else:
            self._contexts.move_to_end(key)
        return ctx

    async def resolve(self, hook: "Hook") -> tuple[str, str | None]:
        """(URL, TLS server name or None to check the URL's host)."""
        cc = hook.client_config
        url = cc.get("url")
        if isinstance(url, str) and url:
            return url, None
        svc = cc.get("service") if isinstance(cc.get("service"), dict) else {}
        name, namespace = str(svc.get("name") or ""), str(svc.get("namespace") or "")
        port = svc.get("port") if isinstance(svc.get("port"), int) else 443
        path = svc.get("path") or ""
        if self.store is None:
            raise CallError(hook.name, f'failed to resolve service "{name}" in namespace "{namespace}"')
        kv = await self.store.get(SERVICES.storage_key(name, namespace))
        if kv is None:
            raise CallError(hook.name, f'service "{name}" not found')
        spec = kv.value.get("spec") or {}
        if spec.get("type") == "ExternalName":
            host = str(spec.get("externalName") or "")
        else:
            host = str(spec.get("clusterIP") or "")
            if not host or host == "None":
                raise CallError(hook.name, f'service "{namespace}/{name}" has no cluster IP')
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"https://{host}:{port}{path}", f"{name}.{namespace}.svc"

    async def post(self, hook: "Hook", review: Obj) -> Any:
        """POST ``review``; the decoded response body. :class:`CallError` on any failure."""
        import aiohttp

        url, server_name = await self.resolve(hook)
        timeout = hook.timeout
        full = f"{url}?timeout={int(timeout)}s"
        try:
            ctx = self.ssl_context(hook.client_config.get("caBundle"))
        except (ValueError, ssl.SSLError) as exc:
            raise CallError(hook.name, f"could not get REST client: unable to load root certificates: {exc}") from None
        parts = urlsplit(url)
        kwargs: dict[str, Any] = {"ssl": ctx}
        if server_name is not None:
            kwargs["server_hostname"] = server_name
        body = orjson.dumps(review)
        try:
            async with asyncio.timeout(timeout):
                async with self._session().post(
                    full, data=body, headers={"Content-Type": "application/json", "Accept": "application/json"},
                    allow_redirects=False, **kwargs,
                ) as resp:
                    raw = await _read_bounded(resp)
                    status = resp.status
        except TimeoutError:
            raise CallError(hook.name, f'failed to call webhook: Post "{full}": context deadline exceeded') from None
        except _TooLarge:
            raise CallError(hook.name, f'failed to call webhook: Post "{full}": response body larger than '
                                       f"{MAX_RESPONSE_BYTES} bytes") from None
        except aiohttp.ClientConnectorCertificateError as exc:
            raise CallError(hook.name, f'failed to call webhook: Post "{full}": {_tls_text(exc, parts.hostname)}') \
                from None
        except aiohttp.ClientConnectorError as exc:
            raise CallError(hook.name, f'failed to call webhook: Post "{full}": {_dial_text(exc, parts)}') from None
        except (aiohttp.ClientError, OSError, ssl.SSLError) as exc:
            raise CallError(hook.name, f'failed to call webhook: Post "{full}": {exc}') from None
        if not 200 <= status < 300:
            text = None
            try:
                decoded = orjson.loads(raw)
                if isinstance(decoded, dict) and decoded.get("kind") == "Status" and decoded.get("message"):
                    text = str(decoded["message"])
            except orjson.JSONDecodeError:
                pass
            raise CallError(hook.name, "failed to call webhook: " + (text or _go_status_text(status, raw)))
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise CallError(hook.name, f"received invalid webhook response: {exc}") from None


class _TooLarge(Exception):
    pass


async def _read_bounded(resp: Any) -> bytes:
    if resp.content_length is not None and resp.content_length > MAX_RESPONSE_BYTES:
        raise _TooLarge()
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await resp.content.readany()
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise _TooLarge()
        chunks.append(chunk)


def _dial_text(exc: Any, parts: Any) -> str:
    host = parts.hostname or ""
    port = parts.port or 443
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    os_error = getattr(exc, "os_error", None)
    code = getattr(os_error, "errno", None)
    if code == errno.ECONNREFUSED:
        return f"dial tcp {target}: connect: connection refused"
    if code in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return f"dial tcp {target}: connect: no route to host"
    if isinstance(os_error, OSError) and getattr(os_error, "strerror", None) is None:
        return f"dial tcp: lookup {host}: no such host"
    return f"dial tcp {target}: {os_error or exc}"


def _tls_text(exc: Any, host: str | None) -> str:
    cert_error = getattr(exc, "certificate_error", None)
    message = str(getattr(cert_error, "verify_message", "") or cert_error or exc)
    if "Hostname mismatch" in message or "IP address mismatch" in message:
        return f"tls: failed to verify certificate: x509: certificate is not valid for {host}"
    if "expired" in message:
        return "tls: failed to verify certificate: x509: certificate has expired or is not yet valid"
    return "tls: failed to verify certificate: x509: certificate signed by unknown authority"
