"""Configuration: defaults < YAML files < environment < config.set."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from apportion import config, config_schema
from apportion.errors import ConfigError


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """No user config files and no APPORTION_* variables leak in; rebuilt after the test."""
    import os

    for name in list(os.environ):
        if name.startswith("APPORTION_"):
            monkeypatch.delenv(name)
    home = tmp_path / "xdg"
    home.mkdir()
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    yield home
    # restore_config (conftest) puts the previous values back.


def test_defaults_are_present(clean_env: Path) -> None:
    config.refresh({})
    assert config.get("scheduler.worker-prefetch") == 1
    assert config.get("scheduler.allowed-failures") == 3
    assert config.get("scheduler.no-worker-timeout") is None
    assert config.get("worker.resources") == {}


@pytest.mark.parametrize(
    ("name", "raw", "key", "expected"),
    [
        ("APPORTION_WORKER__RESOURCES__GPU", "2", "worker.resources.GPU", 2),
        ("APPORTION_WORKER__RESOURCES__gpu", "2", "worker.resources.gpu", 2),
        ("APPORTION_WORKER__RESOURCES__MEMORY", "100e9", "worker.resources.MEMORY", 100e9),
        ("APPORTION_WORKER__RESOURCES__process", "1", "worker.resources.process", 1),
        ("APPORTION_SCHEDULER__NO_WORKER_TIMEOUT", "5", "scheduler.no-worker-timeout", 5),
        ("APPORTION_SCHEDULER__NO-WORKER-TIMEOUT", "2.5", "scheduler.no-worker-timeout", 2.5),
        ("APPORTION_scheduler__allowed_failures", "7", "scheduler.allowed-failures", 7),
        ("APPORTION_WORKER__NTHREADS", "None", "worker.nthreads", None),
        ("APPORTION_WORKER__NTHREADS", "null", "worker.nthreads", None),
        ("APPORTION_SCHEDULER__HTTP_PORT", "8787", "scheduler.http-port", 8787),
        ("APPORTION_SCHEDULER__VALIDATE", "true", "scheduler.validate", True),
        ("APPORTION_CLIENT__DIRECT_RESULTS", "False", "client.direct-results", False),
        ("APPORTION_COMM__EVENT_LOOP", "asyncio", "comm.event-loop", "asyncio"),
        ("APPORTION_COMM__TLS__CA_FILE", "/etc/ca.pem", "comm.tls.ca-file", "/etc/ca.pem"),
        ("APPORTION_COMM__TLS__CA_FILE", "123", "comm.tls.ca-file", "123"),
    ],
)
def test_environment_variables_set_nested_keys(
    clean_env: Path, name: str, raw: str, key: str, expected: object
) -> None:
    config.refresh({name: raw})
    assert config.get(key) == expected


def test_resource_names_from_the_environment_keep_their_case(clean_env: Path) -> None:
    config.refresh(
        {"APPORTION_WORKER__RESOURCES__GPU": "1", "APPORTION_WORKER__RESOURCES__gpu": "2"}
    )
    assert config.get("worker.resources") == {"GPU": 1, "gpu": 2}


def test_other_keys_are_case_insensitive(clean_env: Path) -> None:
    config.refresh({"APPORTION_SCHEDULER__ALLOWED_FAILURES": "9"})
    assert config.get("SCHEDULER.Allowed_Failures") == 9


def test_unrelated_environment_variables_are_ignored(clean_env: Path) -> None:
    config.refresh({"HOME": "/x", "APPORTION_NOSEPARATOR": "1", "OTHER__X": "2"})
    assert config.get("noseparator", None) is None
    assert config.get("other.x", None) is None


def test_environment_leaves_sibling_defaults_in_place(clean_env: Path) -> None:
    config.refresh({"APPORTION_SCHEDULER__ALLOWED_FAILURES": "9"})
    assert config.get("scheduler.worker-prefetch") == 1


def test_set_overrides_the_environment_and_restores_on_exit(clean_env: Path) -> None:
    config.refresh({"APPORTION_WORKER__RESOURCES__GPU": "2"})
    with config.set({"worker.resources.GPU": 4}):
        assert config.get("worker.resources.GPU") == 4
        with config.set(scheduler__no_worker_timeout=5):
            assert config.get("scheduler.no-worker-timeout") == 5
            assert config.get("worker.resources.GPU") == 4
        assert config.get("scheduler.no-worker-timeout") is None
    assert config.get("worker.resources.GPU") == 2


def test_set_restores_on_exit_even_when_the_block_raises(clean_env: Path) -> None:
    config.refresh({})
    with pytest.raises(RuntimeError), config.set({"scheduler.allowed-failures": 0}):
        raise RuntimeError
    assert config.get("scheduler.allowed-failures") == 3


def test_set_as_a_plain_call_persists(clean_env: Path) -> None:
    config.refresh({})
    config.set({"worker.resources.GPU": 2})
    assert config.get("worker.resources") == {"GPU": 2}


def test_set_merges_nested_mappings(clean_env: Path) -> None:
    config.refresh({"APPORTION_WORKER__RESOURCES__GPU": "2"})
    with config.set({"worker.resources": {"MEMORY": 1e9}}):
        assert config.get("worker.resources") == {"GPU": 2, "MEMORY": 1e9}


def test_set_keeps_resource_name_case_and_normalises_the_rest(clean_env: Path) -> None:
    config.refresh({})
    with config.set({"WORKER.RESOURCES.gpu": 1, "Scheduler.No_Worker_Timeout": 3}):
        assert config.get("worker.resources") == {"gpu": 1}
        assert config.get("scheduler.no-worker-timeout") == 3


def test_get_of_a_missing_key_raises_naming_it_or_returns_the_default(clean_env: Path) -> None:
    config.refresh({})
    with pytest.raises(KeyError, match=r"scheduler\.nope"):
        config.get("scheduler.nope")
    assert config.get("scheduler.nope", 42) == 42
    assert config.get("worker.resources.GPU", None) is None


def test_get_returns_a_copy(clean_env: Path) -> None:
    config.refresh({"APPORTION_WORKER__RESOURCES__GPU": "2"})
    config.get("worker.resources")["GPU"] = 99
    assert config.get("worker.resources.GPU") == 2


@pytest.mark.parametrize("key", ["", ".", ".."])
def test_empty_keys_are_rejected(key: str) -> None:
    with pytest.raises(ValueError, match="empty configuration key"):
        config.get(key)


def _yaml(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_yaml_file_named_by_apportion_config(
    clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _yaml(
        tmp_path / "apportion.yaml",
        "worker:\n  resources:\n    GPU: 2\n    Licence: 1\nscheduler:\n  no_worker_timeout: 8\n",
    )
    monkeypatch.setenv("APPORTION_CONFIG", str(path))
    config.refresh()
    assert config.get("worker.resources") == {"GPU": 2, "Licence": 1}
    assert config.get("scheduler.no-worker-timeout") == 8


def test_precedence_is_defaults_then_file_then_environment_then_set(
    clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _yaml(
        tmp_path / "c.yaml",
        "worker:\n  resources:\n    GPU: 1\n    MEMORY: 5\nscheduler:\n  allowed-failures: 7\n",
    )
    monkeypatch.setenv("APPORTION_CONFIG", str(path))
    monkeypatch.setenv("APPORTION_WORKER__RESOURCES__GPU", "2")
    config.refresh()
    assert config.get("scheduler.worker-prefetch") == 1  # default
    assert config.get("scheduler.allowed-failures") == 7  # file over default
    assert config.get("worker.resources.MEMORY") == 5  # file
    assert config.get("worker.resources.GPU") == 2  # environment over file
    with config.set({"worker.resources.GPU": 3}):
        assert config.get("worker.resources.GPU") == 3  # set over environment


def test_yaml_files_in_the_user_config_directory_are_read(clean_env: Path) -> None:
    (clean_env / "apportion").mkdir()
    _yaml(clean_env / "apportion" / "a.yaml", "scheduler:\n  allowed-failures: 5\n")
    config.refresh({"XDG_CONFIG_HOME": str(clean_env)})
    assert config.get("scheduler.allowed-failures") == 5


def test_yaml_file_that_is_not_a_mapping_is_rejected_naming_the_file(
    clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _yaml(tmp_path / "bad.yaml", "- 1\n- 2\n")
    monkeypatch.setenv("APPORTION_CONFIG", str(path))
    with pytest.raises(ValueError, match=r"bad\.yaml"):
        config.refresh()


def test_refresh_reads_the_config_file_named_in_the_given_environ(
    clean_env: Path, tmp_path: Path
) -> None:
    path = _yaml(tmp_path / "c.yaml", "scheduler:\n  allowed-failures: 7\n")
    config.refresh({"APPORTION_CONFIG": str(path)})
    assert config.get("scheduler.allowed-failures") == 7


def test_inherited_configuration_wins_over_the_environment(clean_env: Path) -> None:
    """A LocalCluster's processes inherit its whole configuration, environment and
    config.set included: what it set with config.set beats the environment there too."""
    import json

    inherited = json.dumps(
        {"scheduler": {"no-worker-timeout": 5}, "worker": {"resources": {"X": 1}}}
    )
    config.refresh(
        {
            config.INHERITED_ENV: inherited,
            "APPORTION_SCHEDULER__NO_WORKER_TIMEOUT": "99",
            "APPORTION_WORKER__RESOURCES__GPU": "2",
        }
    )
    assert config.get("scheduler.no-worker-timeout") == 5
    assert config.get("worker.resources") == {"GPU": 2, "X": 1}


@pytest.mark.parametrize(
    ("key", "closest"),
    [
        ("scheduler.no-worker-timout", "scheduler.no-worker-timeout"),
        ("scheduler.allowed-failure", "scheduler.allowed-failures"),
        ("worker.resource.gpu", "worker.resources.gpu"),
        ("comm.tls.certfile", "comm.tls.cert-file"),
    ],
)
def test_an_unknown_key_is_an_error_naming_it_and_the_closest_known_key(
    clean_env: Path, key: str, closest: str
) -> None:
    with pytest.raises(ConfigError, match="unknown configuration key") as raised:
        config.set({key: 1})
    assert (raised.value.key, raised.value.suggestion) == (key, closest)
    assert repr(key) in str(raised.value) and repr(closest) in str(raised.value)
    assert "config.set" in str(raised.value)


def test_an_unknown_key_from_the_environment_names_the_variable(clean_env: Path) -> None:
    name = "APPORTION_SCHEDULER__NO_WORKER_TIMOUT"
    with pytest.raises(ConfigError, match=f"environment variable {name}") as raised:
        config.refresh({name: "5"})
    assert raised.value.suggestion == "scheduler.no-worker-timeout"


def test_an_unknown_key_in_a_file_names_the_file(clean_env: Path, tmp_path: Path) -> None:
    path = _yaml(tmp_path / "c.yaml", "scheduler:\n  alowed-failures: 7\n")
    with pytest.raises(ConfigError, match=f"file {path}") as raised:
        config.refresh({"APPORTION_CONFIG": str(path)})
    assert raised.value.suggestion == "scheduler.allowed-failures"


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("scheduler.allowed-failures", "three", "integer"),
        ("scheduler.allowed-failures", 2.5, "integer"),
        ("scheduler.no-worker-timeout", "5s", "number or None"),
        ("scheduler.validate", 1, "boolean"),
        ("scheduler.worker-prefetch", True, "integer"),
        ("comm.event-loop", "trio", "'uvloop' or 'asyncio'"),
        ("worker.resources.GPU", "two", "number"),
        ("worker.resources", [1], "mapping"),
    ],
)
def test_a_value_of_the_wrong_type_is_an_error_naming_the_key_and_type(
    clean_env: Path, key: str, value: object, expected: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(expected)) as raised:
        config.set({key: value})
    assert raised.value.key == key
    assert repr(value) in str(raised.value)


def test_a_rejected_set_changes_nothing(clean_env: Path) -> None:
    config.refresh({})
    with pytest.raises(ConfigError):
        config.set({"scheduler.allowed-failures": 9, "scheduler.typo": 1})
    assert config.get("scheduler.allowed-failures") == 3


def test_every_default_has_the_type_its_setting_declares() -> None:
    for setting in config_schema.SETTINGS:
        if setting.key not in config_schema.OPEN_MAPPINGS:
            config_schema.check_value(setting, setting.default, "defaults")
    assert config.DEFAULTS == config_schema.defaults()


def test_the_readme_settings_table_is_generated_from_the_schema() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert config_schema.markdown_table() in readme, (
        "regenerate the README's settings table: apportion settings"
    )


def test_get_immutable_follows_set_and_its_undoing() -> None:
    default = config.get("comm.max-frame-bytes")
    assert config.get_immutable("comm.max-frame-bytes") == default
    with config.set({"comm.max-frame-bytes": default // 2}):
        assert config.get_immutable("comm.max-frame-bytes") == default // 2
    assert config.get_immutable("comm.max-frame-bytes") == default
    config.set({"comm.max-frame-bytes": default // 4})  # not undone until refresh
    try:
        assert config.get_immutable("comm.max-frame-bytes") == default // 4
    finally:
        config.refresh()
    assert config.get_immutable("comm.max-frame-bytes") == default


@pytest.mark.parametrize(
    ("name", "raw", "key", "expected"),
    [
        ("APPORTION_OPERATOR__INTERVAL", "5", "operator.interval", 5),
        ("APPORTION_OPERATOR__THREADS", "8", "operator.threads", 8),
        ("APPORTION_OPERATOR__IMAGE", "reg/apportion:1", "operator.image", "reg/apportion:1"),
        ("APPORTION_OPERATOR__IMAGE_PULL_POLICY", "Never", "operator.image-pull-policy", "Never"),
        ("APPORTION_OPERATOR__IMAGE_PULL_SECRETS", "a,b", "operator.image-pull-secrets", "a,b"),
        ("APPORTION_OPERATOR__PEERING__NAME", "op", "operator.peering.name", "op"),
        ("APPORTION_OPERATOR__PEERING__LIFETIME", "30", "operator.peering.lifetime", 30),
        ("APPORTION_SCHEDULER__CONTACT_HOST", "10.0.0.1", "scheduler.contact-host", "10.0.0.1"),
        (
            "APPORTION_CLIENT__SCHEDULER_ADDRESS",
            "tcp://s:8786",
            "client.scheduler-address",
            "tcp://s:8786",
        ),
        ("APPORTION_LOGGING__LEVEL", "DEBUG", "logging.level", "DEBUG"),
    ],
)
def test_every_setting_has_an_environment_variable_by_the_one_convention(
    clean_env: Path, name: str, raw: str, key: str, expected: object
) -> None:
    assert config_schema.env_name(key) == name
    config.refresh({name: raw})
    assert config.get(key) == expected


@pytest.mark.parametrize(
    ("legacy", "raw", "key", "expected"),
    [
        ("APPORTION_OPERATOR_INTERVAL", "0.5", "operator.interval", 0.5),
        ("APPORTION_OPERATOR_THREADS", "4", "operator.threads", 4),
        ("APPORTION_OPERATOR_IMAGE", "apportion:dev", "operator.image", "apportion:dev"),
        ("APPORTION_OPERATOR_IMAGE_PULL_POLICY", "Always", "operator.image-pull-policy", "Always"),
        ("APPORTION_OPERATOR_IMAGE_PULL_SECRETS", "r", "operator.image-pull-secrets", "r"),
        ("APPORTION_OPERATOR_PEERING", "op", "operator.peering.name", "op"),
        ("APPORTION_OPERATOR_PEERING_LIFETIME", "25", "operator.peering.lifetime", 25),
        ("APPORTION_CONTACT_HOST", "10.0.0.2", "scheduler.contact-host", "10.0.0.2"),
        ("APPORTION_SCHEDULER_ADDRESS", "tcp://s:1", "client.scheduler-address", "tcp://s:1"),
        ("APPORTION_LOG_LEVEL", "WARNING", "logging.level", "WARNING"),
    ],
)
def test_the_variable_an_older_release_read_still_sets_its_setting(
    clean_env: Path, legacy: str, raw: str, key: str, expected: object
) -> None:
    config.refresh({legacy: raw})
    assert config.get(key) == expected


def test_a_settings_own_variable_wins_over_its_older_name(clean_env: Path) -> None:
    config.refresh({"APPORTION_OPERATOR_INTERVAL": "9", "APPORTION_OPERATOR__INTERVAL": "3"})
    assert config.get("operator.interval") == 3


def test_an_older_variable_of_the_wrong_type_is_an_error_naming_it(clean_env: Path) -> None:
    with pytest.raises(ConfigError, match="APPORTION_OPERATOR_THREADS") as raised:
        config.refresh({"APPORTION_OPERATOR_THREADS": "many"})
    assert raised.value.key == "operator.threads"


def test_every_variable_the_package_reads_is_a_setting() -> None:
    """No module reads an APPORTION_ variable of its own, except the few that are not
    settings (tokens, and what a process hands its children)."""
    root = Path(__file__).parents[2]
    not_settings = {
        "APPORTION_TOKEN",
        "APPORTION_TOKEN_FILE",
        "APPORTION_CONFIG",
        "APPORTION_INTERNAL_INHERIT_CONFIG",
        "APPORTION_INTERNAL_PARENT_PID",
    }
    legacy = {s.legacy_env for s in config_schema.SETTINGS if s.legacy_env}
    for folder in ("k8s_operator", "scheduler"):
        for path in (root / folder).rglob("*.py"):
            for name in re.findall(r"environ(?:\.get)?\(\s*\"(APPORTION_\w+)\"", path.read_text()):
                assert name in not_settings, f"{path.name} reads ${name} outside the schema"
    assert {"APPORTION_CONTACT_HOST", "APPORTION_LOG_LEVEL"} <= legacy
