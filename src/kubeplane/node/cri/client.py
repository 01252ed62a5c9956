"""An asyncio client of a CRI v1 runtime (containerd's CRI plugin, CRI-O).

Every call has a deadline (the kubelet's ``--runtime-request-timeout``, two
minutes, and longer for image pulls), and a failed call raises
:class:`CRIError` carrying the gRPC status code and the runtime's message,
so the caller can tell NotFound from a runtime that is down.
"""

from __future__ import annotations

import grpc
import grpc.aio

from kubeplane.node.cri import api_pb2 as pb
from kubeplane.node.cri import api_pb2_grpc as pb_grpc

__all__ = ["CRIClient", "CRIError", "pb"]

#: upstream kubelet's --runtime-request-timeout default
RUNTIME_REQUEST_TIMEOUT = 120.0
#: image pulls are not bounded by the request timeout in the kubelet; a pull that
#: makes no progress is cancelled after --image-pull-progress-deadline (1 min)
#: of silence, which a unary call cannot see, so a generous overall deadline
IMAGE_PULL_TIMEOUT = 30 * 60.0
#: gRPC messages from the runtime can be large (ListContainers on a busy node)
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class CRIError(Exception):
    """A CRI call failed: ``code`` is the gRPC status code."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str):
        super().__init__(f"{method}: {details or code.name}")
        self.method = method
        self.code = code
        self.details = details

    @property
    def not_found(self) -> bool:
        return self.code == grpc.StatusCode.NOT_FOUND

    @property
    def unavailable(self) -> bool:
        return self.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def endpoint_target(endpoint: str) -> str:
    """A gRPC target for a CRI endpoint: ``unix:///run/x.sock`` or a bare socket path."""
    if endpoint.startswith("unix://"):
        return "unix://" + endpoint[len("unix://"):]
    if endpoint.startswith("/"):
        return "unix://" + endpoint
    return endpoint


class CRIClient:
    """RuntimeService and ImageService of one CRI endpoint over one channel."""

    def __init__(self, endpoint: str, *, timeout: float = RUNTIME_REQUEST_TIMEOUT):
        self.endpoint = endpoint
        self.timeout = timeout
        self._channel = grpc.aio.insecure_channel(
            endpoint_target(endpoint),
            options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                     ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)])
        self._runtime = pb_grpc.RuntimeServiceStub(self._channel)
        self._image = pb_grpc.ImageServiceStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "CRIClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def runtime(self, method: str, request, *, timeout: float | None = None):
        """Call ``RuntimeService.<method>`` with ``request``."""
        return await self._call(self._runtime, method, request, timeout)

    async def image(self, method: str, request, *, timeout: float | None = None):
        """Call ``ImageService.<method>`` with ``request``."""
        if timeout is None and method == "PullImage":
            timeout = IMAGE_PULL_TIMEOUT
        return await self._call(self._image, method, request, timeout)

    async def _call(self, stub, method: str, request, timeout: float | None):
        try:
            return await getattr(stub, method)(request, timeout=timeout or self.timeout)
        except grpc.aio.AioRpcError as e:
            raise CRIError(method, e.code(), e.details() or "") from None

    async def version(self) -> pb.VersionResponse:
        return await self.runtime("Version", pb.VersionRequest(version="v1"))
