"""Reading a subtask's journal partitions back into a :class:`~.index.RecoveryIndex`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from flink_agents_replay.core.errors import SignatureError
from flink_agents_replay.storage.journal.fencing import PartitionFences
from flink_agents_replay.storage.journal.index import RecoveryIndex
from flink_agents_replay.storage.journal.store import JournalStore, StoredRecord
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import ATTEMPT_ACTION, RecordKind, parse_journal_key

__all__ = ["decode_attempt_record", "parse_stored_key", "read_recovery_index"]

log = logging.getLogger(__name__)


RecordFilter = Callable[[int, int, str, int], bool]


def parse_stored_key(stored: StoredRecord) -> tuple[int, int, str, str, str]:
    """The parts of a read record's journal key; a key of another format is a :class:`SignatureError`."""
    try:
        return parse_journal_key(stored.key)
    except (AttributeError, ValueError, UnicodeDecodeError):
        raise SignatureError(f"journal record (partition {stored.partition} offset {stored.offset}) has key "
                             f"{stored.key!r:.80}, not a flink-agents-replay journal key: something else "
                             "writes to the journal topic") from None


def decode_attempt_record(codec: RecordCodec, stored: StoredRecord, *, topic: str) -> dict:
    """The payload of an attempt record read from ``topic`` (verified); a record with an attempt key but another
    kind is refused."""
    record = codec.decode(stored.key, stored.value, topic=topic, partition=stored.partition,
                          where=f"partition {stored.partition} offset {stored.offset}")
    if record.kind != RecordKind.ATTEMPT.value:
        raise SignatureError(f"journal record at partition {stored.partition} offset {stored.offset} has an attempt "
                             f"key but kind {record.kind!r}")
    return record.payload


def read_recovery_index(store: JournalStore, codec: RecordCodec, start: Mapping[int, int],
                        end: Mapping[int, int], keep: RecordFilter | None = None, *,
                        fences: PartitionFences | None = None, index: RecoveryIndex | None = None) -> RecoveryIndex:
    """Read ``[start[p], end[p])`` of each partition, verify every record, and index it by key.

    Records are verified and unpickled when their key first replays (:meth:`RecoveryIndex.history`).

    ``keep(partition, offset, key_digest, seq)`` may exclude records known to be unneeded (those of runs
    the checkpoint already holds). A record that fails verification raises
    :class:`~flink_agents_replay.core.errors.SignatureError` when its key replays: a record is never used
    unverified, and never skipped silently.

    ``fences`` (:mod:`.fencing`) ignores, and counts, records an earlier attempt delivered after a newer
    attempt's marker; ``index`` continues an index read before (the read after this attempt's own markers).
    """
    index = RecoveryIndex(codec, topic=store.topic) if index is None else index
    begun = time.monotonic()
    for stored in store.read(start, end):
        index.records_read += 1
        _, seq, _, action, digest_of_key = parse_stored_key(stored)
        if action == ATTEMPT_ACTION:  # where an attempt started: no key's history, maybe a fence
            if fences is not None:
                fences.note_marker(stored, decode_attempt_record(codec, stored, topic=store.topic))
            continue
        if keep is not None and not keep(stored.partition, stored.offset, digest_of_key, seq):
            continue  # a run the checkpoint already holds: never unpickled
        if fences is None or fences.admits(stored):
            index.add_raw(digest_of_key, stored)
    log.debug("read %d journal records from %d partitions in %.2f s", index.records_read, len(start),
              time.monotonic() - begun)
    return index
