"""ControllerRevision helpers, after upstream's ``pkg/controller/history``.

StatefulSets and DaemonSets keep the history of their pod templates as
ControllerRevisions (apps/v1): immutable snapshots (``data``, a patch the
controller can apply to roll back) with an increasing ``revision`` number,
owned by the workload through a controller ownerReference and named
``<parent>-<hash>``, where the hash is FNV-1 (32 bit) of the data's JSON
bytes, plus the decimal collision count when one is set, written with
``rand.SafeEncodeString``'s alphabet.

Upstream hashes the ``RawExtension`` bytes the controller produced with
Go's ``encoding/json`` (map keys sorted, ``<``, ``>`` and ``&`` escaped);
:func:`raw_data` writes a dict the same way, so that equal data hashes and
compares equal however it was built.

:class:`History` is upstream's ``realHistory``: listing through an informer
index (the parent's revisions and the orphans a selector matches), creation
that walks the collision count past a name taken by different data, and
adoption, release, revision renumbering and deletion through the API.
"""

from __future__ import annotations

import datetime as _dt
import logging
from typing import Any, Iterable

import orjson

from kubeplane.api.errors import StatusError
from kubeplane.api.meta import deep_copy, parse_time
from kubeplane.api.resources import resource
from kubeplane.api.selectors import LabelSelector
from kubeplane.client.informer import SharedInformer
from kubeplane.client.interface import Client, Obj

log = logging.getLogger(__name__)

CONTROLLER_REVISIONS = resource("controllerrevisions")

#: the label holding a revision's hash (also on the pods made from it)
CONTROLLER_REVISION_HASH_LABEL = "controller.kubernetes.io/hash"
#: informer index: ``namespace/Kind/name/uid`` of the controlling owner, or ``namespace`` for orphans
CONTROLLER_REVISION_CONTROLLER_INDEX = "controllerRevisionController"

#: upstream truncates the parent's name so that ``<prefix>-<hash>`` stays a valid name
_NAME_PREFIX_LIMIT = 223
_SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
#: attempts of an update that meets conflicts (client-go's retry.DefaultBackoff has 4 steps)
_UPDATE_ATTEMPTS = 4


# ---------------------------------------------------------------- small helpers


def _md(obj: Obj) -> dict[str, Any]:
    md = obj.get("metadata")
    return md if isinstance(md, dict) else {}


def _controller_of(obj: Obj) -> Obj | None:
    for ref in _md(obj).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return ref
    return None


def controller_ref_for(parent: Obj, api_version: str, kind: str) -> Obj:
    """``metav1.NewControllerRef``: a controller ownerReference to ``parent``."""
    md = _md(parent)
    return {"apiVersion": api_version, "kind": kind, "name": md.get("name", ""), "uid": md.get("uid", ""),
            "controller": True, "blockOwnerDeletion": True}


def revision_number(revision: Obj) -> int:
    """``revision`` of a ControllerRevision (0 when unset or malformed)."""
    value = revision.get("revision")
    if isinstance(value, bool) or not isinstance(value, int):
        return 0
    return value


# -------------------------------------------------------------------- the index


def controller_revision_controller_index_key(namespace: str, owner_ref: Obj | None) -> str:
    """The index value of a revision controlled by ``owner_ref`` (``None``: an orphan)."""
    if owner_ref is None:
        return namespace
    return f"{namespace}/{owner_ref.get('kind', '')}/{owner_ref.get('name', '')}/{owner_ref.get('uid', '')}"


def controller_revision_controller_index(revision: Obj) -> list[str]:
    return [controller_revision_controller_index_key(_md(revision).get("namespace", ""), _controller_of(revision))]


def add_controller_revision_controller_indexer(informer: SharedInformer) -> None:
    """Add the controller index to a ControllerRevision informer (a no-op when
    another controller sharing the informer added it already)."""
    try:
        informer.add_indexers({CONTROLLER_REVISION_CONTROLLER_INDEX: controller_revision_controller_index})
    except ValueError:
        pass


# ------------------------------------------------------------- names and hashes


def raw_data(data: Any) -> bytes:
    """The JSON bytes Go's ``encoding/json`` writes for ``data`` (keys sorted,
    no spaces, ``<``, ``>``, ``&``, U+2028 and U+2029 escaped)."""
    out = orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
    if any(c in out for c in (b"<", b">", b"&", b"\xe2\x80\xa8", b"\xe2\x80\xa9")):
        # These bytes can only occur inside strings, where Go writes them as \u escapes.
        out = (out.replace(b"<", b"\\u003c").replace(b">", b"\\u003e").replace(b"&", b"\\u0026")
               .replace(b"\xe2\x80\xa8", b"\\u2028").replace(b"\xe2\x80\xa9", b"\\u2029"))
    return out


def fnv32(data: bytes, h: int = 0x811C9DC5) -> int:
    """FNV-1 (multiply, then xor), 32 bit: Go's ``hash/fnv.New32``."""
    for b in data:
        h = (h * 0x01000193) & 0xFFFFFFFF
        h ^= b
    return h


def safe_encode_string(s: str) -> str:
    """``rand.SafeEncodeString``: every character mapped into a vowel-free alphabet."""
    return "".join(_SAFE_ALPHABET[ord(c) % len(_SAFE_ALPHABET)] for c in s)


def hash_controller_revision(revision: Obj, probe: int | None = None) -> str:
    """The hash of a revision's data, with ``probe`` (the collision count) mixed in when set."""
    h = fnv32(raw_data(revision["data"])) if revision.get("data") is not None else fnv32(b"")
    if probe is not None:
        h = fnv32(str(int(probe)).encode(), h)
    return safe_encode_string(str(h))


def controller_revision_name(prefix: str, hash_: str) -> str:
    """``<prefix>-<hash>``, the prefix cut to 223 characters."""
    return f"{prefix[:_NAME_PREFIX_LIMIT]}-{hash_}"


def new_controller_revision(parent: Obj, api_version: str, kind: str, template_labels: dict[str, str] | None,
                            data: Obj, revision: int, collision_count: int | None) -> Obj:
    """A ControllerRevision for ``parent`` (not yet created): the template's labels
    plus the hash label, a controller ownerReference, ``data`` and ``revision``;
    named after the parent and the hash."""
    md = _md(parent)
    cr: Obj = {
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {
            "namespace": md.get("namespace", ""),
            "labels": dict(template_labels or {}),
            "ownerReferences": [controller_ref_for(parent, api_version, kind)],
        },
        "data": data,
        "revision": revision,
    }
    hash_ = hash_controller_revision(cr, collision_count)
    cr["metadata"]["name"] = controller_revision_name(md.get("name", ""), hash_)
    cr["metadata"]["labels"][CONTROLLER_REVISION_HASH_LABEL] = hash_
    return cr


# ------------------------------------------------------------ what a revision holds


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def typed_template(template: Any) -> Obj:
    """A pod template as upstream's typed round trip writes it (what ``getPatch``
    encodes, in the StatefulSet and DaemonSet controllers and in kubectl's
    ``rollout undo``): unset and empty omitempty fields gone, the API server's
    defaults filled in, ``metadata.creationTimestamp: null`` and every
    container's ``resources: {}`` present, map keys sorted (Go writes a
    decoded map so)."""
    from kubeplane.controllers.deployment import normalized_template

    out = normalized_template(template if isinstance(template, dict) else {})
    md = out.get("metadata") if isinstance(out.get("metadata"), dict) else {}
    md["creationTimestamp"] = None
    out["metadata"] = md
    spec = out.get("spec")
    if isinstance(spec, dict):
        for key in ("initContainers", "containers", "ephemeralContainers"):
            for c in spec.get(key) or []:
                if isinstance(c, dict) and not isinstance(c.get("resources"), dict):
                    c["resources"] = {}
    return _sorted(out)


def template_patch(template: Any) -> Obj:
    """The data of a StatefulSet's or DaemonSet's revision (upstream ``getPatch``):
    ``{"spec": {"template": <template>, "$patch": "replace"}}`` with the template
    in :func:`typed_template` form, so that the bytes the API server serves are
    the ones kubectl's ``rollout undo`` computes from the current object (it
    compares them to skip a rollback to the current template)."""
    template_ = typed_template(template)
    template_["$patch"] = "replace"
    return {"spec": {"template": _sorted(template_)}}


# ------------------------------------------------------------ order and equality


def _created(revision: Obj) -> _dt.datetime:
    value = _md(revision).get("creationTimestamp")
    if isinstance(value, str) and value:
        try:
            return parse_time(value)
        except ValueError:
            pass
    return _dt.datetime.min.replace(tzinfo=_dt.timezone.utc)


def sort_controller_revisions(revisions: Iterable[Obj]) -> list[Obj]:
    """Oldest first: by ``revision``, then creation time, then name (a stable sort)."""
    return sorted(revisions, key=lambda r: (revision_number(r), _created(r), _md(r).get("name", "")))


def equal_revision(lhs: Obj | None, rhs: Obj | None) -> bool:
    """Two revisions hold the same data (``None`` equals only ``None``)."""
    if lhs is None or rhs is None:
        return lhs is rhs
    return raw_data(lhs.get("data")) == raw_data(rhs.get("data"))


def find_equal_revisions(revisions: Iterable[Obj], needle: Obj) -> list[Obj]:
    """The revisions whose data equals ``needle``'s, in the given order."""
    want = raw_data(needle.get("data"))
    return [r for r in revisions if raw_data(r.get("data")) == want]


# ------------------------------------------------------------------- the history


class History:
    """A controller's access to ControllerRevisions: reads from the informer's
    index, writes through ``client``."""

    def __init__(self, client: Client, informer: SharedInformer) -> None:
        self.client = client
        self.informer = informer
        add_controller_revision_controller_indexer(informer)

    def list_controller_revisions(self, parent: Obj, api_version: str, kind: str,
                                  selector: LabelSelector) -> list[Obj]:
        """The revisions ``parent`` controls and the orphans in its namespace,
        both filtered by ``selector`` (the parent's pod selector)."""
        md = _md(parent)
        namespace = md.get("namespace", "")
        uid = md.get("uid", "")
        keys = (
            controller_revision_controller_index_key(namespace, controller_ref_for(parent, api_version, kind)),
            controller_revision_controller_index_key(namespace, None),
        )
        out: list[Obj] = []
        indexer = self.informer.indexer
        for key in keys:
            for cr in indexer.by_index(CONTROLLER_REVISION_CONTROLLER_INDEX, key):
                if not selector.matches(_md(cr).get("labels") or {}):
                    continue
                ref = _controller_of(cr)
                if ref is None or ref.get("uid") == uid:
                    out.append(cr)
        return out

    async def create_controller_revision(self, parent: Obj, revision: Obj,
                                         collision_count: int) -> tuple[Obj, int]:
        """Create ``revision`` under the name its hash and ``collision_count``
        give. A name taken by a revision with the same data returns that one; a
        name taken by different data bumps the count and tries again. Returns
        the revision and the collision count it was found or created with."""
        if collision_count is None:
            raise ValueError("collisionCount should not be nil")
        md = _md(parent)
        namespace = md.get("namespace", "")
        clone = deep_copy(revision)
        clone.setdefault("metadata", {})["namespace"] = namespace
        want = raw_data(revision.get("data"))
        while True:
            hash_ = hash_controller_revision(revision, collision_count)
            clone["metadata"]["name"] = controller_revision_name(md.get("name", ""), hash_)
            try:
                created = await self.client.create(CONTROLLER_REVISIONS, deep_copy(clone), namespace)
            except StatusError as err:
                if err.reason != "AlreadyExists":
                    raise
                exists = await self.client.get(CONTROLLER_REVISIONS, clone["metadata"]["name"], namespace)
                if raw_data(exists.get("data")) == want:
                    return exists, collision_count
                collision_count += 1
                continue
            return created, collision_count

    async def update_controller_revision(self, revision: Obj, new_revision: int) -> Obj:
        """Set ``revision`` to ``new_revision`` (retrying on conflicts with a fresh copy)."""
        clone = deep_copy(revision)
        md = _md(clone)
        last: StatusError | None = None
        for _ in range(_UPDATE_ATTEMPTS):
            if revision_number(clone) == new_revision:
                return clone
            clone["revision"] = new_revision
            try:
                return await self.client.update(CONTROLLER_REVISIONS, clone)
            except StatusError as err:
                if err.code != 409:
                    raise
                last = err
            clone = await self.client.get(CONTROLLER_REVISIONS, md.get("name", ""), md.get("namespace", ""))
            md = _md(clone)
        assert last is not None
        raise last

    async def delete_controller_revision(self, revision: Obj) -> None:
        md = _md(revision)
        await self.client.delete(CONTROLLER_REVISIONS, md.get("name", ""), md.get("namespace", ""))

    async def adopt_controller_revision(self, parent: Obj, api_version: str, kind: str, revision: Obj) -> Obj:
        """Make ``parent`` the controller of an orphan revision (a patch that
        fails if the revision was replaced meanwhile: it carries the uid)."""
        owner = _controller_of(revision)
        if owner is not None:
            raise ValueError(f"attempt to adopt revision owned by {owner}")
        md = _md(revision)
        patch = {"metadata": {"uid": md.get("uid", ""),
                              "ownerReferences": [controller_ref_for(parent, api_version, kind)]}}
        return await self.client.patch(CONTROLLER_REVISIONS, md.get("name", ""), patch,
                                       _md(parent).get("namespace", ""), patch_type="strategic")

    async def release_controller_revision(self, parent: Obj, revision: Obj) -> Obj | None:
        """Remove ``parent``'s ownerReference from ``revision``; ``None`` when the
        revision is gone or could not take the change (as upstream, not an error)."""
        md = _md(revision)
        patch = {"metadata": {"uid": md.get("uid", ""), "ownerReferences": [
            {"$patch": "delete", "uid": _md(parent).get("uid", "")}]}}
        try:
            return await self.client.patch(CONTROLLER_REVISIONS, md.get("name", ""), patch,
                                           md.get("namespace", ""), patch_type="strategic")
        except StatusError as err:
            if err.code in (404, 422):
                return None
            raise


__all__ = [
    "CONTROLLER_REVISIONS", "CONTROLLER_REVISION_CONTROLLER_INDEX", "CONTROLLER_REVISION_HASH_LABEL", "History",
    "add_controller_revision_controller_indexer", "controller_ref_for", "controller_revision_controller_index",
    "controller_revision_controller_index_key", "controller_revision_name", "equal_revision",
    "find_equal_revisions", "fnv32", "hash_controller_revision", "new_controller_revision", "raw_data",
    "revision_number", "sort_controller_revisions", "template_patch", "typed_template",
]
