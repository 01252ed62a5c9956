"""String checks of names, label keys and values, ports and keys, with upstream's messages
(apimachinery's util/validation). Each returns a list of messages, empty when the value is valid.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Callable


QUALIFIED_NAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
QUALIFIED_NAME_ERR = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character"
)
LABEL_VALUE_FMT = "(" + QUALIFIED_NAME_FMT + ")?"
LABEL_VALUE_ERR = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character"
)
DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_LABEL_ERR = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
    "start and end with an alphanumeric character"
)
DNS1123_SUBDOMAIN_FMT = DNS1123_LABEL_FMT + "(\\." + DNS1123_LABEL_FMT + ")*"
DNS1123_SUBDOMAIN_ERR = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character"
)
DNS1035_LABEL_FMT = "[a-z]([-a-z0-9]*[a-z0-9])?"
DNS1035_LABEL_ERR = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
    "alphabetic character, and end with an alphanumeric character"
)
CONFIG_MAP_KEY_FMT = "[-._a-zA-Z0-9]+"
CONFIG_MAP_KEY_ERR = "a valid config key must consist of alphanumeric characters, '-', '_' or '.'"
_QUALIFIED_NAME_RE = re.compile("^" + QUALIFIED_NAME_FMT + "$")
_LABEL_VALUE_RE = re.compile("^" + LABEL_VALUE_FMT + "$")
_DNS1123_LABEL_RE = re.compile("^" + DNS1123_LABEL_FMT + "$")
_DNS1123_SUBDOMAIN_RE = re.compile("^" + DNS1123_SUBDOMAIN_FMT + "$")
_DNS1035_LABEL_RE = re.compile("^" + DNS1035_LABEL_FMT + "$")
_CONFIG_MAP_KEY_RE = re.compile("^" + CONFIG_MAP_KEY_FMT + "$")
_PORT_NAME_CHARS_RE = re.compile("^[-a-z0-9]+$")
_PORT_NAME_LETTER_RE = re.compile("[a-z]")


def regex_error(msg: str, fmt: str, *examples: str) -> str:
    """Upstream's ``RegexError`` text, examples included."""
    if not examples:
        return f"{msg} (regex used for validation is '{fmt}')"
    shown = " or ".join(f"'{e}', " for e in examples)
    return f"{msg} (e.g. {shown}regex used for validation is '{fmt}')"


def max_len_error(n: int) -> str:
    return f"must be no more than {n} characters"


def is_dns1123_label(value: str) -> list[str]:
    out: list[str] = []
    if len(value) > 63:
        out.append(max_len_error(63))
    if not _DNS1123_LABEL_RE.match(value):
        out.append(regex_error(DNS1123_LABEL_ERR, DNS1123_LABEL_FMT, "my-name", "123-abc"))
    return out


def is_dns1123_subdomain(value: str) -> list[str]:
    out: list[str] = []
    if len(value) > 253:
        out.append(max_len_error(253))
    if not _DNS1123_SUBDOMAIN_RE.match(value):
        out.append(regex_error(DNS1123_SUBDOMAIN_ERR, DNS1123_SUBDOMAIN_FMT, "example.com"))
    return out


def is_dns1035_label(value: str) -> list[str]:
    out: list[str] = []
    if len(value) > 63:
        out.append(max_len_error(63))
    if not _DNS1035_LABEL_RE.match(value):
        out.append(regex_error(DNS1035_LABEL_ERR, DNS1035_LABEL_FMT, "my-name", "abc-123"))
    return out


def is_qualified_name(value: str) -> list[str]:
    """Label keys, annotation keys, finalizers: ``[prefix/]name``."""
    return list(_qualified_name_errors(value))


@lru_cache(maxsize=8192)
def _qualified_name_errors(value: str) -> tuple[str, ...]:
    out: list[str] = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            out.append("prefix part must be non-empty")
        else:
            out.extend("prefix part " + m for m in is_dns1123_subdomain(prefix))
    else:
        return (
            "a qualified name "
            + regex_error(QUALIFIED_NAME_ERR, QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
        )
    if not name:
        out.append("name part must be non-empty")
    elif len(name) > 63:
        out.append("name part " + max_len_error(63))
    if not _QUALIFIED_NAME_RE.match(name):
        out.append(
            "name part " + regex_error(QUALIFIED_NAME_ERR, QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
        )
    return tuple(out)


def is_valid_label_value(value: str) -> list[str]:
    if len(value) <= 63 and _LABEL_VALUE_RE.match(value):
        return []
    out: list[str] = []
    if len(value) > 63:
        out.append(max_len_error(63))
    if not _LABEL_VALUE_RE.match(value):
        out.append(regex_error(LABEL_VALUE_ERR, LABEL_VALUE_FMT, "MyValue", "my_value", "12345"))
    return out


def is_config_map_key(value: str) -> list[str]:
    out: list[str] = []
    if len(value) > 253:
        out.append(max_len_error(253))
    if not _CONFIG_MAP_KEY_RE.match(value):
        out.append(regex_error(CONFIG_MAP_KEY_ERR, CONFIG_MAP_KEY_FMT, "key.name", "KEY_NAME", "key-name"))
    if value == ".":
        out.append("must not be '.'")
    elif value == "..":
        out.append("must not be '..'")
    elif value.startswith(".."):
        out.append("must not start with '..'")
    return out


def is_valid_port_num(port: Any) -> list[str]:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        return ["must be between 1 and 65535, inclusive"]
    return []


def is_valid_port_name(name: str) -> list[str]:
    out: list[str] = []
    if len(name) > 15:
        out.append(max_len_error(15))
    if not _PORT_NAME_CHARS_RE.match(name):
        out.append("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    if not _PORT_NAME_LETTER_RE.search(name):
        out.append("must contain at least one letter (a-z)")
    if "--" in name:
        out.append("must not contain consecutive hyphens")
    if name.startswith("-") or name.endswith("-"):
        out.append("must not begin or end with a hyphen")
    return out


def _mask_trailing_dash(name: str) -> str:
    return name[:-1] + "a" if len(name) > 1 and name.endswith("-") else name


NameFn = Callable[[str, bool], list[str]]


def name_is_dns_subdomain(name: str, prefix: bool = False) -> list[str]:
    return is_dns1123_subdomain(_mask_trailing_dash(name) if prefix else name)


def name_is_dns_label(name: str, prefix: bool = False) -> list[str]:
    return is_dns1123_label(_mask_trailing_dash(name) if prefix else name)


def name_is_dns1035_label(name: str, prefix: bool = False) -> list[str]:
    return is_dns1035_label(_mask_trailing_dash(name) if prefix else name)
