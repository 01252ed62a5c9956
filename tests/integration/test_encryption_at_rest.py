"""Secrets encrypted at rest, end to end: a server started with
--encryption-provider-config, real kubectl creating and reading a secret, the
SQLite file holding no plaintext, rotation by `kubectl replace`, and the
errors when the key is missing."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from conftest import KUBECTL, Kubectl, start_server

KEY1 = base64.b64encode(bytes(range(32))).decode()
KEY2 = base64.b64encode(bytes(range(64, 96))).decode()
VALUE = "plaintext-password-6f1d"


def write_config(path: Path, providers: str) -> Path:
    path.write_text(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\n"
        "resources:\n  - resources: [secrets]\n    providers:\n" + providers)
    return path


def aesgcm(*keys: tuple[str, str]) -> str:
    lines = "".join(f"            - name: {n}\n              secret: {s}\n" for n, s in keys)
    return "      - aesgcm:\n          keys:\n" + lines


def db_bytes(data_dir: Path) -> bytes:
    return b"".join(p.read_bytes() for p in data_dir.iterdir() if p.name.startswith("kubeplane.db"))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    if not os.path.exists(KUBECTL):
        pytest.fail("kubectl is required for these tests")
    d = tmp_path / "home"
    d.mkdir()
    return d


def test_kubectl_secret_encrypted_at_rest_and_rotated(tmp_path: Path, home: Path) -> None:
    cfg = write_config(tmp_path / "enc.yaml", aesgcm(("key1", KEY1)) + "      - identity: {}\n")
    srv = start_server(tmp_path / "srv", storage="sqlite", extra=["--encryption-provider-config", str(cfg)])
    kubectl = Kubectl(srv.kubeconfig, home)
    try:
        kubectl("create", "secret", "generic", "db", f"--from-literal=password={VALUE}")
        out = kubectl("get", "secret", "db", "-o", "jsonpath={.data.password}").out
        assert base64.b64decode(out).decode() == VALUE
        kubectl("create", "configmap", "plain", "--from-literal=marker=visible-configmap-4e2a")
        listed = json.loads(kubectl("get", "secrets", "-o", "json").out)
        assert [i["metadata"]["name"] for i in listed["items"]] == ["db"]
    finally:
        srv.stop()
    blob = db_bytes(srv.data_dir)
    assert b"visible-configmap-4e2a" in blob  # what is not encrypted is visible to this check
    encoded = base64.b64encode(VALUE.encode())
    assert VALUE.encode() not in blob and encoded not in blob
    assert b"k8s:enc:aesgcm:v1:key1:" in blob

    # Restarted without the file: the secret cannot be read, the rest still works.
    srv = start_server(tmp_path / "srv", storage="sqlite")
    kubectl = Kubectl(srv.kubeconfig, home)
    try:
        res = kubectl("get", "secret", "db", check=False)
        assert res.rc != 0
        assert "Internal error occurred: identity transformer tried to read encrypted data" in res.err
        kubectl("get", "configmap", "plain")
    finally:
        srv.stop()

    # Rotation: key2 first, key1 still readable; rewriting every secret re-encrypts.
    write_config(cfg, aesgcm(("key2", KEY2), ("key1", KEY1)) + "      - identity: {}\n")
    srv = start_server(tmp_path / "srv", storage="sqlite", extra=["--encryption-provider-config", str(cfg)])
    kubectl = Kubectl(srv.kubeconfig, home)
    try:
        before = json.loads(kubectl("get", "secrets", "-o", "json").out)
        kubectl("replace", "-f", "-", stdin=json.dumps(before))
        after = json.loads(kubectl("get", "secrets", "-o", "json").out)
        assert after["items"][0]["data"] == before["items"][0]["data"]
        assert after["items"][0]["metadata"]["resourceVersion"] != before["items"][0]["metadata"]["resourceVersion"]
    finally:
        srv.stop()

    # Only key2 now: the rotated secret is readable.
    write_config(cfg, aesgcm(("key2", KEY2)))
    srv = start_server(tmp_path / "srv", storage="sqlite", extra=["--encryption-provider-config", str(cfg)])
    kubectl = Kubectl(srv.kubeconfig, home)
    try:
        out = kubectl("get", "secret", "db", "-o", "jsonpath={.data.password}").out
        assert base64.b64decode(out).decode() == VALUE
    finally:
        srv.stop()


def test_invalid_config_stops_the_server_with_upstreams_message(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "enc.yaml", aesgcm(("key1", base64.b64encode(b"short").decode())))
    with pytest.raises(RuntimeError) as exc:
        start_server(tmp_path / "srv", extra=["--encryption-provider-config", str(cfg)])
    assert ("error while parsing file: resources[0].providers[0].aesgcm.keys[0].secret: Invalid value: "
            '"REDACTED": secret is not of the expected length, got 5, expected one of [16 24 32]') in str(exc.value)
