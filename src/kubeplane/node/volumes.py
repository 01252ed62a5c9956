"""Pod volumes on the node: made ready before the containers start, as the kubelet's volume manager does.

Every volume a container of the pod mounts is set up under
``<pods_dir>/<uid>/volumes/<plugin>/<name>`` (the plugin directories carry
upstream's names: ``kubernetes.io~empty-dir``, ``kubernetes.io~configmap``,
``kubernetes.io~secret``, ``kubernetes.io~downward-api``,
``kubernetes.io~projected``); volumes nothing mounts are left alone.

* ``emptyDir``: a directory of mode 0777; medium ``Memory`` is a tmpfs whose
  size is the smallest of ``sizeLimit``, the pod's memory limit and the
  node's allocatable memory. ``HugePages`` media are refused.
* ``configMap``, ``secret``, ``downwardAPI`` and ``projected`` (configMap,
  secret, downwardAPI and serviceAccountToken sources): files written by an
  :class:`AtomicWriter`: a timestamped directory and the ``..data`` symlink
  swapped in one rename, the user-visible names symlinks through ``..data``,
  as upstream's ``atomic_writer.go``. They are written again when their
  source changes (:meth:`VolumeManager.setup` on every pod sync, and a
  resync of its own every ``resync_seconds``); secrets, downward API and
  projected volumes live on a tmpfs as upstream's do. Containers mount them
  read-only.
* ServiceAccount tokens come from the TokenRequest API, bound to the pod,
  cached, and asked again once 80 % of their life has passed (or 24 h), with
  upstream's token manager's jitter; the resync loop wakes for that.
* ``hostPath`` with its types (``DirectoryOrCreate``, ``Directory``,
  ``FileOrCreate``, ``File``, ``Socket``, ``CharDevice``, ``BlockDevice``).
* ``persistentVolumeClaim`` (and generic ``ephemeral`` volumes): the bound
  PV's ``hostPath`` or ``local`` path, or, for the local provisioner's CSI
  volumes, a directory per PV under ``local_volumes_dir`` on this node.
* ``subPath``/``subPathExpr``: the path inside the volume is resolved (it
  may not leave the volume, also not through symlinks), created when missing,
  opened component by component without following links and bind-mounted
  under ``<pods_dir>/<uid>/volume-subpaths/<volume>/<container>/<index>``,
  which is what the runtime mounts (upstream's safe subpath).

``fsGroup`` gives the volume's files that group (group read, and write for
writable volumes; set-gid directories) as upstream's volume ownership does.

Sources are read through the client (``GET``) on every set-up (pods asking
at the same time share one read; a resync pass reads each source once);
immutable ConfigMaps and Secrets once while pods of their namespace run here.
A node needs to read the ConfigMaps, Secrets, claims and volumes its pods
use, its own Node (allocatable, for tmpfs sizes and ``resourceFieldRef``),
and to create tokens for its pods' ServiceAccounts.

Failures raise :class:`VolumeError` carrying the event reason (``FailedMount``
from :meth:`VolumeManager.setup`, ``CreateContainerConfigError`` from
:meth:`VolumeManager.mounts`) and upstream's message. A volume already in use
stays as it is when its source fails later (a ``FailedMount`` event through
the ``recorder``, as upstream's remount). ``mountPropagation`` other than
``None`` needs the node's directory on a shared mount: :func:`make_rshared`
does what the kubelet does to its root directory.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import ctypes
import errno
import logging
import math
import os
import random
import re
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from fractions import Fraction
from typing import Any, Callable, Iterable

from kubeplane.api.errors import StatusError
from kubeplane.api.gofmt import go_quote
from kubeplane.api.meta import parse_timestamp
from kubeplane.api.quantity import canonical_quantity, parse_quantity
from kubeplane.api.resources import resource
from kubeplane.client.interface import Client, Obj
from kubeplane.node.cri.client import pb

log = logging.getLogger(__name__)

CONFIG_MAPS = resource("configmaps")
SECRETS = resource("secrets")
SERVICE_ACCOUNTS = resource("serviceaccounts")
PVCS = resource("persistentvolumeclaims")
PVS = resource("persistentvolumes")
NODES = resource("nodes")

EMPTY_DIR = "kubernetes.io~empty-dir"
CONFIG_MAP = "kubernetes.io~configmap"
SECRET = "kubernetes.io~secret"
DOWNWARD_API = "kubernetes.io~downward-api"
PROJECTED = "kubernetes.io~projected"
#: the CSI driver of kubeplane's local provisioner (its PVs are directories on the node)
LOCAL_PROVISIONER = "kubeplane.io/local"

DATA_DIR = "..data"
NEW_DATA_DIR = "..data_tmp"
MAX_FILE_NAME_LENGTH = 255
MAX_PATH_LENGTH = 4096
DEFAULT_MODE = 0o644
EMPTY_DIR_PERM = 0o777
DEFAULT_TOKEN_SECONDS = 3600
#: upstream token manager: a token is asked again after 24 h or within 20 % of its end, less a jitter
TOKEN_MAX_TTL = 24 * 3600.0
TOKEN_MAX_JITTER = 10.0
#: upstream's syncFrequency: how often every pod's volume contents are brought up to date
DEFAULT_RESYNC_SECONDS = 60.0

RW_MASK = 0o660
RO_MASK = 0o440
EXEC_MASK = 0o110

_CONTENT_KINDS = ("configMap", "secret", "downwardAPI", "projected")
_KNOWN_SOURCES = (
    "emptyDir", "configMap", "secret", "downwardAPI", "projected", "hostPath", "persistentVolumeClaim",
    "ephemeral")


class VolumeError(Exception):
    """A volume could not be made ready; ``reason`` is the event reason, ``message`` upstream's text."""

    def __init__(self, reason: str, message: str, messages: list[str] | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        #: one message per volume that failed (upstream records an event for each)
        self.messages = messages or [message]


class _SetupFailed(Exception):
    """One volume's set-up failed (the text is upstream's error)."""


# ----------------------------------------------------------------- mounts (Linux)

MS_RDONLY = 1
MS_BIND = 4096
MS_REC = 16384
MNT_DETACH = 2

_libc: Any = None


def _c() -> Any:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def mount(source: str, target: str, fstype: str | None, flags: int = 0, data: str | None = None) -> None:
    """mount(2); raises :class:`OSError`."""
    rc = _c().mount(source.encode(), target.encode(), fstype.encode() if fstype else None,
                    ctypes.c_ulong(flags), data.encode() if data else None)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def unmount(target: str, *, detach: bool = False) -> None:
    """umount2(2); a path that is not mounted is no error."""
    rc = _c().umount2(target.encode(), MNT_DETACH if detach else 0)
    if rc != 0:
        err = ctypes.get_errno()
        if err == errno.EINVAL or err == errno.ENOENT:
            return
        raise OSError(err, f"unmount {target}: {os.strerror(err)}")


def _unescape_mountinfo(s: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def mount_points() -> list[tuple[str, str]]:
    """(mount point, filesystem type) of every mount this process sees."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            sep = parts.index("-")
            out.append((_unescape_mountinfo(parts[4]), parts[sep + 1]))
    return out


def mounts_under(path: str) -> list[str]:
    """Mount points at or below ``path``, deepest first."""
    path = os.path.realpath(path).rstrip("/")
    found = {p for p, _ in mount_points() if p == path or p.startswith(path + "/")}
    return sorted(found, key=lambda p: (p.count("/"), p), reverse=True)


MS_SHARED = 1 << 20


def _mount_of(path: str) -> tuple[str, list[str]]:
    """The mount point holding ``path`` and its optional fields (``shared:N``, ``master:N``...)."""
    path = os.path.realpath(path)
    best = ("", [])
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            point = _unescape_mountinfo(parts[4])
            inside = path == point or path.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best[0]):
                best = (point, parts[6:parts.index("-")])
    return best


def is_shared(path: str) -> bool:
    return any(f.startswith("shared:") for f in _mount_of(path)[1])


def make_rshared(path: str) -> bool:
    """What the kubelet does to its root directory: unless ``path`` is on a shared mount already,
    bind-mount it onto itself and make that mount rshared, so that volumes with
    ``mountPropagation: HostToContainer`` (or ``Bidirectional``) can be mounted from there.
    Returns whether it mounted (the caller unmounts ``path`` when it removes the directory)."""
    if is_shared(path):
        return False
    mount(path, path, None, MS_BIND)
    try:
        mount("none", path, None, MS_SHARED | MS_REC)
    except OSError:
        unmount(path, detach=True)
        raise
    return True


def _remove_tree(path: str) -> None:
    """Removes ``path`` without crossing into other filesystems (a mount left behind is an error)."""
    if not os.path.lexists(path):
        return
    left = mounts_under(path)
    if left:
        raise OSError(errno.EBUSY, f"{path} still has mounts: {', '.join(left)}")
    shutil.rmtree(path)


# ------------------------------------------------------------------ atomic writer


@dataclass
class FileProjection:
    data: bytes
    mode: int = DEFAULT_MODE
    fs_user: int | None = None


def validate_path(target: str) -> None:
    """A payload path: relative, no ``..`` element, not starting with ``..`` (upstream's rules and wording)."""
    if target == "":
        raise ValueError('invalid path: must not be empty: ""')
    if target.startswith("/"):
        raise ValueError(f"invalid path: must be relative path: {target}")
    if len(target) > MAX_PATH_LENGTH:
        raise ValueError(f"invalid path: must be less than or equal to {MAX_PATH_LENGTH} characters")
    items = target.split("/")
    for item in items:
        if item == "..":
            raise ValueError(f"invalid path: must not contain '..': {target}")
        if len(item) > MAX_FILE_NAME_LENGTH:
            raise ValueError(f"invalid path: filenames must be less than or equal to {MAX_FILE_NAME_LENGTH} characters")
    if items[0].startswith("..") and len(items[0]) > 2:
        raise ValueError(f"invalid path: must not start with '..': {target}")


def _clean(p: str) -> str:
    """Go's filepath.Clean for a relative path."""
    return os.path.normpath(p)


class AtomicWriter:
    """Writes a set of files into ``target_dir`` so that readers see all of the old or all of the new set.

    The files go to a new ``..<timestamp>.<random>`` directory, ``..data_tmp``
    is made a symlink to it and renamed over ``..data``; the user-visible
    top-level names are symlinks into ``..data``. Unchanged content is not
    written again; names gone from the payload are removed, then the old
    timestamped directory.
    """

    def __init__(self, target_dir: str, context: str = "") -> None:
        if not os.path.exists(target_dir):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), target_dir)
        self.target_dir = target_dir
        self.context = context

    def write(self, payload: dict[str, FileProjection], set_perms: Callable[[str], None] | None = None) -> bool:
        """Returns whether anything changed on disk."""
        clean: dict[str, FileProjection] = {}
        for k, v in payload.items():
            validate_path(k)
            clean[_clean(k)] = v
        data_path = os.path.join(self.target_dir, DATA_DIR)
        try:
            old_ts = os.readlink(data_path)
        except FileNotFoundError:
            old_ts = ""
        old_ts_path = os.path.join(self.target_dir, old_ts)
        to_remove: set[str] = set()
        should_write = True
        if old_ts:
            to_remove = self._paths_to_remove(clean, old_ts_path)
            if not self._should_write_payload(clean, old_ts_path) and not to_remove:
                should_write = False
                old_ts = ""
        if should_write:
            ts_dir = tempfile.mkdtemp(prefix=datetime.now(timezone.utc).strftime("..%Y_%m_%d_%H_%M_%S."),
                                      dir=self.target_dir)
            os.chmod(ts_dir, 0o755)
            ts_name = os.path.basename(ts_dir)
            try:
                self._write_payload(clean, ts_dir)
                if set_perms is not None:
                    set_perms(ts_name)
                new_data = os.path.join(self.target_dir, NEW_DATA_DIR)
                if os.path.lexists(new_data):
                    os.remove(new_data)
                os.symlink(ts_name, new_data)
                try:
                    os.rename(new_data, data_path)
                except OSError:
                    os.remove(new_data)
                    raise
            except BaseException:
                shutil.rmtree(ts_dir, ignore_errors=True)
                raise
        self._create_user_visible(clean)
        self._remove_user_visible(to_remove)
        if old_ts:
            shutil.rmtree(old_ts_path)
        return should_write

    @staticmethod
    def _should_write_payload(payload: dict[str, FileProjection], old_ts_dir: str) -> bool:
        for rel, proj in payload.items():
            path = os.path.join(old_ts_dir, rel)
            if not os.path.lexists(path):
                return True
            with open(path, "rb") as f:
                if f.read() != proj.data:
                    return True
        return False

    @staticmethod
    def _paths_to_remove(payload: dict[str, FileProjection], old_ts_dir: str) -> set[str]:
        paths: set[str] = set()
        for root, dirs, files in os.walk(old_ts_dir):
            for name in (*dirs, *files):
                paths.add(os.path.relpath(os.path.join(root, name), old_ts_dir))
        new: set[str] = set()
        for rel in payload:
            sub = rel
            while sub:
                new.add(sub)
                sub = os.path.dirname(sub)
        return paths - new

    @staticmethod
    def _write_payload(payload: dict[str, FileProjection], directory: str) -> None:
        for rel, proj in payload.items():
            full = os.path.join(directory, rel)
            os.makedirs(os.path.dirname(full), mode=0o777, exist_ok=True)
            fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, proj.mode & 0o7777)
            try:
                os.write(fd, proj.data)
                os.fchmod(fd, proj.mode & 0o7777)
                if proj.fs_user is not None:
                    os.fchown(fd, proj.fs_user, -1)
            finally:
                os.close(fd)

    def _create_user_visible(self, payload: dict[str, FileProjection]) -> None:
        for rel, proj in payload.items():
            top = rel.split("/", 1)[0]
            visible = os.path.join(self.target_dir, top)
            if not os.path.lexists(visible):
                os.symlink(os.path.join(DATA_DIR, top), visible)
                if proj.fs_user is not None:
                    os.lchown(visible, proj.fs_user, -1)

    def _remove_user_visible(self, paths: set[str]) -> None:
        last: OSError | None = None
        for p in paths:
            if "/" in p:
                continue
            try:
                os.remove(os.path.join(self.target_dir, p))
            except FileNotFoundError:
                pass
            except OSError as err:
                log.error("%s: pruning the old user-visible path %s: %s", self.context, p, err)
                last = err
        if last is not None:
            raise last


# ------------------------------------------------------------- ownership (fsGroup)


def _root_matches(directory: str, fs_group: int, read_only: bool) -> bool:
    """Upstream's requiresPermissionChange, negated: the root has the group, the modes and set-gid."""
    try:
        st = os.stat(directory)
    except OSError:
        return False
    want = (RO_MASK if read_only else RW_MASK) | EXEC_MASK
    return (st.st_gid == fs_group and stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) & want == want
            and bool(st.st_mode & stat.S_ISGID))


def set_volume_ownership(directory: str, fs_group: int | None, read_only: bool, policy: str | None = None) -> None:
    """Upstream's SetVolumeOwnership: group ``fs_group`` on everything, group
    read (and write unless ``read_only``) on files, set-gid and search on
    directories; symlinks only change group. With ``policy`` ``OnRootMismatch``
    nothing is walked when the root is right already."""
    if fs_group is None:
        return
    if policy == "OnRootMismatch" and _root_matches(directory, fs_group, read_only):
        return
    mask = RO_MASK if read_only else RW_MASK

    def change(path: str) -> None:
        st = os.lstat(path)
        try:
            os.lchown(path, -1, fs_group)
        except OSError as err:
            log.error("lchown %s: %s", path, err)
        if stat.S_ISLNK(st.st_mode):
            return
        m = mask
        if stat.S_ISDIR(st.st_mode):
            m |= stat.S_ISGID | EXEC_MASK
        try:
            os.chmod(path, stat.S_IMODE(st.st_mode) | m)
        except OSError as err:
            log.error("chmod %s: %s", path, err)

    change(directory)
    for root, dirs, files in os.walk(directory):
        for name in (*dirs, *files):
            change(os.path.join(root, name))


# ---------------------------------------------------------------- downward API


def format_map(m: dict[str, str]) -> str:
    """Upstream's ``fieldpath.FormatMap``: ``key="value"`` lines, sorted by key."""
    return "\n".join(f"{k}={go_quote(str(m[k]))}" for k in sorted(m))


_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _qualified_name_errors(value: str) -> list[str]:
    parts = value.split("/")
    if len(parts) == 1:
        name, prefix = parts[0], None
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            return ["prefix part must be non-empty"]
    else:
        return ["a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
                "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
                "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix "
                "and '/' (e.g. 'example.com/MyName')"]
    errs = []
    if prefix is not None and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)):
        errs.append("prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                    "characters, '-' or '.', and must start and end with an alphanumeric character")
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part must be no more than 63 characters")
    elif not _QUALIFIED_NAME.match(name):
        errs.append("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
                    "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
                    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")
    return errs


def split_subscripted_path(field_path: str) -> tuple[str, str, bool]:
    if not field_path.endswith("']"):
        return field_path, "", False
    parts = field_path[:-2].split("['", 1)
    if len(parts) < 2 or not parts[0]:
        return field_path, "", False
    return parts[0], parts[1], True


def extract_field_path(pod: Obj, field_path: str) -> str:
    """Upstream's ``fieldpath.ExtractFieldPathAsString`` (what a downwardAPI volume may show)."""
    md = pod.get("metadata") or {}
    path, sub, ok = split_subscripted_path(field_path)
    if ok:
        if path == "metadata.annotations":
            errs = _qualified_name_errors(sub.lower())
            if errs:
                raise ValueError(f"invalid key subscript in {field_path}: {';'.join(errs)}")
            return str((md.get("annotations") or {}).get(sub, ""))
        if path == "metadata.labels":
            errs = _qualified_name_errors(sub)
            if errs:
                raise ValueError(f"invalid key subscript in {field_path}: {';'.join(errs)}")
            return str((md.get("labels") or {}).get(sub, ""))
        raise ValueError(f'fieldPath "{field_path}" does not support subscript')
    if field_path == "metadata.annotations":
        return format_map(md.get("annotations") or {})
    if field_path == "metadata.labels":
        return format_map(md.get("labels") or {})
    if field_path in ("metadata.name", "metadata.namespace", "metadata.uid"):
        return str(md.get(field_path.split(".", 1)[1]) or "")
    raise ValueError(f"unsupported fieldPath: {field_path}")


def pod_field_value(pod: Obj, field_path: str, pod_ips: list[str], host_ips: list[str]) -> str:
    """Upstream's ``podFieldSelectorRuntimeValue``: what an env var's fieldRef shows, the node's and
    the pod's addresses included, the rest as ``extract_field_path``."""
    spec = pod.get("spec") or {}
    if field_path == "spec.nodeName":
        return str(spec.get("nodeName") or "")
    if field_path == "spec.serviceAccountName":
        return str(spec.get("serviceAccountName") or "")
    if field_path == "status.hostIP":
        return host_ips[0] if host_ips else ""
    if field_path == "status.hostIPs":
        return ",".join(host_ips)
    if field_path == "status.podIP":
        return pod_ips[0] if pod_ips else ""
    if field_path == "status.podIPs":
        return ",".join(pod_ips)
    return extract_field_path(pod, field_path)


def find_container(pod: Obj, name: str) -> Obj:
    spec = pod.get("spec") or {}
    for c in (*(spec.get("containers") or []), *(spec.get("initContainers") or [])):
        if c.get("name") == name:
            return c
    raise ValueError(f"container {name} not found")


def resource_field_value(selector: Obj, container: Obj, node_allocatable: dict[str, Any] | None = None) -> str:
    """Upstream's ``ExtractContainerResourceValue`` after ``MergeContainerResourceLimits``:
    a missing (or zero) cpu/memory/ephemeral-storage limit is the node's allocatable."""
    res = selector.get("resource") or ""
    divisor_raw = selector.get("divisor")
    divisor = parse_quantity(divisor_raw) if divisor_raw not in (None, "", 0, "0") else Fraction(1)
    if divisor == 0:
        divisor = Fraction(1)
    resources = container.get("resources") or {}
    limits = dict(resources.get("limits") or {})
    for name in ("cpu", "memory", "ephemeral-storage"):
        if (name not in limits or parse_quantity(limits[name]) == 0) and node_allocatable and name in node_allocatable:
            limits[name] = node_allocatable[name]
    requests = resources.get("requests") or {}
    kind, _, name = res.partition(".")
    if kind not in ("limits", "requests") or not (name in ("cpu", "memory", "ephemeral-storage")
                                                  or name.startswith("hugepages-")):
        raise ValueError(f"unsupported container resource : {res}")
    raw = (limits if kind == "limits" else requests).get(name)
    value = parse_quantity(raw) if raw is not None else Fraction(0)
    if name == "cpu":
        # MilliValue rounds up
        return str(math.ceil(Fraction(math.ceil(value * 1000)) / Fraction(math.ceil(divisor * 1000))))
    return str(math.ceil(Fraction(math.ceil(value)) / Fraction(math.ceil(divisor))))


# --------------------------------------------------------------------- helpers


def _b64(data: str) -> bytes:
    return base64.b64decode(data)


def _not_found_message(kind: str, name: str) -> str:
    return f'{kind} "{name}" not found'


def _mode(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _content_key(pod: Obj) -> tuple:
    """What of a pod its content volumes may show (downward API items), to tell a changed pod."""
    md = pod.get("metadata") or {}
    return (md.get("generation"), sorted((md.get("labels") or {}).items()),
            sorted((md.get("annotations") or {}).items()))


def _pod_key(pod: Obj) -> str:
    md = pod.get("metadata") or {}
    return f"{md.get('namespace', '')}/{md.get('name', '')}"


def _all_containers(pod: Obj) -> list[Obj]:
    spec = pod.get("spec") or {}
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or []),
            *(spec.get("ephemeralContainers") or [])]


def _mounted_volume_names(pod: Obj) -> set[str]:
    names = set()
    for c in _all_containers(pod):
        for m in c.get("volumeMounts") or []:
            names.add(m.get("name"))
        for d in c.get("volumeDevices") or []:
            names.add(d.get("name"))
    return names


def fs_user_of(pod: Obj) -> int | None:
    """Upstream's ``FsUserFrom``: the one effective runAsUser of every container, if they share one."""
    pod_sc = (pod.get("spec") or {}).get("securityContext") or {}
    user: int | None = None
    containers = [c for c in _all_containers(pod)]
    for c in containers:
        uid = (c.get("securityContext") or {}).get("runAsUser", pod_sc.get("runAsUser"))
        if uid is None or (user is not None and uid != user):
            return None
        user = uid
    return user


def _fs_group_policy(pod: Obj) -> str | None:
    return ((pod.get("spec") or {}).get("securityContext") or {}).get("fsGroupChangePolicy")


def _fs_group(pod: Obj) -> int | None:
    g = ((pod.get("spec") or {}).get("securityContext") or {}).get("fsGroup")
    return g if isinstance(g, int) and not isinstance(g, bool) else None


def _pod_memory_limit(pod: Obj) -> Fraction | None:
    """The pod cgroup's memory limit: set only when every container has one (upstream's ResourceConfigForPod)."""
    spec = pod.get("spec") or {}
    total = Fraction(0)
    for c in spec.get("containers") or []:
        lim = ((c.get("resources") or {}).get("limits") or {}).get("memory")
        if lim is None:
            return None
        total += parse_quantity(lim)
    init_max = Fraction(0)
    for c in spec.get("initContainers") or []:
        lim = ((c.get("resources") or {}).get("limits") or {}).get("memory")
        if lim is None:
            return None
        if c.get("restartPolicy") == "Always":
            total += parse_quantity(lim)
        else:
            init_max = max(init_max, parse_quantity(lim))
    return max(total, init_max)


_EXPANSION = re.compile(r"\$\$|\$\(([^)]*)\)")


def expand(text: str, lookup: Callable[[str], str | None]) -> str:
    """Upstream's ``expansion.Expand``: ``$(VAR)`` replaced, ``$$`` an escaped ``$``, unknown left as written."""
    def repl(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        value = lookup(m.group(1))
        return m.group(0) if value is None else value
    return _EXPANSION.sub(repl, text)


def _validate_no_backsteps(p: str) -> str | None:
    if ".." in p.split("/"):
        return "must not contain '..'"
    return None


def _translate_propagation(mode: str | None) -> int:
    if mode is None or mode == "None":
        return pb.PROPAGATION_PRIVATE
    if mode == "HostToContainer":
        return pb.PROPAGATION_HOST_TO_CONTAINER
    if mode == "Bidirectional":
        return pb.PROPAGATION_BIDIRECTIONAL
    raise ValueError(f'invalid MountPropagation mode: "{mode}"')


# ------------------------------------------------------------------------- state


@dataclass
class _Ready:
    """A volume ready for the containers."""

    kind: str
    path: str
    read_only: bool = False  # mounted read-only whatever the volumeMount says
    block: bool = False


@dataclass
class _PodState:
    pod: Obj
    volumes: dict[str, _Ready] = field(default_factory=dict)
    #: the pod's _content_key when its volumes were last set up
    content_key: tuple | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass
class _Token:
    token: str
    expires: float  # Unix seconds
    seconds: int
    pod_uid: str
    refresh_at: float


class VolumeManager:
    """The pod volumes of one node. ``setup(pod)`` before the containers start (and again on every
    pod sync: unchanged contents cost a read), ``mounts(pod, container)`` for each container's CRI
    config, ``teardown(uid)`` once the pod's containers are gone, ``close()`` at the end."""

    def __init__(self, client: Client, pods_dir: str, *, node_name: str, local_volumes_dir: str | None = None,
                 resync_seconds: float = DEFAULT_RESYNC_SECONDS, clock: Callable[[], float] = time.time,
                 local_drivers: Iterable[str] = (LOCAL_PROVISIONER,), recorder: Any = None) -> None:
        self.client = client
        #: an EventRecorder (``event(obj, type, reason, message)``) for failures of volumes already in use
        self.recorder = recorder
        self.pods_dir = os.path.abspath(pods_dir)
        self.node_name = node_name
        self.local_volumes_dir = os.path.abspath(
            local_volumes_dir or os.path.join(os.path.dirname(self.pods_dir), "local-volumes"))
        self.resync_seconds = resync_seconds
        self.clock = clock
        self.local_drivers = set(local_drivers)
        self._pods: dict[str, _PodState] = {}
        #: reads of ConfigMaps and Secrets in flight, shared by the pods asking meanwhile
        self._reading: dict[tuple[str, str, str], asyncio.Future] = {}
        self._immutable: dict[tuple[str, str, str], Obj] = {}
        self._tokens: dict[tuple, _Token] = {}
        self._node_allocatable: tuple[float, dict[str, Any]] | None = None
        self._resync_task: asyncio.Task | None = None
        self._wake = asyncio.Event()
        os.makedirs(self.pods_dir, exist_ok=True)

    # ---------------------------------------------------------------- paths

    def pod_dir(self, uid: str) -> str:
        return os.path.join(self.pods_dir, uid)

    def volume_dir(self, uid: str, plugin: str, name: str) -> str:
        return os.path.join(self.pods_dir, uid, "volumes", plugin, name)

    def pod_uids_on_disk(self) -> list[str]:
        """Pods that have a directory here (for orphan clean-up after a restart)."""
        try:
            return sorted(d for d in os.listdir(self.pods_dir)
                          if not d.startswith(".") and os.path.isdir(os.path.join(self.pods_dir, d)))
        except FileNotFoundError:
            return []

    # ---------------------------------------------------------------- setup

    async def setup(self, pod: Obj) -> None:
        """Makes every volume a container of ``pod`` mounts ready (idempotent). The contents of
        volumes already ready are kept current by the resync loop; they are written again here
        only when the pod's labels, annotations or spec changed (what a downward API shows)."""
        uid = (pod.get("metadata") or {}).get("uid") or ""
        if not uid or "/" in uid or uid.startswith("."):
            raise VolumeError("FailedMount", f"the pod has no usable uid: {uid!r}")
        state = self._pods.get(uid)
        if state is None:
            state = self._pods[uid] = _PodState(pod)
        key = _content_key(pod)
        changed, state.content_key = key != state.content_key, key
        state.pod = pod
        async with state.lock:
            await self._setup_locked(state, only_missing=not changed)
        self._ensure_resync()

    async def _setup_locked(self, state: _PodState, *, only_content: bool = False,
                            only_missing: bool = False) -> None:
        """Sets up what is not ready yet and (unless ``only_missing``) writes the contents of
        content volumes again; ``only_content``: only the latter. A volume
        that was ready stays ready when bringing its contents up to date fails (upstream's remount):
        that failure is an event, not an error of the set-up."""
        pod = state.pod
        uid = pod["metadata"]["uid"]
        used = _mounted_volume_names(pod)
        failures: list[str] = []
        for vol in (pod.get("spec") or {}).get("volumes") or []:
            name = vol.get("name") or ""
            if name not in used:
                continue
            kind = next((k for k in _KNOWN_SOURCES if k in vol), None)
            ready = name in state.volumes
            if ready and (only_missing or kind not in _CONTENT_KINDS):
                continue  # mounted once, as upstream: pod volumes do not change
            if only_content and not ready:
                continue
            try:
                if kind is None:
                    other = next((k for k in vol if k != "name"), "unknown")
                    raise _SetupFailed(f"volume type {other} is not supported on this node")
                state.volumes[name] = await self._setup_volume(pod, uid, vol, kind)
                continue
            except (_SetupFailed, OSError, ValueError) as err:
                message = f'MountVolume.SetUp failed for volume "{name}" : {err}'
            except _PopulateFailed as err:
                message = str(err)
            if ready:
                log.warning("pod %s: %s", _pod_key(pod), message)
                if self.recorder is not None:
                    self.recorder.event(pod, "Warning", "FailedMount", message)
            else:
                failures.append(message)
        if failures:
            raise VolumeError("FailedMount", "; ".join(failures), failures)

    async def _setup_volume(self, pod: Obj, uid: str, vol: Obj, kind: str) -> _Ready:
        name = vol["name"]
        if kind == "emptyDir":
            return await self._setup_empty_dir(pod, uid, name, vol["emptyDir"] or {})
        if kind == "hostPath":
            src = vol["hostPath"] or {}
            return _Ready("hostPath", self._check_host_path(src.get("path") or "", src.get("type")))
        if kind in ("persistentVolumeClaim", "ephemeral"):
            return await self._setup_claim(pod, uid, vol, kind)
        plugin = {"configMap": CONFIG_MAP, "secret": SECRET, "downwardAPI": DOWNWARD_API,
                  "projected": PROJECTED}[kind]
        directory = self.volume_dir(uid, plugin, name)
        src = vol[kind] or {}
        default_mode = _mode(src.get("defaultMode"), DEFAULT_MODE)
        if kind == "configMap":
            payload = await self._config_map_payload(pod, src, default_mode)
        elif kind == "secret":
            payload = await self._secret_payload(pod, src, default_mode)
        elif kind == "downwardAPI":
            payload = await self._downward_payload(pod, src.get("items") or [], default_mode)
        else:
            payload = await self._projected_payload(pod, src, default_mode)
        fresh = not os.path.isdir(directory)
        memory = kind != "configMap"
        try:
            if memory:
                await self._ensure_tmpfs(pod, directory, None)
            else:
                self._ensure_dir(directory)
            writer = AtomicWriter(directory, f"pod {_pod_key(pod)} volume {name}")
            fs_group = _fs_group(pod)
            writer.write(payload, (lambda _ts: set_volume_ownership(directory, fs_group, True))
                         if fs_group is not None else None)
        except BaseException:
            if fresh:
                self._remove_volume_dir(directory)
            raise
        return _Ready(kind, directory, read_only=True)

    # ---------------------------------------------------------------- emptyDir

    @staticmethod
    def _ensure_dir(directory: str, perm: int = EMPTY_DIR_PERM) -> None:
        if os.path.isdir(directory):
            return  # made by an earlier set-up: its mode may carry fsGroup's set-gid bit now
        os.makedirs(directory, mode=perm, exist_ok=True)
        if stat.S_IMODE(os.lstat(directory).st_mode) != perm:
            os.chmod(directory, perm)  # not narrowed by the umask

    async def _ensure_tmpfs(self, pod: Obj, directory: str, size_limit: Any) -> None:
        if os.path.ismount(directory):
            return  # mounted by an earlier set-up (also before a restart of the agent)
        self._ensure_dir(directory)
        size = await self._memory_size(pod, size_limit)
        mount("tmpfs", directory, "tmpfs", 0, f"size={size}" if size else None)

    async def _memory_size(self, pod: Obj, size_limit: Any) -> int | None:
        """Upstream's calculateEmptyDirMemorySize: node allocatable, then the pod's limit, then sizeLimit,
        each only when smaller."""
        alloc = (await self._allocatable()).get("memory")
        size = parse_quantity(alloc) if alloc is not None else None
        pod_limit = _pod_memory_limit(pod)
        if pod_limit is not None and pod_limit > 0 and (size is None or pod_limit <= size):
            size = pod_limit
        if size_limit is not None:
            lim = parse_quantity(size_limit)
            if lim > 0 and (size is None or lim <= size):
                size = lim
        return math.ceil(size) if size is not None else None

    async def _allocatable(self) -> dict[str, Any]:
        now = time.monotonic()
        if self._node_allocatable is not None and now - self._node_allocatable[0] < self.resync_seconds:
            return self._node_allocatable[1]
        try:
            node = await self.client.get(NODES, self.node_name)
        except StatusError as err:
            log.warning("reading Node %s for its allocatable resources: %s", self.node_name, err)
            alloc = self._node_allocatable[1] if self._node_allocatable else {}
            self._node_allocatable = (now, alloc)  # asked again at the next resync, not at every volume
            return alloc
        alloc = ((node.get("status") or {}).get("allocatable")) or {}
        self._node_allocatable = (now, alloc)
        return alloc

    async def _setup_empty_dir(self, pod: Obj, uid: str, name: str, src: Obj) -> _Ready:
        directory = self.volume_dir(uid, EMPTY_DIR, name)
        medium = src.get("medium") or ""
        fresh = not os.path.isdir(directory)
        if medium == "Memory":
            await self._ensure_tmpfs(pod, directory, src.get("sizeLimit"))
        elif medium == "":
            self._ensure_dir(directory)
        elif medium.startswith("HugePages"):
            raise _SetupFailed(f'storage medium "{medium}" is not supported on this node')
        else:
            raise _SetupFailed(f'unknown storage medium "{medium}"')
        if fresh:
            set_volume_ownership(directory, _fs_group(pod), False)
        return _Ready("emptyDir", directory)

    # ------------------------------------------------------------ config/secret

    async def _get_source(self, res: Any, kind: str, namespace: str, name: str, optional: bool) -> Obj | None:
        """The ConfigMap or Secret as the API has it now: pods asking together share one read in flight,
        one resync pass reads each once; immutable ones are read once."""
        key = (kind, namespace, name)
        if key in self._immutable:
            return self._immutable[key]  # never changes: never read again (as upstream's cache)
        memo = _PASS.get()
        try:
            if memo is not None and key in memo:
                got = memo[key]
            else:
                fut = self._reading.get(key)
                if fut is None:
                    fut = asyncio.ensure_future(self._read_source(res, key))
                    self._reading[key] = fut
                    fut.add_done_callback(lambda _f, k=key: self._reading.pop(k, None))
                got = await asyncio.shield(fut)
                if memo is not None:
                    memo[key] = got
            if isinstance(got, StatusError):
                raise got
            return got
        except StatusError as err:
            if err.code == 404:
                if optional:
                    return None
                raise _SetupFailed(_not_found_message(kind, name)) from None
            raise _SetupFailed(err.message) from None

    async def _read_source(self, res: Any, key: tuple[str, str, str]) -> Any:
        try:
            obj = await self.client.get(res, key[2], key[1])
        except StatusError as err:
            return err
        if obj.get("immutable") is True:
            self._immutable[key] = obj
        return obj

    async def _config_map_payload(self, pod: Obj, src: Obj, default_mode: int) -> dict[str, FileProjection]:
        optional = bool(src.get("optional"))
        cm = await self._get_source(CONFIG_MAPS, "configmap", pod["metadata"].get("namespace", ""),
                                    src.get("name") or "", optional)
        data = {k: str(v).encode() for k, v in ((cm or {}).get("data") or {}).items()}
        for k, v in ((cm or {}).get("binaryData") or {}).items():
            data[k] = _b64(v)
        return self._key_payload(data, src.get("items"), default_mode, optional,
                                 "configmap references non-existent config key: {}")

    async def _secret_payload(self, pod: Obj, src: Obj, default_mode: int, *, name_field: str = "secretName"
                              ) -> dict[str, FileProjection]:
        optional = bool(src.get("optional"))
        secret = await self._get_source(SECRETS, "secret", pod["metadata"].get("namespace", ""),
                                        src.get(name_field) or "", optional)
        data = {k: _b64(v) for k, v in ((secret or {}).get("data") or {}).items()}
        return self._key_payload(data, src.get("items"), default_mode, optional,
                                 "references non-existent secret key: {}")

    @staticmethod
    def _key_payload(data: dict[str, bytes], items: list[Obj] | None, default_mode: int, optional: bool,
                     missing: str) -> dict[str, FileProjection]:
        if not items:
            return {k: FileProjection(v, default_mode) for k, v in data.items()}
        out = {}
        for item in items:
            key = item.get("key") or ""
            if key not in data:
                if optional:
                    continue
                raise _SetupFailed(missing.format(key))
            out[item.get("path") or key] = FileProjection(data[key], _mode(item.get("mode"), default_mode))
        return out

    # ------------------------------------------------------------ downward API

    async def _downward_payload(self, pod: Obj, items: list[Obj], default_mode: int) -> dict[str, FileProjection]:
        errs = []
        out = {}
        for item in items:
            path = _clean(item.get("path") or "")
            proj = FileProjection(b"", _mode(item.get("mode"), default_mode))
            try:
                if item.get("fieldRef"):
                    proj.data = extract_field_path(pod, item["fieldRef"].get("fieldPath") or "").encode()
                elif item.get("resourceFieldRef"):
                    ref = item["resourceFieldRef"]
                    container = find_container(pod, ref.get("containerName") or "")
                    proj.data = resource_field_value(ref, container, await self._allocatable()).encode()
            except ValueError as err:
                errs.append(str(err))
            out[path] = proj
        if errs:
            raise _SetupFailed(errs[0] if len(errs) == 1 else "[" + ", ".join(errs) + "]")
        return out

    # -------------------------------------------------------------- projected

    async def _projected_payload(self, pod: Obj, src: Obj, default_mode: int) -> dict[str, FileProjection]:
        errs: list[str] = []
        out: dict[str, FileProjection] = {}
        fs_user = fs_user_of(pod)
        for source in src.get("sources") or []:
            try:
                if source.get("secret") is not None:
                    out.update(await self._secret_payload(pod, source["secret"], default_mode, name_field="name"))
                elif source.get("configMap") is not None:
                    out.update(await self._config_map_payload(pod, source["configMap"], default_mode))
                elif source.get("downwardAPI") is not None:
                    out.update(await self._downward_payload(pod, source["downwardAPI"].get("items") or [],
                                                            default_mode))
                elif source.get("serviceAccountToken") is not None:
                    tp = source["serviceAccountToken"]
                    mode = default_mode
                    if fs_user is not None or _fs_group(pod) is not None:
                        mode = 0o600
                    token = await self._service_account_token(pod, tp)
                    out[tp.get("path") or "token"] = FileProjection(token.encode(), mode, fs_user)
                elif source.get("clusterTrustBundle") is not None or source.get("podCertificate") is not None:
                    kind = "clusterTrustBundle" if source.get("clusterTrustBundle") is not None else "podCertificate"
                    errs.append(f"{kind} projections are not supported on this node")
            except _SetupFailed as err:
                errs.append(str(err))
        if errs:
            raise _SetupFailed(errs[0] if len(errs) == 1 else "[" + ", ".join(errs) + "]")
        return out

    def _token_key(self, pod: Obj, tp: Obj) -> tuple:
        md = pod["metadata"]
        sa = (pod.get("spec") or {}).get("serviceAccountName") or "default"
        aud = tp.get("audience") or ""
        seconds = tp.get("expirationSeconds") or DEFAULT_TOKEN_SECONDS
        return (sa, md.get("namespace", ""), aud, seconds, md.get("name", ""), md.get("uid", ""))

    def _requires_refresh(self, tok: _Token) -> bool:
        return self.clock() >= tok.refresh_at

    def _refresh_time(self, expires: float, seconds: int) -> float:
        jitter = random.random() * TOKEN_MAX_JITTER
        issued = expires - seconds
        at = min(issued + TOKEN_MAX_TTL - jitter, expires - seconds * 20 // 100 - jitter)
        # a clock far off the API server's must not make every token due at once, again and again
        return max(at, self.clock() + TOKEN_MAX_JITTER)

    async def _service_account_token(self, pod: Obj, tp: Obj) -> str:
        key = self._token_key(pod, tp)
        sa, namespace, aud, seconds, pod_name, pod_uid = key
        cached = self._tokens.get(key)
        if cached is not None and not self._requires_refresh(cached):
            return cached.token
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {
            "audiences": [aud] if aud else None, "expirationSeconds": seconds,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod_uid}}}
        if not aud:
            del body["spec"]["audiences"]
        try:
            tr = await self.client.create(SERVICE_ACCOUNTS, body, namespace, subresource="token", name=sa)
            status = tr.get("status") or {}
            token = status.get("token") or ""
            if not token:
                raise _SetupFailed("failed to fetch token: the TokenRequest returned no token")
            expires = parse_timestamp(str(status.get("expirationTimestamp") or ""))
            got = int((tr.get("spec") or {}).get("expirationSeconds") or seconds)
        except (StatusError, OSError, asyncio.TimeoutError, ValueError) as err:
            text = getattr(err, "message", None) or str(err)
            if cached is None:
                raise _SetupFailed(f"failed to fetch token: {text}") from None
            if self.clock() > cached.expires:
                raise _SetupFailed(f"token {sa}/{namespace} expired and refresh failed: {text}") from None
            log.error("couldn't update the token of %s/%s for pod %s: %s", namespace, sa, pod_name, text)
            cached.refresh_at = self.clock() + TOKEN_MAX_JITTER  # try again soon, not in a loop
            return cached.token
        self._tokens[key] = _Token(token, expires, got, pod_uid, self._refresh_time(expires, got))
        self._wake.set()
        return token

    # ------------------------------------------------------------- hostPath

    @staticmethod
    def _check_host_path(path: str, path_type: str | None) -> str:
        bad = _validate_no_backsteps(path)
        if bad:
            raise _SetupFailed(f"invalid HostPath `{path}`: {bad}")
        t = path_type or ""
        if t == "":
            return path

        def st() -> os.stat_result | None:
            try:
                return os.stat(path)
            except FileNotFoundError:
                return None
            except OSError as err:
                raise _SetupFailed(str(err)) from None

        s = st()
        if t == "DirectoryOrCreate":
            if s is None:
                try:
                    os.makedirs(path, mode=0o755, exist_ok=True)
                except OSError as err:
                    raise _SetupFailed(str(err)) from None
                return path
            t = "Directory"
        if t == "FileOrCreate":
            if s is None:
                try:
                    os.close(os.open(path, os.O_CREAT | os.O_RDONLY, 0o644))
                except OSError as err:
                    raise _SetupFailed(f"open {path}: {os.strerror(err.errno or 0).lower()}") from None
                return path
            t = "File"
        checks = {
            "Directory": (stat.S_ISDIR, "is not a directory"),
            "File": (stat.S_ISREG, "is not a file"),
            "Socket": (stat.S_ISSOCK, "is not a socket file"),
            "CharDevice": (stat.S_ISCHR, "is not a character device"),
            "BlockDevice": (stat.S_ISBLK, "is not a block device"),
        }
        if t not in checks:
            raise _SetupFailed(f"{t} is an invalid volume type")
        test, words = checks[t]
        if s is None or not test(s.st_mode):
            raise _SetupFailed(f"hostPath type check failed: {path} {words}")
        return path

    # ------------------------------------------------------------------ PVC

    async def _setup_claim(self, pod: Obj, uid: str, vol: Obj, kind: str) -> _Ready:
        name = vol["name"]
        ns = pod["metadata"].get("namespace", "")
        if kind == "ephemeral":
            claim_name, read_only = f"{pod['metadata'].get('name', '')}-{name}", False
        else:
            src = vol["persistentVolumeClaim"] or {}
            claim_name, read_only = src.get("claimName") or "", bool(src.get("readOnly"))
        mounted = any(m.get("name") == name for c in _all_containers(pod) for m in c.get("volumeMounts") or [])

        def fail(text: str) -> _PopulateFailed:
            return _PopulateFailed(f"Unable to attach or mount volumes: unmounted volumes=[{name}], "
                                   f"unattached volumes=[{name}]: error processing PVC {ns}/{claim_name}: {text}")

        try:
            pvc = await self.client.get(PVCS, claim_name, ns)
        except StatusError as err:
            raise fail(f"failed to fetch PVC from API server: {err.message}") from None
        md = pvc.get("metadata") or {}
        if md.get("deletionTimestamp") and "kubernetes.io/pvc-protection" not in (md.get("finalizers") or []):
            raise fail("PVC is being deleted")
        if (pvc.get("status") or {}).get("phase") != "Bound":
            raise fail("PVC is not bound")
        pv_name = (pvc.get("spec") or {}).get("volumeName") or ""
        if not pv_name:
            raise fail("PVC has empty pvc.Spec.VolumeName")
        if kind == "ephemeral":
            owners = [o for o in md.get("ownerReferences") or [] if o.get("controller")]
            if not owners or owners[0].get("uid") != uid:
                raise _PopulateFailed(f"PVC {ns}/{claim_name} was not created for pod {_pod_key(pod)} "
                                      f"(pod is not owner)")
        try:
            pv = await self.client.get(PVS, pv_name)
        except StatusError as err:
            raise fail(f"failed to fetch PV {pv_name} from API server: {err.message}") from None
        spec = pv.get("spec") or {}
        ref = spec.get("claimRef")
        if not ref:
            raise fail(f"found PV object {pv_name} but it has a nil pv.Spec.ClaimRef indicating it is not yet "
                       f"bound to the claim")
        if (ref.get("uid") or "") != (md.get("uid") or ""):
            raise fail(f"found PV object {pv_name} but its pv.Spec.ClaimRef.UID {ref.get('uid') or ''} does not "
                       f"point to claim.UID {md.get('uid') or ''}")
        mode = spec.get("volumeMode") or "Filesystem"
        if mounted and mode != "Filesystem":
            raise _PopulateFailed(f"volume {name} has volumeMode {mode}, but is specified in volumeMounts")
        if spec.get("hostPath") is not None:
            hp = spec["hostPath"]
            return _Ready("hostPath", self._check_host_path(hp.get("path") or "", hp.get("type")), read_only)
        if spec.get("local") is not None:
            path = spec["local"].get("path") or ""
            if not os.path.exists(path):
                raise _SetupFailed(f'path "{path}" does not exist')
            if not read_only:
                set_volume_ownership(path, _fs_group(pod), False, _fs_group_policy(pod))
            return _Ready("local", path, read_only)
        csi = spec.get("csi")
        if csi is not None and csi.get("driver") in self.local_drivers:
            handle = csi.get("volumeHandle") or pv_name
            if _validate_no_backsteps(handle) or "/" in handle:
                raise _SetupFailed(f"invalid volume handle {handle!r}")
            path = os.path.join(self.local_volumes_dir, handle)
            fresh = not os.path.isdir(path)
            os.makedirs(path, mode=0o777, exist_ok=True)
            if fresh:
                os.chmod(path, 0o777)
            if not (read_only or csi.get("readOnly")):
                set_volume_ownership(path, _fs_group(pod), False, _fs_group_policy(pod))
            return _Ready("local", path, read_only or bool(csi.get("readOnly")))
        source = next((k for k in spec if k not in (
            "capacity", "accessModes", "claimRef", "persistentVolumeReclaimPolicy", "storageClassName",
            "mountOptions", "volumeMode", "nodeAffinity", "volumeAttributesClassName")), "unknown")
        if source == "csi":
            source = f"csi driver {csi.get('driver')}"
        raise _SetupFailed(f"PV {pv_name}: {source} volumes are not supported on this node")

    # --------------------------------------------------------------- mounts

    def mounts(self, pod: Obj, container: Obj, env: dict[str, str] | None = None) -> list[Any]:
        """The CRI mounts of ``container``'s volumeMounts (after :meth:`setup`). ``env`` is the
        container's environment for ``subPathExpr`` (by default its literal and simple downward values)."""
        uid = (pod.get("metadata") or {}).get("uid") or ""
        state = self._pods.get(uid)
        cname = container.get("name") or ""
        out = []
        for i, m in enumerate(container.get("volumeMounts") or []):
            vname = m.get("name") or ""
            vol = state.volumes.get(vname) if state is not None else None
            if vol is None:
                raise VolumeError("CreateContainerConfigError",
                                  f'cannot find volume "{vname}" to mount into container "{cname}"')
            sub = m.get("subPath") or ""
            if m.get("subPathExpr"):
                values = env if env is not None else _simple_env(pod, container)
                missing: set[str] = set()

                def lookup(k: str) -> str:
                    v = values.get(k)
                    if not v:
                        missing.add(k)
                    return v or ""

                sub = expand(m["subPathExpr"], lookup)
                if missing:
                    raise VolumeError("CreateContainerConfigError", f"missing value for {', '.join(sorted(missing))}")
            host = vol.path
            if sub:
                if sub.startswith("/"):
                    raise VolumeError("CreateContainerConfigError",
                                      f"error SubPath `{sub}` must not be an absolute path")
                if _validate_no_backsteps(sub):
                    raise VolumeError("CreateContainerConfigError",
                                      f"unable to provision SubPath `{sub}`: must not contain '..'")
                host = self._prepare_subpath(uid, vname, cname, i, vol.path, sub)
            try:
                propagation = _translate_propagation(m.get("mountPropagation"))
            except ValueError as err:
                raise VolumeError("CreateContainerConfigError", str(err)) from None
            read_only = bool(m.get("readOnly")) or vol.read_only
            rro = m.get("recursiveReadOnly")
            if rro not in (None, "", "Disabled"):
                if not m.get("readOnly"):
                    raise VolumeError("CreateContainerConfigError", f'volume "{vname}" requested recursive '
                                                                    f"read-only mode, but it is not read-only")
                if m.get("mountPropagation") not in (None, "None"):
                    raise VolumeError("CreateContainerConfigError",
                                      f'volume "{vname}" requested recursive read-only mode, but it is not '
                                      f'compatible with propagation "{m.get("mountPropagation")}"')
                if rro == "Enabled":
                    # containerd 1.6 announces no recursive read-only support
                    raise VolumeError("CreateContainerConfigError", f'volume "{vname}" requested recursive '
                                                                    f"read-only mode, but it is not supported by "
                                                                    f"the runtime")
                if rro != "IfPossible":
                    raise VolumeError("CreateContainerConfigError", f'unknown recursive read-only mode "{rro}"')
            path = m.get("mountPath") or ""
            if not path.startswith("/"):
                path = "/" + path
            out.append(pb.Mount(container_path=path, host_path=host, readonly=read_only, propagation=propagation))
        return out

    def _prepare_subpath(self, uid: str, volume: str, container: str, index: int, volume_path: str, sub: str) -> str:
        """Upstream's SafeMakeDir + PrepareSafeSubpath: a bind mount of the resolved path inside the volume."""
        err_create = VolumeError("CreateContainerConfigError", f'failed to create subPath directory for volumeMount '
                                                               f'"{volume}" of container "{container}"')
        err_prepare = VolumeError("CreateContainerConfigError", f'failed to prepare subPath for volumeMount '
                                                                f'"{volume}" of container "{container}"')
        full = os.path.join(volume_path, sub)
        if not os.path.lexists(full):
            try:
                _safe_make_dir(volume_path, sub, stat.S_IMODE(os.stat(volume_path).st_mode))
            except OSError as err:
                log.error("creating subPath %s in %s: %s", sub, volume_path, err)
                raise err_create from None
        target = os.path.join(self.pod_dir(uid), "volume-subpaths", volume, container, str(index))
        try:
            real_volume = os.path.realpath(volume_path)
            real = os.path.realpath(full)
            if real != real_volume and not real.startswith(real_volume.rstrip("/") + "/"):
                raise OSError(errno.EPERM, f"subpath {real!r} not within volume path {real_volume!r}")
            fd = _safe_open(real_volume, os.path.relpath(real, real_volume))
            try:
                is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
                while target in mounts_under(target):
                    unmount(target, detach=True)
                os.makedirs(os.path.dirname(target), mode=0o750, exist_ok=True)
                if is_dir:
                    os.makedirs(target, mode=0o750, exist_ok=True)
                elif not os.path.exists(target):
                    os.close(os.open(target, os.O_CREAT | os.O_RDONLY, 0o640))
                mount(f"/proc/self/fd/{fd}", target, None, MS_BIND)
            finally:
                os.close(fd)
        except OSError as err:
            log.error("preparing subPath %s of volume %s for container %s: %s", sub, volume, container, err)
            raise err_prepare from None
        return target

    # -------------------------------------------------------------- teardown

    async def teardown(self, uid: str) -> None:
        """Unmounts and removes everything of the pod under ``<pods_dir>/<uid>`` (the directory too)."""
        if not uid or "/" in uid or uid.startswith("."):
            raise ValueError(f"not a pod uid: {uid!r}")
        state = self._pods.pop(uid, None)
        if state is not None:
            namespace = (state.pod.get("metadata") or {}).get("namespace", "")
            if not any((p.pod.get("metadata") or {}).get("namespace", "") == namespace for p in self._pods.values()):
                for key in [k for k in self._immutable if k[1] == namespace]:
                    del self._immutable[key]
        for key in [k for k, t in self._tokens.items() if t.pod_uid == uid]:
            del self._tokens[key]
        lock = state.lock if state is not None else asyncio.Lock()
        async with lock:
            pod_dir = self.pod_dir(uid)
            for _ in range(8):  # mounts stacked on one path come off one by one
                points = mounts_under(pod_dir)
                if not points:
                    break
                for point in points:
                    try:
                        unmount(point)
                    except OSError as err:
                        if err.errno != errno.EBUSY:
                            raise
                        unmount(point, detach=True)
            _remove_tree(pod_dir)

    def _remove_volume_dir(self, directory: str) -> None:
        try:
            for point in mounts_under(directory):
                unmount(point, detach=True)
            _remove_tree(directory)
        except OSError as err:
            log.error("removing %s after a failed set-up: %s", directory, err)

    # ----------------------------------------------------------------- usage

    def volume_usage(self, uid: str) -> dict[str, int]:
        """Bytes used by each emptyDir and content volume of a set-up pod (as ``du``: allocated blocks,
        hard links once, not crossing into other mounts)."""
        state = self._pods.get(uid)
        if state is None:
            return {}
        return {name: _disk_usage(v.path) for name, v in state.volumes.items()
                if v.kind in ("emptyDir", *_CONTENT_KINDS)}

    def empty_dir_limit_exceeded(self, pod: Obj) -> str | None:
        """Upstream's eviction message when an emptyDir uses more than its ``sizeLimit``, else ``None``."""
        uid = (pod.get("metadata") or {}).get("uid") or ""
        state = self._pods.get(uid)
        if state is None:
            return None
        for vol in (pod.get("spec") or {}).get("volumes") or []:
            src = vol.get("emptyDir")
            ready = state.volumes.get(vol.get("name") or "")
            if src is None or ready is None or src.get("sizeLimit") in (None, ""):
                continue
            limit = parse_quantity(src["sizeLimit"])
            if limit > 0 and _disk_usage(ready.path) > limit:
                shown = canonical_quantity(str(src["sizeLimit"]))
                return f'Usage of EmptyDir volume "{vol["name"]}" exceeds the limit "{shown}". '
        return None

    # ---------------------------------------------------------------- resync

    async def refresh(self, uid: str | None = None) -> None:
        """Brings the contents (configMap, secret, downwardAPI, projected) of one or every known pod up to
        date now; failures are logged (the next pod sync reports them)."""
        uids = [uid] if uid is not None else list(self._pods)
        token = _PASS.set({})  # every source read once in this pass, for all the pods using it
        try:
            await self._refresh(uids)
        finally:
            _PASS.reset(token)

    async def _refresh(self, uids: list[str]) -> None:
        for u in uids:
            state = self._pods.get(u)
            if state is None:
                continue
            try:
                async with state.lock:
                    if self._pods.get(u) is state:
                        await self._setup_locked(state, only_content=True)
            except VolumeError as err:
                log.warning("refreshing the volumes of pod %s: %s", _pod_key(state.pod), err.message)
            except Exception:  # a resync must never die
                log.exception("refreshing the volumes of pod %s", _pod_key(state.pod))

    def _ensure_resync(self) -> None:
        if self._resync_task is None or self._resync_task.done():
            self._resync_task = asyncio.get_running_loop().create_task(self._resync_loop(), name="volume-resync")

    async def _resync_loop(self) -> None:
        next_full = time.monotonic() + self.resync_seconds
        while True:
            self._wake.clear()
            now_wall = self.clock()
            due = [t.refresh_at for t in self._tokens.values()]
            delay = next_full - time.monotonic()
            if due:
                delay = min(delay, min(due) - now_wall)
            if delay > 0:
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=delay)
                    continue  # a new token: compute the next wake-up again
                except asyncio.TimeoutError:
                    pass
            if time.monotonic() >= next_full:
                next_full = time.monotonic() + self.resync_seconds
                await self.refresh()
            else:
                now_wall = self.clock()
                pods = {t.pod_uid for t in self._tokens.values() if t.refresh_at <= now_wall}
                for u in pods:
                    await self.refresh(u)
                now_wall = self.clock()
                for t in self._tokens.values():
                    if t.refresh_at <= now_wall:  # not renewed (the volume went away): not before a while
                        t.refresh_at = now_wall + TOKEN_MAX_JITTER
                await asyncio.sleep(0)

    async def close(self) -> None:
        """Stops the resync loop (mounts stay: the pods keep running)."""
        task, self._resync_task = self._resync_task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass


#: the sources one resync pass has read (key -> object or StatusError)
_PASS: contextvars.ContextVar[dict | None] = contextvars.ContextVar("volume_resync_pass", default=None)


class _PopulateFailed(Exception):
    """The volume could not even be looked up (upstream's populator errors, e.g. an unbound claim)."""


def _simple_env(pod: Obj, container: Obj) -> dict[str, str]:
    """A container's variables that need no API lookup: literal values and pod fields."""
    status = pod.get("status") or {}
    pod_ips = [a.get("ip") for a in status.get("podIPs") or [] if a.get("ip")] or \
        ([status["podIP"]] if status.get("podIP") else [])
    host_ips = [a.get("ip") for a in status.get("hostIPs") or [] if a.get("ip")] or \
        ([status["hostIP"]] if status.get("hostIP") else [])
    out: dict[str, str] = {}
    for e in container.get("env") or []:
        name = e.get("name") or ""
        if "value" in e and e.get("valueFrom") is None:
            out[name] = expand(str(e.get("value") or ""), lambda k: out.get(k))
            continue
        ref = (e.get("valueFrom") or {}).get("fieldRef")
        if ref:
            try:
                out[name] = pod_field_value(pod, ref.get("fieldPath") or "", pod_ips, host_ips)
            except ValueError:
                pass
    return out


def _disk_usage(path: str) -> int:
    try:
        top = os.lstat(path)
    except OSError:
        return 0
    seen: set[tuple[int, int]] = set()
    total = top.st_blocks * 512
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if st.st_dev != top.st_dev or (st.st_nlink > 1 and (st.st_dev, st.st_ino) in seen):
                continue
            if st.st_nlink > 1:
                seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
        dirs[:] = [d for d in dirs if os.lstat(os.path.join(root, d)).st_dev == top.st_dev]
    return total


def _safe_open(base: str, rel: str) -> int:
    """An O_PATH descriptor of ``base/rel`` reached without following any symlink."""
    fd = os.open(base, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY)
    try:
        if rel in ("", "."):
            return fd
        for part in rel.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                raise OSError(errno.EPERM, "subpath may not go up")
            nfd = os.open(part, os.O_PATH | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nfd
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                raise OSError(errno.ELOOP, f"{part} is a symlink")
        return fd
    except BaseException:
        os.close(fd)
        raise


def _safe_make_dir(base: str, rel: str, perm: int) -> None:
    """Creates the directories of ``rel`` under ``base`` one by one, never through a symlink."""
    fd = os.open(base, os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY)
    try:
        for part in rel.split("/"):
            if part in ("", "."):
                continue
            created = False
            try:
                os.mkdir(part, perm, dir_fd=fd)
                created = True
            except FileExistsError:
                pass
            nfd = os.open(part, os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
            if created:
                os.fchmod(fd, perm)  # not narrowed by the umask
    finally:
        os.close(fd)


__all__ = ["AtomicWriter", "FileProjection", "VolumeError", "VolumeManager", "extract_field_path", "find_container",
           "format_map", "pod_field_value",
           "is_shared", "make_rshared", "mounts_under", "resource_field_value", "set_volume_ownership",
           "unmount", "validate_path"]
