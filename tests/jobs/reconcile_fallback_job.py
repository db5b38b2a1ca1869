"""Test job for ``flink run -py``: a model with a fallback, then a refund at a service without idempotency keys,
whose calls in doubt a reconciler settles.

Each input ``{"key": ..., "n": ...}`` is a ticket about order ``O-<5 digits>``. The agent asks a
:class:`~flink_agents_replay.FallbackChatModel` (a primary and a fallback local model service, no SDK retries) for
the ticket's category, then calls ``refund``, an ``external`` tool standing for a payment service that keeps no
idempotency keys: every execution pays (``refund:<order>`` in an
:class:`~flink_agents_replay.testing.counter.InvocationCounter` file, outside the worker, with
``paid:<call id>``), then the answer takes ``--refund-delay-ms`` to come back (``returned:<order>``). A refund
whose payment is counted and whose answer is not is *in doubt* if the process dies then. Its reconciler asks the
"payment service" (the counter file) whether that call id paid: done (``reconciled:done:<order>``) or not
(``reconciled:not-done:<order>``). Used by ``tests/integration/test_reconcile_fallback_sigkill.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid

from pyflink.common import Types

from flink_agents_replay import (
    NOT_DONE,
    Agent,
    ChatModel,
    FallbackChatModel,
    InDoubtCall,
    InputEvent,
    OutputEvent,
    Tool,
    action,
    current_call_id,
)
from flink_agents_replay.flink.env import create_environment
from flink_agents_replay.flink.pipeline import connect_to_agent
from flink_agents_replay.local.jars import kafka_connector_jar
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import canonical_output, exactly_once_string_sink, keyed_json_inputs


def order_of(key: str, n: int) -> str:
    return f"O-{int(key.rsplit('-', 1)[1]) * 1000 + n:05d}"


class Refunds:
    """The payment service's two sides: paying (no idempotency key) and looking a payment up by reference."""

    def __init__(self, counter: InvocationCounter, delay_ms: int):
        self.counter, self.delay_ms = counter, delay_ms

    def refund(self, order_id: str, amount: int) -> dict:
        reference = current_call_id()
        self.counter.increment(f"refund:{order_id}")
        self.counter.increment(f"paid:{reference}")
        time.sleep(self.delay_ms / 1000)  # the answer is slow to come back: the window of a call in doubt
        self.counter.increment(f"returned:{order_id}")
        return {"order_id": order_id, "amount": amount, "status": "paid"}

    def reconcile(self, call: InDoubtCall):
        order_id = call.arguments["order_id"]
        if self.counter.count(f"paid:{call.call_id}"):
            self.counter.increment(f"reconciled:done:{order_id}")
            return {"order_id": order_id, "amount": call.arguments["amount"], "status": "paid"}
        self.counter.increment(f"reconciled:not-done:{order_id}")
        return NOT_DONE


class Triage(Agent):
    @action(InputEvent)
    def answer(event, ctx):
        key, n = event.input["key"], event.input["n"]
        order = order_of(key, n)
        reply = ctx.call("llm", messages=[{"role": "user", "content": (
            f"Categories: billing, shipping\nTicket {n} of {key}: refund my billing for {order}")}])
        refund = ctx.call("refund", order_id=order, amount=10 + n)
        ctx.send_event(OutputEvent(output={"n": n, "category": reply.content, "refund": refund}))


def triage_agent(*, primary_url: str, fallback_url: str, counter: InvocationCounter, name: str,
                 refund_delay_ms: int = 0) -> Triage:
    llm = FallbackChatModel([ChatModel("model-a", base_url=primary_url, api_key="unused", max_retries=0),
                             ChatModel("model-b", base_url=fallback_url, api_key="unused", max_retries=0)])
    refunds = Refunds(counter, refund_delay_ms)
    return Triage(name=name, resources={"llm": llm, "refund": Tool(refunds.refund, in_doubt=refunds.reconcile)})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for option in ("bootstrap-servers", "input-topic", "output-topic", "journal-topic", "counter-path",
                   "signing-key", "primary-url", "fallback-url", "agent-name"):
        parser.add_argument(f"--{option}", required=True)
    parser.add_argument("--refund-delay-ms", type=int, default=800)
    parser.add_argument("--checkpoint-interval-ms", type=int, default=2000)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = create_environment(parallelism=1, checkpoint_interval_ms=args.checkpoint_interval_ms, restart_attempts=3,
                             restart_delay_ms=500, jars=[kafka_connector_jar()])
    keyed = keyed_json_inputs(env, args.bootstrap_servers, args.input_topic)
    agent = triage_agent(primary_url=args.primary_url, fallback_url=args.fallback_url,
                         counter=InvocationCounter(args.counter_path), name=args.agent_name,
                         refund_delay_ms=args.refund_delay_ms)
    config = {"kafka": {"bootstrap.servers": args.bootstrap_servers}, "journal_topic": args.journal_topic,
              "signing_key": args.signing_key, "max_concurrent_runs": 8}
    sink = exactly_once_string_sink(args.bootstrap_servers, args.output_topic, f"reconcile-{uuid.uuid4().hex[:8]}")
    (connect_to_agent(keyed, agent, config)
     .map(lambda output: json.dumps(canonical_output(output)), output_type=Types.STRING())
     .uid("reconcile/serialize").sink_to(sink).uid("reconcile/sink"))
    env.execute(f"reconcile and fallback job {args.agent_name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
