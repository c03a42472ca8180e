"""Results larger than the workers' memory, side by side with Dask and Ray.

    python -m benchmarks.spill [--systems apportion,dask,ray] [--chunks 64] [--chunk-mb 64]
                               [--limit 1GiB] [--reads 2]

Two worker processes (one thread each) limited to ``--limit`` persist ``--chunks`` arrays
of ``--chunk-mb`` MB (64 x 64 MB = 4 GiB against 2 x 1 GiB by default), then sum each
chunk, ``--reads`` times (every pass reads spilled chunks back). Each system runs in a
fresh process; printed per system: seconds to persist, seconds for the sums, the peak
resident memory of each worker process (VmHWM) against its limit, the bytes on disk at
the end, the bytes the worker processes wrote to files (``write_bytes`` of /proc/<pid>/io,
the same measure for apportion and Dask: in all, and while persisting), and the machine's
load average before the run (other jobs swing the times); for apportion, what the two
workers counted, which the load does not swing as much: the seconds their task threads
waited for results to be spilled, the seconds their spill writes took, and the seconds
they were paused. Ray has no per-worker memory
limit: its object store, which spills to disk when full, is given the two workers' memory
(2 x ``--limit``), with two task processes; their peaks are printed against the limit.
``make bench-spill`` runs it with the benchmark environment.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.pathing import child_pythonpath, import_dir

MB = 1_000_000


def make_chunk(i: int, nbytes: int) -> Any:
    import numpy as np

    return np.full(nbytes, i % 251, dtype=np.uint8)


def total(chunk: Any, read: int) -> int:
    return int(chunk.sum())


def peak_rss() -> int:
    """This process's peak resident memory (VmHWM), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def dask_spilled(dask_worker: Any) -> int:
    spilled = getattr(dask_worker.data, "spilled_total", None)
    return int(getattr(spilled, "disk", 0) or 0)


def bytes_written() -> int:
    """The bytes this process has written to files (``write_bytes`` of /proc/self/io: pages
    it dirtied, whether or not they reached the disk before their file was removed)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    return 0


def _workload(
    submit: Any, wait: Any, run: Any, chunks: int, nbytes: int, reads: int
) -> tuple[dict[str, float], list[Any]]:
    """Times and bytes written by the workers (``run`` calls a function on each), and the
    persisted futures (held until the caller has measured)."""
    before = run(bytes_written)
    start = time.perf_counter()
    futures = [submit(make_chunk, i, nbytes) for i in range(chunks)]
    wait(futures)  # persisted, on the workers (no chunk comes to the client)
    persisted = time.perf_counter()
    after_persist = run(bytes_written)
    sums_start = time.perf_counter()
    for read in range(reads):
        got = [s.result() for s in [submit(total, future, read) for future in futures]]
        assert got == [nbytes * (i % 251) for i in range(chunks)], "wrong sums"
    sums_end = time.perf_counter()
    after = run(bytes_written)
    return {
        "persist_s": persisted - start,
        "sums_s": sums_end - sums_start,
        "written_persist": sum(after_persist[w] - before[w] for w in before),
        "written": sum(after[w] - before[w] for w in before),
    }, futures


def _run_apportion(limit: str, chunks: int, nbytes: int, reads: int) -> dict[str, Any]:
    from apportion import Client, LocalCluster, config, wait

    with (
        config.set({"worker.memory-limit": limit}),
        LocalCluster(n_workers=2, threads_per_worker=1) as cluster,
        Client(cluster) as client,
    ):
        timing, futures = _workload(client.submit, wait, client.run, chunks, nbytes, reads)
        peaks = client.run(peak_rss)
        time.sleep(1.5)  # the next heartbeat carries the spill counts
        info = [w["memory"] for w in client.scheduler_info()["workers"].values()]
        on_disk = sum(m.get("spilled_bytes", 0) for m in info)
        # Where the workers' time went, whatever the machine's load: their task threads
        # waiting for results to be spilled, writing spill files, and paused.
        steps = {step: sum(m.get(step, 0.0) for m in info) for step in STEPS}
        del futures
    return {**timing, "peaks": sorted(peaks.values()), "spilled": on_disk, "steps": steps}


# The seconds each apportion worker counts (summed over the two), as printed.
STEPS = {
    "spill_wait_seconds": "task threads waited for spills",
    "spill_write_seconds": "spill writes took",
    "paused_seconds": "paused",
}


def _run_dask(limit: str, chunks: int, nbytes: int, reads: int) -> dict[str, Any]:
    from distributed import Client, LocalCluster, wait

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, memory_limit=limit, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        timing, futures = _workload(client.submit, wait, client.run, chunks, nbytes, reads)
        peaks = client.run(peak_rss)
        spilled = sum(client.run(dask_spilled).values())
        del futures
    return {**timing, "peaks": sorted(peaks.values()), "spilled": spilled}


def _ray_peaks() -> list[int]:
    """Peak resident memory of Ray's task processes (``ray::`` workers) on this host."""
    peaks = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
            cmdline = (status.parent / "cmdline").read_bytes()
        except OSError:
            continue  # ended meanwhile
        if not cmdline.startswith(b"ray::"):
            continue
        for line in text.splitlines():
            if line.startswith("VmHWM:"):
                peaks.append(int(line.split()[1]) * 1024)
    return sorted(peaks)


def _run_ray(limit: str, chunks: int, nbytes: int, reads: int) -> dict[str, Any]:
    """Ray keeps results in its object store, which spills to disk when full: given the
    two workers' memory (2 x ``limit``) as its size, with two task processes."""
    import tempfile

    import ray

    from apportion.memory_limit import parse_size

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    spill_dir = Path(tempfile.mkdtemp(prefix="ray-spill-"))
    spilling = {"type": "filesystem", "params": {"directory_path": str(spill_dir)}}
    ray.init(
        num_cpus=2,
        object_store_memory=2 * parse_size(limit),
        _system_config={"object_spilling_config": json.dumps(spilling)},
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        make, add = ray.remote(make_chunk), ray.remote(total)

        class Ref:  # ObjectRef takes no attributes: wrap it
            def __init__(self, ref: Any) -> None:
                self.ref = ref

            def result(self) -> Any:
                return ray.get(self.ref)

        def ray_submit(func: Any, *args: Any) -> Ref:
            remote = make if func is make_chunk else add
            return Ref(remote.remote(*(a.ref if isinstance(a, Ref) else a for a in args)))

        def ray_wait(refs: list[Ref]) -> None:
            ray.wait([r.ref for r in refs], num_returns=len(refs), fetch_local=False)

        def unmeasured(func: Any) -> dict[str, int]:  # Ray's spilling is its store's, not
            return {}  # its task processes': the bytes on disk are printed instead

        timing, futures = _workload(ray_submit, ray_wait, unmeasured, chunks, nbytes, reads)
        del timing["written"], timing["written_persist"]
        spilled = sum(f.stat().st_size for f in spill_dir.rglob("*") if f.is_file())
        peaks = _ray_peaks()
        del futures
    finally:
        ray.shutdown()
        shutil.rmtree(spill_dir, ignore_errors=True)
    return {**timing, "peaks": peaks, "spilled": spilled}


RUNS = {"apportion": _run_apportion, "dask": _run_dask, "ray": _run_ray}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.spill", description=__doc__)
    parser.add_argument("--systems", default="apportion,dask,ray")
    parser.add_argument("--chunks", type=int, default=64)
    parser.add_argument("--chunk-mb", type=int, default=64)
    parser.add_argument("--limit", default="1GiB")
    parser.add_argument("--reads", type=int, default=2)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    nbytes = opts.chunk_mb * MB
    if opts.one:
        run = RUNS[opts.one]
        print(json.dumps(run(opts.limit, opts.chunks, nbytes, opts.reads)))
        return 0
    try:
        from apportion.memory_limit import parse_size
    except ImportError:  # an apportion without memory limits: Dask's parser reads the same
        from dask.utils import parse_bytes as parse_size

    limit = parse_size(opts.limit)
    print(
        f"{opts.chunks} x {opts.chunk_mb} MB on 2 workers limited to {opts.limit} each, "
        f"summed {opts.reads} times"
    )
    for system in opts.systems.split(","):
        load = (
            Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
        )
        env = {"PYTHONPATH": child_pythonpath(None), "APPORTION_LOG_LEVEL": "WARNING"}
        command = [sys.executable, "-m", "benchmarks.spill", *(argv or sys.argv[1:])]
        done = subprocess.run(
            [*command, "--one", system],
            cwd=import_dir(),
            env={**os.environ, **env},
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            print(f"{system}: failed\n{done.stderr[-2000:]}")
            continue
        result = json.loads(done.stdout.strip().splitlines()[-1])
        worst = max(result["peaks"]) / limit
        print(
            f"{system:>10} (load {load}): persist {result['persist_s']:.1f} s, "
            f"sums {result['sums_s']:.1f} s, "
            f"worker peaks {[round(p / 2**20) for p in result['peaks']]} MiB "
            f"({worst:.0%} of the limit), on disk at the end {result['spilled'] / 2**30:.2f} GiB"
            + (
                f", written {result['written'] / 2**30:.2f} GiB "
                f"({result['written_persist'] / 2**30:.2f} of it persisting)"
                if "written" in result
                else ""
            )
            + "".join(
                f", {STEPS[step]} {seconds:.2f} s"
                for step, seconds in result.get("steps", {}).items()
                if step in STEPS
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
