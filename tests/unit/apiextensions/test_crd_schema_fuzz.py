"""Arbitrary schemas and objects never crash the schema library."""

import random

from kubeplane.apiextensions.schema import ResourceSchema
from kubeplane.apiextensions.structural import check_crd_schema

KEYS = ["type", "properties", "items", "additionalProperties", "required", "enum", "default", "nullable",
        "pattern", "format", "minimum", "maximum", "maxLength", "minItems", "maxItems", "allOf", "anyOf",
        "oneOf", "not", "x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource",
        "x-kubernetes-int-or-string", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type", "x-kubernetes-validations", "$ref", "uniqueItems", "multipleOf"]
TYPES = ["object", "array", "string", "integer", "number", "boolean", "null", "bogus", 3, None]


def rand_value(r, depth=0):
    k = r.randrange(8 if depth < 3 else 5)
    if k == 0:
        return None
    if k == 1:
        return r.choice([True, False])
    if k == 2:
        return r.choice([0, -1, 7, 2**63, 1.5, float("1e300")])
    if k in (3, 4):
        return r.choice(["", "a", "(a", "^x$", "self > 0", "self.a", "1.2.3.4", "map", "set"])
    if k == 5:
        return [rand_value(r, depth + 1) for _ in range(r.randrange(3))]
    return {r.choice(["a", "b", "spec", "metadata", "kind"]): rand_value(r, depth + 1) for _ in range(r.randrange(3))}


def rand_schema(r, depth=0):
    s = {}
    for key in r.sample(KEYS, r.randrange(1, 6)):
        if key == "type":
            s[key] = r.choice(TYPES)
        elif key == "properties" and depth < 4:
            s[key] = {r.choice(["a", "b", "spec", "metadata", "name"]): rand_schema(r, depth + 1) for _ in range(r.randrange(3))}
        elif key in ("items", "additionalProperties", "not") and depth < 4:
            s[key] = rand_schema(r, depth + 1) if r.random() < 0.8 else rand_value(r)
        elif key in ("allOf", "anyOf", "oneOf") and depth < 4:
            s[key] = [rand_schema(r, depth + 1) for _ in range(r.randrange(3))]
        elif key == "x-kubernetes-validations":
            s[key] = [{"rule": r.choice(["self > 0", "self.a == oldSelf.a", "self.all(x, true)", "(", "true"]),
                       "message": r.choice(["", "m", None])} for _ in range(r.randrange(3))]
        else:
            s[key] = rand_value(r)
    return s


def test_random_schemas_and_objects_never_crash():
    r = random.Random(1234)
    for _ in range(400):
        schema = rand_schema(r)
        check_crd_schema(schema, "s")
        root = {"type": "object", "properties": {"spec": schema}}
        check_crd_schema(root, "s")
        rs = ResourceSchema(root)
        for _ in range(3):
            obj = {"spec": rand_value(r)}
            old = {"spec": rand_value(r)}
            rs.prune(obj)
            rs.default(obj)
            rs.validate(obj, old)


def _nested_dict(depth):
    top = x = {}
    for _ in range(depth):
        x["a"] = {}
        x = x["a"]
    return top


def _nested_list(depth):
    top = y = []
    for _ in range(depth):
        y.append([])
        y = y[0]
    return top


def test_objects_nested_as_deep_as_json_allows_do_not_crash():
    schema = {"type": "object", "properties": {
        "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "properties": {
            "l": {"type": "array", "x-kubernetes-list-type": "set",
                  "items": {"type": "object", "x-kubernetes-map-type": "atomic", "x-kubernetes-preserve-unknown-fields": True}}}},
        "m": {"type": "object", "additionalProperties": True},
        "n": {"type": "array", "items": {"type": "array", "items": {"type": "string"}}}},
        "x-kubernetes-validations": [{"rule": "has(self.spec)"}]}
    rs = ResourceSchema(schema)
    deep, deep_list = _nested_dict(1000), _nested_list(1000)
    for obj in ({"spec": {"deep": deep, "l": [deep, deep]}}, {"m": {"k": deep_list}}, {"n": deep_list}, {"spec": deep}):
        rs.prune(obj)
        rs.default(obj)
        assert isinstance(rs.validate(obj), list)
    obj = {"m": {"k": [[[{"x": 1}]]]}}
    assert rs.prune(obj) == ["m.k[0][0][0].x"]


def test_deeply_nested_schema_is_rejected_not_crashing():
    schema = inner = {"type": "object", "properties": {}}
    for _ in range(600):
        nxt = {"type": "object", "properties": {}}
        inner["properties"]["a"] = nxt
        inner = nxt
    out = check_crd_schema(schema, "s")
    assert [f"{c.field}: {c.message}" for c in out] == ["s: Forbidden: must not be nested more than 128 levels deep"]


RULES = ["self > 0", "self.a == oldSelf.a", "self.all(x, true)", "(", "true", "self.size() > 1",
         "oldSelf.?a.orValue(1) == 1", "self.x.y.z", 'self.matches("(a")', 'self.find("[")', "quantity(self) > 1",
         'url(self).getHost() == ""', "ip(self).family() == 4", "self.sum() > 1", "self.isSorted()", "1/0 == 1",
         "self[0] == 1"]


def test_random_rules_on_random_values_never_crash():
    r = random.Random(99)
    for _ in range(300):
        schema = rand_schema(r)
        schema["x-kubernetes-validations"] = [
            {"rule": r.choice(RULES), "optionalOldSelf": r.choice([None, True]),
             "messageExpression": r.choice([None, "string(self)", "self"])} for _ in range(2)]
        root = {"type": "object", "properties": {"spec": schema}}
        check_crd_schema(root, "s", status_subresource=r.random() < 0.5)
        rs = ResourceSchema(root)
        for _ in range(2):
            obj, old = {"spec": rand_value(r)}, {"spec": rand_value(r)}
            rs.prune(obj)
            rs.default(obj)
            assert isinstance(rs.validate(obj, old, []), list)
            assert isinstance(rs.validate(obj), list)
