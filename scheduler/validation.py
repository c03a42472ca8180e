"""Checks on client messages before they touch scheduler state.

A client is authenticated but may still be buggy or hostile: a malformed message is
rejected whole (the connection closes with the reason), never half-applied.
"""

from __future__ import annotations

from typing import Any

from apportion.protocol import Message, ProtocolError
from apportion.resources import validate
from apportion.serialize import Pickled

_TASK_FIELDS = frozenset(
    {
        "key",
        "func",
        "args",
        "deps",
        "resources",
        "parent",  # the task that submitted it (kept in a client's lineage)
        "priority",
        "retries",
        "timeout",  # seconds a run may take (worker/server.py enforces it)
        "workers",
        "allow_other_workers",
        "placement_group",  # the group and bundle it runs in (placement_groups.py)
        "bundle_index",
        "stored",  # a client's value on its one worker, this key's (stored_arguments.py)
    }
)


def _expect(condition: bool, problem: str) -> None:
    if not condition:
        raise ProtocolError(problem)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_keys(message: Message) -> list[str]:
    keys: Any = message.get("keys")
    _expect(
        isinstance(keys, list) and all(isinstance(k, str) for k in keys),
        f"{message['op']!r} needs 'keys': a list of strings",
    )
    return keys


def check_lines(n: Any) -> int | None:
    """How many log lines a ``logs`` request asks for (None: all kept)."""
    _expect(
        n is None or (_is_int(n) and n >= 0), f"'logs' needs 'n': None or a count >= 0, got {n!r}"
    )
    return n


def check_submit(message: Message) -> list[Message]:
    tasks: Any = message.get("tasks")
    _expect(isinstance(tasks, list), "'submit' needs 'tasks': a list of task maps")
    seen: set[str] = set()
    for task in tasks:
        problem = _task_problem(task, seen)
        if problem is not None:  # messages are built only for a bad task: cheap when fine
            raise ProtocolError(problem)
        seen.add(task["key"])
        resources = task.get("resources")
        if not resources and (resources is None or type(resources) is dict):
            task["resources"] = {}  # what validate() returns for no demand, minus its checks
            continue
        try:
            task["resources"] = validate(resources)
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"task {task['key']!r}: {exc}") from None
    return tasks


def _task_problem(task: Any, seen: set[str]) -> str | None:
    """What is wrong with one submitted task (its resources aside), or None."""
    if not isinstance(task, dict):
        return f"a task must be a map, got {str(task)[:80]}"
    if not _TASK_FIELDS.issuperset(task):
        return f"task has unknown fields {sorted(set(task) - _TASK_FIELDS)}"
    key = task.get("key")
    if not isinstance(key, str) or key == "":
        return "task 'key' must be a non-empty string"
    if key in seen:
        return f"task {key!r} appears twice in one submission"
    if not isinstance(task.get("func"), bytes):
        return f"task {key!r}: 'func' must be bytes"
    if not isinstance(task.get("args"), (bytes, Pickled)):
        return f"task {key!r}: 'args' must be bytes or a pickle with out-of-band buffers"
    deps = task.get("deps", [])
    if not isinstance(deps, list) or not all(type(d) is str for d in deps):
        return f"task {key!r}: 'deps' must be a list of keys"
    priority = task.get("priority", 0)
    if not _is_int(priority):
        return f"task {key!r}: 'priority' must be an int"
    retries = task.get("retries", 0)
    if not _is_int(retries) or retries < 0:
        return f"task {key!r}: 'retries' must be an int >= 0"
    if "timeout" in task:
        timeout = task["timeout"]
        if type(timeout) not in (int, float) or not 0 < timeout < float("inf"):
            return f"task {key!r}: 'timeout' must be a number of seconds > 0"
    if "workers" in task:
        workers = task["workers"]
        if not isinstance(workers, list) or not all(type(w) is str for w in workers):
            return f"task {key!r}: 'workers' must be a list of worker names or addresses"
        if type(task.get("allow_other_workers", False)) is not bool:
            return f"task {key!r}: 'allow_other_workers' must be true or false"
    if "stored" in task:
        stored, workers = task["stored"], task.get("workers")
        if not _is_int(stored) or stored < 0 or not isinstance(workers, list) or len(workers) != 1:
            return f"task {key!r}: 'stored' must be a size in bytes, with one of 'workers'"
    if "placement_group" in task:
        if type(task["placement_group"]) is not str:
            return f"task {key!r}: 'placement_group' must be a group's id (a string)"
        index = task.get("bundle_index", 0)
        if not _is_int(index) or index < 0:
            return f"task {key!r}: 'bundle_index' must be an int >= 0"
    return None


def check_id(message: Message) -> None:
    """A request the scheduler answers carries the ``id`` its answer quotes."""
    _expect("id" in message, f"{message['op']!r} needs an 'id' to quote in its answer")


def check_run_id(message: Message) -> None:
    _expect(_is_int(message.get("run_id")), f"{message['op']!r} needs an integer 'run_id'")


def check_key(message: Message) -> str:
    key: Any = message.get("key")
    _expect(isinstance(key, str), f"{message['op']!r} needs 'key': a string")
    return key


def check_retire(message: Message) -> tuple[list[str], int | None]:
    """``names``: worker names; ``count`` (optional): how many of them at most."""
    names: Any = message.get("names")
    _expect(
        isinstance(names, list) and all(isinstance(n, str) for n in names),
        "'retire' needs 'names': a list of worker names",
    )
    count: Any = message.get("count")
    _expect(
        count is None or (_is_int(count) and count >= 0),
        f"'retire' needs 'count' to be an int >= 0 (or absent for all named), got {count!r}",
    )
    return names, count


def check_parent(message: Message) -> str:
    """The key of the task whose client submitted a batch (``parent``)."""
    parent: Any = message.get("parent")
    _expect(isinstance(parent, str) and parent != "", "'parent' must be a task key")
    return parent


def check_placement_group(message: Message) -> None:
    """A request naming a placement group; one making a group also gives its bundles
    (maps of resources, normalized in place) and a strategy."""
    _expect(type(message.get("group")) is str, f"{message['op']!r} needs 'group': its id")
    if message["op"] != "placement-group":
        return
    bundles: Any = message.get("bundles")
    _expect(
        isinstance(bundles, list) and len(bundles) > 0,
        "'placement-group' needs 'bundles': a non-empty list of resource maps",
    )
    try:
        message["bundles"] = [validate(bundle) for bundle in bundles]
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"placement group bundle: {exc}") from None
    _expect(type(message.get("strategy")) is str, "'placement-group' needs a 'strategy'")
