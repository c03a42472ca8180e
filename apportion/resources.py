"""Abstract resources: parsing, validation and the arithmetic placement relies on.

A resource set is a plain ``dict[str, float]`` (``{"GPU": 2, "MEMORY": 100e9}``).
A *demand* is normalised into a hashable ``Shape`` (sorted tuple of pairs) so the
scheduler can bucket tasks and cache which workers fit each distinct demand.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

Resources = dict[str, float]
Shape = tuple[tuple[str, float], ...]

EMPTY_SHAPE: Shape = ()

# Letters, digits, '.', '_', '-', '/' (so "nvidia.com/gpu"-like names work); must start alnum.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$")


def validate_name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"resource name must be a string, got {type(name).__name__} {name!r}")
    if not _NAME.match(name):
        raise ValueError(
            f"invalid resource name {name!r}: use 1-63 letters, digits, '.', '_', '-' or '/', "
            "starting with a letter or digit"
        )
    return name


def validate_amount(name: str, amount: object, *, allow_zero: bool) -> int | float:
    if isinstance(amount, bool) or not isinstance(amount, (int, float)):
        raise TypeError(
            f"resource {name!r} amount must be a number, got {type(amount).__name__} {amount!r}"
        )
    value = float(amount)
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"resource {name!r} amount must be finite, got {amount!r}")
    if value < 0 or (value == 0 and not allow_zero):
        bound = "zero or more" if allow_zero else "positive"
        raise ValueError(f"resource {name!r} amount must be {bound}, got {amount!r}")
    return int(value) if value.is_integer() else value


# Keys typed Any: they come from users and the wire, and are checked here.
def validate(resources: Mapping[Any, Any] | None, *, what: str = "demand") -> Resources:
    """Check a resource mapping and return a clean copy with numeric amounts.

    Demands must be positive (a zero demand is dropped: it constrains nothing);
    worker capacities may be zero.
    """
    if resources is None:
        return {}
    if not isinstance(resources, Mapping):
        raise TypeError(
            f"resources ({what}) must be a mapping like {{'GPU': 1}}, "
            f"got {type(resources).__name__} {resources!r}"
        )
    clean: Resources = {}
    for name, amount in resources.items():
        validate_name(name)
        value = validate_amount(name, amount, allow_zero=True)
        if what == "demand" and value == 0:
            continue
        clean[name] = value
    return clean


def to_shape(demand: Mapping[str, float] | None) -> Shape:
    if not demand:
        return EMPTY_SHAPE
    if len(demand) == 1:  # the usual demand: one resource, nothing to sort
        return tuple(demand.items())
    return tuple(sorted(demand.items()))


# Sums of fractional amounts drift (0.2 * 5 != 1.0 in floats); fit checks forgive that much.
TOLERANCE = 1e-9


def fits(demand: Shape, available: Mapping[str, float]) -> bool:
    """True when every demanded amount is available."""
    for name, amount in demand:
        if available.get(name, 0) + TOLERANCE < amount:
            return False
    return True


def acquire(used: dict[str, float], demand: Shape) -> None:
    for name, amount in demand:
        used[name] = used.get(name, 0) + amount


def release(used: dict[str, float], demand: Shape) -> None:
    for name, amount in demand:
        left = used.get(name, 0) - amount
        # Float sums of fractional demands drift; snap near-zero to exactly zero.
        used[name] = 0 if abs(left) < 1e-9 else left


def free(total: Mapping[str, float], used: Mapping[str, float]) -> Resources:
    return {name: total[name] - used.get(name, 0) for name in total}


def parse_spec(spec: str) -> Resources:
    """Parse a CLI spec such as ``"GPU=2,MEMORY=100e9"`` into a resource mapping."""
    resources: Resources = {}
    for raw in spec.replace(" ", ",").split(","):
        part = raw.strip()
        if not part:
            continue
        name, sep, value = part.partition("=")
        if not sep or not name or not value:
            raise ValueError(
                f"malformed resource {part!r} in {spec!r}: expected NAME=NUMBER, e.g. 'GPU=2'"
            )
        try:
            amount = float(value)
        except ValueError:
            raise ValueError(
                f"malformed resource {part!r} in {spec!r}: {value!r} is not a number"
            ) from None
        validate_name(name)
        resources[name] = validate_amount(name, amount, allow_zero=True)
    return resources


def format_resources(resources: Mapping[str, float]) -> str:
    return ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(resources.items())) or "-"


def format_usage(used: Mapping[str, float], total: Mapping[str, float]) -> str:
    """Used/total of each resource: ``"GPU 2/4, MEMORY 50e9/100e9"`` (``"-"`` for none)."""
    names = sorted(set(total) | set(used))
    return ", ".join(f"{k} {_fmt(used.get(k, 0))}/{_fmt(total.get(k, 0))}" for k in names) or "-"


def _fmt(value: float) -> str:
    """Large amounts in engineering notation (``100e9``), small ones as they are."""
    if value >= 1e6:
        exponent = int(math.floor(math.log10(value) / 3) * 3)
        return f"{value / 10**exponent:g}e{exponent}"
    return f"{value:g}"
