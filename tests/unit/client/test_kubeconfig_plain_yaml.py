"""write_kubeconfig writes its document without PyYAML when every string is
plain: the text must be exactly what yaml.dump writes, and read back the same;
anything else is dumped by PyYAML."""

from __future__ import annotations

import base64
import itertools
import os

import yaml

from kubeplane.client.kubeconfig import _plain_yaml, load_kubeconfig, write_kubeconfig

PEM = b"-----BEGIN CERTIFICATE-----\n" + base64.b64encode(os.urandom(600)) + b"\n-----END CERTIFICATE-----\n"


def _doc(server: str, name: str, ca: bytes | None, cert: bytes | None, token: str | None, ns: str) -> dict:
    cluster: dict = {"server": server}
    if ca:
        cluster["certificate-authority-data"] = base64.b64encode(ca).decode()
    user: dict = {}
    if cert:
        user["client-certificate-data"] = base64.b64encode(cert).decode()
        user["client-key-data"] = base64.b64encode(cert).decode()
    if token:
        user["token"] = token
    return {"apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": name, "cluster": cluster}], "users": [{"name": name, "user": user}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": ns}}],
            "current-context": name}


def test_the_text_is_pyyamls_or_none() -> None:
    plain = 0
    servers = ["https://127.0.0.1:6443", "http://127.0.0.1:8080", "https://[::1]:6443", "https://h:1/", "https:"]
    names = ["kubeplane", "kube-plane.x_1", "yes", "On", "NULL", "a b", "x:", "1abc", "=", "~", "é", "#x"]
    secrets = [None, PEM, os.urandom(31), b"\x00" * 3]
    tokens = [None, "abc.def", "12345", "a#b", "tok: x", "Bearer", "e5", "0x1f"]
    for server, name, ca, cert, token, ns in itertools.product(servers, names, secrets, [None, PEM], tokens,
                                                               ["default", "true"]):
        doc = _doc(server, name, ca, cert, token, ns)
        got = _plain_yaml(doc)
        if got is None:
            continue
        plain += 1
        assert got == yaml.dump(doc, Dumper=yaml.CSafeDumper, default_flow_style=False, sort_keys=False)
        assert yaml.safe_load(got) == doc
    assert plain > 100


def test_the_kubeconfig_of_a_cluster_is_written_plain_and_reads_back(tmp_path) -> None:
    doc = _doc("https://127.0.0.1:6443", "kubeplane", PEM, PEM, None, "default")
    assert _plain_yaml(doc) is not None
    for name, token in (("kubeplane", None), ("yes", "a: b")):  # the second through PyYAML
        path = str(tmp_path / f"kc-{name}")
        write_kubeconfig(path, "https://127.0.0.1:6443", name, ca_data=PEM, token=token)
        cfg = load_kubeconfig(path)
        assert cfg.server == "https://127.0.0.1:6443"
        assert yaml.safe_load(open(path).read())["current-context"] == name


def test_a_kubeconfig_thrown_away_with_its_cluster_is_not_synced(tmp_path, monkeypatch) -> None:
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    write_kubeconfig(str(tmp_path / "a"), "https://127.0.0.1:1", ca_data=PEM)
    assert len(synced) == 1
    write_kubeconfig(str(tmp_path / "b"), "https://127.0.0.1:1", ca_data=PEM, durable=False)
    assert len(synced) == 1
    assert load_kubeconfig(str(tmp_path / "b")).server == "https://127.0.0.1:1"


def test_a_test_clusters_kubeconfig_is_not_synced() -> None:
    import kubeplane.testing

    with kubeplane.testing.Cluster() as c:
        assert c._server.config.durable_kubeconfig is False
        assert c._server._kubeconfig.durable is False
        assert load_kubeconfig(c.kubeconfig).server == c.url
