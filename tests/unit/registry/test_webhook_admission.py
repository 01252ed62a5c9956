"""Admission webhooks in the registry: rule matching, the AdmissionReview sent,
patches, reinvocation, failure policies, dryRun, selectors, matchConditions,
warnings and the configuration cache. The webhook calls go to a fake client
(the HTTPS client has tests of its own)."""

from __future__ import annotations

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.api.warning import collecting as recording
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.auth.user import UserInfo, acting_as
from kubeplane.registry.admission import (
    AdmissionChain,
    Attributes,
    DefaultStorageClass,
    NamespaceLifecycle,
)
from kubeplane.registry.admissionrules import Rule
from kubeplane.registry.registry import Registry
from kubeplane.registry.webhookclient import CallError
from kubeplane.registry.webhooks import (
    MutatingAdmissionWebhook,
    ValidatingAdmissionWebhook,
    WebhookSource,
    build_review,
    verify_response,
)
from kubeplane.storage.memory import MemoryStore

CMS = resource("configmaps")
PODS = resource("pods")
NAMESPACES = resource("namespaces")
DEPLOYMENTS = resource("deployments")
MWC = resource("mutatingwebhookconfigurations")
VWC = resource("validatingwebhookconfigurations")


class FakeClient:
    """Answers each review with ``handlers[webhook name](request)``."""

    def __init__(self) -> None:
        self.handlers: dict = {}
        self.calls: list[tuple[str, dict]] = []

    async def post(self, hook, review):
        req = review["request"]
        self.calls.append((hook.name, review))
        handler = self.handlers.get(hook.name, lambda r: {"allowed": True})
        result = handler(req)
        if isinstance(result, Exception):
            raise result
        response = {"uid": req["uid"], **result}
        if isinstance(response.get("patch"), list):
            import base64

            import orjson

            response["patch"] = base64.b64encode(orjson.dumps(response["patch"])).decode()
            response.setdefault("patchType", "JSONPatch")
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}

    async def close(self) -> None:
        pass

    def names(self) -> list[str]:
        return [n for n, _ in self.calls]


@pytest.fixture
async def env():
    store = MemoryStore()
    client = FakeClient()
    source = WebhookSource(store)
    chain = AdmissionChain([NamespaceLifecycle(store), DefaultStorageClass(store),
                            MutatingAdmissionWebhook(source, store, client),
                            ValidatingAdmissionWebhook(source, store, client)])
    registry = Registry(store, CATALOGUE, admission=chain)
    await ensure_default_namespaces(registry)
    yield registry, client
    await registry.close()
    await store.close()


def hook(name: str, *, resources=("configmaps",), operations=("*",), groups=("",), versions=("v1",),
         **kw) -> dict:
    out = {"name": name, "sideEffects": "None", "admissionReviewVersions": ["v1"],
           "clientConfig": {"url": "https://127.0.0.1:1/x"},
           "rules": [{"operations": list(operations), "apiGroups": list(groups), "apiVersions": list(versions),
                      "resources": list(resources)}]}
    out.update(kw)
    return out


async def install(registry, kind, name, *hooks):
    res = MWC if kind == "mutating" else VWC
    return await registry.create(res, {"metadata": {"name": name}, "webhooks": list(hooks)})


def cm(name, labels=None, data=None):
    return {"metadata": {"name": name, **({"labels": labels} if labels else {})}, **({"data": data} if data else {})}


# -- rules ----------------------------------------------------------------------


def attrs(op="CREATE", res=CMS, ns="default", sub="", name="x"):
    return Attributes(op, res, name, ns, {}, None, sub)


def matches(rule, a):
    """The shared rule matcher, as the webhook plugin asks it."""
    return rule.matches(a.operation, a.resource, a.namespace or "", a.subresource or "")


def test_rule_matching():
    r = Rule.from_dict({"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                        "resources": ["configmaps"]})
    assert matches(r, attrs())
    assert not matches(r, attrs("UPDATE"))
    assert not matches(r, attrs(res=PODS))
    assert not matches(r, attrs(res=DEPLOYMENTS))
    assert not matches(r, attrs(sub="status"))  # a resource without "/x" is the main resource only
    star = Rule.from_dict({"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"]})
    assert matches(star, attrs(res=DEPLOYMENTS, op="DELETE"))
    assert not matches(star, attrs(res=PODS, sub="status"))
    status = Rule.from_dict({"operations": ["UPDATE"], "apiGroups": ["*"], "apiVersions": ["*"],
                             "resources": ["*/status"]})
    assert matches(status, attrs("UPDATE", PODS, sub="status")) and not matches(status, attrs("UPDATE", PODS))
    pods_all = Rule.from_dict({"operations": ["*"], "apiGroups": [""], "apiVersions": ["v1"],
                               "resources": ["pods/*"]})
    # as upstream's matcher: a "*" subresource also matches the main resource
    assert matches(pods_all, attrs("CREATE", PODS, sub="binding")) and matches(pods_all, attrs("CREATE", PODS))
    assert not matches(pods_all, attrs("CREATE", CMS))
    both = Rule.from_dict({"operations": ["*"], "apiGroups": ["apps"], "apiVersions": ["v1"],
                           "resources": ["deployments", "deployments/scale"]})
    assert matches(both, attrs("UPDATE", DEPLOYMENTS, sub="scale")) and matches(both, attrs("UPDATE", DEPLOYMENTS))


def test_rule_scope():
    def scoped(scope):
        return Rule(("*",), ("*",), ("*",), (("*", ""),), scope)

    assert matches(scoped("Namespaced"), attrs()) and not matches(scoped("Cluster"), attrs())
    node = attrs(res=resource("nodes"), ns=None)
    assert matches(scoped("Cluster"), node) and not matches(scoped("Namespaced"), node)
    # a Namespace object is cluster-scoped, though its requests name a namespace
    ns = attrs(res=NAMESPACES, ns="team", name="team")
    assert matches(scoped("Cluster"), ns) and not matches(scoped("Namespaced"), ns)
    assert matches(scoped("*"), ns) and matches(scoped("*"), attrs())


# -- the review ---------------------------------------------------------------------


async def test_review_fields_for_create_update_delete(env):
    registry, client = env
    await install(registry, "validating", "v", hook("v.example.com"))
    alice = UserInfo("alice", uid="u1", groups=("dev", "system:authenticated"), extra={"k": ("a",)})
    with acting_as(alice):
        await registry.create(CMS, cm("c", data={"a": "1"}), "default", field_manager="kubectl")
        await registry.update(CMS, cm("c", data={"a": "2"}), namespace="default")
        await registry.delete(CMS, "c", "default", propagation_policy="Background")
    create, update, delete = (review["request"] for _, review in client.calls)
    assert create["operation"] == "CREATE" and create["name"] == "c" and create["namespace"] == "default"
    assert create["kind"] == {"group": "", "version": "v1", "kind": "ConfigMap"}
    assert create["resource"] == create["requestResource"] == {"group": "", "version": "v1", "resource": "configmaps"}
    assert create["object"]["data"] == {"a": "1"} and create["oldObject"] is None
    assert create["userInfo"] == {"username": "alice", "uid": "u1", "groups": ["dev", "system:authenticated"],
                                  "extra": {"k": ["a"]}}
    assert create["options"] == {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1", "fieldManager": "kubectl"}
    assert create["dryRun"] is False and "subResource" not in create
    assert update["operation"] == "UPDATE" and update["oldObject"]["data"] == {"a": "1"}
    assert update["object"]["data"] == {"a": "2"} and update["options"]["kind"] == "UpdateOptions"
    assert delete["operation"] == "DELETE" and delete["object"] is None
    assert delete["oldObject"]["data"] == {"a": "2"}
    assert delete["options"] == {"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1",
                                 "propagationPolicy": "Background"}
    assert len({r["request"]["uid"] for _, r in client.calls}) == 3


async def test_subresources_are_admitted_with_their_kinds(env):
    registry, client = env
    await install(registry, "validating", "v", hook("v.example.com", groups=("*",), versions=("*",), resources=(
        "pods/status", "pods/binding", "deployments/scale")))
    await registry.create(PODS, {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
                          "default")
    await registry.update(PODS, {"metadata": {"name": "p"}, "status": {"phase": "Running"}}, namespace="default",
                          subresource="status")
    await registry.bind("p", "default", {"metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n1"}})
    await registry.create(DEPLOYMENTS, {"metadata": {"name": "d"}, "spec": {
        "selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {
            "containers": [{"name": "c", "image": "i"}]}}}}, "default")
    await registry.update_scale(DEPLOYMENTS, "d", "default", lambda s: {**s, "spec": {"replicas": 3}})
    reqs = [r["request"] for _, r in client.calls]
    assert [(r["operation"], r["resource"]["resource"], r.get("subResource")) for r in reqs] == [
        ("UPDATE", "pods", "status"), ("CREATE", "pods", "binding"), ("UPDATE", "deployments", "scale")]
    assert reqs[0]["kind"]["kind"] == "Pod" and reqs[0]["object"]["status"]["phase"] == "Running"
    assert reqs[1]["kind"] == {"group": "", "version": "v1", "kind": "Binding"}
    assert reqs[1]["object"]["target"]["name"] == "n1"
    assert reqs[2]["kind"] == {"group": "autoscaling", "version": "v1", "kind": "Scale"}
    assert reqs[2]["object"]["spec"]["replicas"] == 3 and reqs[2]["oldObject"]["spec"]["replicas"] == 1


async def test_deletecollection_items_are_admitted_without_a_name(env):
    registry, client = env
    await registry.create(CMS, cm("a"), "default")
    await install(registry, "validating", "v", hook("v.example.com", operations=("DELETE",)))
    await registry.delete(CMS, "a", "default", collection=True)
    (_, review), = client.calls
    assert "name" not in review["request"] and review["request"]["oldObject"]["metadata"]["name"] == "a"


# -- mutation -----------------------------------------------------------------------------


async def test_patch_is_applied_defaulted_and_validated(env):
    registry, client = env
    await install(registry, "mutating", "m", hook("m.example.com", resources=("pods",)))
    client.handlers["m.example.com"] = lambda r: {"allowed": True, "patch": [
        {"op": "add", "path": "/spec/containers/-", "value": {"name": "sidecar", "image": "side:latest"}}]}
    pod = await registry.create(PODS, {"metadata": {"name": "p"}, "spec": {
        "containers": [{"name": "c", "image": "i:1"}]}}, "default")
    side = pod["spec"]["containers"][1]
    assert side["name"] == "sidecar"
    assert side["imagePullPolicy"] == "Always"  # the patched object is defaulted again
    assert pod["metadata"]["uid"]
    client.handlers["m.example.com"] = lambda r: {"allowed": True, "patch": [
        {"op": "replace", "path": "/spec/containers/0/name", "value": "Not A Name"}]}
    with pytest.raises(StatusError) as exc:
        await registry.create(PODS, {"metadata": {"name": "q"}, "spec": {
            "containers": [{"name": "c", "image": "i"}]}}, "default")
    assert exc.value.code == 422 and "spec.containers[0].name" in exc.value.message
    client.handlers["m.example.com"] = lambda r: {"allowed": True, "patch": [
        {"op": "remove", "path": "/nothing/here"}]}
    with pytest.raises(StatusError) as exc:
        await registry.create(PODS, {"metadata": {"name": "r"}, "spec": {
            "containers": [{"name": "c", "image": "i"}]}}, "default")
    assert exc.value.code == 500 and exc.value.message.startswith("Internal error occurred: ")


async def test_a_webhook_cannot_rewrite_server_owned_metadata(env):
    registry, client = env
    await registry.create(CMS, cm("c"), "default")
    await install(registry, "mutating", "m", hook("m.example.com"))
    client.handlers["m.example.com"] = lambda r: {"allowed": True, "patch": [
        {"op": "replace", "path": "/metadata/uid", "value": "forged"},
        {"op": "add", "path": "/metadata/labels", "value": {"m": "1"}}]}
    before = await registry.get(CMS, "c", "default")
    after = await registry.update(CMS, cm("c", data={"x": "y"}), namespace="default")
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["metadata"]["labels"] == {"m": "1"}
    created = await registry.create(CMS, cm("d"), "default")
    assert created["metadata"]["uid"] != "forged"


async def test_reinvocation_if_needed(env):
    registry, client = env
    # configurations run in name order: "a" before "b"
    await install(registry, "mutating", "a", hook("first.example.com", reinvocationPolicy="IfNeeded"),
                  hook("never.example.com"))
    await install(registry, "mutating", "b", hook("changer.example.com"))

    def first(req):
        labels = req["object"]["metadata"].get("labels") or {}
        if "changed" in labels and "seen-change" not in labels:
            return {"allowed": True, "patch": [{"op": "add", "path": "/metadata/labels/seen-change", "value": "1"}]}
        return {"allowed": True}

    client.handlers["first.example.com"] = first
    client.handlers["changer.example.com"] = lambda r: {"allowed": True, "patch": [
        {"op": "add", "path": "/metadata/labels", "value": {"changed": "1"}}]}
    out = await registry.create(CMS, cm("c"), "default")
    assert client.names() == ["first.example.com", "never.example.com", "changer.example.com", "first.example.com"]
    assert out["metadata"]["labels"] == {"changed": "1", "seen-change": "1"}
    client.calls.clear()
    client.handlers["changer.example.com"] = lambda r: {"allowed": True}
    await registry.create(CMS, cm("d"), "default")
    assert client.names() == ["first.example.com", "never.example.com", "changer.example.com"]


# -- refusals and failures ---------------------------------------------------------------------


async def test_denial_uses_the_webhooks_status(env):
    registry, client = env
    await install(registry, "validating", "v", hook("v.example.com"))
    client.handlers["v.example.com"] = lambda r: {"allowed": False, "status": {
        "code": 403, "reason": "Forbidden", "message": "no thanks"}}
    with pytest.raises(StatusError) as exc:
        await registry.create(CMS, cm("c"), "default")
    assert (exc.value.code, exc.value.reason) == (403, "Forbidden")
    assert exc.value.message == 'admission webhook "v.example.com" denied the request: no thanks'
    client.handlers["v.example.com"] = lambda r: {"allowed": False}
    with pytest.raises(StatusError) as exc:
        await registry.create(CMS, cm("c"), "default")
    assert exc.value.code == 500
    assert exc.value.message == 'admission webhook "v.example.com" denied the request without explanation'
    assert await registry.list(CMS, "default") and not (await registry.list(CMS, "default"))["items"]


async def test_failure_policy(env):
    registry, client = env
    await install(registry, "validating", "v", hook("ignore.example.com", failurePolicy="Ignore"),
                  hook("fail.example.com", objectSelector={"matchLabels": {"strict": "yes"}}))
    boom = CallError("x", "failed to call webhook: boom")
    client.handlers["ignore.example.com"] = lambda r: CallError("ignore.example.com", "failed to call webhook: boom")
    client.handlers["fail.example.com"] = lambda r: CallError("fail.example.com", "failed to call webhook: boom")
    await registry.create(CMS, cm("through"), "default")
    with pytest.raises(StatusError) as exc:
        await registry.create(CMS, cm("blocked", labels={"strict": "yes"}), "default")
    assert exc.value.code == 500 and exc.value.reason == "InternalError"
    assert exc.value.message == ('Internal error occurred: failed calling webhook "fail.example.com": '
                                 "failed to call webhook: boom")
    del boom


async def test_invalid_responses_are_call_failures(env):
    registry, client = env
    await install(registry, "validating", "v", hook("v.example.com"))
    client.handlers["v.example.com"] = lambda r: {"allowed": True, "uid": "other"}
    with pytest.raises(StatusError) as exc:
        await registry.create(CMS, cm("c"), "default")
    assert 'received invalid webhook response: expected response.uid="' in exc.value.message
    assert 'got "other"' in exc.value.message
    client.handlers["v.example.com"] = lambda r: {"allowed": True, "patch": [{"op": "add", "path": "/a", "value": 1}]}
    with pytest.raises(StatusError) as exc:
        await registry.create(CMS, cm("c"), "default")
    assert "validating webhook may not return response.patch or response.patchType" in exc.value.message


def test_verify_response_checks():
    ok = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": "u", "allowed": True}}
    assert verify_response(ok, "u", True).allowed
    with pytest.raises(ValueError, match="expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, "
                                         "got admission.k8s.io/v1beta1, Kind=AdmissionReview"):
        verify_response({**ok, "apiVersion": "admission.k8s.io/v1beta1"}, "u", True)
    with pytest.raises(ValueError, match="webhook response was absent"):
        verify_response({**ok, "response": None}, "u", True)
    with pytest.raises(ValueError, match="webhook returned response.patch but not response.patchType"):
        verify_response({**ok, "response": {"uid": "u", "allowed": True, "patch": "W10="}}, "u", True)
    with pytest.raises(ValueError, match='invalid response.patchType of "Merge"'):
        verify_response({**ok, "response": {"uid": "u", "allowed": True, "patch": "W10=", "patchType": "Merge"}},
                        "u", True)


async def test_dry_run_and_side_effects(env):
    registry, client = env
    await install(registry, "validating", "v", hook("v.example.com", sideEffects="NoneOnDryRun"))
    await registry.create(CMS, cm("c"), "default", dry_run=True)
    (_, review), = client.calls
    assert review["request"]["dryRun"] is True and review["request"]["options"]["dryRun"] == ["All"]
    # configurations written by an older server may say Some or Unknown; they
    # are refused on dryRun without being called, as upstream
    store = registry.store
    key = VWC.storage_key("legacy")
    await store.create(key, {"apiVersion": "admissionregistration.k8s.io/v1",
                             "kind": "ValidatingWebhookConfiguration", "metadata": {"name": "legacy"},
                             "webhooks": [{**hook("some.example.com"), "sideEffects": "Some"}]})
    await registry.admission.plugin("ValidatingAdmissionWebhook").source.caught_up(store.revision)
    client.calls.clear()
    with pytest.raises(StatusError) as exc:
        await registry.create(CMS, cm("d"), "default", dry_run=True)
    assert (exc.value.code, exc.value.message) == (400, 'admission webhook "some.example.com" does not support dry run')
    assert "some.example.com" not in client.names()
    await registry.create(CMS, cm("d"), "default")  # not a dry run: called
    assert "some.example.com" in client.names()


# -- selectors and conditions -----------------------------------------------------------------------


async def test_namespace_selector(env):
    registry, client = env
    await registry.create(NAMESPACES, {"metadata": {"name": "watched", "labels": {"team": "a"}}})
    await registry.create(NAMESPACES, {"metadata": {"name": "other"}})
    await install(registry, "validating", "v", hook("v.example.com", resources=("configmaps", "namespaces"),
                                                    namespaceSelector={"matchLabels": {"team": "a"}}))
    await registry.create(CMS, cm("in"), "watched")
    await registry.create(CMS, cm("out"), "other")
    assert [r["request"]["namespace"] for _, r in client.calls] == ["watched"]
    client.calls.clear()
    # a Namespace is judged on its own labels
    await registry.create(NAMESPACES, {"metadata": {"name": "new", "labels": {"team": "a"}}})
    await registry.create(NAMESPACES, {"metadata": {"name": "new2"}})
    assert [r["request"]["name"] for _, r in client.calls] == ["new"]
    assert "namespace" not in client.calls[0][1]["request"]
    # requests on an existing Namespace carry its name as their namespace (upstream's request info)
    await registry.update(NAMESPACES, {"metadata": {"name": "new", "labels": {"team": "a", "x": "y"}}})
    assert client.calls[-1][1]["request"]["namespace"] == "new"


async def test_object_selector_on_old_and_new(env):
    registry, client = env
    await registry.create(CMS, cm("c", labels={"pick": "me"}), "default")
    await install(registry, "validating", "v", hook("v.example.com", objectSelector={"matchLabels": {"pick": "me"}}))
    await registry.update(CMS, cm("c"), namespace="default")  # the label goes: the old object still matches
    await registry.create(CMS, cm("d"), "default")
    assert [(r["request"]["operation"], r["request"]["name"]) for _, r in client.calls] == [("UPDATE", "c")]


async def test_match_conditions(env):
    registry, client = env
    await install(registry, "validating", "v",
                  hook("cond.example.com", matchConditions=[
                      {"name": "not-kube-system", "expression": "request.namespace != 'kube-system'"},
                      {"name": "labelled", "expression": "has(object.metadata.labels) && 'check' in object.metadata.labels"
                                                        " && object.metadata.labels['check'] == 'yes'"}]),
                  hook("broken.example.com", objectSelector={"matchLabels": {"broken": "yes"}},
                       matchConditions=[{"name": "x", "expression": "object.data.missing == 'x'"}]),
                  hook("lenient.example.com", failurePolicy="Ignore",
                       matchConditions=[{"name": "x", "expression": "object.data.missing == 'x'"}]))
    await registry.create(CMS, cm("a", labels={"check": "yes"}), "default")
    await registry.create(CMS, cm("b", labels={"check": "no"}), "default")
    await registry.create(CMS, cm("c", labels={"check": "yes"}), "kube-system")
    assert [r["request"]["name"] for n, r in client.calls if n == "cond.example.com"] == ["a"]
    with pytest.raises(StatusError) as exc:
        await registry.create(CMS, cm("d", labels={"broken": "yes"}, data={"k": "v"}), "default")
    assert exc.value.code == 403
    assert exc.value.message == ("configmaps \"d\" is forbidden: expression 'object.data.missing == 'x'' "
                                 "resulted in error: no such key: missing")
    assert "lenient.example.com" not in client.names()


# -- warnings, exemption, the cache -------------------------------------------------------------------


async def test_warnings_reach_the_recorder(env):
    registry, client = env
    await install(registry, "mutating", "m", hook("m.example.com"))
    await install(registry, "validating", "v", hook("v.example.com"))
    client.handlers["m.example.com"] = lambda r: {"allowed": True, "warnings": ["from mutating"]}
    client.handlers["v.example.com"] = lambda r: {"allowed": True, "warnings": ["from validating", "from mutating"]}
    with recording() as warnings:
        await registry.create(CMS, cm("c"), "default")
    assert warnings == ["from mutating", "from validating"]


async def test_webhook_configurations_are_exempt(env):
    registry, client = env
    await install(registry, "validating", "all", hook("all.example.com", resources=("*",), groups=("*",),
                                                      versions=("*",)))
    client.handlers["all.example.com"] = lambda r: {"allowed": False, "status": {"code": 403, "message": "no"}}
    # a configuration that denies everything can still be removed
    await install(registry, "mutating", "m", hook("m.example.com"))
    await registry.delete(VWC, "all")
    assert client.names() == []
    await registry.create(CMS, cm("c"), "default")


async def test_configuration_changes_apply_to_the_next_request(env):
    registry, client = env
    await registry.create(CMS, cm("before"), "default")
    await install(registry, "validating", "v", hook("v.example.com"))
    await registry.create(CMS, cm("after"), "default")
    assert client.names() == ["v.example.com"]
    await registry.update(VWC, {"metadata": {"name": "v"}, "webhooks": [hook("v.example.com", operations=("DELETE",))]})
    await registry.create(CMS, cm("after-update"), "default")
    assert client.names() == ["v.example.com"]
    await registry.delete(VWC, "v")
    await registry.delete(CMS, "after", "default")
    assert client.names() == ["v.example.com"]
    # a write that did not go through this registry arrives by the watch
    await registry.store.create(VWC.storage_key("elsewhere"), {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "elsewhere"}, "webhooks": [hook("w.example.com")]})
    source = registry.admission.plugin("ValidatingAdmissionWebhook").source
    assert await source.caught_up(registry.store.revision)
    await registry.create(CMS, cm("late"), "default")
    assert client.names() == ["v.example.com", "w.example.com"]


# -- the configuration kinds ------------------------------------------------------------------------


async def test_configuration_defaults(env):
    registry, _ = env
    out = await install(registry, "mutating", "m", {
        "name": "m.example.com", "sideEffects": "None", "admissionReviewVersions": ["v1"],
        "clientConfig": {"service": {"name": "s", "namespace": "default"}},
        "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]})
    wh = out["webhooks"][0]
    assert wh["failurePolicy"] == "Fail" and wh["matchPolicy"] == "Equivalent"
    assert wh["namespaceSelector"] == {} and wh["objectSelector"] == {}
    assert wh["timeoutSeconds"] == 10 and wh["reinvocationPolicy"] == "Never"
    assert wh["rules"][0]["scope"] == "*" and wh["clientConfig"]["service"]["port"] == 443
    assert out["metadata"]["generation"] == 1
    val = await install(registry, "validating", "v", hook("v.example.com"))
    assert "reinvocationPolicy" not in val["webhooks"][0]


async def test_configuration_validation(env):
    registry, _ = env
    with pytest.raises(StatusError) as exc:
        await install(registry, "validating", "v", hook(
            "v.example.com", sideEffects="Some", failurePolicy="Sometimes",
            clientConfig={"url": "https://h/p#frag", "service": {"name": "s", "namespace": "n"}},
            rules=[{"operations": ["CREATE", "*"], "apiGroups": [], "apiVersions": ["v1"],
                    "resources": ["*/*", "pods"], "scope": "Everywhere"}],
            matchConditions=[{"name": "c", "expression": "object."}, {"name": "c", "expression": "true"}]))
    msgs = {c.field: c.message for c in exc.value.causes}
    assert exc.value.code == 422
    assert msgs["webhooks[0].sideEffects"] == 'Unsupported value: "Some": supported values: "None", "NoneOnDryRun"'
    assert msgs["webhooks[0].failurePolicy"] == 'Unsupported value: "Sometimes": supported values: "Fail", "Ignore"'
    assert msgs["webhooks[0].clientConfig"] == "Required value: exactly one of url or service is required"
    assert msgs["webhooks[0].rules[0].operations"].endswith("if '*' is present, must not specify other operations")
    assert msgs["webhooks[0].rules[0].apiGroups"] == "Required value"
    assert msgs["webhooks[0].rules[0].resources"].endswith("if '*/*' is present, must not specify other resources")
    assert msgs["webhooks[0].rules[0].scope"].startswith('Unsupported value: "Everywhere"')
    assert msgs["webhooks[0].matchConditions[1].name"] == 'Duplicate value: "c"'
    assert msgs["webhooks[0].matchConditions[0].expression"].startswith(
        'Invalid value: "object.": compilation failed: ')
    with pytest.raises(StatusError) as exc:
        await install(registry, "mutating", "m", hook(
            "m.example.com", reinvocationPolicy="Always", timeoutSeconds=0, admissionReviewVersions=[],
            clientConfig={"service": {"name": "", "namespace": "n", "path": "nope", "port": 70000}}))
    msgs = {c.field: c.message for c in exc.value.causes}
    assert msgs["webhooks[0].reinvocationPolicy"] == (
        'Unsupported value: "Always": supported values: "IfNeeded", "Never"')
    assert msgs["webhooks[0].timeoutSeconds"] == "Invalid value: 0: the timeout value must be between 1 and 30 seconds"
    assert msgs["webhooks[0].admissionReviewVersions"] == "Required value: must specify one of v1, v1beta1"
    assert msgs["webhooks[0].clientConfig.service.name"] == "Required value: service name is required"
    assert msgs["webhooks[0].clientConfig.service.path"] == "Invalid value: \"nope\": must start with a '/'"
    assert msgs["webhooks[0].clientConfig.service.port"].startswith("Invalid value: 70000: port is not valid: ")


async def test_an_update_keeps_what_an_older_configuration_allowed(env):
    registry, _ = env
    store = registry.store
    await store.create(VWC.storage_key("old"), {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "old", "uid": "u", "creationTimestamp": "2020-01-01T00:00:00Z", "generation": 1},
        "webhooks": [{**hook("a.example.com"), "sideEffects": "Unknown"}]})
    out = await registry.update(VWC, {"metadata": {"name": "old"}, "webhooks": [
        {**hook("a.example.com"), "sideEffects": "Unknown", "timeoutSeconds": 5}]})
    assert out["webhooks"][0]["timeoutSeconds"] == 5 and out["metadata"]["generation"] == 2


def test_review_is_built_from_attributes():
    a = Attributes("CREATE", CMS, "", "default", {"metadata": {"generateName": "x-"}}, None,
                   user=UserInfo("bob"))
    review = build_review(a, "uid-1")
    assert review["apiVersion"] == "admission.k8s.io/v1" and review["kind"] == "AdmissionReview"
    req = review["request"]
    assert req["uid"] == "uid-1" and "name" not in req and req["userInfo"] == {"username": "bob"}
    assert list(req)[-2:] == ["dryRun", "options"] or "options" not in req


async def test_a_patched_object_is_decoded_as_upstreams_typed_objects(env):
    registry, client = env
    from kubeplane.apiserver import openapi

    registry.pruner = lambda res, obj: openapi.check_fields(obj, res.group, res.version, res.kind, prune=True)
    await install(registry, "mutating", "m", hook("m.example.com"))
    client.handlers["m.example.com"] = lambda r: {"allowed": True, "patch": [
        {"op": "add", "path": "/unknownField", "value": 1}, {"op": "add", "path": "/data", "value": {"k": "v"}}]}
    out = await registry.create(CMS, cm("c"), "default")
    assert "unknownField" not in out and out["data"] == {"k": "v"}
    client.handlers["m.example.com"] = lambda r: {"allowed": True, "patch": [
        {"op": "add", "path": "/data", "value": {"k": 5}}]}
    with pytest.raises(StatusError) as exc:
        await registry.create(CMS, cm("d"), "default")
    assert exc.value.code == 500 and "json: cannot unmarshal number into Go struct field" in exc.value.message


async def test_match_conditions_ask_the_authorizer(env):
    registry, client = env
    from kubeplane.auth.authorizer import Decision

    asked = []

    class OnlyAlice:
        def authorize(self, a):
            asked.append((a.user.name, a.verb, a.api_group, a.resource, a.subresource, a.namespace, a.name,
                          a.resource_request, a.path))
            if a.user.name == "alice" and a.resource == "configmaps":
                return Decision.ALLOW, ""
            return Decision.NO_OPINION, "not alice"

    registry.admission.set_authorizer(OnlyAlice())
    await install(registry, "validating", "v", hook("authz.example.com", matchConditions=[
        {"name": "can-delete", "expression": "authorizer.group('').resource('configmaps').namespace('default')"
                                             ".check('delete').allowed()"},
        {"name": "request", "expression": "authorizer.requestResource.check('update').reason() == ''"},
        {"name": "sa", "expression": "!authorizer.serviceAccount('ns', 'robot').path('/healthz').check('get')"
                                     ".allowed()"}]))
    with acting_as(UserInfo("alice")):
        await registry.create(CMS, cm("by-alice"), "default")
    with acting_as(UserInfo("bob")):
        await registry.create(CMS, cm("by-bob"), "default")
    assert [r["request"]["name"] for _, r in client.calls] == ["by-alice"]
    assert asked[:3] == [
        ("alice", "delete", "", "configmaps", "", "default", "", True, ""),
        ("alice", "update", "", "configmaps", "", "default", "by-alice", True, ""),
        ("system:serviceaccount:ns:robot", "get", "", "", "", "", "", False, "/healthz")]


async def test_no_webhook_is_called_for_a_create_namespace_lifecycle_refuses(env):
    registry, client = env
    await install(registry, "mutating", "m", hook("m.example.com"))
    with pytest.raises(StatusError) as exc:
        await registry.create(CMS, cm("c"), "missing")
    assert exc.value.code == 404
    assert client.calls == []


async def test_requests_are_refused_until_the_configurations_are_read():
    class Failing(MemoryStore):
        broken = True

        async def list(self, prefix, **kw):
            if self.broken and prefix.startswith("/registry/admissionregistration.k8s.io/"):
                from kubeplane.storage.interface import StorageError

                raise StorageError("disk on fire")
            return await super().list(prefix, **kw)

    store = Failing()
    source = WebhookSource(store)
    plugin = MutatingAdmissionWebhook(source, store, FakeClient())
    try:
        with pytest.raises(StatusError) as exc:
            await plugin.admit(Attributes("CREATE", CMS, "c", "default", {"metadata": {"name": "c"}}))
        assert (exc.value.code, exc.value.message) == (
            403, 'configmaps "c" is forbidden: not yet ready to handle request')
        store.broken = False
        assert await source.caught_up(0, timeout=5)
        await plugin.admit(Attributes("CREATE", CMS, "c", "default", {"metadata": {"name": "c"}}))
    finally:
        await plugin.close()
        await store.close()


async def test_nested_comprehensions_are_refused(env):
    registry, _ = env
    from kubeplane.registry.matchconditions import nested_comprehensions

    assert not nested_comprehensions("object.spec.containers.all(c, c.image != '')")
    assert not nested_comprehensions("object.a.map(x, x).filter(y, y == '.all(')")
    assert nested_comprehensions("object.a.all(x, object.b.exists(y, y == x))")
    with pytest.raises(StatusError) as exc:
        await install(registry, "validating", "v", hook("v.example.com", matchConditions=[
            {"name": "quadratic", "expression": "object.data.all(k, object.data.exists(j, j == k))"}]))
    (cause,) = exc.value.causes
    assert cause.field == "webhooks[0].matchConditions[0].expression"
    assert "estimated rule cost exceeds budget" in cause.message
