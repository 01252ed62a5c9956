"""The Service proxy of a node: informers on Services and EndpointSlices feeding one proxier per family.

``kubeplane proxy`` runs a :class:`ServiceProxy` on its own; ``kubeplane
node`` runs one inside the node agent. Stopping it deletes its tables
(unless ``keep_rules_on_stop``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from kubeplane.api.resources import resource
from kubeplane.client.informer import SharedInformerFactory, unwrap_deleted
from kubeplane.proxy.model import INFORMER_LABEL_SELECTOR
from kubeplane.proxy.proxier import Proxier, ProxyConfig
from kubeplane.runtime import cancel_and_wait

log = logging.getLogger(__name__)

SERVICES = resource("services")
ENDPOINT_SLICES = resource("endpointslices", "discovery.k8s.io")
NODES = resource("nodes")
ZONE_LABEL = "topology.kubernetes.io/zone"


class ServiceProxy:
    """``client`` reads Services and EndpointSlices (the node's identity may: see the
    ``kubeplane:node-proxier`` binding); ``nftables_factory(family)`` overrides how nft runs."""

    def __init__(self, client: Any, config: ProxyConfig, *,
                 nftables_factory: Callable[[str], Any] | None = None,
                 informer_factory: SharedInformerFactory | None = None) -> None:
        self.client = client
        self.config = config
        self.proxiers = [Proxier(f, config, nftables=nftables_factory(f) if nftables_factory else None)
                         for f in config.families]
        self._factory = informer_factory
        self._own_factory = informer_factory is None
        self._informers: list[Any] = []
        self._registrations: list[tuple[Any, Any]] = []
        self._tasks: list[asyncio.Task] = []

    def proxier(self, family: str = "ipv4") -> Proxier:
        for p in self.proxiers:
            if p.family == family:
                return p
        raise KeyError(family)

    # -- events, fanned out to every family

    def _on_service(self, svc: dict) -> None:
        for p in self.proxiers:
            p.on_service(svc)

    def _on_service_update(self, old: dict, new: dict) -> None:
        self._on_service(new)

    def _on_service_deleted(self, svc: dict) -> None:
        svc = unwrap_deleted(svc)
        for p in self.proxiers:
            p.on_service_deleted(svc)

    def _on_slice(self, sl: dict) -> None:
        for p in self.proxiers:
            p.on_slice(sl)

    def _on_slice_update(self, old: dict, new: dict) -> None:
        self._on_slice(new)

    def _on_slice_deleted(self, sl: dict) -> None:
        sl = unwrap_deleted(sl)
        for p in self.proxiers:
            p.on_slice_deleted(sl)

    def _on_node(self, node: dict, new: dict | None = None) -> None:
        """Its own Node: the zone label decides which endpoints topology hints give this node."""
        node = new if new is not None else node
        zone = ((node.get("metadata") or {}).get("labels") or {}).get(ZONE_LABEL, "")
        for p in self.proxiers:
            p.set_zone(zone)

    # -- life

    async def start(self, *, sync_timeout: float = 60.0) -> None:
        """Start the informers; once both listed, the first sync runs. Returns after
        it (or after ``sync_timeout`` while it keeps failing: the runner retries)."""
        if self._factory is None:
            self._factory = SharedInformerFactory(self.client)
        services = self._factory.informer_for(SERVICES, label_selector=INFORMER_LABEL_SELECTOR)
        slices = self._factory.informer_for(ENDPOINT_SLICES, label_selector=INFORMER_LABEL_SELECTOR)
        # its own Node, for its zone (upstream's NodeTopologyConfig); the first syncs do not wait for it
        nodes = self._factory.informer_for(NODES, field_selector=f"metadata.name={self.config.node_name}")
        self._informers = [services, slices]
        regs = [services.add_event_handler(self._on_service, self._on_service_update, self._on_service_deleted),
                slices.add_event_handler(self._on_slice, self._on_slice_update, self._on_slice_deleted)]
        node_reg = nodes.add_event_handler(self._on_node, self._on_node, None)
        self._registrations = list(zip(self._informers, regs)) + [(nodes, node_reg)]
        self._factory.start()
        loop = asyncio.get_running_loop()
        for p in self.proxiers:
            self._tasks.append(loop.create_task(p.runner.loop(), name=f"proxy-{p.family}"))
        try:
            for reg in regs:
                if not await reg.wait_for_sync(sync_timeout):
                    raise TimeoutError("Services and EndpointSlices did not sync")
            for p in self.proxiers:
                p.set_initialized()
            for p in self.proxiers:
                try:
                    await asyncio.wait_for(p.synced.wait(), sync_timeout)
                except asyncio.TimeoutError:
                    log.error("proxy (%s): no successful sync yet: %s", p.family, p.last_error)
        except BaseException:
            await self.stop()
            raise
        log.info("proxy for node %s: programming %s", self.config.node_name,
                 ", ".join(f"table {p.nft_family} kube-proxy" for p in self.proxiers))

    async def stop(self) -> None:
        """Stop watching and syncing; delete the tables unless configured to keep them."""
        for inf, reg in self._registrations:
            await inf.remove_event_handler(reg)
        self._registrations = []
        if self._own_factory and self._factory is not None:
            await self._factory.stop()
            self._factory = None
        tasks, self._tasks = self._tasks, []
        await cancel_and_wait(tasks, "proxy task")
        if not self.config.keep_rules_on_stop:
            for p in self.proxiers:
                # a sync may be running: wait for it, then remove what it wrote
                async with p._lock:
                    try:
                        await p.cleanup()
                    except Exception as err:  # noqa: BLE001
                        log.error("deleting table %s kube-proxy failed: %s", p.nft_family, err)
