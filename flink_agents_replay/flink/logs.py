"""Logging set-up of a subtask and the operator's log summaries.

The operator's INFO lines (restores, closing summaries) are what an operator of the job reads first, and
what tests and the demo look for; PyFlink's worker does not show Python logging by default, so every
subtask adds one handler (once per process) to the package's logger.
"""

from __future__ import annotations

import logging
import os
import threading

from flink_agents_replay.engine import RunStats

__all__ = ["LOG_FILE_ENV", "configure_logging", "describe_stats"]

#: Set to a file path to have every subtask append its log lines there (the worker's stderr is hard to find).
LOG_FILE_ENV = "FLINK_AGENTS_REPLAY_LOG_FILE"

_LOGGING_SET_UP = threading.Lock()


def configure_logging() -> None:
    """Make the operator's INFO lines visible: to $FLINK_AGENTS_REPLAY_LOG_FILE, else to stderr (once per process:
    the handler is marked, so a second copy of this module does not add another and double every line)."""
    logger = logging.getLogger("flink_agents_replay")
    with _LOGGING_SET_UP:  # subtasks of one TaskManager open concurrently: check and add as one step
        if any(getattr(handler, "_flink_agents_replay", False) for handler in logger.handlers):
            return
        path = os.environ.get(LOG_FILE_ENV)
        handler = logging.FileHandler(path) if path else logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler._flink_agents_replay = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def describe_stats(stats: RunStats) -> str:
    """A subtask's run totals in one line (closing, and when a restore has been replayed)."""
    return (f"actions executed {stats.actions_executed}, reused {stats.actions_reused}; calls executed "
            f"{stats.calls_executed}, reused {stats.calls_reused}, in doubt {stats.calls_in_doubt}; "
            f"sub-agent calls executed {stats.child_calls_executed}, reused {stats.child_calls_reused}; "
            f"divergences {stats.divergences}"
            + (f"; replay: calls served from production's capture {stats.calls_recorded}, blocked "
               f"{stats.calls_blocked}" if stats.calls_recorded or stats.calls_blocked else ""))
