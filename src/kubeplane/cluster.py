"""Assembling the control-plane components, in one process or separately.

``kubeplane up`` runs everything over the in-process client; ``kubeplane
scheduler``, ``controllers`` and ``nodes`` run one part each over HTTP (any
Kubernetes API server), which is how kubeplane uses more than one core.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from kubeplane.client.informer import SharedInformerFactory
from kubeplane.client.interface import Client

log = logging.getLogger("kubeplane")


@dataclass
class ControllerOptions:
    provisioner_name: str = "kubeplane.io/local"


def build_controllers(client: Client, factory: SharedInformerFactory, opts: ControllerOptions) -> list[Any]:
    """Every controller kubeplane ships, sharing one informer factory."""
    from kubeplane.controllers.deployment import DeploymentController
    from kubeplane.controllers.garbagecollector import GarbageCollector
    from kubeplane.controllers.pv.binder import PersistentVolumeController
    from kubeplane.controllers.pv.provisioner import LocalProvisioner
    from kubeplane.controllers.replicaset import ReplicaSetController
    from kubeplane.controllers.resourceclaim import ResourceClaimController

    return [
        PersistentVolumeController(client, factory),
        LocalProvisioner(client, factory, provisioner_name=opts.provisioner_name),
        ResourceClaimController(client, factory),
        ReplicaSetController(client, factory),
        DeploymentController(client, factory),
        GarbageCollector(client, factory),
    ]


@dataclass
class Components:
    """Started components, stopped in reverse order."""

    items: list[Any] = field(default_factory=list)
    tasks: list[asyncio.Task] = field(default_factory=list)

    async def start(self, component: Any) -> None:
        await component.start()
        self.items.append(component)

    def run(self, coro, name: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.append(task)
        return task

    async def stop(self) -> None:
        for component in reversed(self.items):
            try:
                await component.stop()
            except Exception:  # noqa: BLE001 - keep stopping the rest
                log.exception("stopping %s failed", type(component).__name__)
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
