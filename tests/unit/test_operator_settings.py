"""The operator's settings are typed sections read from the one configuration schema."""

from __future__ import annotations

from apportion.operator.settings import OperatorSettings, PeeringSettings
from apportion.operator.spec import DEFAULT_IMAGE, Defaults

from apportion import config


def test_defaults_are_a_standalone_operator_with_the_default_image() -> None:
    with config.set({}):
        settings = OperatorSettings.from_config()
    assert settings == OperatorSettings(
        interval=2.0,
        threads=32,
        peering=PeeringSettings(name=None, lifetime=20),
        defaults=Defaults(DEFAULT_IMAGE, "IfNotPresent", ()),
    )


def test_every_section_follows_the_configuration() -> None:
    values = {
        "operator.interval": 0.5,
        "operator.threads": 4,
        "operator.peering.name": "apportion",
        "operator.peering.lifetime": 30,
        "operator.image": "registry/apportion:1.0",
        "operator.image-pull-policy": "Always",
        "operator.image-pull-secrets": " regcred, other ,",
    }
    with config.set(values):
        settings = OperatorSettings.from_config()
    assert settings.interval == 0.5 and settings.threads == 4
    assert settings.peering == PeeringSettings(name="apportion", lifetime=30)
    assert settings.defaults == Defaults("registry/apportion:1.0", "Always", ("regcred", "other"))


def test_environment_variables_reach_the_sections() -> None:
    try:
        config.refresh(
            {"APPORTION_OPERATOR__PEERING__NAME": "peers", "APPORTION_OPERATOR_THREADS": "3"}
        )
        settings = OperatorSettings.from_config()
    finally:
        config.refresh()
    assert settings.peering.name == "peers" and settings.threads == 3
