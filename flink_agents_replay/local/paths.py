"""Where local services keep their files: a cache and work directory outside the repository."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["conf_dir", "home_dir"]


def home_dir() -> Path:
    """Root for fetched jars and service work directories (``$FLINK_AGENTS_REPLAY_HOME``)."""
    configured = os.environ.get("FLINK_AGENTS_REPLAY_HOME")
    if configured:
        return Path(configured).expanduser().resolve()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "flink-agents-replay"


def conf_dir() -> Path:
    """The project's ``conf/`` directory (``$FLINK_AGENTS_REPLAY_CONF`` overrides it)."""
    configured = os.environ.get("FLINK_AGENTS_REPLAY_CONF")
    if configured:
        return Path(configured).expanduser().resolve()
    return Path(__file__).resolve().parent.parent.parent / "conf"
