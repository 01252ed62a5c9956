"""ResourceSchema: pruning, defaulting and OpenAPI validation of custom resources."""

import pytest

from kubeplane.apiextensions.schema import ResourceSchema, go_number, unknown_field_messages


def spec(**props):
    return {"type": "object", "properties": {"spec": {"type": "object", "properties": props}}}


def errors(schema, value, old=None):
    rs = ResourceSchema(schema)
    return [f"{c.field}: {c.message}" for c in rs.validate(value, old)]


CASES = [
    (spec(r={"type": "integer", "maximum": 10}), {"spec": {"r": 20}},
     ["spec.r: Invalid value: 20: spec.r in body should be less than or equal to 10"]),
    (spec(r={"type": "integer", "maximum": 10, "exclusiveMaximum": True}), {"spec": {"r": 10}},
     ["spec.r: Invalid value: 10: spec.r in body should be less than 10"]),
    (spec(r={"type": "integer", "minimum": 1}), {"spec": {"r": 0}},
     ["spec.r: Invalid value: 0: spec.r in body should be greater than or equal to 1"]),
    (spec(r={"type": "number", "minimum": 1.5, "exclusiveMinimum": True}), {"spec": {"r": 1.5}},
     ["spec.r: Invalid value: 1.5: spec.r in body should be greater than 1.5"]),
    (spec(r={"type": "integer", "multipleOf": 3}), {"spec": {"r": 4}},
     ["spec.r: Invalid value: 4: spec.r in body should be a multiple of 3"]),
    (spec(r={"type": "integer"}), {"spec": {"r": "x"}},
     ['spec.r: Invalid value: "string": spec.r in body must be of type integer: "string"']),
    (spec(r={"type": "integer"}), {"spec": {"r": 2.0}}, []),
    (spec(r={"type": "number"}), {"spec": {"r": 2}}, []),
    (spec(r={"type": "boolean"}), {"spec": {"r": 1}},
     ['spec.r: Invalid value: "integer": spec.r in body must be of type boolean: "integer"']),
    (spec(s={"type": "string", "minLength": 3}), {"spec": {"s": "ab"}},
     ['spec.s: Invalid value: "ab": spec.s in body should be at least 3 chars long']),
    (spec(s={"type": "string", "maxLength": 2}), {"spec": {"s": "abc"}},
     ["spec.s: Too long: may not be more than 2 bytes"]),
    (spec(s={"type": "string", "maxLength": 2}), {"spec": {"s": "éé"}}, []),
    (spec(s={"type": "string", "pattern": "^[a-z]+$"}), {"spec": {"s": "A1"}},
     ["spec.s: Invalid value: \"A1\": spec.s in body should match '^[a-z]+$'"]),
    (spec(s={"type": "string", "enum": ["a", "b"]}), {"spec": {"s": "c"}},
     ['spec.s: Unsupported value: "c": supported values: "a", "b"']),
    (spec(s={"type": "integer", "enum": [1, 2]}), {"spec": {"s": 3}},
     ['spec.s: Unsupported value: 3: supported values: "1", "2"']),
    (spec(s={"type": "string", "format": "uuid"}), {"spec": {"s": "nope"}},
     ['spec.s: Invalid value: "nope": spec.s in body must be of type uuid: "nope"']),
    (spec(s={"type": "string", "format": "date-time"}), {"spec": {"s": "2024-01-02T03:04:05Z"}}, []),
    (spec(s={"type": "string", "format": "date"}), {"spec": {"s": "2024-02-30"}},
     ['spec.s: Invalid value: "2024-02-30": spec.s in body must be of type date: "2024-02-30"']),
    (spec(s={"type": "string", "format": "ipv4"}), {"spec": {"s": "1.2.3"}},
     ['spec.s: Invalid value: "1.2.3": spec.s in body must be of type ipv4: "1.2.3"']),
    (spec(s={"type": "string", "format": "int-or-anything"}), {"spec": {"s": "x"}}, []),
    (spec(l={"type": "array", "items": {"type": "string"}, "minItems": 2}), {"spec": {"l": ["a"]}},
     ["spec.l: Invalid value: 1: spec.l in body should have at least 2 items"]),
    (spec(l={"type": "array", "items": {"type": "string"}, "maxItems": 1}), {"spec": {"l": ["a", "b"]}},
     ["spec.l: Too many: 2: must have at most 1 items"]),
    (spec(l={"type": "array", "items": {"type": "integer"}}), {"spec": {"l": [1, "x"]}},
     ['spec.l[1]: Invalid value: "string": spec.l[1] in body must be of type integer: "string"']),
    (spec(m={"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 1}),
     {"spec": {"m": {"a": 1, "b": "x"}}},
     ["spec.m: Too many: 2: must have at most 1 items",
      'spec.m.b: Invalid value: "string": spec.m.b in body must be of type integer: "string"']),
    (spec(m={"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2}),
     {"spec": {"m": {"a": 1}}}, ["spec.m: Invalid value: 1: spec.m in body should have at least 2 properties"]),
    ({"type": "object", "required": ["spec"], "properties": {"spec": {"type": "object"}}}, {"metadata": {"name": "a"}},
     ["spec: Required value"]),
    ({"type": "object", "properties": {"spec": {"type": "object", "required": ["a"], "properties": {"a": {"type": "string"}}}}},
     {"spec": {}}, ["spec.a: Required value"]),
    (spec(n={"type": "string", "nullable": True}), {"spec": {"n": None}}, []),
    (spec(n={"type": "string"}), {"spec": {"n": None}},
     ['spec.n: Invalid value: "null": spec.n in body must be of type string: "null"']),
    (spec(i={"x-kubernetes-int-or-string": True}), {"spec": {"i": "10%"}}, []),
    (spec(i={"x-kubernetes-int-or-string": True}), {"spec": {"i": 3}}, []),
    (spec(i={"x-kubernetes-int-or-string": True}), {"spec": {"i": True}},
     ['spec.i: Invalid value: "boolean": spec.i in body must be of type integer,string: "boolean"']),
    (spec(i={"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]}), {"spec": {"i": [1]}},
     ['spec.i: Invalid value: "array": spec.i in body must be of type integer,string: "array"']),
    (spec(n={"type": "integer", "format": "int32"}), {"spec": {"n": 2**40}}, []),
    (spec(l={"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"}), {"spec": {"l": ["a", "b", "a"]}},
     ['spec.l[2]: Duplicate value: "a"']),
    (spec(l={"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
             "items": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}, "v": {"type": "integer"}}}}),
     {"spec": {"l": [{"name": "a", "v": 1}, {"name": "a", "v": 2}]}},
     ['spec.l[1]: Duplicate value: map[string]interface {}{"name":"a"}']),
    (spec(a={"type": "string", "oneOf": [{"pattern": "^a"}, {"pattern": "b$"}]}), {"spec": {"a": "ab"}},
     ['<nil>: Invalid value: "": "spec.a" must validate one and only one schema (oneOf). Found 2 valid alternatives']),
    (spec(a={"type": "string", "oneOf": [{"pattern": "^a"}, {"pattern": "b$"}]}), {"spec": {"a": "ax"}}, []),
    (spec(a={"type": "string", "anyOf": [{"minLength": 3}, {"pattern": "^x"}]}), {"spec": {"a": "ab"}},
     ['<nil>: Invalid value: "": "spec.a" must validate at least one schema (anyOf)',
      'spec.a: Invalid value: "ab": spec.a in body should be at least 3 chars long']),
    (spec(a={"type": "string", "allOf": [{"minLength": 3}, {"pattern": "^x"}]}), {"spec": {"a": "xa"}},
     ['spec.a: Invalid value: "xa": spec.a in body should be at least 3 chars long',
      '<nil>: Invalid value: "": "spec.a" must validate all the schemas (allOf)']),
    (spec(a={"type": "string", "not": {"enum": ["bad"]}}), {"spec": {"a": "bad"}},
     ['<nil>: Invalid value: "": "spec.a" must not validate the schema (not)']),
    (spec(f={"type": "object", "x-kubernetes-preserve-unknown-fields": True}), {"spec": {"f": {"any": [1, {"x": 2}]}}}, []),
]


@pytest.mark.parametrize("schema,value,expected", CASES)
def test_validation_messages_match_upstream(schema, value, expected):
    assert errors(schema, value) == expected


def test_root_metadata_and_type_meta_are_not_validated_by_the_schema():
    schema = {"type": "object", "properties": {"spec": {"type": "object"}}}
    assert errors(schema, {"apiVersion": "a/v1", "kind": "K", "metadata": {"name": "x", "labels": {"a": "b"}}}) == []


def test_root_metadata_name_restriction_applies():
    schema = {"type": "object", "properties": {"metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 3}}}}}
    assert errors(schema, {"metadata": {"name": "abcd"}}) == ["metadata.name: Too long: may not be more than 3 bytes"]


# ------------------------------------------------------------------ pruning

PRUNE_SCHEMA = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {
                "a": {"type": "string"},
                "items": {"type": "array", "items": {"type": "object", "properties": {"n": {"type": "string"}}}},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                         "properties": {"typed": {"type": "object", "properties": {"k": {"type": "string"}}}}},
                "labels": {"type": "object", "additionalProperties": {"type": "object", "properties": {"v": {"type": "string"}}}},
                "tmpl": {"type": "object", "x-kubernetes-embedded-resource": True,
                         "properties": {"spec": {"type": "object", "properties": {"x": {"type": "integer"}}}}},
            },
        },
    },
}


def test_prune_removes_unknown_fields_and_reports_paths():
    rs = ResourceSchema(PRUNE_SCHEMA)
    obj = {
        "apiVersion": "g/v1", "kind": "K", "metadata": {"name": "o", "junk": 1},
        "spec": {
            "a": "x", "b": 1,
            "items": [{"n": "1", "m": 2}, {"n": "2"}],
            "free": {"anything": {"deep": True}, "typed": {"k": "v", "drop": 1}},
            "labels": {"one": {"v": "x", "w": "y"}},
            "tmpl": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "zzz": 1},
                     "spec": {"x": 1, "y": 2}, "other": 3},
        },
        "status": {"s": 1},
    }
    pruned = rs.prune(obj)
    assert pruned == sorted([
        "metadata.junk", "spec.b", "spec.items[0].m", "spec.free.typed.drop", "spec.labels.one.w",
        "spec.tmpl.metadata.zzz", "spec.tmpl.spec.y", "spec.tmpl.other", "status",
    ])
    assert obj == {
        "apiVersion": "g/v1", "kind": "K", "metadata": {"name": "o"},
        "spec": {
            "a": "x", "items": [{"n": "1"}, {"n": "2"}],
            "free": {"anything": {"deep": True}, "typed": {"k": "v"}},
            "labels": {"one": {"v": "x"}},
            "tmpl": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"x": 1}},
        },
    }
    assert unknown_field_messages(["spec.b"]) == ['unknown field "spec.b"']


def test_prune_keeps_everything_under_root_preserve_unknown_fields():
    rs = ResourceSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True})
    obj = {"spec": {"a": 1}, "x": [1]}
    assert rs.prune(obj) == [] and obj == {"spec": {"a": 1}, "x": [1]}


# ---------------------------------------------------------------- defaulting


def test_defaults_applied_nested_and_in_lists():
    schema = spec(
        replicas={"type": "integer", "default": 1},
        tmpl={"type": "object", "default": {}, "properties": {"mode": {"type": "string", "default": "auto"}}},
        ports={"type": "array", "items": {"type": "object", "properties": {"proto": {"type": "string", "default": "TCP"}}}},
        m={"type": "object", "additionalProperties": {"type": "object", "properties": {"w": {"type": "integer", "default": 5}}}},
        set={"type": "string"},
        nul={"type": "string", "nullable": True},
    )
    rs = ResourceSchema(schema)
    obj = {"spec": {"ports": [{}, {"proto": "UDP"}], "m": {"a": {}}, "set": None, "nul": None}}
    rs.default(obj)
    assert obj == {"spec": {"replicas": 1, "tmpl": {"mode": "auto"}, "ports": [{"proto": "TCP"}, {"proto": "UDP"}],
                            "m": {"a": {"w": 5}}, "nul": None}}


def test_default_replaces_non_nullable_null():
    rs = ResourceSchema(spec(r={"type": "integer", "default": 3}))
    obj = {"spec": {"r": None}}
    rs.default(obj)
    assert obj == {"spec": {"r": 3}}


def test_default_values_are_copied():
    rs = ResourceSchema(spec(l={"type": "array", "items": {"type": "string"}, "default": ["a"]}))
    a, b = {"spec": {}}, {"spec": {}}
    rs.default(a)
    rs.default(b)
    a["spec"]["l"].append("b")
    assert b["spec"]["l"] == ["a"]


def test_go_number_formatting():
    assert [go_number(x) for x in (10, 10.0, 1.5, 1e21, 0.0001, 0.00001, -3.25)] == [
        "10", "10", "1.5", "1e+21", "0.0001", "1e-05", "-3.25"]


def test_garbage_never_crashes():
    rs = ResourceSchema({"type": "object", "properties": {"spec": {"type": "object", "properties": {"a": {"type": "array", "items": "x"}}}}})
    for v in ({"spec": {"a": [1, {"b": 2}]}}, {"spec": "x"}, {"spec": None}, {"spec": [1]}):
        rs.prune(v)
        rs.default(v)
        rs.validate(v)


def test_prune_under_preserved_list_keeps_unknown_fields_of_items():
    rs = ResourceSchema(spec(l={"type": "array", "x-kubernetes-preserve-unknown-fields": True,
                                "items": {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}}}}}}))
    obj = {"spec": {"l": [{"x": 1, "a": {"b": "y", "c": 2}}]}}
    assert rs.prune(obj) == ["spec.l[0].a.c"]
    assert obj == {"spec": {"l": [{"x": 1, "a": {"b": "y"}}]}}


def test_prune_embedded_resource_keeps_type_meta_even_when_specified_otherwise():
    rs = ResourceSchema(spec(t={"type": "object", "x-kubernetes-embedded-resource": True,
                                "properties": {"spec": {"type": "object"}}}))
    obj = {"spec": {"t": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}, "x": 1}}}
    assert rs.prune(obj) == ["spec.t.x"]


def test_embedded_resource_type_meta_and_metadata_are_validated():
    s = spec(t={"type": "object", "x-kubernetes-embedded-resource": True, "x-kubernetes-preserve-unknown-fields": True})
    out = errors(s, {"spec": {"t": {"kind": "Foo_bar", "metadata": {"name": "a/b"}}}})
    assert out[0] == "spec.t.apiVersion: Required value"
    assert out[1].startswith('spec.t.kind: Invalid value: "Foo_bar": may have mixed case, but should otherwise match: a DNS-1035 label')
    assert out[2] == "spec.t.metadata.name: Invalid value: \"a/b\": may not contain '/'"
    assert errors(s, {"spec": {"t": {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {}}}}) == []
    assert errors(s, {"spec": {"t": {"apiVersion": "a/b/c", "kind": "X"}}}) == [
        'spec.t.apiVersion: Invalid value: "a/b/c": unexpected GroupVersion string: a/b/c']


def test_has_defaults():
    assert ResourceSchema(spec(r={"type": "integer", "default": 1})).has_defaults
    assert not ResourceSchema(spec(r={"type": "integer"})).has_defaults


# ----------------------------------------------------------------- ratcheting

RATCHET = spec(
    r={"type": "integer", "maximum": 10},
    name={"type": "string"},
    l={"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k"],
       "items": {"type": "object", "required": ["k"], "properties": {"k": {"type": "string"}, "v": {"type": "string", "maxLength": 2}}}},
    s={"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string", "maxLength": 2}},
    a={"type": "array", "items": {"type": "string", "maxLength": 2}},
)


def test_unchanged_invalid_values_are_ratcheted_on_update():
    old = {"spec": {"r": 20, "name": "a", "l": [{"k": "x", "v": "long"}], "s": ["long"], "a": ["long"]}}
    new = {"spec": {"r": 20, "name": "b", "l": [{"k": "y", "v": "ok"}, {"k": "x", "v": "long"}], "s": ["ok", "long"], "a": ["long"]}}
    assert errors(RATCHET, new, old) == []
    # without the old object every error shows
    assert len(errors(RATCHET, new)) == 4


def test_changed_values_are_validated_on_update():
    old = {"spec": {"r": 20, "a": ["long"]}}
    new = {"spec": {"r": 30, "a": ["x", "long"]}}
    assert errors(RATCHET, new, old) == [
        "spec.r: Invalid value: 30: spec.r in body should be less than or equal to 10",
        "spec.a[1]: Too long: may not be more than 2 bytes",
    ]


def test_ratcheted_cel_failures_become_warnings():
    s = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "x": {"type": "integer", "x-kubernetes-validations": [{"rule": "self > 5", "message": "too small"}]},
        "y": {"type": "integer"}}}}}
    rs = ResourceSchema(s)
    warnings: list[str] = []
    assert rs.validate({"spec": {"x": 1, "y": 2}}, {"spec": {"x": 1, "y": 1}}, warnings) == []
    assert warnings == ['spec.x: Invalid value: "integer": too small']
    assert [c.message for c in rs.validate({"spec": {"x": 2}}, {"spec": {"x": 1}})] == ['Invalid value: "integer": too small']


def test_default_reports_whether_it_changed_the_object():
    rs = ResourceSchema(spec(r={"type": "integer", "default": 1}, n={"type": "string"}))
    assert rs.default({"spec": {}}) is True
    assert rs.default({"spec": {"r": 2}}) is False
    assert rs.default({"spec": {"r": 2, "n": None}}) is True


def test_root_required_type_meta_and_metadata():
    schema = {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
              "properties": {"spec": {"type": "object"}}}
    assert errors(schema, {"apiVersion": "a/v1", "kind": "K", "metadata": {"name": "x"}, "spec": {}}) == []
    assert errors(schema, {"apiVersion": "a/v1", "kind": "K", "metadata": {"name": "x"}}) == ["spec: Required value"]


def test_list_type_errors_use_field_paths_under_maps():
    schema = spec(m={"type": "object", "additionalProperties": {
        "type": "object", "properties": {"l": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"}}}})
    assert errors(schema, {"spec": {"m": {"k": {"l": ["a", "a"]}}}}) == ['spec.m[k].l[1]: Duplicate value: "a"']
    # an unchanged list is not checked again on update
    assert errors(schema, {"spec": {"m": {"k": {"l": ["a", "a"]}}}}, {"spec": {"m": {"k": {"l": ["a", "a"]}}}}) == []
