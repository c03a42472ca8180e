"""The Events the operator posts on a ResourceCluster, and the rule that a problem is
announced once: not again while it lasts, also across an operator restart."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import kopf
from apportion.operator.memo import ClusterMemo


def event(owner: Mapping[str, Any], *, type: str, reason: str, message: str) -> None:
    kopf.event(cast(kopf.Body, owner), type=type, reason=reason, message=message)


def warn(owner: Mapping[str, Any], *, reason: str, message: str) -> None:
    kopf.warn(cast(kopf.Body, owner), reason=reason, message=message)


def announce_once(
    memo: ClusterMemo,
    owner: Mapping[str, Any],
    previous: Mapping[str, Any],
    kind: str,
    reason: str,
    message: str,
) -> None:
    """One warning Event per problem: not when the status's ``kind`` condition already
    says it (announced before a restart), nor when this process announced it already."""
    old: Mapping[str, Any] = next(
        (c for c in previous.get("conditions") or [] if c.get("type") == kind), {}
    )
    if (old.get("status") == "False" and old.get("message") == message) or memo.announced.get(
        reason
    ) == message:
        return
    memo.announced[reason] = message
    warn(owner, reason=reason, message=message)


def over(memo: ClusterMemo, reason: str) -> None:
    """The problem announced under ``reason`` is over: announce it again if it comes back."""
    memo.announced.pop(reason, None)
