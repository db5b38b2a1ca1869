"""Where local services keep their files: a cache and work directory outside the repository, and their config.

The cache root itself (:func:`home_dir`) belongs to the product (``flink_agents_replay.core.home``); this module adds
what only the development services need: the configuration files they start from (Kafka's and Flink's), which
are package data, so an installed wheel has them.
"""

from __future__ import annotations

import os
from pathlib import Path

from flink_agents_replay.core.home import home_dir

__all__ = ["conf_dir", "home_dir"]

PACKAGED_CONF = Path(__file__).resolve().parent / "conf"


def conf_dir() -> Path:
    """The services' configuration files (``kafka/``, ``flink/``); ``$FLINK_AGENTS_REPLAY_CONF`` overrides them."""
    configured = os.environ.get("FLINK_AGENTS_REPLAY_CONF")
    if configured:
        return Path(configured).expanduser().resolve()
    return PACKAGED_CONF
