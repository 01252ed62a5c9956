"""The VolumeBinding plugin and its machinery (upstream ``plugins/volumebinding``).

* :mod:`.volume_binding`: the plugin (PreFilter to PreBind, hints, scoring);
* :mod:`.binder`: the :class:`VolumeBinder` that finds, assumes and binds a
  pod's volumes;
* :mod:`.passivecache`: the passive PV/PVC assume caches on the informers'
  indexers, shared by every profile of a scheduler.
"""

from kubeplane.scheduler.plugins.volumebinding.binder import VolumeBinder, VolumeBindingError
from kubeplane.scheduler.plugins.volumebinding.passivecache import new_pv_assume_cache, new_pvc_assume_cache
from kubeplane.scheduler.plugins.volumebinding.volume_binding import (
    CLAIM_HINT_SCOPE,
    DEFAULT_SHAPE,
    NAME,
    PV_HINT_SCOPE,
    VolumeBinding,
    build_broken_linear_function,
    claim_event_keys,
    claim_keys_of_pod,
)

__all__ = [
    "CLAIM_HINT_SCOPE", "DEFAULT_SHAPE", "NAME", "PV_HINT_SCOPE", "VolumeBinder", "VolumeBinding",
    "VolumeBindingError", "build_broken_linear_function", "claim_event_keys", "claim_keys_of_pod",
    "new_pv_assume_cache", "new_pvc_assume_cache",
]
