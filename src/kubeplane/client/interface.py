"""The ``Client`` protocol: one interface, two transports.

``InProcessClient`` calls the registry directly (what ``kubeplane up`` uses);
``HttpClient`` speaks the Kubernetes REST API over aiohttp and also works
against a real cluster. Both raise :class:`kubeplane.api.errors.StatusError`
for every API failure and pass the same test suite.

Objects are plain dicts exactly as the API serves them. Returned dicts belong
to the caller (the in-process client hands out copies).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, AsyncIterator, Literal, Protocol

from kubeplane.api.resources import ResourceInfo

Obj = dict[str, Any]

PatchType = Literal["json", "merge", "strategic", "apply"]

PATCH_CONTENT_TYPES: dict[str, str] = {
    "json": "application/json-patch+json",
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",
}


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """``type`` is ADDED, MODIFIED, DELETED, BOOKMARK or ERROR (object is then a Status)."""

    type: str
    object: Obj


class WatchStream(Protocol):
    def __aiter__(self) -> AsyncIterator[WatchEvent]: ...

    async def __anext__(self) -> WatchEvent: ...

    async def close(self) -> None: ...


class Client(Protocol):
    async def get(
        self, res: ResourceInfo, name: str, namespace: str | None = None, *, subresource: str | None = None
    ) -> Obj: ...

    async def list(
        self,
        res: ResourceInfo,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
        resource_version: str | None = None,
        resource_version_match: str | None = None,
    ) -> Obj:
        """Returns the List object: ``items``, ``metadata.resourceVersion`` and
        ``metadata.continue`` when more pages exist."""

    async def create(
        self,
        res: ResourceInfo,
        obj: Obj,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        name: str | None = None,
        field_manager: str | None = None,
        dry_run: bool = False,
    ) -> Obj:
        """POST. With ``subresource`` (e.g. ``binding``) ``name`` names the parent."""

    async def update(
        self,
        res: ResourceInfo,
        obj: Obj,
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
        dry_run: bool = False,
    ) -> Obj:
        """PUT; namespace and name come from ``obj['metadata']``."""

    async def patch(
        self,
        res: ResourceInfo,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        patch_type: PatchType = "merge",
        subresource: str | None = None,
        field_manager: str | None = None,
        force: bool | None = None,
        dry_run: bool = False,
    ) -> Obj: ...

    async def delete(
        self,
        res: ResourceInfo,
        name: str,
        namespace: str | None = None,
        *,
        grace_period_seconds: int | None = None,
        propagation_policy: str | None = None,
        preconditions: dict[str, str] | None = None,
        dry_run: bool = False,
    ) -> Obj:
        """Returns the object (when it lingers: finalizers, graceful pods) or a Status."""

    async def delete_collection(
        self,
        res: ResourceInfo,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        grace_period_seconds: int | None = None,
        propagation_policy: str | None = None,
        dry_run: bool = False,
    ) -> Obj:
        """deletecollection: deletes what the selectors match; returns the List of it."""

    def watch(
        self,
        res: ResourceInfo,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        allow_bookmarks: bool = True,
        timeout_seconds: int | None = None,
        send_initial_events: bool = False,
    ) -> WatchStream:
        """Starts a watch. An expired resourceVersion shows up as an ERROR event
        whose Status has code 410 (as on the wire), never as an exception."""

    async def close(self) -> None: ...
