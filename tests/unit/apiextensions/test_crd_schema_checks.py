"""check_crd_schema: the errors upstream reports for a CRD version's openAPIV3Schema."""

import pytest

from kubeplane.apiextensions.structural import check_crd_schema

P = "spec.versions[0].schema.openAPIV3Schema"


def obj(**props):
    return {"type": "object", "properties": props}


def spec(**props):
    return obj(spec={"type": "object", "properties": props})


def msgs(schema, **kw):
    return [f"{c.field}: {c.message}" for c in check_crd_schema(schema, P, **kw)]


VALID = [
    spec(replicas={"type": "integer", "default": 1, "minimum": 0}),
    spec(port={"x-kubernetes-int-or-string": True}),
    spec(port={"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]}),
    spec(free={"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
    spec(tmpl={"type": "object", "x-kubernetes-embedded-resource": True, "x-kubernetes-preserve-unknown-fields": True}),
    spec(labels={"type": "object", "additionalProperties": {"type": "string"}}),
    spec(items={"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                "items": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}}),
    spec(a={"type": "string", "oneOf": [{"pattern": "^a"}, {"pattern": "^b"}]}),
    {"type": "object", "properties": {"metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}}}}},
    spec(x={"type": "integer", "x-kubernetes-validations": [{"rule": "self > 0"}]}),
]


@pytest.mark.parametrize("schema", VALID)
def test_valid_schemas_have_no_errors(schema):
    assert msgs(schema) == []


INVALID = [
    (obj(spec={"properties": {"a": {"type": "string"}}}),
     [f"{P}.properties[spec].type: Required value: must not be empty for specified object fields"]),
    ({"properties": {}}, [f"{P}.type: Required value: must not be empty at the root"]),
    ({"type": "string"}, [f"{P}.type: Invalid value: \"string\": must be object at the root"]),
    (spec(l={"type": "array"}), [f"{P}.properties[spec].properties[l].items: Required value: must be specified"]),
    (spec(l={"type": "array", "items": {}}),
     [f"{P}.properties[spec].properties[l].items.type: Required value: must not be empty for specified array items"]),
    (spec(u={"type": "array", "items": {"type": "string"}, "uniqueItems": True}),
     [f"{P}.properties[spec].properties[u].uniqueItems: Forbidden: uniqueItems cannot be set to true since the runtime complexity becomes quadratic"]),
    (spec(r={"$ref": "#/definitions/x", "type": "string"}),
     [f"{P}.properties[spec].properties[r].$ref: Forbidden: $ref is not supported"]),
    (spec(n={"type": "null"}),
     [f'{P}.properties[spec].properties[n].type: Unsupported value: "null": supported values: "array", "boolean", "integer", "number", "object", "string"',
      f"{P}.properties[spec].properties[n].type: Forbidden: type cannot be set to null, use nullable as an alternative"]),
    (spec(t={"type": "str"}),
     [f'{P}.properties[spec].properties[t].type: Unsupported value: "str": supported values: "array", "boolean", "integer", "number", "object", "string"']),
    (spec(m={"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "string"}}),
     [f"{P}.properties[spec].properties[m].additionalProperties: Forbidden: additionalProperties and properties are mutual exclusive"]),
    ({"type": "object", "additionalProperties": {"type": "string"}},
     [f"{P}.additionalProperties: Forbidden: must not be used at the root"]),
    (spec(a={"type": "string", "anyOf": [{"type": "string"}]}),
     [f"{P}.properties[spec].properties[a].anyOf[0].type: Forbidden: must be empty to be structural"]),
    ({"type": "object", "properties": {"spec": {"type": "object"}},
      "anyOf": [{"properties": {"spec": {"properties": {"b": {"minLength": 1}}}}}]},
     [f"{P}.properties[spec].properties[b]: Required value: because it is defined in {P}.anyOf[0].properties[spec].properties[b]"]),
    (spec(a={"type": "string", "allOf": [{"description": "x"}]}),
     [f"{P}.properties[spec].properties[a].allOf[0].description: Forbidden: must be empty to be structural"]),
    ({"type": "object", "properties": {"metadata": {"type": "object", "properties": {"labels": {"type": "object"}}}}},
     [f"{P}.properties[metadata]: Forbidden: must not specify anything other than name and generateName, but metadata is implicitly specified"]),
    (spec(e={"type": "object", "x-kubernetes-embedded-resource": True}),
     [f"{P}.properties[spec].properties[e].properties: Required value: must not be empty if x-kubernetes-embedded-resource is true without x-kubernetes-preserve-unknown-fields"]),
    (spec(e={"type": "string", "x-kubernetes-embedded-resource": True, "x-kubernetes-preserve-unknown-fields": True}),
     [f'{P}.properties[spec].properties[e].type: Invalid value: "string": must be object if x-kubernetes-embedded-resource is true']),
    (spec(i={"x-kubernetes-int-or-string": True, "x-kubernetes-preserve-unknown-fields": True}),
     [f"{P}.properties[spec].properties[i].x-kubernetes-preserve-unknown-fields: Invalid value: true: must be false if x-kubernetes-int-or-string is true"]),
    (spec(p={"type": "object", "x-kubernetes-preserve-unknown-fields": False}),
     [f"{P}.properties[spec].properties[p].x-kubernetes-preserve-unknown-fields: Invalid value: false: must be true or undefined"]),
    (spec(l={"type": "string", "x-kubernetes-list-type": "set"}),
     [f'{P}.properties[spec].properties[l].type: Invalid value: "string": must be array if x-kubernetes-list-type is specified']),
    (spec(l={"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "bag"}),
     [f'{P}.properties[spec].properties[l].x-kubernetes-list-type: Unsupported value: "bag": supported values: "atomic", "set", "map"']),
    (spec(l={"type": "array", "items": {"type": "object", "properties": {"n": {"type": "string"}}}, "x-kubernetes-list-type": "map"}),
     [f"{P}.properties[spec].properties[l].x-kubernetes-list-map-keys: Required value: must not be empty if x-kubernetes-list-type is map"]),
    (spec(l={"type": "array", "items": {"type": "object", "properties": {"n": {"type": "string"}}},
             "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["n"]}),
     [f"{P}.properties[spec].properties[l].items.properties[n].default: Required value: this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property"]),
    (spec(l={"type": "array", "items": {"type": "string"}, "x-kubernetes-list-map-keys": ["n"]}),
     [f"{P}.properties[spec].properties[l].x-kubernetes-list-type: Required value: must be map if x-kubernetes-list-map-keys is non-empty"]),
    (spec(m={"type": "object", "x-kubernetes-map-type": "weird"}),
     [f'{P}.properties[spec].properties[m].x-kubernetes-map-type: Unsupported value: "weird": supported values: "atomic", "granular"']),
    (spec(p={"type": "string", "pattern": "(a"}),
     [f'{P}.properties[spec].properties[p].pattern: Invalid value: "(a": must be a valid regular expression, but isn\'t: error parsing regexp: missing closing ): `(a`']),
    (spec(r={"type": "integer", "default": "x"}),
     [f'{P}.properties[spec].properties[r].default: Invalid value: "string":  in body must be of type integer: "string"']),
    (spec(o={"type": "object", "properties": {"a": {"type": "string"}}, "default": {"a": "x", "b": 1}}),
     [f'{P}.properties[spec].properties[o].default: Invalid value: {{"a":"x","b":1}}: must not have unknown fields']),
    (spec(r={"type": "integer", "maximum": 3, "default": 5}),
     [f"{P}.properties[spec].properties[r].default: Invalid value: 5:  in body should be less than or equal to 3"]),
    ({"type": "object", "properties": {"metadata": {"type": "object", "properties": {"name": {"type": "string", "default": "x"}}}}},
     [f"{P}.properties[metadata].properties[name].default: Forbidden: must not be set in top-level metadata"]),
    ({"type": "object", "nullable": True}, [f"{P}.nullable: Forbidden: nullable cannot be true at the root"]),
    (spec(x={"type": "integer", "x-kubernetes-validations": [{"rule": " "}]}),
     [f"{P}.properties[spec].properties[x].x-kubernetes-validations[0].rule: Required value: rule is not specified"]),
    (spec(x={"type": "integer", "x-kubernetes-validations": [{"rule": "self > 0", "reason": "Nope"}]}),
     [f'{P}.properties[spec].properties[x].x-kubernetes-validations[0].reason: Unsupported value: "Nope": supported values: "FieldValueDuplicate", "FieldValueForbidden", "FieldValueInvalid", "FieldValueRequired"']),
    (spec(x={"type": "integer", "x-kubernetes-validations": [{"rule": "self > 0\n&& self < 5"}]}),
     [f"{P}.properties[spec].properties[x].x-kubernetes-validations[0].message: Required value: message must be specified if rule contains line breaks"]),
    (spec(x={"type": "object", "properties": {"a": {"type": "string"}},
             "x-kubernetes-validations": [{"rule": "true", "fieldPath": ".b"}]}),
     [f'{P}.properties[spec].properties[x].x-kubernetes-validations[0].fieldPath: Invalid value: ".b": fieldPath must be a valid path']),
]


@pytest.mark.parametrize("schema,expected", INVALID)
def test_invalid_schemas_report_upstream_errors(schema, expected):
    assert msgs(schema) == expected


def test_rule_compile_error():
    out = msgs(spec(x={"type": "integer", "x-kubernetes-validations": [{"rule": "self >"}]}))
    assert len(out) == 1
    assert out[0].startswith(f'{P}.properties[spec].properties[x].x-kubernetes-validations[0].rule: Invalid value: '
                             'apiextensions.ValidationRule{Rule:"self >", Message:"", MessageExpression:"", '
                             'Reason:(*apiextensions.FieldValueErrorReason)(nil), FieldPath:"", OptionalOldSelf:(*bool)(nil)}: '
                             "compilation failed: ERROR: <input>:1:7: Syntax error")


def test_rule_must_return_bool():
    out = msgs(spec(x={"type": "integer", "x-kubernetes-validations": [{"rule": "self + 1"}]}))
    assert len(out) == 1 and out[0].endswith(": cel expression must evaluate to a bool")


def test_rule_type_checked_against_self_type():
    out = msgs(spec(x={"type": "integer", "x-kubernetes-validations": [{"rule": "self == 'a'"}]}))
    assert len(out) == 1 and "found no matching overload for '_==_' applied to '(int, string)'" in out[0]


def test_message_expression_must_be_string():
    out = msgs(spec(x={"type": "integer", "x-kubernetes-validations": [{"rule": "self > 0", "messageExpression": "self"}]}))
    assert len(out) == 1
    assert out[0].startswith(f"{P}.properties[spec].properties[x].x-kubernetes-validations[0].messageExpression: Invalid value: ")
    assert out[0].endswith(": must evaluate to a string")


def test_old_self_forbidden_under_atomic_list_items():
    schema = spec(l={"type": "array", "maxItems": 5, "items": {"type": "string", "maxLength": 5,
                                                               "x-kubernetes-validations": [{"rule": "self == oldSelf"}]}})
    assert msgs(schema) == [
        f'{P}.properties[spec].properties[l].items.x-kubernetes-validations[0].rule: Invalid value: "self == oldSelf": '
        f"oldSelf cannot be used on the uncorrelatable portion of the schema within {P}.properties[spec].properties[l]"
    ]


def test_optional_old_self_needs_old_self():
    schema = spec(x={"type": "integer", "x-kubernetes-validations": [{"rule": "self > 0", "optionalOldSelf": True}]})
    assert msgs(schema) == [
        f"{P}.properties[spec].properties[x].x-kubernetes-validations[0].optionalOldSelf: Invalid value: true: "
        "may not be set if oldSelf is not used in rule"
    ]


def test_cost_limit_for_nested_comprehensions_over_unbounded_lists():
    schema = spec(l={"type": "array", "items": {"type": "string"},
                     "x-kubernetes-validations": [{"rule": "self.all(x, self.all(y, x == y))"}]})
    out = msgs(schema)
    assert f"{P}.properties[spec].properties[l].x-kubernetes-validations[0].rule: Forbidden: estimated rule cost exceeds budget by factor of more than 100x (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)" in out


def test_cost_within_limit_when_bounded():
    schema = spec(l={"type": "array", "maxItems": 10, "items": {"type": "string"},
                     "x-kubernetes-validations": [{"rule": "self.all(x, self.all(y, x == y))"}]})
    assert msgs(schema) == []


def test_defaults_forbidden_when_not_allowed():
    assert msgs(spec(r={"type": "integer", "default": 1}), allow_defaults=False) == [
        f"{P}.properties[spec].properties[r].default: Forbidden: must not be set"
    ]


def test_not_a_dict_never_crashes():
    assert check_crd_schema("nope", P)
    assert msgs({"type": "object", "properties": {"a": "x", "b": {"type": "array", "items": [1]}}}) is not None


def test_undefined_field_is_a_compile_error():
    schema = spec(a={"type": "object", "properties": {"b": {"type": "integer"}},
                     "x-kubernetes-validations": [{"rule": "self.c > 0 && self.b > 0"}]})
    out = msgs(schema)
    assert len(out) == 1
    assert out[0].endswith("compilation failed: ERROR: <input>:1:5: undefined field 'c'\n | self.c > 0 && self.b > 0\n | ....^")


def test_root_rule_may_read_type_meta_and_name_only():
    ok = {"type": "object", "properties": {"spec": {"type": "object"}},
          "x-kubernetes-validations": [{"rule": "self.kind == 'K' && self.metadata.name.size() < 10 && has(self.spec)"}]}
    assert msgs(ok) == []
    bad = {"type": "object", "properties": {"spec": {"type": "object"}},
           "x-kubernetes-validations": [{"rule": "self.metadata.namespace == 'x'"}]}
    out = msgs(bad)
    assert len(out) == 1 and "undefined field 'namespace'" in out[0]


def test_fields_of_maps_and_preserved_objects_are_not_checked():
    schema = spec(m={"type": "object", "additionalProperties": {"type": "string"},
                     "x-kubernetes-validations": [{"rule": "self.anything == 'x' || true"}]},
                  p={"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                     "x-kubernetes-validations": [{"rule": "!has(self.whatever)"}]})
    assert msgs(schema) == []


def test_cost_follows_iteration_variables_into_nested_lists():
    inner = {"type": "array", "items": {"type": "object", "properties": {
        "m": {"type": "array", "items": {"type": "string", "maxLength": 8}}}}}
    bounded = dict(inner, maxItems=16)
    bounded["items"] = {"type": "object", "properties": {"m": {"type": "array", "maxItems": 8, "items": {"type": "string"}}}}
    rule = [{"rule": "self.all(r, r.m.all(q, q.size() < 5))"}]
    assert msgs(spec(l=dict(bounded, **{"x-kubernetes-validations": rule}))) == []
    out = msgs(spec(l=dict(inner, **{"x-kubernetes-validations": rule})))
    assert (f"{P}.properties[spec].properties[l].x-kubernetes-validations[0].rule: Forbidden: estimated rule cost exceeds "
            "budget by factor of more than 100x (try simplifying the rule, or adding maxItems, maxProperties, and "
            "maxLength where arrays, maps, and strings are declared)") in out


def test_single_comprehension_over_unbounded_list_is_within_budget():
    schema = spec(l={"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}},
                     "x-kubernetes-validations": [{"rule": "self.all(x, x.name.size() > 0 && x.name.size() < 64)"}]})
    assert msgs(schema) == []


def test_rules_inside_unbounded_lists_multiply_by_the_list_size():
    item_rule = {"type": "object", "properties": {"a": {"type": "array", "maxItems": 100, "items": {"type": "string"},
                                                        "x-kubernetes-validations": [{"rule": "self.all(x, x.size() > 1)"}]}}}
    out = msgs(spec(l={"type": "array", "items": item_rule}))
    assert any("estimated rule cost exceeds budget" in o for o in out)
    assert msgs(spec(l={"type": "array", "maxItems": 4, "items": item_rule})) == []


def test_total_cost_for_whole_schema():
    rule = {"type": "array", "maxItems": 1500, "items": {"type": "string"},
            "x-kubernetes-validations": [{"rule": "self.all(x, self.exists(y, x == y))"}]}
    schema = spec(**{f"l{i}": rule for i in range(12)})
    out = msgs(schema)
    assert out[-1] == (f"{P}: Forbidden: x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema exceeds "
                       "budget by factor of 1.080540x (try simplifying the rule, or adding maxItems, maxProperties, and maxLength "
                       "where arrays, maps, and strings are declared)")
    assert sum("contributed to estimated rule cost total exceeding cost limit for entire OpenAPIv3 schema" in o for o in out) == 4


def test_message_expression_undefined_field():
    schema = spec(x={"type": "object", "properties": {"a": {"type": "integer"}},
                     "x-kubernetes-validations": [{"rule": "self.a > 0", "messageExpression": "'bad ' + string(self.b)"}]})
    out = msgs(schema)
    assert len(out) == 1
    assert out[0].startswith(f"{P}.properties[spec].properties[x].x-kubernetes-validations[0].messageExpression: Invalid value: ")
    assert "messageExpression compilation failed: ERROR: <input>:1:21: undefined field 'b'" in out[0]


def test_default_must_satisfy_the_rules_of_its_schema():
    schema = spec(r={"type": "integer", "default": 3, "x-kubernetes-validations": [{"rule": "self > 5", "message": "too small"}]})
    assert msgs(schema) == [f'{P}.properties[spec].properties[r].default: Invalid value: "integer": too small']
    ok = spec(r={"type": "integer", "default": 7, "x-kubernetes-validations": [{"rule": "self > 5", "message": "too small"}]})
    assert msgs(ok) == []
