"""Reading a subtask's journal partitions back into a :class:`~.index.RecoveryIndex`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from flink_agents_replay.errors import SignatureError
from flink_agents_replay.journal.index import RecoveryIndex
from flink_agents_replay.journal.store import JournalStore, StoredRecord
from flink_agents_replay.records.codec import RecordCodec
from flink_agents_replay.records.journal import ATTEMPT_ACTION, parse_journal_key

__all__ = ["parse_stored_key", "read_recovery_index"]

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


def read_recovery_index(store: JournalStore, codec: RecordCodec, start: Mapping[int, int],
                        end: Mapping[int, int], keep: RecordFilter | None = None) -> RecoveryIndex:
    """Read ``[start[p], end[p])`` of each partition, verify every record, and index it by key.

    Records are verified and unpickled when their key first replays (:meth:`RecoveryIndex.history`).

    ``keep(partition, offset, key_digest, seq)`` may exclude records known to be unneeded (those of runs
    the checkpoint already holds). A record that fails verification raises
    :class:`~flink_agents_replay.errors.SignatureError` when its key replays: a record is never used
    unverified, and never skipped silently.
    """
    index = RecoveryIndex(codec, topic=store.topic)
    begun = time.monotonic()
    for stored in store.read(start, end):
        index.records_read += 1
        _, seq, _, action, digest_of_key = parse_stored_key(stored)
        if action == ATTEMPT_ACTION:
            continue  # where a job started (another job's, in this range): no key's history
        if keep is not None and not keep(stored.partition, stored.offset, digest_of_key, seq):
            continue  # a run the checkpoint already holds: never unpickled
        index.add_raw(digest_of_key, stored)
    log.debug("read %d journal records from %d partitions in %.2f s", index.records_read, len(start),
              time.monotonic() - begun)
    return index
