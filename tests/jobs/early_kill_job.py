"""Job for ``flink run -py``: Kafka inputs -> traced chain agent -> exactly-once Kafka outputs, with a first
checkpoint held back (long interval *and* the same min-pause), for faults in a job's first seconds.

Like ``tests/jobs/agent_failover_job.py``, but

* the checkpoint interval and ``execution.checkpointing.min-pause`` are both set (Flink triggers a job's
  first periodic checkpoint at a random delay between min-pause and interval: equal, it is exactly the
  interval), so a TaskManager killed in the first seconds is killed before any checkpoint completed, and
  the restarted job goes through the "restarted before its first completed checkpoint" path;
* every tool invocation is recorded twice in the :class:`InvocationCounter` file (outside the worker):
  ``call:<tool>:<argument>`` when it begins (the name ``chain_agent`` uses, so ``logical_call_counts``
  works) and ``done:<tool>:<argument>`` when it returns. A SIGKILL stops both at once, so a snapshot of the
  file right after the kill says which calls were under way at that moment (begun more often than done).

The agent is defined here (a ``flink run -py`` script is ``__main__``: it ships to the worker by value); the
test imports this file with ``flink_agents_replay.testing.jobs.job_script`` to compute the failure-free
reference with the same agent.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
import zlib

from pyflink.common import Types

from flink_agents_replay.agent import Agent, Event, InputEvent, OutputEvent, action
from flink_agents_replay.flink_env import create_environment
from flink_agents_replay.local.jars import kafka_connector_jar
from flink_agents_replay.pipeline import connect_to_agent
from flink_agents_replay.resources import Tool
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import canonical_output, exactly_once_string_sink, keyed_json_inputs

AGENT_NAME = "infra-chain"
#: The agent's tools in call order; consecutive pairs are its three actions' calls.
TOOLS = ("classifier", "lookup", "writer", "checker", "sender", "archiver")


class Classified(Event):
    """First action's result."""


class Drafted(Event):
    """Second action's result."""


def traced_chain_agent(counter: InvocationCounter, call_delay_s: float = 0.0) -> Agent:
    """3 chained actions per input, 2 journaled calls each ("sender" has external side effects)."""

    def tool(tool_name: str):
        def invoke(argument: str) -> str:
            counter.increment(f"call:{tool_name}:{argument}")
            counter.increment("calls")
            if call_delay_s:  # 0.5x to 1.5x, fixed per call: keys drift apart, so a kill finds varied calls
                time.sleep(call_delay_s * (0.5 + zlib.crc32(argument.encode()) % 1000 / 1000))
            counter.increment(f"done:{tool_name}:{argument}")
            return f"{tool_name}({argument})"
        invoke.__qualname__ = tool_name
        return invoke

    class TracedChain(Agent):
        @action(InputEvent)
        def classify(event, ctx):
            label = ctx.call("classifier", f"{ctx.key}|{ctx.seq}|{event.input}")
            detail = ctx.call("lookup", label)
            history = ctx.memory.get("history", [])
            ctx.memory.set("history", [*history, event.input])
            ctx.send_event(Classified(label=label, detail=detail))

        @action(Classified)
        def draft(event, ctx):
            text = ctx.call("writer", event.detail)
            checked = ctx.call("checker", text)
            ctx.send_event(Drafted(text=checked))

        @action(Drafted)
        def reply(event, ctx):
            sent = ctx.call("sender", event.text)
            receipt = ctx.call("archiver", sent)
            ctx.send_event(OutputEvent(output={"receipt": receipt, "history": ctx.memory.get("history")}))

    return TracedChain(name=AGENT_NAME, resources={
        t: Tool(tool(t), side_effects="external" if t == "sender" else "none") for t in TOOLS})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--input-topic", required=True)
    parser.add_argument("--output-topic", required=True)
    parser.add_argument("--journal-topic", required=True)
    parser.add_argument("--counter-path", required=True)
    parser.add_argument("--signing-key", required=True)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--checkpoint-interval-ms", type=int, default=60_000)
    parser.add_argument("--min-pause-ms", type=int, default=60_000)
    parser.add_argument("--restart-attempts", type=int, default=5)
    parser.add_argument("--restart-delay-ms", type=int, default=1000)
    parser.add_argument("--call-delay-s", type=float, default=0.0)
    parser.add_argument("--max-concurrent-runs", type=int, default=16)
    parser.add_argument("--job-name", default="flink-agents-replay early-kill job")
    return parser.parse_args(argv)


def build(args: argparse.Namespace):
    env = create_environment(parallelism=args.parallelism, checkpoint_interval_ms=args.checkpoint_interval_ms,
                             restart_attempts=args.restart_attempts, restart_delay_ms=args.restart_delay_ms,
                             jars=[kafka_connector_jar()],
                             config={"execution.checkpointing.min-pause": f"{args.min_pause_ms} ms"})
    # Also through the API: whichever way the cluster honours, the test reads it back from the REST API.
    env.get_checkpoint_config().set_min_pause_between_checkpoints(args.min_pause_ms)
    keyed = keyed_json_inputs(env, args.bootstrap_servers, args.input_topic)
    agent = traced_chain_agent(InvocationCounter(args.counter_path), call_delay_s=args.call_delay_s)
    config = {"kafka": {"bootstrap.servers": args.bootstrap_servers}, "journal_topic": args.journal_topic,
              "signing_key": args.signing_key, "max_concurrent_runs": args.max_concurrent_runs}
    outputs = connect_to_agent(keyed, agent, config)
    sink = exactly_once_string_sink(args.bootstrap_servers, args.output_topic,
                                    f"early-kill-{uuid.uuid4().hex[:8]}", transaction_timeout_ms=300_000)
    (outputs.map(lambda output: json.dumps(canonical_output(output)), output_type=Types.STRING())
     .uid("early-kill/serialize").sink_to(sink).uid("early-kill/sink"))
    return env


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    build(args).execute(args.job_name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
