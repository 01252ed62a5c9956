"""The DefaultTolerationSeconds admission plugin, after upstream's
``plugin/pkg/admission/defaulttolerationseconds``.

Every pod written (create and update, not its subresources) that does not
already tolerate the ``node.kubernetes.io/not-ready`` or
``node.kubernetes.io/unreachable`` NoExecute taint gets a toleration for it
with ``tolerationSeconds`` 300 (the API server's
``--default-not-ready-toleration-seconds`` and
``--default-unreachable-toleration-seconds``): when its node stops being
Ready, the taint-eviction controller deletes it five minutes later rather
than at once. A toleration with an empty key (tolerating every taint) or an
empty effect (every effect) counts as tolerating.
"""

from __future__ import annotations

from kubeplane.api.resources import ResourceInfo
from kubeplane.registry.admission import CREATE, UPDATE, AdmissionPlugin, Attributes

NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
DEFAULT_TOLERATION_SECONDS = 300


def _tolerates(tolerations: list, key: str) -> bool:
    for t in tolerations:
        if not isinstance(t, dict):
            continue
        if (t.get("key") or "") in (key, "") and (t.get("effect") or "") in ("NoExecute", ""):
            return True
    return False


class DefaultTolerationSeconds(AdmissionPlugin):
    name = "DefaultTolerationSeconds"

    def __init__(self, not_ready_seconds: int = DEFAULT_TOLERATION_SECONDS,
                 unreachable_seconds: int = DEFAULT_TOLERATION_SECONDS) -> None:
        self.seconds = {NOT_READY_TAINT: not_ready_seconds, UNREACHABLE_TAINT: unreachable_seconds}

    def handles(self, operation: str, res: ResourceInfo) -> bool:
        return operation in (CREATE, UPDATE) and res.key == ("", "pods")

    async def admit(self, attrs: Attributes) -> None:
        if attrs.subresource or not isinstance(attrs.obj, dict):
            return
        spec = attrs.obj.get("spec")
        if not isinstance(spec, dict):
            return
        tolerations = spec.get("tolerations")
        if tolerations is None:
            tolerations = []
        if not isinstance(tolerations, list):
            return  # validation names the field
        added = [{"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}
                 for key, seconds in self.seconds.items() if not _tolerates(tolerations, key)]
        if added:
            spec["tolerations"] = tolerations + added


__all__ = ["DEFAULT_TOLERATION_SECONDS", "DefaultTolerationSeconds"]
