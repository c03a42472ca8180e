"""The kubelet's port-forward over a WebSocket, as clients such as the ``kubernetes``
Python library speak it through the API server (which proxies the upgraded connection to
the node's kubeletEndpoint): ``/portForward/<ns>/<pod>?port=N``, subprotocol
``v4.channel.k8s.io``. Each binary message starts with a channel byte: port i has data
channel 2i and error channel 2i+1; the server's first message on each carries the port
(uint16, little-endian). One port per connection here (``kubectl port-forward`` speaks
SPDY, which this harness does not)."""

from __future__ import annotations

import base64
import hashlib
import logging
import socket
import struct
import threading
from typing import BinaryIO

log = logging.getLogger("kubelet.portforward")

PROTOCOL = "v4.channel.k8s.io"
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()


def frame(payload: bytes, opcode: int = 0x2) -> bytes:
    """A server's (unmasked, final) WebSocket frame."""
    size = len(payload)
    if size < 126:
        header = struct.pack("!BB", 0x80 | opcode, size)
    elif size < 1 << 16:
        header = struct.pack("!BBH", 0x80 | opcode, 126, size)
    else:
        header = struct.pack("!BBQ", 0x80 | opcode, 127, size)
    return header + payload


def read_frame(stream: BinaryIO) -> tuple[int, bytes] | None:
    """A client's frame: (opcode, payload), None at the end of the stream."""
    head = stream.read(2)
    if len(head) < 2:
        return None
    opcode, size = head[0] & 0x0F, head[1] & 0x7F
    if size == 126:
        (size,) = struct.unpack("!H", stream.read(2))
    elif size == 127:
        (size,) = struct.unpack("!Q", stream.read(8))
    mask = stream.read(4) if head[1] & 0x80 else b"\0\0\0\0"
    data = stream.read(size)
    return opcode, bytes(b ^ mask[i % 4] for i, b in enumerate(data))


def relay(rfile: BinaryIO, send: callable, port: int, target: socket.socket) -> None:  # type: ignore[valid-type]
    """Carry one forwarded port between the WebSocket and ``target`` until either ends."""
    lock = threading.Lock()

    def send_frame(payload: bytes, opcode: int = 0x2) -> None:
        with lock:
            send(frame(payload, opcode))

    port_bytes = struct.pack("<H", port)
    send_frame(b"\x00" + port_bytes)
    send_frame(b"\x01" + port_bytes)

    def from_pod() -> None:
        try:
            while data := target.recv(65536):
                send_frame(b"\x00" + data)
        except OSError:
            pass
        try:
            send_frame(struct.pack("!H", 1000), 0x8)
        except OSError:
            pass

    threading.Thread(target=from_pod, daemon=True).start()
    try:
        while (message := read_frame(rfile)) is not None:
            opcode, payload = message
            if opcode == 0x8:
                break
            if opcode == 0x9:
                send_frame(payload, 0xA)
            elif opcode in (0x1, 0x2) and payload[:1] == b"\x00" and len(payload) > 1:
                target.sendall(payload[1:])
    except OSError as exc:
        log.debug("port-forward to %d ended: %s", port, exc)
    finally:
        target.close()
