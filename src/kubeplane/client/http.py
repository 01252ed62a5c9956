"""``HttpClient``: the :class:`~kubeplane.client.interface.Client` protocol over
the Kubernetes REST API (aiohttp, one pooled session, orjson).

It speaks plain JSON and works against kubeplane's API server and a real
cluster alike (bearer token or client certificate, TLS from the kubeconfig).
"""

from __future__ import annotations

import asyncio
import logging
import time
from http import HTTPStatus
from typing import Any, AsyncIterator

import aiohttp
import orjson

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import ResourceInfo
from kubeplane.client.interface import PATCH_CONTENT_TYPES, Obj, PatchType, WatchEvent
from kubeplane.client.kubeconfig import ClientConfig, load_kubeconfig

_JSON = "application/json"
USER_AGENT = "kubeplane/0.1"
#: seconds between reads of a kubeconfig's tokenFile (client-go's cached file token source)
TOKEN_FILE_PERIOD = 60.0
log = logging.getLogger("kubeplane.client")

# Reasons client-go derives from a bare HTTP status when the body is not a Status.
_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


#: as client-go's default: a request throttled with 429 is sent again up to 10 times
MAX_THROTTLE_RETRIES = 10


def _throttled(resp: aiohttp.ClientResponse) -> float | None:
    """Seconds to wait before sending a 429'd request again, or None."""
    if resp.status != 429:
        return None
    try:
        seconds = int(resp.headers.get("Retry-After", "1"))
    except ValueError:
        seconds = 1
    return float(min(max(seconds, 0), 10))


def _error_from_body(code: int, body: bytes) -> StatusError:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    if isinstance(doc, dict) and doc.get("kind") == "Status":
        return StatusError.from_status(doc, code)
    text = body.decode("utf-8", "replace").strip()
    if not text:
        try:
            text = HTTPStatus(code).phrase
        except ValueError:
            text = f"HTTP {code}"
    return StatusError(code, _REASONS.get(code, "Unknown"), text)


def _status_from_body(code: int, body: bytes) -> Obj:
    """A Status dict for an error reply, whatever the server put in the body."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    if isinstance(doc, dict) and doc.get("kind") == "Status":
        return doc
    return _error_from_body(code, body).to_status()


def _dump(body: Any) -> bytes:
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    return orjson.dumps(body)


def _common_params(field_manager: str | None, dry_run: bool) -> dict[str, str]:
    params: dict[str, str] = {}
    if field_manager:
        params["fieldManager"] = field_manager
    if dry_run:
        params["dryRun"] = "All"
    return params


class HttpClient:
    """The Client protocol over HTTP. Create it anywhere; the aiohttp session
    is opened lazily inside the running event loop. Call :meth:`close`."""

    def __init__(
        self,
        config: ClientConfig,
        *,
        request_timeout: float = 60.0,
        max_connections: int = 100,
        user_agent: str = USER_AGENT,
        impersonate_context: bool = False,
    ) -> None:
        self.config = config
        #: send the context's user (:func:`kubeplane.auth.user.current_user`, when
        #: not the process default) as Impersonate-User/-Group headers: one
        #: client acting for several identities (the simulated nodes of
        #: ``kubeplane nodes``, each system:node:<name>), as its credentials allow
        self.impersonate_context = impersonate_context
        self._base = config.server.rstrip("/")
        self._ssl: Any = config.ssl_context() if config.is_tls else None
        self._request_timeout = aiohttp.ClientTimeout(total=request_timeout)
        self._max_connections = max_connections
        self._exec = None
        auth = config.auth_headers()
        if config.exec_config is not None:
            from kubeplane.client.execcred import ExecCredentialProvider

            # The plugin's credentials go on each request (they expire and are renewed).
            self._exec = ExecCredentialProvider(config.exec_config)
            auth = {}
        self._headers = {"Accept": _JSON, "User-Agent": user_agent, **auth}
        #: tokenFile: read again at most once a minute, as client-go's cached file token source
        self._token_file_read = time.monotonic() if config.token_file else 0.0
        self._token = config.token
        self._token_set = False
        self._session: aiohttp.ClientSession | None = None
        self._watches: set[HttpWatchStream] = set()
        self._cert_contexts: dict[tuple[bytes, bytes], Any] = {}

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, context: str | None = None, **kw: Any) -> "HttpClient":
        return cls(load_kubeconfig(path, context), **kw)

    @property
    def namespace(self) -> str:
        """The kubeconfig context's default namespace."""
        return self.config.namespace

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._max_connections, ssl=self._ssl if self._ssl else False)
            self._session = aiohttp.ClientSession(
                connector=connector,
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
                json_serialize=lambda o: orjson.dumps(o).decode(),
            )
        return self._session

    def set_token(self, token: str) -> None:
        """Use bearer ``token`` from the next request on (a token renewed by
        its owner, as a ServiceAccount's from the TokenRequest API)."""
        self._token = token
        self._token_set = True

    def _file_token(self, headers: dict[str, str]) -> None:
        """The tokenFile's current token (or one given to :meth:`set_token`)
        on the request (when it is the credential)."""
        if self._exec is not None:
            return
        path = self.config.token_file
        if path is None:
            if self._token_set and self._token:
                headers["Authorization"] = f"Bearer {self._token}"
            return
        now = time.monotonic()
        if now - self._token_file_read >= TOKEN_FILE_PERIOD:
            self._token_file_read = now
            try:
                with open(path, encoding="utf-8") as f:
                    token = f.read().strip()
            except OSError as exc:
                log.warning("cannot read tokenFile %s: %s", path, exc)
            else:
                if token:
                    self._token = token
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"

    def _impersonation(self, headers: dict[str, str]) -> Any:
        self._file_token(headers)
        if not self.impersonate_context:
            return headers
        from multidict import CIMultiDict

        from kubeplane.auth.user import AUTHENTICATED, SYSTEM_ADMIN, current_user

        user = current_user()
        if user is SYSTEM_ADMIN:
            return headers
        out = CIMultiDict(headers)
        out["Impersonate-User"] = user.name
        for g in user.groups:
            if g != AUTHENTICATED:  # the server adds it
                out.add("Impersonate-Group", g)
        return out

    def _request_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {}
        if self.config.tls_server_name:
            kw["server_hostname"] = self.config.tls_server_name
        return kw

    async def _credentials(self, headers: dict[str, str], kw: dict[str, Any]) -> Any:
        """Adds the exec plugin's credentials to a request (header or TLS
        context); returns them, to invalidate on a 401, or None without a plugin."""
        if self._exec is None:
            return None
        creds = await self._exec.get()
        if creds.token:
            headers["Authorization"] = f"Bearer {creds.token}"
        if creds.client_cert and creds.client_key and self.config.is_tls:
            pair = (creds.client_cert, creds.client_key)
            ctx = self._cert_contexts.get(pair)
            if ctx is None:
                import dataclasses

                self._cert_contexts.clear()  # only the latest pair is used
                ctx = dataclasses.replace(self.config, client_cert_data=pair[0], client_key_data=pair[1],
                                          client_cert_file=None, client_key_file=None).ssl_context()
                self._cert_contexts[pair] = ctx
            kw["ssl"] = ctx
        return creds

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = _JSON,
        accept: str | None = None,
    ) -> Obj:
        session = self._get_session()
        headers: dict[str, str] = {}
        if accept is not None:
            headers["Accept"] = accept
        data = None
        if body is not None:
            data = _dump(body)
            headers["Content-Type"] = content_type
        renewed = False
        throttled = 0
        while True:
            kw = self._request_kwargs()
            creds = await self._credentials(headers, kw) if self._exec is not None else None
            async with session.request(
                method,
                self._base + path,
                params=params or None,
                data=data,
                headers=self._impersonation(headers),
                timeout=self._request_timeout,
                **kw,
            ) as resp:
                raw = await resp.read()
                status = resp.status
                wait = _throttled(resp)
            if status == 401 and creds is not None and not renewed:
                # As client-go: credentials the server refuses are renewed by
                # running the plugin again; a 401 was not acted on, so retry once.
                self._exec.invalidate(creds)
                renewed = True
                continue
            if wait is None or throttled == MAX_THROTTLE_RETRIES:
                break
            # As client-go: a 429 was not served, so any verb may be sent again.
            throttled += 1
            await asyncio.sleep(wait)
        if status >= 300:
            raise _error_from_body(status, raw)
        if not raw:
            return {}
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise StatusError(
                500, "InternalError", f"invalid JSON in {method} {path} response: {raw[:200]!r}"
            ) from None

    async def server_version(self) -> Obj:
        """The API server's ``/version`` (version.Info)."""
        return await self._request("GET", "/version")

    async def discover(self) -> list[ResourceInfo]:
        """The resources the server serves, from aggregated discovery (``/api``
        and ``/apis`` as apidiscovery.k8s.io/v2, as client-go's discovery
        client asks for them); see :mod:`kubeplane.client.discovery`."""
        from kubeplane.client.discovery import AGGREGATED_ACCEPT, resources_from_aggregated

        core = await self._request("GET", "/api", accept=AGGREGATED_ACCEPT)
        groups = await self._request("GET", "/apis", accept=AGGREGATED_ACCEPT)
        if core.get("kind") != "APIGroupDiscoveryList" or groups.get("kind") != "APIGroupDiscoveryList":
            raise StatusError(406, "NotAcceptable", "the server does not serve aggregated discovery")
        return resources_from_aggregated(core, groups)

    async def get(
        self, res: ResourceInfo, name: str, namespace: str | None = None, *, subresource: str | None = None
    ) -> Obj:
        return await self._request("GET", res.item_path(name, namespace, subresource))

    async def list(
        self,
        res: ResourceInfo,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
        resource_version: str | None = None,
        resource_version_match: str | None = None,
    ) -> Obj:
        params: dict[str, str] = {}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        if limit:
            params["limit"] = str(limit)
        if continue_token:
            params["continue"] = continue_token
        if resource_version is not None:
            params["resourceVersion"] = resource_version
        if resource_version_match:
            params["resourceVersionMatch"] = resource_version_match
        return await self._request("GET", res.collection_path(namespace), params=params)

    async def create(
        self,
        res: ResourceInfo,
        obj: Obj,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        name: str | None = None,
        field_manager: str | None = None,
        dry_run: bool = False,
    ) -> Obj:
        ns = namespace or (obj.get("metadata") or {}).get("namespace")
        if subresource:
            if not name:
                raise ValueError("create with a subresource needs the parent's name")
            path = res.item_path(name, ns, subresource)
        else:
            path = res.collection_path(ns)
        return await self._request(
            "POST", path, params=_common_params(field_manager, dry_run), body=obj
        )

    async def update(
        self,
        res: ResourceInfo,
        obj: Obj,
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
        dry_run: bool = False,
    ) -> Obj:
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if not name:
            raise ValueError("update needs metadata.name")
        path = res.item_path(name, meta.get("namespace"), subresource)
        return await self._request("PUT", path, params=_common_params(field_manager, dry_run), body=obj)

    async def patch(
        self,
        res: ResourceInfo,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        patch_type: PatchType = "merge",
        subresource: str | None = None,
        field_manager: str | None = None,
        force: bool | None = None,
        dry_run: bool = False,
    ) -> Obj:
        try:
            content_type = PATCH_CONTENT_TYPES[patch_type]
        except KeyError:
            raise ValueError(f"unknown patch type {patch_type!r}") from None
        params = _common_params(field_manager, dry_run)
        if force is not None:
            params["force"] = "true" if force else "false"
        # An apply patch is YAML; JSON is valid YAML, so every body goes out as JSON.
        return await self._request(
            "PATCH", res.item_path(name, namespace, subresource),
            params=params, body=patch, content_type=content_type,
        )

    async def delete(
        self,
        res: ResourceInfo,
        name: str,
        namespace: str | None = None,
        *,
        grace_period_seconds: int | None = None,
        propagation_policy: str | None = None,
        preconditions: dict[str, str] | None = None,
        dry_run: bool = False,
    ) -> Obj:
        params = _common_params(None, dry_run)
        options: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_period_seconds is not None:
            params["gracePeriodSeconds"] = str(grace_period_seconds)
            options["gracePeriodSeconds"] = grace_period_seconds
        if propagation_policy:
            params["propagationPolicy"] = propagation_policy
            options["propagationPolicy"] = propagation_policy
        if preconditions:
            options["preconditions"] = preconditions
        if dry_run:
            options["dryRun"] = ["All"]
        return await self._request(
            "DELETE", res.item_path(name, namespace), params=params, body=options
        )

    async def delete_collection(
        self,
        res: ResourceInfo,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        grace_period_seconds: int | None = None,
        propagation_policy: str | None = None,
        dry_run: bool = False,
    ) -> Obj:
        """DELETE on the collection (deletecollection); returns the List of what was deleted."""
        params = _common_params(None, dry_run)
        options: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        if grace_period_seconds is not None:
            params["gracePeriodSeconds"] = str(grace_period_seconds)
            options["gracePeriodSeconds"] = grace_period_seconds
        if propagation_policy:
            params["propagationPolicy"] = propagation_policy
            options["propagationPolicy"] = propagation_policy
        if dry_run:
            options["dryRun"] = ["All"]
        return await self._request("DELETE", res.collection_path(namespace), params=params, body=options)

    def watch(
        self,
        res: ResourceInfo,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        allow_bookmarks: bool = True,
        timeout_seconds: int | None = None,
        send_initial_events: bool = False,
    ) -> "HttpWatchStream":
        params: dict[str, str] = {"watch": "1"}
        if allow_bookmarks:
            params["allowWatchBookmarks"] = "true"
        if resource_version is not None:
            params["resourceVersion"] = resource_version
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        if timeout_seconds is not None:
            params["timeoutSeconds"] = str(timeout_seconds)
        if send_initial_events:
            params["sendInitialEvents"] = "true"
            params["resourceVersionMatch"] = "NotOlderThan"
        return HttpWatchStream(self, res.collection_path(namespace), params)

    async def close(self) -> None:
        for stream in list(self._watches):
            await stream.close()
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def __aenter__(self) -> "HttpClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class HttpWatchStream:
    """One watch request. The request is sent on the first ``__anext__``; events
    are NDJSON lines read through our own buffer (lines may exceed aiohttp's
    64 KiB readline limit). An HTTP 410 reply becomes one ERROR event."""

    _CHUNK = 1 << 16

    def __init__(self, client: HttpClient, path: str, params: dict[str, str]) -> None:
        self._client = client
        self._path = path
        self._params = params
        self._resp: aiohttp.ClientResponse | None = None
        self._buf = bytearray()
        self._pending: WatchEvent | None = None
        self._eof = False
        self._closed = False
        self._started = False

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self

    async def _open(self) -> None:
        self._started = True
        self._client._watches.add(self)
        session = self._client._get_session()
        for attempt in (0, 1):
            headers: dict[str, str] = {}
            kw = self._client._request_kwargs()
            creds = await self._client._credentials(headers, kw)
            resp = await session.get(
                self._client._base + self._path,
                params=self._params,
                headers=self._client._impersonation(headers),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=None),
                **kw,
            )
            if resp.status == 401 and creds is not None and attempt == 0:
                resp.release()
                self._client._exec.invalidate(creds)
                continue
            break
        if self._closed:
            resp.close()
            raise StopAsyncIteration
        if resp.status >= 300:
            raw = await resp.read()
            resp.release()
            self._eof = True
            self._client._watches.discard(self)
            if resp.status == 410:
                self._pending = WatchEvent("ERROR", _status_from_body(410, raw))
                return
            raise _error_from_body(resp.status, raw)
        self._resp = resp

    async def _readline(self) -> bytes | None:
        while True:
            idx = self._buf.find(b"\n")
            if idx >= 0:
                line = bytes(self._buf[:idx])
                del self._buf[: idx + 1]
                return line
            if self._eof:
                if self._buf:
                    line = bytes(self._buf)
                    self._buf.clear()
                    return line
                return None
            assert self._resp is not None
            chunk = await self._resp.content.readany()
            if not chunk:
                self._eof = True
            else:
                self._buf += chunk

    async def __anext__(self) -> WatchEvent:
        if self._closed:
            raise StopAsyncIteration
        try:
            if not self._started:
                await self._open()
            if self._pending is not None:
                event, self._pending = self._pending, None
                return event
            while True:
                if self._resp is None:
                    raise StopAsyncIteration
                line = await self._readline()
                if line is None:
                    await self._finish()
                    raise StopAsyncIteration
                line = line.strip()
                if not line:
                    continue
                doc = orjson.loads(line)
                return WatchEvent(doc.get("type", ""), doc.get("object") or {})
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError):
            if self._closed:
                raise StopAsyncIteration from None
            await self._finish()
            raise

    async def _finish(self) -> None:
        self._client._watches.discard(self)
        if self._resp is not None:
            self._resp.close()

    async def close(self) -> None:
        """Stop the stream; a pending ``__anext__`` ends with StopAsyncIteration."""
        if self._closed:
            return
        self._closed = True
        self._eof = True
        await self._finish()
