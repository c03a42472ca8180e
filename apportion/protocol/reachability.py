"""Whether the peer of a TCP connection still answers, read from the kernel's own record of
the connection (``TCP_INFO``).

A peer that is unreachable (its host vanished, a partition dropping packets, no reset ever
coming) leaves the bytes sent to it unacknowledged; the kernel would retransmit them for
about 15 minutes before giving up. A peer that is alive but not reading (stopped, its loop
busy, its buffers full) still acknowledges: its kernel answers, and once its receive
window is full the sender only probes it, with nothing in flight.

``TCP_USER_TIMEOUT`` cannot tell the two apart (Linux also ends a connection whose window
stayed closed that long, though every probe is answered), so a short one cut off busy
peers: a client submitting a million tasks, a scheduler busy for seconds. Instead, the
side that sends periodically (a worker's heartbeats) looks here: bytes in flight and no
acknowledgement for several intervals means the peer is gone.
"""

from __future__ import annotations

import socket
import struct

# struct tcp_info (linux/tcp.h): eight one-byte fields, then 32-bit ones; tcpi_unacked is
# the 5th of those (offset 24), tcpi_last_ack_recv (milliseconds) the 13th (offset 56).
_TCP_INFO_BYTES = 60
_UNACKED_OFFSET = 24
_LAST_ACK_RECV_OFFSET = 56


def unanswered_for(unacked_segments: int, last_ack_ms: int) -> float:
    """Seconds the peer has left bytes in flight unacknowledged (0: nothing is waiting for
    an acknowledgement, however long the peer has not read)."""
    return last_ack_ms / 1000 if unacked_segments else 0.0


def seconds_unanswered(sock: socket.socket) -> float:
    """``unanswered_for`` of a connected TCP socket; 0 where the system does not say."""
    option = getattr(socket, "TCP_INFO", None)
    if option is None:
        return 0.0
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, option, _TCP_INFO_BYTES)
    except OSError:
        return 0.0  # closed meanwhile, or not TCP
    if len(info) < _TCP_INFO_BYTES:
        return 0.0
    (unacked,) = struct.unpack_from("I", info, _UNACKED_OFFSET)
    (last_ack_ms,) = struct.unpack_from("I", info, _LAST_ACK_RECV_OFFSET)
    return unanswered_for(unacked, last_ack_ms)
