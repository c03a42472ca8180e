"""apportion/shared_memory.py in one process, on the real kernel: export, map, checks, fallbacks."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from apportion import shared_memory
from apportion.serialize import Pickled, dumps_data, loads_value


def large_pickle(n: int = 400_000) -> tuple[np.ndarray, Pickled]:
    array = np.arange(n, dtype="f8")
    payload = dumps_data(array)
    assert isinstance(payload, Pickled)
    return array, payload


def test_an_exported_result_maps_back_equal_and_private() -> None:
    array, payload = large_pickle()
    exported = shared_memory.export(payload)
    assert exported is not None
    shared, segment = exported
    value = loads_value(shared)
    del shared, exported
    np.testing.assert_array_equal(value, array)
    opened = shared_memory.open_described(segment.describe())
    assert opened is not None
    peer = loads_value(opened[0])
    peer[:] = -1  # copy-on-write: the holder's value and the file stay as they were
    np.testing.assert_array_equal(value, array)
    again = shared_memory.open_described(segment.describe())
    assert again is not None
    np.testing.assert_array_equal(loads_value(again[0]), array)


def test_a_segment_lives_as_long_as_a_value_built_on_it() -> None:
    _, payload = large_pickle()
    exported = shared_memory.export(payload)
    assert exported is not None
    value = loads_value(exported[0])
    segment = exported[1]
    fd = segment.fd
    del exported
    gc.collect()
    assert segment.alive and os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:")
    del value
    gc.collect()
    assert not segment.alive
    assert not os.path.exists(f"/proc/self/fd/{fd}") or not os.readlink(
        f"/proc/self/fd/{fd}"
    ).startswith("/memfd:apportion")


def test_a_description_whose_descriptor_was_reused_is_refused() -> None:
    _, payload = large_pickle()
    exported = shared_memory.export(payload)
    assert exported is not None
    described = exported[1].describe()
    del exported
    gc.collect()  # freed: its descriptor number is free again
    other = shared_memory.export(large_pickle()[1])
    assert other is not None
    assert other[1].fd == described[1]  # the same number, another file
    before = shared_memory.counters["fallbacks"]
    assert shared_memory.open_described(described) is None
    assert shared_memory.counters["fallbacks"] == before + 1


def test_a_description_of_a_process_that_is_gone_is_refused() -> None:
    _, payload = large_pickle()
    exported = shared_memory.export(payload)
    assert exported is not None
    described = exported[1].describe()
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    described[0] = int(done.stdout)  # a pid that no longer runs
    assert shared_memory.open_described(described) is None


def test_a_result_that_does_not_fit_in_memory_is_kept_as_it_is() -> None:
    """Writing the file fails (here: a file size limit, as a full memory would): export
    gives up, closes what it opened, and the caller keeps its own value."""
    script = textwrap.dedent(
        """
        import os, resource, signal
        import numpy as np
        from apportion.serialize import dumps_data
        from apportion import shared_memory
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
        array = np.arange(1_000_000, dtype="f8")
        fds = len(os.listdir("/proc/self/fd"))
        assert shared_memory.export(dumps_data(array)) is None
        assert len(os.listdir("/proc/self/fd")) == fds, "a descriptor was left open"
        assert shared_memory.counters["fallbacks"] == 1
        assert array[-1] == 999_999
        print("kept")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "kept"


def test_results_are_shared_from_one_mebibyte_of_buffers() -> None:
    shared = shared_memory.SharedResults(enabled=True)
    assert not shared.wanted(dumps_data(np.ones(1 << 20)))  # nobody on this host asked yet
    assert not shared.asked_by("another host")
    assert shared.asked_by(shared_memory.host_identity())
    assert not shared.wanted(b"x" * (2 << 20))  # plain bytes: nothing out of band
    assert not shared.wanted(dumps_data(np.ones(shared_memory.SHARED_MIN_BYTES // 8 - 1)))
    assert shared.wanted(dumps_data(np.ones(shared_memory.SHARED_MIN_BYTES // 8)))
    assert not shared_memory.SharedResults(enabled=False).wanted(dumps_data(np.ones(1 << 20)))


def test_the_host_identity_names_the_kernel_boot_and_pid_namespace() -> None:
    identity = shared_memory.host_identity()
    with open("/proc/sys/kernel/random/boot_id") as boot:
        assert identity.startswith(boot.read().strip())
    assert identity.endswith(os.readlink("/proc/self/ns/pid"))


@pytest.mark.parametrize("bad", [None, [1, 2], ["x", 3, b"", 10, b"", []]])
def test_a_malformed_description_is_refused(bad: object) -> None:
    assert shared_memory.open_described(bad) is None


class Holder:
    """Stands in for a holder's connection: answers get-data as a worker does."""

    def __init__(self, shared: dict[str, object], data: dict[str, object]) -> None:
        self.shared, self.data = shared, data
        self.requests: list[dict] = []

    async def request(self, message: dict) -> dict:
        self.requests.append(message)
        keys = message["keys"]
        if message.get("host"):
            shared = {k: d for k, d in self.shared.items() if k in keys}
            data = {k: v for k, v in self.data.items() if k in keys and k not in shared}
            return {"op": "data", "shared": shared, "data": data}
        return {"op": "data", "data": {k: v for k, v in self.data.items() if k in keys}}


def test_get_data_maps_what_it_can_and_asks_again_for_the_bytes_of_the_rest() -> None:
    array, payload = large_pickle()
    exported = shared_memory.export(payload)
    assert exported is not None
    value = loads_value(exported[0])
    good = exported[1].describe()
    stale = [*good[:2], b"not the token....", *good[3:]]
    holder = Holder(
        {"mapped": good, "stale": stale}, {"mapped": b"", "stale": b"bytes", "small": b"s"}
    )
    payloads, segments = asyncio.run(
        shared_memory.get_data(holder.request, ["mapped", "stale", "small"], "here")
    )
    np.testing.assert_array_equal(loads_value(payloads["mapped"]), array)
    assert payloads["stale"] == b"bytes" and payloads["small"] == b"s"
    assert list(segments) == ["mapped"]
    assert [r.get("host") for r in holder.requests] == ["here", None]
    assert holder.requests[1]["keys"] == ["stale"]  # only what could not be mapped
    del value


def test_get_data_without_a_host_asks_for_bytes_only() -> None:
    holder = Holder({}, {"k": b"v"})
    payloads, segments = asyncio.run(shared_memory.get_data(holder.request, ["k", "gone"], ""))
    assert payloads == {"k": b"v"} and segments == {}
    assert holder.requests == [{"op": "get-data", "keys": ["k", "gone"]}]
