"""Test job for ``flink run -py``: Kafka inputs and decisions -> an agent that asks for approval -> exactly-once
outputs and wait events.

Each input ``{"key": ..., "n": ...}`` is a refund: the agent looks it up (``lookup``), waits for
``refund-approval`` with ``{"reference": ..., "n": ...}`` as payload, then pays (``pay``, external, 0.3 s) or
answers that it was denied. Decisions come from ``--signals-topic`` (JSON ``{"key", "wait_id", "approved",
...}``); the outputs go to ``--output-topic`` and the wait events (JSON ``{"kind", "key", "wait_id",
"payload"}``) to ``--waits-topic``, both exactly once. Both tools count themselves in an
:class:`~flink_agents_replay.testing.counter.InvocationCounter` file, outside the worker: ``lookup:<ref>``,
``pay:<ref>`` and ``pay-id:<ref>|<call id>`` (a payment service applies a call id once). Used by
``tests/integration/test_waits_sigkill.py``.

With ``--later-inputs run`` the job runs :func:`later_inputs_agent` instead, with
``later_inputs_while_waiting="run"`` (``tests/integration/test_waits_later_inputs.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from pyflink.common import Types

from flink_agents_replay import Agent, InputEvent, OutputEvent, Tool, action, current_call_id
from flink_agents_replay.flink.env import create_environment
from flink_agents_replay.flink.pipeline import connect_to_agent, wait_events
from flink_agents_replay.local.jars import kafka_connector_jar
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import canonical_output, exactly_once_string_sink, keyed_json_inputs


def refund_agent(counter: InvocationCounter, *, name: str, pay_delay_s: float = 0.0) -> Agent:
    """The agent (see the module docstring)."""

    def lookup(key: str, n: int) -> str:
        counter.increment(f"lookup:{key}/{n}")
        return f"{key}/{n}"

    def pay(reference: str) -> str:
        counter.increment(f"pay:{reference}")
        counter.increment(f"pay-id:{reference}|{current_call_id()}")
        time.sleep(pay_delay_s)
        return f"paid {reference}"

    class Refunds(Agent):
        @action(InputEvent)
        def refund(event, ctx):
            reference = ctx.call("lookup", event.input["key"], event.input["n"])
            decision = ctx.wait_for("refund-approval", {"reference": reference, "n": event.input["n"]},
                                    timeout_s=3600)
            memory = ctx.memory.get("decided", [])
            ctx.memory.set("decided", [*memory, [event.input["n"], decision.approved]])
            if decision.approved:
                ctx.send_event(OutputEvent(output=["paid", ctx.call("pay", reference), ctx.memory.get("decided")]))
            else:
                ctx.send_event(OutputEvent(output=["denied", reference, decision.reason, ctx.memory.get("decided")]))

    return Refunds(name=name, resources={"lookup": Tool(lookup, side_effects="none"),
                                         "pay": Tool(pay, side_effects="external")})


def later_inputs_agent(counter: InvocationCounter, *, name: str, pay_delay_s: float = 0.0) -> Agent:
    """Even inputs wait for approval, odd ones do not; each run reports the inputs of its key it saw done in memory
    as it started (``seen``), notes them (``seen:<ref>|<seen>``: a run that saw other memory in another attempt
    notes a second value), pays with them as an argument, and writes ``done.<n>``."""

    def note(reference: str, seen: list) -> None:
        counter.increment(f"seen:{reference}|{json.dumps(seen)}")

    def lookup(key: str, n: int) -> str:
        counter.increment(f"lookup:{key}/{n}")
        return f"{key}/{n}"

    def pay(reference: str, seen: list) -> str:
        counter.increment(f"pay:{reference}")
        counter.increment(f"pay-id:{reference}|{current_call_id()}")
        time.sleep(pay_delay_s)
        return f"paid {reference}"

    class LaterInputs(Agent):
        @action(InputEvent)
        def refund(event, ctx):
            n = event.input["n"]
            reference = ctx.call("lookup", event.input["key"], n)
            seen = sorted(int(m) for m in ctx.memory.get("done", {}))
            ctx.call("note", reference, seen)
            outcome = "free"
            if n % 2 == 0:
                decision = ctx.wait_for("refund-approval", {"reference": reference, "n": n}, timeout_s=3600)
                outcome = ctx.call("pay", reference, seen) if decision.approved else "denied"
            ctx.memory.set(f"done.{n}", outcome)
            ctx.send_event(OutputEvent(output=[outcome, reference, seen]))

    return LaterInputs(name=name, resources={"lookup": Tool(lookup, side_effects="none"),
                                             "note": Tool(note, side_effects="none"),
                                             "pay": Tool(pay, side_effects="external")})


def decision_for(payload: dict) -> dict:
    """What the people decide: even inputs approved, odd ones denied."""
    approved = payload["n"] % 2 == 0
    return {"approved": approved, "reason": None if approved else "odd", "by": "test"}


def event_json(event) -> str:
    return json.dumps({"kind": event.kind, "key": event.key, "wait_id": event.wait_id, "payload": event.payload})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for option in ("bootstrap-servers", "input-topic", "signals-topic", "output-topic", "waits-topic",
                   "journal-topic", "counter-path", "signing-key", "agent-name", "transactional-id-prefix"):
        parser.add_argument(f"--{option}", required=True)
    parser.add_argument("--checkpoint-interval-ms", type=int, default=1000)
    parser.add_argument("--parallelism", type=int, default=1)
    parser.add_argument("--pay-delay-s", type=float, default=0.3)
    parser.add_argument("--later-inputs", choices=("hold", "run"), default="hold")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = create_environment(parallelism=args.parallelism, checkpoint_interval_ms=args.checkpoint_interval_ms,
                             restart_attempts=3, restart_delay_ms=500, jars=[kafka_connector_jar()])
    keyed = keyed_json_inputs(env, args.bootstrap_servers, args.input_topic)
    signals = keyed_json_inputs(env, args.bootstrap_servers, args.signals_topic, source_uid="signals",
                                parse_uid="parse-signals")
    make_agent = later_inputs_agent if args.later_inputs == "run" else refund_agent
    agent = make_agent(InvocationCounter(args.counter_path), name=args.agent_name, pay_delay_s=args.pay_delay_s)
    config = {"kafka": {"bootstrap.servers": args.bootstrap_servers}, "journal_topic": args.journal_topic,
              "signing_key": args.signing_key, "max_concurrent_runs": 4,
              "later_inputs_while_waiting": args.later_inputs}
    outputs = connect_to_agent(keyed, agent, config, signals=signals)
    prefix = args.transactional_id_prefix
    (outputs.map(lambda output: json.dumps(canonical_output(output)), output_type=Types.STRING())
     .uid("waits/serialize").sink_to(exactly_once_string_sink(args.bootstrap_servers, args.output_topic,
                                                              f"{prefix}-out")).uid("waits/sink"))
    (wait_events(outputs).map(event_json, output_type=Types.STRING()).uid("waits/events")
     .sink_to(exactly_once_string_sink(args.bootstrap_servers, args.waits_topic, f"{prefix}-waits"))
     .uid("waits/events-sink"))
    env.execute(f"waits job {args.agent_name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
