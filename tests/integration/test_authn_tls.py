"""HTTPS and authentication with real kubectl and the official clients."""

from __future__ import annotations

import asyncio
import json
import os
import uuid

import pytest
import yaml
from kubernetes import client, config

from conftest import Kubectl, start_server


@pytest.fixture(scope="module")
def authn_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("authn")
    tokens = tmp / "tokens.csv"
    tokens.write_text('alice-token,alice,uid-alice,"devs,ops"\n')
    srv = start_server(tmp, extra=["--token-auth-file", str(tokens)])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def kc(authn_server, tmp_path_factory) -> Kubectl:
    return Kubectl(authn_server.kubeconfig, tmp_path_factory.mktemp("authn-kubectl"))


def no_cert_kubeconfig(srv, path, token: str | None = None) -> Kubectl:
    """A kubeconfig with the CA and (optionally) a token, but no client certificate."""
    doc = yaml.safe_load(srv.kubeconfig.read_text())
    doc["users"][0]["user"] = {"token": token} if token else {}
    path.write_text(yaml.safe_dump(doc))
    return Kubectl(path, path.parent)


def test_kubeconfig_carries_the_ca_and_the_admin_certificate(authn_server, kc):
    doc = yaml.safe_load(authn_server.kubeconfig.read_text())
    assert doc["clusters"][0]["cluster"]["server"].startswith("https://127.0.0.1:")
    assert "certificate-authority-data" in doc["clusters"][0]["cluster"]
    assert {"client-certificate-data", "client-key-data"} <= set(doc["users"][0]["user"])
    out = kc("auth", "whoami", "-o", "json").out
    info = json.loads(out)["status"]["userInfo"]
    assert info["username"] == "kubeplane-admin"
    assert info["groups"] == ["system:masters", "system:authenticated"]
    kc("get", "namespaces")  # no flags: TLS verified with the kubeconfig's CA


def test_bad_token_is_401_and_no_credentials_is_anonymous(authn_server, tmp_path):
    bad = no_cert_kubeconfig(authn_server, tmp_path / "bad", "not-a-token")
    res = bad("get", "pods", check=False)
    assert res.rc != 0 and "You must be logged in to the server" in res.err
    ctx = authn_server.ssl_context(client_cert=False)

    async def probe():
        import aiohttp

        async with aiohttp.ClientSession(authn_server.url, connector=aiohttp.TCPConnector(ssl=ctx)) as s:
            async with s.get("/api/v1/namespaces", headers={"Authorization": "Bearer nope"}) as r:
                body = await r.json()
                assert r.status == 401
                assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                "message": "Unauthorized", "reason": "Unauthorized", "code": 401}
            # RBAC lets anonymous requests reach the public info only (system:basic-user,
            # which allows SelfSubjectReviews, is bound to system:authenticated): the 403 names the user
            async with s.post("/apis/authentication.k8s.io/v1/selfsubjectreviews",
                              json={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}) as r:
                assert r.status == 403
                return (await r.json())["message"]

    message = asyncio.run(probe())
    assert message == ('selfsubjectreviews.authentication.k8s.io is forbidden: User "system:anonymous" cannot create '
                       'resource "selfsubjectreviews" in API group "authentication.k8s.io" at the cluster scope')


def test_token_auth_file_user(authn_server, tmp_path):
    alice = no_cert_kubeconfig(authn_server, tmp_path / "alice", "alice-token")
    info = json.loads(alice("auth", "whoami", "-o", "json").out)["status"]["userInfo"]
    assert info == {"username": "alice", "uid": "uid-alice", "groups": ["devs", "ops", "system:authenticated"]}


def test_create_token_then_use_it_and_review_it(authn_server, kc, tmp_path):
    name = f"robot-{uuid.uuid4().hex[:6]}"
    kc("create", "serviceaccount", name)
    sa_uid = kc("get", "serviceaccount", name, "-o", "jsonpath={.metadata.uid}").out
    token = kc("create", "token", name, "--duration=15m").out.strip()
    robot = no_cert_kubeconfig(authn_server, tmp_path / "robot", token)
    info = json.loads(robot("auth", "whoami", "-o", "json").out)["status"]["userInfo"]
    assert info["username"] == f"system:serviceaccount:default:{name}"
    assert info["uid"] == sa_uid
    assert info["groups"] == ["system:serviceaccounts", "system:serviceaccounts:default", "system:authenticated"]
    # too short a duration, as upstream's validation
    short = kc("create", "token", name, "--duration=5m", check=False)
    assert short.rc != 0 and "may not specify a duration less than 10 minutes" in short.err
    # TokenReview
    review = kc("create", "-f", "-", "-o", "json", stdin=json.dumps({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}})).out
    status = json.loads(review)["status"]
    assert status["authenticated"] is True and status["user"]["username"] == info["username"]
    assert status["audiences"] == ["https://kubernetes.default.svc.cluster.local"]
    # a token for another audience does not authenticate to the API server
    other = kc("create", "token", name, "--audience=vault").out.strip()
    denied = no_cert_kubeconfig(authn_server, tmp_path / "vault", other)
    assert "You must be logged in" in denied("get", "pods", check=False).err
    # deleting the ServiceAccount invalidates its tokens
    kc("delete", "serviceaccount", name)
    assert "You must be logged in" in robot("get", "pods", check=False).err


def test_token_bound_to_a_pod_dies_with_the_pod(authn_server, kc, tmp_path):
    name = f"bound-{uuid.uuid4().hex[:6]}"
    kc("create", "serviceaccount", name)
    kc("apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"serviceAccountName": name, "containers": [{"name": "c", "image": "busybox"}]}}))
    token = kc("create", "token", name, "--bound-object-kind=Pod", f"--bound-object-name={name}").out.strip()
    bound = no_cert_kubeconfig(authn_server, tmp_path / "bound", token)
    info = json.loads(bound("auth", "whoami", "-o", "json").out)["status"]["userInfo"]
    assert info["extra"]["authentication.kubernetes.io/pod-name"] == [name]
    kc("delete", "pod", name, "--grace-period=0", "--force", "--wait=true")
    assert "You must be logged in" in bound("get", "pods", check=False).err


def test_impersonation(kc):
    info = json.loads(kc("--as=bob", "--as-group=devs", "--as-group=qa", "auth", "whoami", "-o", "json").out)
    assert info["status"]["userInfo"] == {"username": "bob", "groups": ["devs", "qa", "system:authenticated"]}
    sa = json.loads(kc("--as=system:serviceaccount:kube-system:x", "auth", "whoami", "-o", "json").out)
    assert sa["status"]["userInfo"]["groups"] == ["system:serviceaccounts", "system:serviceaccounts:kube-system",
                                                  "system:authenticated"]
    bad = kc("--as-group=devs", "get", "pods", check=False)
    assert bad.rc != 0 and "without impersonating a user" in bad.err


def test_official_client_verifies_tls(authn_server):
    api = config.new_client_from_config(config_file=str(authn_server.kubeconfig))
    try:
        assert api.configuration.verify_ssl
        v1 = client.CoreV1Api(api)
        assert "default" in [n.metadata.name for n in v1.list_namespace().items]
        review = client.AuthenticationV1Api(api).create_self_subject_review(
            client.V1SelfSubjectReview(metadata=client.V1ObjectMeta()))
        assert review.status.user_info.username == "kubeplane-admin"
    finally:
        api.close()


def test_kubernetes_asyncio_verifies_tls(authn_server):
    from kubernetes_asyncio import client as aclient
    from kubernetes_asyncio import config as aconfig

    async def run() -> list[str]:
        api = await aconfig.new_client_from_config(config_file=str(authn_server.kubeconfig))
        async with api:
            assert api.configuration.verify_ssl
            ns = await aclient.CoreV1Api(api).list_namespace()
            return [n.metadata.name for n in ns.items]

    assert "kube-system" in asyncio.run(run())


def test_a_client_without_the_ca_refuses_the_server(authn_server, tmp_path):
    doc = yaml.safe_load(authn_server.kubeconfig.read_text())
    del doc["clusters"][0]["cluster"]["certificate-authority-data"]
    (tmp_path / "noca").write_text(yaml.safe_dump(doc))
    res = Kubectl(tmp_path / "noca", tmp_path)("get", "ns", check=False)
    assert res.rc != 0 and "certificate signed by unknown authority" in res.err


def test_certificates_are_reused_across_restarts_and_plain_http_needs_a_flag(tmp_path):
    first = start_server(tmp_path, storage="sqlite")
    ca = (first.data_dir / "pki" / "ca.crt").read_bytes()
    first.stop()
    second = start_server(tmp_path, storage="sqlite")
    try:
        assert (second.data_dir / "pki" / "ca.crt").read_bytes() == ca
        Kubectl(second.kubeconfig, tmp_path)("get", "ns")
        # the component kubeconfigs (kubeplane scheduler/controllers run apart)
        sched = yaml.safe_load((second.data_dir / "scheduler.kubeconfig").read_text())
        assert sched["clusters"][0]["cluster"]["server"] == second.url
        who = Kubectl(second.data_dir / "scheduler.kubeconfig", tmp_path)("auth", "whoami", "-o", "json").out
        assert json.loads(who)["status"]["userInfo"]["username"] == "system:kube-scheduler"
    finally:
        second.stop()
    plain = start_server(tmp_path / "plain", extra=["--insecure-http"])
    try:
        assert plain.url.startswith("http://127.0.0.1:")
    finally:
        plain.stop()
    import subprocess
    import sys

    refused = subprocess.run([sys.executable, "-m", "kubeplane.cli.main", "apiserver", "--storage", "memory",
                              "--listen", "0.0.0.0:0", "--insecure-http", "--data-dir", str(tmp_path / "x")],
                             capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert refused.returncode != 0 and "loopback addresses only" in refused.stderr + refused.stdout


def test_tls_files_given_on_the_command_line(tmp_path):
    from kubeplane.auth import pki

    own = pki.ensure_pki(str(tmp_path / "own"))
    cert, key = pki.issue(own.ca_cert, own.ca_key, "my-apiserver", server_names=("127.0.0.1", "localhost"),
                          client=False)
    (tmp_path / "s.crt").write_bytes(pki.cert_pem(cert) + own.ca_pem)  # with its chain
    (tmp_path / "s.key").write_bytes(pki.key_pem(key))
    # clients keep the data directory's admin certificate, so its CA verifies them
    srv = start_server(tmp_path, extra=["--tls-cert-file", str(tmp_path / "s.crt"),
                                        "--tls-private-key-file", str(tmp_path / "s.key")])
    try:
        import ssl

        ctx = ssl.create_default_context(cafile=own.ca_file)
        host, port = srv.host_port
        with ctx.wrap_socket(__import__("socket").create_connection((host, port)), server_hostname=host) as s:
            subject = dict(x[0] for x in s.getpeercert()["subject"])
        assert subject["commonName"] == "my-apiserver"
        doc = yaml.safe_load(srv.kubeconfig.read_text())
        import base64

        assert base64.b64decode(doc["clusters"][0]["cluster"]["certificate-authority-data"]) == own.ca_pem
    finally:
        srv.stop()



def test_client_ca_file(tmp_path):
    from kubeplane.auth import pki

    other = pki.ensure_pki(str(tmp_path / "other"))
    cert, key = pki.issue(other.ca_cert, other.ca_key, "dave", orgs=("auditors",))
    srv = start_server(tmp_path, extra=["--client-ca-file", other.ca_file])
    try:
        doc = yaml.safe_load(srv.kubeconfig.read_text())
        import base64

        doc["users"][0]["user"] = {"client-certificate-data": base64.b64encode(pki.cert_pem(cert)).decode(),
                                   "client-key-data": base64.b64encode(pki.key_pem(key)).decode()}
        (tmp_path / "dave.kc").write_text(yaml.safe_dump(doc))
        info = json.loads(Kubectl(tmp_path / "dave.kc", tmp_path)("auth", "whoami", "-o", "json").out)
        assert info["status"]["userInfo"]["username"] == "dave"
        assert info["status"]["userInfo"]["groups"] == ["auditors", "system:authenticated"]
        # The data directory's admin certificate is not from that CA: the TLS handshake
        # refuses it (Python's ssl verifies client certificates in the handshake; with
        # TLS 1.3 the client learns it on its first read).
        import ssl

        try:
            with srv.connect(timeout=10) as conn:
                conn.sendall(b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n")
                answer = conn.recv(1024)
        except (ssl.SSLError, ConnectionResetError):
            answer = b""
        assert answer == b""
    finally:
        srv.stop()
