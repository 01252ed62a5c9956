"""The channel protocols of exec, attach and port-forward.

Over a WebSocket (``v5.channel.k8s.io``, ``v4.channel.k8s.io``) each binary
message is one byte of channel and the data: 0 stdin, 1 stdout, 2 stderr,
3 the error channel (a ``Status`` in JSON that ends the command, with its
exit code), 4 terminal resize (``{"Width": w, "Height": h}``). ``v5`` adds
the message ``[255, channel]`` closing a channel (stdin EOF). Over SPDY the
same streams are separate SPDY streams named by their ``streamType`` header.
Port-forward over SPDY opens an ``error`` and a ``data`` stream per
connection with headers ``port`` and ``requestID``; kubectl tunnels that
SPDY session through a WebSocket of subprotocol ``SPDY/3.1+portforward.k8s.io``.
"""

from __future__ import annotations

import json
from typing import Any

V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"
V3 = "v3.channel.k8s.io"
V2 = "v2.channel.k8s.io"
V1 = "channel.k8s.io"
#: the WebSocket protocols the exec and attach endpoints serve, best first
REMOTE_COMMAND_WEBSOCKET = (V5, V4)
PORT_FORWARD_SPDY = "portforward.k8s.io"
TUNNELING_PREFIX = "SPDY/3.1+"
PORT_FORWARD_TUNNEL = TUNNELING_PREFIX + PORT_FORWARD_SPDY

STDIN, STDOUT, STDERR, ERROR, RESIZE = 0, 1, 2, 3, 4
CLOSE = 255

STREAM_TYPE = "streamType"
STREAM_NAMES = {STDIN: "stdin", STDOUT: "stdout", STDERR: "stderr", ERROR: "error", RESIZE: "resize"}

NON_ZERO_EXIT_CODE = "NonZeroExitCode"
EXIT_CODE_CAUSE = "ExitCode"


def success_status() -> dict[str, Any]:
    return {"metadata": {}, "status": "Success"}


def exit_status(code: int) -> dict[str, Any]:
    """The error-channel Status of a command that exited with ``code`` (non-zero)."""
    return {"metadata": {}, "status": "Failure",
            "message": f"command terminated with non-zero exit code: exit status {code}",
            "reason": NON_ZERO_EXIT_CODE,
            "details": {"causes": [{"reason": EXIT_CODE_CAUSE, "message": str(code)}]}}


def exit_code_of(status: dict[str, Any]) -> int | None:
    """The exit code an error-channel Status carries (0 on success, None if unknown)."""
    if status.get("status") == "Success":
        return 0
    if status.get("reason") == NON_ZERO_EXIT_CODE:
        for cause in (status.get("details") or {}).get("causes") or []:
            if cause.get("reason") == EXIT_CODE_CAUSE:
                try:
                    return int(cause.get("message", ""))
                except ValueError:
                    return None
    return None


def encode_resize(width: int, height: int) -> bytes:
    return json.dumps({"Width": width, "Height": height}).encode()
