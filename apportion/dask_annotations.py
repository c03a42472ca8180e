"""Annotations of Dask tasks merged into one task's: shared by the graph planning
(``apportion.dask_graph``) and the dataframe regions (``apportion.dask_regions``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

Annotations = Mapping[str, Any]


def merged(all_annotations: Iterable[Annotations | None]) -> Annotations | None:
    """One task's annotations from its parts': the largest demand of each resource, the
    most retries, the highest priority, the longest timeout (the parts run as one task)."""
    merged: dict[str, Any] = {}
    for one in all_annotations:
        for name, value in (one or {}).items():
            if name == "resources" and isinstance(value, Mapping):
                resources = dict(merged.get("resources", {}))
                for resource, amount in value.items():
                    resources[resource] = max(resources.get(resource, amount), amount)
                merged["resources"] = resources
            elif name in ("retries", "priority", "timeout") and name in merged:
                merged[name] = max(merged[name], value)
            else:
                merged[name] = value
    return merged or None
