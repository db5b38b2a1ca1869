"""What a capture topic holds: the accepted inputs of an agent, what each run produced, and the runs parked at a wait.

Three record kinds, all in the journal's signed envelope (:mod:`flink_agents_replay.storage.records.codec`), in the
partition of the key's key group:

* :class:`CapturedInput`, written when the operator accepts an input and gives it its seq: the recorded
  traffic a replay runs again, with the input's event time. (The Kafka timestamp is the capture time, so
  the topic's time-based retention counts from when traffic was captured, not from its event times.)
* :class:`CapturedRun`, written when the run's result is applied: its outputs (what a diff compares),
  every call it made or reused with the result (what a replay serves on ``recorded``), and, in a replay,
  the calls its policy blocked and the error that ended the run, if any.
* :class:`CapturedParked` (since 0.7), written each time a run stops at ``ctx.wait_for`` with no decision and
  is parked: the wait it waits at and the calls it made so far. Nothing of the run is applied yet; a run that is
  resumed and finishes is captured as a :class:`CapturedRun` later. So a key and seq whose last record is a
  parked one, with no run, was still waiting when the capture ended: a replay leaves such a wait open (its
  decision was never recorded), and the diff reports it (:mod:`flink_agents_replay.replay.diff`).

Kafka record key: ``"{key_group}:{seq}:{kind}:{key_digest}"``. A key may be captured twice at the same
seq (a failure between writing and the next checkpoint); readers keep the last record. Unlike journal
records, capture records are signed with a fixed key (:data:`SIGNED_KEY`) in place of their Kafka key, and
for no partition: Flink's Python ``KafkaSource`` hands a replay only record values. What can be bound is
bound inside the signed value instead: the topic (the MAC covers the topic name the reader expects, envelope
version 3), the key and seq (in the payload), and the key group (``key_group``, in the payload since schema
version 2), which a reader that knows the partition checks against it (:mod:`.reader`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flink_agents_replay.storage.records.codec import CAPTURE_SIGNED_KEY
from flink_agents_replay.storage.records.journal import CallRecord
from flink_agents_replay.storage.records.waits import WaitOpened

__all__ = ["SIGNED_KEY", "BlockedCall", "CapturedInput", "CapturedOutput", "CapturedParked", "CapturedRun",
           "CapturedRunEnd", "capture_key", "parse_capture_key"]


#: What capture records are signed with in place of their Kafka record key.
SIGNED_KEY = CAPTURE_SIGNED_KEY


@dataclass(frozen=True)
class CapturedInput:
    """One accepted input: the key, its seq, its event time (ms, or ``None``), the record and its digest, and the
    W3C ``traceparent`` its Kafka record carried, if any (a replay's run links to it too)."""

    key: Any
    seq: int
    event_time: int | None
    payload: Any
    input_digest: str
    key_group: int | None = None  # set by the writer; None in records of schema version 1
    traceparent: str | None = None  # None in records of schema versions 1 and 2


@dataclass(frozen=True)
class CapturedOutput:
    """One OutputEvent of a run: its id and its ``output``."""

    event_id: str
    output: Any


@dataclass(frozen=True)
class BlockedCall:
    """A call a replay's side-effect policy did not make (``CallBlocked``): where, to what, with what."""

    event_id: str
    action: str
    position: int
    resource: str
    arguments: str  # repr of (args, kwargs), shortened: for people reading the report


@dataclass(frozen=True)
class CapturedRun:
    """What the run of one input produced."""

    key: Any
    seq: int
    input_digest: str
    outputs: list[CapturedOutput] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)
    blocked: list[BlockedCall] = field(default_factory=list)
    error: str | None = None  # replay only: the exception that ended the run (its outputs are then empty)
    key_group: int | None = None  # set by the writer; None in records of schema version 1
    #: The run's trace id (32 hex digits), derived from the job lineage, the agent, the key and the seq
    #: (:mod:`flink_agents_replay.traces.ids`): where the run's spans are, with tracing on. A replay's runs have
    #: their own. None in records before schema version 5.
    trace_id: str | None = None


@dataclass(frozen=True)
class CapturedParked:
    """A run that stopped at a wait with no decision and was parked (nothing of it applied): the wait, the action
    and event waiting at it, and the run's calls so far (the wait's ``@wait`` record and earlier waits'
    ``@decision`` records among them), with the calls a replay's policy blocked. Written each time the run parks:
    a resumed run that waits again is captured parked again, with its longer list of calls."""

    key: Any
    seq: int
    input_digest: str
    action: str
    event_id: str
    wait: WaitOpened
    calls: list[CallRecord] = field(default_factory=list)
    blocked: list[BlockedCall] = field(default_factory=list)
    key_group: int | None = None  # set by the writer


@dataclass(frozen=True)
class CapturedRunEnd:
    """Production finished the run of ``key``'s input ``seq`` (a captured run, as a replay's source passes it on:
    a run the replay's savepoint holds parked at a wait resumes then). Never persisted."""

    key: Any
    seq: int
    event_time: int | None = None  # none: the source's timestamp stands


def capture_key(key_group: int, seq: int, kind: str, digest_of_key: str) -> bytes:
    """The Kafka record key of a capture record."""
    return f"{key_group}:{seq}:{kind}:{digest_of_key}".encode()


def parse_capture_key(raw: bytes) -> tuple[int, int, str, str]:
    """Inverse of :func:`capture_key`: (key group, seq, kind, key digest)."""
    group, seq, kind, digest = raw.decode().split(":")
    return int(group), int(seq), kind, digest
