"""The capture's records as plain data (schema version 1 of each kind; see :mod:`flink_agents_replay.formats`).

=========  ==============================================================================================
kind       plain payload (``bytes`` fields are user values, pickled)
=========  ==============================================================================================
``input``  ``key`` (bytes), ``seq``, ``event_time``, ``payload`` (bytes), ``input_digest``
``run``    ``key`` (bytes), ``seq``, ``input_digest``, ``outputs`` (``[event id, output bytes]``), ``calls``
           (journal call records, :func:`flink_agents_replay.records.schemas.call_to_plain`), ``blocked``
           (``[event id, action, position, resource, arguments]``), ``error``
=========  ==============================================================================================
"""

from __future__ import annotations

from typing import Any

from flink_agents_replay.capture.records import BlockedCall, CapturedInput, CapturedOutput, CapturedRun
from flink_agents_replay.events import EventTypes
from flink_agents_replay.formats.plain import dump_user, load_user
from flink_agents_replay.formats.schema import RecordSchema
from flink_agents_replay.records.codec import RecordCodec
from flink_agents_replay.records.schemas import call_from_plain, call_to_plain

__all__ = ["CAPTURED_INPUT", "CAPTURED_RUN", "CAPTURE_SCHEMAS", "capture_codec"]

CAPTURED_INPUT = "input"
CAPTURED_RUN = "run"


def _input_to_plain(record: CapturedInput) -> dict[str, Any]:
    return {"key": dump_user(record.key, what="a key"), "seq": record.seq, "event_time": record.event_time,
            "payload": dump_user(record.payload, what="an input"), "input_digest": record.input_digest}


def _input_from_plain(plain: dict[str, Any], _: EventTypes) -> CapturedInput:
    return CapturedInput(load_user(plain["key"]), plain["seq"], plain["event_time"], load_user(plain["payload"]),
                         plain["input_digest"])


def _run_to_plain(run: CapturedRun) -> dict[str, Any]:
    return {"key": dump_user(run.key, what="a key"), "seq": run.seq, "input_digest": run.input_digest,
            "outputs": [[o.event_id, dump_user(o.output, what="an output")] for o in run.outputs],
            "calls": [call_to_plain(call) for call in run.calls],
            "blocked": [[b.event_id, b.action, b.position, b.resource, b.arguments] for b in run.blocked],
            "error": run.error}


def _run_from_plain(plain: dict[str, Any], _: EventTypes) -> CapturedRun:
    return CapturedRun(load_user(plain["key"]), plain["seq"], plain["input_digest"],
                       outputs=[CapturedOutput(event_id, load_user(output)) for event_id, output in plain["outputs"]],
                       calls=[call_from_plain(call) for call in plain["calls"]],
                       blocked=[BlockedCall(*blocked) for blocked in plain["blocked"]], error=plain["error"])


#: The capture topic's record kinds, by header kind.
CAPTURE_SCHEMAS: dict[str, RecordSchema] = {schema.kind: schema for schema in (
    RecordSchema(CAPTURED_INPUT, 1, _input_to_plain, _input_from_plain, CapturedInput),
    RecordSchema(CAPTURED_RUN, 1, _run_to_plain, _run_from_plain, CapturedRun),
)}


def capture_codec(signing_key: bytes, uid: str) -> RecordCodec:
    """The codec of an operator's capture records (its uid and the job's signing key)."""
    return RecordCodec(signing_key, uid, schemas=CAPTURE_SCHEMAS)
