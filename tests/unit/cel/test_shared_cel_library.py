"""The Kubernetes CEL libraries are one library: the admission (VAP)
environment and the CRD rule environment answer alike."""

import pytest

from kubeplane.admission.cel import BOOL, EvalError, Evaluation, compile_expression
from kubeplane.apiextensions.schema import ResourceSchema
from kubeplane.auth.user import SYSTEM_ADMIN
from kubeplane.cel import library


def _vap(expr: str, obj=None):
    data = {"object": obj or {}, "oldObject": None, "request": {}, "namespaceObject": None}
    return compile_expression(expr, (BOOL,)).evaluate(Evaluation(data, SYSTEM_ADMIN))


def _crd_errors(rule: str, value: dict) -> list[str]:
    schema = {"type": "object", "properties": {"spec": {"type": "object", "x-kubernetes-validations": [{"rule": rule}],
                                                        "properties": {"name": {"type": "string"}}}}}
    return [f"{c.field} {c.message}" for c in ResourceSchema(schema).validate({"spec": value})]


SHARED = [
    "'abc42'.find('[0-9]+') == '42' && 'abc'.findAll('[a-z]', 2) == ['a', 'b']",
    "ip.isCanonical('::1') && !ip.isCanonical('0:0::1') && !isIP('::ffff:1.2.3.4') && !isIP('01.2.3.4')",
    "cidr('10.1.2.3/8').ip() == ip('10.1.2.3') && ip('8.8.8.8').isGlobalUnicast()",
    "[quantity('1Gi'), quantity('2Gi')].isSorted() && [1.5, 2.5].sum() == 4.0",
]


@pytest.mark.parametrize("expr", SHARED)
def test_both_environments_have_the_libraries(expr: str) -> None:
    assert _vap(expr) is True
    assert _crd_errors(expr, {"name": "x"}) == []


def test_runtime_errors_in_the_same_words() -> None:
    with pytest.raises(EvalError, match="^modulus by zero$"):
        _vap("1 % object.z == 1", {"z": 0})
    assert library.runtime_message("INVALID_ARGUMENT: modulus by zero [OUT_OF_RANGE]") == "modulus by zero"
    assert library.runtime_message('Key not found in map : "x"') == "no such key: x"


def test_list_sum_refuses_mixed_values() -> None:
    with pytest.raises(ValueError, match="no such overload"):
        library.list_sum([1, "a"])
    assert library.list_sum([]) == 0
