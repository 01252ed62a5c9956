"""x-kubernetes-validations evaluated on custom resources, with upstream's messages."""

import pytest

from kubeplane.apiextensions.schema import ResourceSchema


def spec_rules(rules, **props):
    return {"type": "object", "properties": {"spec": {
        "type": "object", "properties": props or {"a": {"type": "integer"}, "b": {"type": "integer"}, "name": {"type": "string"}},
        "x-kubernetes-validations": rules}}}


def errors(schema, value, old=None):
    return [f"{c.reason} {c.field}: {c.message}" for c in ResourceSchema(schema).validate(value, old)]


def test_rule_with_message():
    s = spec_rules([{"rule": "self.a <= self.b", "message": "a must not exceed b"}])
    assert errors(s, {"spec": {"a": 1, "b": 2}}) == []
    assert errors(s, {"spec": {"a": 3, "b": 2}}) == ['FieldValueInvalid spec: Invalid value: "object": a must not exceed b']


def test_rule_without_message():
    s = spec_rules([{"rule": "self.a > 0"}])
    assert errors(s, {"spec": {"a": 0}}) == ['FieldValueInvalid spec: Invalid value: "object": failed rule: self.a > 0']


def test_message_expression():
    s = spec_rules([{"rule": "self.a > 0", "message": "static", "messageExpression": "'a is ' + string(self.a)"}])
    assert errors(s, {"spec": {"a": -1}}) == ['FieldValueInvalid spec: Invalid value: "object": a is -1']


def test_message_expression_error_falls_back_to_message():
    s = spec_rules([{"rule": "self.a > 0", "message": "static", "messageExpression": "self.name"}])
    assert errors(s, {"spec": {"a": -1}}) == ['FieldValueInvalid spec: Invalid value: "object": static']


@pytest.mark.parametrize("reason,expected", [
    ("FieldValueForbidden", "FieldValueForbidden spec: Forbidden: nope"),
    ("FieldValueRequired", "FieldValueRequired spec: Required value: nope"),
    ("FieldValueDuplicate", 'FieldValueDuplicate spec: Duplicate value: "object"'),
    ("FieldValueInvalid", 'FieldValueInvalid spec: Invalid value: "object": nope'),
])
def test_reason(reason, expected):
    s = spec_rules([{"rule": "false", "message": "nope", "reason": reason}])
    assert errors(s, {"spec": {}}) == [expected]


def test_field_path():
    s = spec_rules([{"rule": "self.a > 0", "message": "bad a", "fieldPath": ".a"}])
    assert errors(s, {"spec": {"a": 0}}) == ['FieldValueInvalid spec.a: Invalid value: "object": bad a']


def test_rule_on_scalar_field():
    s = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "replicas": {"type": "integer", "x-kubernetes-validations": [{"rule": "self % 2 == 0", "message": "even"}]}}}}}
    assert errors(s, {"spec": {"replicas": 3}}) == ['FieldValueInvalid spec.replicas: Invalid value: "integer": even']
    assert errors(s, {"spec": {"replicas": 4}}) == []


def test_transition_rule_only_with_old():
    s = spec_rules([{"rule": "self.name == oldSelf.name", "message": "name is immutable"}])
    assert errors(s, {"spec": {"name": "a"}}) == []
    assert errors(s, {"spec": {"name": "a"}}, {"spec": {"name": "b"}}) == [
        'FieldValueInvalid spec: Invalid value: "object": name is immutable']
    assert errors(s, {"spec": {"name": "a"}}, {"spec": {"name": "a"}}) == []


def test_optional_old_self():
    s = spec_rules([{"rule": "!oldSelf.hasValue() || self.a >= oldSelf.value().a", "message": "a may only grow",
                     "optionalOldSelf": True}])
    assert errors(s, {"spec": {"a": 1}}) == []
    assert errors(s, {"spec": {"a": 3}}, {"spec": {"a": 2}}) == []
    assert errors(s, {"spec": {"a": 1}}, {"spec": {"a": 2}}) == ['FieldValueInvalid spec: Invalid value: "object": a may only grow']


def test_rules_on_map_values_and_list_items_paths():
    s = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "m": {"type": "object", "additionalProperties": {"type": "string", "x-kubernetes-validations": [{"rule": "self != 'x'"}]}},
        "l": {"type": "array", "items": {"type": "integer", "x-kubernetes-validations": [{"rule": "self > 0"}]}},
    }}}}
    assert errors(s, {"spec": {"m": {"k": "x"}, "l": [1, 0]}}) == [
        'FieldValueInvalid spec.m[k]: Invalid value: "string": failed rule: self != \'x\'',
        'FieldValueInvalid spec.l[1]: Invalid value: "integer": failed rule: self > 0',
    ]


def test_root_rule_sees_metadata_name():
    s = {"type": "object", "properties": {"spec": {"type": "object"}},
         "x-kubernetes-validations": [{"rule": "self.metadata.name.startsWith('ok')", "message": "bad name"}]}
    assert errors(s, {"metadata": {"name": "okay"}, "spec": {}}) == []
    assert errors(s, {"metadata": {"name": "no"}, "spec": {}}) == ['FieldValueInvalid <nil>: Invalid value: "object": bad name']


def test_runtime_error_is_reported():
    s = spec_rules([{"rule": "self.a > 0"}])
    assert errors(s, {"spec": {}}) == ['FieldValueInvalid spec: Invalid value: "object": no such key: a evaluating rule: self.a > 0']


def test_null_value_skips_rules():
    s = {"type": "object", "properties": {"spec": {"type": "object", "nullable": True,
                                                   "x-kubernetes-validations": [{"rule": "false"}]}}}
    assert errors(s, {"spec": None}) == []


@pytest.mark.parametrize("rule", [
    "self.name.matches('^[a-z0-9]+$')",
    "self.name.find('[0-9]+') == '42'",
    "self.name.findAll('[a-z]').size() == 3",
    "[1, 2, 3].isSorted() && [1, 2].sum() == 3 && [4, 2].min() == 2 && [4, 2].max() == 4",
    "quantity('1Gi').isGreaterThan(quantity('1M'))",
    "isURL('https://x.example/a') && url('https://x.example:8080/p').getPort() == '8080'",
    "isIP('10.0.0.1') && cidr('10.0.0.0/8').containsIP('10.1.2.3') && ip('::1').family() == 6",
    "self.name.lowerAscii() == 'abc42'.lowerAscii() || self.name.size() > 0",
    "self.all(k, k.size() > 0)",
])
def test_kubernetes_libraries(rule):
    s = spec_rules([{"rule": rule}])
    assert errors(s, {"spec": {"name": "abc42"}}) == []


def test_runtime_cost_budget_stops_unbounded_work():
    s = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "l": {"type": "array", "items": {"type": "integer"},
              "x-kubernetes-validations": [{"rule": "self.all(x, self.all(y, x != y || true))"}]}}}}}
    out = errors(s, {"spec": {"l": list(range(5000))}})
    assert out == ["FieldValueInvalid spec.l: Invalid value: \"array\": 'operation cancelled: actual cost limit exceeded': "
                   "no further validation rules will be run due to call cost exceeds limit for rule: "
                   "self.all(x, self.all(y, x != y || true))"]
    assert errors(s, {"spec": {"l": list(range(20))}}) == []


def test_transition_rule_on_list_map_items_correlates_by_key():
    s = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "l": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k"],
              "items": {"type": "object", "required": ["k"], "properties": {"k": {"type": "string"}, "v": {"type": "integer"}},
                        "x-kubernetes-validations": [{"rule": "self.v >= oldSelf.v", "message": "v may only grow"}]}}}}}}
    new = {"spec": {"l": [{"k": "b", "v": 1}, {"k": "a", "v": 5}]}}
    old = {"spec": {"l": [{"k": "a", "v": 4}, {"k": "b", "v": 2}]}}
    assert errors(s, new, old) == ['FieldValueInvalid spec.l[0]: Invalid value: "object": v may only grow']


def test_escaped_property_names():
    s = spec_rules([{"rule": "self.__namespace__ == 'a' && self.foo__dash__bar == 1 && self.x__dot__y", "message": "m"}],
                   namespace={"type": "string"}, **{"foo-bar": {"type": "integer"}, "x.y": {"type": "boolean"}})
    assert errors(s, {"spec": {"namespace": "a", "foo-bar": 1, "x.y": True}}) == []
    assert errors(s, {"spec": {"namespace": "b", "foo-bar": 1, "x.y": True}}) == ['FieldValueInvalid spec: Invalid value: "object": m']


def test_number_fields_are_doubles():
    s = spec_rules([{"rule": "self.ratio + 0.5 > 1.0"}], ratio={"type": "number"})
    assert errors(s, {"spec": {"ratio": 1}}) == []
    scalar = {"type": "object", "properties": {"r": {"type": "number", "x-kubernetes-validations": [{"rule": "self * 2.0 == 2.0"}]}}}
    assert errors(scalar, {"r": 1}) == []


def test_rules_not_run_after_blocking_schema_errors():
    s = spec_rules([{"rule": "self.a > 100", "message": "never shown"}], a={"type": "integer"}, e={"type": "string", "enum": ["x"]})
    assert errors(s, {"spec": {"a": 1, "e": "y"}}) == [
        'FieldValueNotSupported spec.e: Unsupported value: "y": supported values: "x"',
        'FieldValueInvalid <nil>: Invalid value: "null": some validation rules were not checked because the object was '
        'invalid; correct the existing errors to complete validation',
    ]
    # a non-blocking error (a bound) still lets the rules run
    s2 = spec_rules([{"rule": "self.a > 100", "message": "shown"}], a={"type": "integer", "maximum": 0})
    assert errors(s2, {"spec": {"a": 1}}) == [
        "FieldValueInvalid spec.a: Invalid value: 1: spec.a in body should be less than or equal to 0",
        'FieldValueInvalid spec: Invalid value: "object": shown',
    ]


def test_optional_old_self_is_an_optional_value():
    s = spec_rules([{"rule": "oldSelf.?a.orValue(0) <= self.a", "message": "a may only grow", "optionalOldSelf": True}])
    assert errors(s, {"spec": {"a": 1}}) == []
    assert errors(s, {"spec": {"a": 1}}, {"spec": {"a": 2}}) == ['FieldValueInvalid spec: Invalid value: "object": a may only grow']


def test_optional_old_self_compile_error_points_into_the_rule():
    from kubeplane.apiextensions.structural import check_crd_schema

    s = spec_rules([{"rule": "oldSelf.hasValue() &&", "optionalOldSelf": True}])
    out = [c.message for c in check_crd_schema(s, "p")]
    assert len(out) == 1
    assert "compilation failed: ERROR: <input>:1:22: Syntax error" in out[0]
    assert "\n | oldSelf.hasValue() &&\n | .....................^" in out[0]


def test_optional_field_selection():
    s = spec_rules([{"rule": "self.?name.orValue('none') != 'bad'"}])
    assert errors(s, {"spec": {}}) == []
    assert errors(s, {"spec": {"name": "bad"}}) != []


def test_integral_float_for_an_integer_field():
    s = {"type": "object", "properties": {"r": {"type": "integer", "x-kubernetes-validations": [{"rule": "self % 2 == 0"}]}}}
    assert errors(s, {"r": 4.0}) == []
    assert errors(s, {"r": 3.0}) == ['FieldValueInvalid r: Invalid value: "integer": failed rule: self % 2 == 0']
