"""The ClusterRole aggregation controller (upstream's clusterrole-aggregation
controller): a ClusterRole with an ``aggregationRule`` holds the rules of
every ClusterRole its selectors match, in name order per selector, each rule
once. It runs in the API server's process over the RBAC policy cache, so it
sees a change as soon as the cache does; its writes change the cache again,
which is how chains (view into edit into admin) settle.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import resource
from kubeplane.api.selectors import label_selector_from_dict
from kubeplane.auth.rbac import GROUP, PolicyCache
from kubeplane.auth.user import SYSTEM_ADMIN, acting_as

log = logging.getLogger("kubeplane.apiserver")

Obj = dict[str, Any]


def aggregated_rules(role: Obj, roles: dict[str, Obj]) -> list[Obj] | None:
    """The rules ``role`` should hold (None: it has no aggregation rule or a
    selector that cannot be parsed)."""
    agg = role.get("aggregationRule")
    if not isinstance(agg, dict):
        return None
    name = (role.get("metadata") or {}).get("name")
    rules: list[Obj] = []
    for sel in agg.get("clusterRoleSelectors") or []:
        try:
            selector = label_selector_from_dict(sel if isinstance(sel, dict) else {})
        except Exception:  # noqa: BLE001 - validation refuses such selectors; skip rather than crash
            return None
        for other_name in sorted(roles):
            if other_name == name:
                continue
            other = roles[other_name]
            if not selector.matches((other.get("metadata") or {}).get("labels") or {}):
                continue
            for rule in other.get("rules") or []:
                if isinstance(rule, dict) and rule not in rules:
                    rules.append(rule)
    return rules


class ClusterRoleAggregator:
    def __init__(self, registry: Any, cache: PolicyCache) -> None:
        self.registry = registry
        self.cache = cache
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self.cache.listeners.append(self._wake.set)
        self._wake.set()
        with acting_as(SYSTEM_ADMIN):  # the task (and its writes) run as the server itself
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._wake.set in self.cache.listeners:
            self.cache.listeners.remove(self._wake.set)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self.sync()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - try again at the next change
                log.exception("ClusterRole aggregation failed")
                await asyncio.sleep(0.5)
                self._wake.set()

    async def sync(self) -> int:
        """Brings every aggregated ClusterRole up to date; how many it updated."""
        res = resource("clusterroles", GROUP)
        roles = dict(self.cache.cluster_roles)
        updated = 0
        for name, role in sorted(roles.items()):
            wanted = aggregated_rules(role, roles)
            if wanted is None or wanted == (role.get("rules") or []):
                continue
            try:
                await self.registry.update(res, {**role, "rules": wanted}, name=name,
                                           field_manager="clusterrole-aggregation-controller")
                updated += 1
            except StatusError as err:
                if err.code not in (404, 409):
                    raise
                # changed meanwhile: the cache brings the new version (waited for, up
                # to a second, so a retry never spins on a cache that has not caught up)
                generation = self.cache.generation
                for _ in range(200):
                    await asyncio.sleep(0.005)
                    if self.cache.generation != generation:
                        break
                self._wake.set()
        return updated
