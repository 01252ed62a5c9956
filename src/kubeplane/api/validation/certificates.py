"""Validation of certificates.k8s.io/v1 CertificateSigningRequests, with
upstream's rules and messages (pkg/apis/certificates/validation).

``spec.request`` and ``status.certificate`` are base64 strings in JSON (Go
``[]byte``); the checks decode them. The update rules that depend on the
endpoint (status or approval) are :func:`subresource_update_causes`; the
registry's strategy adds them to the object's own checks.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from kubeplane.api.errors import (
    Cause,
    duplicate,
    forbidden_field,
    invalid_value,
    not_supported,
    required,
    too_long,
)
from kubeplane.api.strings import is_dns1123_label, is_dns1123_subdomain
from kubeplane.api.validation.common import _d, _l, _s

APPROVED = "Approved"
DENIED = "Denied"
FAILED = "Failed"

#: the signer name of the deprecated v1beta1 default, refused by v1
LEGACY_UNKNOWN_SIGNER = "kubernetes.io/legacy-unknown"

#: condition types whose only allowed status is True
_TRUE_ONLY_TYPES = frozenset({APPROVED, DENIED, FAILED})
_ALL_STATUSES = ("False", "True", "Unknown")

#: the key usages of certificates.k8s.io (sorted, as upstream lists them)
VALID_USAGES = tuple(sorted((
    "signing", "digital signature", "content commitment", "key encipherment", "key agreement",
    "data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any",
    "server auth", "client auth", "code signing", "email protection", "s/mime", "ipsec end system",
    "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing", "microsoft sgc", "netscape sgc",
)))
_VALID_USAGES = frozenset(VALID_USAGES)

#: the longest a bad []byte value is printed in a message (the rest is elided)
_MAX_PRINTED_BYTES = 256

_PEM_BLOCK = re.compile(
    rb"-----BEGIN ([^\r\n-]*)-----\r?\n(.*?)-----END \1-----", re.DOTALL)


def decode_bytes(value: Any) -> bytes | None:
    """A Go ``[]byte`` field's JSON form (base64) decoded; None if it is not one."""
    if value is None:
        return b""
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None


def go_bytes(data: bytes) -> str:
    """``%#v`` of a Go ``[]byte``: ``[]byte{0x2d, 0x2d}``."""
    shown = ", ".join(f"0x{b:x}" for b in data[:_MAX_PRINTED_BYTES])
    if len(data) > _MAX_PRINTED_BYTES:
        shown += ", ..."
    return "[]byte{" + shown + "}"


def pem_blocks(data: bytes) -> list[tuple[str, dict[str, str], bytes]]:
    """The PEM blocks of ``data`` in order: (type, headers, DER bytes). Text
    around and between blocks is skipped, as Go's pem.Decode skips it; a block
    whose body is not base64 ends the list."""
    out = []
    for m in _PEM_BLOCK.finditer(data):
        kind = m.group(1).decode("ascii", "replace")
        body = m.group(2)
        headers: dict[str, str] = {}
        lines = body.split(b"\n")
        # RFC 1421 headers: "Key: value" lines, then a blank line
        if lines and b":" in lines[0]:
            i = 0
            while i < len(lines) and b":" in lines[i]:
                k, _, v = lines[i].partition(b":")
                headers[k.strip().decode("ascii", "replace")] = v.strip().decode("ascii", "replace")
                i += 1
            body = b"\n".join(lines[i:])
        try:
            der = base64.b64decode(b"".join(body.split()), validate=True)
        except (binascii.Error, ValueError):
            break
        out.append((kind, headers, der))
    return out


def parse_csr(data: bytes) -> Any:
    """The x509 CertificateRequest of a PEM ``CERTIFICATE REQUEST`` (upstream's
    certificates.ParseCSR); raises ValueError with upstream's message."""
    from cryptography import x509

    blocks = pem_blocks(data)
    if not blocks or blocks[0][0] != "CERTIFICATE REQUEST":
        raise ValueError("PEM block type must be CERTIFICATE REQUEST")
    try:
        return x509.load_der_x509_csr(blocks[0][2])
    except ValueError as err:
        raise ValueError(f"x509: malformed certificate request: {err}") from None


def _check_csr(data: bytes) -> str | None:
    try:
        csr = parse_csr(data)
    except ValueError as err:
        return str(err)
    try:
        ok = csr.is_signature_valid
    except Exception:  # noqa: BLE001 - an unsupported algorithm is a bad request too
        ok = False
    return None if ok else "x509: signature verification failure"


def _check_certificate(data: bytes) -> str | None:
    """upstream's validateCertificate: empty, or one or more CERTIFICATE blocks."""
    from cryptography import x509

    if not data:
        return None
    blocks = pem_blocks(data)
    if not blocks:
        return "must contain at least one CERTIFICATE PEM block"
    for kind, headers, der in blocks:
        if kind != "CERTIFICATE":
            return f'only CERTIFICATE PEM blocks are allowed, found "{kind}"'
        if headers:
            return "no PEM block headers are permitted"
        try:
            x509.load_der_x509_certificate(der)
        except ValueError as err:
            return f"x509: malformed certificate: {err}"
    return None


def validate_signer_name(path: str, name: str) -> list[Cause]:
    """upstream's ValidateSignerName: ``example.com/signer-name``."""
    if not name:
        return [required(path)]
    segments = name.split("/")
    if len(segments) != 2:
        return [invalid_value(path, name, "must be a fully qualified domain and path of the form "
                                          "'example.com/signer-name'")]
    domain, rest = segments
    out: list[Cause] = []
    if len(domain) > 253:
        out.append(too_long(path, domain, 253))
    labels = domain.split(".")
    for label in labels:
        errs = is_dns1123_label(label)
        if errs:
            out += [invalid_value(path, domain, f'validating label "{label}": {e}') for e in errs]
            break
    if len(labels) < 2:
        out.append(invalid_value(path, domain, "should be a domain with at least two segments separated by dots"))
    for part in rest.split("."):
        errs = is_dns1123_subdomain(part)
        if errs:
            out += [invalid_value(path, rest, f'validating component "{part}": {e}') for e in errs]
            break
    max_path = 253 - len(domain) - 1
    if len(rest) > max_path:
        out.append(too_long(path, rest, max_path))
    return out


def _conditions(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return [c if isinstance(c, dict) else {} for c in _l(_d(obj.get("status")).get("conditions"))]


def find_conditions(obj: dict[str, Any], ctype: str) -> list[dict[str, Any]]:
    return [c for c in _conditions(obj) if c.get("type") == ctype]


def _compat(old: dict[str, Any] | None) -> dict[str, bool]:
    """What an update tolerates because the stored object already has it."""
    if old is None:
        return {"both": False, "legacy": False, "dup_types": False, "empty_type": False,
                "unknown_usages": False, "dup_usages": False}
    conds = _conditions(old)
    types = [c.get("type") for c in conds]
    usages = [u for u in _l(_d(old.get("spec")).get("usages"))]
    return {
        "both": APPROVED in types and DENIED in types,
        "legacy": _s(_d(old.get("spec")).get("signerName")) == LEGACY_UNKNOWN_SIGNER,
        "dup_types": len(types) != len(set(map(str, types))),
        "empty_type": any(not t for t in types),
        "unknown_usages": any(u not in _VALID_USAGES for u in usages),
        "dup_usages": len(usages) != len(set(map(str, usages))),
    }


def validate_csr(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[Cause]:
    """upstream's validateCertificateSigningRequest (metadata aside)."""
    opts = _compat(old)
    spec = _d(obj.get("spec"))
    out: list[Cause] = []
    request = decode_bytes(spec.get("request"))
    if request is None:
        out.append(invalid_value("spec.request", spec.get("request"), "must be base64-encoded PEM data"))
    else:
        problem = _check_csr(request)
        if problem:
            out.append(Cause("FieldValueInvalid", f"Invalid value: {go_bytes(request)}: {problem}", "spec.request"))
    usages = _l(spec.get("usages"))
    if not usages:
        out.append(required("spec.usages"))
    if not opts["unknown_usages"]:
        for i, u in enumerate(usages):
            if u not in _VALID_USAGES:
                out.append(not_supported(f"spec.usages[{i}]", u, VALID_USAGES))
    if not opts["dup_usages"]:
        seen: set[Any] = set()
        for i, u in enumerate(usages):
            key = u if isinstance(u, (str, int, float, bool)) or u is None else repr(u)
            if key in seen:
                out.append(duplicate(f"spec.usages[{i}]", u))
            seen.add(key)
    signer = _s(spec.get("signerName"))
    if not opts["legacy"] and signer == LEGACY_UNKNOWN_SIGNER:
        out.append(invalid_value("spec.signerName", signer, "the legacy signerName is not allowed via this API version"))
    else:
        out += validate_signer_name("spec.signerName", signer)
    exp = spec.get("expirationSeconds")
    if isinstance(exp, int) and not isinstance(exp, bool) and exp < 600:
        out.append(invalid_value("spec.expirationSeconds", exp, "may not specify a duration less than 600 seconds (10 minutes)"))
    out += _validate_conditions(obj, opts)
    status = _d(obj.get("status"))
    cert = decode_bytes(status.get("certificate"))
    old_cert = decode_bytes(_d((old or {}).get("status")).get("certificate")) if old is not None else None
    arbitrary = old is not None and (cert == old_cert or (old_cert is not None and _check_certificate(old_cert)))
    if not arbitrary:
        if cert is None:
            out.append(invalid_value("status.certificate", "<certificate data>", "must be base64-encoded PEM data"))
        else:
            problem = _check_certificate(cert)
            if problem:
                out.append(invalid_value("status.certificate", "<certificate data>", problem))
    return out


def _validate_conditions(obj: dict[str, Any], opts: dict[str, bool]) -> list[Cause]:
    out: list[Cause] = []
    seen: set[str] = set()
    has_approved = has_denied = False
    for i, c in enumerate(_conditions(obj)):
        path = f"status.conditions[{i}]"
        ctype = _s(c.get("type"))
        if not opts["empty_type"] and not ctype:
            out.append(required(f"{path}.type"))
        allowed = ("True",) if ctype in _TRUE_ONLY_TYPES else _ALL_STATUSES
        status = c.get("status")
        if not status:
            out.append(required(f"{path}.status"))
        elif status not in allowed:
            out.append(not_supported(f"{path}.status", status, allowed))
        if not opts["both"]:
            if ctype == APPROVED:
                has_approved = True
                if has_denied:
                    out.append(invalid_value(f"{path}.type", ctype, "Approved and Denied conditions are mutually exclusive"))
            elif ctype == DENIED:
                has_denied = True
                if has_approved:
                    out.append(invalid_value(f"{path}.type", ctype, "Approved and Denied conditions are mutually exclusive"))
        if not opts["dup_types"]:
            if ctype in seen:
                out.append(duplicate(f"{path}.type", ctype))
            seen.add(ctype)
    return out


def validate_csr_create(obj: dict[str, Any]) -> list[Cause]:
    return validate_csr(obj, None)


def validate_csr_update(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    """The update rules every endpoint shares (upstream's
    validateCertificateSigningRequestUpdate, less the checks of the object
    itself, which :func:`validate_csr_create` runs on every write)."""
    out: list[Cause] = []
    for ctype in (APPROVED, DENIED, FAILED):
        if len(find_conditions(new, ctype)) < len(find_conditions(old, ctype)):
            out.append(forbidden_field("status.conditions", f'updates may not remove a condition of type "{ctype}"'))
    new_cert = decode_bytes(_d(new.get("status")).get("certificate"))
    old_cert = decode_bytes(_d(old.get("status")).get("certificate"))
    if new_cert != old_cert and old_cert:
        out.append(forbidden_field("status.certificate", "updates may not modify existing certificate content"))
    return out


def subresource_update_causes(new: dict[str, Any], old: dict[str, Any], subresource: str | None) -> list[Cause]:
    """What only the approval endpoint may do: add, remove or change the
    Approved and Denied conditions; and only the status endpoint may set the
    certificate."""
    out: list[Cause] = []
    if subresource != "approval":
        for ctype in (APPROVED, DENIED):
            new_c, old_c = find_conditions(new, ctype), find_conditions(old, ctype)
            if len(new_c) < len(old_c):
                continue  # reported as a removal already
            if len(new_c) > len(old_c):
                out.append(forbidden_field("status.conditions", f'updates may not add a condition of type "{ctype}"'))
            elif new_c != old_c:
                out.append(forbidden_field("status.conditions", f'updates may not modify a condition of type "{ctype}"'))
    if subresource != "status":
        if decode_bytes(_d(new.get("status")).get("certificate")) != decode_bytes(
                _d(old.get("status")).get("certificate")):
            out.append(forbidden_field("status.certificate", "updates may not set certificate content"))
    return out


def csr_name(name: str, prefix: bool = False) -> list[str]:
    """Any name that fits in a URL path segment will do for a CSR (upstream's
    ValidateCertificateRequestName accepts all; its REST layer refuses the
    names no path can carry)."""
    if not prefix and name in (".", ".."):
        return [f"may not be '{name}'"]
    return [f"may not contain '{c}'" for c in ("/", "%") if c in name]
