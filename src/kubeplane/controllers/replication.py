"""The ReplicationController manager, after upstream's ``pkg/controller/replication``.

Upstream runs its ReplicaSet controller for ReplicationControllers through
adapters that convert between the two kinds; here the ReplicaSet controller
is parameterised by the kind it manages, and this subclass names core/v1
ReplicationControllers and reads their selector, a plain label set.
"""

from __future__ import annotations

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import resource
from kubeplane.api.selectors import LabelSelector, label_selector_from_dict
from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.interface import Client, Obj
from kubeplane.controllers.replicaset import BURST_REPLICAS, ReplicaSetController

REPLICATIONCONTROLLERS = resource("replicationcontrollers", "")


class ReplicationManager(ReplicaSetController):
    """Keeps ``spec.replicas`` pods running for every ReplicationController."""

    owner_resource = REPLICATIONCONTROLLERS
    owner_api_version = "v1"
    owner_kind = "ReplicationController"
    queue_name = "replicationmanager"

    def __init__(
        self,
        client: Client,
        factory: SharedInformerFactory | None = None,
        *,
        workers: int = 1,
        burst_replicas: int = BURST_REPLICAS,
        name: str = "replication-controller",
    ) -> None:
        super().__init__(client, factory, workers=workers, burst_replicas=burst_replicas, name=name)

    def selector_of(self, owner: Obj) -> LabelSelector:
        """``spec.selector`` as equality requirements; an empty or malformed
        one matches nothing (validation refuses both)."""
        sel = (owner.get("spec") or {}).get("selector")
        if not isinstance(sel, dict) or not sel:
            return label_selector_from_dict(None)
        try:
            return label_selector_from_dict({"matchLabels": sel})
        except StatusError:
            return label_selector_from_dict(None)


__all__ = ["REPLICATIONCONTROLLERS", "ReplicationManager"]
