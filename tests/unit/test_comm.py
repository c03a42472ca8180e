"""Comm: frames cut from the byte stream, writes from other threads, messages that may wait,
and flow control both ways."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from typing import cast

import pytest

from apportion import config
from apportion.protocol import Comm, CommClosedError, Message, ProtocolError, reachability
from apportion.protocol import comm as comm_module
from apportion.protocol.comm import adopt
from apportion.protocol.frames import HEADER, encode

BIG = 1 << 26


async def _pair() -> tuple[Comm, Comm]:
    a, b = socket.socketpair()
    return await adopt(a, "a", max_frame=BIG), await adopt(b, "b", max_frame=BIG)


async def _read(comm: Comm, count: int) -> list[Message]:
    got: list[Message] = []
    while len(got) < count:
        got += await asyncio.wait_for(comm.read(), 30)
    return got


def test_a_thread_write_too_big_for_the_socket_is_finished_by_the_loop_in_order() -> None:
    async def main() -> None:
        sender, receiver = await _pair()
        sender.allow_thread_writes()
        big = {"op": "big", "data": b"x" * 8_000_000}  # far more than a socket buffer holds
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, sender.send_from_thread, [big])
        sender.send({"op": "after"})
        sender.send_now([{"op": "now"}])
        got = await _read(receiver, 3)
        assert [m["op"] for m in got] == ["big", "after", "now"]
        assert got[0]["data"] == big["data"]

    asyncio.run(main())


def test_a_thread_writes_a_frame_of_out_of_band_buffers_itself_the_loop_ends_it() -> None:
    from apportion.serialize import Pickled

    async def main() -> None:
        sender, receiver = await _pair()
        sender.allow_thread_writes()
        payload = bytes(range(256)) * 40_000  # 10 MB: more than the socket takes at once
        big = {"op": "big", "data": Pickled(b"h", [memoryview(payload)])}
        loop = asyncio.get_running_loop()
        # Written by the calling thread, not handed to the loop whole (no wake-up of it).
        assert await loop.run_in_executor(None, sender.send_from_thread, [big])
        sender.send({"op": "after"})
        got = await _read(receiver, 2)
        assert [m["op"] for m in got] == ["big", "after"]
        assert bytes(got[0]["data"].buffers[0]) == payload

    asyncio.run(main())


class _RecordingTransport:
    """A real transport, each call of ``write`` and ``writelines`` recorded."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.calls: list[tuple[str, int]] = []

    def write(self, data: bytes) -> None:
        self.calls.append(("write", 1))
        self.transport.write(data)

    def writelines(self, pieces: list) -> None:
        self.calls.append(("writelines", len(pieces)))
        self.transport.writelines(pieces)

    def __getattr__(self, name: str) -> object:
        return getattr(self.transport, name)


def test_a_frame_head_and_its_buffers_go_to_the_transport_in_one_call() -> None:
    """Written apart, the head left as a segment of its own and woke the receiver for it
    alone; uvloop writes the pieces of one call with one writev."""
    import uvloop

    from apportion.serialize import Pickled

    async def main() -> None:
        sender, receiver = await _pair()
        recording = _RecordingTransport(cast(asyncio.Transport, sender.transport))
        sender.transport = cast(asyncio.Transport, recording)
        payload = b"x" * 1_000_000
        sender.send_now([{"op": "big", "data": Pickled(b"h", [memoryview(payload)])}])
        assert recording.calls == [("writelines", 3)]  # head, padding, buffer
        got = await _read(receiver, 1)
        assert bytes(got[0]["data"].buffers[0]) == payload

    uvloop.run(main())


def test_a_thread_write_never_overtakes_queued_messages() -> None:
    async def main() -> None:
        sender, receiver = await _pair()
        assert not sender.send_from_thread([{"op": "x"}])  # thread writes not allowed yet
        sender.allow_thread_writes()
        sender.send({"op": "queued"})
        assert not sender.send_from_thread([{"op": "refused"}])
        sender.flush()
        assert sender.send_from_thread([{"op": "direct"}])
        assert [m["op"] for m in await _read(receiver, 2)] == ["queued", "direct"]
        sender.close()
        assert not sender.send_from_thread([{"op": "closed"}])

    asyncio.run(main())


@pytest.mark.parametrize(
    ("delay", "then", "expected"),
    [
        (3600, [{"op": "urgent"}], ["lazy", "urgent"]),  # with the next send, before it
        (0.01, [], ["lazy"]),  # alone, after the delay
    ],
)
def test_messages_that_may_wait_leave_with_the_next_send_or_after_the_delay(
    delay: float, then: list[Message], expected: list[str]
) -> None:
    async def main() -> None:
        sender, receiver = await _pair()
        sender.send_later([{"op": "lazy"}], delay=delay)
        sender.send_many(then)
        assert [m["op"] for m in await _read(receiver, len(expected))] == expected

    asyncio.run(main())


def _frames_then_raw(raw: bytes, limit: int = BIG, reads: int = 1) -> list[object]:
    """Write raw bytes at once to one end; read ``reads`` frames (or the error) at the other."""

    async def main() -> list[object]:
        a, b = socket.socketpair()
        receiver = await adopt(b, "b", max_frame=limit)
        # From a thread: more than a socket buffer holds waits for the reader.
        writer = threading.Thread(target=a.sendall, args=(raw,))
        writer.start()
        got: list[object] = []
        for _ in range(reads):
            try:
                got.append(await asyncio.wait_for(receiver.read(), 30))
            except Exception as exc:  # the error is the result under test
                got.append(exc)
        writer.join(30)
        a.close()
        return got

    return asyncio.run(main())


def test_frames_arriving_together_are_returned_one_frame_per_read() -> None:
    raw = encode([{"op": "a"}]) + encode([{"op": "b"}, {"op": "c"}]) + encode([{"op": "d"}])
    got = _frames_then_raw(raw, reads=3)
    assert got == [[{"op": "a"}], [{"op": "b"}, {"op": "c"}], [{"op": "d"}]]


def test_a_frame_larger_than_one_read_arrives_whole_after_a_small_one() -> None:
    big = {"op": "big", "data": bytes(range(256)) * 8_000}  # ~2 MB: several reads' worth
    got = _frames_then_raw(encode([{"op": "small"}]) + encode([big]), reads=2)
    assert got == [[{"op": "small"}], [big]]


def test_a_frame_split_into_single_bytes_is_reassembled() -> None:
    async def main() -> list[Message]:
        a, b = socket.socketpair()
        receiver = await adopt(b, "b", max_frame=BIG)
        reading = asyncio.ensure_future(receiver.read())
        for byte in encode([{"op": "slow", "n": 12345}]):
            a.send(bytes([byte]))
            await asyncio.sleep(0)  # let the reader see each byte on its own
        got = await asyncio.wait_for(reading, 30)
        a.close()
        return got

    assert asyncio.run(main()) == [{"op": "slow", "n": 12345}]


def test_the_limit_applies_to_each_frame_even_when_read_together() -> None:
    # A small handshake-sized frame, then one over the limit in the same write: the first
    # is returned, the second refused by its announced length before it is decoded.
    raw = encode([{"op": "hello"}]) + encode([{"op": "x", "data": b"y" * 5000}])
    first, second = _frames_then_raw(raw, limit=1000, reads=2)
    assert first == [{"op": "hello"}]
    assert isinstance(second, ProtocolError) and "limit of 1000 bytes" in str(second)


async def _until(condition: Callable[[], bool], what: str) -> None:
    """Let the loop run until ``condition`` holds (30 s at most)."""
    deadline = asyncio.get_running_loop().time() + 30
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0)  # one loop iteration: the transport reads or writes


def test_reading_pauses_while_much_arrived_unread_and_loses_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(comm_module, "READ_BACKLOG_BYTES", 1_000_000)
    frames = [encode([{"op": "n", "i": i, "pad": b"p" * 10_000}]) for i in range(500)]

    async def main() -> None:
        a, b = socket.socketpair()
        receiver = await adopt(b, "b", max_frame=BIG)
        writer = threading.Thread(target=a.sendall, args=(b"".join(frames),))
        writer.start()
        await _until(lambda: receiver._paused, "reading to pause")
        # Paused: what waits unread is bounded by the backlog limit and one chunk more.
        assert receiver._reader.waiting_bytes < 1_000_000 + 300_000
        got = await _read(receiver, len(frames))
        assert [m["i"] for m in got] == list(range(500))
        assert not receiver._paused
        writer.join(30)
        a.close()

    asyncio.run(main())


def test_write_returns_once_the_kernel_took_everything() -> None:
    async def main() -> None:
        sender, receiver = await _pair()
        big = {"op": "big", "data": b"x" * 8_000_000}  # more than the socket buffers hold
        writing = asyncio.ensure_future(sender.write([big]))
        await _until(lambda: sender._drained is not None, "the transport to hold bytes back")
        assert not writing.done()  # nobody reads: the bytes wait in the transport
        got = await _read(receiver, 1)
        await asyncio.wait_for(writing, 30)
        assert got[0]["data"] == big["data"]

    asyncio.run(main())


def test_serve_hands_over_every_frame_in_order_even_those_sent_before_the_peer_closed() -> None:
    async def main() -> None:
        a, b = socket.socketpair()
        receiver = await adopt(b, "b", max_frame=BIG)
        a.sendall(encode([{"op": "early"}]))  # before serve() is called
        await _until(lambda: receiver._reader.frames, "the first frame")
        a.sendall(encode([{"op": "x"}, {"op": "y"}]) + encode([{"op": "last"}]))
        a.close()
        got: list[str] = []
        with pytest.raises(CommClosedError):
            await asyncio.wait_for(receiver.serve(lambda ms: got.extend(m["op"] for m in ms)), 30)
        assert got == ["early", "x", "y", "last"]

    asyncio.run(main())


def test_serve_raises_what_the_handler_raised_and_leaves_the_comm_open_to_answer() -> None:
    async def main() -> None:
        sender, receiver = await _pair()
        sender.send_many([{"op": "ok"}, {"op": "bad"}])
        sender.flush()
        sender.send({"op": "never"})  # a later frame: not handed over
        got: list[str] = []

        def handle(messages: list[Message]) -> None:
            for message in messages:
                if message["op"] == "bad":
                    raise KeyError("bad")
                got.append(message["op"])

        with pytest.raises(KeyError):
            await asyncio.wait_for(receiver.serve(handle), 30)
        assert got == ["ok"]
        assert not receiver.closed
        await receiver.write([{"op": "error", "reason": "bad message"}])
        assert [m["op"] for m in await _read(sender, 1)] == ["error"]

    asyncio.run(main())


def test_serve_ends_with_a_protocol_error_for_a_malformed_frame_and_closes() -> None:
    async def main() -> None:
        a, b = socket.socketpair()
        receiver = await adopt(b, "b", max_frame=BIG)
        a.sendall(HEADER.pack(3) + b"\xc1\xc1\xc1")
        with pytest.raises(ProtocolError, match="not valid msgpack"):
            await asyncio.wait_for(receiver.serve(lambda ms: None), 30)
        assert receiver.closed
        a.close()

    asyncio.run(main())


def test_large_frames_are_read_straight_into_their_buffer_between_small_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from apportion.serialize import Pickled

    read_directly: list[int] = []
    updated = comm_module._LargeFrameReads.buffer_updated

    def counting(self: comm_module._LargeFrameReads, nbytes: int) -> None:
        read_directly.append(nbytes)
        updated(self, nbytes)

    monkeypatch.setattr(comm_module._LargeFrameReads, "buffer_updated", counting)

    async def main() -> None:
        sender, receiver = await _pair()
        payloads = [bytes([i]) * (3_000_000 + i) for i in range(3)]
        for i, payload in enumerate(payloads):
            sender.send({"op": "small", "i": i})
            sender.send_now([{"op": "big", "data": Pickled(b"h", [memoryview(payload)])}])
            sender.send({"op": "after", "i": i})
        got = await _read(receiver, 9)
        assert [m["op"] for m in got] == ["small", "big", "after"] * 3
        for message, payload in zip(got[1::3], payloads, strict=True):
            assert bytes(message["data"].buffers[0]) == payload
        # Most of each large frame went from the socket straight into its buffer, and the
        # connection is its comm's again.
        assert sum(read_directly) > 0.9 * sum(map(len, payloads))
        assert receiver.transport is not None
        assert receiver.transport.get_protocol() is receiver

    asyncio.run(main())


async def _tcp_pair() -> tuple[Comm, Comm]:
    """Two ends of a real loopback TCP connection (tuned as every connection is)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        a = socket.create_connection(server.getsockname())
        b, _ = server.accept()
    return await adopt(a, "a", max_frame=BIG), await adopt(b, "b", max_frame=BIG)


def test_a_peer_that_stops_reading_for_many_heartbeats_is_not_cut_off() -> None:
    """A busy peer (its loop blocked, a client submitting a million tasks) lets its receive
    window close while its kernel still answers. The connection must outlive that: it did
    not while TCP_USER_TIMEOUT (3 heartbeats) also ended connections with a closed window."""
    interval = 0.25

    async def main() -> None:
        with config.set({"worker.heartbeat-interval": interval}):
            sender, receiver = await _tcp_pair()
        assert receiver.transport is not None
        receiver.transport.pause_reading()  # the peer stops reading, as a busy one does
        big = {"op": "big", "data": b"x" * 40_000_000}  # far more than the buffers hold
        sender.send(big)
        # The scenario is a peer silent for long: 4 times what 3 heartbeats last.
        await asyncio.sleep(4 * 3 * interval)
        assert not sender.closed
        assert sender.seconds_unanswered() == 0  # nothing in flight: only window probes
        receiver.transport.resume_reading()
        (got,) = await _read(receiver, 1)
        assert got["data"] == big["data"]

    asyncio.run(main())


@pytest.mark.parametrize(
    ("unacked", "last_ack_ms", "expected"),
    [(0, 90_000, 0.0), (3, 4_500, 4.5), (1, 0, 0.0)],
)
def test_only_bytes_in_flight_unacknowledged_count_as_unanswered(
    unacked: int, last_ack_ms: int, expected: float
) -> None:
    assert reachability.unanswered_for(unacked, last_ack_ms) == expected
