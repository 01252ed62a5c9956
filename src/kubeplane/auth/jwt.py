"""JSON Web Tokens (RFC 7519) signed with RS256 or ES256, as ServiceAccount tokens are.

Only what ServiceAccount tokens need: compact JWS, one signature, the key id
upstream derives from the public key (base64url of the SHA-256 of its DER
SubjectPublicKeyInfo).
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import orjson

# cryptography is imported when a token is signed or verified, not with this module.

#: a token longer than this is not looked at (upstream's tokens are a few KiB)
MAX_TOKEN_BYTES = 64 * 1024


class JWTError(ValueError):
    pass


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64url(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError) as exc:
        raise JWTError("malformed token") from exc


def key_id(public_key: Any) -> str:
    from cryptography.hazmat.primitives._serialization import Encoding, PublicFormat

    der = public_key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return b64url(hashlib.sha256(der).digest())


def algorithm(key: Any) -> str:
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    if isinstance(key, (rsa.RSAPrivateKey, rsa.RSAPublicKey)):
        return "RS256"
    if isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)):
        size = key.curve.key_size
        if size == 256:
            return "ES256"
        if size == 384:
            return "ES384"
        if size == 521:
            return "ES512"
    raise JWTError(f"unsupported signing key type {type(key).__name__}")


#: the hash of each algorithm (cryptography.hazmat.primitives.hashes' class names)
_HASH = {"RS256": "SHA256", "ES256": "SHA256", "ES384": "SHA384", "ES512": "SHA512"}
_EC_SIZE = {"ES256": 32, "ES384": 48, "ES512": 66}


def _hash(alg: str) -> Any:
    from cryptography.hazmat.primitives import hashes

    return getattr(hashes, _HASH[alg])()


def sign(claims: dict[str, Any], key: Any) -> str:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, padding
    from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

    alg = algorithm(key)
    header = {"alg": alg, "kid": key_id(key.public_key())}
    signing_input = f"{b64url(orjson.dumps(header))}.{b64url(orjson.dumps(claims))}".encode()
    if alg == "RS256":
        sig = key.sign(signing_input, padding.PKCS1v15(), hashes.SHA256())
    else:
        r, s = decode_dss_signature(key.sign(signing_input, ec.ECDSA(_hash(alg))))
        n = _EC_SIZE[alg]
        sig = r.to_bytes(n, "big") + s.to_bytes(n, "big")
    return f"{signing_input.decode()}.{b64url(sig)}"


def looks_like_jwt(token: str) -> bool:
    return token.count(".") == 2 and len(token) <= MAX_TOKEN_BYTES


def unverified(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The header and claims, not yet verified."""
    if not looks_like_jwt(token):
        raise JWTError("malformed token")
    h, c, _ = token.split(".")
    try:
        header = orjson.loads(unb64url(h))
        claims = orjson.loads(unb64url(c))
    except orjson.JSONDecodeError as exc:
        raise JWTError("malformed token") from exc
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise JWTError("malformed token")
    return header, claims


def verify(token: str, public_keys: list[Any]) -> dict[str, Any]:
    """The claims of ``token`` if one of ``public_keys`` signed it."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, padding
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

    header, claims = unverified(token)
    alg = header.get("alg")
    if alg not in _HASH:
        raise JWTError(f"unsupported signing algorithm {alg!r}")
    h, c, s = token.split(".")
    signing_input = f"{h}.{c}".encode()
    sig = unb64url(s)
    kid = header.get("kid")
    candidates = [k for k in public_keys if _alg_fits(k, alg)]
    if kid:
        matching = [k for k in candidates if key_id(k) == kid]
        candidates = matching or candidates
    for key in candidates:
        try:
            if alg == "RS256":
                key.verify(sig, signing_input, padding.PKCS1v15(), hashes.SHA256())
            else:
                n = _EC_SIZE[alg]
                if len(sig) != 2 * n:
                    continue
                der = encode_dss_signature(int.from_bytes(sig[:n], "big"), int.from_bytes(sig[n:], "big"))
                key.verify(der, signing_input, ec.ECDSA(_hash(alg)))
            return claims
        except InvalidSignature:
            continue
    raise JWTError("invalid signature")


def _alg_fits(key: Any, alg: str) -> bool:
    try:
        return algorithm(key) == alg
    except JWTError:
        return False


def load_public_keys(path: str) -> list[Any]:
    """Every public key in a PEM file (public keys, private keys and
    certificates all count, as upstream's ``--service-account-key-file``)."""
    from cryptography import x509

    from cryptography.hazmat.primitives import serialization

    with open(path, "rb") as f:
        data = f.read()
    keys: list[Any] = []
    for block in _pem_blocks(data):
        label = block.split(b"\n", 1)[0]
        try:
            if b"CERTIFICATE" in label:
                keys.append(x509.load_pem_x509_certificate(block).public_key())
            elif b"PRIVATE KEY" in label:
                keys.append(serialization.load_pem_private_key(block, password=None).public_key())
            elif b"PUBLIC KEY" in label:
                keys.append(serialization.load_pem_public_key(block))
        except ValueError as exc:
            raise ValueError(f"{path}: cannot read a key: {exc}") from None
    if not keys:
        raise ValueError(f"{path}: no public key found")
    return keys


def _pem_blocks(data: bytes) -> list[bytes]:
    out = []
    rest = data
    while True:
        start = rest.find(b"-----BEGIN ")
        if start < 0:
            return out
        end_marker = rest.find(b"-----END ", start)
        if end_marker < 0:
            return out
        end = rest.find(b"-----", end_marker + 9)
        if end < 0:
            return out
        out.append(rest[start:end + 5] + b"\n")
        rest = rest[end + 5:]
