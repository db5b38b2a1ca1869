"""What recovery found in the journal, per key, and the divergence rule.

After a restore, a subtask reads its partitions from the checkpoint's offsets and files every record
under its key (:class:`RecoveryIndex`). A replayed run then asks its key's history
(:class:`~flink_agents_replay.storage.journal.history.KeyHistory`) for each action: a *completion* means "skip,
re-apply, re-emit"; *calls* without a completion mean the action was cut short and its recorded calls are
served in order.

Accepted records give the key's accepted order: seq -> digest of the input. A record for a seq that
carries another digest than an earlier one supersedes the key's history from that seq on: the journal is
read in write order, and a key's records are written one run at a time, so a later record for the seq
means a restore ran another input there (after a divergence or an order-restore timeout) and the older
records belong to an abandoned history.

Resumed records give where a parked run resumed in the key's order when the key's later inputs ran while it
waited: after which accepted seq (docs/design.md §16).

Failed actions: when an exception leaves an action, the operator journals an :class:`ActionFailedRecord`
before the task fails, naming the failed calls to make again: those of the action's last steps, back to
the last step in which a call returned (see ``engine.failures.calls_to_retry``). Filing it drops those calls'
RAISED records, so the next attempt makes them again (a transient outage is not turned into a permanent
failure). Calls that returned, and failures the action handled and got past, are still reused: the next
attempt takes the same path, and no journaled success moves. An action that caught an exception and was
then killed mid-way has no such record, and reuses the RAISED result as it saw it.

Divergence: history is positional — (seq, order of the action in its run). When a replayed action
finds no completion at position P although the key has records *after* P, or finds a record written
for a different input, the key's history has diverged from the journal: every entry of that key after
P is dropped, so nothing recorded for another history is reused. Several actions sharing one seq is
the normal shape of a run and never counts as divergence.
"""

from __future__ import annotations

from flink_agents_replay.storage.journal.history import KeyHistory
from flink_agents_replay.storage.journal.store import StoredRecord
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import (
    AcceptedRecord,
    ActionFailedRecord,
    CallRecord,
    CompletionRecord,
    RecordKind,
    ResumedRecord,
    parse_journal_key,
)

__all__ = ["KeyHistory", "RecoveryIndex"]  # KeyHistory: .history, re-exported for readers

_INDEXED_KINDS = (RecordKind.ACCEPTED.value, RecordKind.RESUMED.value, RecordKind.CALL.value,
                  RecordKind.COMPLETION.value, RecordKind.ACTION_FAILED.value)
IndexedRecord = AcceptedRecord | ResumedRecord | CallRecord | CompletionRecord | ActionFailedRecord


class RecoveryIndex:
    """Recovered records of one subtask, by key digest, with per-partition bookkeeping for pruning.

    Records may be filed raw (:meth:`add_raw`): a key's records are verified and unpickled when
    :meth:`history` first asks for that key, so a restore costs little more than reading the partitions,
    and the rest is spread over the keys that actually replay. A record is still verified before its
    payload is unpickled, against ``topic`` (the journal topic the records were read from) and its
    partition; one that fails raises :class:`~flink_agents_replay.core.errors.SignatureError`.
    """

    def __init__(self, codec: RecordCodec | None = None, *, topic: str | None = None) -> None:
        self._codec = codec
        self._topic = topic
        self._keys: dict[str, KeyHistory] = {}
        self._raw: dict[str, list[StoredRecord]] = {}
        self.records_read = 0  # every record read, including those a filter skipped

    def history(self, digest_of_key: str) -> KeyHistory | None:
        """The key's recovered history, or ``None`` when the journal had nothing for it."""
        raw = self._raw.pop(digest_of_key, None)
        if raw is not None:
            for stored in raw:
                header, payload = self._codec.verify(
                    stored.key, stored.value, topic=self._topic, partition=stored.partition,
                    where=f"partition {stored.partition} offset {stored.offset}")
                if header["kind"] in _INDEXED_KINDS:
                    record = self._codec.load(header, payload)
                    if isinstance(record, (AcceptedRecord, ResumedRecord, CallRecord, CompletionRecord,
                                           ActionFailedRecord)):
                        self.add(digest_of_key, raw[0].partition, raw[0].offset, record)
        return self._keys.get(digest_of_key)

    def add_raw(self, digest_of_key: str, stored: StoredRecord) -> None:
        """File one record as read, to be verified and decoded when its key first replays."""
        if self._codec is None or self._topic is None:
            raise ValueError("a RecoveryIndex without a codec and a topic cannot take raw records")
        self._raw.setdefault(digest_of_key, []).append(stored)

    def add(self, digest_of_key: str, partition: int, offset: int, record: IndexedRecord) -> None:
        """File one decoded record."""
        history = self._keys.get(digest_of_key)
        if history is None:
            history = self._keys[digest_of_key] = KeyHistory(partition=partition, first_offset=offset)
        if isinstance(record, CompletionRecord):
            history.add_completion(record)
        elif isinstance(record, AcceptedRecord):
            history.add_accepted(record)
        elif isinstance(record, ActionFailedRecord):
            history.add_action_failed(record)
        elif isinstance(record, ResumedRecord):
            history.add_resumed(record)
        else:
            history.add_call(record)

    def forget_if_empty(self, digest_of_key: str) -> None:
        """Drop a key whose history has been fully replayed or invalidated."""
        history = self._keys.get(digest_of_key)
        if history is not None and len(history) == 0:
            del self._keys[digest_of_key]

    def digests(self) -> list[str]:
        """The keys that still have recovered history (decoded or not yet)."""
        return [*self._keys, *self._raw]

    def drop(self, digest_of_key: str) -> int:
        """Forget a key's whole recovered history (it expired); return how many records it held."""
        raw = self._raw.pop(digest_of_key, None)
        history = self._keys.pop(digest_of_key, None)
        return (len(raw) if raw is not None else 0) + (len(history) if history is not None else 0)

    def floor_offsets(self) -> dict[int, int]:
        """Per partition, the first offset still needed by some key's unreplayed history."""
        floors: dict[int, int] = {}
        # Called on the task thread while runs mutate their keys' histories: read only fixed fields.
        firsts = [(h.partition, h.first_offset) for h in list(self._keys.values())]
        firsts += [(raw[0].partition, raw[0].offset) for raw in list(self._raw.values())]
        for partition, first in firsts:
            if partition is not None and first is not None:
                floors[partition] = first if partition not in floors else min(floors[partition], first)
        return floors

    def unreplayed(self) -> dict[int, list[tuple[str, int]]]:
        """Per partition, the keys whose history is not replayed yet: (key digest, first seq it holds)."""
        found: dict[int, list[tuple[str, int]]] = {}
        # Called on the task thread while runs mutate their keys' histories: copy before reading.
        for digest, history in list(self._keys.items()):
            seqs = history.input_digests.copy()
            if seqs and history.partition is not None:
                found.setdefault(history.partition, []).append((digest, min(seqs)))
        for digest, raw in list(self._raw.items()):
            found.setdefault(raw[0].partition, []).append(
                (digest, min(parse_journal_key(stored.key)[1] for stored in raw)))
        return found

    def __len__(self) -> int:
        return len(self._keys) + len(self._raw)
