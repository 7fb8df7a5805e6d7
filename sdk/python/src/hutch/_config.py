"""Where the server is and which key to use: arguments, then environment, then the key file."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

DEFAULT_URL = "http://127.0.0.1:7700"
"""Address of a local ``hutch serve`` with its default ``--listen``."""


def default_state_dir() -> Path:
    """The server's state directory, as ``hutch serve`` chooses it.

    ``$HUTCH_STATE_DIR`` if set; else ``/var/lib/hutch`` when running as root; else
    ``$XDG_DATA_HOME/hutch`` (``~/.local/share/hutch`` when ``XDG_DATA_HOME`` is unset).
    """
    env = os.environ.get("HUTCH_STATE_DIR")
    if env:
        return Path(env)
    geteuid = getattr(os, "geteuid", None)
    if geteuid is not None and geteuid() == 0:
        return Path("/var/lib/hutch")
    xdg = os.environ.get("XDG_DATA_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "share"
    )
    return Path(xdg) / "hutch"


@dataclass(frozen=True)
class Config:
    """Resolved connection settings."""

    url: str
    """Base URL of the server, without a trailing slash."""
    api_key: Optional[str]
    """Bearer key, or ``None`` when none was found (the server will answer 401)."""
    key_source: str
    """Where the key came from, for error messages."""


def resolve(
    url: Optional[str] = None,
    api_key: Optional[str] = None,
    state_dir: Union[str, os.PathLike[str], None] = None,
) -> Config:
    """Resolve the server URL and API key.

    The URL is ``url``, else ``$HUTCH_URL``, else ``http://127.0.0.1:7700``. The key is
    ``api_key``, else ``$HUTCH_API_KEY``, else the contents of ``<state dir>/admin.key`` where
    the state directory is ``state_dir`` or :func:`default_state_dir`.
    """
    base = (url or os.environ.get("HUTCH_URL") or DEFAULT_URL).rstrip("/")
    if api_key:
        return Config(base, api_key, "the api_key argument")
    env_key = os.environ.get("HUTCH_API_KEY")
    if env_key:
        return Config(base, env_key.strip(), "$HUTCH_API_KEY")
    key_file = Path(state_dir) if state_dir is not None else default_state_dir()
    key_file = key_file / "admin.key"
    try:
        key = key_file.read_text(encoding="utf-8").strip()
    except OSError:
        return Config(
            base, None, f"nothing (no api_key, no $HUTCH_API_KEY, and {key_file} is unreadable)"
        )
    return Config(base, key or None, str(key_file))
