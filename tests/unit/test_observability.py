"""Dashboard view, /metrics, the event log, task output capture, recent log lines and
progress bars: the pure parts, driven without processes."""

from __future__ import annotations

import io
import sys
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from apportion.scheduler import dashboard
from apportion.scheduler.events import DURATION_BUCKETS, EventLog
from apportion.scheduler.metrics import exposition, scheduler_registry
from apportion.worker import output
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from apportion import config
from apportion.core.keys import key_prefix
from apportion.logs import RecentLines, show_task_output
from apportion.progress import Progress, render_html, render_text, tally
from apportion.reprs import dashboard_link
from tests.unit.sim import Sim


def gpu_sim() -> Sim:
    """gpu-a (GPU=2) running two GPU tasks, one more queued, one no worker can run."""
    sim = Sim()
    sim.state.events = EventLog(clock=lambda: 1000.0)
    sim.add_client("c")
    sim.add_worker("gpu-a", {"GPU": 2}, nthreads=4)
    sim.add_worker("cpu", {}, nthreads=1)
    for i in range(3):
        sim.submit(f"train-{i}", resources={"GPU": 1})
    sim.submit("huge-0", resources={"GPU": 8})
    return sim


def report(sim: Sim, key: str, **fields: Any) -> None:
    """The worker running ``key`` reports it finished, with the fields a worker adds."""
    address, run_id = sim.run_of(key)
    del sim.runs[address][run_id]
    sim.state.handle_task_finished(address, {"run_id": run_id, "nbytes": 8, **fields})
    sim.step()


# -------------------------------------------------------------------- event log
def test_key_prefix_is_the_task_name_before_the_token() -> None:
    assert key_prefix("inc-5f3a9c") == "inc"
    assert key_prefix("load-file-00ab") == "load-file"
    assert key_prefix("plain") == "plain"


def test_event_log_folds_durations_into_histograms_only_when_read() -> None:
    log = EventLog(clock=lambda: 0.0)
    log.task_ended("train-1", "gpu-a", "memory", {"start": 10.0, "stop": 10.3, "fetched": 2})
    log.task_ended("train-2", "gpu-a", "erred", {"start": 10.0, "stop": 12.0})
    assert log.durations == {}  # nothing done on the recording path
    histogram = log.fold()["train"]
    cumulative = dict(histogram.cumulative())
    assert cumulative["0.1"] == 0 and cumulative["0.5"] == 1 and cumulative["5.0"] == 2
    assert cumulative["+Inf"] == 2 and len(cumulative) == len(DURATION_BUCKETS) + 1
    assert histogram.total == pytest.approx(2.3)
    assert log.ended == {"memory": 1, "erred": 1}
    assert log.outcomes["train"] == {"memory": 1, "erred": 1}
    assert log.transfers == 2
    assert [r.key for r in log.recent_runs(1)] == ["train-2"]
    assert log.recorded == 2


# ---------------------------------------------------------------- state hooks
def test_state_records_runs_and_worker_changes_in_the_event_log() -> None:
    sim = gpu_sim()
    report(sim, "train-0", start=5.0, stop=6.5, units={"GPU": [1]})
    sim.remove_worker("cpu")
    events = sim.state.events
    assert events is not None
    (run,) = events.recent_runs(10)
    assert (run.key, run.worker, run.state, run.units) == (
        "train-0",
        "gpu-a",
        "memory",
        {"GPU": [1]},
    )
    assert run.stop - run.start == 1.5
    assert [(e.kind, e.name) for e in events.workers] == [
        ("joined", "gpu-a"),
        ("joined", "cpu"),
        ("left", "cpu"),
    ]


def test_printed_output_reaches_the_waiting_client_before_the_result() -> None:
    sim = gpu_sim()
    report(sim, "train-0", output=[["stdout", "epoch 1\n"]])
    ops = sim.client_ops("train-0")
    assert ops[:2] == ["task-output", "task-finished"]
    (message,) = sim.client_messages("task-output")
    assert message["worker"] == "gpu-a" and message["output"] == [["stdout", "epoch 1\n"]]


def test_no_event_log_records_nothing() -> None:
    sim = Sim()
    sim.add_client("c")
    sim.add_worker("w", {"GPU": 1})
    sim.submit("t-1", resources={"GPU": 1})
    report(sim, "t-1", start=1.0, stop=2.0)
    assert sim.state.events is None
    assert sim.client_ops("t-1") == ["task-finished"]


# -------------------------------------------------------------------- dashboard
def test_dashboard_view_shows_units_held_waiting_demand_and_progress() -> None:
    sim = gpu_sim()
    data = dashboard.view(sim.state, sim.state.events, "tcp://s:1")
    gpu_a = next(w for w in data["workers"] if w.name == "gpu-a")
    (gpu,) = gpu_a.resources
    assert (gpu.name, gpu.total, gpu.used, gpu.free) == ("GPU", 2, 2, 0)
    assert sorted(u.task for u in gpu.units) == ["train-0", "train-1"]
    assert data["queued"] == [{"resources": "GPU=1", "tasks": 1}]
    (nowhere,) = data["no_worker"]
    assert nowhere["resources"] == "GPU=8" and "most any worker has is 2" in nowhere["why"]
    rows = {p.prefix: p for p in data["progress"]}
    assert (rows["train"].processing, rows["train"].waiting) == (2, 1)

    report(sim, "train-0", start=1.0, stop=2.0)
    rows = {p.prefix: p for p in dashboard.progress(sim.state, sim.state.events)}
    assert (rows["train"].memory, rows["train"].processing, rows["train"].waiting) == (1, 2, 0)


def test_dashboard_puts_each_run_on_the_units_its_worker_reported() -> None:
    sim = gpu_sim()
    events = sim.state.events
    assert events is not None
    _, run_1 = sim.run_of("train-1")
    events.heartbeat("gpu-a", [[run_1, {"GPU": [0]}]])  # train-0 not reported yet
    (gpu,) = dashboard.view(sim.state, events, "x")["workers"][0].resources
    assert [(u.index, u.task, u.reported) for u in gpu.units] == [
        (0, "train-1", True),
        (1, "train-0", False),
    ]
    html = dashboard.render_sections(dashboard.view(sim.state, events, "x"))["workers"]
    assert "#0 train-1" in html and "#1 train-0" not in html
    events.heartbeat("gpu-a", None)  # nothing holds units any more
    assert events.units == {}


def test_dashboard_sections_render_the_view_and_escape_task_names() -> None:
    sim = gpu_sim()
    sim.submit("<script>alert(1)</script>-1", resources={"GPU": 1})
    sections = dashboard.render_sections(dashboard.view(sim.state, sim.state.events, "x"))
    assert set(sections) == set(dashboard.SECTIONS)
    workers = sections["workers"]
    assert 'data-worker="gpu-a"' in workers and "2/2 in use" in workers
    assert "<script>alert" not in "".join(sections.values())
    assert "no-worker" in sections["waiting"] and "GPU=8" in sections["waiting"]
    page = dashboard.render_page(dashboard.view(sim.state, sim.state.events, "x")).decode()
    assert page.count("<section") == len(dashboard.SECTIONS)
    assert "EventSource" in page


def test_shared_rendering_renders_once_per_interval_and_within_its_budget() -> None:
    now, cpu = [0.0], [0.0]
    cost = [0.001]  # CPU seconds one rendering takes
    made = []

    def make() -> dict[str, Any]:
        made.append(1)
        cpu[0] += cost[0]
        return dashboard.view(Sim().state, None, "x")

    shared = dashboard.SharedRendering(make, clock=lambda: now[0], cpu=lambda: cpu[0])
    shared.sections()
    shared.sections()  # a second page, the same tick: the same rendering
    assert len(made) == 1
    now[0] += dashboard.PUSH_INTERVAL
    shared.sections()
    assert len(made) == 2
    # A large backlog: renderings take 0.1 s of CPU. An idle scheduler renders once its
    # wall-clock budget allows it...
    cost[0] = 0.1
    now[0] += dashboard.PUSH_INTERVAL
    shared.sections()
    assert len(made) == 3
    now[0] += 0.1 / dashboard.RENDER_BUDGET - 1
    shared.sections()
    assert len(made) == 3
    now[0] += 1
    shared.sections()
    assert len(made) == 4
    # ... a busy one (a CPU second per second) once it did 0.1 / RENDER_SHARE of its work.
    busy = 0.1 / (dashboard.RENDER_SHARE + dashboard.RENDER_BUDGET)
    now[0] += busy - 0.5
    cpu[0] += busy - 0.5
    shared.sections()
    assert len(made) == 4
    now[0] += 0.5
    cpu[0] += 0.5
    shared.sections()
    assert len(made) == 5


@pytest.mark.parametrize(
    ("since_wall", "since_cpu", "took", "due"),
    [
        (0.5, 10.0, 0.0, False),  # never more often than PUSH_INTERVAL
        (1.0, 0.0, 0.001, True),  # cheap: every interval, idle or not
        (1.0, 1.0, 0.05, False),  # 5% of what the scheduler did meanwhile: too much
        (1.0, 2.5, 0.05, True),  # 2% of it
        (30.0, 0.0, 0.05, True),  # idle: 0.2% of the wall clock
    ],
)
def test_renderings_stay_within_a_share_of_the_schedulers_cpu(
    since_wall: float, since_cpu: float, took: float, due: bool
) -> None:
    assert dashboard.render_due(since_wall, since_cpu, took) is due


# ----------------------------------------------------------------------- metrics
def scrape(sim: Sim) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = exposition(scheduler_registry(SimpleNamespace(state=sim.state))).decode()  # type: ignore[arg-type]
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metrics_read_resources_tasks_and_waiting_demand_from_the_state() -> None:
    sim = gpu_sim()
    report(sim, "train-0", start=1.0, stop=1.2, fetched=1)
    m = scrape(sim)
    assert m[("apportion_worker_resource_total", (("resource", "GPU"), ("worker", "gpu-a")))] == 2
    assert m[("apportion_worker_resource_used", (("resource", "GPU"), ("worker", "gpu-a")))] == 2
    assert m[("apportion_tasks", (("state", "processing"),))] == 2
    assert m[("apportion_tasks", (("state", "no-worker"),))] == 1
    assert m[("apportion_waiting_tasks", (("reason", "no-worker"), ("resources", "GPU=8")))] == 1
    assert m[("apportion_connections", (("role", "worker"),))] == 2
    bucket = ("apportion_task_duration_seconds_bucket", (("le", "0.5"), ("prefix", "train")))
    assert m[bucket] == 1
    assert m[("apportion_task_runs_total", (("state", "memory"),))] == 1
    assert m[("apportion_transfers_total", ())] == 1
    assert ("process_cpu_seconds_total", ()) in m


# ---------------------------------------------------------------- task output
def test_output_is_captured_per_task_thread_and_cut_when_huge(capsys: Any) -> None:
    output.install()
    seen: dict[str, list[list[str]]] = {}

    def task(name: str, text: str) -> None:
        output.begin(SimpleNamespace())
        print(text)
        print(f"careful {name}", file=sys.stderr)
        seen[name] = output.end()

    threads = [threading.Thread(target=task, args=(n, f"from {n}")) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("not a task")
    assert seen["a"] == [["stdout", "from a\n"], ["stderr", "careful a\n"]]
    assert capsys.readouterr().out == "not a task\n"

    output.begin(SimpleNamespace())
    print("x" * (output.MAX_OUTPUT_CHARS + 10))
    cut = output.end()
    assert sum(len(text) for _, text in cut[:-1]) == output.MAX_OUTPUT_CHARS
    assert "output cut" in cut[-1][1]


def test_a_running_tasks_output_goes_out_with_each_heartbeat_and_the_rest_at_its_end() -> None:
    output.install()
    running = SimpleNamespace(run_id=7)
    sent: list[dict[str, Any]] = []
    output.begin(running)
    print("epoch 1")
    output.send_running_output([running], sent.append)
    output.send_running_output([running], sent.append)  # nothing new: nothing sent
    print("epoch 2")
    rest = output.end()
    assert sent == [{"op": "task-output", "run_id": 7, "output": [["stdout", "epoch 1\n"]]}]
    assert rest == [["stdout", "epoch 2\n"]]


def test_output_of_a_run_still_going_reaches_its_clients() -> None:
    sim = gpu_sim()
    address, run_id = sim.run_of("train-0")
    sim.state.handle_task_output(address, {"run_id": run_id, "output": [["stdout", "1\n"]]})
    sim.state.handle_task_output(address, {"run_id": 999, "output": [["stdout", "?\n"]]})
    sim.step()
    (message,) = sim.client_messages("task-output")
    assert (message["key"], message["worker"]) == ("train-0", "gpu-a")


def test_forwarded_output_is_printed_with_the_worker_name() -> None:
    out, err = io.StringIO(), io.StringIO()
    message = {"worker": "gpu-a", "output": [["stdout", "a\nb"], ["stderr", "oops\n"]]}
    show_task_output(message, out, err)
    assert out.getvalue() == "(gpu-a) a\n(gpu-a) b\n"
    assert err.getvalue() == "(gpu-a) oops\n"
    with config.set({"client.forward-output": False}):
        show_task_output(message, out, err)
    assert out.getvalue() == "(gpu-a) a\n(gpu-a) b\n"
    for malformed in ("text", [["stdout"]], [["stdout", 5]], None):
        show_task_output({"worker": "w", "output": malformed}, out, err)  # no exception
    assert out.getvalue() == "(gpu-a) a\n(gpu-a) b\n"


def test_recent_lines_keep_only_the_last_ones() -> None:
    import logging

    handler = RecentLines(maxlen=3)
    logger = logging.getLogger("apportion.test-recent")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        for i in range(5):
            logger.info("line %d", i)
    finally:
        logger.removeHandler(handler)
    assert [line.rsplit(" ", 1)[1] for line in handler.lines] == ["2", "3", "4"]
    assert "apportion.test-recent INFO line 4" in handler.lines[-1]


# ----------------------------------------------------------------------- progress
class FakeFuture:
    def __init__(self, key: str, status: str = "pending") -> None:
        self.key = key
        self.status = status

    def done(self) -> bool:
        return self.status != "pending"


def test_progress_tallies_and_draws_per_task_name() -> None:
    futures = [FakeFuture("load-1", "finished"), FakeFuture("load-2")]
    futures += [FakeFuture("train-1", "error"), FakeFuture("train-2", "finished")]
    rows = tally(futures)
    assert [(r.prefix, r.done, r.total, r.erred) for r in rows] == [
        ("load", 1, 2, 0),
        ("train", 2, 2, 1),
    ]
    text = render_text(rows, width=10)
    assert text.splitlines() == [
        "load  [#####.....] 1/2",
        "train [##########] 2/2, 1 erred",
    ]
    assert "train" in render_html(rows) and "1 erred" in render_html(rows)


def test_progress_in_a_terminal_draws_until_every_future_is_done() -> None:
    futures = [FakeFuture(f"train-{i}") for i in range(3)]
    console = Console(file=io.StringIO(), width=100, force_terminal=False)
    watcher = Progress(futures, notebook=False, console=console).start()
    assert not watcher.finished.wait(0.05)  # still pending: still watching
    for f in futures:
        f.status = "finished"
    assert watcher.wait(timeout=30)
    assert "3/3" in console.file.getvalue()  # type: ignore[attr-defined]


def test_progress_refuses_things_that_are_not_futures() -> None:
    from apportion import progress

    with pytest.raises(TypeError, match="takes futures"):
        progress([1, 2], wait=False)


def test_dashboard_link_carries_the_token_only_when_there_is_one() -> None:
    assert dashboard_link("tcp://10.0.0.5:8786", 8787, "a/b") == (
        "http://10.0.0.5:8787/dashboard?token=a%2Fb"
    )
    assert dashboard_link("tcp://h:8786", 8787, None) == "http://h:8787/dashboard"
    assert dashboard_link("tcp://h:8786", None, "t") is None


def test_a_tls_scheduler_links_its_dashboard_over_https() -> None:
    assert dashboard_link("tls://10.0.0.5:8786", 8787, None) == "https://10.0.0.5:8787/dashboard"
    assert dashboard_link("tcp://10.0.0.5:8786", 8787, None) == "http://10.0.0.5:8787/dashboard"
