"""Test job for ``flink run -py``: Kafka inputs -> an agent whose model calls a tool in a loop -> exactly-once outputs.

Each input ``{"key": ..., "n": ...}`` is a ticket naming order ``O-<5 digits>``. The agent runs one tool loop
(:func:`flink_agents_replay.api.tool_loop.run_tool_loop`) against the local model service: turn 1 asks for the
``find_order`` tool (the service fills ``order_id`` from the ticket's text by the tool's pattern), the tool
runs, turn 2 answers. Both sides count themselves in an
:class:`~flink_agents_replay.testing.counter.InvocationCounter` file, outside the worker: the tool
``tool:<order>`` and ``tool-id:<order>|<call id>``, each model turn ``turn:<k>:<ticket>`` when its request
starts and ``answered:<k>:<ticket>`` when it returns. A ticket whose tool ran and whose turn 2 has not answered
is *between a tool call and the next model turn*. Used by ``tests/integration/test_tool_loop_sigkill.py``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import uuid
from typing import Annotated

from pydantic import Field
from pyflink.common import Types

from flink_agents_replay import (
    Agent,
    ChatModel,
    InputEvent,
    OutputEvent,
    action,
    current_call_id,
    run_tool_loop,
    tool,
)
from flink_agents_replay.flink.env import create_environment
from flink_agents_replay.flink.pipeline import connect_to_agent
from flink_agents_replay.local.jars import kafka_connector_jar
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import canonical_output, exactly_once_string_sink, keyed_json_inputs


def order_of(key: str, n: int) -> str:
    """The order a ticket names: one per ticket (keys are ``key-<k>``)."""
    return f"O-{int(key.rsplit('-', 1)[1]) * 1000 + n:05d}"


def ticket_text(key: str, n: int) -> str:
    return f"Ticket {n} of {key}: where is my order {order_of(key, n)}?"


class CountedModel(ChatModel):
    """The chat model, counting each turn's request in the counter file (before and after)."""

    def __init__(self, *args, counter: InvocationCounter, **kwargs):
        super().__init__(*args, **kwargs)
        self.counter = counter

    def invoke(self, *args, messages=None, **kwargs):
        ticket = re.search(r"Ticket (\d+) of (\S+):", messages[0]["content"])
        name = f"{ticket.group(2)}|{ticket.group(1)}"
        turn = 1 + sum(1 for m in messages if m["role"] == "assistant")
        self.counter.increment(f"turn:{turn}:{name}")
        result = super().invoke(*args, messages=messages, **kwargs)
        self.counter.increment(f"answered:{turn}:{name}")
        return result


class Support(Agent):
    @action(InputEvent)
    def answer(event, ctx):
        key, n = event.input["key"], event.input["n"]
        done = run_tool_loop(ctx, "llm", messages=[{"role": "user", "content": ticket_text(key, n)}],
                             tools=["find_order"], max_turns=3)
        # The loop's result kept in memory as it is (a package object in the user's state, restored by name in
        # a new TaskManager after the kill), read back by the key's next ticket.
        previous = ctx.memory.get("last_loop")
        ctx.memory.set("last_loop", done)
        ctx.send_event(OutputEvent(output={"n": n, "turns": done.turns, "reply": done.content,
                                           "orders": [result for _, result in done.tool_calls],
                                           "previous": _summary(previous)}))


def _summary(loop):
    if loop is None:
        return None
    return {"turns": loop.turns, "tools": [call.name for call, _ in loop.tool_calls],
            "tokens": loop.final.usage.total_tokens, "type": type(loop).__name__}


def find_order_tool(counter: InvocationCounter):
    def find_order(order_id: Annotated[str, Field(pattern=r"O-\d{5}")]) -> dict:
        """Find an order by its id.

        Args:
            order_id: the order's id, O- and five digits.
        """
        # Counted per order and per (order, call id): a tool made again in doubt after the kill keeps its call
        # id, which is what lets an idempotent service apply it once.
        counter.increment(f"tool:{order_id}")
        counter.increment(f"tool-id:{order_id}|{current_call_id()}")
        return {"order_id": order_id, "status": "in transit"}
    return tool(find_order, side_effects="external")  # in doubt after a crash: made again (its policy: rerun)


def support_agent(*, model_url: str, counter: InvocationCounter, name: str) -> Support:
    model = CountedModel("stub-model", base_url=model_url, api_key="unused", counter=counter)
    return Support(name=name, resources={"llm": model, "find_order": find_order_tool(counter)})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for option in ("bootstrap-servers", "input-topic", "output-topic", "journal-topic", "counter-path",
                   "signing-key", "model-url", "agent-name"):
        parser.add_argument(f"--{option}", required=True)
    parser.add_argument("--checkpoint-interval-ms", type=int, default=2000)
    parser.add_argument("--otlp-endpoint", default=None, help="trace the runs to this OTLP/HTTP receiver")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = create_environment(parallelism=1, checkpoint_interval_ms=args.checkpoint_interval_ms, restart_attempts=3,
                             restart_delay_ms=500, jars=[kafka_connector_jar()])
    keyed = keyed_json_inputs(env, args.bootstrap_servers, args.input_topic)
    agent = support_agent(model_url=args.model_url, counter=InvocationCounter(args.counter_path), name=args.agent_name)
    config = {"kafka": {"bootstrap.servers": args.bootstrap_servers}, "journal_topic": args.journal_topic,
              "signing_key": args.signing_key, "max_concurrent_runs": 8}
    if args.otlp_endpoint:
        config["tracing"] = {"endpoint": args.otlp_endpoint, "service_name": args.agent_name}
    sink = exactly_once_string_sink(args.bootstrap_servers, args.output_topic, f"toolloop-{uuid.uuid4().hex[:8]}")
    (connect_to_agent(keyed, agent, config)
     .map(lambda output: json.dumps(canonical_output(output)), output_type=Types.STRING())
     .uid("toolloop/serialize").sink_to(sink).uid("toolloop/sink"))
    env.execute(f"tool loop job {args.agent_name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
