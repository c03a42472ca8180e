"""The benchmark suite in one command.

    python -m benchmarks.run [--quick] [--systems apportion,dask,ray] [--reps N]
                             [--out benchmarks/results]

Each repetition runs every system once, in a rotated order (systems alternate), each in a
fresh process with its own cluster (4 worker processes, one thread each, on 127.0.0.1),
torn down before the next starts. Prints a table of medians and apportion's ratio to each
peer; writes results.json and ratios.png under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import floor, report
from benchmarks.pathing import child_pythonpath, import_dir
from benchmarks.systems import SYSTEMS, available
from benchmarks.workloads import CLUSTER_WORKLOADS, Sizes

ROOT = Path(__file__).resolve().parent.parent
CHILD_TIMEOUT = 600.0


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # Workers of every system import benchmarks.workloads by reference.
    env["PYTHONPATH"] = child_pythonpath(env.get("PYTHONPATH"))
    env.setdefault("APPORTION_LOG_LEVEL", "WARNING")
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _wait_for_low_load(limit: float, max_wait: float) -> None:
    """Prefer measuring when the machine is quiet, but never wait more than max_wait."""
    deadline = time.monotonic() + max_wait
    while os.getloadavg()[0] > limit and time.monotonic() < deadline:
        time.sleep(2)


def _cleanup_group(pgid: int) -> list[str]:
    """Give a finished child's process group (ours) 3 s to empty, then kill what is left;
    return the command lines of the stragglers."""
    deadline = time.monotonic() + 3
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    ps = ["ps", "-o", "pid=,args=", "-g", str(pgid)]
    left = [" ".join(line.split())[:120] for line in _output(ps).splitlines() if line.strip()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        time.sleep(1)
    return left


def _output(cmd: list[str]) -> str:
    return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()


def _child(
    args: list[str], log: Path, ready_line: bool = False
) -> tuple[int, float, str, list[str]]:
    """Run ``benchmarks.child`` in a new session; return (rc, seconds to READY, READY text,
    leftover processes)."""
    cmd = [sys.executable, "-m", "benchmarks.child", *args]
    start = time.perf_counter()
    with open(log, "a") as err:
        proc = subprocess.Popen(
            cmd,
            cwd=import_dir(),
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )
        ready_at, ready_text = float("nan"), ""
        try:
            assert proc.stdout is not None
            if ready_line:
                for line in proc.stdout:
                    if line.startswith("READY "):
                        ready_at, ready_text = time.perf_counter() - start, line.split()[1]
                        break
            proc.communicate(timeout=CHILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        leftover = _cleanup_group(proc.pid)
    return proc.returncode, ready_at, ready_text, leftover


def _rotate(items: list[str], by: int) -> list[str]:
    by %= len(items)
    return items[by:] + items[:by]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--reps", type=int, default=None, help="repetitions (3, quick: 2)")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument(
        "--workloads",
        default="tiny,seed,chain,latency,dask_array,dask_gpu,dask_groupby,dask_programs,stream,data,"
        "data_tls,"
        "cold_start,scheduler",
        help="subset",
    )
    parser.add_argument("--max-load", type=float, default=2.5, help="wait (≤30 s) below this")
    opts = parser.parse_args(argv)

    reps = opts.reps or (2 if opts.quick else 3)
    wanted = [s for s in opts.systems.split(",") if s]
    systems = [s for s in wanted if available(s)]
    skipped = [s for s in wanted if s not in systems]
    if skipped:
        print(f"not installed, skipped: {', '.join(skipped)}", file=sys.stderr)
    workloads = opts.workloads.split(",")
    cluster_workloads = [w for w in workloads if w in CLUSTER_WORKLOADS]
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="apportion-bench-"))
    sizes = Sizes.quick() if opts.quick else Sizes()
    quick = ["--quick"] if opts.quick else []

    runs: list[dict[str, Any]] = []
    uptime_start, engine_start = _output(["uptime"]), _engine_revision()
    # The data rows' floors: loopback TCP into new memory of each transfer's size.
    shapes = sizes.data_mb if "data" in cluster_workloads else ()
    machine_floor = floor.measure(shapes)
    for rep in range(reps):
        _wait_for_low_load(opts.max_load, 30)
        if rep:  # the loopback figure is read over the whole run (floor.LOOPBACK_SAMPLES)
            machine_floor = floor.with_loopback_samples(machine_floor, floor.loopback_samples())
            machine_floor = floor.with_shape_samples(machine_floor, floor.shape_samples(shapes))
        for system in _rotate(systems, rep):
            log = logs / f"{system}.log"
            tasks: list[tuple[str, list[str]]] = []
            if cluster_workloads:
                tasks.append(("cluster", ["--only=" + ",".join(cluster_workloads)]))
            if "cold_start" in workloads:
                tasks.append(("cold_start", []))
            if "scheduler" in workloads and system != "ray":  # Ray's scheduler is C++: n/a
                tasks.append(("scheduler", []))
            for mode, extra in tasks:
                result_file = logs / f"{system}-{mode}-{rep}.json"
                load = _load()
                rc, ready_s, in_process, leftover = _child(
                    [system, mode, str(result_file), *quick, *extra], log, mode == "cold_start"
                )
                metrics: dict[str, float] = {}
                if mode == "cold_start" and in_process:
                    metrics = {
                        "cold_start_s": ready_s,
                        "cold_start_in_process_s": float(in_process),
                    }
                elif result_file.exists():
                    metrics = json.loads(result_file.read_text())
                run = {"rep": rep, "system": system, "mode": mode, "rc": rc, "load": load}
                run |= {"leftover_processes": leftover, "metrics": metrics}
                runs.append(run)
                status = "ok" if rc == 0 and metrics else f"FAILED (rc={rc}, log {log})"
                print(f"rep {rep + 1}/{reps} {system:9} {mode:10} {status}", file=sys.stderr)
    uptime_end = _output(["uptime"])

    results = report.summarise(runs, systems, machine_floor)
    results["meta"] = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "quick": opts.quick,
        "reps": reps,
        "sizes": sizes.__dict__,
        "uptime_start": uptime_start,
        "uptime_end": uptime_end,
        "cpus": os.cpu_count(),
        "floor": machine_floor,
        "python": platform.python_version(),
        # Which interpreter every system ran on (see BENCH_PYTHON in the Makefile).
        "interpreter": os.path.realpath(sys.executable),
        "platform": platform.platform(),
        "versions": _versions(systems),
        "scheduler_compiled": _scheduler_compiled(),
        # The lead may commit engine changes during a run: both ends are recorded.
        "engine": engine_start,
        "engine_end": _engine_revision(),
        "logs": str(logs),
    }
    results["runs"] = runs
    failed = [f"{r['system']} {r['mode']} rep {r['rep']}" for r in runs if r["rc"] != 0]
    if failed:
        # Keep the last good results; write this run beside them.
        out = out / "incomplete"
        out.mkdir(exist_ok=True)
        print(f"FAILED: {', '.join(failed)}; logs in {logs}; results in {out}", file=sys.stderr)
    report.write(results, out)
    report.print_table(results)
    return 1 if failed else 0


def _engine_revision() -> str:
    """The commit measured, and whether engine files had uncommitted edits."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()

    dirty = git("status", "--porcelain", "--", "apportion", "scheduler", "worker")
    return git("rev-parse", "--short", "HEAD") + (" + uncommitted engine edits" if dirty else "")


def _scheduler_compiled() -> bool | None:
    """Whether apportion's scheduler runs mypyc-compiled (setup.py) in processes started as
    the measured ones are; None where apportion cannot be imported there."""
    probe = "from apportion.build_info import scheduler_compiled; print(scheduler_compiled())"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=import_dir(), env=_env(), capture_output=True, text=True
    ).stdout.strip()
    return {"True": True, "False": False}.get(out)


def _versions(systems: list[str]) -> dict[str, str]:
    from importlib.metadata import version

    names = {"apportion": "apportion", "dask": "distributed", "ray": "ray"}
    return {s: version(names[s]) for s in systems}


if __name__ == "__main__":
    sys.exit(main())
