"""Pods through the CRI: what upstream's kuberuntime manager and kubelet_pods.go do.

:class:`KubeRuntime` runs one reconcile step of a pod at a time
(:meth:`KubeRuntime.sync_pod`, upstream's computePodActions + SyncPod): a
sandbox with the pod's hostname, DNS config, ports, labels and annotations;
image pulls under the pod's imagePullPolicy and pull secrets, with upstream's
ErrImagePull / ImagePullBackOff; init containers one after another, sidecars
(``restartPolicy: Always`` init containers) kept running; containers with
their command, args, environment, mounts, security context and resources;
restarts under the restart policy with the CrashLoopBackOff back-off; the
postStart hook. It returns the pod's status (see :mod:`kubeplane.node.podstatus`).

All state that must survive the agent lives in the runtime: the labels and
annotations upstream puts on sandboxes and containers (restart count, spec
hash, termination message path, grace periods) let a restarted agent adopt the
containers it already runs (:meth:`KubeRuntime.running_pods`). Only the
back-off timers live in memory, as in the kubelet.
"""

from __future__ import annotations

import asyncio
import contextlib
import base64
import json
import logging
import math
import os
import re
import shutil
import time
import uuid
import zlib
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable

from kubeplane.api.backoff import Backoff
from kubeplane.api.errors import StatusError
from kubeplane.api.gofmt import format_pod, go_duration, grpc_code_name
from kubeplane.api.qos import pod_qos_class
from kubeplane.api.quantity import parse_quantity
from kubeplane.api.resources import resource
from kubeplane.node import podstatus as ps
from kubeplane.node import prober as prober_mod
from kubeplane.node.cri import CONTAINER_NAME_LABEL, POD_NAME_LABEL, POD_NAMESPACE_LABEL, POD_UID_LABEL
from kubeplane.node.cgroups import QUOTA_PERIOD, CgroupError, milli_cpu_to_quota, milli_cpu_to_shares
from kubeplane.node.cri.client import RUNTIME_REQUEST_TIMEOUT, CRIClient, CRIError, pb
from kubeplane.node.logs import rotated_logs
from kubeplane.node.podstatus import ContainerInfo, RuntimePod, SandboxInfo
from kubeplane.node.volumes import VolumeError, expand, find_container, pod_field_value, resource_field_value

log = logging.getLogger(__name__)

Obj = dict[str, Any]

# -- annotations, as upstream's kuberuntime sets them (the labels: kubeplane.node.cri) --
HASH_ANNOTATION = "io.kubernetes.container.hash"
RESTART_COUNT_ANNOTATION = "io.kubernetes.container.restartCount"
TERMINATION_MESSAGE_PATH_ANNOTATION = "io.kubernetes.container.terminationMessagePath"
TERMINATION_MESSAGE_POLICY_ANNOTATION = "io.kubernetes.container.terminationMessagePolicy"
DELETION_GRACE_ANNOTATION = "io.kubernetes.pod.deletionGracePeriod"
TERMINATION_GRACE_ANNOTATION = "io.kubernetes.pod.terminationGracePeriod"
PRESTOP_ANNOTATION = "io.kubernetes.container.preStopHandler"
PORTS_ANNOTATION = "io.kubernetes.container.ports"

#: flowcontrol back-off of container restarts and image pulls
BACKOFF_INITIAL = 10.0
BACKOFF_MAX = 300.0
#: upstream's minimumGracePeriodInSeconds for killing a container
MIN_GRACE_SECONDS = 2
#: termination messages: the file is read up to 4 KiB; from the logs, 80 lines and 2 KiB
MAX_TERMINATION_MESSAGE = 4096
MAX_LOG_MESSAGE_LINES = 80
MAX_LOG_MESSAGE_BYTES = 2048

DEFAULT_MASKED_PATHS = [
    "/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
    "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
    "/sys/firmware", "/sys/devices/virtual/powercap",
]
DEFAULT_READONLY_PATHS = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]

#: how long a container's start waits for the first list of Services (its environment needs them)
SERVICE_SYNC_SECONDS = 30.0

CONFIGMAPS = resource("configmaps")
SECRETS = resource("secrets")
SERVICES = resource("services")



class ConfigError(Exception):
    """A container's configuration cannot be built (CreateContainerConfigError)."""


def go_grpc_error(e: CRIError) -> str:
    """A CRI error as Go's gRPC status error prints it (what upstream's messages quote)."""
    return f"rpc error: code = {grpc_code_name(e.code.name)} desc = {e.details}"


def container_hash(container: Obj) -> str:
    """A stable hash of the container spec; a change restarts the container (as upstream's
    HashContainer, which leaves resources out so in-place resizes do not restart)."""
    c = {k: v for k, v in container.items() if k != "resources"}
    return format(zlib.crc32(json.dumps(c, sort_keys=True, separators=(",", ":")).encode()), "x")


# -- images ----------------------------------------------------------------------

def image_pull_policy(container: Obj) -> str:
    policy = container.get("imagePullPolicy")
    if policy:
        return policy
    image = container.get("image") or ""
    tail = image.rsplit("/", 1)[-1]
    if "@" in image:
        return "IfNotPresent"
    if ":" not in tail or tail.endswith(":latest"):
        return "Always"
    return "IfNotPresent"


def image_registry(image: str) -> str:
    """The registry host of an image reference (docker.io when it names none)."""
    first = image.split("/", 1)[0]
    if "/" in image and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def _strip_scheme(key: str) -> str:
    for p in ("https://", "http://"):
        if key.startswith(p):
            key = key[len(p):]
    return key.rstrip("/")


def _registry_key_matches(key: str, image: str) -> bool:
    """upstream credentialprovider's URLsMatch, in short: host (with * globs per label) and path prefix."""
    key = _strip_scheme(key)
    if key in ("index.docker.io/v1", "index.docker.io", "registry-1.docker.io", "docker.io"):
        key = "docker.io"
    host, _, path = key.partition("/")
    reg = image_registry(image)
    repo = image if reg != "docker.io" or image.startswith("docker.io/") else "docker.io/" + image
    repo = repo.split("@", 1)[0]
    img_host, _, img_path = repo.partition("/")
    hl, il = host.split("."), img_host.split(".")
    if len(hl) != len(il):
        return False
    for a, b in zip(hl, il):
        if a != b and not re.fullmatch(re.escape(a).replace(r"\*", "[^.]*"), b):
            return False
    return not path or img_path == path or img_path.startswith(path.rstrip("/") + "/")


def pull_credentials(secrets: list[Obj], image: str) -> list[pb.AuthConfig]:
    """AuthConfigs for ``image`` from dockerconfigjson / dockercfg Secrets, best match first."""
    found: list[tuple[int, pb.AuthConfig]] = []
    for s in secrets:
        data = s.get("data") or {}
        try:
            if ".dockerconfigjson" in data:
                auths = json.loads(base64.b64decode(data[".dockerconfigjson"])).get("auths") or {}
            elif ".dockercfg" in data:
                auths = json.loads(base64.b64decode(data[".dockercfg"]))
            else:
                continue
        except (ValueError, TypeError):
            continue
        if not isinstance(auths, dict):
            continue
        for key, entry in auths.items():
            if not isinstance(entry, dict) or not _registry_key_matches(key, image):
                continue
            user, password = entry.get("username") or "", entry.get("password") or ""
            if entry.get("auth") and not user:
                try:
                    user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
                except (ValueError, UnicodeDecodeError):
                    continue
            found.append((len(_strip_scheme(key)), pb.AuthConfig(
                username=user, password=password, server_address=_strip_scheme(key).split("/")[0],
                identity_token=entry.get("identitytoken") or "", registry_token=entry.get("registrytoken") or "")))
    found.sort(key=lambda x: -x[0])
    return [a for _, a in found]


# -- resources ---------------------------------------------------------------------

def _q(resources: Obj | None, kind: str, name: str) -> Fraction | None:
    v = ((resources or {}).get(kind) or {}).get(name)
    if v is None:
        return None
    try:
        return parse_quantity(v)
    except (TypeError, ValueError):
        return None


def oom_score_adj(pod: Obj, container: Obj, memory_capacity: int) -> int:
    """upstream's GetContainerOOMScoreAdjust by QoS class."""
    qos = (pod.get("status") or {}).get("qosClass") or pod_qos_class(pod.get("spec") or {})
    if qos == "Guaranteed":
        return -997
    if qos == "BestEffort":
        return 1000
    req = _q(container.get("resources"), "requests", "memory") or 0
    adj = 1000 - int(1000 * req / memory_capacity) if memory_capacity else 1000
    if adj < 2:
        return 2
    if adj >= 1000:
        return 999
    return adj


def linux_resources(pod: Obj, container: Obj, memory_capacity: int) -> pb.LinuxContainerResources:
    res = container.get("resources") or {}
    cpu_req = _q(res, "requests", "cpu")
    cpu_lim = _q(res, "limits", "cpu")
    mem_lim = _q(res, "limits", "memory")
    if cpu_req is None and cpu_lim is not None:
        cpu_req = cpu_lim
    out = pb.LinuxContainerResources(
        cpu_shares=milli_cpu_to_shares(math.ceil((cpu_req or 0) * 1000)),
        oom_score_adj=oom_score_adj(pod, container, memory_capacity))
    if cpu_lim is not None:
        out.cpu_period = QUOTA_PERIOD
        out.cpu_quota = milli_cpu_to_quota(math.ceil(cpu_lim * 1000))
    if mem_lim is not None:
        out.memory_limit_in_bytes = math.ceil(mem_lim)
    return out


def host_memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# -- security context --------------------------------------------------------------

def _effective_security_context(pod: Obj, container: Obj) -> Obj:
    psc = (pod.get("spec") or {}).get("securityContext") or {}
    csc = container.get("securityContext") or {}
    out: Obj = {}
    for k in ("runAsUser", "runAsGroup", "runAsNonRoot", "seLinuxOptions", "seccompProfile", "appArmorProfile"):
        if k in psc:
            out[k] = psc[k]
    out.update(csc)
    return out


def _cap(name: str) -> str:
    return name if name == "ALL" or name.startswith("CAP_") else "CAP_" + name


def _seccomp(profile: Obj | None) -> pb.SecurityProfile | None:
    if not profile:
        return None
    t = profile.get("type")
    if t == "RuntimeDefault":
        return pb.SecurityProfile(profile_type=pb.SecurityProfile.RuntimeDefault)
    if t == "Localhost":
        return pb.SecurityProfile(profile_type=pb.SecurityProfile.Localhost,
                                  localhost_ref=profile.get("localhostProfile") or "")
    return pb.SecurityProfile(profile_type=pb.SecurityProfile.Unconfined)


def container_security_context(pod: Obj, container: Obj) -> pb.LinuxContainerSecurityContext:
    spec = pod.get("spec") or {}
    sc = _effective_security_context(pod, container)
    psc = spec.get("securityContext") or {}
    out = pb.LinuxContainerSecurityContext()
    caps = sc.get("capabilities") or {}
    if caps:
        out.capabilities.CopyFrom(pb.Capability(
            add_capabilities=[_cap(c) for c in caps.get("add") or []],
            drop_capabilities=[_cap(c) for c in caps.get("drop") or []]))
    out.privileged = bool(sc.get("privileged"))
    if sc.get("runAsUser") is not None:
        out.run_as_user.value = int(sc["runAsUser"])
    if sc.get("runAsGroup") is not None:
        out.run_as_group.value = int(sc["runAsGroup"])
    out.readonly_rootfs = bool(sc.get("readOnlyRootFilesystem"))
    groups = [int(g) for g in psc.get("supplementalGroups") or []]
    if psc.get("fsGroup") is not None:
        groups.insert(0, int(psc["fsGroup"]))
    out.supplemental_groups.extend(groups)
    if sc.get("allowPrivilegeEscalation") is False:
        out.no_new_privs = True
    if not out.privileged:
        if sc.get("procMount") == "Unmasked":
            out.masked_paths.extend([])
            out.readonly_paths.extend([])
        else:
            out.masked_paths.extend(DEFAULT_MASKED_PATHS)
            out.readonly_paths.extend(DEFAULT_READONLY_PATHS)
    prof = _seccomp(sc.get("seccompProfile"))
    if prof is not None:
        out.seccomp.CopyFrom(prof)
    ns = namespace_options(spec)
    out.namespace_options.CopyFrom(ns)
    return out


def namespace_options(spec: Obj) -> pb.NamespaceOption:
    return pb.NamespaceOption(
        network=pb.NODE if spec.get("hostNetwork") else pb.POD,
        pid=pb.NODE if spec.get("hostPID") else (pb.POD if spec.get("shareProcessNamespace") else pb.CONTAINER),
        ipc=pb.NODE if spec.get("hostIPC") else pb.POD)


def verify_run_as_non_root(pod: Obj, container: Obj, image: pb.Image | None) -> None:
    sc = _effective_security_context(pod, container)
    if not sc.get("runAsNonRoot"):
        return
    who = f"(pod: {format_pod(pod)!r}, container: {container['name']})"
    if sc.get("runAsUser") is not None:
        if int(sc["runAsUser"]) == 0:
            raise ConfigError(f"container's runAsUser breaks non-root policy {who}")
        return
    uid: int | None = None
    if image is not None:
        if image.HasField("uid"):
            uid = image.uid.value
        elif image.username:
            if not image.username.isdigit():
                raise ConfigError(f"container has runAsNonRoot and image has non-numeric user "
                                  f"({image.username}), cannot verify user is non-root {who}")
            uid = int(image.username)
    if uid is None or uid == 0:
        raise ConfigError(f"container has runAsNonRoot and image will run as root {who}")


# -- environment -------------------------------------------------------------------

def service_env(services: list[Obj], namespace: str, enable_links: bool) -> dict[str, str]:
    """Docker-links style variables of the namespace's Services and the master service."""
    env: dict[str, str] = {}
    chosen: dict[str, Obj] = {}
    for s in services:
        md = s.get("metadata") or {}
        spec = s.get("spec") or {}
        ip = spec.get("clusterIP")
        if not ip or ip == "None":
            continue
        if md.get("namespace") == "default" and md.get("name") == "kubernetes":
            chosen.setdefault("kubernetes", s)
        elif enable_links and md.get("namespace") == namespace:
            chosen[md.get("name", "")] = s
    for name in sorted(chosen):
        s = chosen[name]
        spec = s["spec"]
        prefix = name.upper().replace("-", "_")
        ip = spec["clusterIP"]
        ports = spec.get("ports") or []
        env[f"{prefix}_SERVICE_HOST"] = ip
        if ports:
            env[f"{prefix}_SERVICE_PORT"] = str(ports[0].get("port"))
        for p in ports:
            if p.get("name"):
                env[f"{prefix}_SERVICE_PORT_{p['name'].upper().replace('-', '_')}"] = str(p.get("port"))
        if ports:
            p0 = ports[0]
            env[f"{prefix}_PORT"] = f"{(p0.get('protocol') or 'TCP').lower()}://{ip}:{p0.get('port')}"
        for p in ports:
            proto = (p.get("protocol") or "TCP")
            base = f"{prefix}_PORT_{p.get('port')}_{proto.upper()}"
            env[base] = f"{proto.lower()}://{ip}:{p.get('port')}"
            env[base + "_PROTO"] = proto.lower()
            env[base + "_PORT"] = str(p.get("port"))
            env[base + "_ADDR"] = ip
    return env


# -- termination messages and logs ---------------------------------------------------

def _parse_cri_log_line(line: bytes) -> bytes:
    parts = line.split(b" ", 3)
    if len(parts) < 4:
        return line
    return parts[3] + (b"" if parts[2] == b"P" else b"\n")


def tail_log_message(path: str, lines: int = MAX_LOG_MESSAGE_LINES,
                     max_bytes: int = MAX_LOG_MESSAGE_BYTES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read()
    except OSError:
        return ""
    raw = data.split(b"\n")
    if raw and raw[-1] == b"":
        raw.pop()
    text = b"".join(_parse_cri_log_line(ln) for ln in raw[-lines:])
    return text[-max_bytes:].decode("utf-8", "replace")


def hosts_file(pod: Obj, pod_ips: list[str], hostname: str, domain: str) -> str:
    lines = ["# Kubernetes-managed hosts file.", "127.0.0.1\tlocalhost",
             "::1\tlocalhost ip6-localhost ip6-loopback", "fe00::0\tip6-localnet",
             "fe00::0\tip6-mcastprefix", "fe00::1\tip6-allnodes", "fe00::2\tip6-allrouters"]
    for ip in pod_ips:
        lines.append(f"{ip}\t{hostname}.{domain}\t{hostname}" if domain else f"{ip}\t{hostname}")
    aliases = (pod.get("spec") or {}).get("hostAliases") or []
    if aliases:
        lines.append("")
        lines.append("# Entries added by HostAliases.")
        for a in aliases:
            lines.append(f"{a.get('ip')}\t" + "\t".join(a.get("hostnames") or []))
    return "\n".join(lines) + "\n"


def pod_hostname(pod: Obj, cluster_domain: str) -> tuple[str, str]:
    md = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    name = spec.get("hostname") or md.get("name", "")
    if len(name) > 63:
        name = name[:63].rstrip("-.")
    domain = ""
    if spec.get("subdomain"):
        domain = f"{spec['subdomain']}.{md.get('namespace', '')}.svc.{cluster_domain}"
    return name, domain


#: upstream's pod DNS limits (pkg/apis/core/validation: MaxDNSNameservers,
#: MaxDNSSearchPaths, MaxDNSSearchListChars) and a DNS-1123 subdomain's length
MAX_DNS_NAMESERVERS = 3
MAX_DNS_SEARCH_PATHS = 32
MAX_DNS_SEARCH_LIST_CHARS = 2048
MAX_SEARCH_PATH_LENGTH = 253


def _dedupe(xs: list[str]) -> list[str]:
    seen, out = set(), []
    for x in xs:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


def _merge_dns_options(existing: list[str], extra: list[Obj]) -> list[str]:
    """upstream's mergeDNSOptions: the pod's dnsConfig options replace those of the same name."""
    by_name: dict[str, str] = {}
    for o in existing:
        name, _, value = o.partition(":")
        by_name[name] = value
    for o in extra:
        if isinstance(o, dict) and o.get("name"):
            by_name[o["name"]] = o.get("value") or ""
    return [f"{k}:{v}" if v else k for k, v in by_name.items()]


def _fit_searches(searches: list[str]) -> tuple[list[str], bool]:
    """upstream's formDNSSearchFitsLimits: at most 32 paths, none longer than
    253 characters, the line at most 2048 characters (paths dropped from the end)."""
    exceeded = len(searches) > MAX_DNS_SEARCH_PATHS
    searches = searches[:MAX_DNS_SEARCH_PATHS]
    kept = [s for s in searches if len(s) <= MAX_SEARCH_PATH_LENGTH]
    exceeded = exceeded or len(kept) != len(searches)
    while kept and len(" ".join(kept)) > MAX_DNS_SEARCH_LIST_CHARS:
        kept.pop()
        exceeded = True
    return kept, exceeded


def dns_config(pod: Obj, cluster_dns: list[str], cluster_domain: str, resolv_conf: str,
               warn: Callable[[str, str], None] | None = None, node_ips: list[str] | None = None) -> pb.DNSConfig:
    """upstream's dns Configurer.GetPodDNS: the pod's resolv.conf by its
    dnsPolicy (ClusterFirst, ClusterFirstWithHostNet, Default, None) and
    dnsConfig, within the limits. ``warn(reason, message)`` receives the pod
    events upstream records (MissingClusterDNS, DNSConfigForming)."""
    from kubeplane.dns.resolvconf import read_resolv_conf

    spec = pod.get("spec") or {}
    ns = (pod.get("metadata") or {}).get("namespace", "")
    policy = spec.get("dnsPolicy") or "ClusterFirst"
    host = read_resolv_conf(resolv_conf) if resolv_conf else None
    servers = list(host.nameservers) if host else []
    searches = list(host.searches) if host else []
    options = list(host.options) if host else []
    if policy == "ClusterFirst" and spec.get("hostNetwork"):
        policy = "Default"  # a host-network pod resolves as its node
    if policy in ("ClusterFirst", "ClusterFirstWithHostNet") and not cluster_dns:
        if warn is not None:
            warn("MissingClusterDNS", f'pod: "{format_pod(pod)}". kubelet does not have ClusterDNS IP configured '
                                      'and cannot create Pod using "ClusterFirst" policy. Falling back to '
                                      '"Default" policy.')
        policy = "Default"
    if policy == "None":
        servers, searches, options = [], [], []
    elif policy == "Default":
        if not resolv_conf:
            # --resolv-conf "": the node's own resolver, and no search path
            servers = ["::1" if ":" in ip else "127.0.0.1" for ip in node_ips or []] or ["127.0.0.1"]
            searches = ["."]
    else:
        servers = list(cluster_dns)
        if cluster_domain:
            searches = _dedupe([f"{ns}.svc.{cluster_domain}", f"svc.{cluster_domain}", cluster_domain] + searches)
        options = ["ndots:5"]
    cfg = spec.get("dnsConfig") or {}
    if cfg:
        servers = _dedupe(servers + list(cfg.get("nameservers") or []))
        searches = _dedupe(searches + list(cfg.get("searches") or []))
        options = _merge_dns_options(options, list(cfg.get("options") or []))
    if len(servers) > MAX_DNS_NAMESERVERS:
        servers = servers[:MAX_DNS_NAMESERVERS]
        if warn is not None:
            warn("DNSConfigForming", "Nameserver limits were exceeded, some nameservers have been omitted, the "
                                     f"applied nameserver line is: {' '.join(servers)}")
    searches, exceeded = _fit_searches(searches)
    if exceeded and warn is not None:
        warn("DNSConfigForming", "Search Line limits were exceeded, some search paths have been omitted, the "
                                 f"applied search line is: {' '.join(searches)}")
    return pb.DNSConfig(servers=servers, searches=searches, options=options)


# -- CRI → runtime view ---------------------------------------------------------------

_STATES = {pb.CONTAINER_RUNNING: ps.RUNNING, pb.CONTAINER_CREATED: ps.CREATED,
           pb.CONTAINER_EXITED: ps.EXITED, pb.CONTAINER_UNKNOWN: ps.UNKNOWN}


def container_info(st: pb.ContainerStatus, runtime_name: str = "containerd") -> ContainerInfo:
    ann = dict(st.annotations)
    labels = dict(st.labels)
    image = st.image.user_specified_image or st.image.image
    try:
        restarts = int(ann.get(RESTART_COUNT_ANNOTATION, "0"))
    except ValueError:
        restarts = 0
    return ContainerInfo(
        id=f"{runtime_name}://{st.id}", name=labels.get(CONTAINER_NAME_LABEL) or st.metadata.name,
        state=_STATES.get(st.state, ps.UNKNOWN), created_at=st.created_at, started_at=st.started_at,
        finished_at=st.finished_at, exit_code=st.exit_code, reason=st.reason, message=st.message,
        image=image, image_ref=st.image_ref, restart_count=restarts, hash=ann.get(HASH_ANNOTATION, ""),
        attempt=st.metadata.attempt, labels=labels, annotations=ann, log_path=st.log_path)


def termination_message(st: pb.ContainerStatus, info: ContainerInfo) -> str:
    """upstream's getTerminationMessage: the file mounted at terminationMessagePath, else
    (FallbackToLogsOnError and a failure) the log's tail."""
    path = info.annotations.get(TERMINATION_MESSAGE_PATH_ANNOTATION, "")
    policy = info.annotations.get(TERMINATION_MESSAGE_POLICY_ANNOTATION, "")
    if path:
        for m in st.mounts:
            if m.container_path == path:
                try:
                    with open(m.host_path, "rb") as f:
                        data = f.read(MAX_TERMINATION_MESSAGE)
                except OSError:
                    data = b""
                if data:
                    return data.decode("utf-8", "replace")
                break
    if policy == "FallbackToLogsOnError" and info.exit_code != 0 and st.log_path:
        return tail_log_message(st.log_path)
    return ""


def annotated_grace(ci: ContainerInfo) -> int:
    """The grace period of a container known only from the runtime (upstream's
    restoreSpecsFromContainerLabels): the pod's deletion grace, else its termination grace."""
    for key in (DELETION_GRACE_ANNOTATION, TERMINATION_GRACE_ANNOTATION):
        try:
            return int(ci.annotations[key])
        except (KeyError, ValueError):
            continue
    return 30


def run_once(c: Obj, spec: Obj) -> bool:
    """A container that is not run again once it succeeded (OnFailure)."""
    if c.get("restartPolicy"):
        return c["restartPolicy"] == "OnFailure"
    return spec.get("restartPolicy") == "OnFailure"


def succeeded(rt: RuntimePod, name: str) -> bool:
    latest = rt.latest(name)
    return latest is not None and latest.state == ps.EXITED and latest.exit_code == 0


# -- per pod bookkeeping ---------------------------------------------------------------

@dataclass
class _PodState:
    waiting: dict[str, tuple[str, str]] = field(default_factory=dict)
    sandbox_config: pb.PodSandboxConfig | None = None
    sandbox_id: str = ""
    backoff_keys: set[str] = field(default_factory=set)
    pull_errors: dict[str, str] = field(default_factory=dict)


class KubeRuntime:
    """Runs pods through one CRI runtime.

    ``volumes`` (a VolumeManager: ``setup(pod)``, ``mounts(pod, container)``,
    ``teardown(uid)``) and ``prober`` (``ready/started/liveness_failed(container_id)``,
    optionally ``run_handler``) are optional so the runtime works alone;
    ``recorder`` is an EventRecorder (``event(obj, type, reason, message)``);
    ``cgroups`` (a :class:`~kubeplane.node.cgroups.PodCgroups`) gives each pod
    its cgroup, the sandbox's cgroup parent (None: the runtime's default place).
    """

    def __init__(self, cri: CRIClient, *, client: Any = None, node_name: str = "",
                 pods_dir: str, logs_dir: str, volumes: Any = None, prober: Any = None,
                 recorder: Any = None, host_ips: list[str] | None = None,
                 cluster_dns: list[str] | None = None, cluster_domain: str = "cluster.local",
                 resolv_conf: str = "/etc/resolv.conf", allocatable: dict[str, Any] | None = None,
                 runtime_handler: str = "", cgroups: Any = None, clock: Callable[[], float] = time.time):
        self.cri = cri
        self.client = client
        self.node_name = node_name
        self.pods_dir = os.path.abspath(pods_dir)
        self.logs_dir = os.path.abspath(logs_dir)
        self.volumes = volumes
        self.prober = prober
        self.recorder = recorder
        self.host_ips = list(host_ips or [])
        self.cluster_dns = list(cluster_dns or [])
        self.cluster_domain = cluster_domain
        self.resolv_conf = resolv_conf
        self.allocatable = dict(allocatable or {})
        self.runtime_handler = runtime_handler
        self.cgroups = cgroups
        self.clock = clock
        self.backoff = Backoff(BACKOFF_INITIAL, BACKOFF_MAX, clock=clock)
        self.image_backoff = Backoff(BACKOFF_INITIAL, BACKOFF_MAX, clock=clock)
        self.memory_capacity = host_memory_bytes()
        self.runtime_name = ""
        self._pods: dict[str, _PodState] = {}
        self._locks: dict[str, list] = {}   # uid -> [lock, holders and waiters]
        self._services_informer: Any = None

    # -- helpers ----------------------------------------------------------------------

    def _event(self, pod: Obj, type_: str, reason: str, message: str, container: str | None = None) -> None:
        """An event about ``pod``, or about its container named ``container``
        (the reference's fieldPath names it, as upstream's container references)."""
        if self.recorder is not None:
            try:
                if container is None:
                    self.recorder.event(pod, type_, reason, message)
                else:
                    self.recorder.event(pod, type_, reason, message,
                                        field_path=ps.container_field_path(pod, container))
            except Exception:  # events are best effort
                log.debug("event %s failed", reason, exc_info=True)

    def _state(self, uid: str) -> _PodState:
        st = self._pods.get(uid)
        if st is None:
            st = self._pods[uid] = _PodState()
        return st

    @contextlib.asynccontextmanager
    async def _lock(self, uid: str):
        """The pod's lock: one sync, termination or removal of a pod at a time. It is
        forgotten once nobody holds or waits for it."""
        entry = self._locks.get(uid)
        if entry is None:
            entry = self._locks[uid] = [asyncio.Lock(), 0]
        entry[1] += 1
        try:
            async with entry[0]:
                yield
        finally:
            entry[1] -= 1
            if entry[1] == 0 and self._locks.get(uid) is entry:
                del self._locks[uid]

    async def _runtime_name(self) -> str:
        if not self.runtime_name:
            try:
                self.runtime_name = (await self.cri.version()).runtime_name or "containerd"
            except CRIError:
                return "containerd"
        return self.runtime_name

    def pod_log_dir(self, pod: Obj) -> str:
        md = pod.get("metadata") or {}
        return os.path.join(self.logs_dir, f"{md.get('namespace', '')}_{md.get('name', '')}_{md.get('uid', '')}")

    def pod_dir(self, uid: str) -> str:
        return os.path.join(self.pods_dir, uid)

    # -- the runtime's view ---------------------------------------------------------------

    async def pod_runtime_status(self, uid: str) -> RuntimePod:
        """Every sandbox and container of pod ``uid``, newest first (upstream's GetPodStatus)."""
        name = await self._runtime_name()
        sel = {POD_UID_LABEL: uid}
        sbs = (await self.cri.runtime("ListPodSandbox", pb.ListPodSandboxRequest(
            filter=pb.PodSandboxFilter(label_selector=sel)))).items
        ctrs = (await self.cri.runtime("ListContainers", pb.ListContainersRequest(
            filter=pb.ContainerFilter(label_selector=sel)))).containers
        rt = RuntimePod(uid=uid)
        for sb in sbs:
            rt.name = sb.labels.get(POD_NAME_LABEL, rt.name)
            rt.namespace = sb.labels.get(POD_NAMESPACE_LABEL, rt.namespace)
            info = SandboxInfo(id=sb.id, ready=sb.state == pb.SANDBOX_READY, created_at=sb.created_at,
                               attempt=sb.metadata.attempt)
            if info.ready:
                try:
                    s = (await self.cri.runtime("PodSandboxStatus",
                                                pb.PodSandboxStatusRequest(pod_sandbox_id=sb.id))).status
                except CRIError as e:
                    if not e.not_found:
                        raise
                    continue
                info.ready = s.state == pb.SANDBOX_READY
                info.ip = s.network.ip
                info.ips = [a.ip for a in s.network.additional_ips]
                info.host_network = s.linux.namespaces.options.network == pb.NODE
            rt.sandboxes.append(info)
        for c in ctrs:
            try:
                st = (await self.cri.runtime("ContainerStatus",
                                             pb.ContainerStatusRequest(container_id=c.id))).status
            except CRIError as e:
                if e.not_found:
                    continue
                raise
            info = container_info(st, name)
            info.sandbox_id = c.pod_sandbox_id
            if info.state == ps.EXITED and not info.message:
                info.message = termination_message(st, info)
            rt.containers.append(info)
        ps.sort_newest_first(rt)
        return rt

    async def running_pods(self) -> list[RuntimePod]:
        """The pods this runtime holds, from the sandboxes' and containers' labels (adoption
        after an agent restart, and the list of orphans to clean up)."""
        name = await self._runtime_name()
        sbs = (await self.cri.runtime("ListPodSandbox", pb.ListPodSandboxRequest())).items
        ctrs = (await self.cri.runtime("ListContainers", pb.ListContainersRequest())).containers
        pods: dict[str, RuntimePod] = {}
        for sb in sbs:
            uid = sb.labels.get(POD_UID_LABEL)
            if not uid:
                continue
            rp = pods.setdefault(uid, RuntimePod(uid=uid))
            rp.name = sb.labels.get(POD_NAME_LABEL, rp.name)
            rp.namespace = sb.labels.get(POD_NAMESPACE_LABEL, rp.namespace)
            rp.sandboxes.append(SandboxInfo(id=sb.id, ready=sb.state == pb.SANDBOX_READY,
                                            created_at=sb.created_at, attempt=sb.metadata.attempt))
        for c in ctrs:
            uid = c.labels.get(POD_UID_LABEL)
            if not uid:
                continue
            rp = pods.setdefault(uid, RuntimePod(uid=uid))
            rp.name = rp.name or c.labels.get(POD_NAME_LABEL, "")
            rp.namespace = rp.namespace or c.labels.get(POD_NAMESPACE_LABEL, "")
            ann = dict(c.annotations)
            try:
                restarts = int(ann.get(RESTART_COUNT_ANNOTATION, "0"))
            except ValueError:
                restarts = 0
            rp.containers.append(ContainerInfo(
                id=f"{name}://{c.id}", name=c.labels.get(CONTAINER_NAME_LABEL) or c.metadata.name,
                state=_STATES.get(c.state, ps.UNKNOWN), created_at=c.created_at,
                image=c.image.user_specified_image or c.image.image, image_ref=c.image_ref,
                restart_count=restarts, hash=ann.get(HASH_ANNOTATION, ""), attempt=c.metadata.attempt,
                labels=dict(c.labels), annotations=ann, sandbox_id=c.pod_sandbox_id))
        for rp in pods.values():
            ps.sort_newest_first(rp)
        return list(pods.values())

    # -- status -----------------------------------------------------------------------------

    def _probe(self, method: str) -> Callable[[str], bool | None]:
        fn = getattr(self.prober, method, None) if self.prober is not None else None
        if fn is None:
            return lambda cid: None
        return fn

    def compute_status(self, pod: Obj, rt: RuntimePod, *, terminal: bool = False) -> Obj:
        uid = (pod.get("metadata") or {}).get("uid", "")
        st = self._pods.get(uid)
        update = getattr(self.prober, "update_pod_status", None) if self.prober is not None else None
        return ps.compute_pod_status(
            pod, rt, waiting=st.waiting if st else {}, ready=self._probe("ready"),
            started=self._probe("started"), probe_update=update, host_ips=self.host_ips,
            terminal=terminal, now=self.clock())

    def next_wakeup(self, uid: str) -> float | None:
        """When the earliest back-off of pod ``uid`` ends (time in the runtime's clock), if any."""
        st = self._pods.get(uid)
        if st is None:
            return None
        now = self.clock()
        ends = [e for k in st.backoff_keys
                for e in (self.backoff.ends(k), self.image_backoff.ends(k)) if e is not None and e > now]
        return min(ends) if ends else None

    # -- sync ----------------------------------------------------------------------------------

    async def sync_pod(self, pod: Obj) -> Obj:
        """One reconcile step of ``pod``; returns the pod's new status."""
        uid = pod["metadata"]["uid"]
        async with self._lock(uid):
            state = self._state(uid)
            rt = await self.pod_runtime_status(uid)
            old_phase = (pod.get("status") or {}).get("phase")
            deleting = bool(pod["metadata"].get("deletionTimestamp"))
            if old_phase in ("Succeeded", "Failed"):
                if rt.running() or any(s.ready for s in rt.sandboxes):
                    await self._kill_pod(pod, rt, self._grace(pod))
                    rt = await self.pod_runtime_status(uid)
                await self._release_pod_cgroup(uid, rt)
                return self.compute_status(pod, rt, terminal=True)
            if not deleting:
                changed = await self._reconcile(pod, rt, state)
                if changed:
                    rt = await self.pod_runtime_status(uid)
            status = self.compute_status(pod, rt)
            if status["phase"] in ("Succeeded", "Failed") and (rt.running() or any(s.ready for s in rt.sandboxes)):
                # a pod that is done: its sidecars stop and its sandbox goes, as upstream's
                # pod worker terminates a pod whose phase is terminal
                await self._kill_pod(pod, rt, self._grace(pod))
                rt = await self.pod_runtime_status(uid)
                status = self.compute_status({**pod, "status": status}, rt, terminal=True)
            if status["phase"] in ("Succeeded", "Failed"):
                await self._release_pod_cgroup(uid, rt)
            return status

    def _grace(self, pod: Obj) -> int:
        md = pod.get("metadata") or {}
        if md.get("deletionGracePeriodSeconds") is not None:
            return int(md["deletionGracePeriodSeconds"])
        g = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
        return 30 if g is None else int(g)

    async def _reconcile(self, pod: Obj, rt: RuntimePod, state: _PodState) -> bool:
        """upstream's computePodActions + SyncPod; True when it changed anything."""
        spec = pod.get("spec") or {}
        uid = pod["metadata"]["uid"]
        containers = list(spec.get("containers") or [])
        regular_names = {c["name"] for c in containers}
        alive = bool(rt.running()) or any(s.ready for s in rt.sandboxes)
        changed = False
        self._ensure_pod_cgroup(pod)
        if ps.sandbox_needs_replacing(rt, pod):
            any_regular_created = any(c.name in regular_names for c in rt.containers)
            if rt.sandboxes and spec.get("restartPolicy") == "Never" and rt.containers:
                # a Never pod whose containers already ran gets no new sandbox
                if alive:
                    await self._kill_pod(pod, rt, self._grace(pod))
                return alive
            wanted = [c for c in containers if not (run_once(c, spec) and succeeded(rt, c["name"]))]
            if not wanted and any_regular_created:
                if alive:
                    await self._kill_pod(pod, rt, self._grace(pod))
                return alive
            if alive:
                await self._kill_pod(pod, rt, self._grace(pod))
            if not await self._setup_volumes(pod, state):
                return True
            if await self._create_sandbox(pod, rt, state) is None:
                return True
            rt = await self.pod_runtime_status(uid)
            changed = True
        elif not await self._setup_volumes(pod, state):
            return changed

        sandbox = rt.sandbox
        assert sandbox is not None
        if state.sandbox_id != sandbox.id or state.sandbox_config is None:
            state.sandbox_config, state.sandbox_id = self._sandbox_config(pod, sandbox.attempt), sandbox.id
        sb_config = state.sandbox_config
        pod_ips = ([sandbox.ip] + sandbox.ips) if sandbox.ip else list(self.host_ips if spec.get("hostNetwork") else [])

        # containers of the current sandbox decide how far initialization got
        current = [c for c in rt.containers if c.sandbox_id in ("", sandbox.id)]
        in_sandbox = RuntimePod(uid=uid, sandboxes=rt.sandboxes, containers=current)
        initialized = any(c.name in regular_names for c in current)
        to_start: list[tuple[Obj, bool]] = []
        to_kill: list[tuple[ContainerInfo, Obj, str, int]] = []
        init_done = True
        started_fn = self._probe("started")
        for c in spec.get("initContainers") or []:
            latest = in_sandbox.latest(c["name"])
            if ps.is_sidecar(c):
                if latest is None or latest.state != ps.RUNNING:
                    to_start.append((c, True))
                    if not initialized:
                        init_done = False
                        break
                    continue
                kill = self._kill_reason(pod, c, latest, init=True)
                if kill is not None:
                    to_kill.append((latest, c, kill[0] + ", will be restarted", kill[1]))
                    to_start.append((c, True))
                    if not initialized:
                        init_done = False
                        break
                    continue
                if not initialized and c.get("startupProbe") and not started_fn(latest.id):
                    init_done = False
                    break
                continue
            if initialized:
                continue
            if latest is None:
                to_start.append((c, True))
                init_done = False
                break
            if latest.state in (ps.RUNNING, ps.CREATED):
                if latest.state == ps.CREATED:
                    to_start.append((c, True))
                else:
                    kill = self._kill_reason(pod, c, latest, init=True)
                    if kill is not None:
                        restart = ps.container_should_restart(c, spec, 1)
                        to_kill.append((latest, c, kill[0] + (", will be restarted" if restart else ""), kill[1]))
                        if restart:
                            to_start.append((c, True))
                init_done = False
                break
            if latest.state == ps.EXITED and latest.exit_code == 0:
                continue
            init_done = False
            if ps.container_should_restart(c, spec, latest.exit_code):
                to_start.append((c, True))
            elif any(ci.state == ps.RUNNING for ci in current):
                # the pod failed: its sidecars stop too
                await self._kill_pod(pod, rt, self._grace(pod))
                return True
            break

        if init_done:
            keep = 0
            regular_starts = 0
            for c in containers:
                latest = rt.latest(c["name"])
                if latest is None or latest.state != ps.RUNNING:
                    if ps.should_restart(c, pod, latest):
                        to_start.append((c, False))
                        regular_starts += 1
                    continue
                restart = ps.container_should_restart(c, spec, 1) if c.get("restartPolicy") else \
                    spec.get("restartPolicy") != "Never"
                if latest.hash and latest.hash != container_hash(c):
                    message, grace, restart = f"Container {c['name']} definition changed", self._grace(pod), True
                else:
                    kill = self._kill_reason(pod, c, latest, init=False)
                    if kill is None:
                        keep += 1
                        continue
                    message, grace = kill
                if restart:
                    message += ", will be restarted"
                    to_start.append((c, False))
                    regular_starts += 1
                to_kill.append((latest, c, message, grace))
            if keep == 0 and regular_starts == 0 and containers:
                # every regular container is done for good: the pod stops, sidecars included
                if alive:
                    await self._kill_pod(pod, rt, self._grace(pod))
                    return True
                return changed

        for ci, c, why, grace in to_kill:
            await self._kill_container(pod, ci, c, grace, message=why)
            changed = True
        if to_kill:
            rt = await self.pod_runtime_status(uid)
        for c, is_init in to_start:
            await self._start_container(pod, c, rt, state, sandbox.id, sb_config, pod_ips, is_init)
            changed = True
        await self._prune(rt)
        return changed

    def _kill_reason(self, pod: Obj, c: Obj, ci: ContainerInfo, *, init: bool) -> tuple[str, int] | None:
        """(message, grace) when a failed liveness or startup probe wants the container killed."""
        kill = self.prober.kill_reason(c["name"], ci.id, init=init) if self.prober is not None else None
        if kill is None:
            return None
        reason, message = kill
        return message, prober_mod.kill_grace_seconds(pod, c, reason)

    async def _setup_volumes(self, pod: Obj, state: _PodState) -> bool:
        if self.volumes is None:
            return True
        try:
            await self.volumes.setup(pod)
        except VolumeError as e:
            self._event(pod, "Warning", e.reason, e.message)
            return False
        return True

    # -- sandboxes ---------------------------------------------------------------------

    def _ensure_pod_cgroup(self, pod: Obj) -> None:
        """The pod's cgroup exists, with its limits (upstream's syncPod does it
        before anything else runs); CgroupError when it cannot be made."""
        if self.cgroups is None:
            return
        # the pod's directory first: a cgroup left by a crash then belongs to a pod on disk (orphans)
        os.makedirs(self.pod_dir(pod["metadata"]["uid"]), exist_ok=True)
        try:
            self.cgroups.ensure_pod(pod)
        except CgroupError as e:
            self._event(pod, "Warning", "FailedToCreatePodContainer", f"unable to ensure pod container exists: {e}")
            raise

    async def _release_pod_cgroup(self, uid: str, rt: RuntimePod) -> None:
        """A pod that is done and runs nothing any more gives its cgroup back
        (upstream's cleanup of the cgroups of pods that cannot be running)."""
        if self.cgroups is None or rt.running() or any(s.ready for s in rt.sandboxes):
            return
        await asyncio.to_thread(self.cgroups.destroy, uid)
        self.cgroups.forget(uid)

    def _sandbox_config(self, pod: Obj, attempt: int) -> pb.PodSandboxConfig:
        md = pod["metadata"]
        spec = pod.get("spec") or {}
        hostname = ""
        if not spec.get("hostNetwork"):  # a host-network pod has the node's UTS namespace
            hostname, domain = pod_hostname(pod, self.cluster_domain)
            if spec.get("setHostnameAsFQDN") and domain:
                hostname = f"{hostname}.{domain}"
                if len(hostname) > 64:
                    raise ConfigError(f"failed to construct FQDN from pod hostname and cluster domain, FQDN "
                                      f"{hostname} is too long (64 characters is the max, {len(hostname)} "
                                      f"characters requested)")
        labels = {k: str(v) for k, v in (md.get("labels") or {}).items()}
        labels.update({POD_NAME_LABEL: md["name"], POD_NAMESPACE_LABEL: md.get("namespace", ""),
                       POD_UID_LABEL: md["uid"]})
        cfg = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=md["name"], uid=md["uid"], namespace=md.get("namespace", ""),
                                           attempt=attempt),
            hostname=hostname, log_directory=self.pod_log_dir(pod),
            dns_config=dns_config(pod, self.cluster_dns, self.cluster_domain, self.resolv_conf,
                                  warn=lambda reason, message: self._event(pod, "Warning", reason, message),
                                  node_ips=self.host_ips),
            labels=labels, annotations={k: str(v) for k, v in (md.get("annotations") or {}).items()})
        protos = {"TCP": pb.TCP, "UDP": pb.UDP, "SCTP": pb.SCTP}
        for c in list(spec.get("initContainers") or []) + list(spec.get("containers") or []):
            for p in c.get("ports") or []:
                if not p.get("hostPort") and not spec.get("hostNetwork"):
                    continue
                host_port = p.get("hostPort") or (p.get("containerPort") if spec.get("hostNetwork") else 0)
                cfg.port_mappings.append(pb.PortMapping(
                    protocol=protos.get(p.get("protocol") or "TCP", pb.TCP),
                    container_port=int(p.get("containerPort") or 0), host_port=int(host_port or 0),
                    host_ip=p.get("hostIP") or ""))
        psc = spec.get("securityContext") or {}
        sc = pb.LinuxSandboxSecurityContext(namespace_options=namespace_options(spec))
        if psc.get("runAsUser") is not None:
            sc.run_as_user.value = int(psc["runAsUser"])
        if psc.get("runAsGroup") is not None:
            sc.run_as_group.value = int(psc["runAsGroup"])
        groups = [int(g) for g in psc.get("supplementalGroups") or []]
        if psc.get("fsGroup") is not None:
            groups.insert(0, int(psc["fsGroup"]))
        sc.supplemental_groups.extend(groups)
        sc.privileged = any(((c.get("securityContext") or {}).get("privileged"))
                            for c in list(spec.get("initContainers") or []) + list(spec.get("containers") or []))
        prof = _seccomp(psc.get("seccompProfile"))
        if prof is not None:
            sc.seccomp.CopyFrom(prof)
        cfg.linux.security_context.CopyFrom(sc)
        for s in psc.get("sysctls") or []:
            cfg.linux.sysctls[s.get("name", "")] = str(s.get("value", ""))
        if self.cgroups is not None:
            cfg.linux.cgroup_parent = self.cgroups.pod_name(pod)
        return cfg

    async def _create_sandbox(self, pod: Obj, rt: RuntimePod, state: _PodState) -> str | None:
        attempt = (rt.sandbox.attempt + 1) if rt.sandbox is not None else 0
        try:
            cfg = self._sandbox_config(pod, attempt)
        except ConfigError as e:
            self._event(pod, "Warning", "FailedCreatePodSandBox", f"Failed to create pod sandbox: {e}")
            return None
        os.makedirs(cfg.log_directory, exist_ok=True)
        os.makedirs(self.pod_dir(pod["metadata"]["uid"]), exist_ok=True)
        try:
            sid = (await self.cri.runtime("RunPodSandbox", pb.RunPodSandboxRequest(
                config=cfg, runtime_handler=self.runtime_handler))).pod_sandbox_id
        except CRIError as e:
            msg = f"Failed to create pod sandbox: {e.details or e}"
            self._event(pod, "Warning", "FailedCreatePodSandBox", msg)
            log.warning("%s: %s", format_pod(pod), msg)
            return None
        if rt.sandbox is not None:
            self._event(pod, "Normal", "SandboxChanged", "Pod sandbox changed, it will be killed and re-created.")
        state.sandbox_config, state.sandbox_id = cfg, sid
        return sid

    # -- images --------------------------------------------------------------------

    async def _pull_secrets(self, pod: Obj) -> list[Obj]:
        names = [r.get("name") for r in (pod.get("spec") or {}).get("imagePullSecrets") or [] if r.get("name")]
        out = []
        if not names or self.client is None:
            return out
        ns = pod["metadata"].get("namespace", "")
        for n in names:
            try:
                out.append(await self.client.get(SECRETS, n, ns))
            except Exception as e:
                log.info("%s: pull secret %s/%s: %s", format_pod(pod), ns, n, e)
                self._event(pod, "Warning", "FailedToRetrieveImagePullSecret",
                            f'Unable to retrieve some image pull secrets ({n}); attempting to pull the image may not succeed.')
        return out

    async def _image_status(self, image: str) -> pb.Image | None:
        r = await self.cri.image("ImageStatus", pb.ImageStatusRequest(image=pb.ImageSpec(image=image)))
        return r.image if r.HasField("image") and r.image.id else None

    async def ensure_image(self, pod: Obj, container: Obj, sb_config: pb.PodSandboxConfig
                           ) -> tuple[str, pb.Image | None, tuple[str, str] | None]:
        """upstream's EnsureImageExists: (image ref, image, (reason, message) on failure)."""
        image = container.get("image") or ""
        cname = container.get("name") or ""
        uid = pod["metadata"]["uid"]
        policy = image_pull_policy(container)
        try:
            present = await self._image_status(image)
        except CRIError as e:
            return "", None, ("ErrImageInspect", f"Failed to inspect image {image!r}: {go_grpc_error(e)}")
        if present is not None and policy != "Always":
            self._event(pod, "Normal", "Pulled", f'Container image "{image}" already present on machine',
                        cname)
            return present.id, present, None
        if policy == "Never":
            msg = f'Container image "{image}" is not present with pull policy of Never'
            self._event(pod, "Warning", "ErrImageNeverPull", msg, cname)
            return "", None, ("ErrImageNeverPull", msg)
        key = f"{uid}_{image}"
        state = self._state(uid)
        state.backoff_keys.add(key)
        if self.image_backoff.in_backoff_since_update(key, self.clock()):
            msg = f'Back-off pulling image "{image}"'
            self._event(pod, "Normal", "BackOff", msg, cname)
            prev = state.pull_errors.get(key)
            return "", None, ("ImagePullBackOff", f"{msg}: {prev}" if prev else msg)
        state.pull_errors.pop(key, None)
        self._event(pod, "Normal", "Pulling", f'Pulling image "{image}"', cname)
        started = time.monotonic()
        auths = pull_credentials(await self._pull_secrets(pod), image) or [None]
        err: CRIError | None = None
        ref = ""
        for auth in auths:
            try:
                req = pb.PullImageRequest(image=pb.ImageSpec(image=image), sandbox_config=sb_config)
                if auth is not None:
                    req.auth.CopyFrom(auth)
                ref = (await self.cri.image("PullImage", req)).image_ref
                err = None
                break
            except CRIError as e:
                err = e
        if err is not None:
            text = go_grpc_error(err)
            self._event(pod, "Warning", "Failed", f'Failed to pull image "{image}": {text}', cname)
            self.image_backoff.next(key, self.clock())
            state.pull_errors[key] = f"ErrImagePull: {text}"
            return "", None, ("ErrImagePull", text)
        took = time.monotonic() - started
        img = await self._image_status(ref or image)
        self._event(pod, "Normal", "Pulled", f'Successfully pulled image "{image}" in {took:.3f}s. '
                    f'Image size: {img.size if img else 0} bytes.', cname)
        return ref or (img.id if img else image), img, None

    # -- containers ------------------------------------------------------------------

    def _service_informer(self) -> Any:
        """The Services informer, started on first use (upstream's kubelet lists Services
        through an informer for the service environment variables)."""
        if self._services_informer is None:
            from kubeplane.client.informer import SharedInformer

            inf = SharedInformer(self.client, SERVICES, indexers={
                "namespace": lambda o: [(o.get("metadata") or {}).get("namespace", "")]})
            inf.start()
            self._services_informer = inf
        return self._services_informer

    async def _services(self, ns: str) -> list[Obj]:
        """The namespace's Services and the master service."""
        inf = self._service_informer()
        if not inf.has_synced() and not await inf.wait_for_sync(SERVICE_SYNC_SECONDS):
            raise ConfigError("services have not yet been read at least once, cannot construct envvars")
        out = list(inf.indexer.by_index("namespace", ns))
        if ns != "default":
            master = inf.indexer.get_by_key("default/kubernetes")
            if master is not None:
                out.append(master)
        return out

    async def close(self) -> None:
        """Stop the Services informer, if one was started."""
        inf, self._services_informer = self._services_informer, None
        if inf is not None:
            await inf.stop()

    async def _env(self, pod: Obj, container: Obj, pod_ips: list[str]) -> list[pb.KeyValue]:
        """upstream's makeEnvironmentVariables."""
        spec = pod.get("spec") or {}
        ns = pod["metadata"].get("namespace", "")
        env: dict[str, str] = {}
        if self.client is not None:
            services = await self._services(ns)
            env.update(service_env(services, ns, spec.get("enableServiceLinks", True) is not False))
        cache: dict[tuple[str, str], Obj | None] = {}

        async def source(kind: str, name: str, optional: bool) -> Obj | None:
            k = (kind, name)
            if k not in cache:
                if self.client is None:
                    what = "configMap" if kind == "configmap" else "secret"
                    raise ConfigError(f"couldn't get {what} {ns}/{name}, no kubeClient defined")
                try:
                    cache[k] = await self.client.get(CONFIGMAPS if kind == "configmap" else SECRETS, name, ns)
                except StatusError as e:
                    if e.code != 404:
                        raise ConfigError(e.message) from None
                    cache[k] = None
            obj = cache[k]
            if obj is None and not optional:
                raise ConfigError(f'{kind} "{name}" not found')
            return obj

        def values(kind: str, obj: Obj) -> dict[str, str]:
            if kind == "configmap":
                return {**{k: str(v) for k, v in (obj.get("data") or {}).items()}}
            out = {}
            for k, v in (obj.get("data") or {}).items():
                try:
                    out[k] = base64.b64decode(v).decode("utf-8", "replace")
                except (ValueError, TypeError):
                    out[k] = ""
            for k, v in (obj.get("stringData") or {}).items():
                out[k] = str(v)
            return out

        for ef in container.get("envFrom") or []:
            prefix = ef.get("prefix") or ""
            if ef.get("configMapRef"):
                ref, kind = ef["configMapRef"], "configmap"
            elif ef.get("secretRef"):
                ref, kind = ef["secretRef"], "secret"
            else:
                continue
            obj = await source(kind, ref.get("name", ""), bool(ref.get("optional")))
            if obj is None:
                continue
            # names the API accepted are passed on as they are (relaxed env var names, GA in 1.34)
            for k, v in values(kind, obj).items():
                env[prefix + k] = v

        for e in container.get("env") or []:
            name = e.get("name", "")
            if "valueFrom" not in e:
                env[name] = expand(str(e.get("value", "")), env.get)
                continue
            vf = e.get("valueFrom") or {}
            if vf.get("fieldRef"):
                try:
                    env[name] = pod_field_value(pod, vf["fieldRef"].get("fieldPath", ""), pod_ips, self.host_ips)
                except ValueError as err:
                    raise ConfigError(str(err)) from None
            elif vf.get("resourceFieldRef"):
                ref = vf["resourceFieldRef"]
                try:
                    target = find_container(pod, ref["containerName"]) if ref.get("containerName") else container
                    env[name] = resource_field_value(ref, target, self.allocatable)
                except ValueError as err:
                    raise ConfigError(str(err)) from None
            elif vf.get("configMapKeyRef") or vf.get("secretKeyRef"):
                kind = "configmap" if vf.get("configMapKeyRef") else "secret"
                ref = vf.get("configMapKeyRef") or vf.get("secretKeyRef")
                optional = bool(ref.get("optional"))
                obj = await source(kind, ref.get("name", ""), optional)
                if obj is None:
                    continue
                vals = values(kind, obj)
                key = ref.get("key", "")
                if key not in vals:
                    if optional:
                        continue
                    what = "ConfigMap" if kind == "configmap" else "Secret"
                    raise ConfigError(f"couldn't find key {key} in {what} {ns}/{ref.get('name', '')}")
                env[name] = vals[key]
        return [pb.KeyValue(key=k, value=v.encode()) for k, v in env.items()]

    def _termination_message_file(self, uid: str, container: Obj) -> str:
        d = os.path.join(self.pod_dir(uid), "containers", container["name"])
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, uuid.uuid4().hex[:8])
        with open(path, "w"):
            pass
        os.chmod(path, 0o666)
        return path

    def _hosts_mount(self, pod: Obj, pod_ips: list[str]) -> pb.Mount | None:
        spec = pod.get("spec") or {}
        if spec.get("hostNetwork"):
            return None
        hostname, domain = pod_hostname(pod, self.cluster_domain)
        path = os.path.join(self.pod_dir(pod["metadata"]["uid"]), "etc-hosts")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(hosts_file(pod, pod_ips, hostname, domain))
        return pb.Mount(container_path="/etc/hosts", host_path=path)

    async def container_config(self, pod: Obj, c: Obj, restart_count: int, image_ref: str,
                               pod_ips: list[str], image: pb.Image | None) -> pb.ContainerConfig:
        """upstream's generateContainerConfig (raises ConfigError)."""
        md = pod["metadata"]
        spec = pod.get("spec") or {}
        verify_run_as_non_root(pod, c, image)
        envs = await self._env(pod, c, pod_ips)
        env = {kv.key: kv.value.decode("utf-8", "replace") for kv in envs}
        lookup = env.get
        mounts: list[pb.Mount] = []
        if self.volumes is not None:
            try:
                mounts.extend(self.volumes.mounts(pod, c, env))
            except VolumeError as e:
                raise ConfigError(e.message) from None
        names = {m.container_path for m in mounts}
        hosts = self._hosts_mount(pod, pod_ips)
        if hosts is not None and "/etc/hosts" not in names:
            mounts.append(hosts)
        tmp = c.get("terminationMessagePath") or "/dev/termination-log"
        if tmp not in names:
            mounts.append(pb.Mount(container_path=tmp, host_path=self._termination_message_file(md["uid"], c)))
        labels = {POD_NAME_LABEL: md["name"], POD_NAMESPACE_LABEL: md.get("namespace", ""),
                  POD_UID_LABEL: md["uid"], CONTAINER_NAME_LABEL: c["name"]}
        ann = {HASH_ANNOTATION: container_hash(c), RESTART_COUNT_ANNOTATION: str(restart_count),
               TERMINATION_MESSAGE_PATH_ANNOTATION: tmp,
               TERMINATION_MESSAGE_POLICY_ANNOTATION: c.get("terminationMessagePolicy") or "File"}
        if md.get("deletionGracePeriodSeconds") is not None:
            ann[DELETION_GRACE_ANNOTATION] = str(md["deletionGracePeriodSeconds"])
        if spec.get("terminationGracePeriodSeconds") is not None:
            ann[TERMINATION_GRACE_ANNOTATION] = str(spec["terminationGracePeriodSeconds"])
        if (c.get("lifecycle") or {}).get("preStop"):
            ann[PRESTOP_ANNOTATION] = json.dumps(c["lifecycle"]["preStop"], separators=(",", ":"))
        if c.get("ports"):
            ann[PORTS_ANNOTATION] = json.dumps(c["ports"], separators=(",", ":"))
        cfg = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=c["name"], attempt=restart_count),
            image=pb.ImageSpec(image=image_ref, user_specified_image=c.get("image") or ""),
            command=[expand(x, lookup) for x in c.get("command") or []],
            args=[expand(x, lookup) for x in c.get("args") or []],
            working_dir=c.get("workingDir") or "", envs=envs, mounts=mounts, labels=labels, annotations=ann,
            log_path=os.path.join(c["name"], f"{restart_count}.log"),
            stdin=bool(c.get("stdin")), stdin_once=bool(c.get("stdinOnce")), tty=bool(c.get("tty")))
        cfg.linux.resources.CopyFrom(linux_resources(pod, c, self.memory_capacity))
        cfg.linux.security_context.CopyFrom(container_security_context(pod, c))
        return cfg

    def _restart_count_from_logs(self, pod: Obj, name: str) -> int:
        """No container left of that name: continue after the newest log file (upstream does)."""
        d = os.path.join(self.pod_log_dir(pod), name)
        try:
            counts = [int(f[:-4]) for f in os.listdir(d) if f.endswith(".log") and f[:-4].isdigit()]
        except OSError:
            return 0
        return max(counts) + 1 if counts else 0

    async def _start_container(self, pod: Obj, c: Obj, rt: RuntimePod, state: _PodState, sandbox_id: str,
                               sb_config: pb.PodSandboxConfig, pod_ips: list[str], is_init: bool) -> bool:
        name = c["name"]
        uid = pod["metadata"]["uid"]
        latest = rt.latest(name)
        if latest is not None and latest.state == ps.EXITED:
            key = f"{pod['metadata']['name']}_{pod['metadata'].get('namespace', '')}_{uid}_{name}_{container_hash(c)}"
            state.backoff_keys.add(key)
            finished = latest.finished_at / 1e9
            if self.backoff.in_backoff_since(key, finished):
                msg = (f"back-off {go_duration(self.backoff.get(key))} restarting failed container={name} "
                       f"pod={format_pod(pod)}")
                self._event(pod, "Warning", "BackOff", f"Back-off restarting failed container {name} in pod "
                            f"{format_pod(pod)}", name)
                state.waiting[name] = ("CrashLoopBackOff", msg)
                return False
            self.backoff.next(key, finished)
        restart_count = latest.restart_count + 1 if latest is not None else self._restart_count_from_logs(pod, name)
        image_ref, image, err = await self.ensure_image(pod, c, sb_config)
        if err is not None:
            self._event(pod, "Warning", "Failed", f"Error: {err[0]}", name)
            state.waiting[name] = err
            return False
        try:
            cfg = await self.container_config(pod, c, restart_count, image_ref, pod_ips, image)
        except ConfigError as e:
            self._event(pod, "Warning", "Failed", f"Error: {e}", name)
            state.waiting[name] = ("CreateContainerConfigError", str(e))
            return False
        try:
            cid = (await self.cri.runtime("CreateContainer", pb.CreateContainerRequest(
                pod_sandbox_id=sandbox_id, config=cfg, sandbox_config=sb_config))).container_id
        except CRIError as e:
            self._event(pod, "Warning", "Failed", f"Error: {e.details or e}", name)
            state.waiting[name] = ("CreateContainerError", e.details or str(e))
            return False
        self._event(pod, "Normal", "Created", "Container created", name)
        try:
            await self.cri.runtime("StartContainer", pb.StartContainerRequest(container_id=cid))
        except CRIError as e:
            self._event(pod, "Warning", "Failed", f"Error: {e.details or e}", name)
            state.waiting[name] = ("RunContainerError", e.details or str(e))
            return False
        self._event(pod, "Normal", "Started", "Container started", name)
        state.waiting.pop(name, None)
        post = (c.get("lifecycle") or {}).get("postStart")
        if post:
            full_id = f"{await self._runtime_name()}://{cid}"
            msg = await self.run_handler(pod, c, full_id, post, pod_ips, timeout=None)
            if msg is not None:
                self._event(pod, "Warning", "FailedPostStartHook", msg, name)
                info = ContainerInfo(id=full_id, name=name, state=ps.RUNNING)
                await self._kill_container(pod, info, c, self._grace(pod), message="FailedPostStartHook")
                state.waiting[name] = ("PostStartHookError", msg)
                return False
        return True

    async def _prune(self, rt: RuntimePod) -> None:
        """Keep the two newest instances of each container (the current and the previous,
        whose log ``--previous`` reads), as upstream's container GC with MaxPerPodContainer=1."""
        seen: dict[str, int] = {}
        for ci in rt.containers:
            seen[ci.name] = seen.get(ci.name, 0) + 1
            if seen[ci.name] > 2 and ci.state != ps.RUNNING:
                try:
                    await self.cri.runtime("RemoveContainer", pb.RemoveContainerRequest(container_id=ci.raw_id))
                except CRIError as e:
                    if not e.not_found:
                        log.info("remove container %s: %s", ci.id, e)
                        continue
                if ci.log_path:  # its logs go with it, rotated ones too, as upstream's container GC
                    for path in [ci.log_path, *rotated_logs(ci.log_path)]:
                        try:
                            os.unlink(path)
                        except OSError:
                            pass
        # sandboxes replaced by a newer one and holding no container go (upstream's evictSandboxes)
        used = {ci.sandbox_id for ci in rt.containers}
        for sb in rt.sandboxes[1:]:
            if sb.ready or sb.id in used:
                continue
            try:
                await self.cri.runtime("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=sb.id))
            except CRIError as e:
                if not e.not_found:
                    log.info("remove sandbox %s: %s", sb.id, e)

    # -- hooks ---------------------------------------------------------------------

    async def run_handler(self, pod: Obj, c: Obj, container_id: str, handler: Obj, pod_ips: list[str],
                          timeout: float | None) -> str | None:
        """Run a lifecycle handler (exec, httpGet, sleep) with the prober's handler runner;
        None when it succeeded, else the message upstream's kubelet reports."""
        pod_ip = pod_ips[0] if pod_ips else None
        try:
            if self.prober is not None and hasattr(self.prober, "run_handler"):
                coro = self.prober.run_handler(pod, c, container_id, handler, pod_ip=pod_ip)
            else:
                coro = prober_mod.run_handler(self.cri, pod, c, container_id, handler, pod_ip=pod_ip,
                                              recorder=self.recorder)
            await asyncio.wait_for(coro, timeout)
        except prober_mod.HandlerError as e:
            return e.message
        except asyncio.TimeoutError:
            return f"lifecycle hook for Container {c.get('name', '')!r} in Pod {format_pod(pod)!r} " \
                   f"did not finish in {int(timeout or 0)}s"
        return None

    # -- stopping ------------------------------------------------------------------

    async def _kill_container(self, pod: Obj, ci: ContainerInfo, c: Obj | None, grace: int, *,
                              message: str = "") -> None:
        """upstream's killContainer: the preStop hook within the grace period, then
        StopContainer (the stop signal, SIGKILL after what remains of the grace)."""
        name = ci.name
        self._event(pod, "Normal", "Killing", message or f"Stopping container {name}", name)
        started = time.monotonic()
        pre_stop = (c or {}).get("lifecycle", {}).get("preStop") if c else None
        if pre_stop is None and ci.annotations.get(PRESTOP_ANNOTATION):
            try:
                pre_stop = json.loads(ci.annotations[PRESTOP_ANNOTATION])
            except ValueError:
                pre_stop = None
        if pre_stop and grace > 0:
            sb = (await self.pod_runtime_status(ci.labels.get(POD_UID_LABEL) or pod["metadata"]["uid"])).sandbox
            pod_ips = [sb.ip] + sb.ips if sb is not None and sb.ip else list(self.host_ips)
            try:
                msg = await asyncio.wait_for(
                    self.run_handler(pod, c or {"name": name}, ci.id, pre_stop, pod_ips, timeout=grace), grace)
            except asyncio.TimeoutError:
                msg = f"PreStop hook for Container {name!r} in Pod {format_pod(pod)!r} did not finish in {grace}s"
            if msg:
                self._event(pod, "Warning", "FailedPreStopHook", msg, name)
            grace = grace - int(time.monotonic() - started)
        grace = max(grace, MIN_GRACE_SECONDS)
        try:
            await self.cri.runtime("StopContainer", pb.StopContainerRequest(container_id=ci.raw_id, timeout=grace),
                                   timeout=grace + RUNTIME_REQUEST_TIMEOUT)
        except CRIError as e:
            if not e.not_found:
                raise

    async def _kill_pod(self, pod: Obj, rt: RuntimePod, grace: int) -> None:
        """Stop every running container (regular ones first, then sidecars in reverse
        order, as upstream) and every ready sandbox."""
        spec = pod.get("spec") or {}
        by_name = {c["name"]: c for c in list(spec.get("containers") or []) + list(spec.get("initContainers") or [])}
        init_order = [c["name"] for c in spec.get("initContainers") or []]
        running = rt.running()
        sidecars = [ci for ci in running if ci.name in init_order]
        regular = [ci for ci in running if ci.name not in init_order]
        deadline = time.monotonic() + grace
        await asyncio.gather(*(self._kill_container(pod, ci, by_name.get(ci.name), grace) for ci in regular))
        for ci in sorted(sidecars, key=lambda x: -init_order.index(x.name)):
            left = max(int(deadline - time.monotonic()), MIN_GRACE_SECONDS)
            await self._kill_container(pod, ci, by_name.get(ci.name), left)
        for sb in rt.sandboxes:
            if sb.ready:
                try:
                    await self.cri.runtime("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=sb.id))
                except CRIError as e:
                    if not e.not_found:
                        raise

    async def terminate_pod(self, pod: Obj, grace_seconds: int | None = None) -> Obj:
        """Stop the pod: preStop hooks, the stop signal, SIGKILL after the grace period, then
        its sandbox. Returns the pod's final status."""
        uid = pod["metadata"]["uid"]
        grace = self._grace(pod) if grace_seconds is None else int(grace_seconds)
        async with self._lock(uid):
            rt = await self.pod_runtime_status(uid)
            await self._kill_pod(pod, rt, grace)
            rt = await self.pod_runtime_status(uid)
            status = self.compute_status(pod, rt, terminal=True)
            return status

    async def _remove_container(self, raw_id: str, wait: float = 10.0) -> None:
        """RemoveContainer, waiting out the runtime's record of an exit.

        A container whose process has gone can still count as running for a moment:
        containerd answers StopContainer once the task is gone but marks the container
        exited only when it has handled the exit event, and refuses to remove it until
        then. Stop it again (a no-op for a finished process) and retry until ``wait``."""
        deadline = time.monotonic() + wait
        delay = 0.05
        while True:
            try:
                await self.cri.runtime("RemoveContainer", pb.RemoveContainerRequest(container_id=raw_id))
                return
            except CRIError as e:
                if e.not_found:
                    return
                if "still running" not in e.details or time.monotonic() + delay > deadline:
                    raise
            try:
                await self.cri.runtime("StopContainer", pb.StopContainerRequest(container_id=raw_id, timeout=0))
            except CRIError as e:
                if not e.not_found:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def remove_pod(self, uid: str) -> None:
        """Remove every container and sandbox of pod ``uid``, its volumes and its files.

        Containers still running (an orphan the API no longer has) are stopped as
        upstream kills them: their preStop hook and grace period come from the
        annotations the runtime put on them."""
        async with self._lock(uid):
            rt = await self.pod_runtime_status(uid)
            running = rt.running()
            if running:
                stub = {"metadata": {"uid": uid, "name": rt.name or running[0].labels.get(POD_NAME_LABEL, ""),
                                     "namespace": rt.namespace or running[0].labels.get(POD_NAMESPACE_LABEL, "")},
                        "spec": {}}
                await asyncio.gather(*(self._kill_container(stub, ci, None, annotated_grace(ci)) for ci in running))
            for ci in rt.containers:
                await self._remove_container(ci.raw_id)
            for sb in rt.sandboxes:
                for method, req in (("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=sb.id)),
                                    ("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=sb.id))):
                    try:
                        await self.cri.runtime(method, req)
                    except CRIError as e:
                        if not e.not_found:
                            raise
            if self.cgroups is not None:
                await asyncio.to_thread(self.cgroups.destroy, uid)
                self.cgroups.forget(uid)
            if self.volumes is not None:
                await self.volumes.teardown(uid)
            d = self.pod_dir(uid)
            shutil.rmtree(os.path.join(d, "containers"), ignore_errors=True)
            try:
                os.unlink(os.path.join(d, "etc-hosts"))
            except OSError:
                pass
            try:
                os.rmdir(d)
            except OSError:
                pass
            if os.path.isdir(self.logs_dir):
                for entry in os.listdir(self.logs_dir):
                    if entry.endswith("_" + uid):
                        shutil.rmtree(os.path.join(self.logs_dir, entry), ignore_errors=True)
            st = self._pods.pop(uid, None)
            if st is not None:
                for k in st.backoff_keys:
                    self.backoff.forget(k)
                    self.image_backoff.forget(k)
            self.backoff.gc()
            self.image_backoff.gc()

