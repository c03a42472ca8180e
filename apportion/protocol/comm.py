"""TCP connections carrying batched frames, and the authenticated handshake.

Each connection is an asyncio ``Protocol``: the event loop hands it bytes as they
arrive and it cuts them into frames itself, so a message costs no stream machinery
on the way in. ``Comm.send`` queues a message and flushes everything queued on the
next event-loop tick as one frame: bursts are batched, yet an idle link never waits
on a timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import Any, cast

from apportion import config
from apportion.aio import background
from apportion.auth import tokens_match
from apportion.errors import ApportionError
from apportion.protocol import reachability, tls
from apportion.protocol.frames import (
    HEADER_BYTES,
    MAX_FRAME_LIMIT,
    PROTOCOL_VERSION,
    Buffer,
    Message,
    ProtocolError,
    decode,
    encode,
    encode_frame,
)
from apportion.protocol.paced import PacedWrites
from apportion.protocol.reader import FrameReader

logger = logging.getLogger("apportion.comm")

# Nothing but a small handshake is accepted from a peer before it has authenticated.
HANDSHAKE_FRAME_LIMIT = 64 * 1024
HANDSHAKE_TIMEOUT = 10.0
# Connections the kernel completes while the loop is busy: a flood of connections must
# not keep legitimate peers waiting in SYN retries (the system caps it at somaxconn).
LISTEN_BACKLOG = 4096
# Reading pauses while this much arrived unread (a peer outpacing its reader).
READ_BACKLOG_BYTES = 32 * 1024 * 1024


# A thread writes a batch in one writev of at most this many pieces (the system's limit
# is 1024); a batch of more goes through the loop.
WRITEV_MAX_PIECES = 512


class CommClosedError(ApportionError, ConnectionError):
    """The connection is closed (by us, the peer, or a protocol violation)."""


class _LargeFrameReads(asyncio.BufferedProtocol):
    """A connection's protocol while the rest of a large frame arrives: the event loop
    reads from the socket straight into the frame's buffer, then hands the connection
    back to its Comm."""

    def __init__(self, comm: Comm) -> None:
        self.comm = comm

    def get_buffer(self, sizehint: int) -> memoryview:
        try:
            return self.comm._reader.large_room()
        except ProtocolError as exc:  # no memory for the frame: the connection ends
            self.comm._fail(exc)
            raise

    def buffer_updated(self, nbytes: int) -> None:
        comm = self.comm
        comm._reader.large_written(nbytes)
        if comm._reader.large is None:  # whole: back to cutting frames from chunks
            assert comm.transport is not None
            comm.transport.set_protocol(comm)
            comm.data_received(b"")  # hands the frame over, as for one cut from chunks

    def eof_received(self) -> bool | None:
        return self.comm.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.comm.connection_lost(exc)

    def pause_writing(self) -> None:
        self.comm.pause_writing()

    def resume_writing(self) -> None:
        self.comm.resume_writing()


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


class Comm(asyncio.Protocol):
    """One framed, batched connection. Use from the event-loop thread only, except
    ``send_from_thread`` once ``allow_thread_writes`` was called.

    ``handshake_limit`` bounds what is buffered before the peer authenticated (see
    FrameReader): for accepted connections until ``trust()``, for the connecting side
    only the first frame (the server's welcome).
    """

    def __init__(
        self,
        peer: str,
        max_frame: int | None = None,
        handshake_limit: int | None = None,
        on_connected: Callable[[Comm], None] | None = None,
    ) -> None:
        self.peer = peer
        self.max_frame = max_frame or int(config.get("comm.max-frame-bytes"))
        self.transport: asyncio.Transport | None = None
        self._on_connected = on_connected
        # Writing: messages queued for the next tick, and flags for the pending flushes.
        self._queue: list[Message] = []
        self._flush_pending = False
        self._later_pending = False
        self._closed_reason: str | None = None
        # Reading: whole frames wait in the reader for read() or the serve() handler.
        self._reader = FrameReader(
            self.max_frame, handshake_limit, trust_after_first_frame=on_connected is None
        )
        # What ended the stream: a malformed frame, or an error from the frame handler.
        self._error: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None
        # Set by serve(): whole frames go straight to it, and it ends when the comm does.
        self._handler: Callable[[list[Message]], None] | None = None
        self._ended: asyncio.Future[None] | None = None
        self._paused = False
        # Messages that arrived in the same frame as the handshake reply, for the next read.
        self._backlog: list[Message] = []
        # Waiting for the kernel to take what the transport holds (see write()).
        self._drained: asyncio.Future[None] | None = None
        # Held while writing, once other threads may write too (see allow_thread_writes).
        self.write_lock: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        self._loop: asyncio.AbstractEventLoop | None = None
        # Our own descriptor of the socket for other threads' writes (plain TCP only).
        self._thread_fd: int | None = None
        # Bytes a thread could not send whole; the loop writes them before anything else.
        self._handoff: list[Buffer] = []
        # Over TLS: large frames (and what was sent after them) handed to the transport a
        # chunk at a time, each once it took the one before (see paced.py).
        self._tls = False
        self._paced = PacedWrites()
        self._feeding = False
        # The largest frame the peer reads (its comm.max-frame-bytes, from the handshake):
        # what this side sends is cut to fit it. None: not told (an older peer).
        self.peer_max_frame: int | None = None
        # Told of a single message too large for the peer, instead of sending it (the peer
        # would close the connection, and the same message would be sent again after a
        # reconnect): ``(message, encoded size)``. Unset: sent, and the peer refuses it.
        self.on_oversize: Callable[[Message, int], None] | None = None

    # ------------------------------------------------------- asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not derive from asyncio.Transport, but behave as one.
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        # Signals pause_writing as soon as anything waits for the kernel, resume once all
        # is taken: write() waits on exactly that. A TLS transport pauses at its high-water
        # mark already, not only above it: at 0 it would pause after every write, and
        # resume only when something else happens on the connection.
        self._tls = transport.get_extra_info("sslcontext") is not None
        transport.set_write_buffer_limits(high=1 if self._tls else 0)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            tune_tcp(sock)
        if self._on_connected is not None:
            self._on_connected(self)

    def connection_lost(self, exc: Exception | None) -> None:
        with self.write_lock:
            if self._closed_reason is None:
                self._closed_reason = "peer closed the connection"
            self._close_thread_fd()
            self._paced.take_all()
        self._reader.drop_incomplete()
        self._wake()
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def pause_writing(self) -> None:
        if self._drained is None:
            self._drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)
        if self._paced:
            with self.write_lock:
                self._feed_paced()

    def data_received(self, data: bytes) -> None:
        if self._error is not None:
            return  # the stream already failed: nothing after that is read
        reader = self._reader
        try:
            reader.feed(data)
        except ProtocolError as exc:
            self._fail(exc)
            return
        if reader.large is not None and self._direct_reads():
            return  # the rest of a large frame is read straight into its buffer
        if reader.frames:
            self._wake()
        if reader.waiting_bytes > READ_BACKLOG_BYTES and not self._paused and self.transport:
            self._paused = True
            self.transport.pause_reading()

    def _direct_reads(self) -> bool:
        """Read the rest of the large frame being filled straight into its buffer (no
        chunk objects, no copy from them): from the socket on a plain TCP connection; over
        TLS the transport decrypts straight into it."""
        transport = self.transport
        if transport is None:
            return False
        transport.set_protocol(_LargeFrameReads(self))
        return True

    def _fail(self, error: Exception) -> None:
        # Without its traceback: the frames it names (this comm, the bytes that arrived)
        # would stay alive as long as the error, until a full garbage collection.
        self._error = error.with_traceback(None)
        self._reader.drop_incomplete()
        self.close(str(error))

    def trust(self) -> None:
        """The peer authenticated: lift the handshake limit on what it may send."""
        self._reader.trust()

    def _wake(self) -> None:
        """Frames arrived, or the stream ended: tell the reader."""
        if self._handler is not None:
            self._deliver()
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if self._closed_reason is not None:
            self._stop_serving()

    def _stop_serving(self) -> None:
        self._handler = None
        ended, self._ended = self._ended, None
        if ended is not None and not ended.done():
            ended.set_result(None)

    def _deliver(self) -> None:
        """Hand the whole frames to the handler, in order, until it is closed here (frames
        that arrived before the peer closed are still handed over)."""
        reader = self._reader
        while reader.frames and self._handler is not None:
            try:
                messages = decode(reader.pop())
            except ProtocolError as exc:
                self._fail(exc)
                return
            try:
                self._handler(messages)
            except Exception as exc:
                # A message the handler could not take: nothing more is read, and serve()
                # raises this, leaving the comm open for the caller to answer and close.
                self._error = exc
                if self.transport is not None:
                    self.transport.pause_reading()
                self._stop_serving()
                return
        self._resume_if_drained()

    def _resume_if_drained(self) -> None:
        if self._paused and self._reader.waiting_bytes < READ_BACKLOG_BYTES // 2 and self.transport:
            self._paused = False
            self.transport.resume_reading()

    # ----------------------------------------------------------------- reading
    async def read(self) -> list[Message]:
        """The messages of the next frame (one frame per call, each checked on its own)."""
        if self._backlog:
            backlog, self._backlog = self._backlog, []
            return backlog
        while not self._reader.frames:
            if self._error is not None:
                raise self._error
            if self._closed_reason is not None:
                raise CommClosedError(f"connection to {self.peer} closed")
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        payload = self._reader.pop()
        self._resume_if_drained()
        try:
            return decode(payload)
        except ProtocolError as exc:
            self._fail(exc)
            raise

    async def serve(self, handler: Callable[[list[Message]], None]) -> None:
        """Call ``handler`` with each frame's messages as it arrives, on the event-loop
        thread with no coroutine step in between, until the connection ends.

        Raises CommClosedError once it is closed, or what ended it: a ProtocolError for a
        malformed frame (the comm is closed), or the exception the handler raised (the
        comm stays open, but reads nothing more).
        """
        if self._backlog:
            backlog, self._backlog = self._backlog, []
            handler(backlog)
        # Held here: _wake() below may already end serving, dropping self._ended.
        ended = self._ended = asyncio.get_running_loop().create_future()
        self._handler = handler
        self._wake()  # frames that came before, or an end that did
        try:
            if self._closed_reason is None and self._error is None:
                await ended
        finally:
            self._handler = None
        if self._error is not None:
            raise self._error
        raise CommClosedError(f"connection to {self.peer} closed: {self._closed_reason}")

    # ----------------------------------------------------------------- writing
    def allow_thread_writes(self) -> None:
        """Let other threads call ``send_from_thread``; call on the event-loop thread."""
        self._loop = asyncio.get_running_loop()
        # Reentrant: a holder (see Client._flush) may go on to write through this comm.
        self.write_lock = threading.RLock()
        transport = self.transport
        if transport is None or transport.get_extra_info("sslcontext") is not None:
            return  # TLS: every write goes through the transport, on the loop
        sock = transport.get_extra_info("socket")
        if sock is not None and not self.closed:
            # A descriptor of our own: closed under the lock, so a thread never writes to
            # a number the transport closed and the system gave to another file meanwhile.
            self._thread_fd = os.dup(sock.fileno())

    def _close_thread_fd(self) -> None:
        fd, self._thread_fd = self._thread_fd, None
        if fd is not None:
            os.close(fd)

    @property
    def closed(self) -> bool:
        return self._closed_reason is not None

    def seconds_unanswered(self) -> float:
        """Seconds the peer has left bytes sent to it unacknowledged: a sign that it is
        unreachable, where a peer that only stopped reading still acknowledges (see
        reachability.py). 0 for other than TCP."""
        transport = self.transport
        sock = transport.get_extra_info("socket") if transport is not None else None
        if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return 0.0
        return reachability.seconds_unanswered(sock)

    def send(self, message: Message) -> None:
        if self._closed_reason is not None:
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
        if self._closed_reason is not None:
            raise CommClosedError(f"connection to {self.peer} is closed: {self._closed_reason}")
        self._queue.extend(messages)
        self._flush()

    def send_later(self, messages: list[Message], delay: float) -> None:
        """Queue messages that may wait: they leave with the next ``send``, or after ``delay``
        seconds at the latest. Order with other messages is kept (one queue)."""
        if self._closed_reason is not None:
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
            for frame in self._frames_of(batch):
                if isinstance(frame, bytes):
                    self._write(frame)
                else:
                    self._write_parts(frame)

    @property
    def send_limit(self) -> int:
        """The largest frame to send: the peer's limit once known, else our own."""
        return self.peer_max_frame or self.max_frame

    def _frames_of(self, batch: list[Message]) -> list[bytes | list[Buffer]]:
        """Encode a batch, halving it until every frame is within the peer's limit (see
        encode_frame)."""
        frame = encode_frame(batch)
        size = len(frame) if isinstance(frame, bytes) else sum(memoryview(p).nbytes for p in frame)
        limit = self.send_limit
        if size <= limit:
            return [frame]
        if len(batch) == 1:
            if self.on_oversize is not None:
                self.on_oversize(batch[0], size)
                return []
            return [frame]  # refused by the peer, loudly
        middle = len(batch) // 2
        return self._frames_of(batch[:middle]) + self._frames_of(batch[middle:])

    def _write_parts(self, parts: list[Buffer]) -> None:
        """Write a frame of several parts (out-of-band buffers) without joining them: the
        transport keeps views of what the kernel does not take at once (uvloop's; asyncio's
        own plain TCP transport copies what the kernel did not take into its buffer); over
        TLS they are handed over a chunk at a time (see paced.py)."""
        with self.write_lock:
            if self._tls:
                self._write_tls(parts)
                return
            if self._handoff:  # a thread's unsent rest goes first
                parts = [*self._handoff, *parts]
                self._handoff = []
            self._write_pieces(parts)

    def _write_pieces(self, pieces: list[Buffer]) -> None:
        """Write these one after the other, none joined to another (plain TCP)."""
        transport = self.transport
        if transport is None or self.closed:
            return
        if transport.is_closing():
            self.close("peer closed the connection")
            return
        if type(transport).writelines is asyncio.WriteTransport.writelines:
            # That writelines joins the parts into one bytes object first: a copy of all
            # of them on top of the transport's own.
            for piece in pieces:
                transport.write(piece)
        else:
            # All in one call (one writev when nothing waits): a frame's head written
            # apart from its buffers left as a segment of its own, and woke the receiver
            # for it alone.
            transport.writelines(pieces)

    def _write_tls(self, parts: list[Buffer]) -> None:
        """Write a frame's parts to a TLS transport: at once when they are small and
        nothing waits, else after what waits, a chunk at a time (see paced.py)."""
        transport = self.transport
        if transport is None:
            return
        if transport.is_closing():
            self.close("peer closed the connection")
            return
        if self._paced or sum(memoryview(p).nbytes for p in parts) > self._paced.chunk:
            for part in parts:
                self._paced.add(part)
            self._feed_paced()
        else:
            transport.writelines(parts)  # (a TLS transport's writelines joins nothing)

    def _feed_paced(self) -> None:
        """Hand the TLS transport the chunks waiting, until it holds some it could not
        pass on to the kernel yet (it pauses writing: resume_writing feeds the next)."""
        transport = self.transport
        if self._feeding or transport is None:
            return
        self._feeding = True  # the transport may call resume_writing from within write
        try:
            while self._paced and self._drained is None and not transport.is_closing():
                transport.writelines(self._paced.next_chunk())
        finally:
            self._feeding = False

    def send_from_thread(self, messages: list[Message]) -> bool:
        """From any thread: write now when the connection is idle, saving the wake-up of
        the loop. False, with nothing written, when it is not (TLS, bytes still buffered,
        messages queued, closed): then send through the loop."""
        if self._thread_fd is None:
            return False
        with self.write_lock:
            fd, transport = self._thread_fd, self.transport
            if fd is None or transport is None or self._queue or self._handoff:
                return False
            if transport.get_write_buffer_size():
                return False
            pieces: list[Buffer] = []
            for frame in self._frames_of(messages):
                if isinstance(frame, bytes):
                    pieces.append(frame)
                else:
                    pieces.extend(frame)  # out-of-band buffers, from where they are
            if not pieces or len(pieces) > WRITEV_MAX_PIECES:
                return not pieces
            try:
                sent = os.writev(fd, pieces)
            except BlockingIOError:
                sent = 0
            except OSError:
                return False  # the connection broke: the loop hears of it when reading
            rest = unsent(pieces, sent)
            if rest:
                # Socket buffer full: the loop writes the rest (views, not copies), before
                # anything else.
                self._handoff = rest
                assert self._loop is not None
                self._loop.call_soon_threadsafe(self._write_handoff)
            return True

    def _write_handoff(self) -> None:
        with self.write_lock:
            if self._handoff and not self.closed:
                self._write_locked(b"")

    def _write(self, data: Buffer) -> None:
        with self.write_lock:
            self._write_locked(data)

    def _write_locked(self, data: Buffer) -> None:
        if self._handoff:
            handoff, self._handoff = self._handoff, []
            self._write_pieces([*handoff, data] if data else handoff)
            return
        transport = self.transport
        if not data or transport is None:
            return
        if transport.is_closing():
            self.close("peer closed the connection")
            return
        if self._tls:
            self._write_tls([data])
            return
        transport.write(data)  # sent at once when nothing waits before it

    async def write(self, messages: list[Message]) -> None:
        """Send now and wait until the bytes are handed to the kernel."""
        self._flush()
        with self.write_lock:
            if self.closed:
                raise CommClosedError(f"connection to {self.peer} closed while writing")
            self._write_locked(encode(messages))
        while self._drained is not None:  # (over TLS, paused again for each chunk)
            await self._drained
        if self.closed and self._closed_reason == "peer closed the connection":
            raise CommClosedError(f"connection to {self.peer} closed while writing")

    def close(self, reason: str = "closed locally") -> None:
        self._handler = None  # nothing more is read once closed here
        with self.write_lock:
            if self._closed_reason is None:
                self._closed_reason = reason
            self._close_thread_fd()
            if self._paced and self.transport is not None and not self.transport.is_closing():
                self.transport.writelines(self._paced.take_all())
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()  # what is buffered still goes out first
        self._wake()

    def __repr__(self) -> str:
        return f"<Comm peer={self.peer} closed={self.closed}>"


async def adopt(sock: socket.socket, peer: str, max_frame: int | None = None) -> Comm:
    """A comm over an already connected socket (a socketpair, say)."""
    comm = Comm(peer, max_frame)
    await asyncio.get_running_loop().connect_accepted_socket(lambda: comm, sock)
    return comm


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
    secure = address.startswith("tls://")
    comm = Comm(address, handshake_limit=HANDSHAKE_FRAME_LIMIT)
    loop = asyncio.get_running_loop()
    try:
        await asyncio.wait_for(
            loop.create_connection(
                lambda: comm, host, port, ssl=tls.client_context() if secure else None
            ),
            timeout,
        )
    except (OSError, asyncio.TimeoutError) as exc:
        raise OSError(f"could not connect to {address}: {exc or 'timed out'}") from None
    hello = {
        "op": "hello",
        "role": role,
        "protocol": PROTOCOL_VERSION,
        "token": token,
        "max_frame_bytes": comm.max_frame,
    }
    hello.update(info or {})
    try:
        await comm.write([hello])
        replies = await asyncio.wait_for(comm.read(), timeout)
    except (CommClosedError, ProtocolError, asyncio.TimeoutError):
        comm.close()
        raise OSError(f"{address} closed the connection during the handshake") from None
    reply = replies[0] if replies else {}
    comm._backlog = replies[1:]
    if reply.get("op") != "welcome":
        comm.close()
        reason = reply.get("reason", f"unexpected handshake reply {reply!r}")
        raise ConnectionRefusedError(f"{address} refused the connection: {reason}")
    comm.peer_max_frame = peer_frame_limit(reply)
    return comm, reply


def welcome(comm: Comm, **fields: Any) -> Message:
    """The handshake's answer: ``fields`` and the largest frame this side reads."""
    return {"op": "welcome", "max_frame_bytes": comm.max_frame, **fields}


def peer_frame_limit(handshake: Message) -> int | None:
    """The largest frame the peer of this hello or welcome reads; None if it did not say
    (or said nonsense: then our own limit applies, as before the field existed). Never
    below what a handshake may take: cutting batches finer only costs the sender work."""
    limit = handshake.get("max_frame_bytes")
    if isinstance(limit, int) and not isinstance(limit, bool) and limit > HEADER_BYTES:
        return min(max(limit, HANDSHAKE_FRAME_LIMIT), MAX_FRAME_LIMIT)
    return None


Handler = Callable[[Comm, Message], Awaitable[None]]


class Listener:
    """Accepts connections, authenticates the handshake, then hands over to ``handler``.

    The handler receives the comm and the hello message and must answer with
    ``{"op": "welcome", ...}`` (or refuse with ``refuse``).
    """

    def __init__(self, handler: Handler, token: str | None, roles: tuple[str, ...]) -> None:
        self.max_frame = int(config.get("comm.max-frame-bytes"))
        self.handler = handler
        self.token = token
        self.roles = roles
        # Tokens a client may present instead of ``token``, each to who presents it (a
        # tenant's name, see scheduler/tenants.py): the hello handed on names it as
        # ``tenant`` (set here only, whatever the client sent).
        self.client_tokens: dict[str, str] = {}
        self.port: int = 0
        # Authenticated connections, and every accepted one (closed on shutdown).
        self.comms: set[Comm] = set()
        self._accepted: set[Comm] = set()
        self._servers: list[asyncio.AbstractServer] = []

    async def listen_on(self, host: str, port: int) -> int:
        from tornado.netutil import bind_sockets  # one port for every address family

        loop = asyncio.get_running_loop()
        context = tls.server_context()
        sockets = bind_sockets(port, address=host or None, reuse_port=False, backlog=LISTEN_BACKLOG)
        for sock in sockets:
            self._servers.append(
                await loop.create_server(
                    self._new_comm, sock=sock, ssl=context, backlog=LISTEN_BACKLOG
                )
            )
        self.port = sockets[0].getsockname()[1]
        return self.port

    def _new_comm(self) -> Comm:
        return Comm(
            "unknown",
            self.max_frame,
            handshake_limit=HANDSHAKE_FRAME_LIMIT,
            on_connected=self._on_connected,
        )

    def _on_connected(self, comm: Comm) -> None:
        assert comm.transport is not None
        address = comm.transport.get_extra_info("peername")
        if address:
            comm.peer = format_address(str(address[0]), int(address[1]))
        self._accepted.add(comm)
        background(self._handle(comm)).add_done_callback(lambda _: self._accepted.discard(comm))

    async def _handle(self, comm: Comm) -> None:
        try:
            messages = await asyncio.wait_for(comm.read(), HANDSHAKE_TIMEOUT)
        except (CommClosedError, ProtocolError, asyncio.TimeoutError) as exc:
            logger.info(
                "dropped connection from %s before handshake: %s", comm.peer, exc or "timeout"
            )
            comm.close()
            return
        hello = messages[0] if messages else {}
        problem = self._check_hello(hello)
        if problem:
            logger.warning("refused connection from %s: %s", comm.peer, problem)
            await refuse(comm, problem)
            return
        comm.trust()
        comm.peer_max_frame = peer_frame_limit(hello)
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
        hello.pop("tenant", None)  # never the client's say
        tenant = None
        if self.client_tokens and hello.get("role") == "client":
            offered = hello.get("token")
            for token, name in self.client_tokens.items():
                if tokens_match(offered, token):
                    tenant = hello["tenant"] = name
        if self.token is not None and tenant is None:
            offered = hello.get("token")
            if not tokens_match(offered, self.token):
                what = "no" if not offered else "a wrong"
                return f"authentication failed: {what} token was presented"
        if hello.get("role") not in self.roles:
            return f"unknown role {hello.get('role')!r}; expected one of {list(self.roles)}"
        return None

    def close_all(self) -> None:
        for server in self._servers:
            server.close()
        for comm in list(self._accepted | self.comms):
            comm.close("server shutting down")


async def refuse(comm: Comm, reason: str) -> None:
    try:
        await comm.write([{"op": "refused", "reason": reason}])
    except CommClosedError:
        pass
    comm.close(reason)


# How many heartbeat intervals a peer may stay unreachable before its connection is given
# up: the failure detector of every connection, whoever holds it.
UNREACHABLE_AFTER_HEARTBEATS = 3


def tune_tcp(sock: socket.socket) -> None:
    """Small messages go out at once (no Nagle), and an idle connection whose peer became
    unreachable (its host vanished, a partition: no RST ever comes) ends within a few
    heartbeat intervals instead of the kernel's default of hours (keepalive probes).

    A connection with bytes in flight is judged by who sends on it periodically (see
    reachability.py); no TCP_USER_TIMEOUT, which would also end connections to peers that
    are alive but busy (their receive window closed for that long).
    """
    interval = float(config.get("worker.heartbeat-interval"))
    options = [
        (socket.IPPROTO_TCP, "TCP_NODELAY", 1),
        (socket.SOL_SOCKET, "SO_KEEPALIVE", 1),
        (socket.IPPROTO_TCP, "TCP_KEEPIDLE", max(1, round(interval))),
        (socket.IPPROTO_TCP, "TCP_KEEPINTVL", max(1, round(interval))),
        (socket.IPPROTO_TCP, "TCP_KEEPCNT", UNREACHABLE_AFTER_HEARTBEATS),
    ]
    for level, name, value in options:
        option = getattr(socket, name, None)  # not every platform has every option
        if option is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(level, option, value)


def unsent(pieces: list[Buffer], sent: int) -> list[Buffer]:
    """What is left of ``pieces`` once the first ``sent`` bytes of them were written:
    views of the rest, nothing copied."""
    for index, piece in enumerate(pieces):
        size = memoryview(piece).nbytes
        if sent < size:
            first = memoryview(piece).cast("B")[sent:] if sent else piece
            return [first, *pieces[index + 1 :]]
        sent -= size
    return []
