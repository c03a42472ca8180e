"""The dashboard: what the scheduler knows, drawn around resources.

``view()`` is a pure function of the scheduler's state and event log to plain data;
the templates in ``templates/`` turn it into HTML, on the server. The page loads the
sections once and then receives them again, rendered, through server-sent events
(``/dashboard/events``): the browser's script only swaps them in. One rendering is
shared by every open page per tick, and none is made while no page is open.
"""

from __future__ import annotations

import collections
import functools
import html
import itertools
import operator
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tornado.template
from apportion.scheduler.events import EventLog
from apportion.scheduler.placement import explain_no_worker

from apportion.core.events import TaskRun
from apportion.core.keys import key_prefix
from apportion.memory_limit import format_size
from apportion.resources import format_resources

if TYPE_CHECKING:
    from apportion.scheduler.model import WorkerState
    from apportion.scheduler.state import SchedulerState

# Resources with at most this many whole units are drawn unit by unit (GPU #0, #1...).
MAX_DRAWN_UNITS = 64
# The task stream shows this many seconds and at most this many runs.
STREAM_SECONDS = 20.0
STREAM_RUNS = 150
# Seconds between updates pushed to an open page.
PUSH_INTERVAL = 1.0
# Renderings of updates take at most this share of the CPU time the scheduler spends on
# its own work, plus this share of the wall clock (what lets an idle scheduler with a
# large backlog update its page now and then): see render_due.
RENDER_SHARE = 0.02
RENDER_BUDGET = 0.002

WAITING_STATES = frozenset({"released", "waiting", "queued", "no-worker"})
TEMPLATES = tornado.template.Loader(str(Path(__file__).with_name("templates")))
SECTIONS = (
    "summary",
    "kubernetes",
    "workers",
    "tenants",
    "waiting",
    "progress",
    "stream",
    "events",
)


@dataclass
class Unit:
    index: int
    task: str | None = None  # the key of the task holding it
    # The worker said this task holds this very unit (its last heartbeat); otherwise the
    # task holds one of the resource's units not yet reported.
    reported: bool = False


@dataclass
class ResourceView:
    name: str
    total: float
    used: float
    units: list[Unit] | None  # for whole-number resources small enough to draw

    @property
    def free(self) -> float:
        return self.total - self.used

    @property
    def percent(self) -> float:
        return 100.0 * self.used / self.total if self.total else 0.0


@dataclass
class WorkerView:
    name: str
    address: str
    nthreads: int
    running: list[str]
    retiring: bool
    results: int
    resources: list[ResourceView] = field(default_factory=list)
    paused: bool = False
    # At its spilling level: work goes elsewhere while another worker can take it.
    nearly_full: bool = False
    # Its memory as of its last heartbeat ("" without a limit): used, limit, spilled.
    memory: str = ""


@dataclass
class PrefixProgress:
    prefix: str
    waiting: int = 0
    processing: int = 0
    memory: int = 0  # runs finished
    erred: int = 0

    @property
    def total(self) -> int:
        return self.waiting + self.processing + self.memory + self.erred


def worker_view(ws: WorkerState, held: dict[int, dict[str, list[int]]] | None = None) -> WorkerView:
    running = [ts for ts in ws.processing.values() if ts.processing_on is ws]
    view = WorkerView(
        ws.name,
        ws.address,
        ws.nthreads,
        [ts.key for ts in running],
        ws.retiring,
        len(ws.has_what),
        paused=ws.paused,
        nearly_full=ws.nearly_full and not ws.paused,
        memory=memory_text(ws.memory),
    )
    for name, total in sorted(ws.total.items()):
        units = None
        if float(total).is_integer() and 0 < total <= MAX_DRAWN_UNITS:
            units = _units(name, int(total), ws, held or {})
        view.resources.append(ResourceView(name, total, ws.used.get(name, 0), units))
    return view


def memory_text(report: dict[str, Any]) -> str:
    """A worker's memory report (its heartbeat's) in a few words."""
    if not report.get("limit"):
        return ""
    text = f"memory {format_size(report.get('rss', 0))} of {format_size(report['limit'])}"
    if report.get("spilled_bytes"):
        text += f" · {format_size(report['spilled_bytes'])} spilled"
    return text


def _units(
    name: str, total: int, ws: WorkerState, held: dict[int, dict[str, list[int]]]
) -> list[Unit]:
    """One entry per unit of a resource, with the run holding it. The worker picks the
    unit numbers and reports them with its heartbeat (``held``: run id -> units); a run
    started since then takes the first units not reported taken, for now."""
    units = [Unit(i) for i in range(total)]
    unreported: list[tuple[str, int]] = []
    for run_id, ts in ws.processing.items():
        amount = int(dict(ts.shape).get(name, 0))
        if not amount:
            continue
        numbers = [i for i in held.get(run_id, {}).get(name, ()) if 0 <= i < total]
        for i in numbers:
            units[i].task, units[i].reported = ts.key, True
        unreported.append((ts.key, amount - len(numbers)))
    free = (u for u in units if u.task is None)
    for key, amount in unreported:
        for unit in itertools.islice(free, amount):
            unit.task = key
    return units


Tally = collections.Counter  # (task name prefix, state, demand shape) -> tasks


def tally(state: SchedulerState) -> Tally:
    """The tasks the page counts (all but results held), by name prefix, state and demand:
    one pass serves the progress and the queued demand.

    Results held are most of a busy scheduler's tasks and count toward nothing shown
    (finished runs come from the event log): C code skips them (``compress`` over their
    states) before the per-task step, so a rendering costs per task waiting or running."""
    tasks = state.tasks.values()
    active = itertools.compress(tasks, map(operator.ne, map(_STATE, tasks), _HELD))
    return collections.Counter(
        (ts.key.rpartition("-")[0] or ts.key, ts.state, ts.shape) for ts in active
    )


_STATE = operator.attrgetter("state")
_HELD = itertools.repeat("memory")


def progress(
    state: SchedulerState, events: EventLog | None, counted: Tally | None = None
) -> list[PrefixProgress]:
    """Per task name prefix: tasks waiting and running now, runs finished and failed so far."""
    counted = tally(state) if counted is None else counted
    rows: dict[str, PrefixProgress] = {}
    for (prefix, task_state, _), n in counted.items():
        row = rows.get(prefix) or rows.setdefault(prefix, PrefixProgress(prefix))
        if task_state in WAITING_STATES:
            row.waiting += n
        elif task_state == "processing":
            row.processing += n
    if events is not None:
        for prefix, outcomes in events.outcomes.items():
            row = rows.get(prefix) or rows.setdefault(prefix, PrefixProgress(prefix))
            row.memory += outcomes["memory"]
            row.erred += outcomes["erred"]
    # Names with only results held (counted above as neither) and no runs seen: nothing to show.
    return sorted((r for r in rows.values() if r.total), key=lambda r: r.prefix)


def view(state: SchedulerState, events: EventLog | None, address: str) -> dict[str, Any]:
    """Everything the page shows, as plain data."""
    now = time.time()
    held = events.units if events is not None else {}
    workers = [worker_view(ws, held.get(ws.address)) for ws in state.workers.values()]
    counted = tally(state)
    queued_by_shape: collections.Counter[Any] = collections.Counter()
    for (_, task_state, shape), n in counted.items():
        if task_state == "queued":
            queued_by_shape[shape] += n
    queued = [
        {"resources": format_resources(dict(shape)), "tasks": n, **_tenant(shape)}
        for shape, n in sorted(queued_by_shape.items())
    ]
    tenants = state.settings.tenants
    no_worker = [
        {
            "resources": format_resources(dict(shape)),
            "tasks": len(tasks),
            "why": explain_no_worker(shape, state.workers.values()),
        }
        for shape, tasks in sorted(state.no_worker.items())
    ]
    runs = []
    worker_events = []
    if events is not None:
        runs = [r for r in events.recent_runs(STREAM_RUNS) if r.stop >= now - STREAM_SECONDS]
        worker_events = list(events.workers)[-30:][::-1]
    return {
        "address": address,
        "now": now,
        "workers": workers,
        "clients": len(state.clients),
        "tasks": len(state.tasks),
        "queued": queued,
        "no_worker": no_worker,
        "tenants": [] if tenants is None else tenant_rows(tenants.info(state.ready.counts())),
        "progress": progress(state, events, counted),
        "runs": runs,
        "stream_seconds": STREAM_SECONDS,
        "worker_events": worker_events,
        "recorded": events.recorded if events is not None else 0,
        "cluster": events.cluster if events is not None else None,
    }


def _tenant(shape: Any) -> dict[str, str]:
    """The tenant of a waiting demand, where tenants are declared (scheduler/tenants.py)."""
    tenant = getattr(shape, "tenant", "")
    return {"tenant": tenant} if tenant else {}


def tenant_rows(tenants: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per tenant: weight, share of the cluster, what it holds against its quota,
    and its tasks waiting (over quota among them)."""
    return [
        {
            "name": name,
            "weight": _amount(t["weight"]),
            "share": f"{100 * t['share']:.0f}%",
            "used": format_resources(t["used"]) or "nothing",
            "quota": format_resources(t["quota"]) or "none",
            "runs": t["runs"],
            "waiting": t["waiting"],
            "over_quota": t["over_quota"],
        }
        for name, t in sorted(tenants.items())
    ]


def render_sections(data: dict[str, Any]) -> dict[str, str]:
    """Each section of the page, rendered to HTML."""
    return {
        name: TEMPLATES.load(f"{name}.html").generate(**data, **HELPERS).decode()
        for name in SECTIONS
    }


def render_page(data: dict[str, Any]) -> bytes:
    return TEMPLATES.load("dashboard.html").generate(
        sections=render_sections(data), address=data["address"], interval=PUSH_INTERVAL
    )


def stream_svg(
    runs: list[TaskRun], names: list[str], now: float, seconds: float, height: int = 22
) -> str:
    """The task stream as an SVG: a row per worker, a bar per run over the last
    ``seconds``. Built here rather than in a template: it is the largest part of every
    update, and only the task keys need escaping."""
    row = {name: i for i, name in enumerate(names)}
    size = max(1, len(names)) * height + 18
    parts = [
        f'<svg width="100%" height="{size}" viewBox="0 0 1000 {size}" preserveAspectRatio="none">'
    ]
    for i, name in enumerate(names):
        parts.append(
            f'<text x="2" y="{i * height + 15}" font-size="11" fill="#6b7480">'
            f"{html.escape(name)}</text>"
            f'<line x1="140" x2="1000" y1="{(i + 1) * height}" y2="{(i + 1) * height}" '
            'stroke="#eef0f3"/>'
        )
    scale = 860 / seconds
    for r in runs:
        at = row.get(r.worker)
        if at is None:
            continue
        x0 = 140 + max(0.0, 860 - (now - r.start) * scale)
        x1 = 140 + max(0.0, 860 - (now - r.stop) * scale)
        fill = "#c0392b" if r.state == "erred" else _color(r.prefix)
        units = "".join(f" {res} #{','.join(map(str, n))}" for res, n in r.units.items())
        parts.append(
            f'<rect x="{x0:.1f}" y="{at * height + 3}" width="{max(1.0, x1 - x0):.1f}" '
            f'height="{height - 6}" fill="{fill}"><title>{html.escape(r.key)} on '
            f"{html.escape(r.worker)}{html.escape(units)}: {r.stop - r.start:.3f} s</title></rect>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _amount(value: float) -> str:
    return format_resources({"x": value})[2:] if value else "0"


@functools.lru_cache(maxsize=1024)
def _color(prefix: str) -> str:
    """A stable colour per task name prefix."""
    hue = sum(ord(c) * 31**i for i, c in enumerate(prefix[:16])) % 360
    return f"hsl({hue}, 60%, 55%)"


def _clock(when: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(when))


HELPERS = {
    "amount": _amount,
    "clock": _clock,
    "color": _color,
    "prefix_of": key_prefix,
    "stream_svg": stream_svg,
}


def render_due(since_wall: float, since_cpu: float, took: float) -> bool:
    """Whether to render the page again, ``since_wall`` seconds and ``since_cpu`` seconds
    of the scheduler's CPU time after the last rendering, which took ``took`` CPU seconds.

    A rendering counts every task waiting or running: with a large backlog it takes
    milliseconds, which a busy scheduler would pay per task, so renderings are spaced to
    stay within ``RENDER_SHARE`` of the scheduler's own CPU time (plus ``RENDER_BUDGET``
    of the wall clock), and are never more frequent than ``PUSH_INTERVAL``."""
    if since_wall < PUSH_INTERVAL * 0.9:
        return False
    return took <= RENDER_SHARE * since_cpu + RENDER_BUDGET * since_wall


class SharedRendering:
    """One rendering per ``PUSH_INTERVAL`` at most, whatever the number of open pages, and
    rarer when a rendering is costly for the scheduler (see ``render_due``)."""

    def __init__(
        self, make: Any, clock: Any = time.monotonic, cpu: Any = time.process_time
    ) -> None:
        self.make = make
        self.clock = clock
        self.cpu = cpu
        self._last: tuple[float, float, float] | None = None  # wall, CPU at its end; took
        self._sections: dict[str, str] = {}

    def sections(self) -> dict[str, str]:
        last = self._last
        if last is None or render_due(self.clock() - last[0], self.cpu() - last[1], last[2]):
            started = self.cpu()
            self._sections = render_sections(self.make())
            ended = self.cpu()
            self._last = (self.clock(), ended, ended - started)
        return self._sections
