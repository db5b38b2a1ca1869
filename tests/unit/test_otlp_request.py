"""The exporter's own OTLP request body (traces/otlp_request.py) against the SDK's: for the spans of reused, executed,
failed, linked and content-carrying calls, the request it builds must be the very ``ExportTraceServiceRequest`` the
SDK's encoder makes of the same spans as ``ReadableSpan`` s; and the SDK exporter's HTTP client sends it on the
version this environment pins (an upgrade that moves that client fails here, not silently in a job)."""

from __future__ import annotations

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from flink_agents_replay.core.keygroups import key_group
from flink_agents_replay.engine import RunInput, execute_run
from flink_agents_replay.traces.export import SpanSink, TracingConfig
from flink_agents_replay.traces.otlp_request import RequestEncoder, sender
from flink_agents_replay.traces.spans import SpanData
from tests.harness.otlp_receiver import Receiver
from tests.unit.test_traces import (
    KEY,
    MAX_PARALLELISM,
    Model,
    Refund,
    _traced_with_content,
    attempts,
    identity,
    make_agent,
    spans_made,
)

UPSTREAM = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def spans_of_every_kind() -> list[SpanData]:
    """Reused and executed calls across two attempts, content on, an upstream link, a failed span and odd values."""
    spans = spans_made(attempts(Model(), Refund()).trace, identity())
    spans += spans_made(_traced_with_content(Model(), Refund()), identity(), content=True)
    run = RunInput(KEY, key_group(KEY, "STRING", MAX_PARALLELISM), 1, {"order": "o-1"}, traceparent=UPSTREAM)
    spans += spans_made(execute_run(make_agent(Model(), Refund()), run, {}, trace=True).trace, identity())
    spans.append(SpanData("odd", 1, 2, None, 5, 3, {"flag": True, "list": ("a", "b"), "none": None, "float": 0.5,
                                                   "gen_ai.operation.name": "chat", "range": range(2),
                                                   "mapping": {"a": 1}, "gen_ai.tool.name": ["kept", "not"]},
                          error="ValueError"))
    # What neither encodes is left out, the rest of the span kept: a set, an int over 64 bits, an object.
    spans.append(SpanData("bad values", 1, 3, 2, 5, 6, {"set": {1}, "huge": 2**70, "object": object(), "fine": 1,
                                                        "gen_ai.provider.name": {"unhashable"}}))
    assert any(span.links for span in spans) and any(span.error for span in spans)
    return spans


def test_the_request_is_the_one_the_sdk_encodes():
    sink = SpanSink(TracingConfig(service_name="triage-svc", resource_attributes={"deployment": "eu"}),
                    agent="triage", exporter=InMemorySpanExporter())
    spans = spans_of_every_kind()
    for _ in range(2):  # the second time from the attributes it kept
        ours = ExportTraceServiceRequest.FromString(sink._encoder.encode(spans))
        assert ours == encode_spans([sink._readable(span) for span in spans])
    [kept] = [span for span in ours.resource_spans[0].scope_spans[0].spans if span.name == "bad values"]
    assert [attribute.key for attribute in kept.attributes] == ["fine"]
    sink.close()


def test_a_resource_schema_url_is_sent_as_the_sdk_sends_it():
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import SpanContext

    resource = Resource({"service.name": "s"}, "https://opentelemetry.io/schemas/1.26.0")
    encoder = RequestEncoder(resource.attributes, scope="s", version="1", schema_url="",
                             resource_schema_url=resource.schema_url)
    span = SpanData("one", 1, 2, None, 5, 6)
    sdk = ReadableSpan(name="one", context=SpanContext(1, 2, False), resource=resource, start_time=5, end_time=6,
                       instrumentation_scope=InstrumentationScope("s", "1"))
    assert ExportTraceServiceRequest.FromString(encoder.encode([span])) == encode_spans([sdk])


def test_the_sdk_exporters_client_sends_it_on_this_version_only_for_the_sdk_exporter():
    receiver = Receiver()
    try:
        exporter = OTLPSpanExporter(endpoint=receiver.endpoint + "/v1/traces", timeout=10)
        send = sender(exporter)
        assert send is not None  # else the pinned exporter moved its client: check it, then CHECKED_VERSIONS
        spans = spans_made(attempts(Model(), Refund()).trace, identity())
        encoder = RequestEncoder({"service.name": "direct"}, scope="s", version="1", schema_url="")
        assert send(encoder.encode(spans))
        got = {(int.from_bytes(s.trace_id, "big"), int.from_bytes(s.span_id, "big")) for s in receiver.spans}
        assert got == {(span.trace_id, span.span_id) for span in spans}
        exporter.shutdown()
    finally:
        receiver.close()
    assert sender(InMemorySpanExporter()) is None
