"""The subtask's exporter process (traces/process_sink.py, traces/exporter_process.py): a real child process
exporting over OTLP/HTTP to a receiver in this process (tests/harness/otlp_receiver.py).

What it must keep: the spans it is handed arrive with the ids the span builder derives; a flush returns once they
are out; a collector that is down costs a flush nothing and counts the spans as dropped; a process that dies loses
what it held (counted) and the next run starts another; closing ends the process."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, action
from flink_agents_replay.api.resources import Tool
from flink_agents_replay.core.keygroups import key_group
from flink_agents_replay.engine import RunInput, execute_run
from flink_agents_replay.storage.records.journal import key_digest
from flink_agents_replay.traces.export import TracingConfig
from flink_agents_replay.traces.handoff import RunIdentity, decode_run, encode_run, span_count
from flink_agents_replay.traces.process_sink import ProcessSpanSink
from flink_agents_replay.traces.spans import TOOL, spans_of_run
from tests.harness.otlp_receiver import Receiver

KINDS = {"lookup": TOOL}


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.close()


def traced_run(seq: int) -> tuple[bytes, int, list]:
    """One run's packed facts, its span estimate, and the spans the process is to make of it."""
    class Lookups(Agent):
        @action(InputEvent)
        def answer(event, ctx):
            ctx.send_event(OutputEvent(ctx.call("lookup", event.input)))

    agent = Lookups(name="lookups", resources={"lookup": Tool(lambda n: n * 10, side_effects="none")})
    trace = execute_run(agent, RunInput("k", key_group("k", "STRING", 128), seq, seq), {}, trace=True).trace
    run = RunIdentity("lookups", "k", key_digest("k"), seq, lineage="lineage-1")
    packed = encode_run(trace, run)
    spans = spans_of_run(decode_run(packed), KINDS)
    assert span_count(trace) == len(spans)
    return packed, span_count(trace), spans


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_spans_handed_over_arrive_with_their_derived_ids_and_a_flush_waits_for_them(receiver):
    sink = ProcessSpanSink(TracingConfig(endpoint=receiver.endpoint, service_name="lookups"), agent="lookups",
                           kinds=KINDS)
    expected = []
    for seq in range(1, 21):
        packed, estimate, spans = traced_run(seq)
        sink.submit(packed, estimate)
        expected += spans
    assert sink.flush(30)
    got = {(int.from_bytes(span.trace_id, "big"), int.from_bytes(span.span_id, "big")) for span in receiver.spans}
    assert got == {(span.trace_id, span.span_id) for span in expected}
    assert sink.exported == len(expected) == len(receiver.spans) and sink.dropped == 0
    process = sink._process
    begun = time.monotonic()
    sink.close()
    assert time.monotonic() - begun < 2  # a closing operator does not wait for the exporter
    assert process.wait(30) == 0  # its input ended: it exported what it held and exited on its own


def test_a_collector_that_is_down_costs_a_flush_nothing_and_its_spans_are_counted_dropped():
    sink = ProcessSpanSink(TracingConfig(endpoint=f"http://127.0.0.1:{closed_port()}", export_timeout_s=1,
                                         flush_timeout_s=30), agent="lookups", kinds=KINDS)
    packed, estimate, spans = traced_run(1)
    sink.submit(packed, estimate)
    sink.flush(30)  # waits for the first export, which fails
    assert sink.collector_down and sink.dropped == len(spans) and sink.exported == 0
    sink.submit(packed, estimate)
    begun = time.monotonic()
    assert not sink.flush(30)  # at once while the collector is down, not after the export's retries
    assert time.monotonic() - begun < 1.0
    process = sink._process
    sink.close()
    assert process.wait(30) == 0
    sink._reader.join(10)  # its last answer read: the final counts
    assert sink.dropped == 2 * len(spans)


def test_a_process_that_dies_loses_what_it_held_counted_and_the_next_run_starts_another(receiver):
    # A collector that does not answer yet (a closed port, retried for 30 s): the process holds the spans.
    sink = ProcessSpanSink(TracingConfig(endpoint=f"http://127.0.0.1:{closed_port()}", export_timeout_s=30),
                           agent="lookups", kinds=KINDS)
    packed, estimate, spans = traced_run(1)
    sink.submit(packed, estimate)
    assert not sink.flush(0.5)  # still exporting: the process holds them
    first = sink._process
    os.kill(first.pid, signal.SIGKILL)
    until(lambda: sink._process is None, "the death noticed")
    assert sink.dropped == len(spans) and sink.exported == 0  # what it held, counted once
    sink.submit(packed, estimate)  # a moment after the death: not restarted yet, dropped and counted
    assert sink._process is None and sink.dropped == 2 * len(spans)
    sink.settings = TracingConfig(endpoint=receiver.endpoint)  # the collector is back
    sink._init = ProcessSpanSink(sink.settings, agent="lookups", kinds=KINDS)._init
    until(lambda: time.monotonic() >= sink._restart_at, "the pause after a death")
    sink.submit(packed, estimate)
    assert sink.flush(30)
    assert sink._process is not first and sink.exported == len(spans) and sink.dropped == 2 * len(spans)
    sink.close()


def until(condition, what: str, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.01)  # polls; the deadline bounds it
