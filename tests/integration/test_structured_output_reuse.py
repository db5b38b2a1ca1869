"""Structured output survives a failover as the same object: real Kafka, a Flink MiniCluster, the local model service.

Each ticket's action asks the model for a pydantic ``Triage`` (``response_format=Triage``), then files it with a
tool that fails once per ticket (counted in a SQLite file outside the worker): the exception leaves the action,
the task fails and Flink restarts it, and the recovered run reuses the model call from the journal. Checked:
every output equals a failure-free run's; each ticket's filing failed once (the fault hit, after the model
call); the model service executed one request per ticket (none was asked again, none answered from its
idempotency store); and what the action received on the recovered attempt was a ``Triage`` equal to the first.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from typing import Literal

import pydantic
import pytest

from flink_agents_replay import Agent, ChatModel, InputEvent, OutputEvent, Tool, action
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import make_inputs, produce_inputs, reference_outputs, run_agent_job

pytestmark = pytest.mark.integration


class Triage(pydantic.BaseModel):
    category: Literal["refund", "shipping", "account"]
    urgent: bool
    summary: str


class Structured(Agent):
    @action(InputEvent)
    def triage(event, ctx):
        text = f"ticket {event.input['n']} of {event.input['key']}: my parcel shipping is late"
        result = ctx.call("llm", messages=[{"role": "user", "content": text}], response_format=Triage)
        triage = result.parsed
        ctx.call("file", f"{event.input['key']}|{event.input['n']}", type(triage).__name__,
                 triage.model_dump_json())
        ctx.send_event(OutputEvent(output={"n": event.input["n"], **triage.model_dump()}))


def filing(counter: InvocationCounter, *, fail_once: bool):
    def file(ticket: str, received_type: str, received: str) -> str:
        counter.increment(f"received:{ticket}:{received_type}:{received}")
        if fail_once and counter.increment(f"attempt:{ticket}") == 1:
            raise RuntimeError(f"the filing service failed for {ticket}")
        return "filed"
    return Tool(file, side_effects="idempotent")


def agent(base_url: str, counter: InvocationCounter, *, fail_once: bool) -> Structured:
    return Structured(name="structured", resources={
        "llm": ChatModel("stub-model", base_url=base_url, api_key="unused"),
        "file": filing(counter, fail_once=fail_once)})


def test_a_structured_reply_is_reused_after_a_failover_as_the_same_object(kafka_bootstrap, model_server, tmp_path):
    inputs = make_inputs(keys=3, per_key=4)
    reference = reference_outputs(agent(model_server().base_url, InvocationCounter(tmp_path / "ref.db"),
                                        fail_once=False), inputs)
    server, counter = model_server(), InvocationCounter(tmp_path / "calls.db")
    config = {"kafka": {"bootstrap.servers": kafka_bootstrap}, "journal_topic": f"journal-{uuid.uuid4().hex[:8]}",
              "signing_key": "structured-output-signing-key", "max_concurrent_runs": 4}
    outputs = run_agent_job(kafka_bootstrap, produce_inputs(kafka_bootstrap, inputs),
                            agent(server.base_url, counter, fail_once=True), config,
                            restart_attempts=len(inputs) + 2)
    assert Counter(outputs) == reference
    counts = counter.counts()
    tickets = [f"{r['key']}|{r['n']}" for r in inputs]
    assert all(counts[f"attempt:{t}"] == 2 for t in tickets), counts  # the fault hit every ticket, once
    received = [name for name in counts if name.startswith("received:")]
    # Both attempts of each ticket received a Triage with the same fields: one distinct value per ticket.
    assert len(received) == len(tickets) and all(":Triage:" in name for name in received), received
    assert all(counts[name] == 2 for name in received)
    assert all(json.loads(name.split(":Triage:", 1)[1])["category"] == "shipping" for name in received)
    stats = server.stats()
    assert (stats.chat, stats.repeated, stats.idempotent_replays) == (len(inputs), 0, 0), stats
