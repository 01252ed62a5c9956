"""Bootstrap tokens: the Secret ``kubeplane token create`` writes, the
authenticator's checks (type, secret, expiry, usage, groups), the detached
JWS of token discovery and the CA public key pin."""

from __future__ import annotations

import base64
import datetime as dt

import pytest

from kubeplane.auth import bootstraptoken as bt
from kubeplane.auth.authenticator import AuthenticationError

TOKEN = "abcdef.0123456789abcdef"
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def _getter(*secrets):
    by_name = {s["metadata"]["name"]: s for s in secrets}

    async def get(plural, name, namespace):
        assert plural == "secrets" and namespace == "kube-system"
        return by_name.get(name)

    return get


def test_token_secret_as_kubeadm_writes_it():
    s = bt.token_secret(TOKEN, description="d", now=NOW)
    assert s["type"] == "bootstrap.kubernetes.io/token"
    assert s["metadata"] == {"name": "bootstrap-token-abcdef", "namespace": "kube-system"}
    data = {k: base64.b64decode(v).decode() for k, v in s["data"].items()}
    assert data == {"token-id": "abcdef", "token-secret": "0123456789abcdef", "description": "d",
                    "expiration": "2026-01-02T00:00:00Z", "usage-bootstrap-authentication": "true",
                    "usage-bootstrap-signing": "true",
                    "auth-extra-groups": "system:bootstrappers:kubeplane:default-node-token"}
    assert "expiration" not in bt.token_secret(TOKEN, ttl=dt.timedelta(0))["data"]
    with pytest.raises(ValueError, match="was not of the form"):
        bt.token_secret("ABCDEF.0123456789abcdef")
    with pytest.raises(ValueError, match='invalid bootstrap token usage "fly"'):
        bt.token_secret(TOKEN, usages=("fly",))
    with pytest.raises(ValueError, match='bootstrap group "admins" is invalid'):
        bt.token_secret(TOKEN, groups=("admins",))
    assert bt.parse_token(bt.generate_token()) is not None


async def test_authenticates_a_valid_token():
    auth = bt.BootstrapTokenAuthenticator(_getter(bt.token_secret(TOKEN, now=NOW)), clock=lambda: NOW)
    resp = await auth.authenticate_token(TOKEN, ())
    assert resp.user.name == "system:bootstrap:abcdef"
    assert resp.user.groups == ("system:bootstrappers", "system:bootstrappers:kubeplane:default-node-token")


@pytest.mark.parametrize("change", ["wrong-secret", "expired", "no-auth-usage", "wrong-type", "deleting",
                                    "missing", "not-a-token"])
async def test_refuses(change):
    secret = bt.token_secret(TOKEN, now=NOW)
    token = TOKEN
    clock = NOW
    if change == "wrong-secret":
        token = "abcdef.ffffffffffffffff"
    elif change == "expired":
        clock = NOW + dt.timedelta(hours=25)
    elif change == "no-auth-usage":
        secret = bt.token_secret(TOKEN, usages=("signing",), now=NOW)
    elif change == "wrong-type":
        secret["type"] = "Opaque"
    elif change == "deleting":
        secret["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    elif change == "missing":
        token = "zzzzzz.0123456789abcdef"
    elif change == "not-a-token":
        token = "eyJhbGciOi.not.a-bootstrap-token"
    auth = bt.BootstrapTokenAuthenticator(_getter(secret), clock=lambda: clock)
    assert await auth.authenticate_token(token, ()) is None


async def test_a_bad_extra_group_is_an_error():
    secret = bt.token_secret(TOKEN, now=NOW)
    secret["data"]["auth-extra-groups"] = base64.b64encode(b"system:masters").decode()
    auth = bt.BootstrapTokenAuthenticator(_getter(secret), clock=lambda: NOW)
    with pytest.raises(AuthenticationError, match="invalid auth-extra-groups"):
        await auth.authenticate_token(TOKEN, ())


def test_detached_jws_round_trip():
    jws = bt.detached_jws("content", "abcdef", "0123456789abcdef")
    header, empty, sig = jws.split(".")
    assert empty == "" and header and sig
    assert bt.verify_detached_jws(jws, "content", "abcdef", "0123456789abcdef")
    assert not bt.verify_detached_jws(jws, "content!", "abcdef", "0123456789abcdef")
    assert not bt.verify_detached_jws(jws, "content", "abcdef", "ffffffffffffffff")
    assert not bt.verify_detached_jws(jws, "content", "zzzzzz", "0123456789abcdef")
    assert not bt.verify_detached_jws("garbage", "content", "abcdef", "0123456789abcdef")


def test_ca_cert_hash_pins_the_public_key(tmp_path):
    import hashlib

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from kubeplane.auth.pki import cert_pem, make_ca

    pem = cert_pem(make_ca()[0])
    cert = x509.load_pem_x509_certificate(pem)
    spki = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert bt.ca_cert_hash(pem) == "sha256:" + hashlib.sha256(spki).hexdigest()
    assert bt.matches_ca_hash(pem, [bt.ca_cert_hash(pem).upper().replace("SHA256", "sha256")])
    assert not bt.matches_ca_hash(pem, ["sha256:" + "0" * 64])
