"""The host a node runs on, measured: what its Node status reports.

Capacity as upstream's kubelet reads it through cAdvisor (online CPUs,
MemTotal, the size of the filesystem holding the node's data directory,
huge pages), allocatable after ``--system-reserved`` and the default hard
eviction thresholds, the node's addresses, ``nodeInfo``, and the pressure
signals (memory.available, nodefs.available, nodefs.inodesFree,
pid.available) compared with the same thresholds.
"""

from __future__ import annotations

import ipaddress
import os
import platform
import socket
from dataclasses import dataclass
from fractions import Fraction

from kubeplane.api.quantity import format_quantity, parse_quantity

#: the kubelet's default --eviction-hard (linux): memory.available<100Mi,
#: nodefs.available<10%, nodefs.inodesFree<5%
EVICTION_MEMORY_BYTES = 100 * 1024 * 1024
EVICTION_NODEFS_FRACTION = Fraction(1, 10)
EVICTION_INODES_FRACTION = Fraction(5, 100)
#: resources --system-reserved may name
RESERVABLE = ("cpu", "memory", "ephemeral-storage", "pid")

_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le", "s390x": "s390x",
         "riscv64": "riscv64", "i686": "386", "i386": "386"}


class HostError(ValueError):
    """A setting that does not fit this host (a --node-ip it does not have...)."""


def go_arch() -> str:
    m = platform.machine()
    return _ARCH.get(m, m)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes."""
    out: dict[str, int] = {}
    for line in _read("/proc/meminfo").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


def hugepages() -> dict[str, int]:
    """``hugepages-<size>`` -> bytes of huge pages of that size the host holds."""
    out: dict[str, int] = {}
    base = "/sys/kernel/mm/hugepages"
    try:
        names = os.listdir(base)
    except OSError:
        return out
    for d in names:
        if not (d.startswith("hugepages-") and d.endswith("kB")):
            continue
        kb = int(d[len("hugepages-"):-2])
        count = _read(os.path.join(base, d, "nr_hugepages"))
        size = format_quantity(kb * 1024, "BinarySI")
        out[f"hugepages-{size}"] = kb * 1024 * (int(count) if count.isdigit() else 0)
    return out


def cpu_count() -> int:
    return os.cpu_count() or 1


def parse_reserved(text: str) -> dict[str, str]:
    """``cpu=500m,memory=1Gi`` (the kubelet's --system-reserved); ValueError when malformed."""
    out: dict[str, str] = {}
    if not text.strip():
        return out
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep or not key:
            raise ValueError(f"missing value for key {item.strip()!r}: the form is name=quantity[,name=quantity]")
        if key not in RESERVABLE:
            raise ValueError(f"unsupported resource {key!r}: one of {', '.join(RESERVABLE)}")
        try:
            q = parse_quantity(value)
        except (ValueError, TypeError):
            raise ValueError(f"quantities must match the regular expression "
                             f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {key}={value}") from None
        if q < 0:
            raise ValueError(f"resource quantity for {key!r} cannot be negative: {value}")
        out[key] = value
    return out


@dataclass
class Capacity:
    capacity: dict[str, str]
    allocatable: dict[str, str]


def measure_capacity(data_dir: str, max_pods: int, reserved: dict[str, str] | None = None) -> Capacity:
    """Capacity and allocatable as upstream computes them: allocatable is
    capacity minus the reservations and the hard eviction threshold (memory,
    ephemeral-storage), never below zero; huge pages come out of memory."""
    reserved = reserved or {}
    mem = meminfo().get("MemTotal", 0)
    st = os.statvfs(data_dir)
    disk = st.f_blocks * st.f_frsize
    huge = hugepages()
    cap_values: dict[str, Fraction] = {"cpu": Fraction(cpu_count()), "memory": Fraction(mem),
                                       "ephemeral-storage": Fraction(disk), "pods": Fraction(max_pods)}
    for k, v in huge.items():
        cap_values[k] = Fraction(v)
    minus: dict[str, Fraction] = {k: parse_quantity(v) for k, v in reserved.items() if k in cap_values}
    minus["memory"] = minus.get("memory", Fraction(0)) + EVICTION_MEMORY_BYTES + sum(huge.values())
    minus["ephemeral-storage"] = (minus.get("ephemeral-storage", Fraction(0))
                                  + int(disk * EVICTION_NODEFS_FRACTION))

    def fmt(k: str, v: Fraction, allocatable: bool) -> str:
        v = max(Fraction(0), v)
        if k == "cpu":
            return format_quantity(v, "DecimalSI")
        if k == "pods":
            return str(int(v))
        if k == "memory" or (k == "ephemeral-storage" and not allocatable):
            return f"{int(v) // 1024}Ki"  # as cAdvisor's figures come: KiB
        if k == "ephemeral-storage":
            return str(int(v))
        return format_quantity(Fraction(int(v)), "BinarySI")

    capacity = {k: fmt(k, v, False) for k, v in cap_values.items()}
    allocatable = {k: fmt(k, v - minus.get(k, Fraction(0)), True) for k, v in cap_values.items()}
    return Capacity(capacity, allocatable)


@dataclass
class Pressure:
    memory: bool
    disk: bool
    pid: bool


def measure_pressure(data_dir: str, reserved: dict[str, str] | None = None) -> Pressure:
    """The eviction signals against the default hard thresholds."""
    mem = meminfo()
    available = mem.get("MemAvailable", mem.get("MemFree", 0))
    st = os.statvfs(data_dir)
    disk_low = st.f_blocks > 0 and Fraction(st.f_bavail, st.f_blocks) < EVICTION_NODEFS_FRACTION
    inodes_low = st.f_files > 0 and Fraction(st.f_favail, st.f_files) < EVICTION_INODES_FRACTION
    pid_pressure = False
    if reserved and "pid" in reserved:
        pid_max = _read("/proc/sys/kernel/pid_max")
        if pid_max.isdigit():
            running = sum(1 for p in os.listdir("/proc") if p.isdigit())
            pid_pressure = int(pid_max) - running < int(parse_quantity(reserved["pid"]))
    return Pressure(memory=bool(mem) and available < EVICTION_MEMORY_BYTES, disk=disk_low or inodes_low,
                    pid=pid_pressure)


def os_image() -> str:
    for line in _read("/etc/os-release").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.partition("=")[2].strip().strip('"')
    return "Linux"


def node_info(runtime_name: str, runtime_version: str, kubelet_version: str) -> dict[str, str]:
    uname = os.uname()
    machine_id = _read("/etc/machine-id") or _read("/var/lib/dbus/machine-id")
    return {
        "machineID": machine_id,
        "systemUUID": _read("/sys/class/dmi/id/product_uuid").lower() or machine_id,
        "bootID": _read("/proc/sys/kernel/random/boot_id"),
        "kernelVersion": uname.release,
        "osImage": os_image(),
        "containerRuntimeVersion": f"{runtime_name}://{runtime_version}",
        "kubeletVersion": kubelet_version,
        "kubeProxyVersion": "",
        "operatingSystem": "linux",
        "architecture": go_arch(),
    }


def _local_addresses() -> set[str]:
    """Every IP address of this host's interfaces (from /proc)."""
    found = {"127.0.0.1", "::1"}
    for line in _read("/proc/net/if_inet6").splitlines():
        parts = line.split()
        if parts:
            found.add(str(ipaddress.ip_address(int(parts[0], 16))))
    try:
        import subprocess

        out = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, timeout=5).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) > 3 and parts[2] in ("inet", "inet6"):
                found.add(parts[3].split("/")[0])
    except (OSError, ValueError):
        pass
    return found


def default_route_ip() -> str | None:
    """The address this host would use to reach the outside (the default route's source)."""
    for family, probe in ((socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1")):
        s = socket.socket(family, socket.SOCK_DGRAM)
        try:
            s.connect((probe, 9))  # a UDP "connect" sends nothing, it only picks a route
            return s.getsockname()[0]
        except OSError:
            continue
        finally:
            s.close()
    return None


def validate_node_ip(ip: str) -> str:
    """A --node-ip: an address of this host, not unspecified, multicast or link-local.
    (Loopback is allowed: several nodes may share one host.)"""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        raise HostError(f"failed to parse node IP: {ip!r}") from None
    if addr.is_unspecified:
        raise HostError(f"nodeIP can't be an all zeros address: {ip}")
    if addr.is_multicast:
        raise HostError(f"nodeIP can't be a multicast address: {ip}")
    if addr.is_link_local:
        raise HostError(f"nodeIP can't be a link-local unicast address: {ip}")
    if not addr.is_loopback and str(addr) not in _local_addresses():
        raise HostError(f"node IP: {ip!r} not found in the host's network interfaces")
    return str(addr)


def node_addresses(hostname: str, node_ip: str | None) -> list[dict[str, str]]:
    ip = node_ip or default_route_ip() or "127.0.0.1"
    return [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": hostname}]
