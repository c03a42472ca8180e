"""One measurement in a fresh process: ``python -m benchmarks.child SYSTEM MODE OUT [--quick]``.

MODE is ``cluster`` (warm up, then tiny/chain/latency on 4 plain workers and the seed
pipeline on its heterogeneous cluster; metrics as JSON in OUT), ``cold_start`` (prints
``READY <seconds in process>`` as soon as a client with 4 workers has run one task; the
parent times it from process start) or ``scheduler`` (the in-process scheduler benchmark).
Running each piece in its own process keeps the systems from sharing an interpreter.
"""

from __future__ import annotations

import json
import sys
import time

from benchmarks.systems import adapter
from benchmarks.workloads import (
    DASK_WORKLOADS,
    HOMOGENEOUS,
    SEED_CLUSTER,
    Sizes,
    data_tls,
    inc,
    stream,
    tls_share_of_tcp,
    warm_up,
)


def run_cluster(system: str, sizes: Sizes, workloads: list[str]) -> dict[str, float]:
    module = adapter(system)
    if not getattr(module, "COMPUTES_DASK_COLLECTIONS", False):
        workloads = [w for w in workloads if w not in DASK_WORKLOADS]
    metrics: dict[str, float] = {}
    for table, seed in ((HOMOGENEOUS, False), (SEED_CLUSTER, True)):
        wanted = [w for w in workloads if w in table]
        if not wanted:
            continue
        with module.session(seed=seed) as session:
            warm_up(session)
            for name in wanted:
                metrics.update(table[name](session, sizes))
    if "stream" in workloads:  # a cluster of its own: the stream's throughput from a cold start
        with module.session(seed=True) as session:
            warm_up(session)
            metrics.update(stream(session, sizes))
    if "data_tls" in workloads and getattr(module, "SUPPORTS_TLS", False):
        import tempfile
        from pathlib import Path

        from benchmarks.tls import make_certificates

        # A cluster of its own, every connection mutual TLS, the same certificates for all.
        with (
            tempfile.TemporaryDirectory(prefix="apportion-bench-tls-") as keys,
            module.session(seed=True, tls=make_certificates(Path(keys))) as session,
        ):
            warm_up(session)
            metrics.update(data_tls(session, sizes))
        metrics.update(tls_share_of_tcp(metrics, sizes))
    return metrics


def run_cold_start(system: str) -> None:
    start = time.perf_counter()
    module = adapter(system)
    with module.session(seed=False) as session:
        assert session.result(session.submit(inc, 1)) == 2
        print(f"READY {time.perf_counter() - start:.6f}", flush=True)


def main(argv: list[str]) -> None:
    system, mode, out = argv[:3]
    sizes = Sizes.quick() if "--quick" in argv else Sizes()
    workloads = next((a.split("=", 1)[1].split(",") for a in argv if a.startswith("--only=")), [])
    if mode == "cold_start":
        run_cold_start(system)
        return
    if mode == "cluster":
        metrics = run_cluster(system, sizes, workloads)
    elif mode == "scheduler":
        metrics = adapter(system).scheduler_only(sizes) or {}
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    with open(out, "w") as f:
        json.dump(metrics, f)


if __name__ == "__main__":
    main(sys.argv[1:])
