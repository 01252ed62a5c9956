"""Plugin registry: plugin name -> plugin class, and the default profile.

Adding a plugin is one file in ``kubeplane.scheduler.plugins`` and one line
in ``_PLUGINS`` below.

``DEFAULT_PLUGINS`` is upstream's default MultiPoint list, in order, with its
score weights. The default profile is built from the names present in the
registry, so plugins that are not implemented yet (VolumeRestrictions,
NodeVolumeLimits, VolumeBinding, VolumeZone, PodTopologySpread,
InterPodAffinity, DynamicResources, DefaultPreemption) are simply left out
until they are registered.
"""

from __future__ import annotations

from typing import Mapping

from kubeplane.scheduler.framework.plugin import Plugin
from kubeplane.scheduler.plugins.default_binder import DefaultBinder
from kubeplane.scheduler.plugins.image_locality import ImageLocality
from kubeplane.scheduler.plugins.node_affinity import NodeAffinity
from kubeplane.scheduler.plugins.node_name import NodeName
from kubeplane.scheduler.plugins.node_ports import NodePorts
from kubeplane.scheduler.plugins.node_resources_balanced import NodeResourcesBalancedAllocation
from kubeplane.scheduler.plugins.node_resources_fit import NodeResourcesFit
from kubeplane.scheduler.plugins.node_unschedulable import NodeUnschedulable
from kubeplane.scheduler.plugins.priority_sort import PrioritySort
from kubeplane.scheduler.plugins.scheduling_gates import SchedulingGates
from kubeplane.scheduler.plugins.taint_toleration import TaintToleration
from kubeplane.scheduler.plugins.podtopologyspread import PodTopologySpread
from kubeplane.scheduler.plugins.interpodaffinity import InterPodAffinity
from kubeplane.scheduler.plugins.defaultpreemption import DefaultPreemption
from kubeplane.scheduler.plugins.dynamicresources import DynamicResources
from kubeplane.scheduler.plugins.volume_restrictions import VolumeRestrictions
from kubeplane.scheduler.plugins.node_volume_limits import NodeVolumeLimits
from kubeplane.scheduler.plugins.volumebinding import VolumeBinding
from kubeplane.scheduler.plugins.volume_zone import VolumeZone

Registry = dict[str, type[Plugin]]

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
    """A fresh name -> class map of all built-in plugins."""
    return {p.name: p for p in _PLUGINS}


def default_multi_point(registry: Mapping[str, type[Plugin]]) -> list[dict]:
    """The default MultiPoint ``enabled`` list, restricted to plugins in ``registry``."""
    out: list[dict] = []
    for name, weight in DEFAULT_PLUGINS:
        if name in registry:
            out.append({"name": name, "weight": weight} if weight else {"name": name})
    return out
