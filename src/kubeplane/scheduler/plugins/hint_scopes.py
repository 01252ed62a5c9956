"""Hint scopes shared by several plugins (see :class:`~kubeplane.scheduler.framework.hintscope.HintScope`).

:data:`CLAIM_HINT_SCOPE` keys PersistentVolumeClaim add/update events by
``(namespace, claim name)``: the PVC hints of VolumeBinding, VolumeZone,
VolumeRestrictions and NodeVolumeLimits queue only pods naming the claim in
its namespace, so the queue need not ask them about other pods.
"""

from __future__ import annotations

from typing import Any, Mapping

from kubeplane.scheduler.framework.hintscope import HintScope

__all__ = ["CLAIM_HINT_SCOPE", "claim_event_keys", "claim_keys_of_pod"]


def claim_keys_of_pod(pod: Mapping[str, Any]) -> list[tuple[Any, Any]]:
    """``(namespace, claim name)`` for every claim name the PVC hints of the volume
    plugins may test: the union of VolumeBinding's ``pod_claim_names``,
    ``PodInfo.pvc_names`` and VolumeRestrictions' raw ``claimName`` set (which
    holds None for volumes without a claim)."""
    md = pod.get("metadata") or {}
    ns = md.get("namespace") or "default"
    pod_name = md.get("name") or ""
    names: set[Any] = set()
    for vol in (pod.get("spec") or {}).get("volumes") or ():
        pvc = vol.get("persistentVolumeClaim")
        raw = (pvc or {}).get("claimName")
        names.add(raw)
        ephemeral = vol.get("ephemeral") is not None
        if pvc is not None:
            names.add(raw or "")
        elif ephemeral:
            names.add(f"{pod_name}-{vol.get('name') or ''}")
        if ephemeral and not raw:
            names.add(f"{pod_name}-{vol.get('name')}")
    return [(ns, n) for n in names]


def claim_event_keys(old: Any, new: Any) -> list[tuple[Any, Any]]:
    """The claim a PVC add/update concerns (namespace defaulted as the hints do)."""
    if new is None:
        return []
    md = new.get("metadata") or {}
    return [(md.get("namespace") or "default", md.get("name"))]


#: PVC add/update hints (VolumeBinding, VolumeZone, VolumeRestrictions,
#: NodeVolumeLimits) queue only pods naming the claim in its namespace
CLAIM_HINT_SCOPE = HintScope(claim_keys_of_pod, claim_event_keys)
