"""Protobuf bodies of CustomResourceDefinitions (apiextensions-apiserver's
messages): JSON values, and the schema-or-bool/array/strings unions written
as upstream's MarshalJSON writes them."""

from __future__ import annotations

from kubeplane.api import protobuf
from kubeplane.api.protobuf import encode_varint as _varint


def vi(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def ld(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def st(number: int, text: str) -> bytes:
    return ld(number, text.encode())


def entry(number: int, key: str, value: bytes) -> bytes:
    return ld(number, st(1, key) + ld(2, value))


def test_crd_with_a_schema_decodes_as_kubectl_sends_it_in_json() -> None:
    string = st(5, "string")
    color = string + ld(20, ld(1, b'"red"')) + ld(20, ld(1, b'"blue"')) + ld(8, ld(1, b'"red"'))
    tags = st(5, "array") + ld(24, ld(1, string))  # items: one schema
    labels = st(5, "object") + ld(30, ld(2, string))  # additionalProperties: a schema
    closed = st(5, "object") + ld(30, vi(1, 0))  # additionalProperties: false
    spec_schema = (st(5, "object") + entry(29, "color", color) + entry(29, "tags", tags)
                   + entry(29, "labels", labels) + entry(29, "closed", closed) + st(23, "color"))
    root = st(5, "object") + entry(29, "spec", spec_schema)
    version = st(1, "v1") + vi(2, 1) + vi(3, 1) + ld(4, ld(1, root))
    names = st(1, "widgets") + st(4, "Widget") + st(3, "wd")
    spec = st(1, "example.com") + ld(3, names) + st(4, "Namespaced") + ld(7, version)
    raw = ld(1, st(1, "widgets.example.com")) + ld(2, spec)
    body = protobuf.MAGIC + ld(1, st(1, "apiextensions.k8s.io/v1") + st(2, "CustomResourceDefinition")) + ld(2, raw)
    obj = protobuf.decode(body)
    assert obj["metadata"] == {"name": "widgets.example.com"}
    assert obj["spec"]["names"] == {"plural": "widgets", "kind": "Widget", "shortNames": ["wd"]}
    v = obj["spec"]["versions"][0]
    assert (v["name"], v["served"], v["storage"]) == ("v1", True, True)
    props = v["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert props["color"] == {"type": "string", "enum": ["red", "blue"], "default": "red"}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["labels"] == {"type": "object", "additionalProperties": {"type": "string"}}
    assert props["closed"] == {"type": "object", "additionalProperties": False}
    assert v["schema"]["openAPIV3Schema"]["properties"]["spec"]["required"] == ["color"]
