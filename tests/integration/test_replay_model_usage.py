"""A replay with a changed model reports what it costs: token, latency and cost deltas against production's, checked
against the numbers the local model service itself reported. Real Kafka, Flink MiniCluster jobs, the local service.

Production (capture on) answers tickets with ``stub-model``; after a savepoint it answers more. A replay from the
savepoint answers those again with ``stub-model-verbose`` (longer replies) sent with a 40 ms delay per request
(a slower model), calls live. The service counts the tokens it reported while each side ran; the replay report's
usage must equal them, its latencies must show the slower model, and its costs follow the price table.

Both jobs trace to an OTLP/HTTP receiver in this process (issue 37): the diff names each run's production and replay
trace ids, each the trace of a run span its own job exported, production's under the agent's service and the
replay's under ``<service>-replay``, and the text report links both.
"""

from __future__ import annotations

import json
import sys
import time
import uuid

import cloudpickle
import pytest
from pyflink.common import Types

from flink_agents_replay import Agent, ChatModel, InputEvent, OutputEvent, action
from flink_agents_replay.flink.config import default_uid
from flink_agents_replay.flink.env import create_environment
from flink_agents_replay.flink.pipeline import connect_to_agent
from flink_agents_replay.integrations.kafka.admin import ensure_topics
from flink_agents_replay.local.jars import kafka_connector_jar
from flink_agents_replay.local.model_server import VERBOSE_MODEL_NAME, StubModelServer
from flink_agents_replay.replay.diff import TraceViewer
from flink_agents_replay.replay.job import captured_inputs, prepare_replay, replay_config
from flink_agents_replay.replay.report import diff_captures
from flink_agents_replay.replay.usage import Price
from flink_agents_replay.testing.committed import CommittedReader
from flink_agents_replay.testing.jobs import (
    exactly_once_string_sink,
    keyed_json_inputs,
    produce_json,
    running_job,
    trigger_savepoint,
    wait_until,
)
from flink_agents_replay.traces.export import TracingConfig
from tests.harness.otlp_receiver import Receiver

pytestmark = pytest.mark.integration

SIGNING_KEY = "replay-model-usage-signing-key-0123456789"
MAX_PARALLELISM = 8
AGENT_NAME = "usage-triage"
PRICES = {"stub-model": Price(0.15, 0.60), VERBOSE_MODEL_NAME: Price(2.50, 10.0)}
BEFORE = [{"key": f"c{k}", "n": n, "text": f"my parcel {n} is late, customer {k}"} for n in range(2) for k in range(4)]
AFTER = [{"key": f"c{k}", "n": n, "text": f"refund for order {n} please, customer {k}"}
         for n in range(2, 5) for k in range(4)]


class Answering(Agent):
    @action(InputEvent)
    def answer(event, ctx):
        result = ctx.call("llm", messages=[{"role": "user", "content": event.input["text"]}])
        ctx.send_event(OutputEvent(output={"n": event.input["n"], "reply": result.content}))


def agent(base_url: str, model: str, delay_ms: int = 0) -> Answering:
    headers = {"X-Stub-Delay-Ms": str(delay_ms)} if delay_ms else None
    return Answering(name=AGENT_NAME, resources={"llm": ChatModel(model, base_url=base_url, api_key="unused",
                                                                  default_headers=headers)})



def _answer(output) -> str:
    return json.dumps({"key": output.key, **output.output}, sort_keys=True)


def _tokens(before, after) -> tuple[int, int, int]:
    return (after.chat - before.chat, after.prompt_tokens - before.prompt_tokens,
            after.completion_tokens - before.completion_tokens)


RUN_SPAN = f"invoke_agent {AGENT_NAME}"


@pytest.fixture(scope="module")
def receiver():
    server = Receiver()
    yield server
    server.close()


def _run_traces(receiver: Receiver, report) -> dict[str, set[str]]:
    """The trace ids of the run spans the receiver got, per service, once every compared run's span of both sides is
    in (the last spans leave when a job's exporter process is closed), or what it has after 60 s."""
    wanted = {run.production_trace_id for run in report.runs} | {run.replay_trace_id for run in report.runs}
    deadline = time.monotonic() + 60
    while True:
        traces = receiver.services(RUN_SPAN)
        if wanted <= set().union(*traces.values()) or time.monotonic() > deadline:
            return traces
        time.sleep(0.05)  # polling the receiver, which has no signal to wait on


@pytest.fixture(scope="module")
def replayed(kafka_bootstrap, tmp_path_factory, receiver):
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    suffix = uuid.uuid4().hex[:8]
    kafka = {"bootstrap.servers": kafka_bootstrap}
    input_topic, output_topic, replay_out = f"usage-in-{suffix}", f"usage-out-{suffix}", f"usage-replay-{suffix}"
    ensure_topics(kafka_bootstrap, [input_topic, output_topic, replay_out], 1)
    config = {"kafka": kafka, "signing_key": SIGNING_KEY, "journal_topic": f"usage-journal-{suffix}",
              "capture": True, "capture_topic": f"usage-capture-{suffix}", "output_topics": [output_topic],
              "max_parallelism": MAX_PARALLELISM, "tracing": TracingConfig(endpoint=receiver.endpoint)}
    with StubModelServer() as server:
        env = create_environment(parallelism=2, checkpoint_interval_ms=400, jars=[kafka_connector_jar()])
        outputs = connect_to_agent(keyed_json_inputs(env, kafka_bootstrap, input_topic), agent(server.base_url,
                                                                                               "stub-model"), config)
        outputs.map(_answer, output_type=Types.STRING()).sink_to(
            exactly_once_string_sink(kafka_bootstrap, output_topic, f"usage-prod-{suffix}")).uid("outputs")
        produce_json(kafka_bootstrap, input_topic, BEFORE)
        with CommittedReader(kafka_bootstrap, output_topic, json.loads) as reader, \
                running_job(env, "production") as client:
            wait_until(client, lambda: len(reader.poll(0.1)) >= len(BEFORE), "the answers before the savepoint")
            savepoint = trigger_savepoint(client, tmp_path_factory.mktemp("savepoints"))
            at_savepoint = server.stats()
            produce_json(kafka_bootstrap, input_topic, AFTER)
            wait_until(client, lambda: len(reader.poll(0.1)) >= len(BEFORE + AFTER), "every answer", 180)
            production = _tokens(at_savepoint, server.stats())

        uid = default_uid(AGENT_NAME)
        settings = prepare_replay(kafka, config["capture_topic"], savepoint, uid=uid, key_type="STRING",
                                  max_parallelism=MAX_PARALLELISM, policies={"llm": "live"})
        capture_topic = f"{config['capture_topic']}.replay-verbose"
        env = create_environment(parallelism=2, checkpoint_interval_ms=400, jars=[kafka_connector_jar()], config={
            "execution.savepoint.path": savepoint, "execution.savepoint.ignore-unclaimed-state": "true"})
        inputs = captured_inputs(env, kafka, settings, SIGNING_KEY.encode(), uid=uid, key_type="STRING")
        replay = replay_config(config, settings, journal_topic=f"{config['journal_topic']}.replay",
                               capture_topic=capture_topic, output_topics=[replay_out])
        changed = agent(server.base_url, VERBOSE_MODEL_NAME, delay_ms=40)
        connect_to_agent(inputs, changed, replay).map(_answer, output_type=Types.STRING()).sink_to(
            exactly_once_string_sink(kafka_bootstrap, replay_out, f"usage-replay-{suffix}")).uid("replay-out")
        before_replay = server.stats()
        env.execute("replay with a verbose, slower model")
        replay_tokens = _tokens(before_replay, server.stats())
    report = diff_captures(kafka, config["capture_topic"], capture_topic, signing_key=SIGNING_KEY.encode(), uid=uid,
                           prices=PRICES)
    return report, production, replay_tokens, _run_traces(receiver, report)


def test_the_usage_of_each_side_is_what_the_model_service_reported(replayed):
    report, (prod_calls, prod_prompt, prod_completion), (replay_calls, replay_prompt, replay_completion), _ = replayed
    assert report.summary["compared"] == len(AFTER) and prod_calls == replay_calls == len(AFTER)
    usage = report.usage
    assert (usage.production.calls, usage.production.prompt_tokens, usage.production.completion_tokens) == (
        prod_calls, prod_prompt, prod_completion)
    assert (usage.replay.calls, usage.replay.prompt_tokens, usage.replay.completion_tokens) == (
        replay_calls, replay_prompt, replay_completion)
    assert replay_prompt == prod_prompt and replay_completion == prod_completion + 14 * len(AFTER)  # verbose


def test_the_report_shows_the_slower_model_and_what_the_change_costs(replayed):
    report, (_, prod_prompt, prod_completion), (_, replay_prompt, replay_completion), _ = replayed
    usage = report.usage
    # The service waited 40 ms before every replay request (production's speed depends on the machine's load).
    assert min(usage.replay.latencies_ms) >= 40 and usage.replay.p95_ms >= usage.replay.p50_ms >= 40
    assert usage.delta()["latency_p50_ms"] == pytest.approx(usage.replay.p50_ms - usage.production.p50_ms)
    assert usage.production.cost_usd == pytest.approx((prod_prompt * 0.15 + prod_completion * 0.60) / 1e6)
    assert usage.replay.cost_usd == pytest.approx((replay_prompt * 2.50 + replay_completion * 10.0) / 1e6)
    delta = usage.delta()
    assert delta["completion_tokens"] == 14 * len(AFTER) and delta["prompt_tokens"] == 0
    assert delta["cost_usd"] == pytest.approx(usage.replay.cost_usd - usage.production.cost_usd)
    text = report.render_text()
    assert "Model usage" in text and "completion tokens" in text and "cost USD" in text
    assert all(run.production_usage.calls == 1 and run.replay_usage.calls == 1 for run in report.runs)
    assert report.to_json()["usage"]["delta"]["completion_tokens"] == 14 * len(AFTER)


def test_the_diff_names_both_traces_of_each_run_each_exported_by_its_own_job(replayed):
    report, _, _, traces = replayed
    service = TracingConfig().service(AGENT_NAME)  # the agent's name, or $OTEL_SERVICE_NAME
    assert set(traces) == {service, f"{service}-replay"}, traces  # a replay traces under a service of its own
    production = [run.production_trace_id for run in report.runs]
    replay = [run.replay_trace_id for run in report.runs]
    assert len(report.runs) == len(AFTER) and all(production) and all(replay)
    assert len(set(production)) == len(set(replay)) == len(AFTER) and not set(production) & set(replay)
    assert set(production) <= traces[service] and set(replay) <= traces[f"{service}-replay"]
    as_json = [(run["production_trace_id"], run["replay_trace_id"]) for run in report.to_json()["runs"]]
    assert as_json == list(zip(production, replay, strict=True))
    text = report.render_text(trace_viewer=TraceViewer("http://jaeger:16686/trace/{trace_id}"))
    assert all(f"http://jaeger:16686/trace/{trace_id}" in text for trace_id in production + replay)
