"""serviceaccounts/<name>/token (TokenRequest), as upstream's TokenREST validates and binds."""

from __future__ import annotations

import pytest

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import CATALOGUE, resource
from kubeplane.apiserver.app import ensure_default_namespaces
from kubeplane.apiserver.authn import token_request
from kubeplane.auth import jwt, pki
from kubeplane.auth.serviceaccount import TokenIssuer
from kubeplane.registry.registry import Registry
from kubeplane.storage import MemoryStore

AUD = ("https://kubernetes.default.svc.cluster.local",)


@pytest.fixture
async def reg():
    store = MemoryStore()
    r = Registry(store, CATALOGUE)
    await ensure_default_namespaces(r)
    await r.create(resource("serviceaccounts"), {"metadata": {"name": "robot"}}, "default")
    await r.create(resource("pods"), {"metadata": {"name": "p"}, "spec": {
        "serviceAccountName": "other", "containers": [{"name": "c", "image": "x"}]}}, "default")
    yield r
    await r.close()
    await store.close()


async def request(reg, body, issuer=None):
    return await token_request(reg, CATALOGUE, issuer or TokenIssuer(pki.new_key()), AUD, "default", "robot", body)


async def test_defaults_and_claims(reg):
    key = pki.new_key()
    out = await request(reg, {"spec": {}}, TokenIssuer(key))
    assert out["kind"] == "TokenRequest" and out["spec"]["expirationSeconds"] == 3600
    assert out["spec"]["audiences"] == list(AUD)
    claims = jwt.verify(out["status"]["token"], [key.public_key()])
    assert claims["sub"] == "system:serviceaccount:default:robot"
    assert claims["exp"] - claims["iat"] == 3600
    sa = await reg.get(resource("serviceaccounts"), "robot", "default")
    assert claims["kubernetes.io"]["serviceaccount"] == {"name": "robot", "uid": sa["metadata"]["uid"]}


async def test_expiration_bounds(reg):
    with pytest.raises(StatusError) as err:
        await request(reg, {"spec": {"expirationSeconds": 599}})
    assert err.value.code == 422
    assert err.value.message == ('TokenRequest.authentication.k8s.io "robot" is invalid: spec.expirationSeconds: '
                                 'Invalid value: 599: may not specify a duration less than 10 minutes')
    assert (err.value.kind, err.value.group) == ("TokenRequest", "authentication.k8s.io")
    with pytest.raises(StatusError) as err:
        await request(reg, {"spec": {"expirationSeconds": (1 << 32) + 1}})
    assert "may not specify a duration larger than 2^32 seconds" in err.value.message


async def test_binding_to_a_pod_of_another_service_account_is_refused(reg):
    with pytest.raises(StatusError) as err:
        await request(reg, {"spec": {"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "p"}}})
    assert err.value.code == 400
    assert 'cannot bind token for serviceaccount "robot" to pod running with different serviceaccount name' \
        in err.value.message
    with pytest.raises(StatusError) as err:
        await request(reg, {"spec": {"boundObjectRef": {"kind": "ConfigMap", "apiVersion": "v1", "name": "p"}}})
    assert err.value.code == 400
    with pytest.raises(StatusError) as err:
        await request(reg, {"spec": {"boundObjectRef": {"kind": "Secret", "apiVersion": "v1", "name": "gone"}}})
    assert err.value.code == 404


async def test_missing_service_account_is_not_found(reg):
    with pytest.raises(StatusError) as err:
        await token_request(reg, CATALOGUE, TokenIssuer(pki.new_key()), AUD, "default", "nobody", {})
    assert err.value.code == 404 and err.value.message == 'serviceaccounts "nobody" not found'


async def test_body_of_another_kind_or_version_is_a_bad_request(reg):
    for body, words in (([], "must be a JSON object"),
                        ({"apiVersion": "v1", "spec": {}}, "the API version in the data (v1) does not match"),
                        ({"kind": "TokenReview", "spec": {}},
                         "the kind in the data (TokenReview) does not match the expected kind (TokenRequest)")):
        with pytest.raises(StatusError) as err:
            await request(reg, body)
        assert err.value.code == 400 and words in err.value.message
