"""What a wanted future costs the client's garbage collector.

A client keeps a state per wanted future, with its lineage (for a new scheduler after a
restart). Every container a state keeps alive is traversed by each collection of its
generation, and the survivors bring on the older generations' collections: each one
per future cost the client about 2% of a submit. The states share their empty lists
and their locks, so a pending future with one dependency keeps about 3.5 tracked
objects alive (the Future, its state, the kept spec, the list of its dependencies).
"""

from __future__ import annotations

import gc
import warnings

from apportion import Client, LocalCluster, futures
from apportion.client import NoWorkerWarning

from .tasks import inc

FUTURES = 2000


def test_a_pending_future_keeps_few_tracked_objects_alive() -> None:
    with LocalCluster(workers=[]) as cluster, Client(cluster) as client:
        warnings.simplefilter("ignore", NoWorkerWarning)  # nothing runs: no worker
        first = client.submit(inc, 0, pure=False)
        gc.collect()
        before = len(gc.get_objects())
        held = [client.submit(inc, first, pure=False) for _ in range(FUTURES)]
        gc.collect()
        per_future = (len(gc.get_objects()) - before) / FUTURES
        assert len(held) == FUTURES
        # 6.5 when every state owned a lock and two lists, and kept its spec and deps.
        assert per_future <= 4.0, f"{per_future:.2f} tracked objects kept per future"


def test_states_share_their_empty_lists_but_not_what_they_get() -> None:
    with LocalCluster(workers=[{"name": "w", "nthreads": 1}]) as cluster:
        with Client(cluster) as client:
            a, b = client.submit(inc, 1, pure=False), client.submit(inc, 2, pure=False)
            seen: list[str] = []
            a.add_done_callback(lambda f: seen.append(f.key))
            assert a.result(timeout=60) == 2 and b.result(timeout=60) == 3
            assert seen == [a.key]  # a's callback only
            b.add_done_callback(lambda f: seen.append(f.key))  # done: called at once
            assert seen == [a.key, b.key]
            assert a._state.who_has and b._state.who_has
    assert futures._NO_HOLDERS == [] and futures._NO_DEPS == []  # never changed
