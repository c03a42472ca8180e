"""Tenants: clients grouped by the token they presented, sharing the cluster by weight,
each within an optional quota.

A tenant is declared in the configuration (``scheduler.tenants.<name>``: ``token-file``,
``weight``, ``quota.<resource>``); the cluster's own token is the tenant ``default``.
With no tenant declared none of this exists and the scheduler places tasks as before.

Fair share (weighted dominant resource fairness, Ghodsi et al., NSDI 2011). A tenant's
*share* is the largest fraction it holds of any resource of the cluster, counting every
run as one thread of the cluster's threads too (so tasks declaring no resources share by
threads); divided by its weight it is the tenant's *rank*. When a worker can take a task,
the queued task it can start that belongs to the tenant of lowest rank goes first; within
one tenant, priority then submission order, as without tenants. It is work-conserving
(a tenant alone gets everything) and never preempts: shares converge as runs end.

Tenancy is part of a task's demand: its shape is a ``RestrictedShape`` naming its tenant,
so each tenant's tasks have their own queues (placement.py) and the placement code asks
this module only which queue goes first (``rank``).

Quota: a tenant never holds more than its quota at once, even with idle resources. Tasks
are *admitted* into the ready queues only while what the tenant runs plus what it has
admitted fits its quota; the others wait aside, queued "over quota", and are admitted as
the tenant's runs end. Admitted tasks can start anywhere, through any path (a reservation
included), without ever taking the tenant past its quota.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from apportion.scheduler.restrictions import RestrictedShape

from apportion.auth import read_token_file
from apportion.errors import ConfigError
from apportion.resources import TOLERANCE, Resources, Shape, validate_name

if TYPE_CHECKING:
    from apportion.scheduler.model import TaskState, WorkerState

DEFAULT_TENANT = "default"
# The pseudo-resource every run holds one of, out of the cluster's threads.
THREADS = "threads"
SETTING = "scheduler.tenants"


class Tenant:
    """One tenant's settings (from the configuration) and books (kept by TenantShares)."""

    __slots__ = (
        "admitted",
        "name",
        "over_quota",
        "quota",
        "rank",
        "runs",
        "share",
        "token",
        "used",
        "weight",
    )

    def __init__(
        self, name: str, token: str | None, weight: float, quota: Resources | None = None
    ) -> None:
        self.name = name
        self.token = token  # None: the cluster's token (the default tenant)
        self.weight = float(weight)
        self.quota: Resources = dict(quota or {})
        # What its runs hold now (THREADS: how many runs), its share and rank (see above).
        self.used: dict[str, float] = {}
        self.runs = 0
        self.share = 0.0
        self.rank = 0.0
        # With a quota: tasks admitted to the ready queues, not yet started (their demand
        # counts against the quota), and those waiting to be admitted, in arrival order.
        self.admitted: dict[TaskState, None] = {}
        self.over_quota: dict[TaskState, None] = {}


def tenants_from_config(tree: Mapping[str, Any], cluster_token: str | None) -> list[Tenant]:
    """The tenants ``scheduler.tenants`` declares (``tree``), the default one first; an
    empty list when none is declared. Raises ConfigError naming the setting at fault."""
    if not tree:
        return []
    tenants: dict[str, Tenant] = {DEFAULT_TENANT: Tenant(DEFAULT_TENANT, None, 1.0)}
    owners: dict[str, str] = {}
    for name, fields in tree.items():
        key = f"{SETTING}.{name}"
        weight = fields.get("weight", 1)
        if not weight > 0:
            raise ConfigError(
                f"{key}.weight must be a positive number, got {weight!r}", f"{key}.weight"
            )
        quota: Resources = {}
        for resource, amount in (fields.get("quota") or {}).items():
            where = f"{key}.quota.{resource}"
            try:
                validate_name(resource)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"{where}: {exc}", where) from None
            if resource == THREADS:
                raise ConfigError(
                    f"{where}: {THREADS!r} is not a resource a quota can cap (it counts runs "
                    "for fair shares only); cap a resource workers declare",
                    where,
                )
            if amount < 0:
                raise ConfigError(f"{where} must be zero or more, got {amount!r}", where)
            quota[resource] = float(amount)
        path = fields.get("token-file")
        if name == DEFAULT_TENANT:
            if path is not None:
                raise ConfigError(
                    f"{key}.token-file: the tenant {DEFAULT_TENANT!r} presents the cluster's "
                    "token; give other tenants a token file",
                    f"{key}.token-file",
                )
            tenants[name] = Tenant(name, None, weight, quota)
            continue
        if path is None:
            raise ConfigError(
                f"{key}.token-file is required: the file holding the token the tenant "
                f"{name!r}'s clients present",
                f"{key}.token-file",
            )
        try:
            token = read_token_file(str(path))
        except ValueError as exc:
            raise ConfigError(f"{key}.token-file: {exc}", f"{key}.token-file") from None
        if cluster_token is not None and _same(token, cluster_token):
            raise ConfigError(
                f"{key}.token-file holds the cluster's own token: a tenant needs a token "
                "of its own (the cluster's token is the tenant 'default')",
                f"{key}.token-file",
            )
        for other_token, other in owners.items():
            if _same(token, other_token):
                raise ConfigError(
                    f"{key}.token-file holds the same token as {SETTING}.{other}.token-file: "
                    "each tenant needs a token of its own",
                    f"{key}.token-file",
                )
        owners[token] = name
        tenants[name] = Tenant(name, token, weight, quota)
    return list(tenants.values())


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def tenant_shape(shape: Shape, tenant: str) -> Shape:
    """``shape`` (a plain demand, or one with a restriction) as a demand of ``tenant``."""
    if type(shape) is RestrictedShape:
        return RestrictedShape(shape, shape.workers, shape.loose, tenant)
    return RestrictedShape(shape, (), True, tenant)


def tenant_of(shape: Shape) -> str:
    """The tenant a task of ``shape`` belongs to."""
    if type(shape) is RestrictedShape and shape.tenant:
        return shape.tenant
    return DEFAULT_TENANT


class TenantShares:
    """The tenants' books and decisions, kept by the scheduler's state (state.py tells it
    of every run started and ended, of workers joining and leaving, and asks it whether a
    ready task is admitted; placement.py asks it for ranks)."""

    def __init__(self, tenants: Iterable[Tenant]) -> None:
        self.tenants: dict[str, Tenant] = {t.name: t for t in tenants}
        if DEFAULT_TENANT not in self.tenants:
            self.tenants[DEFAULT_TENANT] = Tenant(DEFAULT_TENANT, None, 1.0)
        self.clients: dict[str, str] = {}  # client id -> tenant
        self.shapes: dict[tuple[str, Shape], Shape] = {}  # (tenant, demand) -> its shape
        self.capacity: dict[str, float] = {}
        # (client, tenant): told that the tenant's tasks wait over its quota (to_tell).
        self.told: set[tuple[str, str]] = set()
        # Each run charged to a tenant (by run id): the tenant and the demand it holds.
        self.charged: dict[int, tuple[Tenant, Shape]] = {}
        # Tenants with tasks over quota: looked at after each batch (see admit_waiting).
        self.limited = [t for t in self.tenants.values() if t.quota]

    # ------------------------------------------------------------------ clients
    def client_joined(self, client: str, tenant: str) -> None:
        self.clients[client] = tenant if tenant in self.tenants else DEFAULT_TENANT

    def client_left(self, client: str) -> None:
        self.clients.pop(client, None)
        self.told = {(c, t) for c, t in self.told if c != client}

    def shape_for(self, client: str, shape: Shape) -> Shape:
        """The shape of a task ``client`` submits with demand ``shape`` (made once per
        tenant and demand: tasks share it, as they share their plain shapes)."""
        key = (self.clients.get(client, DEFAULT_TENANT), shape)
        tagged = self.shapes.get(key)
        if tagged is None:
            tagged = self.shapes[key] = tenant_shape(shape, key[0])
        return tagged

    # ------------------------------------------------------------- fair shares
    def rank(self, shape: Shape) -> float:
        """Which tenant's queue goes first: lowest rank (weighted dominant share)."""
        tenant = self.tenants.get(tenant_of(shape))
        return 0.0 if tenant is None else tenant.rank

    def tenant(self, shape: Shape) -> str:
        return tenant_of(shape)

    def workers_changed(self, workers: Iterable[WorkerState]) -> None:
        capacity: dict[str, float] = {}
        for ws in workers:
            for name, amount in ws.total.items():
                capacity[name] = capacity.get(name, 0.0) + amount
            capacity[THREADS] = capacity.get(THREADS, 0.0) + ws.nthreads
        self.capacity = capacity
        for tenant in self.tenants.values():
            self._rerank(tenant)

    def started(self, ts: TaskState, run_id: int) -> None:
        """Run ``run_id`` of ``ts`` was booked on a worker: its tenant holds its demand."""
        tenant = self.tenants[tenant_of(ts.shape)]
        self.charged[run_id] = (tenant, ts.shape)
        used = tenant.used
        for name, amount in ts.shape:
            used[name] = used.get(name, 0.0) + amount
        tenant.runs += 1
        if tenant.quota:
            tenant.admitted.pop(ts, None)
        self._rerank(tenant)

    def ended(self, run_id: int) -> None:
        """Run ``run_id`` gave its resources back (it ended, or its worker left); runs
        booked another way (adopted after a restart) were never charged, and are not."""
        charged = self.charged.pop(run_id, None)
        if charged is None:
            return
        tenant, shape = charged
        used = tenant.used
        for name, amount in shape:
            left = used.get(name, 0.0) - amount
            used[name] = 0.0 if left < TOLERANCE else left
        tenant.runs -= 1
        self._rerank(tenant)

    def _rerank(self, tenant: Tenant) -> None:
        capacity = self.capacity
        share = tenant.runs / capacity[THREADS] if capacity.get(THREADS) else 0.0
        for name, amount in tenant.used.items():
            total = capacity.get(name)
            if total and amount / total > share:
                share = amount / total
        tenant.share = share
        tenant.rank = share / tenant.weight

    # ------------------------------------------------------------------- quotas
    def admit(self, ts: TaskState) -> bool:
        """Whether ``ts``, ready, may join the ready queues (within its tenant's quota);
        if not, it waits aside until ``admit_waiting`` lets it in."""
        tenant = self.tenants[tenant_of(ts.shape)]
        quota = tenant.quota
        if not quota or not any(name in quota for name, _ in ts.shape):
            return True  # it takes nothing the quota caps
        if ts in tenant.admitted:  # admitted already (admit_waiting), not started yet
            return True
        tenant.over_quota.pop(ts, None)
        if not tenant.over_quota and self._fits_quota(tenant, ts.shape):
            tenant.admitted[ts] = None
            return True
        tenant.over_quota[ts] = None
        return False

    def to_tell(self, ts: TaskState) -> list[str]:
        """The clients wanting ``ts`` (waiting over quota) not yet told that their tenant's
        tasks wait over its quota: each is told once."""
        tenant = tenant_of(ts.shape)
        fresh = [c for c in ts.who_wants if (c, tenant) not in self.told]
        self.told.update((c, tenant) for c in fresh)
        return fresh

    def admit_waiting(self) -> list[TaskState]:
        """Tasks waiting over quota that fit their tenant's quota now (they are admitted:
        the caller makes them ready), oldest first per tenant."""
        admitted: list[TaskState] = []
        for tenant in self.limited:
            waiting = tenant.over_quota
            if not waiting:
                continue
            while waiting:
                ts = next(iter(waiting))
                if ts.state != "queued":  # cancelled or released meanwhile
                    del waiting[ts]
                    continue
                if not self._fits_quota(tenant, ts.shape):
                    break  # in order: a smaller task behind it does not overtake it
                del waiting[ts]
                tenant.admitted[ts] = None
                admitted.append(ts)
        return admitted

    def _fits_quota(self, tenant: Tenant, shape: Shape) -> bool:
        committed = dict(tenant.used)
        for ts in list(tenant.admitted):
            if ts.state != "queued":  # left the queue another way than by starting
                del tenant.admitted[ts]
                continue
            for name, amount in ts.shape:
                committed[name] = committed.get(name, 0.0) + amount
        for name, amount in shape:
            cap = tenant.quota.get(name)
            if cap is not None and committed.get(name, 0.0) + amount > cap + TOLERANCE:
                return False
        return True

    def never_fits_quota(self, shape: Shape) -> str | None:
        """Why a demand could never start within its tenant's quota, or None."""
        tenant = self.tenants[tenant_of(shape)]
        for name, amount in shape:
            cap = tenant.quota.get(name)
            if cap is not None and amount > cap + TOLERANCE:
                return (
                    f"its demand {name}={amount:g} is more than the quota of its tenant "
                    f"{tenant.name!r} ({name}={cap:g}: {SETTING}.{tenant.name}.quota.{name})"
                )
        return None

    # ------------------------------------------------------------ introspection
    def waiting(self, queued: Mapping[Shape, int]) -> dict[str, int]:
        """Tasks waiting per tenant: those queued (``queued``: per shape), and over quota."""
        counts = dict.fromkeys(self.tenants, 0)
        for shape, n in queued.items():
            name = tenant_of(shape)
            counts[name] = counts.get(name, 0) + n
        for tenant in self.limited:
            counts[tenant.name] += sum(ts.state == "queued" for ts in tenant.over_quota)
        return counts

    def info(self, queued: Mapping[Shape, int]) -> dict[str, dict[str, Any]]:
        waiting = self.waiting(queued)
        return {
            tenant.name: {
                "weight": tenant.weight,
                "quota": dict(tenant.quota),
                "used": {name: amount for name, amount in tenant.used.items() if amount},
                "runs": tenant.runs,
                "waiting": waiting.get(tenant.name, 0),
                "over_quota": sum(ts.state == "queued" for ts in tenant.over_quota),
                "share": tenant.share,
            }
            for tenant in self.tenants.values()
        }

    def problems(self, workers: Iterable[WorkerState]) -> list[str]:
        """Quotas exceeded by what runs on the workers, or books that disagree with them."""
        held: dict[str, dict[str, float]] = {}
        booked: dict[str, dict[str, float]] = {}
        for ws in workers:
            for run_id, ts in ws.processing.items():
                used = held.setdefault(tenant_of(ts.shape), {})
                for resource, amount in ts.shape:
                    used[resource] = used.get(resource, 0.0) + amount
                charged = self.charged.get(run_id)
                if charged is not None:
                    books = booked.setdefault(charged[0].name, {})
                    for resource, amount in charged[1]:
                        books[resource] = books.get(resource, 0.0) + amount
        problems = []
        for tenant in self.tenants.values():
            used = held.get(tenant.name, {})
            for resource, cap in tenant.quota.items():
                if used.get(resource, 0.0) > cap + 1e-9:
                    problems.append(
                        f"tenant {tenant.name}: {resource} held {used[resource]} > quota {cap}"
                    )
            books = {k: v for k, v in tenant.used.items() if abs(v) > 1e-9}
            runs = {k: v for k, v in booked.get(tenant.name, {}).items() if abs(v) > 1e-9}
            if books.keys() != runs.keys() or any(abs(books[k] - runs[k]) > 1e-6 for k in books):
                problems.append(f"tenant {tenant.name}: books {books} != its runs {runs}")
        return problems
