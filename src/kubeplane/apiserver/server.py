"""The HTTP front end: Kubernetes REST routes on aiohttp.

Routing is generic: a URL is parsed into (resource, namespace, name,
subresource) against the catalogue, so a new resource needs no handler code.
Every error leaves as a ``Status``; any unexpected exception becomes a 500
Status and is logged, and the server keeps running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import platform
import random
import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import orjson
from aiohttp import web

from kubeplane import __version__
from kubeplane.api import errors
from kubeplane.api import warning
from kubeplane.api.errors import StatusError
from kubeplane.api.meta import deep_copy
from kubeplane.api.resources import Catalogue, ResourceInfo
from kubeplane.apiserver import codec, discovery, health
from kubeplane.apiserver.openapi import json_kind as _json_kind
from kubeplane.apiserver.serving import InflightLimiter, ServingLimits, deadline_middleware
from kubeplane.auth.authorizer import AlwaysAllow
from kubeplane.registry.registry import Registry, WatchOptions
from kubeplane.storage.interface import WriteFailedError
from kubeplane.storage.transformer import TransformError

if TYPE_CHECKING:
    from kubeplane.apiserver.metrics import APIServerMetrics
    from kubeplane.auth.authorizer import Authorizer

log = logging.getLogger("kubeplane.apiserver")

MAX_BODY_BYTES = 3 * 1024 * 1024  # upstream's default request body limit
# Key (not a DeleteOptions field) for "orphanDependents=false was sent".
_CASCADE_REQUESTED = "_orphanDependentsFalse"


def _platform() -> str:
    """``GOOS/GOARCH`` as Go names them, for the machine the server runs on."""
    arch = platform.machine().lower()
    arch = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "i686": "386", "ppc64le": "ppc64le",
            "s390x": "s390x"}.get(arch, arch)
    return f"{sys.platform.rstrip('0123456789')}/{arch}"


# Upstream's version.Info of v1.32 (the same fields, in the same order). The
# server's identity is build metadata ("+kubeplane"), as distributions such as
# k3s mark theirs: a pre-release suffix would make semver ranges like helm's
# kubeVersion ">=1.25.0" reject the server.
VERSION_INFO = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0+kubeplane",
    "gitCommit": "kubeplane-" + __version__,
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": f"python{platform.python_version()}",
    "compiler": platform.python_implementation().lower(),
    "platform": _platform(),
}

HANDLER_KEY: "web.AppKey[APIHandler]" = web.AppKey("handler")
INFLIGHT_KEY: "web.AppKey[InflightLimiter]" = web.AppKey("inflight")
#: set on a request once its streamed response has been prepared: from then on
#: an error can only go inside the stream, never as a second response
STREAMING_KEY: "web.RequestKey[web.StreamResponse]" = web.RequestKey("streaming", web.StreamResponse)

TABLE_CONTENT_TYPE = "application/json;as=Table;v=v1;g=meta.k8s.io"

Obj = dict[str, Any]


@dataclass(slots=True)
class Target:
    res: ResourceInfo
    namespace: str | None
    name: str | None
    subresource: str | None
    watch_path: bool = False


def json_response(obj: Any, status: int = 200, content_type: str = "application/json",
                  headers: dict[str, str] | None = None) -> web.Response:
    h = dict(headers or {})
    h["Content-Type"] = content_type  # set raw: may carry parameters (as=Table, g=...)
    return web.Response(body=orjson.dumps(obj), status=status, headers=h)


def status_response(err: StatusError) -> web.Response:
    headers = {"Retry-After": str(err.retry_after)} if err.retry_after is not None else None
    return web.Response(body=orjson.dumps(err.to_status()), status=err.code,
                        headers={**(headers or {}), "Content-Type": "application/json"})


#: built-in kinds upstream warns about on every request
BUILTIN_DEPRECATIONS: dict[tuple[str, str], str] = {
    ("", "endpoints"): "v1 Endpoints is deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice",
}


def _warning_header(text: str) -> str:
    from kubeplane.apiserver.openapi import warning_header

    return warning_header(text)


def _bool_param(q, name: str) -> bool | None:
    v = q.get(name)
    if v is None:
        return None
    if v.lower() in ("true", "1"):
        return True
    if v.lower() in ("false", "0", ""):
        return False
    raise errors.bad_request(f"invalid boolean value for {name}: {v!r}")


def _int_param(q, name: str) -> int | None:
    v = q.get(name)
    if v in (None, ""):
        return None
    try:
        return int(v)
    except ValueError:
        raise errors.bad_request(f"invalid value for {name}: {v!r}: must be an integer") from None


def _validate_log_options(q, name: str) -> None:
    """Upstream's ValidatePodLogOptions (a 422 Invalid on PodLogOptions)."""
    for flag in ("follow", "previous", "timestamps", "insecureSkipTLSVerifyBackend"):
        _bool_param(q, flag)
    tail, limit, since = _int_param(q, "tailLines"), _int_param(q, "limitBytes"), _int_param(q, "sinceSeconds")
    since_time = q.get("sinceTime")
    causes = []
    if tail is not None and tail < 0:
        causes.append(errors.invalid_value("tailLines", tail, "must be greater than or equal to 0"))
    if limit is not None and limit < 1:
        causes.append(errors.invalid_value("limitBytes", limit, "must be greater than 0"))
    if since is not None and since_time is not None:
        causes.append(errors.forbidden_field("", "at most one of `sinceTime` or `sinceSeconds` may be specified"))
    elif since is not None and since < 1:
        causes.append(errors.invalid_value("sinceSeconds", since, "must be greater than 0"))
    if since_time is not None:
        from kubeplane.api.meta import parse_time

        try:
            parse_time(since_time)
        except (ValueError, TypeError):
            raise errors.bad_request(f'parsing time "{since_time}" as "2006-01-02T15:04:05Z07:00": '
                                     "cannot parse as RFC3339") from None
    if causes:
        raise errors.invalid("PodLogOptions", name, causes)


def _dry_run(q) -> bool:
    values = q.getall("dryRun", [])
    for v in values:
        if v != "All":
            raise errors.bad_request(f'dryRun: Unsupported value: "{v}": supported values: "All"')
    return bool(values)


def _field_validation(q, default: str = "Warn") -> str:
    v = q.get("fieldValidation") or default
    if v not in ("Strict", "Warn", "Ignore"):
        raise errors.bad_request(
            f'fieldValidation: Unsupported value: "{v}": supported values: "Ignore", "Strict", "Warn"'
        )
    return v


def _wants_table(request: web.Request) -> bool:
    accept = request.headers.get("Accept", "")
    for part in accept.split(","):
        params = {p.strip() for p in part.split(";")[1:]}
        if "as=Table" in params and "g=meta.k8s.io" in params:
            return True
    return False


def _wants_aggregated(request: web.Request) -> str | None:
    accept = request.headers.get("Accept", "")
    for part in accept.split(","):
        params = {p.strip() for p in part.split(";")[1:]}
        if "as=APIGroupDiscoveryList" in params and "g=apidiscovery.k8s.io" in params:
            if "v=v2" in params:
                return discovery.AGGREGATED_CONTENT_TYPE
            if "v=v2beta1" in params:
                return discovery.AGGREGATED_V2BETA1_CONTENT_TYPE
    return None


OPENAPI_V2_PROTOBUF = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
_OPENAPI_V2_PROTOBUF_SUBTYPES = ("com.github.proto-openapi.spec.v2@v1.0+protobuf",
                                 "com.github.proto-openapi.spec.v2.v1.0+protobuf")


def _openapi_v2_format(accept: str) -> str | None:
    """"json", "protobuf" or None (406), chosen as upstream's OpenAPI handler
    does: Accept clauses by quality, the first that names a served type."""
    clauses = []
    for i, part in enumerate(accept.split(",")):
        fields = [f.strip() for f in part.split(";")]
        media = fields[0].lower()
        if not media:
            continue
        q = 1.0
        for param in fields[1:]:
            if param.startswith("q="):
                try:
                    q = float(param[2:])
                except ValueError:
                    q = 0.0
        clauses.append((-q, i, media))
    for q, _, media in sorted(clauses):
        if q == 0:
            break
        typ, _, sub = media.partition("/")
        if typ not in ("application", "*"):
            continue
        if sub in ("json", "*"):
            return "json"
        if sub in _OPENAPI_V2_PROTOBUF_SUBTYPES:
            return "protobuf"
    return None


class APIHandler:
    def __init__(self, registry: Registry, catalogue: Catalogue, *, max_body: int = MAX_BODY_BYTES,
                 server_address: str = "127.0.0.1:6443") -> None:
        self.registry = registry
        self.catalogue = catalogue
        self.max_body = max_body
        self.server_address = server_address
        self.watch_bookmark_interval = 5.0
        #: seconds; a watch without timeoutSeconds ends in [min, 2*min] (0: never)
        self.min_request_timeout = 0.0
        self.metrics: Any = None  # APIServerMetrics, set by build_app
        self.authorizer: Any = None  # the Authorizer every request is put to, set by build_app
        self.stopping = asyncio.Event()
        #: authentication (None: every request is the current user, SYSTEM_ADMIN)
        #: and the ServiceAccount token issuer of TokenRequest (None: not served)
        self.authenticator: Any = None
        self.token_issuer: Any = None
        #: HTTPS to the nodes' kubelets (nodeproxy.KubeletClient; made without a
        #: client certificate on first use when none was given)
        self.kubelet_client: Any = None
        from kubeplane.apiserver.openapi_crd import CustomDocuments

        #: the OpenAPI documents of the custom resources the catalogue serves
        self.custom_docs = CustomDocuments(catalogue)
        # id(obj) -> (obj, type, encoded line); holding obj keeps the id unique.
        self._encoded: OrderedDict[int, tuple[Obj, str, bytes]] = OrderedDict()

    @property
    def kubelet(self) -> Any:
        if self.kubelet_client is None:
            from kubeplane.apiserver.nodeproxy import KubeletClient

            self.kubelet_client = KubeletClient()
        return self.kubelet_client

    # -- plumbing ------------------------------------------------------------

    @web.middleware
    async def middleware(self, request: web.Request, handler):
        with warning.collecting() as warnings:
            try:
                response = await handler(request)
            except (asyncio.CancelledError, ConnectionResetError):
                raise
            except Exception as exc:
                streaming = request.get(STREAMING_KEY)
                if streaming is not None and streaming.prepared:
                    # Headers are out: a second response would corrupt the stream.
                    log.error("error after the response to %s %s started: %r", request.method, request.path, exc)
                    return streaming
                response = self._error_response(request, exc)
        if warnings and not response.prepared:
            # warnings added below the front end (admission), on success and failure alike
            for text in warnings:
                response.headers.add("Warning", _warning_header(text))
        return response

    def _error_response(self, request: web.Request, exc: Exception) -> web.Response:
        if isinstance(exc, StatusError):
            return status_response(exc)
        if isinstance(exc, web.HTTPException):
            if exc.status == 404:
                return status_response(errors.route_not_found())
            if exc.status == 405:
                # a generic server response, as go-restful's: details present and empty
                return status_response(StatusError(
                    405, "MethodNotAllowed", "the server does not allow this method on the requested resource",
                    name="", group="", kind=""))
            if exc.status == 413:
                return status_response(errors.too_large(self.max_body))
            return status_response(StatusError(exc.status, exc.reason.replace(" ", ""), exc.text or exc.reason))
        if isinstance(exc, (WriteFailedError, TransformError)):
            # Upstream answers a storage failure (a write that failed, a value that
            # cannot be decrypted) as an internal error carrying its text.
            log.error("storage failed serving %s %s: %s", request.method, request.path, exc)
            return status_response(errors.internal(f"Internal error occurred: {exc}"))
        # The server must survive any input.
        log.error("internal error serving %s %s", request.method, request.path, exc_info=exc)
        return status_response(errors.internal(f"an error on the server has prevented the request from succeeding: {exc!r}"))

    async def read_body(self, request: web.Request) -> bytes:
        if request.content_length is not None and request.content_length > self.max_body:
            raise errors.too_large(self.max_body)
        chunks = []
        size = 0
        while True:
            chunk = await request.content.readany()
            if not chunk:
                break
            size += len(chunk)
            if size > self.max_body:
                raise errors.too_large(self.max_body)
            chunks.append(chunk)
        return b"".join(chunks)

    # -- meta endpoints --------------------------------------------------

    async def version(self, request: web.Request) -> web.Response:
        return json_response(VERSION_INFO)

    async def api_root(self, request: web.Request) -> web.Response:
        agg = _wants_aggregated(request)
        if agg:
            ver = "apidiscovery.k8s.io/v2" if agg == discovery.AGGREGATED_CONTENT_TYPE else "apidiscovery.k8s.io/v2beta1"
            return json_response(discovery.aggregated(self.catalogue, True, ver), content_type=agg)
        return json_response(discovery.api_versions(self.server_address))

    async def apis_root(self, request: web.Request) -> web.Response:
        agg = _wants_aggregated(request)
        if agg:
            ver = "apidiscovery.k8s.io/v2" if agg == discovery.AGGREGATED_CONTENT_TYPE else "apidiscovery.k8s.io/v2beta1"
            return json_response(discovery.aggregated(self.catalogue, False, ver), content_type=agg)
        return json_response(discovery.api_group_list(self.catalogue))

    async def openapi_v3_index(self, request: web.Request) -> web.Response:
        return json_response(await asyncio.to_thread(self.custom_docs.v3_index))

    async def openapi_v3_doc(self, request: web.Request) -> web.Response:
        from kubeplane.apiserver import openapi

        path = request.match_info["path"].strip("/")
        parts = path.split("/")
        doc = None
        if len(parts) == 2 and parts[0] == "api":
            doc = openapi.v3_document_bytes("", parts[1])
        elif len(parts) == 3 and parts[0] == "apis":
            doc = openapi.v3_document_bytes(parts[1], parts[2])
            if doc is None:
                custom = await asyncio.to_thread(self.custom_docs.v3, parts[1], parts[2])
                doc = custom[1] if custom is not None else None
        if doc is None:
            raise errors.route_not_found()
        headers = {"Content-Type": "application/json"}
        if request.query.get("hash"):
            headers["Cache-Control"] = "public, immutable"
        return web.Response(body=doc, headers=headers)

    async def openapi_v2(self, request: web.Request) -> web.Response:
        """Swagger 2.0, negotiated as upstream's handler does: JSON or gnostic's
        protobuf (what client-go's OpenAPISchema() and kubectl's
        plaintext-openapiv2 explain ask for), anything else a 406 with an empty
        body."""
        fmt = _openapi_v2_format(request.headers.get("Accept") or "*/*")
        if fmt is None:
            return web.Response(status=406, headers={"Vary": "Accept"})
        # Built once (about a second of CPU), off the event loop.
        # (with the custom resources merged in)
        body, etag = await asyncio.to_thread(self.custom_docs.v2, fmt)
        content_type = "application/json" if fmt == "json" else OPENAPI_V2_PROTOBUF
        headers = {"Content-Type": content_type, "Vary": "Accept", "Etag": f'"{etag}"'}
        if request.headers.get("If-None-Match") == f'"{etag}"':
            return web.Response(status=304, headers=headers)
        return web.Response(body=body, headers=headers)

    # -- resource routing ------------------------------------------------

    def _resolve(self, group: str, version: str, rest: str) -> Target | None:
        parts = [p for p in rest.split("/") if p != ""]
        watch_path = False
        if parts and parts[0] == "watch":
            watch_path = True
            parts = parts[1:]
        namespace = None
        if len(parts) == 3 and parts[0] == "namespaces" and not watch_path:
            # a namespace's own subresources (namespaces/{name}/status, /finalize),
            # unless a namespaced resource has that name
            ns_res = self.catalogue.by_gvr(group, version, "namespaces")
            inner = self.catalogue.by_gvr(group, version, parts[2])
            if ns_res is not None and parts[2] in ns_res.subresources and (inner is None or not inner.namespaced):
                return Target(ns_res, None, parts[1], parts[2], watch_path)
        if len(parts) >= 3 and parts[0] == "namespaces":
            namespace = parts[1]
            parts = parts[2:]
        if not parts or len(parts) > 3:
            return None
        res = self.catalogue.by_gvr(group, version, parts[0])
        if res is None:
            return None
        if namespace is not None and not res.namespaced:
            return None
        name = parts[1] if len(parts) > 1 else None
        sub = parts[2] if len(parts) > 2 else None
        if sub is not None and sub not in res.subresources:
            return None
        return Target(res, namespace, name, sub, watch_path)

    async def core_group_version(self, request: web.Request) -> web.Response:
        version = request.match_info["version"]
        rest = request.match_info.get("rest", "")
        if not rest.strip("/"):
            doc = discovery.api_resource_list(self.catalogue, "", version)
            if doc is None:
                raise errors.route_not_found()
            return json_response(doc)
        return await self._dispatch(request, "", version, rest)

    async def named_group(self, request: web.Request) -> web.Response:
        group = request.match_info["group"]
        version = request.match_info.get("version")
        rest = request.match_info.get("rest", "")
        if version is None:
            doc = discovery.api_group(self.catalogue, group)
        elif not rest.strip("/"):
            doc = discovery.api_resource_list(self.catalogue, group, version)
        else:
            return await self._dispatch(request, group, version, rest)
        if doc is None:
            raise errors.route_not_found()
        return json_response(doc)

    async def _dispatch(self, request: web.Request, group: str, version: str, rest: str) -> web.StreamResponse:
        t = self._resolve(group, version, rest)
        if t is None:
            raise errors.route_not_found()
        m = request.method
        text = BUILTIN_DEPRECATIONS.get(t.res.key) if t.res.custom is None else None
        if t.res.custom is not None:
            _check_custom_media_types(request, m)
            if t.res.custom.deprecated:
                text = t.res.custom.deprecation_warning or f"{t.res.api_version} {t.res.kind} is deprecated"
        if text is not None:
            resp = await self._route(request, t, m)
            if not resp.prepared:
                prior = resp.headers.get("Warning")
                resp.headers["Warning"] = ", ".join(x for x in (_warning_header(text), prior) if x)
            return resp
        return await self._route(request, t, m)

    async def _route(self, request: web.Request, t: Target, m: str) -> web.StreamResponse:
        if t.res.namespaced and t.namespace is None and t.name is not None:
            raise errors.route_not_found()
        if "get" not in t.res.verbs:
            # create-only kinds (the reviews): one route, POST on the collection
            if t.name is not None or t.watch_path:
                raise errors.route_not_found()
            if m != "POST":
                raise errors.method_not_allowed("the server does not allow this method on the requested resource")
        elif t.subresource is None and len(t.res.verbs) < 8:
            # a kind that serves only some verbs (the read-only metrics) refuses the others
            watching = m == "GET" and bool(t.watch_path or _bool_param(request.query, "watch"))
            verb = "watch" if watching else {"POST": "create", "PUT": "update", "PATCH": "patch",
                                              "DELETE": "delete" if t.name else "deletecollection"}.get(m)
            if verb is not None and verb not in t.res.verbs:
                raise errors.method_not_allowed("the server does not allow this method on the requested resource")
        if t.name is None:
            if m == "GET":
                if t.watch_path or _bool_param(request.query, "watch"):
                    return await self.watch(request, t)
                return await self.list(request, t)
            if m == "POST":
                return await self.create(request, t)
            if m == "DELETE" and "deletecollection" in t.res.verbs:
                return await self.delete_collection(request, t)
            raise errors.method_not_allowed("the server does not allow this method on the requested resource")
        if t.watch_path:
            return await self.watch(request, t, single=t.name)
        sub = t.subresource
        if sub == "binding":
            if m != "POST":
                raise errors.method_not_allowed("the server does not allow this method on the requested resource")
            return await self.bind(request, t)
        if sub == "eviction" and t.res.key == ("", "pods"):
            if m != "POST":
                raise errors.method_not_allowed("the server does not allow this method on the requested resource")
            return await self.evict(request, t)
        if sub == "log":
            if m != "GET":
                raise errors.method_not_allowed("the server does not allow this method on the requested resource")
            return await self.pod_log(request, t)
        if sub in ("exec", "attach", "portforward"):
            if m not in ("GET", "POST"):
                raise errors.method_not_allowed("the server does not allow this method on the requested resource")
            return await self.pod_connect(request, t, sub)
        if sub == "scale":
            return await self.scale(request, t)
        if sub == "token" and t.res.key == ("", "serviceaccounts"):
            if m != "POST":
                raise errors.method_not_allowed("the server does not allow this method on the requested resource")
            return await self.token_request(request, t)
        if sub == "finalize" and m != "PUT":
            # upstream's namespace finalize REST is an updater only
            raise errors.method_not_allowed("the server does not allow this method on the requested resource")
        if m == "GET":
            return await self.get(request, t)
        if m == "PUT":
            return await self.update(request, t)
        if m == "PATCH":
            return await self.patch(request, t)
        if m == "DELETE" and sub is None:
            return await self.delete(request, t)
        if m == "POST":
            raise errors.method_not_allowed("the server does not allow this method on the requested resource")
        raise errors.method_not_allowed("the server does not allow this method on the requested resource")

    # -- verbs -----------------------------------------------------------

    def _respond_object(self, request: web.Request, res: ResourceInfo, obj: Obj, status: int = 200,
                        warnings: list[str] | None = None) -> web.Response:
        headers = None
        if warnings:
            headers = {"Warning": ", ".join(_warning_header(w) for w in warnings)}
        if _wants_table(request) and obj.get("kind") == res.kind:
            return json_response(self._table(request, res, [obj], {"resourceVersion": obj.get("metadata", {}).get("resourceVersion", "")}),
                                 status, TABLE_CONTENT_TYPE, headers)
        if status in (200, 201, 202) and obj.get("kind") != "Status" and ("apiVersion" not in obj or "kind" not in obj):
            obj = {"apiVersion": res.api_version, "kind": res.kind, **obj}
        return json_response(obj, status, headers=headers)

    def _table(self, request: web.Request, res: ResourceInfo, items: list[Obj], list_meta: Obj) -> Obj:
        from kubeplane.api.meta import utcnow
        from kubeplane.apiserver import tables

        return tables.build_table(res, items, now=utcnow(), include_object=_include_object(request),
                                  list_metadata=list_meta)

    async def get(self, request: web.Request, t: Target) -> web.Response:
        obj = await self.registry.get(t.res, t.name, t.namespace)
        return self._respond_object(request, t.res, obj)

    async def list(self, request: web.Request, t: Target) -> web.Response:
        q = request.query
        limit = _int_param(q, "limit") or 0
        if limit < 0:
            raise errors.bad_request("limit must be non-negative")
        result = await self.registry.list(
            t.res, t.namespace,
            label_selector=q.get("labelSelector", ""),
            field_selector=q.get("fieldSelector", ""),
            limit=limit,
            continue_token=q.get("continue", ""),
            resource_version=q.get("resourceVersion", ""),
            resource_version_match=q.get("resourceVersionMatch", ""),
        )
        if _wants_table(request):
            return json_response(self._table(request, t.res, result["items"], result["metadata"]),
                                 content_type=TABLE_CONTENT_TYPE)
        return json_response(result)

    def _check_fields(self, request: web.Request, res: ResourceInfo, obj: Any, default: str = "Warn", *,
                      prune: bool = False) -> list[str]:
        """Warnings for ``obj`` under the request's fieldValidation (Strict raises);
        with ``prune`` the unknown fields are dropped from ``obj`` in place."""
        from kubeplane.apiserver import openapi

        mode = _field_validation(request.query, default)
        if not isinstance(obj, dict):
            raise errors.bad_request(f"{res.kind} in version \"{res.version}\" cannot be handled as a {res.kind}: "
                                     "the body must be a JSON object")
        if res.custom is not None:
            from kubeplane.registry import customresource

            pruned = customresource.prune(res, obj if prune else deep_copy(obj))
            problems = [f'unknown field "{p}"' for p in pruned]
        else:
            problems = openapi.check_fields(obj, res.group, res.version, res.kind, prune=prune)
        return openapi.enforce(problems, mode, kind=res.kind, version=res.version)

    def _checked_body(self, request: web.Request, res: ResourceInfo, obj: Any) -> tuple[list[str], Any, bool]:
        """(warnings, object, owned) for a create or update body: unknown fields
        of a built-in kind are dropped, as decoding into upstream's typed
        objects drops them. A tree that may share containers (YAML aliases) is
        copied before anything is dropped from it."""
        owned = codec.fresh_tree(request.headers.get("Content-Type"))
        if owned or not isinstance(obj, dict):
            return self._check_fields(request, res, obj, prune=True), obj, owned
        warnings = self._check_fields(request, res, obj)
        if any(w.startswith('unknown field "') for w in warnings) or _field_validation(request.query) == "Ignore":
            obj = deep_copy(obj)
            self._check_fields(request, res, obj, prune=True)
            owned = True
        return warnings, obj, owned

    async def create(self, request: web.Request, t: Target) -> web.Response:
        body = await self.read_body(request)
        obj = codec.decode_body(body, request.headers.get("Content-Type"))
        q = request.query
        if t.res.group == "authentication.k8s.io":
            return await self.authentication_review(request, t, obj)
        if isinstance(obj, dict):
            # Bodies without type meta (typed Python models) take it from the URL.
            obj.setdefault("apiVersion", t.res.api_version)
            obj.setdefault("kind", t.res.kind)
            if obj.get("apiVersion") != t.res.api_version or obj.get("kind") != t.res.kind:
                other = self.catalogue.by_api_version_kind(str(obj.get("apiVersion")), str(obj.get("kind")))
                if other is None:
                    raise errors.bad_request(
                        f"no kind \"{obj.get('kind')}\" is registered for version \"{obj.get('apiVersion')}\"")
        warnings, obj, owned = self._checked_body(request, t.res, obj)
        created = await self.registry.create(t.res, obj, t.namespace, dry_run=_dry_run(q),
                                             field_manager=q.get("fieldManager") or _manager_from_agent(request),
                                             owned=owned)
        return self._respond_object(request, t.res, created, 201, warnings)

    async def authentication_review(self, request: web.Request, t: Target, obj: Any) -> web.Response:
        """TokenReview and SelfSubjectReview: answered, never stored."""
        from kubeplane.apiserver import authn
        from kubeplane.auth.user import current_user

        if t.res.plural == "selfsubjectreviews":
            return json_response(authn.self_subject_review(obj, current_user()), 201)
        return json_response(await authn.token_review(obj, self.authenticator), 201)

    async def token_request(self, request: web.Request, t: Target) -> web.Response:
        from kubeplane.apiserver import authn

        body = await self.read_body(request)
        obj = codec.decode_body(body, request.headers.get("Content-Type"))
        audiences = self.authenticator.api_audiences if self.authenticator is not None else ()
        out = await authn.token_request(self.registry, self.catalogue, self.token_issuer, audiences,
                                        t.namespace or "default", t.name or "", obj, dry_run=_dry_run(request.query))
        return json_response(out, 201)

    async def update(self, request: web.Request, t: Target) -> web.Response:
        body = await self.read_body(request)
        obj = codec.decode_body(body, request.headers.get("Content-Type"))
        q = request.query
        if isinstance(obj, dict) and t.subresource is None:
            obj.setdefault("apiVersion", t.res.api_version)
            obj.setdefault("kind", t.res.kind)
        warnings, obj, owned = self._checked_body(request, t.res, obj)
        updated = await self.registry.update(
            t.res, obj, name=t.name, namespace=t.namespace, subresource=t.subresource, dry_run=_dry_run(q),
            field_manager=q.get("fieldManager") or _manager_from_agent(request),
            owned=owned,
        )
        return self._respond_object(request, t.res, updated, 200, warnings)

    async def patch(self, request: web.Request, t: Target) -> web.Response:
        body = await self.read_body(request)
        kind, patch = codec.decode_patch(body, request.headers.get("Content-Type"))
        q = request.query
        force = _bool_param(q, "force")
        warnings: list[str] = []
        mode = _field_validation(q, "Warn")
        if kind == "apply" or (kind in ("merge", "strategic") and isinstance(patch, dict)):
            if mode != "Ignore" and isinstance(patch, dict):
                probe = dict(patch)
                probe.setdefault("apiVersion", t.res.api_version)
                probe.setdefault("kind", t.res.kind)
                if kind == "strategic":
                    probe = _strip_directives(probe)
                with _patch_type_errors(patch):
                    warnings = self._check_fields(request, t.res, probe)
        prune: Any = None
        # A merge or strategic patch adds to the stored object (pruned when it
        # was written) only what its body holds, so the result needs pruning
        # only if the body had unknown fields or was not checked.
        body_clean = (kind in ("merge", "strategic") and mode != "Ignore"
                      and not any(w.startswith('unknown field "') for w in warnings)
                      and not (kind == "strategic" and _odd_directives(patch)))
        if kind == "apply":
            if isinstance(patch, dict):
                # Unknown fields of an applied configuration are neither stored nor owned.
                patch = deep_copy(patch)
                self._check_fields(request, t.res, patch, "Ignore", prune=True)
        elif not body_clean:
            result_warnings: list[str] = []

            def prune(new: Obj) -> None:
                # The patched object is decoded as a whole upstream: what it
                # holds that the schema does not know is dropped too.
                with _patch_type_errors(new if kind == "json" else patch):
                    problems = self._check_fields(request, t.res, new, "Ignore" if kind != "json" else mode,
                                                  prune=True)
                result_warnings[:] = problems
        obj, created = await self.registry.patch(
            t.res, t.name, patch, t.namespace, patch_type=kind, subresource=t.subresource,
            dry_run=_dry_run(q), field_manager=q.get("fieldManager") or _manager_from_agent(request),
            force=force, prune=prune,
        )
        if prune is not None and kind == "json":
            warnings = result_warnings
        return self._respond_object(request, t.res, obj, 201 if created else 200, warnings)

    async def _delete_options(self, request: web.Request) -> Obj:
        body = await self.read_body(request)
        opts: Obj = {}
        if body.strip():
            decoded = codec.decode_body(body, request.headers.get("Content-Type"))
            if not isinstance(decoded, dict):
                raise errors.bad_request(
                    f"json: cannot unmarshal {_json_kind(decoded)} into Go value of type v1.DeleteOptions")
            _check_delete_options(decoded)
            opts = decoded
        q = request.query
        grace = _int_param(q, "gracePeriodSeconds")
        if grace is not None:
            opts["gracePeriodSeconds"] = grace
        if q.get("propagationPolicy"):
            opts["propagationPolicy"] = q["propagationPolicy"]
        orphan = _bool_param(q, "orphanDependents")
        if orphan is not None:
            opts["orphanDependents"] = orphan
        if q.getall("dryRun", []):
            opts["dryRun"] = q.getall("dryRun")
        orphan = opts.pop("orphanDependents", None)
        if orphan is not None:
            if opts.get("propagationPolicy") is not None:
                raise errors.invalid("DeleteOptions", "", [errors.invalid_value(
                    "propagationPolicy", opts["propagationPolicy"],
                    "orphanDependents and deletionPropagation cannot be both set")], group=errors.META_GROUP)
            # Kept for the response code: upstream answers 202 only to a
            # delete that asked for orphanDependents=false explicitly.
            opts[_CASCADE_REQUESTED] = not orphan
            opts["propagationPolicy"] = "Orphan" if orphan else "Background"
        for v in opts.get("dryRun") or []:
            if v != "All":
                raise errors.bad_request(f'dryRun: Unsupported value: "{v}": supported values: "All"')
        return opts

    async def delete(self, request: web.Request, t: Target) -> web.Response:
        opts = await self._delete_options(request)
        obj, finished = await self.registry.delete(
            t.res, t.name, t.namespace,
            grace_period_seconds=opts.get("gracePeriodSeconds"),
            propagation_policy=opts.get("propagationPolicy"),
            preconditions=opts.get("preconditions"),
            dry_run=bool(opts.get("dryRun")),
        )
        # Upstream's delete handler: 200 with the object whenever the object
        # is not gone yet (finalizers, graceful deletion), 202 Accepted only
        # when the client also set orphanDependents=false (kept so for
        # existing clients); propagationPolicy alone never makes it 202.
        accepted = not finished and opts.get(_CASCADE_REQUESTED, False)
        return self._respond_object(request, t.res, obj, 202 if accepted else 200)

    async def delete_collection(self, request: web.Request, t: Target) -> web.Response:
        opts = await self._delete_options(request)
        q = request.query
        result = await self.registry.list(t.res, t.namespace, label_selector=q.get("labelSelector", ""),
                                          field_selector=q.get("fieldSelector", ""))
        deleted = []
        for obj in result["items"]:
            md = obj["metadata"]
            try:
                o, _ = await self.registry.delete(
                    t.res, md["name"], md.get("namespace"),
                    grace_period_seconds=opts.get("gracePeriodSeconds"),
                    propagation_policy=opts.get("propagationPolicy"),
                    dry_run=bool(opts.get("dryRun")),
                    collection=True,
                )
            except StatusError as err:
                if err.code == 404:
                    continue
                raise
            deleted.append(obj)
        return json_response({"kind": t.res.list_kind, "apiVersion": t.res.api_version,
                              "metadata": {"resourceVersion": str(self.registry.store.revision)}, "items": deleted})

    async def bind(self, request: web.Request, t: Target) -> web.Response:
        body = await self.read_body(request)
        binding = codec.decode_body(body, request.headers.get("Content-Type"))
        status = await self.registry.bind(t.name, t.namespace, binding, dry_run=_dry_run(request.query))
        return json_response(status, 201)

    async def evict(self, request: web.Request, t: Target) -> web.Response:
        from kubeplane.registry.eviction import evict

        body = await self.read_body(request)
        eviction = codec.decode_body(body, request.headers.get("Content-Type"))
        status, code = await evict(self.registry, t.name, t.namespace, eviction, dry_run=_dry_run(request.query))
        return json_response(status, code)

    async def pod_log(self, request: web.Request, t: Target) -> web.StreamResponse:
        from kubeplane.apiserver import nodeproxy

        pod = await self.registry.get(t.res, t.name, t.namespace)
        container = nodeproxy.pick_container(pod, request.query.get("container"))
        _validate_log_options(request.query, t.name)
        node = await self._pod_node(pod)
        if node is None or nodeproxy.is_simulated(node):
            # Not on a node yet (upstream answers no location: nothing), or on a
            # simulated node, which runs no processes: there is no output to show.
            return web.Response(text="", content_type="text/plain")
        host, port = nodeproxy.kubelet_address(node)
        return await nodeproxy.stream_logs(request, self.kubelet, host, port, pod, container)

    async def _pod_node(self, pod: Obj) -> Obj | None:
        from kubeplane.api.resources import resource

        node_name = (pod.get("spec") or {}).get("nodeName")
        if not node_name:
            return None
        return await self.registry.get(resource("nodes"), node_name, None)

    async def pod_connect(self, request: web.Request, t: Target, sub: str) -> web.StreamResponse:
        """pods/exec, pods/attach and pods/portforward: relayed to the node's kubelet."""
        from kubeplane.apiserver import nodeproxy

        if request.method != "POST" and not isinstance(self.authorizer, AlwaysAllow) and self.authorizer is not None:
            # as upstream (AuthorizePodWebsocketUpgradeCreatePermission): a WebSocket
            # upgrade (a GET) needs the create permission a POST needs
            from kubeplane.apiserver.authorization import check
            from kubeplane.auth.requestinfo import request_info, to_attributes
            from kubeplane.auth.user import current_user

            check(self.authorizer, to_attributes(current_user(), request_info("POST", request.path, request.query)))
        q = request.query
        pod = await self.registry.get(t.res, t.name, t.namespace)
        meta = pod.get("metadata") or {}
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        params: list[tuple[str, str]] = []
        if sub == "portforward":
            ports = []
            for value in q.getall("ports", []):
                for part in value.split(","):
                    part = part.strip()
                    if not part.isdigit() or not 0 < int(part) < 65536:
                        raise errors.bad_request(f"invalid port {part!r}: ports must be in the range 1-65535")
                    ports.append(part)
            if ports:
                params.append(("port", ",".join(ports)))
            path = "/portForward/{}/{}".format(*(quote(x, safe="") for x in (ns, name)))
        else:
            container = nodeproxy.pick_container(pod, q.get("container"))
            flags = {k: _bool_param(q, k) for k in ("stdin", "stdout", "stderr", "tty")}
            if sub == "exec":
                command = q.getall("command", [])
                if not command:
                    raise errors.bad_request("you must specify at least 1 command")
                params += [("command", c) for c in command]
            for option, kubelet_param in (("stdin", "input"), ("stdout", "output"), ("stderr", "error"),
                                          ("tty", "tty")):
                if flags[option]:
                    params.append((kubelet_param, "1"))
            if not (flags["stdin"] or flags["stdout"] or flags["stderr"]):
                raise errors.bad_request("you must specify at least 1 of stdin, stdout, stderr")
            path = "/{}/{}/{}/{}".format(sub, *(quote(x, safe="") for x in (ns, name, container)))
        node_name = (pod.get("spec") or {}).get("nodeName")
        if not node_name:
            raise errors.bad_request(f"pod {name} does not have a host assigned")
        node = await self._pod_node(pod)
        assert node is not None
        if nodeproxy.is_simulated(node):
            raise errors.bad_request(f"pod {name} is on the simulated node {node_name}, which runs no containers")
        host, port = nodeproxy.kubelet_address(node)
        if sub == "portforward":
            spdy_opts = nodeproxy.SpdyOptions(port_forward=True)
        else:
            spdy_opts = nodeproxy.SpdyOptions(**{k: bool(v) for k, v in flags.items()})
        return await nodeproxy.relay_websocket(request, self.kubelet, host, port, path, params, name, spdy_opts)
    async def scale(self, request: web.Request, t: Target) -> web.Response:
        m = request.method
        if m == "GET":
            return json_response(await self.registry.get_scale(t.res, t.name, t.namespace))
        if m not in ("PUT", "PATCH"):
            raise errors.method_not_allowed("the server does not allow this method on the requested resource")
        body = await self.read_body(request)
        if m == "PUT":
            scale = codec.decode_body(body, request.headers.get("Content-Type"))

            def scale_of(_current: Obj) -> Obj:
                return scale
        else:
            from kubeplane.api import patch as patching

            kind, patch = codec.decode_patch(body, request.headers.get("Content-Type"))

            def scale_of(current: Obj) -> Obj:
                if kind == "json":
                    return patching.json_patch(current, patch)
                if kind in ("merge", "strategic", "apply"):
                    if not isinstance(patch, dict):
                        raise errors.bad_request("patch must be a JSON object")
                    return patching.merge_patch(current, patch)
                raise errors.unsupported_media_type(kind, list(codec.PATCH_TYPES))
        result = await self.registry.update_scale(t.res, t.name, t.namespace, scale_of,
                                                  dry_run=_dry_run(request.query))
        return json_response(result)

    async def watch(self, request: web.Request, t: Target, single: str | None = None) -> web.StreamResponse:
        q = request.query
        field_selector = q.get("fieldSelector", "")
        if single:
            extra = f"metadata.name={single}"
            field_selector = f"{field_selector},{extra}" if field_selector else extra
        timeout = _int_param(q, "timeoutSeconds")
        if not timeout and self.min_request_timeout > 0:
            # As upstream: a watch without timeoutSeconds ends after a random
            # time in [min, 2*min] so clients re-watch and spread the load.
            timeout = self.min_request_timeout * (1.0 + random.random())
        send_initial = _bool_param(q, "sendInitialEvents")
        opts = WatchOptions(
            resource_version=q.get("resourceVersion", ""),
            resource_version_match=q.get("resourceVersionMatch", ""),
            label_selector=q.get("labelSelector", ""),
            field_selector=field_selector,
            allow_bookmarks=bool(_bool_param(q, "allowWatchBookmarks")),
            send_initial_events=send_initial,
            timeout_seconds=float(timeout) if timeout else None,
            bookmark_interval=self.watch_bookmark_interval,
            announce_start=True,
            on_overflow=lambda: _close_unresponsive(request),
        )
        table = _wants_table(request)
        if table:
            _include_object(request)  # a bad value is a 400 before streaming, not an ERROR event
        batches = self.registry.watch_batches(t.res, t.namespace, opts)
        try:
            # The registry announces the watch with an empty batch once every
            # error that can come before it (selectors, a version too large)
            # has been raised: those get a Status response of their own.
            # After the headers, an error can only be an ERROR event.
            first = await batches.__anext__()
        except StopAsyncIteration:
            first = []
        except BaseException:
            await batches.aclose()
            raise
        resp = web.StreamResponse(status=200)
        resp.headers["Content-Type"] = TABLE_CONTENT_TYPE if table else "application/json"
        resp.enable_chunked_encoding()
        request[STREAMING_KEY] = resp
        try:
            await resp.prepare(request)
            ended = bool(first) and await self._write_batch(resp, request, t.res, first, table)
            if not ended:
                try:
                    async for batch in batches:
                        if await self._write_batch(resp, request, t.res, batch, table):
                            break
                except StatusError as err:
                    await self._write_batch(resp, request, t.res, [("ERROR", err.to_status())], table)
                except (ConnectionResetError, ConnectionError, asyncio.CancelledError):
                    raise
                except Exception as exc:  # noqa: BLE001 - the stream ends with an ERROR event, not a 2nd response
                    log.exception("watch of %s failed", request.path)
                    await self._write_batch(resp, request, t.res, [("ERROR", errors.internal(
                        f"an error on the server has prevented the request from succeeding: {exc!r}").to_status())],
                        table)
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            await batches.aclose()
        return resp

    async def _write_batch(self, resp: web.StreamResponse, request: web.Request, res: ResourceInfo,
                           batch: list[tuple[str, Obj]], table: bool) -> bool:
        """Writes a burst of events with one socket write; True after an ERROR."""
        await resp.write(b"".join(self._watch_line(request, res, ev, table) for ev in batch))
        if self.metrics is not None:
            self.metrics.watch_event_counter(res).inc(len(batch))
        return any(ev[0] == "ERROR" for ev in batch)

    def _watch_line(self, request: web.Request, res: ResourceInfo, ev: tuple[str, Obj], table: bool) -> bytes:
        typ, obj = ev
        if not table:
            # Every watcher of a change gets the same stored dict: encode it once.
            cached = self._encoded.get(id(obj))
            if cached is not None and cached[0] is obj and cached[1] == typ:
                return cached[2]
            line = self._encode_event(res, typ, obj)
            self._encoded[id(obj)] = (obj, typ, line)
            if len(self._encoded) > 4096:
                self._encoded.popitem(last=False)
            return line
        if typ in ("ADDED", "MODIFIED", "DELETED"):
            obj = self._table(request, res, [obj], {"resourceVersion": obj.get("metadata", {}).get("resourceVersion", "")})
        return orjson.dumps({"type": typ, "object": obj}) + b"\n"

    @staticmethod
    def _encode_event(res: ResourceInfo, typ: str, obj: Obj) -> bytes:
        if typ != "ERROR" and ("kind" not in obj or "apiVersion" not in obj):
            obj = {"apiVersion": res.api_version, "kind": res.kind, **obj}
        return orjson.dumps({"type": typ, "object": obj}) + b"\n"


#: what custom resources are served in and accept (no protobuf: they have no Go types)
_CUSTOM_MEDIA_TYPES = ("application/json", "application/yaml")


def _check_custom_media_types(request: web.Request, method: str) -> None:
    """A protobuf body for a custom resource is a 415 and an Accept header
    naming only protobuf a 406, with upstream's messages."""
    if method in ("POST", "PUT"):
        if codec.media_type(request.headers.get("Content-Type")) == codec.PROTOBUF:
            raise errors.unsupported_media_type(codec.PROTOBUF, list(_CUSTOM_MEDIA_TYPES))
    accept = request.headers.get("Accept", "")
    if not accept:
        return
    for part in accept.split(","):
        mt = part.split(";", 1)[0].strip().lower()
        if mt in ("", "*/*", "application/*", "application/json", "application/yaml", "application/json;stream=watch"):
            return
        if mt.endswith("+json") or mt == "text/yaml":
            return
    raise StatusError(406, "NotAcceptable", "only the following media types are accepted: "
                      + ", ".join(_CUSTOM_MEDIA_TYPES))


def _unmarshal_error(value: Any, struct: str, field: str, go_type: str) -> str:
    kind = _json_kind(value)
    if kind == "number" and go_type == "int64":
        kind = f"number {value}"  # an integer type names the literal it could not hold
    return f"json: cannot unmarshal {kind} into Go struct field {struct}.{field} of type {go_type}"


_INT64 = (-(2**63), 2**63 - 1)

#: DeleteOptions fields with one value: (field, Go type, accepts)
_DELETE_OPTION_FIELDS: tuple[tuple[str, str, Any], ...] = (
    ("gracePeriodSeconds", "int64",
     lambda v: isinstance(v, int) and not isinstance(v, bool) and _INT64[0] <= v <= _INT64[1]),
    ("orphanDependents", "bool", lambda v: isinstance(v, bool)),
    ("propagationPolicy", "v1.DeletionPropagation", lambda v: isinstance(v, str)),
    ("ignoreStoreReadErrorWithClusterBreakingPotential", "bool", lambda v: isinstance(v, bool)),
)


def _check_delete_options(opts: Obj) -> None:
    """A DeleteOptions body with a field of the wrong type is a 400 naming it,
    worded as upstream's JSON decoder words it (never an error deeper in)."""
    for field in ("apiVersion", "kind"):
        v = opts.get(field)
        if v is not None and not isinstance(v, str):
            raise errors.bad_request(
                "couldn't get version/kind; json parse error: " + _unmarshal_error(v, "", field, "string"))
    kind = opts.get("kind")
    if kind not in (None, "", "DeleteOptions"):
        raise errors.bad_request(f'no kind "{kind}" is registered for version "{opts.get("apiVersion") or ""}"')
    for field, go_type, ok in _DELETE_OPTION_FIELDS:
        v = opts.get(field)
        if v is not None and not ok(v):
            raise errors.bad_request(_unmarshal_error(v, "DeleteOptions", field, go_type))
    dry = opts.get("dryRun")
    if dry is not None:
        if not isinstance(dry, list):
            raise errors.bad_request(_unmarshal_error(dry, "DeleteOptions", "dryRun", "[]string"))
        for v in dry:
            if v is not None and not isinstance(v, str):
                raise errors.bad_request(_unmarshal_error(v, "DeleteOptions", "dryRun", "string"))
    pre = opts.get("preconditions")
    if pre is not None:
        if not isinstance(pre, dict):
            raise errors.bad_request(_unmarshal_error(pre, "DeleteOptions", "preconditions", "v1.Preconditions"))
        for field, go_type in (("uid", "types.UID"), ("resourceVersion", "string")):
            v = pre.get(field)
            if v is not None and not isinstance(v, str):
                raise errors.bad_request(_unmarshal_error(v, "Preconditions", f"preconditions.{field}", go_type))


def _include_object(request: web.Request) -> str:
    include = request.query.get("includeObject") or "Metadata"
    if include not in ("None", "Metadata", "Object"):
        raise errors.bad_request(f'includeObject: Unsupported value: "{include}"')
    return include


def _odd_directives(obj: Any) -> bool:
    """Whether a strategic merge patch holds ``$`` keys that are no directive
    (the merge keeps them as fields; the body check does not see them)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k.startswith("$") and k not in ("$patch", "$retainKeys") and not k.startswith(
                    ("$setElementOrder/", "$deleteFromPrimitiveList/")):
                return True
            if isinstance(v, (dict, list)) and _odd_directives(v):
                return True
    elif isinstance(obj, list):
        return any(isinstance(v, (dict, list)) and _odd_directives(v) for v in obj)
    return False


def _close_unresponsive(request: web.Request) -> None:
    """The store dropped a watcher whose backlog passed its bound. If the
    client is not even reading what was already written, the stream cannot
    deliver the 410 that makes it relist: close the connection instead, as
    upstream closes unresponsive watchers (the client re-watches)."""
    transport = request.transport
    if transport is not None and transport.get_write_buffer_size() > 0:
        log.warning("closing the watch %s: the client is not reading its events", request.path_qs)
        transport.abort()


@contextlib.contextmanager
def _patch_type_errors(shown: Any):
    """A patch whose result holds a value of the wrong type is a 422 on the
    field ``patch``, as upstream answers when the patched object does not
    decode (a create or update body gets the decoder's 400 instead). The value
    shown is the patch, or for a JSON patch the patched object."""
    try:
        yield
    except StatusError as err:
        cut = err.message.find(": json: cannot unmarshal ")
        if err.code != 400 or cut < 0:
            raise
        text = orjson.dumps(shown).decode() if not isinstance(shown, str) else shown
        raise errors.invalid("", "", [errors.invalid_value("patch", text, err.message[cut + 2:])]) from None


def _strip_directives(obj: Any) -> Any:
    """Drops strategic-merge-patch directives before checking field names."""
    if isinstance(obj, dict):
        return {k: _strip_directives(v) for k, v in obj.items() if not k.startswith("$")}
    if isinstance(obj, list):
        return [_strip_directives(v) for v in obj]
    return obj


def _manager_from_agent(request: web.Request) -> str:
    """Upstream derives a default field manager from the User-Agent's program name."""
    agent = request.headers.get("User-Agent", "")
    prog = agent.split("/", 1)[0].strip()
    return prog[:128] or "unknown"


def build_app(registry: Registry, catalogue: Catalogue, *, max_body: int = MAX_BODY_BYTES,
              server_address: str = "127.0.0.1:6443", limits: ServingLimits | None = None,
              metrics: "APIServerMetrics | None" = None, authenticator: Any = None,
              authorizer: "Authorizer | None" = None, token_issuer: Any = None,
              kubelet_client: Any = None) -> web.Application:
    """The API server's aiohttp app. With an ``authenticator``
    (:class:`kubeplane.auth.authenticator.RequestAuthenticator`) every request
    is authenticated and may impersonate as ``authorizer`` allows; without one
    every request is the current user (SYSTEM_ADMIN). ``authorizer`` decides
    every request (default: the registry's, which allows everything unless one
    was given to it); the registry answers reviews and escalation checks with
    the same object."""
    from kubeplane.apiserver.authorization import authorization_middleware
    from kubeplane.apiserver.metrics import APIServerMetrics

    limits = limits or ServingLimits()
    h = APIHandler(registry, catalogue, max_body=max_body, server_address=server_address)
    if registry.pruner is None:
        from kubeplane.apiserver import openapi

        # objects patched by admission webhooks are pruned as request bodies are
        registry.pruner = lambda res, obj: openapi.check_fields(obj, res.group, res.version, res.kind, prune=True)
    h.min_request_timeout = limits.min_request_timeout
    if metrics is None:
        metrics = APIServerMetrics(catalogue)
    h.metrics = metrics
    h.authenticator = authenticator
    h.token_issuer = token_issuer
    h.kubelet_client = kubelet_client
    inflight = InflightLimiter(limits.max_requests_inflight, limits.max_mutating_requests_inflight)
    if authorizer is None:
        authorizer = registry.authorizer
    elif isinstance(registry.authorizer, AlwaysAllow):
        registry.authorizer = authorizer  # reviews and escalation checks ask the same authorizer
    h.authorizer = authorizer
    # The metrics middleware is outermost, so it sees every final code (429s
    # and 504s included). aiohttp's own body limit is set above ours so our
    # Status reply is the one sent.
    # Authentication (and impersonation) come after the deadline and before the
    # in-flight limit, authorization after it and before the handlers, as in
    # upstream's filter chain.
    authn_filters = []
    if authenticator is not None:
        from kubeplane.apiserver.authn import authentication_middleware

        authn_filters.append(authentication_middleware(authenticator, authorizer))
    middlewares = [metrics.middleware(), deadline_middleware(limits.request_timeout), *authn_filters,
                   inflight.middleware]
    if not isinstance(authorizer, AlwaysAllow):
        middlewares.append(authorization_middleware(authorizer))
    middlewares.append(h.middleware)
    app = web.Application(middlewares=middlewares,
                          client_max_size=max_body + 1024 * 1024)
    app[HANDLER_KEY] = h

    async def _close_kubelet_client(_app: web.Application) -> None:
        if h.kubelet_client is not None:
            await h.kubelet_client.close()

    app.on_cleanup.append(_close_kubelet_client)
    app[INFLIGHT_KEY] = inflight
    r = app.router
    # Upstream serves these documents from go-restful web services whose one
    # route is "/", so the path with a trailing slash is the same document
    # (kr8s asks for /version/). /api/v1/ and /apis/g/v/ reach the catch-all
    # routes below with an empty rest. Health paths are exact matches
    # upstream: /healthz/ is a 404 there too.
    for path in ("/version", "/version/"):
        r.add_get(path, h.version)
    r.add_get("/metrics", metrics.handle)
    health.add_routes(r, registry.store)
    for path in ("/api", "/api/"):
        r.add_get(path, h.api_root)
    for path in ("/apis", "/apis/"):
        r.add_get(path, h.apis_root)
    r.add_get("/openapi/v3", h.openapi_v3_index)
    r.add_get("/openapi/v3/{path:.+}", h.openapi_v3_doc)
    r.add_get("/openapi/v2", h.openapi_v2)
    r.add_route("*", "/api/{version}", h.core_group_version)
    r.add_route("*", "/api/{version}/{rest:.*}", h.core_group_version)
    r.add_route("*", "/apis/{group}", h.named_group)
    r.add_route("*", "/apis/{group}/", h.named_group)
    r.add_route("*", "/apis/{group}/{version}", h.named_group)
    r.add_route("*", "/apis/{group}/{version}/{rest:.*}", h.named_group)
    return app
