"""Summaries of the benchmark runs: medians, ratios, a rich table, JSON and a PNG chart."""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

from benchmarks import floor
from benchmarks.workloads import METRICS, Metric

NA = "n/a"

# The data plane's targets for each transfer over TCP: at least this share of the floor of
# its own shape (loopback TCP into new memory of the same size over a connection used
# before, as a cluster's are, measured in the same run),
# and at least this many times Dask's figure in the same run.
OF_FLOOR = 0.9
OVER_DASK = 1.2
# Peak resident memory of any process: at most this many times the largest payload.
RSS_OVER_PAYLOAD = 1.5
# The rows read against their shape's floor: (metric suffix, label).
TCP_ROWS = (
    ("worker_to_worker", "worker to worker"),
    ("gather", "client gather"),
    ("submit", "client submit as argument"),
)
RSS_ROWS = ("data_peak_rss_sender_mb", "data_peak_rss_receiver_mb", "data_peak_rss_client_mb")


def summarise(
    runs: list[dict[str, Any]], systems: list[str], machine_floor: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Median per system and metric; apportion's advantage over each peer (>1: apportion
    wins); the data plane read against the floors of ``machine_floor`` (see data_plane)."""
    medians: dict[str, dict[str, float]] = {}
    for system in systems:
        medians[system] = {}
        for metric in METRICS:
            values = [
                r["metrics"][metric.name]
                for r in runs
                if r["system"] == system and metric.name in r["metrics"]
            ]
            values = [v for v in values if not math.isnan(v)]
            if values:
                medians[system][metric.name] = statistics.median(values)
    ratios: dict[str, dict[str, float]] = {}
    mine = medians.get("apportion", {})
    for peer in (s for s in systems if s != "apportion"):
        ratios[peer] = {}
        for metric in METRICS:
            a, p = mine.get(metric.name), medians[peer].get(metric.name)
            if a and p:
                ratios[peer][metric.name] = a / p if metric.higher_is_better else p / a
    targets = {
        m.name: {"target": m.target, "met": _meets(m, mine.get(m.name))}
        for m in METRICS
        if m.target is not None and m.name in mine
    }
    summary = {"medians": medians, "ratios": ratios, "targets": targets}
    return {**summary, "data_plane": data_plane(summary, machine_floor)}


def data_plane(summary: dict[str, Any], machine_floor: dict[str, Any] | None) -> dict[str, Any]:
    """Each TCP transfer row of apportion against the floor of its own shape (loopback TCP
    into new memory of the same size, measured in the same run), the cached-loopback
    ratio beside it (for information), and its ratio to Dask; met when it reaches
    ``OF_FLOOR`` of the floor and ``OVER_DASK`` times Dask (where Dask ran). Then each
    peak RSS against ``RSS_OVER_PAYLOAD`` times the largest payload."""
    mine = summary["medians"].get("apportion", {})
    dask = summary["ratios"].get("dask", {})
    cached = (machine_floor or {}).get("loopback_tcp_mb_per_s")
    rows: dict[str, Any] = {}
    sizes = sorted(
        {int(found[1]) for name in mine if (found := re.match(r"data_(\d+)mb_", name))}
        | {int(size) for size in (machine_floor or {}).get("shape_new_mb_per_s", {})}
    )
    for mb in sizes:
        shape = floor.shape_floor(machine_floor, mb)
        for what, label in TCP_ROWS:
            name = f"data_{mb}mb_{what}_mb_per_s"
            value = mine.get(name)
            if value is None:
                continue
            of_floor = value / shape if shape else None
            over_dask = dask.get(name)
            met = None
            if of_floor is not None:
                met = of_floor >= OF_FLOOR and (over_dask is None or over_dask >= OVER_DASK)
            rows[name] = {
                "label": f"{mb} MB array: {label}",
                "mb_per_s": value,
                "floor_mb_per_s": shape,
                "of_floor": of_floor,
                "of_cached_loopback": value / float(cached) if cached else None,
                # The transfer alone as its receiver timed it (request to reply), for
                # information: the row itself also holds a task's round trip.
                "transfer_mb_per_s": mine.get(f"data_{mb}mb_{what}_transfer_mb_per_s"),
                "over_dask": over_dask,
                "task_pass_ms": mine.get(f"data_{mb}mb_task_pass_ms"),
                "met": met,
            }
    payload = max(sizes, default=0)
    for name in RSS_ROWS:
        value = mine.get(name)
        if value is not None and payload:
            rows[name] = {
                "mb": value,
                "payload_mb": payload,
                "over_payload": value / payload,
                "met": value <= RSS_OVER_PAYLOAD * payload,
            }
    return rows


def _meets(metric: Metric, value: float | None) -> bool | None:
    if value is None or metric.target is None:
        return None
    return value >= metric.target if metric.higher_is_better else value <= metric.target


def _fmt(value: float | None) -> str:
    if value is None:
        return NA
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _rows(
    results: dict[str, Any], signs: tuple[str, str], marks: tuple[str, str]
) -> list[list[str]]:
    """One row per metric: label, unit, each system's median, ratios to peers, target.

    ``signs`` are (at least, at most) and ``marks`` (met, missed), as each output spells them.
    """
    systems = list(results["medians"])
    peers = [s for s in systems if s != "apportion"]
    rows = []
    for metric in METRICS:
        row = [metric.label, metric.unit]
        row += [_fmt(results["medians"][s].get(metric.name)) for s in systems]
        for peer in peers:
            ratio = results["ratios"][peer].get(metric.name)
            row.append(NA if ratio is None else f"{ratio:.2f}x")
        target = results["targets"].get(metric.name)
        if target is None:
            row.append("")
        else:
            sign = signs[0] if metric.higher_is_better else signs[1]
            row.append(f"{sign} {_fmt(target['target'])} {marks[0] if target['met'] else marks[1]}")
        rows.append(row)
    return rows


def _stem(results: dict[str, Any]) -> str:
    return "quick-" if results["meta"]["quick"] else ""


def write(results: dict[str, Any], out: Path) -> None:
    stem = _stem(results)
    (out / f"{stem}results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (out / f"{stem}results.md").write_text(markdown(results))
    draw(results, out / f"{stem}ratios.png")


def markdown(results: dict[str, Any]) -> str:
    """The table as Markdown, to paste into or link from the README."""
    systems = list(results["medians"])
    peers = [s for s in systems if s != "apportion"]
    meta = results["meta"]
    head = ["workload", "unit", *(f"{s} {meta['versions'].get(s, '')}" for s in systems)]
    head += [f"x {p}" for p in peers] + ["target"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in _rows(results, (">=", "<="), ("met", "MISSED")):
        lines.append("| " + " | ".join(row) + " |")
    quick = ", quick sizes" if meta["quick"] else ""
    lines += [
        "",
        f"Medians of {meta['reps']} repetitions{quick}, {meta['cpus']} cores, engine "
        f"{meta.get('engine', '?')}, {meta['when']}. Load before: `{meta['uptime_start']}`; "
        f"after: `{meta['uptime_end']}`. x peer: apportion's advantage (>1: apportion "
        "better; for times and bytes, peer/apportion).",
    ]
    if machine := floor.describe(meta.get("floor")):
        lines += ["", machine]
    if scheduler := _scheduler(meta):
        lines += ["", scheduler + "."]
    if plane := _plane_rows(results, ("met", "MISSED")):
        head = ["data plane (TCP)", *PLANE_HEAD]
        lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(row) + " |" for row in plane]
        lines += ["", PLANE_NOTE]
    return "\n".join(lines) + "\n"


PLANE_HEAD = [
    "MB/s",
    "floor (new memory, same size, warm connection)",
    "of floor",
    "of cached loopback",
    "transfer alone (receiver's timing), of floor",
    "x dask",
    "sum where it is (ms)",
    "target",
]
PLANE_NOTE = (
    f"Target per TCP row: at least {OF_FLOOR:.0%} of its floor (loopback TCP into new memory "
    "of the same size over a connection used before, measured in the same run; each row also "
    "holds a task's round trip, or the client's request, which the floor does not; the "
    "transfer alone, where the receiving worker timed it, is shown beside) and at "
    f"least {OVER_DASK:g}x Dask in the "
    "same run; the transfer is timed without a pass over the array (its sum, where it is, "
    "is shown apart); the ratio to cached loopback is for information. Peak RSS: at most "
    f"{RSS_OVER_PAYLOAD:g}x the largest payload."
)


def _plane_rows(results: dict[str, Any], marks: tuple[str, str]) -> list[list[str]]:
    """The data plane's rows (see data_plane) as table cells; ``marks``: (met, missed)."""
    rows = []
    for name, row in results.get("data_plane", {}).items():
        mark = NA if row["met"] is None else marks[0] if row["met"] else marks[1]
        if "mb_per_s" in row:
            rows.append(
                [
                    row["label"],
                    _fmt(row["mb_per_s"]),
                    _fmt(row["floor_mb_per_s"]),
                    _percent(row["of_floor"]),
                    _percent(row["of_cached_loopback"]),
                    _transfer(row.get("transfer_mb_per_s"), row["floor_mb_per_s"]),
                    NA if row["over_dask"] is None else f"{row['over_dask']:.2f}x",
                    _fmt(row["task_pass_ms"]),
                    f"{OF_FLOOR:.0%} of floor, {OVER_DASK:g}x dask {mark}",
                ]
            )
        else:
            label = next(m.label for m in METRICS if m.name == name)
            rows.append(
                [
                    label,
                    f"{_fmt(row['mb'])} MB",
                    f"payload {_fmt(row['payload_mb'])} MB",
                    f"{row['over_payload']:.2f}x payload",
                    "",
                    "",
                    "",
                    "",
                    f"<= {RSS_OVER_PAYLOAD:g}x payload {mark}",
                ]
            )
    return rows


def _transfer(mb_per_s: float | None, floor_mb_per_s: float | None) -> str:
    """A row's transfer alone: its MB/s and its share of the floor."""
    if mb_per_s is None:
        return NA
    share = f" ({mb_per_s / floor_mb_per_s:.0%})" if floor_mb_per_s else ""
    return _fmt(mb_per_s) + share


def _percent(value: float | None) -> str:
    return NA if value is None else f"{value:.0%}"


def _scheduler(meta: dict[str, Any]) -> str:
    """How apportion's scheduler ran ("" for results that did not record it)."""
    compiled = meta.get("scheduler_compiled")
    if compiled is None:
        return ""
    text = "apportion's scheduler: " + ("compiled with mypyc" if compiled else "pure Python")
    if interpreter := meta.get("interpreter"):
        text += f"; every system on Python {meta['python']} ({interpreter})"
    return text


def print_table(results: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    systems = list(results["medians"])
    peers = [s for s in systems if s != "apportion"]
    meta = results["meta"]
    table = Table(
        title=f"medians of {meta['reps']} reps{' (quick sizes)' if meta['quick'] else ''}",
        caption="\n".join(
            line
            for line in (
                f"load: {meta['uptime_start']}  →  {meta['uptime_end']}",
                floor.describe(meta.get("floor")),
                _scheduler(meta),
            )
            if line
        ),
    )
    table.add_column("workload")
    table.add_column("unit")
    for system in systems:
        table.add_column(f"{system} {meta['versions'].get(system, '')}", justify="right")
    for peer in peers:
        table.add_column(f"x {peer}", justify="right")
    table.add_column("target", justify="right")
    for row in _rows(results, ("≥", "≤"), ("[green]✓[/]", "[red]✗[/]")):
        table.add_row(*row)
    Console(width=170).print(table)
    print("x peer: apportion's advantage (>1 = apportion better; for times, peer/apportion)")
    if plane := _plane_rows(results, ("[green]✓[/]", "[red]✗[/]")):
        table = Table(title="data plane (TCP) against the floor of each transfer's shape")
        table.add_column("workload")
        for head in PLANE_HEAD:
            table.add_column(head, justify="right")
        for row in plane:
            table.add_row(*row)
        Console(width=170).print(table)
        print(PLANE_NOTE)


def draw(results: dict[str, Any], path: Path) -> None:
    """Grouped bars: apportion's advantage over each peer per workload, log scale."""
    peers = list(results["ratios"])
    metrics = [m for m in METRICS if any(m.name in results["ratios"][p] for p in peers)]
    if not peers or not metrics:
        return
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no chart (pip install -r benchmarks/requirements.txt)")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.8))
    width = 0.8 / len(peers)
    for i, peer in enumerate(peers):
        xs = [j + (i - (len(peers) - 1) / 2) * width for j in range(len(metrics))]
        ys = [results["ratios"][peer].get(m.name, 0) for m in metrics]
        bars = ax.bar(xs, ys, width, label=f"vs {peer}")
        ax.bar_label(bars, labels=[f"{y:.1f}x" if y else NA for y in ys], fontsize=8)
    ax.axhline(1, color="black", linewidth=0.8)
    ax.axhline(2, color="grey", linewidth=0.8, linestyle="--", label="2x (target vs dask)")
    ax.set_yscale("log")
    ax.set_xticks(range(len(metrics)), [m.label for m in metrics], rotation=20, ha="right")
    ax.set_ylabel("apportion advantage (x better)")
    meta = results["meta"]
    ax.set_title(f"apportion vs peers, medians of {meta['reps']} reps, {meta['cpus']} cores")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
