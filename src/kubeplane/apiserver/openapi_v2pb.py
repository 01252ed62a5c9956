"""The protobuf form of the OpenAPI v2 document (gnostic's ``openapi_v2.Document``).

client-go's ``OpenAPISchema()`` asks ``/openapi/v2`` for
``application/com.github.proto-openapi.spec.v2@v1.0+protobuf`` only, and
``kubectl explain --output=plaintext-openapiv2`` reads it. Upstream's
kube-openapi converts its Swagger JSON into gnostic's messages; this module
encodes the same JSON document (:func:`kubeplane.apiserver.openapi.v2_document`)
with the field numbers of gnostic-models' ``openapiv2/OpenAPIv2.proto``
(proto3: zero values are not written). Vendor extensions, defaults, enums and
examples are ``Any`` messages holding YAML text, as gnostic writes them.
"""

from __future__ import annotations

import struct
from typing import Any

import yaml

from kubeplane.api.protobuf import encode_varint as _varint

__all__ = ["encode_document"]


def _ld(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _str(number: int, value: Any) -> bytes:
    if not value:
        return b""
    return _ld(number, str(value).encode())


def _bool(number: int, value: Any) -> bytes:
    return _varint(number << 3) + b"\x01" if value else b""


def _int(number: int, value: Any) -> bytes:
    if not isinstance(value, int) or isinstance(value, bool) or value == 0:
        return b""
    return _varint(number << 3) + _varint(value)


def _double(number: int, value: Any) -> bytes:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value == 0:
        return b""
    return _varint(number << 3 | 1) + struct.pack("<d", float(value))


def _any(number: int, value: Any) -> bytes:
    text = yaml.safe_dump(value, default_flow_style=False, sort_keys=True)
    if text.endswith("...\n"):  # scalars: gnostic's YAML has no document end marker
        text = text[:-4]
    return _ld(number, _ld(2, text.encode()))


def _extensions(number: int, obj: dict[str, Any]) -> bytes:
    return b"".join(_ld(number, _str(1, k) + _any(2, v)) for k, v in obj.items() if k.startswith("x-"))


def _schema(s: dict[str, Any]) -> bytes:
    out = [_str(1, s.get("$ref")), _str(2, s.get("format")), _str(3, s.get("title")),
           _str(4, s.get("description"))]
    if "default" in s:
        out.append(_any(5, s["default"]))
    out += [_double(6, s.get("multipleOf")), _double(7, s.get("maximum")), _bool(8, s.get("exclusiveMaximum")),
            _double(9, s.get("minimum")), _bool(10, s.get("exclusiveMinimum")), _int(11, s.get("maxLength")),
            _int(12, s.get("minLength")), _str(13, s.get("pattern")), _int(14, s.get("maxItems")),
            _int(15, s.get("minItems")), _bool(16, s.get("uniqueItems")), _int(17, s.get("maxProperties")),
            _int(18, s.get("minProperties"))]
    out += [_str(19, r) for r in s.get("required") or ()]
    out += [_any(20, e) for e in s.get("enum") or ()]
    extra = s.get("additionalProperties")
    if isinstance(extra, dict):
        out.append(_ld(21, _ld(1, _schema(extra))))
    elif isinstance(extra, bool):
        out.append(_ld(21, _varint(2 << 3) + (b"\x01" if extra else b"\x00")))
    typ = s.get("type")
    if typ:
        out.append(_ld(22, b"".join(_str(1, t) for t in (typ if isinstance(typ, list) else [typ]))))
    items = s.get("items")
    if isinstance(items, dict):
        items = [items]
    if items:
        out.append(_ld(23, b"".join(_ld(1, _schema(i)) for i in items)))
    out += [_ld(24, _schema(a)) for a in s.get("allOf") or ()]
    props = s.get("properties")
    if props:
        out.append(_ld(25, b"".join(_ld(1, _str(1, k) + _ld(2, _schema(v))) for k, v in props.items())))
    out += [_str(26, s.get("discriminator")), _bool(27, s.get("readOnly"))]
    if "example" in s:
        out.append(_any(30, s["example"]))
    out.append(_extensions(31, s))
    return b"".join(out)


def _parameter(p: dict[str, Any]) -> bytes:
    where = p.get("in")
    if where == "body":
        body = (_str(1, p.get("description")) + _str(2, p.get("name")) + _str(3, where)
                + _bool(4, p.get("required")) + _ld(5, _schema(p.get("schema") or {})) + _extensions(6, p))
        param = _ld(1, body)
    else:
        common = _bool(1, p.get("required")) + _str(2, where) + _str(3, p.get("description")) + _str(4, p.get("name"))
        if where == "path":
            sub = common + _str(5, p.get("type")) + _str(6, p.get("format")) + _bool(19, p.get("uniqueItems"))
            sub += _extensions(22, p)
            non_body = _ld(4, sub)
        else:  # query (the only other kind the document has)
            sub = common + _str(6, p.get("type")) + _str(7, p.get("format")) + _bool(20, p.get("uniqueItems"))
            sub += _extensions(23, p)
            non_body = _ld(3, sub)
        param = _ld(2, non_body)
    return _ld(1, param)  # ParametersItem.parameter


def _operation(op: dict[str, Any]) -> bytes:
    out = [_str(1, t) for t in op.get("tags") or ()]
    out += [_str(2, op.get("summary")), _str(3, op.get("description")), _str(5, op.get("operationId"))]
    out += [_str(6, m) for m in op.get("produces") or ()]
    out += [_str(7, m) for m in op.get("consumes") or ()]
    out += [_ld(8, _parameter(p)) for p in op.get("parameters") or ()]
    responses = b""
    for code, r in (op.get("responses") or {}).items():
        response = _str(1, r.get("description"))
        if r.get("schema"):
            response += _ld(2, _ld(1, _schema(r["schema"])))
        responses += _ld(1, _str(1, code) + _ld(2, _ld(1, response)))
    out.append(_ld(9, responses))
    out += [_str(10, s) for s in op.get("schemes") or ()]
    out += [_bool(11, op.get("deprecated")), _extensions(13, op)]
    return b"".join(out)


_METHODS = {"get": 2, "put": 3, "post": 4, "delete": 5, "options": 6, "head": 7, "patch": 8}


def _path_item(item: dict[str, Any]) -> bytes:
    out = [_ld(_METHODS[k], _operation(v)) for k, v in item.items() if k in _METHODS]
    out += [_ld(9, _parameter(p)) for p in item.get("parameters") or ()]
    out.append(_extensions(10, item))
    return b"".join(out)


def encode_document(doc: dict[str, Any]) -> bytes:
    """gnostic ``openapi_v2.Document`` bytes of a Swagger 2.0 JSON document."""
    info = doc.get("info") or {}
    out = [_str(1, doc.get("swagger")), _ld(2, _str(1, info.get("title")) + _str(2, info.get("version")))]
    paths = b"".join(_ld(2, _str(1, name) + _ld(2, _path_item(item))) for name, item in doc["paths"].items())
    out.append(_ld(8, paths))
    out.append(_ld(9, b"".join(_ld(1, _str(1, name) + _ld(2, _schema(s)))
                               for name, s in doc["definitions"].items())))
    for requirement in doc.get("security") or ():
        entries = b"".join(_ld(1, _str(1, k) + _ld(2, b"".join(_str(1, v) for v in vs)))
                           for k, vs in requirement.items())
        out.append(_ld(12, entries))
    defs = b""
    for name, d in (doc.get("securityDefinitions") or {}).items():
        if d.get("type") == "apiKey":
            key = _str(1, "apiKey") + _str(2, d.get("name")) + _str(3, d.get("in")) + _str(4, d.get("description"))
            defs += _ld(1, _str(1, name) + _ld(2, _ld(2, key)))
    if defs:
        out.append(_ld(13, defs))
    out.append(_extensions(16, doc))
    return b"".join(out)
