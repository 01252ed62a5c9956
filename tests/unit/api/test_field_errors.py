"""One field-error constructor: every "Invalid value", "Duplicate value", ...
message prints its bad value the way upstream's field.Error does."""

import subprocess
import sys

import pytest

from kubeplane.api import errors
from kubeplane.api.errors import (
    duplicate,
    field_not_found,
    forbidden_field,
    go_repr,
    invalid_value,
    not_supported,
    required,
    too_long,
    too_many,
)


@pytest.mark.parametrize("value, shown", [
    ("v", '"v"'),
    ("é", '"é"'),
    ('say "hi"', '"say \\"hi\\""'),
    (5, "5"),
    (1.5, "1.5"),
    (True, "true"),
    (None, "null"),
    ({"b": "2", "a": "1"}, 'map[string]string{"a":"1", "b":"2"}'),
    (["x", "y"], '[]string{"x", "y"}'),
    ({"n": 1}, '{"n":1}'),
    ([1, 2], "[1,2]"),
])
def test_go_repr(value, shown):
    assert go_repr(value) == shown


@pytest.mark.parametrize("value", ["é", {"a": "1"}, ["x"], 7, None])
def test_every_constructor_prints_the_value_alike(value):
    shown = go_repr(value)
    assert invalid_value("spec.x", value, "bad").message == f"Invalid value: {shown}: bad"
    assert duplicate("spec.x", value).message == f"Duplicate value: {shown}"
    assert duplicate("spec.x", value, "twice").message == f"Duplicate value: {shown}: twice"
    assert field_not_found("spec.x", value).message == f"Not found: {shown}"
    assert not_supported("spec.x", value, ["A", "B"]).message == \
        f'Unsupported value: {shown}: supported values: "A", "B"'


def test_reasons_and_value_free_messages():
    assert required("spec.x") == errors.Cause("FieldValueRequired", "Required value", "spec.x")
    assert required("spec.x", "must be set").message == "Required value: must be set"
    assert forbidden_field("spec.x", "no").message == "Forbidden: no"
    assert too_long("spec.x", "v" * 9, 8).message == "Too long: may not be more than 8 bytes"
    assert too_many("spec.x", 9, 8) == errors.Cause(
        "FieldValueTooMany", "Too many: 9: must have at most 8 items", "spec.x")
    status = errors.invalid("Pod", "p", [invalid_value("spec.x", "v", "msg")])
    assert status.message == 'Pod "p" is invalid: spec.x: Invalid value: "v": msg'


def test_selectors_and_validation_import_each_other_without_a_circle():
    # Either module first, in a fresh interpreter: neither needs the other half-imported.
    for first, second in (("kubeplane.api.selectors", "kubeplane.api.validation"),
                          ("kubeplane.api.validation.apps", "kubeplane.api.selectors")):
        code = f"import {first}, {second}; import sys; print('kubeplane.api.validation' in sys.modules)"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
    code = "import kubeplane.api.selectors, sys; print('kubeplane.api.validation' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False"  # selectors needs only the string checks and errors
