"""The journal store interface: partitioned, append-only, readable from an offset, prunable.

Kafka implements it for real (:mod:`.kafka_store`); :mod:`.memory_store` implements it in memory for
unit tests. Partition = Flink key group, so a subtask reads and prunes exactly its own key groups.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import NamedTuple

__all__ = ["Delivery", "JournalStore", "StoredRecord"]


class StoredRecord(NamedTuple):
    """One record as read back (a tuple: a restore creates one per record)."""

    partition: int
    offset: int
    key: bytes
    value: bytes


class Delivery(ABC):
    """The pending acknowledgement of one appended record."""

    @abstractmethod
    def wait(self, timeout_s: float) -> int:
        """Block until the store acknowledged the record; return its offset or raise ``JournalError``."""

    @abstractmethod
    def done(self) -> bool:
        """Whether the store has answered (acknowledged or failed): :meth:`wait` then returns at once."""

    @abstractmethod
    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the store has answered: at once if it has, else from the thread that
        receives the answer (keep it short, it must not block)."""


class JournalStore(ABC):
    """Partitioned append-only log with per-partition offsets."""

    #: The topic's name: records are signed for it (:mod:`flink_agents_replay.storage.records.codec`).
    topic: str

    #: The largest record the store takes, if it has a limit of its own (Kafka: the topic's max.message.bytes).
    max_message_bytes: int | None = None

    @property
    @abstractmethod
    def partitions(self) -> int:
        """Number of partitions (= max parallelism)."""

    @abstractmethod
    def append(self, partition: int, key: bytes, value: bytes) -> Delivery:
        """Append asynchronously; the returned :class:`Delivery` confirms it."""

    @abstractmethod
    def flush(self, timeout_s: float) -> None:
        """Wait until every appended record is acknowledged (raise ``JournalError`` on failure)."""

    def prepare_writes(self) -> None:  # noqa: B027 - optional: an in-memory store has nothing to set up
        """Set up what the first append needs now (Kafka: the producer's connection and idempotence), so that it
        overlaps other work instead of delaying the first acknowledgement."""

    def check_deliveries(self) -> None:  # noqa: B027 - optional: an in-memory store never fails a record
        """Raise ``JournalError`` if an appended record failed (checked after waiting for later ones)."""

    @abstractmethod
    def end_offsets(self, partitions: Iterable[int]) -> dict[int, int]:
        """Next offset to be written in each partition (the high watermark)."""

    @abstractmethod
    def start_offsets(self, partitions: Iterable[int]) -> dict[int, int]:
        """First offset still stored in each partition (the low watermark)."""

    @abstractmethod
    def read(self, start: Mapping[int, int], end: Mapping[int, int]) -> Iterator[StoredRecord]:
        """Records of each partition in ``start`` from its start offset up to (excluding) its end offset."""

    @abstractmethod
    def delete_before(self, offsets: Mapping[int, int]) -> None:
        """Delete every record below ``offsets[p]`` in each partition (asynchronous is fine)."""

    def close(self) -> None:  # noqa: B027 - optional hook; in-memory stores hold nothing to release
        """Release clients and threads."""
