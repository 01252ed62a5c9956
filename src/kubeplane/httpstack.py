"""Importing aiohttp for a process that starts a server.

aiohttp's package imports its client, whose connector module makes two
default client TLS contexts at import (``_SSL_CONTEXT_VERIFIED`` and
``_SSL_CONTEXT_UNVERIFIED``), each reading the system's whole CA bundle:
some 30 ms of CPU apiece, a sixth of a first start of the API server, for
contexts the API server never uses (kubeplane's clients and webhooks make
their own from a CA or a caBundle). :func:`import_aiohttp_web` imports
``aiohttp.web`` with those two reads deferred: the contexts are the same
objects, with the same settings, and read the bundle under a lock on their
first use (a handshake, ``get_ca_certs``, ``cert_store_stats``), so a client
that relies on aiohttp's defaults verifies exactly as before.

Only the calls aiohttp's connector module makes while it is being imported
are deferred (recognised by the calling frame); any other thread that makes
a context meanwhile reads its bundle as usual. Where aiohttp is already
imported, or makes its contexts another way, nothing changes.
"""

from __future__ import annotations

import ssl
import sys
import threading
from typing import Any

_CONNECTOR = "aiohttp.connector"
_lock = threading.Lock()
#: threads in :func:`import_aiohttp_web` (the patch is in place while any is)
_importers = 0


class DeferredCAContext(ssl.SSLContext):
    """aiohttp's default client context whose CA bundle
    (``set_default_verify_paths``) is read on first use."""

    def _load_deferred_ca(self) -> None:
        if self.__dict__.get("_kubeplane_ca_pending"):
            with _lock:
                if self.__dict__.get("_kubeplane_ca_pending"):
                    _original_set_default_verify_paths(self)
                    self.__dict__["_kubeplane_ca_pending"] = False

    def wrap_socket(self, *args: Any, **kwargs: Any) -> Any:
        self._load_deferred_ca()
        return super().wrap_socket(*args, **kwargs)

    def wrap_bio(self, *args: Any, **kwargs: Any) -> Any:
        self._load_deferred_ca()
        return super().wrap_bio(*args, **kwargs)

    def get_ca_certs(self, *args: Any, **kwargs: Any) -> Any:
        self._load_deferred_ca()
        return super().get_ca_certs(*args, **kwargs)

    def cert_store_stats(self) -> Any:
        self._load_deferred_ca()
        return super().cert_store_stats()


def _in_connector_import() -> bool:
    frame = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return False
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == _CONNECTOR:
            return True
        frame = frame.f_back
    return False


def _set_default_verify_paths(self: ssl.SSLContext) -> None:
    if type(self) is ssl.SSLContext and _in_connector_import():
        # from here on the context reads the bundle before it is first used
        self.__dict__["_kubeplane_ca_pending"] = True
        self.__class__ = DeferredCAContext
        return
    _original_set_default_verify_paths(self)


_original_set_default_verify_paths = ssl.SSLContext.set_default_verify_paths


def import_aiohttp_web() -> None:
    """``import aiohttp.web``, deferring the default client contexts' CA
    bundle reads to their first use (see the module's text)."""
    global _importers
    if _CONNECTOR in sys.modules:
        import aiohttp.web  # noqa: F401
        return
    with _lock:
        if _importers == 0:
            ssl.SSLContext.set_default_verify_paths = _set_default_verify_paths  # type: ignore[method-assign]
        _importers += 1
    try:
        import aiohttp.web  # noqa: F401
    finally:
        with _lock:
            _importers -= 1
            if _importers == 0:
                del ssl.SSLContext.set_default_verify_paths
