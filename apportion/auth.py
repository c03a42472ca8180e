"""Shared-secret tokens that every connection presents in its handshake."""

from __future__ import annotations

import os
import secrets

TOKEN_ENV = "APPORTION_TOKEN"
TOKEN_FILE_ENV = "APPORTION_TOKEN_FILE"


def generate_token() -> str:
    return secrets.token_urlsafe(32)


def read_token_file(path: str) -> str:
    try:
        with open(path) as handle:
            token = handle.read().strip()
    except OSError as exc:
        raise ValueError(f"cannot read token file {path!r}: {exc.strerror}") from None
    if not token:
        raise ValueError(f"token file {path!r} is empty")
    return token


def token_from_environment() -> str | None:
    """``$APPORTION_TOKEN``, else the contents of ``$APPORTION_TOKEN_FILE``, else None."""
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV]
    path = os.environ.get(TOKEN_FILE_ENV)
    return read_token_file(path) if path else None
