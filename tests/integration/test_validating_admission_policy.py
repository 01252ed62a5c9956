"""ValidatingAdmissionPolicy with real kubectl against a real API server
process: a policy and binding deny a Deployment with too many replicas with
the policy's message, a Warn binding shows a kubectl warning, and a policy
with a ConfigMap paramKind reads its limit from the ConfigMap (and sees a
changed limit on the next request). Each case binds to its own namespace."""

from __future__ import annotations

import json

import pytest

from conftest import Kubectl, start_server
from helpers import eventually_sync


@pytest.fixture(scope="module")
def k(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("vap-apiserver"))
    try:
        yield Kubectl(srv.kubeconfig, tmp_path_factory.mktemp("vap-kubectl-home"))
    finally:
        srv.stop()


def _policy(name: str, validation: dict, param_kind: dict | None = None) -> dict:
    spec: dict = {
        "matchConstraints": {"resourceRules": [{
            "apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
            "resources": ["deployments"]}]},
        "validations": [validation],
    }
    if param_kind:
        spec["paramKind"] = param_kind
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name}, "spec": spec}


def _binding(name: str, policy: str, namespace: str, actions: list[str], param_ref: dict | None = None) -> dict:
    spec: dict = {"policyName": policy, "validationActions": actions, "matchResources": {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}}
    if param_ref:
        spec["paramRef"] = param_ref
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name}, "spec": spec}


def _deployment(name: str, namespace: str, replicas: int) -> dict:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}}


def _apply(k: Kubectl, *objs: dict, check: bool = True):
    return k("apply", "-f", "-", stdin="\n---\n".join(json.dumps(o) for o in objs), check=check)


def test_deny_with_the_policys_message(k: Kubectl) -> None:
    k("create", "namespace", "vap-deny")
    _apply(k, _policy("max-replicas.example.com", {
        "expression": "object.spec.replicas <= 5", "message": "replicas must be no greater than 5"}))
    _apply(k, _binding("max-replicas-binding", "max-replicas.example.com", "vap-deny", ["Deny"]))
    r = _apply(k, _deployment("big", "vap-deny", 10), check=False)
    assert r.rc != 0
    assert ("The deployments \"big\" is invalid: : ValidatingAdmissionPolicy 'max-replicas.example.com' with "
            "binding 'max-replicas-binding' denied request: replicas must be no greater than 5") in r.err, r.err
    _apply(k, _deployment("small", "vap-deny", 3))
    # an update is checked as well
    r = k("scale", "deployment", "small", "-n", "vap-deny", "--replicas=7", check=False)
    assert r.rc == 0, "scale goes through deployments/scale, which the rule does not name"
    r = k("patch", "deployment", "small", "-n", "vap-deny", "--type=merge", "-p", '{"spec":{"replicas":8}}',
          check=False)
    assert r.rc != 0 and "replicas must be no greater than 5" in r.err, r.err
    # the policy is served with its defaults and its type checking (the API server's controller writes it)
    def checked():
        out = json.loads(k("get", "validatingadmissionpolicy", "max-replicas.example.com", "-o", "json").out)
        return out if out.get("status", {}).get("observedGeneration") == 1 else None

    out = eventually_sync(checked, what="the policy type-checked")
    assert out["spec"]["failurePolicy"] == "Fail"
    assert out["spec"]["matchConstraints"]["matchPolicy"] == "Equivalent"
    assert out["status"]["typeChecking"] == {}
    table = k("get", "validatingadmissionpolicies", "max-replicas.example.com").out.splitlines()
    assert table[0].split() == ["NAME", "VALIDATIONS", "PARAMKIND", "AGE"]
    assert table[1].split()[:3] == ["max-replicas.example.com", "1", "<unset>"]
    table = k("get", "validatingadmissionpolicybindings", "max-replicas-binding").out.splitlines()
    assert table[0].split() == ["NAME", "POLICYNAME", "PARAMREF", "AGE"]
    assert table[1].split()[:3] == ["max-replicas-binding", "max-replicas.example.com", "<unset>"]


def test_warn_action_shows_a_kubectl_warning(k: Kubectl) -> None:
    k("create", "namespace", "vap-warn")
    _apply(k, _policy("warn-replicas.example.com", {
        "expression": "object.spec.replicas <= 2",
        "messageExpression": "'replicas ' + string(object.spec.replicas) + ' exceed 2'"}))
    _apply(k, _binding("warn-replicas-binding", "warn-replicas.example.com", "vap-warn", ["Warn", "Audit"]))
    r = _apply(k, _deployment("warned", "vap-warn", 4))
    assert ("Warning: Validation failed for ValidatingAdmissionPolicy 'warn-replicas.example.com' with binding "
            "'warn-replicas-binding': replicas 4 exceed 2") in r.err, r.err
    assert k("get", "deployment", "warned", "-n", "vap-warn", "-o", "jsonpath={.spec.replicas}").out == "4"


def test_param_kind_with_a_configmap(k: Kubectl) -> None:
    k("create", "namespace", "vap-params")
    k("create", "configmap", "replica-limit", "-n", "vap-params", "--from-literal=maxReplicas=3")
    _apply(k, _policy("param-replicas.example.com", {
        "expression": "object.spec.replicas <= int(params.data.maxReplicas)",
        "messageExpression": "'at most ' + params.data.maxReplicas + ' replicas'", "reason": "Forbidden"},
        param_kind={"apiVersion": "v1", "kind": "ConfigMap"}))
    _apply(k, _binding("param-replicas-binding", "param-replicas.example.com", "vap-params", ["Deny"], {
        "name": "replica-limit", "parameterNotFoundAction": "Deny"}))
    assert k("get", "validatingadmissionpolicybinding", "param-replicas-binding", "--no-headers").out.split()[2] \
        == "*/replica-limit"
    r = _apply(k, _deployment("four", "vap-params", 4), check=False)
    assert r.rc != 0
    assert ("deployments.apps \"four\" is forbidden: ValidatingAdmissionPolicy 'param-replicas.example.com' with "
            "binding 'param-replicas-binding' denied request: at most 3 replicas") in r.err, r.err
    # the new limit applies to the next request
    k("patch", "configmap", "replica-limit", "-n", "vap-params", "--type=merge", "-p", '{"data":{"maxReplicas":"5"}}')
    _apply(k, _deployment("four", "vap-params", 4))
    # without its param the binding denies (parameterNotFoundAction Deny)
    k("delete", "configmap", "replica-limit", "-n", "vap-params")
    r = _apply(k, _deployment("five", "vap-params", 1), check=False)
    assert r.rc != 0
    assert ("ValidatingAdmissionPolicy 'param-replicas.example.com' with binding 'param-replicas-binding' denied "
            "request: failed to configure binding: no params found for policy binding with `Deny` "
            "parameterNotFoundAction") in r.err, r.err
