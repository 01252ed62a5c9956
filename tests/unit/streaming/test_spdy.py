"""The SPDY/3.1 codec: frames, header compression, sessions of streams."""

from __future__ import annotations

import asyncio
import struct
import zlib

import pytest

from kubeplane.streaming import channels, spdy


def test_dictionary_is_the_protocol_one():
    d = spdy.DICTIONARY
    assert len(d) == 1423
    assert d.startswith(b"\x00\x00\x00\x07options\x00\x00\x00\x04head")
    assert d.endswith(b"charset=iso-8859-1,utf-,*,enq=0.")
    # the zlib stream announces the dictionary: FDICT set, its adler32 after the header
    f = spdy.Framer()
    frame = f.syn_stream(1, {"streamtype": ["error"]})
    block = frame[18:]
    assert block[1] & 0x20
    assert struct.unpack(">I", block[2:6])[0] == zlib.adler32(d)


def test_frames_round_trip_with_one_compression_context_per_direction():
    a, b = spdy.Framer(), spdy.Framer()
    wire = b"".join([
        a.syn_stream(1, {"streamType": ["stdout"], "port": ["80", "81"]}, fin=False, priority=3),
        a.syn_stream(3, {"streamtype": ["stdin"]}, fin=True),
        a.syn_reply(2, {}),
        a.data(1, b"hello"),
        a.data(1, b"", fin=True),
        a.rst_stream(3, spdy.CANCEL),
        a.ping(7),
        a.goaway(3),
        a.window_update(1, 1000),
        a.settings({4: 100}),
        a.headers(1, {"x": ["y"]}),
    ])
    # fed byte by byte the same frames come out
    frames = []
    for i in range(len(wire)):
        frames += b.feed(wire[i:i + 1])
    kinds = [f.type for f in frames]
    assert kinds == [spdy.SYN_STREAM, spdy.SYN_STREAM, spdy.SYN_REPLY, 0, 0, spdy.RST_STREAM, spdy.PING,
                     spdy.GOAWAY, spdy.WINDOW_UPDATE, spdy.SETTINGS, spdy.HEADERS]
    assert frames[0].headers == {"streamtype": ["stdout"], "port": ["80", "81"]}
    assert frames[0].priority == 3 and not frames[0].fin
    assert frames[1].fin and frames[1].stream_id == 3
    assert frames[3].data == b"hello" and frames[4].fin
    assert frames[5].value == spdy.CANCEL and frames[6].value == 7
    assert frames[8].value == 1000 and frames[10].headers == {"x": ["y"]}


def test_bad_input_is_a_protocol_error():
    with pytest.raises(spdy.ProtocolError):
        spdy.Framer().feed(struct.pack(">HHI", 0x8000 | 2, spdy.PING, 4) + b"\0\0\0\1")
    f = spdy.Framer()
    with pytest.raises(spdy.ProtocolError):
        f.feed(struct.pack(">HHI", 0x8000 | 3, spdy.SYN_STREAM, 14) + b"\0\0\0\1\0\0\0\0\0\0garb")


class Pipe:
    """Two sessions wired to each other."""

    def __init__(self, on_stream):
        self.client = spdy.Session(self._to_server, server=False)
        self.server = spdy.Session(self._to_client, server=True, on_stream=on_stream)

    async def _to_server(self, data):
        await self.server.feed(data)

    async def _to_client(self, data):
        await self.client.feed(data)


async def test_sessions_open_streams_exchange_data_and_half_close():
    got = {}

    async def on_stream(s):
        await s.reply()
        got[s.header(channels.STREAM_TYPE)] = s
        if s.header(channels.STREAM_TYPE) == "echo":
            data = await s.read_all()
            await s.write(data.upper())
            await s.close()

    pipe = Pipe(on_stream)
    s = await pipe.client.open_stream({"streamtype": ["echo"]})
    assert s.id == 1
    await s.write(b"abc" * 20000)  # more than one frame
    await s.close()
    assert await asyncio.wait_for(s.read_all(), 5) == b"ABC" * 20000
    s2 = await pipe.client.open_stream({"streamtype": ["other"]})
    assert s2.id == 3
    await asyncio.sleep(0)
    assert got["other"].header("streamType") == "other"
    # a reset reaches the peer's reader
    await got["other"].reset()
    assert await s2.read() == b""
    assert s2.reset_by_peer
    with pytest.raises(spdy.StreamReset):
        await s2.write(b"x")
    pipe.client.feed_eof()
    with pytest.raises(ConnectionError):
        await pipe.client.open_stream({"streamtype": ["late"]})


async def test_refused_stream_and_wrong_stream_ids():
    async def on_stream(s):
        await s.reset(spdy.REFUSED_STREAM)

    pipe = Pipe(on_stream)
    with pytest.raises(spdy.StreamReset):
        await pipe.client.open_stream({"streamtype": ["x"]})
    # a client may not open even ids: the server resets them
    sent = []

    async def capture(data):
        sent.append(data)

    server = spdy.Session(capture, server=True, on_stream=lambda s: None)
    await server.feed(spdy.Framer().syn_stream(2, {}))
    (frame,) = spdy.Framer().feed(b"".join(sent))
    assert frame.type == spdy.RST_STREAM and frame.value == spdy.PROTOCOL_ERROR


def test_exit_codes_of_error_channel_statuses():
    assert channels.exit_code_of(channels.success_status()) == 0
    assert channels.exit_code_of(channels.exit_status(3)) == 3
    assert channels.exit_code_of({"status": "Failure", "reason": "InternalError"}) is None


class _Producer:
    """A streaming server (as a runtime's) whose ``stdout`` stream writes
    ``total`` bytes as fast as the connection takes them."""

    def __init__(self, total: int):
        self.total, self.sent = total, 0
        self.done = asyncio.Event()

    async def handle(self, reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
                     b"X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n")

        async def send(data):
            writer.write(data)
            await writer.drain()

        async def on_stream(s):
            await s.reply()
            chunk = b"y\n" * (spdy.WRITE_CHUNK // 2)
            while self.sent < self.total:
                await s.write(chunk)
                self.sent += len(chunk)
            await s.close()
            self.done.set()

        session = spdy.Session(send, server=True, on_stream=on_stream)
        try:
            while data := await reader.read(65536):
                await session.feed(data)
        except (ConnectionError, OSError):
            pass
        finally:
            session.feed_eof()
            session.cancel_tasks()
            writer.close()


async def test_a_stalled_reader_holds_the_peer_back():
    total = 48 * 1024 * 1024
    producer = _Producer(total)
    server = await asyncio.start_server(producer.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    task = None
    try:
        session, proto, task = await spdy.dial(f"http://127.0.0.1:{port}/exec/x", [channels.V4])
        assert proto == channels.V4
        stream = await session.open_stream({"streamtype": ["stdout"]})
        await stream.close()
        await asyncio.sleep(1.0)  # nobody reads: the peer is held back
        assert stream.buffered <= spdy.STREAM_HIGH_WATER + spdy.WRITE_CHUNK
        assert not producer.done.is_set() and producer.sent < total // 4
        # reading afterwards gets everything, in order
        got = 0
        while chunk := await asyncio.wait_for(stream.read(), 10):
            assert chunk == b"y\n" * (len(chunk) // 2)
            got += len(chunk)
            assert stream.buffered <= spdy.STREAM_HIGH_WATER + spdy.WRITE_CHUNK
        assert got == total and producer.done.is_set()
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        server.close()
        await server.wait_closed()


async def test_a_discarded_stream_does_not_hold_the_session():
    got = asyncio.Queue()

    async def on_stream(s):
        await s.reply()
        got.put_nowait(s)

    pipe = Pipe(on_stream)
    a = await pipe.client.open_stream({"streamtype": ["data"]})
    b = await pipe.client.open_stream({"streamtype": ["data"]})
    sa, sb = await got.get(), await got.get()
    sa.discard()  # its handler ended: what still comes for it is dropped
    await asyncio.wait_for(a.write(b"x" * (4 * spdy.STREAM_HIGH_WATER)), 5)
    assert sa.buffered == 0
    await asyncio.wait_for(b.write(b"hello"), 5)
    assert await sb.read() == b"hello"
