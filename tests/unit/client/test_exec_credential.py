"""Exec credential plugins: HttpClient runs the kubeconfig's plugin as client-go
does, against a small server that records the Authorization header it gets."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from kubeplane.api.errors import StatusError
from kubeplane.api.resources import resource
from kubeplane.client.execcred import ExecCredentialError, ExecCredentialProvider
from kubeplane.client.http import HttpClient
from kubeplane.client.kubeconfig import KubeconfigError, load_kubeconfig

PODS = resource("pods")

PLUGIN = """#!{python}
import json, os, pathlib, sys
state = pathlib.Path(os.environ["PLUGIN_STATE"])
n = int(state.read_text()) + 1 if state.exists() else 1
state.write_text(str(n))
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
pathlib.Path(os.environ["PLUGIN_INFO"]).write_text(json.dumps({{"info": info, "argv": sys.argv[1:],
    "stdin_is_devnull": os.path.samefile("/dev/null", "/proc/self/fd/0") if os.path.exists("/proc/self/fd/0") else None}}))
if os.environ.get("PLUGIN_FAIL"):
    print("no credentials for you", file=sys.stderr)
    sys.exit(3)
status = {{}}
if os.environ.get("PLUGIN_CERT"):
    status["clientCertificateData"] = pathlib.Path(os.environ["PLUGIN_CERT"]).read_text()
    status["clientKeyData"] = pathlib.Path(os.environ["PLUGIN_KEY"]).read_text()
else:
    status["token"] = f"token-{{n}}"
if os.environ.get("PLUGIN_EXPIRY"):
    status["expirationTimestamp"] = os.environ["PLUGIN_EXPIRY"]
print(json.dumps({{"apiVersion": os.environ.get("PLUGIN_VERSION", info["apiVersion"]), "kind": "ExecCredential",
                  "status": status}}))
"""


class AuthServer:
    """Answers /version and GET pods; refuses the tokens in ``refused`` with 401."""

    def __init__(self) -> None:
        self.seen: list[str | None] = []
        self.refused: set[str] = set()
        self.app = web.Application()
        self.app.router.add_get("/version", self.version)
        self.app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", self.pod)
        self.app.router.add_get("/api/v1/namespaces/{ns}/pods", self.watch)

    def _check(self, request: web.Request) -> web.Response | None:
        auth = request.headers.get("Authorization")
        self.seen.append(auth)
        token = auth[len("Bearer "):] if auth and auth.startswith("Bearer ") else None
        if token is None or token in self.refused:
            return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                      "message": "Unauthorized", "reason": "Unauthorized", "code": 401}, status=401)
        return None

    async def version(self, request: web.Request) -> web.Response:
        return self._check(request) or web.json_response({"gitVersion": "v1.32.0"})

    async def pod(self, request: web.Request) -> web.Response:
        return self._check(request) or web.json_response(
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": request.match_info["name"]}})

    async def watch(self, request: web.Request) -> web.StreamResponse:
        refused = self._check(request)
        if refused is not None:
            return refused
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b'{"type":"ADDED","object":{"metadata":{"name":"w"}}}\n')
        await resp.write_eof()
        return resp


def write_plugin(tmp_path: Path) -> Path:
    path = tmp_path / "plugin.py"
    path.write_text(PLUGIN.format(python=sys.executable))
    path.chmod(0o755)
    return path


def kubeconfig(tmp_path: Path, server: str, exec_stanza: dict, cluster_extra: dict | None = None) -> str:
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server, **(cluster_extra or {})}}],
        "users": [{"name": "u", "user": {"exec": exec_stanza}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def stanza(tmp_path: Path, plugin: Path, **env: str) -> dict:
    base = {"PLUGIN_STATE": str(tmp_path / "runs"), "PLUGIN_INFO": str(tmp_path / "info.json")}
    base.update(env)
    return {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin), "args": ["--flag", "x"],
            "interactiveMode": "Never", "env": [{"name": k, "value": v} for k, v in base.items()]}


def runs(tmp_path: Path) -> int:
    p = tmp_path / "runs"
    return int(p.read_text()) if p.exists() else 0


@pytest.fixture
async def api():
    srv = AuthServer()
    server = TestServer(srv.app, host="127.0.0.1")
    await server.start_server()
    srv.url = str(server.make_url("")).rstrip("/")
    yield srv
    await server.close()


async def test_token_from_plugin_is_sent_and_cached(tmp_path, api):
    plugin = write_plugin(tmp_path)
    cfg = kubeconfig(tmp_path, api.url, stanza(tmp_path, plugin))
    async with HttpClient.from_kubeconfig(cfg) as client:
        assert (await client.get(PODS, "a", "default"))["metadata"]["name"] == "a"
        await client.get(PODS, "b", "default")
        await client.server_version()
    assert api.seen == ["Bearer token-1"] * 3
    assert runs(tmp_path) == 1  # no expirationTimestamp: cached for the client's life
    info = json.loads((tmp_path / "info.json").read_text())
    assert info["info"] == {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                            "spec": {"interactive": False}}
    assert info["argv"] == ["--flag", "x"]
    assert info["stdin_is_devnull"] is True  # Never: the plugin gets no terminal


async def test_expired_credentials_are_renewed(tmp_path, api):
    plugin = write_plugin(tmp_path)
    past = (datetime.now(timezone.utc) - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    cfg = kubeconfig(tmp_path, api.url, stanza(tmp_path, plugin, PLUGIN_EXPIRY=past))
    async with HttpClient.from_kubeconfig(cfg) as client:
        await client.get(PODS, "a", "default")
        await client.get(PODS, "b", "default")
    assert api.seen == ["Bearer token-1", "Bearer token-2"]


async def test_future_expiry_is_cached(tmp_path, api):
    plugin = write_plugin(tmp_path)
    future = (datetime.now(timezone.utc) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    cfg = kubeconfig(tmp_path, api.url, stanza(tmp_path, plugin, PLUGIN_EXPIRY=future))
    async with HttpClient.from_kubeconfig(cfg) as client:
        await client.get(PODS, "a", "default")
        await client.get(PODS, "b", "default")
    assert runs(tmp_path) == 1


async def test_401_runs_the_plugin_again_and_retries(tmp_path, api):
    plugin = write_plugin(tmp_path)
    api.refused.add("token-1")
    cfg = kubeconfig(tmp_path, api.url, stanza(tmp_path, plugin))
    async with HttpClient.from_kubeconfig(cfg) as client:
        assert (await client.get(PODS, "a", "default"))["metadata"]["name"] == "a"
        # A watch carries the renewed credentials too.
        events = [ev async for ev in client.watch(PODS, "default")]
    assert [e.type for e in events] == ["ADDED"]
    assert api.seen == ["Bearer token-1", "Bearer token-2", "Bearer token-2"]
    # Refused again after renewal: the 401 reaches the caller (one retry only).
    api.refused.update({"token-3", "token-4"})
    async with HttpClient.from_kubeconfig(cfg) as client:
        with pytest.raises(StatusError) as err:
            await client.get(PODS, "a", "default")
    assert err.value.code == 401
    assert runs(tmp_path) == 4


async def test_cluster_info_is_provided_when_asked(tmp_path, api):
    plugin = write_plugin(tmp_path)
    st = stanza(tmp_path, plugin)
    st["provideClusterInfo"] = True
    cfg = kubeconfig(tmp_path, api.url, st, {"extensions": [
        {"name": "client.authentication.k8s.io/exec", "extension": {"audience": "kubeplane"}}]})
    async with HttpClient.from_kubeconfig(cfg) as client:
        await client.server_version()
    info = json.loads((tmp_path / "info.json").read_text())["info"]
    assert info["spec"]["cluster"] == {"server": api.url, "config": {"audience": "kubeplane"}}


async def test_failures_are_clear(tmp_path, api, capfd):
    plugin = write_plugin(tmp_path)
    cfg = kubeconfig(tmp_path, api.url, stanza(tmp_path, plugin, PLUGIN_FAIL="1"))
    async with HttpClient.from_kubeconfig(cfg) as client:
        with pytest.raises(ExecCredentialError, match=f"executable {plugin} failed with exit code 3$"):
            await client.get(PODS, "a", "default")
    assert "no credentials for you" in capfd.readouterr().err  # the plugin's stderr is the user's
    missing = stanza(tmp_path, plugin)
    missing["command"] = "kubeplane-no-such-plugin"
    missing["installHint"] = "install it from example.com"
    cfg = kubeconfig(tmp_path, api.url, missing)
    async with HttpClient.from_kubeconfig(cfg) as client:
        with pytest.raises(ExecCredentialError, match="executable kubeplane-no-such-plugin not found"
                                                      "\n\ninstall it from example.com"):
            await client.get(PODS, "a", "default")
    wrong = stanza(tmp_path, plugin, PLUGIN_VERSION="client.authentication.k8s.io/v1beta1")
    cfg = kubeconfig(tmp_path, api.url, wrong)
    async with HttpClient.from_kubeconfig(cfg) as client:
        with pytest.raises(ExecCredentialError, match="plugin returned version client.authentication.k8s.io/v1beta1"):
            await client.get(PODS, "a", "default")
    assert api.seen == []  # nothing was sent without credentials


@pytest.mark.parametrize("change, message", [
    ({"apiVersion": "client.authentication.k8s.io/v1alpha1"}, "invalid apiVersion"),
    ({"interactiveMode": None}, "interactiveMode must be specified"),
    ({"interactiveMode": "Sometimes"}, 'invalid interactiveMode "Sometimes"'),
    ({"command": ""}, "command must be specified"),
])
def test_invalid_stanzas_are_rejected_at_load(tmp_path, change, message):
    st = stanza(tmp_path, Path("/bin/true"))
    st.update(change)
    st = {k: v for k, v in st.items() if v is not None}
    with pytest.raises(KubeconfigError, match=message):
        load_kubeconfig(kubeconfig(tmp_path, "http://127.0.0.1:1", st))


def test_v1beta1_defaults_interactive_mode_and_relative_command(tmp_path):
    (tmp_path / "bin").mkdir()
    st = {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "./bin/plugin"}
    cfg = load_kubeconfig(kubeconfig(tmp_path, "http://127.0.0.1:1", st))
    assert cfg.exec_config.interactive_mode == "IfAvailable"
    assert cfg.exec_config.command == str(tmp_path / "bin" / "plugin")


async def test_interactive_modes(tmp_path):
    plugin = write_plugin(tmp_path)
    cfg = load_kubeconfig(kubeconfig(tmp_path, "http://127.0.0.1:1", {**stanza(tmp_path, plugin),
                                                                        "interactiveMode": "Always"}))
    with pytest.raises(ExecCredentialError, match="standard input is not a terminal"):
        await ExecCredentialProvider(cfg.exec_config, stdin_is_terminal=False).get()
    cfg = load_kubeconfig(kubeconfig(tmp_path, "http://127.0.0.1:1", {**stanza(tmp_path, plugin),
                                                                        "interactiveMode": "IfAvailable"}))
    await ExecCredentialProvider(cfg.exec_config, stdin_is_terminal=False).get()
    assert json.loads((tmp_path / "info.json").read_text())["info"]["spec"]["interactive"] is False


def _make_cert(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not available")
async def test_client_certificate_from_plugin(tmp_path):
    server_cert, server_key = _make_cert(tmp_path, "server")
    client_cert, client_key = _make_cert(tmp_path, "client")
    seen: list[str] = []

    async def version(request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peercert")
        seen.append(dict(x[0] for x in peer["subject"])["commonName"])
        return web.json_response({"gitVersion": "v1.32.0"})

    app = web.Application()
    app.router.add_get("/version", version)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(server_cert, server_key)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cafile=str(client_cert))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server(ssl=ctx)
    try:
        url = f"https://127.0.0.1:{server.port}"
        plugin = write_plugin(tmp_path)
        cfg = kubeconfig(tmp_path, url, stanza(tmp_path, plugin, PLUGIN_CERT=str(client_cert),
                                               PLUGIN_KEY=str(client_key)),
                         {"certificate-authority": str(server_cert)})
        async with HttpClient.from_kubeconfig(cfg) as client:
            await client.server_version()
        assert seen == ["client"]
    finally:
        await server.close()
