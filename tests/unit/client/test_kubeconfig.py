from __future__ import annotations

import base64
import os
import shutil
import ssl
from pathlib import Path

import pytest
import yaml

from kubeplane.client.kubeconfig import (
    ClientConfig,
    KubeconfigError,
    load_kubeconfig,
    write_kubeconfig,
)
from helpers import make_cert

needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not available")


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def test_write_then_load_round_trip(tmp_path):
    path = tmp_path / "sub" / "config"
    write_kubeconfig(str(path), "http://127.0.0.1:6443")
    cfg = load_kubeconfig(str(path))
    assert cfg == ClientConfig(server="http://127.0.0.1:6443", namespace="default")
    assert cfg.ssl_context() is None
    assert cfg.auth_headers() == {}
    doc = yaml.safe_load(path.read_text())
    assert doc["current-context"] == "kubeplane"
    assert doc["contexts"][0]["context"] == {"cluster": "kubeplane", "user": "kubeplane", "namespace": "default"}
    assert doc["users"] == [{"name": "kubeplane", "user": {}}]
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    # The write is atomic: no temporary files are left behind.
    assert sorted(p.name for p in path.parent.iterdir()) == ["config"]


def test_write_replaces_existing_file(tmp_path):
    path = tmp_path / "config"
    write_kubeconfig(str(path), "http://a:1", name="one")
    write_kubeconfig(str(path), "http://b:2", name="two")
    cfg = load_kubeconfig(str(path))
    assert cfg.server == "http://b:2"
    with pytest.raises(KubeconfigError, match='context "one" not found'):
        load_kubeconfig(str(path), context="one")


def _config(tmp_path: Path, users: list, clusters: list, contexts: list, current: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": clusters, "users": users, "contexts": contexts, "current-context": current,
    }))
    return path


@needs_openssl
def test_base64_data_token_and_context_selection(tmp_path):
    ca, _ = make_cert(tmp_path, "ca")
    cert, key = make_cert(tmp_path, "client")
    path = _config(
        tmp_path,
        users=[
            {"name": "admin", "user": {"client-certificate-data": b64(cert), "client-key-data": b64(key)}},
            {"name": "bot", "user": {"token": "s3cret"}},
        ],
        clusters=[{"name": "prod", "cluster": {
            "server": "https://127.0.0.1:6443/", "certificate-authority-data": b64(ca),
            "tls-server-name": "localhost"}}],
        contexts=[
            {"name": "admin@prod", "context": {"cluster": "prod", "user": "admin", "namespace": "kube-system"}},
            {"name": "bot@prod", "context": {"cluster": "prod", "user": "bot"}},
        ],
        current="admin@prod",
    )
    cfg = load_kubeconfig(str(path))
    assert cfg.server == "https://127.0.0.1:6443"
    assert cfg.namespace == "kube-system"
    assert cfg.client_cert_data == cert.read_bytes()
    assert cfg.client_key_data == key.read_bytes()
    assert cfg.ca_data == ca.read_bytes()
    assert cfg.tls_server_name == "localhost"
    ctx = cfg.ssl_context()
    assert isinstance(ctx, ssl.SSLContext)
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert [c["subject"] for c in ctx.get_ca_certs()] == [((("commonName", "ca"),),)]
    bot = load_kubeconfig(str(path), context="bot@prod")
    assert bot.token == "s3cret"
    assert bot.namespace == "default"
    assert bot.auth_headers() == {"Authorization": "Bearer s3cret"}
    assert bot.client_cert_data is None


@needs_openssl
def test_relative_file_paths_and_token_file(tmp_path):
    (tmp_path / "pki").mkdir()
    make_cert(tmp_path / "pki", "ca")
    make_cert(tmp_path / "pki", "client")
    (tmp_path / "token").write_text("tok-from-file\n")
    path = _config(
        tmp_path,
        users=[{"name": "u", "user": {"client-certificate": "pki/client.crt", "client-key": "pki/client.key",
                                      "tokenFile": "token"}}],
        clusters=[{"name": "c", "cluster": {"server": "https://127.0.0.1:1", "certificate-authority": "pki/ca.crt"}}],
        contexts=[{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        current="x",
    )
    cfg = load_kubeconfig(str(path))
    assert cfg.client_cert_file == str(tmp_path / "pki" / "client.crt")
    assert cfg.ca_file == str(tmp_path / "pki" / "ca.crt")
    assert cfg.token == "tok-from-file"
    assert isinstance(cfg.ssl_context(), ssl.SSLContext)


def test_insecure_skip_verify_and_basic_auth(tmp_path):
    path = _config(
        tmp_path,
        users=[{"name": "u", "user": {"username": "admin", "password": "pw"}}],
        clusters=[{"name": "c", "cluster": {"server": "https://10.0.0.1", "insecure-skip-tls-verify": True}}],
        contexts=[{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        current="x",
    )
    cfg = load_kubeconfig(str(path))
    ctx = cfg.ssl_context()
    assert ctx.verify_mode == ssl.CERT_NONE and ctx.check_hostname is False
    assert cfg.auth_headers() == {"Authorization": "Basic " + base64.b64encode(b"admin:pw").decode()}


def test_kubeconfig_env_merges_files_first_wins(tmp_path, monkeypatch):
    first = tmp_path / "a"
    second = tmp_path / "b"
    first.write_text(yaml.safe_dump({
        "clusters": [{"name": "c", "cluster": {"server": "http://first"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "namespace": "ns-a"}}],
        "current-context": "x",
    }))
    second.write_text(yaml.safe_dump({
        "clusters": [{"name": "c", "cluster": {"server": "http://second"}},
                     {"name": "d", "cluster": {"server": "http://d"}}],
        "contexts": [{"name": "y", "context": {"cluster": "d"}}],
        "current-context": "y",
    }))
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(first), str(tmp_path / "missing"), str(second)]))
    cfg = load_kubeconfig()
    assert (cfg.server, cfg.namespace) == ("http://first", "ns-a")
    assert load_kubeconfig(context="y").server == "http://d"


def test_home_default(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(KubeconfigError, match="no kubeconfig found"):
        load_kubeconfig()
    write_kubeconfig(str(tmp_path / ".kube" / "config"), "http://home:1")
    assert load_kubeconfig().server == "http://home:1"


def test_errors(tmp_path):
    with pytest.raises(KubeconfigError, match="does not exist"):
        load_kubeconfig(str(tmp_path / "nope"))
    bad = tmp_path / "bad"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(KubeconfigError, match="not a mapping"):
        load_kubeconfig(str(bad))
    path = _config(tmp_path, users=[], clusters=[],
                   contexts=[{"name": "x", "context": {"cluster": "c", "user": "u"}}], current="x")
    with pytest.raises(KubeconfigError, match='cluster "c"'):
        load_kubeconfig(str(path))
    nocur = _config(tmp_path, users=[], clusters=[], contexts=[], current="")
    with pytest.raises(KubeconfigError, match="no current-context"):
        load_kubeconfig(str(nocur))
