"""Where the root CA publisher and the CSR signer get their CA: the data
directory's PKI under ``up``, kube-controller-manager's flags elsewhere; the
signer's certificate and key go together, and without a CA neither runs."""

from __future__ import annotations

import logging

import click
import pytest

from kubeplane.cli.main import _ca_files
from kubeplane.cluster import ControllerOptions, _ca_controllers, cluster_ca_options


def test_cluster_ca_options_follow_the_files(tmp_path):
    assert cluster_ca_options(str(tmp_path)) == {}
    pki = tmp_path / "pki"
    pki.mkdir()
    (pki / "ca.crt").write_text("x")
    assert cluster_ca_options(str(tmp_path)) == {"root_ca_file": str(pki / "ca.crt")}
    (pki / "ca.key").write_text("y")
    assert cluster_ca_options(str(tmp_path)) == {
        "root_ca_file": str(pki / "ca.crt"), "signing_cert_file": str(pki / "ca.crt"),
        "signing_key_file": str(pki / "ca.key")}


def test_signing_flags_go_together():
    assert _ca_files(None, None, None) == {}
    assert _ca_files("ca.crt", "ca.crt", "ca.key") == {
        "root_ca_file": "ca.crt", "signing_cert_file": "ca.crt", "signing_key_file": "ca.key"}
    with pytest.raises(click.UsageError):
        _ca_files(None, "ca.crt", None)


def test_without_a_ca_neither_runs_and_it_says_so(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="kubeplane")
    assert _ca_controllers(None, None, ControllerOptions()) == []  # type: ignore[arg-type]
    assert "kube-root-ca.crt publisher does not run" in caplog.text
    assert "CertificateSigningRequests are not signed" in caplog.text
    empty = tmp_path / "empty.crt"
    empty.write_text("\n")
    caplog.clear()
    assert _ca_controllers(None, None, ControllerOptions(root_ca_file=str(empty))) == []  # type: ignore[arg-type]
    assert "is empty: kube-root-ca.crt is not published" in caplog.text
