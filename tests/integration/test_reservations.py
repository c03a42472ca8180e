"""On real processes: a stream of one-GPU tasks does not starve two-GPU tasks."""

from __future__ import annotations

from apportion import Client
from tests.integration.tasks import hold, peak_use

AHEAD = 8  # one-GPU tasks submitted before the two-GPU ones: all four GPUs busy
BIG = 5  # two-GPU tasks
BEHIND = 120  # one-GPU tasks submitted after them, 50 ms each


def test_two_gpu_tasks_start_ahead_of_one_gpu_tasks_submitted_after_them(
    idle_client: Client,
) -> None:
    client = idle_client

    def one_gpu(tag: object) -> object:
        return client.submit(hold, 0.05, tag, pure=False, resources={"GPU": 1})

    ahead = [one_gpu(("ahead", i)) for i in range(AHEAD)]
    big = [
        client.submit(hold, 0.05, ("big", i), pure=False, resources={"GPU": 2}) for i in range(BIG)
    ]
    behind = [one_gpu(("behind", i)) for i in range(BEHIND)]
    records = client.gather(ahead + big + behind)
    big_starts = [r["start"] for r in records if r["tag"][0] == "big"]
    # Workers and the client share the machine's monotonic clock: order starts by it.
    overtaking = [r for r in records if r["tag"][0] == "behind" and r["start"] < max(big_starts)]
    # Placing only where resources are free, a worker with one free GPU is always refilled
    # by a one-GPU task and the two-GPU tasks wait for the whole backlog behind them. With
    # reservations, each waits at most for a worker to drain its two runs (the units freed
    # meanwhile on the other worker still go to one-GPU tasks).
    assert len(overtaking) <= 4 * BIG, len(overtaking)
    # Never more than declared: no worker held more than its two GPUs at once.
    assert max(peak_use(records, "GPU").values()) <= 2
