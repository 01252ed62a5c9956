"""Container probes (liveness, readiness, startup) and lifecycle hook handlers.

This follows upstream's kubelet (pkg/kubelet/prober, pkg/probe,
pkg/kubelet/lifecycle):

* One worker per (pod, container, probe type), started by
  :meth:`ProbeManager.add_pod` for the containers and the restartable init
  containers (sidecars) that declare the probe. A worker probes every
  ``periodSeconds``; when the agent has been up for less than one period, its
  first probe waits a random part of a period so that workers started together
  after a restart do not probe together.
* Workers read the containers they probe from the pod status the agent last
  computed (:meth:`ProbeManager.update_pod_status`, which is also what fills
  ``started`` and ``ready`` into that status, as upstream's
  ``UpdatePodStatus``). A new container id resets the result to the probe
  type's initial value: readiness Failure, liveness Success, startup Unknown.
* Liveness and readiness probes wait until the container has started (its
  startup probe succeeded); the startup probe stops probing once it succeeded.
  A result is recorded after ``failureThreshold`` failures or
  ``successThreshold`` successes in a row; a liveness failure or a startup
  result puts the worker on hold until the container is replaced.
* Every change of a result calls ``on_change(pod_uid)`` so the pod's worker
  runs again (to restart the container, or to write the new readiness).
* Probe errors (a probe that could not run) are retried three times and then
  thrown away, as upstream's prober does; they never count as a result.

The probe actions are exec (CRI ``ExecSync`` with the probe's timeout),
httpGet (to the pod IP unless ``host`` is set; HTTPS without verifying the
certificate; redirects followed only to the same host, a redirect elsewhere
is a success with a warning event), tcpSocket (a TCP connect) and grpc (the
``grpc.health.v1.Health/Check`` call).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import ssl
import time
from typing import Any, Callable, Iterable
from urllib.parse import urljoin, urlsplit

import grpc
import grpc.aio

from kubeplane.api.gofmt import format_pod, go_duration, go_quote, grpc_code_name
from kubeplane.api.meta import parse_timestamp
from kubeplane.api.nodestatus import KUBELET_VERSION
from kubeplane.api.protobuf import encode_varint, iter_fields
from kubeplane.node.cri.client import RUNTIME_REQUEST_TIMEOUT, CRIError, pb
from kubeplane.node.podstatus import container_field_path, container_should_restart, is_sidecar
from kubeplane.node.volumes import expand

log = logging.getLogger(__name__)

__all__ = [
    "ProbeManager", "HandlerError", "run_handler", "Result", "ProbeError",
    "probe_exec", "probe_http", "probe_tcp", "probe_grpc",
    "kill_grace_seconds", "LIVENESS", "READINESS", "STARTUP",
]

LIVENESS, READINESS, STARTUP = "Liveness", "Readiness", "Startup"
_SPEC_FIELD = {LIVENESS: "livenessProbe", READINESS: "readinessProbe", STARTUP: "startupProbe"}

#: a probe that errors is tried this often before its result is thrown away
MAX_PROBE_RETRIES = 3
#: exec output and HTTP bodies are read up to this many bytes
MAX_OUTPUT = 10 * 1024
#: containers started this long before the agent count as adopted, not new
RESTART_GRACE_SECONDS = 10.0
#: a lifecycle exec hook has no timeout of its own; this only bounds the gRPC call
_NO_TIMEOUT = 10 * 365 * 24 * 3600.0

# probe defaults (the API server sets them; a pod read from elsewhere may lack them)
_DEFAULTS = {"initialDelaySeconds": 0, "periodSeconds": 10, "timeoutSeconds": 1,
             "successThreshold": 1, "failureThreshold": 3}


class Result:
    """Outcome of one probe action (upstream's ``probe.Result``)."""
    SUCCESS = "success"
    WARNING = "warning"
    FAILURE = "failure"
    UNKNOWN = "unknown"


# results manager values (upstream's ``results.Result``)
SUCCESS, FAILURE, UNKNOWN = "Success", "Failure", "Unknown"


class ProbeError(Exception):
    """The probe could not be run at all (its result is Unknown)."""


class HandlerError(Exception):
    """A lifecycle hook failed; ``message`` is the event message upstream's kubelet writes."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


# ---------------------------------------------------------------- small helpers


def static_env(container: dict) -> dict[str, str]:
    """The container's env entries with a literal value (``valueFrom`` ones map to "")."""
    return {e.get("name", ""): e.get("value", "") for e in container.get("env") or []}


def resolve_port(port: Any, container: dict) -> int:
    """A probe's port: a number, or the name of one of the container's ports
    (upstream's ``ResolveContainerPort``)."""
    if isinstance(port, bool) or port is None:
        raise ProbeError(f"intOrString had no kind: {port!r}")
    if isinstance(port, int):
        value = port
    elif isinstance(port, str):
        for p in container.get("ports") or []:
            if p.get("name") == port:
                value = int(p.get("containerPort") or 0)
                break
        else:
            try:
                value = int(port)
            except ValueError:
                raise ProbeError(f'strconv.Atoi: parsing {go_quote(port)}: invalid syntax') from None
    else:
        raise ProbeError(f"intOrString had no kind: {port!r}")
    if 0 < value < 65536:
        return value
    raise ProbeError(f"invalid port number: {value}")


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def canonical_header(name: str) -> str:
    """Go's ``CanonicalMIMEHeaderKey`` (``content-type`` → ``Content-Type``)."""
    if not name or any(c in name for c in " \t\r\n:"):
        return name
    return "-".join(part[:1].upper() + part[1:].lower() for part in name.split("-"))


def strip_runtime(container_id: str) -> str:
    """``containerd://abc`` → ``abc`` (the id the CRI knows)."""
    return container_id.split("://", 1)[1] if "://" in container_id else container_id


#: the Kubernetes major.minor of this kubelet (``1.32`` of ``v1.32.0-kubeplane``)
KUBE_MINOR_VERSION = ".".join(KUBELET_VERSION.lstrip("v").split(".")[:2])


def user_agent(purpose: str) -> str:
    """``kube-probe/1.32`` or ``kube-lifecycle/1.32``, as upstream's kubelet sends."""
    return f"kube-{purpose}/{KUBE_MINOR_VERSION}"


# ---------------------------------------------------------------- probe actions


async def probe_exec(cri, container_id: str, command: list[str], timeout: float) -> tuple[str, str]:
    """Run ``command`` in the container through CRI ``ExecSync``.

    Exit code 0 is success, any other a failure (with the output); a command
    that outlives ``timeout`` is a failure ``command timed out``. A runtime
    that cannot run it raises :class:`ProbeError`."""
    # the CRI's timeout is whole seconds, and 0 would mean none at all
    req = pb.ExecSyncRequest(container_id=strip_runtime(container_id), cmd=command,
                             timeout=max(int(timeout), 1))
    call_timeout = (cri.timeout if hasattr(cri, "timeout") else RUNTIME_REQUEST_TIMEOUT) + timeout
    try:
        resp = await cri.runtime("ExecSync", req, timeout=call_timeout)
    except CRIError as e:
        if e.code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return Result.FAILURE, "command timed out"
        raise ProbeError(str(e)) from None
    output = (resp.stdout + resp.stderr)[:MAX_OUTPUT].decode("utf-8", "replace")
    if resp.exit_code == 0:
        return Result.SUCCESS, output
    return Result.FAILURE, output


def _http_error_text(e: BaseException, host: str, port: int) -> str:
    """Go's wording of a failed dial or request, as far as Python tells the cause."""
    addr = join_host_port(host, port)
    if isinstance(e, (asyncio.TimeoutError, TimeoutError)):
        return "context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
    if type(e).__name__ == "ServerDisconnectedError":
        return "EOF"  # the server closed the connection without an answer
    inner = getattr(e, "os_error", None) or e.__cause__ or e
    if isinstance(inner, ConnectionRefusedError):
        return f"dial tcp {addr}: connect: connection refused"
    if isinstance(inner, OSError) and inner.strerror:
        return f"dial tcp {addr}: connect: {inner.strerror.lower()}"
    return str(e) or type(e).__name__


class HTTPProber:
    """The httpGet probe's client: no keep-alive, no proxy, no compression,
    certificates not verified (upstream's probe transport)."""

    def __init__(self, *, follow_non_local_redirects: bool = False, purpose: str = "probe"):
        self.follow_non_local_redirects = follow_non_local_redirects
        self.purpose = purpose
        self._session = None

    def _get_session(self):
        if self._session is None or self._session.closed:
            import aiohttp
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=ctx, force_close=True, limit=0),
                auto_decompress=False, trust_env=False,
                skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def request_for(self, http_get: dict, container: dict, pod_ip: str) -> tuple[str, dict[str, str]]:
        """The URL and headers of an httpGet action (upstream's
        ``NewRequestForHTTPGetAction``); a bad port raises :class:`ProbeError`."""
        scheme = (http_get.get("scheme") or "http").lower()
        host = http_get.get("host") or pod_ip
        if not host:
            raise ProbeError("the pod has no IP to probe")
        port = resolve_port(http_get.get("port"), container)
        path = http_get.get("path") or ""
        if path and not path.startswith("/"):
            path = "/" + path
        url = f"{scheme}://{join_host_port(host, port)}{path or '/'}"
        headers: dict[str, str] = {}
        for h in http_get.get("httpHeaders") or []:
            key = canonical_header(h.get("name", ""))
            # Go's Header.Add keeps every value; a request sends them joined
            headers[key] = f"{headers[key]}, {h.get('value', '')}" if key in headers else h.get("value", "")
        if "User-Agent" not in headers:
            headers["User-Agent"] = user_agent(self.purpose)
        if "Accept" not in headers:
            headers["Accept"] = "*/*"
        elif headers["Accept"] == "":
            del headers["Accept"]
        return url, headers

    async def get(self, url: str, headers: dict[str, str], timeout: float) -> tuple[int, bytes, str]:
        """GET ``url`` following redirects as the probe's redirect checker allows.

        Returns (status, body up to 10 KiB, final URL); connection errors and
        the timeout raise."""
        import aiohttp
        session = self._get_session()
        first_host = urlsplit(url).hostname
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        via = 0
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise asyncio.TimeoutError()
            async with session.get(url, headers=headers, allow_redirects=False,
                                   timeout=aiohttp.ClientTimeout(total=remaining)) as resp:
                location = resp.headers.get("Location")
                if resp.status in (301, 302, 303, 307, 308) and location:
                    target = urljoin(url, location)
                    if (not self.follow_non_local_redirects
                            and urlsplit(target).hostname != first_host):
                        return resp.status, await _read_at_most(resp, MAX_OUTPUT), url
                    via += 1
                    if via >= 10:
                        raise ProbeError("stopped after 10 redirects")
                    url = target
                    continue
                return resp.status, await _read_at_most(resp, MAX_OUTPUT), url


async def _read_at_most(resp, limit: int) -> bytes:
    """Up to ``limit`` bytes of the body (a longer body is cut, as upstream's probe reads it)."""
    chunks: list[bytes] = []
    total = 0
    while total < limit:
        chunk = await resp.content.read(limit - total)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


async def probe_http(prober: HTTPProber, url: str, headers: dict[str, str], timeout: float) -> tuple[str, str]:
    """upstream's ``DoHTTPProbe``: 200-299 success, 300-399 success with a
    warning, otherwise failure."""
    parts = urlsplit(url)
    try:
        status, body, final = await prober.get(url, headers, timeout)
    except ProbeError as e:
        return Result.FAILURE, f'Get {go_quote(url)}: {e}'
    except Exception as e:  # every transport error is a failed probe
        text = _http_error_text(e, parts.hostname or "", parts.port or 0)
        return Result.FAILURE, f"Get {go_quote(url)}: {text}"
    text = body.decode("utf-8", "replace")
    if 200 <= status < 400:
        if status >= 300:
            return Result.WARNING, f"Probe terminated redirects, Response body: {text}"
        return Result.SUCCESS, text
    return Result.FAILURE, f"HTTP probe failed with statuscode: {status}"


async def probe_tcp(host: str, port: int, timeout: float) -> tuple[str, str]:
    """Success when a TCP connection to host:port opens within ``timeout``."""
    addr = join_host_port(host, port)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (asyncio.TimeoutError, TimeoutError):
        return Result.FAILURE, f"dial tcp {addr}: i/o timeout"
    except OSError as e:
        reason = "connection refused" if isinstance(e, ConnectionRefusedError) else (e.strerror or str(e)).lower()
        return Result.FAILURE, f"dial tcp {addr}: connect: {reason}"
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass
    return Result.SUCCESS, ""


# grpc.health.v1: HealthCheckRequest{string service = 1},
# HealthCheckResponse{ServingStatus status = 1}
_SERVING_STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def encode_health_request(service: str) -> bytes:
    data = service.encode()
    return encode_varint(1 << 3 | 2) + encode_varint(len(data)) + data if data else b""


def decode_health_response(buf: bytes) -> int:
    """The ``status`` field of a HealthCheckResponse (unknown fields skipped)."""
    status = 0
    for number, wire, value in iter_fields(buf):
        if number == 1 and wire == 0:
            status = int(value)
    return status


def decode_health_request(buf: bytes) -> str:
    """The ``service`` of a HealthCheckRequest (for servers in tests and tools)."""
    service = ""
    for number, wire, value in iter_fields(buf):
        if number == 1 and wire == 2:
            service = bytes(value).decode()
    return service


def encode_health_response(status: int) -> bytes:
    return encode_varint(1 << 3) + encode_varint(status) if status else b""


async def probe_grpc(host: str, service: str, port: int, timeout: float) -> tuple[str, str]:
    """``grpc.health.v1.Health/Check`` without TLS, as upstream's gRPC probe."""
    addr = join_host_port(host, port)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    channel = grpc.aio.insecure_channel(addr, options=[("grpc.primary_user_agent", user_agent("probe")),
                                                       ("grpc.enable_http_proxy", 0)])
    try:
        try:
            await asyncio.wait_for(channel.channel_ready(), timeout)
        except (asyncio.TimeoutError, TimeoutError):
            return (Result.FAILURE, f"timeout: failed to connect service {go_quote(addr)} within "
                                    f"{go_duration(timeout)}: context deadline exceeded")
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=encode_health_request,
                                    response_deserializer=decode_health_response)
        try:
            status = await check(service, timeout=max(deadline - loop.time(), 0.001))
        except grpc.aio.AioRpcError as e:
            code = e.code()
            if code == grpc.StatusCode.UNIMPLEMENTED:
                return (Result.FAILURE, "error: this server does not implement the grpc health protocol "
                                        f"(grpc.health.v1.Health): {e.details()}")
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return Result.FAILURE, f"timeout: health rpc did not complete within {go_duration(timeout)}"
            return (Result.FAILURE, f"error: health rpc probe failed: rpc error: code = "
                                    f"{grpc_code_name(code.name)} desc = {e.details()}")
        if status != 1:
            name = _SERVING_STATUS.get(status, str(status))
            return Result.FAILURE, f"service unhealthy (responded with {go_quote(name)})"
        return Result.SUCCESS, "service healthy"
    finally:
        await channel.close()


# ---------------------------------------------------------------- results


class ResultsCache:
    """Results by container id; a changed result calls ``on_update(cid, result, pod_uid)``
    (upstream's results.Manager and its Updates channel)."""

    def __init__(self, on_update: Callable[[str, str, str], None]):
        self._cache: dict[str, str] = {}
        self._on_update = on_update

    def get(self, cid: str) -> str | None:
        return self._cache.get(cid)

    def set(self, cid: str, result: str, pod_uid: str) -> None:
        if self._cache.get(cid) != result:
            self._cache[cid] = result
            self._on_update(cid, result, pod_uid)

    def remove(self, cid: str) -> None:
        self._cache.pop(cid, None)

    def __len__(self) -> int:
        return len(self._cache)


def _parse_time(text: str | None) -> float | None:
    try:
        return parse_timestamp(text) if text else None
    except ValueError:
        return None


def _find_status(statuses: Iterable[dict] | None, name: str) -> dict | None:
    for s in statuses or []:
        if s.get("name") == name:
            return s
    return None


def kill_grace_seconds(pod: dict, container: dict, reason: str | None = None) -> int:
    """The grace period of killing ``container``: the pod's deletion grace, else
    for a container failing its liveness/startup probe (``reason``
    ``"LivenessProbe"``/``"StartupProbe"``) the probe's
    terminationGracePeriodSeconds when set, else the pod's (upstream's
    ``setTerminationGracePeriod``)."""
    md, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if md.get("deletionGracePeriodSeconds") is not None:
        return int(md["deletionGracePeriodSeconds"])
    if spec.get("terminationGracePeriodSeconds") is not None:
        field = {"LivenessProbe": "livenessProbe", "StartupProbe": "startupProbe"}.get(reason or "")
        if field:
            probe = container.get(field) or {}
            if probe.get("terminationGracePeriodSeconds") is not None:
                return int(probe["terminationGracePeriodSeconds"])
        return int(spec["terminationGracePeriodSeconds"])
    return 2


# ---------------------------------------------------------------- workers


class _Known:
    """A container the manager has seen: whose it is, when it started, and
    what the API said of it (for a container adopted after an agent restart)."""

    __slots__ = ("uid", "name", "started_at", "api_started", "api_ready", "pod_ready")

    def __init__(self, uid: str, name: str):
        self.uid, self.name = uid, name
        self.started_at: float | None = None
        self.api_started = self.api_ready = self.pod_ready = False

    def adopted(self, agent_start: float) -> bool:
        """Running since before the agent started (upstream: 10 s of grace)."""
        return self.started_at is not None and self.started_at < agent_start - RESTART_GRACE_SECONDS


class _Worker:
    """Probes one container of one pod for one probe type (upstream's worker.go)."""

    def __init__(self, manager: "ProbeManager", kind: str, pod: dict, container: dict):
        self.m = manager
        self.kind = kind
        self.pod = pod
        self.container = container
        self.spec = {**_DEFAULTS, **(container.get(_SPEC_FIELD[kind]) or {})}
        self.results = manager._results[kind]
        self.initial = {READINESS: FAILURE, LIVENESS: SUCCESS, STARTUP: UNKNOWN}[kind]
        self.container_id = ""
        self.last_result: str | None = None
        self.result_run = 0
        self.on_hold = False
        self.stopped = False
        self._wake = asyncio.Event()
        self._manual = False
        self.task: asyncio.Task | None = None
        self.is_init = any(c.get("name") == container.get("name")
                           for c in (pod.get("spec") or {}).get("initContainers") or [])

    @property
    def uid(self) -> str:
        return (self.pod.get("metadata") or {}).get("uid", "")

    @property
    def period(self) -> float:
        return max(float(self.spec.get("periodSeconds") or 10), 0.001)

    def stop(self) -> None:
        self.stopped = True
        self._wake.set()

    def trigger(self) -> None:
        self._manual = True
        self._wake.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        period = self.period
        try:
            # jitter the first probe of workers created right after the agent started
            if period > self.m._now() - self.m.start:
                await self._sleep(self.m._rand() * period)
            next_tick = loop.time() + period
            while not self.stopped:
                if not await self._do_probe_safe():
                    break
                while not self.stopped:
                    remaining = next_tick - loop.time()
                    if remaining > 0 and not self._wake.is_set() and not self._manual:
                        try:
                            await asyncio.wait_for(self._wake.wait(), remaining)
                        except (asyncio.TimeoutError, TimeoutError):
                            pass
                    self._wake.clear()
                    now = loop.time()
                    if self._manual:
                        self._manual = False
                        next_tick = now + period
                        break
                    if now >= next_tick:
                        while next_tick <= now:
                            next_tick += period
                        break
        finally:
            if self.container_id:
                self.results.remove(self.container_id)
                if not self.stopped:  # ended on its own: the container is done for good
                    self.m._ended[(self.uid, self.container.get("name", ""), self.kind)] = self.container_id
            self.m._remove_worker(self)

    async def _sleep(self, seconds: float) -> None:
        """Sleep, cut short only by stop (a manual trigger stays pending for after the first probe)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while not self.stopped:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            try:
                await asyncio.wait_for(self._wake.wait(), remaining)
            except (asyncio.TimeoutError, TimeoutError):
                return
            self._wake.clear()

    async def _do_probe_safe(self) -> bool:
        try:
            return await self.do_probe()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s probe of %s/%s failed unexpectedly", self.kind, self.uid,
                          self.container.get("name"))
            return True

    async def do_probe(self) -> bool:
        """One probe step; False ends the worker (upstream's ``doProbe``)."""
        status = self.m._statuses.get(self.uid)
        if status is None:
            return True  # no status yet
        if status.get("phase") in ("Failed", "Succeeded"):
            return False
        name = self.container.get("name")
        c = _find_status(status.get("containerStatuses"), name)
        if not c or not c.get("containerID"):
            c = _find_status(status.get("initContainerStatuses"), name)
            if not c or not c.get("containerID"):
                return True  # the container is not there yet
        state = c.get("state") or {}
        running = state.get("running")
        sidecar = self.is_init and is_sidecar(self.container)

        cid = strip_runtime(c["containerID"])
        if cid != self.container_id:
            if self.container_id:
                self.results.remove(self.container_id)
            self.container_id = cid
            known = self.m._learn(self.uid, name, c)
            adopted = known.adopted(self.m.start)
            if sidecar and self.kind == STARTUP and c.get("started"):
                self.results.set(cid, SUCCESS, self.uid)
            if not adopted:
                self.results.set(cid, self.initial, self.uid)
            self.on_hold = False

        if self.on_hold:
            return True

        if running is None:
            self.results.set(cid, FAILURE, self.uid)
            terminated = state.get("terminated")
            if terminated is None:
                return True
            return container_should_restart(self.container, self.pod.get("spec") or {},
                                            int(terminated.get("exitCode") or 0))

        if (self.pod.get("metadata") or {}).get("deletionTimestamp") and self.kind in (LIVENESS, STARTUP):
            self.results.set(cid, SUCCESS, self.uid)
            return False

        started_at = _parse_time(running.get("startedAt"))
        if started_at is not None and int(self.m._now() - started_at) < int(self.spec.get("initialDelaySeconds") or 0):
            return True

        started = self.m.started(cid)
        if started:
            if self.kind == STARTUP:
                return True
        elif self.kind != STARTUP:
            return True

        try:
            result = await self.m._probe(self.kind, self.pod, status, self.container, cid, self.spec)
        except ProbeError:
            return True  # the probe errored: its result is thrown away
        if self.stopped or cid != self.container_id:
            return True

        if self.last_result == result:
            self.result_run += 1
        else:
            self.last_result, self.result_run = result, 1
        if ((result == FAILURE and self.result_run < int(self.spec.get("failureThreshold") or 3))
                or (result == SUCCESS and self.result_run < int(self.spec.get("successThreshold") or 1))):
            return True
        self.results.set(cid, result, self.uid)
        if (self.kind == LIVENESS and result == FAILURE) or self.kind == STARTUP:
            # stop probing until the container is replaced
            self.on_hold = True
            self.result_run = 0
        return True


# ---------------------------------------------------------------- the manager


class ProbeManager:
    """Probe workers of the node's pods and their results.

    ``cri`` is the node's :class:`~kubeplane.node.cri.client.CRIClient`
    (exec probes and hooks); ``on_change(pod_uid)`` is called (it may be a
    coroutine function) whenever a probe result of one of the pod's containers
    changes; ``recorder`` (an :class:`~kubeplane.client.events.EventRecorder`)
    receives the Unhealthy / ProbeWarning events. ``now`` and ``rand`` are the
    wall clock and the jitter source."""

    def __init__(self, cri, on_change: Callable[[str], Any] | None = None, *, recorder=None,
                 now: Callable[[], float] = time.time, rand: Callable[[], float] = random.random):
        self.cri = cri
        self.on_change = on_change
        self.recorder = recorder
        self._now = now
        self._rand = rand
        self.start = now()
        self._workers: dict[tuple[str, str, str], _Worker] = {}
        #: (uid, container, kind) -> the container a worker ended with (not restarted for it)
        self._ended: dict[tuple[str, str, str], str] = {}
        self._statuses: dict[str, dict] = {}
        #: what the manager knows of each container, by the CRI's (bare) container id
        self._known: dict[str, _Known] = {}
        self._results = {kind: ResultsCache(self._updated) for kind in (LIVENESS, READINESS, STARTUP)}
        self._http = HTTPProber()
        self._hook_http = HTTPProber(purpose="lifecycle")
        self._callbacks: set[asyncio.Task] = set()

    # -- pods

    def add_pod(self, pod: dict) -> None:
        """Start the probe workers of the pod's containers and sidecars (again
        for a pod seen before: existing workers are kept, their pod refreshed)."""
        uid = (pod.get("metadata") or {}).get("uid", "")
        spec = pod.get("spec") or {}
        self._learn_pod(pod, pod.get("status") or {}, from_api=True)
        containers = list(spec.get("containers") or []) + [
            c for c in spec.get("initContainers") or [] if is_sidecar(c)]
        for c in containers:
            for kind in (STARTUP, READINESS, LIVENESS):
                if not c.get(_SPEC_FIELD[kind]):
                    continue
                key = (uid, c.get("name", ""), kind)
                w = self._workers.get(key)
                if w is not None:
                    w.pod = pod
                    continue
                ended = self._ended.get(key)
                if ended is not None:
                    if ended == self._container_id(uid, c.get("name", "")):
                        continue  # its worker ended with this very container: nothing to probe
                    del self._ended[key]
                w = _Worker(self, kind, pod, c)
                self._workers[key] = w
                w.task = asyncio.get_running_loop().create_task(
                    w.run(), name=f"probe-{kind.lower()}-{uid}-{c.get('name')}")

    def stop_liveness_and_startup(self, pod: dict) -> None:
        """Stop the liveness and startup workers (a terminating pod keeps its readiness probes)."""
        uid = (pod.get("metadata") or {}).get("uid", "")
        for (u, _, kind), w in list(self._workers.items()):
            if u == uid and kind in (LIVENESS, STARTUP):
                w.stop()

    def remove_pod(self, pod_or_uid: dict | str) -> None:
        """Stop every worker of the pod and forget its status."""
        uid = pod_or_uid if isinstance(pod_or_uid, str) else (pod_or_uid.get("metadata") or {}).get("uid", "")
        for (u, _, _), w in list(self._workers.items()):
            if u == uid:
                w.stop()
        self._statuses.pop(uid, None)
        for cid, k in list(self._known.items()):
            if k.uid == uid:
                del self._known[cid]
        for key in [k for k in self._ended if k[0] == uid]:
            del self._ended[key]

    def _container_id(self, uid: str, name: str) -> str:
        status = self._statuses.get(uid) or {}
        for field in ("containerStatuses", "initContainerStatuses"):
            c = _find_status(status.get(field), name)
            if c and c.get("containerID"):
                return strip_runtime(c["containerID"])
        return ""

    async def close(self) -> None:
        """Stop all workers and wait for them; close the HTTP client."""
        workers = list(self._workers.values())
        for w in workers:
            w.stop()
            if w.task is not None:
                w.task.cancel()
        tasks = [w.task for w in workers if w.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for t in list(self._callbacks):
            t.cancel()
        await self._http.close()
        await self._hook_http.close()

    def worker_count(self) -> int:
        return len(self._workers)

    def _remove_worker(self, w: _Worker) -> None:
        key = (w.uid, w.container.get("name", ""), w.kind)
        if self._workers.get(key) is w:
            del self._workers[key]

    # -- status

    def update_pod_status(self, pod: dict, status: dict) -> dict:
        """Record ``status`` as the pod's current status for the workers and
        set ``started`` and ``ready`` of its container statuses in place
        (upstream's ``UpdatePodStatus``); returns ``status``. It never calls
        ``on_change``.

        ``ready`` and ``started`` give the same answers by container id, for
        a runtime that derives the conditions before handing the status here."""
        uid = (pod.get("metadata") or {}).get("uid", "")
        self._statuses[uid] = status
        for w in self._workers.values():
            if w.uid == uid:
                w.pod = pod
        self._learn_pod(pod, status)
        spec = pod.get("spec") or {}
        inits = {c.get("name"): c for c in spec.get("initContainers") or []}
        for cs in status.get("containerStatuses") or []:
            running = bool((cs.get("state") or {}).get("running"))
            cid = cs.get("containerID") or ""
            cs["started"] = running and bool(cid) and self.started(cid)
            cs["ready"] = cs["started"] and self.ready(cid)
        for cs in status.get("initContainerStatuses") or []:
            c = inits.get(cs.get("name"))
            running = bool((cs.get("state") or {}).get("running"))
            cid = cs.get("containerID") or ""
            cs["started"] = running and bool(cid) and self.started(cid)
            if c is None:
                continue
            if not is_sidecar(c):
                term = (cs.get("state") or {}).get("terminated")
                cs["ready"] = bool(term is not None and int(term.get("exitCode") or 0) == 0)
                continue
            cs["ready"] = cs["started"] and self.ready(cid)
        return status

    def _learn_pod(self, pod: dict, status: dict, *, from_api: bool = False) -> None:
        uid = (pod.get("metadata") or {}).get("uid", "")
        pod_ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in (pod.get("status") or {}).get("conditions") or [])
        for cs in list(status.get("containerStatuses") or []) + list(status.get("initContainerStatuses") or []):
            if cs.get("containerID") and (cs.get("state") or {}).get("running"):
                self._learn(uid, cs.get("name", ""), cs, pod_ready=pod_ready, from_api=from_api)

    def _learn(self, uid: str, name: str, cs: dict, *, pod_ready: bool | None = None,
               from_api: bool = False) -> "_Known":
        """Remember container ``cs`` of pod ``uid``; the ids it had before are forgotten."""
        cid = strip_runtime(cs.get("containerID") or "")
        k = self._known.get(cid)
        if k is None or (k.uid, k.name) != (uid, name):
            for old, other in list(self._known.items()):
                if (other.uid, other.name) == (uid, name) and old != cid:
                    del self._known[old]
            k = self._known[cid] = _Known(uid, name)
        started_at = _parse_time(((cs.get("state") or {}).get("running") or {}).get("startedAt"))
        if started_at is not None:
            k.started_at = started_at
        if from_api:
            # what the API said before this agent started: kept across an agent restart
            k.api_started = bool(cs.get("started"))
            k.api_ready = bool(cs.get("ready"))
            if pod_ready is not None:
                k.pod_ready = pod_ready
        return k

    # -- results by container id (the runtime's own "containerd://" ids or the CRI's bare ones)

    def started(self, container_id: str) -> bool:
        """Whether the (running) container has started: its startup probe
        succeeded, or it has none. A container this manager has not seen yet
        (in :meth:`add_pod`'s pod status, :meth:`update_pod_status`) has not."""
        cid = strip_runtime(container_id)
        result = self._results[STARTUP].get(cid)
        if result is not None:
            return result == SUCCESS
        k = self._known.get(cid)
        if k is None:
            return False
        if k.api_started and k.adopted(self.start):
            return True  # running since before the agent started, and the API said so
        return (k.uid, k.name, STARTUP) not in self._workers

    def ready(self, container_id: str) -> bool:
        """Whether the (running, started) container is ready: its readiness
        probe last succeeded, or it has none. A container not seen yet is not.
        Asking about an unready container with a readiness probe runs the probe
        soon, as upstream's UpdatePodStatus does."""
        cid = strip_runtime(container_id)
        k = self._known.get(cid)
        if k is None:
            return False
        result = self._results[READINESS].get(cid)
        if result == SUCCESS:
            return True
        w = self._workers.get((k.uid, k.name, READINESS))
        ready = w is None
        if w is not None:
            w.trigger()
        if k.adopted(self.start):
            # after an agent restart a container keeps its readiness until probed again
            if not ready and result is None:
                ready = True
            if w is not None and not k.pod_ready:
                ready = False
        return ready

    def liveness_failed(self, container_id: str) -> bool:
        """The container failed its liveness probe: kill and restart it."""
        return self._results[LIVENESS].get(strip_runtime(container_id)) == FAILURE

    def startup_failed(self, container_id: str) -> bool:
        """The container failed its startup probe: kill and restart it."""
        return self._results[STARTUP].get(strip_runtime(container_id)) == FAILURE

    def kill_reason(self, container_name: str, container_id: str, *, init: bool = False) -> tuple[str, str] | None:
        """(reason, message) when a probe wants the container killed, as
        upstream's computePodActions words it; None otherwise. ``reason`` is
        ``LivenessProbe`` or ``StartupProbe`` (see :func:`kill_grace_seconds`)."""
        prefix = "Init container" if init else "Container"
        if self.liveness_failed(container_id):
            return "LivenessProbe", f"{prefix} {container_name} failed liveness probe"
        if self.startup_failed(container_id):
            return "StartupProbe", f"{prefix} {container_name} failed startup probe"
        return None

    def result(self, kind: str, container_id: str) -> str | None:
        """The raw result (Success / Failure / Unknown) of one probe type, None when absent."""
        return self._results[kind].get(strip_runtime(container_id))

    def _updated(self, cid: str, result: str, pod_uid: str) -> None:
        if self.on_change is None:
            return
        try:
            ret = self.on_change(pod_uid)
        except Exception:
            log.exception("probe result callback failed for pod %s", pod_uid)
            return
        if inspect.isawaitable(ret):
            task = asyncio.ensure_future(ret)
            self._callbacks.add(task)
            task.add_done_callback(self._callbacks.discard)

    # -- lifecycle hooks

    async def run_handler(self, pod: dict, container: dict, container_id: str, handler: dict, *,
                          pod_ip: str | None = None) -> None:
        """Run a postStart / preStop handler of ``container`` (see :func:`run_handler`);
        raises :class:`HandlerError` when it fails."""
        await run_handler(self.cri, pod, container, container_id, handler, pod_ip=pod_ip,
                          recorder=self.recorder, http=self._hook_http)

    # -- running one probe

    def _event(self, pod: dict, type_: str, reason: str, message: str, container: str) -> None:
        """An event about the container ``container`` of ``pod``."""
        if self.recorder is not None:
            try:
                self.recorder.event(pod, type_, reason, message, field_path=container_field_path(pod, container))
            except Exception:
                log.exception("recording a probe event failed")

    async def _probe(self, kind: str, pod: dict, status: dict, container: dict, cid: str, spec: dict) -> str:
        """Run the probe (retrying errors); Success or Failure, or ProbeError."""
        error: ProbeError | None = None
        for _ in range(MAX_PROBE_RETRIES):
            try:
                result, output = await self.run_probe(spec, pod, status, container, cid)
                break
            except ProbeError as e:
                error = e
        else:
            self._event(pod, "Warning", "Unhealthy",
                        f"{kind} probe errored and resulted in unknown state: {error}", container.get("name", ""))
            raise error  # type: ignore[misc]
        if result == Result.SUCCESS:
            return SUCCESS
        if result == Result.WARNING:
            self._event(pod, "Warning", "ProbeWarning", f"{kind} probe warning: {output}", container.get("name", ""))
            return SUCCESS
        if result == Result.FAILURE:
            self._event(pod, "Warning", "Unhealthy", f"{kind} probe failed: {output}", container.get("name", ""))
        return FAILURE

    async def run_probe(self, spec: dict, pod: dict, status: dict, container: dict, cid: str) -> tuple[str, str]:
        """One probe action of ``spec`` against the container: (Result, output)."""
        timeout = float(spec.get("timeoutSeconds") or 1)
        pod_ip = status.get("podIP") or ""
        if spec.get("exec"):
            command = [expand(a, static_env(container).get) for a in spec["exec"].get("command") or []]
            return await probe_exec(self.cri, cid, command, timeout)
        if spec.get("httpGet"):
            url, headers = self._http.request_for(spec["httpGet"], container, pod_ip)
            return await probe_http(self._http, url, headers, timeout)
        if spec.get("tcpSocket"):
            port = resolve_port(spec["tcpSocket"].get("port"), container)
            host = spec["tcpSocket"].get("host") or pod_ip
            if not host:
                raise ProbeError("the pod has no IP to probe")
            return await probe_tcp(host, port, timeout)
        if spec.get("grpc"):
            if not pod_ip:
                raise ProbeError("the pod has no IP to probe")
            g = spec["grpc"]
            return await probe_grpc(pod_ip, g.get("service") or "", int(g.get("port") or 0), timeout)
        raise ProbeError(f"missing probe handler for {format_pod(pod)}:{container.get('name')}")


# ---------------------------------------------------------------- lifecycle hooks


async def _pod_ip_of(cri, container_id: str) -> str:
    """The pod IP of the sandbox a container runs in, from the CRI."""
    listed = await cri.runtime("ListContainers", pb.ListContainersRequest(
        filter=pb.ContainerFilter(id=strip_runtime(container_id))))
    if not listed.containers:
        raise HandlerError("unable to get pod, event handlers may be invalid: container not found")
    sandbox = listed.containers[0].pod_sandbox_id
    st = await cri.runtime("PodSandboxStatus", pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox))
    ip = st.status.network.ip if st.status.network else ""
    if not ip:
        raise HandlerError("failed to find networking container")
    return ip


def _is_http_response_to_https(e: BaseException) -> bool:
    """A TLS handshake that met a plain HTTP server (Go: "server gave HTTP
    response to HTTPS client")."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, ssl.SSLError):
            reason = (getattr(e, "reason", "") or "").upper()
            if reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "HTTP_REQUEST",
                          "PACKET_LENGTH_TOO_LONG", "UNKNOWN_PROTOCOL"):
                return True
        e = getattr(e, "os_error", None) or e.__cause__ or e.__context__
    return False


async def run_handler(cri, pod: dict, container: dict, container_id: str, handler: dict, *,
                      pod_ip: str | None = None, recorder=None, http: HTTPProber | None = None) -> None:
    """Run a postStart or preStop handler (upstream's lifecycle handlerRunner).

    exec: the command in the container (no timeout of its own: the caller
    bounds preStop by the grace period); httpGet: a GET to the pod IP (or
    ``host``; without ``pod_ip`` it is read from the container's sandbox),
    redirects followed on the same host only, HTTPS not verified and retried
    as HTTP when the server speaks plain HTTP; the response code is not
    checked, as upstream; sleep: waits ``seconds``.
    tcpSocket is accepted by the API only for compatibility and fails here,
    as it does in upstream's kubelet. A failure raises :class:`HandlerError`
    with the message upstream's kubelet puts in its FailedPostStartHook /
    FailedPreStopHook event."""
    name = container.get("name", "")
    if handler.get("exec") is not None:
        command = list(handler["exec"].get("command") or [])
        req = pb.ExecSyncRequest(container_id=strip_runtime(container_id), cmd=command, timeout=0)
        try:
            resp = await cri.runtime("ExecSync", req, timeout=_NO_TIMEOUT)
        except CRIError as e:
            err, output = str(e), ""
        else:
            if resp.exit_code == 0:
                return
            output = (resp.stdout + resp.stderr).decode("utf-8", "replace")
            err = (f"command '{' '.join(command)}' exited with {resp.exit_code}: "
                   f"{resp.stderr.decode('utf-8', 'replace')}")
        raise HandlerError(
            f"Exec lifecycle hook ([{' '.join(command)}]) for Container {go_quote(name)} in Pod "
            f"{go_quote(format_pod(pod))} failed - error: {err}, message: {go_quote(output)}")
    if handler.get("httpGet") is not None:
        http_get = handler["httpGet"]
        path = http_get.get("path", "")
        try:
            await _run_http_handler(cri, pod, container, container_id, http_get, pod_ip, recorder, http)
        except HandlerError as e:
            raise HandlerError(f"HTTP lifecycle hook ({path}) for Container {go_quote(name)} in Pod "
                               f"{go_quote(format_pod(pod))} failed - error: {e.message}") from None
        return
    if handler.get("sleep") is not None:
        seconds = int(handler["sleep"].get("seconds") or 0)
        await asyncio.sleep(seconds)
        return
    kinds = ", ".join(sorted(handler)) or "none"
    raise HandlerError(f"Cannot run handler: invalid handler: {kinds} is not a supported lifecycle handler")


async def _run_http_handler(cri, pod, container, container_id, http_get, pod_ip, recorder, http):
    own = http is None
    client = http or HTTPProber(purpose="lifecycle")
    try:
        host = http_get.get("host") or pod_ip or await _pod_ip_of(cri, container_id)
        try:
            url, headers = client.request_for({**http_get, "host": host}, container, host)
        except ProbeError as e:
            raise HandlerError(str(e)) from None
        # no timeout of its own, as upstream's hook client; the caller bounds preStop
        try:
            await client.get(url, headers, _NO_TIMEOUT)
            return
        except Exception as e:
            if not (url.startswith("https://") and _is_http_response_to_https(e)):
                parts = urlsplit(url)
                raise HandlerError(f"Get {go_quote(url)}: "
                                   f"{_http_error_text(e, parts.hostname or '', parts.port or 0)}") from None
        plain = "http://" + url[len("https://"):]
        headers = {k: v for k, v in headers.items() if k != "Authorization"}
        try:
            await client.get(plain, headers, _NO_TIMEOUT)
        except Exception as e:
            raise HandlerError(f"Get {go_quote(url)}: http: server gave HTTP response to HTTPS client") from e
        if recorder is not None:
            recorder.event(pod, "Warning", "LifecycleHTTPFallback",
                           f"request to HTTPS lifecycle hook {urlsplit(url).netloc} got HTTP response, "
                           "retry with HTTP succeeded")
    finally:
        if own:
            await client.close()
