"""Encryption at rest at the storage boundary: the providers, upstream's wire
format, key rotation, identity migration, and TransformingStore over both backends."""

from __future__ import annotations

import asyncio
import base64
import sqlite3
from pathlib import Path
from typing import AsyncIterator

import orjson
import pytest
from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from kubeplane.storage import MemoryStore, SQLiteStore
from kubeplane.storage.interface import RevisionConflictError
from kubeplane.storage.transformer import (
    ENVELOPE_FIELD,
    IDENTITY,
    DecryptError,
    TransformError,
    TransformingStore,
    ValueTransformer,
    aes_provider,
    identity_provider,
    is_envelope,
    secretbox_provider,
    upstream_bytes,
)

from helpers import eventually

KEY = "/registry/core/secrets/default/s1"
K1 = bytes(range(32))
K2 = bytes(range(100, 132))
PLAINTEXT = "c3VwZXItc2VjcmV0LXZhbHVl"  # base64 of the secret's data


def secret(name: str = "s1", value: str = PLAINTEXT) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": "default"},
            "data": {"password": value}, "type": "Opaque"}


def provider(kind: str, *keys: tuple[str, bytes]):
    return secretbox_provider(keys) if kind == "secretbox" else aes_provider(kind, keys)


KINDS = ["aesgcm", "aescbc", "secretbox"]


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_with_upstreams_prefix(kind: str) -> None:
    t = ValueTransformer([provider(kind, ("key1", K1))])
    stored = t.to_storage({**secret(), "metadata": {**secret()["metadata"], "resourceVersion": "7"}}, KEY)
    assert is_envelope(stored) and set(stored) == {"metadata", ENVELOPE_FIELD}
    text = stored[ENVELOPE_FIELD]
    assert text.startswith(f"k8s:enc:{kind}:v1:key1:")
    assert PLAINTEXT not in text and "password" not in text
    # Two writes of one value differ (random nonce / IV).
    assert t.to_storage(secret(), KEY)[ENVELOPE_FIELD] != t.to_storage(secret(), KEY)[ENVELOPE_FIELD]
    obj, stale = t.from_storage({**stored, "metadata": {"resourceVersion": "9"}}, KEY)
    assert not stale
    assert obj == {**secret(), "metadata": {**secret()["metadata"], "resourceVersion": "9"}}


def test_aesgcm_bytes_are_upstreams_and_bound_to_the_key() -> None:
    """nonce(12) || AES-GCM(ciphertext||tag) with the storage key as additional data."""
    t = ValueTransformer([provider("aesgcm", ("key1", K1))])
    raw = upstream_bytes(t.to_storage(secret(), KEY)[ENVELOPE_FIELD])
    prefix = b"k8s:enc:aesgcm:v1:key1:"
    assert raw.startswith(prefix)
    body = raw[len(prefix):]
    plain = AESGCM(K1).decrypt(body[:12], body[12:], KEY.encode())
    assert orjson.loads(plain) == secret()
    moved = t.to_storage(secret(), KEY)
    with pytest.raises(DecryptError, match="cipher: message authentication failed"):
        t.from_storage(moved, "/registry/core/secrets/default/other")


def test_aescbc_bytes_are_upstreams() -> None:
    """IV(16) || AES-CBC(PKCS#7-padded plaintext)."""
    t = ValueTransformer([provider("aescbc", ("k", K1[:16]))])
    raw = upstream_bytes(t.to_storage(secret(), KEY)[ENVELOPE_FIELD])
    body = raw[len(b"k8s:enc:aescbc:v1:k:"):]
    dec = Cipher(algorithms.AES(K1[:16]), modes.CBC(body[:16])).decryptor()
    padded = dec.update(body[16:]) + dec.finalize()
    unpadder = padding.PKCS7(128).unpadder()  # raises on anything but PKCS#7 padding
    plain = unpadder.update(padded) + unpadder.finalize()
    # PKCS#7 always pads, by 1 to 16 bytes: a whole block when the length is a multiple of 16
    assert len(padded) - len(plain) == 16 - len(plain) % 16
    assert orjson.loads(plain) == secret()


def test_secretbox_bytes_are_upstreams() -> None:
    """nonce(24) || secretbox.Seal (tag || XSalsa20 ciphertext)."""
    from nacl.secret import SecretBox

    t = ValueTransformer([provider("secretbox", ("sb", K1))])
    raw = upstream_bytes(t.to_storage(secret(), KEY)[ENVELOPE_FIELD])
    body = raw[len(b"k8s:enc:secretbox:v1:sb:"):]
    assert orjson.loads(SecretBox(K1).decrypt(body[24:], body[:24])) == secret()


@pytest.mark.parametrize("kind", KINDS)
def test_value_of_key1_readable_after_key2_becomes_first(kind: str) -> None:
    old = ValueTransformer([provider(kind, ("key1", K1))])
    stored = old.to_storage(secret(), KEY)
    rotated = ValueTransformer([provider(kind, ("key2", K2), ("key1", K1))])
    obj, stale = rotated.from_storage(stored, KEY)
    assert obj == secret() and stale  # readable, and a rewrite would change it
    again = rotated.to_storage(obj, KEY)
    assert again[ENVELOPE_FIELD].startswith(f"k8s:enc:{kind}:v1:key2:")
    assert rotated.from_storage(again, KEY) == (secret(), False)
    # Key 1 removed: the old value cannot be read any more.
    only2 = ValueTransformer([provider(kind, ("key2", K2))])
    which = "Secretbox" if kind == "secretbox" else "AES"
    with pytest.raises(DecryptError, match=f"^no matching key was found for the provided {which} transformer$"):
        only2.from_storage(stored, KEY)


def test_same_key_name_with_another_secret_fails_with_the_ciphers_error() -> None:
    stored = ValueTransformer([provider("aesgcm", ("k", K1))]).to_storage(secret(), KEY)
    with pytest.raises(DecryptError, match="^cipher: message authentication failed$"):
        ValueTransformer([provider("aesgcm", ("k", K2))]).from_storage(stored, KEY)
    stored = ValueTransformer([provider("secretbox", ("k", K1))]).to_storage(secret(), KEY)
    with pytest.raises(DecryptError, match="^output array was not large enough for encryption$"):
        ValueTransformer([provider("secretbox", ("k", K2))]).from_storage(stored, KEY)
    for _ in range(20):
        # A wrong CBC key gives garbage padding, or (rarely) valid padding on garbage
        # that does not decode: either way a DecryptError, never another exception.
        stored = ValueTransformer([provider("aescbc", ("k", K1))]).to_storage(secret(), KEY)
        with pytest.raises(DecryptError, match="invalid padding on input|invalid PKCS7 data|couldn't decode"):
            ValueTransformer([provider("aescbc", ("k", K2))]).from_storage(stored, KEY)


def test_overlapping_providers_try_the_next_one() -> None:
    """Two aescbc entries (rotating to key 2, away from key 1 of the same name):
    a failure in the first does not stop the second."""
    stored = ValueTransformer([provider("aescbc", ("same", K1))]).to_storage(secret(), KEY)
    both = ValueTransformer([provider("aescbc", ("same", K2)), provider("aescbc", ("same", K1))])
    assert both.from_storage(stored, KEY) == (secret(), True)


def test_identity_first_reads_encrypted_and_plain_values() -> None:
    enc = ValueTransformer([provider("aesgcm", ("key1", K1)), identity_provider()])
    stored = enc.to_storage(secret(), KEY)
    # Migrating away from encryption: identity first, the old provider after it.
    plain_first = ValueTransformer([identity_provider(), provider("aesgcm", ("key1", K1))])
    assert plain_first.from_storage(stored, KEY) == (secret(), True)
    assert plain_first.to_storage(secret(), KEY) is not None and not is_envelope(plain_first.to_storage(secret(), KEY))
    assert plain_first.from_storage(secret(), KEY) == (secret(), False)
    # Identity after the encrypting provider: plain values stay readable, but stale.
    assert enc.from_storage(secret(), KEY) == (secret(), True)


def test_unreadable_values_name_upstreams_reasons() -> None:
    stored = ValueTransformer([provider("aesgcm", ("key1", K1))]).to_storage(secret(), KEY)
    with pytest.raises(DecryptError, match="^identity transformer tried to read encrypted data$"):
        IDENTITY.from_storage(stored, KEY)
    with pytest.raises(DecryptError, match="^no matching prefix found$"):
        ValueTransformer([provider("secretbox", ("key1", K1))]).from_storage(stored, KEY)
    with pytest.raises(DecryptError, match="^no matching prefix found$"):
        # Plain data, no identity provider: upstream cannot read it either.
        ValueTransformer([provider("aesgcm", ("key1", K1))]).from_storage(secret(), KEY)
    short = {"metadata": {}, ENVELOPE_FIELD: "k8s:enc:aesgcm:v1:key1:" + base64.b64encode(b"abc").decode()}
    with pytest.raises(DecryptError, match="^the stored data was shorter than the required size$"):
        ValueTransformer([provider("aesgcm", ("key1", K1))]).from_storage(short, KEY)
    ragged = {"metadata": {}, ENVELOPE_FIELD: "k8s:enc:aescbc:v1:k:" + base64.b64encode(bytes(20)).decode()}
    with pytest.raises(DecryptError, match="^the stored data is not a multiple of the block size$"):
        ValueTransformer([provider("aescbc", ("k", K1))]).from_storage(ragged, KEY)
    # Several failures: upstream's aggregate.
    two = ValueTransformer([identity_provider(), provider("aesgcm", ("key1", K2))])
    with pytest.raises(DecryptError, match=r"^\[identity transformer tried to read encrypted data, "
                                           r"cipher: message authentication failed\]$"):
        two.from_storage(stored, KEY)


# --------------------------------------------------------------------------- over the backends


ENCRYPTED = ValueTransformer([provider("aesgcm", ("key1", K1)), identity_provider()])


def secrets_only(t: ValueTransformer):
    return lambda key: t if key.startswith("/registry/core/secrets/") else IDENTITY


@pytest.fixture(params=["memory", "sqlite"])
async def backend(request, tmp_path: Path) -> AsyncIterator:
    if request.param == "memory":
        store = MemoryStore()
    else:
        store = await SQLiteStore.open(str(tmp_path / "kubeplane.db"))
    yield store
    await store.close()


async def test_store_encrypts_before_the_backend_and_decrypts_every_read(backend) -> None:
    store = TransformingStore(backend, secrets_only(ENCRYPTED))
    w = store.watch("/registry/", store.revision)
    kv = await store.create(KEY, secret())
    assert kv.value["data"]["password"] == PLAINTEXT and kv.value["metadata"]["resourceVersion"] == str(kv.mod_revision)
    cm_key = "/registry/core/configmaps/default/c"
    await store.create(cm_key, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "b"}})
    # The backend (current state and history) holds only the envelope.
    raw = (await backend.get(KEY)).value
    assert is_envelope(raw) and PLAINTEXT not in orjson.dumps(raw).decode()
    assert (await backend.get(cm_key)).value["data"] == {"a": "b"}  # other resources as they were
    got = await store.get(KEY)
    assert got is not None and got.value == kv.value and not got.stale
    listed = await store.list("/registry/core/secrets/")
    assert [i.value for i in listed.items] == [kv.value]
    upd = await store.update(KEY, {**kv.value, "data": {"password": "bmV3"}}, expected_revision=kv.mod_revision)
    with pytest.raises(RevisionConflictError) as conflict:
        await store.update(KEY, kv.value, expected_revision=kv.mod_revision)
    assert conflict.value.current.value == upd.value  # the conflict's current object, decrypted
    old = await store.list("/registry/core/secrets/", revision=kv.mod_revision)
    assert old.items[0].value["data"]["password"] == PLAINTEXT  # history decrypts too
    gone = await store.delete(KEY)
    assert gone.value["data"]["password"] == "bmV3"
    events = []
    while len(events) < 4:
        events += await w.next_batch(timeout=2) or []
    assert [(e.type, e.key) for e in events] == [("ADDED", KEY), ("ADDED", cm_key), ("MODIFIED", KEY), ("DELETED", KEY)]
    assert events[0].value == kv.value
    assert events[2].value == upd.value and events[2].prev_value == kv.value
    assert events[3].value["data"]["password"] == "bmV3" and events[3].prev_value == upd.value
    w.close()


async def test_rewrite_after_rotation_is_marked_stale_and_reencrypts(backend) -> None:
    await TransformingStore(backend, secrets_only(ENCRYPTED)).create(KEY, secret())
    rotated = ValueTransformer([provider("aesgcm", ("key2", K2), ("key1", K1)), identity_provider()])
    store = TransformingStore(backend, secrets_only(rotated))
    kv = await store.get(KEY)
    assert kv is not None and kv.stale and kv.value["data"]["password"] == PLAINTEXT
    await store.update(KEY, kv.value)
    assert (await backend.get(KEY)).value[ENVELOPE_FIELD].startswith("k8s:enc:aesgcm:v1:key2:")
    assert not (await store.get(KEY)).stale


async def test_an_unreadable_value_fails_its_reads_and_nothing_else(backend) -> None:
    await TransformingStore(backend, secrets_only(ENCRYPTED)).create(KEY, secret())
    await backend.create("/registry/core/configmaps/default/c", {"kind": "ConfigMap", "metadata": {"name": "c"}})
    w_other = TransformingStore(backend, lambda k: IDENTITY).watch("/registry/", backend.revision)
    # A watch of one resource takes the cheap path for plain values, but still sees envelopes.
    w_secrets = TransformingStore(backend, lambda k: IDENTITY).watch("/registry/core/secrets/", backend.revision)
    lost_key = TransformingStore(backend, lambda k: IDENTITY)  # e.g. restarted without the file
    with pytest.raises(TransformError, match="^identity transformer tried to read encrypted data$"):
        await lost_key.get(KEY)
    with pytest.raises(TransformError, match=r'^unable to transform key "/registry/core/secrets/default/s1": '
                                             r"identity transformer tried to read encrypted data$"):
        await lost_key.list("/registry/core/secrets/")
    assert (await lost_key.get("/registry/core/configmaps/default/c")) is not None
    assert len((await lost_key.list("/registry/core/configmaps/")).items) == 1
    # A watch delivers what comes before the unreadable event, then fails.
    await backend.create("/registry/core/configmaps/default/d", {"kind": "ConfigMap", "metadata": {"name": "d"}})
    await TransformingStore(backend, secrets_only(ENCRYPTED)).create("/registry/core/secrets/default/s2", secret("s2"))
    got = []
    with pytest.raises(TransformError, match="identity transformer tried to read encrypted data"):
        while True:
            got += [e.key for e in await w_other.next_batch(timeout=2) or []]
    assert got == ["/registry/core/configmaps/default/d"]
    assert await w_other.next_batch(timeout=0.01) is None  # ended
    with pytest.raises(TransformError, match="identity transformer tried to read encrypted data"):
        await w_secrets.next_batch(timeout=2)


async def test_sqlite_file_holds_no_plaintext_secret(tmp_path: Path) -> None:
    path = tmp_path / "kubeplane.db"
    backend = await SQLiteStore.open(str(path))
    store = TransformingStore(backend, secrets_only(ENCRYPTED))
    kv = await store.create(KEY, secret())
    await store.update(KEY, {**kv.value, "stringData": None, "data": {"password": PLAINTEXT, "second": PLAINTEXT}})
    await store.create("/registry/core/configmaps/default/plain", {
        "kind": "ConfigMap", "metadata": {"name": "plain"}, "data": {"marker": "visible-configmap-value"}})
    await backend.close()
    blob = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("kubeplane.db"))
    assert b"visible-configmap-value" in blob  # the check can see what is stored in clear
    assert PLAINTEXT.encode() not in blob and b"password" not in blob
    assert b"k8s:enc:aesgcm:v1:key1:" in blob
    rows = sqlite3.connect(path).execute("SELECT value FROM history").fetchall()
    assert rows and all(PLAINTEXT.encode() not in bytes(r[0]) for r in rows)
    # Reopened with the key: readable.
    again = TransformingStore(await SQLiteStore.open(str(path)), secrets_only(ENCRYPTED))
    assert (await again.get(KEY)).value["data"]["second"] == PLAINTEXT
    await again.close()


async def test_watch_wrapper_is_a_sync_point_and_closes(backend) -> None:
    store = TransformingStore(backend, secrets_only(ENCRYPTED))
    w = store.watch("/registry/", store.revision)
    assert not w.waiting
    task = asyncio.create_task(w.next_batch(timeout=5))
    await eventually(lambda: w.waiting, what="next_batch parked")
    w.close()
    assert await asyncio.wait_for(task, 2) is None
