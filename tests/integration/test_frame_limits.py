"""A client whose comm.max-frame-bytes is larger than its scheduler's: each side knows the
other's limit from the handshake, so the client cuts what it sends to fit the scheduler's,
or fails what can never fit with an error naming both limits (it used to send the frame,
be closed for it, reconnect and send it again, for ever)."""

from __future__ import annotations

import os
import time

import pytest

from apportion import Client, LocalCluster, config, wait
from apportion.errors import FrameTooLargeError
from tests.integration.tasks import inc

SCHEDULER_LIMIT = 1_000_000
CLIENT_LIMIT = 8_000_000


def test_a_client_with_a_larger_frame_limit_splits_what_fits_and_fails_what_cannot() -> None:
    with config.set({"comm.max-frame-bytes": SCHEDULER_LIMIT}):
        cluster = LocalCluster(n_workers=1)
    try:
        with config.set({"comm.max-frame-bytes": CLIENT_LIMIT}), Client(cluster) as client:
            # 3 MB of arguments in one map: more than one of the scheduler's frames.
            pieces = [os.urandom(100_000) for _ in range(30)]
            futures = client.map(len, pieces)
            _, pending = wait(futures, timeout=60)
            assert not pending, "a submission larger than the scheduler's frames never ran"
            assert client.gather(futures) == [100_000] * 30
            # One task larger than the scheduler's frames can never be sent.
            began = time.monotonic()
            with pytest.raises(FrameTooLargeError) as refused:
                client.submit(len, b"x" * 3_000_000).result(timeout=60)
            assert time.monotonic() - began < 60
            text = str(refused.value)
            assert f"{SCHEDULER_LIMIT:,}" in text and f"{CLIENT_LIMIT:,}" in text, text
            assert "comm.max-frame-bytes" in text and "future" in text, text
            # The connection survived: no reconnect loop is under way.
            assert client.submit(inc, 1).result(timeout=30) == 2
            assert client.check_invariants() == []
    finally:
        cluster.close()
