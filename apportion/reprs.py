"""How a ``Client`` or ``LocalCluster`` shows itself: text, HTML for Jupyter, the
dashboard's address."""

from __future__ import annotations

import html
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
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>".format(
            html.escape(str(w.get("name"))),
            html.escape(address),
            w.get("nthreads", ""),
            html.escape(format_resources(w.get("resources") or {})),
            html.escape(format_resources(w.get("used_resources") or {})),
        )
        for address, w in sorted(workers.items(), key=lambda item: str(item[1].get("name")))
    )
    return (
        "<table><tr><th>worker</th><th>address</th><th>threads</th><th>resources</th>"
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
        tasks = sum((info.get("tasks") or {}).values())
        parts.append(
            f"<div>{len(info['workers'])} workers, {info.get('clients', 0)} clients, "
            f"{tasks} tasks</div>"
        )
        parts.append(workers_table(info["workers"]))
    return "<div class='apportion'>" + "".join(parts) + "</div>"
