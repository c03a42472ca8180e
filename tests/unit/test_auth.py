"""Tokens: compared safely whatever a peer sends; token files others can read are named."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from apportion.auth import read_or_create_token_file, read_token_file, tokens_match


@pytest.mark.parametrize("offered", ["tökén", "\u2603", "", None, 42, b"s3cret", ["s3cret"]])
def test_anything_but_the_token_is_a_wrong_token(offered: object) -> None:
    assert tokens_match(offered, "s3cret") is False


def test_the_token_matches_itself_even_outside_ascii() -> None:
    assert tokens_match("s3cret", "s3cret")
    assert tokens_match("tökén", "tökén")


def _read_with_mode(mode: int, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> Path:
    path = tmp_path / "token"
    path.write_text("s3cret\n")
    os.chmod(path, mode)
    with caplog.at_level(logging.WARNING, logger="apportion.auth"):
        assert read_token_file(str(path)) == "s3cret"
    return path


def test_a_token_file_others_can_read_is_accepted_with_a_warning_naming_the_fix(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _read_with_mode(0o644, tmp_path, caplog)
    (record,) = [r for r in caplog.records if r.name == "apportion.auth"]
    assert str(path) in record.getMessage()
    assert f"chmod 600 {path}" in record.getMessage()
    assert "0o644" in record.getMessage()


def test_a_private_token_file_is_read_silently(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _read_with_mode(0o600, tmp_path, caplog)
    assert not [r for r in caplog.records if r.name == "apportion.auth"]


def test_a_created_token_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "token"
    token = read_or_create_token_file(path)
    assert path.read_text().strip() == token
    assert path.stat().st_mode & 0o077 == 0
