"""Node lifecycle: node health monitoring, after upstream's
``pkg/controller/nodelifecycle``.

Every ``monitor_period`` (``--node-monitor-period``, 5 s) the controller looks
at every node. A node is heard from when its kubelet posts a Ready condition
with a new ``lastHeartbeatTime`` or renews its Lease in ``kube-node-lease``;
the time it was last heard from is kept in memory (the probe timestamp). When
that is longer ago than the grace period (``--node-monitor-grace-period``,
50 s; ``--node-startup-grace-period``, 60 s, for a node that never posted a
Ready condition, counted from its creation), the Ready, MemoryPressure,
DiskPressure and PIDPressure conditions become ``Unknown``: reason
``NodeStatusUnknown`` ("Kubelet stopped posting node status."), or
``NodeStatusNeverUpdated`` ("Kubelet never posted node status.") for a
condition that was never posted.

What follows from a node's conditions:

- NoSchedule taints mirror them (``node.kubernetes.io/not-ready`` for Ready
  False, ``unreachable`` for Unknown, ``memory-pressure``, ``disk-pressure``,
  ``pid-pressure``, ``network-unavailable``), and ``spec.unschedulable``
  (``kubectl cordon``) gives ``node.kubernetes.io/unschedulable``;
- a node that is not Ready gets the NoExecute ``not-ready`` or ``unreachable``
  taint (never both), through a rate-limited queue per zone (upstream's
  defaults, as constructor arguments: ``eviction_qps`` 0.1 nodes per second;
  in a zone where at least ``unhealthy_zone_threshold`` (55%) of more than
  two nodes are unhealthy, ``secondary_eviction_qps`` (0.01) above
  ``large_cluster_threshold`` (50) nodes and none in smaller zones); when
  every zone is fully disrupted the controller assumes its own network is at
  fault, removes the NoExecute taints and stops tainting, as upstream;
- its pods' Ready condition becomes False (with a ``NodeNotReady`` event), and
  the node gets a ``NodeNotReady`` event;
- once Ready again, the NoExecute taints go.

The taint-eviction controller (:mod:`kubeplane.controllers.tainteviction`)
deletes the pods that do not tolerate a NoExecute taint, after their
``tolerationSeconds``.

Time is read from ``clock`` (injectable): tests move it instead of waiting.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import logging
from dataclasses import dataclass
from typing import Callable

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import deep_copy, format_time, parse_time, utcnow
from kubeplane.api.resources import resource
from kubeplane.client.informer import SharedInformerFactory, unwrap_deleted
from kubeplane.client.interface import Client, Obj
from kubeplane.controllers.base import Controller

log = logging.getLogger(__name__)

NODES = resource("nodes")
PODS = resource("pods")
LEASES = resource("leases")
NODE_LEASE_NAMESPACE = "kube-node-lease"

NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
#: the condition types upstream marks Unknown (NetworkUnavailable is not its to change)
CONDITION_TYPES = ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure")
NEVER_UPDATED_REASON = "NodeStatusNeverUpdated"
NEVER_UPDATED_MESSAGE = "Kubelet never posted node status."
UNKNOWN_REASON = "NodeStatusUnknown"
UNKNOWN_MESSAGE = "Kubelet stopped posting node status."

#: upstream's nodeConditionToTaintKeyStatusMap: (condition, status) -> NoSchedule taint key
CONDITION_TAINTS = {
    ("Ready", "False"): NOT_READY_TAINT,
    ("Ready", "Unknown"): UNREACHABLE_TAINT,
    ("MemoryPressure", "True"): "node.kubernetes.io/memory-pressure",
    ("DiskPressure", "True"): "node.kubernetes.io/disk-pressure",
    ("NetworkUnavailable", "True"): "node.kubernetes.io/network-unavailable",
    ("PIDPressure", "True"): "node.kubernetes.io/pid-pressure",
}
_CONDITION_TAINT_KEYS = frozenset(CONDITION_TAINTS.values())

#: nodes with this label are left out of the zones' disruption counts
EXCLUDE_DISRUPTION_LABEL = "node.kubernetes.io/exclude-disruption"

DEFAULT_STARTUP_GRACE = 60.0
DEFAULT_MONITOR_GRACE = 50.0
DEFAULT_MONITOR_PERIOD = 5.0
DEFAULT_EVICTION_QPS = 0.1
DEFAULT_SECONDARY_EVICTION_QPS = 0.01
DEFAULT_LARGE_CLUSTER_THRESHOLD = 50
DEFAULT_UNHEALTHY_ZONE_THRESHOLD = 0.55

# zone states
INITIAL, NORMAL, FULL_DISRUPTION, PARTIAL_DISRUPTION = "Initial", "Normal", "FullDisruption", "PartialDisruption"


def _conditions(node: Obj) -> list[Obj]:
    conds = (node.get("status") or {}).get("conditions")
    return [c for c in conds if isinstance(c, dict)] if isinstance(conds, list) else []


def node_condition(node: Obj, ctype: str) -> Obj | None:
    for c in _conditions(node):
        if c.get("type") == ctype:
            return c
    return None


def ready_condition(node: Obj) -> Obj | None:
    return node_condition(node, "Ready")


def _taints(node: Obj) -> list[Obj]:
    return [t for t in (node.get("spec") or {}).get("taints") or [] if isinstance(t, dict)]


def _has_taint(node: Obj, key: str, effect: str) -> bool:
    return any(t.get("key") == key and t.get("effect") == effect for t in _taints(node))


def zone_key(node: Obj) -> str:
    """upstream's GetZoneKey: region and zone (stable or beta labels), "" when neither."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    region = labels.get("topology.kubernetes.io/region") or labels.get("failure-domain.beta.kubernetes.io/region", "")
    zone = labels.get("topology.kubernetes.io/zone") or labels.get("failure-domain.beta.kubernetes.io/zone", "")
    if not region and not zone:
        return ""
    return f"{region}:\x00:{zone}"


def _seconds(t: _dt.datetime) -> float:
    return t.timestamp()


def _time_or(text: object, default: _dt.datetime) -> _dt.datetime:
    if isinstance(text, str) and text:
        try:
            return parse_time(text)
        except ValueError:
            pass
    return default


class TokenBucket:
    """client-go's token bucket (burst 1 here) on the controller's clock; qps 0 never accepts."""

    def __init__(self, qps: float, now: float, burst: int = 1) -> None:
        self.qps = qps
        self.burst = burst
        self.tokens = float(burst)
        self.last = now

    def try_accept(self, now: float) -> bool:
        if self.qps <= 0:
            return False
        self.tokens = min(float(self.burst), self.tokens + max(0.0, now - self.last) * self.qps)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def next_token_in(self, now: float) -> float:
        if self.qps <= 0:
            return float("inf")
        missing = 1.0 - (self.tokens + max(0.0, now - self.last) * self.qps)
        return max(0.0, missing / self.qps)


class RateLimitedTimedQueue:
    """upstream's RateLimitedTimedQueue: node names in the order they were
    added, each taken when due and when the zone's limiter allows."""

    def __init__(self, qps: float, now: float) -> None:
        self.limiter = TokenBucket(qps, now)
        self.items: dict[str, float] = {}
        #: names processed: out of the queue but remembered, so they are not
        #: queued again until removed (upstream's UniqueQueue.RemoveFromQueue)
        self.done: set[str] = set()

    def add(self, name: str, now: float) -> bool:
        if name in self.items or name in self.done:
            return False
        self.items[name] = now
        return True

    def remove(self, name: str) -> bool:
        was = name in self.done
        self.done.discard(name)
        return self.items.pop(name, None) is not None or was

    def finish(self, name: str) -> None:
        if self.items.pop(name, None) is not None:
            self.done.add(name)

    def swap_limiter(self, qps: float, now: float) -> None:
        if self.limiter.qps != qps:
            self.limiter = TokenBucket(qps, now)

    def due(self, now: float) -> list[str]:
        """The names the limiter lets through now, in order (they stay queued until removed)."""
        out = []
        for name, at in sorted(self.items.items(), key=lambda kv: kv[1]):
            if at > now or not self.limiter.try_accept(now):
                break
            out.append(name)
        return out

    def retry_later(self, name: str, at: float) -> None:
        if name in self.items:
            self.items[name] = at


@dataclass
class NodeHealth:
    """What the controller remembers of a node between passes (upstream's nodeHealthData)."""

    probe_timestamp: _dt.datetime
    ready_transition_timestamp: _dt.datetime
    #: the Ready condition last seen (None: never posted)
    ready: Obj | None
    lease_renew: _dt.datetime | None = None


def pod_node_index(pod: Obj) -> list[str]:
    node = (pod.get("spec") or {}).get("nodeName")
    return [node] if node else []


NODE_NAME_INDEX = "spec.nodeName"


class NodeLifecycleController(Controller):
    def __init__(self, client: Client, factory: SharedInformerFactory | None = None, *,
                 startup_grace: float = DEFAULT_STARTUP_GRACE,
                 monitor_grace: float = DEFAULT_MONITOR_GRACE,
                 monitor_period: float = DEFAULT_MONITOR_PERIOD,
                 eviction_qps: float = DEFAULT_EVICTION_QPS,
                 secondary_eviction_qps: float = DEFAULT_SECONDARY_EVICTION_QPS,
                 large_cluster_threshold: int = DEFAULT_LARGE_CLUSTER_THRESHOLD,
                 unhealthy_zone_threshold: float = DEFAULT_UNHEALTHY_ZONE_THRESHOLD,
                 clock: Callable[[], _dt.datetime] = utcnow) -> None:
        super().__init__("node-lifecycle-controller", client, factory)
        self.recorder.component = "node-controller"  # upstream's event source
        self.recorder.instance = "node-controller"
        self.startup_grace = startup_grace
        self.monitor_grace = monitor_grace
        self.monitor_period = monitor_period
        self.eviction_qps = eviction_qps
        self.secondary_eviction_qps = secondary_eviction_qps
        self.large_cluster_threshold = large_cluster_threshold
        self.unhealthy_zone_threshold = unhealthy_zone_threshold
        self.clock = clock
        self.health: dict[str, NodeHealth] = {}
        self.known: dict[str, Obj] = {}
        self.zone_states: dict[str, str] = {}
        self.zone_tainters: dict[str, RateLimitedTimedQueue] = {}
        self._retry_mark_pods: set[str] = set()
        self.nodes = self.factory.informer_for(NODES)
        self.leases = self.factory.informer_for(LEASES, NODE_LEASE_NAMESPACE)
        self.pods = self.factory.informer_for(PODS)
        try:
            self.pods.add_indexers({NODE_NAME_INDEX: pod_node_index})
        except ValueError:
            pass  # another controller of the factory indexes it the same way
        self.nodes.add_event_handler(self._node_changed, lambda _o, n: self._node_changed(n), None)
        self.pods.add_event_handler(lambda p: self._pod_changed(None, p), self._pod_changed, None)
        self.add_queue("nodes", self.sync_no_schedule_taints)
        self.add_queue("monitor", self._monitor)
        self.add_queue("pods", self.sync_pod)

    async def start(self, sync_timeout: float | None = 30.0) -> None:
        await super().start(sync_timeout)
        self.queue("monitor").add("all")

    # -- events ------------------------------------------------------------------

    def _node_changed(self, obj: Obj) -> None:
        node = unwrap_deleted(obj)
        if isinstance(node, dict):
            self.queue("nodes").add((node.get("metadata") or {}).get("name", ""))

    def _pod_changed(self, old: Obj | None, new: Obj) -> None:
        node = (new.get("spec") or {}).get("nodeName")
        if node and (old is None or (old.get("spec") or {}).get("nodeName") != node):
            md = new.get("metadata") or {}
            self.queue("pods").add(f"{md.get('namespace')}/{md.get('name')}")

    # -- NoSchedule taints from conditions -----------------------------------------

    async def sync_no_schedule_taints(self, name: str) -> None:
        """upstream's doNoScheduleTaintingPass."""
        node = self.nodes.indexer.get_by_key(name)
        if node is None:
            return
        wanted = []
        for c in _conditions(node):
            key = CONDITION_TAINTS.get((c.get("type"), c.get("status")))
            if key:
                wanted.append(key)
        if (node.get("spec") or {}).get("unschedulable") is True:
            wanted.append(UNSCHEDULABLE_TAINT)
        have = {t.get("key") for t in _taints(node) if t.get("effect") == "NoSchedule"
                and (t.get("key") in _CONDITION_TAINT_KEYS or t.get("key") == UNSCHEDULABLE_TAINT)}
        add = [k for k in dict.fromkeys(wanted) if k not in have]
        remove = [k for k in have if k not in wanted]
        if add or remove:
            await self.swap_taints(name, [(k, "NoSchedule") for k in add], [(k, "NoSchedule") for k in remove])

    async def swap_taints(self, name: str, add: list[tuple[str, str]], remove: list[tuple[str, str]],
                          node: Obj | None = None) -> Obj | None:
        """upstream's SwapNodeControllerTaint: add the taints (timeAdded now),
        remove others, as one write pinned to the version read (a conflict
        reads the node again)."""
        stamp = format_time(self.clock())
        for attempt in range(5):
            if node is None or attempt:
                try:
                    node = await self.client.get(NODES, name)
                except StatusError as err:
                    if err.code == 404:
                        return None
                    raise
            taints = _taints(node)
            gone = set(remove)
            new = [t for t in taints if (t.get("key"), t.get("effect")) not in gone]
            for key, effect in add:
                new = [t for t in new if (t.get("key"), t.get("effect")) != (key, effect)]
                new.append({"key": key, "effect": effect, "timeAdded": stamp})
            if new == taints:
                return node
            rv = (node.get("metadata") or {}).get("resourceVersion")
            try:
                return await self.client.patch(NODES, name, {"metadata": {"resourceVersion": rv},
                                                             "spec": {"taints": new or None}})
            except StatusError as err:
                if err.code == 404:
                    return None
                if err.code != 409 or attempt == 4:
                    raise
        return None

    # -- health monitoring ---------------------------------------------------------

    async def _monitor(self, key: str) -> None:
        try:
            await self.monitor_node_health()
        finally:
            if self.running:
                self.queue("monitor").add_after(key, self.monitor_period)

    def _now(self) -> _dt.datetime:
        return self.clock()

    async def monitor_node_health(self) -> None:
        """One pass over every node (upstream's monitorNodeHealth)."""
        nodes = sorted(self.nodes.indexer.list(), key=lambda n: n["metadata"]["name"])
        names = {n["metadata"]["name"] for n in nodes}
        now_s = _seconds(self._now())
        for node in nodes:
            name = node["metadata"]["name"]
            zone = zone_key(node)
            if zone not in self.zone_states:
                self.zone_states[zone] = INITIAL
                self.zone_tainters[zone] = RateLimitedTimedQueue(self.eviction_qps, now_s)
            if name not in self.known:
                self.known[name] = node
                self._node_event(node, "Normal", "RegisteredNode", f"Registered Node {name} in Controller")
                await self.mark_reachable(node)
        for name in [n for n in self.known if n not in names]:
            node = self.known.pop(name)
            self.health.pop(name, None)
            self._node_event(node, "Normal", "RemovingNode", f"Removing Node {name} from Controller")

        zone_conditions: dict[str, list[Obj | None]] = {}
        for i, node in enumerate(nodes):
            if i and i % 500 == 0:
                await asyncio.sleep(0)  # a pass over thousands of nodes lets the rest of the process run
            name = node["metadata"]["name"]
            try:
                observed, current, node = await self._update_health_with_retries(node)
            except StatusError as err:
                log.warning("updating the health of node %s failed, no pods will be evicted: %s", name, err)
                continue
            if node is None:
                continue
            labels = (node.get("metadata") or {}).get("labels") or {}
            if EXCLUDE_DISRUPTION_LABEL not in labels:
                zone_conditions.setdefault(zone_key(node), []).append(current)
            if current is None:
                continue
            await self._process_taint_based_eviction(node, current)
            status, was = current.get("status"), observed.get("status")
            retry = name in self._retry_mark_pods
            if status != "True" and was == "True":
                self._node_event(node, "Normal", "NodeNotReady", f"Node {name} status is now: NodeNotReady")
            if (status != "True" and was == "True") or (retry and was != "True"):
                try:
                    await self.mark_pods_not_ready(name)
                except StatusError as err:
                    log.warning("marking the pods of node %s not ready failed, retrying: %s", name, err)
                    self._retry_mark_pods.add(name)
                    continue
            self._retry_mark_pods.discard(name)
        await self._handle_disruption(zone_conditions, nodes)
        await self.do_no_execute_tainting_pass()

    async def _update_health_with_retries(self, node: Obj) -> tuple[Obj, Obj | None, Obj | None]:
        for attempt in range(5):
            try:
                observed, current = await self.try_update_node_health(node)
                return observed, current, node
            except StatusError as err:
                if err.code != 409 or attempt == 4:
                    raise
                try:
                    node = await self.client.get(NODES, node["metadata"]["name"])
                except StatusError as get_err:
                    if get_err.code == 404:
                        return {}, None, None
                    raise
        raise AssertionError("unreachable")

    async def try_update_node_health(self, node: Obj) -> tuple[Obj, Obj | None]:
        """upstream's tryUpdateNodeHealth: (the Ready condition as observed,
        the Ready condition now). ``node`` is updated in place when its
        conditions become Unknown."""
        name = node["metadata"]["name"]
        now = self._now()
        created = _time_or((node.get("metadata") or {}).get("creationTimestamp"), now)
        health = self.health.get(name)
        current = ready_condition(node)
        if current is None:
            observed: Obj = {"type": "Ready", "status": "Unknown",
                             "lastHeartbeatTime": node["metadata"].get("creationTimestamp"),
                             "lastTransitionTime": node["metadata"].get("creationTimestamp")}
            grace = self.startup_grace
            if health is None:
                health = NodeHealth(created, created, None)
            else:
                health.ready = None
        else:
            observed = dict(current)
            grace = self.monitor_grace
        saved = health.ready if health is not None else None
        if health is None:
            health = NodeHealth(now, now, dict(current) if current else None)
        elif saved is None and current is not None:
            health = NodeHealth(now, now, dict(current), health.lease_renew)
        elif saved is not None and current is not None and \
                saved.get("lastHeartbeatTime") != current.get("lastHeartbeatTime"):
            transition = now if saved.get("lastTransitionTime") != current.get("lastTransitionTime") \
                else health.ready_transition_timestamp
            health = NodeHealth(now, transition, dict(current), health.lease_renew)
        # A renewed Lease counts as hearing from the node.
        lease = self.leases.indexer.get_by_key(f"{NODE_LEASE_NAMESPACE}/{name}")
        renew = (lease.get("spec") or {}).get("renewTime") if lease else None
        if isinstance(renew, str) and renew:
            try:
                renewed = parse_time(renew)
            except ValueError:
                renewed = None
            if renewed is not None and (health.lease_renew is None or health.lease_renew < renewed):
                health.lease_renew = renewed
                health.probe_timestamp = now
        self.health[name] = health

        if now > health.probe_timestamp + _dt.timedelta(seconds=grace):
            stamp = format_time(now)
            new = deep_copy(node)
            conds = new.setdefault("status", {}).setdefault("conditions", [])
            if not isinstance(conds, list):
                conds = new["status"]["conditions"] = []
            for ctype in CONDITION_TYPES:
                cond = next((c for c in conds if isinstance(c, dict) and c.get("type") == ctype), None)
                if cond is None:
                    conds.append({"type": ctype, "status": "Unknown",
                                  "lastHeartbeatTime": node["metadata"].get("creationTimestamp"),
                                  "lastTransitionTime": stamp,
                                  "reason": NEVER_UPDATED_REASON, "message": NEVER_UPDATED_MESSAGE})
                elif cond.get("status") != "Unknown":
                    cond.update(status="Unknown", reason=UNKNOWN_REASON, message=UNKNOWN_MESSAGE,
                                lastTransitionTime=stamp)
            now_ready = ready_condition(new)
            if now_ready != observed:
                log.info("node %s: not heard from for %.0fs; conditions set to Unknown", name,
                         (now - health.probe_timestamp).total_seconds())
                updated = await self.client.update(NODES, new, subresource="status")
                node.clear()
                node.update(updated)
                self.health[name] = NodeHealth(health.probe_timestamp, now, dict(ready_condition(updated) or {}),
                                               health.lease_renew)
                return observed, ready_condition(updated)
        return observed, current

    async def _process_taint_based_eviction(self, node: Obj, ready: Obj) -> None:
        name = node["metadata"]["name"]
        status = ready.get("status")
        if status == "False":
            if _has_taint(node, UNREACHABLE_TAINT, "NoExecute"):
                await self.swap_taints(name, [(NOT_READY_TAINT, "NoExecute")], [(UNREACHABLE_TAINT, "NoExecute")],
                                       node)
            else:
                self._mark_for_tainting(node, NOT_READY_TAINT)
        elif status == "Unknown":
            if _has_taint(node, NOT_READY_TAINT, "NoExecute"):
                await self.swap_taints(name, [(UNREACHABLE_TAINT, "NoExecute")], [(NOT_READY_TAINT, "NoExecute")],
                                       node)
            else:
                self._mark_for_tainting(node, UNREACHABLE_TAINT)
        elif status == "True":
            if await self.mark_reachable(node):
                log.info("node %s is healthy again, removed its NoExecute taints", name)

    def _mark_for_tainting(self, node: Obj, key: str) -> bool:
        tainter = self._tainter(node)
        name = node["metadata"]["name"]
        if not _has_taint(node, key, "NoExecute"):
            tainter.remove(name)
        return tainter.add(name, _seconds(self._now()))

    def _tainter(self, node: Obj) -> RateLimitedTimedQueue:
        zone = zone_key(node)
        if zone not in self.zone_tainters:
            self.zone_states.setdefault(zone, INITIAL)
            self.zone_tainters[zone] = RateLimitedTimedQueue(self.eviction_qps, _seconds(self._now()))
        return self.zone_tainters[zone]

    async def mark_reachable(self, node: Obj) -> bool:
        """Remove the NoExecute not-ready and unreachable taints; True if the node was queued for tainting."""
        remove = [(k, "NoExecute") for k in (UNREACHABLE_TAINT, NOT_READY_TAINT) if _has_taint(node, k, "NoExecute")]
        if remove:
            await self.swap_taints(node["metadata"]["name"], [], remove, node)
        return self._tainter(node).remove(node["metadata"]["name"])

    async def do_no_execute_tainting_pass(self) -> None:
        """Taint the queued nodes as far as each zone's limiter allows (upstream's doNoExecuteTaintingPass)."""
        now_s = _seconds(self._now())
        for tainter in list(self.zone_tainters.values()):
            for name in tainter.due(now_s):
                node = self.nodes.indexer.get_by_key(name)
                if node is None:
                    tainter.remove(name)
                    continue
                ready = ready_condition(node)
                if ready is None:
                    tainter.retry_later(name, now_s + 0.05)
                    continue
                if ready.get("status") == "False":
                    add, opposite = NOT_READY_TAINT, UNREACHABLE_TAINT
                elif ready.get("status") == "Unknown":
                    add, opposite = UNREACHABLE_TAINT, NOT_READY_TAINT
                else:
                    tainter.remove(name)  # ready again
                    continue
                try:
                    await self.swap_taints(name, [(add, "NoExecute")], [(opposite, "NoExecute")])
                except StatusError as err:
                    log.warning("tainting node %s failed: %s", name, err)
                    tainter.retry_later(name, now_s + 1.0)
                    continue
                tainter.finish(name)

    def compute_zone_state(self, conditions: list[Obj | None]) -> tuple[int, str]:
        ready = sum(1 for c in conditions if c is not None and c.get("status") == "True")
        not_ready = len(conditions) - ready
        if ready == 0 and not_ready > 0:
            return not_ready, FULL_DISRUPTION
        if not_ready > 2 and not_ready / (not_ready + ready) >= self.unhealthy_zone_threshold:
            return not_ready, PARTIAL_DISRUPTION
        return not_ready, NORMAL

    def _zone_qps(self, state: str, size: int) -> float:
        if state == PARTIAL_DISRUPTION:
            return self.secondary_eviction_qps if size > self.large_cluster_threshold else 0.0
        return self.eviction_qps  # Normal, and FullDisruption of one zone among healthy ones

    async def _handle_disruption(self, zone_conditions: dict[str, list[Obj | None]], nodes: list[Obj]) -> None:
        now = self._now()
        new_states = {z: self.compute_zone_state(c)[1] for z, c in zone_conditions.items()}
        if not new_states:
            self.zone_states.clear()
            return
        all_fully_disrupted = all(s == FULL_DISRUPTION for s in new_states.values()) and bool(new_states)
        for z in new_states:
            self.zone_states.setdefault(z, INITIAL)
        for z in [z for z in self.zone_states if z not in zone_conditions]:
            del self.zone_states[z]  # no node of the zone is left
        all_were_fully_disrupted = all(s == FULL_DISRUPTION for s in self.zone_states.values())
        if all_fully_disrupted and all_were_fully_disrupted:
            return
        if all_fully_disrupted:
            log.info("every node is not ready: entering master disruption mode (no NoExecute taints)")
            for node in nodes:
                try:
                    await self.mark_reachable(node)
                except StatusError as err:
                    log.warning("removing the taints of node %s failed: %s", node["metadata"]["name"], err)
            for z in self.zone_states:
                self.zone_tainters[z].swap_limiter(0.0, _seconds(now))
                self.zone_states[z] = FULL_DISRUPTION
            return
        if all_were_fully_disrupted:
            log.info("some nodes are ready: exiting master disruption mode")
            for node in nodes:
                h = self.health.get(node["metadata"]["name"])
                if h is not None:
                    h.probe_timestamp = now
                    h.ready_transition_timestamp = now
            for z in self.zone_states:
                self.zone_tainters[z].swap_limiter(self._zone_qps(new_states[z], len(zone_conditions[z])),
                                                   _seconds(now))
                self.zone_states[z] = new_states[z]
            return
        for z, state in list(self.zone_states.items()):
            new = new_states[z]
            if state == new:
                continue
            log.info("zone %r is now in state %s", z, new)
            self.zone_tainters[z].swap_limiter(self._zone_qps(new, len(zone_conditions[z])), _seconds(now))
            self.zone_states[z] = new

    # -- pods ----------------------------------------------------------------------

    async def mark_pods_not_ready(self, node_name: str) -> None:
        """upstream's MarkPodsNotReady: the Ready condition of the node's pods becomes False."""
        failed: StatusError | None = None
        for pod in list(self.pods.indexer.by_index(NODE_NAME_INDEX, node_name)):
            try:
                await self._mark_pod_not_ready(pod)
            except StatusError as err:
                failed = err
        if failed is not None:
            raise failed

    async def _mark_pod_not_ready(self, pod: Obj) -> None:
        conds = (pod.get("status") or {}).get("conditions") or []
        ready = next((c for c in conds if isinstance(c, dict) and c.get("type") == "Ready"), None)
        if ready is None or ready.get("status") == "False":
            return
        new = deep_copy(pod)
        for c in new["status"]["conditions"]:
            if isinstance(c, dict) and c.get("type") == "Ready":
                c["status"] = "False"
                c["lastTransitionTime"] = format_time(self._now())
        try:
            await self.client.update(PODS, new, subresource="status")
        except StatusError as err:
            if err.code == 404:
                return
            raise
        self.recorder.event(new, "Warning", "NodeNotReady", "Node is not ready")

    async def sync_pod(self, key: str) -> None:
        """A pod newly on a node that is not Ready is marked not ready too (upstream's processPod)."""
        pod = self.pods.indexer.get_by_key(key)
        if pod is None:
            return
        node_name = (pod.get("spec") or {}).get("nodeName")
        health = self.health.get(node_name or "")
        if health is None or health.ready is None or self.nodes.indexer.get_by_key(node_name) is None:
            return
        if health.ready.get("status") != "True":
            await self._mark_pod_not_ready(pod)

    def _node_event(self, node: Obj, type_: str, reason: str, message: str) -> None:
        md = node.get("metadata") or {}
        ref = {"kind": "Node", "apiVersion": "v1", "metadata": {"name": md.get("name", ""), "uid": md.get("uid", "")}}
        self.recorder.event(ref, type_, reason, message)


__all__ = [
    "NEVER_UPDATED_MESSAGE", "NEVER_UPDATED_REASON", "NOT_READY_TAINT", "NodeLifecycleController",
    "UNKNOWN_MESSAGE", "UNKNOWN_REASON", "UNREACHABLE_TAINT", "UNSCHEDULABLE_TAINT", "ready_condition",
]
