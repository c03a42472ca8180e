"""Profile apportion on the tiny, seed pipeline and latency workloads: where does each
process spend time?

    python -m benchmarks.profile [--out benchmarks/results] [--rate 250]

py-spy records the client (all threads), the scheduler and every worker process while
the workload runs; pyinstrument profiles the client's main thread. Prints, per process,
the busy share of wall time and the top functions by self and by inclusive time, and
writes them to ``profile-<workload>.txt`` (plus pyinstrument's text output).

Before the sampled run, each workload also runs once unwatched, and what it cost each
process is counted per task from /proc: CPU time, voluntary context switches (each a wait
for a message, a lock or the GIL), and read and write system calls (each frame sent is one
write). These figures hardly move with the machine's load, where wall-clock times do.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("APPORTION_LOG_LEVEL", "WARNING")

from benchmarks.pathing import child_pythonpath

# Worker processes import benchmarks.workloads by reference.
os.environ["PYTHONPATH"] = child_pythonpath(os.environ.get("PYTHONPATH"))

from benchmarks.systems import apportion_
from benchmarks.workloads import Session, Sizes, latency, seed, tiny, warm_up

TOP = 12
PROFILE_SIZES = Sizes(tiny=20_000, latency=2_000, seed_loads=5_000)  # long enough for sampling
# Tasks each workload runs at PROFILE_SIZES: what the costs per task are divided by.
TASKS: dict[str, int] = {
    "tiny": PROFILE_SIZES.tiny,
    "seed": 2 * PROFILE_SIZES.seed_loads + 1,
    "latency": PROFILE_SIZES.latency,
}
ROOT = str(Path(__file__).resolve().parent.parent)
# Leaf frames that are waiting, not working (py-spy's idle detection misses some of them).
WAITING = (
    "EpollSelector.select (",
    "Condition.wait (",
    "_worker (concurrent/futures/thread.py)",
    "Event.wait (",
    "Thread.join (",
)
ENTRY_POINTS = ("apportion/cli.py", "apportion/process.py", "apportion/__main__.py")


def _engine(frame: str) -> bool:
    """A frame in apportion's own code (not the benchmarks, not the CLI entry points)."""
    where = frame.partition(" (")[2]
    # py-spy names files relative to sys.path: apportion/..., or the installed package's
    # directories scheduler/... and worker/... (an editable install), or absolute paths.
    ours = where.startswith((ROOT, "apportion/", "scheduler/", "worker/"))
    return ours and "benchmarks/" not in where and not any(e in where for e in ENTRY_POINTS)


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: pip install -r benchmarks/requirements.txt")
    return found


def _record(pid: int, path: Path, rate: int) -> subprocess.Popen:
    args = ["--pid", str(pid), "--format", "raw", "--output", str(path), "--rate", str(rate)]
    return subprocess.Popen(
        [_py_spy(), "record", *args, "--nolineno", "--nonblocking", "--threads"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _short(frame: str) -> str:
    """``name (/path/to/pkg/module.py)`` -> ``name (pkg/module.py)``."""
    name, _, where = frame.partition(" (")
    parts = where.rstrip(")").split("/")
    return f"{name} ({'/'.join(parts[-2:])})"


def _waiting(frame: str) -> bool:
    return any(w in frame for w in WAITING)


def summarise(path: Path, seconds: float, rate: int) -> str:
    """Top self-time functions and top engine functions (inclusive), as shares of the
    samples in which the process was working (not waiting in select/locks/queues)."""
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = waiting = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")[1:]  # [0] names the thread
        if not frames:
            continue
        if _waiting(frames[-1]):
            waiting += n
            continue
        total += n
        self_time[_short(frames[-1])] += n
        for frame in {_short(f) for f in frames if _engine(f)}:
            inclusive[frame] += n
    if not total:
        return "  (no working samples)\n"
    busy = 100 * total / max(1.0, seconds * rate)
    lines = [
        f"  {total} working samples (~{busy:.0f}% of one core over {seconds:.2f}s; "
        f"{waiting} more samples waiting in select/locks, left out)",
        "  self time (share of working samples):",
    ]
    lines += [f"    {100 * n / total:5.1f}%  {f}" for f, n in self_time.most_common(TOP)]
    lines.append("  apportion functions, inclusive:")
    lines += [f"    {100 * n / total:5.1f}%  {f}" for f, n in inclusive.most_common(TOP)]
    return "\n".join(lines) + "\n"


def counters(pid: int) -> dict[str, float]:
    """What a process has used so far (all its threads): CPU seconds, voluntary context
    switches, read and write system calls."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    used = {"cpu": (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), "switches": 0}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:  # a thread that ended meanwhile
            continue
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                used["switches"] += int(line.split()[1])
    with open(f"/proc/{pid}/io") as io:
        calls = dict(line.split(": ") for line in io.read().splitlines())
    used["reads"], used["writes"] = int(calls["syscr"]), int(calls["syscw"])
    return used


def costs(pids: dict[str, int], run: Callable[[], object], tasks: int) -> str:
    """Run once, unwatched: each process's CPU, context switches and system calls per task."""
    before = {who: counters(pid) for who, pid in pids.items()}
    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    lines = [
        f"  costs per task, unwatched run of {tasks:,} tasks in {seconds:.2f}s "
        f"(load {os.getloadavg()[0]:.1f}):",
        f"    {'process':<20} {'CPU µs':>8} {'switches':>9} {'reads':>7} {'writes':>7}",
    ]
    total = dict.fromkeys(("cpu", "switches", "reads", "writes"), 0.0)
    for who, pid in pids.items():
        after = counters(pid)
        used = {k: (after[k] - before[who][k]) / tasks for k in total}
        for k in total:
            total[k] += used[k]
        lines.append(
            f"    {who:<20} {1e6 * used['cpu']:8.1f} {used['switches']:9.2f} "
            f"{used['reads']:7.2f} {used['writes']:7.2f}"
        )
    lines.append(
        f"    {'all':<20} {1e6 * total['cpu']:8.1f} {total['switches']:9.2f} "
        f"{total['reads']:7.2f} {total['writes']:7.2f}"
    )
    return "\n".join(lines) + "\n"


def profile(name: str, run: Callable[[Session, Sizes], object], out: Path, rate: int) -> str:
    from pyinstrument import Profiler

    tmp = Path(tempfile.mkdtemp(prefix="apportion-profile-"))
    with apportion_.session(seed=name == "seed") as session:
        warm_up(session)
        cluster = session.client.cluster
        pids = {"client": os.getpid(), "scheduler": cluster._scheduler_process.pid}
        pids |= {f"worker {w}": pid for w, pid in cluster.worker_pids.items()}
        cost = costs(pids, lambda: run(session, PROFILE_SIZES), TASKS[name])
        spies = {who: _record(pid, tmp / f"{who}.txt", rate) for who, pid in pids.items()}
        time.sleep(1.0)  # let py-spy attach
        profiler = Profiler(interval=0.0005)
        start = time.perf_counter()
        profiler.start()
        run(session, PROFILE_SIZES)
        profiler.stop()
        seconds = time.perf_counter() - start
        for spy in spies.values():
            spy.send_signal(signal.SIGINT)
        for spy in spies.values():
            try:
                spy.wait(timeout=30)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait()
    report = [f"== {name}: {seconds:.2f}s, py-spy at {rate} Hz, idle samples excluded", cost]
    for who in pids:
        report.append(f"-- {who}")
        path = tmp / f"{who}.txt"
        report.append(summarise(path, seconds, rate) if path.exists() else "  (no output)\n")
    text = "\n".join(report)
    (out / f"profile-{name}.txt").write_text(text)
    (out / f"pyinstrument-client-{name}.txt").write_text(
        profiler.output_text(unicode=False, color=False, show_all=False)
    )
    shutil.rmtree(tmp, ignore_errors=True)
    return text


def profile_scheduler(out: Path) -> str:
    """pyinstrument over the in-process scheduler-only benchmark (apportion's state machine)."""
    from pyinstrument import Profiler

    from benchmarks.scheduler_only import _place_all, _specs, _state

    sizes = Sizes()
    state, specs = _state(sizes.sched_workers), _specs(sizes.sched_tasks)
    profiler = Profiler(interval=0.0005)
    profiler.start()
    _place_all(state, specs)
    profiler.stop()
    tree = profiler.output_text(unicode=False, color=False)
    (out / "pyinstrument-scheduler-only.txt").write_text(tree)
    return "== scheduler-only (in-process; GC pauses land in whatever frame runs)\n" + tree


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--rate", type=int, default=250)
    opts = parser.parse_args()
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, run in (("tiny", tiny), ("seed", seed), ("latency", latency)):
        print(profile(name, run, out, opts.rate))
    print(profile_scheduler(out))


if __name__ == "__main__":
    main()
