"""The DynamicResources plugin and its machinery (upstream ``plugins/dynamicresources``).

* :mod:`.dynamic_resources`: the plugin (PreEnqueue to PreBind, hints);
* :mod:`.dra_manager`: the :class:`DRAManager` shared by every profile of a
  scheduler (claim assume cache, allocated and in-flight devices, node verdicts).
"""

from kubeplane.scheduler.plugins.dynamicresources.dra_manager import DRAManager
from kubeplane.scheduler.plugins.dynamicresources.dynamic_resources import (
    FINALIZER,
    NAME,
    POD_CLAIM_NAME_ANNOTATION,
    RESERVED_FOR_MAX_SIZE,
    ClaimError,
    DynamicResources,
    is_reserved_for_pod,
    pod_claim_names,
    shared_dra_manager,
)

__all__ = [
    "ClaimError", "DRAManager", "DynamicResources", "FINALIZER", "NAME", "POD_CLAIM_NAME_ANNOTATION",
    "RESERVED_FOR_MAX_SIZE", "is_reserved_for_pod", "pod_claim_names", "shared_dra_manager",
]
