"""CertificateSigningRequests in the registry: upstream's validation, the
requester recorded from the request's user, the immutable spec, and which
endpoint may write what (approval: Approved/Denied; status: certificate and
other conditions)."""

from __future__ import annotations

import base64

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.auth.user import UserInfo, acting_as
from kubeplane.registry.admission import default_chain
from kubeplane.registry.registry import Registry
from kubeplane.storage.memory import MemoryStore

CSRS = resource("certificatesigningrequests")
SIGNER = "kubernetes.io/kube-apiserver-client"


def make_request(cn="alice", orgs=(), key=None) -> bytes:
    key = key or ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)] + [
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    req = x509.CertificateSigningRequestBuilder().subject_name(x509.Name(attrs)).sign(key, hashes.SHA256())
    return req.public_bytes(serialization.Encoding.PEM)


def self_signed_pem() -> bytes:
    import datetime as dt

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "x")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def csr(name="alice", **spec) -> dict:
    body = {"request": b64(make_request()), "signerName": SIGNER, "usages": ["client auth"], **spec}
    return {"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
            "metadata": {"name": name}, "spec": {k: v for k, v in body.items() if v is not None}}


@pytest.fixture
async def registry():
    store = MemoryStore()
    reg = Registry(store, CATALOGUE)
    yield reg
    await reg.close()
    await store.close()


def causes(err: StatusError) -> list[tuple[str, str]]:
    return [(c["field"], c["message"]) for c in err.to_status()["details"]["causes"]]


JUNK = b"not a CSR"
INVALID = [
    ("request not PEM", {"request": b64(JUNK)}, "spec.request",
     "Invalid value: []byte{0x6e, 0x6f, 0x74, 0x20, 0x61, 0x20, 0x43, 0x53, 0x52}: "
     "PEM block type must be CERTIFICATE REQUEST"),
    ("request is a certificate", {"request": b64(self_signed_pem())}, "spec.request",
     "PEM block type must be CERTIFICATE REQUEST"),
    ("no signer", {"signerName": None}, "spec.signerName", "Required value"),
    ("signer without a path", {"signerName": "example.com"}, "spec.signerName",
     "Invalid value: \"example.com\": must be a fully qualified domain and path of the form "
     "'example.com/signer-name'"),
    ("signer domain of one label", {"signerName": "example/signer"}, "spec.signerName",
     "Invalid value: \"example\": should be a domain with at least two segments separated by dots"),
    ("legacy signer", {"signerName": "kubernetes.io/legacy-unknown"}, "spec.signerName",
     "Invalid value: \"kubernetes.io/legacy-unknown\": the legacy signerName is not allowed via this API version"),
    ("no usages", {"usages": []}, "spec.usages", "Required value"),
    ("unknown usage", {"usages": ["client auth", "flying"]}, "spec.usages[1]",
     'Unsupported value: "flying": supported values: "any", "cert sign"'),
    ("duplicate usage", {"usages": ["client auth", "client auth"]}, "spec.usages[1]",
     'Duplicate value: "client auth"'),
    ("too short", {"expirationSeconds": 599}, "spec.expirationSeconds",
     "Invalid value: 599: may not specify a duration less than 600 seconds (10 minutes)"),
]


@pytest.mark.parametrize("case, spec, field, message", INVALID, ids=[c[0] for c in INVALID])
async def test_invalid_requests_are_refused_as_upstream(registry, case, spec, field, message):
    with pytest.raises(StatusError) as err:
        await registry.create(CSRS, csr(**spec))
    assert err.value.code == 422 and err.value.reason == "Invalid"
    got = causes(err.value)
    assert any(f == field and (m.startswith(message) or m.endswith(": " + message)) for f, m in got), got


async def test_a_bad_signature_is_refused(registry):
    pem = make_request()
    der = x509.load_pem_x509_csr(pem).public_bytes(serialization.Encoding.DER)
    broken = der[:-3] + bytes([der[-3] ^ 0x55]) + der[-2:]  # in the signature
    forged = b"-----BEGIN CERTIFICATE REQUEST-----\n" + base64.encodebytes(broken) + \
        b"-----END CERTIFICATE REQUEST-----\n"
    with pytest.raises(StatusError) as err:
        await registry.create(CSRS, csr(request=b64(forged)))
    assert [f for f, _ in causes(err.value)] == ["spec.request"]


async def test_valid_request_records_the_requester_and_starts_pending(registry):
    body = csr(expirationSeconds=600, username="mallory", groups=["system:masters"])
    body["status"] = {"conditions": [{"type": "Approved", "status": "True"}], "certificate": b64(self_signed_pem())}
    user = UserInfo("alice", uid="u-1", groups=("devs", "system:authenticated"), extra={"scope": ("a",)})
    with acting_as(user):
        out = await registry.create(CSRS, body)
    assert out["spec"]["username"] == "alice" and out["spec"]["uid"] == "u-1"
    assert out["spec"]["groups"] == ["devs", "system:authenticated"] and out["spec"]["extra"] == {"scope": ["a"]}
    assert out["status"] == {}  # no pre-approved requests
    assert "generation" not in out["metadata"]


async def test_names_that_fit_a_path_segment(registry):
    await registry.create(CSRS, csr("node-csr-Ab_9.x:y"))
    for bad in ("a/b", "a%b", ".."):
        with pytest.raises(StatusError) as err:
            await registry.create(CSRS, csr(bad))
        assert causes(err.value)[0][0] == "metadata.name"


async def test_spec_is_immutable_and_main_endpoint_cannot_touch_status(registry):
    stored = await registry.create(CSRS, csr())
    changed = {**stored, "metadata": {**stored["metadata"], "labels": {"a": "b"}},
               "spec": {**stored["spec"], "signerName": "example.com/other", "usages": ["server auth"]},
               "status": {"conditions": [{"type": "Approved", "status": "True"}]}}
    out = await registry.update(CSRS, changed)
    assert out["metadata"]["labels"] == {"a": "b"}
    assert out["spec"] == stored["spec"] and out["status"] == {}


async def _approve(registry, obj, ctype="Approved"):
    body = {**obj, "status": {**obj.get("status", {}), "conditions": [
        *obj.get("status", {}).get("conditions", []),
        {"type": ctype, "status": "True", "reason": "KubectlApprove", "message": "ok"}]}}
    return await registry.update(CSRS, body, subresource="approval")


async def test_approval_endpoint_sets_approval_conditions_only(registry):
    stored = await registry.create(CSRS, csr())
    body = {**stored, "spec": {**stored["spec"], "signerName": "example.com/x"},
            "status": {"certificate": b64(self_signed_pem()),
                       "conditions": [{"type": "Approved", "status": "True", "reason": "KubectlApprove"}]}}
    out = await registry.update(CSRS, body, subresource="approval")
    assert out["spec"] == stored["spec"] and "certificate" not in out["status"]
    (cond,) = out["status"]["conditions"]
    assert cond["type"] == "Approved" and cond["lastUpdateTime"] and cond["lastTransitionTime"]
    # Denied next to Approved is refused
    with pytest.raises(StatusError) as err:
        await _approve(registry, out, "Denied")
    assert causes(err.value) == [("status.conditions[1].type",
                                  'Invalid value: "Denied": Approved and Denied conditions are mutually exclusive')]
    # and an approval cannot be taken back
    with pytest.raises(StatusError) as err:
        await registry.update(CSRS, {**out, "status": {"conditions": []}}, subresource="approval")
    assert causes(err.value) == [("status.conditions",
                                  'Forbidden: updates may not remove a condition of type "Approved"')]
    # condition status must be True for Approved
    fresh = await registry.create(CSRS, csr("bob"))
    with pytest.raises(StatusError) as err:
        await registry.update(CSRS, {**fresh, "status": {"conditions": [{"type": "Approved", "status": "False"}]}},
                              subresource="approval")
    assert causes(err.value) == [("status.conditions[0].status", 'Unsupported value: "False": supported values: "True"')]


async def test_status_endpoint_sets_the_certificate_not_the_approval(registry):
    stored = await _approve(registry, await registry.create(CSRS, csr()))
    # the approval conditions are kept from the stored object when their count is the same
    tampered = {**stored, "status": {"conditions": [{"type": "Approved", "status": "True", "reason": "Other"}]}}
    out = await registry.update(CSRS, tampered, subresource="status")
    assert out["status"]["conditions"] == stored["status"]["conditions"]
    # adding Denied through /status is forbidden
    with pytest.raises(StatusError) as err:
        await registry.update(CSRS, {**stored, "status": {"conditions": [
            *stored["status"]["conditions"], {"type": "Denied", "status": "True"}]}}, subresource="status")
    assert ("status.conditions", 'Forbidden: updates may not add a condition of type "Denied"') in causes(err.value)
    # the certificate, once, and must be PEM certificates
    with pytest.raises(StatusError) as err:
        await registry.update(CSRS, {**stored, "status": {**stored["status"], "certificate": b64(b"junk")}},
                              subresource="status")
    assert causes(err.value) == [("status.certificate", 'Invalid value: "<certificate data>": '
                                                        "must contain at least one CERTIFICATE PEM block")]
    cert = b64(self_signed_pem())
    issued = await registry.update(CSRS, {**stored, "status": {**stored["status"], "certificate": cert}},
                                   subresource="status")
    assert issued["status"]["certificate"] == cert
    with pytest.raises(StatusError) as err:
        await registry.update(CSRS, {**issued, "status": {**issued["status"], "certificate": b64(self_signed_pem())}},
                              subresource="status")
    assert causes(err.value) == [("status.certificate",
                                  "Forbidden: updates may not modify existing certificate content")]
    # Failed may be added through /status, with True only
    failed = await registry.update(CSRS, {**issued, "status": {**issued["status"], "conditions": [
        *issued["status"]["conditions"], {"type": "Failed", "status": "True", "reason": "X"}]}},
        subresource="status")
    assert [c["type"] for c in failed["status"]["conditions"]] == ["Approved", "Failed"]


async def test_the_approval_subresource_is_served_for_csrs_only(registry):
    assert "approval" in CSRS.subresources and "status" in CSRS.subresources
    assert all("approval" not in r.subresources for r in CATALOGUE.resources if r is not CSRS)


async def test_system_masters_through_the_client_signer_is_forbidden():
    store = MemoryStore()
    reg = Registry(store, CATALOGUE, admission=default_chain(store))
    body = csr(request=b64(make_request(orgs=("system:masters",))))
    with pytest.raises(StatusError) as err:
        await reg.create(CSRS, body)
    assert err.value.code == 403
    assert err.value.message == ('certificatesigningrequests.certificates.k8s.io "alice" is forbidden: use of '
                                 "kubernetes.io/kube-apiserver-client signer with system:masters group is not "
                                 "allowed")
    # other signers may ask for it (their own rules decide)
    await reg.create(CSRS, csr(signerName="example.com/mine", request=b64(make_request(orgs=("system:masters",)))))
    await store.close()


def test_discovery_lists_csrs_with_their_approval_subresource():
    from kubeplane.apiserver.discovery import aggregated, api_resource_list

    legacy = api_resource_list(CATALOGUE, "certificates.k8s.io", "v1")
    by_name = {r["name"]: r for r in legacy["resources"]}
    assert by_name["certificatesigningrequests"]["shortNames"] == ["csr"]
    assert by_name["certificatesigningrequests"]["namespaced"] is False
    assert by_name["certificatesigningrequests/approval"]["verbs"] == ["get", "patch", "update"]
    assert by_name["certificatesigningrequests/status"]["verbs"] == ["get", "patch", "update"]
    groups = aggregated(CATALOGUE, core=False)["items"]
    (group,) = [g for g in groups if g["metadata"]["name"] == "certificates.k8s.io"]
    (res,) = group["versions"][0]["resources"]
    assert {s["subresource"] for s in res["subresources"]} == {"status", "approval"}
