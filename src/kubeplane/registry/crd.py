"""The CustomResourceDefinition controllers of the API server's process
(apiextensions-apiserver's naming, establishing and finalizing controllers,
folded into one).

For every CRD it decides the accepted names (a name another CRD of the group,
or a built-in resource of the group, already uses is refused with
NamesAccepted False and upstream's reason and message), sets Established
once the names are accepted, and makes the registry's catalogue serve the
CRD's versions, before Established is written, so a client that sees the
condition finds the resource served. A CRD being deleted keeps its
``customresourcecleanup.apiextensions.k8s.io`` finalizer until every custom
resource of it is deleted; then the finalizer goes and the CRD with it, and
the catalogue stops serving its resources.

It works from a watch on the CRDs' storage prefix, so changes made through
any front end (HTTP, the in-process client, the local wire) are seen.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import ResourceInfo, resource
from kubeplane.registry import customresource as cr
from kubeplane.storage.interface import StorageError
from kubeplane.runtime import cancel_and_wait

log = logging.getLogger("kubeplane.crd")

Obj = dict[str, Any]

CRDS = resource("customresourcedefinitions")
#: how often the cleanup of a deleted CRD looks again at instances held by finalizers
CLEANUP_RETRY_SECONDS = 0.5


def _cond(crd: Obj, ctype: str) -> Obj | None:
    for c in (crd.get("status") or {}).get("conditions") or ():
        if isinstance(c, dict) and c.get("type") == ctype:
            return c
    return None


def _used_names(crd_name: str, group: str, crds: dict[str, Obj], builtin: tuple[ResourceInfo, ...]
                ) -> tuple[set[str], set[str]]:
    """(resource names, kinds) other CRDs of ``group`` accepted, and the
    built-in resources of the group."""
    resources: set[str] = set()
    kinds: set[str] = set()
    for name, other in crds.items():
        if name == crd_name or (other.get("spec") or {}).get("group") != group:
            continue
        accepted = (other.get("status") or {}).get("acceptedNames") or {}
        for key in ("plural", "singular"):
            if accepted.get(key):
                resources.add(accepted[key])
        resources.update(accepted.get("shortNames") or ())
        for key in ("kind", "listKind"):
            if accepted.get(key):
                kinds.add(accepted[key])
    for r in builtin:
        if r.group == group:
            resources.update((r.plural, r.singular, *r.short_names))
            kinds.update((r.kind, r.list_kind))
    return resources, kinds


def _fresh(requested: str, accepted: str, used: set[str]) -> str | None:
    """None when ``requested`` may be taken, else the reason it may not."""
    if requested == accepted or requested not in used:
        return None
    return f'"{requested}" is already in use'


def names_and_conditions(crd: Obj, crds: dict[str, Obj], builtin: tuple[ResourceInfo, ...]
                         ) -> tuple[Obj, Obj, Obj]:
    """(accepted names, NamesAccepted condition, Established condition) as
    upstream's naming controller computes them (without transition times)."""
    spec = crd.get("spec") or {}
    requested = spec.get("names") or {}
    accepted = dict((crd.get("status") or {}).get("acceptedNames") or {})
    used, kinds = _used_names((crd.get("metadata") or {}).get("name", ""), spec.get("group") or "", crds, builtin)
    new = dict(accepted)
    cond = {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found"}

    def conflict(reason: str, message: str) -> None:
        cond.update(status="False", reason=reason, message=message)

    for key, reason, pool in (("plural", "PluralConflict", used), ("singular", "SingularConflict", used)):
        err = _fresh(requested.get(key) or "", accepted.get(key) or "", pool)
        if err:
            conflict(reason, err)
        else:
            new[key] = requested.get(key) or ""
    shorts = list(requested.get("shortNames") or ())
    if shorts != list(accepted.get("shortNames") or ()):
        mine = set(accepted.get("shortNames") or ())
        errs = [e for s in shorts if s not in mine and (e := _fresh(s, "", used))]
        if errs:
            conflict("ShortNamesConflict", errs[0] if len(errs) == 1 else "[" + ", ".join(errs) + "]")
        else:
            new["shortNames"] = shorts
    for key, reason in (("kind", "KindConflict"), ("listKind", "ListKindConflict")):
        err = _fresh(requested.get(key) or "", accepted.get(key) or "", kinds)
        if err:
            conflict(reason, err)
        else:
            new[key] = requested.get(key) or ""
    if requested.get("categories"):
        new["categories"] = list(requested["categories"])
    else:
        new.pop("categories", None)
    if not new.get("shortNames"):
        new.pop("shortNames", None)
    established = _cond(crd, "Established")
    if established is None or established.get("status") != "True":
        if cond["status"] == "True":
            established = {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                           "message": "the initial names have been accepted"}
        else:
            established = {"type": "Established", "status": "False", "reason": "NotAccepted",
                           "message": "not all names are accepted"}
    else:
        established = {k: established[k] for k in ("type", "status", "reason", "message") if k in established}
    return new, cond, established


class CRDController:
    """Runs in the API server's process over its registry (see the module docstring)."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry
        self.catalogue = registry.catalogue
        self.store = registry.store
        #: the CRDs as last stored, by name
        self.crds: dict[str, Obj] = {}
        self._task: asyncio.Task | None = None
        self._cleanups: dict[str, asyncio.Task] = {}
        self._wake = asyncio.Event()

    async def start(self) -> None:
        result = await self.store.list(CRDS.storage_prefix())
        for kv in result.items:
            self.crds[kv.value["metadata"]["name"]] = kv.value
        for name in list(self.crds):
            await self._sync(name)
        self._task = asyncio.get_running_loop().create_task(self._run(result.revision), name="crd-controller")

    async def stop(self) -> None:
        await cancel_and_wait([self._task, *self._cleanups.values()], "CRD controller task")
        self._task = None
        self._cleanups.clear()

    async def _run(self, revision: int) -> None:
        prefix = CRDS.storage_prefix()
        while True:
            try:
                watch = self.store.watch(prefix, revision)
            except StorageError:
                result = await self.store.list(prefix)
                self.crds = {kv.value["metadata"]["name"]: kv.value for kv in result.items}
                revision = result.revision
                for name in list(self.crds) + [n for n, _ in self.catalogue._custom.items() if n not in self.crds]:
                    await self._sync_safely(name)
                continue
            try:
                while True:
                    try:
                        events = await watch.next_batch(None)
                    except StorageError:
                        break
                    if events is None:
                        return
                    touched: list[str] = []
                    groups: set[Any] = set()
                    for ev in events:
                        for o in (ev.value, ev.prev_value):
                            if isinstance(o, dict):
                                groups.add((o.get("spec") or {}).get("group"))
                        revision = ev.revision
                        name = ev.key.rsplit("/", 1)[-1]
                        if ev.type == "DELETED":
                            self.crds.pop(name, None)
                        else:
                            self.crds[name] = ev.value
                        if name not in touched:
                            touched.append(name)
                    for name in touched:
                        await self._sync_safely(name)
                    # a change of one CRD's names may free names others asked for
                    for name, other in list(self.crds.items()):
                        if name in touched or (other.get("spec") or {}).get("group") not in groups:
                            continue
                        cond = _cond(other, "NamesAccepted")
                        if cond is None or cond.get("status") != "True":
                            await self._sync_safely(name)
            finally:
                watch.close()

    async def _sync_safely(self, name: str) -> None:
        try:
            await self._sync(name)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - one bad CRD must not stop the others
            log.exception("syncing CustomResourceDefinition %s failed", name)

    async def _sync(self, name: str) -> None:
        crd = self.crds.get(name)
        if crd is None:
            self.catalogue.remove_custom(name)
            return
        md = crd.get("metadata") or {}
        if not md.get("deletionTimestamp"):
            crd = await self._update_names(crd)
            if crd is None:
                return  # written: the watch brings the new version
        if cr.is_established(crd):
            infos = cr.resources_for_crd(crd)
            old = self.catalogue.custom(name)
            if not _same_serving(old, infos, crd):
                cr.register_apply_tables(infos)
                self.catalogue.set_custom(name, infos)
        else:
            self.catalogue.remove_custom(name)
        if md.get("deletionTimestamp") and cr.CLEANUP_FINALIZER in (md.get("finalizers") or ()):
            task = self._cleanups.get(name)
            if task is None or task.done():
                self._cleanups[name] = asyncio.get_running_loop().create_task(
                    self._cleanup(name), name=f"crd-cleanup-{name}")

    async def _update_names(self, crd: Obj) -> Obj | None:
        """Writes the accepted names and conditions if they change (returning
        None then); the CRD as it is otherwise."""
        names, accepted_cond, established_cond = names_and_conditions(crd, self.crds, self.catalogue.builtin)
        status = crd.get("status") or {}
        current = {
            "names": status.get("acceptedNames") or {},
            "accepted": _cond(crd, "NamesAccepted"),
            "established": _cond(crd, "Established"),
        }

        def strip(c: Obj | None) -> Obj | None:
            return None if c is None else {k: c.get(k) for k in ("type", "status", "reason", "message")}

        if (current["names"] == names and strip(current["accepted"]) == accepted_cond
                and strip(current["established"]) == established_cond):
            return crd
        now = self.registry._now()
        new = {**crd, "status": {**status, "acceptedNames": names}}
        for c in (accepted_cond, established_cond):
            new = cr.set_condition(new, c["type"], c["status"], c["reason"], c["message"], now)
        if established_cond["status"] == "True" and not cr.is_established(crd):
            # served first: whoever sees Established finds the resource
            infos = cr.resources_for_crd(new)
            cr.register_apply_tables(infos)
            self.catalogue.set_custom(crd["metadata"]["name"], infos)
        try:
            await self.registry.update(CRDS, new, subresource="status")
        except StatusError as err:
            if err.code not in (404, 409):
                raise
        return None

    async def _cleanup(self, name: str) -> None:
        """Deletes every custom resource of a CRD being deleted, then drops the
        cleanup finalizer (upstream's finalizing controller)."""
        try:
            while True:
                crd = self.crds.get(name)
                if crd is None or cr.CLEANUP_FINALIZER not in ((crd.get("metadata") or {}).get("finalizers") or ()):
                    return
                remaining = await self._delete_instances(crd)
                if remaining == 0:
                    break
                await asyncio.sleep(CLEANUP_RETRY_SECONDS)
            await self._finish(name)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - tried again on the next change of the CRD
            log.exception("deleting the custom resources of %s failed", name)

    async def _delete_instances(self, crd: Obj) -> int:
        infos = self.catalogue.custom(crd["metadata"]["name"]) or tuple(cr.resources_for_crd(crd))
        if not infos:
            return 0
        res = next((r for r in infos if r.version == r.custom.storage_version), infos[0])
        await self._set_terminating(crd, "InstanceDeletionInProgress", "CustomResource deletion is in progress")
        result = await self.store.list(res.storage_prefix())
        remaining = 0
        for kv in result.items:
            md = kv.value.get("metadata") or {}
            try:
                _, finished = await self.registry.delete(res, md.get("name", ""), md.get("namespace"))
            except StatusError as err:
                if err.code == 404:
                    continue
                raise
            if not finished:
                remaining += 1
        return remaining

    async def _set_terminating(self, crd: Obj, reason: str, message: str) -> None:
        cond = _cond(crd, "Terminating")
        if cond is not None and cond.get("reason") == reason and cond.get("status") == "True":
            return
        new = cr.set_condition(crd, "Terminating", "True", reason, message, self.registry._now())
        try:
            await self.registry.update(CRDS, new, subresource="status")
        except StatusError as err:
            if err.code not in (404, 409):
                raise

    async def _finish(self, name: str) -> None:
        for _ in range(20):
            try:
                crd = await self.registry.get(CRDS, name)
            except StatusError as err:
                if err.code == 404:
                    return
                raise
            crd = cr.set_condition(crd, "Terminating", "False", "InstanceDeletionCompleted", "removed all instances",
                                   self.registry._now())
            try:
                crd = await self.registry.update(CRDS, crd, subresource="status")
                md = dict(crd["metadata"])
                md["finalizers"] = [f for f in md.get("finalizers") or () if f != cr.CLEANUP_FINALIZER]
                await self.registry.update(CRDS, {**crd, "metadata": md})
                return
            except StatusError as err:
                if err.code == 404:
                    return
                if err.code != 409:
                    raise


def _same_serving(old: tuple[ResourceInfo, ...], new: list[ResourceInfo], crd: Obj) -> bool:
    """Whether the catalogue already serves what ``crd`` defines (the same
    resources, made from the same CRD generation and deletion state)."""
    if tuple(old) != tuple(new):
        return False
    return all(o.custom.source == n.custom.source for o, n in zip(old, new))
