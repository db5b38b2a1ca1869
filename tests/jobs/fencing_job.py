"""Test job for ``flink run -py``: an agent whose tools mark what a zombie returns, for the fencing test.

Kafka inputs ``{"key": ..., "n": ...}`` (unbounded: the test cancels the job) -> :func:`fencing_agent` (three
chained actions, two slow journaled calls each, the key's history in memory) -> exactly-once Kafka outputs
``json.dumps(canonical_output(output))``. Checkpoints every ``--checkpoint-interval-ms`` with a min-pause of
the same length, so after a restart the next checkpoint comes one whole interval later.

Every tool invocation is counted outside the worker (``call:<tool>:<argument>`` when it begins, ``done:...``
when it returns; the argument names the key and seq, so it is the call's idempotency key). A test pausing a
TaskManager first creates the file ``paused-<pid>`` next to the counter: a call that returns in that process
after the pause, i.e. after it was resumed as a zombie, returns its result marked ``[zombie]`` and counts
``zombie-return:...``; one that *begins* there after the test created ``resumed-<pid>`` (just before resuming it)
counts ``zombie-call:...``: a new call of the zombie. A ``[zombie]`` result must never reach a committed output: a
zombie's outputs are never committed (its sink's transactions are aborted), so one there came from a zombie's
journal record reused by a later attempt. Used by ``tests/integration/test_fencing_zombie.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
import zlib
from pathlib import Path

from pyflink.common import Types

from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, action
from flink_agents_replay.api.resources import Tool
from flink_agents_replay.flink.env import create_environment
from flink_agents_replay.flink.pipeline import connect_to_agent
from flink_agents_replay.local.jars import kafka_connector_jar
from flink_agents_replay.testing.agents import Classified, Drafted
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import canonical_output, exactly_once_string_sink, keyed_json_inputs

ZOMBIE_MARK = "[zombie]"


def paused_flag(counter_path: str | Path, pid: int) -> Path:
    """The file a test creates before pausing process ``pid``."""
    return Path(counter_path).with_name(f"paused-{pid}")


def resumed_flag(counter_path: str | Path, pid: int) -> Path:
    """The file a test creates while process ``pid`` is still paused, just before it resumes it: a call that
    begins in that process while the file exists began after the resumption (a zombie's new call)."""
    return Path(counter_path).with_name(f"resumed-{pid}")


def _tool(counter: InvocationCounter, name: str, call_delay_s: float):
    def invoke(argument: str) -> str:
        counter.increment(f"call:{name}:{argument}")
        resumed = resumed_flag(counter.path, os.getpid())
        if resumed.exists():  # begun by a zombie, after it resumed (ms after the flag, written just before)
            counter.increment(f"zombie-call:{name}:{argument}")
            counter.increment(f"zombie-call-ms:{name}:{int((time.time() - resumed.stat().st_mtime) * 1000)}")
        # 0.5x to 1.5x the delay, fixed per call: keys drift apart, so a pause finds varied calls under way.
        time.sleep(call_delay_s * (0.5 + zlib.crc32(argument.encode()) % 1000 / 1000))
        counter.increment(f"done:{name}:{argument}")
        if paused_flag(counter.path, os.getpid()).exists():  # this process was paused and resumed: a zombie
            counter.increment(f"zombie-return:{name}:{argument}")
            return f"{name}({argument}){ZOMBIE_MARK}"
        return f"{name}({argument})"

    invoke.__qualname__ = name
    return invoke


def fencing_agent(counter: InvocationCounter, call_delay_s: float = 0.0) -> Agent:
    """Three chained actions, two journaled calls each; ``sender`` has external side effects."""

    class Fenced(Agent):
        @action(InputEvent)
        def classify(event, ctx):
            label = ctx.call("classifier", f"{ctx.key}|{ctx.seq}|{event.input['n']}")
            detail = ctx.call("lookup", label)
            ctx.memory.set("history", [*ctx.memory.get("history", []), event.input["n"]])
            ctx.send_event(Classified(label=label, detail=detail))

        @action(Classified)
        def draft(event, ctx):
            ctx.send_event(Drafted(text=ctx.call("checker", ctx.call("writer", event.detail))))

        @action(Drafted)
        def reply(event, ctx):
            receipt = ctx.call("archiver", ctx.call("sender", event.text))
            ctx.send_event(OutputEvent(output={"receipt": receipt, "history": ctx.memory.get("history")}))

    tools = ("classifier", "lookup", "writer", "checker", "sender", "archiver")
    return Fenced(name="fenced", resources={
        t: Tool(_tool(counter, t, call_delay_s), side_effects="external" if t == "sender" else "none") for t in tools})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--input-topic", required=True)
    parser.add_argument("--output-topic", required=True)
    parser.add_argument("--journal-topic", required=True)
    parser.add_argument("--counter-path", required=True, help="SQLite file of the InvocationCounter")
    parser.add_argument("--signing-key", required=True, help="journal signing key (16+ characters)")
    parser.add_argument("--checkpoint-interval-ms", type=int, default=10_000)
    parser.add_argument("--call-delay-s", type=float, default=0.5, help="how long each tool call takes (average)")
    return parser.parse_args(argv)


def build(args: argparse.Namespace):
    """The job's environment with the pipeline: parallelism 1 (one TaskManager runs it), restarts on failure."""
    interval = args.checkpoint_interval_ms
    env = create_environment(parallelism=1, checkpoint_interval_ms=interval, restart_attempts=5,
                             restart_delay_ms=500, jars=[kafka_connector_jar()],
                             config={"execution.checkpointing.min-pause": f"{interval} ms"})
    keyed = keyed_json_inputs(env, args.bootstrap_servers, args.input_topic)
    agent = fencing_agent(InvocationCounter(args.counter_path), call_delay_s=args.call_delay_s)
    config = {"kafka": {"bootstrap.servers": args.bootstrap_servers}, "journal_topic": args.journal_topic,
              "signing_key": args.signing_key, "max_concurrent_runs": 16}
    outputs = connect_to_agent(keyed, agent, config)
    sink = exactly_once_string_sink(args.bootstrap_servers, args.output_topic, f"fencing-{uuid.uuid4().hex[:8]}",
                                    transaction_timeout_ms=120_000)
    (outputs.map(lambda output: json.dumps(canonical_output(output)), output_type=Types.STRING())
     .uid("fencing/serialize").sink_to(sink).uid("fencing/sink"))
    return env


def main(argv: list[str] | None = None) -> int:
    build(parse_args(argv)).execute("flink-agents-replay fencing job")
    return 0


if __name__ == "__main__":
    sys.exit(main())
