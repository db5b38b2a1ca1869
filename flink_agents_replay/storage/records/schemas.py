"""The journal's records as plain data (schema version 1 of each kind, 3 of ``call``; see
:mod:`flink_agents_replay.storage.formats`).

=============  ==========================================================================================
kind           plain payload (``bytes`` fields are user values, pickled)
=============  ==========================================================================================
``accepted``   ``seq``, ``input_digest``, ``event_time``
``resumed``    ``seq``, ``after``, ``wait_id``, ``input_digest`` (new in 0.7)
``call``       ``seq``, ``order``, ``event_id``, ``action``, ``position``, ``resource``, ``args_digest``,
               ``outcome`` (``started``/``returned``/``raised``), ``result`` (``None``; the return value as
               bytes; a chat model's answer as ``{"chat": ...}``, :mod:`flink_agents_replay.storage.records.chat`; a
               wait as ``{"wait": ...}`` or its decision as ``{"decision": ...}``,
               :mod:`flink_agents_replay.storage.records.waits`; or an
               exception, :mod:`flink_agents_replay.storage.formats.exceptions`), ``input_digest``, ``meta`` (how the
               call went: ``latency_ms`` and what the resource reported, e.g. a model's tokens)
``completion`` ``seq``, ``order``, ``event_id``, ``action``, ``fingerprint``, ``memory`` (a list of
               ``[path, deleted, value bytes or None]``), ``events``
               (:mod:`flink_agents_replay.storage.formats.events`), ``calls``, ``input_digest``
``failed``     ``seq``, ``order``, ``event_id``, ``action``, ``error``, ``input_digest``, ``retry_calls``
``attempt``    ``version``, ``job_id``, ``attempt``, ``subtask`` (see :mod:`.attempts`)
=============  ==========================================================================================

``call`` version 2 (0.5) added ``meta`` and the ``chat`` form of results; version 1 records read with
``meta == {}``. Version 3 (0.7) added the ``wait`` and ``decision`` forms (an older reader, which would take
any mapping for a chat answer, refuses the version).
"""

from __future__ import annotations

from typing import Any

from flink_agents_replay.core.events import EventTypes
from flink_agents_replay.storage.formats.events import event_from_plain, event_to_plain
from flink_agents_replay.storage.formats.exceptions import exception_from_plain, exception_to_plain
from flink_agents_replay.storage.formats.plain import dump_user, load_user
from flink_agents_replay.storage.formats.schema import RecordSchema
from flink_agents_replay.storage.records.chat import ChatResult, chat_result_from_plain, chat_result_to_plain
from flink_agents_replay.storage.records.journal import (
    DELETED,
    AcceptedRecord,
    ActionFailedRecord,
    CallOutcome,
    CallRecord,
    CompletionRecord,
    MemoryUpdate,
    RecordKind,
    ResumedRecord,
)
from flink_agents_replay.storage.records.waits import (
    Decision,
    WaitOpened,
    decision_from_plain,
    decision_to_plain,
    wait_from_plain,
    wait_to_plain,
)

__all__ = ["JOURNAL_SCHEMAS", "call_from_plain", "call_to_plain"]

_POSITION = ("seq", "order", "event_id", "action")


def _accepted_to_plain(record: AcceptedRecord) -> dict[str, Any]:
    return {"seq": record.seq, "input_digest": record.input_digest, "event_time": record.event_time}


def _accepted_from_plain(plain: dict[str, Any], _: EventTypes) -> AcceptedRecord:
    return AcceptedRecord(plain["seq"], plain["input_digest"], plain["event_time"])


def _resumed_to_plain(record: ResumedRecord) -> dict[str, Any]:
    return {"seq": record.seq, "after": record.after, "wait_id": record.wait_id, "input_digest": record.input_digest}


def _resumed_from_plain(plain: dict[str, Any], _: EventTypes) -> ResumedRecord:
    return ResumedRecord(plain["seq"], plain["after"], plain["wait_id"], plain["input_digest"])


def call_to_plain(record: CallRecord) -> dict[str, Any]:
    """The plain form of a call record (capture runs hold them too)."""
    if record.outcome is CallOutcome.RETURNED and type(record.result) in _PLAIN_RESULTS:
        form, to_plain = _PLAIN_RESULTS[type(record.result)]
        result = {form: to_plain(record.result)}  # plain data, not a class of this package
    elif record.outcome is CallOutcome.RETURNED:
        result = dump_user(record.result, what=f"the result of call {record.position} to {record.resource!r}")
    elif record.outcome is CallOutcome.RAISED:
        result = exception_to_plain(record.result)
    else:
        result = None
    return {**{name: getattr(record, name) for name in _POSITION}, "position": record.position,
            "resource": record.resource, "args_digest": record.args_digest, "outcome": record.outcome.value,
            "result": result, "input_digest": record.input_digest, "meta": dict(record.meta)}


def call_from_plain(plain: dict[str, Any], _: EventTypes | None = None) -> CallRecord:
    """The call record :func:`call_to_plain` wrote."""
    outcome = CallOutcome(plain["outcome"])
    result = plain["result"]
    if outcome is CallOutcome.RETURNED:
        result = _result_from_plain(result) if isinstance(result, dict) else load_user(result)
    elif outcome is CallOutcome.RAISED:
        result = exception_from_plain(result)
    return CallRecord(*(plain[name] for name in _POSITION), position=plain["position"], resource=plain["resource"],
                      args_digest=plain["args_digest"], outcome=outcome, result=result,
                      input_digest=plain["input_digest"], meta=dict(plain.get("meta") or {}))


#: Call results kept in a plain form of their own, by type: the form's name and its writer.
_PLAIN_RESULTS: dict[type, tuple[str, Any]] = {
    ChatResult: ("chat", chat_result_to_plain), WaitOpened: ("wait", wait_to_plain),
    Decision: ("decision", decision_to_plain)}
_RESULT_READERS = {"chat": chat_result_from_plain, "wait": wait_from_plain, "decision": decision_from_plain}


def _result_from_plain(plain: dict[str, Any]) -> Any:
    [(form, value)] = plain.items()
    return _RESULT_READERS[form](value)


def _update_to_plain(update: MemoryUpdate) -> list[Any]:
    if update.value is DELETED:
        return [update.path, True, None]
    return [update.path, False, dump_user(update.value, what=f"memory path {update.path!r}")]


def _completion_to_plain(record: CompletionRecord) -> dict[str, Any]:
    return {**{name: getattr(record, name) for name in _POSITION}, "fingerprint": record.fingerprint,
            "memory": [_update_to_plain(update) for update in record.memory_updates],
            "events": [event_to_plain(event) for event in record.sent_events], "calls": record.calls,
            "input_digest": record.input_digest}


def _completion_from_plain(plain: dict[str, Any], types: EventTypes) -> CompletionRecord:
    updates = [MemoryUpdate(path, DELETED if deleted else load_user(value)) for path, deleted, value in plain["memory"]]
    return CompletionRecord(*(plain[name] for name in _POSITION), fingerprint=plain["fingerprint"],
                            memory_updates=updates, sent_events=[event_from_plain(e, types) for e in plain["events"]],
                            calls=plain["calls"], input_digest=plain["input_digest"])


def _failed_to_plain(record: ActionFailedRecord) -> dict[str, Any]:
    return {**{name: getattr(record, name) for name in _POSITION}, "error": record.error,
            "input_digest": record.input_digest, "retry_calls": list(record.retry_calls)}


def _failed_from_plain(plain: dict[str, Any], _: EventTypes) -> ActionFailedRecord:
    return ActionFailedRecord(*(plain[name] for name in _POSITION), error=plain["error"],
                              input_digest=plain["input_digest"], retry_calls=list(plain["retry_calls"]))


def _attempt_to_plain(payload: dict[str, Any]) -> dict[str, Any]:
    return dict(payload)


def _attempt_from_plain(plain: dict[str, Any], _: EventTypes) -> dict[str, Any]:
    return {name: value for name, value in plain.items() if name != "v"}


#: The journal's record kinds, by header kind.
JOURNAL_SCHEMAS: dict[str, RecordSchema] = {schema.kind: schema for schema in (
    RecordSchema(RecordKind.ACCEPTED.value, 1, _accepted_to_plain, _accepted_from_plain, AcceptedRecord),
    RecordSchema(RecordKind.RESUMED.value, 1, _resumed_to_plain, _resumed_from_plain, ResumedRecord),
    RecordSchema(RecordKind.CALL.value, 3, call_to_plain, call_from_plain, CallRecord),
    RecordSchema(RecordKind.COMPLETION.value, 1, _completion_to_plain, _completion_from_plain, CompletionRecord),
    RecordSchema(RecordKind.ACTION_FAILED.value, 1, _failed_to_plain, _failed_from_plain, ActionFailedRecord),
    RecordSchema(RecordKind.ATTEMPT.value, 1, _attempt_to_plain, _attempt_from_plain, dict),
)}
