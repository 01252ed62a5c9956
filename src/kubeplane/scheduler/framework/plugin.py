"""The single plugin shape and the handle plugins get from the framework.

A plugin subclasses :class:`Plugin`, sets ``name`` and overrides the methods
of the extension points it implements; the framework detects capabilities
from which methods a subclass overrides. Signatures (``state`` is a
``CycleState``, ``pod_info`` a ``PodInfo``, ``node_info`` a ``NodeInfo``):

* ``pre_enqueue(pod) -> Status | None``
* ``less(a, b) -> bool`` (QueueSort; ``a``/``b`` have ``.pod`` and ``.timestamp``)
* ``pre_filter(state, pod_info, nodes) -> (PreFilterResult | None, Status | None)``
* ``add_pod`` / ``remove_pod(state, pod_info, pod_info_to_change, node_info) -> Status | None``
  (PreFilter extensions, used with nominated pods and preemption)
* ``filter(state, pod_info, node_info) -> Status | None``
* ``post_filter(state, pod_info, filtered_statuses) -> (nominated_node | None, Status)``
* ``pre_score(state, pod_info, nodes) -> Status | None``
* ``score(state, pod_info, node_info) -> (int, Status | None)``
* ``normalize_score(state, pod_info, scores) -> Status | None`` (edits ``[node, score]`` pairs in place)
* ``reserve`` / ``unreserve(state, pod_info, node_name)``
* ``permit(state, pod_info, node_name) -> (Status | None, timeout_seconds)``
* ``async pre_bind`` / ``async bind(state, pod_info, node_name) -> Status | None``
* ``async post_bind(state, pod_info, node_name) -> None``
* ``events_to_register() -> list[ClusterEventWithHint]``

Optional vectorised forms of Filter and Score (driven by ``framework.fastpath``,
which evaluates many nodes at once over the column arrays ``arr`` of a
snapshot, a ``fastpath.NodeArrays``); a plugin that defines none of them has
its Filter and Score called per node. Each must agree exactly with the
plugin's scalar Filter/Score, so a plugin file holds both forms, sharing
helpers:

* ``filter_mask(state, pod_info, arr)``: a builder ``rows -> True | bool array``
  of the rows where Filter certainly succeeds, ``fastpath.ALL_PASS``, or None;
* ``filter_mask_certain(state, pod_info, arr) -> bool | bool array``: whether a row
  the mask does not pass is certainly rejected by Filter;
* ``filter_status_builder(state, pod_info, arr)``: ``rows -> (statuses, distinct)``,
  Filter's own statuses of rows its mask rejects, computed in bulk, or None;
* ``score_vector(state, pod_info, arr, rows, nodes, sel)``: final (normalized)
  scores of ``rows`` as an int (all equal) or an int64 array, or None;
* for plugins that work on node names: ``filter_pass_except``,
  ``filter_known_statuses``, ``filter_known_rejections`` (see ``fastpath``).

Preemption's dry run uses ``filter_pod_view`` (Filter reads only the node
object and this view of the pod) and ``fit_requests`` / ``fit_status``
(Filter is resource arithmetic) to avoid cloning nodes.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol

from kubeplane.scheduler.framework.types import ClusterEventWithHint, CycleState, Obj, PreFilterResult, Status

if TYPE_CHECKING:
    from kubeplane.client.interface import Client
    from kubeplane.scheduler.framework.nodeinfo import NodeInfo, PodInfo


class PodNominator(Protocol):
    """What the framework needs from the queue's nominator (pod dicts or PodInfos)."""

    def nominated_pods_for_node(self, node_name: str) -> list[Any]: ...


class SnapshotLister(Protocol):
    node_info_list: list["NodeInfo"]
    have_pods_with_affinity_list: list["NodeInfo"]
    have_pods_with_required_anti_affinity_list: list["NodeInfo"]

    def get(self, node_name: str) -> "NodeInfo": ...

    def num_nodes(self) -> int: ...


class SharedDRAManager(Protocol):
    """The DRA state every profile of a scheduler shares (upstream framework.SharedDRAManager):
    the claim assume cache, allocated and in-flight devices. The DynamicResources
    plugin's ``DRAManager`` implements it."""

    def get_claim(self, namespace: str, name: str) -> Obj | None: ...

    def list_claims(self) -> list[Obj]: ...


class VolumeBinderLike(Protocol):
    """What the VolumeBinding plugin drives through a pod's phases (its ``VolumeBinder``)."""

    def get_pod_volume_claims(self, pod: Obj) -> Any: ...

    def assume_pod_volumes(self, pod: Obj, node_name: str, pod_volumes: Any) -> bool: ...

    def revert_assumed_pod_volumes(self, pod_volumes: Any) -> None: ...


class AssumeCacheLike(Protocol):
    """A passive assume cache of PVs or PVCs (reads through the informer's indexer)."""

    def get(self, key: str) -> Obj: ...

    def get_api_obj(self, key: str) -> Obj: ...

    def assume(self, obj: Obj) -> None: ...

    def restore(self, obj: Obj) -> None: ...


#: namespace -> its labels, None when the namespace is unknown
NamespaceLabels = Callable[[str], "dict[str, str] | None"]
#: (resource plural, namespace or None) -> the informer's objects
ObjectLister = Callable[[str, "str | None"], "list[Obj]"]

#: upstream's default ``parallelism`` (KubeSchedulerConfiguration)
DEFAULT_PARALLELISM = 16


class Handle:
    """Services shared by the plugins of one profile (upstream framework.Handle).

    Every field is declared here; plugins read them directly. ``snapshot`` is
    replaced by the scheduling loop at the start of each cycle; ``framework`` is
    set by the Framework that owns this handle. Fields a plugin builds lazily
    when the scheduler did not (``dra_manager``, ``volume_binder``) are stored
    back so the rest of the profile sees the same object; the scheduler hands
    one DRA manager and one pair of volume assume caches to all its profiles.
    """

    __slots__ = (
        "client", "snapshot", "informer_factory", "event_recorder", "nominator", "clock", "rng", "parallelism",
        "dra_manager", "volume_binder", "pv_assume_cache", "pvc_assume_cache",
        "namespace_labels", "pdb_lister", "list_objects", "framework",
    )

    def __init__(
        self,
        *,
        client: "Client | None" = None,
        snapshot: SnapshotLister | None = None,
        informer_factory: Any = None,
        event_recorder: Any = None,
        nominator: PodNominator | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        parallelism: int = DEFAULT_PARALLELISM,
        dra_manager: SharedDRAManager | None = None,
        volume_binder: VolumeBinderLike | None = None,
        pv_assume_cache: AssumeCacheLike | None = None,
        pvc_assume_cache: AssumeCacheLike | None = None,
        namespace_labels: NamespaceLabels | None = None,
        pdb_lister: Callable[[], list[Obj]] | None = None,
        list_objects: ObjectLister | None = None,
    ) -> None:
        self.client: "Client | None" = client
        self.snapshot: SnapshotLister | None = snapshot
        #: a SharedInformerFactory (``informer_for(resource)``)
        self.informer_factory: Any = informer_factory
        #: an EventRecorder (``event(obj, type, reason, action, note)``)
        self.event_recorder: Any = event_recorder
        self.nominator: PodNominator | None = nominator
        self.clock: Callable[[], float] = clock
        self.rng: random.Random = rng or random.Random()
        #: the configured ``parallelism`` (workers of upstream's parallelizer)
        self.parallelism: int = parallelism
        self.dra_manager: SharedDRAManager | None = dra_manager
        self.volume_binder: VolumeBinderLike | None = volume_binder
        self.pv_assume_cache: AssumeCacheLike | None = pv_assume_cache
        self.pvc_assume_cache: AssumeCacheLike | None = pvc_assume_cache
        #: namespace labels (InterPodAffinity's namespace selectors)
        self.namespace_labels: NamespaceLabels | None = namespace_labels
        #: PodDisruptionBudgets (preemption)
        self.pdb_lister: Callable[[], list[Obj]] | None = pdb_lister
        #: workload objects by resource (PodTopologySpread's default selectors)
        self.list_objects: ObjectLister | None = list_objects
        self.framework: Any = None

    def node_infos(self) -> list["NodeInfo"]:
        return self.snapshot.node_info_list if self.snapshot is not None else []


class Plugin:
    """Base class of every scheduler plugin. Override what you implement."""

    name: ClassVar[str] = ""

    def __init__(self, args: dict | None, handle: Handle) -> None:
        self.args: dict = dict(args or {})
        self.handle = handle

    # --- queue side
    def pre_enqueue(self, pod: Obj) -> Status | None:
        raise NotImplementedError

    def less(self, a: Any, b: Any) -> bool:
        raise NotImplementedError

    # --- scheduling cycle
    def pre_filter(
        self, state: CycleState, pod_info: "PodInfo", nodes: list["NodeInfo"]
    ) -> tuple[PreFilterResult | None, Status | None]:
        raise NotImplementedError

    def add_pod(
        self, state: CycleState, pod_info: "PodInfo", pod_info_to_add: "PodInfo", node_info: "NodeInfo"
    ) -> Status | None:
        raise NotImplementedError

    def remove_pod(
        self, state: CycleState, pod_info: "PodInfo", pod_info_to_remove: "PodInfo", node_info: "NodeInfo"
    ) -> Status | None:
        raise NotImplementedError

    def filter(self, state: CycleState, pod_info: "PodInfo", node_info: "NodeInfo") -> Status | None:
        raise NotImplementedError

    def post_filter(
        self, state: CycleState, pod_info: "PodInfo", filtered_statuses: dict[str, Status]
    ) -> tuple[str | None, Status]:
        raise NotImplementedError

    def pre_score(self, state: CycleState, pod_info: "PodInfo", nodes: list["NodeInfo"]) -> Status | None:
        raise NotImplementedError

    def score(self, state: CycleState, pod_info: "PodInfo", node_info: "NodeInfo") -> tuple[int, Status | None]:
        raise NotImplementedError

    def normalize_score(self, state: CycleState, pod_info: "PodInfo", scores: list[list[Any]]) -> Status | None:
        raise NotImplementedError

    def reserve(self, state: CycleState, pod_info: "PodInfo", node_name: str) -> Status | None:
        raise NotImplementedError

    def unreserve(self, state: CycleState, pod_info: "PodInfo", node_name: str) -> None:
        return None

    def permit(self, state: CycleState, pod_info: "PodInfo", node_name: str) -> tuple[Status | None, float]:
        raise NotImplementedError

    # --- binding cycle
    async def pre_bind(self, state: CycleState, pod_info: "PodInfo", node_name: str) -> Status | None:
        raise NotImplementedError

    async def bind(self, state: CycleState, pod_info: "PodInfo", node_name: str) -> Status | None:
        raise NotImplementedError

    async def post_bind(self, state: CycleState, pod_info: "PodInfo", node_name: str) -> None:
        raise NotImplementedError

    # --- queueing hints
    def events_to_register(self) -> list[ClusterEventWithHint]:
        raise NotImplementedError

    # --- vectorised Filter / Score (optional, see the module docstring)
    def filter_mask(self, state: CycleState, pod_info: "PodInfo", arr: Any) -> Any:
        return None

    def filter_mask_certain(self, state: CycleState, pod_info: "PodInfo", arr: Any) -> Any:
        known = self.filter_known_rejections(state, pod_info, arr.index, len(arr.node_infos))
        return False if known is None else known

    def filter_status_builder(self, state: CycleState, pod_info: "PodInfo", arr: Any) -> Any:
        return None

    def score_vector(self, state: CycleState, pod_info: "PodInfo", arr: Any, rows: Any,
                     nodes: list["NodeInfo"], sel: Any) -> Any:
        return None

    def filter_pass_except(self, state: CycleState, pod_info: "PodInfo") -> Any:
        """After PreFilter in the same cycle: None (no vectorised form), or the node
        names outside which Filter certainly succeeds (``EVERY_NODE``,
        ``PassOnly(names)``: see ``fastpath``)."""
        return None

    def filter_known_statuses(self, state: CycleState, pod_info: "PodInfo") -> Any:
        """After ``filter_pass_except``: node name -> the rejection Filter certainly
        returns there this cycle (``plugin`` set), or None."""
        return None

    def filter_known_rejections(self, state: CycleState, pod_info: "PodInfo", rows: Any, n: int) -> Any:
        """After ``filter_pass_except``: a bool array by row (``rows`` maps node names to
        rows), True where Filter certainly rejects the row with the status
        ``filter_known_statuses`` gives, or None."""
        return None

    # --- preemption dry runs (optional)
    def filter_pod_view(self, pod_info: "PodInfo") -> Any:
        """When Filter reads only the node object (never the pods on the node): the part
        of the pod it reads (equal views, equal verdicts on a node); None otherwise."""
        return None

    def fit_requests(self, state: CycleState, pod_info: "PodInfo") -> Any:
        """When Filter only compares the node's free resources and pod count with the
        pod's requests: ``(requests, ((resource, value), ...) checked)``; None otherwise."""
        return None

    def fit_status(self, state: CycleState, pod_info: "PodInfo", usage: Any) -> Status | None:
        """With ``fit_requests``: Filter's status on a node with ``usage`` (``allocatable``,
        ``requested`` and ``pods``, as a NodeInfo has)."""
        raise NotImplementedError


#: extension point name -> method implementing it
EXTENSION_METHODS: dict[str, str] = {
    "preEnqueue": "pre_enqueue",
    "queueSort": "less",
    "preFilter": "pre_filter",
    "filter": "filter",
    "postFilter": "post_filter",
    "preScore": "pre_score",
    "score": "score",
    "reserve": "reserve",
    "permit": "permit",
    "preBind": "pre_bind",
    "bind": "bind",
    "postBind": "post_bind",
}


def implements(plugin: type[Plugin] | Plugin, method: str) -> bool:
    """Whether a plugin (class or instance) overrides ``method`` of :class:`Plugin`."""
    cls = plugin if isinstance(plugin, type) else type(plugin)
    return getattr(cls, method, None) is not getattr(Plugin, method)


def extension_points(plugin: type[Plugin] | Plugin) -> list[str]:
    """The extension points (config names) a plugin implements."""
    return [ep for ep, m in EXTENSION_METHODS.items() if implements(plugin, m)]


def normalized_score(max_priority: int, reverse: bool, score: Any, max_count: int) -> Any:
    """One score (an int, or a numpy array of them) scaled so ``max_count`` becomes
    ``max_priority``; ``reverse`` flips it. ``max_count`` must not be 0."""
    sc = max_priority * score // max_count
    return max_priority - sc if reverse else sc


def default_normalize_score(max_priority: int, reverse: bool, scores: list[list[Any]]) -> None:
    """Scale scores so the highest becomes ``max_priority``; ``reverse`` flips them."""
    max_count = max((s for _, s in scores), default=0)
    if max_count == 0:
        if reverse:
            for entry in scores:
                entry[1] = max_priority
        return
    for entry in scores:
        entry[1] = normalized_score(max_priority, reverse, entry[1], max_count)
