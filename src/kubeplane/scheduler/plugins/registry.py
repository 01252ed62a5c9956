"""The in-tree plugin registry: every built-in plugin and upstream's default profile.

Adding a plugin is one module in this package and one line in ``_PLUGINS``
(and in ``DEFAULT_PLUGINS`` when the default profile enables it). The
framework runtime gets this registry from the scheduler; it imports no
plugin itself.
"""

from __future__ import annotations

from kubeplane.scheduler.framework.plugin import Plugin
from kubeplane.scheduler.framework.registry import Registry
from kubeplane.scheduler.plugins.default_binder import DefaultBinder
from kubeplane.scheduler.plugins.default_preemption import DefaultPreemption
from kubeplane.scheduler.plugins.dynamicresources import DynamicResources
from kubeplane.scheduler.plugins.image_locality import ImageLocality
from kubeplane.scheduler.plugins.inter_pod_affinity import InterPodAffinity
from kubeplane.scheduler.plugins.node_affinity import NodeAffinity
from kubeplane.scheduler.plugins.node_name import NodeName
from kubeplane.scheduler.plugins.node_ports import NodePorts
from kubeplane.scheduler.plugins.node_resources_balanced import NodeResourcesBalancedAllocation
from kubeplane.scheduler.plugins.node_resources_fit import NodeResourcesFit
from kubeplane.scheduler.plugins.node_unschedulable import NodeUnschedulable
from kubeplane.scheduler.plugins.node_volume_limits import NodeVolumeLimits
from kubeplane.scheduler.plugins.pod_topology_spread import PodTopologySpread
from kubeplane.scheduler.plugins.priority_sort import PrioritySort
from kubeplane.scheduler.plugins.scheduling_gates import SchedulingGates
from kubeplane.scheduler.plugins.taint_toleration import TaintToleration
from kubeplane.scheduler.plugins.volumebinding import VolumeBinding
from kubeplane.scheduler.plugins.volume_restrictions import VolumeRestrictions
from kubeplane.scheduler.plugins.volume_zone import VolumeZone

_PLUGINS: list[type[Plugin]] = [
    SchedulingGates,
    PrioritySort,
    NodeUnschedulable,
    NodeName,
    TaintToleration,
    NodeAffinity,
    NodePorts,
    NodeResourcesFit,
    VolumeRestrictions,
    NodeVolumeLimits,
    VolumeBinding,
    VolumeZone,
    PodTopologySpread,
    InterPodAffinity,
    DynamicResources,
    DefaultPreemption,
    NodeResourcesBalancedAllocation,
    ImageLocality,
    DefaultBinder,
]

#: upstream default MultiPoint plugins in order; weight only for score plugins
DEFAULT_PLUGINS: list[tuple[str, int]] = [
    ("SchedulingGates", 0),
    ("PrioritySort", 0),
    ("NodeUnschedulable", 0),
    ("NodeName", 0),
    ("TaintToleration", 3),
    ("NodeAffinity", 2),
    ("NodePorts", 0),
    ("NodeResourcesFit", 1),
    ("VolumeRestrictions", 0),
    ("NodeVolumeLimits", 0),
    ("VolumeBinding", 0),
    ("VolumeZone", 0),
    ("PodTopologySpread", 2),
    ("InterPodAffinity", 2),
    ("DynamicResources", 0),
    ("DefaultPreemption", 0),
    ("NodeResourcesBalancedAllocation", 1),
    ("ImageLocality", 1),
    ("DefaultBinder", 0),
]


def in_tree_registry() -> Registry:
    """A fresh registry of all built-in plugins, with upstream's default MultiPoint list."""
    return Registry(_PLUGINS, DEFAULT_PLUGINS)


__all__ = ["DEFAULT_PLUGINS", "in_tree_registry"]
