"""A Kafka record's W3C ``traceparent`` header reaches its run (issue 37), on a real broker and a MiniCluster: the
packaged input path (``records_from_kafka`` keyed into ``connect_to_agent``), with capture and tracing on.

Records go in with and without a header (one with two: the last counts; one whose value is not UTF-8: none). The
agent's outputs do not change with the header (the key selector and the agent see the plain record), the capture's
inputs hold the header exactly for the records that had it and its runs their trace ids, and each run's span, as a
tiny OTLP/HTTP receiver in this process gets it, links to exactly the upstream span its record named.
"""

from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka import Producer

from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, action
from flink_agents_replay.api.resources import Tool
from flink_agents_replay.integrations.kafka.settings import LIBRDKAFKA_LOGGER
from flink_agents_replay.storage.capture.reader import CaptureDecoder, read_capture
from flink_agents_replay.storage.capture.records import CapturedInput, CapturedRun
from flink_agents_replay.traces import conventions as c
from flink_agents_replay.traces.export import TracingConfig
from tests.harness.otlp_receiver import Receiver

pytestmark = pytest.mark.integration

AGENT = "traced-tickets"
SIGNING_KEY = "traceparent-integration-test-key"


def _traceparent(n: int) -> tuple[str, str, str]:
    """A distinct upstream span per record: (traceparent, trace id, span id)."""
    trace, span = f"{n + 1:032x}", f"{n + 17:016x}"
    return f"00-{trace}-{span}-01", trace, span


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.close()


def _agent() -> Agent:
    class TracedTickets(Agent):
        @action(InputEvent)
        def answer(event, ctx):
            record = event.input
            assert type(record) is dict, f"the agent got a {type(record).__name__}"
            looked_up = ctx.call("lookup", record["n"])
            ctx.send_event(OutputEvent(output={"customer": record["customer"], "n": record["n"],
                                               "looked_up": looked_up, "type": type(record).__name__}))

    return TracedTickets(name=AGENT, resources={"lookup": Tool(lambda n: n * 10, side_effects="none")})


def _attribute(span, name: str):
    for attribute in span.attributes:
        if attribute.key == name:
            value = attribute.value
            return value.string_value if value.HasField("string_value") else value.int_value
    return None


def test_a_records_traceparent_header_reaches_its_run_its_capture_and_its_spans_link(
        kafka_bootstrap, new_topic, receiver):
    from pyflink.common import Types

    from flink_agents_replay.flink.env import create_environment
    from flink_agents_replay.flink.pipeline import connect_to_agent
    from flink_agents_replay.jobs.connector import require_kafka_connector
    from flink_agents_replay.jobs.kafka_input import DeadLetters, JsonRecords, KafkaInput, records_from_kafka
    from flink_agents_replay.testing.jobs import connector_jars

    tickets, dead = new_topic(1, "tickets"), new_topic(1, "dead")
    run = uuid.uuid4().hex[:8]
    journal, capture = f"traced-journal-{run}", f"traced-capture-{run}"
    # Record n: its customer, and the headers it is produced with.
    records: list[tuple[str, list]] = [
        ("c-0", [("traceparent", _traceparent(0)[0].encode())]),
        ("c-0", []),
        ("c-0", [("traceparent", _traceparent(2)[0].encode())]),  # behind the key's earlier inputs
        ("c-1", [("traceparent", b"00-ffffffffffffffffffffffffffffffff-ffffffffffffffff-01"),
                 ("other", b"x"), ("traceparent", _traceparent(3)[0].encode())]),  # the last one counts
        ("c-1", [("traceparent", b"\xff\xfe not utf-8")]),  # not UTF-8: none
        ("c-2", [("other", b"y")]),
        ("c-2", [("traceparent", _traceparent(6)[0].encode())]),
    ]
    expected_header = {0: _traceparent(0)[0], 2: _traceparent(2)[0], 3: _traceparent(3)[0], 6: _traceparent(6)[0]}
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "logger": LIBRDKAFKA_LOGGER})
    for n, (customer, headers) in enumerate(records):
        producer.produce(tickets, json.dumps({"customer": customer, "n": n}).encode(), headers=headers)
    producer.produce(tickets, b"not json", headers=[("traceparent", _traceparent(9)[0].encode())])
    assert producer.flush(30) == 0

    env = create_environment(parallelism=1, checkpoint_interval_ms=500)
    require_kafka_connector(env, connector_jars())
    parsed = records_from_kafka(env, KafkaInput(kafka_bootstrap, tickets, f"traced-{run}", bounded=True),
                                JsonRecords("customer"), DeadLetters(kafka_bootstrap, dead, f"traced-dead-{run}"),
                                uid="tickets")
    keyed = parsed.key_by(lambda ticket: ticket["customer"], key_type=Types.STRING())
    config = {"kafka": {"bootstrap.servers": kafka_bootstrap}, "signing_key": SIGNING_KEY, "journal_topic": journal,
              "capture": True, "capture_topic": capture,
              "tracing": TracingConfig(endpoint=receiver.endpoint, flush_timeout_s=10.0)}
    outputs = connect_to_agent(keyed, _agent(), config)
    with outputs.map(lambda out: json.dumps([out.key, out.seq, out.output]), output_type=Types.STRING()) \
            .execute_and_collect("traceparent input") as results:
        collected = [json.loads(line) for line in results]

    # (a) The outputs are the same with and without a header: the agent saw each record itself.
    assert sorted((key, output["n"], output["looked_up"], output["type"]) for key, _, output in collected) == sorted(
        (customer, n, n * 10, "dict") for n, (customer, _) in enumerate(records))

    # (b) The capture: each input's header exactly where its record had one, each run's trace id.
    captured = list(read_capture({"bootstrap.servers": kafka_bootstrap}, capture, None,
                                 CaptureDecoder(SIGNING_KEY.encode(), f"flink-agents-replay/{AGENT}")))
    inputs = {record.payload["n"]: record for record in captured if isinstance(record, CapturedInput)}
    assert sorted(inputs) == list(range(len(records)))
    assert {n: record.traceparent for n, record in inputs.items() if record.traceparent is not None} == \
        expected_header
    runs = {(record.key, record.seq): record for record in captured if isinstance(record, CapturedRun)}
    assert sorted(runs) == sorted((record.key, record.seq) for record in inputs.values())
    assert all(len(record.trace_id) == 32 and int(record.trace_id, 16) for record in runs.values())

    # (c) Every run's span is in the trace the capture names, and links to exactly its record's upstream span.
    run_spans = {}
    for span in receiver.spans:  # a run's span may come twice (exported at least once): one id, one span
        if span.name == f"invoke_agent {AGENT}":
            run_spans[(_attribute(span, c.FA_KEY), _attribute(span, c.FA_SEQ))] = span
    assert sorted(run_spans) == sorted(runs)
    record_of_run = {(record.key, record.seq): n for n, record in inputs.items()}
    for (key, seq), span in run_spans.items():
        n = record_of_run[(key, seq)]
        assert span.trace_id.hex() == runs[(key, seq)].trace_id
        links = [(link.trace_id.hex(), link.span_id.hex()) for link in span.links]
        if n in expected_header:
            assert links == [_traceparent(n)[1:]], (n, links)
        else:
            assert links == [], (n, links)
