"""Request body decoding and response encoding.

Every decoding failure is a 400/415 Status; nothing here can raise anything
else for any input.
"""

from __future__ import annotations

from typing import Any

import orjson
import yaml

from kubeplane.api import errors

try:  # the C loader is much faster; fall back when libyaml is missing
    _YamlLoader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover
    _YamlLoader = yaml.SafeLoader

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
    try:
        docs = list(yaml.load_all(body, Loader=_YamlLoader))
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
