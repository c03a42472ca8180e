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
            pool = self._free_units.get(name)
            if pool is None:
                continue  # no longer counted in units (set_resources)
            pool.extend(granted)
            pool.sort()
            if pool[-1] >= self.total[name]:  # out of service since (set_resources)
                pool[:] = [i for i in pool if i < self.total[name]]

    def resize(self, total: Resources) -> None:
        """New totals (``client.set_resources``); runs keep what they hold. Unit indices
        at or above a new count go out of service (given back, they are not reused)."""
        for name in set(self.total) | set(total):
            amount = total.get(name, 0)
            pool = self._free_units.get(name)
            if pool is not None or name not in self.total:
                taken = set(range(int(self.total.get(name, 0)))) - set(pool or ())
                if float(amount).is_integer() and amount <= MAX_UNITS:
                    self._free_units[name] = [i for i in range(int(amount)) if i not in taken]
                else:
                    self._free_units.pop(name, None)
            self.total[name] = amount
            self.used.setdefault(name, 0)
            self.peak.setdefault(name, 0)

    def free(self) -> Resources:
        return {name: self.total[name] - self.used[name] for name in self.total}
