"""The capture's records as plain data (schema version 3 of inputs, 5 of runs, 1 of parked runs; see
:mod:`flink_agents_replay.storage.formats`).

==========  =============================================================================================
kind        plain payload (``bytes`` fields are user values, pickled)
==========  =============================================================================================
``input``   ``key`` (bytes), ``seq``, ``event_time``, ``payload`` (bytes), ``input_digest``, ``traceparent``
``run``     ``key`` (bytes), ``seq``, ``input_digest``, ``outputs`` (``[event id, output bytes]``), ``calls``
            (journal call records, :func:`flink_agents_replay.storage.records.schemas.call_to_plain`), ``blocked``
            (``[event id, action, position, resource, arguments]``), ``error``, ``trace_id``
``parked``  ``key`` (bytes), ``seq``, ``input_digest``, ``action``, ``event_id``, ``wait`` (the wait as opened,
            :func:`flink_agents_replay.storage.records.waits.wait_to_plain`: JSON payload), ``calls``,
            ``blocked`` (as in ``run``)
==========  =============================================================================================

Version 2 added ``key_group`` to both kinds (the partition the record was written to); version 1 records
(0.1.0, 0.2.0) read with ``key_group=None``. Run version 3 (0.5) holds calls of journal call schema 2 (their
``meta``: latency, a model's tokens; a chat model's answer as plain data). Run version 4 (0.7) holds calls of
journal call schema 3: a run that waited holds its wait (``@wait``) and the decision it got (``@decision``), which
a replay gives the same wait (:mod:`flink_agents_replay.replay.policy`). ``parked`` (0.7, version 1, with
``key_group``) is a run parked at a wait with no decision; readers before 0.7 skip the kind (a reader skips every
kind it does not know: :mod:`.reader`). Input version 3 (0.7) adds the W3C ``traceparent`` header the input's Kafka
record carried (``None`` without one), run version 5 (0.7) the run's ``trace_id`` (32 hex digits; ``None`` where
unknown); older records read without them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flink_agents_replay.core.events import EventTypes
from flink_agents_replay.storage.capture.records import (
    BlockedCall,
    CapturedInput,
    CapturedOutput,
    CapturedParked,
    CapturedRun,
)
from flink_agents_replay.storage.formats.plain import dump_user, load_user
from flink_agents_replay.storage.formats.schema import RecordSchema
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.schemas import call_from_plain, call_to_plain
from flink_agents_replay.storage.records.waits import wait_from_plain, wait_to_plain

__all__ = ["CAPTURED_INPUT", "CAPTURED_PARKED", "CAPTURED_RUN", "CAPTURE_SCHEMAS", "capture_codec"]

CAPTURED_INPUT = "input"
CAPTURED_RUN = "run"
CAPTURED_PARKED = "parked"


def _input_to_plain(record: CapturedInput) -> dict[str, Any]:
    return {"key": dump_user(record.key, what="a key"), "seq": record.seq, "event_time": record.event_time,
            "payload": dump_user(record.payload, what="an input"), "input_digest": record.input_digest,
            "key_group": record.key_group, "traceparent": record.traceparent}


def _input_from_plain(plain: dict[str, Any], _: EventTypes) -> CapturedInput:
    return CapturedInput(load_user(plain["key"]), plain["seq"], plain["event_time"], load_user(plain["payload"]),
                         plain["input_digest"], plain.get("key_group"), plain.get("traceparent"))


def _run_to_plain(run: CapturedRun) -> dict[str, Any]:
    return {"key": dump_user(run.key, what="a key"), "seq": run.seq, "input_digest": run.input_digest,
            "outputs": [[o.event_id, dump_user(o.output, what="an output")] for o in run.outputs],
            "calls": [call_to_plain(call) for call in run.calls],
            "blocked": [[b.event_id, b.action, b.position, b.resource, b.arguments] for b in run.blocked],
            "error": run.error, "key_group": run.key_group, "trace_id": run.trace_id}


def _run_from_plain(plain: dict[str, Any], _: EventTypes) -> CapturedRun:
    return CapturedRun(load_user(plain["key"]), plain["seq"], plain["input_digest"],
                       outputs=[CapturedOutput(event_id, load_user(output)) for event_id, output in plain["outputs"]],
                       calls=[call_from_plain(call) for call in plain["calls"]],
                       blocked=[BlockedCall(*blocked) for blocked in plain["blocked"]], error=plain["error"],
                       key_group=plain.get("key_group"), trace_id=plain.get("trace_id"))


def _parked_to_plain(parked: CapturedParked) -> dict[str, Any]:
    return {"key": dump_user(parked.key, what="a key"), "seq": parked.seq, "input_digest": parked.input_digest,
            "action": parked.action, "event_id": parked.event_id, "wait": wait_to_plain(parked.wait),
            "calls": [call_to_plain(call) for call in parked.calls],
            "blocked": [[b.event_id, b.action, b.position, b.resource, b.arguments] for b in parked.blocked],
            "key_group": parked.key_group}


def _parked_from_plain(plain: dict[str, Any], _: EventTypes) -> CapturedParked:
    return CapturedParked(load_user(plain["key"]), plain["seq"], plain["input_digest"], plain["action"],
                          plain["event_id"], wait_from_plain(plain["wait"]),
                          calls=[call_from_plain(call) for call in plain["calls"]],
                          blocked=[BlockedCall(*blocked) for blocked in plain["blocked"]],
                          key_group=plain.get("key_group"))


#: The capture topic's record kinds, by header kind.
CAPTURE_SCHEMAS: dict[str, RecordSchema] = {schema.kind: schema for schema in (
    RecordSchema(CAPTURED_INPUT, 3, _input_to_plain, _input_from_plain, CapturedInput),
    RecordSchema(CAPTURED_RUN, 5, _run_to_plain, _run_from_plain, CapturedRun),
    RecordSchema(CAPTURED_PARKED, 1, _parked_to_plain, _parked_from_plain),
)}


def capture_codec(signing_key: bytes, uid: str, *, verification_keys: Iterable[bytes] = ()) -> RecordCodec:
    """The codec of an operator's capture records (its uid and the job's signing and verification keys)."""
    return RecordCodec(signing_key, uid, verification_keys=verification_keys, schemas=CAPTURE_SCHEMAS)
