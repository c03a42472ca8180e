"""``GET /metrics``: the scheduler's state in Prometheus' text format.

Everything is read from the state machine when Prometheus scrapes (a custom collector),
so nothing is counted on the scheduler's hot path; task durations come from the event
log, folded into histograms at scrape time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from apportion.resources import format_resources

if TYPE_CHECKING:
    from apportion.scheduler.shell import SchedulerShell

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


# (label, field of a worker's memory report) of apportion_worker_memory_bytes.
_MEMORY_GAUGES = (
    ("limit", "limit"),
    ("rss", "rss"),
    ("managed", "managed"),
    ("spilled", "spilled_bytes"),
)


class SchedulerCollector(Collector):
    def __init__(self, scheduler: SchedulerShell) -> None:
        self.scheduler = scheduler

    def collect(self) -> Iterator[Metric]:
        state = self.scheduler.state
        total = GaugeMetricFamily(
            "apportion_worker_resource_total",
            "Amount of a resource a worker declared",
            labels=["worker", "resource"],
        )
        used = GaugeMetricFamily(
            "apportion_worker_resource_used",
            "Amount of a resource held by the tasks a worker runs",
            labels=["worker", "resource"],
        )
        processing = GaugeMetricFamily(
            "apportion_worker_tasks_processing",
            "Tasks assigned to a worker and not yet reported over",
            labels=["worker"],
        )
        held = GaugeMetricFamily(
            "apportion_worker_results", "Results a worker holds", labels=["worker"]
        )
        retiring = GaugeMetricFamily(
            "apportion_worker_retiring", "1 while a worker is being retired", labels=["worker"]
        )
        paused = GaugeMetricFamily(
            "apportion_worker_paused",
            "1 while a worker is paused for memory (it starts no new task)",
            labels=["worker"],
        )
        memory = GaugeMetricFamily(
            "apportion_worker_memory_bytes",
            "A worker's memory, by kind: limit, rss (the process), managed (results held in "
            "memory), spilled (results on disk now); as of its last heartbeat",
            labels=["worker", "kind"],
        )
        spilled = CounterMetricFamily(
            "apportion_worker_spilled",
            "Results a worker wrote to disk (direction=out) or read back (direction=in) since "
            "it started",
            labels=["worker", "direction"],
        )
        spilled_bytes = CounterMetricFamily(
            "apportion_worker_spilled_bytes",
            "Bytes of results a worker wrote to disk (out) or read back (in) since it started",
            labels=["worker", "direction"],
        )
        for ws in state.workers.values():
            paused.add_metric([ws.name], int(ws.paused))
            report = ws.memory
            for kind, field in _MEMORY_GAUGES:
                if report.get(field) is not None:
                    memory.add_metric([ws.name, kind], report[field])
            if "spilled_count" in report:
                spilled.add_metric([ws.name, "out"], report["spilled_count"])
                spilled.add_metric([ws.name, "in"], report.get("unspilled_count", 0))
                spilled_bytes.add_metric([ws.name, "out"], report.get("spilled_total", 0))
                spilled_bytes.add_metric([ws.name, "in"], report.get("unspilled_total", 0))
        yield from (paused, memory, spilled, spilled_bytes)
        for ws in state.workers.values():
            for resource, amount in ws.total.items():
                total.add_metric([ws.name, resource], amount)
                used.add_metric([ws.name, resource], ws.used.get(resource, 0))
            processing.add_metric([ws.name], len(ws.processing))
            held.add_metric([ws.name], len(ws.has_what))
            retiring.add_metric([ws.name], int(ws.retiring))
        yield from (total, used, processing, held, retiring)

        by_state: dict[str, int] = dict.fromkeys(
            ("released", "waiting", "queued", "no-worker", "processing", "memory", "erred"), 0
        )
        for ts in state.tasks.values():
            by_state[ts.state] = by_state.get(ts.state, 0) + 1
        tasks = GaugeMetricFamily(
            "apportion_tasks", "Tasks the scheduler knows, by state", labels=["state"]
        )
        for name, count in by_state.items():
            tasks.add_metric([name], count)
        yield tasks

        waiting = GaugeMetricFamily(
            "apportion_waiting_tasks",
            "Tasks waiting to start, by demand: queued (for free resources on a fitting "
            "worker) or no-worker (no connected worker could ever run them)",
            labels=["reason", "resources"],
        )
        # Summed by demand: with tenants (or restrictions) several shapes share one demand.
        counts: dict[tuple[str, str], int] = {}
        queued = state.ready.counts()
        for shape, count in queued.items():
            label = ("queued", format_resources(dict(shape)))
            counts[label] = counts.get(label, 0) + count
        for shape, waiters in state.no_worker.items():
            label = ("no-worker", format_resources(dict(shape)))
            counts[label] = counts.get(label, 0) + len(waiters)
        for label, count in counts.items():
            waiting.add_metric(list(label), count)
        yield waiting
        if state.settings.tenants is not None:
            yield from _tenant_metrics(state.settings.tenants.info(queued))

        connections = GaugeMetricFamily(
            "apportion_connections", "Connected clients and workers", labels=["role"]
        )
        connections.add_metric(["client"], len(state.clients))
        connections.add_metric(["worker"], len(state.workers))
        yield connections

        events = state.events
        if events is None:
            return
        durations = HistogramMetricFamily(
            "apportion_task_duration_seconds",
            "How long runs took on their worker, by task name prefix",
            labels=["prefix"],
        )
        for prefix, histogram in sorted(events.fold().items()):
            durations.add_metric([prefix], histogram.cumulative(), histogram.total)
        yield durations
        ended = CounterMetricFamily(
            "apportion_task_runs", "Runs workers reported over, by outcome", labels=["state"]
        )
        for outcome, count in sorted(events.ended.items()):
            ended.add_metric([outcome], count)
        yield ended
        yield CounterMetricFamily(
            "apportion_transfers",
            "Dependencies workers fetched from other workers for the runs they reported",
            value=events.transfers,
        )


def _tenant_metrics(tenants: dict[str, dict[str, Any]]) -> Iterator[Metric]:
    """Per tenant (scheduler/tenants.py): what its runs hold, its quota, weight and share,
    and its tasks waiting (queued, or over its quota)."""
    used = GaugeMetricFamily(
        "apportion_tenant_resource_used",
        "Amount of a resource held by a tenant's running tasks",
        labels=["tenant", "resource"],
    )
    quota = GaugeMetricFamily(
        "apportion_tenant_resource_quota",
        "The most of a resource a tenant's running tasks may hold at once",
        labels=["tenant", "resource"],
    )
    weight = GaugeMetricFamily(
        "apportion_tenant_weight", "A tenant's weight in fair shares", labels=["tenant"]
    )
    share = GaugeMetricFamily(
        "apportion_tenant_share",
        "A tenant's dominant share: the largest fraction it holds of any resource (runs "
        "count as threads)",
        labels=["tenant"],
    )
    waiting = GaugeMetricFamily(
        "apportion_tenant_waiting_tasks",
        "A tenant's tasks waiting to start: queued (for free resources) or over-quota",
        labels=["tenant", "reason"],
    )
    for name, tenant in sorted(tenants.items()):
        for resource, amount in tenant["used"].items():
            used.add_metric([name, resource], amount)
        for resource, amount in tenant["quota"].items():
            quota.add_metric([name, resource], amount)
        weight.add_metric([name], tenant["weight"])
        share.add_metric([name], tenant["share"])
        waiting.add_metric([name, "queued"], tenant["waiting"] - tenant["over_quota"])
        waiting.add_metric([name, "over-quota"], tenant["over_quota"])
    yield from (used, quota, weight, share, waiting)


def scheduler_registry(scheduler: SchedulerShell) -> CollectorRegistry:
    """The registry ``/metrics`` serves: the scheduler's state and this process's CPU and
    memory."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SchedulerCollector(scheduler))
    ProcessCollector(registry=registry)
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
