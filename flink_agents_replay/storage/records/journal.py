"""What the journal holds: one record per accepted input, per call and per completed action.

Kafka record key: ``"{key_group}:{seq}:{event_id}:{action}:{key_digest}"``. ``key_digest`` hashes the
serialized business key: a raw key may contain ':' or collide in ``str()``.

* A :class:`CallRecord` is written for every ``ctx.call`` as it completes (its result or the exception
  it raised), and, for resources with external side effects, once more *before* it starts
  (``outcome == "started"``) so that a call cut short by a failure is known to be in doubt.
* An :class:`AcceptedRecord` is written when the operator accepts an input for a key and gives it its
  seq, before the run starts: the key's accepted order, which a restore uses to put inputs arriving in
  another interleaving back into that order (docs/design.md §4, §8).
* A :class:`ResumedRecord` is written when a run parked at a wait resumes while the key's later inputs ran
  meanwhile (``later_inputs_while_waiting="run"``): where in the key's order it resumed (after which accepted
  seq), which a restore reproduces as it does the accepted order (docs/design.md §16).
* A :class:`CompletionRecord` is written when an action finishes: the memory updates it made and the
  events it sent. Reusing an action means applying exactly these.
* An :class:`ActionFailedRecord` is written (and acknowledged) when an exception leaves an action. The
  action's trailing failed calls are made again by the next attempt instead of being reused: a failure is
  not forever (see :mod:`.index`).
* An :class:`AttemptRecord` is written (and acknowledged) in every owned partition when a subtask starts
  with no checkpoint to restore: it ties the records after it to the Flink job that wrote them, so a
  restart of the same job before its first completed checkpoint finds them (see :mod:`.attempts`).
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DELETED",
    "MemoryUpdate",
    "ACCEPTED_ACTION",
    "ATTEMPT_ACTION",
    "AcceptedRecord",
    "ActionFailedRecord",
    "RESUMED_ACTION",
    "ResumedRecord",
    "CallOutcome",
    "CallRecord",
    "CompletionRecord",
    "RecordKind",
    "RunPosition",
    "STARTED_META",
    "STILL_IN_DOUBT_IF_FAILED",
    "child_input_event_id",
    "event_id",
    "input_event_id",
    "journal_key",
    "key_digest",
    "parse_journal_key",
]


class _Deleted:
    """Marks a deleted path in an update (distinct from a stored ``None``)."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __reduce__(self):
        return (_Deleted, ())

    def __repr__(self) -> str:
        return "DELETED"


DELETED = _Deleted()


#: A call record's ``meta`` flag on the exception of a call that was in doubt (made again after it, or found failed
#: by a reconciler): if the exception leaves the action, the call is in doubt again for the next attempt (its first
#: try may have taken effect), never made under a new call id (0.7.0). Its ``@started`` (:data:`STARTED_META`) keeps
#: what the call's last started record noted, which the started record it turns back into holds again. Names with
#: ``@``: a resource's ``report_call`` cannot set them.
STILL_IN_DOUBT_IF_FAILED = "@in_doubt"
STARTED_META = "@started"


@dataclass(frozen=True)
class MemoryUpdate:
    """``path`` was set to ``value`` (or deleted, when ``value is DELETED``): what a completion re-applies."""

    path: str
    value: Any


class RecordKind(str, enum.Enum):
    """The kinds of journal record (capture records, in the same signed envelope, have their own kinds)."""

    ACCEPTED = "accepted"
    RESUMED = "resumed"
    CALL = "call"
    COMPLETION = "completion"
    ACTION_FAILED = "failed"
    ATTEMPT = "attempt"


class CallOutcome(str, enum.Enum):
    """How a journaled call ended."""

    STARTED = "started"  # written before an external call; alone, it means "in doubt"
    RETURNED = "returned"
    RAISED = "raised"


@dataclass(frozen=True, order=True)
class RunPosition:
    """Where in a key's history a record belongs: the input's seq and the action's place in its run."""

    seq: int
    order: int


#: The action name in the Kafka record key of an accepted record (no action has a leading underscore name
#: clash: actions are Python identifiers, and this one is reserved).
ACCEPTED_ACTION = "_accepted"
#: The action name in the Kafka record key of a resumed record.
RESUMED_ACTION = "_resumed"
#: The action name in the Kafka record key of an attempt record (see :mod:`.attempts`); no run writes it.
ATTEMPT_ACTION = "_attempt"


@dataclass
class AcceptedRecord:
    """One input the operator accepted for a key: its seq, the digest of its payload, its event time (ms)."""

    seq: int
    input_digest: str
    event_time: int | None = None


@dataclass
class ResumedRecord:
    """A parked run of a key resumed: its seq, the seq of the key's last accepted input then (``after``), and the
    wait it resumed from."""

    seq: int
    after: int
    wait_id: str
    input_digest: str = ""


@dataclass
class CallRecord:
    """One mediated call of an action."""

    seq: int
    order: int
    event_id: str
    action: str
    position: int  # index of the call within the action execution
    resource: str
    args_digest: str
    outcome: CallOutcome
    result: Any = None  # the return value, or the raised exception
    input_digest: str = ""
    # How the call went, plain data: "latency_ms" (every call made for real) and what the resource reported
    # (a model's "model", "prompt_tokens", "completion_tokens"); "reconciled" ("done" / "failed") for an outcome
    # a reconciler found, STILL_IN_DOUBT_IF_FAILED and STARTED_META on the exception of a call that was in doubt.
    # Absent from records before 0.5.
    meta: dict[str, Any] = field(default_factory=dict)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # 0.1.0's journal pickled call records: theirs have no meta (a default factory leaves no class attribute).
        self.__dict__.update({"meta": {}, **state})

    def identity(self) -> tuple[int, str, str]:
        """Call identity for reuse: position, resource, argument digest."""
        return (self.position, self.resource, self.args_digest)


@dataclass
class CompletionRecord:
    """One finished action: what it changed and what it sent."""

    seq: int
    order: int
    event_id: str
    action: str
    fingerprint: str
    memory_updates: list[MemoryUpdate] = field(default_factory=list)
    sent_events: list[Any] = field(default_factory=list)  # Events carrying their ids
    calls: int = 0
    input_digest: str = ""


@dataclass
class ActionFailedRecord:
    """An exception left an action (it was not handled there): the action's failed calls are made again."""

    seq: int
    order: int
    event_id: str
    action: str
    error: str  # "<type>: <message>", for people reading the journal
    input_digest: str = ""
    #: Failed calls the next attempt makes again (the action's trailing failed calls; see the index).
    retry_calls: list[int] = field(default_factory=list)


def _short_hash(*parts: object) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(str(part).encode("utf-8", "surrogatepass"))
        digest.update(b"\x1f")
    return digest.hexdigest()[:16]


def key_digest(key: object) -> str:
    """Stable digest of a business key, tagged by type so ``1`` and ``"1"`` differ."""
    return _short_hash(type(key).__name__, key)


def input_event_id(digest_of_key: str, seq: int) -> str:
    """Id of the InputEvent of input ``seq`` of a key."""
    return _short_hash("input", digest_of_key, seq)


def event_id(digest_of_key: str, seq: int, parent_event_id: str, action: str, emission_index: int) -> str:
    """Id of the ``emission_index``-th event ``action`` sent while handling ``parent_event_id``."""
    return _short_hash("event", digest_of_key, seq, parent_event_id, action, emission_index)


def journal_key(key_group: int, seq: int, event: str, action: str, digest_of_key: str) -> bytes:
    """The Kafka record key of a journal record."""
    return f"{key_group}:{seq}:{event}:{action}:{digest_of_key}".encode()


def parse_journal_key(raw: bytes) -> tuple[int, int, str, str, str]:
    """Inverse of :func:`journal_key`: (key group, seq, event id, action, key digest)."""
    group, seq, event, action, digest = raw.decode().split(":")
    return int(group), int(seq), event, action, digest


def child_input_event_id(digest_of_key: str, seq: int, parent_event_id: str, parent_action: str, position: int,
                         child: str, input_digest: str) -> str:
    """Id of the InputEvent of a sub-agent call: call ``position`` of ``parent_action`` handling ``parent_event_id``.

    The child's input is part of it, so a call with another input than the journaled one starts a fresh
    subtree instead of reusing the old child's records (divergence confined to that subtree).
    """
    return _short_hash("child", digest_of_key, seq, parent_event_id, parent_action, position, child, input_digest)
