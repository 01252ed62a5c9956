"""A raw HTTP/1.1 client for tests that check the framing of responses."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass
class RawResponse:
    status: int
    reason: str
    headers: dict[str, str]
    body: bytes
    chunks: list[bytes] = field(default_factory=list)


class FramingError(AssertionError):
    pass


async def read_response(reader: asyncio.StreamReader, timeout: float = 10.0) -> RawResponse:
    """Reads exactly one response, checking its framing strictly."""
    line = await asyncio.wait_for(reader.readline(), timeout)
    if not line.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")):
        raise FramingError(f"not a status line: {line!r}")
    _, code, *reason = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
    headers: dict[str, str] = {}
    while True:
        h = await asyncio.wait_for(reader.readline(), timeout)
        if h in (b"\r\n", b""):
            break
        name, _, value = h.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    chunks: list[bytes] = []
    if headers.get("transfer-encoding") == "chunked":
        while True:
            size_line = await asyncio.wait_for(reader.readline(), timeout)
            try:
                size = int(size_line.strip(), 16)
            except ValueError:
                raise FramingError(f"bad chunk size line {size_line!r} after {chunks!r}") from None
            if size == 0:
                if await asyncio.wait_for(reader.readline(), timeout) != b"\r\n":
                    raise FramingError("last chunk not followed by CRLF")
                break
            data = await asyncio.wait_for(reader.readexactly(size + 2), timeout)
            if not data.endswith(b"\r\n"):
                raise FramingError("chunk not followed by CRLF")
            chunks.append(data[:-2])
        body = b"".join(chunks)
    elif "content-length" in headers:
        body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), timeout)
    else:
        body = await asyncio.wait_for(reader.read(), timeout)
    return RawResponse(int(code), reason[0] if reason else "", headers, body, chunks)


async def closed_within(reader: asyncio.StreamReader, timeout: float) -> bytes:
    """Reads until the server closes the connection; fails after ``timeout``."""
    return await asyncio.wait_for(reader.read(), timeout)


def request(method: str, path: str, host: str, headers: dict[str, str] | None = None,
            body: bytes | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    for k, v in (headers or {}).items():
        lines.append(f"{k}: {v}")
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")
