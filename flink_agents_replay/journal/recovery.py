"""Reading a subtask's journal partitions back into a :class:`~.index.RecoveryIndex`."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from flink_agents_replay.journal.codec import RecordCodec
from flink_agents_replay.journal.index import RecoveryIndex
from flink_agents_replay.journal.records import CallRecord, CompletionRecord, RecordKind, parse_journal_key
from flink_agents_replay.journal.store import JournalStore

__all__ = ["read_recovery_index"]

log = logging.getLogger(__name__)


def read_recovery_index(store: JournalStore, codec: RecordCodec, start: Mapping[int, int],
                        end: Mapping[int, int]) -> RecoveryIndex:
    """Read ``[start[p], end[p])`` of each partition, verify every record, and index it by key.

    A record that fails verification raises :class:`~flink_agents_replay.errors.SignatureError`:
    recovery never skips a record silently.
    """
    index = RecoveryIndex()
    begun = time.monotonic()
    for stored in store.read(start, end):
        group, _, _, _, digest_of_key = parse_journal_key(stored.key)
        decoded = codec.decode(stored.key, stored.value, where=f"partition {stored.partition} offset {stored.offset}")
        if decoded.kind is RecordKind.ACCEPTED:
            continue
        payload = decoded.payload
        if not isinstance(payload, (CallRecord, CompletionRecord)):
            continue
        index.add(digest_of_key, stored.partition, stored.offset, payload)
    log.debug("read %d journal records from %d partitions in %.2f s", index.records_read, len(start),
              time.monotonic() - begun)
    return index
