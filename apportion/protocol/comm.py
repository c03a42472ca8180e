"""TCP connections carrying batched frames, and the authenticated handshake.

``Comm.send`` queues a message and flushes everything queued on the next
event-loop tick as one frame: bursts are batched, yet an idle link never waits
on a timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from tornado.iostream import IOStream, StreamClosedError
from tornado.tcpclient import TCPClient
from tornado.tcpserver import TCPServer

from apportion import config
from apportion.protocol import tls
from apportion.protocol.frames import (
    HEADER_BYTES,
    PROTOCOL_VERSION,
    Message,
    ProtocolError,
    decode,
    encode,
    frame_length,
)

logger = logging.getLogger("apportion.comm")

# Nothing but a small handshake is accepted from a peer before it has authenticated.
HANDSHAKE_FRAME_LIMIT = 64 * 1024
HANDSHAKE_TIMEOUT = 10.0
# Most a single read takes from the stream (frames larger than this are read whole).
READ_CHUNK_BYTES = 256 * 1024


class CommClosedError(ConnectionError):
    """The connection is closed (by us, the peer, or a protocol violation)."""


def parse_address(address: str) -> tuple[str, int]:
    """``"tcp://host:port"``, ``"tls://host:port"`` or ``"host:port"`` to ``(host, port)``."""
    text = address.split("://", 1)[1] if "://" in address else address
    if "://" in address and not address.startswith(("tcp://", "tls://")):
        raise ValueError(f"unsupported address {address!r}: use tcp:// or tls://")
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"invalid address {address!r}: expected tcp://HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


def format_address(host: str, port: int, scheme: str | None = None) -> str:
    scheme = scheme or ("tls" if tls.enabled() else "tcp")
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


class Comm:
    """One framed, batched connection. Use from the event-loop thread only, except
    ``send_from_thread`` once ``allow_thread_writes`` was called."""

    def __init__(self, stream: IOStream, peer: str, max_frame: int | None = None) -> None:
        self.stream = stream
        self.peer = peer
        self.max_frame = max_frame or int(config.get("comm.max-frame-bytes"))
        self._queue: list[Message] = []
        self._flush_pending = False
        self._later_pending = False
        self._closed_reason: str | None = None
        # Messages that arrived in the same frame as the handshake reply, for the next read.
        self._backlog: list[Message] = []
        # Bytes read but not yet decoded: the start of the next frame(s).
        self._inbox = bytearray()
        # Plain TCP (not TLS): a frame may go straight to the socket when nothing is queued.
        self._direct = type(stream) is IOStream
        stream.set_nodelay(True)
        # Held while writing, once other threads may write too (see allow_thread_writes).
        self.write_lock: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        self._loop: asyncio.AbstractEventLoop | None = None
        # Bytes a thread could not send whole; the loop writes them before anything else.
        self._handoff: list[bytes] = []

    def allow_thread_writes(self) -> None:
        """Let other threads call ``send_from_thread``; call on the event-loop thread."""
        self._loop = asyncio.get_running_loop()
        # Reentrant: a holder (see Client._flush) may go on to write through this comm.
        lock = self.write_lock = threading.RLock()
        # Tornado closes the socket itself (on a read error, say): never in the middle of
        # a thread's send, whose file descriptor could otherwise be reused meanwhile.
        close_fd = self.stream.close_fd

        def close_fd_locked() -> None:
            with lock:
                close_fd()

        self.stream.close_fd = close_fd_locked  # type: ignore[method-assign]

    @property
    def closed(self) -> bool:
        return self._closed_reason is not None or self.stream.closed()

    def send(self, message: Message) -> None:
        if self.closed:
            raise CommClosedError(f"connection to {self.peer} is closed: {self._closed_reason}")
        self._queue.append(message)
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self._flush)

    def send_many(self, messages: list[Message]) -> None:
        for message in messages:
            self.send(message)

    def send_now(self, messages: list[Message]) -> None:
        """Write these (after anything queued) at once, as one frame: for callers that
        batched them already, so they neither wait a tick nor leave a callback behind."""
        if self.closed:
            raise CommClosedError(f"connection to {self.peer} is closed: {self._closed_reason}")
        self._queue.extend(messages)
        self._flush()

    def send_later(self, messages: list[Message], delay: float) -> None:
        """Queue messages that may wait: they leave with the next ``send``, or after ``delay``
        seconds at the latest. Order with other messages is kept (one queue)."""
        if self.closed:
            raise CommClosedError(f"connection to {self.peer} is closed: {self._closed_reason}")
        self._queue.extend(messages)
        if not self._flush_pending and not self._later_pending:
            self._later_pending = True
            asyncio.get_running_loop().call_later(delay, self._flush_later)

    def _flush_later(self) -> None:
        self._later_pending = False
        if not self._flush_pending:
            self._flush()

    def flush(self) -> None:
        """Write what is queued now instead of on the next loop tick (saves a tick)."""
        if self._queue:
            self._flush()

    def _flush(self) -> None:
        self._flush_pending = False
        batch, self._queue = self._queue, []
        if batch and not self.closed:
            for frame in self._frames(batch):
                self._write(frame)

    def _frames(self, batch: list[Message]) -> list[bytes]:
        """Encode a batch, halving it until every frame is within the peer's limit."""
        frame = encode(batch)
        if len(frame) <= self.max_frame or len(batch) == 1:
            return [frame]  # a single oversized message is refused by the peer, loudly
        middle = len(batch) // 2
        return self._frames(batch[:middle]) + self._frames(batch[middle:])

    def send_from_thread(self, messages: list[Message]) -> bool:
        """From any thread: write now when the connection is idle, saving the wake-up of
        the loop. False, with nothing written, when it is not (TLS, bytes still buffered,
        messages queued, closed): then send through the loop."""
        if self._loop is None or not self._direct:
            return False
        with self.write_lock:
            if self._queue or self._handoff or self.closed or self.stream.writing():
                return False
            frames = self._frames(messages)
            for i, frame in enumerate(frames):
                try:
                    sent = self.stream.socket.send(frame)
                except BlockingIOError:
                    sent = 0
                except OSError:
                    return i > 0  # the connection broke: the loop hears of it when reading
                if sent < len(frame):
                    # Socket buffer full: the loop writes the rest, before anything else.
                    self._handoff = [frame[sent:], *frames[i + 1 :]]
                    self._loop.call_soon_threadsafe(self._write_handoff)
                    return True
            return True

    def _write_handoff(self) -> None:
        with self.write_lock:
            if self._handoff and not self.closed:
                self._write_locked(b"")

    def _write(self, data: bytes) -> None:
        with self.write_lock:
            self._write_locked(data)

    def _write_locked(self, data: bytes) -> None:
        if self._handoff:
            data = b"".join([*self._handoff, data])
            self._handoff = []
        if not data:
            return
        stream = self.stream
        if self._direct and not stream.writing() and not stream.closed():
            # Nothing queued in tornado: send directly, skipping its write future and the
            # loop callback that resolves it (most frames are small and go out whole).
            try:
                sent = stream.socket.send(data)
            except OSError:
                sent = 0  # would block, or an error tornado reports below
            if sent == len(data):
                return
            data = data[sent:]
        try:
            future = stream.write(data)
        except StreamClosedError:
            self.close("peer closed the connection")
            return
        # Observe the future so a peer hanging up does not log "exception never retrieved".
        future.add_done_callback(lambda f: f.cancelled() or f.exception())

    async def write(self, messages: list[Message]) -> None:
        """Send now and wait until the bytes are handed to the kernel."""
        self._flush()
        try:
            with self.write_lock:
                if self._handoff:
                    self._write_locked(b"")
                future = self.stream.write(encode(messages))
            await future
        except StreamClosedError:
            self.close("peer closed the connection")
            raise CommClosedError(f"connection to {self.peer} closed while writing") from None

    async def read(self, limit: int | None = None) -> list[Message]:
        """The messages of the next frame (one frame per call, each checked on its own)."""
        if self._backlog:
            backlog, self._backlog = self._backlog, []
            return backlog
        buffer = self._inbox
        try:
            # Take whatever has arrived: frames that came together are then read from
            # here, without another trip through the stream.
            while len(buffer) < HEADER_BYTES:
                buffer += await self.stream.read_bytes(READ_CHUNK_BYTES, partial=True)
            end = HEADER_BYTES + frame_length(buffer[:HEADER_BYTES], limit or self.max_frame)
            if len(buffer) < end:  # a large frame: its rest is read straight into place
                payload = bytearray(end - HEADER_BYTES)
                have = len(buffer) - HEADER_BYTES
                payload[:have] = buffer[HEADER_BYTES:]
                with memoryview(payload) as view, view[have:] as rest:
                    await self.stream.read_into(rest)
                buffer.clear()
                messages = decode(payload)
            else:
                with memoryview(buffer) as view, view[HEADER_BYTES:end] as payload_view:
                    messages = decode(payload_view)
                del buffer[:end]
        except StreamClosedError:
            self.close("peer closed the connection")
            raise CommClosedError(f"connection to {self.peer} closed") from None
        except ProtocolError as exc:
            self.close(str(exc))
            raise
        return messages

    def close(self, reason: str = "closed locally") -> None:
        if self._closed_reason is None:
            self._closed_reason = reason
        if not self.stream.closed():
            self.stream.close()

    def __repr__(self) -> str:
        return f"<Comm peer={self.peer} closed={self.closed}>"


async def connect(
    address: str,
    role: str,
    token: str | None = None,
    info: dict[str, Any] | None = None,
    timeout: float | None = None,
) -> tuple[Comm, Message]:
    """Open a connection and complete the handshake; returns the comm and the welcome."""
    host, port = parse_address(address)
    timeout = float(config.get("comm.connect-timeout")) if timeout is None else timeout
    max_frame = int(config.get("comm.max-frame-bytes"))
    secure = address.startswith("tls://")
    try:
        stream = await asyncio.wait_for(
            TCPClient().connect(
                host,
                port,
                max_buffer_size=max_frame + HEADER_BYTES,
                ssl_options=tls.client_context() if secure else None,
            ),
            timeout,
        )
    except (OSError, StreamClosedError, asyncio.TimeoutError) as exc:
        raise OSError(f"could not connect to {address}: {exc or 'timed out'}") from None
    comm = Comm(stream, address, max_frame)
    hello = {"op": "hello", "role": role, "protocol": PROTOCOL_VERSION, "token": token}
    hello.update(info or {})
    try:
        await comm.write([hello])
        replies = await asyncio.wait_for(comm.read(HANDSHAKE_FRAME_LIMIT), timeout)
    except (CommClosedError, asyncio.TimeoutError):
        comm.close()
        raise OSError(f"{address} closed the connection during the handshake") from None
    reply = replies[0] if replies else {}
    comm._backlog = replies[1:]
    if reply.get("op") != "welcome":
        comm.close()
        reason = reply.get("reason", f"unexpected handshake reply {reply!r}")
        raise ConnectionRefusedError(f"{address} refused the connection: {reason}")
    return comm, reply


Handler = Callable[[Comm, Message], Awaitable[None]]


class Listener(TCPServer):
    """Accepts connections, authenticates the handshake, then hands over to ``handler``.

    The handler receives the comm and the hello message and must answer with
    ``{"op": "welcome", ...}`` (or refuse with ``refuse``).
    """

    def __init__(self, handler: Handler, token: str | None, roles: tuple[str, ...]) -> None:
        self.max_frame = int(config.get("comm.max-frame-bytes"))
        super().__init__(
            ssl_options=tls.server_context(), max_buffer_size=self.max_frame + HEADER_BYTES
        )
        self.handler = handler
        self.token = token
        self.roles = roles
        self.port: int = 0
        self.comms: set[Comm] = set()

    def listen_on(self, host: str, port: int) -> int:
        sockets = self._bind(host, port)
        self.add_sockets(sockets)
        self.port = sockets[0].getsockname()[1]
        return self.port

    @staticmethod
    def _bind(host: str, port: int) -> list[socket.socket]:
        from tornado.netutil import bind_sockets

        return bind_sockets(port, address=host or None, reuse_port=False)

    async def handle_stream(self, stream: IOStream, address: Any) -> None:
        peer = format_address(str(address[0]), int(address[1])) if address else "unknown"
        comm = Comm(stream, peer, self.max_frame)
        try:
            messages = await asyncio.wait_for(comm.read(HANDSHAKE_FRAME_LIMIT), HANDSHAKE_TIMEOUT)
        except (CommClosedError, ProtocolError, asyncio.TimeoutError) as exc:
            logger.info("dropped connection from %s before handshake: %s", peer, exc or "timeout")
            comm.close()
            return
        hello = messages[0] if messages else {}
        problem = self._check_hello(hello)
        if problem:
            logger.warning("refused connection from %s: %s", peer, problem)
            await refuse(comm, problem)
            return
        self.comms.add(comm)
        try:
            await self.handler(comm, hello)
        finally:
            self.comms.discard(comm)
            comm.close()

    def _check_hello(self, hello: Message) -> str | None:
        if hello.get("op") != "hello":
            return "the first message must be a handshake ({'op': 'hello', ...})"
        if hello.get("protocol") != PROTOCOL_VERSION:
            return (
                f"protocol version {hello.get('protocol')!r} is not supported; this server speaks "
                f"version {PROTOCOL_VERSION}: use the same apportion version on both sides"
            )
        if self.token is not None:
            offered = hello.get("token")
            if not isinstance(offered, str) or not hmac.compare_digest(offered, self.token):
                what = "no" if not offered else "a wrong"
                return f"authentication failed: {what} token was presented"
        if hello.get("role") not in self.roles:
            return f"unknown role {hello.get('role')!r}; expected one of {list(self.roles)}"
        return None

    def close_all(self) -> None:
        self.stop()
        for comm in list(self.comms):
            comm.close("server shutting down")


async def refuse(comm: Comm, reason: str) -> None:
    try:
        await comm.write([{"op": "refused", "reason": reason}])
    except CommClosedError:
        pass
    comm.close(reason)
