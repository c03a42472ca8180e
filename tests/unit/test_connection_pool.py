"""ConnectionPool: requests to peers over one connection each, from the loop or, where
allowed, straight from another thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from apportion.protocol import Comm, Listener, Message
from apportion.protocol.comm import welcome
from apportion.protocol.rpc import ConnectionPool

TIMEOUT = 30.0


async def _answer(comm: Comm, hello: Message) -> None:
    """A peer answering each request with its keys."""
    comm.send(welcome(comm))
    while True:
        for message in await comm.read():
            comm.send({"op": "data", "id": message["id"], "keys": message["keys"]})


@contextmanager
def _loop_thread() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        _run(loop, _end_tasks())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(TIMEOUT)
        loop.close()


async def _end_tasks() -> None:
    """End what the connections left running, before the loop stops."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _run(loop: asyncio.AbstractEventLoop, coro: object) -> object:
    return asyncio.run_coroutine_threadsafe(coro, loop).result(TIMEOUT)  # type: ignore[arg-type]


def test_a_thread_sends_a_request_itself_on_an_open_connection_and_gets_its_reply() -> None:
    with _loop_thread() as loop:
        listener = Listener(_answer, token=None, roles=("client",))
        port = _run(loop, listener.listen_on("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{port}"
        pool = ConnectionPool("client", None, thread_writes=True)
        assert pool.request_from_thread(address, {"op": "get-data", "keys": ["a"]}) is None
        _run(loop, pool.open(address))  # connected: from now on a thread may ask
        reply = pool.request_from_thread(address, {"op": "get-data", "keys": ["a"]})
        assert reply is not None
        assert reply.result(TIMEOUT)["keys"] == ["a"]
        # The loop's way still works beside it.
        assert _run(loop, pool.request(address, {"op": "get-data", "keys": ["b"]}))["keys"] == ["b"]
        loop.call_soon_threadsafe(pool.close)
        loop.call_soon_threadsafe(listener.close_all)


def test_a_pool_without_thread_writes_leaves_every_request_to_the_loop() -> None:
    with _loop_thread() as loop:
        listener = Listener(_answer, token=None, roles=("worker",))
        port = _run(loop, listener.listen_on("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{port}"
        pool = ConnectionPool("worker", None)
        _run(loop, pool.open(address))
        assert pool.request_from_thread(address, {"op": "get-data", "keys": ["a"]}) is None
        assert _run(loop, pool.request(address, {"op": "get-data", "keys": ["a"]}))["keys"] == ["a"]
        loop.call_soon_threadsafe(pool.close)
        loop.call_soon_threadsafe(listener.close_all)
