"""The controllers kubeplane ships, as kube-controller-manager knows them.

Each controller has one :class:`ControllerDef`: upstream's name for it (what
``--controllers`` selects, e.g. ``job-controller``, with the short aliases
upstream also accepts, e.g. ``job``), the ServiceAccount in ``kube-system``
it acts as (upstream's ``--use-service-account-credentials`` identities, whose
``system:controller:<account>`` ClusterRoles the bootstrap policy holds) and
a function that builds it. :func:`select_controllers` reads a
``--controllers`` list as upstream does: ``*`` is every controller that is on
by default, ``name`` turns one on, ``-name`` turns one off.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import resource
from kubeplane.auth.user import AUTHENTICATED, SERVICE_ACCOUNT_PREFIX, SERVICE_ACCOUNTS_GROUP, UserInfo
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.interface import Client

log = logging.getLogger(__name__)

#: where the controllers' ServiceAccounts live, as upstream's
CONTROLLER_NAMESPACE = "kube-system"
SERVICE_ACCOUNTS = resource("serviceaccounts")
#: the lifetime asked for the controllers' tokens, renewed at 80 % of it
TOKEN_EXPIRATION_SECONDS = 3600


@dataclass
class ControllerOptions:
    provisioner_name: str = "kubeplane.io/local"
    #: the namespace controller (off where the API server's process runs it)
    namespace: bool = True
    #: the ServiceAccount controller (off where the API server's process runs it)
    service_accounts: bool = True
    #: the CA bundle published as ``kube-root-ca.crt`` in every namespace
    #: (kube-controller-manager's --root-ca-file); without one the publisher does not run
    root_ca_file: str | None = None
    #: the CA that signs approved CertificateSigningRequests (--cluster-signing-cert-file
    #: and --cluster-signing-key-file); without them the signer does not run
    signing_cert_file: str | None = None
    signing_key_file: str | None = None
    #: the HorizontalPodAutoscaler controller's --horizontal-pod-autoscaler-* flags (seconds; a fraction)
    hpa_sync_period: float = 15.0
    hpa_tolerance: float = 0.1
    hpa_downscale_stabilization: float = 300.0
    hpa_cpu_initialization_period: float = 300.0
    hpa_initial_readiness_delay: float = 30.0
    #: the node lifecycle controller's --node-monitor-grace-period,
    #: --node-startup-grace-period and --node-monitor-period (seconds)
    node_monitor_grace_period: float = 50.0
    node_startup_grace_period: float = 60.0
    node_monitor_period: float = 5.0
    #: the pod garbage collector's --terminated-pod-gc-threshold (0: off)
    terminated_pod_gc_threshold: int = 12500
    #: the node IPAM controller's --allocate-node-cidrs, --cluster-cidr (one CIDR,
    #: or an IPv4 and an IPv6 one comma-separated) and --node-cidr-mask-size[-ipv4|-ipv6]
    #: (0: upstream's default, 24 for IPv4 and 64 for IPv6)
    allocate_node_cidrs: bool = False
    cluster_cidr: str = ""
    node_cidr_mask_size: int = 0
    node_cidr_mask_size_ipv4: int = 0
    node_cidr_mask_size_ipv6: int = 0


Build = Callable[[Client, SharedInformerFactory, ControllerOptions], list[Any]]


@dataclass(frozen=True)
class ControllerDef:
    #: upstream's controller name, as ``--controllers`` takes it
    name: str
    #: the other names upstream accepts for it
    aliases: tuple[str, ...]
    #: the ServiceAccount in kube-system the controller acts as
    account: str
    build: Build
    #: part of ``*`` (upstream leaves a few controllers off unless named)
    enabled_by_default: bool = True

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


def select_controllers(defs: Iterable[ControllerDef], selection: Sequence[str] = ("*",)) -> list[ControllerDef]:
    """The definitions ``selection`` (``--controllers`` items) turns on, in
    ``defs`` order. An item naming no controller is a ValueError."""
    defs = list(defs)
    by_name = {n: d for d in defs for n in d.names}
    on: set[str] = set()
    off: set[str] = set()
    star = False
    for item in selection:
        item = item.strip()
        if not item:
            continue
        if item == "*":
            star = True
            continue
        negated = item.startswith("-")
        name = item[1:] if negated else item
        d = by_name.get(name)
        if d is None:
            raise ValueError(f'"{name}" is not in the list of known controllers')
        (off if negated else on).add(d.name)
    return [d for d in defs
            if d.name not in off and (d.name in on or (star and d.enabled_by_default))]


def controller_user(account: str) -> UserInfo:
    """The identity of the controller acting as ServiceAccount ``account``
    of kube-system, as a token of that account authenticates."""
    return UserInfo(f"{SERVICE_ACCOUNT_PREFIX}{CONTROLLER_NAMESPACE}:{account}",
                    groups=(SERVICE_ACCOUNTS_GROUP, f"{SERVICE_ACCOUNTS_GROUP}:{CONTROLLER_NAMESPACE}", AUTHENTICATED))


class ServiceAccountClients:
    """One HTTP client per controller ServiceAccount, authenticated by a token
    of that account (upstream's ``--use-service-account-credentials``): the
    account is created in kube-system if missing, its token asked of the
    TokenRequest API with the root client's credentials and asked again when
    80 % of its lifetime has passed."""

    def __init__(self, root: Any, *, expiration_seconds: int = TOKEN_EXPIRATION_SECONDS) -> None:
        self.root = root
        self.expiration_seconds = expiration_seconds
        self._clients: dict[str, Any] = {}
        self._renewals: list[asyncio.Task] = []

    async def client_for(self, account: str) -> Any:
        if account in self._clients:
            return self._clients[account]
        from kubeplane.client.http import HttpClient

        await self._ensure_account(account)
        token, lifetime = await self._token(account)
        config = dataclasses.replace(self.root.config, token=token, token_file=None, exec_config=None,
                                     client_cert_file=None, client_key_file=None, client_cert_data=None,
                                     client_key_data=None, username=None, password=None)
        client = HttpClient(config)
        client.set_token(token)
        self._clients[account] = client
        self._renewals.append(asyncio.get_running_loop().create_task(
            self._renew(account, client, lifetime), name=f"token-{account}"))
        return client

    async def _ensure_account(self, account: str) -> None:
        try:
            await self.root.create(SERVICE_ACCOUNTS, {
                "apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": account, "namespace": CONTROLLER_NAMESPACE}}, CONTROLLER_NAMESPACE)
        except StatusError as err:
            if err.code != 409:
                raise

    async def _token(self, account: str) -> tuple[str, float]:
        review = await self.root.create(SERVICE_ACCOUNTS, {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": self.expiration_seconds}},
            CONTROLLER_NAMESPACE, subresource="token", name=account)
        status = review.get("status") or {}
        token = status.get("token")
        if not token:
            raise RuntimeError(f"the TokenRequest for {CONTROLLER_NAMESPACE}/{account} returned no token")
        return token, float(self.expiration_seconds)

    async def _renew(self, account: str, client: Any, lifetime: float) -> None:
        delay = lifetime * 0.8
        while True:
            await asyncio.sleep(delay)
            try:
                token, lifetime = await self._token(account)
            except (StatusError, OSError, RuntimeError, asyncio.TimeoutError) as err:
                log.warning("renewing the token of %s/%s failed (retrying in 10s): %s",
                            CONTROLLER_NAMESPACE, account, err)
                delay = 10.0
                continue
            client.set_token(token)
            delay = lifetime * 0.8

    async def close(self) -> None:
        for task in self._renewals:
            task.cancel()
        await asyncio.gather(*self._renewals, return_exceptions=True)
        self._renewals.clear()
        for client in self._clients.values():
            await client.close()
        self._clients.clear()

    stop = close


def known_controller_names(defs: Iterable[ControllerDef]) -> list[str]:
    return sorted(d.name for d in defs)


__all__ = ["Build", "CONTROLLER_NAMESPACE", "ControllerDef", "ControllerOptions", "ServiceAccountClients",
           "controller_user", "known_controller_names", "select_controllers"]
