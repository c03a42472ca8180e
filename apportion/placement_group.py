"""``client.placement_group(bundles, strategy=...)``: a gang of resources reserved all at once.

The scheduler's side is scheduler/placement_groups.py (how bundles are placed and tasks run
in them); this is the client's handle on one group. See docs/sharing.md.
"""

from __future__ import annotations

import concurrent.futures
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from apportion.errors import NoValidWorkerError
from apportion.resources import validate
from apportion.session import Session

STRATEGIES = ("pack", "spread", "strict_pack", "strict_spread")


class PlacementGroup:
    """Bundles of resources the scheduler reserves together, on workers chosen by
    ``strategy``; tasks submitted with ``placement_group=`` (and ``bundle_index=``) run in
    them. Use ``ready()`` to wait until all bundles are held, ``remove()`` to give them back
    (also on leaving a ``with`` block)."""

    def __init__(self, session: Session, bundles: Sequence[Mapping[str, float]], strategy: str):
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {list(STRATEGIES)}, got {strategy!r}")
        if isinstance(bundles, Mapping) or not bundles:
            raise ValueError("bundles must be a non-empty list of resource maps, e.g. [{'GPU': 1}]")
        self.bundles = [validate(bundle) for bundle in bundles]
        self.strategy = strategy
        self.id = f"pg-{uuid.uuid4().hex[:16]}"
        self._session = session
        self._workers: list[str] | None = None
        _answer(
            session.request(
                {
                    "op": "placement-group",
                    "group": self.id,
                    "bundles": self.bundles,
                    "strategy": strategy,
                }
            )
        )

    def ready(self, timeout: float | None = None) -> PlacementGroup:
        """Wait until every bundle is reserved; returns the group.

        Raises ``NoValidWorkerError`` (with the reason) if, when ``timeout`` seconds pass,
        no set of the connected workers could ever host the group, else ``TimeoutError``;
        also, whatever ``timeout``, once the group has waited ``scheduler.no-worker-timeout``
        seconds (if set) and no set of the connected workers could host it.
        """
        try:
            reply = self._session.request(
                {"op": "placement-group-ready", "group": self.id}, timeout=timeout
            )
        except (TimeoutError, concurrent.futures.TimeoutError):
            status = self.status()
            if "why" in status:
                raise NoValidWorkerError(f"placement group {self.id}: {status['why']}") from None
            raise TimeoutError(
                f"placement group {self.id} not ready after {timeout}s: its bundles "
                f"{self.bundles} wait for resources to come free"
            ) from None
        _answer(reply)
        self._workers = list(reply["workers"])
        return self

    def status(self) -> dict[str, Any]:
        """The group's state now: ``{"state": "pending" | "ready", "workers": [...]}``, with
        ``why`` when no set of the connected workers could ever host it."""
        reply = _answer(
            self._session.request({"op": "placement-group-ready", "group": self.id, "wait": False})
        )
        return {k: v for k, v in reply.items() if k not in ("op", "id")}

    @property
    def workers(self) -> list[str]:
        """The address of each bundle's worker (in bundle order), once the group is ready."""
        if self._workers is None:
            status = self.status()
            if status["state"] != "ready":
                raise RuntimeError(f"placement group {self.id} is not ready: call .ready() first")
            self._workers = list(status["workers"])
        return list(self._workers)

    def remove(self) -> None:
        """Give back what the bundles reserve: tasks still queued in the group fail, runs
        under way finish first."""
        self._workers = None
        if not self._session.closed:
            _answer(self._session.request({"op": "remove-placement-group", "group": self.id}))

    def __enter__(self) -> PlacementGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"<PlacementGroup {self.id} {self.strategy} {self.bundles}>"


def _answer(reply: dict[str, Any]) -> dict[str, Any]:
    if "error" in reply:
        if reply.get("kind") == "NoValidWorkerError":  # waited scheduler.no-worker-timeout
            raise NoValidWorkerError(reply["error"])
        raise ValueError(reply["error"])
    return reply


def group_option(group: Any, bundle_index: Any) -> dict[str, Any]:
    """A task's fields naming its group and bundle (none without a group)."""
    if group is None:
        if bundle_index is not None:
            raise ValueError("bundle_index needs a placement_group")
        return {}
    if not isinstance(group, PlacementGroup):
        raise TypeError(f"placement_group must be a PlacementGroup, got {group!r}")
    options: dict[str, Any] = {"placement_group": group.id}
    if bundle_index is not None:
        if isinstance(bundle_index, bool) or not isinstance(bundle_index, int):
            raise TypeError(f"bundle_index must be an integer, got {bundle_index!r}")
        if not 0 <= bundle_index < len(group.bundles):
            raise ValueError(
                f"bundle_index {bundle_index} out of range: the group has "
                f"{len(group.bundles)} bundles"
            )
        options["bundle_index"] = bundle_index
    return options
