"""A key's recovered history: what the journal holds for it after the restore point, and the reuse rules.

A replayed run asks its key's :class:`KeyHistory` for each action: a *completion* means "skip, re-apply,
re-emit"; *calls* without a completion mean the action was cut short and its recorded calls are served in
order. How the history is read from the journal is :mod:`flink_agents_replay.storage.journal.index`'s job; the
rules for accepted order, failed actions and divergence are in its docstring and in docs/design.md §6.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from flink_agents_replay.storage.records.journal import (
    STARTED_META,
    STILL_IN_DOUBT_IF_FAILED,
    AcceptedRecord,
    ActionFailedRecord,
    CallOutcome,
    CallRecord,
    CompletionRecord,
    ResumedRecord,
    RunPosition,
)
from flink_agents_replay.storage.records.waits import DECISION_RESOURCE, WAIT_RESOURCE

__all__ = ["ActionSlot", "KeyHistory", "Resume"]

ActionSlot = tuple[int, str, str]  # (seq, event id, action)


class Resume(NamedTuple):
    """A resumed record as the history keeps it: after which accepted seq run ``seq`` resumed from ``wait_id``."""

    after: int
    seq: int
    wait_id: str
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
    #: Parked runs that resumed, in journal order.
    resumes: list[Resume] = field(default_factory=list)
    partition: int | None = None
    first_offset: int | None = None

    def add_accepted(self, record: AcceptedRecord) -> None:
        """File an accepted record."""
        self._note_input(record.seq, record.input_digest)
        self.accepted[record.seq] = record.input_digest

    def add_resumed(self, record: ResumedRecord) -> None:
        """File a resumed record; a later one for the same wait (an attempt after a restore resumed it again)
        supersedes the earlier."""
        self.resumes = [r for r in self.resumes if (r.seq, r.wait_id) != (record.seq, record.wait_id)]
        self.resumes.append(Resume(record.after, record.seq, record.wait_id))

    def recorded_resume(self, after: int) -> int | None:
        """The seq of the parked run the journal recorded resuming next after accepted seq ``after``, if any."""
        return next((r.seq for r in self.resumes if r.after == after), None)

    def resumed_later(self, seq: int, wait_id: str) -> bool:
        """Whether the journal recorded run ``seq`` resuming from wait ``wait_id`` (still to come: it parked there
        first, while the key's later inputs ran)."""
        return any((r.seq, r.wait_id) == (seq, wait_id) for r in self.resumes)

    def parked_first(self, seq: int, event: str, action: str) -> bool:
        """Whether the action execution opened a wait that the journal recorded its run resuming from later (so a
        run of ``seq`` must park there again, and its completion waits for that resume)."""
        waits = {r.wait_id for r in self.resumes if r.seq == seq}
        return bool(waits) and any(
            record.resource == WAIT_RESOURCE and getattr(record.result, "wait_id", None) in waits
            for record in self.calls.get((seq, event, action), {}).values())

    def parked_in(self, seq: int, event: str, action: str) -> bool:
        """Whether the action execution stopped at a wait in the recorded history (a ``@wait`` without its
        ``@decision``, or one it resumed from later): the key's later inputs may have run meanwhile, and their
        records are no divergence."""
        calls = list(self.calls.get((seq, event, action), {}).values())
        decided = {record.args_digest for record in calls if record.resource == DECISION_RESOURCE}
        return (any(record.resource == WAIT_RESOURCE and record.args_digest not in decided for record in calls)
                or self.parked_first(seq, event, action))

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
        """File an action-failed record: the RAISED calls of that action execution are not reused. One that was
        in doubt before it raised is in doubt again (its first try may have taken effect): the next attempt's
        in-doubt policy decides, under the same call id."""
        self._note_input(record.seq, record.input_digest)
        action_slot = (record.seq, record.event_id, record.action)
        calls = self.calls.get(action_slot, {})
        retried = self.retried[action_slot]
        for position in record.retry_calls:
            call = calls.get(position)
            if call is None or call.outcome is not CallOutcome.RAISED:
                continue
            if call.meta.get(STILL_IN_DOUBT_IF_FAILED):
                calls[position] = replace(call, outcome=CallOutcome.STARTED, result=None,
                                          meta=dict(call.meta.get(STARTED_META) or {}))
            else:
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
        kept = [r for r in self.resumes if RunPosition(r.after, _LAST) <= position]
        dropped += len(self.resumes) - len(kept)
        self.resumes = kept
        self._rebuild_input_digests()
        return dropped

    def has_decision(self, seq: int) -> bool:
        """Whether a wait of input ``seq`` has a journaled decision (a ``@decision`` call)."""
        return any(slot[0] == seq and any(record.resource == DECISION_RESOURCE for record in calls.values())
                   for slot, calls in self.calls.items())

    def merge_seq(self, other: KeyHistory, seq: int) -> None:
        """Add what ``other`` holds of ``seq`` (completions, calls, retried positions) to this history."""
        self.completions.update({slot: record for slot, record in other.completions.items() if slot[0] == seq})
        for slot, calls in other.calls.items():
            if slot[0] == seq:
                for record in calls.values():
                    self.add_call(record)
        for slot, positions in other.retried.items():
            if slot[0] == seq:
                self.retried[slot].update(positions)
        if seq in other.input_digests:
            self._note_input(seq, other.input_digests[seq])

    def drop_through_seq(self, seq: int) -> None:
        """Forget everything at or before ``seq`` (those inputs are done; a parked run's records travel with it)."""
        self._drop(lambda s: s <= seq)
        self.resumes = [r for r in self.resumes if r.after >= seq]

    def take_seq(self, seq: int, wait_id: str) -> KeyHistory:
        """Take out what the history holds of ``seq``, whose parked run resumes from ``wait_id`` now, as a history
        of its own, with the resumes recorded for the run's later waits (those stay here too: they order the key's
        inputs)."""
        self.resumes = [r for r in self.resumes if (r.seq, r.wait_id) != (seq, wait_id)]
        taken = KeyHistory()
        taken.merge_seq(self, seq)
        taken.resumes = [r for r in self.resumes if r.seq == seq]
        self._drop(lambda s: s == seq)
        return taken

    def take_records(self, seq: int) -> list[CallRecord | CompletionRecord]:
        """Take out the call and completion records of ``seq`` (a parked run's: they travel with it in keyed state,
        and the key's recovered history, which holds pruning back, can end)."""
        records: list[CallRecord | CompletionRecord] = [
            record for slot, record in self.completions.items() if slot[0] == seq]
        records += [record for slot, calls in self.calls.items() if slot[0] == seq for record in calls.values()]
        self._drop(lambda s: s == seq)
        return records

    def _drop(self, done) -> None:
        for slot in [s for s in self.completions if done(s[0])]:
            del self.completions[slot]
        for slot in [s for s in self.calls if done(s[0])]:
            del self.calls[slot]
        for slot in [s for s in self.retried if done(s[0])]:
            del self.retried[slot]
        for finished in [s for s in self.accepted if done(s)]:
            del self.accepted[finished]
        self._rebuild_input_digests()

    def _rebuild_input_digests(self) -> None:
        self.input_digests = dict(self.accepted)
        self.input_digests.update((r.seq, r.input_digest) for r in self.completions.values())
        self.input_digests.update(
            (r.seq, r.input_digest) for slot in self.calls.values() for r in slot.values()
        )

    def __len__(self) -> int:
        return (len(self.accepted) + len(self.resumes) + len(self.completions)
                + sum(len(c) for c in self.calls.values()))
