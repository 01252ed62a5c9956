"""Admission webhooks against a real API server subprocess, with real kubectl:
a mutating and a validating webhook served over HTTPS (their own CA, an
aiohttp server in this process on 127.0.0.1), failure policies with the
webhook down, timeouts, dryRun and warnings.

The server is this module's own: webhook configurations would reach every
other test of a shared one.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time

import orjson
import pytest
from aiohttp import web

from conftest import Kubectl, start_server
from kubeplane.testing import WebhookInstallOptions


class WebhookServer:
    """An HTTPS admission webhook server on its own event loop thread; the
    handlers get the AdmissionRequest and return the AdmissionResponse."""

    def __init__(self) -> None:
        self.certs = WebhookInstallOptions(validating=[])
        self.port = self.certs.port
        self.requests: list[dict] = []
        self.handlers: dict = {}
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> None:
        async def serve(request: web.Request) -> web.Response:
            review = orjson.loads(await request.read())
            req = review["request"]
            self.requests.append({"path": request.path, "query": dict(request.query), **req})
            handler = self.handlers.get(request.path)
            result = handler(req) if handler else {"allowed": True}
            if asyncio.iscoroutine(result):
                result = await result
            response = {"uid": req["uid"], **result}
            if isinstance(response.get("patch"), list):
                response["patch"] = base64.b64encode(orjson.dumps(response["patch"])).decode()
                response["patchType"] = "JSONPatch"
            return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                      "response": response})

        app = web.Application()
        app.router.add_post("/{tail:.*}", serve)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port, ssl_context=self.certs.server_ssl_context()).start()

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port}{path}"

    @property
    def ca_bundle(self) -> str:
        return base64.b64encode(self.certs.ca_pem).decode()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("webhook-apiserver"))
    hooks = WebhookServer()
    kubectl = Kubectl(srv.kubeconfig, tmp_path_factory.mktemp("kubectl-home-webhooks"))
    yield srv, hooks, kubectl
    hooks.stop()
    srv.stop()


def _hook(name: str, url: str, ca: str, *, resources=("configmaps",), operations=("CREATE", "UPDATE"), **kw) -> dict:
    hook = {
        "name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
        "clientConfig": {"url": url, "caBundle": ca},
        "rules": [{"operations": list(operations), "apiGroups": [""], "apiVersions": ["v1"],
                   "resources": list(resources)}],
        "objectSelector": {"matchLabels": {"webhook-test": name.split(".")[0]}},
    }
    hook.update(kw)
    return hook


def _config(kind: str, name: str, *hooks: dict) -> str:
    return json.dumps({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
                       "metadata": {"name": name}, "webhooks": list(hooks)})


def _cm(name: str, label: str, ns: str = "default") -> str:
    return json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": name, "namespace": ns, "labels": {"webhook-test": label}}})


def test_mutating_and_validating_webhooks_with_kubectl(env):
    srv, hooks, kubectl = env

    def mutate(req):
        return {"allowed": True, "warnings": ["mutated by the test webhook"],
                "patch": [{"op": "add", "path": "/data", "value": {"injected": "yes"}}]}

    def validate(req):
        if req["object"]["metadata"]["name"].startswith("bad"):
            return {"allowed": False, "status": {"code": 403, "reason": "Forbidden", "message": "no bad names"}}
        if req["object"].get("data", {}).get("injected") != "yes":
            return {"allowed": False, "status": {"code": 400, "message": "the mutation did not happen first"}}
        return {"allowed": True}

    hooks.handlers.update({"/mutate": mutate, "/validate": validate})
    kubectl("apply", "-f", "-", stdin=_config("MutatingWebhookConfiguration", "mut",
                                              _hook("mut.example.com", hooks.url("/mutate"), hooks.ca_bundle)))
    kubectl("apply", "-f", "-", stdin=_config("ValidatingWebhookConfiguration", "val",
                                              _hook("val.example.com", hooks.url("/validate"), hooks.ca_bundle,
                                                    objectSelector={"matchLabels": {"webhook-test": "mut"}})))
    # the configurations are in effect for the very next request
    res = kubectl("create", "-f", "-", stdin=_cm("good", "mut"))
    assert "Warning: mutated by the test webhook" in res.err
    out = kubectl("get", "configmap", "good", "-o", "jsonpath={.data.injected}").out
    assert out == "yes"
    bad = kubectl("create", "-f", "-", stdin=_cm("bad-one", "mut"), check=False)
    assert bad.rc != 0
    assert 'admission webhook "val.example.com" denied the request: no bad names' in bad.err
    assert "(Forbidden)" in bad.err
    assert kubectl("get", "configmap", "bad-one", check=False).rc != 0
    review = [r for r in hooks.requests if r["path"] == "/mutate" and r.get("name") == "good"][0]
    assert review["operation"] == "CREATE"
    assert review["kind"] == {"group": "", "version": "v1", "kind": "ConfigMap"}
    assert review["resource"] == {"group": "", "version": "v1", "resource": "configmaps"}
    assert review["namespace"] == "default"
    assert review["options"]["kind"] == "CreateOptions"
    assert review["oldObject"] is None and review["dryRun"] is False
    assert review["userInfo"]["username"]
    assert review["query"] == {"timeout": "10s"}
    # an update is admitted with the stored object as oldObject
    kubectl("label", "configmap", "good", "extra=1")
    upd = [r for r in hooks.requests if r["path"] == "/validate" and r["operation"] == "UPDATE"][-1]
    assert upd["oldObject"]["metadata"]["name"] == "good"
    assert upd["object"]["metadata"]["labels"]["extra"] == "1"
    assert upd["options"]["kind"] == "UpdateOptions"
    # removing the configurations takes effect at once too
    kubectl("delete", "validatingwebhookconfiguration", "val")
    kubectl("delete", "mutatingwebhookconfiguration", "mut")
    kubectl("create", "-f", "-", stdin=_cm("bad-two", "mut"))


def test_failure_policy_with_the_webhook_down(env):
    srv, hooks, kubectl = env
    from kubeplane.testing._webhooks import _free_port

    down = f"https://127.0.0.1:{_free_port('127.0.0.1')}/nothing"
    kubectl("apply", "-f", "-", stdin=_config("ValidatingWebhookConfiguration", "down",
                                              _hook("ignore.example.com", down, hooks.ca_bundle,
                                                    failurePolicy="Ignore"),
                                              _hook("fail.example.com", down, hooks.ca_bundle)))
    try:
        kubectl("create", "-f", "-", stdin=_cm("let-through", "ignore"))
        res = kubectl("create", "-f", "-", stdin=_cm("blocked", "fail"), check=False)
        assert res.rc != 0
        assert (f'Internal error occurred: failed calling webhook "fail.example.com": failed to call webhook: '
                f'Post "{down}?timeout=10s": dial tcp 127.0.0.1:') in res.err, res.err
        assert "connect: connection refused" in res.err
        assert kubectl("get", "configmap", "blocked", check=False).rc != 0
    finally:
        kubectl("delete", "validatingwebhookconfiguration", "down")


def test_timeout_and_dry_run(env):
    srv, hooks, kubectl = env

    async def slow(req):
        await asyncio.sleep(4)
        return {"allowed": True}

    hooks.handlers["/slow"] = slow
    hooks.handlers["/dry"] = lambda req: {"allowed": True}
    kubectl("apply", "-f", "-", stdin=_config(
        "ValidatingWebhookConfiguration", "timing",
        _hook("slow.example.com", hooks.url("/slow"), hooks.ca_bundle, timeoutSeconds=1),
        _hook("dry.example.com", hooks.url("/dry"), hooks.ca_bundle, sideEffects="NoneOnDryRun")))
    try:
        t0 = time.monotonic()
        res = kubectl("create", "-f", "-", stdin=_cm("slow", "slow"), check=False)
        took = time.monotonic() - t0
        assert res.rc != 0
        assert (f'failed calling webhook "slow.example.com": failed to call webhook: '
                f'Post "{hooks.url("/slow")}?timeout=1s": context deadline exceeded') in res.err, res.err
        assert took < 3.5
        before = len(hooks.requests)
        kubectl("create", "--dry-run=server", "-f", "-", stdin=_cm("dry", "dry"))
        seen = [r for r in hooks.requests[before:] if r["path"] == "/dry"]
        assert len(seen) == 1 and seen[0]["dryRun"] is True and seen[0]["options"]["dryRun"] == ["All"]
        assert kubectl("get", "configmap", "dry", check=False).rc != 0
    finally:
        kubectl("delete", "validatingwebhookconfiguration", "timing")


def test_configuration_validation_messages(env):
    srv, hooks, kubectl = env
    bad = {"name": "short", "admissionReviewVersions": ["v2"], "timeoutSeconds": 31,
           "clientConfig": {"url": "http://user@127.0.0.1/x?q=1"},
           "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]}
    res = kubectl("create", "-f", "-", stdin=_config("ValidatingWebhookConfiguration", "broken", bad, dict(bad)),
                  check=False)
    assert res.rc != 0
    for text in (
        'webhooks[0].name: Invalid value: "short": should be a domain with at least three segments separated by dots',
        "webhooks[0].sideEffects: Required value: must specify one of None, NoneOnDryRun",
        "webhooks[0].timeoutSeconds: Invalid value: 31: the timeout value must be between 1 and 30 seconds",
        "webhooks[0].clientConfig.url: Invalid value: \"http\": 'https' is the only allowed URL scheme",
        'webhooks[0].clientConfig.url: Invalid value: "user": user information is not permitted in the URL',
        'webhooks[0].clientConfig.url: Invalid value: "q=1": query parameters are not permitted in the URL',
        'webhooks[0].admissionReviewVersions: Invalid value: []string{"v2"}: must include at least one of v1, v1beta1',
        'webhooks[1].name: Duplicate value: "short"',
    ):
        assert text in res.err, (text, res.err)


def test_scale_subresource_is_admitted_as_a_scale(env):
    srv, hooks, kubectl = env

    def limit(req):
        replicas = req["object"]["spec"]["replicas"]
        if replicas > 5:
            return {"allowed": False, "status": {"code": 422, "reason": "Invalid",
                                                 "message": f"{replicas} replicas is too many"}}
        return {"allowed": True}

    hooks.handlers["/scale"] = limit
    hook = _hook("scale.example.com", hooks.url("/scale"), hooks.ca_bundle, resources=("deployments/scale",),
                 operations=("UPDATE",))
    hook["rules"][0]["apiGroups"] = ["apps"]
    del hook["objectSelector"]
    kubectl("apply", "-f", "-", stdin=_config("ValidatingWebhookConfiguration", "scale", hook))
    try:
        kubectl("create", "deployment", "web", "--image=nginx", "--replicas=1")
        kubectl("scale", "deployment", "web", "--replicas=3")
        res = kubectl("scale", "deployment", "web", "--replicas=9", check=False)
        assert res.rc != 0
        assert 'admission webhook "scale.example.com" denied the request: 9 replicas is too many' in res.err
        assert kubectl("get", "deployment", "web", "-o", "jsonpath={.spec.replicas}").out == "3"
        seen = [r for r in hooks.requests if r["path"] == "/scale"]
        assert seen[0]["kind"] == {"group": "autoscaling", "version": "v1", "kind": "Scale"}
        assert seen[0]["subResource"] == "scale" and seen[0]["oldObject"]["spec"]["replicas"] == 1
    finally:
        kubectl("delete", "validatingwebhookconfiguration", "scale")
        kubectl("delete", "deployment", "web", "--wait=false")
