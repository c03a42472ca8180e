"""``with performance_report("report.html"): ...``: an HTML file of what a block computed;
``with get_task_stream() as ts: ...``: the runs of a block, as data.

The report shows the task stream (each run on its worker's lane, in time, coloured by task
name), each resource's use over time per worker (sampled from the scheduler while the block
runs), and a summary per task name. One self-contained file: inline SVG, no scripts.
"""

from __future__ import annotations

import html
import threading
import time
from collections import defaultdict
from typing import Any

from apportion.client import Client
from apportion.cluster_ops import get_task_stream
from apportion.core.keys import key_prefix  # task names, as the dashboard has them
from apportion.default_client import default_client

WIDTH = 1000
LANE = 18
MARGIN = 80  # room for the workers' names left of the lanes
PALETTE = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2"]


class TaskStream:
    """``with get_task_stream(client) as ts: ...`` then ``ts.data``: the runs of the block."""

    def __init__(self, client: Client | None = None) -> None:
        self.client = client if client is not None else default_client()
        self.data: list[dict[str, Any]] = []
        self.start = 0.0

    def __enter__(self) -> TaskStream:
        get_task_stream(self.client.session, time.time())  # starts recording, if not yet
        self.start = time.time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.data = get_task_stream(self.client.session, self.start)


class performance_report:
    """Write an HTML report of the block to ``filename``; ``interval``: seconds between
    samples of resource use."""

    def __init__(
        self,
        filename: str = "apportion-report.html",
        client: Client | None = None,
        interval: float = 0.1,
    ) -> None:
        self.filename = filename
        self.client = client if client is not None else default_client()
        self.interval = interval
        self.samples: list[tuple[float, dict[str, dict[str, Any]]]] = []
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        self.start = self.stop = 0.0

    def __enter__(self) -> performance_report:
        get_task_stream(self.client.session, time.time())  # the scheduler records from now on
        self.start = time.time()
        self._sample()
        self._sampler = threading.Thread(target=self._sample_until_stopped, daemon=True)
        self._sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join()
        self._sample()
        self.stop = time.time()
        runs = get_task_stream(self.client.session, self.start)
        with open(self.filename, "w", encoding="utf-8") as f:
            f.write(render(runs, self.samples, self.start, self.stop))

    def _sample(self) -> None:
        workers = self.client.scheduler_info()["workers"]
        self.samples.append(
            (
                time.time(),
                {
                    w["name"]: {"total": w["resources"], "used": w["used_resources"]}
                    for w in workers.values()
                },
            )
        )

    def _sample_until_stopped(self) -> None:
        while not self._stop.wait(self.interval):  # sampling pace, not synchronisation
            try:
                self._sample()
            except Exception:
                return  # the client closed: the report has what it has


def render(
    runs: list[dict[str, Any]],
    samples: list[tuple[float, dict[str, dict[str, Any]]]],
    start: float,
    stop: float,
) -> str:
    """The report's HTML (pure: tested without a cluster)."""
    span = max(stop - start, 1e-6)

    def x(t: float) -> float:
        return round(MARGIN + (min(max(t, start), stop) - start) / span * (WIDTH - MARGIN), 1)

    prefixes = sorted({key_prefix(r["key"]) for r in runs})
    colour = {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(prefixes)}
    workers = sorted({r["worker"] for r in runs} | {w for _, seen in samples for w in seen})
    rows = _rows(runs, workers)
    bars = [
        f'<rect x="{x(r["start"])}" y="{row * LANE}" '
        f'width="{max(x(r["stop"]) - x(r["start"]), 1)}" height="{LANE - 3}" '
        f'fill="{"#000" if r["state"] == "erred" else colour[key_prefix(r["key"])]}">'
        f"<title>{html.escape(r['key'])} on {html.escape(r['worker'])}: "
        f"{r['stop'] - r['start']:.3f}s {r['state']}</title></rect>"
        for r, row in zip(runs, rows, strict=True)
    ]
    first_rows: dict[str, int] = {}
    for r, row in zip(runs, rows, strict=True):
        first_rows[r["worker"]] = min(row, first_rows.get(r["worker"], row))
    labels = [
        f'<text x="2" y="{row * LANE + 12}" font-size="11">{html.escape(w)}</text>'
        for w, row in first_rows.items()
    ]
    height = (max(rows, default=-1) + 1) * LANE
    stream = _svg(height, labels + bars)
    sections = [f"<h2>Task stream ({len(runs)} runs, {span:.2f}s)</h2>", stream, _legend(colour)]
    for resource in sorted({r for _, seen in samples for w in seen.values() for r in w["total"]}):
        sections.append(f"<h2>{html.escape(resource)} in use</h2>")
        sections.append(_usage(resource, samples, workers, x))
    sections.append(_summary(runs, samples))
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>apportion performance "
        "report</title><style>body{font-family:sans-serif}td,th{padding:2px 8px}</style>"
        "</head><body><h1>apportion performance report</h1>"
        f"<p>{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(start))}, "
        f"{span:.2f} seconds</p>{''.join(sections)}</body></html>"
    )


def _rows(runs: list[dict[str, Any]], workers: list[str]) -> list[int]:
    """Each run's row (aligned with ``runs``): a worker's runs that overlap in time go on
    rows of their own (one per thread in use), the workers one below the other."""
    placed = [0] * len(runs)
    base = 0
    for worker in workers:
        ends: list[float] = []  # per row of this worker: when its last run ended
        mine = sorted(
            (i for i, r in enumerate(runs) if r["worker"] == worker), key=lambda i: runs[i]["start"]
        )
        for i in mine:
            row = next((n for n, end in enumerate(ends) if end <= runs[i]["start"]), len(ends))
            if row == len(ends):
                ends.append(0.0)
            ends[row] = runs[i]["stop"]
            placed[i] = base + row
        base += max(len(ends), 1)
    return placed


def _svg(height: int, parts: list[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH + 10}" height="{height + 4}">'
        f"{''.join(parts)}</svg>"
    )


def _legend(colour: dict[str, str]) -> str:
    items = "".join(
        f'<span style="color:{c}">&#9632;</span> {html.escape(p)} ' for p, c in colour.items()
    )
    return f"<p>{items}</p>"


def _usage(
    resource: str,
    samples: list[tuple[float, dict[str, dict[str, Any]]]],
    workers: list[str],
    x: Any,
) -> str:
    """One step line per worker: the units of ``resource`` in use, over its total."""
    height = 60
    parts = []
    for i, worker in enumerate(w for w in workers if any(w in seen for _, seen in samples)):
        points = []
        total = 0.0
        for _, seen in samples:
            if worker in seen:
                total = max(total, float(seen[worker]["total"].get(resource, 0)))
        if not total:
            continue
        for t, seen in samples:
            if worker in seen:
                used = float(seen[worker]["used"].get(resource, 0))
                points.append(f"{x(t)},{round(height - used / total * (height - 4), 1)}")
        colour = PALETTE[i % len(PALETTE)]
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2" '
            f'points="{" ".join(points)}"><title>{html.escape(worker)} (of {total:g})'
            "</title></polyline>"
        )
        parts.append(
            f'<text x="{WIDTH - 150}" y="{12 + 12 * i}" font-size="11" fill="{colour}">'
            f"{html.escape(worker)}: of {total:g}</text>"
        )
    return _svg(height, parts)


def _summary(
    runs: list[dict[str, Any]], samples: list[tuple[float, dict[str, dict[str, Any]]]]
) -> str:
    by_prefix: dict[str, list[float]] = defaultdict(list)
    for r in runs:
        by_prefix[key_prefix(r["key"])].append(r["stop"] - r["start"])
    rows = "".join(
        f"<tr><td>{html.escape(p)}</td><td>{len(d)}</td><td>{sum(d):.3f}</td>"
        f"<td>{sum(d) / len(d):.4f}</td></tr>"
        for p, d in sorted(by_prefix.items())
    )
    peaks: dict[tuple[str, str], float] = {}
    for _, seen in samples:
        for worker, books in seen.items():
            for resource, used in books["used"].items():
                key = (worker, resource)
                peaks[key] = max(peaks.get(key, 0.0), float(used))
    peak_rows = "".join(
        f"<tr><td>{html.escape(w)}</td><td>{html.escape(r)}</td><td>{used:g}</td></tr>"
        for (w, r), used in sorted(peaks.items())
    )
    return (
        "<h2>Summary</h2><table><tr><th>task</th><th>runs</th><th>seconds</th>"
        f"<th>mean</th></tr>{rows}</table>"
        "<h2>Peak use sampled</h2><table><tr><th>worker</th><th>resource</th><th>peak</th>"
        f"</tr>{peak_rows}</table>"
    )
