"""Logging set-up of a subtask and the operator's log summaries.

The operator's INFO lines (restores, closing summaries) are what an operator of the job reads first, and
what tests and the demo look for; PyFlink's worker does not show Python logging by default, so every
subtask adds one handler (once per process) to the package's logger.

That handler never blocks the thread that logs: records go through a bounded queue to one writer thread, and
are dropped (and counted) when the queue is full. A local MiniCluster's JVM has its stderr on a pipe PyFlink reads
only if the JVM fails to start (``pyflink_gateway_server``): after 64 KB a write there blocks for ever, and a
task thread writing its log line would hold every Python operator of the TaskManager with it.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
from logging.handlers import QueueHandler, QueueListener

from flink_agents_replay.engine import RunStats

__all__ = ["LOG_FILE_ENV", "configure_logging", "describe_stats", "dropped_log_records"]

#: Set to a file path to have every subtask append its log lines there (the worker's stderr is hard to find).
LOG_FILE_ENV = "FLINK_AGENTS_REPLAY_LOG_FILE"

#: Records waiting for the writer thread at most; more are dropped (a writer that cannot write: a full pipe).
QUEUE_BOUND = 10_000

_LOGGING_SET_UP = threading.Lock()


class _DroppingQueueHandler(QueueHandler):
    """Puts records on a bounded queue without waiting; drops and counts them when it is full."""

    def __init__(self, records: queue.Queue) -> None:
        super().__init__(records)
        self.dropped = 0

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1


class _Writer:
    """Writes the queued records (the listener's "handler"). Not a ``logging.Handler``: ``logging.shutdown`` at exit
    would flush it, and wait for ever on a writer blocked on a full pipe."""

    def __init__(self, path: str | None) -> None:
        self.stream = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115 - open for the process
        self.formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def handle(self, record: logging.LogRecord) -> None:
        stream = self.stream or sys.stderr
        try:
            stream.write(self.formatter.format(record) + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001 - a log line that cannot be written is not worth failing anything for
            pass


_handler: _DroppingQueueHandler | None = None


def configure_logging() -> None:
    """Make the operator's INFO lines visible: to $FLINK_AGENTS_REPLAY_LOG_FILE, else to stderr (once per process:
    the handler is marked, so a second copy of this module does not add another and double every line)."""
    global _handler
    logger = logging.getLogger("flink_agents_replay")
    with _LOGGING_SET_UP:  # subtasks of one TaskManager open concurrently: check and add as one step
        if any(getattr(handler, "_flink_agents_replay", False) for handler in logger.handlers):
            return
        records: queue.Queue = queue.Queue(QUEUE_BOUND)
        QueueListener(records, _Writer(os.environ.get(LOG_FILE_ENV))).start()  # a daemon thread
        _handler = _DroppingQueueHandler(records)
        _handler._flink_agents_replay = True  # type: ignore[attr-defined]
        logger.addHandler(_handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def dropped_log_records() -> int:
    """How many of the package's log records this process dropped (its writer could not keep up, or not write)."""
    return _handler.dropped if _handler is not None else 0


def describe_stats(stats: RunStats) -> str:
    """A subtask's run totals in one line (closing, and when a restore has been replayed)."""
    return (f"actions executed {stats.actions_executed}, reused {stats.actions_reused}; calls executed "
            f"{stats.calls_executed}, reused {stats.calls_reused}, in doubt {stats.calls_in_doubt}; "
            f"sub-agent calls executed {stats.child_calls_executed}, reused {stats.child_calls_reused}; "
            f"divergences {stats.divergences}"
            + (f"; replay: calls served from production's capture {stats.calls_recorded}, blocked "
               f"{stats.calls_blocked}" if stats.calls_recorded or stats.calls_blocked else ""))
