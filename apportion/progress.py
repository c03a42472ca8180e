"""``apportion.progress(futures)``: a live progress bar per task name.

In a terminal the bars are drawn with rich; in Jupyter an HTML table is displayed and
updated in place. ``progress(futures)`` waits until every future is done (Ctrl-C stops
watching, not the tasks); ``progress(futures, wait=False)`` returns at once and updates
in the background, the form to use in a notebook cell.
"""

from __future__ import annotations

import html
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from apportion.core.keys import key_prefix

# Seconds between redraws.
REFRESH = 0.2


@dataclass
class Tally:
    """The futures of one task name: how many, and how many ended each way."""

    prefix: str
    total: int = 0
    finished: int = 0
    erred: int = 0
    cancelled: int = 0

    @property
    def done(self) -> int:
        return self.finished + self.erred + self.cancelled


def tally(futures: Iterable[Any]) -> list[Tally]:
    """Count futures per task name prefix (in the order names first appear)."""
    rows: dict[str, Tally] = {}
    for future in futures:
        prefix = key_prefix(future.key)
        row = rows.get(prefix)
        if row is None:
            row = rows[prefix] = Tally(prefix)
        row.total += 1
        status = future.status
        if status == "finished":
            row.finished += 1
        elif status == "error":
            row.erred += 1
        elif status == "cancelled":
            row.cancelled += 1
    return list(rows.values())


def render_text(rows: list[Tally], width: int = 30) -> str:
    """Plain text bars, one line per task name."""
    name_width = max((len(r.prefix) for r in rows), default=0)
    lines = []
    for r in rows:
        filled = round(width * r.done / r.total) if r.total else width
        extra = "".join(
            f", {n} {what}" for n, what in ((r.erred, "erred"), (r.cancelled, "cancelled")) if n
        )
        lines.append(
            f"{r.prefix:<{name_width}} [{'#' * filled}{'.' * (width - filled)}] "
            f"{r.done}/{r.total}{extra}"
        )
    return "\n".join(lines)


def render_html(rows: list[Tally]) -> str:
    """An HTML table of bars, for Jupyter."""
    cells = []
    for r in rows:
        ok = 100.0 * r.finished / r.total if r.total else 100.0
        bad = 100.0 * (r.erred + r.cancelled) / r.total if r.total else 0.0
        cells.append(
            f"<tr><td>{html.escape(r.prefix)}</td><td style='width:240px'>"
            f"<div style='display:flex;height:12px;background:#eee;border-radius:2px'>"
            f"<div style='width:{ok:.1f}%;background:#2f7d4a'></div>"
            f"<div style='width:{bad:.1f}%;background:#c0392b'></div></div></td>"
            f"<td>{r.done}/{r.total}{f' ({r.erred} erred)' if r.erred else ''}</td></tr>"
        )
    return f"<table class='apportion-progress'>{''.join(cells)}</table>"


def in_notebook() -> bool:
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    ip = shell.get_ipython()
    return ip is not None and ip.__class__.__name__ == "ZMQInteractiveShell"


class Progress:
    """Watches futures and draws their progress until all are done (or ``stop()``)."""

    def __init__(self, futures: list[Any], notebook: bool, console: Any = None) -> None:
        self.futures = futures
        self.notebook = notebook
        self.console = console
        self._stop = threading.Event()
        self.finished = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def rows(self) -> list[Tally]:
        return tally(self.futures)

    def all_done(self) -> bool:
        return all(future.done() for future in self.futures)

    def _repr_html_(self) -> str:
        return render_html(self.rows)

    def __repr__(self) -> str:
        return render_text(self.rows)

    def start(self) -> Progress:
        target = self._watch_notebook if self.notebook else self._watch_terminal
        self._thread = threading.Thread(target=target, name="apportion-progress", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every future is done; True if so (False: the timeout passed)."""
        try:
            return self.finished.wait(timeout)
        except KeyboardInterrupt:
            self.stop()  # stop watching; the tasks go on
            raise

    def _ticks(self) -> Iterable[None]:
        while True:
            yield
            if self.all_done() or self._stop.wait(REFRESH):
                break
        yield  # a last drawing of the final state

    def _watch_terminal(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress

        bars = RichProgress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[note]}"),
            TimeElapsedColumn(),
            console=self.console or Console(stderr=True),
        )
        ids: dict[str, Any] = {}
        try:
            with bars:
                for _ in self._ticks():
                    for row in self.rows:
                        note = f"[red]{row.erred} erred" if row.erred else ""
                        if row.prefix not in ids:
                            ids[row.prefix] = bars.add_task(row.prefix, total=row.total, note="")
                        bars.update(ids[row.prefix], completed=row.done, note=note)
        finally:
            self.finished.set()

    def _watch_notebook(self) -> None:
        from IPython.display import HTML, display

        handle = display(HTML(render_html(self.rows)), display_id=True)
        try:
            for _ in self._ticks():
                if handle is not None:
                    handle.update(HTML(render_html(self.rows)))
        finally:
            self.finished.set()


def progress(
    *futures: Any, wait: bool | None = None, notebook: bool | None = None, console: Any = None
) -> Progress:
    """Show progress bars (one per task name) for futures, lists or dicts of futures.

    ``wait`` (default: True in a terminal, False in Jupyter) blocks until all are done.
    ``console``: a ``rich.console.Console`` to draw on (default: stderr).
    """
    flat: list[Any] = []
    for item in futures:
        if isinstance(item, dict):
            flat.extend(item.values())
        elif isinstance(item, (list, tuple, set)):
            flat.extend(item)
        else:
            flat.append(item)
    for item in flat:
        if not hasattr(item, "key") or not hasattr(item, "status"):
            raise TypeError(f"progress() takes futures (or lists or dicts of them), got {item!r}")
    notebook = in_notebook() if notebook is None else notebook
    watcher = Progress(flat, notebook, console).start()
    if wait if wait is not None else not notebook:
        watcher.wait()
    return watcher
