"""On real processes: a steady stream of one-GPU tasks does not starve two-GPU tasks."""

from __future__ import annotations

import time

from apportion import FIRST_COMPLETED, Client, wait
from tests.integration.tasks import hold

STREAM = 160  # one-GPU tasks in all, each holding its GPU for 50 ms
BIG = 5  # two-GPU tasks, submitted once the stream is under way


def test_two_gpu_tasks_start_during_a_stream_of_one_gpu_tasks(idle_client: Client) -> None:
    client = idle_client
    # Keep every GPU of the cluster (two workers with GPU=2) busy: a new one-GPU task is
    # submitted as soon as one finishes.
    in_flight = {
        client.submit(hold, 0.05, ("stream", i), pure=False, resources={"GPU": 1}) for i in range(4)
    }
    submitted, records, big = 4, [], []
    big_submitted_at = 0.0
    while in_flight:
        done, in_flight = wait(in_flight, timeout=60, return_when=FIRST_COMPLETED)
        records += [future.result() for future in done]
        for _ in done:
            if submitted < STREAM:
                in_flight.add(
                    client.submit(
                        hold, 0.05, ("stream", submitted), pure=False, resources={"GPU": 1}
                    )
                )
                submitted += 1
        if not big and len(records) >= 20:
            big_submitted_at = time.monotonic()
            big = [
                client.submit(hold, 0.05, ("big", i), pure=False, resources={"GPU": 2})
                for i in range(BIG)
            ]
    big_records = [future.result(timeout=60) for future in big]
    last_big_start = max(r["start"] for r in big_records)
    # Worker and client share the machine's monotonic clock: order the starts by it.
    stream_starts = sorted(r["start"] for r in records)
    overtaking = [s for s in stream_starts if big_submitted_at < s < last_big_start]
    after = [s for s in stream_starts if s > last_big_start]
    # Without reservations every two-GPU task waits for the stream's end (some 140 one-GPU
    # tasks start before them). With them, each waits for a worker to drain its two runs.
    assert len(overtaking) <= 4 * BIG, (len(overtaking), len(after))
    assert len(after) >= STREAM - 20 - 4 * BIG - 4
    # Never more than declared: no worker ran more than two GPUs' worth at once.
    from tests.integration.tasks import peak_use

    assert max(peak_use(records + big_records, "GPU").values()) <= 2
