"""Where the package keeps files of its own outside the repository: one cache directory per user.

The checkpoint bridge caches its compiled jar here (``<home>/bridge/<digest>/``), and the development
services of ``flink_agents_replay.local`` keep their jars and work directories here too, so this module sits
below both: product code never reaches into ``local/`` for a path. ``$FLINK_AGENTS_REPLAY_HOME`` moves it;
otherwise it is ``$XDG_CACHE_HOME/flink-agents-replay`` (``~/.cache/flink-agents-replay``).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["HOME_ENV", "home_dir"]

HOME_ENV = "FLINK_AGENTS_REPLAY_HOME"


def home_dir() -> Path:
    """Root for the bridge's jar cache, fetched jars and local services' work directories."""
    configured = os.environ.get(HOME_ENV)
    if configured:
        return Path(configured).expanduser().resolve()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "flink-agents-replay"
