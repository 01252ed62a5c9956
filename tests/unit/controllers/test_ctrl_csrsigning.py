"""The CSR signer: approved requests of the built-in signers get a
certificate that verifies against the CA, with the request's subject and
names, the requested usages and lifetime (capped); requests its rules forbid
get a Failed condition; pending, denied and foreign requests are left alone."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from helpers import eventually
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.client.inprocess import InProcessClient
from kubeplane.controllers.csrsigning import (
    CertificateAuthority,
    CSRSigningController,
    requested_duration,
)
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

CSRS = resource("certificatesigningrequests")
NOW = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.timezone.utc)


def make_ca(days=3650, start=NOW - dt.timedelta(days=1)):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-ca")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(7).not_valid_before(start).not_valid_after(start + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return CertificateAuthority(cert, key)


def make_request(cn, orgs=(), dns=(), ips=()):
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)] + [
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name(attrs))
    names = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM), key


@pytest.fixture
async def env():
    store = MemoryStore()
    registry = Registry(store, CATALOGUE)
    client = InProcessClient(registry)
    ca = make_ca()
    ctrl = CSRSigningController(client, ca, clock=lambda: NOW)
    await ctrl.start()
    yield client, ca, ctrl
    await ctrl.stop()
    await client.close()
    await registry.close()
    await store.close()


async def submit(client, name, pem, signer="kubernetes.io/kube-apiserver-client", usages=("client auth",),
                 expiration=None, condition="Approved"):
    spec = {"request": base64.b64encode(pem).decode(), "signerName": signer, "usages": list(usages)}
    if expiration is not None:
        spec["expirationSeconds"] = expiration
    obj = await client.create(CSRS, {"metadata": {"name": name}, "spec": spec})
    if condition:
        obj = {**obj, "status": {"conditions": [{"type": condition, "status": "True", "reason": "Test"}]}}
        obj = await client.update(CSRS, obj, subresource="approval")
    return obj


async def issued(client, name):
    csr = await client.get(CSRS, name)
    pem = (csr.get("status") or {}).get("certificate")
    return x509.load_pem_x509_certificate(base64.b64decode(pem)) if pem else None


async def failed(client, name):
    csr = await client.get(CSRS, name)
    return next((c for c in (csr.get("status") or {}).get("conditions", []) if c["type"] == "Failed"), None)


async def test_client_certificate_issued_and_verifies(env):
    client, ca, _ = env
    pem, key = make_request("alice", orgs=("devs", "ops"))
    await submit(client, "alice", pem, usages=("digital signature", "key encipherment", "client auth"),
                 expiration=3600)
    cert = await eventually(lambda: issued(client, "alice"), what="certificate issued")
    # signed by the CA
    cert.verify_directly_issued_by(ca.cert)
    assert cert.issuer == ca.cert.subject
    # the request's subject and key
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "alice"
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == ["devs", "ops"]
    assert cert.public_key().public_numbers() == key.public_key().public_numbers()
    # the usages asked for; not a CA
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH]
    ku = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert ku.digital_signature and ku.key_encipherment and not ku.key_cert_sign
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    # expirationSeconds: a short certificate is backdated at its start only
    assert cert.not_valid_before_utc == NOW - dt.timedelta(minutes=5)
    assert cert.not_valid_after_utc == NOW + dt.timedelta(hours=1)


async def test_long_lifetimes_are_capped_and_backdated(env):
    client, ca, ctrl = env
    await submit(client, "long", make_request("bob")[0], expiration=10 * 365 * 86400)
    cert = await eventually(lambda: issued(client, "long"))
    assert cert.not_valid_after_utc == NOW + ctrl.cert_ttl - dt.timedelta(minutes=5)
    # no expirationSeconds: the signer's maximum
    await submit(client, "default", make_request("carol")[0])
    cert = await eventually(lambda: issued(client, "default"))
    assert cert.not_valid_after_utc == NOW + dt.timedelta(days=365) - dt.timedelta(minutes=5)


def test_requested_duration_bounds():
    year = dt.timedelta(days=365)
    assert requested_duration(year, None) == year
    assert requested_duration(year, 600) == dt.timedelta(minutes=10)
    assert requested_duration(year, 86400) == dt.timedelta(days=1)
    assert requested_duration(year, 10**9) == year
    assert requested_duration(dt.timedelta(hours=1), 86400) == dt.timedelta(hours=1)


async def test_certificate_never_outlives_the_ca():
    ca = make_ca(days=2)  # ends NOW + 1 day
    pem, _ = make_request("dave")
    cert = x509.load_pem_x509_certificate(ca.sign(x509.load_pem_x509_csr(pem), ["client auth"],
                                                  dt.timedelta(days=30), NOW))
    assert cert.not_valid_after_utc == ca.cert.not_valid_after_utc


REFUSED = [
    ("client signer: server usage", "kubernetes.io/kube-apiserver-client", dict(cn="eve"),
     ("client auth", "server auth"), "invalid usage for client certificate: server auth"),
    ("client signer: no client auth", "kubernetes.io/kube-apiserver-client", dict(cn="eve"),
     ("digital signature",), "missing required usage for client certificate: client auth"),
    ("kubelet client: wrong organization", "kubernetes.io/kube-apiserver-client-kubelet",
     dict(cn="system:node:n1", orgs=("devs",)), ("digital signature", "client auth"),
     "subject organization is not system:nodes"),
    ("kubelet client: not a node name", "kubernetes.io/kube-apiserver-client-kubelet",
     dict(cn="alice", orgs=("system:nodes",)), ("digital signature", "client auth"),
     "subject common name does not begin with system:node:"),
    ("kubelet client: with a DNS name", "kubernetes.io/kube-apiserver-client-kubelet",
     dict(cn="system:node:n1", orgs=("system:nodes",), dns=("n1",)), ("digital signature", "client auth"),
     "DNS subjectAltNames are not allowed"),
    ("kubelet client: usages", "kubernetes.io/kube-apiserver-client-kubelet",
     dict(cn="system:node:n1", orgs=("system:nodes",)), ("client auth",),
     "usages did not match [client auth digital signature key encipherment]"),
    ("kubelet serving: no names", "kubernetes.io/kubelet-serving",
     dict(cn="system:node:n1", orgs=("system:nodes",)), ("digital signature", "server auth"),
     "DNS or IP subjectAltName is required"),
]


@pytest.mark.parametrize("case, signer, subject, usages, message", REFUSED, ids=[c[0] for c in REFUSED])
async def test_signer_rules_give_a_failed_condition(env, case, signer, subject, usages, message):
    client, _, _ = env
    await submit(client, "r", make_request(**subject)[0], signer=signer, usages=usages)
    cond = await eventually(lambda: failed(client, "r"), what="Failed condition")
    assert cond["status"] == "True" and cond["reason"] == "SignerValidationFailure"
    assert cond["message"] == message
    assert await issued(client, "r") is None


async def test_kubelet_certificates(env):
    client, ca, _ = env
    await submit(client, "kc", make_request("system:node:n1", orgs=("system:nodes",))[0],
                 signer="kubernetes.io/kube-apiserver-client-kubelet",
                 usages=("digital signature", "key encipherment", "client auth"))
    cert = await eventually(lambda: issued(client, "kc"))
    cert.verify_directly_issued_by(ca.cert)
    await submit(client, "ks", make_request("system:node:n1", orgs=("system:nodes",), dns=("n1.local",),
                                            ips=("10.0.0.1",))[0],
                 signer="kubernetes.io/kubelet-serving", usages=("digital signature", "server auth"))
    cert = await eventually(lambda: issued(client, "ks"))
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["n1.local"]
    assert [str(i) for i in san.get_values_for_type(x509.IPAddress)] == ["10.0.0.1"]
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH]


async def test_pending_denied_and_foreign_requests_are_left_alone(env):
    client, _, ctrl = env
    await submit(client, "pending", make_request("a")[0], condition=None)
    await submit(client, "denied", make_request("b")[0], condition="Denied")
    await submit(client, "foreign", make_request("c")[0], signer="example.com/other")
    # a positive sync point: a later approved request is signed
    await submit(client, "later", make_request("d")[0])
    await eventually(lambda: issued(client, "later"))
    await eventually(lambda: ctrl.idle)
    for name in ("pending", "denied", "foreign"):
        csr = await client.get(CSRS, name)
        assert "certificate" not in (csr.get("status") or {}) and await failed(client, name) is None


def test_ca_from_pem_files(tmp_path):
    ca = make_ca()
    cert_file, key_file = tmp_path / "ca.crt", tmp_path / "ca.key"
    cert_file.write_bytes(ca.cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(ca.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()))
    loaded = CertificateAuthority.from_files(str(cert_file), str(key_file))
    assert loaded.cert == ca.cert
