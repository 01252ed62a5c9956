"""resolv.conf, read as upstream's kubelet reads it (``pkg/kubelet/network/dns``):
``nameserver`` lines accumulate, the last ``search`` line wins (trailing dots
dropped, ``.`` skipped), ``options`` accumulate with a later option replacing
an earlier one of the same name. Lines starting with ``#`` are comments; so
are lines starting with ``;`` (as the resolver reads them)."""

from __future__ import annotations

from dataclasses import dataclass, field

#: upstream's maxResolvConfLength: longer files are refused
MAX_RESOLV_CONF_LENGTH = 10 * 1 << 20


@dataclass
class ResolvConf:
    nameservers: list[str] = field(default_factory=list)
    searches: list[str] = field(default_factory=list)
    options: list[str] = field(default_factory=list)


def append_options(options: list[str], new: list[str]) -> list[str]:
    """``options`` with ``new`` added, one entry per option name, the later one winning."""
    by_name: dict[str, str] = {}
    for opt in [*options, *new]:
        by_name[opt.split(":", 1)[0]] = opt
    return list(by_name.values())


def parse_resolv_conf_text(text: str) -> ResolvConf:
    conf = ResolvConf()
    for line in text.split("\n"):
        trimmed = line.strip()
        if trimmed.startswith(("#", ";")):
            continue
        fields = trimmed.split()
        if not fields:
            continue
        if fields[0] == "nameserver" and len(fields) >= 2:
            conf.nameservers.append(fields[1])
        elif fields[0] == "search":
            conf.searches = [s.removesuffix(".") for s in fields[1:] if s != "."]
        elif fields[0] == "options":
            conf.options = append_options(conf.options, fields[1:])
    return conf


def read_resolv_conf(path: str) -> ResolvConf:
    """The file's settings; an unreadable or missing file has none."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(MAX_RESOLV_CONF_LENGTH + 1)
    except OSError:
        return ResolvConf()
    if len(text) > MAX_RESOLV_CONF_LENGTH:
        return ResolvConf()
    return parse_resolv_conf_text(text)
