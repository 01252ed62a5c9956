"""IP and CIDR checks of the "legacy" fields (Endpoints, EndpointSlices,
Service IPs, NetworkPolicy ipBlocks), with upstream's messages
(apimachinery's ``IsValidIPForLegacyField``, core's ``ValidateEndpointIP``).
"""

from __future__ import annotations

import ipaddress
from typing import Any

from kubeplane.api.errors import Cause, invalid_value

IP_EXAMPLE = "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"
CIDR_EXAMPLE = "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"


def parse_ip(value: Any) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if not isinstance(value, str) or not value or "%" in value:
        return None
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        return None


def validate_ip(value: Any, path: str) -> list[Cause]:
    """An IP address (IPv4 dotted quad or IPv6)."""
    if parse_ip(value) is None:
        return [invalid_value(path, value if value is not None else "", IP_EXAMPLE)]
    return []


def validate_cidr(value: Any, path: str) -> list[Cause]:
    """A CIDR; host bits may be set, as upstream's legacy fields allow."""
    if not isinstance(value, str) or "/" not in value:
        return [invalid_value(path, value if value is not None else "", CIDR_EXAMPLE)]
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        return [invalid_value(path, value, CIDR_EXAMPLE)]
    return []


def validate_endpoint_ip(value: Any, path: str) -> list[Cause]:
    """An address a Service may send traffic to: not unspecified, loopback or link-local."""
    ip = parse_ip(value)
    if ip is None:
        return [invalid_value(path, value if value is not None else "", "must be a valid IP address")]
    out: list[Cause] = []
    if ip.is_unspecified:
        out.append(invalid_value(path, value, f"may not be unspecified ({value})"))
    if ip.is_loopback:
        out.append(invalid_value(path, value, "may not be in the loopback range (127.0.0.0/8, ::1/128)"))
    if ip.is_link_local and not ip.is_multicast:
        out.append(invalid_value(path, value, "may not be in the link-local range (169.254.0.0/16, fe80::/10)"))
    link_local_multicast = (ipaddress.ip_network("224.0.0.0/24") if ip.version == 4
                            else ipaddress.ip_network("ff02::/16"))
    if ip in link_local_multicast:
        out.append(invalid_value(path, value, "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)"))
    return out
