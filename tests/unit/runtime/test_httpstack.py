"""import_aiohttp_web: aiohttp's default client TLS contexts read the CA
bundle on first use instead of at import, and verify as before."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import textwrap
import threading

from kubeplane import httpstack


def _child(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_default_contexts_are_made_without_the_bundle_and_read_it_on_first_use() -> None:
    got = _child("""
        import json, ssl
        from kubeplane.httpstack import import_aiohttp_web
        import_aiohttp_web()
        import aiohttp.connector as c
        v, u = c._SSL_CONTEXT_VERIFIED, c._SSL_CONTEXT_UNVERIFIED
        pending = [v.__dict__.get("_kubeplane_ca_pending"), u.__dict__.get("_kubeplane_ca_pending")]
        ref = ssl.create_default_context()
        print(json.dumps({
            "types": [type(v).__name__, type(u).__name__], "pending": pending,
            "is_ssl_context": isinstance(v, ssl.SSLContext) and isinstance(u, ssl.SSLContext),
            "verify": [v.verify_mode == ssl.CERT_REQUIRED, v.check_hostname, u.verify_mode == ssl.CERT_NONE,
                       u.check_hostname],
            "stats": [v.cert_store_stats(), u.cert_store_stats(), ref.cert_store_stats()],
            "after": [v.__dict__.get("_kubeplane_ca_pending"), u.__dict__.get("_kubeplane_ca_pending")],
            "patched": "set_default_verify_paths" in ssl.SSLContext.__dict__,
        }))
    """)
    assert got["types"] == ["DeferredCAContext", "DeferredCAContext"]
    assert got["pending"] == [True, True]
    assert got["is_ssl_context"]
    assert got["verify"] == [True, True, True, False]
    verified, unverified, reference = got["stats"]
    # the same bundle as a context made the ordinary way
    assert verified == unverified == reference
    assert reference["x509_ca"] > 0
    assert got["after"] == [False, False]
    assert got["patched"] is False


def test_a_client_on_the_default_context_still_verifies_the_server(tmp_path) -> None:
    """A server whose certificate no system CA signed: aiohttp's verifying
    default refuses it, its non-verifying one connects."""
    from kubeplane.auth import pki

    ca = pki.ensure_pki(str(tmp_path), durable=False)
    cert, key = ca.serving_pair(pki.serving_names("127.0.0.1"))
    got = _child(f"""
        import asyncio, json, ssl
        from kubeplane.httpstack import import_aiohttp_web
        import_aiohttp_web()
        import aiohttp
        from aiohttp import web

        async def main():
            app = web.Application()
            app.router.add_get("/", lambda r: web.Response(text="ok"))
            runner = web.AppRunner(app)
            await runner.setup()
            sctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            sctx.load_cert_chain({str(cert)!r}, {str(key)!r})
            site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=sctx)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]
            out = {{}}
            async with aiohttp.ClientSession() as s:
                try:
                    await s.get(f"https://127.0.0.1:{{port}}/")
                    out["verified"] = "connected"
                except aiohttp.ClientConnectorCertificateError as exc:
                    out["verified"] = type(exc.certificate_error).__name__
                async with s.get(f"https://127.0.0.1:{{port}}/", ssl=False) as r:
                    out["unverified"] = await r.text()
            await runner.cleanup()
            print(json.dumps(out))

        asyncio.run(main())
    """)
    assert got == {"verified": "SSLCertVerificationError", "unverified": "ok"}


def test_other_contexts_read_their_bundle_while_aiohttp_is_imported() -> None:
    """Only the connector module's import-time calls are deferred: a context
    made meanwhile elsewhere is loaded at once."""
    stats: list[dict] = []
    with httpstack._lock:
        httpstack._importers += 1
        if httpstack._importers == 1:
            ssl.SSLContext.set_default_verify_paths = httpstack._set_default_verify_paths
    try:
        def other() -> None:
            stats.append(ssl.create_default_context().cert_store_stats())

        t = threading.Thread(target=other)
        t.start()
        t.join()
        stats.append(ssl.create_default_context().cert_store_stats())
    finally:
        with httpstack._lock:
            httpstack._importers -= 1
            if httpstack._importers == 0:
                del ssl.SSLContext.set_default_verify_paths
    assert stats[0] == stats[1] == ssl.create_default_context().cert_store_stats()
    assert "set_default_verify_paths" not in ssl.SSLContext.__dict__
