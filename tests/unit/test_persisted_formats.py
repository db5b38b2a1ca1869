"""Persisted formats: every record and state kind is plain data that names no module of this package, round
trips, and what earlier versions wrote (checked-in fixtures per version, made by
tests/fixtures/compat/make_record_fixtures.py) still reads."""

from __future__ import annotations

import base64
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from flink_agents_replay.api.agent import Event, InputEvent, OutputEvent, with_event_id
from flink_agents_replay.api.memory import DELETED, MemoryUpdate
from flink_agents_replay.core.errors import AgentDefinitionError, CallBlocked, ChatModelError, SignatureError
from flink_agents_replay.core.events import EventTypes
from flink_agents_replay.integrations.vector_store import InMemoryVectorStore, StoredDoc, Where
from flink_agents_replay.longterm.versions import Position, VersionedMemory
from flink_agents_replay.storage.capture.records import (
    SIGNED_KEY,
    BlockedCall,
    CapturedInput,
    CapturedOutput,
    CapturedRun,
)
from flink_agents_replay.storage.capture.schemas import CAPTURED_INPUT, CAPTURED_RUN, capture_codec
from flink_agents_replay.storage.formats.state import (
    InFlightInput,
    WaitingInput,
    decode_in_flight,
    decode_memory,
    decode_waiting,
    encode_in_flight,
    encode_memory,
    encode_waiting,
)
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import (
    AcceptedRecord,
    ActionFailedRecord,
    CallOutcome,
    CallRecord,
    CompletionRecord,
    RecordKind,
    ResumedRecord,
    journal_key,
    key_digest,
)
from flink_agents_replay.storage.records.parked import (
    DecisionStatus,
    ParkedWait,
    ReceivedDecision,
    WaitingRun,
    decode_decision,
    decode_parked_wait,
    decode_waiting_run,
    encode_decision,
    encode_parked_wait,
    encode_waiting_run,
)
from flink_agents_replay.storage.records.raised import decode_exception, encode_exception
from flink_agents_replay.storage.records.schemas import call_from_plain, call_to_plain
from flink_agents_replay.storage.records.waits import Decision, WaitOpened

FIXTURES = Path(__file__).parent.parent / "fixtures" / "compat"
KEY = b"k" * 32
RECORD_KEY = journal_key(3, 1, "ev-1", "classify", key_digest("customer:1"))
HERE = {"topic": "op.journal", "partition": 3}  # where RECORD_KEY's records are signed for and read from
CAPTURE_HERE = {"topic": "op.capture", "partition": None}
PACKAGE = b"flink_agents_replay"
#: What the 0.7.0 fixtures on hold as an input's traceparent header and a captured run's trace id.
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


@dataclass(frozen=True)
class Triaged(Event):
    label: str
    tags: tuple


class SlowDown(Exception):
    def __init__(self, message: str, *, wait_s: int):
        super().__init__(message)
        self.wait_s = wait_s


def _call(position: int, outcome: CallOutcome, result) -> CallRecord:
    return CallRecord(1, 0, "ev-1", "classify", position, "llm", f"a{position}", outcome, result, "in-1")


def _journal_records() -> list[tuple[RecordKind, object]]:
    sent = [with_event_id(Triaged("billing", ("a", 1)), "ev-2"), with_event_id(OutputEvent({"x": {1, 2}}), "ev-3"),
            with_event_id(InputEvent("child input"), "ev-4")]
    return [
        (RecordKind.ACCEPTED, AcceptedRecord(1, "in-1", 1_700_000_000_000)),
        (RecordKind.CALL, _call(0, CallOutcome.STARTED, None)),
        (RecordKind.CALL, _call(1, CallOutcome.RETURNED, {"label": "billing", "ids": {3, 1}})),
        (RecordKind.CALL, _call(2, CallOutcome.RAISED, encode_exception(ChatModelError("busy", 503)))),
        (RecordKind.CALL, _call(3, CallOutcome.RAISED, encode_exception(CallBlocked("no", "mailer", "()")))),
        (RecordKind.CALL, _call(4, CallOutcome.RAISED, encode_exception(SlowDown("slow", wait_s=3)))),
        (RecordKind.CALL, _call(5, CallOutcome.RAISED, encode_exception(KeyError("k")))),
        (RecordKind.COMPLETION, CompletionRecord(1, 0, "ev-1", "classify", "fp", [
            MemoryUpdate("log", ["a", {"n": 1}]), MemoryUpdate("draft", DELETED), MemoryUpdate("none", None)],
            sent, 6, "in-1")),
        (RecordKind.ACTION_FAILED, ActionFailedRecord(1, 1, "ev-1", "answer", "RuntimeError: x", "in-1", [0, 2])),
        (RecordKind.ATTEMPT, {"version": 1, "job_id": "abc", "attempt": 2, "subtask": 1}),
        (RecordKind.RESUMED, ResumedRecord(1, 3, "agent:refund:1:1:0123456789abcdef01234567", "in-1")),
    ]


def _capture_records() -> list[tuple[str, object]]:
    return [
        (CAPTURED_INPUT, CapturedInput(("tenant", 7), 1, None, {"text": "hi"}, "in-1")),
        (CAPTURED_INPUT, CapturedInput("k", 2, None, {"text": "hi"}, "in-2", traceparent=TRACEPARENT)),
        (CAPTURED_RUN, CapturedRun("customer:1", 1, "in-1", [CapturedOutput("ev-3", {"answer": 1})],
                                   [_call(1, CallOutcome.RETURNED, [1, 2])],
                                   [BlockedCall("ev-1", "classify", 2, "mailer", "('x',)")], "boom",
                                   trace_id=TRACE_ID)),
    ]


def _comparable(value):
    """Records compared field by field; exceptions by type, args and attributes."""
    if isinstance(value, BaseException):
        return (type(value), value.args, vars(value))
    if isinstance(value, CallRecord) and value.outcome is CallOutcome.RAISED:
        return (value.identity(), _comparable(decode_exception(value.result)))
    return value


@pytest.mark.parametrize(("kind", "record"), _journal_records(), ids=lambda v: getattr(v, "value", ""))
def test_every_journal_record_round_trips_and_names_no_package_module(kind, record):
    codec = RecordCodec(KEY, "op", event_types=EventTypes([Triaged]))
    value = codec.encode(RECORD_KEY, kind, record, **HERE)
    assert PACKAGE not in value
    decoded = codec.decode(RECORD_KEY, value, **HERE).payload
    assert _comparable(decoded) == _comparable(record)
    if isinstance(record, CompletionRecord):
        assert [type(e) for e in decoded.sent_events] == [Triaged, OutputEvent, InputEvent]
        assert [e.id for e in decoded.sent_events] == ["ev-2", "ev-3", "ev-4"]
        assert decoded.memory_updates[1].value is DELETED


@pytest.mark.parametrize(("kind", "record"), _capture_records(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_capture_record_round_trips_and_names_no_package_module(kind, record):
    codec = capture_codec(KEY, "op")
    value = codec.encode(SIGNED_KEY, kind, record, **CAPTURE_HERE)
    assert PACKAGE not in value
    assert codec.decode(SIGNED_KEY, value, **CAPTURE_HERE).payload == record


def test_every_keyed_state_entry_round_trips_and_names_no_package_module():
    waiting = WaitingInput({"text": "x"}, 5, 3, traceparent=TRACEPARENT)
    in_flight = InFlightInput(4, ("a", {1}), None, epoch=7, traceparent=TRACEPARENT)
    memory = {"log": ["a"], "seen": {1, 2}, "nested": {"deep": {"x": 1.5}}}
    entries = [encode_waiting(waiting), encode_in_flight(in_flight), encode_memory(memory)]
    assert all(PACKAGE not in entry for entry in entries)
    assert (decode_waiting(entries[0]), decode_in_flight(entries[1]), decode_memory(entries[2])) == (
        waiting, in_flight, memory)


def test_parked_run_entries_round_trip_and_name_no_package_module():
    wait = WaitOpened("agent:refund:2:1:0123456789abcdef01234567", "refund-approval", {"amount": 120},
                      1_700_000_360_000, 1_700_000_000_000)
    opened = CallRecord(2, 0, "ev-1", "refund", 1, "@wait", "d", CallOutcome.RETURNED, wait, "in-2")
    lookup = CallRecord(2, 0, "ev-1", "refund", 0, "orders", "a0", CallOutcome.RETURNED, {"total": 120}, "in-2")
    held = WaitingRun(wait, 2, "refund", "ev-1", 0, [lookup, opened], {})
    aside = WaitingRun(wait, 2, "refund", "ev-1", 0, [lookup, opened], {0: 1}, input=("a", {1}), event_time=7,
                       memory=encode_memory({"done": {"1": "free"}}), kept_aside=True)
    received = ReceivedDecision(Decision(approved=True, value=[1], by="ana"), DecisionStatus.APPLIED, 5, None, "s", 4)
    entries = [encode_waiting_run(held), encode_waiting_run(aside), encode_parked_wait(ParkedWait(2, None)),
               encode_decision(received)]
    assert all(PACKAGE not in entry for entry in entries)
    assert [decode_waiting_run(entry, EventTypes()) for entry in entries[:2]] == [held, aside]
    assert (decode_parked_wait(entries[2]), decode_decision(entries[3])) == (ParkedWait(2, None), received)


def test_a_package_exception_comes_back_as_itself_without_its_constructor():
    codec = RecordCodec(KEY, "op")
    record = _call(2, CallOutcome.RAISED, encode_exception(ChatModelError("busy", 503)))
    value = codec.encode(RECORD_KEY, RecordKind.CALL, record, **HERE)
    raised = decode_exception(codec.decode(RECORD_KEY, value, **HERE).payload.result)
    assert type(raised) is ChatModelError and raised.status == 503 and raised.transient and str(raised) == "busy"


def test_an_event_name_that_two_classes_share_asks_for_event_name():
    first = type("Twin", (Event,), {"__module__": "one"})
    second = type("Twin", (Event,), {"__module__": "two"})
    with pytest.raises(AgentDefinitionError, match="__event_name__"):
        EventTypes().resolve("Twin")
    assert EventTypes().resolve("Twin", "two") is second  # the module it was written from tells them apart
    assert EventTypes([first]).resolve("Twin") is first  # the agent's own types win
    renamed = type("Renamed", (Event,), {"__event_name__": "Twin", "__module__": "three"})
    assert EventTypes([renamed]).resolve("Twin") is renamed
    del first, second, renamed


def test_a_newer_schema_version_is_refused_with_advice():
    codec = RecordCodec(KEY, "op")
    value = codec.encode(RECORD_KEY, RecordKind.ACCEPTED, AcceptedRecord(1, "d"), **HERE)
    from flink_agents_replay.storage.formats import plain
    header, body = codec.verify(RECORD_KEY, value, **HERE)
    newer = plain.pack({**plain.unpack(body), "v": 99})
    with pytest.raises(SignatureError, match="upgrade flink-agents-replay"):
        codec.load(header, newer)


# -- what earlier versions wrote ----------------------------------------------------------------------------------

def _fixture(version: str) -> dict:
    return json.loads((FIXTURES / version / "records.json").read_text())


def _decode(codec: RecordCodec, entry: dict, *, capture: bool = False):
    """A fixture's record, read as from its place: a journal record from the partition its key names (0.1.0 and
    0.2.0 records are not bound to a topic), a capture record from no known partition."""
    record_key = base64.b64decode(entry["record_key"])
    partition = None if capture else int(record_key.split(b":")[0])
    topic = entry.get("topic", "any.topic")  # kept from envelope version 3 on
    return codec.decode(record_key, base64.b64decode(entry["value"]), topic=topic, partition=partition).payload


@dataclass(frozen=True)
class Classified(Event):
    """The agent's own class for the event the fixtures' script sent (defined in its ``__main__``)."""

    label: str
    score: float


VERSIONS = sorted(path.name for path in FIXTURES.iterdir() if (path / "records.json").exists())


def test_there_is_a_fixture_of_this_version_and_of_0_1_0():
    from flink_agents_replay import __version__

    assert {"v0_1_0", "v" + __version__.replace(".", "_")} <= set(VERSIONS)


@pytest.mark.parametrize("version", VERSIONS)
def test_journal_records_written_by_earlier_versions_still_read(version):
    fixture = _fixture(version)
    codec = RecordCodec(base64.b64decode(fixture["signing_key"]), fixture["producer"],
                        event_types=EventTypes([Classified]))
    records = {name: _decode(codec, entry) for name, entry in fixture["journal"].items()}
    assert records["accepted"] == AcceptedRecord(1, "in-1", 1_700_000_000_000)
    assert records["call_started"].outcome is CallOutcome.STARTED
    assert records["call_returned"].result == {"label": "billing"}
    # Older call records have no meta (0.1.0's were pickled objects) and are written again as this version's.
    assert records["call_returned"].meta == {} or version >= "v0_5_0"
    assert call_from_plain(call_to_plain(records["call_returned"])) == records["call_returned"]
    package_error = decode_exception(records["call_raised_package"].result)
    assert type(package_error) is ChatModelError and package_error.status == 503
    user_error = decode_exception(records["call_raised_user"].result)
    assert type(user_error).__name__ == "QuotaExceeded" and user_error.retry_after == 7
    assert repr(decode_exception(records["call_raised_builtin"].result)) == "ValueError('bad input')"
    completion = records["completion"]
    assert [(u.path, u.value) for u in completion.memory_updates] == [("history", ["hi", {"n": 1}]),
                                                                      ("draft", DELETED)]
    classified, output = completion.sent_events
    assert isinstance(classified, Event) and (classified.label, classified.score, classified.id) == (
        "billing", 0.5, "ev-2")
    assert type(output) is OutputEvent and output.output == {"answer": "refund", "tags": ("a", "b")}
    assert records["failed"].retry_calls == [0, 1]
    assert records["attempt"]["attempt"] == 2
    if version >= "v0_5_0":  # how each call went, and a chat model's answer as plain data
        assert records["call_returned"].meta == {"latency_ms": 12.5, "model": "m-1", "prompt_tokens": 7,
                                                 "completion_tokens": 2}
        chat = records["call_chat"].result
        assert (chat.content, chat.parsed, chat.usage.total_tokens, chat.finish_reason) == (
            None, {"category": "refund", "urgent": True}, 15, "tool_calls")
        assert chat.tool_calls[0].name == "orders" and chat.tool_calls[0].arguments == {"order_id": "O-1"}
    if version >= "v0_7_0":  # a wait and its decision, as call records
        assert records["call_wait"].resource == "@wait" and records["call_wait"].result == WaitOpened(
            "triage:refund:1:6:0123456789abcdef01234567", "refund-approval",
            {"order": "O-1", "amount": 120.5, "lines": [1, 2]}, 1_700_000_360_000, 1_700_000_000_000)
        assert records["call_decision"].result == Decision(approved=False, value={"amount": 60}, reason="half only",
                                                           by="ana", decided_at_ms=1_700_000_100_000)
    if "resumed" in records:  # 0.7.0 on: where a parked run kept aside resumed among its key's later inputs
        resumed = records["resumed"]
        assert type(resumed) is ResumedRecord
        assert (resumed.seq, resumed.after, resumed.wait_id, resumed.input_digest) == (
            4, 6, "triage:refund:4:1:0123456789abcdef01234567", "in-4")
        assert base64.b64decode(fixture["journal"]["resumed"]["record_key"]).split(b":")[3] == b"_resumed"
    assert ("resumed" in records) == (version >= "v0_7_0")


@pytest.mark.parametrize("version", VERSIONS)
def test_capture_records_written_by_earlier_versions_still_read(version):
    fixture = _fixture(version)
    codec = capture_codec(base64.b64decode(fixture["signing_key"]), fixture["producer"])
    captured = _decode(codec, fixture["capture"]["captured_input"], capture=True)
    run = _decode(codec, fixture["capture"]["captured_run"], capture=True)
    assert captured == CapturedInput("customer:1", 1, 1_700_000_000_000, {"text": "refund please"}, "in-1")
    assert run.outputs == [CapturedOutput("ev-3", {"answer": "refund"})]
    traced = "captured_input_traced" in fixture["capture"]  # 0.7.0 on: the header, and each run's trace id
    assert traced == (version >= "v0_7_0")
    assert run.trace_id == (TRACE_ID if traced else None)
    if traced:
        assert _decode(codec, fixture["capture"]["captured_input_traced"], capture=True) == CapturedInput(
            "customer:1", 2, None, {"text": "and again"}, "in-2", traceparent=TRACEPARENT)
    assert type(decode_exception(run.calls[1].result)) is CallBlocked
    assert run.blocked == [BlockedCall("ev-1", "classify", 2, "mailer", "('x',)")]


@pytest.mark.parametrize("version", VERSIONS)
def test_keyed_state_written_by_earlier_versions_still_reads(version):
    state = {name: base64.b64decode(raw) for name, raw in _fixture(version)["state"].items()}
    assert decode_waiting(state["waiting"]) == WaitingInput({"text": "next"}, 1_700_000_000_500)
    epoch = 5 if version >= "v0_4_0" else None  # kept with the run since 0.4.0
    assert decode_in_flight(state["in_flight"]) == InFlightInput(4, {"text": "now"}, 1_700_000_000_400, epoch)
    assert decode_memory(state["memory"]) == {"history": ["hi", {"n": 1}], "count": 3}
    assert ("waiting_traced" in state) == (version >= "v0_7_0")  # state version 4: the input's traceparent
    if "waiting_traced" in state:
        assert decode_waiting(state["waiting_traced"]) == WaitingInput({"text": "traced next"}, 1_700_000_000_600,
                                                                       None, TRACEPARENT)
        assert decode_in_flight(state["in_flight_traced"]) == InFlightInput(5, {"text": "traced now"},
                                                                            1_700_000_000_700, 6, TRACEPARENT)
    else:
        assert decode_in_flight(state["in_flight"]).traceparent is None


@pytest.mark.parametrize("version", [v for v in VERSIONS if "waiting_run" in _fixture(v)["state"]])
def test_waiting_runs_and_decisions_written_by_earlier_versions_still_read(version):
    state = {name: base64.b64decode(raw) for name, raw in _fixture(version)["state"].items()}
    assert PACKAGE not in state["waiting_run"] and PACKAGE not in state["decision"]
    run = decode_waiting_run(state["waiting_run"], EventTypes([Classified]))
    assert (run.wait.wait_id, run.wait.payload, run.seq, run.action, run.order, run.retried) == (
        "triage:refund:4:1:0123456789abcdef01234567", {"amount": 120}, 4, "refund", 1, {0: 1})
    completion, lookup, opened = run.records
    assert completion.memory_updates[0].value == 3 and type(completion.sent_events[0]).__name__ == "Classified"
    assert lookup.result == {"total": 120} and opened.result == run.wait
    received = decode_decision(state["decision"])
    assert (received.decision.approved, received.decision.by, received.status.value, received.signal_id) == (
        True, "ana", "early", "sig-1")
    assert (received.received_at_ms, received.keep_until_ms, received.arrival) == (
        1_700_000_001_000, 1_700_003_601_000, 0)  # an early decision has no place among applied ones yet


@pytest.mark.parametrize("version", [v for v in VERSIONS if "waiting_run_kept_aside" in _fixture(v)["state"]])
def test_runs_kept_aside_their_wait_index_and_applied_decisions_written_by_earlier_versions_still_read(version):
    """``later_inputs_while_waiting="run"`` (0.7.0 on): a parked run kept aside with its input, event time and the
    key's memory as it started; its entry in the key's wait index; a decision applied, with its arrival."""
    state = {name: base64.b64decode(raw) for name, raw in _fixture(version)["state"].items()}
    for name in ("waiting_run_kept_aside", "parked_wait", "decision_applied"):
        assert PACKAGE not in state[name], name
    run = decode_waiting_run(state["waiting_run_kept_aside"], EventTypes([Classified]))
    assert run.kept_aside is True
    assert (run.wait.wait_id, run.wait.name, run.wait.payload, run.wait.deadline_ms, run.wait.opened_at_ms) == (
        "triage:refund:4:1:0123456789abcdef01234567", "refund-approval", {"amount": 120}, 1_700_000_360_000,
        1_700_000_000_000)
    assert (run.seq, run.action, run.event_id, run.order, run.retried) == (4, "refund", "ev-2", 1, {0: 1})
    assert run.input == {"order": "O-4", "amount": 120, "lines": (1, 2)} and type(run.input["lines"]) is tuple
    assert run.event_time == 1_700_000_000_400
    assert run.traceparent == (TRACEPARENT if "waiting_traced" in state else None)
    assert decode_memory(run.memory) == {"done": {"1": "free"}, "count": 2}
    completion, lookup, opened = run.records
    assert (completion.seq, completion.action, completion.memory_updates[0].path) == (4, "classify", "count")
    assert type(completion.sent_events[0]).__name__ == "Classified" and completion.sent_events[0].id == "ev-2"
    assert (lookup.resource, lookup.position, lookup.result) == ("orders", 0, {"total": 120})
    assert (opened.resource, opened.position, opened.result) == ("@wait", 1, run.wait)
    assert decode_parked_wait(state["parked_wait"]) == ParkedWait(4, 1_700_000_360_000)
    applied = decode_decision(state["decision_applied"])
    assert applied == ReceivedDecision(Decision(approved=False, value={"amount": 60}, reason="half", by="bo",
                                                decided_at_ms=1_700_000_002_000),
                                       DecisionStatus.APPLIED, 1_700_000_002_500, None, "sig-2", arrival=3)


@pytest.mark.parametrize("version", [v for v in VERSIONS if "memory_package_objects" in _fixture(v)["state"]])
def test_package_objects_kept_in_memory_by_earlier_versions_still_read(version):
    from flink_agents_replay import ChatResult, InputEvent, SideEffects, ToolLoopResult
    from flink_agents_replay.core.errors import ChatModelError

    raw = base64.b64decode(_fixture(version)["state"]["memory_package_objects"])
    assert PACKAGE not in raw
    memory = decode_memory(raw)
    reply, loop = memory["reply"], memory["loop"]
    assert type(reply) is ChatResult and reply.tool_calls[0].arguments == {"order_id": "O-1"}
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.finish_reason) == (30, 8, "tool_calls")
    assert type(loop) is ToolLoopResult and (loop.content, loop.turns, loop.final.usage.total_tokens) == (
        "On its way.", 2, 46)
    assert loop.messages[1] == reply.message() and loop.tool_calls == [(reply.tool_calls[0], {"status": "shipped"})]
    assert memory["event"] == InputEvent({"text": "hi"}) and memory["event"].id == "ev-1"
    assert memory["effects"] is SideEffects.EXTERNAL
    assert type(memory["failure"]) is ChatModelError and memory["failure"].args == ("no text",)


@pytest.mark.parametrize("version", [v for v in VERSIONS if "long_term_memory" in _fixture(v)])
def test_long_term_memory_written_by_earlier_versions_still_reads_and_takes_new_writes(version):
    store = InMemoryVectorStore()
    for doc in _fixture(version)["long_term_memory"]:
        store.upsert(doc["namespace"], [StoredDoc(doc["id"], doc["text"], tuple(doc["embedding"]), doc["metadata"])])
    now, then = VersionedMemory(store, "triage"), VersionedMemory(store, "triage", as_of=2, overlay="triage@replay:r1")

    def texts(memory):
        return [item["memory"] for item in memory.get_all("key:kd")]

    assert texts(now) == ["likes green tea"] and now.get_all("key:kd")[0]["metadata"] == {"topic": "taste"}
    assert texts(then) == ["likes coffee"]  # the overlay's version hides production's as of checkpoint 2
    assert texts(VersionedMemory(store, "triage", as_of=1, overlay="other")) == ["likes tea", "old address"]
    [tea] = now.get_all("key:kd")
    again = Position(3, "kd", 4, 1_700_000_000_004, "c4", stable_id="stable-c4")  # the old update made again
    now.update("key:kd", tea["id"], "likes green tea", (1.0, 0.1, 0.0), again)
    assert texts(now) == ["likes green tea"] and len(store.get("triage", Where())) == 4


def test_every_exception_of_the_package_has_a_persisted_name():
    """A package exception missing from the table would be pickled by its module path."""
    from flink_agents_replay.core import errors
    from flink_agents_replay.storage.formats.exceptions import PACKAGE_EXCEPTIONS

    classes = {getattr(errors, name) for name in errors.__all__}
    assert classes - set(PACKAGE_EXCEPTIONS.values()) == set()


def test_version_1_data_naming_a_class_that_cannot_be_imported_says_so():
    import pickle

    from flink_agents_replay.storage.formats.legacy import load_v1

    with pytest.raises(pickle.UnpicklingError, match="flink_agents_replay.nowhere.Gone, which cannot be imported"):
        load_v1(b"cflink_agents_replay.nowhere\nGone\n.")
    # a class of the package outside the table (the testing API's agents' events) is found where it is
    assert load_v1(b"cflink_agents_replay.testing.agents\nClassified\n.").__name__ == "Classified"


def test_events_of_the_testing_api_name_no_module_of_the_package_either():
    from flink_agents_replay.testing.agents import Classified as TestingClassified

    codec = RecordCodec(KEY, "op", event_types=EventTypes([TestingClassified]))  # as the operator passes them
    sent = [with_event_id(TestingClassified(label="x", detail="y"), "ev-9")]
    record = CompletionRecord(1, 0, "ev-1", "classify", "fp", [], sent, 0, "in-1")
    value = codec.encode(RECORD_KEY, RecordKind.COMPLETION, record, **HERE)
    assert PACKAGE not in value
    assert type(codec.decode(RECORD_KEY, value, **HERE).payload.sent_events[0]) is TestingClassified


#: The fixtures a real job left behind (``make_fixtures.py``: ``v*/``; ``make_waits_fixtures.py``: ``v*/waits/``).
JOB_FIXTURES = sorted(str(path.parent.relative_to(FIXTURES)) for pattern in ("v*/fixture.json", "v*/waits/fixture.json")
                      for path in FIXTURES.glob(pattern))


@pytest.mark.parametrize("fixture", [f for f in JOB_FIXTURES if not f.startswith("v0_1_0")])
def test_what_a_real_job_of_this_format_left_behind_names_no_module_of_the_package(fixture):
    """The savepoint and the journal, capture and manifest topics a job wrote (tests/fixtures/compat/v*/, and
    v*/waits/ with runs parked at a wait)."""
    import gzip

    directory = FIXTURES / fixture
    assert PACKAGE not in (directory / "savepoint" / "_metadata").read_bytes()
    values = 0
    for dump in directory.glob("*.dump.jsonl.gz"):
        with gzip.open(dump, "rt") as lines:
            records = [json.loads(line) for line in list(lines)[1:]]
        for record in records:
            if record.get("value"):
                values += 1
                assert PACKAGE not in base64.b64decode(record["value"]), f"{dump.name} offset {record.get('offset')}"
    assert values > 100


def _markers(metadata: bytes) -> list[dict]:
    """The checkpoint markers (JSON in the operators' union state) a savepoint's ``_metadata`` holds inline."""
    decoder = json.JSONDecoder()
    text = metadata.decode("latin-1")
    return [decoder.raw_decode(text, start)[0] for start in (
        index for index in range(len(text)) if text.startswith('{"version": ', index))]


@pytest.mark.parametrize("fixture", [f for f in JOB_FIXTURES if f.endswith("waits")])
def test_a_fixture_with_parked_runs_holds_them_in_its_savepoint_and_its_journal_resumed_records(fixture):
    """What ``make_waits_fixtures.py`` says the fixture holds: markers of version 2 whose ``waits_open`` count the
    runs parked at the savepoint by key group, for both agents and subtasks; and in the journal, ``resumed`` records
    (a run kept aside resumed before and one after the savepoint)."""
    import gzip

    from flink_agents_replay.core.keygroups import key_group

    directory = FIXTURES / fixture
    description = json.loads((directory / "fixture.json").read_text())
    parked = json.loads((directory / "expected.json").read_text())["parked_at_savepoint"]
    markers = _markers((directory / "savepoint" / "_metadata").read_bytes())
    assert sorted((m["version"], m["subtask"]) for m in markers) == [(2, 0), (2, 0), (2, 1), (2, 1)]
    assert len({m["topic_id"] for m in markers}) == 2  # one journal per agent
    waits_open = Counter()
    for marker in markers:
        waits_open.update({int(group): n for group, n in marker["waits_open"].items()})
    assert waits_open == Counter(key_group(key, "STRING", description["max_parallelism"]) for key, _ in parked)
    resumed = []
    for dump in description["dumps"].values():
        with gzip.open(directory / dump, "rt") as lines:
            records = [json.loads(line) for line in list(lines)[1:]]
        resumed += [base64.b64decode(r["key"]).split(b":")[1] for r in records
                    if r.get("key") and base64.b64decode(r["key"]).split(b":")[3:4] == [b"_resumed"]]
    assert sorted(resumed) == [b"1", b"3"], resumed  # r-0's seq 1 (before the savepoint), r-1's seq 3 (after)


@dataclass(slots=True)
class Slotted(Event):
    label: str
    score: float = 0.0


def test_a_slotted_event_keeps_its_fields():
    codec = RecordCodec(KEY, "op", event_types=EventTypes([Slotted]))
    record = CompletionRecord(1, 0, "ev-1", "classify", "fp", [], [with_event_id(Slotted("x", 2.5), "ev-2")], 0, "in")
    value = codec.encode(RECORD_KEY, RecordKind.COMPLETION, record, **HERE)
    back = codec.decode(RECORD_KEY, value, **HERE).payload.sent_events[0]
    assert type(back) is Slotted and (back.label, back.score, back.id) == ("x", 2.5, "ev-2")


def test_same_named_event_classes_under_one_agent_base_are_told_apart_by_their_module():
    from flink_agents_replay.storage.formats.events import event_from_plain, event_to_plain

    base = type("AppEvent", (Event,), {"__module__": "app.base"})
    orders = type("Created", (base,), {"__module__": "app.orders"})
    users = type("Created", (base,), {"__module__": "app.users"})
    types = EventTypes([base])  # an agent whose action takes AppEvent: both subclasses are its own types
    for kind in (orders, users):
        assert type(event_from_plain(event_to_plain(with_event_id(kind(x=1), "e")), types)) is kind
    with pytest.raises(AgentDefinitionError, match="__event_name__"):
        types.resolve("Created")  # no module to tell them apart


def test_an_agent_handling_same_named_event_classes_is_warned_when_defined(caplog):
    from flink_agents_replay.api.agent import Agent, InputEvent, action

    base = type("ShopEvent", (Event,), {"__module__": "shop.base"})
    type("Created", (base,), {"__module__": "shop.orders"})
    type("Created", (base,), {"__module__": "shop.users"})

    class Shop(Agent):
        @action(InputEvent, base)
        def handle(event, ctx):
            pass

    with caplog.at_level("WARNING", logger="flink_agents_replay.api.agent"):
        Shop()
    [warning] = [r.getMessage() for r in caplog.records if "several event classes named 'Created'" in r.getMessage()]
    assert "shop.orders.Created, shop.users.Created" in warning and "__event_name__" in warning
