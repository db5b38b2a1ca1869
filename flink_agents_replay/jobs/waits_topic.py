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
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flink_agents_replay.flink.waits import WaitEvent

__all__ = ["REJECTED_KEY_PREFIX", "WAIT_EVENT_VERSION", "wait_event_dict", "wait_event_json", "wait_event_key",
           "wait_event_record"]

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
