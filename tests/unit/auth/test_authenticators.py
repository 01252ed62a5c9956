"""Each authenticator, and their union as the API server asks it."""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import Encoding

from kubeplane.auth import jwt, pki
from kubeplane.auth.authenticator import (DEFAULT_ISSUER, AuthenticationError, RequestAuthenticator,
                                          ServiceAccountTokenAuthenticator, TokenFileAuthenticator,
                                          X509Authenticator, bearer_token)
from kubeplane.auth.serviceaccount import TokenIssuer
from kubeplane.auth.user import ANONYMOUS


def der(cert) -> bytes:
    return cert.public_bytes(Encoding.DER)


# -- x509 -------------------------------------------------------------------------

def test_x509_user_is_cn_and_groups_are_o(tmp_path):
    p = pki.ensure_pki(str(tmp_path))
    cert, _ = pki.issue(p.ca_cert, p.ca_key, "alice", orgs=("devs", "ops"))
    user = X509Authenticator().authenticate_cert(der(cert))
    assert user.name == "alice" and user.groups == ("devs", "ops")
    assert user.extra["authentication.kubernetes.io/credential-id"][0].startswith("X509SHA256=")


def test_x509_serving_only_certificate_is_refused(tmp_path):
    p = pki.ensure_pki(str(tmp_path))
    cert, _ = pki.issue(p.ca_cert, p.ca_key, "kube-apiserver", server_names=("localhost",), client=False)
    with pytest.raises(AuthenticationError, match="incompatible key usage"):
        X509Authenticator().authenticate_cert(der(cert))


# -- token file ---------------------------------------------------------------------

async def test_token_file_csv(tmp_path):
    f = tmp_path / "tokens.csv"
    f.write_text('tok1,alice,uid-1,"devs,ops"\ntok2,bob,uid-2\n\n')
    auth = TokenFileAuthenticator.from_file(str(f))
    alice = (await auth.authenticate_token("tok1", ())).user
    assert (alice.name, alice.uid, alice.groups) == ("alice", "uid-1", ("devs", "ops"))
    assert (await auth.authenticate_token("tok2", ())).user.groups == ()
    assert await auth.authenticate_token("nope", ()) is None


def test_token_file_needs_three_columns(tmp_path):
    f = tmp_path / "tokens.csv"
    f.write_text("tok1,alice\n")
    with pytest.raises(ValueError, match="must have at least 3 columns"):
        TokenFileAuthenticator.from_file(str(f))


# -- ServiceAccount tokens -------------------------------------------------------------

class Objects:
    def __init__(self) -> None:
        self.objs: dict[tuple[str, str, str | None], dict] = {}

    def add(self, plural: str, name: str, uid: str, namespace: str | None = "default", **extra) -> dict:
        obj = {"metadata": {"name": name, "uid": uid, **({"namespace": namespace} if namespace else {})}, **extra}
        self.objs[(plural, name, namespace)] = obj
        return obj

    async def get(self, plural: str, name: str, namespace: str | None):
        return self.objs.get((plural, name, namespace))


@pytest.fixture
def sa_setup():
    objs = Objects()
    objs.add("serviceaccounts", "robot", "sa-uid")
    objs.add("pods", "web", "pod-uid", spec={"serviceAccountName": "robot"})
    objs.add("nodes", "node-0", "node-uid", namespace=None)
    key = pki.new_key()
    now = [1_000_000.0]
    issuer = TokenIssuer(key, clock=lambda: now[0])
    auth = ServiceAccountTokenAuthenticator([key.public_key()], objs.get, clock=lambda: now[0])
    return objs, issuer, auth, now


async def test_bound_token_names_the_service_account_and_pod(sa_setup):
    objs, issuer, auth, _ = sa_setup
    token, _ = issuer.issue("default", "robot", "sa-uid", [DEFAULT_ISSUER], 3600, pod=("web", "pod-uid"),
                            node=("node-0", "node-uid"))
    resp = await auth.authenticate_token(token, (DEFAULT_ISSUER,))
    user = resp.user
    assert user.name == "system:serviceaccount:default:robot" and user.uid == "sa-uid"
    assert user.groups == ("system:serviceaccounts", "system:serviceaccounts:default")
    assert user.extra["authentication.kubernetes.io/pod-name"] == ("web",)
    assert user.extra["authentication.kubernetes.io/pod-uid"] == ("pod-uid",)
    assert user.extra["authentication.kubernetes.io/node-name"] == ("node-0",)
    assert user.extra["authentication.kubernetes.io/credential-id"][0].startswith("JTI=")
    assert resp.audiences == (DEFAULT_ISSUER,)


async def test_expired_token_is_refused(sa_setup):
    _, issuer, auth, now = sa_setup
    token, _ = issuer.issue("default", "robot", "sa-uid", [DEFAULT_ISSUER], 600)
    now[0] += 600 + 61
    with pytest.raises(AuthenticationError, match="expired"):
        await auth.authenticate_token(token, (DEFAULT_ISSUER,))


async def test_wrong_audience_is_refused(sa_setup):
    _, issuer, auth, _ = sa_setup
    token, _ = issuer.issue("default", "robot", "sa-uid", ["vault"], 3600)
    with pytest.raises(AuthenticationError, match="audiences"):
        await auth.authenticate_token(token, (DEFAULT_ISSUER,))
    assert (await auth.authenticate_token(token, ("vault",))).audiences == ("vault",)


async def test_bound_objects_must_still_exist_with_the_same_uid(sa_setup):
    objs, issuer, auth, _ = sa_setup
    token, _ = issuer.issue("default", "robot", "sa-uid", [DEFAULT_ISSUER], 3600, pod=("web", "pod-uid"))
    objs.add("pods", "web", "another-uid")  # deleted and recreated
    with pytest.raises(AuthenticationError, match="does not match claim"):
        await auth.authenticate_token(token, (DEFAULT_ISSUER,))
    del objs.objs[("pods", "web", "default")]
    with pytest.raises(AuthenticationError, match="has been deleted"):
        await auth.authenticate_token(token, (DEFAULT_ISSUER,))
    del objs.objs[("serviceaccounts", "robot", "default")]
    plain, _ = issuer.issue("default", "robot", "sa-uid", [DEFAULT_ISSUER], 3600)
    with pytest.raises(AuthenticationError, match="service account default/robot has been deleted"):
        await auth.authenticate_token(plain, (DEFAULT_ISSUER,))


async def test_signature_by_another_key_or_a_changed_payload_is_refused(sa_setup):
    _, issuer, auth, now = sa_setup
    other = TokenIssuer(pki.new_key(), clock=lambda: now[0])
    token, _ = other.issue("default", "robot", "sa-uid", [DEFAULT_ISSUER], 3600)
    with pytest.raises(AuthenticationError, match="invalid signature"):
        await auth.authenticate_token(token, (DEFAULT_ISSUER,))
    good, _ = issuer.issue("default", "robot", "sa-uid", [DEFAULT_ISSUER], 3600)
    assert await auth.authenticate_token(good, (DEFAULT_ISSUER,)) is not None
    h, c, s = good.split(".")
    claims = jwt.unverified(good)[1]
    claims["sub"] = "system:serviceaccount:kube-system:admin"
    forged = jwt.b64url(__import__("orjson").dumps(claims))
    with pytest.raises(AuthenticationError, match="invalid signature"):
        await auth.authenticate_token(f"{h}.{forged}.{s}", (DEFAULT_ISSUER,))


async def test_another_issuer_or_not_a_jwt_is_not_ours(sa_setup):
    _, _, auth, now = sa_setup
    foreign = TokenIssuer(pki.new_key(), issuer="https://elsewhere", clock=lambda: now[0])
    token, _ = foreign.issue("default", "robot", "sa-uid", [DEFAULT_ISSUER], 3600)
    assert await auth.authenticate_token(token, (DEFAULT_ISSUER,)) is None
    assert await auth.authenticate_token("opaque-token", (DEFAULT_ISSUER,)) is None


async def test_rs256_keys_work_too():
    objs = Objects()
    objs.add("serviceaccounts", "robot", "sa-uid")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    token, _ = TokenIssuer(key).issue("default", "robot", "sa-uid", [DEFAULT_ISSUER], 3600)
    assert jwt.unverified(token)[0]["alg"] == "RS256"
    auth = ServiceAccountTokenAuthenticator([key.public_key()], objs.get)
    assert (await auth.authenticate_token(token, ())).user.name == "system:serviceaccount:default:robot"


async def test_legacy_secret_token(sa_setup):
    objs, issuer, auth, _ = sa_setup
    token = issuer.legacy("default", "robot", "sa-uid", "robot-token")
    assert await _raises(auth.authenticate_token(token, ()), "secret default/robot-token has been deleted")
    objs.add("secrets", "robot-token", "s-uid", data={"token": base64.b64encode(token.encode()).decode()})
    assert (await auth.authenticate_token(token, ())).user.name == "system:serviceaccount:default:robot"
    objs.add("secrets", "robot-token", "s-uid", data={"token": base64.b64encode(b"other").decode()})
    assert await _raises(auth.authenticate_token(token, ()), "does not match")


async def _raises(coro, text: str) -> bool:
    try:
        await coro
    except AuthenticationError as exc:
        return text in str(exc)
    return False


def test_public_keys_load_from_pem_of_any_kind(tmp_path):
    key = pki.new_key()
    (tmp_path / "k.pem").write_bytes(pki.key_pem(key))
    keys = jwt.load_public_keys(str(tmp_path / "k.pem"))
    assert jwt.key_id(keys[0]) == jwt.key_id(key.public_key())


# -- the union ------------------------------------------------------------------------

async def test_union_order_anonymous_and_bad_credentials(tmp_path):
    p = pki.ensure_pki(str(tmp_path))
    cert, _ = pki.issue(p.ca_cert, p.ca_key, "carol", orgs=("system:masters",))
    f = tmp_path / "tokens.csv"
    f.write_text("tok1,alice,uid-1\n")
    union = RequestAuthenticator(X509Authenticator(), [TokenFileAuthenticator.from_file(str(f))])
    # a certificate wins over a token, as upstream's x509 authenticator comes first
    user = await union.authenticate(der(cert), "Bearer bad")
    assert user.name == "carol" and user.groups == ("system:masters", "system:authenticated")
    alice = await union.authenticate(None, "Bearer tok1")
    assert alice.groups == ("system:authenticated",)
    assert await union.authenticate(None, None) == ANONYMOUS
    assert await union.authenticate(None, "Basic YTpi") == ANONYMOUS  # not a bearer token: no credential
    with pytest.raises(AuthenticationError):
        await union.authenticate(None, "Bearer bad")
    union.anonymous = False
    with pytest.raises(AuthenticationError):
        await union.authenticate(None, None)


def test_bearer_token_parsing():
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer abc extra") == "abc"
    assert bearer_token("Bearer ") is None
    assert bearer_token("Basic abc") is None
    assert bearer_token(None) is None
