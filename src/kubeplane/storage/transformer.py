"""Encryption at rest: value transformers at the storage boundary.

As upstream's ``storage/value`` packages: a resource has a list of providers;
the first one transforms every value written, and reading tries the providers
in order, each recognising its values by a prefix: ``k8s:enc:aesgcm:v1:``,
``k8s:enc:aescbc:v1:`` or ``k8s:enc:secretbox:v1:``, then the key's name and
``:``. The identity provider has no prefix: it writes values as they are and
reads any value that is not encrypted.

Stored values are JSON objects here, so an encrypted value is kept as an
envelope ``{"metadata": {"resourceVersion": ...}, "encrypted": TEXT}`` where
TEXT is the prefix (readable, as in upstream's etcd values) followed by the
provider's binary output in base64. ``upstream_bytes(TEXT)`` gives exactly the
bytes upstream stores in etcd (prefix, nonce or IV, ciphertext). The plaintext
is the object's JSON without ``metadata.resourceVersion`` (the store's
revision, as upstream's versioner leaves it out of etcd values); AES-GCM
authenticates the storage key with it, so a value cannot be moved to another key.

:class:`TransformingStore` wraps any store: values are transformed before they
reach the backend (its current state, its history, its file) and back on every
read, list, delete result, conflict and watch event. A value that cannot be
read back fails that read with :class:`TransformError` (HTTP 500); the rest of
the store keeps working.
"""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Sequence

import orjson

from kubeplane.storage.interface import (
    Event,
    KeyValue,
    ListResult,
    Obj,
    RevisionConflictError,
    StorageError,
    Store,
)
from kubeplane.storage.memory import stamp

#: the envelope field holding an encrypted value's text
ENVELOPE_FIELD = "encrypted"

AESGCM_PREFIX = "k8s:enc:aesgcm:v1:"
AESCBC_PREFIX = "k8s:enc:aescbc:v1:"
SECRETBOX_PREFIX = "k8s:enc:secretbox:v1:"

_SHORT = "the stored data was shorter than the required size"


class TransformError(StorageError):
    """A stored value could not be transformed back (wrong or missing key,
    corrupt data). The API server answers 500 InternalError with this text."""


class DecryptError(ValueError):
    """One provider or key could not read a value (upstream's error text)."""


def upstream_bytes(text: str) -> bytes:
    """The bytes upstream keeps in etcd for an envelope's text: the prefix as it
    is, the rest base64-decoded (base64 has no ':', so the prefix ends at the last one)."""
    cut = text.rfind(":") + 1
    return text[:cut].encode() + base64.b64decode(text[cut:])


# --------------------------------------------------------------------------- ciphers


class AESGCMCipher:
    """AES-GCM with a random 12-byte nonce: nonce || ciphertext || tag (upstream's ``gcm``)."""

    def __init__(self, key: bytes) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._aead = AESGCM(key)

    def encrypt(self, data: bytes, authenticated: bytes) -> bytes:
        nonce = os.urandom(12)
        return nonce + self._aead.encrypt(nonce, data, authenticated)

    def decrypt(self, data: bytes, authenticated: bytes) -> bytes:
        from cryptography.exceptions import InvalidTag

        if len(data) < 12:
            raise DecryptError(_SHORT)
        try:
            return self._aead.decrypt(data[:12], data[12:], authenticated)
        except InvalidTag:
            raise DecryptError("cipher: message authentication failed") from None


class AESCBCCipher:
    """AES-CBC with a random IV and PKCS#7 padding: IV || ciphertext (upstream's ``cbc``)."""

    BLOCK = 16

    def __init__(self, key: bytes) -> None:
        from cryptography.hazmat.primitives.ciphers import algorithms

        self._algorithm = algorithms.AES(key)

    def _cipher(self, iv: bytes) -> Any:
        from cryptography.hazmat.primitives.ciphers import Cipher, modes

        return Cipher(self._algorithm, modes.CBC(iv))

    def encrypt(self, data: bytes, authenticated: bytes) -> bytes:
        iv = os.urandom(self.BLOCK)
        pad = self.BLOCK - len(data) % self.BLOCK
        enc = self._cipher(iv).encryptor()
        return iv + enc.update(data + bytes([pad]) * pad) + enc.finalize()

    def decrypt(self, data: bytes, authenticated: bytes) -> bytes:
        if len(data) < self.BLOCK:
            raise DecryptError(_SHORT)
        iv, body = data[:self.BLOCK], data[self.BLOCK:]
        if len(body) % self.BLOCK != 0:
            raise DecryptError("the stored data is not a multiple of the block size")
        dec = self._cipher(iv).decryptor()
        out = dec.update(body) + dec.finalize()
        pad = out[-1] if out else 0
        if pad == 0 or pad > len(out):
            raise DecryptError("invalid PKCS7 data (empty or not padded)")
        if out[-pad:] != bytes([pad]) * pad:
            raise DecryptError("invalid padding on input")
        return out[:-pad]


class SecretboxCipher:
    """XSalsa20-Poly1305 (NaCl secretbox) with a random 24-byte nonce:
    nonce || tag || ciphertext, as upstream's ``secretbox`` transformer."""

    NONCE = 24
    OVERHEAD = 16

    def __init__(self, key: bytes) -> None:
        from nacl.secret import SecretBox

        self._box = SecretBox(key)

    def encrypt(self, data: bytes, authenticated: bytes) -> bytes:
        return bytes(self._box.encrypt(data, os.urandom(self.NONCE)))

    def decrypt(self, data: bytes, authenticated: bytes) -> bytes:
        from nacl.exceptions import CryptoError

        if len(data) < self.NONCE + self.OVERHEAD:
            raise DecryptError(_SHORT)
        try:
            return self._box.decrypt(data[self.NONCE:], data[:self.NONCE])
        except CryptoError:
            raise DecryptError("output array was not large enough for encryption") from None


# --------------------------------------------------------------------------- providers


def _aggregate(errs: Sequence[str]) -> str:
    """upstream's error aggregate: one message as it is, several as ``[a, b]`` (duplicates once)."""
    seen: list[str] = []
    for e in errs:
        if e not in seen:
            seen.append(e)
    return seen[0] if len(seen) == 1 else "[" + ", ".join(seen) + "]"


@dataclass(frozen=True)
class Provider:
    """One entry of a resource's provider list: ``kind`` is aesgcm, aescbc,
    secretbox or identity; ``keys`` are (name, cipher) pairs, the first one writes."""

    kind: str
    prefix: str = ""
    keys: tuple[tuple[str, Any], ...] = ()

    @property
    def identity(self) -> bool:
        return self.kind == "identity"

    def seal(self, data: bytes, authenticated: bytes) -> str:
        name, cipher = self.keys[0]
        return f"{self.prefix}{name}:" + base64.b64encode(cipher.encrypt(data, authenticated)).decode()

    def open(self, rest: str, authenticated: bytes) -> tuple[bytes, bool]:
        """Read ``rest`` (the text after this provider's prefix): the plaintext and
        whether a key other than the first one was needed (the value is stale)."""
        errs: list[str] = []
        for i, (name, cipher) in enumerate(self.keys):
            head = name + ":"
            if not rest.startswith(head):
                continue
            try:
                payload = base64.b64decode(rest[len(head):], validate=True)
            except (binascii.Error, ValueError) as exc:
                errs.append(f"illegal base64 data: {exc}")
                continue
            try:
                return cipher.decrypt(payload, authenticated), i != 0
            except DecryptError as exc:
                errs.append(str(exc))  # a later key of the same name may still match
        if errs:
            raise DecryptError(_aggregate(errs))
        which = "Secretbox" if self.kind == "secretbox" else "AES"
        raise DecryptError(f"no matching key was found for the provided {which} transformer")


def identity_provider() -> Provider:
    return Provider("identity")


def aes_provider(kind: str, keys: Sequence[tuple[str, bytes]]) -> Provider:
    """An aesgcm or aescbc provider over (name, raw key) pairs."""
    if kind == "aesgcm":
        return Provider(kind, AESGCM_PREFIX, tuple((n, AESGCMCipher(k)) for n, k in keys))
    if kind == "aescbc":
        return Provider(kind, AESCBC_PREFIX, tuple((n, AESCBCCipher(k)) for n, k in keys))
    raise ValueError(f"not an AES provider: {kind}")


def secretbox_provider(keys: Sequence[tuple[str, bytes]]) -> Provider:
    return Provider("secretbox", SECRETBOX_PREFIX, tuple((n, SecretboxCipher(k)) for n, k in keys))


def is_envelope(value: Any) -> bool:
    """An encrypted value's envelope (stored objects always have a kind; envelopes never)."""
    return type(value) is dict and type(value.get(ENVELOPE_FIELD)) is str and "kind" not in value


class ValueTransformer:
    """The providers of one resource, in order (upstream's prefix transformers)."""

    def __init__(self, providers: Sequence[Provider]) -> None:
        if not providers:
            raise ValueError("a transformer needs at least one provider")
        self.providers = tuple(providers)
        self.writes_plain = self.providers[0].identity

    def to_storage(self, value: Obj, key: str) -> Obj:
        """What the backend stores for ``value`` at ``key``."""
        if self.writes_plain:
            return value
        md = value.get("metadata")
        if isinstance(md, dict) and "resourceVersion" in md:
            md = dict(md)
            del md["resourceVersion"]
            value = {**value, "metadata": md}
        text = self.providers[0].seal(orjson.dumps(value), key.encode())
        return {"metadata": {}, ENVELOPE_FIELD: text}

    def from_storage(self, stored: Obj, key: str) -> tuple[Obj, bool]:
        """The object a stored value holds, stamped with its revision, and whether
        it is stale (not written by the first provider and key: a rewrite changes it).
        Raises :class:`DecryptError` with upstream's text."""
        if not is_envelope(stored):
            for i, p in enumerate(self.providers):
                if p.identity:  # the empty prefix matches any plain value
                    return stored, i != 0
            raise DecryptError("no matching prefix found")
        text = stored[ENVELOPE_FIELD]
        errs: list[str] = []
        for i, p in enumerate(self.providers):
            if p.identity:
                # An envelope is never a plain object. Migrating away from
                # encryption puts identity first: keep trying the providers after it.
                errs.append("identity transformer tried to read encrypted data")
                continue
            if not text.startswith(p.prefix):
                continue
            try:
                data, stale = p.open(text[len(p.prefix):], key.encode())
            except DecryptError as exc:
                errs.append(str(exc))  # an overlapping prefix later in the list may match
                continue
            try:
                obj = orjson.loads(data)
            except orjson.JSONDecodeError as exc:
                raise DecryptError(f"couldn't decode the decrypted value: {exc}") from None
            if not isinstance(obj, dict):
                raise DecryptError("couldn't decode the decrypted value: not an object")
            rv = (stored.get("metadata") or {}).get("resourceVersion")
            if rv is not None:
                obj = stamp(obj, int(rv))
            return obj, stale or i != 0
        if errs:
            raise DecryptError(_aggregate(errs))
        raise DecryptError("no matching prefix found")


#: what a resource without configured providers gets: values are written as
#: they are, and an encrypted one cannot be read (as upstream's encrypt-check)
IDENTITY = ValueTransformer([identity_provider()])


# --------------------------------------------------------------------------- the store


class TransformingStore:
    """A store whose values pass through ``transformer_for(key)`` on the way to
    and from ``inner``. Implements the Store protocol; anything else is the inner store's."""

    def __init__(self, inner: Store, transformer_for: Callable[[str], ValueTransformer]) -> None:
        self.inner = inner
        self._transformer_for = transformer_for

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def revision(self) -> int:
        return self.inner.revision

    @property
    def compacted_revision(self) -> int:
        return self.inner.compacted_revision

    def _read(self, kv: KeyValue, *, in_list: bool = False) -> KeyValue:
        stored = kv.value
        t = self._transformer_for(kv.key)
        if t is IDENTITY and not is_envelope(stored):
            return kv
        try:
            value, stale = t.from_storage(stored, kv.key)
        except DecryptError as exc:
            # upstream: a list names the key it failed on, a get gives the reason alone
            raise TransformError(f'unable to transform key "{kv.key}": {exc}' if in_list else str(exc)) from None
        if value is stored and not stale:
            return kv
        return KeyValue(kv.key, value, kv.create_revision, kv.mod_revision, stale)

    def _value(self, key: str, stored: Obj | None) -> Obj | None:
        if stored is None or not is_envelope(stored) and self._transformer_for(key) is IDENTITY:
            return stored
        try:
            return self._transformer_for(key).from_storage(stored, key)[0]
        except DecryptError as exc:
            raise TransformError(str(exc)) from None

    async def get(self, key: str) -> KeyValue | None:
        kv = await self.inner.get(key)
        return None if kv is None else self._read(kv)

    def _of_prefix(self, prefix: str) -> ValueTransformer | None:
        """The one transformer of every key under ``prefix`` when the prefix names
        a whole resource (``/registry/<group>/<resource>/...``), else None."""
        return self._transformer_for(prefix) if prefix.count("/") >= 4 else None

    async def list(self, prefix: str, *, revision: int = 0, limit: int = 0, start_after: str = "") -> ListResult:
        result = await self.inner.list(prefix, revision=revision, limit=limit, start_after=start_after)
        if self._of_prefix(prefix) is IDENTITY:
            # The common case, kept cheap: nothing to transform unless an envelope is found.
            for kv in result.items:
                if ENVELOPE_FIELD in kv.value:
                    break
            else:
                return result
        items = [self._read(kv, in_list=True) for kv in result.items]
        return ListResult(items, result.revision, result.more)

    def _conflict(self, exc: RevisionConflictError) -> RevisionConflictError:
        return RevisionConflictError(exc.key, exc.expected, self._read(exc.current))

    async def create(self, key: str, value: Obj) -> KeyValue:
        t = self._transformer_for(key)
        if t.writes_plain:
            return await self.inner.create(key, value)
        kv = await self.inner.create(key, t.to_storage(value, key))
        return KeyValue(key, stamp(value, kv.mod_revision), kv.create_revision, kv.mod_revision)

    async def update(self, key: str, value: Obj, expected_revision: int | None = None) -> KeyValue:
        t = self._transformer_for(key)
        try:
            kv = await self.inner.update(key, t.to_storage(value, key), expected_revision)
        except RevisionConflictError as exc:
            raise self._conflict(exc) from None
        if t.writes_plain:
            return kv
        return KeyValue(key, stamp(value, kv.mod_revision), kv.create_revision, kv.mod_revision)

    async def delete(self, key: str, expected_revision: int | None = None) -> KeyValue:
        try:
            kv = await self.inner.delete(key, expected_revision)
        except RevisionConflictError as exc:
            raise self._conflict(exc) from None
        return self._read(kv)

    def watch(self, prefix: str, revision: int) -> "TransformingWatch":
        return TransformingWatch(self, self.inner.watch(prefix, revision), self._of_prefix(prefix) is IDENTITY)

    def _event(self, ev: Event) -> Event:
        value = self._value(ev.key, ev.value)
        prev = self._value(ev.key, ev.prev_value)
        if value is ev.value and prev is ev.prev_value:
            return ev
        assert value is not None
        return Event(ev.type, ev.key, value, prev, ev.revision)

    async def close(self) -> None:
        await self.inner.close()


class TransformingWatch:
    """A watch whose events are transformed back. An event that cannot be read
    ends the watch with :class:`TransformError`, after the events before it."""

    def __init__(self, store: TransformingStore, inner: Any, plain: bool = False) -> None:
        self._store = store
        self._inner = inner
        self._error: TransformError | None = None
        #: every key watched is identity's: only envelopes need a look
        self._plain = plain

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("_store", "_inner", "_error", "_plain"):
            object.__setattr__(self, name, value)
        else:  # e.g. on_overflow: the inner watch calls it
            setattr(self._inner, name, value)

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        if self._error is not None:
            self._raise()
        ev = await self._inner.__anext__()
        try:
            return self._store._event(ev)
        except TransformError:
            self._inner.close()
            raise

    async def next_batch(self, timeout: float | None = None) -> list[Event] | None:
        if self._error is not None:
            self._raise()
        batch = await self._inner.next_batch(timeout)
        if not batch:
            return batch
        if self._plain:
            for ev in batch:
                if ENVELOPE_FIELD in ev.value or ev.prev_value is not None and ENVELOPE_FIELD in ev.prev_value:
                    break
            else:
                return batch
        out: list[Event] = []
        for ev in batch:
            try:
                out.append(self._store._event(ev))
            except TransformError as exc:
                self._error = exc
                self._inner.close()
                if not out:
                    self._raise()
                break
        return out

    def _raise(self) -> None:
        err, self._error = self._error, None
        assert err is not None
        raise err

    @property
    def waiting(self) -> bool:
        return self._inner.waiting

    def close(self) -> None:
        self._inner.close()


__all__ = [
    "AESCBCCipher", "AESGCMCipher", "DecryptError", "ENVELOPE_FIELD", "IDENTITY", "Provider", "SecretboxCipher",
    "TransformError", "TransformingStore", "TransformingWatch", "ValueTransformer", "aes_provider",
    "identity_provider", "is_envelope", "secretbox_provider", "upstream_bytes",
]
