"""A map of a million trivial tasks, then their results, side by side with Ray and Dask.

    python -m benchmarks.map_million [--n 1000000] [--systems apportion,ray,dask]
                                     [--timeout 300] [--out FILE.json]

Each system runs in a fresh process with its own 4-worker cluster on 127.0.0.1 (one
thread each, as ``benchmarks.run``), warmed up with one task. Timed: ``map(inc,
range(n))`` and waiting for every result, then gathering them to the client (checked:
their sum). Printed per system: seconds to submit, seconds until all were done, seconds
with the gather, the client process's peak resident memory (VmHWM; Dask's scheduler runs
in that process too, Ray's object store does not) and its CPU seconds, with the load
average beside. A system not done within ``--timeout`` seconds is reported as
did-not-finish, with how many tasks it had finished by then. ``make bench`` runs it
(not ``make bench-quick``); ``--n`` runs it small.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.pathing import child_pythonpath, import_dir
from benchmarks.systems import SYSTEMS, available
from benchmarks.workloads import N_WORKERS, inc, peak_rss_mb

# Seconds between looks at how many tasks are done while waiting.
POLL = 5.0
# Seconds the parent allows a child beyond --timeout (start, warm-up, gather, teardown).
GRACE = 180.0


def _wait_counting(done: Callable[[float], int], total: int, deadline: float) -> tuple[int, float]:
    """Wait until ``total`` tasks are done or ``deadline`` (perf_counter) passes; ``done(s)``
    waits at most s seconds and says how many are done. Returns (done, when)."""
    finished = 0
    while True:
        left = deadline - time.perf_counter()
        finished = done(max(0.0, min(POLL, left)))
        if finished >= total or time.perf_counter() >= deadline:
            return finished, time.perf_counter()


def _futures_ops(client: Any, wait: Callable[..., Any]) -> dict[str, Any]:
    """The measured operations on a client of futures (apportion's or Dask's)."""

    def done(futures: list[Any], seconds: float) -> int:
        try:
            wait(futures, timeout=seconds)
        except TimeoutError:
            pass
        return sum(f.done() for f in futures)

    return {
        "one": lambda: client.submit(inc, 0).result(),
        "map": lambda n: client.map(inc, range(n)),
        "done": done,
        "gather": client.gather,
    }


@contextmanager
def _apportion() -> Iterator[dict[str, Any]]:
    from apportion import Client, LocalCluster, wait

    with (
        LocalCluster(n_workers=N_WORKERS, threads_per_worker=1, host="127.0.0.1") as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(N_WORKERS, timeout=60)
        yield _futures_ops(client, wait)


@contextmanager
def _dask() -> Iterator[dict[str, Any]]:
    from distributed import wait

    from benchmarks.systems import dask_

    with dask_.session(seed=False) as session:
        yield _futures_ops(session.client, wait)


@contextmanager
def _ray() -> Iterator[dict[str, Any]]:
    import ray

    from benchmarks.systems import ray_

    with ray_.session(seed=False) as session:
        remote = ray.remote(num_cpus=1)(inc)

        def done(refs: list[Any], seconds: float) -> int:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=seconds, fetch_local=False)
            return len(ready)

        yield {
            "one": lambda: ray.get(remote.remote(0)),
            "map": lambda n: [remote.remote(i) for i in range(n)],
            "done": done,
            "gather": ray.get,
        }
        del session


CLUSTERS = {"apportion": _apportion, "dask": _dask, "ray": _ray}


def run_one(system: str, n: int, timeout: float) -> dict[str, Any]:
    """In the child: the measurement of one system."""
    with CLUSTERS[system]() as ops:
        assert ops["one"]() == 1
        load = os.getloadavg()[0]
        cpu = time.process_time()
        start = time.perf_counter()
        futures = ops["map"](n)
        submitted = time.perf_counter()
        finished, at = _wait_counting(partial(ops["done"], futures), n, start + timeout)
        result: dict[str, Any] = {
            "system": system,
            "n": n,
            "load_before": round(load, 2),
            "submit_s": round(submitted - start, 2),
        }
        if finished < n:
            result |= {"finished": False, "done_by_timeout": finished, "timeout_s": timeout}
        else:
            values = ops["gather"](futures)
            gathered = time.perf_counter()
            assert sum(values) == n * (n + 1) // 2, "wrong results"
            del values
            result |= {
                "finished": True,
                "done_s": round(at - start, 2),
                "total_s": round(gathered - start, 2),
            }
        result["client_cpu_s"] = round(time.process_time() - cpu, 1)
        result["client_peak_mb"] = round(peak_rss_mb())
        result["load_after"] = round(os.getloadavg()[0], 2)
        del futures
    return result


def _child(system: str, n: int, timeout: float) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.map_million", "--one", system]
    command += ["--n", str(n), "--timeout", str(timeout)]
    env = {
        **os.environ,
        "PYTHONPATH": child_pythonpath(os.environ.get("PYTHONPATH")),
        "APPORTION_LOG_LEVEL": "WARNING",
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONWARNINGS": "ignore",
    }
    try:
        done = subprocess.run(
            command,
            cwd=import_dir(),
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout + GRACE,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired:
        return {"system": system, "n": n, "finished": False, "timeout_s": timeout}
    if done.returncode != 0:
        return {"system": system, "n": n, "failed": done.stderr[-2000:]}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def describe(result: dict[str, Any]) -> str:
    system = f"{result['system']:>10}"
    if "failed" in result:
        return f"{system}: failed\n{result['failed']}"
    memory = ""
    if "client_peak_mb" in result:
        memory = (
            f", client peak {result['client_peak_mb']} MB, client CPU "
            f"{result['client_cpu_s']} s, load {result['load_before']} -> {result['load_after']}"
        )
    if not result.get("finished"):
        count = result.get("done_by_timeout")
        reached = f" ({count:,} of {result['n']:,} done)" if count is not None else ""
        return f"{system}: did not finish in {result['timeout_s']:.0f} s{reached}{memory}"
    return (
        f"{system}: {result['total_s']:.1f} s (submitted in {result['submit_s']:.1f} s, all done "
        f"at {result['done_s']:.1f} s){memory}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.map_million", description=__doc__)
    parser.add_argument("--n", type=int, default=1_000_000, help="tasks in the map")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds, then DNF")
    parser.add_argument("--out", default=None, help="also write the results here (JSON)")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.one:
        print(json.dumps(run_one(opts.one, opts.n, opts.timeout)))
        return 0
    print(
        f"map(inc, range({opts.n:,})), then gather, {N_WORKERS} workers; "
        f"did-not-finish after {opts.timeout:.0f} s"
    )
    results = []
    for system in opts.systems.split(","):
        if not available(system):
            print(f"{system:>10}: not installed, skipped")
            continue
        result = _child(system, opts.n, opts.timeout)
        results.append(result)
        print(describe(result), flush=True)
    if opts.out:
        Path(opts.out).write_text(json.dumps(results, indent=1) + "\n")
    failed = [r for r in results if r["system"] == "apportion" and not r.get("finished")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
