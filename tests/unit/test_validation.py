"""Each malformed submitted task is refused with a message naming what is wrong."""

from __future__ import annotations

from typing import Any

import pytest
from apportion.scheduler.validation import check_submit

from apportion.protocol import ProtocolError

GOOD: dict[str, Any] = {"key": "k", "func": b"f", "args": b"a", "deps": ["d"]}


@pytest.mark.parametrize(
    ("task", "problem"),
    [
        ("not a map", "a task must be a map, got not a map"),
        ({**GOOD, "colour": 1}, "unknown fields ['colour']"),
        ({**GOOD, "key": ""}, "'key' must be a non-empty string"),
        ({**GOOD, "key": 7}, "'key' must be a non-empty string"),
        ({**GOOD, "func": "text"}, "task 'k': 'func' must be bytes"),
        ({**GOOD, "args": None}, "task 'k': 'args' must be bytes"),
        ({**GOOD, "deps": "d"}, "task 'k': 'deps' must be a list of keys"),
        ({**GOOD, "deps": ["d", 1]}, "task 'k': 'deps' must be a list of keys"),
        ({**GOOD, "priority": True}, "task 'k': 'priority' must be an int"),
        ({**GOOD, "retries": -1}, "task 'k': 'retries' must be an int >= 0"),
        ({**GOOD, "resources": {"GPU": -1}}, "task 'k': "),
    ],
)
def test_a_bad_task_is_refused_with_what_is_wrong(task: Any, problem: str) -> None:
    with pytest.raises(ProtocolError) as info:
        check_submit({"op": "submit", "tasks": [GOOD | {"key": "first"}, task]})
    assert problem in str(info.value)


def test_the_same_key_twice_in_one_submission_is_refused() -> None:
    with pytest.raises(ProtocolError, match="'k' appears twice"):
        check_submit({"op": "submit", "tasks": [GOOD, GOOD]})


def test_good_tasks_pass_with_their_demands_normalised() -> None:
    tasks = check_submit(
        {"op": "submit", "tasks": [GOOD, {**GOOD, "key": "g", "resources": {"GPU": 1}}]}
    )
    assert tasks[0]["resources"] == {}
    assert tasks[1]["resources"] == {"GPU": 1.0}
