"""Shared-secret tokens that every connection presents in its handshake."""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import stat
from pathlib import Path

TOKEN_ENV = "APPORTION_TOKEN"
TOKEN_FILE_ENV = "APPORTION_TOKEN_FILE"

logger = logging.getLogger("apportion.auth")


def default_token_file() -> Path:
    base = Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config"))
    return base / "apportion" / "token"


def generate_token() -> str:
    return secrets.token_urlsafe(32)


def tokens_match(offered: object, expected: str) -> bool:
    """Whether ``offered`` is the token, in constant time; anything that is not a string
    (or not even text) is simply a wrong token."""
    if not isinstance(offered, str):
        return False
    # As bytes: compare_digest refuses str with characters outside ASCII.
    return hmac.compare_digest(
        offered.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
    )


def data_token(cluster_token: str) -> str:
    """The token a client of a tenant (scheduler/tenants.py) presents to workers, to fetch
    results from them: derived from the cluster's token, which such a client never learns
    (the scheduler refuses this one), and accepted by every worker from clients."""
    return hmac.new(cluster_token.encode(), b"apportion client data", "sha256").hexdigest()


def read_token_file(path: str) -> str:
    try:
        with open(path) as handle:
            token = handle.read().strip()
            mode = os.fstat(handle.fileno()).st_mode
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "it is not UTF-8 text"
        raise ValueError(f"cannot read token file {path!r}: {why}") from None
    if not token:
        raise ValueError(f"token file {path!r} is empty")
    warn_if_readable_by_others(path, mode)
    return token


def warn_if_readable_by_others(path: str, mode: int) -> None:
    """Anyone who can read the token can run code on every worker: say so, with the fix."""
    if stat.S_ISREG(mode) and mode & (stat.S_IRWXG | stat.S_IRWXO):
        logger.warning(
            "token file %s can be read by other users (mode %s): anyone who reads it can "
            "run code on this cluster; run: chmod 600 %s",
            path,
            oct(stat.S_IMODE(mode)),
            path,
        )


def token_from_environment() -> str | None:
    """``$APPORTION_TOKEN``, else ``$APPORTION_TOKEN_FILE``'s contents, else the default
    token file (``~/.config/apportion/token``) if it exists, else None."""
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV]
    path = os.environ.get(TOKEN_FILE_ENV)
    if path:
        return read_token_file(path)
    default = default_token_file()
    return read_token_file(str(default)) if default.is_file() else None


def connecting_token(token_file: str | None, no_auth: bool) -> str | None:
    """The token a worker presents: none with ``--no-auth``, else ``--token-file``'s
    contents, else the environment or the default token file (see token_from_environment)."""
    if no_auth:
        return None
    return read_token_file(token_file) if token_file else token_from_environment()


def read_or_create_token_file(path: Path) -> str:
    """The token in ``path``; a new random one, written there readable by us only, if absent."""
    if path.is_file():
        return read_token_file(str(path))
    token = generate_token()
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(token + "\n")
    logger.warning(
        "generated a new token in %s: give it to workers and clients "
        "(--token-file %s, or APPORTION_TOKEN)",
        path,
        path,
    )
    return token


def scheduler_token(token_file: str | None, no_auth: bool) -> str | None:
    """Authentication is on unless ``--no-auth``: the token comes from ``--token-file``
    (created if missing), the environment, or the default token file (created if missing)."""
    if no_auth:
        logger.warning(
            "authentication is OFF (--no-auth): anyone who can reach this port can "
            "run code here; use it only on a trusted, private network"
        )
        return None
    if token_file:
        return read_or_create_token_file(Path(token_file))
    return token_from_environment() or read_or_create_token_file(default_token_file())
