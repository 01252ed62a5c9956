"""The API server's Prometheus metrics, with kube-apiserver's (v1.32) names,
labels and buckets, served at ``/metrics``.

Every :class:`APIServerMetrics` owns a ``CollectorRegistry``, so several API
servers in one process (tests) keep separate counts.

The request path is hot: the middleware derives the labels from the path with
string splits and a catalogue lookup (no routing), and keeps one cached pair
of metric children per label set, so a request costs two dictionary lookups
and two child updates. In-flight counts and stored-object counts are read at
scrape time, not maintained per request.
"""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_left
from typing import Any, Awaitable, Callable

from aiohttp import web

from kubeplane.api.resources import CATALOGUE, Catalogue, ResourceInfo

#: kube-apiserver's buckets for apiserver_request_duration_seconds and etcd_request_duration_seconds
REQUEST_DURATION_BUCKETS: tuple[float, ...] = (0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10,
                            15, 20, 30, 45, 60)

COMPONENT = "apiserver"

#: non-resource paths reported with the path as ``subresource``, as upstream
#: reports its health endpoints; other non-resource paths get an empty one
#: (the label set must stay bounded whatever paths clients send)
_NON_RESOURCE_PATHS = frozenset({"/healthz", "/livez", "/readyz", "/version", "/metrics", "/api", "/apis",
                                 "/openapi/v2", "/openapi/v3"})
#: subresources that upstream serves with the CONNECT verb
_CONNECT_SUBRESOURCES = frozenset({"exec", "attach", "portforward", "proxy"})
#: namespace paths whose third segment is a namespace subresource, not a resource
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})
_READONLY_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_TRUE = frozenset({"1", "t", "true"})

#: Called with each ``/metrics`` request before it is answered; raise an
#: aiohttp HTTP exception (403) to refuse it. Authentication does not exist
#: yet, so the default lets everyone read; once requests carry a user, the
#: hook restricts scrapes to the ``system:monitoring`` group as upstream's
#: default RBAC does.
MetricsAuthorizer = Callable[[web.Request], Awaitable[None]]


def _go_float(value: float) -> str:
    from prometheus_client.utils import floatToGoString

    return floatToGoString(value)


class _Histogram:
    """One histogram series: per-bucket counts (the last one is +Inf) and the sum.
    Plain attributes, no lock: every observation happens on the event loop."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(REQUEST_DURATION_BUCKETS) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # bucket i counts values <= bound i: bisect_left finds the first bound >= value
        self.counts[bisect_left(REQUEST_DURATION_BUCKETS, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, float]]:
        out, total = [], 0
        for bound, n in zip((*REQUEST_DURATION_BUCKETS, float("inf")), self.counts):
            total += n
            out.append((_go_float(bound), total))
        return out


class _Counter:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def inc(self, n: int = 1) -> None:
        self.value += n


_REQUEST_LABELS = ["verb", "dry_run", "group", "version", "resource", "subresource", "scope", "component"]


class APIServerMetrics:
    """kube-apiserver's metrics in a registry of their own.

    The series are plain counters and bucket lists updated on the event loop
    (a request costs a dictionary lookup, a bisection and three additions)
    and turned into Prometheus families when scraped."""

    def __init__(self, catalogue: Catalogue = CATALOGUE) -> None:
        self.catalogue = catalogue
        self._registry: Any = None
        #: [readOnly, mutating] requests being served now (long-running watches excluded, as upstream)
        self.inflight = [0, 0]
        self.store: Any = None
        self.authorize: MetricsAuthorizer | None = None
        #: request labels -> (duration histogram, {code: count})
        self._requests: dict[tuple, tuple[_Histogram, dict[int, int]]] = {}
        self._watch_events: dict[ResourceInfo, _Counter] = {}
        self._storage: dict[tuple[str, str], _Histogram] = {}

    @property
    def registry(self) -> Any:
        """The Prometheus registry holding the collector, made at the first
        scrape: prometheus_client is imported only then, which keeps it out
        of the server's start-up."""
        if self._registry is None:
            from prometheus_client import CollectorRegistry

            self._registry = CollectorRegistry(auto_describe=True)
            self._registry.register(_Collector(self))
        return self._registry

    # -- requests ----------------------------------------------------------

    def observe_request(self, labels: tuple, code: int, seconds: float) -> None:
        """One finished request: ``labels`` from :func:`request_labels`."""
        entry = self._requests.get(labels)
        if entry is None:
            entry = self._requests[labels] = (_Histogram(), {})
        hist, codes = entry
        codes[code] = codes.get(code, 0) + 1
        hist.counts[bisect_left(REQUEST_DURATION_BUCKETS, seconds)] += 1
        hist.sum += seconds

    def watch_event_counter(self, res: ResourceInfo) -> _Counter:
        """apiserver_watch_events_total of ``res``: call ``inc(n)`` for n events sent."""
        child = self._watch_events.get(res)
        if child is None:
            child = self._watch_events[res] = _Counter()
        return child

    def storage_timer(self, operation: str, type_label: str) -> _Histogram:
        """etcd_request_duration_seconds of one operation on one resource: call ``observe(seconds)``."""
        child = self._storage.get((operation, type_label))
        if child is None:
            child = self._storage[(operation, type_label)] = _Histogram()
        return child

    # -- exposition --------------------------------------------------------

    def exposition(self, accept: str = "") -> tuple[bytes, str]:
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type

    async def handle(self, request: web.Request) -> web.Response:
        """``GET /metrics``."""
        if self.authorize is not None:
            await self.authorize(request)
        body, content_type = self.exposition(request.headers.get("Accept", ""))
        return web.Response(body=body, headers={"Content-Type": content_type})

    def middleware(self) -> Any:
        """The aiohttp middleware that counts and times every request; put it
        outermost so it sees the status code that is finally sent."""
        catalogue = self.catalogue
        observe = self.observe_request
        inflight = self.inflight
        clock = time.perf_counter

        @web.middleware
        async def metrics_middleware(request: web.Request, handler):
            labels = request_labels(request, catalogue)
            verb = labels[0]
            slot = -1 if verb == "WATCH" or verb == "CONNECT" else (0 if request.method in _READONLY_METHODS else 1)
            if slot >= 0:
                inflight[slot] += 1
            code = 500
            start = clock()
            try:
                resp = await handler(request)
                code = resp.status
                return resp
            except web.HTTPException as exc:
                code = exc.status
                raise
            except asyncio.CancelledError:
                code = 0  # the client went away: no answer was sent, nothing to count
                raise
            finally:
                if slot >= 0:
                    inflight[slot] -= 1
                if code:
                    observe(labels, code, clock() - start)

        return metrics_middleware


class _Collector:
    """Turns the series into Prometheus families when scraped; in-flight
    requests and stored objects are read at that moment."""

    def __init__(self, metrics: APIServerMetrics) -> None:
        self.metrics = metrics

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        m = self.metrics
        requests = CounterMetricFamily(
            "apiserver_request",
            "Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, "
            "scope, component, and HTTP response code.", labels=[*_REQUEST_LABELS, "code"])
        durations = HistogramMetricFamily(
            "apiserver_request_duration_seconds",
            "Response latency distribution in seconds for each verb, dry run value, group, version, resource, "
            "subresource, scope and component.", labels=_REQUEST_LABELS)
        for labels, (hist, codes) in list(m._requests.items()):
            values = [*labels, COMPONENT]
            for code, n in sorted(codes.items()):
                requests.add_metric([*values, str(code)], n)
            durations.add_metric(values, hist.cumulative(), hist.sum)
        yield requests
        yield durations
        inflight = GaugeMetricFamily(
            "apiserver_current_inflight_requests",
            "Number of requests this apiserver is serving now, per request kind (long-running watches excluded).",
            labels=["request_kind"])
        inflight.add_metric(["readOnly"], m.inflight[0])
        inflight.add_metric(["mutating"], m.inflight[1])
        yield inflight
        watch = CounterMetricFamily("apiserver_watch_events", "Number of events sent in watch clients",
                                    labels=["group", "version", "kind"])
        for res, counter in list(m._watch_events.items()):
            watch.add_metric([res.group, res.version, res.kind], counter.value)
        yield watch
        storage = HistogramMetricFamily(
            "etcd_request_duration_seconds", "Etcd request latency in seconds for each operation and object type.",
            labels=["operation", "type"])
        for (operation, type_label), hist in list(m._storage.items()):
            storage.add_metric([operation, type_label], hist.cumulative(), hist.sum)
        yield storage
        count = getattr(m.store, "count", None)
        if count is None:
            return
        objects = GaugeMetricFamily(
            "apiserver_storage_objects", "Number of stored objects at the time of last check split by kind.",
            labels=["resource"])
        seen: set[tuple[str, str]] = set()
        for res in m.catalogue.resources:
            if res.key in seen:
                continue
            seen.add(res.key)
            objects.add_metric([res.qualified], count(res.storage_prefix()))
        yield objects


def request_labels(request: web.Request, catalogue: Catalogue) -> tuple[str, str, str, str, str, str, str]:
    """(verb, dry_run, group, version, resource, subresource, scope) as
    kube-apiserver reports a request: LIST/GET/WATCH for reads, APPLY for
    server-side apply patches, DELETECOLLECTION, CONNECT; scope ``resource``
    for named objects and creates, ``namespace`` or ``cluster`` for
    collections, empty for non-resource paths. Paths that name no served
    resource get empty resource labels, so clients cannot grow the label set."""
    method = request.method
    path = request.path
    parts = path.split("/")
    n = len(parts)
    if n >= 3 and parts[1] == "api":
        group, version, rest = "", parts[2], parts[3:]
    elif n >= 4 and parts[1] == "apis":
        group, version, rest = parts[2], parts[3], parts[4:]
    else:
        return _non_resource(method, path)
    if rest and rest[-1] == "":
        rest = [p for p in rest if p]
    if not rest:
        return _non_resource(method, path)
    watch = False
    if rest[0] == "watch":
        watch = True
        rest = rest[1:]
    namespace = ""
    if len(rest) >= 2 and rest[0] == "namespaces":
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    if not rest or len(rest) > 3:
        return _non_resource(method, path)
    res = catalogue.by_gvr(group, version, rest[0])
    if res is None:
        return _non_resource(method, path)
    name = rest[1] if len(rest) > 1 else ""
    sub = rest[2] if len(rest) > 2 else ""
    if sub and sub not in res.subresources:
        sub = ""
    dry_run = ""
    if request.query_string:
        q = request.query
        if not watch and method == "GET" and q.get("watch", "").lower() in _TRUE:
            watch = True
        values = q.getall("dryRun", ())
        if values:
            dry_run = "All" if all(v == "All" for v in values) else "invalid"
    if method == "GET":
        verb = "WATCH" if watch else ("GET" if name else "LIST")
    elif method == "PATCH":
        ctype = request.headers.get("Content-Type", "")
        verb = "APPLY" if ctype.startswith("application/apply-patch") else "PATCH"
    elif method == "DELETE" and not name:
        verb = "DELETECOLLECTION"
    elif sub in _CONNECT_SUBRESOURCES:
        verb = "CONNECT"
    else:
        verb = method if method in _METHODS else "other"
    if name or method == "POST":
        scope = "resource"
    elif namespace:
        scope = "namespace"
    else:
        scope = "cluster"
    return verb, dry_run, res.group, res.version, res.plural, sub, scope


_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT"})


def _non_resource(method: str, path: str) -> tuple[str, str, str, str, str, str, str]:
    if path in _NON_RESOURCE_PATHS:
        sub = path
    elif path.startswith("/openapi/v3/"):
        sub = "/openapi/v3"
    else:
        sub = ""
    return (method if method in _METHODS else "other"), "", "", "", "", sub, ""


def storage_type(key: str) -> str:
    """The ``type`` label of a storage key ``/registry/<group>/<plural>/...``:
    ``pods`` or ``deployments.apps``, as upstream names resources."""
    if not key.startswith("/registry/"):
        return ""
    i = key.find("/", 10)
    if i < 0:
        return ""
    group = key[10:i]
    j = key.find("/", i + 1)
    plural = key[i + 1:j] if j >= 0 else key[i + 1:]
    return plural if group == "core" else f"{plural}.{group}"


def instrument_store(store: Any, metrics: APIServerMetrics) -> None:
    """Time ``store``'s reads and writes into etcd_request_duration_seconds and
    let ``/metrics`` count its objects. The store's methods are wrapped on the
    instance: the object (its type, its other methods) stays what it was."""
    metrics.store = store
    clock = time.perf_counter

    def timed(operation: str, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        # Keys of one resource share their first three segments (/registry/<group>/<plural>):
        # one histogram child per such head, found with two finds and a dict lookup.
        children: dict[str, Any] = {}

        async def call(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return await fn(*args, **kwargs)
            finally:
                key = args[0] if args else kwargs.get("key", kwargs.get("prefix", ""))
                j = key.find("/", key.find("/", 10) + 1)
                head = key[:j] if j > 0 else key
                child = children.get(head)
                if child is None:
                    child = metrics.storage_timer(operation, storage_type(key))
                    if len(children) < 4096:
                        children[head] = child
                child.observe(clock() - start)

        call.__wrapped__ = fn  # type: ignore[attr-defined]
        call.__doc__ = fn.__doc__
        return call

    for operation in ("get", "list", "create", "update", "delete"):
        fn = getattr(store, operation, None)
        if fn is not None:
            setattr(store, operation, timed(operation, fn))


__all__ = ["APIServerMetrics", "COMPONENT", "MetricsAuthorizer", "REQUEST_DURATION_BUCKETS", "instrument_store",
           "request_labels", "storage_type"]
