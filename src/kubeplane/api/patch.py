"""The three PATCH body formats the API server accepts besides apply.

* :func:`json_patch` - RFC 6902 operations (``application/json-patch+json``).
* :func:`merge_patch` - RFC 7386 (``application/merge-patch+json``).
* :func:`strategic_merge_patch` - the Kubernetes strategic merge patch
  (``application/strategic-merge-patch+json``) for built-in kinds.

The per-field list strategies of built-in kinds (:data:`LIST_STRATEGIES`) come
from the ``patchStrategy``/``patchMergeKey`` and ``listType``/``listMapKey``
markers of the upstream API types; server-side apply reuses the same table.

None of the functions mutates its inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from kubeplane.api import errors
from kubeplane.api.meta import deep_copy
from kubeplane.api.errors import StatusError
from kubeplane.api.resources import RESOURCES

__all__ = [
    "ListStrategy",
    "LIST_STRATEGIES",
    "ATOMIC_MAPS",
    "RETAIN_KEYS_MAPS",
    "BUILTIN_KINDS",
    "PATCH_MEDIA_TYPES",
    "SMP_UNSUPPORTED_MEDIA_TYPES",
    "json_patch",
    "merge_patch",
    "strategic_merge_patch",
    "list_strategy",
    "is_atomic_map",
    "json_equal",
]

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
PATCH_MEDIA_TYPES = (JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, APPLY_PATCH)
# What upstream offers for kinds without strategic-merge metadata (custom resources).
SMP_UNSUPPORTED_MEDIA_TYPES = [JSON_PATCH, MERGE_PATCH, APPLY_PATCH]

# Upstream answers any JSON patch that does not apply with this generic 422.
_PATCH_REJECTED = "the server rejected our request due to an error in our request"


# ---------------------------------------------------------------------------
# Value helpers


def json_equal(a: Any, b: Any) -> bool:
    """Equality of JSON values: ``true`` is not ``1``, ``1`` equals ``1.0``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


# ---------------------------------------------------------------------------
# Merge-key table


@dataclass(frozen=True, slots=True)
class ListStrategy:
    """How one list field merges.

    ``smp_key`` is the strategic-merge-patch merge key (``patchMergeKey``);
    ``smp_merge`` is true for ``patchStrategy:"merge"`` (a primitive list with
    no key then merges as a set). ``ssa`` is the apply ``listType``
    (``map``/``set``/``atomic``) with ``ssa_keys`` the ``listMapKey`` fields and
    ``key_defaults`` the defaults applied to missing key fields.
    """

    smp_merge: bool
    smp_key: str | None = None
    ssa: str = "atomic"
    ssa_keys: tuple[str, ...] = ()
    key_defaults: tuple[tuple[str, Any], ...] = ()
    retain_keys: bool = False


def _by(key: str, *, ssa_keys: tuple[str, ...] | None = None, ssa: str = "map",
        defaults: tuple[tuple[str, Any], ...] = (), retain: bool = False) -> ListStrategy:
    return ListStrategy(True, key, ssa, ssa_keys or (key,), defaults, retain)


_SET = ListStrategy(True, None, "set")
_ATOMIC = ListStrategy(False)
# listType=map for apply but no patchStrategy: atomic for strategic merge patch.
def _ssa_only(*keys: str) -> ListStrategy:
    return ListStrategy(False, None, "map", keys)


Path = tuple[str, ...]
# "*" in a schema path stands for "any element of the list".


def _object_meta(prefix: Path) -> dict[Path, ListStrategy]:
    return {
        prefix + ("finalizers",): _SET,
        prefix + ("ownerReferences",): _by("uid"),
    }


def _container(prefix: Path) -> dict[Path, ListStrategy]:
    return {
        prefix + ("ports",): _by("containerPort", ssa_keys=("containerPort", "protocol"),
                                 defaults=(("protocol", "TCP"),)),
        prefix + ("env",): _by("name"),
        prefix + ("volumeMounts",): _by("mountPath"),
        prefix + ("volumeDevices",): _by("devicePath"),
        prefix + ("resources", "claims"): _ssa_only("name"),
    }


def _pod_spec(prefix: Path) -> dict[Path, ListStrategy]:
    table: dict[Path, ListStrategy] = {
        prefix + ("volumes",): _by("name", retain=True),
        prefix + ("imagePullSecrets",): _by("name"),
        prefix + ("hostAliases",): _by("ip"),
        prefix + ("topologySpreadConstraints",): _by(
            "topologyKey", ssa_keys=("topologyKey", "whenUnsatisfiable")),
        prefix + ("resourceClaims",): _by("name", retain=True),
        prefix + ("schedulingGates",): _by("name"),
    }
    for name in ("containers", "initContainers", "ephemeralContainers"):
        table[prefix + (name,)] = _by("name")
        table.update(_container(prefix + (name, "*")))
    return table


def _pod_template(prefix: Path) -> dict[Path, ListStrategy]:
    return {**_object_meta(prefix + ("metadata",)), **_pod_spec(prefix + ("spec",))}


def _conditions(*prefix: str, ssa: str = "map") -> dict[Path, ListStrategy]:
    strategy = _by("type") if ssa == "map" else ListStrategy(True, "type", "atomic")
    return {tuple(prefix) + ("conditions",): strategy}


_POD_STATUS: dict[Path, ListStrategy] = {
    **_conditions("status"),
    ("status", "podIPs"): _by("ip"),
    ("status", "hostIPs"): _by("ip"),
    ("status", "resourceClaimStatuses"): _by("name", retain=True),
}

# (group, kind) -> schema path -> list strategy; lists not listed are atomic.
LIST_STRATEGIES: dict[tuple[str, str], dict[Path, ListStrategy]] = {
    ("", "Pod"): {**_pod_spec(("spec",)), **_POD_STATUS},
    ("", "Node"): {
        ("spec", "podCIDRs"): _SET,
        **_conditions("status"),
        # patchStrategy merge by type, but listType=atomic for apply.
        ("status", "addresses"): ListStrategy(True, "type", "atomic"),
    },
    ("", "Namespace"): _conditions("status"),
    ("", "PersistentVolumeClaim"): _conditions("status"),
    ("", "PersistentVolume"): {},
    ("", "Service"): {
        ("spec", "ports"): _by("port", ssa_keys=("port", "protocol"), defaults=(("protocol", "TCP"),)),
        **_conditions("status"),
    },
    ("", "ConfigMap"): {},
    ("", "Secret"): {},
    ("", "Event"): {},
    ("apps", "Deployment"): {**_pod_template(("spec", "template")), **_conditions("status")},
    ("apps", "ReplicaSet"): {**_pod_template(("spec", "template")), **_conditions("status")},
    ("apps", "StatefulSet"): {**_pod_template(("spec", "template")), **_conditions("status")},
    ("apps", "DaemonSet"): {**_pod_template(("spec", "template")), **_conditions("status")},
    ("batch", "Job"): {
        **_pod_template(("spec", "template")),
        # Job conditions merge by type in SMP but are listType=atomic for apply.
        **_conditions("status", ssa="atomic"),
    },
    ("policy", "PodDisruptionBudget"): _conditions("status"),
    ("storage.k8s.io", "CSINode"): {("spec", "drivers"): _by("name")},
    ("resource.k8s.io", "ResourceClaim"): {
        ("status", "reservedFor"): _by("uid"),
        ("status", "devices"): _ssa_only("driver", "device", "pool"),
    },
}
# ObjectMeta lists, shared by every kind (custom resources included).
_META: dict[Path, ListStrategy] = _object_meta(("metadata",))
for _table in LIST_STRATEGIES.values():
    _table.update(_META)
del _table

# Maps whose strategic-merge patchStrategy is "retainKeys" (a patch clears the
# fields it does not list); lists with it are marked in their ListStrategy.
RETAIN_KEYS_MAPS: dict[tuple[str, str], frozenset[Path]] = {
    ("apps", "Deployment"): frozenset({("spec", "strategy")}),
}

# Maps apply replaces as a whole (``+structType=atomic``, e.g. LabelSelector).
# Strategic merge patch ignores this marker and merges them like any map.
ATOMIC_MAPS: dict[tuple[str, str], frozenset[Path]] = {
    ("apps", "Deployment"): frozenset({("spec", "selector")}),
    ("apps", "ReplicaSet"): frozenset({("spec", "selector")}),
    ("apps", "StatefulSet"): frozenset({("spec", "selector")}),
    ("apps", "DaemonSet"): frozenset({("spec", "selector")}),
    ("batch", "Job"): frozenset({("spec", "selector")}),
    ("policy", "PodDisruptionBudget"): frozenset({("spec", "selector")}),
}
for _gk, _prefix in ((("", "Pod"), ("spec",)), (("apps", "Deployment"), ("spec", "template", "spec")),
                     (("apps", "ReplicaSet"), ("spec", "template", "spec")),
                     (("apps", "StatefulSet"), ("spec", "template", "spec")),
                     (("apps", "DaemonSet"), ("spec", "template", "spec")),
                     (("batch", "Job"), ("spec", "template", "spec"))):
    ATOMIC_MAPS[_gk] = ATOMIC_MAPS.get(_gk, frozenset()) | {
        _prefix + ("topologySpreadConstraints", "*", "labelSelector"),
    }
del _gk, _prefix


def _builtin_kinds() -> frozenset[tuple[str, str]]:
    kinds = {(r.group, r.kind) for r in RESOURCES}
    kinds.add(("autoscaling", "Scale"))
    return frozenset(kinds)


BUILTIN_KINDS: frozenset[tuple[str, str]] = _builtin_kinds()


def list_strategy(group: str, kind: str, path: Iterable[str]) -> ListStrategy:
    """The strategy of the list at schema ``path`` (``"*"`` for list elements)."""
    return LIST_STRATEGIES.get((group, kind), _META).get(tuple(path), _ATOMIC)


def is_atomic_map(group: str, kind: str, path: Iterable[str]) -> bool:
    return tuple(path) in ATOMIC_MAPS.get((group, kind), frozenset())


def kind_tables(group: str, kind: str) -> tuple[frozenset[Path], dict[Path, ListStrategy], ListStrategy]:
    """The atomic map paths, the list strategies by schema path and the strategy of
    lists not in that table, for one kind (what ``is_atomic_map`` and
    ``list_strategy`` read)."""
    return ATOMIC_MAPS.get((group, kind), frozenset()), LIST_STRATEGIES.get((group, kind), _META), _ATOMIC


# ---------------------------------------------------------------------------
# RFC 6902


class _PatchFailure(Exception):
    """Why a JSON patch did not apply; surfaces as a generic 422."""


def _rejected(detail: str) -> StatusError:
    err = StatusError(422, "Invalid", _PATCH_REJECTED)
    err.__cause__ = _PatchFailure(detail)
    return err


def _parse_pointer(pointer: Any) -> list[str]:
    if not isinstance(pointer, str):
        raise _PatchFailure(f"invalid path: {pointer!r}")
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise _PatchFailure(f"JSON pointer must be empty or start with a \"/\": {pointer}")
    return [p.replace("~1", "/").replace("~0", "~") for p in pointer[1:].split("/")]


def _array_index(token: str, length: int, *, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return length
    if not token.isdigit() or (len(token) > 1 and token[0] == "0"):
        raise _PatchFailure(f"invalid array index: {token}")
    idx = int(token)
    if idx > length or (idx == length and not allow_end):
        raise _PatchFailure(f"array index out of bounds: {idx}")
    return idx


def _container_of(doc: Any, tokens: list[str], op: str, pointer: str) -> Any:
    cur = doc
    for token in tokens[:-1]:
        if isinstance(cur, dict):
            if token not in cur:
                raise _PatchFailure(f'{op} operation does not apply: doc is missing path: "{pointer}"')
            cur = cur[token]
        elif isinstance(cur, list):
            cur = cur[_array_index(token, len(cur), allow_end=False)]
        else:
            raise _PatchFailure(f'{op} operation does not apply: doc is missing path: "{pointer}"')
    if not isinstance(cur, (dict, list)):
        raise _PatchFailure(f'{op} operation does not apply: doc is missing path: "{pointer}"')
    return cur


def _get(doc: Any, tokens: list[str], op: str, pointer: str) -> Any:
    if not tokens:
        return doc
    parent = _container_of(doc, tokens, op, pointer)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise _PatchFailure(f'{op} operation does not apply: doc is missing path: "{pointer}"')
        return parent[last]
    return parent[_array_index(last, len(parent), allow_end=False)]


def _add(doc: Any, tokens: list[str], value: Any, pointer: str, op: str = "add") -> Any:
    if not tokens:
        return value
    parent = _container_of(doc, tokens, op, pointer)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    else:
        parent.insert(_array_index(last, len(parent), allow_end=True), value)
    return doc


def _remove(doc: Any, tokens: list[str], pointer: str, op: str = "remove") -> tuple[Any, Any]:
    if not tokens:
        raise _PatchFailure(f"{op} operation does not apply: cannot remove the whole document")
    parent = _container_of(doc, tokens, op, pointer)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise _PatchFailure(f"Unable to remove nonexistent key: {last}: missing value")
        return doc, parent.pop(last)
    return doc, parent.pop(_array_index(last, len(parent), allow_end=False))


def _require(op: dict[str, Any], name: str, kind: str) -> Any:
    if name not in op:
        raise _PatchFailure(f"{kind} operation, missing {name} field")
    return op[name]


def json_patch(obj: dict, ops: Any) -> dict:
    """Apply RFC 6902 ``ops`` to a copy of ``obj``.

    A body that is not a list of operation objects is a 400; an operation
    that does not apply (missing path, failed ``test``, bad index) is the
    generic 422 Invalid upstream answers.
    """
    if not isinstance(ops, list) or not all(isinstance(o, dict) for o in ops):
        raise errors.bad_request(
            "json: cannot unmarshal " + _go_type(ops) + " into Go value of type jsonpatch.Patch"
        )
    doc: Any = deep_copy(obj)
    try:
        for op in ops:
            kind = op.get("op")
            pointer = _require(op, "path", str(kind))
            tokens = _parse_pointer(pointer)
            if kind == "add":
                doc = _add(doc, tokens, deep_copy(_require(op, "value", kind)), pointer)
            elif kind == "remove":
                doc, _ = _remove(doc, tokens, pointer)
            elif kind == "replace":
                value = deep_copy(_require(op, "value", kind))
                _get(doc, tokens, kind, pointer)
                if not tokens:
                    doc = value
                else:
                    parent = _container_of(doc, tokens, kind, pointer)
                    if isinstance(parent, dict):
                        parent[tokens[-1]] = value
                    else:
                        parent[_array_index(tokens[-1], len(parent), allow_end=False)] = value
            elif kind in ("move", "copy"):
                source = _require(op, "from", kind)
                from_tokens = _parse_pointer(source)
                if kind == "move":
                    if tokens[: len(from_tokens)] == from_tokens and len(tokens) > len(from_tokens):
                        raise _PatchFailure("move operation does not apply: cannot move into a child")
                    _get(doc, from_tokens, kind, source)
                    doc, value = _remove(doc, from_tokens, source, kind)
                else:
                    value = deep_copy(_get(doc, from_tokens, kind, source))
                doc = _add(doc, tokens, value, pointer, kind)
            elif kind == "test":
                expected = _require(op, "value", kind)
                try:
                    actual = _get(doc, tokens, kind, pointer)
                except _PatchFailure:
                    if expected is None:
                        continue
                    raise _PatchFailure(f"testing value {pointer} failed: test failed") from None
                if not json_equal(actual, expected):
                    raise _PatchFailure(f"testing value {pointer} failed: test failed")
            else:
                raise _PatchFailure(f"Unexpected kind: {kind if kind is not None else 'unknown'}")
    except _PatchFailure as exc:
        raise _rejected(str(exc)) from exc
    except (IndexError, TypeError) as exc:
        raise _rejected(str(exc)) from exc
    if not isinstance(doc, dict):
        raise _rejected("the patched document is not an object")
    return doc


def _go_type(value: Any) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return "null"


# ---------------------------------------------------------------------------
# RFC 7386


def _merge_value(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return deep_copy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_value(result.get(key), value)
    return result


def merge_patch(obj: dict, patch: Any) -> dict:
    """Apply an RFC 7386 merge patch to a copy of ``obj``."""
    if not isinstance(patch, dict):
        raise errors.bad_request("Invalid JSON Patch")
    return deep_copy(_merge_value(obj, patch))


# ---------------------------------------------------------------------------
# Strategic merge patch

_DIRECTIVE = "$patch"
_RETAIN_KEYS = "$retainKeys"
_DELETE_PRIMITIVE_PREFIX = "$deleteFromPrimitiveList"
_SET_ORDER_PREFIX = "$setElementOrder"

_ERR_PRIMITIVE_LIST = "invalid patch format of primitive list"
_ERR_RETAIN_KEYS = "invalid patch format of retainKeys"
_ERR_SET_ORDER = "invalid patch format of setElementOrder list"
_ERR_LIST_OF_LISTS = "lists of lists are not supported"


def _directive_key(key: str, prefix: str, error: str) -> str:
    """The list name after ``prefix/`` in a parallel-list directive key."""
    head, sep, name = key.partition("/")
    if not sep or head != prefix:
        raise errors.bad_request(error)
    return name


def _kind_of(value: Any) -> str:
    """The JSON type of a value as the merge compares it (numbers are one type)."""
    if isinstance(value, dict):
        return "map"
    if isinstance(value, list):
        return "list"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if value is None:
        return "null"
    return "string"


def _element_kind(*lists: list) -> str | None:
    """The one element type of ``lists`` (``None`` when all are empty)."""
    kind: str | None = None
    for items in lists:
        for item in items:
            k = _kind_of(item)
            if kind is None:
                if k == "list":
                    raise StatusError(422, "Invalid", _ERR_LIST_OF_LISTS)
                kind = k
            elif k != kind:
                raise errors.bad_request(f"list element types are not identical: {_show(list(lists))}")
    return kind


def _remove_directives(value: Any) -> tuple[Any, bool]:
    """A patch value placed where the original has nothing (or a value of another
    type): maps carrying ``$patch`` are dropped, other directive keys removed."""
    if isinstance(value, dict):
        if _DIRECTIVE in value:
            return None, False
        out: dict[str, Any] = {}
        for k, v in value.items():
            if k == _RETAIN_KEYS or k.startswith((_SET_ORDER_PREFIX + "/", _DELETE_PRIMITIVE_PREFIX + "/")):
                continue
            cleaned, keep = _remove_directives(v)
            if keep:
                out[k] = cleaned
        return out, True
    if isinstance(value, list):
        res = []
        for v in value:
            cleaned, keep = _remove_directives(v)
            if keep:
                res.append(cleaned)
        return res, True
    return value, True


def _key_of(item: Any, key: str) -> Any:
    if not isinstance(item, dict) or key not in item:
        raise errors.bad_request(f"map: {_show(item)} does not contain declared merge key: {key}")
    return _hashable(item[key])


@dataclass
class _Smp:
    """Applies a strategic merge patch the way apimachinery's strategicpatch
    package does on the server (parallel lists merged, unmatched nulls
    ignored), with list strategies and merge keys from :data:`LIST_STRATEGIES`.

    Works on copies: ``original`` arguments are never modified."""

    group: str
    kind: str
    tables: dict[Path, ListStrategy] = field(default_factory=dict)

    def strategy(self, path: Path) -> ListStrategy:
        return self.tables.get(path, _ATOMIC)

    # -- maps -------------------------------------------------------------

    def merge_map(self, original: dict, patch: dict, path: Path) -> dict:
        if _DIRECTIVE in patch:
            directive = patch[_DIRECTIVE]
            if directive == "replace":
                rest = {k: v for k, v in patch.items() if k != _DIRECTIVE}
                return self._fresh(rest, path)
            if directive == "delete":
                return {}
            raise errors.bad_request(f"unknown patch type: {_go(directive)} in map: {_show(patch)}")
        result = dict(original)
        pending = dict(patch)
        if _RETAIN_KEYS in pending:
            self._retain_keys(result, pending)
        self._set_element_orders(result, pending, path)
        for key, value in pending.items():
            delete_list = False
            if key.startswith(_DELETE_PRIMITIVE_PREFIX):
                key = _directive_key(key, _DELETE_PRIMITIVE_PREFIX, _ERR_PRIMITIVE_LIST)
                delete_list = True
            if value is None:
                result.pop(key, None)
                continue
            if key not in result or _kind_of(result[key]) != _kind_of(value):
                if not delete_list:
                    cleaned, keep = _remove_directives(value)
                    if keep:
                        result[key] = deep_copy(cleaned)
                    else:
                        result.pop(key, None)
                continue
            child = path + (key,)
            current = result[key]
            if isinstance(value, dict):
                result[key] = self.merge_map(current, value, child)
            elif isinstance(value, list):
                result[key] = self.merge_list_field(current, value, child, delete_list)
            else:
                result[key] = deep_copy(value)
        return result

    @staticmethod
    def _retain_keys(result: dict, pending: dict) -> None:
        """``$retainKeys``: every field the patch sets must be listed; fields of
        the original that are not listed are cleared."""
        retain = pending.pop(_RETAIN_KEYS)
        if not isinstance(retain, list):
            raise errors.bad_request(_ERR_RETAIN_KEYS)
        keep = {_hashable(k) for k in retain}
        for key, value in pending.items():
            if value is None or key.startswith((_DELETE_PRIMITIVE_PREFIX, _SET_ORDER_PREFIX)):
                continue
            if key not in keep:
                raise errors.bad_request(_ERR_RETAIN_KEYS)
        for key in [k for k in result if k not in keep]:
            del result[key]

    def _set_element_orders(self, result: dict, pending: dict, path: Path) -> None:
        """``$setElementOrder/<list>``: merge that list now and give its items the
        order listed; items only the server has keep their relative places."""
        for directive in [k for k in pending if k.startswith(_SET_ORDER_PREFIX)]:
            order = pending.pop(directive)
            name = _directive_key(directive, _SET_ORDER_PREFIX, _ERR_SET_ORDER)
            if not isinstance(order, list):
                raise errors.bad_request(_ERR_SET_ORDER)
            child = path + (name,)
            strategy = self.strategy(child)
            key = strategy.smp_key if strategy.smp_merge else None
            found_original = name in result
            found_patch = name in pending
            original = result.get(name)
            patch_list = pending.get(name)
            if found_original and not isinstance(original, list):
                raise errors.bad_request(_ERR_SET_ORDER)
            if found_patch and not isinstance(patch_list, list):
                raise errors.bad_request(_ERR_SET_ORDER)
            original = original if found_original else []
            patch_list = patch_list if found_patch else []
            if found_patch:
                self._check_order(patch_list, order, key)
            if found_original and found_patch:
                merged = self.merge_list_field(original, patch_list, child, False)
            elif found_patch:
                merged = _remove_directives(patch_list)[0]
            elif found_original:
                merged = original
            else:
                continue
            pending.pop(name, None)
            kind = _element_kind(original, patch_list)
            if kind is None:
                result[name] = merged
                continue
            key = key if kind == "map" else None
            wanted = {self._ident(o, key) for o in order}
            patch_items = [m for m in merged if self._ident(m, key) in wanted]
            server_only = [m for m in merged if self._ident(m, key) not in wanted]
            result[name] = self._normalize(patch_items, server_only, order, original, key)

    def _check_order(self, patch_list: list, order: list, key: str | None) -> None:
        """The items of the patch list must appear in ``order`` in the same
        relative order (deletions and directive items aside)."""
        if not order or not patch_list:
            return
        items = patch_list
        if key is not None:
            if not all(isinstance(i, dict) for i in patch_list):
                raise errors.bad_request(_ERR_SET_ORDER)
            items = [i for i in patch_list if i.get(_DIRECTIVE) != "delete"]
        pi = oi = 0
        while pi < len(items) and oi < len(order):
            if isinstance(items[pi], dict) and _DIRECTIVE in items[pi]:
                pi += 1
                continue
            if self._ident(items[pi], key) == self._ident(order[oi], key):
                pi += 1
            oi += 1
        if pi < len(items):
            raise errors.bad_request(
                f"The order in patch list:\n{_show(patch_list)}\n doesn't match "
                f"{_SET_ORDER_PREFIX} list:\n{_show(order)}\n")

    # -- lists ------------------------------------------------------------

    def merge_list_field(self, original: list, patch: list, path: Path, delete_list: bool) -> list:
        """A list present on both sides: merged when the field's strategy says
        so, replaced by the patch otherwise."""
        strategy = self.strategy(path)
        if not strategy.smp_merge:
            return _remove_directives(patch)[0]
        return self.merge_list(original, patch, path, delete_list)

    def merge_list(self, original: list, patch: list, path: Path, delete_list: bool = False) -> list:
        if not original and not patch:
            return []
        kind = _element_kind(original, patch)
        strategy = self.strategy(path)
        if kind != "map":
            if delete_list:
                gone = {_hashable(d) for d in patch}
                return [deep_copy(x) for x in original if _hashable(x) not in gone]
            merged: list = []
            seen: set = set()
            for item in [*original, *patch]:
                h = _hashable(item)
                if h not in seen:
                    seen.add(h)
                    merged.append(deep_copy(item))
            wanted = {_hashable(p) for p in patch}
            patch_items = [m for m in merged if _hashable(m) in wanted]
            server_only = [m for m in merged if _hashable(m) not in wanted]
            return self._normalize(patch_items, server_only, patch, original, None)
        key = strategy.smp_key
        if key is None:
            raise errors.bad_request("cannot merge lists without merge key for type map")
        base = list(original)
        rest: list[dict] = []
        replace = False
        for item in patch:
            if _DIRECTIVE not in item:
                rest.append(item)
                continue
            directive = item[_DIRECTIVE]
            if directive == "delete":
                target = _key_of(item, key)
                base = [b for b in base if not (isinstance(b, dict) and key in b
                                                and _hashable(b[key]) == target)]
            elif directive == "replace":
                replace = True
            elif directive == "merge":
                raise errors.bad_request("merging lists cannot yet be specified in the patch")
            else:
                raise errors.bad_request(f"unknown patch type: {_go(directive)} in map: {_show(item)}")
        if replace:
            return [_remove_directives(i)[0] for i in rest]
        merged = [deep_copy(b) for b in base]
        for item in rest:
            ident = _key_of(item, key)
            for idx, existing in enumerate(merged):
                if isinstance(existing, dict) and key in existing and _hashable(existing[key]) == ident:
                    merged[idx] = self.merge_map(existing, item, path + ("*",))
                    break
            else:
                merged.append(self._fresh(item, path + ("*",)))
        wanted = {_key_of(p, key) for p in rest}
        patch_items = [m for m in merged if _key_of(m, key) in wanted]
        server_only = [m for m in merged if _key_of(m, key) not in wanted]
        return self._normalize(patch_items, server_only, rest, base, key)

    def _fresh(self, value: Any, path: Path) -> Any:
        """A patch map placed where nothing was: its directives still apply."""
        if isinstance(value, dict):
            return self.merge_map({}, value, path)
        return deep_copy(value)

    @staticmethod
    def _ident(item: Any, key: str | None) -> Any:
        if key is None:
            return _hashable(item)
        return _key_of(item, key)

    def _normalize(self, patch_items: list, server_only: list, patch_order: list,
                   server_order: list, key: str | None) -> list:
        """Patch items in the patch's order, server-only items in the server's,
        interleaved by where the server had them (apimachinery's
        normalizeElementOrder and mergeSortedSlice)."""
        def rank(order: list) -> dict[Any, int]:
            out: dict[Any, int] = {}
            for i, o in enumerate(order):
                out.setdefault(self._ident(o, key), i)
            return out

        p_rank = rank(patch_order)
        s_rank = rank(server_order)
        patch_sorted = self._sort(patch_items, p_rank, key)
        server_sorted = self._sort(server_only, s_rank, key)
        out: list = []
        i = j = 0
        while i < len(server_sorted) or j < len(patch_sorted):
            if i >= len(server_sorted):
                out.append(patch_sorted[j])
                j += 1
            elif j >= len(patch_sorted):
                out.append(server_sorted[i])
                i += 1
            else:
                li = s_rank.get(self._ident(server_sorted[i], key))
                ri = s_rank.get(self._ident(patch_sorted[j], key))
                if li is not None and ri is not None and li < ri:
                    out.append(server_sorted[i])
                    i += 1
                else:
                    out.append(patch_sorted[j])
                    j += 1
        return out

    def _sort(self, items: list, ranks: dict[Any, int], key: str | None) -> list:
        keep = [i for i in items if not (isinstance(i, dict) and i.get(_DIRECTIVE) == "delete")]
        deleted = [i for i in items if isinstance(i, dict) and i.get(_DIRECTIVE) == "delete"]
        known = [i for i in keep if self._ident(i, key) in ranks]
        unknown = [i for i in keep if self._ident(i, key) not in ranks]
        known.sort(key=lambda i: ranks[self._ident(i, key)])
        return known + unknown + deleted


def _hashable(value: Any) -> Any:
    if isinstance(value, (dict, list)):
        import orjson

        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    if isinstance(value, bool):
        return ("bool", value)
    return value


def _go(value: Any) -> str:
    return value if isinstance(value, str) else _show(value)


def _show(value: Any) -> str:
    import orjson

    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return repr(value)


def strategic_merge_patch(obj: dict, patch: dict, group: str, kind: str) -> dict:
    """Apply a strategic merge patch to a copy of ``obj`` (a built-in kind).

    Kinds without strategic-merge metadata (anything not served as a
    built-in) get 415, as upstream answers for custom resources.
    """
    if (group, kind) not in BUILTIN_KINDS:
        raise errors.unsupported_media_type(STRATEGIC_MERGE_PATCH, SMP_UNSUPPORTED_MEDIA_TYPES)
    if not isinstance(patch, dict):
        raise errors.bad_request("invalid JSON document")
    smp = _Smp(group, kind, LIST_STRATEGIES.get((group, kind), _META))
    return deep_copy(smp.merge_map(obj, patch, ()))
