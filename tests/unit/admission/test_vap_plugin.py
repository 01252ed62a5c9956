"""The ValidatingAdmissionPolicy plugin in a registry: matching, bindings,
params, validation actions, failurePolicy, audit annotations and status."""

from __future__ import annotations

import pytest

from kubeplane.admission.policy import AUDIT_FAILURE_KEY
from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.api.warning import collecting
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.auth.authorizer import Decision
from kubeplane.auth.user import UserInfo, acting_as
from kubeplane.registry.admission import AdmissionChain, AdmissionPlugin, default_chain
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

VAP = resource("validatingadmissionpolicies", "admissionregistration.k8s.io")
VAPB = resource("validatingadmissionpolicybindings", "admissionregistration.k8s.io")
DEPLOY = resource("deployments", "apps")
CM = resource("configmaps")
NS = resource("namespaces")


class Recorder(AdmissionPlugin):
    """Keeps the admission records the chain hands its validating plugins."""

    name = "Recorder"

    def __init__(self) -> None:
        self.records = []

    def handles(self, operation, res):
        return True

    async def validate(self, attrs):
        self.records.append(attrs)


@pytest.fixture
async def env():
    store = MemoryStore(history=1000)
    recorder = Recorder()
    chain = default_chain(store)
    registry = Registry(store, CATALOGUE, admission=AdmissionChain([*chain.plugins, recorder]))
    await ensure_default_namespaces(registry)
    registry.recorder = recorder
    yield registry
    await chain.plugin("ValidatingAdmissionPolicy").close()
    await registry.close()
    await store.close()


def rules(resources=("deployments",), groups=("apps",), ops=("CREATE", "UPDATE"), **extra):
    return [{"apiGroups": list(groups), "apiVersions": ["v1"], "operations": list(ops),
             "resources": list(resources), **extra}]


async def policy(reg, name, validations, *, match=None, **spec):
    body = {"metadata": {"name": name}, "spec": {
        "matchConstraints": match or {"resourceRules": rules()}, "validations": validations, **spec}}
    return await reg.create(VAP, body)


async def binding(reg, name, policy_name, actions=("Deny",), **spec):
    return await reg.create(VAPB, {"metadata": {"name": name}, "spec": {
        "policyName": policy_name, "validationActions": list(actions), **spec}})


def deployment(name, replicas=1, labels=None, ns="default"):
    sel = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
            "spec": {"replicas": replicas, "selector": {"matchLabels": sel}, "template": {
                "metadata": {"labels": sel}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}}


async def test_deny_message_reason_and_code(env) -> None:
    await policy(env, "p", [{"expression": "object.spec.replicas <= 5"},
                            {"expression": "object.metadata.name != 'x'", "reason": "Forbidden",
                             "messageExpression": "'name ' + object.metadata.name + ' is taken'"},
                            {"expression": "object.metadata.name != 'big'", "reason": "RequestEntityTooLarge",
                             "message": "too big"}])
    await binding(env, "b", "p")
    await env.create(DEPLOY, deployment("ok", 3), "default")
    with pytest.raises(StatusError) as err:
        await env.create(DEPLOY, deployment("many", 6), "default")
    e = err.value
    text = "ValidatingAdmissionPolicy 'p' with binding 'b' denied request: failed expression: object.spec.replicas <= 5"
    assert (e.code, e.reason, e.message) == (422, "Invalid", f'deployments.apps "many" is forbidden: {text}')
    assert e.to_status()["details"] == {"name": "many", "group": "apps", "kind": "deployments",
                                        "causes": [{"message": text}]}
    with pytest.raises(StatusError) as err:
        await env.create(DEPLOY, deployment("x"), "default")
    assert (err.value.code, err.value.reason) == (403, "Forbidden")
    assert err.value.message.endswith("denied request: name x is taken")
    with pytest.raises(StatusError) as err:
        await env.create(DEPLOY, deployment("big"), "default")
    assert (err.value.code, err.value.reason) == (413, "RequestEntityTooLarge")
    assert err.value.message.endswith("denied request: too big")


async def test_a_policy_without_a_binding_does_nothing_and_changes_apply_to_the_next_request(env) -> None:
    await policy(env, "p", [{"expression": "object.spec.replicas <= 5"}])
    await env.create(DEPLOY, deployment("a", 9), "default")
    await binding(env, "b", "p")
    with pytest.raises(StatusError):
        await env.create(DEPLOY, deployment("b", 9), "default")
    await env.delete(VAPB, "b")
    await env.create(DEPLOY, deployment("c", 9), "default")


async def test_updates_see_the_old_object_and_deletes_only_the_old_one(env) -> None:
    await policy(env, "no-shrink", [
        {"expression": "request.operation != 'UPDATE' || object.spec.replicas >= oldObject.spec.replicas",
         "message": "no shrinking"},
        {"expression": "request.operation != 'DELETE' || (object == null && oldObject.metadata.name != 'keep')",
         "message": "keep stays"}],
        match={"resourceRules": rules(ops=("*",))})
    await binding(env, "b", "no-shrink")
    await env.create(DEPLOY, deployment("keep", 3), "default")
    await env.patch(DEPLOY, "keep", {"spec": {"replicas": 4}}, "default")
    with pytest.raises(StatusError, match="no shrinking"):
        await env.patch(DEPLOY, "keep", {"spec": {"replicas": 2}}, "default")
    with pytest.raises(StatusError, match="keep stays"):
        await env.delete(DEPLOY, "keep", "default")
    await env.create(DEPLOY, deployment("other", 3), "default")
    await env.delete(DEPLOY, "other", "default")


async def test_scale_is_admitted_as_the_scale_subresource(env) -> None:
    await policy(env, "scale", [{"expression": "object.spec.replicas <= 5", "message": "scale at most 5"},
                                {"expression": "request.kind.kind == 'Scale' && request.subResource == 'scale' && "
                                               "request.resource.resource == 'deployments'"}],
                 match={"resourceRules": rules(resources=("deployments/scale",))})
    await binding(env, "b", "scale")
    await env.create(DEPLOY, deployment("d", 9), "default")  # the rule names only the subresource
    with pytest.raises(StatusError, match="scale at most 5"):
        await env.update_scale(DEPLOY, "d", "default", lambda s: {**s, "spec": {"replicas": 7}})
    await env.update_scale(DEPLOY, "d", "default", lambda s: {**s, "spec": {"replicas": 4}})
    rec = env.recorder.records[-1]
    assert (rec.operation, rec.subresource, rec.obj["kind"], rec.old_obj["spec"]) == (
        "UPDATE", "scale", "Scale", {"replicas": 9})


async def test_matching_rules_scope_names_exclusions_and_selectors(env) -> None:
    match = {
        "resourceRules": rules(resources=("configmaps",), groups=("",), scope="Namespaced"),
        "excludeResourceRules": [{**rules(resources=("configmaps",), groups=("",))[0],
                                  "resourceNames": ["excluded"]}],
        "namespaceSelector": {"matchLabels": {"team": "a"}},
        "objectSelector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
    }
    await policy(env, "cm", [{"expression": "false", "message": "no"}], match=match)
    await binding(env, "b", "cm")
    await env.create(NS, {"metadata": {"name": "team-a", "labels": {"team": "a"}}})
    await env.create(NS, {"metadata": {"name": "team-b", "labels": {"team": "b"}}})
    cm = lambda name, **labels: {"metadata": {"name": name, "labels": labels}}  # noqa: E731
    with pytest.raises(StatusError, match="no"):
        await env.create(CM, cm("denied"), "team-a")
    await env.create(CM, cm("excluded"), "team-a")
    await env.create(CM, cm("skipped", skip="1"), "team-a")
    await env.create(CM, cm("other-team"), "team-b")
    await env.create(DEPLOY, deployment("not-a-configmap", ns="team-a"), "team-a")
    # the object selector matches either the new or the old object
    with pytest.raises(StatusError):
        await env.patch(CM, "skipped", {"metadata": {"labels": {"skip": None}}}, "team-a")


async def test_binding_match_resources_narrow_the_policy(env) -> None:
    await policy(env, "p", [{"expression": "false", "message": "no"}])
    await binding(env, "b", "p", matchResources={"objectSelector": {"matchLabels": {"checked": "yes"}}})
    await env.create(DEPLOY, deployment("free"), "default")
    with pytest.raises(StatusError, match="no"):
        await env.create(DEPLOY, deployment("checked", labels={"checked": "yes"}), "default")


async def test_match_policy_exact_and_equivalent(env) -> None:
    other_version = [{"apiGroups": ["apps"], "apiVersions": ["v1beta1"], "operations": ["CREATE"],
                      "resources": ["deployments"]}]
    await policy(env, "exact", [{"expression": "false", "message": "exact"}],
                 match={"resourceRules": other_version, "matchPolicy": "Exact"})
    await binding(env, "b1", "exact")
    await env.create(DEPLOY, deployment("a"), "default")
    await policy(env, "equivalent", [{"expression": "false", "message": "equivalent"}],
                 match={"resourceRules": other_version})
    await binding(env, "b2", "equivalent")
    with pytest.raises(StatusError, match="equivalent"):
        await env.create(DEPLOY, deployment("b"), "default")


async def test_params_by_name_and_selector(env) -> None:
    await env.create(CM, {"metadata": {"name": "limit", "labels": {"limits": "1"}}, "data": {"max": "3"}}, "default")
    await env.create(CM, {"metadata": {"name": "limit2", "labels": {"limits": "1"}}, "data": {"max": "2"}}, "default")
    await policy(env, "p", [{"expression": "object.spec.replicas <= int(params.data.max)",
                             "messageExpression": "'at most ' + params.data.max"}],
                 paramKind={"apiVersion": "v1", "kind": "ConfigMap"})
    await binding(env, "by-name", "p", paramRef={"name": "limit", "parameterNotFoundAction": "Deny"})
    with pytest.raises(StatusError, match="denied request: at most 3"):
        await env.create(DEPLOY, deployment("four", 4), "default")
    await env.delete(VAPB, "by-name")
    # a selector evaluates the policy once per matching param
    await binding(env, "by-selector", "p", paramRef={
        "selector": {"matchLabels": {"limits": "1"}}, "namespace": "default", "parameterNotFoundAction": "Deny"})
    with pytest.raises(StatusError, match="denied request: at most 2"):
        await env.create(DEPLOY, deployment("three", 3), "default")
    await env.create(DEPLOY, deployment("two", 2), "default")


async def test_missing_params_deny_allow_and_failure_policy(env) -> None:
    await policy(env, "p", [{"expression": "params.data.ok == 'yes'"}],
                 paramKind={"apiVersion": "v1", "kind": "ConfigMap"})
    await binding(env, "deny", "p", paramRef={"name": "absent", "parameterNotFoundAction": "Deny"})
    with pytest.raises(StatusError) as err:
        await env.create(DEPLOY, deployment("a"), "default")
    assert err.value.message.endswith(
        "ValidatingAdmissionPolicy 'p' with binding 'deny' denied request: failed to configure binding: "
        "no params found for policy binding with `Deny` parameterNotFoundAction")
    await env.delete(VAPB, "deny")
    await binding(env, "allow", "p", paramRef={"name": "absent", "parameterNotFoundAction": "Allow"})
    await env.create(DEPLOY, deployment("b"), "default")
    await env.delete(VAPB, "allow")
    # failurePolicy Ignore: the configuration error lets the request through
    await env.patch(VAP, "p", {"spec": {"failurePolicy": "Ignore"}})
    await binding(env, "deny", "p", paramRef={"name": "absent", "parameterNotFoundAction": "Deny"})
    await env.create(DEPLOY, deployment("c"), "default")


async def test_runtime_errors_follow_the_failure_policy(env) -> None:
    await policy(env, "fail", [{"expression": "object.spec.nope == 1"}])
    await binding(env, "b", "fail")
    with pytest.raises(StatusError) as err:
        await env.create(DEPLOY, deployment("a"), "default")
    assert err.value.message.endswith(
        "denied request: expression 'object.spec.nope == 1' resulted in error: no such key: nope")
    await env.patch(VAP, "fail", {"spec": {"failurePolicy": "Ignore"}})
    await env.create(DEPLOY, deployment("b"), "default")


async def test_warn_and_audit_actions(env) -> None:
    await policy(env, "p", [{"expression": "object.spec.replicas <= 1", "message": "one is enough"}],
                 auditAnnotations=[{"key": "replicas", "valueExpression": "string(object.spec.replicas)"},
                                   {"key": "never", "valueExpression": "null"}])
    await binding(env, "b", "p", actions=("Warn", "Audit"))
    with collecting() as warnings:
        await env.create(DEPLOY, deployment("two", 2), "default")
    assert warnings == ["Validation failed for ValidatingAdmissionPolicy 'p' with binding 'b': one is enough"]
    rec = [r for r in env.recorder.records if r.name == "two"][-1]
    assert rec.audit_annotations["p/replicas"] == "2" and "p/never" not in rec.audit_annotations
    import json

    assert json.loads(rec.audit_annotations[AUDIT_FAILURE_KEY]) == [{
        "message": "one is enough", "policy": "p", "binding": "b", "expressionIndex": 0,
        "validationActions": ["Warn", "Audit"]}]


async def test_match_conditions(env) -> None:
    await policy(env, "p", [{"expression": "false", "message": "no"}], matchConditions=[
        {"name": "labelled", "expression": "has(object.metadata.labels) && 'check' in object.metadata.labels"}])
    await binding(env, "b", "p")
    await env.create(DEPLOY, deployment("a"), "default")
    with pytest.raises(StatusError, match="no"):
        await env.create(DEPLOY, deployment("b", labels={"check": "1"}), "default")


async def test_request_user_namespace_object_and_authorizer(env) -> None:
    plugin = env.admission.plugin("ValidatingAdmissionPolicy")

    class NoSecrets:
        def authorize(self, attrs):
            return (Decision.DENY if attrs.resource == "secrets" else Decision.ALLOW), "secrets are off"

    plugin.authorizer = NoSecrets()
    await env.create(NS, {"metadata": {"name": "prod", "labels": {"env": "prod"}}})
    await policy(env, "p", [
        {"expression": "request.userInfo.username != 'mallory'", "message": "not mallory"},
        {"expression": "namespaceObject.metadata.labels.env != 'prod' || object.spec.replicas >= 2",
         "message": "prod needs two"},
        {"expression": "authorizer.group('').resource('secrets').namespace(request.namespace).check('get')"
                       ".allowed()", "messageExpression": "'no secrets for ' + request.userInfo.username"}])
    await binding(env, "b", "p")
    with acting_as(UserInfo("mallory")):
        with pytest.raises(StatusError, match="not mallory"):
            await env.create(DEPLOY, deployment("a", 2, ns="prod"), "prod")
    with pytest.raises(StatusError, match="prod needs two"):
        await env.create(DEPLOY, deployment("b", 1, ns="prod"), "prod")
    with acting_as(UserInfo("alice")):
        with pytest.raises(StatusError, match="no secrets for alice"):
            await env.create(DEPLOY, deployment("c", 2, ns="prod"), "prod")
    plugin.authorizer = type("Yes", (), {"authorize": lambda self, a: (Decision.ALLOW, "")})()
    await env.create(DEPLOY, deployment("d", 2, ns="prod"), "prod")


async def test_policies_do_not_apply_to_the_policy_kinds(env) -> None:
    await policy(env, "everything", [{"expression": "false"}],
                 match={"resourceRules": rules(resources=("*",), groups=("*",), ops=("*",))})
    await binding(env, "b", "everything")
    await policy(env, "another", [{"expression": "true"}])
    await binding(env, "b2", "another")
    with pytest.raises(StatusError):
        await env.create(CM, {"metadata": {"name": "x"}}, "default")


async def test_status_records_type_checking(env) -> None:
    from helpers import eventually

    from kubeplane.admission.typecheck import PolicyStatusController

    controller = PolicyStatusController(env)
    await controller.start()
    try:
        await policy(env, "typo", [{"expression": "object.spec.replicas > 0 || object.spec.replica > 0"}])
        await policy(env, "fine", [{"expression": "object.spec.replicas > 0"}])

        async def checked(name):
            status = (await env.get(VAP, name)).get("status") or {}
            return status if status.get("observedGeneration") == 1 else None

        status = await eventually(lambda: checked("typo"), what="typo type-checked")
        assert status["typeChecking"]["expressionWarnings"] == [{
            "fieldRef": "spec.validations[0].expression",
            "warning": "apps/v1, Kind=Deployment: ERROR: <input>:1:40: undefined field 'replica'\n"
                       " | object.spec.replicas > 0 || object.spec.replica > 0\n"
                       " | .......................................^"}]
        assert (await eventually(lambda: checked("fine")))["typeChecking"] == {}
        # a new generation is checked again
        await env.patch(VAP, "fine", {"spec": {"validations": [{"expression": "object.spec.nothing > 0"}]}})

        async def rechecked():
            status = (await env.get(VAP, "fine")).get("status") or {}
            return status if status.get("observedGeneration") == 2 else None

        status = await eventually(rechecked, what="fine re-checked")
        assert status["typeChecking"]["expressionWarnings"][0]["warning"].startswith(
            "apps/v1, Kind=Deployment: ERROR: <input>:1:12: undefined field 'nothing'")
    finally:
        await controller.stop()


async def test_audit_annotation_values_of_all_bindings_and_their_errors(env) -> None:
    for n in ("a", "b"):
        await env.create(CM, {"metadata": {"name": n}, "data": {"tier": n}}, "default")
    await policy(env, "p", [{"expression": "true"}], paramKind={"apiVersion": "v1", "kind": "ConfigMap"},
                 auditAnnotations=[{"key": "tier", "valueExpression": "string(params.data.tier)"}])
    await binding(env, "ba", "p", paramRef={"name": "a", "parameterNotFoundAction": "Deny"})
    await binding(env, "bb", "p", paramRef={"name": "b", "parameterNotFoundAction": "Deny"})
    await binding(env, "bb2", "p", paramRef={"name": "b", "parameterNotFoundAction": "Deny"})
    await env.create(DEPLOY, deployment("d"), "default")
    rec = [r for r in env.recorder.records if r.name == "d"][-1]
    assert rec.audit_annotations == {"p/tier": "a, b"}
    # an annotation that fails to evaluate denies under failurePolicy Fail, whatever the binding's actions
    await policy(env, "broken", [{"expression": "true"}], auditAnnotations=[
        {"key": "k", "valueExpression": "string(object.nope)"}])
    await binding(env, "warn-only", "broken", actions=("Warn",))
    with pytest.raises(StatusError, match=r"expression .string\(object.nope\). resulted in error: no such key: nope"):
        await env.create(DEPLOY, deployment("e"), "default")


async def test_a_false_match_condition_wins_over_an_error(env) -> None:
    await policy(env, "p", [{"expression": "false", "message": "no"}], matchConditions=[
        {"name": "broken", "expression": "object.metadata.labels.missing == 'x'"},
        {"name": "only-labelled", "expression": "'only' in object.metadata.labels"}])
    await binding(env, "b", "p")
    await env.create(DEPLOY, deployment("a", labels={"other": "1"}), "default")  # false + error: skipped
    with pytest.raises(StatusError) as err:
        await env.create(DEPLOY, deployment("b", labels={"only": "1"}), "default")  # true + error: failurePolicy
    assert err.value.message.endswith(
        "expression 'object.metadata.labels.missing == 'x'' resulted in error: no such key: missing")


async def test_next_request_sees_a_new_binding_with_sqlite_storage(tmp_path) -> None:
    from kubeplane.storage.sqlite import SQLiteStore

    store = await SQLiteStore.open(str(tmp_path / "db.sqlite"))
    reg = Registry(store, CATALOGUE)
    try:
        await ensure_default_namespaces(reg)
        await policy(reg, "p", [{"expression": "object.spec.replicas <= 5", "message": "at most 5"}])
        for i in range(3):
            await binding(reg, f"b{i}", "p")
            with pytest.raises(StatusError, match="binding 'b0' denied request: at most 5"):
                await reg.create(DEPLOY, deployment(f"d{i}", 9), "default")
            await reg.delete(VAPB, f"b{i}") if i else None
        await reg.delete(VAPB, "b0")
        await reg.create(DEPLOY, deployment("free", 9), "default")
    finally:
        await reg.admission.close()
        await store.close()


async def test_param_caches_live_as_long_as_a_policy_reads_the_kind(env) -> None:
    plugin = env.admission.plugin("ValidatingAdmissionPolicy")
    await policy(env, "p", [{"expression": "true"}], paramKind={"apiVersion": "v1", "kind": "ConfigMap"})
    await binding(env, "b", "p", paramRef={"name": "x", "parameterNotFoundAction": "Allow"})
    await env.create(DEPLOY, deployment("a"), "default")
    assert list(plugin.params) == [CM.storage_prefix()]
    await env.delete(VAP, "p")
    await env.create(DEPLOY, deployment("b"), "default")
    assert plugin.params == {}
