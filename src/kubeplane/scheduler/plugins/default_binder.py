"""DefaultBinder: bind by POSTing a Binding to the pod's ``binding`` subresource."""

from __future__ import annotations

from kubeplane.api.resources import resource
from kubeplane.scheduler.framework.nodeinfo import PodInfo
from kubeplane.scheduler.framework.plugin import Plugin
from kubeplane.scheduler.framework.types import CycleState, Status


class DefaultBinder(Plugin):
    name = "DefaultBinder"

    async def bind(self, state: CycleState, pod_info: PodInfo, node_name: str) -> Status | None:
        client = self.handle.client
        if client is None:
            return Status.as_status(RuntimeError("no client configured for binding"))
        meta = pod_info.pod.get("metadata") or {}
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"), "uid": meta.get("uid")},
            "target": {"kind": "Node", "name": node_name},
        }
        try:
            await client.create(resource("pods"), binding, meta.get("namespace"),
                                subresource="binding", name=meta.get("name"))
        except Exception as e:  # noqa: BLE001 - any API failure is a binding error
            return Status.as_status(e)
        return None
