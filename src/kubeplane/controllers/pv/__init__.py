"""PersistentVolume controller (binder), local provisioner and PV/PVC matching."""

from kubeplane.controllers.pv.binder import PersistentVolumeController
from kubeplane.volume.matching import check_node_affinity, find_best_match_for_claim, find_matching_volume
from kubeplane.controllers.pv.provisioner import DEFAULT_PROVISIONER, LocalProvisioner

__all__ = [
    "DEFAULT_PROVISIONER",
    "LocalProvisioner",
    "PersistentVolumeController",
    "check_node_affinity",
    "find_best_match_for_claim",
    "find_matching_volume",
]
