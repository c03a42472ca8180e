"""Every configuration key: its type, default and meaning, in one place.

``apportion.config`` builds its defaults from this table and checks every value set
(files, environment, ``config.set``) against it; the README's settings table is
generated from it (``apportion settings`` prints it), and a test keeps the two equal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from apportion.errors import ConfigError

# "size": bytes, or a size such as "4GiB" (apportion/memory_limit.py); "fraction": a
# number in (0, 1], or false (off).
Kind = Literal["number", "integer", "boolean", "string", "size", "fraction"]


class Setting:
    """One key: its type (``kind``, and ``choices`` for a closed set of strings), its
    default, whether None is valid too (``optional``), and what it means.

    Its environment variable is ``env_name(key)``; ``legacy_env`` names the variable an
    older release read instead, still honoured (pods made by an older operator, and
    deployments written for one, set it) when the new one is not set."""

    # A plain class: every process imports this table, and a dataclass costs more to build.
    __slots__ = ("choices", "default", "key", "kind", "legacy_env", "meaning", "optional")

    def __init__(
        self,
        key: str,
        kind: Kind,
        default: Any,
        meaning: str,
        optional: bool = False,
        choices: tuple[str, ...] = (),
        legacy_env: str | None = None,
    ) -> None:
        self.key = key
        self.kind = kind
        self.default = default
        self.meaning = meaning
        self.optional = optional
        self.choices = choices
        self.legacy_env = legacy_env

    def describe_type(self, article: bool = False) -> str:
        if self.choices:
            text = " or ".join(repr(c) for c in self.choices)
        elif self.kind in _KIND_TEXT:
            text = _KIND_TEXT[self.kind]
        else:
            text = (
                f"{'an' if self.kind == 'integer' else 'a'} {self.kind}" if article else self.kind
            )
        return f"{text} or None" if self.optional else text


_KIND_TEXT = {
    "size": "bytes, a size ('4GiB', '4GB'), a fraction of the machine or 'auto'",
    "fraction": "a fraction in (0, 1] or false",
}

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "scheduler.no-worker-timeout",
        "number",
        None,
        "Seconds a task may wait for a worker that could ever run it, then it fails with "
        "NoValidWorkerError; None waits forever.",
        optional=True,
    ),
    Setting(
        "scheduler.worker-prefetch",
        "integer",
        1,
        "Tasks handed to a worker beyond its thread count, to hide the round trip.",
    ),
    Setting(
        "scheduler.worker-prefetch-max",
        "integer",
        64,
        "Tasks per thread a worker may be handed beyond its thread count while its tasks "
        "are short (a few milliseconds of them queued per thread; one long task brings it "
        "back to scheduler.worker-prefetch); 0 keeps every worker at scheduler.worker-prefetch.",
    ),
    Setting(
        "scheduler.locality-bytes",
        "number",
        16 * 2**20,
        "A task whose inputs on one worker add up to this many bytes or more runs on that "
        "worker, waiting for a free slot there rather than moving the inputs, unless the "
        "worker cannot take it (paused, retiring, or not fitting the task's resources), or "
        "the wait passes the time the inputs would take to move (see scheduler.bandwidth).",
    ),
    Setting(
        "scheduler.bandwidth",
        "number",
        100e6,
        "Bytes per second assumed for moving a task's inputs between workers (as Dask's "
        "distributed.scheduler.bandwidth): a task waits for the worker holding its large "
        "inputs at most as long as moving them would take.",
    ),
    Setting(
        "scheduler.allowed-failures",
        "integer",
        3,
        "A task that was running on more workers that died than this fails with KilledWorkerError.",
    ),
    Setting(
        "scheduler.worker-timeout",
        "number",
        30.0,
        "Seconds without a heartbeat after which a worker is removed.",
    ),
    Setting(
        "scheduler.retire-timeout",
        "number",
        30.0,
        "Seconds a retire request waits for results to be copied off the retiring workers; "
        "workers not emptied by then stay in service.",
    ),
    Setting(
        "scheduler.recovery-wait",
        "number",
        3.0,
        "Seconds after start during which the scheduler waits for the workers and clients "
        "of a scheduler that died: tasks that reconnecting clients re-register start only "
        "after it, unless a worker reports holding or running them; results and runs "
        "nobody re-registered by then are released.",
    ),
    Setting(
        "scheduler.http-port",
        "integer",
        None,
        "Port of the HTTP API when `apportion scheduler` is not given --http-port; None: "
        "no HTTP API.",
        optional=True,
    ),
    Setting(
        "scheduler.contact-host",
        "string",
        None,
        "Host the scheduler gives out as its address (to workers, clients and its "
        "dashboard links); None: its own IP address as the network route shows it.",
        optional=True,
        legacy_env="APPORTION_CONTACT_HOST",
    ),
    Setting(
        "scheduler.validate",
        "boolean",
        False,
        "Check resource accounting after every batch of messages (slow; for tests).",
    ),
    Setting(
        "scheduler.tenants.<name>.token-file",
        "string",
        None,
        "File holding the token a tenant's clients present; a client belongs to the tenant "
        "whose token it presented (the cluster's token: the tenant `default`, which needs "
        "no file). Declaring any tenant turns on fair shares (docs/sharing.md).",
        optional=True,
    ),
    Setting(
        "scheduler.tenants.<name>.weight",
        "number",
        1,
        "A tenant's weight: while several tenants wait, each gets resources in proportion "
        "to its weight (weighted dominant resource fairness).",
    ),
    Setting(
        "scheduler.tenants.<name>.quota",
        "number",
        {},
        "The most of a resource a tenant's running tasks may hold at once "
        "(`scheduler.tenants.<name>.quota.GPU: 2`), even while the rest is idle; none: no cap.",
    ),
    Setting(
        "worker.resources",
        "number",
        {},
        "Resources a worker advertises, by name (`worker.resources.GPU: 2`); names keep "
        "their case. Flags and LocalCluster arguments take precedence.",
    ),
    Setting(
        "worker.nthreads",
        "integer",
        None,
        "Task threads per worker when --nthreads is not given; None: one.",
        optional=True,
    ),
    Setting(
        "worker.heartbeat-interval",
        "number",
        1.0,
        "Seconds between a worker's heartbeats to the scheduler.",
    ),
    Setting(
        "worker.connect-timeout",
        "number",
        300.0,
        "Seconds a worker keeps trying to reach a scheduler that is not (yet) there.",
    ),
    Setting(
        "worker.readiness-port",
        "integer",
        None,
        "Port of the worker's readiness endpoint on its contact host: GET /ready answers "
        "200 while it is connected to its scheduler, else 503 and why (the operator's "
        "worker pods are probed there); None: no endpoint.",
        optional=True,
    ),
    Setting(
        "worker.inline-result-bytes",
        "integer",
        64 * 1024,
        "Results up to this many bytes travel with the completion message.",
    ),
    Setting(
        "worker.shared-memory",
        "boolean",
        True,
        "Workers (and clients) on one host hand each other results of 1 MiB or more "
        "through shared memory instead of TCP; false: always TCP.",
    ),
    Setting(
        "worker.memory-limit",
        "size",
        "auto",
        "A worker's memory limit: bytes, '4GiB', '4GB', a fraction of the machine (0.5), "
        "'auto' (the machine's or its container's memory divided among --nworkers) or "
        "None/0 (no limit). The thresholds below are fractions of it (docs/memory.md).",
        optional=True,
    ),
    Setting(
        "worker.memory.target",
        "fraction",
        0.6,
        "Results held in memory beyond this fraction of the memory limit are spilled to "
        "disk, least recently used first; false: off.",
    ),
    Setting(
        "worker.memory.spill",
        "fraction",
        0.7,
        "Once the process's memory passes this fraction of the limit, results are spilled "
        "until it is back under target; false: off.",
    ),
    Setting(
        "worker.memory.pause",
        "fraction",
        0.8,
        "Above this fraction of the limit the worker starts no new task (the scheduler "
        "places none there) until it is back under; false: off.",
    ),
    Setting(
        "worker.memory.terminate",
        "fraction",
        0.95,
        "Above this fraction of the limit the worker exits and is restarted by its "
        "supervisor; what it held is recomputed; false: off.",
    ),
    Setting(
        "worker.memory.monitor-interval",
        "number",
        0.1,
        "Seconds between a worker's measurements of its memory.",
    ),
    Setting(
        "worker.memory.spill-directory",
        "string",
        None,
        "Where workers spill results (a directory of each worker's own under it, removed "
        "when it stops); None: the system's temporary directory.",
        optional=True,
    ),
    Setting(
        "client.store-argument-bytes",
        "integer",
        1024 * 1024,
        "A submitted argument pickling to this many bytes or more is stored on a worker "
        "that can run the task, straight from the client, not sent through the scheduler.",
    ),
    Setting(
        "client.scheduler-address",
        "string",
        None,
        "Scheduler a Client() given no address connects to; None: Client() needs an "
        "address or a cluster.",
        optional=True,
        legacy_env="APPORTION_SCHEDULER_ADDRESS",
    ),
    Setting(
        "client.direct-results",
        "boolean",
        True,
        "Workers holding results tell waiting clients themselves: one hop fewer.",
    ),
    Setting(
        "client.reconnect-timeout",
        "number",
        120.0,
        "Seconds a client keeps reconnecting to a scheduler it lost (its futures stay "
        "pending meanwhile, and it re-registers them); then they fail with "
        "SchedulerConnectionError.",
    ),
    Setting(
        "client.forward-output",
        "boolean",
        True,
        "Print what tasks print (stdout, stderr, warnings) here, prefixed with the worker.",
    ),
    Setting(
        "comm.max-frame-bytes",
        "integer",
        1 << 30,
        "Largest frame (a batch of messages, a result, an argument) a peer accepts.",
    ),
    Setting(
        "comm.connect-timeout",
        "number",
        10.0,
        "Seconds to open a connection and complete its handshake.",
    ),
    Setting(
        "comm.event-loop",
        "string",
        "uvloop",
        "Event loop: uvloop (where installed; faster I/O and wake-ups) or asyncio.",
        choices=("uvloop", "asyncio"),
    ),
    Setting(
        "comm.tls.cert-file",
        "string",
        None,
        "Certificate to serve and to present over TLS (--tls-cert); addresses become tls://.",
        optional=True,
    ),
    Setting("comm.tls.key-file", "string", None, "Private key of the certificate.", optional=True),
    Setting(
        "comm.tls.ca-file",
        "string",
        None,
        "CA that peers' certificates must be signed by (mutual TLS).",
        optional=True,
    ),
    Setting(
        "comm.tls.check-hostname",
        "boolean",
        True,
        "Clients check that the server's certificate names the host they connect to.",
    ),
    Setting(
        "logging.level",
        "string",
        None,
        "Level of what a process prints to stderr (DEBUG, INFO, WARNING, ERROR); None: "
        "INFO, and WARNING for LocalCluster's processes (LocalCluster(log_level=...)).",
        optional=True,
        legacy_env="APPORTION_LOG_LEVEL",
    ),
    # The operator's own settings (its chart sets them from its values).
    Setting(
        "operator.interval",
        "number",
        2.0,
        "Seconds between two reconciles of a ResourceCluster when nothing changes (its "
        "status, autoscaling and lost pods follow at this pace).",
        legacy_env="APPORTION_OPERATOR_INTERVAL",
    ),
    Setting(
        "operator.threads",
        "integer",
        32,
        "Reconciles the operator runs at once (each of a different cluster; one may wait "
        "on a scheduler's retire call).",
        legacy_env="APPORTION_OPERATOR_THREADS",
    ),
    Setting(
        "operator.image",
        "string",
        "apportion:0.1.0",
        "Image of the scheduler and worker pods of ResourceClusters that name none.",
        legacy_env="APPORTION_OPERATOR_IMAGE",
    ),
    Setting(
        "operator.image-pull-policy",
        "string",
        "IfNotPresent",
        "Pull policy of those pods when the cluster names none.",
        choices=("Always", "IfNotPresent", "Never"),
        legacy_env="APPORTION_OPERATOR_IMAGE_PULL_POLICY",
    ),
    Setting(
        "operator.image-pull-secrets",
        "string",
        "",
        "Comma-separated names of the Secrets to pull those pods' images with when the "
        "cluster names none.",
        legacy_env="APPORTION_OPERATOR_IMAGE_PULL_SECRETS",
    ),
    Setting(
        "operator.priority-class-name",
        "string",
        "",
        "The PriorityClass of the scheduler and worker pods of clusters whose templates name "
        "none (empty: the cluster's default priority).",
    ),
    Setting(
        "operator.peering.name",
        "string",
        None,
        "Several operator replicas: the name of their leader election (the Lease "
        "<name>-leader in the operator's namespace); the replica holding it acts, the others "
        "stand by. None: a single operator, always acting.",
        optional=True,
        legacy_env="APPORTION_OPERATOR_PEERING",
    ),
    Setting(
        "operator.peering.lifetime",
        "integer",
        20,
        "Seconds the leader's Lease lives unless renewed: a standby replica takes over this "
        "long after the acting one stopped renewing it (it stops acting two thirds of the "
        "way there).",
        legacy_env="APPORTION_OPERATOR_PEERING_LIFETIME",
    ),
)

BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS}
ENV_PREFIX = "APPORTION_"


def env_name(key: str) -> str:
    """The environment variable of a key: ``operator.image-pull-policy`` is
    ``APPORTION_OPERATOR__IMAGE_PULL_POLICY``."""
    return ENV_PREFIX + "__".join(part.upper().replace("-", "_") for part in key.split("."))


# Keys whose value is a mapping of free names (resource names) to values of the setting's kind.
OPEN_MAPPINGS = frozenset({"worker.resources", "scheduler.tenants.<name>.quota"})
# Keys under which each free name holds a group of the settings "<key>.<name>.<field>".
NAMED_GROUPS = frozenset({"scheduler.tenants"})
NAME = "<name>"


def _in_group(key: str) -> bool:
    return any(key.startswith(f"{group}.{NAME}.") for group in NAMED_GROUPS)


def defaults() -> dict[str, Any]:
    """The nested mapping of every default."""
    out: dict[str, Any] = {}
    for group in NAMED_GROUPS:  # no name declared by default
        *parents, name = group.split(".")
        cursor = out
        for part in parents:
            cursor = cursor.setdefault(part, {})
        cursor[name] = {}
    for setting in SETTINGS:
        if _in_group(setting.key):
            continue
        *parents, name = setting.key.split(".")
        cursor = out
        for part in parents:
            cursor = cursor.setdefault(part, {})
        cursor[name] = (
            dict(setting.default) if isinstance(setting.default, dict) else setting.default
        )
    return out


def check_tree(tree: Mapping[str, Any], source: str, prefix: str = "") -> None:
    """Raise ConfigError for the first unknown key or wrongly typed value in ``tree``
    (nested, canonical keys)."""
    for name, value in tree.items():
        key = f"{prefix}{name}"
        if key in OPEN_MAPPINGS:
            check_open_mapping(key, value, source)
        elif key in NAMED_GROUPS:
            check_named_group(key, value, source)
        elif key in BY_KEY:
            check_value(BY_KEY[key], value, source)
        elif isinstance(value, Mapping) and any(k.startswith(key + ".") for k in BY_KEY):
            check_tree(value, source, key + ".")
        else:
            while isinstance(value, Mapping) and len(value) == 1:  # name the key as written
                ((name, value),) = value.items()
                key = f"{key}.{name}"
            raise unknown_key(key, source)


def check_named_group(key: str, value: Any, source: str) -> None:
    """``value``: names, each to a mapping of the group's fields (``key.<name>.<field>``)."""
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"configuration key {key!r} (from {source}) must be a mapping of names to "
            f"settings, got {value!r}",
            key,
            source=source,
        )
    for name, fields in value.items():
        if not isinstance(fields, Mapping):
            raise ConfigError(
                f"configuration key {key}.{name} (from {source}) must be a mapping of "
                f"settings ({', '.join(_group_fields(key))}), got {fields!r}",
                f"{key}.{name}",
                source=source,
            )
        for field, setting_value in fields.items():
            schema_key = f"{key}.{NAME}.{field}"
            if schema_key in OPEN_MAPPINGS:
                check_open_mapping(schema_key, setting_value, source, f"{key}.{name}.{field}")
            elif schema_key in BY_KEY:
                check_value(BY_KEY[schema_key], setting_value, source, f"{key}.{name}.{field}")
            else:
                raise unknown_key(f"{key}.{name}.{field}", source)


def _group_fields(group: str) -> list[str]:
    prefix = f"{group}.{NAME}."
    return [key[len(prefix) :] for key in BY_KEY if key.startswith(prefix)]


def check_open_mapping(key: str, value: Any, source: str, named: str | None = None) -> None:
    """``named``: the key as written, where ``key`` is the schema's (with ``<name>``)."""
    setting = BY_KEY[key]
    named = named or key
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"configuration key {named!r} (from {source}) must be a mapping of names to "
            f"{setting.kind}s, got {value!r}",
            named,
            source=source,
        )
    for name, amount in value.items():
        check_value(setting, amount, source, f"{named}.{name}")


def check_value(setting: Setting, value: Any, source: str, key: str | None = None) -> None:
    key = key or setting.key
    if value is None and setting.optional:
        return
    if not _is_kind(value, setting.kind) or (setting.choices and value not in setting.choices):
        raise ConfigError(
            f"configuration key {key!r} (from {source}) must be "
            f"{setting.describe_type(article=True)}, got {value!r}",
            key,
            source=source,
        )


def _is_kind(value: Any, kind: Kind) -> bool:
    if kind == "size":
        return isinstance(value, (int, float, str)) and value is not True
    if kind == "fraction":
        return value is False or (_is_kind(value, "number") and 0 < value <= 1)
    if kind == "boolean":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False  # True is an int to Python, not a number to a user
    if kind == "integer":
        return isinstance(value, int)
    if kind == "number":
        return isinstance(value, (int, float))
    return isinstance(value, str)


def unknown_key(key: str, source: str) -> ConfigError:
    import difflib  # here: only a mistake pays for importing it

    last = key.rsplit(".", 1)[-1]
    known = [*BY_KEY, *(f"{k}.{last}" for k in OPEN_MAPPINGS)]
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
    suggestion = close[0] if close else None
    hint = f"; did you mean {suggestion!r}?" if suggestion else "."
    return ConfigError(
        f"unknown configuration key {key!r} (from {source}){hint} Every key is listed "
        "under 'Settings' in the README (`apportion settings` prints them).",
        key,
        suggestion,
        source,
    )


def markdown_table() -> str:
    """The README's settings table."""
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for s in SETTINGS:
        placeholder = "<resource>" if _in_group(s.key) else "<name>"
        key = f"{s.key}.{placeholder}" if s.key in OPEN_MAPPINGS else s.key
        default = "{}" if s.key in OPEN_MAPPINGS else repr(s.default)
        meaning = f"{s.meaning} Also read from `{s.legacy_env}`." if s.legacy_env else s.meaning
        rows.append(f"| `{key}` | {s.describe_type()} | `{default}` | {meaning} |")
    return "\n".join(rows)
