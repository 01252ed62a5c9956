"""The scheduling loop: informers -> queue/cache -> scheduleOne -> binding cycles.

One pod is scheduled at a time (the scheduling cycle); binding cycles run as
concurrent tasks so a slow PreBind never holds up the next pod, as upstream.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence

import numpy as np

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import format_time, utcnow
from kubeplane.api.resources import ResourceInfo, resource
from kubeplane.client.events import EventRecorder
from kubeplane.client.informer import DeletedFinalStateUnknown, SharedInformerFactory
from kubeplane.client.interface import Client
from kubeplane.runtime import yield_while_ready
from kubeplane.scheduler.cache import Cache, Snapshot
from kubeplane.scheduler.framework.fastpath import Rejections, arrays_for, nodes_for_rows, select_host_index
from kubeplane.scheduler.framework.nodeinfo import NodeInfo, PodInfo
from kubeplane.scheduler.framework.plugin import (
    DEFAULT_PARALLELISM, Handle, NamespaceLabels, ObjectLister, SharedDRAManager,
)
from kubeplane.scheduler.plugins.registry import in_tree_registry
from kubeplane.scheduler.framework.runtime import Framework, NodePluginScores
from kubeplane.scheduler.framework.types import (
    ActionType,
    ClusterEvent,
    Code,
    CycleState,
    EventResource,
    Status,
)
from kubeplane.scheduler.nominator import Nominator
from kubeplane.scheduler.queue import QueuedPodInfo, QueueProfile, SchedulingQueue

log = logging.getLogger("kubeplane.scheduler")

PODS = resource("pods")
NODES = resource("nodes")

#: informer resources for the cluster events plugins may register
EVENT_RESOURCES: dict[EventResource, ResourceInfo] = {
    EventResource.PERSISTENT_VOLUME: resource("persistentvolumes"),
    EventResource.PERSISTENT_VOLUME_CLAIM: resource("persistentvolumeclaims"),
    EventResource.STORAGE_CLASS: resource("storageclasses"),
    EventResource.CSI_NODE: resource("csinodes"),
    EventResource.CSI_STORAGE_CAPACITY: resource("csistoragecapacities"),
    EventResource.RESOURCE_CLAIM: resource("resourceclaims"),
    EventResource.RESOURCE_SLICE: resource("resourceslices"),
    EventResource.DEVICE_CLASS: resource("deviceclasses"),
}

MIN_FEASIBLE_NODES_TO_FIND = 100
MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND = 5
NO_NODE_AVAILABLE_MSG = "0/{} nodes are available"
#: most extra event-loop passes a scheduling cycle yields while binding cycles
#: run PreBind, with a client whose API server runs elsewhere
PRE_BIND_YIELD_PASSES = 8
#: seconds between cache cleanups (expired assumed pods, the cache size gauges), as upstream
CACHE_CLEANUP_PERIOD = 1.0


def num_feasible_nodes_to_find(percentage: int | None, num_all_nodes: int) -> int:
    """How many feasible nodes to look for (upstream's adaptive percentage)."""
    if num_all_nodes < MIN_FEASIBLE_NODES_TO_FIND:
        return num_all_nodes
    pct = percentage or 0
    if pct == 0:
        pct = max(50 - num_all_nodes // 125, MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND)
    n = num_all_nodes * pct // 100
    return max(n, MIN_FEASIBLE_NODES_TO_FIND)


class NodeStatuses(MutableMapping[str, Status]):
    """Filter statuses by node name. The vectorised Filter loop adds them in bulk as
    snapshot rows (:meth:`add_rejections`); they get node names only when read by
    name, so a cycle that rejects thousands of nodes and still finds a host (or
    whose failure is only counted, as in the FailedScheduling message) never
    names them. Rows a cycle that found a host rejected without computing
    their status (see ``Rejections``) are only counted in ``len``."""

    __slots__ = ("_named", "_chunks", "_nodes", "_chunked", "_distinct", "_uncomputed")

    def __init__(self, statuses: Mapping[str, Status] | None = None) -> None:
        self._named: dict[str, Status] = dict(statuses or {})
        self._chunks: list[tuple[Sequence[int], list[Status | None]]] = []
        self._nodes: Sequence[NodeInfo] = ()
        self._chunked = 0  # statuses in _chunks
        self._distinct: dict[int, Status] = {}  # the statuses in _chunks, each once
        self._uncomputed = 0  # rejected rows resolved from _chunks without a status

    def add_rejections(self, nodes: Sequence[NodeInfo], rejections: Rejections) -> None:
        """The statuses of rows of ``nodes`` (the snapshot's node list)."""
        if self._chunks and nodes is not self._nodes:
            self._resolve()
        self._nodes = nodes
        self._chunks.extend(rejections.chunks)
        self._chunked += rejections.count
        self._distinct.update(rejections.distinct)

    def fill(self, nodes: Sequence[NodeInfo], status: Status) -> None:
        """``status`` for every node of ``nodes``."""
        rej = Rejections()
        rej.add(range(len(nodes)), [status] * len(nodes), len(nodes))  # type: ignore[arg-type]
        rej.distinct[id(status)] = status
        self.add_rejections(nodes, rej)

    def _resolve(self) -> dict[str, Status]:
        if self._chunks:
            named, nodes = self._named, self._nodes
            with_status = 0
            for rows, sts in self._chunks:
                for row, st in zip(rows, sts):
                    if st is not None:
                        named[nodes[row].name] = st
                        with_status += 1
            self._uncomputed += self._chunked - with_status
            self._chunks = []
            self._chunked = 0
            self._distinct = {}
        return self._named

    def by_name(self) -> dict[str, Status]:
        """Every status by node name, as a plain dict (for many lookups; do not modify)."""
        return self._resolve()

    def __getitem__(self, name: str) -> Status:
        return self._resolve()[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self._resolve().get(name, default)

    def __setitem__(self, name: str, status: Status) -> None:
        self._resolve()[name] = status

    def __delitem__(self, name: str) -> None:
        del self._resolve()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._resolve())

    def __len__(self) -> int:
        if self._named and self._chunks:
            self._resolve()  # a node could be in both
        return len(self._named) + self._chunked + self._uncomputed

    def values(self) -> list[Status]:  # type: ignore[override]
        """The statuses, without naming their nodes."""
        if self._named and self._chunks:
            self._resolve()
        out = list(self._named.values())
        for _, sts in self._chunks:
            out.extend(st for st in sts if st is not None)
        return out

    def status_counts(self) -> list[tuple[Status, int]]:
        """Each distinct status (by identity) with the number of nodes it was given to,
        counted without naming the nodes."""
        if self._named and self._chunks:
            self._resolve()
        counts: Counter[int] = Counter(map(id, self._named.values()))
        objs = {id(st): st for st in self._named.values()}
        for _, sts in self._chunks:
            counts.update(map(id, sts))
        objs.update(self._distinct)
        counts.pop(id(None), None)  # rows that passed
        if any(i not in objs for i in counts):
            for _, sts in self._chunks:
                objs.update((id(st), st) for st in sts if st is not None)
        return [(objs[i], n) for i, n in counts.items()]

    def rejecting_plugins(self) -> set[tuple[Code, str]]:
        """(code, plugin) of every status, each pair once."""
        pairs = {(st.code, st.plugin) for st in self._distinct.values()}
        pairs.update((st.code, st.plugin) for st in {id(st): st for st in self._named.values()}.values())
        return pairs


@dataclass
class Diagnosis:
    node_to_status: MutableMapping[str, Status] = field(default_factory=NodeStatuses)
    unschedulable_plugins: set[str] = field(default_factory=set)
    pending_plugins: set[str] = field(default_factory=set)
    pre_filter_msg: str = ""
    post_filter_msg: str = ""


class FitError(Exception):
    def __init__(self, pod: dict, num_all_nodes: int, diagnosis: Diagnosis) -> None:
        super().__init__()
        self.pod = pod
        self.num_all_nodes = num_all_nodes
        self.diagnosis = diagnosis

    def __str__(self) -> str:
        """``0/5 nodes are available: 2 Insufficient cpu, 3 node(s) had .... preemption: ...``

        As upstream: a PreFilter rejection's message replaces the per-node
        histogram (which would repeat it for every node); histogram entries
        are ``"<count> <reason>"`` strings sorted as strings; the PostFilter
        message follows as is.
        """
        msg = NO_NODE_AVAILABLE_MSG.format(self.num_all_nodes) + ":"
        if self.diagnosis.pre_filter_msg:
            msg += f" {self.diagnosis.pre_filter_msg}."
        else:
            counts: dict[str, int] = {}
            statuses = self.diagnosis.node_to_status
            by_status = (statuses.status_counts() if isinstance(statuses, NodeStatuses)
                         else [(st, 1) for st in statuses.values()])
            for status, n in by_status:
                for reason in status.reasons:
                    counts[reason] = counts.get(reason, 0) + n
            histogram = sorted(f"{n} {r}" for r, n in counts.items())
            if histogram:
                msg += " " + ", ".join(histogram) + "."
        if self.diagnosis.post_filter_msg:
            msg += " " + self.diagnosis.post_filter_msg
        return msg


@dataclass
class ScheduleResult:
    suggested_host: str
    evaluated_nodes: int
    feasible_nodes: int
    nominated_node: str | None = None


def _node_update_action(old: dict, new: dict) -> ActionType:
    action = ActionType(0)
    os_, ns_ = old.get("status") or {}, new.get("status") or {}
    if os_.get("allocatable") != ns_.get("allocatable"):
        action |= ActionType.UPDATE_NODE_ALLOCATABLE
    om, nm = old.get("metadata") or {}, new.get("metadata") or {}
    if om.get("labels") != nm.get("labels"):
        action |= ActionType.UPDATE_NODE_LABEL
    ospec, nspec = old.get("spec") or {}, new.get("spec") or {}
    if ospec.get("taints") != nspec.get("taints") or ospec.get("unschedulable") != nspec.get("unschedulable"):
        action |= ActionType.UPDATE_NODE_TAINT
    if os_.get("conditions") != ns_.get("conditions"):
        action |= ActionType.UPDATE_NODE_CONDITION
    if om.get("annotations") != nm.get("annotations"):
        action |= ActionType.UPDATE_NODE_ANNOTATION
    return action


def _unwrap(obj: Any) -> dict:
    if isinstance(obj, DeletedFinalStateUnknown):
        return obj.obj
    return obj


class Scheduler:
    """kube-scheduler: profiles, queue, cache and the scheduling loop."""

    def __init__(
        self,
        client: Client,
        *,
        profiles: list[dict] | None = None,
        percentage_of_nodes_to_score: int | None = None,
        pod_initial_backoff: float = 1.0,
        pod_max_backoff: float = 10.0,
        registry: dict | None = None,
        informer_factory: SharedInformerFactory | None = None,
        metrics: Any = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        identity: str = "",
        pop_from_backoff: bool = True,
        pre_bind_yield_passes: int | None = None,
        parallelism: int = DEFAULT_PARALLELISM,
    ) -> None:
        """``pop_from_backoff`` is upstream's SchedulerPopFromBackoffQ feature (beta,
        on by default): when activeQ is empty, a pod still backing off is tried
        rather than leaving the scheduler idle.

        ``pre_bind_yield_passes``: while binding cycles run PreBind, how many
        extra event-loop passes each scheduling cycle may yield to other ready
        work (see :meth:`schedule_one`). By default
        :data:`PRE_BIND_YIELD_PASSES`, or none when the client's API server
        shares this event loop: there PreBind's steps need no replies from
        elsewhere, and extra passes only add the loop's own overhead."""
        self.client = client
        self.clock = clock
        self.rng = rng or random.Random()
        self.metrics = metrics
        self.percentage_of_nodes_to_score = percentage_of_nodes_to_score
        self.informer_factory = informer_factory or SharedInformerFactory(client)
        self.recorder = EventRecorder(client, "default-scheduler", instance=identity or "kubeplane-scheduler",
                                      kind="Pod", api_version="v1")
        self.cache = Cache(clock=clock)
        self.snapshot = Snapshot()
        # One nominator, shared by the queue and every profile's plugins.
        self.nominator = Nominator(self._pod_by_name)
        registry = registry if registry is not None else in_tree_registry()
        self._started = False
        # Workload kinds PodTopologySpread derives default selectors from.
        for plural in ("services", "replicasets"):
            self.informer_factory.informer_for(resource(plural))
        # One pair of passive assume caches for every profile, so a volume one
        # profile assumed is taken for all of them (as one upstream scheduler).
        from kubeplane.scheduler.plugins.volumebinding.passivecache import new_pv_assume_cache, new_pvc_assume_cache

        pv_cache = new_pv_assume_cache(self.informer_factory.informer_for(resource("persistentvolumes")))
        pvc_cache = new_pvc_assume_cache(self.informer_factory.informer_for(resource("persistentvolumeclaims")))
        namespace_labels, pdb_lister, list_objects = self._listers()
        self.parallelism = parallelism
        #: the DRA manager every profile shares; built by the first DynamicResources plugin
        self.dra_manager: SharedDRAManager | None = None
        self.frameworks: dict[str, Framework] = {}
        for prof in profiles or [{"schedulerName": "default-scheduler"}]:
            handle = Handle(client=client, snapshot=self.snapshot, informer_factory=self.informer_factory,
                            event_recorder=self.recorder, nominator=self.nominator, clock=clock, rng=self.rng,
                            parallelism=parallelism, dra_manager=self.dra_manager,
                            pv_assume_cache=pv_cache, pvc_assume_cache=pvc_cache,
                            namespace_labels=namespace_labels, pdb_lister=pdb_lister, list_objects=list_objects)
            fw = Framework(registry, prof, handle)
            self.dra_manager = handle.dra_manager
            fw.metrics = metrics
            if fw.profile_name in self.frameworks:
                raise ValueError(f"duplicate profile {fw.profile_name!r}")
            self.frameworks[fw.profile_name] = fw
        queue_profiles = {
            name: QueueProfile(
                pre_enqueue=[(pl.name, pl.pre_enqueue) for pl in fw.pre_enqueue_plugins],
                hints=fw.events_to_register(),
                less=fw.less,
                sort_key=getattr(fw.queue_sort_plugin, "sort_key", None),
            )
            for name, fw in self.frameworks.items()
        }
        self.queue = SchedulingQueue(queue_profiles, clock=clock, initial_backoff=pod_initial_backoff,
                                     max_backoff=pod_max_backoff, pod_getter=self._pod_by_name,
                                     pop_from_backoff=pop_from_backoff)
        self.queue.nominator = self.nominator
        self.next_start_node_index = 0
        #: use the vectorised Filter/Score (``framework.fastpath``) where it applies
        self.use_fast_path = True
        self._binding_tasks: set[asyncio.Task] = set()
        #: binding cycles now running PreBind plugins
        self._in_pre_bind = 0
        if pre_bind_yield_passes is None:
            pre_bind_yield_passes = 0 if getattr(client, "shares_event_loop", False) else PRE_BIND_YIELD_PASSES
        self.pre_bind_yield_passes = pre_bind_yield_passes
        self._incoming_exported: dict[tuple[str, str], int] = {}
        self._unschedulable_exported: set[tuple[str, str]] = set()
        self._tasks: list[asyncio.Task] = []
        self._stopped = asyncio.Event()
        self._pods_informer = self.informer_factory.informer_for(PODS)
        self._nodes_informer = self.informer_factory.informer_for(NODES)
        self._wire_informers()

    @classmethod
    def from_config(cls, client: Client, config: Any, **kwargs: Any) -> "Scheduler":
        """Build from a :class:`kubeplane.scheduler.config.SchedulerConfig`."""
        return cls(
            client,
            profiles=config.framework_profiles(),
            percentage_of_nodes_to_score=config.percentage_of_nodes_to_score,
            pod_initial_backoff=config.pod_initial_backoff_seconds,
            pod_max_backoff=config.pod_max_backoff_seconds,
            parallelism=config.parallelism,
            **kwargs,
        )

    def _listers(self) -> tuple[NamespaceLabels, Callable[[], list[dict]], ObjectLister]:
        """Read-only views plugins use: namespaces (InterPodAffinity namespace
        selectors), PodDisruptionBudgets (preemption) and workload objects
        (PodTopologySpread's default selectors)."""
        namespaces = self.informer_factory.informer_for(resource("namespaces"))
        pdbs = self.informer_factory.informer_for(resource("poddisruptionbudgets"))
        by_plural = {"namespaces": namespaces, "poddisruptionbudgets": pdbs}

        def namespace_labels(ns: str) -> dict | None:
            obj = namespaces.indexer.get_by_key(ns)
            return None if obj is None else ((obj.get("metadata") or {}).get("labels") or {})

        def pdb_lister() -> list[dict]:
            return pdbs.indexer.list()

        def list_objects(plural: str, namespace: str | None = None) -> list[dict]:
            inf = by_plural.get(plural)
            if inf is None:
                try:
                    res = resource(plural)
                except KeyError:
                    return []
                inf = by_plural[plural] = self.informer_factory.informer_for(res)
                if inf.started is False and self._started:
                    inf.start()
            items = inf.indexer.list()
            if namespace:
                items = [o for o in items if (o.get("metadata") or {}).get("namespace") == namespace]
            return items

        return namespace_labels, pdb_lister, list_objects

    # -- event handlers ----------------------------------------------------

    def _responsible(self, pod: dict) -> bool:
        return ((pod.get("spec") or {}).get("schedulerName") or "default-scheduler") in self.frameworks

    @staticmethod
    def _assigned(pod: dict) -> bool:
        return bool((pod.get("spec") or {}).get("nodeName"))

    def _pod_by_name(self, namespace: str, name: str) -> dict | None:
        return self._pods_informer.indexer.get_by_key(f"{namespace}/{name}")

    def _informer_pod(self, pod: dict) -> dict | None:
        md = pod.get("metadata") or {}
        key = f"{md.get('namespace')}/{md.get('name')}"
        return self._pods_informer.indexer.get_by_key(key)

    def _wire_informers(self) -> None:
        self._registrations = [
            self._pods_informer.add_event_handler(self._on_pod_add, self._on_pod_update, self._on_pod_delete),
            self._nodes_informer.add_event_handler(self._on_node_add, self._on_node_update, self._on_node_delete),
        ]
        wanted: set[EventResource] = set()
        for fw in self.frameworks.values():
            for regs in fw.events_to_register().values():
                for reg in regs:
                    if reg.event.resource in EVENT_RESOURCES:
                        wanted.add(reg.event.resource)
        for er in sorted(wanted, key=lambda e: e.value):
            inf = self.informer_factory.informer_for(EVENT_RESOURCES[er])
            self._registrations.append(inf.add_event_handler(*self._generic_handlers(er)))

    def _generic_handlers(self, er: EventResource):
        def on_add(obj: dict) -> None:
            self.queue.move_all_to_active_or_backoff(ClusterEvent(er, ActionType.ADD, f"{er.value}Add"), None, obj)

        def on_update(old: dict, new: dict) -> None:
            self.queue.move_all_to_active_or_backoff(ClusterEvent(er, ActionType.UPDATE, f"{er.value}Update"),
                                                     old, new)

        def on_delete(obj: dict) -> None:
            self.queue.move_all_to_active_or_backoff(ClusterEvent(er, ActionType.DELETE, f"{er.value}Delete"),
                                                     _unwrap(obj), None)

        return on_add, on_update, on_delete

    def _on_pod_add(self, pod: dict) -> None:
        if self._assigned(pod):
            self.cache.add_pod(pod)
            self.queue.assigned_pod_added(pod)
        elif self._responsible(pod):
            self.queue.add(pod)

    def _on_pod_update(self, old: dict, new: dict) -> None:
        if self._assigned(new):
            if self._assigned(old):
                self.cache.update_pod(old, new)
                self.queue.assigned_pod_updated(old, new)
            else:
                # Bound by someone (usually us): leave the queue, enter the cache.
                self.queue.delete(old)
                self.cache.add_pod(new)
                self.queue.assigned_pod_added(new)
        elif self._responsible(new):
            self.queue.update(old, new)

    def _on_pod_delete(self, obj: Any) -> None:
        pod = _unwrap(obj)
        if self._assigned(pod):
            try:
                self.cache.remove_pod(pod)
            except Exception:  # noqa: BLE001 - the cache may never have seen it
                log.debug("pod %s not in cache", pod.get("metadata", {}).get("name"))
            self.queue.move_all_to_active_or_backoff(
                ClusterEvent(EventResource.ASSIGNED_POD, ActionType.DELETE, "AssignedPodDelete"), pod, None)
        else:
            self.queue.delete(pod)
            uid = (pod.get("metadata") or {}).get("uid", "")
            for fw in self.frameworks.values():
                fw.reject_waiting_pod(uid, msg="pod deleted")

    def _on_node_add(self, node: dict) -> None:
        self.cache.add_node(node)
        self.queue.move_all_to_active_or_backoff(ClusterEvent(EventResource.NODE, ActionType.ADD, "NodeAdd"),
                                                 None, node)

    def _on_node_update(self, old: dict, new: dict) -> None:
        self.cache.update_node(old, new)
        action = _node_update_action(old, new)
        if action:
            self.queue.move_all_to_active_or_backoff(ClusterEvent(EventResource.NODE, action, "NodeUpdate"),
                                                     old, new)

    def _on_node_delete(self, obj: Any) -> None:
        node = _unwrap(obj)
        try:
            self.cache.remove_node(node)
        except Exception:  # noqa: BLE001
            log.debug("node %s not in cache", node.get("metadata", {}).get("name"))

    # -- running ------------------------------------------------------------

    async def start(self) -> None:
        """Start informers and wait until their caches are synced."""
        self._started = True
        self.informer_factory.start()
        await self.informer_factory.wait_for_cache_sync(60)
        # Our handlers have seen the initial lists (client-go's handler HasSynced).
        for reg in self._registrations:
            await reg.wait_for_sync(60)

    async def run(self) -> None:
        """Schedule until :meth:`stop`."""
        await self.start()
        self._tasks.append(asyncio.create_task(self.queue.run()))
        self._tasks.append(asyncio.create_task(self._run_cache_cleanup()))
        try:
            while not self._stopped.is_set():
                if not await self.schedule_one():
                    break
                if self.metrics is not None:
                    self._export_queue_metrics()
        finally:
            for t in self._tasks:
                t.cancel()

    def _export_queue_metrics(self) -> None:
        """scheduler_pending_pods and scheduler_queue_incoming_pods_total from the queue's counts."""
        self.metrics.set_pending(self.queue.counts())
        seen = self._incoming_exported
        for (queue, event), n in self.queue.incoming_pods.items():
            delta = n - seen.get((queue, event), 0)
            if delta > 0:
                self.metrics.queue_incoming_pods.labels(queue, event).inc(delta)
                seen[(queue, event)] = n
        counts = self.queue.unschedulable_pods_by_plugin()
        for plugin, profile in self._unschedulable_exported - counts.keys():
            self.metrics.set_unschedulable(plugin, profile, 0)
        for (plugin, profile), n in counts.items():
            self.metrics.set_unschedulable(plugin, profile, n)
        self._unschedulable_exported = set(counts)

    async def _run_cache_cleanup(self, period: float = CACHE_CLEANUP_PERIOD) -> None:
        """Every ``period`` seconds, drop expired assumed pods and export
        scheduler_scheduler_cache_size, as upstream's cache cleanup loop."""
        while not self._stopped.is_set():
            self.cache.cleanup_assumed_pods()
            if self.metrics is not None:
                self.metrics.set_cache_size(*self.cache.sizes())
            try:
                await asyncio.wait_for(self._stopped.wait(), period)
            except asyncio.TimeoutError:
                pass

    async def stop(self, grace: float = 1.0) -> None:
        """Stop scheduling. Binding cycles get ``grace`` seconds to finish, then
        are cancelled (upstream cancels their context): a PreBind waiting for
        a controller must not hold shutdown for its whole bind timeout."""
        self._stopped.set()
        self.queue.close()
        if self._binding_tasks:
            _, pending = await asyncio.wait(set(self._binding_tasks), timeout=grace)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.recorder.close()
        await self.informer_factory.stop()

    # -- the scheduling cycle ------------------------------------------------

    async def schedule_one(self) -> bool:
        """One scheduling cycle. Returns False once the queue is closed."""
        pinfo = await self.queue.pop()
        if pinfo is None:
            return False
        pod = pinfo.pod
        fw = self.frameworks.get((pod.get("spec") or {}).get("schedulerName") or "default-scheduler")
        if fw is None:
            self.queue.done(pinfo.pod_uid)
            return True
        if (pod.get("metadata") or {}).get("deletionTimestamp") or self.cache.is_assumed(pod):
            self.queue.done(pinfo.pod_uid)
            return True
        start = self.clock()
        state = CycleState()
        state.record_metrics = self.metrics is not None and self.rng.random() < 0.1
        pod_info = PodInfo(pod)
        cycle = self.queue.scheduling_cycle
        try:
            result = self.schedule_pod(fw, state, pod_info)
        except FitError as fit:
            nominated = None
            if fw.has_post_filter_plugins():
                nominated, pf_status = fw.run_post_filter_plugins(state, pod_info, fit.diagnosis.node_to_status)
                msg = pf_status.message() if pf_status is not None else ""
                if pf_status is not None and pf_status.code == Code.ERROR:
                    log.warning("PostFilter for %s: %s", pinfo.key, msg)
                elif msg:
                    fit.diagnosis.post_filter_msg = msg
            await self._handle_failure(fw, pinfo, Status(Code.UNSCHEDULABLE, [str(fit)]), fit.diagnosis,
                                       cycle, nominated, start)
            return True
        except _CycleError as err:
            await self._handle_failure(fw, pinfo, err.status, None, cycle, None, start)
            return True
        # Assume: the cache now counts the pod on the chosen node. The assumed pod is a
        # new object only where it differs (pods from the informer are never modified).
        assumed = {**pod, "spec": {**(pod.get("spec") or {}), "nodeName": result.suggested_host}}
        assumed_info = pod_info.for_copy(assumed)
        try:
            self.cache.assume_pod(assumed, assumed_info)
        except Exception as exc:  # noqa: BLE001
            await self._handle_failure(fw, pinfo, Status.as_status(exc), None, cycle, None, start)
            return True
        self.nominator.delete_nominated_pod_if_exists(pod)
        s = fw.run_reserve_plugins_reserve(state, assumed_info, result.suggested_host)
        if s is not None and not s.is_success():
            fw.run_reserve_plugins_unreserve(state, assumed_info, result.suggested_host)
            self._forget(assumed)
            await self._handle_failure(fw, pinfo, s, self._diag_for(s), cycle, None, start)
            return True
        s = fw.run_permit_plugins(state, assumed_info, result.suggested_host)
        if s is not None and not s.is_success() and not s.is_wait():
            fw.run_reserve_plugins_unreserve(state, assumed_info, result.suggested_host)
            self._forget(assumed)
            await self._handle_failure(fw, pinfo, s, self._diag_for(s), cycle, None, start)
            return True
        task = asyncio.create_task(
            self._binding_cycle(fw, state, pinfo, assumed_info, result.suggested_host, cycle, start))
        self._binding_tasks.add(task)
        task.add_done_callback(self._binding_tasks.discard)
        # Let the binding cycle start before the next pod (cooperative fairness).
        # While binding cycles wait in PreBind, each on a chain of API writes and
        # informer events (volume binding: the PV controller's writes too),
        # give that chain more passes: upstream runs it on other goroutines,
        # and here a chain waiting on replies from another process would
        # otherwise advance one step per cycle, so pods would bind only once
        # the queue ran dry.
        await asyncio.sleep(0)
        if self._in_pre_bind and self.pre_bind_yield_passes:
            await yield_while_ready(self.pre_bind_yield_passes)
        return True

    def _diag_for(self, s: Status) -> Diagnosis:
        d = Diagnosis()
        if s.is_rejected() and s.plugin:
            (d.pending_plugins if s.code == Code.PENDING else d.unschedulable_plugins).add(s.plugin)
        return d

    def _forget(self, assumed: dict) -> bool:
        try:
            self.cache.forget_pod(assumed)
            return True
        except Exception:  # noqa: BLE001
            log.debug("forget failed", exc_info=True)
            return False

    def schedule_pod(self, fw: Framework, state: CycleState, pod_info: PodInfo) -> ScheduleResult:
        self.cache.update_snapshot(self.snapshot)
        fw.handle.snapshot = self.snapshot
        all_nodes = self.snapshot.node_info_list
        if not all_nodes:
            # Upstream returns ErrNoNodesAvailable: an error, not a FitError.
            raise _CycleError(Status(Code.ERROR, ["no nodes available to schedule pods"]))
        feasible, diagnosis, rows = self._find_feasible(fw, state, pod_info, all_nodes)
        if not feasible:
            raise FitError(pod_info.pod, len(all_nodes), diagnosis)
        if len(feasible) == 1:
            return ScheduleResult(feasible[0].name, len(feasible) + len(diagnosis.node_to_status), 1)
        s = fw.run_pre_score_plugins(state, pod_info, feasible)
        if s is not None and not s.is_success():
            raise _CycleError(s)
        if rows is not None:
            totals, s = fw.fast_path().score(state, pod_info, arrays_for(self.snapshot), rows, feasible)
            if s is not None and not s.is_success():
                raise _CycleError(s)
            host = feasible[select_host_index(totals, self.rng)].name
        else:
            scores, s = fw.run_score_plugins(state, pod_info, feasible)
            if s is not None and not s.is_success():
                raise _CycleError(s)
            host = self._select_host(scores)
        return ScheduleResult(host, len(feasible) + len(diagnosis.node_to_status), len(feasible))

    def _find_nodes_that_fit(
        self, fw: Framework, state: CycleState, pod_info: PodInfo, all_nodes: list[NodeInfo]
    ) -> tuple[list[NodeInfo], Diagnosis]:
        """PreFilter, the nominated-node shortcut, then Filter from the rotating start index."""
        feasible, diagnosis, _ = self._find_feasible(fw, state, pod_info, all_nodes)
        return feasible, diagnosis

    def _find_feasible(
        self, fw: Framework, state: CycleState, pod_info: PodInfo, all_nodes: list[NodeInfo]
    ) -> tuple[list[NodeInfo], Diagnosis, Any]:
        """Like ``_find_nodes_that_fit``; also the snapshot rows of the feasible
        nodes when the vectorised path ran (None otherwise)."""
        diagnosis = Diagnosis()
        result, s, plugins = fw.run_pre_filter_plugins(state, pod_info, all_nodes)
        if s is not None and not s.is_success():
            if not s.is_rejected():
                raise _CycleError(s)
            # Every node gets the PreFilter status.
            diagnosis.node_to_status.fill(all_nodes, s)
            (diagnosis.pending_plugins if s.code == Code.PENDING else diagnosis.unschedulable_plugins).update(
                plugins or ({s.plugin} if s.plugin else set()))
            diagnosis.pre_filter_msg = s.message()
            return [], diagnosis, None
        # A nominated node from an earlier preemption is tried first.
        nominated = (pod_info.pod.get("status") or {}).get("nominatedNodeName")
        if nominated:
            try:
                ni = self.snapshot.get(nominated)
            except Exception:  # noqa: BLE001 - node gone
                ni = None
            if ni is not None and (result is None or result.all_nodes() or nominated in (result.node_names or ())):
                st = fw.run_filter_plugins_with_nominated_pods(state, pod_info, ni)
                if st is None or st.is_success():
                    return [ni], diagnosis, None
        nodes = all_nodes
        allowed: set[str] | None = None
        if result is not None and not result.all_nodes():
            allowed = result.node_names or set()
            nodes = [ni for ni in all_nodes if ni.name in allowed]
            for ni in all_nodes:
                if ni.name not in allowed:
                    diagnosis.node_to_status[ni.name] = Status.unresolvable(
                        "node(s) didn't satisfy plugin(s) [" + ", ".join(sorted(plugins)) + "]" if plugins
                        else "node(s) didn't satisfy plugin(s)")
        if not fw.has_filter_plugins():
            return nodes, diagnosis, None
        num_to_find = num_feasible_nodes_to_find(
            fw.percentage_of_nodes_to_score if fw.percentage_of_nodes_to_score is not None
            else self.percentage_of_nodes_to_score, len(nodes))
        if not fw.has_score_plugins():
            num_to_find = 1
        n = len(nodes)
        if n == 0:
            return [], diagnosis, None
        if self.use_fast_path and all_nodes is self.snapshot.node_info_list:
            found = self._find_feasible_fast(fw, state, pod_info, all_nodes, allowed, num_to_find, diagnosis)
            if found is not None:
                return found[0], diagnosis, found[1]
        feasible: list[NodeInfo] = []
        start = self.next_start_node_index % n
        processed = 0
        for i in range(n):
            ni = nodes[(start + i) % n]
            processed += 1
            st = fw.run_filter_plugins_with_nominated_pods(state, pod_info, ni)
            if st is None or st.is_success():
                feasible.append(ni)
                if len(feasible) >= num_to_find:
                    break
                continue
            if not st.is_rejected():
                raise _CycleError(st)
            diagnosis.node_to_status[ni.name] = st
            if st.plugin:
                (diagnosis.pending_plugins if st.code == Code.PENDING else diagnosis.unschedulable_plugins).add(
                    st.plugin)
        self.next_start_node_index = (self.next_start_node_index + processed) % len(all_nodes)
        return feasible, diagnosis, None

    def _find_feasible_fast(
        self, fw: Framework, state: CycleState, pod_info: PodInfo, all_nodes: list[NodeInfo],
        allowed: set[str] | None, num_to_find: int, diagnosis: Diagnosis,
    ) -> tuple[list[NodeInfo], Any] | None:
        """The Filter loop over the snapshot's column arrays; None when it does not apply."""
        nominator = fw.handle.nominator
        nominated_rows: set[int] = set()
        arr = arrays_for(self.snapshot)
        if nominator is not None:
            listing = getattr(nominator, "nominated_nodes", None)
            if listing is None:
                return None
            if len(nominator):
                for name in listing():
                    row = arr.index.get(name)
                    if row is not None:
                        nominated_rows.add(row)
        cand = None
        if allowed is not None:
            cand = np.array(sorted(arr.index[nm] for nm in allowed if nm in arr.index), dtype=np.intp)
        m = len(cand) if cand is not None else len(all_nodes)
        start = self.next_start_node_index % m
        rows, processed, failed, err = fw.fast_path().find_feasible(
            state, pod_info, arr, cand, start, num_to_find, nominated_rows)
        if failed:
            node_to_status = diagnosis.node_to_status
            node_to_status.add_rejections(all_nodes, failed)
            for code, plugin in node_to_status.rejecting_plugins():
                if plugin:
                    (diagnosis.pending_plugins if code == Code.PENDING else diagnosis.unschedulable_plugins).add(
                        plugin)
        if err is not None:
            raise _CycleError(err)
        self.next_start_node_index = (self.next_start_node_index + processed) % len(all_nodes)
        return nodes_for_rows(all_nodes, rows), rows

    def _select_host(self, scores: list[NodePluginScores]) -> str:
        """Uniformly random among the highest total scores (one draw among the ties, in order)."""
        best = max(nps.total_score for nps in scores)
        ties = [nps for nps in scores if nps.total_score == best]
        if len(ties) == 1:
            return ties[0].name
        return ties[self.rng.randrange(len(ties))].name

    # -- binding cycle ---------------------------------------------------------

    async def _binding_cycle(self, fw: Framework, state: CycleState, pinfo: QueuedPodInfo, pod_info: PodInfo,
                             host: str, cycle: int, start: float) -> None:
        assumed = pod_info.pod
        try:
            s = await fw.wait_on_permit(pod_info)
            if s is not None and not s.is_success():
                await self._binding_failed(fw, state, pinfo, pod_info, host, s, cycle, start)
                return
            self.queue.done(pinfo.pod_uid)
            self._in_pre_bind += 1
            try:
                s = await fw.run_pre_bind_plugins(state, pod_info, host)
            finally:
                self._in_pre_bind -= 1
            if s is not None and not s.is_success():
                await self._binding_failed(fw, state, pinfo, pod_info, host, s, cycle, start)
                return
            s = await fw.run_bind_plugins(state, pod_info, host)
            if s is not None and not s.is_success():
                self.cache.finish_binding(assumed)
                await self._binding_failed(fw, state, pinfo, pod_info, host, s, cycle, start)
                return
            self.cache.finish_binding(assumed)
            md = assumed.get("metadata") or {}
            self.recorder.event(assumed, "Normal", "Scheduled",
                                f"Successfully assigned {md.get('namespace')}/{md.get('name')} to {host}",
                                action="Binding")
            await fw.run_post_bind_plugins(state, pod_info, host)
            if self.metrics is not None:
                elapsed = self.clock() - start
                self.metrics.observe_attempt("scheduled", fw.profile_name, elapsed)
                first = pinfo.initial_attempt_timestamp or pinfo.timestamp
                self.metrics.observe_sli(pinfo.attempts, max(0.0, self.clock() - first))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a plugin bug must not kill the scheduler
            log.exception("binding cycle for %s failed", pinfo.key)
            await self._binding_failed(fw, state, pinfo, pod_info, host, Status.as_status(exc), cycle, start)

    async def _binding_failed(self, fw: Framework, state: CycleState, pinfo: QueuedPodInfo, pod_info: PodInfo,
                              host: str, s: Status, cycle: int, start: float) -> None:
        fw.run_reserve_plugins_unreserve(state, pod_info, host)
        if self._forget(pod_info.pod):
            self.queue.move_all_to_active_or_backoff(
                ClusterEvent(EventResource.ASSIGNED_POD, ActionType.DELETE, "AssignedPodDelete"), pod_info.pod, None)
        diag = self._diag_for(s)
        await self._handle_failure(fw, pinfo, s, diag, cycle, None, start)

    # -- failure handling -------------------------------------------------------

    async def _handle_failure(self, fw: Framework, pinfo: QueuedPodInfo, s: Status, diagnosis: Diagnosis | None,
                              cycle: int, nominated_node: str | None, start: float) -> None:
        rejected = s.is_rejected()
        reason = "Unschedulable" if rejected else "SchedulerError"
        message = s.message() or "unknown error"
        if diagnosis is not None:
            pinfo.unschedulable_plugins = set(diagnosis.unschedulable_plugins)
            pinfo.pending_plugins = set(diagnosis.pending_plugins)
        if self.metrics is not None:
            self.metrics.observe_attempt("unschedulable" if rejected else "error", fw.profile_name,
                                         self.clock() - start)
        current = self._informer_pod(pinfo.pod)
        pod = pinfo.pod
        if current is None:
            self.queue.done(pinfo.pod_uid)
            log.debug("pod %s is gone; not requeued", pinfo.key)
            return
        if (current.get("spec") or {}).get("nodeName"):
            self.queue.done(pinfo.pod_uid)
            return
        pinfo.update(current)
        self.queue.add_unschedulable_if_not_present(pinfo, cycle)
        if nominated_node:
            self.nominator.add_nominated_pod(current, nominated_node)
        log.info("unable to schedule pod %s: %s", pinfo.key, message)
        self.recorder.event(pod, "Warning", "FailedScheduling", message, action="Scheduling")
        await self._update_pod_condition(current, reason, message, nominated_node)

    async def _update_pod_condition(self, pod: dict, reason: str, message: str, nominated: str | None) -> None:
        status = pod.get("status") or {}
        cond = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
        unchanged = (cond is not None and cond.get("status") == "False" and cond.get("reason") == reason
                     and cond.get("message") == message)
        if unchanged and (nominated is None or status.get("nominatedNodeName") == nominated):
            return
        new_cond = {"type": "PodScheduled", "status": "False", "reason": reason, "message": message,
                    "lastProbeTime": None, "lastTransitionTime": format_time(utcnow())}
        if cond is not None and cond.get("status") == "False" and cond.get("lastTransitionTime"):
            new_cond["lastTransitionTime"] = cond["lastTransitionTime"]
        patch: dict = {"status": {"conditions": [new_cond]}}
        if nominated is not None:
            patch["status"]["nominatedNodeName"] = nominated
        md = pod.get("metadata") or {}
        try:
            await self.client.patch(PODS, md.get("name"), patch, md.get("namespace"), patch_type="strategic",
                                    subresource="status", field_manager="kube-scheduler")
        except StatusError as err:
            log.debug("could not update pod condition for %s: %s", md.get("name"), err)


class _CycleError(Exception):
    def __init__(self, status: Status) -> None:
        super().__init__(status.message())
        self.status = status


def pod_names(pods: Iterable[dict]) -> list[str]:
    return [(p.get("metadata") or {}).get("name", "") for p in pods]
