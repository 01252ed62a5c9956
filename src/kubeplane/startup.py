"""What a server process needs before it serves: a private, locked data
directory, a listening socket (with an error an operator can read), and a
kubeconfig that exists exactly while the server it names is usable."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket

log = logging.getLogger("kubeplane")

LOCK_FILE = "kubeplane.lock"


class StartupError(RuntimeError):
    """The process cannot start; the message is one line for the operator."""


def prepare_data_dir(path: str) -> None:
    """Create ``path`` (and missing parents) readable by this user only (0700)."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise StartupError(f"cannot create data directory {path}: {exc.strerror or exc}") from None
    if not os.path.isdir(path):
        raise StartupError(f"data directory {path} is not a directory")


class DataDirLock:
    """An exclusive ``flock`` on ``<data dir>/kubeplane.lock``, held while the
    process lives (the kernel drops it when the process dies, however it dies).
    The file records the holder's pid for the message a second process gets."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.path = os.path.join(data_dir, LOCK_FILE)
        self._fd: int | None = None

    def acquire(self) -> None:
        prepare_data_dir(self.data_dir)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StartupError(f"cannot open lock file {self.path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                who = f" (pid {holder})" if holder else ""
                raise StartupError(f"data directory {self.data_dir} is in use by another kubeplane process{who}; "
                                   "stop it or choose another --data-dir") from None
            raise StartupError(f"cannot lock {self.path}: {exc.strerror or exc}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            # The file stays: removing it would let a third process lock a new
            # file while a second one still waits on the old one.
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None


def _read_pid(fd: int) -> int | None:
    try:
        raw = os.pread(fd, 32, 0).decode().strip()
        return int(raw) if raw else None
    except (OSError, ValueError):
        return None


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_socket(host: str, port: int, backlog: int = 1024) -> socket.socket:
    """A non-blocking listening TCP socket; a failure is one line, worded as Go's net.Listen."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise StartupError(listen_error(host, port, exc)) from None
    sock.setblocking(False)
    return sock


def listen_error(host: str, port: int, exc: OSError) -> str:
    if isinstance(exc, socket.gaierror):
        return f"listen tcp {format_address(host, port)}: lookup {host}: {exc.strerror}"
    reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
    op = "bind" if exc.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL) else "listen"
    return f"listen tcp {format_address(host, port)}: {op}: {reason}"


class KubeconfigFile:
    """A kubeconfig written atomically once the server is ready and removed on
    exit, but only while it is still the file this process wrote (another
    process may have replaced it since)."""

    def __init__(self, path: str, *, durable: bool = True) -> None:
        self.path = path
        #: synced to disk before it replaces the old file
        self.durable = durable
        self._identity: tuple[int, int] | None = None

    def remove_stale(self) -> None:
        """Drop a kubeconfig a previous kubeplane left behind (a process that
        was killed cannot remove its own): until this server is ready, nothing
        should look ready at this path. Files kubeplane did not write stay."""
        from kubeplane.client.kubeconfig import is_kubeplane_kubeconfig

        try:
            if is_kubeplane_kubeconfig(self.path):
                os.unlink(self.path)
                log.info("removed the stale kubeconfig %s", self.path)
        except OSError:
            pass

    def publish(self, server_url: str, **credentials) -> None:
        """Write it (``credentials``: as :func:`~kubeplane.client.kubeconfig.write_kubeconfig` takes them)."""
        from kubeplane.client.kubeconfig import write_kubeconfig

        write_kubeconfig(self.path, server_url, durable=self.durable, **credentials)
        st = os.stat(self.path)
        self._identity = (st.st_dev, st.st_ino)

    def withdraw(self) -> None:
        ident, self._identity = self._identity, None
        if ident is None:
            return
        try:
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) == ident:
                os.unlink(self.path)
        except OSError:
            pass


__all__ = ["DataDirLock", "KubeconfigFile", "LOCK_FILE", "StartupError", "bind_socket", "format_address",
           "listen_error", "prepare_data_dir"]
