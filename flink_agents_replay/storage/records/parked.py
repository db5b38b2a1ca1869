"""A run waiting for a decision, and the decisions a key received, as keyed state entries.

A run that stops at ``ctx.wait_for`` is *parked* in its key's state until its decision comes: the wait, where
in the run it was opened, and the run's records so far (its finished calls and completions, as the journal
keeps them: :mod:`.schemas`), from which the resumed run reuses everything before the wait. Keyed state, not
the journal, carries them: a run may wait for days, and checkpoints keep pruning the journal meanwhile.

A key's decisions are kept by wait id (:class:`ReceivedDecision`): one that came before its wait was reached
(*early*), one applied to a parked run, one whose run finished (*closed*, kept a while so that a duplicate is
recognised). A key's parked runs are kept by seq, and indexed by wait id (:class:`ParkedWait`, with the
deadline). The entries are state format version 3, and 4 since a run kept aside keeps its input's W3C ``traceparent``
(:mod:`flink_agents_replay.storage.formats.state`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from flink_agents_replay.core.events import EventTypes
from flink_agents_replay.storage.formats.plain import dump_user, load_user
from flink_agents_replay.storage.formats.state import decode_entry, encode_entry
from flink_agents_replay.storage.records.journal import CallRecord, CompletionRecord, RecordKind
from flink_agents_replay.storage.records.schemas import JOURNAL_SCHEMAS, call_from_plain, call_to_plain
from flink_agents_replay.storage.records.waits import (
    WAIT_RESOURCE,
    Decision,
    WaitOpened,
    decision_from_plain,
    decision_to_plain,
    wait_from_plain,
    wait_to_plain,
)

__all__ = ["DecisionStatus", "ParkedWait", "ReceivedDecision", "WaitingRun", "decode_decision", "decode_parked_wait",
           "decode_waiting_run", "encode_decision", "encode_parked_wait", "encode_waiting_run"]

_COMPLETION = JOURNAL_SCHEMAS[RecordKind.COMPLETION.value]


@dataclass(frozen=True)
class WaitingRun:
    """A run stopped at ``ctx.wait_for``: the wait, where it was opened, and what the run resumes from."""

    wait: WaitOpened
    seq: int
    action: str  # the waiting action's name in the journal
    event_id: str  # the event it handles
    order: int  # its step in the run
    #: The run's finished calls and completions so far: a resumed run reuses them, whether or not the journal
    #: still holds them.
    records: list[CallRecord | CompletionRecord]
    retried: dict[int, int]  # positions of the waiting action an earlier attempt's failure asks to make again
    #: Kept only while the key's later inputs run (``later_inputs_while_waiting="run"``): the input and its event
    #: time (the key's run in flight moves on), and the key's memory state entry as the run started (what the
    #: resumed run sees again).
    input: Any = None
    event_time: int | None = None
    memory: bytes | None = None
    kept_aside: bool = False  # the key's later inputs run while it waits (input, event_time, memory are set)
    traceparent: str | None = None  # kept aside: the W3C traceparent its input arrived with (state version 4 on)


def encode_waiting_run(run: WaitingRun) -> bytes:
    """State bytes of a waiting run. The wait is its ``@wait`` call record among the records (``wait_record``: its
    index), not a second copy: a payload kept twice doubled a parked run's memory."""
    records = [["completion", _COMPLETION.to_plain(record)] if isinstance(record, CompletionRecord)
               else ["call", call_to_plain(record)] for record in run.records]
    at = next((index for index, record in enumerate(run.records)
               if isinstance(record, CallRecord) and record.resource == WAIT_RESOURCE and record.result == run.wait),
              None)
    wait = {"wait_record": at} if at is not None else {"wait": wait_to_plain(run.wait)}
    aside = {"input": dump_user(run.input, what="an input"), "event_time": run.event_time,
             "memory": run.memory} if run.kept_aside else {}
    if run.kept_aside and run.traceparent is not None:
        aside["traceparent"] = run.traceparent
    return encode_entry({**wait, "seq": run.seq, "action": run.action, "event_id": run.event_id, "order": run.order,
                         "records": records, "retried": [[position, count] for position, count in run.retried.items()],
                         **aside})


def decode_waiting_run(raw: bytes, event_types: EventTypes) -> WaitingRun:
    """The waiting run :func:`encode_waiting_run` wrote (``event_types`` resolve its completions' events)."""
    plain = decode_entry(raw, "a waiting run")
    records = [_COMPLETION.from_plain(record, event_types) if kind == "completion" else call_from_plain(record)
               for kind, record in plain["records"]]
    wait = records[plain["wait_record"]].result if "wait_record" in plain else wait_from_plain(plain["wait"])
    aside = {"input": load_user(plain["input"]), "event_time": plain["event_time"], "memory": plain["memory"],
             "kept_aside": True, "traceparent": plain.get("traceparent")} if "input" in plain else {}
    return WaitingRun(wait, plain["seq"], plain["action"], plain["event_id"], plain["order"], records,
                      {position: count for position, count in plain["retried"]}, **aside)


@dataclass(frozen=True)
class ParkedWait:
    """A parked run's wait as the key's wait index keeps it: which run (seq) and its deadline (epoch ms)."""

    seq: int
    deadline_ms: int | None


def encode_parked_wait(wait: ParkedWait) -> bytes:
    """State bytes of a parked wait's index entry."""
    return encode_entry({"seq": wait.seq, "deadline_ms": wait.deadline_ms})


def decode_parked_wait(raw: bytes) -> ParkedWait:
    """The index entry :func:`encode_parked_wait` wrote."""
    plain = decode_entry(raw, "a parked wait")
    return ParkedWait(plain["seq"], plain["deadline_ms"])


class DecisionStatus(str, enum.Enum):
    """Where a received decision stands."""

    EARLY = "early"  # no wait of the key had its id when it came
    APPLIED = "applied"  # given to the key's parked run
    CLOSED = "closed"  # its run finished: kept to recognise a duplicate


@dataclass(frozen=True)
class ReceivedDecision:
    """A decision a key received: the decision, its status, when it came and until when it is kept (epoch ms),
    and the id the sender gave it (duplicates of one decision share it)."""

    decision: Decision
    status: DecisionStatus
    received_at_ms: int
    keep_until_ms: int | None
    signal_id: str | None = None
    arrival: int = 0  # its place among the key's decisions as they came (decisions of one millisecond too)


def encode_decision(received: ReceivedDecision) -> bytes:
    """State bytes of a received decision."""
    return encode_entry({"decision": decision_to_plain(received.decision), "status": received.status.value,
                         "received_at_ms": received.received_at_ms, "keep_until_ms": received.keep_until_ms,
                         "signal_id": received.signal_id, "arrival": received.arrival})


def decode_decision(raw: bytes) -> ReceivedDecision:
    """The received decision :func:`encode_decision` wrote."""
    plain: dict[str, Any] = decode_entry(raw, "a received decision")
    return ReceivedDecision(decision_from_plain(plain["decision"]), DecisionStatus(plain["status"]),
                            plain["received_at_ms"], plain["keep_until_ms"], plain.get("signal_id"),
                            plain.get("arrival", 0))
