"""Custom resources in controllers that run apart from the API server:
``kubeplane up --split`` (controllers in a child process over the local wire)
and ``kubeplane apiserver`` + ``kubeplane controllers`` (HTTPS, RBAC, the
controller manager's own identity: a client certificate for
system:kube-controller-manager). A namespace holding custom resources
finishes deleting; ownerReferences between custom and built-in kinds are
garbage collected both ways."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import Kubectl, start_server
from helpers import eventually_sync

CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gadgets.gc.example.com
spec:
  group: gc.example.com
  scope: Namespaced
  names: {plural: gadgets, singular: gadget, kind: Gadget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
"""


def _controller_manager_kubeconfig(srv, tmp):
    """The admin kubeconfig with a client certificate of the controller
    manager's identity (CN=system:kube-controller-manager, as upstream's
    kubeconfig for it): RBAC's bootstrap policy decides what it may do."""
    import base64

    import yaml
    from cryptography.hazmat.primitives import serialization

    from kubeplane.auth import pki

    ca_dir = srv.data_dir / "pki"
    cert, key = pki.issue(pki.load_cert(str(ca_dir / "ca.crt")), pki.load_key(str(ca_dir / "ca.key")),
                          "system:kube-controller-manager")
    cfg = yaml.safe_load(srv.kubeconfig.read_text())
    cfg["users"][0]["user"] = {
        "client-certificate-data": base64.b64encode(cert.public_bytes(serialization.Encoding.PEM)).decode(),
        "client-key-data": base64.b64encode(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption())).decode(),
    }
    path = tmp / "kcm.kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module", params=["up-split", "apiserver+controllers"])
def cluster(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("crdctl")
    procs = []
    log = open(tmp / "controllers.log", "ab")
    if request.param == "up-split":
        srv = start_server(tmp, storage="memory", command="up", extra=["--nodes", "0", "--split"])
    else:
        srv = start_server(tmp, storage="memory")
        kcm = _controller_manager_kubeconfig(srv, tmp)
        who = Kubectl(kcm, tmp / "kcm-home")("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}").out
        assert who.strip() == "system:kube-controller-manager"
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "kubeplane.cli.main", "controllers", "--kubeconfig", str(kcm),
             "--metrics-listen", ""], stdout=log, stderr=subprocess.STDOUT))
    kubectl = Kubectl(srv.kubeconfig, tmp / "home")
    kubectl("apply", "-f", "-", stdin=CRD)
    kubectl("wait", "--for=condition=Established", "crd/gadgets.gc.example.com", "--timeout=30s")
    yield srv, kubectl
    for p in procs:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
    log.close()
    srv.stop()


def _uid(kubectl: Kubectl, kind: str, name: str, ns: str = "default") -> str:
    return kubectl("-n", ns, "get", kind, name, "-o", "jsonpath={.metadata.uid}").out.strip()


def _gone(kubectl: Kubectl, kind: str, name: str, ns: str = "default") -> bool:
    r = kubectl("-n", ns, "get", kind, name, check=False)
    return r.rc != 0 and "NotFound" in r.err


def _apply(kubectl: Kubectl, obj: dict) -> None:
    kubectl("apply", "-f", "-", stdin=json.dumps(obj))


def test_a_namespace_holding_custom_resources_is_deleted(cluster):
    _, kubectl = cluster
    kubectl("create", "namespace", "gadgets")
    for name in ("a", "b"):
        _apply(kubectl, {"apiVersion": "gc.example.com/v1", "kind": "Gadget",
                         "metadata": {"name": name, "namespace": "gadgets"}, "spec": {"n": 1}})
    kubectl("-n", "gadgets", "create", "configmap", "c", "--from-literal=a=b")
    kubectl("delete", "namespace", "gadgets", "--timeout=60s")  # waits until it is gone
    r = kubectl("get", "namespace", "gadgets", check=False)
    assert r.rc != 0 and "NotFound" in r.err


def test_a_configmap_owned_by_a_custom_resource_is_collected(cluster):
    _, kubectl = cluster
    _apply(kubectl, {"apiVersion": "gc.example.com/v1", "kind": "Gadget",
                     "metadata": {"name": "owner", "namespace": "default"}})
    ref = {"apiVersion": "gc.example.com/v1", "kind": "Gadget", "name": "owner",
           "uid": _uid(kubectl, "gadget", "owner")}
    _apply(kubectl, {"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": "owned-by-gadget", "namespace": "default", "ownerReferences": [ref]}})
    kubectl("delete", "gadget", "owner")
    eventually_sync(lambda: _gone(kubectl, "configmap", "owned-by-gadget"), timeout=30, interval=0.2,
                    what="the ConfigMap collected")


def test_a_custom_resource_owned_by_a_configmap_is_collected(cluster):
    _, kubectl = cluster
    kubectl("create", "configmap", "cm-owner", "--from-literal=a=b")
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm-owner", "uid": _uid(kubectl, "configmap", "cm-owner")}
    _apply(kubectl, {"apiVersion": "gc.example.com/v1", "kind": "Gadget",
                     "metadata": {"name": "owned-by-cm", "namespace": "default", "ownerReferences": [ref]}})
    kubectl("delete", "configmap", "cm-owner")
    eventually_sync(lambda: _gone(kubectl, "gadget", "owned-by-cm"), timeout=30, interval=0.2,
                    what="the Gadget collected")


def test_foreground_deletion_of_a_custom_resource_waits_for_its_dependents(cluster):
    _, kubectl = cluster
    _apply(kubectl, {"apiVersion": "gc.example.com/v1", "kind": "Gadget",
                     "metadata": {"name": "fg-owner", "namespace": "default"}})
    ref = {"apiVersion": "gc.example.com/v1", "kind": "Gadget", "name": "fg-owner",
           "uid": _uid(kubectl, "gadget", "fg-owner"), "blockOwnerDeletion": True}
    _apply(kubectl, {"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": "fg-dep", "namespace": "default", "ownerReferences": [ref]}})
    # kubectl waits for the owner to go, which needs the collector to remove
    # the blocking dependent, then the foregroundDeletion finalizer
    kubectl("delete", "gadget", "fg-owner", "--cascade=foreground", "--timeout=60s")
    assert _gone(kubectl, "gadget", "fg-owner") and _gone(kubectl, "configmap", "fg-dep")


def test_a_terminating_namespace_reports_the_custom_resources_it_waits_for(cluster):
    _, kubectl = cluster
    kubectl("create", "namespace", "held")
    _apply(kubectl, {"apiVersion": "gc.example.com/v1", "kind": "Gadget",
                     "metadata": {"name": "h", "namespace": "held", "finalizers": ["gc.example.com/hold"]}})
    kubectl("delete", "namespace", "held", "--wait=false")

    def conditions():
        ns = json.loads(kubectl("get", "namespace", "held", "-o", "json").out)
        conds = {c["type"]: c for c in ns.get("status", {}).get("conditions") or ()}
        return conds if conds.get("NamespaceFinalizersRemaining", {}).get("status") == "True" else None

    conds = eventually_sync(conditions, timeout=30, interval=0.2, what="the namespace's conditions")
    assert conds["NamespaceContentRemaining"]["message"] == (
        "Some resources are remaining: gadgets.gc.example.com has 1 resource instances")
    assert conds["NamespaceFinalizersRemaining"]["message"] == (
        "Some content in the namespace has finalizers remaining: gc.example.com/hold in 1 resource instances")
    assert json.loads(kubectl("get", "namespace", "held", "-o", "json").out)["status"]["phase"] == "Terminating"
    kubectl("-n", "held", "patch", "gadget", "h", "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
    kubectl("wait", "--for=delete", "namespace/held", "--timeout=60s")
