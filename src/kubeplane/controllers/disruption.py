"""The disruption controller: PodDisruptionBudget status, after upstream's
``pkg/controller/disruption``.

For every budget it counts the pods its selector picks in its namespace:

- ``expectedPods``: with ``maxUnavailable`` or a percentage ``minAvailable``,
  the sum of the scales of the pods' controllers (a ReplicaSet's Deployment
  when it has one, else the ReplicaSet, else any owner with a ``scale``
  subresource: StatefulSets, ReplicationControllers, custom resources); with
  an integer ``minAvailable``, the number of pods;
- ``desiredHealthy``: ``minAvailable`` (scaled) or expected minus ``maxUnavailable``;
- ``currentHealthy``: the Ready pods that are not being deleted and not in
  ``disruptedPods`` (pods the eviction subresource is about to delete; an
  entry older than two minutes whose pod is still there is dropped, with a
  ``NotDeleted`` event);
- ``disruptionsAllowed``: current minus desired, never below zero, zero while
  no pod is expected; the ``DisruptionAllowed`` condition says
  ``SufficientPods`` or ``InsufficientPods``.

A budget whose pods cannot be accounted for (a pod without a controller under
a percentage or ``maxUnavailable`` budget) fails safe as upstream: zero
disruptions allowed, condition False with reason ``SyncFailed`` and the
error as message. The controller also resets a ``DisruptionTarget`` condition
left on a pod that was not deleted within two minutes.

Time is read from ``clock`` (injectable), so tests move it rather than wait.
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
from typing import Any, Callable

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import deep_copy, format_time, parse_time, utcnow
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.api.selectors import label_selector_from_dict
from kubeplane.client.informer import SharedInformerFactory, meta_namespace_key, unwrap_deleted
from kubeplane.client.interface import Client, Obj
from kubeplane.controllers.base import Controller
from kubeplane.controllers.replicaset import (
    NAMESPACE_INDEX,
    add_indexers,
    controller_ref,
    namespace_index,
)
from kubeplane.registry.eviction import is_pod_ready, set_allowed_condition, set_status_condition

log = logging.getLogger(__name__)

PODS = resource("pods")
PDBS = resource("poddisruptionbudgets")
REPLICASETS = resource("replicasets")
DEPLOYMENTS = resource("deployments")

#: upstream's DeletionTimeout: how long a pod may stay in disruptedPods
DELETION_TIMEOUT = 120.0
#: upstream's stalePodDisruptionTimeout
STALE_POD_DISRUPTION_TIMEOUT = 120.0


def scaled_value(value: Any, total: int, round_up: bool) -> int:
    """upstream's GetScaledValueFromIntOrPercent (ValueError when it is neither)."""
    if isinstance(value, bool):
        raise ValueError(f"invalid value for IntOrString: invalid type: {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        if not value.endswith("%"):
            raise ValueError("invalid value for IntOrString: invalid type: string is not a percentage")
        try:
            pct = int(value[:-1])
        except ValueError:
            raise ValueError(f'invalid value "{value}": strconv.Atoi: parsing "{value[:-1]}": invalid syntax') from None
        v = pct * total / 100
        return math.ceil(v) if round_up else math.floor(v)
    raise ValueError(f"invalid value for IntOrString: invalid type: {value!r}")


def _group_of(api_version: str) -> str:
    return api_version.split("/", 1)[0] if "/" in api_version else ""


class _SyncFailed(Exception):
    """What upstream's trySync returns as an error: failSafe writes it as the condition message."""


class DisruptionController(Controller):
    def __init__(self, client: Client, factory: SharedInformerFactory | None = None, *,
                 clock: Callable[[], _dt.datetime] = utcnow,
                 deletion_timeout: float = DELETION_TIMEOUT,
                 stale_pod_disruption_timeout: float = STALE_POD_DISRUPTION_TIMEOUT) -> None:
        super().__init__("disruption-controller", client, factory)
        self.clock = clock
        self.deletion_timeout = deletion_timeout
        self.stale_timeout = stale_pod_disruption_timeout
        self.pods = self.factory.informer_for(PODS)
        self.pdbs = self.factory.informer_for(PDBS)
        self.rs = self.factory.informer_for(REPLICASETS)
        self.deployments = self.factory.informer_for(DEPLOYMENTS)
        add_indexers(self.pdbs, {NAMESPACE_INDEX: namespace_index})
        add_indexers(self.pods, {NAMESPACE_INDEX: namespace_index})
        self.pdbs.add_event_handler(self._enqueue_pdb, lambda _o, n: self._enqueue_pdb(n), self._enqueue_pdb)
        self.pods.add_event_handler(self._pod_changed, lambda _o, n: self._pod_changed(n), self._pod_deleted)
        self.add_queue("pdbs", self.sync)
        self.add_queue("stale", self.sync_stale_pod_disruption)

    # -- events ----------------------------------------------------------------

    def _enqueue_pdb(self, obj: Obj) -> None:
        pdb = unwrap_deleted(obj)
        if isinstance(pdb, dict):
            self.queue("pdbs").add(meta_namespace_key(pdb))

    def _pod_changed(self, pod: Obj) -> None:
        pdb = self._pdb_for_pod(pod)
        if pdb is not None:
            self.queue("pdbs").add(meta_namespace_key(pdb))
        stale, after = self._stale_disruption_condition(pod)
        if stale:
            self._add_stale(pod, after)

    def _pod_deleted(self, obj: Obj) -> None:
        pod = unwrap_deleted(obj)
        if isinstance(pod, dict):
            pdb = self._pdb_for_pod(pod)
            if pdb is not None:
                self.queue("pdbs").add(meta_namespace_key(pdb))

    def _add_stale(self, pod: Obj, after: float) -> None:
        key = meta_namespace_key(pod)
        if after > 0:
            self.queue("stale").add_after(key, after)
        else:
            self.queue("stale").add(key)

    def _pdbs_for_pod(self, pod: Obj) -> list[Obj]:
        md = pod.get("metadata") or {}
        labels = md.get("labels") or {}
        out = []
        for pdb in self.pdbs.indexer.by_index(NAMESPACE_INDEX, md.get("namespace", "")):
            sel = (pdb.get("spec") or {}).get("selector")
            if not isinstance(sel, dict):
                continue  # a nil selector matches nothing
            try:
                selector = label_selector_from_dict(sel)
            except (StatusError, ValueError):
                continue
            if selector.matches(labels):
                out.append(pdb)
        return sorted(out, key=lambda p: p["metadata"]["name"])

    def _pdb_for_pod(self, pod: Obj) -> Obj | None:
        pdbs = self._pdbs_for_pod(pod)
        if not pdbs:
            return None
        if len(pdbs) > 1:
            md = pod.get("metadata") or {}
            msg = (f'Pod "{md.get("namespace")}"/"{md.get("name")}" matches multiple PodDisruptionBudgets.  '
                   f'Chose "{pdbs[0]["metadata"]["name"]}" arbitrarily.')
            log.info(msg)
            self.recorder.event(pod, "Warning", "MultiplePodDisruptionBudgets", msg)
        return pdbs[0]

    def _pods_for_pdb(self, pdb: Obj) -> list[Obj]:
        sel = (pdb.get("spec") or {}).get("selector")
        selector = label_selector_from_dict(sel if isinstance(sel, dict) else None)
        ns = pdb["metadata"].get("namespace", "")
        return [p for p in self.pods.indexer.by_index(NAMESPACE_INDEX, ns)
                if selector.matches((p.get("metadata") or {}).get("labels") or {})]

    # -- the budget --------------------------------------------------------------

    async def sync(self, key: str) -> None:
        pdb = self.pdbs.indexer.get_by_key(key)
        if pdb is None:
            return
        try:
            await self._try_sync(pdb)
        except StatusError as err:
            if err.code == 409:
                raise  # retried on fresh data, without the fail-safe
            log.error("failed to sync PodDisruptionBudget %s: %s", key, err)
            await self._fail_safe(pdb, str(err.message))
        except _SyncFailed as err:
            # As upstream: the fail-safe status written is the end of this sync;
            # the next change of a pod or the budget tries again.
            log.error("failed to sync PodDisruptionBudget %s: %s", key, err)
            await self._fail_safe(pdb, str(err))

    async def _try_sync(self, pdb: Obj) -> None:
        try:
            pods = self._pods_for_pdb(pdb)
        except (StatusError, ValueError) as err:
            msg = err.message if isinstance(err, StatusError) else str(err)
            self.recorder.event(pdb, "Warning", "NoPods", f"Failed to get pods: {msg}")
            raise _SyncFailed(msg) from None
        if not pods:
            self.recorder.event(pdb, "Normal", "NoPods", "No matching pods found")
        try:
            expected, desired, unmanaged = await self._expected_pod_count(pdb, pods)
        except _SyncFailed as err:
            self.recorder.event(pdb, "Warning", "CalculateExpectedPodCountFailed",
                                f"Failed to calculate the number of expected pods: {err}")
            raise
        if unmanaged:
            self.recorder.event(pdb, "Warning", "UnmanagedPods", (
                f"Pods selected by this PodDisruptionBudget (selector: {_selector_text(pdb)}) were found to be "
                "unmanaged. As a result, the status of the PDB cannot be calculated correctly, which may result "
                "in undefined behavior. To account for these pods please set \".spec.minAvailable\" field of the "
                "PDB to an integer value."))
        now = self.clock()
        disrupted, recheck = self._build_disrupted_pod_map(pods, pdb, now)
        healthy = self._count_healthy(pods, disrupted, now)
        await self._update_status(pdb, healthy, desired, expected, disrupted)
        if recheck is not None:
            self.queue("pdbs").add_after(meta_namespace_key(pdb), max(0.0, (recheck - now).total_seconds()))

    async def _expected_pod_count(self, pdb: Obj, pods: list[Obj]) -> tuple[int, int, list[str]]:
        spec = pdb.get("spec") or {}
        unmanaged: list[str] = []
        expected = desired = 0
        try:
            if spec.get("maxUnavailable") is not None:
                expected, unmanaged = await self._expected_scale(pods)
                desired = max(0, expected - scaled_value(spec["maxUnavailable"], expected, True))
            elif spec.get("minAvailable") is not None:
                min_available = spec["minAvailable"]
                if isinstance(min_available, int) and not isinstance(min_available, bool):
                    desired, expected = min_available, len(pods)
                else:
                    expected, unmanaged = await self._expected_scale(pods)
                    desired = scaled_value(min_available, expected, True)
        except ValueError as err:
            raise _SyncFailed(str(err)) from None
        return expected, desired, unmanaged

    async def _expected_scale(self, pods: list[Obj]) -> tuple[int, list[str]]:
        """The sum of the scales of the pods' controllers, and the pods without one."""
        scales: dict[str, int] = {}
        unmanaged: list[str] = []
        for pod in pods:
            ref = controller_ref(pod)
            if ref is None:
                unmanaged.append((pod.get("metadata") or {}).get("name", ""))
                continue
            if ref.get("uid") in scales:
                continue
            found = await self._controller_scale(ref, (pod.get("metadata") or {}).get("namespace", ""))
            if found is None:
                raise _SyncFailed(f'found no controllers for pod "{pod["metadata"]["name"]}"')
            scales[found[0]] = found[1]
        return sum(scales.values()), unmanaged

    async def _controller_scale(self, ref: Obj, namespace: str) -> tuple[str, int] | None:
        """(uid, replicas) of the controller ``ref`` names, as upstream's finders look for it."""
        kind, group = ref.get("kind"), _group_of(ref.get("apiVersion") or "")
        if kind == "ReplicaSet" and group in ("apps", "extensions"):
            rs = self.rs.indexer.get_by_key(f"{namespace}/{ref.get('name')}")
            if rs is None or rs["metadata"].get("uid") != ref.get("uid"):
                return None
            owner = controller_ref(rs)
            if owner is not None and owner.get("kind") == "Deployment":
                if _group_of(owner.get("apiVersion") or "") not in ("apps", "extensions"):
                    return None
                d = self.deployments.indexer.get_by_key(f"{namespace}/{owner.get('name')}")
                if d is None or d["metadata"].get("uid") != owner.get("uid"):
                    return None
                return d["metadata"]["uid"], int((d.get("spec") or {}).get("replicas", 1))
            return rs["metadata"]["uid"], int((rs.get("spec") or {}).get("replicas", 1))
        return await self._scale_of(ref, namespace)

    async def _scale_of(self, ref: Obj, namespace: str) -> tuple[str, int] | None:
        catalogue = getattr(self.client, "catalogue", None) or CATALOGUE
        res = catalogue.by_api_version_kind(ref.get("apiVersion") or "", ref.get("kind") or "")
        if res is None:
            raise _SyncFailed(f'no matches for kind "{ref.get("kind")}" in version "{ref.get("apiVersion")}"')
        if "scale" not in res.subresources:
            raise _SyncFailed(f"{res.qualified} does not implement the scale subresource")
        try:
            scale = await self.client.get(res, ref.get("name", ""), namespace, subresource="scale")
        except StatusError as err:
            if err.code == 404:
                return None
            raise
        uid = (scale.get("metadata") or {}).get("uid")
        if uid != ref.get("uid"):
            return None
        return uid, int((scale.get("spec") or {}).get("replicas") or 0)

    def _build_disrupted_pod_map(self, pods: list[Obj], pdb: Obj,
                                 now: _dt.datetime) -> tuple[dict[str, str], _dt.datetime | None]:
        disrupted = (pdb.get("status") or {}).get("disruptedPods") or {}
        result: dict[str, str] = {}
        recheck: _dt.datetime | None = None
        if not isinstance(disrupted, dict):
            return result, None
        for pod in pods:
            md = pod.get("metadata") or {}
            if md.get("deletionTimestamp"):
                continue
            stamp = disrupted.get(md.get("name"))
            if stamp is None:
                continue
            try:
                expected_deletion = parse_time(stamp) + _dt.timedelta(seconds=self.deletion_timeout)
            except (TypeError, ValueError):
                continue
            if expected_deletion < now:
                pmd = pdb["metadata"]
                # upstream's message names the namespace twice
                self.recorder.event(pod, "Warning", "NotDeleted",
                                    f"Pod was expected by PDB {pmd.get('namespace')}/{pmd.get('namespace')} to be "
                                    "deleted but it wasn't")
            else:
                if recheck is None or expected_deletion < recheck:
                    recheck = expected_deletion
                result[md["name"]] = stamp
        return result, recheck

    def _count_healthy(self, pods: list[Obj], disrupted: dict[str, str], now: _dt.datetime) -> int:
        healthy = 0
        for pod in pods:
            md = pod.get("metadata") or {}
            if md.get("deletionTimestamp"):
                continue
            stamp = disrupted.get(md.get("name", ""))
            if stamp is not None:
                try:
                    if parse_time(stamp) + _dt.timedelta(seconds=self.deletion_timeout) > now:
                        continue
                except (TypeError, ValueError):
                    pass
            if is_pod_ready(pod):
                healthy += 1
        return healthy

    async def _update_status(self, pdb: Obj, healthy: int, desired: int, expected: int,
                             disrupted: dict[str, str]) -> None:
        allowed = healthy - desired
        if expected <= 0 or allowed <= 0:
            allowed = 0
        status = pdb.get("status") or {}
        generation = int(pdb["metadata"].get("generation") or 0)
        if (status.get("currentHealthy") == healthy and status.get("desiredHealthy") == desired
                and status.get("expectedPods") == expected and status.get("disruptionsAllowed") == allowed
                and (status.get("disruptedPods") or {}) == disrupted
                and int(status.get("observedGeneration") or 0) == generation
                and _conditions_up_to_date(pdb)):
            return
        new_status: Obj = {"currentHealthy": healthy, "desiredHealthy": desired, "expectedPods": expected,
                           "disruptionsAllowed": allowed, "observedGeneration": generation}
        if disrupted:
            new_status["disruptedPods"] = disrupted
        new_status["conditions"] = set_allowed_condition(status.get("conditions"), allowed, generation)
        await self._write_status(pdb, new_status)

    async def _fail_safe(self, pdb: Obj, message: str) -> None:
        """At least stop evictions: zero disruptions allowed, condition SyncFailed."""
        status = dict(pdb.get("status") or {})
        status["disruptionsAllowed"] = 0
        status["conditions"] = set_status_condition(status.get("conditions"), {
            "type": "DisruptionAllowed", "status": "False", "reason": "SyncFailed", "message": message,
            "observedGeneration": int(status.get("observedGeneration") or 0)})
        await self._write_status(pdb, status)

    async def _write_status(self, pdb: Obj, status: Obj) -> None:
        new = {**pdb, "metadata": dict(pdb["metadata"]), "status": status}
        new.setdefault("apiVersion", "policy/v1")
        new.setdefault("kind", "PodDisruptionBudget")
        await self.client.update(PDBS, new, subresource="status")

    # -- stale DisruptionTarget conditions --------------------------------------

    def _stale_disruption_condition(self, pod: Obj) -> tuple[bool, float]:
        md = pod.get("metadata") or {}
        if md.get("deletionTimestamp"):
            return False, 0.0
        status = pod.get("status") or {}
        cond = next((c for c in status.get("conditions") or []
                     if isinstance(c, dict) and c.get("type") == "DisruptionTarget"), None)
        if (cond is None or cond.get("status") != "True" or cond.get("reason") == "TerminationByKubelet"
                or status.get("phase") in ("Succeeded", "Failed")):
            return False, 0.0
        try:
            since = parse_time(cond.get("lastTransitionTime") or "")
        except (TypeError, ValueError):
            since = self.clock()
        wait = self.stale_timeout - (self.clock() - since).total_seconds()
        return True, max(0.0, wait)

    async def sync_stale_pod_disruption(self, key: str) -> None:
        pod = self.pods.indexer.get_by_key(key)
        if pod is None:
            return
        stale, after = self._stale_disruption_condition(pod)
        if not stale:
            return
        if after > 0:
            self._add_stale(pod, after)
            return
        new = deep_copy(pod)
        for c in new["status"]["conditions"]:
            if isinstance(c, dict) and c.get("type") == "DisruptionTarget":
                c["status"] = "False"
                c["lastTransitionTime"] = format_time(self.clock())
                c.pop("reason", None)
                c.pop("message", None)
        await self.client.update(PODS, new, subresource="status")
        log.info("reset stale DisruptionTarget condition of pod %s to False", key)


def _conditions_up_to_date(pdb: Obj) -> bool:
    status = pdb.get("status") or {}
    cond = next((c for c in status.get("conditions") or []
                 if isinstance(c, dict) and c.get("type") == "DisruptionAllowed"), None)
    if cond is None or int(status.get("observedGeneration") or 0) != int(pdb["metadata"].get("generation") or 0):
        return False
    if int(status.get("disruptionsAllowed") or 0) > 0:
        return cond.get("status") == "True" and cond.get("reason") == "SufficientPods"
    return cond.get("status") == "False" and cond.get("reason") == "InsufficientPods"


def _selector_text(pdb: Obj) -> str:
    sel = (pdb.get("spec") or {}).get("selector")
    try:
        return str(label_selector_from_dict(sel if isinstance(sel, dict) else None))
    except (StatusError, ValueError):
        return str(sel)


__all__ = ["DELETION_TIMEOUT", "DisruptionController", "scaled_value"]
