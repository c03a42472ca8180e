"""How a ``Client`` or ``LocalCluster`` shows itself: text, HTML for Jupyter, the
dashboard's address."""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from apportion.protocol.comm import parse_address
from apportion.resources import format_resources


def dashboard_link(scheduler_address: str, http_port: int | None, token: str | None) -> str | None:
    """The dashboard's address, signed in with the token (None without an HTTP port). A
    scheduler on ``tls://`` serves its HTTP API over TLS too, hence https."""
    if not http_port:
        return None
    host, _ = parse_address(scheduler_address)
    if ":" in host:
        host = f"[{host}]"
    scheme = "https" if scheduler_address.startswith("tls://") else "http"
    link = f"{scheme}://{host}:{http_port}/dashboard"
    return f"{link}?token={quote(token, safe='')}" if token else link


def workers_table(workers: dict[str, dict[str, Any]]) -> str:
    rows = "".join(
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>".format(
            html.escape(str(w.get("name"))),
            html.escape(address),
            w.get("nthreads", ""),
            html.escape(format_bytes(w.get("memory_limit"))),
            html.escape(format_resources(w.get("resources") or {})),
            html.escape(format_resources(w.get("used_resources") or {})),
        )
        for address, w in sorted(workers.items(), key=lambda item: str(item[1].get("name")))
    )
    return (
        "<table><tr><th>worker</th><th>address</th><th>threads</th><th>memory</th><th>resources</th>"
        f"<th>in use</th></tr>{rows}</table>"
    )


def summary_html(title: str, address: str, link: str | None, info: dict[str, Any] | None) -> str:
    """A block for Jupyter: scheduler, dashboard link, workers and their resources."""
    parts = [f"<h4 style='margin:4px 0'>{html.escape(title)}</h4>"]
    parts.append(f"<div>Scheduler: <code>{html.escape(address)}</code></div>")
    if link:
        parts.append(
            f"<div>Dashboard: <a href='{html.escape(link)}' target='_blank'>"
            f"{html.escape(link.split('?')[0])}</a></div>"
        )
    if info is not None:
        parts.append(totals_html(summarise(info["workers"])))
        if info.get("tasks") is not None:
            tasks = sum(info["tasks"].values())
            parts.append(f"<div>{info.get('clients', 0)} clients, {tasks} tasks</div>")
        parts.append(workers_table(info["workers"]))
    return "<div class='apportion'>" + "".join(parts) + "</div>"


@dataclass(frozen=True)
class Summary:
    """A cluster's size at a glance: workers, threads, memory, resources (totals)."""

    workers: int
    threads: int
    memory: int | None  # None: no worker declared a memory limit
    resources: dict[str, float]


def summarise(workers: dict[str, dict[str, Any]]) -> Summary:
    """Totals over the workers a scheduler reports (``scheduler_info()["workers"]``)."""
    resources: dict[str, float] = {}
    memory = [w.get("memory_limit") for w in workers.values()]
    for worker in workers.values():
        for name, amount in (worker.get("resources") or {}).items():
            resources[name] = resources.get(name, 0) + amount
    return Summary(
        workers=len(workers),
        threads=sum(int(w.get("nthreads") or 0) for w in workers.values()),
        memory=sum(m for m in memory if isinstance(m, int)) or None,
        resources=resources,
    )


def format_bytes(n: int | None) -> str:
    """``1.50 GiB``, as Dask writes memory; "no limit" for None."""
    if n is None:
        return "no limit"
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("kiB", 1 << 10)):
        if n >= size * 0.9:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def summary_fields(summary: Summary | None) -> str:
    """``workers=2, threads=4, memory=no limit, resources=GPU=2``."""
    if summary is None:
        return "scheduler not answering"
    fields = (
        f"workers={summary.workers}, threads={summary.threads}, "
        f"memory={format_bytes(summary.memory)}"
    )
    if summary.resources:
        fields += f", resources={format_resources(summary.resources)}"
    return fields


def cluster_text(kind: str, address: str, summary: Summary | None, link: str) -> str:
    """``LocalCluster('tcp://127.0.0.1:8786', workers=2, threads=4, memory=..., ...)``."""
    dashboard = f", dashboard={link.split('?')[0]}" if link else ""
    return f"{kind}({address!r}, {summary_fields(summary)}{dashboard})"


def client_text(client_id: str, address: str, summary: Summary | None, link: str) -> str:
    """``<Client 3: 'tcp://...' workers=2, threads=4, memory=..., dashboard=...>``."""
    dashboard = f", dashboard={link.split('?')[0]}" if link else ""
    return f"<Client {client_id}: {address!r} {summary_fields(summary)}{dashboard}>"


def totals_html(summary: Summary) -> str:
    resources = (
        f", resources <b>{html.escape(format_resources(summary.resources))}</b>"
        if summary.resources
        else ""
    )
    return (
        f"<div>Workers <b>{summary.workers}</b>, threads <b>{summary.threads}</b>, "
        f"memory <b>{format_bytes(summary.memory)}</b>{resources}</div>"
    )


def cluster_html(
    kind: str, address: str, workers: dict[str, dict[str, Any]] | None, link: str
) -> str:
    """A cluster's block for Jupyter: totals, then a row per worker."""
    if workers is None:
        return summary_html(kind, address, link or None, None) + (
            "<div>(the scheduler did not answer)</div>"
        )
    info = {"workers": workers, "clients": None, "tasks": None}
    return summary_html(kind, address, link or None, info)
