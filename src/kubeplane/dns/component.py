"""The cluster DNS component: informers, records, server and the kube-dns Service.

``kubeplane up`` runs it over the in-process client; ``kubeplane dns`` over
HTTP with a kubeconfig. It reads Services, EndpointSlices and Namespaces
(and Pods with ``pods="verified"``) through shared informers, serves once
their first lists are in (or after ``sync_timeout``, answering from what has
arrived), and forwards names outside the cluster domain to the nameservers of
``resolv_conf``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from kubeplane.api.resources import resource
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.dns.kubedns import KubeDNSService, endpoint_address
from kubeplane.dns.records import DEFAULT_TTL, ClusterRecords
from kubeplane.dns.resolvconf import read_resolv_conf
from kubeplane.dns.server import DNSServer, Forwarder

log = logging.getLogger("kubeplane.dns")

#: where ``kubeplane up`` serves DNS unless told otherwise: loopback, a port
#: that needs no privilege (kube-dns's old port)
DEFAULT_LISTEN = "127.0.0.1:10053"


@dataclass
class DNSConfig:
    #: HOST:PORT of UDP and TCP (port 0: a free one)
    listen: str = DEFAULT_LISTEN
    cluster_domain: str = "cluster.local"
    #: the kube-dns Service's ClusterIP; None: no Service is kept
    service_ip: str | None = "10.96.0.10"
    #: the address the kube-dns endpoints list (default: from the listen address)
    advertise_address: str | None = None
    #: the upstream resolvers' file, and the port they are asked on
    resolv_conf: str = "/etc/resolv.conf"
    upstream_port: int = 53
    forward_timeout: float = 2.0
    ttl: int = DEFAULT_TTL
    #: CoreDNS's ``pods`` option: insecure, verified or disabled
    pods: str = "insecure"
    service_interval: float = 10.0
    sync_timeout: float = 30.0
    max_tcp: int = 128
    #: HOST:PORT of /metrics (CoreDNS's names) and /healthz; empty: none
    metrics_listen: str = ""


class ClusterDNS:
    """The DNS server of a cluster, as a component (``start``/``stop``)."""

    def __init__(self, client: Any, config: DNSConfig | None = None,
                 factory: SharedInformerFactory | None = None) -> None:
        self.client = client
        self.config = config or DNSConfig()
        self._own_factory = factory is None
        self.factory = factory or SharedInformerFactory(client)
        self.records: ClusterRecords | None = None
        self.server: DNSServer | None = None
        self.keeper: KubeDNSService | None = None
        self.metrics: Any = None

    @property
    def host(self) -> str:
        return self.server.host if self.server else ""

    @property
    def port(self) -> int:
        return self.server.port if self.server else 0

    async def start(self) -> None:
        """Start everything; on a failure (a busy address: StartupError) what
        was started is stopped again."""
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        from kubeplane.apiserver.app import parse_listen

        cfg = self.config
        host, port = parse_listen(cfg.listen)
        f = self.factory
        services = f.informer_for(resource("services"))
        slices = f.informer_for(resource("endpointslices"))
        namespaces = f.informer_for(resource("namespaces"))
        pods = f.informer_for(resource("pods")) if cfg.pods == "verified" else None
        self.records = ClusterRecords(
            services.indexer, slices.indexer, namespaces=namespaces.indexer,
            pods=pods.indexer if pods is not None else None, zone=cfg.cluster_domain, ttl=cfg.ttl,
            pod_mode=cfg.pods, dns_ips=[cfg.service_ip] if cfg.service_ip else [])
        f.start()
        synced = await f.wait_for_cache_sync(cfg.sync_timeout)
        if not all(synced.values()):
            log.warning("DNS: not every informer synced within %gs; serving what has arrived", cfg.sync_timeout)
        upstreams = read_resolv_conf(cfg.resolv_conf).nameservers
        server = DNSServer(self.records, host, port, max_tcp=cfg.max_tcp)
        await server.start()
        self.server = server
        # never forward to this server itself (a resolv.conf naming it would loop)
        servers = [(ip, cfg.upstream_port) for ip in upstreams if not _is_self(ip, cfg.upstream_port, server)]
        if not servers:
            log.warning("DNS: no nameserver in %s: names outside %s are answered SERVFAIL", cfg.resolv_conf,
                        cfg.cluster_domain)
        server.forwarder = Forwarder(servers, timeout=cfg.forward_timeout)
        metrics_port = None
        if cfg.metrics_listen:
            metrics_port = await self._start_metrics(cfg.metrics_listen)
        if cfg.service_ip:
            self.keeper = KubeDNSService(self.client, service_ip=cfg.service_ip, port=server.port,
                                         address=endpoint_address(server.host, cfg.advertise_address),
                                         interval=cfg.service_interval, metrics_port=metrics_port)
            await self.keeper.start()
            if self.keeper.cluster_ip and self.keeper.cluster_ip != cfg.service_ip:
                self.records.dns_ips = [self.keeper.cluster_ip]

    async def _start_metrics(self, listen: str) -> int | None:
        """Serve /metrics; the port the kube-dns endpoints list for it (None
        when it is served at another address than DNS)."""
        import ipaddress

        from prometheus_client import CollectorRegistry

        from kubeplane.apiserver.app import parse_listen
        from kubeplane.cluster import Exposition, MetricsServer
        from kubeplane.dns.metrics import DNSCollector
        from kubeplane.scheduler.metrics import metrics_app

        registry = CollectorRegistry(auto_describe=False)
        registry.register(DNSCollector(lambda: self.server))
        self.metrics = MetricsServer(metrics_app(Exposition(registry), health_check=lambda: self.server is not None),
                                     listen, "DNS metrics")
        await self.metrics.start()
        host, _ = parse_listen(listen)
        port = int(self.metrics.url.rsplit(":", 1)[1])
        dns_host = self.server.host if self.server is not None else ""
        try:
            same = host == dns_host or ipaddress.ip_address(host).is_unspecified
        except ValueError:
            same = False
        return port if same else None

    async def stop(self) -> None:
        if self.metrics is not None:
            await self.metrics.stop()
            self.metrics = None
        if self.keeper is not None:
            await self.keeper.stop()
            self.keeper = None
        if self.server is not None:
            await self.server.stop()
            self.server = None
        if self._own_factory:
            await self.factory.stop()


def _is_self(ip: str, port: int, server: DNSServer) -> bool:
    """Whether ``ip:port`` reaches ``server`` (its address, or on every
    address one of the loopback ones)."""
    import ipaddress

    if port != server.port:
        return False
    if ip == server.host:
        return True
    try:
        return ipaddress.ip_address(server.host).is_unspecified and ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False
