"""Kubernetes' URL, IP and CIDR CEL libraries (``k8s.io/apiserver/pkg/cel/library``
``urls.go``, ``ip.go``, ``cidr.go``), part of :mod:`kubeplane.cel.library`.

At run time a URL, an IP or a CIDR is a CEL map with one marker key holding
its canonical text, so ``==`` compares values, as the quantity and semver
values of the DRA library do.

* ``url(s)``, ``isURL(s)``; ``getScheme()``, ``getHost()``, ``getHostname()``,
  ``getPort()``, ``getEscapedPath()``, ``getQuery()`` (a map of lists);
* ``ip(s)``, ``isIP(s)``, ``ip.isCanonical(s)``; ``family()``,
  ``isUnspecified()``, ``isLoopback()``, ``isLinkLocalMulticast()``,
  ``isLinkLocalUnicast()``, ``isGlobalUnicast()``;
* ``cidr(s)``, ``isCIDR(s)``; ``containsIP(ip or string)``,
  ``containsCIDR(cidr or string)``, ``ip()``, ``masked()``, ``prefixLength()``.

As upstream, IPv4-mapped IPv6 addresses and zones are refused, and IPv4
addresses with leading zeros are not IPs.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Mapping
from urllib.parse import parse_qs, urlsplit

from cel_expr_python import cel as _cel

T = _cel.Type
_VAL = T.Map(T.STRING, T.STRING)
_URL, _IP, _CIDR = "__k8s_url__", "__k8s_ip__", "__k8s_cidr__"


def _ov(oid: str, ret: Any, params: list, impl: Any, member: bool = False) -> Any:
    return _cel.Overload(oid, ret, params, is_member=member, impl=impl)


# -------------------------------------------------------------------- URLs

def _parse_url(s: str):
    # upstream accepts what Go's url.ParseRequestURI accepts: an absolute URL or an absolute path
    if not s or any(c in s for c in " \t\r\n") or not (s.startswith("/") or "://" in s):
        raise ValueError(f"URL parse error during conversion from string: parse \"{s}\": invalid URI for request")
    parts = urlsplit(s)
    if "://" in s and not parts.scheme:
        raise ValueError(f"URL parse error during conversion from string: parse \"{s}\": missing protocol scheme")
    return parts


def _f_url(s: str) -> dict:
    _parse_url(s)
    return {_URL: s}


def _f_is_url(s: str) -> bool:
    try:
        _parse_url(s)
    except ValueError:
        return False
    return True


def _u(v: Mapping[str, Any]):
    text = v.get(_URL)
    if text is None:
        raise ValueError("no such overload: expected a URL")
    return _parse_url(text)


def _host(v: Mapping[str, Any]) -> str:
    return _u(v).netloc.rpartition("@")[2]


def _hostname(v: Mapping[str, Any]) -> str:
    host = _host(v)
    if host.startswith("["):
        return host[1:host.find("]")]
    return host.rpartition(":")[0] if ":" in host else host


def _port(v: Mapping[str, Any]) -> str:
    host = _host(v)
    if host.startswith("["):
        rest = host[host.find("]") + 1:]
        return rest[1:] if rest.startswith(":") else ""
    return host.rpartition(":")[2] if ":" in host else ""


def _query(v: Mapping[str, Any]) -> dict:
    return {k: list(vals) for k, vals in parse_qs(_u(v).query, keep_blank_values=True).items()}


# ---------------------------------------------------------------- IP, CIDR

def _parse_ip(s: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    if "%" in s:
        raise ValueError(f"IP address with zone value is not allowed: {s}")
    try:
        addr = ipaddress.ip_address(s)
    except ValueError:
        raise ValueError(f"IP Address \"{s}\" parse error during conversion from string: "
                         f"ParseAddr(\"{s}\"): unable to parse IP") from None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        raise ValueError(f"IPv4-mapped IPv6 address is not allowed: {s}")
    return addr


def _f_ip(s: str) -> dict:
    return {_IP: str(_parse_ip(s))}


def _f_is_ip(s: str) -> bool:
    try:
        _parse_ip(s)
    except ValueError:
        return False
    return True


def _f_ip_canonical(s: str) -> bool:
    return str(_parse_ip(s)) == s


def _ip(v: Mapping[str, Any]):
    text = v.get(_IP)
    if text is None:
        raise ValueError("no such overload: expected an IP")
    return ipaddress.ip_address(text)


def _parse_cidr(s: str):
    if "%" in s:
        raise ValueError(f"CIDR with zone value is not allowed: {s}")
    addr, sep, _ = s.partition("/")
    if not sep:
        raise ValueError(f"network address parse error during conversion from string: netip.ParsePrefix(\"{s}\"): "
                         "no '/'")
    _parse_ip(addr)
    try:
        return ipaddress.ip_interface(s)
    except ValueError:
        raise ValueError(f"network address parse error during conversion from string: netip.ParsePrefix(\"{s}\"): "
                         "bad bits") from None


def _f_cidr(s: str) -> dict:
    iface = _parse_cidr(s)
    return {_CIDR: f"{iface.ip}/{iface.network.prefixlen}"}


def _f_is_cidr(s: str) -> bool:
    try:
        _parse_cidr(s)
    except ValueError:
        return False
    return True


def _c(v: Mapping[str, Any]):
    text = v.get(_CIDR)
    if text is None:
        raise ValueError("no such overload: expected a CIDR")
    return ipaddress.ip_interface(text)


def _contains_ip(c: Mapping[str, Any], other: Any) -> bool:
    addr = _parse_ip(other) if isinstance(other, str) else _ip(other)
    net = _c(c).network
    return addr.version == net.version and addr in net


def _contains_cidr(c: Mapping[str, Any], other: Any) -> bool:
    sub = (_parse_cidr(other) if isinstance(other, str) else _c(other)).network
    net = _c(c).network
    return sub.version == net.version and sub.subnet_of(net)  # type: ignore[arg-type]


def decls() -> list[Any]:
    F = _cel.FunctionDecl
    S, B, I = T.STRING, T.BOOL, T.INT
    m = True
    return [
        F("url", [_ov("k8s_url_string", _VAL, [S], _f_url)]),
        F("isURL", [_ov("k8s_is_url_string", B, [S], _f_is_url)]),
        F("getScheme", [_ov("k8s_url_get_scheme", S, [_VAL], lambda v: _u(v).scheme, m)]),
        F("getHost", [_ov("k8s_url_get_host", S, [_VAL], _host, m)]),
        F("getHostname", [_ov("k8s_url_get_hostname", S, [_VAL], _hostname, m)]),
        F("getPort", [_ov("k8s_url_get_port", S, [_VAL], _port, m)]),
        F("getEscapedPath", [_ov("k8s_url_get_escaped_path", S, [_VAL], lambda v: _u(v).path, m)]),
        F("getQuery", [_ov("k8s_url_get_query", T.Map(S, T.List(S)), [_VAL], _query, m)]),
        F("ip", [_ov("k8s_ip_string", _VAL, [S], _f_ip),
                 _ov("k8s_cidr_ip", _VAL, [_VAL], lambda c: {_IP: str(_c(c).ip)}, m)]),
        F("isIP", [_ov("k8s_is_ip_string", B, [S], _f_is_ip)]),
        F("ip.isCanonical", [_ov("k8s_ip_is_canonical", B, [S], _f_ip_canonical)]),
        F("family", [_ov("k8s_ip_family", I, [_VAL], lambda v: _ip(v).version, m)]),
        F("isUnspecified", [_ov("k8s_ip_is_unspecified", B, [_VAL], lambda v: _ip(v).is_unspecified, m)]),
        F("isLoopback", [_ov("k8s_ip_is_loopback", B, [_VAL], lambda v: _ip(v).is_loopback, m)]),
        F("isLinkLocalMulticast", [_ov("k8s_ip_is_link_local_multicast", B, [_VAL], lambda v: _ip(v).is_multicast
                                       and _ip(v) in ipaddress.ip_network("224.0.0.0/24" if _ip(v).version == 4
                                                                          else "ff02::/16"), m)]),
        F("isLinkLocalUnicast", [_ov("k8s_ip_is_link_local_unicast", B, [_VAL], lambda v: _ip(v).is_link_local, m)]),
        F("isGlobalUnicast", [_ov("k8s_ip_is_global_unicast", B, [_VAL], _is_global_unicast, m)]),
        F("cidr", [_ov("k8s_cidr_string", _VAL, [S], _f_cidr)]),
        F("isCIDR", [_ov("k8s_is_cidr_string", B, [S], _f_is_cidr)]),
        F("containsIP", [_ov("k8s_cidr_contains_ip_string", B, [_VAL, S], _contains_ip, m),
                         _ov("k8s_cidr_contains_ip_ip", B, [_VAL, _VAL], _contains_ip, m)]),
        F("containsCIDR", [_ov("k8s_cidr_contains_cidr_string", B, [_VAL, S], _contains_cidr, m),
                           _ov("k8s_cidr_contains_cidr", B, [_VAL, _VAL], _contains_cidr, m)]),
        F("masked", [_ov("k8s_cidr_masked", _VAL, [_VAL], lambda c: {_CIDR: str(_c(c).network)}, m)]),
        F("prefixLength", [_ov("k8s_cidr_prefix_length", I, [_VAL], lambda c: _c(c).network.prefixlen, m)]),
    ]


def _is_global_unicast(v: Mapping[str, Any]) -> bool:
    # Go's IsGlobalUnicast: not unspecified, loopback, multicast, link-local or the IPv4 broadcast address
    a = _ip(v)
    if a.is_unspecified or a.is_loopback or a.is_multicast or a.is_link_local:
        return False
    return not (a.version == 4 and str(a) == "255.255.255.255")
