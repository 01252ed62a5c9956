"""nftables transactions: built as data, written as ``nft -f -`` text, run atomically.

A :class:`Transaction` is a list of operations on the objects of one table
(chains, rules, sets, maps, elements), in the spirit of knftables: the
proxier adds operations to it, :meth:`Transaction.text` renders them in
nft's own syntax, and :class:`NFTables` hands that text to one ``nft -f -``
(one netlink batch: all of it applies or nothing does).

:class:`NFTables` runs ``nft`` behind a configurable command prefix (for
instance ``ip netns exec NAME``) so the same code can program a network
namespace other than its own. :class:`FakeNFTables` applies transactions to
an in-memory table with the kernel's rules for failures (a missing object,
an element added again with another value, a chain deleted while in use),
for tests of what the proxier writes.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

#: nft's chain priorities by name (we write numbers: every nft version reads them)
FILTER_PRIORITY = 0
DNAT_PRIORITY = -100
SNAT_PRIORITY = 100


class NFTError(Exception):
    """``nft`` failed; ``not_found`` when it failed because an object does not exist."""

    def __init__(self, message: str, *, not_found: bool = False) -> None:
        super().__init__(message)
        self.not_found = not_found


def _quote(text: str) -> str:
    return '"' + text.replace('"', "'") + '"'


@dataclass(frozen=True, slots=True)
class Table:
    comment: str | None = None


@dataclass(frozen=True, slots=True)
class Chain:
    name: str
    type: str | None = None  # "filter", "nat" for base chains
    hook: str | None = None
    priority: int | None = None
    comment: str | None = None


@dataclass(frozen=True, slots=True)
class Rule:
    chain: str
    rule: str
    comment: str | None = None


@dataclass(frozen=True, slots=True)
class Set:
    name: str
    type: str = ""
    flags: tuple[str, ...] = ()
    timeout: int | None = None  # seconds
    comment: str | None = None


@dataclass(frozen=True, slots=True)
class Map:
    name: str
    type: str = ""  # "KEY : VALUE"
    comment: str | None = None


@dataclass(frozen=True, slots=True)
class Element:
    """An element of set ``container`` (``value`` None) or of map ``container``."""

    container: str
    key: tuple[str, ...]
    value: tuple[str, ...] | None = None
    comment: str | None = None
    is_map: bool = False


NFTObject = Table | Chain | Rule | Set | Map | Element


def concat(*parts: Any) -> str:
    """Join rule words (nested lists are flattened, empty parts dropped), as knftables.Concat."""
    out: list[str] = []

    def add(p: Any) -> None:
        if p is None:
            return
        if isinstance(p, (list, tuple)):
            for q in p:
                add(q)
            return
        s = str(p)
        if s:
            out.append(s)

    for p in parts:
        add(p)
    return " ".join(out)


class Transaction:
    """Operations ("add", "flush", "delete") on one table's objects, in order."""

    def __init__(self, family: str, table: str) -> None:
        self.family = family
        self.table = table
        self.ops: list[tuple[str, NFTObject]] = []

    def __len__(self) -> int:
        return len(self.ops)

    def add(self, obj: NFTObject) -> None:
        self.ops.append(("add", obj))

    def flush(self, obj: NFTObject) -> None:
        self.ops.append(("flush", obj))

    def delete(self, obj: NFTObject) -> None:
        self.ops.append(("delete", obj))

    # -- text

    def text(self) -> str:
        return "".join(self._line(verb, obj) + "\n" for verb, obj in self.ops)

    def _line(self, verb: str, obj: NFTObject) -> str:
        where = f"{self.family} {self.table}"
        if isinstance(obj, Table):
            if verb == "add" and obj.comment:
                return f"add table {where} {{ comment {_quote(obj.comment)} ; }}"
            return f"{verb} table {where}"
        if isinstance(obj, Chain):
            line = f"{verb} chain {where} {obj.name}"
            if verb == "add":
                props = []
                if obj.type:
                    props.append(f"type {obj.type} hook {obj.hook} priority {obj.priority} ;")
                if obj.comment:
                    props.append(f"comment {_quote(obj.comment)} ;")
                if props:
                    line += " { " + " ".join(props) + " }"
            return line
        if isinstance(obj, Rule):
            if verb != "add":
                raise ValueError(f"cannot {verb} a rule by its text")
            line = f"add rule {where} {obj.chain} {obj.rule}"
            if obj.comment:
                line += f" comment {_quote(obj.comment)}"
            return line
        if isinstance(obj, (Set, Map)):
            kind = "set" if isinstance(obj, Set) else "map"
            line = f"{verb} {kind} {where} {obj.name}"
            if verb == "add":
                props = [f"type {obj.type} ;"]
                if isinstance(obj, Set):
                    if obj.flags:
                        props.append(f"flags {','.join(obj.flags)} ;")
                    if obj.timeout is not None:
                        props.append(f"timeout {obj.timeout}s ;")
                if obj.comment:
                    props.append(f"comment {_quote(obj.comment)} ;")
                line += " { " + " ".join(props) + " }"
            return line
        if isinstance(obj, Element):
            elem = " . ".join(obj.key)
            if verb == "add":
                if obj.comment:
                    elem += f" comment {_quote(obj.comment)}"
                if obj.value is not None:
                    elem += " : " + " . ".join(obj.value)
            if verb == "flush":
                raise ValueError("cannot flush an element")
            return f"{verb} element {where} {obj.container} {{ {elem} }}"
        raise TypeError(f"not an nftables object: {obj!r}")


# ------------------------------------------------------------------ listing


@dataclass
class TableContents:
    """What ``nft -j list table`` showed: names of chains and sets, map and set elements."""

    chains: set[str] = field(default_factory=set)
    sets: set[str] = field(default_factory=set)
    maps: set[str] = field(default_factory=set)
    #: container name -> {key tuple: value tuple or None}
    elements: dict[str, dict[tuple[str, ...], tuple[str, ...] | None]] = field(default_factory=dict)
    #: chain name -> rule texts are not parsed; rule counts only
    rule_counts: dict[str, int] = field(default_factory=dict)


def _json_value(v: Any) -> tuple[str, ...]:
    if isinstance(v, dict):
        if "concat" in v:
            return tuple(str(x) for part in v["concat"] for x in _json_value(part))
        if "elem" in v:
            return _json_value(v["elem"].get("val"))
        for verdict in ("goto", "jump"):
            if verdict in v:
                return (f"{verdict} {v[verdict]['target']}",)
        for verdict in ("drop", "accept", "return", "continue"):
            if verdict in v:
                return (verdict,)
        if "prefix" in v:
            return (f"{v['prefix']['addr']}/{v['prefix']['len']}",)
        if "range" in v:
            return ("-".join(str(x) for x in v["range"]),)
    return (str(v),)


def parse_listing(data: dict) -> TableContents:
    out = TableContents()
    for item in data.get("nftables", []):
        if "chain" in item:
            out.chains.add(item["chain"]["name"])
        elif "rule" in item:
            chain = item["rule"]["chain"]
            out.rule_counts[chain] = out.rule_counts.get(chain, 0) + 1
        elif "set" in item or "map" in item:
            is_map = "map" in item
            s = item["map" if is_map else "set"]
            (out.maps if is_map else out.sets).add(s["name"])
            elems: dict[tuple[str, ...], tuple[str, ...] | None] = {}
            for e in s.get("elem", []):
                if is_map:
                    key, value = e
                    elems[_json_value(key)] = _json_value(value)
                else:
                    elems[_json_value(e)] = None
            out.elements[s["name"]] = elems
    return out


# ------------------------------------------------------------------ runners


class NFTables:
    """Runs ``nft`` for one table, behind ``command_prefix`` (e.g. ``["ip", "netns", "exec", "node"]``)."""

    def __init__(self, family: str, table: str, *, command_prefix: Sequence[str] = (), nft: str = "nft") -> None:
        self.family = family
        self.table = table
        self.command = [*command_prefix, nft]

    def transaction(self) -> Transaction:
        return Transaction(self.family, self.table)

    async def _exec(self, args: list[str], stdin: bytes | None = None) -> bytes:
        proc = await asyncio.create_subprocess_exec(
            *self.command, *args,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await proc.communicate(stdin)
        except BaseException:
            # cancelled (the proxy stops): end nft and wait for it, so that no transaction of it
            # lands after what the caller does next (deleting the table)
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            raise
        if proc.returncode != 0:
            msg = err.decode(errors="replace").strip()
            raise NFTError(msg or f"nft exited with {proc.returncode}",
                           not_found="No such file or directory" in msg)
        return out

    async def run(self, tx: Transaction) -> None:
        if not tx.ops:
            return
        await self._exec(["-f", "-"], tx.text().encode())

    async def list_table(self) -> TableContents:
        """The table's contents (empty when the table does not exist)."""
        try:
            out = await self._exec(["-j", "list", "table", self.family, self.table])
        except NFTError as err:
            if err.not_found:
                return TableContents()
            raise
        return parse_listing(json.loads(out or b"{}"))

    async def list_text(self, *what: str) -> str:
        """``nft list ...`` as text (``list_text("chain", "ip", "kube-proxy", NAME)``)."""
        return (await self._exec(["list", *what])).decode()

    async def delete_table(self) -> bool:
        """Remove the table; False when there was none."""
        tx = self.transaction()
        tx.delete(Table())
        try:
            await self.run(tx)
        except NFTError as err:
            if err.not_found:
                return False
            raise
        return True


_VERDICT_TARGET = re.compile(r"\b(?:goto|jump)\s+([^\s,{}]+)")


class FakeNFTables:
    """An in-memory table applying transactions all-or-nothing, failing where the kernel would."""

    def __init__(self, family: str = "ip", table: str = "kube-proxy") -> None:
        self.family = family
        self.table = table
        self.exists = False
        self.chains: dict[str, Chain] = {}
        self.rules: dict[str, list[Rule]] = {}
        self.sets: dict[str, Set | Map] = {}
        self.elements: dict[str, dict[tuple[str, ...], Element]] = {}
        self.transactions: list[Transaction] = []
        #: when set, the next run fails with it (and applies nothing)
        self.fail_next: str | None = None

    def transaction(self) -> Transaction:
        return Transaction(self.family, self.table)

    def _snapshot(self) -> tuple:
        return (self.exists, dict(self.chains), {k: list(v) for k, v in self.rules.items()}, dict(self.sets),
                {k: dict(v) for k, v in self.elements.items()})

    def _restore(self, snap: tuple) -> None:
        self.exists, self.chains, self.rules, self.sets, self.elements = snap

    async def run(self, tx: Transaction) -> None:
        self.transactions.append(tx)
        if self.fail_next:
            msg, self.fail_next = self.fail_next, None
            raise NFTError(msg)
        snap = self._snapshot()
        try:
            for verb, obj in tx.ops:
                self._apply(verb, obj)
            self._check_references()
        except NFTError:
            self._restore(snap)
            raise

    def _need_table(self) -> None:
        if not self.exists:
            raise NFTError("Error: No such file or directory (table)", not_found=True)

    def _referenced(self, chain: str) -> bool:
        for rules in self.rules.values():
            for r in rules:
                if chain in _VERDICT_TARGET.findall(r.rule):
                    return True
        for elems in self.elements.values():
            for e in elems.values():
                for part in e.value or ():
                    if chain in _VERDICT_TARGET.findall(part):
                        return True
        return False

    def _check_references(self) -> None:
        for rules in self.rules.values():
            for r in rules:
                for target in _VERDICT_TARGET.findall(r.rule):
                    if target not in self.chains:
                        raise NFTError(f"Error: No such file or directory (chain {target})", not_found=True)
                for ref in re.findall(r"@\s*([^\s{}]+)", r.rule):
                    if ref not in self.sets:
                        raise NFTError(f"Error: No such file or directory (set {ref})", not_found=True)
        for elems in self.elements.values():
            for e in elems.values():
                for part in e.value or ():
                    for target in _VERDICT_TARGET.findall(part):
                        if target not in self.chains:
                            raise NFTError(f"Error: No such file or directory (chain {target})", not_found=True)

    def _apply(self, verb: str, obj: NFTObject) -> None:
        if isinstance(obj, Table):
            if verb == "add":
                self.exists = True
            elif verb == "delete":
                self._need_table()
                self.__init__(self.family, self.table)  # type: ignore[misc]
            else:
                self._need_table()
                for name in self.rules:
                    self.rules[name] = []
            return
        self._need_table()
        if isinstance(obj, Chain):
            if verb == "add":
                old = self.chains.get(obj.name)
                if old is not None and (old.type, old.hook, old.priority) != (obj.type, obj.hook, obj.priority) \
                        and obj.type is not None:
                    raise NFTError(f"Error: Could not process rule: File exists (chain {obj.name})")
                if old is None:
                    self.chains[obj.name] = obj
                    self.rules[obj.name] = []
                return
            if obj.name not in self.chains:
                raise NFTError(f"Error: No such file or directory (chain {obj.name})", not_found=True)
            if verb == "flush":
                self.rules[obj.name] = []
            else:
                if self._referenced(obj.name):  # its own rules go with it
                    raise NFTError(f"Error: Could not process rule: Device or resource busy (chain {obj.name})")
                del self.chains[obj.name]
                del self.rules[obj.name]
            return
        if isinstance(obj, Rule):
            if obj.chain not in self.chains:
                raise NFTError(f"Error: No such file or directory (chain {obj.chain})", not_found=True)
            self.rules[obj.chain].append(obj)
            return
        if isinstance(obj, (Set, Map)):
            if verb == "add":
                old = self.sets.get(obj.name)
                if old is None:
                    self.sets[obj.name] = obj
                    self.elements[obj.name] = {}
                elif type(old) is not type(obj) or old.type != obj.type:
                    raise NFTError(f"Error: Could not process rule: File exists (set {obj.name})")
                else:
                    self.sets[obj.name] = obj  # the kernel updates a set's timeout in place
                return
            if obj.name not in self.sets:
                raise NFTError(f"Error: No such file or directory (set {obj.name})", not_found=True)
            if verb == "flush":
                self.elements[obj.name] = {}
            else:
                used = re.compile(r"@\s*" + re.escape(obj.name) + r"(?:\s|$)")
                if any(used.search(r.rule) for rules in self.rules.values() for r in rules):
                    raise NFTError(f"Error: Could not process rule: Device or resource busy (set {obj.name})")
                del self.sets[obj.name]
                del self.elements[obj.name]
            return
        if isinstance(obj, Element):
            if obj.container not in self.sets:
                raise NFTError(f"Error: No such file or directory (set {obj.container})", not_found=True)
            elems = self.elements[obj.container]
            if verb == "add":
                old = elems.get(obj.key)
                if old is not None and old.value != obj.value:
                    raise NFTError(f"Error: Could not process rule: Device or resource busy (element {obj.key})")
                elems[obj.key] = obj
            elif verb == "delete":
                if obj.key not in elems:
                    raise NFTError(f"Error: No such file or directory (element {obj.key})", not_found=True)
                del elems[obj.key]
            return
        raise TypeError(obj)

    async def list_table(self) -> TableContents:
        out = TableContents()
        if not self.exists:
            return out
        out.chains = set(self.chains)
        for name, s in self.sets.items():
            (out.maps if isinstance(s, Map) else out.sets).add(name)
            out.elements[name] = {k: e.value for k, e in self.elements[name].items()}
        out.rule_counts = {k: len(v) for k, v in self.rules.items() if v}
        return out

    async def delete_table(self) -> bool:
        if not self.exists:
            return False
        self.__init__(self.family, self.table)  # type: ignore[misc]
        return True

    # -- for tests

    def chain_rules(self, chain: str) -> list[str]:
        """The rules of ``chain`` as text (with ``comment "..."`` when they have one)."""
        return [r.rule + (f" comment {_quote(r.comment)}" if r.comment else "") for r in self.rules[chain]]

    def map_elements(self, name: str) -> dict[str, str | None]:
        """``"k1 . k2"`` -> ``"value"`` (None for set elements)."""
        return {" . ".join(k): (" . ".join(e.value) if e.value is not None else None)
                for k, e in self.elements[name].items()}

    def dump(self) -> str:
        """The whole table as sorted text, for diffs in failure messages."""
        lines = []
        for name in sorted(self.chains):
            lines.append(f"chain {name}")
            lines.extend(f"  {r}" for r in self.chain_rules(name))
        for name in sorted(self.sets):
            lines.append(f"{'map' if isinstance(self.sets[name], Map) else 'set'} {name}")
            lines.extend(f"  {k}" + (f" : {v}" if v is not None else "")
                         for k, v in sorted(self.map_elements(name).items()))
        return "\n".join(lines)


def element_texts(elements: Iterable[Element]) -> list[str]:
    return sorted(" . ".join(e.key) + (" : " + " . ".join(e.value) if e.value is not None else "") for e in elements)
