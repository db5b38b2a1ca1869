"""Test job for ``flink run -py``: Kafka inputs -> an agent whose tool loop refunds through an MCP server -> outputs.

Each input ``{"key": ..., "n": ...}`` is a ticket asking for a refund of order ``O-<digits>``
(:func:`ticket_text`). The agent runs one tool loop (:func:`flink_agents_replay.api.tool_loop.run_tool_loop`)
against the local model service with one tool, the MCP orders server's ``issue_refund``
(``local/mcp_orders_server.py`` over streamable HTTP, listed here in the job's client process by
:func:`~flink_agents_replay.api.mcp_tools.mcp_tools`: ``external``, ``in_doubt='rerun'``, the call id in the
request's ``_meta``). Turn 1 asks for the refund (the service fills ``order_id`` by the schema's pattern and
``amount`` from the number in the text), the tool runs on the server, turn 2 answers.

Counted outside the worker, in an :class:`~flink_agents_replay.testing.counter.InvocationCounter` file: each model
turn ``turn:<k>:<ticket>`` when its request starts and ``answered:<k>:<ticket>`` when it returns, and
``refund-answered:<order>`` when the MCP tool's answer reached the worker. The server counts the refunds itself
(its SQLite file: every request with its ``_meta`` key and whether it took effect). Used by
``tests/integration/test_mcp_sigkill.py``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import uuid

from pyflink.common import Types

from flink_agents_replay import Agent, ChatModel, InputEvent, OutputEvent, action, run_tool_loop
from flink_agents_replay.api.mcp_tools import McpServer, mcp_tools
from flink_agents_replay.flink.env import create_environment
from flink_agents_replay.flink.pipeline import connect_to_agent
from flink_agents_replay.local.jars import kafka_connector_jar
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import canonical_output, exactly_once_string_sink, keyed_json_inputs

SYSTEM_PROMPT = "You handle refund requests. Pay refunds with the issue_refund tool, then tell the customer."
_TICKET = re.compile(r"Ticket (\d+) of (key-\d+)\.")


def order_of(key: str, n: int) -> str:
    """The order a ticket names: one per ticket (keys are ``key-<k>``)."""
    return f"O-{int(key.rsplit('-', 1)[1]) * 1000 + n:05d}"


def amount_of(n: int) -> int:
    return 20 + n


def ticket_text(key: str, n: int) -> str:
    # The amount is the text's first number (the key's digits and the order's are parts of words).
    return f"Please refund {amount_of(n)} for order {order_of(key, n)}. Ticket {n} of {key}."


class CountedModel(ChatModel):
    """The chat model, counting each turn's request in the counter file (before and after)."""

    def __init__(self, *args, counter: InvocationCounter, **kwargs):
        super().__init__(*args, **kwargs)
        self.counter = counter

    def invoke(self, *args, messages=None, **kwargs):
        [user] = [message["content"] for message in messages if message["role"] == "user"]
        ticket = _TICKET.search(user)
        name = f"{ticket.group(2)}|{ticket.group(1)}"
        turn = 1 + sum(1 for m in messages if m["role"] == "assistant")
        self.counter.increment(f"turn:{turn}:{name}")
        result = super().invoke(*args, messages=messages, **kwargs)
        self.counter.increment(f"answered:{turn}:{name}")
        return result


class CountedAnswers:
    """An MCP tool's call (:class:`~flink_agents_replay.api.mcp_tools.McpCall`), counting each answer that reached
    the worker: a refund the server made and whose answer is not counted was cut short in its call (in doubt)."""

    def __init__(self, call, counter: InvocationCounter):
        self.call, self.counter = call, counter

    def __call__(self, *args, **arguments):
        result = self.call(*args, **arguments)
        self.counter.increment(f"refund-answered:{arguments.get('order_id')}")
        return result


class Refunds(Agent):
    @action(InputEvent)
    def refund(event, ctx):
        key, n = event.input["key"], event.input["n"]
        done = run_tool_loop(ctx, "llm", messages=[{"role": "system", "content": SYSTEM_PROMPT},
                                                    {"role": "user", "content": ticket_text(key, n)}],
                             tools=["issue_refund"], max_turns=3)
        ctx.send_event(OutputEvent(output={"n": n, "turns": done.turns, "reply": done.content,
                                           "refunds": [result for _, result in done.tool_calls]}))


def refund_agent(*, model_url: str, server: McpServer, counter: InvocationCounter, name: str,
                 timeout_s: float | None = None) -> Refunds:
    """The agent, its MCP tools listed now from ``server`` (``external`` by default); ``timeout_s`` bounds a call."""
    tools = mcp_tools(server, timeout_s=timeout_s)
    refund = tools["issue_refund"]
    assert refund.side_effects.value == "external", refund  # the default for an MCP tool
    refund.function = CountedAnswers(refund.function, counter)
    model = CountedModel("stub-model", base_url=model_url, api_key="unused", counter=counter)
    return Refunds(name=name, resources={"llm": model, **tools})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for option in ("bootstrap-servers", "input-topic", "output-topic", "journal-topic", "counter-path",
                   "signing-key", "model-url", "agent-name", "mcp-url"):
        parser.add_argument(f"--{option}", required=True)
    parser.add_argument("--mcp-timeout-s", type=float, default=None)
    parser.add_argument("--checkpoint-interval-ms", type=int, default=2000)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = create_environment(parallelism=1, checkpoint_interval_ms=args.checkpoint_interval_ms, restart_attempts=5,
                             restart_delay_ms=500, jars=[kafka_connector_jar()])
    keyed = keyed_json_inputs(env, args.bootstrap_servers, args.input_topic)
    agent = refund_agent(model_url=args.model_url, server=McpServer(url=args.mcp_url),
                         counter=InvocationCounter(args.counter_path), name=args.agent_name,
                         timeout_s=args.mcp_timeout_s)
    config = {"kafka": {"bootstrap.servers": args.bootstrap_servers}, "journal_topic": args.journal_topic,
              "signing_key": args.signing_key, "max_concurrent_runs": 8}
    sink = exactly_once_string_sink(args.bootstrap_servers, args.output_topic, f"mcploop-{uuid.uuid4().hex[:8]}")
    (connect_to_agent(keyed, agent, config)
     .map(lambda output: json.dumps(canonical_output(output)), output_type=Types.STRING())
     .uid("mcploop/serialize").sink_to(sink).uid("mcploop/sink"))
    env.execute(f"mcp tool loop job {args.agent_name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
