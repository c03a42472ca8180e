"""Teams sharing GPUs: two tenants' backlogs on 4 GPUs, and a quota.

Four workers with one GPU each (declared, no devices). Tenant ``a`` submits ``--tasks``
GPU=1 tasks of 20 ms; tenant ``b`` submits as many ``--late`` seconds later, while ``a``
is still backlogged. With weights 1:1 each should hold half the GPU time while both wait,
with 3:1 ``a`` three quarters; ``b`` should reach its share (2 GPUs, then 1) within one
task's time. Figures: ``a``'s share of GPU time in each second both were backlogged
(median, lowest, highest), and how long ``b`` took from its arrival to hold its share.
Then a tenant with a quota of 2 GPUs submits a backlog alone: the most GPUs it ever held
at once (from the runs' own clocks) and the scheduler's accounting check, taken after
every batch of messages (``scheduler.validate``), which covers quotas.

Dask and Ray run the same two backlogs as reference: two clients (two drivers' worth of
tasks for Ray) of one cluster, first come, first served; they have no quotas.

    .venv/bin/python -m benchmarks.tenants [--tasks 2000] [--systems apportion,dask,ray]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

GPUS = 4
TASK_S = 0.02
WEIGHTS = {"1:1": (1, 1), "3:1": (3, 1)}
QUOTA = 2

Span = tuple[float, float]
# submit(tenant, count) -> futures; gather(futures) -> spans
Submit = Callable[[str, int], list[Any]]
Gather = Callable[[list[Any]], list[Span]]


def occupy_span(seconds: float) -> Span:
    """Hold the task's GPU for ``seconds``; when that was (wall clock: comparable between
    the processes of one machine)."""
    start = time.time()
    time.sleep(seconds)
    return start, time.time()


# ------------------------------------------------------------------ figures
def share_figures(a: list[Span], b: list[Span], arrived: float, weights: tuple[int, int]) -> dict:
    """``a``'s share of GPU time per second while both were backlogged (from ``b``'s
    arrival until the first of them started its last task), and ``b``'s time to its share."""
    end = min(max(s for s, _ in a), max(s for s, _ in b))
    seconds = []
    t = arrived
    while t + 1.0 <= end:
        held_a = _held(a, t, t + 1.0)
        held_b = _held(b, t, t + 1.0)
        if held_a + held_b:
            seconds.append(held_a / (held_a + held_b))
        t += 1.0
    target = GPUS * weights[1] / sum(weights)
    return {
        "a_share_median": statistics.median(seconds) if seconds else float("nan"),
        "a_share_min": min(seconds, default=float("nan")),
        "a_share_max": max(seconds, default=float("nan")),
        "b_reach_s": _reached(b, target) - arrived,
        "seconds": len(seconds),
    }


def _held(spans: list[Span], start: float, end: float) -> float:
    return sum(max(0.0, min(e, end) - max(s, start)) for s, e in spans)


def _depths(spans: list[Span]) -> Iterator[tuple[float, int]]:
    """How many spans overlap, after each start and end, in time order."""
    depth = 0
    for when, step in sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans]):
        depth += step
        yield when, depth


def _reached(spans: list[Span], target: float) -> float:
    """When the spans first overlapped ``target`` deep (inf if never)."""
    return next((when for when, depth in _depths(spans) if depth >= target), float("inf"))


def peak(spans: list[Span]) -> int:
    return max((depth for _, depth in _depths(spans)), default=0)


def two_backlogs(
    submit: Submit, gather: Gather, tasks: int, late: float, pair: tuple[str, str]
) -> tuple[list[Span], list[Span], float]:
    a_name, b_name = pair
    start = time.time()
    a = submit(a_name, tasks)
    time.sleep(max(0.0, start + late - time.time()))  # b arrives later: the workload itself
    arrived = time.time()
    b = submit(b_name, tasks)
    return gather(a), gather(b), arrived


# ------------------------------------------------------------------ systems
@contextmanager
def apportion_system(tasks: int, validate: bool) -> Iterator[tuple[Submit, Gather, Any]]:
    from apportion import Client, LocalCluster, config

    workers = [{"name": f"gpu-{i}", "nthreads": 1, "resources": {"GPU": 1}} for i in range(GPUS)]
    with tempfile.TemporaryDirectory() as folder:
        declared: dict[str, dict[str, Any]] = {}
        tokens = {}
        for name, weight, quota in [
            ("even-a", 1, None),
            ("even-b", 1, None),
            ("heavy", 3, None),
            ("light", 1, None),
            ("capped", 1, {"GPU": QUOTA}),
        ]:
            path = Path(folder) / name
            tokens[name] = f"token-{name}"
            path.write_text(tokens[name])
            path.chmod(0o600)
            declared[name] = {"token-file": str(path), "weight": weight}
            if quota:
                declared[name]["quota"] = quota
        settings = {"scheduler.tenants": declared, "scheduler.validate": validate}
        with config.set(settings), LocalCluster(workers=workers) as cluster:
            clients = {n: Client(cluster.scheduler_address, token=t) for n, t in tokens.items()}
            try:

                def submit(tenant: str, count: int) -> list[Any]:
                    client = clients[tenant]
                    return [
                        client.submit(occupy_span, TASK_S, resources={"GPU": 1}, pure=False)
                        for _ in range(count)
                    ]

                def gather(futures: list[Any]) -> list[Span]:
                    return [tuple(s) for s in clients["even-a"].gather(futures)]

                yield submit, gather, clients["even-a"]
            finally:
                for client in clients.values():
                    client.close()


@contextmanager
def dask_system() -> Iterator[tuple[Submit, Gather, Any]]:
    import logging

    from distributed import Client, LocalCluster

    with LocalCluster(
        n_workers=GPUS,
        threads_per_worker=1,
        resources={"GPU": 1},
        dashboard_address=None,
        silence_logs=logging.WARNING,
    ) as cluster:
        clients = {"a": Client(cluster), "b": Client(cluster)}
        try:

            def submit(tenant: str, count: int) -> list[Any]:
                client = clients["a" if tenant.endswith("a") or tenant == "heavy" else "b"]
                return [
                    client.submit(occupy_span, TASK_S, resources={"GPU": 1}, pure=False)
                    for _ in range(count)
                ]

            def gather(futures: list[Any]) -> list[Span]:
                # (by the client that made them: dask gathers no other client's futures)
                return [tuple(s) for s in futures[0].client.gather(futures)] if futures else []

            yield submit, gather, None
        finally:
            for client in clients.values():
                client.close()


@contextmanager
def ray_system() -> Iterator[tuple[Submit, Gather, Any]]:
    import ray

    ray.init(num_cpus=GPUS, resources={"bench_GPU": GPUS}, include_dashboard=False)
    try:
        remote = ray.remote(num_cpus=1, resources={"bench_GPU": 1})(occupy_span)

        def submit(tenant: str, count: int) -> list[Any]:
            return [remote.remote(TASK_S) for _ in range(count)]

        def gather(futures: list[Any]) -> list[Span]:
            return [tuple(s) for s in ray.get(futures)]

        yield submit, gather, None
    finally:
        ray.shutdown()


PAIRS = {"1:1": ("even-a", "even-b"), "3:1": ("heavy", "light")}


def run_system(system: str, tasks: int, late: float) -> dict[str, dict[str, float]]:
    figures: dict[str, dict[str, float]] = {}
    make = {
        "apportion": lambda: apportion_system(tasks, validate=False),
        "dask": dask_system,
        "ray": ray_system,
    }[system]
    with make() as (submit, gather, _):
        for label, pair in PAIRS.items():
            a, b, arrived = two_backlogs(submit, gather, tasks, late, pair)
            figures[label] = share_figures(a, b, arrived, WEIGHTS[label])
    if system == "apportion":
        with apportion_system(tasks, validate=True) as (submit, gather, observer):
            spans = gather(submit("capped", max(200, tasks // 10)))
            problems = observer.check_invariants()
            figures["quota"] = {"peak_gpus": peak(spans), "problems": len(problems)}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000, help="tasks per tenant")
    parser.add_argument("--late", type=float, default=5.0, help="seconds before b arrives")
    parser.add_argument("--systems", default="apportion,dask,ray")
    args = parser.parse_args()
    print(
        f"{GPUS} GPUs, {args.tasks} GPU=1 tasks of {TASK_S * 1000:.0f} ms per tenant, "
        f"b arrives after {args.late:g} s"
    )
    for system in args.systems.split(","):
        try:
            figures = run_system(system, args.tasks, args.late)
        except ImportError as exc:
            print(f"{system:10} not installed ({exc.name})")
            continue
        for label in PAIRS:
            f = figures[label]
            target = 100 * WEIGHTS[label][0] / sum(WEIGHTS[label])
            print(
                f"{system:10} weights {label}: a's share of GPU time per second while both "
                f"wait: median {100 * f['a_share_median']:.1f}% (lowest "
                f"{100 * f['a_share_min']:.1f}%, highest {100 * f['a_share_max']:.1f}%, "
                f"{f['seconds']:.0f} s; target {target:.0f}%); b reached its share "
                f"{f['b_reach_s']:.3f} s after arriving"
            )
        if "quota" in figures:
            q = figures["quota"]
            print(
                f"{system:10} quota GPU={QUOTA}: at most {q['peak_gpus']:.0f} GPUs held at "
                f"once; accounting problems (checked after every batch): {q['problems']:.0f}"
            )


if __name__ == "__main__":
    main()
