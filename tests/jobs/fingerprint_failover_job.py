"""Test job for ``flink run -py``: an agent whose action holds a set literal, with ``fingerprint_policy="fail"``.

Kafka inputs ``{"key": ..., "n": ...}`` (unbounded: the job runs until cancelled) -> :class:`Routing` (two
actions, one journaled call each, the key's history in memory) -> exactly-once Kafka outputs
``json.dumps(canonical_output(output))``. Checkpoints are retained when the job fails or is cancelled, so a
failed job can be submitted again from its latest one (``flink run -s <checkpoint> -py ...``): that
submission is another client process, which computes the agent's action fingerprints anew (the
TaskManagers get them with the pickled agent), and with the policy ``fail`` any fingerprint other than the
journaled one fails the job. No restarts. Used by ``tests/integration/test_fingerprint_failover.py``.

``--report`` writes, from the client process, its ``PYTHONHASHSEED``, the order in which it iterates the
action's set constant, and the actions' fingerprints (JSON), so a test can check that two submissions
really iterated the set differently. Every call also records, in the counter, the order in which the
TaskManager process running it iterates the same set (``set-order:<pid>:<order>``).

``--audit`` deploys the agent with one more action, ``audit`` (a call per run, counted as ``audit:<label>``,
no output), and ``--fingerprint-policy`` sets the policy: a deploy that adds an action must leave the other
actions' fingerprints as they were (issue 35).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from pyflink.common import Types
from pyflink.datastream import ExternalizedCheckpointRetention

from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, action
from flink_agents_replay.api.resources import Tool
from flink_agents_replay.flink.env import create_environment
from flink_agents_replay.flink.pipeline import connect_to_agent
from flink_agents_replay.local.jars import kafka_connector_jar
from flink_agents_replay.testing.agents import Classified
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import canonical_output, exactly_once_string_sink, keyed_json_inputs

#: The event sent between the actions. It comes from an importable module, not from this script: classes of a
#: `flink run -py` script (__main__) are pickled by value, and a journaled event of such a class comes back,
#: in a job submitted again, as another class, which no action handles.
Routed = Classified

#: The elements of the action's set literal (the literal itself must stay in the action's code).
VIP_KEYS = ("key-000", "key-003", "vip-a", "vip-b", "vip-c", "vip-d", "vip-e", "vip-f")


class Routing(Agent):
    @action(InputEvent)
    def route(event, ctx):
        record = event.input
        # A set literal: compiled to a frozenset constant, iterated in an order that depends on the hash seed.
        urgent = record["key"] in {"key-000", "key-003", "vip-a", "vip-b", "vip-c", "vip-d", "vip-e", "vip-f"}
        label = ctx.call("classifier", f"{ctx.key}|{ctx.seq}|{record['n']}|{urgent}")
        ctx.memory.set("history", [*ctx.memory.get("history", []), record["n"]])
        ctx.send_event(Routed(label=label, urgent=urgent))

    @action(Routed)
    def reply(event, ctx):
        sent = ctx.call("sender", event.label)
        ctx.send_event(OutputEvent(output={"sent": sent, "urgent": event.urgent, "history": ctx.memory.get("history")}))


class AuditedRouting(Routing):
    """The next deploy: one more action; ``route`` and ``reply`` unchanged."""

    @action(Routed)
    def audit(event, ctx):
        ctx.call("auditor", event.label)


def routing_agent(counter: InvocationCounter, call_delay_s: float = 0.0, *, audit: bool = False) -> Routing:
    """The agent, its tools counting every call in ``counter`` (a file that outlives killed TaskManagers)."""

    def tool(name: str):
        def invoke(argument: str) -> str:
            counter.increment(f"call:{name}:{argument}")
            counter.increment("calls")
            counter.increment(f"set-order:{os.getpid()}:{','.join(frozenset(VIP_KEYS))}")
            if call_delay_s:
                time.sleep(call_delay_s)
            return f"{name}({argument})"
        return invoke

    def auditor(label: str) -> None:
        counter.increment(f"audit:{label}")

    return (AuditedRouting if audit else Routing)(name="routing", resources={
        "classifier": Tool(tool("classifier")), "sender": Tool(tool("sender"), side_effects="external"),
        "auditor": Tool(auditor, side_effects="external")})


def set_constant(agent: Agent) -> frozenset:
    """The set literal of the ``route`` action, as the compiled code holds it."""
    [constant] = [c for c in agent.actions[0].function.__code__.co_consts if isinstance(c, frozenset)]
    return constant


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--input-topic", required=True)
    parser.add_argument("--output-topic", required=True)
    parser.add_argument("--journal-topic", required=True)
    parser.add_argument("--transactional-id-prefix", required=True, help="the same in every submission")
    parser.add_argument("--counter-path", required=True, help="SQLite file of the InvocationCounter")
    parser.add_argument("--signing-key", required=True, help="journal signing key (16+ characters)")
    parser.add_argument("--report", required=True, help="JSON file this client process writes (see above)")
    parser.add_argument("--checkpoint-interval-ms", type=int, default=500)
    parser.add_argument("--call-delay-s", type=float, default=0.0, help="how long each tool call takes")
    parser.add_argument("--audit", action="store_true", help="deploy the agent with its audit action")
    parser.add_argument("--fingerprint-policy", default="fail")
    return parser.parse_args(argv)


def build(args: argparse.Namespace):
    """The job's environment with the pipeline; no restarts: a failure (or a fingerprint mismatch) fails it."""
    env = create_environment(parallelism=1, checkpoint_interval_ms=args.checkpoint_interval_ms,
                             restart_attempts=0, jars=[kafka_connector_jar()])
    env.get_checkpoint_config().set_externalized_checkpoint_retention(
        ExternalizedCheckpointRetention.RETAIN_ON_CANCELLATION)
    # Unbounded, like a production job (a bounded KafkaSource restored from a retained checkpoint was seen
    # not to end): a test reads the committed outputs and cancels the job.
    keyed = keyed_json_inputs(env, args.bootstrap_servers, args.input_topic)
    agent = routing_agent(InvocationCounter(args.counter_path), call_delay_s=args.call_delay_s, audit=args.audit)
    with open(args.report, "w", encoding="utf-8") as report:
        json.dump({"hash_seed": os.environ.get("PYTHONHASHSEED"), "set_order": list(set_constant(agent)),
                   "fingerprints": {spec.name: spec.fingerprint for spec in agent.actions}}, report)
    config = {"kafka": {"bootstrap.servers": args.bootstrap_servers}, "journal_topic": args.journal_topic,
              "signing_key": args.signing_key, "max_concurrent_runs": 4,
              "fingerprint_policy": args.fingerprint_policy}
    outputs = connect_to_agent(keyed, agent, config)
    sink = exactly_once_string_sink(args.bootstrap_servers, args.output_topic, args.transactional_id_prefix,
                                    transaction_timeout_ms=120_000)
    (outputs.map(lambda output: json.dumps(canonical_output(output)), output_type=Types.STRING())
     .uid("fingerprint-failover/serialize").sink_to(sink).uid("fingerprint-failover/sink"))
    return env


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    build(args).execute("flink-agents-replay fingerprint failover job")
    return 0


if __name__ == "__main__":
    sys.exit(main())
