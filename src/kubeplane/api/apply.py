"""Server-side apply and field ownership (``metadata.managedFields``).

Ownership is a set of field paths per manager. A path is a tuple of
FieldsV1 elements: ``f:<name>`` for a map field, ``k:<json>`` for an element
of an associative list (its key fields as compact JSON with sorted keys),
``v:<json>`` for an element of a set-list of primitives. A path to a node
that has owned children is rendered with a ``"."`` entry in FieldsV1.

List semantics come from :data:`kubeplane.api.patch.LIST_STRATEGIES` (the
``ssa``/``ssa_keys`` columns); lists not in the table are atomic, maps are
granular unless listed in :data:`kubeplane.api.patch.ATOMIC_MAPS`.

What is observable matches upstream: merging of the applied configuration,
removal of fields a manager stops applying (unless someone else owns them),
409 conflicts with ``FieldManagerConflict`` causes, ``force`` taking
ownership, Update operations taking ownership without conflicts, and the
``before-first-apply`` manager for objects that had no managed fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import orjson

from kubeplane.api import errors
from kubeplane.api.meta import deep_copy, same_json, without_managed_fields
from kubeplane.api.errors import Cause, StatusError
from kubeplane.api.patch import ListStrategy, json_equal, kind_tables

__all__ = [
    "apply",
    "track_update",
    "fields_to_v1",
    "fields_from_v1",
    "path_string",
    "BEFORE_FIRST_APPLY",
]

PathT = tuple[str, ...]
BEFORE_FIRST_APPLY = "before-first-apply"
#: kubectl's field manager for server-side apply; only it upgrades ownership
#: from client-side apply (as upstream).
KUBECTL_MANAGER = "kubectl"
LAST_APPLIED_ANNOTATION = "kubectl.kubernetes.io/last-applied-configuration"

# Never tracked: identity and system metadata (as upstream strips them).
_STRIPPED_EXACT: frozenset[PathT] = frozenset({("f:apiVersion",), ("f:kind",), ("f:metadata",)})
_STRIPPED_TREES: tuple[PathT, ...] = tuple(
    ("f:metadata", f"f:{name}") for name in (
        "name", "namespace", "creationTimestamp", "selfLink", "uid", "clusterName",
        "generation", "managedFields", "resourceVersion",
    )
)
_STRIPPED_TREE_SET = frozenset(_STRIPPED_TREES)
# Maps that upstream always sees in both the old and the new object (value
# structs), so an update never reports them as added nodes.
_VALUE_STRUCTS = frozenset({"metadata", "spec", "status", "template", "strategy"})


# ---------------------------------------------------------------------------
# Paths


def _dumps(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def path_string(path: PathT) -> str:
    """Render a path as upstream prints it: ``.spec.containers[name="c"].image``."""
    out: list[str] = []
    for el in path:
        if el.startswith("f:"):
            out.append("." + el[2:])
        elif el.startswith("k:"):
            key = orjson.loads(el[2:])
            out.append("[" + ",".join(f"{k}={_dumps(v)}" for k, v in key.items()) + "]")
        elif el.startswith("v:"):
            out.append("[=" + el[2:] + "]")
        elif el.startswith("i:"):
            out.append("[" + el[2:] + "]")
        else:
            out.append(el)
    return "".join(out)


_ELEMENT_RANK = {"f": 0, "k": 1, "v": 2, "i": 3}


def _element_order(el: str) -> tuple[int, str]:
    return (_ELEMENT_RANK.get(el[:1], 4), el)


def fields_to_v1(paths: Iterable[PathT]) -> dict[str, Any]:
    """Encode a path set in the FieldsV1 JSON form."""
    tree: dict[str, Any] = {}
    members: set[PathT] = set()
    for path in paths:
        node = tree
        for el in path:
            node = node.setdefault(el, {})
        members.add(path)

    return _render_v1(tree, (), members)


# The walks below are module functions rather than nested ones: a nested
# function that calls itself is a reference cycle, which only the garbage
# collector frees, and it would keep everything it built alive until then.


def _render_v1(node: dict[str, Any], prefix: PathT, members: set[PathT]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if node and prefix in members:
        out["."] = {}
    for el in sorted(node, key=_element_order):
        out[el] = _render_v1(node[el], prefix + (el,), members)
    return out


def fields_from_v1(tree: Any) -> set[PathT]:
    """Decode a FieldsV1 object into a path set."""
    paths: set[PathT] = set()
    if isinstance(tree, dict):
        _paths_of_v1(tree, (), paths)
    return paths


def _paths_of_v1(node: dict[str, Any], prefix: PathT, paths: set[PathT]) -> None:
    for el, child in node.items():
        if el == ".":
            continue
        path = prefix + (el,)
        if not isinstance(child, dict) or not child or "." in child:
            paths.add(path)
        if isinstance(child, dict):
            _paths_of_v1(child, path, paths)


# ---------------------------------------------------------------------------
# Schema-aware walks


class _Schema:
    """What the walks need to know of one kind: its atomic maps and list strategies."""

    __slots__ = ("group", "kind", "_atomic", "_lists", "_other_lists")

    def __init__(self, group: str, kind: str) -> None:
        self.group = group
        self.kind = kind
        self._atomic, self._lists, self._other_lists = kind_tables(group, kind)

    def lst(self, spath: PathT) -> ListStrategy:
        return self._lists.get(spath, self._other_lists)

    def atomic_map(self, spath: PathT) -> bool:
        return spath in self._atomic

    def key_of(self, item: Any, strategy: ListStrategy) -> str:
        if not isinstance(item, dict):
            raise errors.bad_request(
                f"associative list with keys has an element that is not a map: {_dumps(item)}")
        defaults = dict(strategy.key_defaults)
        key: dict[str, Any] = {}
        for name in strategy.ssa_keys:
            if name in item and item[name] is not None:
                key[name] = item[name]
            elif name in defaults:
                key[name] = defaults[name]
            else:
                raise errors.bad_request(
                    f'associative list with keys has an element that omits key field "{name}" '
                    f"(and doesn't have default value)")
        return "k:" + _dumps(key)


def _schema_of(obj: dict) -> _Schema:
    group = (obj.get("apiVersion") or "").rpartition("/")[0]
    kind = obj.get("kind") or ""
    key = (group, kind)
    schema = _schemas.get(key)
    if schema is None:
        schema = _Schema(group, kind)
        _memo_put(_schemas, key, schema)
    return schema


_schemas: dict[tuple[str, str], _Schema] = {}


def _keyed(items: list, schema: _Schema, strategy: ListStrategy) -> bool:
    """Whether every element has its key (live data that does not is atomic)."""
    try:
        keys = [schema.key_of(i, strategy) for i in items]
    except StatusError:
        return False
    return len(set(keys)) == len(keys)


_LEAF = "leaf"
_NODE = "node"
_NODE_ENTRY = (_NODE, None)
_SET_MEMBER_ENTRY = (_LEAF, None)


def _flatten(value: dict, schema: _Schema) -> dict[PathT, tuple[str, Any]]:
    """Every path of an object: leaves with their values, plus granular nodes."""
    out: dict[PathT, tuple[str, Any]] = {}
    _flatten_into(value, (), (), schema, out)
    return out


def _flatten_into(value: Any, path: PathT, spath: PathT, schema: _Schema,
                  out: dict[PathT, tuple[str, Any]]) -> None:
    """The entries of :func:`_flatten` for ``value`` found at ``path`` (schema path ``spath``)."""
    v = value
    if isinstance(v, dict) and not (spath and schema.atomic_map(spath)):
        if path and not (path[-1].startswith("f:") and path[-1][2:] in _VALUE_STRUCTS):
            out[path] = _NODE_ENTRY
        for k, child in v.items():
            _flatten_into(child, path + (f"f:{k}",), spath + (k,), schema, out)
        return
    if isinstance(v, list):
        strategy = schema.lst(spath)
        if strategy.ssa == "map" and _keyed(v, schema, strategy):
            for item in v:
                ipath = path + (schema.key_of(item, strategy),)
                out[ipath] = _NODE_ENTRY
                for k, child in item.items():
                    _flatten_into(child, ipath + (f"f:{k}",), spath + ("*", k), schema, out)
            return
        if strategy.ssa == "set":
            for item in v:
                out[path + ("v:" + _dumps(item),)] = _SET_MEMBER_ENTRY
            return
    out[path] = (_LEAF, v)


_MISSING = object()


def _diff_walk(old: Any, new: Any, path: PathT, spath: PathT, schema: _Schema,
               a: dict[PathT, tuple[str, Any]], b: dict[PathT, tuple[str, Any]]) -> None:
    """:func:`_flatten_into` of ``old`` into ``a`` and of ``new`` into ``b``, leaving out the
    entries both sides share for certain: equal subtrees of two granular maps, and the maps'
    own node entries."""
    if isinstance(old, dict) and isinstance(new, dict) and not (spath and schema.atomic_map(spath)):
        for k, oc in old.items():
            nc = new.get(k, _MISSING)
            if nc is _MISSING:
                _flatten_into(oc, path + (f"f:{k}",), spath + (k,), schema, a)
            elif not same_json(oc, nc):
                _diff_walk(oc, nc, path + (f"f:{k}",), spath + (k,), schema, a, b)
        for k, nc in new.items():
            if k not in old:
                _flatten_into(nc, path + (f"f:{k}",), spath + (k,), schema, b)
        return
    _flatten_into(old, path, spath, schema, a)
    _flatten_into(new, path, spath, schema, b)


def _applied_set(value: dict, schema: _Schema) -> set[PathT]:
    """Fields an applied configuration sets: leaves and list elements."""
    out: set[PathT] = set()
    _applied_walk(value, (), (), schema, out)
    return out


def _applied_walk(v: Any, path: PathT, spath: PathT, schema: _Schema, out: set[PathT]) -> None:
    if v is None:
        return
    if isinstance(v, dict) and not (spath and schema.atomic_map(spath)):
        for k, child in v.items():
            _applied_walk(child, path + (f"f:{k}",), spath + (k,), schema, out)
        return
    if isinstance(v, list):
        strategy = schema.lst(spath)
        if strategy.ssa == "map":
            for item in v:
                ipath = path + (schema.key_of(item, strategy),)
                out.add(ipath)
                for k, child in item.items():
                    _applied_walk(child, ipath + (f"f:{k}",), spath + ("*", k), schema, out)
            return
        if strategy.ssa == "set":
            out.update(path + ("v:" + _dumps(item),) for item in v)
            return
    out.add(path)


def _merge(live: Any, applied: Any, schema: _Schema, spath: PathT) -> Any:
    """Merge an applied configuration into the live value."""
    if applied is None:
        return deep_copy(live)
    if isinstance(applied, dict) and isinstance(live, dict) and not (spath and schema.atomic_map(spath)):
        out = dict(live)
        for k, v in applied.items():
            if v is None:
                continue
            out[k] = _merge(live.get(k), v, schema, spath + (k,))
        return out
    if isinstance(applied, list) and isinstance(live, list):
        strategy = schema.lst(spath)
        if strategy.ssa == "map" and _keyed(live, schema, strategy):
            merged = list(live)
            index = {schema.key_of(i, strategy): n for n, i in enumerate(merged) if isinstance(i, dict)}
            for item in applied:
                key = schema.key_of(item, strategy)
                if key in index:
                    merged[index[key]] = _merge(merged[index[key]], item, schema, spath + ("*",))
                else:
                    index[key] = len(merged)
                    merged.append(_strip_nulls(item))
            return merged
        if strategy.ssa == "set":
            merged = list(live)
            for item in applied:
                if not any(json_equal(item, x) for x in merged):
                    merged.append(deep_copy(item))
            return merged
    return _strip_nulls(applied)


def _strip_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_nulls(v) for v in value]
    return value


def _prune(obj: dict, remove: set[PathT], owned: set[PathT], schema: _Schema) -> dict:
    """Drop ``remove`` paths from ``obj`` unless something below them is owned."""
    if not remove:
        return obj
    keep_prefixes: set[PathT] = set()
    for path in owned:
        for n in range(1, len(path)):
            keep_prefixes.add(path[:n])
    return _prune_walk(obj, (), (), frozenset(), _PruneSets(remove, owned, keep_prefixes, schema))


@dataclass(slots=True)
class _PruneSets:
    remove: set[PathT]
    owned: set[PathT]
    keep_prefixes: set[PathT]
    schema: _Schema


def _prune_walk(v: Any, path: PathT, spath: PathT, keys: frozenset[str], ps: _PruneSets) -> Any:
    schema = ps.schema
    if isinstance(v, dict) and not (spath and schema.atomic_map(spath)):
        out: dict[str, Any] = {}
        for k, child in v.items():
            cpath = path + (f"f:{k}",)
            if k not in keys and cpath in ps.remove and cpath not in ps.keep_prefixes:
                continue
            new = _prune_walk(child, cpath, spath + (k,), frozenset(), ps)
            if (new == {} or new == []) and child not in ({}, []) and cpath not in ps.owned \
                    and cpath not in ps.keep_prefixes:
                continue
            out[k] = new
        return out
    if isinstance(v, list):
        strategy = schema.lst(spath)
        if strategy.ssa == "map" and _keyed(v, schema, strategy):
            items = []
            for item in v:
                ipath = path + (schema.key_of(item, strategy),)
                if ipath in ps.remove and ipath not in ps.keep_prefixes:
                    continue
                items.append(_prune_walk(item, ipath, spath + ("*",), frozenset(strategy.ssa_keys), ps))
            return items
        if strategy.ssa == "set":
            return [i for i in v if path + ("v:" + _dumps(i),) not in ps.remove]
    return v


# ---------------------------------------------------------------------------
# Managed fields bookkeeping


@dataclass
class _Manager:
    manager: str
    operation: str
    api_version: str
    time: str | None
    subresource: str
    #: owned paths; a frozenset shared with the decode memo until changed
    fields: set[PathT] | frozenset[PathT]
    #: the FieldsV1 tree ``fields`` was decoded from, while they are unchanged
    #: and when it is the canonical rendering of them
    source: Any = None

    @property
    def ident(self) -> tuple[str, str, str, str]:
        version = self.api_version if self.operation == "Update" else ""
        return (self.manager, self.operation, self.subresource, version)

    def drop(self, paths: set[PathT]) -> None:
        """Give up ownership of ``paths``."""
        if paths and not self.fields.isdisjoint(paths):
            self.fields = self.fields - paths
            self.source = None

    def printed(self) -> str:
        text = _dumps(self.manager)
        if self.subresource:
            text += f" with subresource {_dumps(self.subresource)}"
        if self.operation == "Update":
            text += f" using {self.api_version}"
        return text

    def to_entry(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "manager": self.manager,
            "operation": self.operation,
            "apiVersion": self.api_version,
        }
        if self.time is not None:
            entry["time"] = self.time
        entry["fieldsType"] = "FieldsV1"
        # Unchanged fields keep their stored tree (stored objects are never
        # modified in place, so versions may share it).
        entry["fieldsV1"] = self.source if self.source is not None else _fields_to_v1_memo(self.fields)
        if self.subresource:
            entry["subresource"] = self.subresource
        return entry


#: bound of the FieldsV1 decode/encode memos (objects written from one template share their trees)
_FIELDS_MEMO_SIZE = 2048
_decoded_memo: dict[bytes, tuple[frozenset[PathT], bool]] = {}
_encoded_memo: dict[frozenset[PathT], bytes] = {}


def _memo_put(memo: dict, key: Any, value: Any) -> None:
    if len(memo) >= _FIELDS_MEMO_SIZE:
        del memo[next(iter(memo))]
    memo[key] = value


def _fields_from_v1_memo(tree: Any) -> tuple[frozenset[PathT], bool]:
    """:func:`fields_from_v1`, memoized by the tree's JSON text; and whether the
    tree is exactly what :func:`_fields_to_v1_memo` renders for those paths
    (then it may be stored again as it is)."""
    if not isinstance(tree, dict):
        return frozenset(fields_from_v1(tree)), False
    try:
        key = orjson.dumps(tree)
    except TypeError:
        return frozenset(fields_from_v1(tree)), False
    hit = _decoded_memo.get(key)
    if hit is None:
        paths = frozenset(fields_from_v1(tree))
        canonical = _encoded_memo.get(paths)
        if canonical is None:
            canonical = orjson.dumps(fields_to_v1(paths))
            _memo_put(_encoded_memo, paths, canonical)
        hit = (paths, canonical == key)
        _memo_put(_decoded_memo, key, hit)
    return hit


def _fields_to_v1_memo(fields: set[PathT]) -> dict[str, Any]:
    """:func:`fields_to_v1`, memoized by the path set. The tree is shared by every
    caller asking for the same paths: it goes into stored objects, which are
    never modified in place (as the trees of creates, see :func:`_owned_fields_v1`)."""
    key = frozenset(fields)
    tree = _tree_by_paths.get(key)
    if tree is None:
        hit = _encoded_memo.get(key)
        if hit is None:
            hit = orjson.dumps(fields_to_v1(key))
            _memo_put(_encoded_memo, key, hit)
        tree = orjson.loads(hit)
        _memo_put(_tree_by_paths, key, tree)
        _memo_put(_decoded_by_id, id(tree), (tree, key, True))
    return tree


#: decoded FieldsV1 trees by path set (see _fields_to_v1_memo)
_tree_by_paths: dict[frozenset[PathT], dict[str, Any]] = {}
#: the FieldsV1 trees of stored objects by identity: id -> (tree, paths, canonical).
#: Stored objects are never modified in place and share unchanged trees across
#: versions and across objects written alike, so an update usually finds every
#: manager's tree here without encoding it. The tree is held, so its id stays its own.
_decoded_by_id: dict[int, tuple[Any, frozenset[PathT], bool]] = {}


def _stored_fields(tree: Any) -> tuple[frozenset[PathT], bool]:
    """:func:`_fields_from_v1_memo` for a tree of a stored object."""
    hit = _decoded_by_id.get(id(tree))
    if hit is not None and hit[0] is tree:
        return hit[1], hit[2]
    paths, canonical = _fields_from_v1_memo(tree)
    if isinstance(tree, dict):
        _memo_put(_decoded_by_id, id(tree), (tree, paths, canonical))
    return paths, canonical


def _decode(entries: Any, stored: bool = False) -> list[_Manager]:
    """The managers of ``entries``; ``stored``: the managedFields of a stored object
    (whose trees are never modified in place), not ones a client sent."""
    out: list[_Manager] = []
    if not isinstance(entries, list):
        return out
    fields_of = _stored_fields if stored else _fields_from_v1_memo
    for e in entries:
        if not isinstance(e, dict) or not e.get("manager") and not e.get("fieldsV1"):
            continue
        tree = e.get("fieldsV1")
        paths, canonical = fields_of(tree)
        out.append(_Manager(
            str(e.get("manager") or ""), str(e.get("operation") or "Update"),
            str(e.get("apiVersion") or ""), e.get("time"), str(e.get("subresource") or ""),
            paths, tree if canonical else None,
        ))
    return out


def _encode(managers: list[_Manager]) -> list[dict[str, Any]]:
    live = [m for m in managers if m.fields]
    live.sort(key=lambda m: (m.operation, m.time or "", m.manager, m.api_version, m.subresource))
    return [m.to_entry() for m in live]


def _ignored(path: PathT, subresource: str) -> bool:
    if path in _STRIPPED_EXACT:
        return True
    if len(path) >= 2 and path[:2] in _STRIPPED_TREE_SET:
        return True
    if subresource == "status":
        return not path or path[0] != "f:status"
    return bool(path) and path[0] == "f:status"


def _tracked(flat: dict[PathT, tuple[str, Any]], subresource: str) -> dict[PathT, tuple[str, Any]]:
    return {p: v for p, v in flat.items() if not _ignored(p, subresource)}


def _compare(old: dict, new: dict, schema: _Schema, subresource: str) -> tuple[set, set, set]:
    """(added, modified, removed) paths from ``old`` to ``new``.

    Subtrees equal on both sides are skipped (they add, change and remove
    nothing), so an update costs in proportion to what it changed."""
    fa: dict[PathT, tuple[str, Any]] = {}
    fb: dict[PathT, tuple[str, Any]] = {}
    _diff_walk(old, new, (), (), schema, fa, fb)
    a = _tracked(fa, subresource)
    b = _tracked(fb, subresource)
    added = set(b) - set(a)
    removed = set(a) - set(b)
    modified = {
        p for p in set(a) & set(b)
        if a[p][0] != b[p][0] or (a[p][0] == _LEAF and not json_equal(a[p][1], b[p][1]))
    }
    return added, modified, removed


def _without_managed(obj: dict | None) -> dict:
    if not obj:
        return {}
    out = deep_copy(obj)
    meta = out.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return out


def _with_managed(obj: dict, managers: list[_Manager]) -> dict:
    meta = obj.setdefault("metadata", {})
    entries = _encode(managers)
    if entries:
        meta["managedFields"] = entries
    else:
        meta.pop("managedFields", None)
    return obj


def _conflict_error(conflicts: list[tuple[_Manager, PathT]]) -> StatusError:
    conflicts = sorted(conflicts, key=lambda c: (c[0].printed(), [_element_order(e) for e in c[1]]))
    causes = [
        Cause("FieldManagerConflict", f"conflict with {m.printed()}", path_string(p))
        for m, p in conflicts
    ]
    if len(conflicts) == 1:
        m, p = conflicts[0]
        message = f"Apply failed with 1 conflict: conflict with {m.printed()}: {path_string(p)}"
    else:
        lines: list[str] = []
        current = None
        for m, p in conflicts:
            if m.printed() != current:
                current = m.printed()
                lines.append(f"conflicts with {current}:")
            lines.append(f"- {path_string(p)}")
        message = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
    return StatusError(409, "Conflict", message, causes=causes)


def _restrict(applied: dict, subresource: str) -> dict:
    """The part of an applied configuration this endpoint may change."""
    config = deep_copy(applied)
    if subresource == "status":
        return {k: v for k, v in config.items() if k in ("apiVersion", "kind", "metadata", "status")}
    config.pop("status", None)
    return config


# ---------------------------------------------------------------------------
# Public API


def apply(
    live: dict | None,
    applied: dict,
    manager: str,
    force: bool,
    now: str,
    *,
    subresource: str | None = None,
) -> dict:
    """Server-side apply ``applied`` on top of ``live`` (``None``: create).

    Returns the new object with ``metadata.managedFields`` updated. Raises a
    409 Conflict when the apply changes fields another manager owns, unless
    ``force``. On the main resource ``status`` in the configuration is
    ignored; with ``subresource="status"`` only ``status`` is.
    """
    if not isinstance(applied, dict):
        raise errors.bad_request("the applied configuration must be an object")
    if not manager:
        raise errors.bad_request("PATCH requests with apply content type require fieldManager")
    meta = applied.get("metadata")
    if isinstance(meta, dict) and meta.get("managedFields") is not None:
        raise errors.bad_request("metadata.managedFields must be nil")
    sub = subresource or ""
    schema = _schema_of(applied if applied.get("kind") else (live or {}))
    api_version = str(applied.get("apiVersion") or (live or {}).get("apiVersion") or "")

    base = _without_managed(live)
    managers = _decode(((live or {}).get("metadata") or {}).get("managedFields"), stored=True)
    if live is not None and not managers:
        # Objects that never had managed fields: someone owns what is there.
        added, _, _ = _compare({}, base, schema, "")
        managers = [_Manager(BEFORE_FIRST_APPLY, "Update", api_version, now, "", added)]

    config = _restrict(applied, sub)
    merged = _merge(base, config, schema, ())
    new_set = {p for p in _applied_set(config, schema) if not _ignored(p, sub)}

    me = _Manager(manager, "Apply", api_version, now, sub, new_set)
    previous = next((m for m in managers if m.ident == me.ident), None)
    others = [m for m in managers if m.ident != me.ident]
    last_set = previous.fields if previous else set()

    owned = set(new_set)
    for m in others:
        owned |= m.fields
    merged = _prune(merged, last_set - owned, owned, schema)

    added, modified, removed = _compare(base, merged, schema, sub)
    changed = added | modified
    conflicts = [(m, p) for m in others for p in sorted(m.fields & changed)]
    if conflicts and not force and manager == KUBECTL_MANAGER:
        # kubectl switching from client-side to server-side apply: fields its
        # last-applied annotation still describes truly are kubectl's, so
        # conflicts on them do not count (upstream's lastAppliedManager).
        allowed = _last_applied_fields(live, schema, api_version)
        conflicts = [(m, p) for m, p in conflicts if p not in allowed]
    if conflicts and not force:
        raise _conflict_error(conflicts)
    for m in others:
        m.drop(changed | removed)

    if previous is not None and previous.fields == new_set and json_equal(merged, base):
        me.time = previous.time
    result = _with_managed(merged, [me, *others] if previous is None else
                           [me if m is previous else m for m in managers])
    if manager == KUBECTL_MANAGER:
        _update_last_applied(result, applied)
    return result


def _last_applied_fields(live: dict | None, schema: _Schema, api_version: str) -> set[PathT]:
    """The fields of ``live``'s last-applied configuration whose values the live
    object still has (none without a usable annotation of the same version)."""
    annotations = ((live or {}).get("metadata") or {}).get("annotations")
    text = annotations.get(LAST_APPLIED_ANNOTATION) if isinstance(annotations, dict) else None
    if not isinstance(text, str) or not text:
        return set()
    try:
        last = orjson.loads(text)
    except orjson.JSONDecodeError:
        return set()
    if not isinstance(last, dict) or last.get("apiVersion") != api_version:
        return set()
    try:
        fields = {p for p in _applied_set(last, schema) if not _ignored(p, "")}
        added, modified, removed = _compare(last, _without_managed(live), schema, "")
    except (StatusError, TypeError, AttributeError):
        return set()
    return fields - added - modified - removed


def _update_last_applied(result: dict, applied: dict) -> None:
    """Keep an existing last-applied annotation in step with what kubectl
    applies server-side, so a later client-side apply diffs against it
    (upstream's lastAppliedUpdater)."""
    annotations = (result.get("metadata") or {}).get("annotations")
    if not isinstance(annotations, dict) or not annotations.get(LAST_APPLIED_ANNOTATION):
        return
    config = deep_copy(applied)
    meta = config.get("metadata")
    if isinstance(meta, dict) and isinstance(meta.get("annotations"), dict):
        meta["annotations"].pop(LAST_APPLIED_ANNOTATION, None)
    annotations[LAST_APPLIED_ANNOTATION] = _go_json(config) + "\n"


def _go_json(value: Any) -> str:
    """JSON as Go's encoding/json writes a map: sorted keys, HTML-escaped."""
    text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    for ch, esc in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"),
                    ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


def _owned_fields_v1(obj: dict, schema: _Schema, subresource: str) -> dict[str, Any]:
    """FieldsV1 of every tracked field of ``obj`` in one pass.

    Equivalent to ``fields_to_v1(_tracked(_flatten(obj)))`` (a test checks
    this) but several times faster; used when a manager creates an object and
    so owns all of it. The tree is built as JSON text and decoded once; maps
    whose values are all scalars (most leaves' parents) are rendered once per
    schema path and key sequence, other maps and lists once per JSON text.
    """
    top: dict[str, str] = {}
    status = subresource == "status"
    for k, child in obj.items():
        if k in _TYPE_KEYS or status != (k == "status"):
            continue
        fk = _FIELD_KEYS.get(k) or _field_key(k)
        if isinstance(child, dict):
            if k == "metadata":
                kept = {}
                for mk, mv in child.items():
                    if mk not in _STRIPPED_META:
                        fmk = _FIELD_KEYS.get(mk) or _field_key(mk)
                        kept[fmk] = _owned_text(mv, fmk, ("metadata", mk), schema)
                if kept:
                    top["f:metadata"] = _level_text(kept, False)
                continue
            top[fk] = _owned_text(child, fk, (k,), schema)
        elif isinstance(child, list):
            top[fk] = _owned_text(child, fk, (k,), schema)
        else:
            top[fk] = _EMPTY
    # Objects of one kind written alike (the events of a recorder, the pods of a
    # template) end in the same top level: one decoded tree, shared (stored
    # objects are never modified in place).
    key = (schema.group, schema.kind, tuple(top.items()))
    tree = _tree_memo.get(key)
    if tree is None:
        tree = orjson.loads(_level_text(top, False))
        _memo_put(_tree_memo, key, tree)
    return tree


_EMPTY = "{}"
_TYPE_KEYS = frozenset({"apiVersion", "kind"})
#: metadata fields never tracked (see _STRIPPED_TREES)
_STRIPPED_META = frozenset(path[1][2:] for path in _STRIPPED_TREES)
#: "f:" + name, for the names objects use
_FIELD_KEYS: dict[str, str] = {}


def _field_key(name: str) -> str:
    fk = "f:" + name
    _memo_put(_FIELD_KEYS, name, fk)
    return fk


_SCALARS = (str, int, float, bool, type(None))
#: decoded FieldsV1 trees of creates by (group, kind, top-level children's texts)
_tree_memo: dict[tuple[str, str, tuple[tuple[str, str], ...]], dict[str, Any]] = {}
#: JSON text of flat maps' FieldsV1 by (group, kind, schema path, member, keys)
_flat_memo: dict[tuple[str, str, PathT, bool, tuple[str, ...]], str] = {}
_esc_memo: dict[str, str] = {}


def _esc(el: str) -> str:
    """``el`` as a JSON string literal."""
    hit = _esc_memo.get(el)
    if hit is None:
        hit = orjson.dumps(el).decode()
        _memo_put(_esc_memo, el, hit)
    return hit


def _level_text(children: dict[str, str], member: bool) -> str:
    """One level of a FieldsV1 tree as JSON text: the ``"."`` member entry first when
    ``member`` and there are children, then the children in element order.

    Memoized by the children's texts: objects that differ only in values (each
    pod's claim name, each volume's node) have levels of the same shape."""
    if not children:
        return _EMPTY
    key = (member, *children.items())
    hit = _level_memo.get(key)
    if hit is None:
        parts = ['".":{}'] if member else []
        for el in sorted(children, key=_element_order):
            parts.append(f"{_esc(el)}:{children[el]}")
        hit = "{" + ",".join(parts) + "}"
        _memo_put(_level_memo, key, hit)
    return hit


#: level texts by (member, children's (element, text) pairs), see _level_text
_level_memo: dict[tuple, str] = {}


def _owned_text(v: Any, last: str, spath: PathT, schema: _Schema) -> str:
    """The FieldsV1 JSON text of value ``v`` reached by element ``last`` at schema path ``spath``."""
    if isinstance(v, dict):
        if spath and schema.atomic_map(spath):
            return _EMPTY
        return _map_text(v, spath, not (last.startswith("f:") and last[2:] in _VALUE_STRUCTS), schema)
    if isinstance(v, list) and v:
        strategy = schema.lst(spath)
        if strategy.ssa == "map" or strategy.ssa == "set":
            return _memoized(v, spath, False, schema, _list_text, strategy)
    return _EMPTY


def _list_text(v: list, spath: PathT, _member: bool, schema: _Schema, strategy: ListStrategy) -> str:
    if strategy.ssa == "map":
        if not _keyed(v, schema, strategy):
            return _EMPTY
        base = spath + ("*",)
        return _level_text({schema.key_of(item, strategy): _map_text(item, base, True, schema)
                            for item in v}, False)
    return _level_text({"v:" + _dumps(item): _EMPTY for item in v}, False)


def _map_text(v: dict, base: PathT, member: bool, schema: _Schema) -> str:
    """FieldsV1 text of a granular map whose fields sit at schema paths ``base + (key,)``."""
    for x in v.values():
        if not isinstance(x, _SCALARS):
            break
    else:
        key = (schema.group, schema.kind, base, member, tuple(v))
        hit = _flat_memo.get(key)
        if hit is None:
            hit = _level_text({f"f:{k}": _EMPTY for k in v}, member)
            _memo_put(_flat_memo, key, hit)
        return hit
    return _memoized(v, base, member, schema, _nested_map_text, None)


def _nested_map_text(v: dict, base: PathT, member: bool, schema: _Schema, _unused: Any) -> str:
    children: dict[str, str] = {}
    for k, child in v.items():
        fk = _FIELD_KEYS.get(k) or _field_key(k)
        # A scalar (or an empty list) owns no fields below it.
        children[fk] = _owned_text(child, fk, base + (k,), schema) if isinstance(child, (dict, list)) else _EMPTY
    return _level_text(children, member)


#: FieldsV1 text of nested maps and of lists by (group, kind, schema path, member, JSON text):
#: objects made from one template (pods of a Deployment, say) share their containers' trees
_owned_memo: dict[tuple[str, str, PathT, bool, bytes], str] = {}
#: values whose JSON text is longer are walked every time
_OWNED_MEMO_MAX_BYTES = 16384


def _memoized(v: Any, spath: PathT, member: bool, schema: _Schema, render: Any, arg: Any) -> str:
    try:
        text = orjson.dumps(v)
    except TypeError:
        return render(v, spath, member, schema, arg)
    if len(text) > _OWNED_MEMO_MAX_BYTES:
        return render(v, spath, member, schema, arg)
    key = (schema.group, schema.kind, spath, member, text)
    hit = _owned_memo.get(key)
    if hit is None:
        hit = render(v, spath, member, schema, arg)
        # Admitted on the second sight only: values seen once (a claim name, a
        # node name) would push out the ones objects share.
        h = hash(key)
        if h in _owned_seen:
            _memo_put(_owned_memo, key, hit)
        else:
            _memo_put(_owned_seen, h, None)
    return hit


#: hashes of _owned_memo keys seen once
_owned_seen: dict[int, None] = {}


def track_update(
    old: dict | None,
    new: dict,
    manager: str,
    now: str,
    *,
    subresource: str | None = None,
) -> dict:
    """Record ownership for a create, update or non-apply patch by ``manager``.

    Changed and added fields move to ``manager`` (operation ``Update``)
    without conflicts; removed fields leave every manager. Managed fields
    sent in ``new`` replace the stored ones when non-empty (``[{}]`` clears
    them), otherwise those of ``old`` are kept.
    """
    sub = subresource or ""
    schema = _schema_of(new if new.get("kind") else (old or {}))
    api_version = str(new.get("apiVersion") or (old or {}).get("apiVersion") or "")
    sent = (new.get("metadata") or {}).get("managedFields")
    if old is None and not sent:
        # A create: the manager owns every tracked field.
        after = without_managed_fields(new, fresh=True)
        tree = _owned_fields_v1(after, schema, sub)
        if tree:
            entry = {"manager": manager, "operation": "Update", "apiVersion": api_version, "time": now,
                     "fieldsType": "FieldsV1", "fieldsV1": tree}
            if sub:
                entry["subresource"] = sub
            after["metadata"] = {**after.get("metadata", {}), "managedFields": [entry]}
        return after
    stored = ((old or {}).get("metadata") or {}).get("managedFields")
    if isinstance(sent, list) and sent and sent is not stored and sent != stored:
        managers = _decode(sent)
    else:
        # Nothing sent, or the stored entries sent back as they are (the
        # status endpoint keeps the stored metadata; a patch copies it).
        managers = _decode(stored, stored=True)

    # Read-only views suffice here: only the metadata dict is replaced.
    before = without_managed_fields(old or {}, fresh=True)
    after = without_managed_fields(new, fresh=True)
    added, modified, removed = _compare(before, after, schema, sub)
    changed = added | modified

    ident = (manager, "Update", sub, api_version)
    mine = next((m for m in managers if m.ident == ident), None)
    gone = changed | removed
    for m in managers:
        if m is not mine:
            m.drop(gone)
    if mine is None:
        if changed:
            managers.append(_Manager(manager, "Update", api_version, now, sub, set(changed)))
    else:
        if changed:
            mine.time = now
        if not changed <= mine.fields or not mine.fields.isdisjoint(removed):
            mine.fields = (mine.fields - removed) | changed
            mine.source = None
            mine.time = now
    return _with_managed(after, managers)
