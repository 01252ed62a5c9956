"""ValidatingAdmissionPolicy and binding: v1 defaults and upstream's
validation messages and field paths, through the registry."""

from __future__ import annotations

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

VAP = resource("validatingadmissionpolicies", "admissionregistration.k8s.io")
VAPB = resource("validatingadmissionpolicybindings", "admissionregistration.k8s.io")


@pytest.fixture
async def reg():
    store = MemoryStore()
    registry = Registry(store, CATALOGUE)
    yield registry
    await registry.close()
    await store.close()


RULE = {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["deployments"]}


async def causes(coro) -> dict[str, str]:
    with pytest.raises(StatusError) as err:
        await coro
    assert err.value.code == 422
    return {c.field: c.message for c in err.value.causes}


async def test_policy_defaults_and_status(reg) -> None:
    p = await reg.create(VAP, {"metadata": {"name": "p"}, "spec": {
        "matchConstraints": {"resourceRules": [RULE]}, "validations": [{"expression": "true"}]}})
    assert p["spec"]["failurePolicy"] == "Fail"
    mc = p["spec"]["matchConstraints"]
    assert mc["matchPolicy"] == "Equivalent" and mc["namespaceSelector"] == {} and mc["objectSelector"] == {}
    assert mc["resourceRules"][0]["scope"] == "*"
    assert p["status"] == {} and p["metadata"]["generation"] == 1
    p = await reg.patch(VAP, "p", {"spec": {"validations": [{"expression": "1 == 1"}]}})
    assert p[0]["metadata"]["generation"] == 2
    # the status subresource writes the status only
    p, _ = await reg.patch(VAP, "p", {"status": {"observedGeneration": 2}, "spec": {"failurePolicy": "Ignore"}},
                           subresource="status")
    assert p["status"] == {"observedGeneration": 2} and p["spec"]["failurePolicy"] == "Fail"


async def test_policy_validation_messages(reg) -> None:
    found = await causes(reg.create(VAP, {"metadata": {"name": "p"}, "spec": {
        "failurePolicy": "Sometimes",
        "paramKind": {"apiVersion": "a/b/c", "kind": "Not_A_Kind"},
        "matchConstraints": {"resourceRules": [
            {"apiGroups": ["*", "apps"], "apiVersions": [], "operations": ["CREATE", "PATCH"], "resources": ["*/*", "x"],
             "scope": "Everywhere"}]},
        "validations": [{"expression": "object.x"}, {"expression": " ", "message": "a\nb", "reason": "Teapot"},
                        {"expression": "true", "messageExpression": "1"}],
        "auditAnnotations": [{"key": "k", "valueExpression": "1"}, {"key": "k", "valueExpression": "'v'"}],
        "variables": [{"name": "1x", "expression": "true"}],
        "matchConditions": [{"name": "", "expression": "'s'"}],
    }}))
    r = "spec.matchConstraints.resourceRules[0]"
    assert found == {
        "spec.failurePolicy": 'Unsupported value: "Sometimes": supported values: "Fail", "Ignore"',
        "spec.paramKind.apiVersion": 'Invalid value: "a/b/c": unexpected GroupVersion string: a/b/c',
        "spec.paramKind.kind": 'Invalid value: "Not_A_Kind": may have mixed case, but should otherwise match: '
                               "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start "
                               "with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',"
                               "  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')",
        f"{r}.operations[1]": 'Unsupported value: "PATCH": supported values: "*", "CONNECT", "CREATE", "DELETE", '
                              '"UPDATE"',
        f"{r}.apiGroups": 'Invalid value: []string{"*", "apps"}: if \'*\' is present, must not specify other API groups',
        f"{r}.apiVersions": "Required value",
        f"{r}.resources": 'Invalid value: []string{"*/*", "x"}: if \'*/*\' is present, must not specify other resources',
        f"{r}.scope": 'Unsupported value: "Everywhere": supported values: "*", "Cluster", "Namespaced"',
        "spec.matchConditions[0].expression": 'Invalid value: "\'s\'": must evaluate to bool',
        "spec.matchConditions[0].name": "Required value",
        "spec.variables[0].name": 'Invalid value: "1x": name is not a valid CEL identifier',
        "spec.validations[0].expression": 'Invalid value: "object.x": must evaluate to bool',
        "spec.validations[1].expression": "Required value: expression is not specified",
        "spec.validations[1].message": 'Invalid value: "a\\nb": message must not contain line breaks',
        "spec.validations[1].reason": 'Unsupported value: "Teapot": supported values: "Forbidden", "Invalid", '
                                      '"RequestEntityTooLarge", "Unauthorized"',
        "spec.validations[2].messageExpression": 'Invalid value: "1": must evaluate to string',
        "spec.auditAnnotations[0].valueExpression": 'Invalid value: "1": must evaluate to one of [string null_type]',
        "spec.auditAnnotations[1].key": 'Duplicate value: "k"',
    }


async def test_policy_needs_match_constraints_and_something_to_check(reg) -> None:
    found = await causes(reg.create(VAP, {"metadata": {"name": "p"}, "spec": {}}))
    msg = "Required value: validations or auditAnnotations must contain at least one item"
    assert found == {"spec.matchConstraints": "Required value", "spec.validations": msg,
                     "spec.auditAnnotations": msg}
    found = await causes(reg.create(VAP, {"metadata": {"name": "p"}, "spec": {
        "matchConstraints": {}, "validations": [{"expression": "true"}]}}))
    assert found == {"spec.matchConstraints.resourceRules": "Required value"}


async def test_binding_validation_messages(reg) -> None:
    found = await causes(reg.create(VAPB, {"metadata": {"name": "b"}, "spec": {
        "policyName": "Bad_Name", "validationActions": ["Deny", "Warn", "Deny", "Shout"],
        "paramRef": {"name": "a/b", "selector": {}, "parameterNotFoundAction": "Maybe"},
        "matchResources": {"matchPolicy": "Fuzzy"},
    }}))
    assert found["spec.policyName"].startswith('Invalid value: "Bad_Name": a lowercase RFC 1123 subdomain')
    assert found["spec.paramRef.name"] == "Forbidden: name and selector are mutually exclusive"
    assert found["spec.paramRef.selector"] == "Forbidden: name and selector are mutually exclusive"
    assert found["spec.paramRef.parameterNotFoundAction"] == ('Unsupported value: "Maybe": supported values: '
                                                              '"Allow", "Deny"')
    # upstream's spelling of the path
    assert found["spec.matchResouces.matchPolicy"] == ('Unsupported value: "Fuzzy": supported values: '
                                                       '"Equivalent", "Exact"')
    assert found["spec.validationActions[2]"] == 'Duplicate value: "Deny"'
    assert found["spec.validationActions[3]"] == ('Unsupported value: "Shout": supported values: "Audit", "Deny", '
                                                  '"Warn"')
    assert found["spec.validationActions"].startswith("Invalid value: []string{\"Deny\", \"Warn\", \"Deny\", "
                                                      "\"Shout\"}: must not contain both Deny and Warn")
    found = await causes(reg.create(VAPB, {"metadata": {"name": "b"}, "spec": {"paramRef": {}}}))
    assert found == {"spec.policyName": "Required value",
                     "spec.paramRef": "Required value: one of name or selector must be specified",
                     "spec.paramRef.parameterNotFoundAction": "Required value",
                     "spec.validationActions": "Required value: at least one validation action is required"}


async def test_binding_defaults(reg) -> None:
    b = await reg.create(VAPB, {"metadata": {"name": "b"}, "spec": {
        "policyName": "p", "validationActions": ["Deny"],
        "matchResources": {"resourceRules": [RULE]}}})
    mr = b["spec"]["matchResources"]
    assert mr["matchPolicy"] == "Equivalent" and mr["namespaceSelector"] == {} and mr["objectSelector"] == {}
    assert mr["resourceRules"][0]["scope"] == "*"
