"""Running the API server: store + registry + HTTP listener + kubeconfig."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from aiohttp import web

from kubeplane.admission.typecheck import PolicyStatusController
from kubeplane.api.resources import CATALOGUE, Catalogue, resource
from kubeplane.apiserver.metrics import APIServerMetrics, instrument_store
from kubeplane.apiserver.eventttl import DEFAULT_EVENT_TTL, EventExpiry
from kubeplane.apiserver.server import MAX_BODY_BYTES, build_app
from kubeplane.apiserver.serving import BoundedAppRunner, BoundedSockSite, ServingLimits
from kubeplane.registry.admission import default_chain
from kubeplane.registry.registry import Registry
from kubeplane.registry.servicealloc import DEFAULT_NODE_PORT_RANGE, DEFAULT_SERVICE_CIDR, ServiceAllocators
from kubeplane.storage import open_store
from kubeplane.startup import DataDirLock, KubeconfigFile, StartupError, bind_socket, format_address
from kubeplane.apiserver.encryptionconfig import NO_ENCRYPTION, EncryptionConfig, EncryptionConfigError
from kubeplane.apiserver.encryptionconfig import load as load_encryption_config
from kubeplane.storage.transformer import TransformingStore
from kubeplane.storage.memory import DEFAULT_HISTORY_BYTES
from kubeplane.storage.interface import StorageError, Store

log = logging.getLogger("kubeplane.apiserver")


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6); port 0 picks a free port."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--listen must be HOST:PORT, got {listen!r}")
    host = host.strip("[]") or "127.0.0.1"
    p = int(port)
    if not 0 <= p <= 65535:
        raise ValueError(f"port out of range in --listen {listen!r}")
    return host, p


@dataclass
class AuthenticationConfig:
    """Upstream's authentication flags."""

    #: ``--token-auth-file``: static tokens (CSV: token,user,uid,"group1,group2")
    token_auth_file: str | None = None
    #: ``--service-account-key-file``: PEM files of keys verifying ServiceAccount
    #: tokens (default: the signing key's public key)
    service_account_key_files: tuple[str, ...] = ()
    #: ``--service-account-signing-key-file``: the private key TokenRequest signs
    #: with (RSA or ECDSA; default: ``<pki>/sa.key``, made on first start)
    service_account_signing_key_file: str | None = None
    #: ``--service-account-issuer`` (the first one issues)
    service_account_issuers: tuple[str, ...] = ()
    #: ``--api-audiences`` (default: the issuer)
    api_audiences: tuple[str, ...] = ()
    #: ``--anonymous-auth``
    anonymous: bool = True
    #: ``--enable-bootstrap-token-auth`` (on, as kubeadm runs the API server)
    bootstrap_tokens: bool = True


@dataclass
class APIServerConfig:
    data_dir: str = "data"
    listen: str = "127.0.0.1:6443"
    storage: str = "sqlite"
    kubeconfig: str | None = None
    max_body: int = MAX_BODY_BYTES
    #: how many revisions of history watches and lists can reach back into
    history_revisions: int = 10_000
    #: how often the system namespaces are re-created if missing (also at once
    #: when one is deleted)
    system_namespaces_interval: float = 60.0
    #: in-flight, timeout and header limits of the HTTP server
    limits: ServingLimits = field(default_factory=ServingLimits)
    #: lock the data directory even with memory storage (``up`` keeps its kubeconfig there)
    lock_data_dir: bool = False
    #: how many bytes of history (estimated from encoded sizes) are kept
    history_bytes: int = DEFAULT_HISTORY_BYTES
    #: seconds an Event lives after its last write (0: forever)
    event_ttl: float = DEFAULT_EVENT_TTL
    #: upstream's EncryptionConfiguration file (``--encryption-provider-config``):
    #: which resources are encrypted at rest, with which providers and keys
    encryption_provider_config: str | None = None
    #: serve plain HTTP without authentication (loopback addresses only)
    insecure_http: bool = False
    #: ``--tls-cert-file``/``--tls-private-key-file`` (default: a serving
    #: certificate made in ``pki_dir``, signed by the CA there)
    tls_cert_file: str | None = None
    tls_private_key_file: str | None = None
    #: ``--client-ca-file``: CAs client certificates are verified against
    #: (default: the CA in ``pki_dir``)
    client_ca_file: str | None = None
    #: where the generated CA, certificates and keys live (default ``<data_dir>/pki``)
    pki_dir: str | None = None
    #: write kubeconfigs for the scheduler and controllers (their client
    #: certificates) next to the data directory's PKI
    component_kubeconfigs: bool = True
    #: sync the PKI files made to disk (off for a data directory that is
    #: thrown away with the process, as a test's cluster's)
    durable_pki: bool = True
    #: sync the admin kubeconfig to disk before it replaces the old one (off
    #: for a kubeconfig thrown away with the process, as a test's cluster's)
    durable_kubeconfig: bool = True
    authentication: AuthenticationConfig = field(default_factory=AuthenticationConfig)
    #: the ServiceAccount admission plugin (pods run as an existing
    #: ServiceAccount and mount its token); needs the ServiceAccount controller
    service_account_admission: bool = True
    #: upstream's --authorization-mode: "Node,RBAC" (the Node authorizer for
    #: kubelets, then RBAC), "RBAC" alone (nodes hold what bindings grant
    #: them) or "AlwaysAllow"
    authorization_mode: str = "Node,RBAC"
    #: ``--service-cluster-ip-range``: the CIDR Service ClusterIPs come from
    #: (its first address is the ``kubernetes`` Service's)
    service_cluster_ip_range: str = DEFAULT_SERVICE_CIDR
    #: ``--service-node-port-range``: the ports NodePort Services get
    service_node_port_range: str = DEFAULT_NODE_PORT_RANGE
    #: ``--advertise-address``: the address the ``kubernetes`` endpoints list
    #: (default: the listen address, or the host's when that is loopback)
    advertise_address: str | None = None
    #: seconds between two repairs of the ``kubernetes`` Service and its endpoints
    kubernetes_service_interval: float = 10.0
    #: with ``storage="etcd"``: the members, prefix, TLS files and compaction
    #: interval (kubeplane.storage.etcd.EtcdConfig; None: its defaults)
    etcd: Any = None


AUTHORIZATION_MODES = ("RBAC", "Node,RBAC", "AlwaysAllow")


@dataclass
class APIServer:
    """An API server running in this process's event loop."""

    config: APIServerConfig
    store: Store | None = None
    registry: Registry | None = None
    url: str = ""
    metrics: APIServerMetrics | None = None
    #: the resources this server serves: the built-in kinds and its CRDs'
    catalogue: Catalogue | None = None
    #: the authorizer every request is put to (RBACAuthorizer or AlwaysAllow)
    authorizer: Any = None
    #: the RBAC objects, watched (the RBAC authorizer's and the aggregation controller's source)
    policy: Any = None
    #: the Node authorizer's graph of which node uses what (with "Node,RBAC")
    node_graph: Any = None
    _runner: web.AppRunner | None = field(default=None, repr=False)
    _keeper: asyncio.Task | None = field(default=None, repr=False)
    _lock: DataDirLock | None = field(default=None, repr=False)
    _kubeconfig: KubeconfigFile | None = field(default=None, repr=False)
    _event_expiry: EventExpiry | None = field(default=None, repr=False)
    _encryption: EncryptionConfig = field(default=NO_ENCRYPTION, repr=False)
    #: components run in this process over the registry once it is ready and
    #: stopped before it closes, each made by ``make(registry)`` and having
    #: ``start()`` and ``stop()`` (the namespace controller, which callers
    #: above this layer pass in: kubeplane.cluster.namespace_controller)
    in_process: list[Callable[[Registry], Any]] = field(default_factory=list)
    _started: list[Any] = field(default_factory=list, repr=False)
    #: the TLS material and authenticator, once started (None with insecure_http)
    security: "Security | None" = None

    async def start(self) -> None:
        """Lock the data directory, open the store, bind, serve; then write the
        kubeconfig. Raises :class:`~kubeplane.startup.StartupError` (a one-line
        reason) when the directory is in use or the address cannot be bound."""
        cfg = self.config
        host, port = parse_listen(cfg.listen)
        self._encryption = NO_ENCRYPTION
        if cfg.encryption_provider_config:
            try:
                self._encryption = load_encryption_config(cfg.encryption_provider_config)
            except EncryptionConfigError as exc:
                raise StartupError(str(exc)) from None
        if cfg.storage == "sqlite" or cfg.lock_data_dir:
            # One server per data directory: a second one would hand out the
            # same resourceVersions and replace the first one's kubeconfig.
            self._lock = DataDirLock(cfg.data_dir)
            self._lock.acquire()
            if cfg.kubeconfig:
                # A kubeconfig a killed server left must not look ready until this one is.
                KubeconfigFile(cfg.kubeconfig).remove_stale()
        try:
            await self._start(host, port)
        except BaseException:
            await self.stop()
            raise

    async def _start(self, host: str, port: int) -> None:
        from kubeplane.startup import StartupError

        if self.config.insecure_http and not _is_loopback(host):
            raise StartupError(f"--insecure-http serves without authentication and is allowed on loopback "
                               f"addresses only, not {host}")
        sock = bind_socket(host, port)  # before opening the store: a busy port fails fast
        try:
            await self._serve(sock, host)
        except BaseException:
            sock.close()
            raise

    async def _serve(self, sock, host: str) -> None:
        cfg = self.config
        try:
            backend = await open_store(cfg.storage, cfg.data_dir if cfg.storage == "sqlite" else None,
                                       history=cfg.history_revisions, history_bytes=cfg.history_bytes,
                                       etcd=cfg.etcd)
        except StorageError as exc:
            if cfg.storage != "etcd":
                raise
            raise StartupError(str(exc)) from None
        # Values pass the encryption transformers on their way to and from the backend
        # (without a file too: then an encrypted value left by an earlier run fails to read).
        self.store = TransformingStore(backend, self._encryption.transformer_for)
        self.metrics = APIServerMetrics()
        instrument_store(self.store, self.metrics)
        self.authorizer = await self._start_policy(cfg.authorization_mode)
        # a catalogue of this server's own: the custom resources it serves
        self.catalogue = CATALOGUE.copy()
        try:
            allocators = ServiceAllocators(self.store, cfg.service_cluster_ip_range, cfg.service_node_port_range,
                                           prefix=resource("services").storage_prefix())
        except ValueError as exc:
            raise StartupError(str(exc)) from None
        self.registry = Registry(self.store, self.catalogue, admission=default_chain(
            self.store, self.authorizer, service_accounts=cfg.service_account_admission),
            authorizer=self.authorizer, service_allocators=allocators)
        await ensure_default_namespaces(self.registry)
        from kubeplane.registry.policyadmission import ensure_system_priority_classes

        await ensure_system_priority_classes(self.registry)
        await self._bootstrap_policy()
        # the type checking of ValidatingAdmissionPolicies runs in the API server, as upstream's
        policy_status = PolicyStatusController(self.registry)
        await policy_status.start()
        self._started.append(policy_status)
        from kubeplane.registry.crd import CRDController

        crd_controller = CRDController(self.registry)
        await crd_controller.start()
        self._started.append(crd_controller)
        for make in self.in_process:
            component = make(self.registry)
            await component.start()
            self._started.append(component)
        self._keeper = asyncio.get_running_loop().create_task(
            keep_system_namespaces(self.registry, cfg.system_namespaces_interval))
        if cfg.event_ttl > 0:
            self._event_expiry = EventExpiry(self.store, cfg.event_ttl)
            self._event_expiry.start()
        bound_port = sock.getsockname()[1]
        address = format_address(host, bound_port)
        ssl_context = None
        auth_kw: dict[str, Any] = {}
        if not cfg.insecure_http:
            from kubeplane.apiserver.security import Security

            self.security = Security.load(cfg, host, self.registry)
            ssl_context = self.security.ssl_context
            auth_kw = {"authenticator": self.security.authenticator, "token_issuer": self.security.issuer}
            from kubeplane.apiserver.nodeproxy import KubeletClient

            auth_kw["kubelet_client"] = KubeletClient(self.security.kubelet_client_files)
        app = build_app(self.registry, self.catalogue, max_body=cfg.max_body, server_address=address,
                        limits=cfg.limits, metrics=self.metrics, authorizer=self.authorizer, **auth_kw)
        self._runner = BoundedAppRunner(app, cfg.limits, access_log=None, handle_signals=False,
                                        shutdown_timeout=1.0)
        await self._runner.setup()
        site = BoundedSockSite(self._runner, sock, ssl_context=ssl_context,
                               handshake_timeout=cfg.limits.header_timeout)
        await site.start()
        # listening on every address: clients are told the advertised one (which the serving
        # certificate covers), as kubeadm's kubeconfigs name the advertise address
        self.url = f"{'https' if ssl_context is not None else 'http'}://{self._client_address(host, bound_port)}"
        await self._start_kubernetes_service(host, bound_port)
        if self.security is not None and cfg.component_kubeconfigs:
            self.security.write_component_kubeconfigs(self.url)
        if self.security is not None and self.security.server_ca_pem:
            await self._publish_cluster_info(host, bound_port)
        if cfg.kubeconfig:
            self._kubeconfig = KubeconfigFile(cfg.kubeconfig, durable=cfg.durable_kubeconfig)
            self._kubeconfig.publish(self.url, **self.admin_credentials())
        log.info("API server listening on %s (storage %s)", self.url, cfg.storage)

    async def _start_kubernetes_service(self, host: str, port: int) -> None:
        from kubeplane.apiserver.kubernetesservice import KubernetesService, advertise_address

        cfg = self.config
        public_ip = advertise_address(cfg.advertise_address, host)
        keeper = KubernetesService(self.registry, service_ip=self.registry.service_allocators.kubernetes_service_ip,
                                   port=port, public_ip=public_ip, interval=cfg.kubernetes_service_interval)
        await keeper.start()
        self._started.append(keeper)

    def _client_address(self, host: str, port: int) -> str:
        """HOST:PORT clients reach this server at: the listen address, or when
        that is every address, the advertised one (loopback if the host has none)."""
        import ipaddress

        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return format_address(host, port)
        if not ip.is_unspecified:
            return format_address(host, port)
        from kubeplane.apiserver.kubernetesservice import advertise_address

        public = advertise_address(self.config.advertise_address, host)
        return format_address(public or ("::1" if ip.version == 6 else "127.0.0.1"), port)

    async def _publish_cluster_info(self, host: str, port: int) -> None:
        """kube-public/cluster-info for token discovery: this server's URL (its
        advertised address when it listens on every address) and CA."""
        from kubeplane.apiserver.clusterinfo import publish_cluster_info

        ca = self.security.server_ca_pem
        await publish_cluster_info(self.registry, self.url, ca.encode() if isinstance(ca, str) else ca)

    def admin_credentials(self) -> dict[str, Any]:
        """What a kubeconfig for the cluster's admin carries (keyword
        arguments of :func:`kubeplane.client.kubeconfig.write_kubeconfig`)."""
        if self.security is None:
            return {}
        return self.security.admin_credentials()

    async def _start_policy(self, mode: str) -> Any:
        from kubeplane.auth.authorizer import AlwaysAllow
        from kubeplane.auth.rbac import PolicyCache, RBACAuthorizer

        if mode not in AUTHORIZATION_MODES:
            raise ValueError(f"unsupported --authorization-mode {mode!r}: one of {', '.join(AUTHORIZATION_MODES)}")
        self.policy = PolicyCache(self.store)
        await self.policy.start()
        self._started.append(self.policy)
        if mode == "AlwaysAllow":
            return AlwaysAllow()
        rbac = RBACAuthorizer(self.policy)
        if mode == "RBAC":
            return rbac
        from kubeplane.apiserver.bootstrappolicy import node_rules
        from kubeplane.auth.node import NodeAuthorizer, NodeGraph, UnionAuthorizer

        self.node_graph = NodeGraph(self.store)
        await self.node_graph.start()
        self._started.append(self.node_graph)
        return UnionAuthorizer(NodeAuthorizer(self.node_graph, node_rules()), rbac)

    async def _bootstrap_policy(self) -> None:
        """Upstream's bootstrap roles and bindings, and the aggregation of ClusterRoles."""
        from kubeplane.apiserver.bootstrappolicy import reconcile
        from kubeplane.apiserver.clusterroleaggregation import ClusterRoleAggregator

        await reconcile(self.registry)
        aggregator = ClusterRoleAggregator(self.registry, self.policy)
        await aggregator.start()
        self._started.append(aggregator)

    async def stop(self) -> None:
        if self._kubeconfig is not None:
            self._kubeconfig.withdraw()  # first: a kubeconfig must not name a stopping server
            self._kubeconfig = None
        while self._started:
            try:
                await self._started.pop().stop()
            except Exception:  # noqa: BLE001 - keep stopping the rest
                log.exception("stopping an in-process component failed")
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
            self._keeper = None
        if self._event_expiry is not None:
            await self._event_expiry.stop()
            self._event_expiry = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.registry is not None:
            await self.registry.close()
        if self.store is not None:
            await self.store.close()
            self.store = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


if TYPE_CHECKING:
    from kubeplane.apiserver.security import Security


#: namespaces the API server keeps in existence, as upstream's system
#: namespaces controller (and, for ``default``, its kubernetes service controller) do
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


async def ensure_default_namespaces(registry: Registry, catalogue: Catalogue = CATALOGUE) -> None:
    """Creates ``default``, ``kube-system``, ``kube-public`` and ``kube-node-lease`` if missing."""
    from kubeplane.api.errors import StatusError
    from kubeplane.api.resources import resource

    ns = resource("namespaces")
    for name in SYSTEM_NAMESPACES:
        try:
            await registry.create(ns, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        except StatusError as err:
            if err.code != 409:
                raise


async def keep_system_namespaces(registry: Registry, interval: float = 60.0) -> None:
    """Re-creates missing system namespaces, forever: every ``interval`` seconds,
    and at once when the store reports one deleted (a watch on namespaces).

    Without it a namespace gone from storage stays gone, and every create in it
    is a 404 until a restart.
    """
    from kubeplane.api.resources import resource
    from kubeplane.storage.interface import StorageError

    store = registry.store
    prefix = resource("namespaces").storage_prefix()
    watched = {prefix + name for name in SYSTEM_NAMESPACES}
    loop = asyncio.get_running_loop()
    watch = None
    try:
        while True:
            if watch is None:
                try:
                    # opened before the check, so no deletion after it goes unseen
                    watch = store.watch(prefix, store.revision)
                except StorageError as exc:
                    log.warning("cannot watch namespaces: %s", exc)
            try:
                await ensure_default_namespaces(registry)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep trying; the next round may succeed
                log.warning("re-creating the system namespaces failed: %s", exc)
            deadline = loop.time() + interval
            while (left := deadline - loop.time()) > 0:
                if watch is None:
                    await asyncio.sleep(left)
                    break
                try:
                    events = await watch.next_batch(left)
                except StorageError:
                    watch.close()  # fell behind: check now, watch again
                    watch = None
                    break
                if events is None:  # the watch was closed (the store is closing)
                    watch.close()
                    watch = None
                    await asyncio.sleep(max(0.0, deadline - loop.time()))
                    break
                if any(ev.type == "DELETED" and ev.key in watched for ev in events):
                    break
    finally:
        if watch is not None:
            watch.close()


async def serve_forever(server: APIServer, stop: asyncio.Event) -> None:
    await server.start()
    try:
        await stop.wait()
    finally:
        await server.stop()
