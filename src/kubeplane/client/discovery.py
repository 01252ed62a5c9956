"""Discovery for controllers that run apart from the API server.

Upstream's controllers learn the served resources from discovery (client-go's
discovery client): the garbage collector re-reads it every 30 s and starts or
stops a monitor per resource, the namespace controller reads it at each sync.
The in-process client hands out the registry's own catalogue; the HTTP client
and the local wire client answer :meth:`discover` instead, a list of
:class:`ResourceInfo` built from the aggregated discovery documents (``/api``
and ``/apis``, apidiscovery.k8s.io/v2). :class:`ServedResources` keeps such a
list up to date with the same reading surface as
:class:`kubeplane.api.resources.Catalogue` (``resources``, lookups,
``subscribe``), re-reading discovery periodically and whenever a
CustomResourceDefinition changes (a watch: faster than the period).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, Catalogue, ResourceInfo, resource

log = logging.getLogger(__name__)

#: what client-go's discovery client asks ``/api`` and ``/apis`` for
AGGREGATED_ACCEPT = (
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
)
#: how often discovery is re-read (upstream's garbage collector: 30 s)
RESYNC_SECONDS = 30.0
#: re-reads after a CustomResourceDefinition event: its versions are served
#: once it is Established, which may follow the event by a moment
CRD_SETTLE_SECONDS = (0.0, 0.5, 2.0)
#: events this close together are answered by one read
COALESCE_SECONDS = 0.02


def resources_from_aggregated(*documents: Any) -> list[ResourceInfo]:
    """The resources an APIGroupDiscoveryList (``/api`` or ``/apis``) lists,
    in order. Entries that cannot be read are skipped (a client must survive
    any answer)."""
    out: list[ResourceInfo] = []
    for doc in documents:
        items = doc.get("items") if isinstance(doc, dict) else None
        for group_doc in items if isinstance(items, list) else ():
            if not isinstance(group_doc, dict):
                continue
            md = group_doc.get("metadata") if isinstance(group_doc.get("metadata"), dict) else {}
            group = md.get("name") or ""
            versions = group_doc.get("versions")
            for version_doc in versions if isinstance(versions, list) else ():
                if not isinstance(version_doc, dict) or not isinstance(version_doc.get("version"), str):
                    continue
                version = version_doc["version"]
                resources = version_doc.get("resources")
                for entry in resources if isinstance(resources, list) else ():
                    info = _resource(group if isinstance(group, str) else "", version, entry)
                    if info is not None:
                        out.append(info)
    return out


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def _resource(group: str, version: str, entry: Any) -> ResourceInfo | None:
    if not isinstance(entry, dict):
        return None
    plural = entry.get("resource")
    kind = (entry.get("responseKind") or {}).get("kind") if isinstance(entry.get("responseKind"), dict) else None
    if not isinstance(plural, str) or not plural or not isinstance(kind, str) or not kind:
        return None
    subresources = tuple(
        s["subresource"] for s in entry.get("subresources") or ()
        if isinstance(s, dict) and isinstance(s.get("subresource"), str)
    ) if isinstance(entry.get("subresources"), list) else ()
    singular = entry.get("singularResource")
    return ResourceInfo(
        group, version, kind, plural,
        singular if isinstance(singular, str) and singular else kind.lower(),
        entry.get("scope") == "Namespaced",
        short_names=_strings(entry.get("shortNames")),
        categories=_strings(entry.get("categories")),
        subresources=subresources,
        verbs=_strings(entry.get("verbs")),
    )


def builtin_keys() -> frozenset[tuple[str, str]]:
    """(group, plural) of every kind kubeplane serves built in."""
    return frozenset(r.key for r in CATALOGUE.builtin)


def is_custom(res: ResourceInfo) -> bool:
    """A resource not built in: served for a CustomResourceDefinition (or,
    against another server, by an aggregated API)."""
    return res.custom is not None or res.key not in _BUILTIN


_BUILTIN = builtin_keys()

CRDS = resource("customresourcedefinitions")


class ServedResources:
    """What a remote server serves, read from discovery and kept current.

    Until the first read it holds the built-in catalogue. ``refresh()`` reads
    discovery once (and tells subscribers when something changed);
    ``start()`` keeps it current: every ``resync`` seconds, and soon after
    any CustomResourceDefinition event.
    """

    def __init__(self, client: Any, *, resync: float = RESYNC_SECONDS,
                 settle: tuple[float, ...] = CRD_SETTLE_SECONDS) -> None:
        self.client = client
        self.resync = resync
        self.settle = settle
        self._catalogue = Catalogue(CATALOGUE.builtin)
        self._subscribers: list[Callable[[], None]] = []
        self._task: asyncio.Task | None = None
        self._crd_informer: Any = None
        self._changed = asyncio.Event()
        self._settler: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        #: True once discovery was read at least once
        self.read = False

    # -- the Catalogue reading surface -------------------------------------

    @property
    def resources(self) -> tuple[ResourceInfo, ...]:
        return self._catalogue.resources

    @property
    def generation(self) -> int:
        return self._catalogue.generation

    def by_gvr(self, group: str, version: str, plural: str) -> ResourceInfo | None:
        return self._catalogue.by_gvr(group, version, plural)

    def by_gvk(self, group: str, version: str, kind: str) -> ResourceInfo | None:
        return self._catalogue.by_gvk(group, version, kind)

    def by_api_version_kind(self, api_version: str, kind: str) -> ResourceInfo | None:
        return self._catalogue.by_api_version_kind(api_version, kind)

    def subscribe(self, fn: Callable[[], None]) -> Callable[[], None]:
        self._subscribers.append(fn)

        def unsubscribe() -> None:
            if fn in self._subscribers:
                self._subscribers.remove(fn)

        return unsubscribe

    # -- reading discovery ---------------------------------------------------

    async def refresh(self) -> bool:
        """Reads discovery; True when the served resources changed. A failed
        read keeps what was known (upstream's controllers carry on with the
        last good discovery) and raises."""
        async with self._lock:
            found = await self.client.discover()
            self.read = True
            if tuple(found) == self._catalogue.resources:
                return False
            catalogue = Catalogue(tuple(found))
            catalogue.generation = self._catalogue.generation + 1
            self._catalogue = catalogue
        for fn in list(self._subscribers):
            try:
                fn()
            except Exception:  # noqa: BLE001 - one subscriber must not stop the others
                log.exception("discovery subscriber failed")
        return True

    async def _refresh_quietly(self) -> None:
        try:
            await self.refresh()
        except StatusError as err:
            log.warning("reading discovery failed: %s", err)
        except (OSError, asyncio.TimeoutError) as err:
            log.warning("reading discovery failed: %s", err)

    async def _loop(self) -> None:
        while True:
            await self._refresh_quietly()
            await asyncio.sleep(self.resync)

    def _kick(self) -> None:
        """A CustomResourceDefinition changed: re-read discovery soon, then a
        few times more while it settles. A burst of events costs one sequence
        of reads (each event starts it over), not one per event."""
        self._changed.set()
        if self._settler is None or self._settler.done():
            self._settler = asyncio.get_running_loop().create_task(self._settle())

    async def _settle(self) -> None:
        pending = list(self.settle)
        while pending or self._changed.is_set():
            delay = pending.pop(0) if pending else 0.0
            if delay > 0 and not self._changed.is_set():
                try:
                    await asyncio.wait_for(self._changed.wait(), delay)
                except asyncio.TimeoutError:
                    pass
            if self._changed.is_set():
                # start over from this (latest) event
                self._changed.clear()
                pending = list(self.settle[1:])
                await asyncio.sleep(COALESCE_SECONDS)
            await self._refresh_quietly()

    async def start(self) -> None:
        """Reads discovery now, then keeps it current until :meth:`stop`."""
        if self._task is not None:
            return
        from kubeplane.client.informer import SharedInformer

        await self._refresh_quietly()
        self._task = asyncio.get_running_loop().create_task(self._loop())
        inf = SharedInformer(self.client, CRDS, None, None, None, 0)
        inf.add_event_handler(lambda _o: self._kick(), lambda _o, _n: self._kick(), lambda _o: self._kick())
        self._crd_informer = inf
        inf.start()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        settler, self._settler = self._settler, None
        if settler is not None:
            settler.cancel()
        inf, self._crd_informer = self._crd_informer, None
        if inf is not None:
            await inf.stop()
        if task is not None:
            try:
                await task
            except asyncio.CancelledError:
                pass


def served_resources(client: Any) -> Any:
    """The served-resources view of ``client``: the registry's own catalogue
    in process, discovery-driven :class:`ServedResources` over HTTP or the
    wire (the same one for every caller with this client), None when the
    client can tell neither."""
    catalogue = getattr(client, "catalogue", None)
    if catalogue is not None:
        return catalogue
    if callable(getattr(client, "discover", None)):
        # one per client: the controllers sharing a client share what it
        # learns (a namespace controller's read at its sync tells the
        # garbage collector too)
        served = getattr(client, _SHARED, None)
        if not isinstance(served, ServedResources):
            served = ServedResources(client)
            setattr(client, _SHARED, served)
        return served
    return None


#: the client attribute holding its ServedResources
_SHARED = "_served_resources"


__all__ = ["CRDS", "ServedResources", "is_custom", "resources_from_aggregated", "served_resources"]
