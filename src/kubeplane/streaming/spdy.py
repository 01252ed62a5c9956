"""SPDY/3.1 as Kubernetes streaming uses it.

Frames (draft-mbelshe-httpbis-spdy-00, version 3): control frames
``SYN_STREAM``, ``SYN_REPLY``, ``RST_STREAM``, ``SETTINGS``, ``PING``,
``GOAWAY``, ``HEADERS``, ``WINDOW_UPDATE`` and data frames. Header blocks are
zlib-compressed with the protocol's dictionary, one compression context per
direction for the whole session, each block ending in a sync flush.

:class:`Session` runs streams over any byte transport (a TCP connection
after an HTTP ``Upgrade: SPDY/3.1``, or the binary messages of a WebSocket
that tunnels SPDY, as kubectl's port-forward does). A client opens odd
stream ids, a server even ones.

Flow control is done as the peers Kubernetes uses do it (moby/spdystream,
in kubectl, client-go and the runtimes' streaming servers): they neither
send ``WINDOW_UPDATE`` nor honour one, so windows cannot hold them back (and
waiting for their window updates would stall a stream for good). Instead a
stream buffers at most about :data:`STREAM_HIGH_WATER` bytes its consumer has
not read: a data frame that takes it above that mark makes :meth:`Session.feed`
wait until the consumer has read it down to :data:`STREAM_LOW_WATER`, so the
owner stops reading the transport and the transport's own flow control (TCP,
the WebSocket's) holds the peer back, as spdystream's blocking frame queues
do. Outgoing data waits for the transport (``send`` is awaited). No
``WINDOW_UPDATE`` is sent and the ones received are ignored.
"""

from __future__ import annotations

import asyncio
import collections
import struct
import zlib
from dataclasses import dataclass, field
from typing import Awaitable, Callable

VERSION = 3

SYN_STREAM = 1
SYN_REPLY = 2
RST_STREAM = 3
SETTINGS = 4
PING = 6
GOAWAY = 7
HEADERS = 8
WINDOW_UPDATE = 9

FLAG_FIN = 0x01
FLAG_UNIDIRECTIONAL = 0x02

# RST_STREAM status codes
PROTOCOL_ERROR = 1
INVALID_STREAM = 2
REFUSED_STREAM = 3
CANCEL = 5
INTERNAL_ERROR = 6

#: the largest payload one frame carries (24-bit length)
MAX_DATA = (1 << 24) - 1
#: the largest data frame this codec writes
WRITE_CHUNK = 32 * 1024
#: unread bytes of one stream above which the session stops taking frames ...
STREAM_HIGH_WATER = 128 * 1024
#: ... until its consumer has read it down to this
STREAM_LOW_WATER = 32 * 1024


def _dictionary() -> bytes:
    """The header compression dictionary of SPDY/3: length-prefixed header
    names and values, then common status lines, dates and media types."""
    words = (
        "options head post put delete trace accept accept-charset accept-encoding accept-language "
        "accept-ranges age allow authorization cache-control connection content-base content-encoding "
        "content-language content-length content-location content-md5 content-range content-type date "
        "etag expect expires from host if-match if-modified-since if-none-match if-range "
        "if-unmodified-since last-modified location max-forwards pragma proxy-authenticate "
        "proxy-authorization range referer retry-after server te trailer transfer-encoding upgrade "
        "user-agent vary via warning www-authenticate method get status"
    ).split() + ["200 OK", "version", "HTTP/1.1", "url", "public", "set-cookie", "keep-alive", "origin"]
    out = bytearray()
    for w in words:
        out += struct.pack(">I", len(w)) + w.encode()
    codes = ("100 101 201 202 205 206 300 302 303 304 305 306 307 402 405 406 407 408 409 410 411 412 413 "
             "414 415 416 417 502 504 505").split()
    out += "".join(codes).encode()
    out += (b"203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request"
            b"401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented"
            b"503 Service Unavailable")
    out += b"Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT"
    out += (b"chunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,"
            b"text/plain,text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8"
            b"charset=iso-8859-1,utf-,*,enq=0.")
    return bytes(out)


DICTIONARY = _dictionary()


class ProtocolError(Exception):
    """The peer sent bytes that are not SPDY/3."""


Headers = dict[str, list[str]]


def _header(headers: Headers, name: str) -> str:
    values = headers.get(name.lower())
    return values[0] if values else ""


@dataclass
class Frame:
    type: int  # 0 for a data frame, else the control frame type
    flags: int = 0
    stream_id: int = 0
    headers: Headers = field(default_factory=dict)
    data: bytes = b""
    #: RST_STREAM / GOAWAY status, PING id, WINDOW_UPDATE delta, SYN_STREAM associated id
    value: int = 0
    priority: int = 0

    @property
    def fin(self) -> bool:
        return bool(self.flags & FLAG_FIN)


class Framer:
    """Encodes and decodes the frames of one session (both compression contexts)."""

    def __init__(self) -> None:
        self._compress = zlib.compressobj(9, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY, DICTIONARY)
        self._decompress = zlib.decompressobj(15, DICTIONARY)
        self._buf = bytearray()

    # -- writing ---------------------------------------------------------

    def _block(self, headers: Headers) -> bytes:
        raw = bytearray(struct.pack(">I", len(headers)))
        for name, values in headers.items():
            n = name.lower().encode()
            v = "\0".join(values).encode()
            raw += struct.pack(">I", len(n)) + n + struct.pack(">I", len(v)) + v
        return self._compress.compress(bytes(raw)) + self._compress.flush(zlib.Z_SYNC_FLUSH)

    @staticmethod
    def _control(ftype: int, flags: int, payload: bytes) -> bytes:
        if len(payload) > MAX_DATA:
            raise ValueError("control frame too large")
        return struct.pack(">HHI", 0x8000 | VERSION, ftype, (flags << 24) | len(payload)) + payload

    def syn_stream(self, stream_id: int, headers: Headers, *, fin: bool = False, priority: int = 0) -> bytes:
        payload = struct.pack(">IIBB", stream_id, 0, (priority & 7) << 5, 0) + self._block(headers)
        return self._control(SYN_STREAM, FLAG_FIN if fin else 0, payload)

    def syn_reply(self, stream_id: int, headers: Headers, *, fin: bool = False) -> bytes:
        return self._control(SYN_REPLY, FLAG_FIN if fin else 0, struct.pack(">I", stream_id) + self._block(headers))

    def headers(self, stream_id: int, headers: Headers, *, fin: bool = False) -> bytes:
        return self._control(HEADERS, FLAG_FIN if fin else 0, struct.pack(">I", stream_id) + self._block(headers))

    def rst_stream(self, stream_id: int, status: int) -> bytes:
        return self._control(RST_STREAM, 0, struct.pack(">II", stream_id, status))

    def ping(self, ping_id: int) -> bytes:
        return self._control(PING, 0, struct.pack(">I", ping_id))

    def goaway(self, last_stream_id: int, status: int = 0) -> bytes:
        return self._control(GOAWAY, 0, struct.pack(">II", last_stream_id, status))

    def window_update(self, stream_id: int, delta: int) -> bytes:
        return self._control(WINDOW_UPDATE, 0, struct.pack(">II", stream_id, delta))

    def settings(self, entries: dict[int, int]) -> bytes:
        payload = struct.pack(">I", len(entries)) + b"".join(
            struct.pack(">II", key & 0xFFFFFF, value) for key, value in entries.items())
        return self._control(SETTINGS, 0, payload)

    @staticmethod
    def data(stream_id: int, data: bytes, *, fin: bool = False) -> bytes:
        if len(data) > MAX_DATA:
            raise ValueError("data frame too large")
        return struct.pack(">II", stream_id & 0x7FFFFFFF, ((FLAG_FIN if fin else 0) << 24) | len(data)) + data

    # -- reading ---------------------------------------------------------

    def _parse_block(self, compressed: bytes) -> Headers:
        try:
            raw = self._decompress.decompress(compressed)
        except zlib.error as exc:
            raise ProtocolError(f"bad header block: {exc}") from None
        try:
            (count,) = struct.unpack_from(">I", raw, 0)
            off = 4
            out: Headers = {}
            for _ in range(count):
                (n,) = struct.unpack_from(">I", raw, off)
                name = raw[off + 4:off + 4 + n].decode("latin-1").lower()
                off += 4 + n
                (n,) = struct.unpack_from(">I", raw, off)
                value = raw[off + 4:off + 4 + n].decode("latin-1")
                off += 4 + n
                if off > len(raw):
                    raise ProtocolError("truncated header block")
                out.setdefault(name, []).extend(value.split("\0"))
            return out
        except struct.error:
            raise ProtocolError("truncated header block") from None

    def feed(self, data: bytes) -> list[Frame]:
        """The frames completed by ``data`` (bytes of a partial frame are kept)."""
        self._buf += data
        frames = []
        while len(self._buf) >= 8:
            first, second = struct.unpack_from(">II", self._buf, 0)
            length = second & 0xFFFFFF
            if len(self._buf) < 8 + length:
                break
            payload = bytes(self._buf[8:8 + length])
            del self._buf[:8 + length]
            flags = second >> 24
            if not first & 0x80000000:
                frames.append(Frame(0, flags, first & 0x7FFFFFFF, data=payload))
                continue
            version, ftype = (first >> 16) & 0x7FFF, first & 0xFFFF
            if version != VERSION:
                raise ProtocolError(f"unsupported SPDY version {version}")
            frames.append(self._control_frame(ftype, flags, payload))
        return frames

    def _control_frame(self, ftype: int, flags: int, p: bytes) -> Frame:
        try:
            if ftype == SYN_STREAM:
                sid, assoc, prio, _slot = struct.unpack_from(">IIBB", p, 0)
                return Frame(ftype, flags, sid & 0x7FFFFFFF, self._parse_block(p[10:]),
                             value=assoc & 0x7FFFFFFF, priority=prio >> 5)
            if ftype in (SYN_REPLY, HEADERS):
                (sid,) = struct.unpack_from(">I", p, 0)
                return Frame(ftype, flags, sid & 0x7FFFFFFF, self._parse_block(p[4:]))
            if ftype in (RST_STREAM, GOAWAY, WINDOW_UPDATE):
                sid, value = struct.unpack_from(">II", p, 0)
                return Frame(ftype, flags, sid & 0x7FFFFFFF, value=value & 0x7FFFFFFF)
            if ftype == PING:
                (pid,) = struct.unpack_from(">I", p, 0)
                return Frame(ftype, flags, value=pid)
        except struct.error:
            raise ProtocolError(f"truncated control frame of type {ftype}") from None
        return Frame(ftype, flags, data=p)  # SETTINGS and unknown types: kept raw, ignored


class StreamReset(Exception):
    """The peer reset the stream."""


class Stream:
    """One stream of a :class:`Session`: headers, incoming data, outgoing data."""

    def __init__(self, session: "Session", stream_id: int, headers: Headers) -> None:
        self.session = session
        self.id = stream_id
        self.headers = headers
        self._chunks: collections.deque[bytes] = collections.deque()
        #: the bytes received and not read yet
        self.buffered = 0
        self._readable = asyncio.Event()
        #: set while the stream has room (or takes nothing more): the session reads on
        self._room = asyncio.Event()
        self._room.set()
        self._discarding = False
        self.replied = asyncio.Event()
        self.remote_closed = False
        self.local_closed = False
        self.reset_by_peer = False

    def header(self, name: str) -> str:
        return _header(self.headers, name)

    async def read(self) -> bytes:
        """The next chunk the peer sent; ``b""`` once it finished (or reset) the stream."""
        while not self._chunks:
            if self.remote_closed:
                return b""
            self._readable.clear()
            await self._readable.wait()
        chunk = self._chunks.popleft()
        self.buffered -= len(chunk)
        if self.buffered <= STREAM_LOW_WATER:
            self._room.set()
        return chunk

    def discard(self) -> None:
        """Nothing will read this stream any more: drop what it holds and what still comes."""
        self._discarding = True
        self._chunks.clear()
        self.buffered = 0
        self._room.set()
        self._readable.set()

    async def read_all(self) -> bytes:
        parts = []
        while chunk := await self.read():
            parts.append(chunk)
        return b"".join(parts)

    async def write(self, data: bytes) -> None:
        if self.local_closed:
            raise BrokenPipeError(f"stream {self.id} is closed")
        if self.reset_by_peer:
            raise StreamReset(f"stream {self.id} was reset")
        view = memoryview(data)
        for i in range(0, len(view), WRITE_CHUNK):
            await self.session._send(lambda c=bytes(view[i:i + WRITE_CHUNK]): self.session.framer.data(self.id, c))

    async def close(self) -> None:
        """Half-close: this side sends no more data (an empty frame with FIN)."""
        if self.local_closed or self.reset_by_peer or self.session.closed.is_set():
            self.local_closed = True
            return
        self.local_closed = True
        await self.session._send(lambda: self.session.framer.data(self.id, b"", fin=True))
        self.session._maybe_forget(self)

    async def reset(self, status: int = CANCEL) -> None:
        self.local_closed = True
        self._end()
        if not self.reset_by_peer and not self.session.closed.is_set():
            await self.session._send(lambda: self.session.framer.rst_stream(self.id, status))
        self.session._streams.pop(self.id, None)

    async def reply(self, headers: Headers | None = None) -> None:
        """Accept a stream the peer opened (``SYN_REPLY``)."""
        await self.session._send(lambda: self.session.framer.syn_reply(self.id, headers or {}))
        self.replied.set()

    def _deliver(self, data: bytes) -> None:
        if data and not self.remote_closed and not self._discarding:
            self._chunks.append(data)
            self.buffered += len(data)
            self._readable.set()
            if self.buffered > STREAM_HIGH_WATER:
                self._room.clear()

    def _end(self) -> None:
        if not self.remote_closed:
            self.remote_closed = True
            self._readable.set()
            self._room.set()  # nothing more comes: the session need not wait for it


Sender = Callable[[bytes], Awaitable[None]]
StreamHandler = Callable[[Stream], Awaitable[None] | None]


class Session:
    """A SPDY/3.1 session over a byte transport.

    ``send`` writes bytes to the peer; the owner feeds what it reads with
    :meth:`feed` and :meth:`feed_eof`. Streams the peer opens go to
    ``on_stream`` (which must :meth:`Stream.reply` or reset them).
    """

    def __init__(self, send: Sender, *, server: bool, on_stream: StreamHandler | None = None) -> None:
        self.framer = Framer()
        self._send_raw = send
        self.server = server
        self.on_stream = on_stream
        self._next_id = 2 if server else 1
        self._streams: dict[int, Stream] = {}
        self._lock = asyncio.Lock()
        self.closed = asyncio.Event()
        self.goaway_received = False
        self._last_remote_id = 0
        self._tasks: set[asyncio.Task] = set()

    async def _send(self, encode: Callable[[], bytes]) -> None:
        # header compression is stateful: frames are encoded and sent in one order
        async with self._lock:
            await self._send_raw(encode())

    async def open_stream(self, headers: Headers, *, fin: bool = False, timeout: float | None = 30.0) -> Stream:
        """Open a stream and wait for the peer's reply."""
        if self.closed.is_set() or self.goaway_received:
            raise ConnectionError("the SPDY session is closed")
        async with self._lock:
            sid = self._next_id
            self._next_id += 2
            stream = Stream(self, sid, headers)
            self._streams[sid] = stream
            await self._send_raw(self.framer.syn_stream(sid, headers, fin=fin))
        if fin:
            stream.local_closed = True
        waiter = asyncio.ensure_future(stream.replied.wait())
        closed = asyncio.ensure_future(self.closed.wait())
        try:
            done, _ = await asyncio.wait({waiter, closed}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            closed.cancel()
        if stream.reset_by_peer:
            raise StreamReset(f"the peer refused stream {sid} ({_header(headers, 'streamType')})")
        if not stream.replied.is_set():
            raise ConnectionError("the SPDY session closed before the stream was accepted"
                                  if self.closed.is_set() else "timed out waiting for the stream to be accepted")
        return stream

    async def ping(self, ping_id: int) -> None:
        await self._send(lambda: self.framer.ping(ping_id))

    async def goaway(self) -> None:
        if not self.closed.is_set():
            await self._send(lambda: self.framer.goaway(self._last_remote_id))

    def _maybe_forget(self, stream: Stream) -> None:
        if stream.local_closed and stream.remote_closed:
            self._streams.pop(stream.id, None)

    async def feed(self, data: bytes) -> None:
        for frame in self.framer.feed(data):
            await self._handle(frame)

    def feed_eof(self) -> None:
        """The transport ended: every stream ends."""
        self.closed.set()
        for s in list(self._streams.values()):
            s._end()
        self._streams.clear()

    async def _handle(self, f: Frame) -> None:
        if f.type == 0:
            s = self._streams.get(f.stream_id)
            if s is None:
                return
            s._deliver(f.data)
            if f.fin:
                s._end()
                self._maybe_forget(s)
            elif not s._room.is_set():
                # the consumer lags: take no more frames (the owner stops reading
                # the transport) until it caught up, or the stream or session ended
                await s._room.wait()
            return
        if f.type == SYN_STREAM:
            if (f.stream_id % 2 == 1) != self.server or f.stream_id <= self._last_remote_id:
                await self._send(lambda: self.framer.rst_stream(f.stream_id, PROTOCOL_ERROR))
                return
            self._last_remote_id = f.stream_id
            s = Stream(self, f.stream_id, f.headers)
            self._streams[f.stream_id] = s
            if f.fin:
                s._end()
            if f.flags & FLAG_UNIDIRECTIONAL:
                s.local_closed = True
            if self.on_stream is None:
                await s.reset(REFUSED_STREAM)
                return
            result = self.on_stream(s)
            if asyncio.iscoroutine(result):
                t = asyncio.get_running_loop().create_task(result)
                self._tasks.add(t)
                t.add_done_callback(self._tasks.discard)
            return
        if f.type in (SYN_REPLY, HEADERS):
            s = self._streams.get(f.stream_id)
            if s is None:
                return
            s.replied.set()
            if f.fin:
                s._end()
                self._maybe_forget(s)
            return
        if f.type == RST_STREAM:
            s = self._streams.pop(f.stream_id, None)
            if s is not None:
                s.reset_by_peer = True
                s._end()
                s.replied.set()
            return
        if f.type == PING:
            if (f.value % 2 == 0) == self.server:
                return  # the answer to one of ours
            await self._send(lambda: self.framer.ping(f.value))
            return
        if f.type == GOAWAY:
            self.goaway_received = True
            return
        # SETTINGS, WINDOW_UPDATE and unknown frames: nothing to do

    def cancel_tasks(self) -> None:
        for t in list(self._tasks):
            t.cancel()


async def dial(url: str, protocols: list[str], *, timeout: float = 10.0,
               headers: dict[str, str] | None = None) -> tuple[Session, str, "asyncio.Task[None]"]:
    """Upgrade an HTTP connection to ``url`` (``http://host:port/path``) to SPDY/3.1.

    Returns the client session, the protocol the server chose (from
    ``X-Stream-Protocol-Version``) and the task reading the connection (it
    ends, and the session is closed, when the peer closes).
    """
    from urllib.parse import urlsplit

    u = urlsplit(url)
    if u.scheme not in ("http", "https"):
        raise ValueError(f"unsupported streaming URL {url!r}")
    host = u.hostname or "127.0.0.1"
    port = u.port or (443 if u.scheme == "https" else 80)
    ssl_ctx = None
    if u.scheme == "https":
        import ssl

        ssl_ctx = ssl.create_default_context()
        ssl_ctx.check_hostname = False
        ssl_ctx.verify_mode = ssl.CERT_NONE
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=ssl_ctx), timeout)
    try:
        path = u.path + (f"?{u.query}" if u.query else "")
        lines = [f"POST {path or '/'} HTTP/1.1", f"Host: {u.netloc}", "Connection: Upgrade",
                 "Upgrade: SPDY/3.1", "Content-Length: 0"]
        lines += [f"X-Stream-Protocol-Version: {p}" for p in protocols]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        parts = status_line.split(" ", 2)
        code = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        resp_headers: dict[str, str] = {}
        for line in header_lines:
            if ":" in line:
                k, v = line.split(":", 1)
                resp_headers[k.strip().lower()] = v.strip()
        if code != 101:
            body = b""
            n = int(resp_headers.get("content-length", "0") or 0)
            if n:
                body = await asyncio.wait_for(reader.readexactly(min(n, 64 * 1024)), timeout)
            raise ConnectionError(f"upgrade to SPDY failed: {status_line.strip()}: {body.decode(errors='replace').strip()}")
    except BaseException:
        writer.close()
        raise

    async def send(data: bytes) -> None:
        writer.write(data)
        await writer.drain()

    session = Session(send, server=False)

    async def pump() -> None:
        try:
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                await session.feed(chunk)
        except (ConnectionError, ProtocolError, OSError):
            pass
        finally:
            session.feed_eof()
            writer.close()

    task = asyncio.get_running_loop().create_task(pump())
    return session, resp_headers.get("x-stream-protocol-version", ""), task
