"""Decode Kubernetes protobuf request bodies into JSON-style dicts.

client-go sends ``application/vnd.kubernetes.protobuf`` whenever its content
type is set to protobuf, as kubectl's typed clients do: the imperative
generators (``kubectl create namespace|configmap|deployment|...``), the
DeleteOptions of ``kubectl drain``, ``kubectl debug --copy-to`` and helm, and
any controller or scheduler built on client-go. None of them fall back to
JSON, so the API server reads every built-in kind (and the meta/v1 option
kinds) in protobuf.

Wire format: the 4-byte magic ``k8s\\x00`` followed by a ``runtime.Unknown``
message (``typeMeta`` = 1 {apiVersion = 1, kind = 2}, ``raw`` = 2,
``contentEncoding`` = 3, ``contentType`` = 4). ``raw`` is the object encoded
with the field numbers of the public ``generated.proto`` files.

The decoder is generic (varint, 64-bit, length-delimited, 32-bit wire types)
and schema driven: the field table of each message comes from
``protobuf_schema.json``, which :mod:`kubeplane.api.gen_protobuf` derives
from upstream's ``generated.proto`` files and Go struct tags. The output
follows the JSON serialization of the same object: JSON names, zero values
of ``omitempty`` non-pointer fields dropped, inline structs merged, bytes as
base64, ``Time`` as RFC 3339, ``Quantity`` as a string, ``IntOrString`` as an
int or a string, ``Duration`` as Go prints it. Unknown field numbers are
skipped, as protobuf readers do.
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
import struct
import threading
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources as importlib_resources
from typing import Any, Union

from kubeplane.api import errors
from kubeplane.api.gofmt import go_duration_ns

MAGIC = b"k8s\x00"
MEDIA_TYPE = "application/vnd.kubernetes.protobuf"

# Wire types.
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5

# Value types used in tables.
STRING, BYTES, INT32, INT64, UINT32, BOOL, DOUBLE = "string", "bytes", "int32", "int64", "uint32", "bool", "double"
TIME, MICROTIME, QUANTITY, INTORSTR, RAWJSON = "time", "microtime", "quantity", "intorstr", "rawjson"
MESSAGE, INLINE, MAP = "message", "inline", "map"

UINT64, SINT32, SINT64, FLOAT = "uint64", "sint32", "sint64", "float"
FIXED32, FIXED64, SFIXED32, SFIXED64 = "fixed32", "fixed64", "sfixed32", "sfixed64"
DURATION, RAWEXT = "duration", "rawext"
#: apiextensions' JSONSchemaPropsOrBool / OrArray / OrStringArray
SCHEMA_OR_BOOL, SCHEMA_OR_ARRAY, SCHEMA_OR_STRINGS = "schemaorbool", "schemaorarray", "schemaorstrings"

_SCALAR_WIRE = {STRING: _LEN, BYTES: _LEN, INT32: _VARINT, INT64: _VARINT, UINT32: _VARINT,
                UINT64: _VARINT, SINT32: _VARINT, SINT64: _VARINT, BOOL: _VARINT, DOUBLE: _I64,
                FLOAT: _I32, FIXED32: _I32, FIXED64: _I64, SFIXED32: _I32, SFIXED64: _I64}
_PACKABLE = {k for k, w in _SCALAR_WIRE.items() if w != _LEN}


@dataclass(frozen=True)
class Field:
    """How one protobuf field maps to a JSON key.

    ``keep`` keeps zero values: set it for pointer fields (only encoded when
    set) and for fields whose JSON tag has no ``omitempty``.
    """

    name: str
    type: str
    table: "Table | None" = None  # MESSAGE / INLINE, or the map value table
    repeated: bool = False
    keep: bool = False
    value: str = STRING  # map value type


Table = dict[int, Field]
_Value = Union[int, bytes]


# --------------------------------------------------------------------------------------------
# Table helpers, for tables composed by hand and given to register()


def s(name: str, keep: bool = False) -> Field:
    return Field(name, STRING, keep=keep)


def i32(name: str, keep: bool = False) -> Field:
    return Field(name, INT32, keep=keep)


def i64(name: str, keep: bool = False) -> Field:
    return Field(name, INT64, keep=keep)


def b(name: str, keep: bool = False) -> Field:
    return Field(name, BOOL, keep=keep)


def t(name: str) -> Field:
    return Field(name, TIME)


def q(name: str) -> Field:
    return Field(name, QUANTITY)


def ios(name: str) -> Field:
    return Field(name, INTORSTR)


def m(name: str, table: Table) -> Field:
    return Field(name, MESSAGE, table)


def inline(table: Table) -> Field:
    return Field("", INLINE, table)


def rs(name: str) -> Field:
    return Field(name, STRING, repeated=True)


def ri64(name: str) -> Field:
    return Field(name, INT64, repeated=True)


def ri32(name: str) -> Field:
    return Field(name, INT32, repeated=True)


def rm(name: str, table: Table) -> Field:
    return Field(name, MESSAGE, table, repeated=True)


def mp(name: str, value: str = STRING, table: Table | None = None) -> Field:
    return Field(name, MAP, table, value=value)


# --------------------------------------------------------------------------------------------
# Schema: field tables generated from upstream's generated.proto and Go struct tags

_REPEATED, _KEEP, _INLINE = 1, 2, 4
_schema_lock = threading.Lock()


@lru_cache(maxsize=1)
def _schema() -> tuple[dict[str, str], dict[str, Table]]:
    """(kind key -> message name, message name -> table), built once from package data.

    Every table is created empty first and filled after, so message fields can
    point at any table, whatever the order (and cycles cost nothing).
    """
    with _schema_lock:
        raw = importlib_resources.files(__package__).joinpath("protobuf_schema.json").read_bytes()
        data = json.loads(raw)
        tables: dict[str, Table] = {name: {} for name in data["messages"]}
        for name, rows in data["messages"].items():
            table = tables[name]
            for number, json_name, typ, ref, flags in rows:
                map_value = None
                if typ.startswith("map:"):
                    map_value = typ[4:]
                sub = tables.get(ref) if ref else None
                keep = bool(flags & _KEEP)
                if flags & _INLINE:
                    table[number] = Field("", INLINE, sub)
                elif map_value is not None:
                    table[number] = Field(json_name, MAP, sub, value=map_value)
                else:
                    table[number] = Field(json_name, typ, sub, repeated=bool(flags & _REPEATED), keep=keep)
        return data["kinds"], tables


def message_table(name: str) -> Table:
    """The field table of one upstream message, e.g. ``k8s.io.api.core.v1.PodSpec``."""
    table = _schema()[1].get(name)
    if table is None:
        raise KeyError(name)
    return table


def kind_table(api_version: str, kind: str) -> Table | None:
    """The table a ``(apiVersion, kind)`` body is decoded with, or None."""
    explicit = KINDS.get((api_version, kind))
    if explicit is not None:
        return explicit
    kinds, tables = _schema()
    name = kinds.get(f"{api_version}/{kind}") or kinds.get(f"*/{kind}")
    return tables.get(name) if name else None


#: tables registered at run time, by (apiVersion, kind); they take precedence
KINDS: dict[tuple[str, str], Table] = {}


def __getattr__(attr: str) -> Any:
    # OBJECT_META and friends, for code that composes its own tables.
    names = {"OBJECT_META": "k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta",
             "LABEL_SELECTOR": "k8s.io.apimachinery.pkg.apis.meta.v1.LabelSelector",
             "POD_TEMPLATE_SPEC": "k8s.io.api.core.v1.PodTemplateSpec"}
    if attr in names:
        return message_table(names[attr])
    raise AttributeError(attr)


# --------------------------------------------------------------------------------------------
# Wire reader


def encode_varint(value: int) -> bytes:
    """``value`` as a protobuf varint (negative numbers as their 64-bit two's complement)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """Read a base-128 varint at ``pos``; return (value, next position)."""
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise errors.bad_request("protobuf: truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise errors.bad_request("protobuf: varint overflows 64 bits")


def iter_fields(buf: bytes) -> list[tuple[int, int, _Value]]:
    """Split a message into (field number, wire type, raw value) triples.

    Varints come back as unsigned ints, fixed-width values as raw bytes and
    length-delimited values as bytes.
    """
    out: list[tuple[int, int, _Value]] = []
    pos = 0
    end = len(buf)
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise errors.bad_request("protobuf: invalid field number 0")
        value: _Value
        if wire == _VARINT:
            value, pos = _varint(buf, pos)
        elif wire == _I64:
            if pos + 8 > end:
                raise errors.bad_request(f"protobuf: truncated 64-bit value in field {number}")
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == _LEN:
            length, pos = _varint(buf, pos)
            if pos + length > end:
                raise errors.bad_request(f"protobuf: truncated length-delimited field {number}")
            value, pos = buf[pos:pos + length], pos + length
        elif wire == _I32:
            if pos + 4 > end:
                raise errors.bad_request(f"protobuf: truncated 32-bit value in field {number}")
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise errors.bad_request(f"protobuf: unsupported wire type {wire} in field {number}")
        out.append((number, wire, value))
    return out


def _signed(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def _text(raw: bytes, path: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise errors.bad_request(f"protobuf: field {path} is not valid UTF-8") from None


def _expect(wire: int, want: int, path: str) -> None:
    if wire != want:
        raise errors.bad_request(f"protobuf: field {path} has wire type {wire}, expected {want}")


def _scalar(kind: str, wire: int, raw: _Value, path: str) -> Any:
    """Convert one non-packed scalar of ``kind``."""
    _expect(wire, _SCALAR_WIRE[kind], path)
    if kind == STRING:
        assert isinstance(raw, bytes)
        return _text(raw, path)
    if kind == BYTES:
        assert isinstance(raw, bytes)
        return base64.b64encode(raw).decode("ascii")
    if isinstance(raw, bytes):  # fixed-width kinds
        fmt = {DOUBLE: "<d", FLOAT: "<f", FIXED32: "<I", FIXED64: "<Q", SFIXED32: "<i", SFIXED64: "<q"}[kind]
        return struct.unpack(fmt, raw)[0]
    if kind == INT32:
        return _signed(raw, 32)
    if kind == INT64:
        return _signed(raw, 64)
    if kind == UINT32:
        return raw & 0xFFFFFFFF
    if kind == UINT64:
        return raw & 0xFFFFFFFFFFFFFFFF
    if kind in (SINT32, SINT64):
        return (raw >> 1) ^ -(raw & 1)
    return raw != 0  # BOOL


def _packed(kind: str, raw: bytes, path: str) -> list[Any]:
    """Decode a packed repeated numeric field."""
    values: list[Any] = []
    pos = 0
    wire = _SCALAR_WIRE[kind]
    width = 8 if wire == _I64 else 4
    while pos < len(raw):
        if wire == _VARINT:
            value, pos = _varint(raw, pos)
            values.append(_scalar(kind, _VARINT, value, path))
        else:
            if pos + width > len(raw):
                raise errors.bad_request(f"protobuf: truncated packed field {path}")
            values.append(_scalar(kind, wire, raw[pos:pos + width], path))
            pos += width
    return values


def _format_time(seconds: int, nanos: int, micro: bool) -> str:
    moment = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc) + _dt.timedelta(seconds=seconds)
    if micro:
        return moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{nanos // 1000:06d}Z"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _time(raw: bytes, path: str, micro: bool) -> str | None:
    """meta/v1 Time / MicroTime (seconds = 1, nanos = 2); None when zero."""
    seconds = nanos = 0
    for number, wire, value in iter_fields(raw):
        if number in (1, 2):
            _expect(wire, _VARINT, path)
            assert isinstance(value, int)
            if number == 1:
                seconds = _signed(value, 64)
            else:
                nanos = _signed(value, 32)
    if seconds == 0 and nanos == 0:
        return None
    try:
        return _format_time(seconds, nanos, micro)
    except (OverflowError, ValueError):
        raise errors.bad_request(f"protobuf: field {path} holds an out-of-range time") from None


def _quantity(raw: bytes, path: str) -> str:
    """resource.Quantity: a message whose field 1 is the string form."""
    text = ""
    for number, wire, value in iter_fields(raw):
        if number == 1:
            _expect(wire, _LEN, path)
            assert isinstance(value, bytes)
            text = _text(value, path)
    return text


def _int_or_string(raw: bytes, path: str) -> int | str:
    """intstr.IntOrString: type = 1 (0 int, 1 string), intVal = 2, strVal = 3."""
    kind, int_val, str_val = 0, 0, ""
    for number, wire, value in iter_fields(raw):
        if number in (1, 2):
            _expect(wire, _VARINT, path)
            assert isinstance(value, int)
            if number == 1:
                kind = _signed(value, 64)
            else:
                int_val = _signed(value, 32)
        elif number == 3:
            _expect(wire, _LEN, path)
            assert isinstance(value, bytes)
            str_val = _text(value, path)
    return str_val if kind == 1 else int_val


def _raw_json(raw: bytes, path: str) -> Any:
    """FieldsV1-style message whose field 1 holds raw JSON."""
    for number, wire, value in iter_fields(raw):
        if number == 1:
            _expect(wire, _LEN, path)
            assert isinstance(value, bytes)
            try:
                return json.loads(value) if value else {}
            except ValueError:
                raise errors.bad_request(f"protobuf: field {path} does not hold valid JSON") from None
    return {}


def _duration(raw: bytes, path: str) -> str:
    """meta/v1 Duration (field 1: int64 nanoseconds), printed as Go's time.Duration does."""
    nanos = 0
    for number, wire, value in iter_fields(raw):
        if number == 1:
            _expect(wire, _VARINT, path)
            assert isinstance(value, int)
            nanos = _signed(value, 64)
    return format_go_duration(nanos)


format_go_duration = go_duration_ns


def _raw_extension(raw: bytes, path: str) -> Any:
    """runtime.RawExtension (field 1: the embedded object's bytes, JSON or protobuf)."""
    for number, wire, value in iter_fields(raw):
        if number == 1:
            _expect(wire, _LEN, path)
            assert isinstance(value, bytes)
            if value.startswith(MAGIC):
                return decode(value)
            try:
                return json.loads(value) if value else None
            except ValueError:
                raise errors.bad_request(f"protobuf: field {path} does not hold a JSON or protobuf object") from None
    return None


def _schema_or(kind: str, table: Table, raw: bytes, path: str) -> Any:
    """A JSONSchemaProps-or-something as upstream's MarshalJSON writes it: the
    schema when set, else the bool (OrBool), the schemas (OrArray) or the
    strings (OrStringArray)."""
    schema_number = 2 if kind == SCHEMA_OR_BOOL else 1
    schema: Any = None
    allows = False
    items: list[Any] = []
    for number, wire, value in iter_fields(raw):
        f = table.get(number)
        if f is None:
            continue
        if number == schema_number:
            _expect(wire, _LEN, path)
            assert isinstance(value, bytes) and f.table is not None
            schema = decode_message(value, f.table, path)
        elif kind == SCHEMA_OR_BOOL and number == 1:
            allows = bool(_scalar(BOOL, wire, value, path))
        elif number == 2 and kind == SCHEMA_OR_ARRAY:
            _expect(wire, _LEN, path)
            assert isinstance(value, bytes) and f.table is not None
            items.append(decode_message(value, f.table, f"{path}[{len(items)}]"))
        elif number == 2:
            items.append(_scalar(STRING, wire, value, f"{path}[{len(items)}]"))
    if kind == SCHEMA_OR_BOOL:
        return schema if schema is not None else allows
    if kind == SCHEMA_OR_ARRAY:
        return items if items else schema
    return items if items else (schema if schema is not None else [])


def _single(kind: str, table: Table | None, wire: int, raw: _Value, path: str) -> Any:
    """Decode one value (a scalar, a well-known type or a nested message)."""
    if kind in _SCALAR_WIRE:
        return _scalar(kind, wire, raw, path)
    _expect(wire, _LEN, path)
    assert isinstance(raw, bytes)
    if kind == TIME or kind == MICROTIME:
        return _time(raw, path, micro=kind == MICROTIME)
    if kind == QUANTITY:
        return _quantity(raw, path)
    if kind == INTORSTR:
        return _int_or_string(raw, path)
    if kind == RAWJSON:
        return _raw_json(raw, path)
    if kind == DURATION:
        return _duration(raw, path)
    if kind == RAWEXT:
        return _raw_extension(raw, path)
    if kind in (SCHEMA_OR_BOOL, SCHEMA_OR_ARRAY, SCHEMA_OR_STRINGS):
        assert table is not None
        return _schema_or(kind, table, raw, path)
    assert table is not None, f"no table for message field {path}"
    return decode_message(raw, table, path)


def _zero(kind: str) -> Any:
    return {STRING: "", BYTES: "", BOOL: False, DOUBLE: 0.0}.get(kind, 0)


# Value of a map entry whose value field was not encoded (it is the zero value).
_MAP_DEFAULTS: dict[str, Any] = {STRING: "", BYTES: "", BOOL: False, DOUBLE: 0.0, QUANTITY: ""}


def _map_entry(f: Field, raw: bytes, path: str) -> tuple[str, Any]:
    key = ""
    value: Any = None
    for number, wire, item in iter_fields(raw):
        if number == 1:
            key = _scalar(STRING, wire, item, f"{path}.key")
        elif number == 2:
            value = _single(f.value, f.table, wire, item, f"{path}[{key}]")
    if value is None and f.value not in (TIME, MICROTIME):
        value = {} if f.value == MESSAGE else _MAP_DEFAULTS.get(f.value, 0)
    return key, value


def _is_zero(kind: str, value: Any) -> bool:
    return kind in _SCALAR_WIRE and value == _zero(kind)


def decode_message(buf: bytes, table: Table, path: str = "") -> dict[str, Any]:
    """Decode ``buf`` with ``table`` into a JSON-style dict."""
    out: dict[str, Any] = {}
    for number, wire, raw in iter_fields(buf):
        f = table.get(number)
        if f is None:
            continue
        here = f"{path}.{f.name}" if path and f.name else (f.name or path)
        if f.type == INLINE:
            _expect(wire, _LEN, here)
            assert isinstance(raw, bytes) and f.table is not None
            out.update(decode_message(raw, f.table, path))
        elif f.type == MAP:
            _expect(wire, _LEN, here)
            assert isinstance(raw, bytes)
            key, value = _map_entry(f, raw, here)
            entries = out.setdefault(f.name, {})
            if value is not None:
                entries[key] = value
        elif f.repeated:
            items = out.setdefault(f.name, [])
            if f.type in _PACKABLE and wire == _LEN:
                assert isinstance(raw, bytes)
                items.extend(_packed(f.type, raw, here))
            else:
                items.append(_single(f.type, f.table, wire, raw, f"{here}[{len(items)}]"))
        else:
            value = _single(f.type, f.table, wire, raw, here)
            if value is None or (not f.keep and _is_zero(f.type, value)):
                out.pop(f.name, None)
            else:
                out[f.name] = value
    return out


# --------------------------------------------------------------------------------------------
# Public API


def is_protobuf(content_type: str | None) -> bool:
    """True when a Content-Type names the Kubernetes protobuf encoding."""
    if not content_type:
        return False
    return content_type.split(";", 1)[0].strip().lower() == MEDIA_TYPE


def _unsupported_kind(api_version: str, kind: str) -> errors.StatusError:
    what = f"{kind} ({api_version})" if api_version else kind or "an object without a kind"
    return errors.StatusError(
        415, "UnsupportedMediaType",
        f"the body of the request was in an unknown format - protobuf is not supported for {what}; "
        "send application/json instead (for example: kubectl create ... --dry-run=client -o yaml "
        "| kubectl apply -f -)",
    )


def decode(body: bytes) -> dict[str, Any]:
    """Decode a ``k8s\\x00``-prefixed protobuf body into a JSON-style object dict.

    Raises a 400 BadRequest ``StatusError`` for malformed bodies and a 415
    UnsupportedMediaType ``StatusError`` for kinds without a field table.
    """
    if not body.startswith(MAGIC):
        raise errors.bad_request(
            "protobuf: body does not start with the Kubernetes protobuf magic prefix 'k8s\\x00'"
        )
    api_version = kind = content_encoding = ""
    raw = b""
    for number, wire, value in iter_fields(body[len(MAGIC):]):
        if number == 1:
            _expect(wire, _LEN, "typeMeta")
            assert isinstance(value, bytes)
            for sub, sub_wire, sub_value in iter_fields(value):
                if sub == 1:
                    api_version = _scalar(STRING, sub_wire, sub_value, "typeMeta.apiVersion")
                elif sub == 2:
                    kind = _scalar(STRING, sub_wire, sub_value, "typeMeta.kind")
        elif number == 2:
            _expect(wire, _LEN, "raw")
            assert isinstance(value, bytes)
            raw = value
        elif number == 3:
            content_encoding = _scalar(STRING, wire, value, "contentEncoding")
    if content_encoding:
        raise errors.bad_request(f"protobuf: unsupported content encoding {content_encoding!r}")
    table = kind_table(api_version, kind)
    if table is None:
        raise _unsupported_kind(api_version, kind)
    obj: dict[str, Any] = {"apiVersion": api_version, "kind": kind}
    try:
        obj.update(decode_message(raw, table))
    except RecursionError:
        raise errors.bad_request("protobuf: the object is nested too deeply") from None
    return obj


def register(api_version: str, kind: str, table: Table) -> None:
    """Add or replace the field table for ``(api_version, kind)``."""
    KINDS[(api_version, kind)] = table


__all__ = [
    "KINDS", "MAGIC", "MEDIA_TYPE", "Field", "Table", "decode", "decode_message", "format_go_duration",
    "is_protobuf", "iter_fields", "kind_table", "message_table", "register",
]
