"""ServiceAccounts and CertificateSigningRequests with real kubectl against
``kubeplane up``: the default ServiceAccount and the root CA ConfigMap in
every namespace, ``kubectl create sa``, pods given their ServiceAccount and
the projected token volume, a missing account refused, and a CSR created,
approved with ``kubectl certificate approve``, issued by the cluster CA and
used by kubectl to authenticate."""

from __future__ import annotations

import base64
import datetime as dt
import json

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from conftest import Kubectl, start_server
from helpers import eventually_sync

MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sa-csr")
    srv = start_server(tmp, command="up", extra=["--nodes", "1"])
    try:
        # the cluster CA `up` made in <data-dir>/pki: it signs CSRs and is published as kube-root-ca.crt
        ca = x509.load_pem_x509_certificate((srv.data_dir / "pki" / "ca.crt").read_bytes())
        yield Kubectl(srv.kubeconfig, tmp / "home"), ca, srv
    finally:
        srv.stop()


def _json(kubectl, *args):
    return json.loads(kubectl(*args, "-o", "json").out)


def test_default_account_and_root_ca_in_every_namespace(cluster):
    kubectl, ca, _ = cluster
    kubectl("create", "namespace", "team-a")
    eventually_sync(lambda: kubectl("get", "sa", "default", "-n", "team-a", check=False).rc == 0,
                    what="default ServiceAccount in team-a")
    cm = eventually_sync(lambda: _json(kubectl, "get", "configmap", "kube-root-ca.crt", "-n", "team-a"),
                         what="kube-root-ca.crt in team-a")
    assert cm["data"]["ca.crt"] == ca.public_bytes(serialization.Encoding.PEM).decode()
    listed = kubectl("get", "sa", "-n", "team-a").out.split("\n")
    assert listed[0].split() == ["NAME", "SECRETS", "AGE"] and listed[1].split()[:2] == ["default", "0"]


def test_pods_get_their_service_account_and_the_token_volume(cluster):
    kubectl, _, _ = cluster
    kubectl("create", "serviceaccount", "robot")
    eventually_sync(lambda: kubectl("get", "sa", "default", check=False).rc == 0)
    kubectl("run", "with-robot", "--image=nginx", "--restart=Never",
            '--overrides={"spec":{"serviceAccountName":"robot"}}')
    kubectl("run", "plain", "--image=nginx", "--restart=Never")
    for name, account in (("with-robot", "robot"), ("plain", "default")):
        pod = yaml.safe_load(kubectl("get", "pod", name, "-o", "yaml").out)
        spec = pod["spec"]
        assert spec["serviceAccountName"] == account and spec["serviceAccount"] == account
        (vol,) = [v for v in spec["volumes"] if v["name"].startswith("kube-api-access-")]
        assert len(vol["name"]) == len("kube-api-access-") + 5
        sources = vol["projected"]["sources"]
        assert sources[0] == {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}
        assert sources[1] == {"configMap": {"name": "kube-root-ca.crt",
                                            "items": [{"key": "ca.crt", "path": "ca.crt"}]}}
        assert sources[2]["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"] == "metadata.namespace"
        assert spec["containers"][0]["volumeMounts"] == [
            {"mountPath": MOUNT_PATH, "name": vol["name"], "readOnly": True}]
    # opted out
    kubectl("run", "no-token", "--image=nginx", "--restart=Never",
            '--overrides={"spec":{"automountServiceAccountToken":false}}')
    spec = _json(kubectl, "get", "pod", "no-token")["spec"]
    assert "volumes" not in spec and "volumeMounts" not in spec["containers"][0]


def test_a_pod_of_a_missing_account_is_refused(cluster):
    kubectl, _, _ = cluster
    res = kubectl("run", "ghost", "--image=nginx", "--restart=Never",
                  '--overrides={"spec":{"serviceAccountName":"nobody"}}', check=False)
    assert res.rc != 0
    assert ('Error from server (Forbidden): pods "ghost" is forbidden: error looking up service account '
            'default/nobody: serviceaccount "nobody" not found') in res.err


def test_csr_approved_with_kubectl_is_issued_by_the_cluster_ca_and_authenticates(cluster):
    kubectl, ca, srv = cluster
    key = ec.generate_private_key(ec.SECP256R1())
    req = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "jane"),
                                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "devs")]))
           .sign(key, hashes.SHA256()))
    manifest = {
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest", "metadata": {"name": "jane"},
        "spec": {"request": base64.b64encode(req.public_bytes(serialization.Encoding.PEM)).decode(),
                 "signerName": "kubernetes.io/kube-apiserver-client", "expirationSeconds": 86400,
                 "usages": ["client auth"]},
    }
    kubectl("create", "-f", "-", stdin=json.dumps(manifest))
    row = kubectl("get", "csr", "jane", "--no-headers").out.split()
    assert row[2:] == ["kubernetes.io/kube-apiserver-client", row[3], "24h", "Pending"]
    assert "approved" in kubectl("certificate", "approve", "jane").out

    def certificate():
        status = _json(kubectl, "get", "csr", "jane").get("status") or {}
        return status.get("certificate")

    pem = base64.b64decode(eventually_sync(certificate, what="certificate issued"))
    cert = x509.load_pem_x509_certificate(pem)
    cert.verify_directly_issued_by(ca)
    assert cert.subject == req.subject
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH]
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert lifetime == dt.timedelta(days=1)  # 24 h backdated by 5 minutes at both ends
    assert kubectl("get", "csr", "jane", "--no-headers").out.split()[-1] == "Approved,Issued"
    conds = _json(kubectl, "get", "csr", "jane")["status"]["conditions"]
    assert [(c["type"], c["reason"]) for c in conds] == [("Approved", "KubectlApprove")]
    # a decision cannot be reversed
    res = kubectl("certificate", "deny", "jane", check=False)
    assert res.rc != 0 and "already Approved" in res.err
    # and the certificate authenticates: kubectl with it is jane of devs
    home = kubectl.cache_dir / "jane"
    home.mkdir()
    (home / "jane.crt").write_bytes(pem)
    (home / "jane.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                      serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption()))
    kubeconfig = home / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "jane",
        "clusters": [{"name": "c", "cluster": {"server": srv.url, "certificate-authority": srv.ca_file}}],
        "users": [{"name": "jane", "user": {"client-certificate": str(home / "jane.crt"),
                                            "client-key": str(home / "jane.key")}}],
        "contexts": [{"name": "jane", "context": {"cluster": "c", "user": "jane"}}],
    }))
    whoami = json.loads(Kubectl(kubeconfig, home)("auth", "whoami", "-o", "json").out)
    assert whoami["status"]["userInfo"]["username"] == "jane"
    assert "devs" in whoami["status"]["userInfo"]["groups"]


def test_csr_for_system_masters_is_forbidden(cluster):
    kubectl, _, _ = cluster
    key = ec.generate_private_key(ec.SECP256R1())
    req = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "root"),
                                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters")]))
           .sign(key, hashes.SHA256()))
    manifest = {
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest", "metadata": {"name": "root"},
        "spec": {"request": base64.b64encode(req.public_bytes(serialization.Encoding.PEM)).decode(),
                 "signerName": "kubernetes.io/kube-apiserver-client", "usages": ["client auth"]},
    }
    res = kubectl("create", "-f", "-", stdin=json.dumps(manifest), check=False)
    assert res.rc != 0
    assert "use of kubernetes.io/kube-apiserver-client signer with system:masters group is not allowed" in res.err
