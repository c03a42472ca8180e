"""Comm writes from other threads, and messages that may wait, keep their order."""

from __future__ import annotations

import asyncio
import socket

import pytest
from tornado.iostream import IOStream

from apportion.protocol import Comm, Message

BIG = 1 << 26


async def _pair() -> tuple[Comm, Comm]:
    a, b = socket.socketpair()
    return Comm(IOStream(a), "a", max_frame=BIG), Comm(IOStream(b), "b", max_frame=BIG)


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
