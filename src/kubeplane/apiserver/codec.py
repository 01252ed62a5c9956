"""Request body decoding and response encoding.

Every decoding failure is a 400/415 Status; nothing here can raise anything
else for any input.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from kubeplane.api import errors

if TYPE_CHECKING:
    import yaml

#: what a YAML body may expand to through its aliases, in bytes of scalars
#: (and a few per node): twice the request body limit, as YAML is terser than
#: the JSON it becomes
MAX_EXPANDED_BYTES = 2 * 3 * 1024 * 1024

# sigs.k8s.io/yaml (go-yaml) rejects "excessive aliasing": past 1,000 decoded
# nodes and 100 of them from aliases, aliases may make up 99% of the nodes of
# a document up to 400,000 nodes, scaling down to 10% at 4,000,000 and beyond.
_ALIAS_RATIO_LOW = 400_000
_ALIAS_RATIO_HIGH = 4_000_000
_COUNT_CAP = 1 << 40  # counts stop growing here: far past every limit


def _allowed_alias_ratio(decoded: int) -> float:
    if decoded <= _ALIAS_RATIO_LOW:
        return 0.99
    if decoded >= _ALIAS_RATIO_HIGH:
        return 0.10
    return 0.99 - 0.89 * (decoded - _ALIAS_RATIO_LOW) / (_ALIAS_RATIO_HIGH - _ALIAS_RATIO_LOW)


def check_expansion(root: yaml.Node, max_bytes: int = MAX_EXPANDED_BYTES) -> None:
    """Rejects a composed YAML document whose aliases expand it too much,
    before anything is constructed from it.

    The composer shares an anchored node between its aliases, so a document
    is a graph; this walks each node once, remembering the expanded size of
    each subtree, so its cost is that of the text, not of the expansion."""
    import yaml

    sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded nodes, expanded bytes)
    started: set[int] = set()
    distinct = 0
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, finish = stack.pop()
        nid = id(node)
        value = node.value
        if finish:
            started.discard(nid)
            count, size = 1, 0
            if isinstance(node, yaml.MappingNode):
                for k, v in value:
                    kc, ks = sizes[id(k)]
                    vc, vs = sizes[id(v)]
                    count += kc + vc
                    size += ks + vs
            else:
                for child in value:
                    cc, cs = sizes[id(child)]
                    count += cc
                    size += cs
            sizes[nid] = (min(count, _COUNT_CAP), min(size + 2, _COUNT_CAP))
            continue
        if nid in sizes:
            continue
        if nid in started:
            raise errors.bad_request("error converting YAML to JSON: yaml: an anchor's value contains itself")
        distinct += 1
        if isinstance(node, yaml.ScalarNode):
            sizes[nid] = (1, len(value) + 3)
            continue
        started.add(nid)
        stack.append((node, True))
        if isinstance(node, yaml.MappingNode):
            for k, v in value:
                stack.append((v, False))
                stack.append((k, False))
        else:
            stack.extend((child, False) for child in value)
    decoded, size = sizes[id(root)]
    aliased = decoded - distinct
    if aliased > 100 and decoded > 1000 and aliased / decoded > _allowed_alias_ratio(decoded):
        raise errors.bad_request("error converting YAML to JSON: yaml: document contains excessive aliasing")
    if size > max_bytes:
        raise errors.too_large_body(max_bytes, "after expanding its YAML aliases")


_LOADERS: tuple[Any, Any] | None = None


def _loaders() -> tuple[Any, Any]:
    """PyYAML's safe loader (the C one unless libyaml is missing) and the same
    loader checking a document's alias expansion before constructing it;
    PyYAML is imported with the first YAML body, not at start."""
    global _LOADERS
    if _LOADERS is None:
        import yaml

        try:  # the C loader is much faster; fall back when libyaml is missing
            base: Any = yaml.CSafeLoader
        except AttributeError:  # pragma: no cover
            base = yaml.SafeLoader

        class _CheckedYamlLoader(base):  # type: ignore[misc, valid-type]
            def construct_document(self, node: Any) -> Any:
                check_expansion(node)
                return super().construct_document(node)

        _LOADERS = (base, _CheckedYamlLoader)
    return _LOADERS


def __getattr__(name: str) -> Any:
    if name == "_YamlLoader":
        return _loaders()[0]
    if name == "_CheckedYamlLoader":
        return _loaders()[1]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

JSON = "application/json"
YAML = "application/yaml"
PROTOBUF = "application/vnd.kubernetes.protobuf"

PATCH_TYPES = {
    "application/json-patch+json": "json",
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
    "application/apply-patch+cbor": "apply-cbor",
}

BODY_TYPES = (JSON, YAML, PROTOBUF)


def media_type(content_type: str | None) -> str:
    if not content_type:
        return JSON  # the Python client sends none on POST/PUT
    return content_type.split(";", 1)[0].strip().lower()


def decode_json(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise errors.bad_request(f"error decoding JSON: {exc}") from None


def decode_yaml(body: bytes) -> Any:
    # Only a document with an anchor ("&name") and an alias ("*name") can
    # expand: others are no larger than their text and skip the check.
    import yaml

    plain, checked = _loaders()
    loader = checked if b"&" in body and b"*" in body else plain
    try:
        docs = list(yaml.load_all(body, Loader=loader))
    except yaml.YAMLError as exc:
        raise errors.bad_request(f"error converting YAML to JSON: {_one_line(str(exc))}") from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise errors.bad_request(f"error converting YAML to JSON: {exc}") from None
    docs = [d for d in docs if d is not None]
    if len(docs) != 1:
        raise errors.bad_request(
            "error converting YAML to JSON: expected exactly one document, found %d" % len(docs)
        )
    # Round-trip through JSON so YAML-only values (dates, binary) become what
    # a JSON client would have sent, and non-string keys are rejected.
    try:
        return orjson.loads(orjson.dumps(docs[0], default=str))
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise errors.bad_request(f"error converting YAML to JSON: {exc}") from None


def _one_line(s: str) -> str:
    return " ".join(s.split())


def decode_body(body: bytes, content_type: str | None) -> Any:
    """Decodes a create/update body by Content-Type."""
    mt = media_type(content_type)
    if not body:
        raise errors.bad_request("the request body is empty")
    if mt == JSON or mt.endswith("+json") and mt not in PATCH_TYPES:
        return decode_json(body)
    if mt in (YAML, "application/x-yaml", "text/yaml"):
        return decode_yaml(body)
    if mt == PROTOBUF:
        from kubeplane.api import protobuf

        return protobuf.decode(body)
    raise errors.unsupported_media_type(mt, [JSON, YAML, PROTOBUF])


def fresh_tree(content_type: str | None) -> bool:
    """Whether :func:`decode_body` of this type builds a tree that shares no
    containers (JSON; YAML aliases may share them), so it may be kept as it is."""
    mt = media_type(content_type)
    return mt == JSON or mt.endswith("+json") and mt not in PATCH_TYPES


def decode_patch(body: bytes, content_type: str | None) -> tuple[str, Any]:
    mt = media_type(content_type)
    kind = PATCH_TYPES.get(mt)
    if kind is None or kind == "apply-cbor":
        raise errors.unsupported_media_type(mt, [k for k, v in PATCH_TYPES.items() if v != "apply-cbor"])
    if not body:
        raise errors.bad_request("the request body is empty")
    if kind == "apply":
        # Apply configurations are YAML (JSON is valid YAML); try JSON first for speed.
        try:
            return kind, orjson.loads(body)
        except orjson.JSONDecodeError:
            return kind, decode_yaml(body)
    return kind, decode_json(body)


def encode(obj: Any) -> bytes:
    return orjson.dumps(obj)
