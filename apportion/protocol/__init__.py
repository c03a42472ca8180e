"""Wire protocol: frames, connections and the handshake."""

from apportion.protocol.comm import Comm, CommClosedError, Listener, connect, parse_address
from apportion.protocol.frames import PROTOCOL_VERSION, Message, ProtocolError

__all__ = [
    "PROTOCOL_VERSION",
    "Comm",
    "CommClosedError",
    "Listener",
    "Message",
    "ProtocolError",
    "connect",
    "parse_address",
]
