"""Count real invocations in a SQLite file, outside the Flink Python worker.

Failure tests must count what *actually* ran, across restarts and killed TaskManagers: a counter in the
worker's memory would die with it. An :class:`InvocationCounter` holds only a file path, so it pickles
into a Flink function; every process that increments it writes the same file, and each increment is
committed before it returns.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

__all__ = ["InvocationCounter", "SharedSqliteFile"]


class SharedSqliteFile:
    """A SQLite file that pickles as its path: one connection per thread, usable from any process.

    WAL and no fsync: what is committed survives a killed process (the OS keeps the pages), cheaply.
    """

    def __init__(self, path: str | Path):
        self.path = str(path)
        self._local = threading.local()

    def __getstate__(self) -> dict:
        return {"path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.path = state["path"]
        self._local = threading.local()

    def _connect(self) -> sqlite3.Connection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            # A generous busy timeout: parallel subtasks write concurrently.
            connection = sqlite3.connect(self.path, timeout=60)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=OFF")
            self._local.connection = connection
        return connection


class InvocationCounter(SharedSqliteFile):
    """Named counters in a SQLite file; safe across threads and processes.

    >>> counter = InvocationCounter(tmp_path / "calls.db")   # doctest: +SKIP
    >>> counter.increment("llm"); counter.count("llm")       # doctest: +SKIP
    1
    """

    def __init__(self, path: str | Path):
        super().__init__(path)
        with self._connect() as connection:
            connection.execute("CREATE TABLE IF NOT EXISTS counts (name TEXT PRIMARY KEY, n INTEGER NOT NULL)")

    def increment(self, name: str, by: int = 1) -> int:
        """Add ``by`` to counter ``name`` (created at 0) and return its new value."""
        with self._connect() as connection:
            row = connection.execute(
                "INSERT INTO counts (name, n) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET n = n + excluded.n "
                "RETURNING n",
                (name, by),
            ).fetchone()
        return row[0]

    def count(self, name: str) -> int:
        """Current value of counter ``name`` (0 if never incremented)."""
        row = self._connect().execute("SELECT n FROM counts WHERE name = ?", (name,)).fetchone()
        return row[0] if row else 0

    def counts(self) -> dict[str, int]:
        """All counters."""
        return dict(self._connect().execute("SELECT name, n FROM counts ORDER BY name").fetchall())

    def reset(self) -> None:
        """Set every counter back to 0."""
        with self._connect() as connection:
            connection.execute("DELETE FROM counts")
