"""Where local services keep their files: a cache and work directory outside the repository.

The cache root itself (:func:`home_dir`) belongs to the product (``flink_agents_replay.home``: the checkpoint
bridge caches its jar there too); this module adds what only the development services need.
"""

from __future__ import annotations

import os
from pathlib import Path

from flink_agents_replay.home import home_dir

__all__ = ["conf_dir", "home_dir"]


def conf_dir() -> Path:
    """The project's ``conf/`` directory (``$FLINK_AGENTS_REPLAY_CONF`` overrides it)."""
    configured = os.environ.get("FLINK_AGENTS_REPLAY_CONF")
    if configured:
        return Path(configured).expanduser().resolve()
    return Path(__file__).resolve().parent.parent.parent / "conf"
