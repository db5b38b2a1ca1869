"""What recovery found in the journal, per key, and the divergence rule.

After a restore, a subtask reads its partitions from the checkpoint's offsets and files every record
under its key (:class:`RecoveryIndex`). A replayed run then asks its key's :class:`KeyHistory` for each
action: a *completion* means "skip, re-apply, re-emit"; *calls* without a completion mean the action
was cut short and its recorded calls are served in order.

Accepted records give the key's accepted order: seq -> digest of the input. A record for a seq that
carries another digest than an earlier one supersedes the key's history from that seq on: the journal is
read in write order, and a key's records are written one run at a time, so a later record for the seq
means a restore ran another input there (after a divergence or an order-restore timeout) and the older
records belong to an abandoned history.

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

from collections import defaultdict
from dataclasses import dataclass, field

from flink_agents_replay.journal.codec import RecordCodec
from flink_agents_replay.journal.records import (
    AcceptedRecord,
    ActionFailedRecord,
    CallOutcome,
    CallRecord,
    CompletionRecord,
    RecordKind,
    RunPosition,
    parse_journal_key,
)
from flink_agents_replay.journal.store import StoredRecord

__all__ = ["KeyHistory", "RecoveryIndex"]

ActionSlot = tuple[int, str, str]  # (seq, event id, action)
_INDEXED_KINDS = (RecordKind.ACCEPTED.value, RecordKind.CALL.value, RecordKind.COMPLETION.value,
                  RecordKind.ACTION_FAILED.value)
IndexedRecord = AcceptedRecord | CallRecord | CompletionRecord | ActionFailedRecord
_LAST = 2**62  # an order after every action of a seq


@dataclass
class KeyHistory:
    """Everything the journal holds for one key after the restore point."""

    completions: dict[ActionSlot, CompletionRecord] = field(default_factory=dict)
    calls: dict[ActionSlot, dict[int, CallRecord]] = field(default_factory=lambda: defaultdict(dict))
    accepted: dict[int, str] = field(default_factory=dict)  # seq -> input digest, from accepted records
    #: Positions of RAISED calls whose action failed afterwards: the next attempt makes them again.
    retried: dict[ActionSlot, dict[int, int]] = field(default_factory=lambda: defaultdict(dict))
    input_digests: dict[int, str] = field(default_factory=dict)
    partition: int | None = None
    first_offset: int | None = None

    def add_accepted(self, record: AcceptedRecord) -> None:
        """File an accepted record."""
        self._note_input(record.seq, record.input_digest)
        self.accepted[record.seq] = record.input_digest

    def add_completion(self, record: CompletionRecord) -> None:
        """File a completion record."""
        self._note_input(record.seq, record.input_digest)
        self.completions[(record.seq, record.event_id, record.action)] = record

    def add_call(self, record: CallRecord) -> None:
        """File a call record; a result supersedes the *started* record of the same call."""
        self._note_input(record.seq, record.input_digest)
        slot = self.calls[(record.seq, record.event_id, record.action)]
        previous = slot.get(record.position)
        if previous is None or previous.outcome is CallOutcome.STARTED:
            slot[record.position] = record

    def add_action_failed(self, record: ActionFailedRecord) -> None:
        """File an action-failed record: the RAISED calls of that action execution are not reused."""
        self._note_input(record.seq, record.input_digest)
        action_slot = (record.seq, record.event_id, record.action)
        calls = self.calls.get(action_slot, {})
        retried = self.retried[action_slot]
        for position in record.retry_calls:
            if position in calls and calls[position].outcome is CallOutcome.RAISED:
                del calls[position]
                retried[position] = retried.get(position, 0) + 1

    def retried_positions(self, seq: int, event: str, action: str) -> dict[int, int]:
        """Calls that raised in an action that then failed, made again: position -> how many times so far."""
        return self.retried.get((seq, event, action), {})

    def _note_input(self, seq: int, input_digest: str) -> None:
        known = self.input_digests.get(seq)
        if known is not None and known != input_digest:
            self.drop_after(RunPosition(seq - 1, _LAST))  # an abandoned history: see the module docstring
        self.input_digests[seq] = input_digest

    def recorded_input(self, seq: int) -> str | None:
        """Digest of the input recorded at ``seq``, if the journal holds one."""
        return self.input_digests.get(seq)

    def input_matches(self, seq: int, input_digest: str) -> bool:
        """Whether the records at ``seq`` (if any) were written for this input."""
        recorded = self.input_digests.get(seq)
        return recorded is None or recorded == input_digest

    def completion(self, seq: int, event: str, action: str) -> CompletionRecord | None:
        """The completion of an action execution, if journaled."""
        return self.completions.get((seq, event, action))

    def recorded_calls(self, seq: int, event: str, action: str) -> list[CallRecord | None]:
        """The calls journaled for an action execution, indexed by position (``None`` where a position holds
        nothing, e.g. a call that failed its action); its completion, if any, aside."""
        slot = self.calls.get((seq, event, action))
        if not slot:
            return []
        return [slot.get(p) for p in range(max(slot) + 1)]

    def positions(self) -> list[RunPosition]:
        """Every position that holds a record."""
        found = {RunPosition(r.seq, r.order) for r in self.completions.values()}
        found.update(RunPosition(r.seq, r.order) for slot in self.calls.values() for r in slot.values())
        return sorted(found)

    def has_records_after(self, position: RunPosition) -> bool:
        """Whether any record lies strictly after ``position``."""
        return any(p > position for p in self.positions())

    def drop_after(self, position: RunPosition) -> int:
        """Drop every record strictly after ``position`` (divergence); return how many were dropped."""
        dropped = 0
        for slot, record in list(self.completions.items()):
            if RunPosition(record.seq, record.order) > position:
                del self.completions[slot]
                dropped += 1
        for slot, calls in list(self.calls.items()):
            for index, record in list(calls.items()):
                if RunPosition(record.seq, record.order) > position:
                    del calls[index]
                    dropped += 1
            if not calls:
                del self.calls[slot]
        for seq in [s for s in self.accepted if RunPosition(s, -1) > position]:
            del self.accepted[seq]
            dropped += 1
        self._rebuild_input_digests()
        return dropped

    def drop_through_seq(self, seq: int) -> None:
        """Forget everything at or before ``seq`` (those inputs are done)."""
        for slot in [s for s in self.completions if s[0] <= seq]:
            del self.completions[slot]
        for slot in [s for s in self.calls if s[0] <= seq]:
            del self.calls[slot]
        for slot in [s for s in self.retried if s[0] <= seq]:
            del self.retried[slot]
        for done in [s for s in self.accepted if s <= seq]:
            del self.accepted[done]
        self._rebuild_input_digests()

    def _rebuild_input_digests(self) -> None:
        self.input_digests = dict(self.accepted)
        self.input_digests.update((r.seq, r.input_digest) for r in self.completions.values())
        self.input_digests.update(
            (r.seq, r.input_digest) for slot in self.calls.values() for r in slot.values()
        )

    def __len__(self) -> int:
        return len(self.accepted) + len(self.completions) + sum(len(c) for c in self.calls.values())


class RecoveryIndex:
    """Recovered records of one subtask, by key digest, with per-partition bookkeeping for pruning.

    Records may be filed raw (:meth:`add_raw`): a key's records are verified and unpickled when
    :meth:`history` first asks for that key, so a restore costs little more than reading the partitions,
    and the rest is spread over the keys that actually replay. A record is still verified before its
    payload is unpickled; one that fails raises :class:`~flink_agents_replay.errors.SignatureError`.
    """

    def __init__(self, codec: RecordCodec | None = None) -> None:
        self._codec = codec
        self._keys: dict[str, KeyHistory] = {}
        self._raw: dict[str, list[StoredRecord]] = {}
        self.records_read = 0  # every record read, including those a filter skipped

    def history(self, digest_of_key: str) -> KeyHistory | None:
        """The key's recovered history, or ``None`` when the journal had nothing for it."""
        raw = self._raw.pop(digest_of_key, None)
        if raw is not None:
            for stored in raw:
                header, payload = self._codec.verify(
                    stored.key, stored.value, where=f"partition {stored.partition} offset {stored.offset}")
                if header["kind"] in _INDEXED_KINDS:
                    record = self._codec.load(header, payload)
                    if isinstance(record, (AcceptedRecord, CallRecord, CompletionRecord, ActionFailedRecord)):
                        self.add(digest_of_key, raw[0].partition, raw[0].offset, record)
        return self._keys.get(digest_of_key)

    def add_raw(self, digest_of_key: str, stored: StoredRecord) -> None:
        """File one record as read, to be verified and decoded when its key first replays."""
        if self._codec is None:
            raise ValueError("a RecoveryIndex without a codec cannot take raw records")
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
        else:
            history.add_call(record)

    def forget_if_empty(self, digest_of_key: str) -> None:
        """Drop a key whose history has been fully replayed or invalidated."""
        history = self._keys.get(digest_of_key)
        if history is not None and len(history) == 0:
            del self._keys[digest_of_key]

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
