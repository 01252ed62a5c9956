"""The generated PKI: CA, serving and client certificates, reuse, reissue."""

from __future__ import annotations

import asyncio
import ssl
import stat

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kubeplane.auth import pki


def test_ca_and_serving_certificate_are_made_once_and_reused(tmp_path):
    d = str(tmp_path / "pki")
    first = pki.ensure_pki(d)
    crt, key = first.serving_pair(pki.serving_names("127.0.0.1"))
    before = (tmp_path / "pki" / "apiserver.crt").read_bytes()
    assert stat.S_IMODE((tmp_path / "pki" / "ca.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "pki" / "apiserver.key").stat().st_mode) == 0o600
    again = pki.ensure_pki(d)
    assert again.ca_pem == first.ca_pem
    again.serving_pair(pki.serving_names("127.0.0.1"))
    assert (tmp_path / "pki" / "apiserver.crt").read_bytes() == before  # reused

    cert = pki.load_cert(crt)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    names = {str(v) for v in san.get_values_for_type(x509.DNSName)} | {
        str(v) for v in san.get_values_for_type(x509.IPAddress)}
    assert {"localhost", "127.0.0.1", "::1", "kubernetes.default.svc"} <= names
    assert cert.issuer == first.ca_cert.subject
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in eku


def test_serving_certificate_is_reissued_for_a_new_listen_address(tmp_path):
    p = pki.ensure_pki(str(tmp_path))
    p.serving_pair(pki.serving_names("127.0.0.1"))
    old = (tmp_path / "apiserver.crt").read_bytes()
    crt, _ = p.serving_pair(pki.serving_names("10.1.2.3"))
    assert (tmp_path / "apiserver.crt").read_bytes() != old
    assert pki.covers(pki.load_cert(crt), ("10.1.2.3", "127.0.0.1", "localhost"))


def test_listening_on_every_address_the_certificate_covers_the_advertised_one(tmp_path):
    import socket

    from kubeplane.apiserver.app import APIServerConfig
    from kubeplane.apiserver.security import public_names

    assert public_names(APIServerConfig(data_dir=str(tmp_path), advertise_address="192.0.2.7"), "127.0.0.1") == \
        ("192.0.2.7",)
    assert public_names(APIServerConfig(data_dir=str(tmp_path)), "127.0.0.1") == ()
    names = pki.serving_names("0.0.0.0", "192.0.2.7")
    assert names[:2] == (socket.gethostname(), "192.0.2.7") and "127.0.0.1" in names
    crt, _ = pki.ensure_pki(str(tmp_path)).serving_pair(names)
    assert pki.covers(pki.load_cert(crt), ("192.0.2.7", "127.0.0.1", "kubernetes.default.svc"))


def test_client_certificate_names_user_and_groups(tmp_path):
    p = pki.ensure_pki(str(tmp_path))
    cert_pem, key_pem = p.client_pair("admin", "kubeplane-admin", ("system:masters",))
    cert = x509.load_pem_x509_certificate(cert_pem)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "kubeplane-admin"
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == ["system:masters"]
    assert ExtendedKeyUsageOID.CLIENT_AUTH in cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert p.client_pair("admin", "kubeplane-admin", ("system:masters",))[0] == cert_pem  # reused
    # another identity under the same file name is issued anew
    assert p.client_pair("admin", "someone-else")[0] != cert_pem


async def test_tls_handshake_verifies_both_ways(tmp_path):
    """A client trusting the CA reaches the server, and the server sees the verified client certificate."""
    p = pki.ensure_pki(str(tmp_path))
    crt, key = p.serving_pair(pki.serving_names("127.0.0.1"))
    cert_pem, key_pem = p.client_pair("admin", "kubeplane-admin", ("system:masters",))
    (tmp_path / "c.crt").write_bytes(cert_pem)
    (tmp_path / "c.key").write_bytes(key_pem)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(crt, key)
    server_ctx.load_verify_locations(cafile=p.ca_file)
    server_ctx.verify_mode = ssl.CERT_OPTIONAL
    seen: list = []

    async def handle(reader, writer):
        seen.append(writer.get_extra_info("ssl_object").getpeercert(binary_form=True))
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    client_ctx = ssl.create_default_context(cafile=p.ca_file)
    client_ctx.load_cert_chain(str(tmp_path / "c.crt"), str(tmp_path / "c.key"))
    for host in ("127.0.0.1", "localhost"):
        _, w = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx, server_hostname=host)
        w.close()
    # a client with no certificate is accepted too (anonymous or token requests)
    _, w = await asyncio.open_connection("127.0.0.1", port, ssl=ssl.create_default_context(cafile=p.ca_file),
                                         server_hostname="127.0.0.1")
    w.close()
    server.close()
    await server.wait_closed()
    assert seen[0] == x509.load_pem_x509_certificate(cert_pem).public_bytes(
        __import__("cryptography.hazmat.primitives.serialization", fromlist=["Encoding"]).Encoding.DER)
    # a server name the certificate does not cover is refused
    other = ssl.create_default_context(cafile=p.ca_file)
    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    try:
        try:
            await asyncio.open_connection("127.0.0.1", port, ssl=other, server_hostname="example.com")
        except ssl.SSLCertVerificationError:
            pass
        else:
            raise AssertionError("a name outside the certificate was accepted")
    finally:
        server.close()
        await server.wait_closed()


def test_a_throw_away_pki_is_not_synced_to_disk(tmp_path, monkeypatch) -> None:
    import os

    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    p = pki.ensure_pki(str(tmp_path / "scratch"), durable=False)
    p.serving_pair(("localhost",))
    p.client_pair("admin", pki.ADMIN_USER)
    p.service_account_signing_key()
    assert synced == []
    kept = pki.ensure_pki(str(tmp_path / "kept"))
    kept.serving_pair(("localhost",))
    assert len(synced) == 5  # ca.key, ca.crt, apiserver.key, apiserver.crt, apiserver.meta
    # what was written unsynced reads back all the same
    again = pki.ensure_pki(str(tmp_path / "scratch"))
    assert again.ca_cert == p.ca_cert
    path, key = again.service_account_signing_key()
    assert key.private_numbers() == p.service_account_signing_key()[1].private_numbers()


def test_a_recorded_leaf_is_reused_and_one_near_its_end_or_changed_is_checked_again(tmp_path) -> None:
    import datetime as dt

    import orjson

    p = pki.ensure_pki(str(tmp_path / "p"))
    crt, _ = p.serving_pair(("127.0.0.1", "localhost"))
    made = open(crt, "rb").read()
    meta_path = tmp_path / "p" / "apiserver.meta"
    meta = orjson.loads(meta_path.read_bytes())
    assert meta["names"] == ["127.0.0.1", "localhost"] and meta["ca"] and meta["crt"]
    # the record answers: same certificate, also for a subset of its names
    again = pki.ensure_pki(str(tmp_path / "p"))
    assert again._ca_cert is None  # nothing read but files' bytes
    again.serving_pair(("localhost",))
    assert open(crt, "rb").read() == made and again._ca_cert is None
    # a name the certificate lacks: a new one
    again.serving_pair(("127.0.0.1", "localhost", "kubernetes"))
    renamed = open(crt, "rb").read()
    assert renamed != made and "kubernetes" in orjson.loads(meta_path.read_bytes())["names"]
    # a record that says the end is near: the certificate itself is checked
    # (still a year to go here: kept, and the record says so again)
    meta = orjson.loads(meta_path.read_bytes())
    true_end = meta["notAfter"]
    meta["notAfter"] = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=2)).isoformat()
    meta_path.write_bytes(orjson.dumps(meta))
    checked = pki.ensure_pki(str(tmp_path / "p"))
    checked.serving_pair(("localhost",))
    assert open(crt, "rb").read() == renamed and checked._ca_cert is not None
    assert orjson.loads(meta_path.read_bytes())["notAfter"] == true_end
    # a certificate that is not the one recorded is checked the slow way and recorded anew
    p.client_pair("admin", pki.ADMIN_USER, ("system:masters",))
    other, _ = pki.issue(p.ca_cert, p.ca_key, pki.ADMIN_USER, orgs=("system:masters",))
    (tmp_path / "p" / "admin.crt").write_bytes(pki.cert_pem(other))
    cp, _ = pki.ensure_pki(str(tmp_path / "p")).client_pair("admin", pki.ADMIN_USER, ("system:masters",))
    assert cp == pki.cert_pem(other)
    import hashlib

    assert orjson.loads((tmp_path / "p" / "admin.meta").read_bytes())["crt"] == hashlib.sha256(cp).hexdigest()
    # another user for the same file: issued for that user
    cp2, _ = pki.ensure_pki(str(tmp_path / "p")).client_pair("admin", "someone-else")
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    cn = x509.load_pem_x509_certificate(cp2).subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    assert cn == "someone-else"


def test_self_signed_pair_is_kept_while_it_covers_the_names(tmp_path):
    crt, key = str(tmp_path / "d" / "kubelet.crt"), str(tmp_path / "d" / "kubelet.key")
    assert pki.ensure_self_signed_pair(crt, key, "n1", ("n1", "127.0.0.1")) == (crt, key)
    cert = pki.load_cert(crt)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value.startswith("n1@")
    assert stat.S_IMODE((tmp_path / "d" / "kubelet.key").stat().st_mode) == 0o600
    pki.ensure_self_signed_pair(crt, key, "n1", ("127.0.0.1",))
    assert pki.load_cert(crt).serial_number == cert.serial_number
    pki.ensure_self_signed_pair(crt, key, "n1", ("n1", "10.0.0.5"))
    again = pki.load_cert(crt)
    assert again.serial_number != cert.serial_number and pki.covers(again, ("n1", "10.0.0.5"))
    assert len(pki.load_certs(crt)) == 2   # the leaf and its CA
