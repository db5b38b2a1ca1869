"""The waits topic's records: what happens to waits (:class:`~flink_agents_replay.flink.waits.WaitEvent`) as
versioned JSON, keyed by wait id, for people and systems that decide (``flink-agents-replay waits list``)::

    {"v": 1, "kind": "opened", "key": "c-7", "wait_id": "9f2c...", "agent": "support-triage", "action": "refund",
     "seq": 3, "name": "refund-approval", "payload": {"amount": 120}, "deadline_ms": 1733400000000,
     "opened_at_ms": 1733390000000, "decision": null, "reason": null}

``decision`` is ``{"approved", "value", "reason", "by", "decided_at_ms", "timed_out"}`` on the events that carry
one (``resumed``, ``decision_early``, ``decision_ignored``, ``decision_unmatched``), else ``null``.

The Kafka key is the wait id, so every event of a wait lands in one partition in the order it happened, and the
topic can be compacted (``cleanup.policy=compact``): a pending wait's ``opened`` stays however old it is, a
finished wait keeps its last event. An event of no wait (a decision that could not be read: ``decision_rejected``
without a wait id) is keyed ``rejected:<the run's key as JSON>``: a compacted topic keeps the last one per key.

Readers fold the events by wait id (:func:`fold_wait_events`): ``flink-agents-replay waits list``, and the testing
API's open waits.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flink_agents_replay.flink.waits import WaitEvent

__all__ = ["REJECTED_KEY_PREFIX", "WAIT_EVENT_VERSION", "Folded", "WaitState", "fold_wait_events", "wait_event_dict",
           "wait_event_json", "wait_event_key", "wait_event_record"]

#: The waits topic's record format (its ``"v"``): a consumer can tell a later one.
WAIT_EVENT_VERSION = 1
#: The Kafka key's prefix of an event that belongs to no wait.
REJECTED_KEY_PREFIX = "rejected:"


def wait_event_dict(event: WaitEvent) -> dict[str, Any]:
    """The JSON object of ``event`` (see the module docstring)."""
    decision = event.decision
    return {
        "v": WAIT_EVENT_VERSION, "kind": event.kind, "key": event.key, "wait_id": event.wait_id, "agent": event.agent,
        "action": event.action, "seq": event.seq, "name": event.name, "payload": event.payload,
        "deadline_ms": event.deadline_ms, "opened_at_ms": event.opened_at_ms,
        "decision": None if decision is None else {
            "approved": decision.approved, "value": decision.value, "reason": decision.reason, "by": decision.by,
            "decided_at_ms": decision.decided_at_ms, "timed_out": decision.timed_out},
        "reason": event.reason,
    }


def wait_event_json(event: WaitEvent) -> str:
    """``event`` as the waits topic's JSON text."""
    # Payloads and values are JSON already (checked when the wait opened and when the decision was read); repr is
    # the last resort for anything else, so that one odd value cannot fail the job on every restart.
    return json.dumps(wait_event_dict(event), sort_keys=True, default=repr)


def wait_event_key(event: WaitEvent) -> str:
    """The Kafka key of ``event``: its wait id, or ``rejected:<key as JSON>`` for an event of no wait."""
    if event.wait_id is not None:
        return event.wait_id
    return REJECTED_KEY_PREFIX + json.dumps(event.key, default=repr)


def wait_event_record(event: WaitEvent):
    """``Row(key, value)`` of ``event`` for :func:`~flink_agents_replay.jobs.kafka_output.
    exactly_once_keyed_string_sink`."""
    from pyflink.common import Row

    return Row(wait_event_key(event), wait_event_json(event))


#: The kinds that move a wait along; the others (``decision_early``...) are about decisions sent for it.
LIFECYCLE = ("opened", "resumed", "closed")
_DETAILS = ("agent", "action", "seq", "name", "payload", "deadline_ms", "opened_at_ms")


@dataclass
class WaitState:
    """One wait as its events tell it: what it asks (from its ``opened`` event), where it is (``state``: the last
    of ``opened``, ``resumed``, ``closed``; ``None`` when only decisions for it were seen), its last event's kind
    and the last decision an event carried."""

    wait_id: str
    key: Any
    agent: str | None = None
    action: str | None = None
    seq: int | None = None
    name: str | None = None
    payload: Any = None
    deadline_ms: int | None = None
    opened_at_ms: int | None = None
    state: str | None = None
    last_kind: str | None = None
    decision: dict | None = None

    @property
    def pending(self) -> bool:
        """Opened, and neither resumed nor closed: waiting for a decision."""
        return self.state == "opened"


@dataclass(frozen=True)
class Folded:
    """The waits of a waits topic by id, and how many of its records were not wait events this version reads."""

    waits: dict[str, WaitState]
    events: int
    skipped: int


def fold_wait_events(records: Iterable[Any]) -> Folded:
    """Fold wait events (JSON objects, or their text or bytes), in the topic's order, into :class:`WaitState` s.

    Records that are not JSON objects, or of a later format than :data:`WAIT_EVENT_VERSION`, are counted as
    skipped; events of no wait (a decision that could not be read) are left out.
    """
    waits: dict[str, WaitState] = {}
    events = skipped = 0
    for record in records:
        event = _event(record)
        if event is None:
            skipped += 1
            continue
        events += 1
        wait_id = event.get("wait_id")
        if not isinstance(wait_id, str):
            continue
        wait = waits.setdefault(wait_id, WaitState(wait_id, event.get("key")))
        if event.get("kind") == "opened":  # the wait's own key (a decision sent under another came first)
            wait.key = event.get("key")
        for name in _DETAILS:
            if event.get(name) is not None:
                setattr(wait, name, event[name])
        kind = event.get("kind")
        if kind in LIFECYCLE:
            wait.state = kind
        wait.last_kind = kind
        if event.get("decision") is not None:
            wait.decision = event["decision"]
    return Folded(waits, events, skipped)


def _event(record: Any) -> dict | None:
    """The wait event in ``record``, or ``None`` for one this version cannot read."""
    if isinstance(record, (bytes, bytearray, str)):
        try:
            record = json.loads(record)
        except ValueError:  # also UnicodeDecodeError
            return None
    if not isinstance(record, dict):
        return None
    version = record.get("v", WAIT_EVENT_VERSION)
    if not isinstance(version, int) or version > WAIT_EVENT_VERSION:
        return None
    return record
