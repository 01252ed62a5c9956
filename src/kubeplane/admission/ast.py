"""The checked syntax tree of a compiled CEL expression.

The CEL runtime hands a compiled expression out only as a serialized
``cel.expr.CheckedExpr`` (wrapped in ``google.protobuf.Any``). The admission
environment needs the tree for two things the runtime does not offer: the
cost of an evaluation before it runs (:mod:`kubeplane.admission.cost`) and
the composited variables an expression refers to. This module decodes the
few messages involved straight from the protobuf wire format.

Nodes are tuples, their first item the kind:

* ``("const", value)``
* ``("ident", name)``
* ``("select", operand, field, test_only)``
* ``("call", function, target_or_None, [args])``
* ``("list", [elements])``
* ``("map", [(key, value)])`` (a map or message literal; message keys are field names)
* ``("comp", iter_var, range, accu_var, init, condition, step, result)``

Every node also records its source offset in :attr:`Tree.positions`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Iterator

Node = tuple


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of one message: ints for varints and
    fixed values, bytes for length-delimited fields."""
    i, n = 0, len(buf)
    while i < n:
        key, i = _varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(buf, i)
        elif wt == 1:
            v = buf[i:i + 8]
            i += 8
        elif wt == 2:
            ln, i = _varint(buf, i)
            v = buf[i:i + ln]
            i += ln
        elif wt == 5:
            v = buf[i:i + 4]
            i += 4
        else:
            raise ValueError(f"unsupported wire type {wt}")
        yield num, wt, v


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


@dataclass
class Tree:
    root: Node
    #: expression id -> source offset
    positions: dict[int, int] = field(default_factory=dict)
    #: offsets of the starts of lines after the first
    line_offsets: list[int] = field(default_factory=list)
    #: node (by id(node)) -> expression id
    ids: dict[int, int] = field(default_factory=dict)

    def location(self, node: Node) -> tuple[int, int]:
        """(line, column), both from 1, of a node (1, 1 when unknown)."""
        offset = self.positions.get(self.ids.get(id(node), -1), 0)
        line, start = 1, 0
        for lo in self.line_offsets:
            if lo > offset:
                break
            line, start = line + 1, lo
        return line, offset - start + 1


def _constant(buf: bytes) -> Any:
    for num, wt, v in _fields(buf):
        if num == 1:
            return None
        if num == 2:
            return bool(v)
        if num == 3:
            return _signed(v)
        if num == 4:
            return v
        if num == 5:
            return struct.unpack("<d", v)[0]
        if num == 6:
            return v.decode("utf-8", "replace")
        if num == 7:
            return bytes(v)
    return None


class _Decoder:
    def __init__(self) -> None:
        self.ids: dict[int, int] = {}
        self.keep: list[Node] = []  # keeps ids of nodes stable while decoding

    def expr(self, buf: bytes) -> Node:
        eid = 0
        node: Node = ("const", None)
        for num, wt, v in _fields(buf):
            if num == 2:
                eid = v
            elif num == 3:
                node = ("const", _constant(v))
            elif num == 4:
                name = ""
                for n2, _, v2 in _fields(v):
                    if n2 == 1:
                        name = v2.decode()
                node = ("ident", name)
            elif num == 5:
                operand: Node = ("const", None)
                fname, test = "", False
                for n2, _, v2 in _fields(v):
                    if n2 == 1:
                        operand = self.expr(v2)
                    elif n2 == 2:
                        fname = v2.decode()
                    elif n2 == 3:
                        test = bool(v2)
                node = ("select", operand, fname, test)
            elif num == 6:
                target = None
                fn, args = "", []
                for n2, _, v2 in _fields(v):
                    if n2 == 1:
                        target = self.expr(v2)
                    elif n2 == 2:
                        fn = v2.decode()
                    elif n2 == 3:
                        args.append(self.expr(v2))
                node = ("call", fn, target, args)
            elif num == 7:
                node = ("list", [self.expr(v2) for n2, _, v2 in _fields(v) if n2 == 1])
            elif num == 8:
                entries = []
                for n2, _, v2 in _fields(v):
                    if n2 != 2:
                        continue
                    key: Any = None
                    value: Node = ("const", None)
                    for n3, _, v3 in _fields(v2):
                        if n3 == 2:
                            key = ("const", v3.decode())
                        elif n3 == 3:
                            key = self.expr(v3)
                        elif n3 == 4:
                            value = self.expr(v3)
                    entries.append((key, value))
                node = ("map", entries)
            elif num == 9:
                parts: dict[int, Any] = {}
                for n2, _, v2 in _fields(v):
                    parts[n2] = v2.decode() if n2 in (1, 3, 8) else self.expr(v2)
                nil: Node = ("const", None)
                node = ("comp", parts.get(1, ""), parts.get(2, nil), parts.get(3, ""), parts.get(4, nil),
                        parts.get(5, ("const", True)), parts.get(6, nil), parts.get(7, nil))
        self.ids[id(node)] = eid
        self.keep.append(node)
        return node


def decode(serialized: bytes) -> Tree:
    """The tree of a serialized checked expression (``Expression.serialize()``)."""
    checked = serialized
    for num, wt, v in _fields(serialized):
        if num == 1 and wt == 2 and v.endswith(b"CheckedExpr"):
            checked = b""
        elif num == 2 and wt == 2:
            checked = v
    dec = _Decoder()
    root: Node = ("const", None)
    positions: dict[int, int] = {}
    line_offsets: list[int] = []
    for num, wt, v in _fields(checked):
        if num == 4:
            root = dec.expr(v)
        elif num == 5:
            for n2, wt2, v2 in _fields(v):
                if n2 == 3:
                    if wt2 == 2:  # packed
                        i = 0
                        while i < len(v2):
                            lo, i = _varint(v2, i)
                            line_offsets.append(lo)
                    else:
                        line_offsets.append(v2)
                elif n2 == 4:
                    k = val = 0
                    for n3, _, v3 in _fields(v2):
                        if n3 == 1:
                            k = v3
                        elif n3 == 2:
                            val = v3
                    positions[k] = val
    tree = Tree(root, positions, line_offsets, dec.ids)
    tree._keep = dec.keep  # type: ignore[attr-defined]
    return tree


def walk(node: Node) -> Iterator[Node]:
    """Every node of a subtree, parents first."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        kind = n[0]
        if kind == "select":
            stack.append(n[1])
        elif kind == "call":
            if n[2] is not None:
                stack.append(n[2])
            stack.extend(n[3])
        elif kind == "list":
            stack.extend(n[1])
        elif kind == "map":
            for k, v in n[1]:
                if isinstance(k, tuple):
                    stack.append(k)
                stack.append(v)
        elif kind == "comp":
            stack.extend(n[2:3] + n[4:8])
