"""Container log rotation, as upstream's kubelet container log manager does it.

The runtime writes each container's output to the log file the kubelet
named (``<pod log dir>/<container>/<restart>.log``). Every
``monitor_interval`` the manager looks at the log of every running
container; one that has reached ``max_size`` is rotated:

1. rotated files beyond what ``max_files`` allows go, the oldest first (the
   current log and the newest rotated one count among the ``max_files``);
2. every rotated file but the one about to be made is gzip-compressed
   (``<log>.<timestamp>.gz``, through a ``.tmp`` file, so a crash leaves no
   half-written archive under the final name);
3. the log is renamed ``<log>.<YYYYMMDD-HHMMSS>`` and the runtime is told to
   reopen it (CRI ReopenContainerLog), so new output goes to a new file under
   the old name; if the runtime refuses, the rename is undone.

So a chatty container holds at most about ``max_files * max_size`` of disk.
``kubectl logs`` reads the current file; one that follows it moves on to the
new file when the old one is rotated away (see the kubelet server).
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import os
import shutil
import time
from typing import Any, Callable, Iterable

from kubeplane.node.cri.client import CRIClient, CRIError, pb

log = logging.getLogger(__name__)

#: upstream's KubeletConfiguration defaults
DEFAULT_MAX_SIZE = 10 * 1024 * 1024
DEFAULT_MAX_FILES = 5
DEFAULT_MONITOR_INTERVAL = 10.0
COMPRESS_SUFFIX = ".gz"
TMP_SUFFIX = ".tmp"
TIMESTAMP_FORMAT = "%Y%m%d-%H%M%S"


def rotated_logs(path: str) -> list[str]:
    """The rotated files of log ``path``, oldest first (their names sort by time)."""
    d, base = os.path.split(path)
    try:
        names = os.listdir(d or ".")
    except OSError:
        return []
    prefix = base + "."

    return [os.path.join(d, n) for n in sorted(
        (n for n in names if n.startswith(prefix) and not n.endswith(TMP_SUFFIX)),
        key=lambda n: _rotation_order(base, n))]


def _rotation_order(base: str, name: str) -> tuple[str, int]:
    """``<base>.<stamp>[.<n>][.gz]`` → (stamp, n): n counts rotations within one second."""
    rest = name[len(base) + 1:].removesuffix(COMPRESS_SUFFIX)
    stamp, _, n = rest.partition(".")
    return stamp, int(n) if n.isdigit() else 0


def _compress(path: str) -> None:
    tmp = path + COMPRESS_SUFFIX + TMP_SUFFIX
    with open(path, "rb") as src, gzip.open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    os.replace(tmp, path + COMPRESS_SUFFIX)
    os.unlink(path)


def _remove_stale_tmp(path: str) -> None:
    d, base = os.path.split(path)
    try:
        names = os.listdir(d or ".")
    except OSError:
        return
    for n in names:
        if n.startswith(base + ".") and n.endswith(TMP_SUFFIX):
            try:
                os.unlink(os.path.join(d, n))
            except OSError:
                pass


class ContainerLogManager:
    """Rotates the logs of the running containers of one runtime."""

    def __init__(self, cri: CRIClient, *, max_size: int = DEFAULT_MAX_SIZE, max_files: int = DEFAULT_MAX_FILES,
                 monitor_interval: float = DEFAULT_MONITOR_INTERVAL,
                 clock: Callable[[], float] = time.time) -> None:
        if max_files < 2:
            raise ValueError("container log max files must be at least 2")
        if max_size <= 0:
            raise ValueError("container log max size must be positive")
        self.cri = cri
        self.max_size = max_size
        self.max_files = max_files
        self.monitor_interval = monitor_interval
        self.clock = clock
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        from kubeplane.runtime import every

        self._task = asyncio.create_task(every(self.monitor_interval, self.rotate_running, "rotating container logs"),
                                         name="container-log-rotation")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _running(self) -> Iterable[Any]:
        req = pb.ListContainersRequest(filter=pb.ContainerFilter(state=pb.ContainerStateValue(
            state=pb.CONTAINER_RUNNING)))
        return (await self.cri.runtime("ListContainers", req)).containers

    async def rotate_running(self) -> list[str]:
        """One round: rotate every running container's log that has grown too big;
        returns the ids of the containers whose log was rotated."""
        done = []
        for c in await self._running():
            try:
                st = (await self.cri.runtime("ContainerStatus", pb.ContainerStatusRequest(container_id=c.id))).status
            except CRIError as e:
                if not e.not_found:
                    log.info("container %s status: %s", c.id, e)
                continue
            if st.state != pb.CONTAINER_RUNNING or not st.log_path:
                continue
            try:
                if os.stat(st.log_path).st_size < self.max_size:
                    continue
            except OSError:
                continue
            try:
                if await self.rotate(c.id, st.log_path):
                    done.append(c.id)
            except OSError as err:
                log.warning("rotating the log of container %s: %s", c.id, err)
        return done

    async def rotate(self, container_id: str, path: str) -> bool:
        """Rotate log ``path`` of container ``container_id`` now."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._prepare, path)
        stamp = time.strftime(TIMESTAMP_FORMAT, time.gmtime(self.clock()))
        base = os.path.basename(path)
        same = [_rotation_order(base, os.path.basename(p))[1] for p in rotated_logs(path)
                if _rotation_order(base, os.path.basename(p))[0] == stamp]
        # a rotation within the same second as an earlier one gets the next count
        rotated = f"{path}.{stamp}" if not same else f"{path}.{stamp}.{max(same) + 1}"
        os.rename(path, rotated)
        try:
            await self.cri.runtime("ReopenContainerLog", pb.ReopenContainerLogRequest(container_id=container_id))
        except CRIError as e:
            # the runtime still writes to the renamed file: put it back, as upstream does
            try:
                os.rename(rotated, path)
            except OSError as err:
                log.warning("restoring the log of container %s: %s", container_id, err)
            log.warning("container %s: reopening its log: %s", container_id, e)
            return False
        return True

    def _prepare(self, path: str) -> None:
        _remove_stale_tmp(path)
        old = rotated_logs(path)
        # the current log and the one about to be rotated count among max_files
        excess = len(old) - (self.max_files - 2)
        for p in old[:max(excess, 0)]:
            try:
                os.unlink(p)
            except OSError:
                pass
        for p in old[max(excess, 0):]:
            if not p.endswith(COMPRESS_SUFFIX):
                _compress(p)


__all__ = ["ContainerLogManager", "DEFAULT_MAX_FILES", "DEFAULT_MAX_SIZE", "DEFAULT_MONITOR_INTERVAL",
           "rotated_logs"]
