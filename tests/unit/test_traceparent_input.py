"""An input's W3C traceparent header on its way to its run (issue 37): the parse operator wraps a record only when its
Kafka record had the header, key selection and the agent see the record itself, keyed state keeps the header with
the input (state version 4; versions 2 and 3 still read), and the capture keeps it and each run's trace id."""

from __future__ import annotations

import pickle
import struct

import msgpack
import pytest
from pyflink.common import Row
from pyflink.datastream import KeySelector

from flink_agents_replay.core.events import traced_input, traceparent_of, untraced
from flink_agents_replay.core.keygroups import key_group
from flink_agents_replay.engine import RunResult, RunStats
from flink_agents_replay.flink.capture_observer import CaptureObserver
from flink_agents_replay.flink.traced_input import _UntracedKey
from flink_agents_replay.jobs.kafka_input import JsonRecords, _ParseRecords
from flink_agents_replay.storage.capture.manifest import CaptureDescription
from flink_agents_replay.storage.capture.reader import CaptureDecoder
from flink_agents_replay.storage.capture.records import SIGNED_KEY, CapturedInput, CapturedRun
from flink_agents_replay.storage.capture.schemas import (
    CAPTURE_SCHEMAS,
    CAPTURED_INPUT,
    CAPTURED_RUN,
    capture_codec,
)
from flink_agents_replay.storage.capture.writer import CaptureWriter
from flink_agents_replay.storage.formats.plain import dump_user
from flink_agents_replay.storage.formats.schema import RecordSchema
from flink_agents_replay.storage.formats.state import (
    STATE_VERSION,
    InFlightInput,
    WaitingInput,
    decode_in_flight,
    decode_waiting,
    encode_in_flight,
    encode_waiting,
)
from flink_agents_replay.storage.journal.memory_store import MemoryJournalStore
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import key_digest
from flink_agents_replay.storage.records.parked import WaitingRun, decode_waiting_run, encode_waiting_run
from flink_agents_replay.storage.records.waits import WaitOpened
from flink_agents_replay.traces.ids import trace_id

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
KEY = b"traceparent-test-signing-key-0123"
UID = "tickets-op"
PARTITIONS = 4


def _row(value: bytes | None, traceparent: str | None) -> Row:
    return Row(topic="tickets", partition=0, offset=7, timestamp=1_700_000_000_000, value=value,
               traceparent=traceparent)


class _Counter:
    def __init__(self):
        self.count = 0

    def inc(self, n: int = 1):
        self.count += n


def _parse() -> _ParseRecords:
    parse = _ParseRecords(JsonRecords("customer"), "dead-letters")
    parse.counter = _Counter()
    return parse


# -- the parse operator and key selection --------------------------------------------------------------------------

def test_the_parse_wraps_a_record_only_when_it_had_a_traceparent_header():
    parse = _parse()
    record = {"customer": "c-1", "text": "hi"}
    assert list(parse.process_element(_row(b'{"customer": "c-1", "text": "hi"}', None), None)) == [record]
    traced = list(parse.process_element(_row(b'{"customer": "c-1", "text": "hi"}', TRACEPARENT), None))
    assert traced == [traced_input(record, TRACEPARENT)]
    # A record sent to the dead letters is never wrapped, header or not.
    [(tag, letter)] = list(parse.process_element(_row(b"not json", TRACEPARENT), None))
    assert tag == "dead-letters" and '"reason": "not JSON' in letter and parse.counter.count == 1


def test_untraced_and_traceparent_of_take_the_wrapper_off():
    record = {"customer": "c-1"}
    assert untraced(traced_input(record, TRACEPARENT)) is record and untraced(record) is record
    assert traceparent_of(traced_input(record, TRACEPARENT)) == TRACEPARENT and traceparent_of(record) is None


def test_a_traced_input_pickles_as_plain_data():
    """Unaligned checkpoints keep records in flight as pickled: no class or module of the package may be in them."""
    pickled = pickle.dumps(traced_input({"customer": "c-1"}, TRACEPARENT), protocol=pickle.HIGHEST_PROTOCOL)
    assert b"flink_agents_replay" not in pickled
    assert untraced(pickle.loads(pickled)) == {"customer": "c-1"}
    for users in (("flink-agents-replay/traced-input/0", TRACEPARENT, 1), (TRACEPARENT, "x", 1)):
        assert untraced(users) is users and traceparent_of(users) is None  # a user's 3-tuple is left alone


def test_the_key_selector_sees_the_record_itself():
    seen = []

    def selector(record):
        seen.append(record)
        return record["customer"]

    key = _UntracedKey(selector)
    assert key.get_key(traced_input({"customer": "c-1"}, TRACEPARENT)) == "c-1"
    assert key.get_key({"customer": "c-2"}) == "c-2"
    assert seen == [{"customer": "c-1"}, {"customer": "c-2"}]

    class ByCustomer(KeySelector):
        def __init__(self):
            self.opened = self.closed = False

        def open(self, runtime_context):
            self.opened = True

        def close(self):
            self.closed = True

        def get_key(self, value):
            assert value is untraced(value)
            return value["customer"]

    selector_object = ByCustomer()
    key = _UntracedKey(selector_object)
    key.open(None)
    assert key.get_key(traced_input({"customer": "c-3"}, TRACEPARENT)) == "c-3"
    key.close()
    assert selector_object.opened and selector_object.closed


# -- keyed state ---------------------------------------------------------------------------------------------------

def test_keyed_state_keeps_the_traceparent_with_the_input():
    waiting = WaitingInput({"text": "next"}, 5, None, TRACEPARENT)
    in_flight = InFlightInput(4, {"text": "now"}, 6, epoch=2, traceparent=TRACEPARENT)
    assert decode_waiting(encode_waiting(waiting)) == waiting
    assert decode_in_flight(encode_in_flight(in_flight)) == in_flight
    assert STATE_VERSION == 4 and encode_waiting(waiting)[4] == 4
    # Most inputs have none: the entry spends no bytes on it.
    assert b"traceparent" not in encode_waiting(WaitingInput({"text": "next"}, 5))
    assert decode_waiting(encode_waiting(WaitingInput({"text": "next"}, 5))).traceparent is None


@pytest.mark.parametrize("version", [2, 3])
def test_state_entries_of_versions_2_and_3_still_read_without_a_traceparent(version):
    def entry(plain: dict) -> bytes:
        return struct.pack(">4sB", b"FARS", version) + msgpack.packb(plain, use_bin_type=True)

    waiting = entry({"value": dump_user({"text": "next"}, what="an input"), "event_time": 5, "captured_seq": None})
    in_flight = entry({"seq": 4, "value": dump_user({"text": "now"}, what="an input"), "event_time": 6, "epoch": 2})
    assert decode_waiting(waiting) == WaitingInput({"text": "next"}, 5)
    assert decode_in_flight(in_flight) == InFlightInput(4, {"text": "now"}, 6, 2)


def test_a_run_kept_aside_keeps_its_inputs_traceparent():
    wait = WaitOpened("a:refund:1:0:0123456789abcdef01234567", "approval", {"amount": 1}, None, 1_700_000_000_000)
    run = WaitingRun(wait, 1, "refund", "ev-1", 0, [], {}, input={"text": "x"}, event_time=5, memory=None,
                     kept_aside=True, traceparent=TRACEPARENT)
    assert decode_waiting_run(encode_waiting_run(run), None).traceparent == TRACEPARENT
    held = WaitingRun(wait, 1, "refund", "ev-1", 0, [], {})  # not kept aside: the run in flight keeps the input
    assert decode_waiting_run(encode_waiting_run(held), None).traceparent is None


# -- the capture ---------------------------------------------------------------------------------------------------

class _Capture:
    def __init__(self, lineage: str):
        self.store = MemoryJournalStore(PARTITIONS, topic="tickets.capture")
        description = CaptureDescription(UID, "tickets.capture", "STRING", PARTITIONS, 3)
        self.observer = CaptureObserver(writer=CaptureWriter(self.store, capture_codec(KEY, UID), description, None,
                                                             timeout_s=1.0), agent="triage")
        self.observer.lineage = lineage

    def records(self) -> list:
        decoder = CaptureDecoder(KEY, UID, key_type="STRING", max_parallelism=PARTITIONS)
        return [decoder.decode(value, topic=self.store.topic, partition=partition)
                for partition in range(PARTITIONS) for _, value in self.store.records(partition)]


def _result(seq: int) -> RunResult:
    return RunResult(seq, {}, [], RunStats(), [], [], "digest")


def test_the_capture_keeps_the_header_and_each_runs_trace_id():
    capture = _Capture("job-lineage-1")
    group = key_group("c-1", "STRING", PARTITIONS)
    capture.observer.input_accepted(key="c-1", group=group, seq=1, value={"text": "a"}, event_time=None,
                                    traceparent=TRACEPARENT)
    capture.observer.input_accepted(key="c-1", group=group, seq=2, value={"text": "b"}, event_time=None)
    capture.observer.run_applied(key="c-1", group=group, result=_result(1))
    inputs = [r for r in capture.records() if isinstance(r, CapturedInput)]
    [run] = [r for r in capture.records() if isinstance(r, CapturedRun)]
    assert [(i.seq, i.traceparent) for i in inputs] == [(1, TRACEPARENT), (2, None)]
    assert run.trace_id == f"{trace_id('job-lineage-1', 'triage', key_digest('c-1'), 1):032x}"
    assert len(run.trace_id) == 32
    # Another lineage (a replay's own job id) names other traces.
    other = _Capture("replay-job")
    other.observer.run_applied(key="c-1", group=group, result=_result(1))
    assert [r.trace_id for r in other.records()] != [run.trace_id]


def test_capture_records_of_input_schema_2_and_run_schema_4_still_read():
    def older(kind: str, version: int, dropped: str) -> RecordSchema:
        current = CAPTURE_SCHEMAS[kind]
        return RecordSchema(kind, version, lambda record: {k: v for k, v in current.to_plain(record).items()
                                                           if k != dropped}, current.from_plain)

    old_codec = RecordCodec(KEY, UID, schemas={CAPTURED_INPUT: older(CAPTURED_INPUT, 2, "traceparent"),
                                               CAPTURED_RUN: older(CAPTURED_RUN, 4, "trace_id")})
    captured = CapturedInput("c-1", 1, None, {"text": "a"}, "digest", key_group=1)
    run = CapturedRun("c-1", 1, "digest", key_group=1)
    decoder = CaptureDecoder(KEY, UID)
    for record, kind in ((captured, CAPTURED_INPUT), (run, CAPTURED_RUN)):
        value = old_codec.encode(SIGNED_KEY, kind, record, topic="t.capture", partition=None)
        assert decoder.decode(value, topic="t.capture") == record
    assert CAPTURE_SCHEMAS[CAPTURED_INPUT].version == 3 and CAPTURE_SCHEMAS[CAPTURED_RUN].version == 5
