"""Status wording and codes as upstream's apiserver writes them: 422 messages
name the group-qualified kind (schema.GroupKind.String()), a Status leaves out
its empty omitempty fields, and a delete held by finalizers or graceful
termination answers 200 with the object, 202 only for orphanDependents=false."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from kubeplane.api import errors
from kubeplane.api.resources import CATALOGUE
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.apiserver.server import build_app
from kubeplane.registry.crd import CRDController
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "crontabs.stable.example.com"},
    "spec": {
        "group": "stable.example.com", "scope": "Namespaced",
        "names": {"plural": "crontabs", "kind": "CronTab"},
        "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
            "type": "object", "properties": {"spec": {"type": "object", "properties": {
                "replicas": {"type": "integer", "minimum": 1}}}}}}}],
    },
}


@pytest.fixture
async def api() -> AsyncIterator[aiohttp.ClientSession]:
    store = MemoryStore()
    registry = Registry(store, CATALOGUE.copy())
    await ensure_default_namespaces(registry)
    ctrl = CRDController(registry)
    await ctrl.start()
    server = TestServer(build_app(registry, registry.catalogue), host="127.0.0.1")
    await server.start_server()
    async with aiohttp.ClientSession(str(server.make_url(""))) as session:
        yield session
    await server.close()
    await ctrl.stop()
    await store.close()


async def call(s: aiohttp.ClientSession, method: str, path: str, body: object = None) -> tuple[int, dict]:
    data = None if body is None else orjson.dumps(body)
    async with s.request(method, path, data=data, headers={"Content-Type": "application/json"}) as r:
        return r.status, orjson.loads(await r.read())


def test_invalid_names_the_group_qualified_kind() -> None:
    cause = errors.invalid_value("spec.replicas", -1, "must be greater than or equal to 0")
    err = errors.invalid("Deployment", "web", [cause], group="apps")
    assert err.message == 'Deployment.apps "web" is invalid: spec.replicas: Invalid value: -1: ' \
                          'must be greater than or equal to 0'
    details = err.to_status()["details"]
    assert (details["kind"], details["group"], details["name"]) == ("Deployment", "apps", "web")
    assert errors.invalid("Pod", "p", [cause]).message.startswith('Pod "p" is invalid: ')
    assert "group" not in errors.invalid("Pod", "p", [cause]).to_status()["details"]
    # NewInvalid with no causes: no trailing colon
    assert errors.invalid("Scale", "s", [], group="autoscaling").message == 'Scale.autoscaling "s" is invalid'


def test_status_omits_empty_fields() -> None:
    status = errors.StatusError(500, "", "boom").to_status()
    assert "reason" not in status and status["message"] == "boom" and status["code"] == 500
    status = errors.StatusError(0, "", "").to_status()
    assert set(status) == {"kind", "apiVersion", "metadata", "status"}
    cause = errors.Cause("", "", "spec").to_dict()
    assert cause == {"field": "spec"}
    # an empty reason survives a round trip through the wire as empty
    again = errors.StatusError.from_status(errors.StatusError(418, "", "odd").to_status())
    assert (again.code, again.reason, again.message) == (418, "", "odd")


async def test_http_invalid_messages_are_group_qualified(api: aiohttp.ClientSession) -> None:
    s = api
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
           "spec": {"replicas": -1, "selector": {"matchLabels": {"a": "b"}},
                    "template": {"metadata": {"labels": {"a": "b"}},
                                 "spec": {"containers": [{"name": "c", "image": "i"}]}}}}
    code, out = await call(s, "POST", "/apis/apps/v1/namespaces/default/deployments", dep)
    assert code == 422 and out["message"].startswith('Deployment.apps "web" is invalid: spec.replicas: '), out
    assert (out["details"]["kind"], out["details"]["group"]) == ("Deployment", "apps")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": []}}
    code, out = await call(s, "POST", "/api/v1/namespaces/default/pods", pod)
    assert code == 422 and out["message"].startswith('Pod "p" is invalid: '), out
    rb = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "rb"},
          "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ""}, "subjects": []}
    code, out = await call(s, "POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings", rb)
    assert code == 422 and out["message"].startswith('RoleBinding.rbac.authorization.k8s.io "rb" is invalid: '), out
    # the scale subresource's kind is autoscaling's Scale
    dep["spec"]["replicas"] = 1
    assert (await call(s, "POST", "/apis/apps/v1/namespaces/default/deployments", dep))[0] == 201
    scale = {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": "web", "namespace": "default"},
             "spec": {"replicas": -2}}
    code, out = await call(s, "PUT", "/apis/apps/v1/namespaces/default/deployments/web/scale", scale)
    assert code == 422 and out["message"].startswith('Scale.autoscaling "web" is invalid: spec.replicas: '), out
    # options are meta.k8s.io kinds
    code, out = await call(s, "DELETE", "/api/v1/namespaces/default/configmaps/x?propagationPolicy=Sideways")
    assert code == 422 and out["message"].startswith('DeleteOptions.meta.k8s.io "" is invalid: '), out
    async with s.get("/api/v1/namespaces/default/configmaps?watch=1&sendInitialEvents=true") as r:
        out = orjson.loads(await r.read())
    assert r.status == 422 and out["message"] == (
        'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: sendInitialEvents requires '
        'setting resourceVersionMatch to NotOlderThan'), out
    assert (out["details"]["kind"], out["details"]["group"]) == ("ListOptions", "meta.k8s.io")


async def test_custom_resource_invalid_names_the_crd_group(api: aiohttp.ClientSession) -> None:
    s = api
    code, _ = await call(s, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", CRD)
    assert code == 201
    path = "/apis/stable.example.com/v1/namespaces/default/crontabs"
    for _ in range(500):  # until the CRD is served
        code, out = await call(s, "POST", path, {"apiVersion": "stable.example.com/v1", "kind": "CronTab",
                                                 "metadata": {"name": "c"}, "spec": {"replicas": 0}})
        if code != 404:
            break
        await asyncio.sleep(0.01)
    assert code == 422, out
    assert out["message"] == ('CronTab.stable.example.com "c" is invalid: spec.replicas: Invalid value: 0: '
                              'spec.replicas in body should be greater than or equal to 1')
    assert (out["details"]["kind"], out["details"]["group"]) == ("CronTab", "stable.example.com")


async def test_delete_held_by_finalizers_answers_200_unless_orphan_dependents_false(
        api: aiohttp.ClientSession) -> None:
    s = api
    base = "/api/v1/namespaces/default/configmaps"
    for name in ("plain", "foreground", "orphan-false", "body-false"):
        cm = {"metadata": {"name": name, "finalizers": ["example.com/keep"]}}
        assert (await call(s, "POST", base, cm))[0] == 201
    code, out = await call(s, "DELETE", f"{base}/plain")
    assert code == 200 and out["kind"] == "ConfigMap" and out["metadata"]["deletionTimestamp"]
    code, out = await call(s, "DELETE", f"{base}/foreground?propagationPolicy=Foreground")
    assert code == 200 and out["kind"] == "ConfigMap" and "foregroundDeletion" in out["metadata"]["finalizers"]
    code, out = await call(s, "DELETE", f"{base}/orphan-false?orphanDependents=false")
    assert code == 202 and out["kind"] == "ConfigMap" and out["metadata"]["deletionTimestamp"]
    code, out = await call(s, "DELETE", f"{base}/body-false", {"orphanDependents": False})
    assert code == 202 and out["kind"] == "ConfigMap"
    # a delete that removes the object is 200 even with orphanDependents=false
    assert (await call(s, "POST", base, {"metadata": {"name": "gone"}}))[0] == 201
    code, out = await call(s, "DELETE", f"{base}/gone?orphanDependents=false")
    assert code == 200 and out["status"] == "Success"


async def test_graceful_pod_delete_answers_200(api: aiohttp.ClientSession) -> None:
    s = api
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]}}
    assert (await call(s, "POST", "/api/v1/namespaces/default/pods", pod))[0] == 201
    code, out = await call(s, "DELETE", "/api/v1/namespaces/default/pods/p")
    assert code == 200 and out["kind"] == "Pod" and out["metadata"]["deletionGracePeriodSeconds"] == 30
