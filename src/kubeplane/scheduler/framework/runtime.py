"""The framework runtime: one instance per scheduling profile.

Builds the per-extension-point plugin lists from a profile (the
``profiles[]`` entry of a KubeSchedulerConfiguration) merged with the default
MultiPoint plugins as upstream does, and runs each extension point with
upstream's semantics (status plugin attribution, PreFilter result
intersection, Skip handling, score weights and range checks, reverse
Unreserve, Permit waiting with capped timeouts, Bind until non-Skip).
"""

from __future__ import annotations

from time import perf_counter

import asyncio
from dataclasses import dataclass, field
from typing import Any, Mapping

from kubeplane.api.gofmt import go_duration, go_list
from kubeplane.scheduler.framework.fastpath import FastPath
from kubeplane.scheduler.framework.nodeinfo import NodeInfo, PodInfo
from kubeplane.scheduler.framework.plugin import EXTENSION_METHODS, Handle, Plugin, implements
from kubeplane.scheduler.framework.registry import default_multi_point
from kubeplane.scheduler.framework.types import (
    ActionType,
    ClusterEvent,
    ClusterEventWithHint,
    Code,
    CycleState,
    EventResource,
    MAX_NODE_SCORE,
    MIN_NODE_SCORE,
    PreFilterResult,
    Status,
    invalid_score_status,
)

#: Permit wait timeouts are capped at this many seconds.
MAX_PERMIT_TIMEOUT = 15 * 60.0

#: Registered for plugins that do not say which events they care about.
ALL_EVENTS = ClusterEventWithHint(ClusterEvent(EventResource.WILDCARD, ActionType.ALL, "*"))

#: Extension points in the order the framework builds them.
EXTENSION_POINTS = [
    "preEnqueue", "queueSort", "preFilter", "filter", "postFilter", "preScore", "score",
    "reserve", "permit", "preBind", "bind", "postBind",
]

# Extension points whose plugins can reject a pod (and so need events).
_REJECTING_POINTS = ("preEnqueue", "preFilter", "filter", "reserve", "permit", "preBind")


class FrameworkError(ValueError):
    """Invalid profile: unknown plugin, plugin not implementing a point, bad combination."""


# --------------------------------------------------------------------------- profile merging


def _plugin_set(raw: Mapping[str, Any] | None) -> dict[str, list[dict]]:
    raw = raw or {}
    return {"enabled": [dict(p) for p in raw.get("enabled") or ()], "disabled": [dict(p) for p in raw.get("disabled") or ()]}


def merge_plugin_set(default: Mapping[str, Any] | None, custom: Mapping[str, Any] | None) -> dict[str, list[dict]]:
    """Merge a user's plugin set into the default one as upstream's config defaulting does.

    Disabled names (or ``*``) remove defaults; a custom entry naming a default
    plugin replaces it in place (e.g. a new weight); other custom entries are
    appended. ``disabled`` is kept so MultiPoint expansion can honour it.
    """
    d, c = _plugin_set(default), _plugin_set(custom)
    disabled = {p.get("name") for p in c["disabled"]}
    custom_idx = {p.get("name"): i for i, p in enumerate(c["enabled"])}
    replaced: set[int] = set()
    enabled: list[dict] = []
    if "*" not in disabled:
        for p in d["enabled"]:
            if p.get("name") in disabled:
                continue
            i = custom_idx.get(p.get("name"))
            if i is not None:
                p = c["enabled"][i]
                replaced.add(i)
            enabled.append(p)
    enabled.extend(p for i, p in enumerate(c["enabled"]) if i not in replaced)
    return {"enabled": enabled, "disabled": c["disabled"]}


def merge_profile_plugins(
    custom: Mapping[str, Any] | None, default_multi: list[dict] | None
) -> dict[str, dict[str, list[dict]]]:
    """Full plugin config of a profile: defaults (MultiPoint) merged with ``custom``."""
    custom = custom or {}
    out: dict[str, dict[str, list[dict]]] = {}
    for ep in ["multiPoint", *EXTENSION_POINTS]:
        default = {"enabled": default_multi or []} if ep == "multiPoint" else None
        out[ep] = merge_plugin_set(default, custom.get(ep))
    return out


# --------------------------------------------------------------------------- waiting pods


class WaitingPod:
    """A pod parked at Permit until every waiting plugin allows it, one rejects, or a timeout fires."""

    def __init__(self, pod_info: PodInfo, plugin_timeouts: Mapping[str, float]) -> None:
        self.pod_info = pod_info
        self.pending: set[str] = set(plugin_timeouts)
        loop = asyncio.get_running_loop()
        self._future: asyncio.Future[Status] = loop.create_future()
        self._timers: list[asyncio.TimerHandle] = []
        for plugin, timeout in plugin_timeouts.items():
            msg = f"rejected due to timeout after waiting {go_duration(timeout)} at plugin {plugin}"
            self._timers.append(loop.call_later(timeout, self.reject, plugin, msg))

    def get_pending_plugins(self) -> list[str]:
        return sorted(self.pending)

    def allow(self, plugin: str) -> None:
        self.pending.discard(plugin)
        if not self.pending:
            self._finish(Status.success())

    def reject(self, plugin: str, msg: str) -> None:
        self._finish(Status.unschedulable(msg, plugin=plugin))

    def _finish(self, status: Status) -> None:
        if self._future.done():
            return
        for t in self._timers:
            t.cancel()
        self._future.set_result(status)

    async def wait(self) -> Status:
        return await self._future


# --------------------------------------------------------------------------- scores


@dataclass(slots=True)
class NodePluginScores:
    """Scores of one node: weighted per-plugin scores and their sum."""

    name: str
    scores: list[tuple[str, int]] = field(default_factory=list)
    total_score: int = 0


# --------------------------------------------------------------------------- framework


class Framework:
    """Runs the plugins of one profile at each extension point."""

    def __init__(
        self,
        registry: Mapping[str, type[Plugin]],
        profile: Mapping[str, Any] | None = None,
        handle: Handle | None = None,
        *,
        default_plugins: list[dict] | None = None,
    ) -> None:
        profile = profile or {}
        self.profile_name: str = profile.get("schedulerName") or "default-scheduler"
        self.percentage_of_nodes_to_score: int | None = profile.get("percentageOfNodesToScore")
        self.handle = handle or Handle()
        self.handle.framework = self
        multi = default_multi_point(registry) if default_plugins is None else default_plugins
        self.plugin_config = merge_profile_plugins(profile.get("plugins"), multi)
        args: dict[str, dict] = {}
        for pc in profile.get("pluginConfig") or ():
            args[pc.get("name")] = dict(pc.get("args") or {})

        needed: list[str] = []
        for ep_set in self.plugin_config.values():
            for p in ep_set["enabled"]:
                if p.get("name") not in needed:
                    needed.append(p["name"])
        self.plugins: dict[str, Plugin] = {}
        for name in needed:
            cls = registry.get(name)
            if cls is None:
                raise FrameworkError(f'plugin "{name}" does not exist')
            self.plugins[name] = cls(args.get(name), self.handle)

        self.score_weights: dict[str, int] = {}
        self.points: dict[str, list[Plugin]] = {}
        for ep in EXTENSION_POINTS:
            self.points[ep] = [self.plugins[n] for n in self._expand(ep)]

        self.pre_enqueue_plugins = self.points["preEnqueue"]
        self.pre_filter_plugins = self.points["preFilter"]
        self.filter_plugins = self.points["filter"]
        self.post_filter_plugins = self.points["postFilter"]
        self.pre_score_plugins = self.points["preScore"]
        self.score_plugins = self.points["score"]
        self.reserve_plugins = self.points["reserve"]
        self.permit_plugins = self.points["permit"]
        self.pre_bind_plugins = self.points["preBind"]
        self.bind_plugins = self.points["bind"]
        self.post_bind_plugins = self.points["postBind"]
        if len(self.points["queueSort"]) == 0:
            raise FrameworkError("no queue sort plugin is enabled")
        if len(self.points["queueSort"]) > 1:
            raise FrameworkError("only one queue sort plugin can be enabled")
        if not self.bind_plugins:
            raise FrameworkError("at least one bind plugin is needed")
        self.queue_sort_plugin = self.points["queueSort"][0]
        self.waiting_pods: dict[str, WaitingPod] = {}
        #: SchedulerMetrics (or None); plugin timings are recorded in cycles whose
        #: CycleState.record_metrics is set (upstream samples 10 % of them)
        self.metrics: Any = None
        self._fast_path: FastPath | None = None

    def fast_path(self) -> FastPath:
        """The vectorised Filter/Score driver of this profile (see ``fastpath``)."""
        if self._fast_path is None:
            self._fast_path = FastPath(self)
        return self._fast_path

    # ------------------------------------------------------------------ construction

    def _expand(self, ep: str) -> list[str]:
        method = EXTENSION_METHODS[ep]
        ep_set = self.plugin_config[ep]
        explicit: list[str] = []
        for p in ep_set["enabled"]:
            name = p["name"]
            if not implements(self.plugins[name], method):
                raise FrameworkError(f'plugin "{name}" does not extend {ep} plugin')
            if name in explicit:
                raise FrameworkError(f'plugin "{name}" already registered as "{ep}"')
            explicit.append(name)
            if ep == "score":
                self.score_weights[name] = int(p.get("weight") or 1)
        disabled = {p.get("name") for p in ep_set["disabled"]}
        if "*" in disabled:
            return explicit
        overrides: list[str] = []
        multi: list[str] = []
        for p in self.plugin_config["multiPoint"]["enabled"]:
            name = p["name"]
            if not implements(self.plugins[name], method) or name in disabled:
                continue
            if name in explicit:
                overrides.append(name)
                continue
            if name in multi:
                raise FrameworkError(f'plugin "{name}" already registered as "{ep}"')
            multi.append(name)
            if ep == "score" and name not in self.score_weights:
                self.score_weights[name] = int(p.get("weight") or 1)
        ordered = overrides + multi + [n for n in explicit if n not in overrides]
        return ordered

    def observe(self, plugin: str, point: str, status: Status | None, t0: float) -> None:
        """scheduler_plugin_execution_duration_seconds, in sampled cycles only."""
        if self.metrics is not None:
            self.metrics.observe_plugin(plugin, point, status, perf_counter() - t0)

    def list_plugins(self) -> dict[str, list[str]]:
        """Enabled plugin names per extension point (non-empty points only)."""
        return {ep: [p.name for p in pls] for ep, pls in self.points.items() if pls}

    def has_filter_plugins(self) -> bool:
        return bool(self.filter_plugins)

    def has_score_plugins(self) -> bool:
        return bool(self.score_plugins)

    def has_post_filter_plugins(self) -> bool:
        return bool(self.post_filter_plugins)

    def events_to_register(self) -> dict[str, list[ClusterEventWithHint]]:
        """Cluster events (with hints) per plugin, for the scheduling queue.

        Plugins that do not implement ``events_to_register`` are registered for
        every event, as upstream does for plugins without EnqueueExtensions.
        """
        out: dict[str, list[ClusterEventWithHint]] = {}
        for name, pl in self.plugins.items():
            if not any(pl in self.points[ep] for ep in _REJECTING_POINTS):
                continue
            out[name] = list(pl.events_to_register()) if implements(pl, "events_to_register") else [ALL_EVENTS]
        return out

    # ------------------------------------------------------------------ queue side

    def run_pre_enqueue_plugins(self, pod: dict) -> Status | None:
        for pl in self.pre_enqueue_plugins:
            s = pl.pre_enqueue(pod)
            if s is None or s.is_success():
                continue
            s.plugin = pl.name
            if s.is_rejected():
                return s
            return s.as_error(f"running PreEnqueue plugin {pl.name!r}", pl.name)
        return None

    def less(self, a: Any, b: Any) -> bool:
        return self.queue_sort_plugin.less(a, b)

    # ------------------------------------------------------------------ filtering

    def run_pre_filter_plugins(
        self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]
    ) -> tuple[PreFilterResult | None, Status | None, set[str]]:
        """Returns (merged result, status, unschedulable plugins)."""
        result: PreFilterResult | None = None
        with_nodes: list[str] = []
        skip: set[str] = set()
        for pl in self.pre_filter_plugins:
            t0 = perf_counter() if state.record_metrics else 0.0
            r, s = pl.pre_filter(state, pod_info, nodes)
            if t0:
                self.observe(pl.name, "PreFilter", s, t0)
            if s is not None and s.is_skip():
                skip.add(pl.name)
                continue
            if s is not None and not s.is_success():
                s.plugin = pl.name
                if s.is_rejected():
                    return None, s, {pl.name}
                return None, s.as_error(f"running PreFilter plugin {pl.name!r}", pl.name), set()
            if r is not None and not r.all_nodes():
                with_nodes.append(pl.name)
            result = r if result is None else result.merge(r)
            if result is not None and result.node_names is not None and not result.node_names:
                if len(with_nodes) == 1:
                    msg = f"node(s) didn't satisfy plugin {with_nodes[0]}"
                else:
                    msg = f"node(s) didn't satisfy plugin(s) {go_list(with_nodes)} simultaneously"
                return result, Status.unresolvable(msg), set(with_nodes)
        state.skip_filter_plugins = skip
        return result, None, set()

    def run_pre_filter_extension_add_pod(
        self, state: CycleState, pod_info: PodInfo, pod_info_to_add: PodInfo, node_info: NodeInfo
    ) -> Status | None:
        for pl in self.pre_filter_plugins:
            if pl.name in state.skip_filter_plugins or not implements(pl, "add_pod"):
                continue
            s = pl.add_pod(state, pod_info, pod_info_to_add, node_info)
            if s is not None and not s.is_success():
                return s.as_error(f"running AddPod on PreFilter plugin {pl.name!r}", pl.name)
        return None

    def run_pre_filter_extension_remove_pod(
        self, state: CycleState, pod_info: PodInfo, pod_info_to_remove: PodInfo, node_info: NodeInfo
    ) -> Status | None:
        for pl in self.pre_filter_plugins:
            if pl.name in state.skip_filter_plugins or not implements(pl, "remove_pod"):
                continue
            s = pl.remove_pod(state, pod_info, pod_info_to_remove, node_info)
            if s is not None and not s.is_success():
                return s.as_error(f"running RemovePod on PreFilter plugin {pl.name!r}", pl.name)
        return None

    def run_filter_plugins(self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> Status | None:
        skip = state.skip_filter_plugins
        for pl in self.filter_plugins:
            if skip and pl.name in skip:
                continue
            s = self.run_filter_plugin(pl, state, pod_info, node_info)
            if s is not None:
                return s
        return None

    def run_filter_plugin(self, pl: Plugin, state: CycleState, pod_info: PodInfo, node_info: NodeInfo) -> Status | None:
        """One plugin's Filter on one node: None when it passes, else the rejection (attributed
        to the plugin) or the Error the framework reports."""
        t0 = perf_counter() if state.record_metrics else 0.0
        s = pl.filter(state, pod_info, node_info)
        if t0:
            self.observe(pl.name, "Filter", s, t0)
        if s is None or s.code == Code.SUCCESS:
            return None
        if not s.is_rejected():
            return s.as_error(f"running {pl.name!r} filter plugin", pl.name)
        s.plugin = pl.name
        return s

    def run_filter_plugins_with_nominated_pods(
        self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo
    ) -> Status | None:
        """Filter with nominated pods of >= priority added, and again without them if they mattered.

        The first pass makes sure this pod does not take room promised to
        nominated pods; the second that inter-pod affinity does not rely on
        pods that may never arrive.
        """
        status: Status | None = None
        pods_added = False
        for i in range(2):
            state_to_use, ni_to_use = state, node_info
            if i == 0:
                try:
                    pods_added, state_to_use, ni_to_use = self._add_nominated_pods(state, pod_info, node_info)
                except Exception as e:  # noqa: BLE001 - surfaced as an Error status
                    return Status.as_status(e)
            elif not pods_added or not (status is None or status.is_success()):
                break
            status = self.run_filter_plugins(state_to_use, pod_info, ni_to_use)
            if status is not None and not status.is_success() and not status.is_rejected():
                return status
        return status

    def _add_nominated_pods(
        self, state: CycleState, pod_info: PodInfo, node_info: NodeInfo
    ) -> tuple[bool, CycleState, NodeInfo]:
        nominator = self.handle.nominator
        if nominator is None:
            return False, state, node_info
        nominated = nominator.nominated_pods_for_node(node_info.name)
        if not nominated:
            return False, state, node_info
        ni_out = node_info.clone()
        state_out = state.clone()
        added = False
        for np_ in nominated:
            npi = np_ if isinstance(np_, PodInfo) else PodInfo(np_)
            if npi.priority >= pod_info.priority and npi.uid != pod_info.uid:
                ni_out.add_pod(npi)
                s = self.run_pre_filter_extension_add_pod(state_out, pod_info, npi, ni_out)
                if s is not None and not s.is_success():
                    raise RuntimeError(s.message())
                added = True
        return added, state_out, ni_out

    def run_post_filter_plugins(
        self, state: CycleState, pod_info: PodInfo, filtered_statuses: dict[str, Status]
    ) -> tuple[str | None, Status]:
        """Returns (nominated node name or None, status)."""
        reasons: list[str] = []
        rejector = ""
        result: str | None = None
        for pl in self.post_filter_plugins:
            r, s = pl.post_filter(state, pod_info, filtered_statuses)
            if s is None or s.is_success():
                return r, s or Status.success()
            if s.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE:
                s.plugin = pl.name
                return r, s
            if not s.is_rejected():
                return None, s.as_error(f"running PostFilter plugin {pl.name!r}", pl.name)
            if r is not None:
                result = r
            reasons.extend(s.reasons)
            rejector = rejector or pl.name
        return result, Status(Code.UNSCHEDULABLE, reasons, rejector)

    # ------------------------------------------------------------------ scoring

    def run_pre_score_plugins(self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]) -> Status | None:
        skip: set[str] = set()
        for pl in self.pre_score_plugins:
            t0 = perf_counter() if state.record_metrics else 0.0
            s = pl.pre_score(state, pod_info, nodes)
            if t0:
                self.observe(pl.name, "PreScore", s, t0)
            if s is None or s.is_success():
                continue
            if s.is_skip():
                skip.add(pl.name)
                continue
            return s.as_error(f"running PreScore plugin {pl.name!r}", pl.name)
        state.skip_score_plugins = skip
        return None

    def run_score_plugins(
        self, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]
    ) -> tuple[list[NodePluginScores], Status | None]:
        """Score, normalize and weight. Normalized scores must be in [0, 100]."""
        result = [NodePluginScores(ni.name) for ni in nodes]
        skip = state.skip_score_plugins
        for pl in self.score_plugins:
            if pl.name in skip:
                continue
            scores, s = self.run_score_plugin(pl, state, pod_info, nodes)
            if s is not None:
                return [], s
            weight = self.score_weights.get(pl.name, 1)
            for nps, (_, sc) in zip(result, scores):
                w = sc * weight
                nps.scores.append((pl.name, w))
                nps.total_score += w
        return result, None

    def run_score_plugin(
        self, pl: Plugin, state: CycleState, pod_info: PodInfo, nodes: list[NodeInfo]
    ) -> tuple[list[list[Any]], Status | None]:
        """One plugin's Score on every node, then its NormalizeScore: ``[node, score]``
        pairs (unweighted, in [MIN_NODE_SCORE, MAX_NODE_SCORE]) or an Error status."""
        scores: list[list[Any]] = []
        t0 = perf_counter() if state.record_metrics else 0.0
        for ni in nodes:
            sc, s = pl.score(state, pod_info, ni)
            if s is not None and not s.is_success():
                return [], s.as_error(f"running Score plugin {pl.name!r}", pl.name)
            scores.append([ni.name, sc])
        if t0:
            self.observe(pl.name, "Score", None, t0)
        if implements(pl, "normalize_score"):
            s = pl.normalize_score(state, pod_info, scores)
            if s is not None and not s.is_success():
                return [], s.as_error(f"running Normalize on Score plugin {pl.name!r}", pl.name)
        for _, sc in scores:
            if sc > MAX_NODE_SCORE or sc < MIN_NODE_SCORE:
                return [], invalid_score_status(pl.name, sc)
        return scores, None

    # ------------------------------------------------------------------ reserve / permit

    def run_reserve_plugins_reserve(self, state: CycleState, pod_info: PodInfo, node_name: str) -> Status | None:
        for pl in self.reserve_plugins:
            t0 = perf_counter() if state.record_metrics else 0.0
            s = pl.reserve(state, pod_info, node_name)
            if t0:
                self.observe(pl.name, "Reserve", s, t0)
            if s is None or s.is_success():
                continue
            if s.is_rejected():
                s.plugin = pl.name
                return s
            return s.as_error(f"running Reserve plugin {pl.name!r}", pl.name)
        return None

    def run_reserve_plugins_unreserve(self, state: CycleState, pod_info: PodInfo, node_name: str) -> None:
        for pl in reversed(self.reserve_plugins):
            pl.unreserve(state, pod_info, node_name)

    def run_permit_plugins(self, state: CycleState, pod_info: PodInfo, node_name: str) -> Status | None:
        """Success, a rejection, an Error, or Wait (the pod is then a WaitingPod)."""
        waits: dict[str, float] = {}
        for pl in self.permit_plugins:
            s, timeout = pl.permit(state, pod_info, node_name)
            if s is None or s.is_success():
                continue
            if s.is_rejected():
                s.plugin = pl.name
                return s
            if s.is_wait():
                waits[pl.name] = min(float(timeout), MAX_PERMIT_TIMEOUT)
                continue
            return s.as_error(f"running Permit plugin {pl.name!r}", pl.name)
        if waits:
            self.waiting_pods[pod_info.uid] = WaitingPod(pod_info, waits)
            msg = f"one or more plugins asked to wait and no plugin rejected pod {pod_info.name!r}"
            return Status(Code.WAIT, [msg])
        return None

    async def wait_on_permit(self, pod_info: PodInfo) -> Status | None:
        wp = self.waiting_pods.get(pod_info.uid)
        if wp is None:
            return None
        try:
            s = await wp.wait()
        finally:
            self.waiting_pods.pop(pod_info.uid, None)
        if s.is_success():
            return None
        if s.is_rejected():
            return s
        return s.as_error("waiting on permit for pod", s.plugin)

    def get_waiting_pod(self, uid: str) -> WaitingPod | None:
        return self.waiting_pods.get(uid)

    def reject_waiting_pod(self, uid: str, plugin: str = "", msg: str = "removed") -> bool:
        """Reject a waiting pod (e.g. a preemption victim); False when it is not waiting."""
        wp = self.waiting_pods.get(uid)
        if wp is None:
            return False
        wp.reject(plugin, msg)
        return True

    # ------------------------------------------------------------------ binding

    async def run_pre_bind_plugins(self, state: CycleState, pod_info: PodInfo, node_name: str) -> Status | None:
        for pl in self.pre_bind_plugins:
            t0 = perf_counter() if state.record_metrics else 0.0
            s = await pl.pre_bind(state, pod_info, node_name)
            if t0:
                self.observe(pl.name, "PreBind", s, t0)
            if s is None or s.is_success() or s.is_skip():
                continue
            if s.is_rejected():
                s.plugin = pl.name
                return s
            return s.as_error(f"running PreBind plugin {pl.name!r}", pl.name)
        return None

    async def run_bind_plugins(self, state: CycleState, pod_info: PodInfo, node_name: str) -> Status | None:
        """Bind plugins in order until one does not Skip. All skipping returns Skip."""
        status: Status | None = Status.skip()
        for pl in self.bind_plugins:
            t0 = perf_counter() if state.record_metrics else 0.0
            status = await pl.bind(state, pod_info, node_name)
            if t0:
                self.observe(pl.name, "Bind", status, t0)
            if status is not None and status.is_skip():
                continue
            if status is None or status.is_success():
                return None
            if status.is_rejected():
                status.plugin = pl.name
                return status
            return status.as_error(f"running Bind plugin {pl.name!r}", pl.name)
        return status

    async def run_post_bind_plugins(self, state: CycleState, pod_info: PodInfo, node_name: str) -> None:
        for pl in self.post_bind_plugins:
            await pl.post_bind(state, pod_info, node_name)


__all__ = [
    "ALL_EVENTS", "Framework", "FrameworkError", "MAX_PERMIT_TIMEOUT", "NodePluginScores", "WaitingPod",
    "merge_plugin_set", "merge_profile_plugins",
]
