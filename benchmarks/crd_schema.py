"""The CPU cost of the structural-schema library on one custom resource: a
20-field spec (strings with maxLength and pattern, bounded integers, booleans,
bounded string lists) with a default and one CEL rule, pruned, defaulted and
validated; also the one-time costs (the CRD schema checks and compiling).
Reports the best of several rounds in CPU time, so other load on the machine
matters less.

    PYTHONPATH=src python benchmarks/crd_schema.py [--rounds 7] [--n 5000]
"""

from __future__ import annotations

import argparse
import copy
import time

from kubeplane.apiextensions.schema import ResourceSchema
from kubeplane.apiextensions.structural import check_crd_schema


def schema_and_object() -> tuple[dict, dict]:
    props: dict = {}
    spec: dict = {}
    for i in range(20):
        kind = i % 4
        if kind == 0:
            props[f"f{i}"] = {"type": "string", "maxLength": 64, "pattern": "^[a-z0-9-]*$"}
            spec[f"f{i}"] = "abc-1"
        elif kind == 1:
            props[f"f{i}"] = {"type": "integer", "minimum": 0, "maximum": 1000}
            spec[f"f{i}"] = 7
        elif kind == 2:
            props[f"f{i}"] = {"type": "boolean"}
            spec[f"f{i}"] = True
        else:
            props[f"f{i}"] = {"type": "array", "items": {"type": "string"}, "maxItems": 10}
            spec[f"f{i}"] = ["a-b", "c"]
    props["f1"]["default"] = 5
    del spec["f1"]
    schema = {
        "type": "object",
        "properties": {
            "spec": {"type": "object", "properties": props,
                     "x-kubernetes-validations": [{"rule": "self.f1 <= 100", "message": "f1 too big"}]},
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
    }
    obj = {"apiVersion": "example.com/v1", "kind": "Widget",
           "metadata": {"name": "w", "namespace": "default", "labels": {"a": "b"}}, "spec": spec}
    return schema, obj


def best(fn, objs_factory, rounds: int) -> float:
    """The best per-call CPU time in microseconds."""
    out = []
    for _ in range(rounds):
        objs = objs_factory()
        t = time.process_time()
        for o in objs:
            fn(o)
        out.append((time.process_time() - t) / len(objs) * 1e6)
    return min(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--n", type=int, default=5000)
    args = ap.parse_args()
    schema, base = schema_and_object()

    t = time.process_time()
    errs = check_crd_schema(schema, "spec.versions[0].schema.openAPIV3Schema")
    first_ms = (time.process_time() - t) * 1e3  # includes creating the CEL environment
    assert errs == [], errs
    schema["properties"]["spec"]["x-kubernetes-validations"][0]["rule"] = "self.f1 <= 100 "
    t = time.process_time()
    check_crd_schema(schema, "spec.versions[0].schema.openAPIV3Schema")
    check_ms = (time.process_time() - t) * 1e3
    t = time.process_time()
    rs = ResourceSchema(schema)
    compile_ms = (time.process_time() - t) * 1e3

    fresh = lambda: [copy.deepcopy(base) for _ in range(args.n)]  # noqa: E731
    defaulted = [copy.deepcopy(base) for _ in range(args.n)]
    for o in defaulted:
        rs.default(o)
    assert rs.validate(defaulted[0]) == []
    old = copy.deepcopy(defaulted[0])
    old["spec"]["f0"] = "old"

    def all_three(o: dict) -> None:
        rs.prune(o)
        rs.default(o)
        rs.validate(o)

    prune = best(rs.prune, fresh, args.rounds)
    default = best(rs.default, fresh, args.rounds)
    validate = best(rs.validate, lambda: defaulted, args.rounds)
    update = best(lambda o: rs.validate(o, old), lambda: defaulted, args.rounds)
    total = best(all_three, fresh, args.rounds)
    print(f"check_crd_schema {check_ms:.2f} ms ({first_ms:.1f} ms the first time in a process: the CEL "
          f"environment), ResourceSchema() {compile_ms:.2f} ms (once per CRD version)")
    print(f"per object: prune {prune:.1f} us, default {default:.1f} us, validate {validate:.1f} us, "
          f"validate on update {update:.1f} us, prune+default+validate {total:.1f} us")


if __name__ == "__main__":
    main()
