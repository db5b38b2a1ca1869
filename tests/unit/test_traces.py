"""A run's spans from what its executions did: the engine's notes, the span builder and the exporter's sink, with the
in-memory journal and the OpenTelemetry SDK's in-memory exporter (the real OTLP path to Phoenix is tested in
tests/integration/test_tool_loop_sigkill.py).

The core case: a run whose model call is journaled, then the process dies inside the tool call; the next attempt
reuses the model call and makes the tool call. Across both attempts' spans the model call must appear once as
executed (with its tokens) and once as reused (without), every span in one trace."""

from __future__ import annotations

import threading
import time

import pytest
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, action
from flink_agents_replay.api.call_site import report_call
from flink_agents_replay.api.resources import Resource, SideEffects
from flink_agents_replay.core.keygroups import key_group
from flink_agents_replay.engine import RunInput, execute_run
from flink_agents_replay.storage.journal.memory_store import MemoryJournalStore
from flink_agents_replay.storage.journal.recovery import read_recovery_index
from flink_agents_replay.storage.journal.writer import Durability, JournalWriter
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import key_digest
from flink_agents_replay.traces import conventions as c
from flink_agents_replay.traces.export import SpanSink, TracingConfig
from flink_agents_replay.traces.handoff import RunIdentity, decode_run, encode_run
from flink_agents_replay.traces.spans import CHAT, TOOL, spans_of_run

MAX_PARALLELISM = 128
KEY = "customer-7"
SECRET_PROMPT = "the secret prompt text"


class ProcessDied(BaseException):
    """The process dying inside a call: no outcome journaled."""


class Model(Resource):
    def __init__(self):
        super().__init__(side_effects=SideEffects.NONE)
        self.calls = 0

    def invoke(self, prompt):
        self.calls += 1
        report_call(model="stub-model", prompt_tokens=11, completion_tokens=7)
        return f"reply to {len(prompt)} chars"


class Refund(Resource):
    def __init__(self):
        super().__init__(side_effects=SideEffects.IDEMPOTENT)
        self.die = False
        self.calls = 0

    def invoke(self, order):
        self.calls += 1
        if self.die:
            raise ProcessDied()
        return f"refunded {order}"


def make_agent(model: Model, refund: Refund) -> Agent:
    class Triage(Agent):
        name = "triage"

        @action(InputEvent)
        def handle(event, ctx):
            answer = ctx.call("model", SECRET_PROMPT)
            ctx.send_event(OutputEvent({"answer": answer, "refund": ctx.call("refund", event.input["order"])}))

    return Triage(resources={"model": model, "refund": refund})


def attempts(model: Model, refund: Refund):
    """Two attempts of one run: the first dies in the refund call, the second reuses the model call."""
    store, codec = MemoryJournalStore(MAX_PARALLELISM), RecordCodec(b"0123456789abcdef0123", "triage")
    agent = make_agent(model, refund)
    group = key_group(KEY, "STRING", MAX_PARALLELISM)
    run = RunInput(KEY, group, 1, {"order": "o-1"})
    refund.die = True
    writer = JournalWriter(store, codec, Durability.PER_ACTION)
    with pytest.raises(ProcessDied):
        execute_run(agent, run, {}, journal=writer.run_journal(group), trace=True)
    writer.close()
    groups = range(MAX_PARALLELISM)
    index = read_recovery_index(store, codec, dict.fromkeys(groups, 0), store.end_offsets(list(groups)))
    refund.die = False
    writer = JournalWriter(store, codec, Durability.PER_ACTION)
    result = execute_run(agent, run, {}, history=index.history(key_digest(KEY)), journal=writer.run_journal(group),
                         trace=True)
    writer.close()
    return result


def identity(attempt: int = 1) -> RunIdentity:
    return RunIdentity("triage", KEY, key_digest(KEY), 1, lineage="job-a", job_id="j", attempt=attempt)


KINDS = {"model": CHAT, "refund": TOOL}


def spans_made(trace, run: RunIdentity, kinds=KINDS, *, content: bool = False):
    """The spans of ``trace`` as the exporter process makes them: packed on the operator's side, unpacked there."""
    return spans_of_run(decode_run(encode_run(trace, run, content=content)), kinds)


def test_a_reused_model_call_is_executed_once_and_reused_once_in_one_trace():
    model, refund = Model(), Refund()
    result = attempts(model, refund)
    assert model.calls == 1 and refund.calls == 2  # the fault hit inside the refund, after the model call
    spans = spans_made(result.trace, identity())
    assert len({span.trace_id for span in spans}) == 1
    chats = [span for span in spans if span.name == "chat stub-model"]
    reused = [span for span in spans if span.name == "reused chat stub-model"]
    assert len(chats) == 1 and len(reused) == 1
    assert chats[0].attributes[c.GEN_AI_USAGE_INPUT_TOKENS] == 11
    assert chats[0].attributes[c.OI_TOKENS_COMPLETION] == 7
    assert chats[0].attributes[c.GEN_AI_OPERATION_NAME] == "chat"
    assert c.GEN_AI_USAGE_INPUT_TOKENS not in reused[0].attributes
    assert c.GEN_AI_OPERATION_NAME not in reused[0].attributes  # never counted as a model call again
    assert reused[0].attributes[c.FA_REUSED] is True
    assert reused[0].attributes[c.FA_ORIGINAL_START_MS] * 1_000_000 == chats[0].start_ns
    assert chats[0].start_ns < reused[0].start_ns  # the original timing, from the first attempt
    tools = [span for span in spans if span.name == "execute_tool refund"]
    assert len(tools) == 1 and tools[0].attributes[c.FA_CALL_HOW] == "executed"
    root = next(span for span in spans if span.parent_id is None)
    action = next(span for span in spans if span.name == "action handle")
    assert action.parent_id == root.span_id
    assert {chats[0].parent_id, reused[0].parent_id, tools[0].parent_id} == {action.span_id}
    assert root.start_ns <= chats[0].start_ns and root.end_ns >= tools[0].end_ns


def test_the_executed_span_made_again_has_the_same_id_and_attempts_share_the_trace():
    model, refund = Model(), Refund()
    result = attempts(model, refund)
    first = spans_made(result.trace, identity(1))
    again = spans_made(result.trace, identity(2))
    ids = {span.name: span.span_id for span in first}
    ids_again = {span.name: span.span_id for span in again}
    for name in ("invoke_agent triage", "action handle", "chat stub-model", "execute_tool refund"):
        assert ids[name] == ids_again[name], name
    assert ids["reused chat stub-model"] != ids_again["reused chat stub-model"]
    other_job = spans_made(result.trace, RunIdentity("triage", KEY, key_digest(KEY), 1, lineage="job-b"))
    assert other_job[0].trace_id != first[0].trace_id


def test_prompts_stay_out_unless_content_is_on():
    model, refund = Model(), Refund()
    result = attempts(model, refund)
    off = spans_made(result.trace, identity())
    assert SECRET_PROMPT not in repr([span.attributes for span in off])
    model2, refund2 = Model(), Refund()
    store_on = _traced_with_content(model2, refund2)
    on = spans_made(store_on, identity(), content=True)
    assert any(SECRET_PROMPT in str(span.attributes.get(c.OI_INPUT_VALUE, "")) for span in on)


def _traced_with_content(model: Model, refund: Refund):
    agent = make_agent(model, refund)
    run = RunInput(KEY, key_group(KEY, "STRING", MAX_PARALLELISM), 1, {"order": "o-1"})
    return execute_run(agent, run, {}, trace=True, trace_content=True).trace


def test_the_sink_exports_with_the_derived_ids_under_the_service_name():
    model, refund = Model(), Refund()
    result = attempts(model, refund)
    exporter = InMemorySpanExporter()
    sink = SpanSink(TracingConfig(service_name="triage-svc"), agent="triage", exporter=exporter)
    spans = spans_made(result.trace, identity())
    sink.submit(lambda: spans, len(spans))
    assert sink.flush(5)
    sink.close()
    exported = exporter.get_finished_spans()
    assert [(s.context.trace_id, s.context.span_id) for s in exported] == [(s.trace_id, s.span_id) for s in spans]
    assert exported[0].resource.attributes["service.name"] == "triage-svc"
    assert exported[0].resource.attributes[c.OI_PROJECT_NAME] == "triage-svc"
    assert exported[0].instrumentation_scope.schema_url == c.SCHEMA_URL
    parents = {s.context.span_id: (s.parent.span_id if s.parent else None) for s in exported}
    assert parents == {s.span_id: s.parent_id for s in spans}
    assert sink.exported == len(spans) and sink.dropped == 0


class DownCollector(SpanExporter):
    """A collector that is down: every export fails."""

    def __init__(self):
        self.attempts = 0

    def export(self, spans):
        self.attempts += 1
        return SpanExportResult.FAILURE

    def shutdown(self):
        pass


def test_a_collector_that_is_down_drops_spans_with_a_count_and_a_full_queue_never_blocks(monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "10")  # sent without a flush
    model, refund = Model(), Refund()
    result = attempts(model, refund)
    spans = spans_made(result.trace, identity())
    collector = DownCollector()
    sink = SpanSink(TracingConfig(max_queued_spans=len(spans)), agent="triage", exporter=collector)
    sink.submit(lambda: spans, len(spans))
    sink.submit(lambda: spans, 1)  # the queue is full: dropped at once, counted
    assert sink.dropped == 1
    deadline = time.monotonic() + 5
    while sink.dropped < 1 + len(spans):
        assert time.monotonic() < deadline, sink.dropped
        time.sleep(0.01)  # polls the counter; the deadline bounds it
    assert collector.attempts == 1 and sink.exported == 0
    sink.close()
    sink.submit(lambda: spans, len(spans))  # after close: dropped at once
    assert sink.dropped == 1 + 2 * len(spans)


def test_an_upstream_traceparent_becomes_a_link_of_the_run_and_a_bad_one_is_ignored():
    upstream = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    agent = make_agent(Model(), Refund())
    group = key_group(KEY, "STRING", MAX_PARALLELISM)
    traced = execute_run(agent, RunInput(KEY, group, 1, {"order": "o-1"}, traceparent=upstream), {}, trace=True).trace
    spans = spans_made(traced, identity())
    assert spans[0].links == ((0x0af7651916cd43dd8448eb211c80319c, 0xb7ad6b7169203331),)
    assert spans[0].trace_id != 0x0af7651916cd43dd8448eb211c80319c  # a link: the run keeps its own trace
    exporter = InMemorySpanExporter()
    sink = SpanSink(TracingConfig(), agent="triage", exporter=exporter)
    sink.submit(lambda: spans, len(spans))
    assert sink.flush(5)
    sink.close()
    [link] = exporter.get_finished_spans()[0].links
    assert (link.context.trace_id, link.context.span_id) == spans[0].links[0]
    for bad in ("garbage", "00-xyz-abc-01", "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "",
                "00-00000000000000000000000000000000-b7ad6b7169203331-01"):
        traced = execute_run(agent, RunInput(KEY, group, 1, {"order": "o-1"}, traceparent=bad), {}, trace=True).trace
        assert spans_made(traced, identity())[0].links == ()


class BlockedDownCollector(DownCollector):
    """A collector that is down and whose exporter, once :attr:`stuck`, hangs in its retries until released."""

    def __init__(self):
        super().__init__()
        self.started, self.released, self.stuck = threading.Event(), threading.Event(), False

    def export(self, spans):
        self.started.set()
        if self.stuck:
            self.released.wait(60)  # stands for the exporter's own retries against a closed port
        return super().export(spans)


def test_a_flush_does_not_wait_for_exports_to_a_collector_found_down(monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "10")  # the second submit is sent without a flush
    model, refund = Model(), Refund()
    spans = spans_made(attempts(model, refund).trace, identity())
    collector = BlockedDownCollector()
    sink = SpanSink(TracingConfig(flush_timeout_s=30), agent="triage", exporter=collector)
    sink.submit(lambda: spans, len(spans))
    sink.flush(30)  # waits for the first export, which fails
    assert sink.collector_down and collector.attempts == 1
    collector.started.clear()
    collector.stuck = True
    sink.submit(lambda: spans, len(spans))
    assert collector.started.wait(5)
    begun = time.monotonic()
    assert not sink.flush(30)  # down: at once, not after the export, which hangs until released
    assert time.monotonic() - begun < 10 and not collector.released.is_set()
    collector.released.set()
    sink.close()
    assert sink.dropped == 2 * len(spans)


class Requests(SpanExporter):
    """A collector that takes every export and keeps each request's size."""

    def __init__(self):
        self.sizes: list[int] = []
        self.arrived = threading.Event()

    def export(self, spans):
        self.sizes.append(len(spans))
        self.arrived.set()
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass


def test_runs_handed_over_between_flushes_leave_in_one_request(monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")  # only the flush sends them
    spans = spans_made(attempts(Model(), Refund()).trace, identity())
    collector = Requests()
    sink = SpanSink(TracingConfig(), agent="triage", exporter=collector)
    for _ in range(20):
        sink.submit(lambda: spans, len(spans))
    assert sink.flush(5)
    assert collector.sizes == [20 * len(spans)]  # not a request per run
    sink.close()


class ComesBack(Requests):
    """A collector that is down for its first export, then takes every export."""

    def export(self, spans):
        if not self.sizes:
            self.sizes.append(0)
            return SpanExportResult.FAILURE
        return super().export(spans)


@pytest.mark.parametrize("found_down", [False, True])
def test_closing_sends_what_waits_for_its_batch(monkeypatch, found_down):
    """The exporter process closes its sink at the end of its input: the spans still gathering are sent, also with
    no flush timeout and to a collector found down before (it may be back)."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")
    spans = spans_made(attempts(Model(), Refund()).trace, identity())
    collector = ComesBack() if found_down else Requests()
    sink = SpanSink(TracingConfig(flush_timeout_s=0), agent="triage", exporter=collector)
    if found_down:
        sink.submit(lambda: spans, len(spans))
        sink.flush(30)
        assert sink.collector_down and sink.dropped == len(spans)
    sink.submit(lambda: spans, len(spans))
    sink.close()
    assert sink.exported == len(spans) and collector.sizes[-1] == len(spans)
    assert sink.dropped == (len(spans) if found_down else 0)


def test_a_full_batch_sends_without_a_flush(monkeypatch):
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "10")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")  # only the full batch can send it
    spans = spans_made(attempts(Model(), Refund()).trace, identity())
    collector = Requests()
    sink = SpanSink(TracingConfig(), agent="triage", exporter=collector)
    for _ in range(2):
        sink.submit(lambda: spans, len(spans))
    assert collector.arrived.wait(10)
    assert collector.sizes[0] == 2 * len(spans) == 10
    sink.close()


@pytest.mark.parametrize(("size", "delay_ms", "expected"), [(None, None, (512, 0.2)), ("64", "20", (64, 0.02)),
                                                            ("many", "-5", (512, 0.2))])
def test_the_batch_processors_variables_set_the_batches(monkeypatch, size, delay_ms, expected):
    from flink_agents_replay.traces.export import _batching

    for variable, value in (("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", size), ("OTEL_BSP_SCHEDULE_DELAY", delay_ms)):
        if value is None:
            monkeypatch.delenv(variable, raising=False)
        else:
            monkeypatch.setenv(variable, value)
    assert _batching() == expected


class Failing(Exception):
    """A refund that fails, with the prompt in its message (as a validation error quotes its input)."""


def test_the_first_attempts_executed_span_and_the_one_made_again_after_a_failure_are_one_span():
    store, codec = MemoryJournalStore(MAX_PARALLELISM), RecordCodec(b"0123456789abcdef0123", "triage")
    model, refund = Model(), Refund()
    agent = make_agent(model, refund)
    group = key_group(KEY, "STRING", MAX_PARALLELISM)
    run = RunInput(KEY, group, 1, {"order": "o-1"})

    def failing_refund(order):
        raise Failing(f"refund of {order} failed for {SECRET_PROMPT}")

    refund.invoke = failing_refund
    writer = JournalWriter(store, codec, Durability.PER_ACTION)
    first = execute_run(agent, run, {}, journal=writer.run_journal(group), trace=True, report_failures=True)
    writer.close()
    assert first.error is not None and model.calls == 1
    first_spans = spans_made(first.trace, identity(1))
    groups = range(MAX_PARALLELISM)
    index = read_recovery_index(store, codec, dict.fromkeys(groups, 0), store.end_offsets(list(groups)))
    del refund.invoke  # the refund works again: the failed call is made again, the model call reused
    writer = JournalWriter(store, codec, Durability.PER_ACTION)
    second = execute_run(agent, run, {}, history=index.history(key_digest(KEY)), journal=writer.run_journal(group),
                         trace=True)
    writer.close()
    assert model.calls == 1
    second_spans = spans_made(second.trace, identity(2))
    [executed] = [span for span in first_spans if span.name == "chat stub-model"]
    [remade] = [span for span in second_spans if span.name == "chat stub-model"]
    assert (remade.trace_id, remade.span_id, remade.start_ns) == (executed.trace_id, executed.span_id,
                                                                  executed.start_ns)
    assert any(span.name == "reused chat stub-model" for span in second_spans)
    # Content off: the failure's message (it holds the prompt) is in no span, its type is.
    shown = repr([(span.name, span.attributes, span.error) for span in first_spans])
    assert SECRET_PROMPT not in shown and "Failing" in shown


def test_the_job_lineage_is_kept_in_the_markers_and_read_back():
    from flink_agents_replay.storage.journal.markers import encode_marker, restored_lineage

    marker = encode_marker("topic-id", 0, {0: 5}, {0: 9}, {}, lineage="job-of-the-first-start")
    other = encode_marker("topic-id", 1, {1: 5}, {1: 9}, {})  # subtasks all keep it; a marker without one is fine
    assert restored_lineage([other, marker]) == "job-of-the-first-start"
    assert restored_lineage([other]) is None and restored_lineage([]) is None


@pytest.mark.parametrize("header, kept", [
    ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", True),
    ("00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01", False),  # the spec writes lower-case hex
    ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" + "x" * 10_000, False),
    ("not a traceparent", False), (None, False)])
def test_only_a_well_formed_traceparent_header_is_kept(header, kept):
    from flink_agents_replay.traces.ids import well_formed_traceparent

    kept_as = well_formed_traceparent(header)
    assert (kept_as == header) is kept if header is not None else kept_as is None


def test_tracing_without_the_exporter_installed_is_a_clear_error(monkeypatch):
    import importlib.util

    from flink_agents_replay.core.errors import ConfigError
    from flink_agents_replay.flink.config import AgentConfig

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name.startswith("opentelemetry.exporter") else real(name, *args))
    with pytest.raises(ConfigError, match=r"flink-agents-replay\[tracing\]"):
        AgentConfig(journal_enabled=False, tracing=True).resolved("triage")
    with pytest.raises(ConfigError, match="tracing setting 'headers'") as raised:
        monkeypatch.setattr(importlib.util, "find_spec", real)
        AgentConfig(journal_enabled=False, tracing={"headers": "Authorization=Bearer sk-secret"}).resolved("triage")
    assert "sk-secret" not in str(raised.value)


@pytest.mark.parametrize("setting, named", [
    ({"endpoint": "not a url"}, "endpoint"), ({"endpoint": "ftp://127.0.0.1:21"}, "endpoint"),
    ({"endpoint": "127.0.0.1:4318"}, "endpoint"), ({"endpoint": ""}, "endpoint"),
    ({"endpoint": "http://127.0.0.1:99999"}, "endpoint"),
    ({"headers": {"x-token": "a\r\nInjected: 1"}}, "headers"), ({"flush_timeout_s": float("inf")}, "flush_timeout_s"),
    ({"export_timeout_s": float("nan")}, "export_timeout_s"), ({"flush_timeout_s": 10_000}, "flush_timeout_s")])
def test_a_bad_tracing_setting_is_a_config_error_naming_it(setting, named):
    from flink_agents_replay.core.errors import ConfigError
    from flink_agents_replay.flink.config import AgentConfig

    with pytest.raises(ConfigError, match=f"tracing setting '{named}"):
        AgentConfig(journal_enabled=False, tracing=setting).resolved("triage")


def test_a_sub_agents_model_call_is_made_again_under_its_caller_when_the_sub_agent_call_is_reused_whole():
    """The sub-agent ran in the first attempt (its model call executed and journaled); the caller's next call failed
    the action. The second attempt reuses the sub-agent call whole (the sub-agent does not run): the model call it
    made appears once as executed, with the id the first attempt gave it, under the calling action."""
    model, refund = Model(), Refund()

    class Summary(Agent):
        name = "summ"

        @action(InputEvent)
        def summarize(event, ctx):
            ctx.send_event(OutputEvent(ctx.call("model", event.input)))

    class Caller(Agent):
        name = "triage"

        @action(InputEvent)
        def handle(event, ctx):
            [summary] = ctx.call_agents([("summ", SECRET_PROMPT)])
            ctx.send_event(OutputEvent({"summary": summary, "refund": ctx.call("refund", event.input["order"])}))

    agent = Caller(name="triage", resources={"refund": refund},
                   sub_agents=[Summary(name="summ", resources={"model": model})])
    store, codec = MemoryJournalStore(MAX_PARALLELISM), RecordCodec(b"0123456789abcdef0123", "triage")
    group = key_group(KEY, "STRING", MAX_PARALLELISM)
    run = RunInput(KEY, group, 1, {"order": "o-1"})

    def failing_refund(order):
        raise Failing(order)

    refund.invoke = failing_refund
    writer = JournalWriter(store, codec, Durability.PER_ACTION)
    first = execute_run(agent, run, {}, journal=writer.run_journal(group), trace=True, report_failures=True)
    writer.close()
    del refund.invoke
    groups = range(MAX_PARALLELISM)
    index = read_recovery_index(store, codec, dict.fromkeys(groups, 0), store.end_offsets(list(groups)))
    writer = JournalWriter(store, codec, Durability.PER_ACTION)
    second = execute_run(agent, run, {}, history=index.history(key_digest(KEY)), journal=writer.run_journal(group),
                         trace=True)
    writer.close()
    assert model.calls == 1 and first.error is not None and second.error is None  # the sub-agent ran once
    [executed] = [span for span in spans_made(first.trace, identity(1)) if span.name == "chat stub-model"]
    spans = spans_made(second.trace, identity(2))
    [remade] = [span for span in spans if span.name == "chat stub-model"]
    assert (remade.span_id, remade.start_ns) == (executed.span_id, executed.start_ns)
    assert remade.attributes[c.GEN_AI_USAGE_INPUT_TOKENS] == 11
    calling = next(span for span in spans if span.name == "action handle")
    assert remade.parent_id == calling.span_id
    [reused] = [span for span in spans if span.name == "reused invoke_agent summ"]
    assert c.GEN_AI_OPERATION_NAME not in reused.attributes and c.FA_ORIGINAL_START_MS in reused.attributes


def test_a_model_call_without_counts_has_no_token_attributes_rather_than_zero():
    class Uncounted(Model):
        def invoke(self, prompt):
            report_call(model="stub-model", prompt_tokens=None, completion_tokens="many")
            return "reply"

    agent = make_agent(Uncounted(), Refund())
    run = RunInput(KEY, key_group(KEY, "STRING", MAX_PARALLELISM), 1, {"order": "o-1"})
    [chat] = [span for span in spans_made(execute_run(agent, run, {}, trace=True).trace, identity())
              if span.name == "chat stub-model"]
    assert chat.attributes[c.GEN_AI_OPERATION_NAME] == "chat"
    assert not {c.GEN_AI_USAGE_INPUT_TOKENS, c.GEN_AI_USAGE_OUTPUT_TOKENS, c.OI_TOKENS_TOTAL} & set(chat.attributes)
