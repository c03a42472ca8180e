"""Request/reply over pooled connections: one connection per peer, replies matched by id.

A peer may also send messages nobody asked for (a worker telling a client of a result):
those go to ``on_push``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
from collections.abc import Callable
from typing import Any

from apportion.aio import background
from apportion.protocol.comm import Comm, CommClosedError, connect
from apportion.protocol.frames import Message, ProtocolError

logger = logging.getLogger("apportion.comm")

# A reply awaited on the loop, or by another thread (request_from_thread).
Reply = asyncio.Future[Message] | concurrent.futures.Future[Message]


class ConnectionPool:
    # Read through the instance, not the module: a connection still opening when the
    # interpreter exits is closed after module globals are cleared, and its ``except``
    # clause must still name real classes.
    _OPEN_FAILURES = (OSError, CommClosedError, ProtocolError)

    def __init__(
        self,
        role: str,
        token: str | None,
        info: dict[str, Any] | None = None,
        on_push: Callable[[Message], None] | None = None,
        on_closed: Callable[[str], None] | None = None,
        thread_writes: bool = False,
    ) -> None:
        self.role = role
        # Whether other threads may send requests (request_from_thread).
        self.thread_writes = thread_writes
        self.token = token
        self.info = info  # sent with the handshake
        self.on_push = on_push
        self.on_closed = on_closed  # told the address when an open connection ends
        self._comms: dict[str, Comm] = {}
        self._connecting: dict[str, asyncio.Future[Comm]] = {}
        self._pending: dict[int, tuple[str, Reply]] = {}
        self._ids = itertools.count(1)

    async def _comm_for(self, address: str) -> Comm:
        comm = self._comms.get(address)
        if comm is not None and not comm.closed:
            return comm
        pending = self._connecting.get(address)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[Comm] = asyncio.get_running_loop().create_future()
        self._connecting[address] = future
        try:
            comm, _ = await connect(address, self.role, self.token, self.info)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # observed: waiters re-raise it
            raise
        finally:
            self._connecting.pop(address, None)
        if self.thread_writes:
            comm.allow_thread_writes()
        self._comms[address] = comm
        future.set_result(comm)
        background(self._read_replies(address, comm))
        return comm

    async def request(self, address: str, message: Message) -> Message:
        comm = await self._comm_for(address)
        request_id = next(self._ids)
        reply: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = (address, reply)
        try:
            comm.send({**message, "id": request_id})
        except CommClosedError:
            self._pending.pop(request_id, None)
            raise
        return await reply

    def request_from_thread(
        self, address: str, message: Message
    ) -> concurrent.futures.Future[Message] | None:
        """From a thread other than the loop's: send a request now, when the connection to
        ``address`` is open and idle, without waking the loop; the future of its reply
        (answered on the loop). None, with nothing sent: use ``request`` on the loop."""
        comm = self._comms.get(address)
        if not self.thread_writes or comm is None or comm.closed:
            return None
        request_id = next(self._ids)
        reply: concurrent.futures.Future[Message] = concurrent.futures.Future()
        self._pending[request_id] = (address, reply)  # before the reply can come
        if not comm.send_from_thread([{**message, "id": request_id}]):
            self._pending.pop(request_id, None)
            return None
        return reply

    def send_if_open(self, address: str, message: Message) -> None:
        """A message needing no reply, on the connection to ``address`` if there is one."""
        comm = self._comms.get(address)
        if comm is not None and not comm.closed:
            comm.send(message)

    async def _read_replies(self, address: str, comm: Comm) -> None:
        reason: Exception = CommClosedError(f"connection to {address} closed")

        def on_frame(messages: list[Message]) -> None:
            for message in messages:
                if "id" not in message:
                    if self.on_push is not None:
                        self.on_push(message)
                    continue
                entry = self._pending.pop(message["id"], None)
                if entry is not None and not entry[1].done():
                    entry[1].set_result(message)

        try:
            await comm.serve(on_frame)
        except (CommClosedError, ProtocolError) as exc:
            reason = CommClosedError(f"connection to {address} lost: {exc}")
        except Exception as exc:  # a malformed message
            comm.close()
            reason = CommClosedError(f"bad message from {address}: {exc!r}")
        finally:
            if self._comms.get(address) is comm:
                del self._comms[address]
            if self.on_closed is not None:
                self.on_closed(address)
            for request_id, (peer, future) in list(self._pending.items()):
                if peer == address:
                    del self._pending[request_id]
                    if not future.done():
                        future.set_exception(reason)

    async def open(self, address: str) -> None:
        """Connect ahead of any request (a failure is left for a request to report)."""
        try:
            await self._comm_for(address)
        except self._OPEN_FAILURES as exc:
            logger.info("could not connect to %s ahead of time: %s", address, exc)

    def drop(self, address: str) -> None:
        """Close the connection to ``address`` (its peer is gone, or should be taken to
        be): the requests waiting on it fail with CommClosedError."""
        comm = self._comms.get(address)
        if comm is not None:
            comm.close()

    def close(self) -> None:
        for comm in list(self._comms.values()):
            comm.close()
        self._comms.clear()
