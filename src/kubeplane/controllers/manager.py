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

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.interface import Client


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
    #: the node lifecycle controller's --node-monitor-grace-period,
    #: --node-startup-grace-period and --node-monitor-period (seconds)
    node_monitor_grace_period: float = 50.0
    node_startup_grace_period: float = 60.0
    node_monitor_period: float = 5.0
    #: the pod garbage collector's --terminated-pod-gc-threshold (0: off)
    terminated_pod_gc_threshold: int = 12500


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


def known_controller_names(defs: Iterable[ControllerDef]) -> list[str]:
    return sorted(d.name for d in defs)


__all__ = ["Build", "ControllerDef", "ControllerOptions", "known_controller_names", "select_controllers"]
