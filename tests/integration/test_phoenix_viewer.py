"""The development trace viewer: a real Phoenix server (``flink-agents-replay local phoenix``) receives spans from
the OpenTelemetry SDK's OTLP/HTTP exporter, gives them back through its REST API (``read_spans``) and shows them
in its UI, read here as headless Chromium renders it.

One server for the session (``phoenix`` in tests/conftest.py: installed once into the cache, on a free port, in a
fresh work directory). Phoenix
writes spans a moment after the export was answered, so every read polls with a deadline.
"""

from __future__ import annotations

import os
import time
import urllib.request
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from flink_agents_replay.cli import main as cli_main
from flink_agents_replay.local.errors import LocalServiceError
from flink_agents_replay.local.phoenix_server import LocalPhoenixServer, read_spans, trace_url
from flink_agents_replay.local.processes import pid_alive
from tests.harness.browser import rendered_dom

pytestmark = pytest.mark.integration

PROJECT_ATTRIBUTE = "openinference.project.name"


@pytest.fixture
def exporter(phoenix, monkeypatch):
    """The SDK's OTLP/HTTP exporter configured as an application would be: by OTEL_EXPORTER_OTLP_ENDPOINT."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", phoenix.otlp_endpoint)
    exporter = OTLPSpanExporter()
    yield exporter
    exporter.shutdown()


def _spans_when(base_url: str, project: str, done, timeout_s: float = 30.0) -> list[dict]:
    """``read_spans`` polled until ``done(spans)``; fails with what was there at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        spans = read_spans(base_url, project)
        if done(spans):
            return spans
        assert time.monotonic() < deadline, f"Phoenix did not hold the expected spans in {timeout_s} s: {spans}"
        time.sleep(0.2)  # a poll interval, the deadline above bounds it


def _export_a_tree(exporter: OTLPSpanExporter, project: str) -> dict[str, object]:
    """A run span with a model-call child and a tool-call grandchild (which fails), through the SDK's tracer."""
    provider = TracerProvider(resource=Resource.create({PROJECT_ATTRIBUTE: project, "service.name": "replay-tests"}),
                              shutdown_on_exit=False)  # the exporter fixture shuts the exporter down
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tests.phoenix")
    with tracer.start_as_current_span("agent.run", attributes={"agent.key": "ada", "agent.run.epoch": 3}) as run:
        with tracer.start_as_current_span("call llm", kind=SpanKind.CLIENT,
                                          attributes={"call.id": "c-1", "gen_ai.usage.input_tokens": 12,
                                                      "tags": ["a", "b"]}) as model:
            with tracer.start_as_current_span("call issue_refund") as tool:
                tool.set_status(Status(StatusCode.ERROR, "payment API down"))
    return {"run": run.get_span_context(), "model": model.get_span_context(), "tool": tool.get_span_context()}


def test_spans_exported_over_otlp_http_come_back_with_their_ids_parents_and_attributes(phoenix, exporter):
    contexts = _export_a_tree(exporter, "viewer-tree")
    spans = _spans_when(phoenix.url, "viewer-tree", lambda found: len(found) == 3)
    by_name = {span["name"]: span for span in spans}
    assert set(by_name) == {"agent.run", "call llm", "call issue_refund"}
    trace_id = format(contexts["run"].trace_id, "032x")
    assert {span["trace_id"] for span in spans} == {trace_id}
    for name, key in (("agent.run", "run"), ("call llm", "model"), ("call issue_refund", "tool")):
        assert by_name[name]["span_id"] == format(contexts[key].span_id, "016x")
    assert by_name["agent.run"]["parent_id"] is None
    assert by_name["call llm"]["parent_id"] == by_name["agent.run"]["span_id"]
    assert by_name["call issue_refund"]["parent_id"] == by_name["call llm"]["span_id"]
    assert by_name["agent.run"]["attributes"] == {"agent.key": "ada", "agent.run.epoch": 3}
    # Phoenix adds the OpenInference attributes it derives from gen_ai.* ones (phoenix/trace/otel.py,
    # decode_otlp_span: _merge_synthesized_attributes), never overriding an attribute the span carries.
    assert by_name["call llm"]["attributes"] == {"call.id": "c-1", "gen_ai.usage.input_tokens": 12,
                                                 "tags": ["a", "b"], "llm.token_count.prompt": 12}
    assert by_name["call issue_refund"]["status"] == "ERROR"
    assert by_name["call issue_refund"]["status_message"] == "payment API down"
    assert by_name["agent.run"]["status"] == "UNSET"
    for span in spans:
        assert span["start_time"] <= span["end_time"]
    assert by_name["agent.run"]["start_time"] <= by_name["call llm"]["start_time"]
    assert read_spans(phoenix.url, "no-such-project") == []


def _span(name: str, trace_id: int, span_id: int, project: str, **attributes) -> ReadableSpan:
    """A finished span with the ids given, as the engine's deterministic ids make them."""
    now = time.time_ns()
    return ReadableSpan(name=name, context=SpanContext(trace_id, span_id, is_remote=False,
                                                      trace_flags=TraceFlags(TraceFlags.SAMPLED)),
                        resource=Resource.create({PROJECT_ATTRIBUTE: project}), attributes=attributes,
                        start_time=now, end_time=now + 1_000_000, status=Status(StatusCode.OK))


def test_a_span_exported_again_with_the_same_ids_is_kept_once_the_first_as_it_came(phoenix, exporter):
    """At-least-once export with deterministic ids relies on this: Phoenix keeps one span per span id, the first
    received (src/phoenix/db/insertion/span.py, insert_span: insert_on_conflict(..., unique_by=("span_id",),
    on_conflict=OnConflict.DO_NOTHING)). Its bulk inserter takes spans in arrival order (a deque), so once the
    sentinel exported after the copies is there, the copies were inserted or dropped."""
    project, trace_id, span_id = "viewer-dedup", 0x5EED_0000_0000_0000_0000_0000_0000_0001, 0x0A11_0000_0000_0001
    first = _span("call llm", trace_id, span_id, project, attempt=1)
    assert exporter.export([first]) is SpanExportResult.SUCCESS
    _spans_when(phoenix.url, project, lambda found: len(found) == 1)
    again = _span("call llm", trace_id, span_id, project, attempt=2)  # the same span, exported by a retry
    sentinel = _span("sentinel", trace_id, 0x0A11_0000_0000_0002, project)
    assert exporter.export([first]) is SpanExportResult.SUCCESS  # the very same span again
    assert exporter.export([again, sentinel]) is SpanExportResult.SUCCESS
    spans = _spans_when(phoenix.url, project, lambda found: "sentinel" in {span["name"] for span in found})
    copies = [span for span in spans if span["span_id"] == format(span_id, "016x")]
    assert len(copies) == 1, spans
    assert copies[0]["attributes"] == {"attempt": 1}  # the first kept; later ones dropped, not merged
    assert len(spans) == 2


def test_the_trace_page_shows_the_span_names_in_its_rendered_dom(phoenix, exporter):
    contexts = _export_a_tree(exporter, "viewer-ui")
    _spans_when(phoenix.url, "viewer-ui", lambda found: len(found) == 3)
    url = trace_url(phoenix.url, "viewer-ui", format(contexts["run"].trace_id, "032x"))
    assert url.startswith(f"{phoenix.url}/projects/") and url.endswith(f"/traces/{contexts['run'].trace_id:032x}")
    names = ["agent.run", "call llm", "call issue_refund"]
    with urllib.request.urlopen(url, timeout=10) as served:  # the page as served: the app, no span yet
        assert not [name for name in names if name in served.read().decode()]
    dom = rendered_dom(url, timeout_s=90, expect=names)
    missing = [name for name in names if name not in dom]
    assert not missing, f"the trace page's DOM lacks {missing}; it begins with:\n{dom[:3000]}"
    with pytest.raises(LocalServiceError, match="no project 'never-sent'"):
        trace_url(phoenix.url, "never-sent", "0" * 32)


def test_the_cli_reports_the_server_and_stop_leaves_no_process(phoenix, tmp_path, capsys):
    work_dir = str(phoenix.work_dir)
    assert cli_main(["local", "phoenix", "status", "--work-dir", work_dir]) == 0
    status = phoenix.status()
    assert f"running: pid {status.pid}, UI {status.url}" in capsys.readouterr().out
    assert phoenix.start().pid == status.pid  # already running: the same server
    taken = int(status.url.rsplit(":", 1)[1])
    with pytest.raises(LocalServiceError, match=rf"port {taken} on 127.0.0.1 is already in use.*--port 0"):
        LocalPhoenixServer(port=taken, work_dir=tmp_path).start()
    assert cli_main(["local", "phoenix", "stop", "--work-dir", work_dir]) == 0
    assert capsys.readouterr().out.strip() == "stopped"
    assert not pid_alive(status.pid)
    assert _processes_in(phoenix.work_dir) == set()
    assert not phoenix.status().running and phoenix.url is None
    assert cli_main(["local", "phoenix", "status", "--work-dir", work_dir]) == 3
    assert capsys.readouterr().out.startswith("not running")


def _processes_in(work_dir: Path) -> set[int]:
    """Live processes whose environment names ``work_dir``'s data (the server, and any child it would leave)."""
    setting = f"PHOENIX_WORKING_DIR={work_dir / 'data'}".encode()
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as environ:
                    found = setting in environ.read().split(b"\0")
            except OSError:
                continue
            if found and pid_alive(int(entry)):
                pids.add(int(entry))
    return pids
