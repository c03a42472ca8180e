"""The scheduler and workers paused for memory: nothing is placed on a paused worker;
it takes work again once it resumes."""

from __future__ import annotations

from tests.unit.sim import Sim, task


def pause(sim: Sim, address: str, paused: bool = True) -> None:
    status = "paused" if paused else "running"
    sim.state.handle_worker_status(address, {"op": "worker-status", "status": status})
    sim.step()


def test_a_paused_worker_is_not_chosen_while_another_fits() -> None:
    sim = Sim()
    sim.add_client("c")
    sim.add_worker("full")
    sim.add_worker("roomy")
    pause(sim, "full")
    sim.submit_many([task(f"t{i}") for i in range(3)])
    assert set(sim.computed_keys("full")) == set()
    assert sim.computed_keys("roomy")
    info = sim.state.info()["workers"]
    assert info["full"]["status"] == "paused" and info["roomy"]["status"] == "running"


def test_work_waits_for_a_paused_worker_and_goes_there_once_it_resumes() -> None:
    sim = Sim()
    sim.add_client("c")
    sim.add_worker("only", nthreads=2)
    pause(sim, "only")
    sim.submit_many([task(f"t{i}") for i in range(4)])
    assert sim.computed_keys() == []
    assert sim.states() == dict.fromkeys(["t0", "t1", "t2", "t3"], "queued")
    pause(sim, "only", paused=False)
    assert len(sim.computed_keys("only")) == 3  # its threads and its prefetch
    for key in sim.outstanding():
        sim.finish(key)
    assert sim.outstanding() == ["t3"]


def test_runs_on_a_worker_that_pauses_finish_and_free_their_resources() -> None:
    sim = Sim()
    sim.add_client("c")
    sim.add_worker("w", {"GPU": 1})
    sim.submit("a", resources={"GPU": 1})
    pause(sim, "w")
    sim.submit("b", resources={"GPU": 1})
    sim.finish("a")
    assert sim.used("w") == {"GPU": 0} and sim.outstanding() == []
    pause(sim, "w", paused=False)
    assert sim.outstanding() == ["b"] and sim.used("w") == {"GPU": 1}


def test_memory_reports_are_kept_for_scheduler_info() -> None:
    sim = Sim()
    sim.add_worker("w")
    report = {"limit": 100, "rss": 50, "spilled_total": 10, "spilled_count": 1}
    sim.state.handle_heartbeat("w", report)
    assert sim.state.info()["workers"]["w"]["memory"] == report


def test_metrics_show_memory_spilling_and_pausing() -> None:
    from tests.unit.test_observability import scrape

    sim = Sim()
    sim.add_worker("w")
    report = {
        "limit": 1000,
        "rss": 600,
        "managed": 300,
        "spilled_bytes": 200,
        "spilled_count": 3,
        "spilled_total": 400,
        "unspilled_count": 1,
        "unspilled_total": 200,
    }
    sim.state.handle_heartbeat("w", report)
    pause(sim, "w")
    m = scrape(sim)
    assert m[("apportion_worker_paused", (("worker", "w"),))] == 1
    assert m[("apportion_worker_memory_bytes", (("kind", "spilled"), ("worker", "w")))] == 200
    assert m[("apportion_worker_memory_bytes", (("kind", "rss"), ("worker", "w")))] == 600
    assert m[("apportion_worker_spilled_total", (("direction", "out"), ("worker", "w")))] == 3
    out = (("direction", "out"), ("worker", "w"))
    assert m[("apportion_worker_spilled_bytes_total", out)] == 400


def test_the_dashboard_shows_a_paused_worker_and_its_memory() -> None:
    from apportion.scheduler import dashboard

    sim = Sim()
    sim.add_worker("w")
    sim.state.handle_heartbeat("w", {"limit": 2**30, "rss": 2**29, "spilled_bytes": 3 * 2**20})
    pause(sim, "w")
    html = dashboard.render_sections(dashboard.view(sim.state, sim.state.events, "x"))["workers"]
    assert "paused for memory" in html
    assert "memory 512.00 MiB of 1.00 GiB · 3.00 MiB spilled" in html


def test_the_dashboard_shows_a_worker_at_its_spilling_level() -> None:
    from apportion.scheduler import dashboard

    sim = Sim()
    sim.add_worker("w")
    sim.state.handle_heartbeat("w", {"limit": 2**30, "rss": 2**29, "nearly_full": True})
    html = dashboard.render_sections(dashboard.view(sim.state, sim.state.events, "x"))["workers"]
    assert "spilling: work goes elsewhere" in html
    sim.state.handle_heartbeat("w", {"limit": 2**30, "rss": 2**28, "nearly_full": False})
    html = dashboard.render_sections(dashboard.view(sim.state, sim.state.events, "x"))["workers"]
    assert "spilling" not in html


def test_clients_are_told_once_each_time_a_worker_pauses_with_its_memory() -> None:
    sim = Sim()
    sim.add_client("c")
    sim.add_worker("w")
    paused = {"op": "worker-status", "status": "paused", "memory": {"rss": 900, "limit": 1000}}
    for _ in range(2):  # two pauses, each reported twice
        sim.state.handle_worker_status("w", paused)
        sim.state.handle_worker_status("w", paused)
        sim.step()
        pause(sim, "w", paused=False)
    notices = sim.client_messages("worker-paused")
    assert notices == 2 * [
        {"op": "worker-paused", "worker": "w", "address": "w", "rss": 900, "limit": 1000}
    ]
    assert sim.state.info()["workers"]["w"]["memory"] == {"rss": 900, "limit": 1000}
