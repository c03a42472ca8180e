"""A large map's futures: what each costs the client, and that they are the futures
``submit`` would have made (the same keys, the same lineage)."""

from __future__ import annotations

import gc
import tracemalloc
import warnings

from apportion import Client, LocalCluster, wait
from apportion.client import NoWorkerWarning
from apportion.lineage import re_registration
from tests.conftest import wait_until

from .tasks import inc

FUTURES = 20_000


def test_a_maps_pending_futures_keep_few_bytes_each() -> None:
    with LocalCluster(workers=[]) as cluster, Client(cluster) as client:
        warnings.simplefilter("ignore", NoWorkerWarning)  # nothing runs: no worker
        client.map(inc, range(10))  # the function pickled and cached once, beforehand
        client.scheduler_info()  # a round trip: what was queued to send is sent
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            held = client.map(inc, range(FUTURES))
            client.scheduler_info()
            gc.collect()
            per_future = (tracemalloc.get_traced_memory()[0] - before) / FUTURES
        finally:
            tracemalloc.stop()
        assert len(held) == FUTURES
        # About 590 bytes when each future's state kept a message of its own and the
        # table counted references apart; 384 with its arguments only (the future, its
        # state, key, arguments, the table's entry); 288 with a state of eight slots and
        # the arguments in the map's pieces.
        assert per_future <= 330, f"{per_future:.0f} bytes kept per pending future"


FINISHED = 20_000


def test_a_maps_finished_futures_keep_few_bytes_each() -> None:
    with (
        LocalCluster(workers=[{"name": f"w{i}", "nthreads": 1} for i in range(2)]) as cluster,
        Client(cluster) as client,
    ):
        client.gather(client.map(inc, range(10)))  # the function pickled, the workers known
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            held = client.map(inc, range(FINISHED))
            wait(held, timeout=600)
            client.scheduler_info()  # a round trip: what was on its way here is here
            gc.collect()
            per_future = (tracemalloc.get_traced_memory()[0] - before) / FINISHED
        finally:
            tracemalloc.stop()
        # About 430 bytes when each state kept fifteen slots, and its pickled arguments
        # and result as bytes objects of their own; 297 with eight slots, and the
        # arguments and small results in the map's pieces.
        assert per_future <= 340, f"{per_future:.0f} bytes kept per finished future"
        assert client.gather(held[-3:]) == [FINISHED - 2, FINISHED - 1, FINISHED]


def test_a_maps_futures_have_the_keys_and_lineage_submit_gives() -> None:
    with LocalCluster(workers=[]) as cluster, Client(cluster) as client:
        warnings.simplefilter("ignore", NoWorkerWarning)
        mapped = client.map(inc, [5, 6], resources={"GPU": 1})
        submitted = client.submit(inc, 6, resources={"GPU": 1})
        assert mapped[1].key == submitted.key  # pure: the same call is the same task
        assert mapped[1]._state is submitted._state
        assert client.map(inc, [5, 5]) != [mapped[0], mapped[0]]  # another demand
        impure = client.map(inc, [5, 5], pure=False)
        assert impure[0].key != impure[1].key
        stepped = client.map(inc, [1, 2], key="step")
        assert all(f.key.startswith("step-") for f in stepped)
        spec = mapped[0]._state.spec
        assert spec is not None
        assert spec["key"] == mapped[0].key and spec["resources"] == {"GPU": 1}
        specs, lineage_only = re_registration([f._state for f in [*mapped, *impure]])
        assert [s["key"] for s in specs] == [f.key for f in [*mapped, *impure]]
        assert lineage_only == []
        # What a new scheduler is given runs: the message is whole.
        assert {"key", "func", "args", "resources"} <= set(specs[0])


def test_results_of_one_worker_share_one_holder_list() -> None:
    with (
        LocalCluster(workers=[{"name": "w", "nthreads": 1}]) as cluster,
        Client(cluster) as client,
    ):
        futures = client.map(inc, range(200))
        assert client.gather(futures) == list(range(1, 201))
        holders = {id(f._state.who_has) for f in futures}
        assert len(holders) == 1, "each result kept a holder list of its own"
        assert futures[0]._state.who_has == [client.scheduler_info()["workers"].popitem()[0]]


def test_dropping_a_cancelled_future_keeps_the_key_its_resubmission_holds() -> None:
    with LocalCluster(workers=[]) as cluster, Client(cluster) as client:
        warnings.simplefilter("ignore", NoWorkerWarning)
        old = client.submit(inc, 1)
        old.cancel()
        wait_until(old._state.is_done)
        new = client.submit(inc, 1)  # the same key, a state of its own
        assert new.key == old.key and new._state is not old._state
        del old
        gc.collect()
        assert client.future_table.states[new.key] is new._state
        assert new._state.refs == 1
        extra = client.map(inc, [1])[0]
        assert extra._state is new._state and new._state.refs == 2
        del new, extra
        gc.collect()
        assert client.future_table.states == {}


def test_gathering_a_maps_futures_copies_them_little() -> None:
    with (
        LocalCluster(workers=[{"name": "w", "nthreads": 1}]) as cluster,
        Client(cluster) as client,
    ):
        futures = client.map(inc, range(FUTURES))
        done, not_done = wait(futures)
        assert len(done) == FUTURES and not not_done
        tracemalloc.start()
        try:
            values = client.gather(futures)
            gathered = tracemalloc.get_traced_memory()[1] / FUTURES
        finally:
            tracemalloc.stop()
        assert values == list(range(1, FUTURES + 1))
        # The values (an int and a pointer each) and the list; 58 when gather made three
        # more lists of the futures on the way.
        assert gathered <= 50, f"gather: {gathered:.0f} bytes at most per future"


def test_waiting_for_a_maps_futures_blocks_on_few_of_them() -> None:
    # Each wait that blocks makes the state an Event, kept: waiting for the last first
    # blocks about once, where waiting in order (or a set's) blocked about once each.
    with (
        LocalCluster(workers=[{"name": "w", "nthreads": 1}]) as cluster,
        Client(cluster) as client,
    ):
        for finish in (client.gather, wait):
            futures = client.map(inc, range(2_000), pure=False)
            finish(futures)
            assert all(f.done() for f in futures)
            blocked = sum(f._state._event is not None for f in futures)
            assert blocked <= 20, f"{finish.__name__}: blocked on {blocked} futures"


def test_submit_and_map_give_a_large_argument_the_same_key() -> None:
    import numpy as np

    big = np.arange(100_000)  # 800 kB: hashed as a large pickle, below storing on a worker
    with LocalCluster(workers=[]) as cluster, Client(cluster) as client:
        warnings.simplefilter("ignore", NoWorkerWarning)
        submitted = client.submit(np.sum, big)
        (mapped,) = client.map(np.sum, [big])
        assert mapped.key == submitted.key
        assert client.submit(np.sum, big + 1).key != submitted.key
