"""Each side of a connection learns the other's frame limit in the handshake and sends
nothing larger; a client that is dropped at once backs off before reconnecting."""

from __future__ import annotations

import asyncio
import itertools
import socket

from apportion.protocol import Comm, Message
from apportion.protocol.comm import HANDSHAKE_FRAME_LIMIT, adopt, peer_frame_limit, welcome
from apportion.session import FIRST_DELAY, MAX_DELAY, STABLE_AFTER, next_reconnect_delay

OWN = 1 << 26


async def _pair(peer_limit: int) -> tuple[Comm, Comm]:
    a, b = socket.socketpair()
    sender, receiver = await adopt(a, "a", max_frame=OWN), await adopt(b, "b", max_frame=OWN)
    sender.peer_max_frame = peer_limit
    return sender, receiver


async def _read(comm: Comm, count: int) -> list[list[Message]]:
    frames: list[list[Message]] = []
    while sum(map(len, frames)) < count:
        frames.append(await asyncio.wait_for(comm.read(), 30))
    return frames


def test_a_batch_is_cut_into_frames_within_the_peers_limit_not_our_own() -> None:
    async def main() -> None:
        sender, receiver = await _pair(peer_limit=50_000)
        sender.send_now([{"op": "piece", "data": bytes(10_000)} for _ in range(20)])
        frames = await _read(receiver, 20)
        assert len(frames) > 4  # 200 kB in frames of at most 50 kB
        assert sum(map(len, frames)) == 20

    asyncio.run(main())


def test_a_single_message_too_large_for_the_peer_is_handed_back_not_sent() -> None:
    async def main() -> None:
        sender, receiver = await _pair(peer_limit=50_000)
        refused: list[tuple[str, int]] = []
        sender.on_oversize = lambda message, size: refused.append((message["op"], size))
        sender.send_now([{"op": "huge", "data": bytes(80_000)}, {"op": "small"}])
        assert [m["op"] for m in (await _read(receiver, 1))[0]] == ["small"]
        assert len(refused) == 1 and refused[0][0] == "huge" and refused[0][1] > 80_000

    asyncio.run(main())


def test_the_handshake_carries_the_frame_limit_and_nonsense_is_ignored() -> None:
    async def main() -> None:
        comm, _ = await _pair(peer_limit=1)
        answer = welcome(comm, client_id="c")
        assert answer == {"op": "welcome", "max_frame_bytes": OWN, "client_id": "c"}
        assert peer_frame_limit(answer) == OWN

    asyncio.run(main())
    assert peer_frame_limit({"op": "welcome"}) is None  # an older peer: our own limit holds
    for nonsense in (-5, 0, True, "big", 2.5):
        assert peer_frame_limit({"max_frame_bytes": nonsense}) is None
    # A tiny limit would only make the sender cut its batches into a great many frames.
    assert peer_frame_limit({"max_frame_bytes": 100}) == HANDSHAKE_FRAME_LIMIT


def test_reconnecting_backs_off_while_the_scheduler_drops_the_client_at_once() -> None:
    assert next_reconnect_delay(0.0, None) == 0.0  # the first loss: try at once
    assert next_reconnect_delay(0.0, STABLE_AFTER + 1) == 0.0  # after a stable connection
    delays = [0.0]
    for _ in range(10):
        delays.append(next_reconnect_delay(delays[-1], connected_for=0.01))
    assert delays[1] == 2 * FIRST_DELAY
    assert all(a < b for a, b in itertools.pairwise(delays[:5]))
    assert max(delays) == MAX_DELAY
