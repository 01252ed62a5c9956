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

__all__ = [
    "ListStrategy",
    "LIST_STRATEGIES",
    "ATOMIC_MAPS",
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

# Maps apply replaces as a whole (``+structType=atomic``, e.g. LabelSelector).
# Strategic merge patch ignores this marker and merges them like any map.
ATOMIC_MAPS: dict[tuple[str, str], frozenset[Path]] = {
    ("apps", "Deployment"): frozenset({("spec", "selector")}),
    ("apps", "ReplicaSet"): frozenset({("spec", "selector")}),
    ("batch", "Job"): frozenset({("spec", "selector")}),
    ("policy", "PodDisruptionBudget"): frozenset({("spec", "selector")}),
}
for _gk, _prefix in ((("", "Pod"), ("spec",)), (("apps", "Deployment"), ("spec", "template", "spec")),
                     (("apps", "ReplicaSet"), ("spec", "template", "spec")),
                     (("batch", "Job"), ("spec", "template", "spec"))):
    ATOMIC_MAPS[_gk] = ATOMIC_MAPS.get(_gk, frozenset()) | {
        _prefix + ("topologySpreadConstraints", "*", "labelSelector"),
    }
del _gk, _prefix


def _builtin_kinds() -> frozenset[tuple[str, str]]:
    from kubeplane.api.resources import RESOURCES

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
_DELETE_PRIMITIVE = "$deleteFromPrimitiveList/"
_SET_ORDER = "$setElementOrder/"

_ERR_PRIMITIVE_LIST = "invalid patch format of primitive list"
_ERR_RETAIN_KEYS = "invalid patch format of retainKeys"
_ERR_SET_ORDER = "invalid patch format of setElementOrder list"
_ERR_RETAIN_MISMATCH = "patch content doesn't match retainKeys list"


@dataclass
class _Smp:
    group: str
    kind: str
    tables: dict[Path, ListStrategy] = field(default_factory=dict)

    def strategy(self, path: Path) -> ListStrategy:
        return self.tables.get(path, _ATOMIC)

    # -- maps -------------------------------------------------------------

    def merge_map(self, original: dict, patch: dict, path: Path) -> dict:
        directive = patch.get(_DIRECTIVE)
        if directive is not None:
            if directive == "replace":
                rest = {k: v for k, v in patch.items() if k != _DIRECTIVE}
                return self.merge_map({}, rest, path)
            if directive == "delete":
                return {}
            if directive != "merge":
                raise errors.bad_request(f"unknown patch type: {directive} in map: {_show(patch)}")
        result = dict(original)
        if _RETAIN_KEYS in patch:
            retain = patch[_RETAIN_KEYS]
            if not isinstance(retain, list):
                raise errors.bad_request(_ERR_RETAIN_KEYS)
            keep = set(k for k in retain if isinstance(k, str))
            for key, value in patch.items():
                if value is None or key.startswith(("$",)):
                    continue
                if key not in keep:
                    raise StatusError(422, "Invalid", _PATCH_REJECTED)
            result = {k: v for k, v in result.items() if k in keep}
        orders: list[tuple[str, list]] = []
        for key, value in patch.items():
            if key in (_DIRECTIVE, _RETAIN_KEYS):
                continue
            if key.startswith(_SET_ORDER):
                if not isinstance(value, list):
                    raise errors.bad_request(_ERR_SET_ORDER)
                orders.append((key[len(_SET_ORDER):], value))
                continue
            if key.startswith(_DELETE_PRIMITIVE):
                name = key[len(_DELETE_PRIMITIVE):]
                if not isinstance(value, list):
                    raise errors.bad_request(_ERR_PRIMITIVE_LIST)
                current = result.get(name)
                if isinstance(current, list):
                    result[name] = [x for x in current if not any(json_equal(x, d) for d in value)]
                continue
            if key.startswith("$"):
                continue
            child = path + (key,)
            if value is None:
                result.pop(key, None)
            elif isinstance(value, dict):
                base = result.get(key)
                result[key] = self.merge_map(base if isinstance(base, dict) else {}, value, child)
            elif isinstance(value, list):
                base = result.get(key)
                result[key] = self.merge_list(base if isinstance(base, list) else [], value, child)
            else:
                result[key] = deep_copy(value)
        for name, order in orders:
            current = result.get(name)
            if isinstance(current, list):
                result[name] = self.reorder(current, order, path + (name,))
        return result

    # -- lists ------------------------------------------------------------

    def merge_list(self, original: list, patch: list, path: Path) -> list:
        strategy = self.strategy(path)
        replace = [i for i in patch if isinstance(i, dict) and i.get(_DIRECTIVE) == "replace"]
        if replace:
            rest = [i for i in patch if not (isinstance(i, dict) and i.get(_DIRECTIVE) == "replace")]
            return [self._fresh(i, path + ("*",)) for i in rest]
        if not strategy.smp_merge:
            return [self._fresh(i, path + ("*",)) for i in patch]
        if strategy.smp_key is None:
            if any(isinstance(i, (dict, list)) for i in patch):
                if any(isinstance(i, list) for i in patch):
                    raise StatusError(422, "Invalid", _PATCH_REJECTED)
                return [self._fresh(i, path + ("*",)) for i in patch]
            merged = list(original)
            for item in patch:
                if not any(json_equal(item, x) for x in merged):
                    merged.append(deep_copy(item))
            return merged
        key = strategy.smp_key
        merged = [deep_copy(i) for i in original]
        for item in patch:
            if not isinstance(item, dict):
                if isinstance(item, list):
                    raise StatusError(422, "Invalid", _PATCH_REJECTED)
                raise errors.bad_request(_ERR_PRIMITIVE_LIST)
            if key not in item:
                raise errors.bad_request(
                    f"map: {_show(item)} does not contain declared merge key: {key}")
            directive = item.get(_DIRECTIVE)
            if directive == "delete":
                merged = [m for m in merged
                          if not (isinstance(m, dict) and json_equal(m.get(key), item[key]))]
                continue
            if directive not in (None, "merge"):
                raise errors.bad_request(f"unknown patch type: {directive} in map: {_show(item)}")
            body = {k: v for k, v in item.items() if k != _DIRECTIVE}
            for idx, existing in enumerate(merged):
                if isinstance(existing, dict) and json_equal(existing.get(key), item[key]):
                    merged[idx] = self.merge_map(existing, body, path + ("*",))
                    break
            else:
                merged.append(self.merge_map({}, body, path + ("*",)))
        return merged

    def _fresh(self, value: Any, path: Path) -> Any:
        """A patch value placed where nothing was: directives still apply."""
        if isinstance(value, dict):
            return self.merge_map({}, value, path)
        return deep_copy(value)

    def reorder(self, items: list, order: list, path: Path) -> list:
        """Apply ``$setElementOrder``: listed items take the given order in the
        slots they occupy; items the patch does not mention keep their slots."""
        strategy = self.strategy(path)
        key = strategy.smp_key

        def ident(item: Any) -> Any:
            if key is not None:
                return _hashable(item.get(key)) if isinstance(item, dict) else None
            return _hashable(item)

        wanted: list[Any] = []
        for entry in order:
            if key is not None:
                if not isinstance(entry, dict) or key not in entry:
                    raise errors.bad_request(_ERR_SET_ORDER)
                wanted.append(_hashable(entry[key]))
            else:
                wanted.append(_hashable(entry))
        rank = {w: i for i, w in enumerate(wanted)}
        ordered = sorted((i for i in items if ident(i) in rank), key=lambda i: rank[ident(i)])
        it = iter(ordered)
        return [next(it) if ident(i) in rank else i for i in items]


def _hashable(value: Any) -> Any:
    if isinstance(value, (dict, list)):
        import orjson

        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    if isinstance(value, bool):
        return ("bool", value)
    return value


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
