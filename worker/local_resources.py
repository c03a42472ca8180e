"""A worker's own resource ledger: it never starts more than it declared.

Whole-number resources (``GPU=2``) are also handed out as unit indices
(``GPU #0``, ``GPU #1``) so a task can pin e.g. ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

from apportion.resources import TOLERANCE, Resources, Shape

# Countable things (GPUs, licences) get unit indices; quantities like bytes do not.
MAX_UNITS = 1024


class LocalResources:
    def __init__(self, total: Resources) -> None:
        self.total = dict(total)
        self.used: Resources = dict.fromkeys(total, 0)
        self.peak: Resources = dict.fromkeys(total, 0)
        self._free_units: dict[str, list[int]] = {
            name: list(range(int(amount)))
            for name, amount in total.items()
            if float(amount).is_integer() and amount <= MAX_UNITS
        }

    def can_ever_fit(self, demand: Shape) -> bool:
        return all(self.total.get(name, 0) >= amount for name, amount in demand)

    def fits_now(self, demand: Shape) -> bool:
        # Same test as fits(demand, self.free()), without building the free dict.
        total, used = self.total, self.used
        for name, amount in demand:
            if total.get(name, 0) - used.get(name, 0) + TOLERANCE < amount:
                return False
        return True

    def acquire(self, demand: Shape) -> dict[str, list[int]]:
        """Take ``demand``; returns the unit indices granted for whole-number resources."""
        if not self.fits_now(demand):
            raise RuntimeError(f"demand {dict(demand)} does not fit free {self.free()}")
        units: dict[str, list[int]] = {}
        for name, amount in demand:
            self.used[name] += amount
            self.peak[name] = max(self.peak[name], self.used[name])
            pool = self._free_units.get(name)
            if pool is not None and float(amount).is_integer() and len(pool) >= amount:
                units[name] = sorted(pool[: int(amount)])
                del pool[: int(amount)]
        return units

    def release(self, demand: Shape, units: dict[str, list[int]]) -> None:
        for name, amount in demand:
            left = self.used[name] - amount
            self.used[name] = 0 if abs(left) < 1e-9 else left
        for name, granted in units.items():
            self._free_units[name].extend(granted)
            self._free_units[name].sort()

    def free(self) -> Resources:
        return {name: self.total[name] - self.used[name] for name in self.total}
