"""An in-memory :class:`~.store.JournalStore` for unit tests (no durability, one process)."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping

from flink_agents_replay.storage.journal.store import Delivery, JournalStore, StoredRecord

__all__ = ["MemoryJournalStore"]


class _Done(Delivery):
    def __init__(self, offset: int):
        self.offset = offset

    def wait(self, timeout_s: float) -> int:
        return self.offset

    def done(self) -> bool:
        return True

    def add_done_callback(self, callback) -> None:
        callback()


class MemoryJournalStore(JournalStore):
    """Keeps every partition as a list; deleted records become ``None`` below the low watermark."""

    def __init__(self, partitions: int, *, topic: str = "memory.journal"):
        self.topic = topic
        self._partitions = partitions
        self._logs: list[list[tuple[bytes, bytes] | None]] = [[] for _ in range(partitions)]
        self._low = [0] * partitions
        self._lock = threading.Lock()
        self.appended = 0

    @property
    def partitions(self) -> int:
        return self._partitions

    def append(self, partition: int, key: bytes, value: bytes) -> Delivery:
        with self._lock:
            log = self._logs[partition]
            log.append((key, value))
            self.appended += 1
            return _Done(len(log) - 1)

    def flush(self, timeout_s: float) -> None:
        return None

    def end_offsets(self, partitions: Iterable[int]) -> dict[int, int]:
        with self._lock:
            return {p: len(self._logs[p]) for p in partitions}

    def start_offsets(self, partitions: Iterable[int]) -> dict[int, int]:
        with self._lock:
            return {p: self._low[p] for p in partitions}

    def read(self, start: Mapping[int, int], end: Mapping[int, int]) -> Iterator[StoredRecord]:
        with self._lock:
            snapshot = {p: list(self._logs[p][max(start[p], self._low[p]):end[p]]) for p in start}
            lows = {p: max(start[p], self._low[p]) for p in start}
        for partition, records in snapshot.items():
            for i, (key, value) in enumerate(records):
                yield StoredRecord(partition, lows[partition] + i, key, value)

    def delete_before(self, offsets: Mapping[int, int]) -> None:
        with self._lock:
            for partition, offset in offsets.items():
                offset = min(offset, len(self._logs[partition]))
                for i in range(self._low[partition], offset):
                    self._logs[partition][i] = None
                self._low[partition] = max(self._low[partition], offset)

    def records(self, partition: int) -> list[tuple[bytes, bytes]]:
        """The records still stored in ``partition`` (for assertions)."""
        with self._lock:
            return [r for r in self._logs[partition][self._low[partition]:] if r is not None]
