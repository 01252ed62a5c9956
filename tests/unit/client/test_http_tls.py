"""The HTTP client over TLS: the CA, client certificates, tokens and tokenFile from a kubeconfig."""

from __future__ import annotations

import yaml

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import resource
from kubeplane.apiserver.app import APIServer, APIServerConfig, AuthenticationConfig
from kubeplane.client.http import HttpClient

REVIEWS = resource("selfsubjectreviews")


async def whoami(client: HttpClient) -> dict:
    out = await client.create(REVIEWS, {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    return out["status"]["userInfo"]


async def test_http_client_with_certificate_token_and_token_file(tmp_path):
    tokens = tmp_path / "tokens.csv"
    tokens.write_text("t0ken,alice,uid-a,devs\nn3w,carol,uid-c\n")
    kc = tmp_path / "kubeconfig"
    srv = APIServer(APIServerConfig(data_dir=str(tmp_path / "d"), listen="127.0.0.1:0", storage="memory",
                                    kubeconfig=str(kc), authentication=AuthenticationConfig(token_auth_file=str(tokens))))
    await srv.start()
    clients = []
    try:
        assert srv.url.startswith("https://")
        admin = HttpClient.from_kubeconfig(str(kc))
        clients.append(admin)
        assert (await whoami(admin))["username"] == "kubeplane-admin"

        # one client acting for several nodes (kubeplane nodes --impersonate-nodes)
        from kubeplane.auth.user import acting_as
        from kubeplane.controllers.nodeagent import node_user

        nodes = HttpClient.from_kubeconfig(str(kc), impersonate_context=True)
        clients.append(nodes)
        with acting_as(node_user("n1")):
            assert (await whoami(nodes)) == {"username": "system:node:n1",
                                             "groups": ["system:nodes", "system:authenticated"]}
            w = nodes.watch(resource("namespaces"), timeout_seconds=1)
            await w.close()
        assert (await whoami(nodes))["username"] == "kubeplane-admin"  # outside any component: itself

        doc = yaml.safe_load(kc.read_text())
        doc["users"][0]["user"] = {"token": "t0ken"}
        (tmp_path / "token.kc").write_text(yaml.safe_dump(doc))
        alice = HttpClient.from_kubeconfig(str(tmp_path / "token.kc"))
        clients.append(alice)
        assert (await whoami(alice)) == {"username": "alice", "uid": "uid-a",
                                         "groups": ["devs", "system:authenticated"]}

        (tmp_path / "tok").write_text("t0ken\n")
        doc["users"][0]["user"] = {"tokenFile": "tok"}  # relative to the kubeconfig
        (tmp_path / "file.kc").write_text(yaml.safe_dump(doc))
        from_file = HttpClient.from_kubeconfig(str(tmp_path / "file.kc"))
        clients.append(from_file)
        assert (await whoami(from_file))["username"] == "alice"
        # a rotated token file is read again (at most once a TOKEN_FILE_PERIOD)
        (tmp_path / "tok").write_text("n3w\n")
        assert (await whoami(from_file))["username"] == "alice"  # not yet read again
        from_file._token_file_read -= 61
        assert (await whoami(from_file))["username"] == "carol"

        doc["users"][0]["user"] = {"token": "wrong"}
        (tmp_path / "bad.kc").write_text(yaml.safe_dump(doc))
        bad = HttpClient.from_kubeconfig(str(tmp_path / "bad.kc"))
        clients.append(bad)
        try:
            await bad.list(resource("namespaces"))
        except StatusError as err:
            assert err.code == 401 and err.reason == "Unauthorized"
        else:
            raise AssertionError("a wrong token was accepted")
    finally:
        for c in clients:
            await c.close()
        await srv.stop()
