"""kubeplane.testing.WebhookInstallOptions: configurations pointed at a server in
the test process, with certificates generated for it, installed and removed."""

from __future__ import annotations

import base64
import ssl

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.testing import Cluster, WebhookInstallOptions

CONFIGS = """
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: label-adder}
webhooks:
- name: add.example.com
  admissionReviewVersions: [v1]
  sideEffects: None
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate}}
  rules:
  - {operations: [CREATE], apiGroups: [""], apiVersions: [v1], resources: [configmaps]}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: guard}
webhooks:
- name: guard.example.com
  admissionReviewVersions: [v1]
  sideEffects: None
  clientConfig: {service: {name: webhook-service, namespace: system, path: /validate}}
  rules:
  - {operations: [CREATE, UPDATE], apiGroups: [""], apiVersions: [v1], resources: [configmaps]}
"""


def test_configurations_point_at_the_local_server(tmp_path):
    wh = WebhookInstallOptions(CONFIGS, cert_dir=tmp_path / "certs")
    confs = wh.configurations()
    assert [c["kind"] for c in confs] == ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
    cc = confs[0]["webhooks"][0]["clientConfig"]
    assert cc == {"url": f"https://127.0.0.1:{wh.port}/mutate", "caBundle": base64.b64encode(wh.ca_pem).decode()}
    assert confs[1]["webhooks"][0]["clientConfig"]["url"].endswith("/validate")
    # the serving certificate verifies against the bundle, for 127.0.0.1 and localhost
    ctx = ssl.create_default_context(cadata=wh.ca_pem.decode())
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(wh.cert_file.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert ctx.verify_mode == ssl.CERT_REQUIRED and wh.key_file.exists()
    with pytest.raises(ValueError, match="not a webhook configuration"):
        WebhookInstallOptions({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}})


async def test_install_serve_and_remove():
    seen = []

    def mutate(request):
        seen.append(("mutate", request["name"]))
        return {"allowed": True, "patch": [{"op": "add", "path": "/metadata/labels", "value": {"added": "yes"}}]}

    async def validate(request):
        seen.append(("validate", request["name"]))
        if request["object"]["metadata"]["name"] == "no":
            return {"allowed": False, "status": {"code": 403, "reason": "Forbidden", "message": "not this one"}}
        return {"allowed": True, "warnings": ["checked"]}

    async with Cluster() as c:
        wh = WebhookInstallOptions(CONFIGS, handler={"/mutate": mutate, "/validate": validate})
        async with wh.installed_async(c):
            stored = await c.get_async("mutatingwebhookconfigurations", "label-adder")
            assert stored["webhooks"][0]["clientConfig"]["url"] == wh.url("/mutate")
            out = await c.apply_async({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "yes"}})
            assert out[0]["metadata"]["labels"] == {"added": "yes"}
            with pytest.raises(StatusError) as exc:
                await c.apply_async({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "no"}})
            assert exc.value.code == 403
            assert exc.value.message == 'admission webhook "guard.example.com" denied the request: not this one'
        assert seen == [("mutate", "yes"), ("validate", "yes"), ("mutate", "no"), ("validate", "no")]
        # removed: the configurations are gone and the server stopped
        with pytest.raises(StatusError):
            await c.get_async("validatingwebhookconfigurations", "guard")
        await c.apply_async({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "no"}})
        assert len(seen) == 4
        assert not wh.cert_dir.exists()


def test_sync_cluster_with_a_handler():
    calls = []

    def allow(request):
        calls.append(request["operation"])
        return {"allowed": True}

    with Cluster() as c, WebhookInstallOptions(CONFIGS, handler=allow).installed(c):
        c.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}})
    assert calls == ["CREATE", "CREATE"]
