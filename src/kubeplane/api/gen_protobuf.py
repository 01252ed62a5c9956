"""Generate the protobuf schema the request-body decoder reads.

Upstream's wire format for every built-in kind is defined by two files per
API package: ``generated.proto`` (field numbers and protobuf types) and the Go
``types.go`` files (the JSON name of each field, ``omitempty``, ``inline`` and
whether the Go field is a pointer). This script reads both from checkouts of
``k8s.io/api`` and ``k8s.io/apimachinery`` and writes one compact table per
message reachable from the kinds kubeplane decodes::

    python -m kubeplane.api.gen_protobuf --api PATH/TO/api --apimachinery PATH/TO/apimachinery \
        --apiextensions PATH/TO/apiextensions-apiserver
    python -m kubeplane.api.gen_protobuf ... --check     # exit 1 if the data file is out of date

The output, ``protobuf_schema.json`` next to this module, is package data read
by :mod:`kubeplane.api.protobuf`. Each field is
``[number, jsonName, type, messageName, flags]``; ``type`` is a protobuf scalar
(``string``, ``int64``, ...), ``message``, a well-known type (``time``,
``quantity``, ...) or ``map:<value type>``; flags: 1 repeated, 2 keep zero
values (a pointer or a field without ``omitempty``), 4 inline.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

OUTPUT = Path(__file__).with_name("protobuf_schema.json")

#: API packages of k8s.io/api and k8s.io/apimachinery whose messages are read
API_PACKAGES = (
    "core/v1", "apps/v1", "batch/v1", "policy/v1", "storage/v1", "resource/v1", "coordination/v1",
    "scheduling/v1", "rbac/v1", "networking/v1", "autoscaling/v1", "autoscaling/v2", "authentication/v1",
    "certificates/v1",
    "admissionregistration/v1",
    "authorization/v1",
    "discovery/v1",
)
MACHINERY_PACKAGES = ("pkg/apis/meta/v1", "pkg/runtime", "pkg/api/resource", "pkg/util/intstr")

#: API group of each k8s.io/api package (for the apiVersion a kind is sent with)
GROUPS = {
    "core": "", "apps": "apps", "batch": "batch", "policy": "policy", "storage": "storage.k8s.io",
    "resource": "resource.k8s.io", "coordination": "coordination.k8s.io", "scheduling": "scheduling.k8s.io",
    "rbac": "rbac.authorization.k8s.io", "networking": "networking.k8s.io", "autoscaling": "autoscaling",
    "authentication": "authentication.k8s.io",
    "certificates": "certificates.k8s.io",
    "admissionregistration": "admissionregistration.k8s.io",
    "authorization": "authorization.k8s.io",
    "discovery": "discovery.k8s.io",
}

META = "k8s.io.apimachinery.pkg.apis.meta.v1"
#: messages with a JSON form of their own (custom MarshalJSON upstream)
WELL_KNOWN = {
    f"{META}.Time": "time",
    f"{META}.MicroTime": "microtime",
    f"{META}.Duration": "duration",
    f"{META}.FieldsV1": "rawjson",
    "k8s.io.apimachinery.pkg.api.resource.Quantity": "quantity",
    "k8s.io.apimachinery.pkg.util.intstr.IntOrString": "intorstr",
    "k8s.io.apimachinery.pkg.runtime.RawExtension": "rawext",
    # apiextensions' JSON: field 1 holds the raw JSON value
    "k8s.io.apiextensions_apiserver.pkg.apis.apiextensions.v1.JSON": "rawjson",
}
SCALARS = {"string", "bytes", "bool", "int32", "int64", "uint32", "uint64", "sint32", "sint64",
           "fixed32", "fixed64", "sfixed32", "sfixed64", "double", "float"}

#: meta/v1 option kinds every group version registers (client-go encodes them
#: with the group version of the request)
OPTION_KINDS = ("DeleteOptions", "CreateOptions", "UpdateOptions", "PatchOptions", "GetOptions",
                "ListOptions", "Status")

REPEATED, KEEP, INLINE = 1, 2, 4

#: k8s.io/apiextensions-apiserver: the CustomResourceDefinition kind
APIEXTENSIONS_PACKAGE = "pkg/apis/apiextensions/v1"
APIEXTENSIONS = "k8s.io.apiextensions_apiserver.pkg.apis.apiextensions.v1"
#: messages of a JSON form of their own that hold a JSONSchemaProps (decoded
#: with their table, then reshaped: upstream's MarshalJSON of each)
SCHEMA_OR = {
    f"{APIEXTENSIONS}.JSONSchemaPropsOrBool": "schemaorbool",
    f"{APIEXTENSIONS}.JSONSchemaPropsOrArray": "schemaorarray",
    f"{APIEXTENSIONS}.JSONSchemaPropsOrStringArray": "schemaorstrings",
}


@dataclass
class ProtoField:
    label: str  # optional | repeated | map
    type: str  # scalar, fully qualified message name, or the map value type
    name: str
    number: int


@dataclass
class GoField:
    json: str
    omitempty: bool
    inline: bool
    pointer: bool


_MESSAGE = re.compile(r"^message (\w+) \{$")
_FIELD = re.compile(r"^\s+(optional|repeated) ([\w.]+) (\w+) = (\d+);")
_MAP_FIELD = re.compile(r"^\s+map<string, ([\w.]+)> (\w+) = (\d+);")


def parse_proto(text: str) -> tuple[str, dict[str, list[ProtoField]]]:
    package = re.search(r"^package ([\w.]+);", text, re.M)
    assert package, "no package line"
    pkg = package.group(1)
    messages: dict[str, list[ProtoField]] = {}
    current: list[ProtoField] | None = None
    for line in text.splitlines():
        m = _MESSAGE.match(line)
        if m:
            current = messages.setdefault(f"{pkg}.{m.group(1)}", [])
            continue
        if line == "}":
            current = None
            continue
        if current is None:
            continue
        m = _FIELD.match(line)
        if m:
            label, typ, name, number = m.groups()
            current.append(ProtoField(label, _qualify(typ, pkg), name, int(number)))
            continue
        m = _MAP_FIELD.match(line)
        if m:
            typ, name, number = m.groups()
            current.append(ProtoField("map", _qualify(typ, pkg), name, int(number)))
    return pkg, messages


def _qualify(typ: str, pkg: str) -> str:
    if typ in SCALARS:
        return typ
    if typ.startswith("."):
        return typ[1:]
    return f"{pkg}.{typ}"


_STRUCT = re.compile(r"^type (\w+) struct ?\{(\})?$")
_GO_FIELD = re.compile(r"^\s+(?:(\w+)\s+)?(\S+)\s+`([^`]*)`")
_TAG = re.compile(r'(\w+):"([^"]*)"')


def parse_go(text: str) -> dict[str, dict[str, GoField]]:
    """struct name -> protobuf field name -> what the JSON encoding needs."""
    structs: dict[str, dict[str, GoField]] = {}
    current: dict[str, GoField] | None = None
    for line in text.splitlines():
        m = _STRUCT.match(line)
        if m:
            current = structs.setdefault(m.group(1), {})
            if m.group(2):  # an empty struct on one line: `type X struct{}`
                current = None
            continue
        if line == "}":
            current = None
            continue
        if current is None or line.lstrip().startswith("//"):
            continue
        m = _GO_FIELD.match(line)
        if not m:
            continue
        go_name, go_type, tags = m.groups()
        tag = dict(_TAG.findall(tags))
        pb = tag.get("protobuf")
        if not pb:
            continue
        parts = tag.get("json", "").split(",")
        embedded = go_name is None
        type_name = go_type.lstrip("*").rsplit(".", 1)[-1]
        name = next((p[5:] for p in pb.split(",") if p.startswith("name=")), None)
        if name is None and embedded:
            name = type_name[:1].lower() + type_name[1:]  # go-to-protobuf's name for an embedded struct
        if name is None:
            continue
        json_name = parts[0] or ("" if embedded else (go_name or ""))
        # encoding/json promotes the fields of an embedded struct that has no JSON name
        inline = "inline" in parts[1:] or (embedded and not parts[0])
        current[name] = GoField(json_name, "omitempty" in parts[1:] or "omitzero" in parts[1:],
                                inline, go_type.startswith("*"))
    return structs


def _read_package(root: Path, package: str) -> tuple[str, dict[str, list[ProtoField]], dict[str, dict[str, GoField]]]:
    d = root / package
    pkg, messages = parse_proto((d / "generated.proto").read_text())
    structs: dict[str, dict[str, GoField]] = {}
    for go in sorted(d.glob("*.go")):
        if go.name.endswith("_test.go") or go.name.startswith(("zz_generated", "generated")):
            continue
        structs.update(parse_go(go.read_text()))
    return pkg, messages, structs


def build(api: Path, machinery: Path, apiextensions: Path | None = None) -> dict:
    messages: dict[str, list[ProtoField]] = {}
    go: dict[str, dict[str, GoField]] = {}  # fully qualified message -> fields
    kinds: dict[str, str] = {}
    roots: list[tuple[Path, tuple[str, ...]]] = [(api, API_PACKAGES), (machinery, MACHINERY_PACKAGES)]
    if apiextensions is not None:
        roots.append((apiextensions, (APIEXTENSIONS_PACKAGE,)))
    for root, packages in roots:
        for package in packages:
            pkg, msgs, structs = _read_package(root, package)
            messages.update(msgs)
            for full in msgs:
                if full.rsplit(".", 1)[1] in structs:
                    go[full] = structs[full.rsplit(".", 1)[1]]
            if root is not machinery:
                if package == APIEXTENSIONS_PACKAGE:
                    group, version = "apiextensions.k8s.io", "v1"
                else:
                    group, version = GROUPS[package.split("/")[0]], package.split("/")[1]
                api_version = f"{group}/{version}" if group else version
                for full, fields in msgs.items():
                    # A kind is a message that carries ObjectMeta (or ListMeta) as field 1.
                    # (Aliases of other types, such as core/v1 List, have no struct to read.)
                    if full in go and fields and fields[0].number == 1 and fields[0].type in (
                            f"{META}.ObjectMeta", f"{META}.ListMeta"):
                        kinds[f"{api_version}/{full.rsplit('.', 1)[1]}"] = full
    for kind in OPTION_KINDS:
        kinds[f"*/{kind}"] = f"{META}.{kind}"
    kinds["meta.k8s.io/v1/DeleteOptions"] = f"{META}.DeleteOptions"

    out: dict[str, list[list]] = {}
    todo = sorted(set(kinds.values()))
    while todo:
        name = todo.pop()
        if name in out or name in WELL_KNOWN:
            continue
        rows = []
        for f in messages[name]:
            gf = go[name].get(f.name)
            if gf is None:
                raise SystemExit(f"{name}.{f.name}: no Go field with this protobuf name")
            flags = (REPEATED if f.label == "repeated" else 0) | (INLINE if gf.inline else 0)
            if gf.pointer or not gf.omitempty:
                flags |= KEEP
            if f.type in SCALARS:
                typ, ref = f.type, None
            elif f.type in WELL_KNOWN:
                typ, ref = WELL_KNOWN[f.type], None
            elif f.type in SCHEMA_OR:
                typ, ref = SCHEMA_OR[f.type], f.type
                todo.append(f.type)
            elif f.type in messages and f.type not in go:
                # a slice alias (authentication's ExtraValue, []string) has no struct:
                # it only appears in status and user info a request does not carry
                continue
            elif f.type in messages:
                typ, ref = "message", f.type
                todo.append(f.type)
            else:
                continue  # a message of a package not read (alpha versions): skipped as unknown
            if f.label == "map":
                typ = "map:" + typ
            rows.append([f.number, "" if gf.inline else gf.json, typ, ref, flags])
        out[name] = rows
    return {
        "source": "generated.proto and Go struct tags of k8s.io/api and k8s.io/apimachinery"
                  + (" and k8s.io/apiextensions-apiserver" if apiextensions is not None else ""),
        "kinds": dict(sorted(kinds.items())),
        "messages": dict(sorted(out.items())),
    }


def render(data: dict) -> str:
    # One message per line: small diffs when upstream adds a field.
    lines = ["{", f'"source": {json.dumps(data["source"])},', f'"kinds": {json.dumps(data["kinds"])},',
             '"messages": {']
    items = list(data["messages"].items())
    for i, (name, rows) in enumerate(items):
        sep = "," if i < len(items) - 1 else ""
        lines.append(f"{json.dumps(name)}: {json.dumps(rows, separators=(',', ':'))}{sep}")
    lines += ["}", "}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--api", type=Path, required=True, help="checkout of k8s.io/api")
    p.add_argument("--apimachinery", type=Path, required=True, help="checkout of k8s.io/apimachinery")
    p.add_argument("--apiextensions", type=Path, help="checkout of k8s.io/apiextensions-apiserver")
    p.add_argument("--check", action="store_true", help="exit 1 if the data file differs")
    args = p.parse_args(argv)
    text = render(build(args.api, args.apimachinery, args.apiextensions))
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT.name} is out of date", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
