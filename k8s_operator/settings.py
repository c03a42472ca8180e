"""The operator's settings, as typed sections read from the one configuration schema.

Every value comes from ``apportion.config`` (defaults < files < environment <
``config.set``), so the keys, types, defaults and environment variables are those listed
in ``apportion.config_schema`` under ``operator.``: ``APPORTION_OPERATOR__INTERVAL=5``
sets ``operator.interval``.
"""

from __future__ import annotations

from dataclasses import dataclass

from apportion.operator.spec import Defaults

from apportion import config


@dataclass(frozen=True)
class PeeringSettings:
    """Several replicas: the one of highest priority acts (``name``: the KopfPeering
    object they share; None: a single operator, standalone)."""

    name: str | None
    lifetime: int


@dataclass(frozen=True)
class OperatorSettings:
    interval: float
    threads: int
    peering: PeeringSettings
    defaults: Defaults  # what the pods of a cluster that names no image get

    @classmethod
    def from_config(cls) -> OperatorSettings:
        secrets = config.get("operator.image-pull-secrets")
        return cls(
            interval=float(config.get("operator.interval")),
            threads=int(config.get("operator.threads")),
            peering=PeeringSettings(
                name=config.get("operator.peering.name") or None,
                lifetime=int(config.get("operator.peering.lifetime")),
            ),
            defaults=Defaults(
                image=config.get("operator.image"),
                image_pull_policy=config.get("operator.image-pull-policy"),
                image_pull_secrets=tuple(s.strip() for s in secrets.split(",") if s.strip()),
                priority_class_name=config.get("operator.priority-class-name") or "",
            ),
        )
