"""The job of the compatibility fixtures (``tests/fixtures/compat/``): made by one version, restored by every later one.

JSON inputs ``{"key": ..., "n": ...}`` from a Kafka topic, keyed by ``key`` (``Types.STRING()``), run through the
``compat-chain`` agent with capture on: three chained actions (``classify``, ``draft``, ``reply``), two journaled
tool calls each, ``sender`` with ``side_effects="external"``, memory keeping each key's history. Every real tool
invocation is counted in an :class:`~flink_agents_replay.testing.counter.InvocationCounter` (``call:<tool>:<arg>``,
and ``done:<tool>:<arg>`` once it returns), outside the Flink worker.

``tests/fixtures/compat/make_fixtures.py`` builds the job in its own process (it needs the job client to take a
savepoint) with *gates*: the ``writer`` call of each held key's seq 2 and seq 3 waits until a file in
``--gate-dir`` exists, so that the savepoint is taken with runs in flight and inputs waiting behind them.
``tests/integration/test_compat_fixtures.py`` runs this script in a fresh Python process to restore the fixture's
savepoint (no gates)::

    python tests/jobs/compat_job.py --bootstrap-servers HOST:PORT --input-topic IN --output-topic OUT \\
        --journal-topic J --capture-topic C --counter-path calls.db --savepoint DIR \\
        --accept-moved-journal-from OLD_TOPIC_ID

It runs until its standard input closes, then cancels the job; a job that fails (a refused restore) makes it
print ``JOB FAILED: <reason>`` on stderr and exit 1.

Keep stable across versions: the agent's name, actions, tools and events (``testing.agents``' ``Classified`` and
``Drafted``, importable classes: a class of a script is pickled by value and would come back as another class).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

from flink_agents_replay.agent import Agent, InputEvent, OutputEvent, action
from flink_agents_replay.resources import Tool
from flink_agents_replay.testing.agents import Classified, Drafted
from flink_agents_replay.testing.counter import InvocationCounter

AGENT_NAME = "compat-chain"
TOOLS = ("classifier", "lookup", "writer", "checker", "sender", "archiver")
#: A test key, checked in with the fixtures: never use it for anything else.
SIGNING_KEY = "compat-fixtures-TEST-ONLY-signing-key"
#: Keys whose ``writer`` calls wait for a gate file at these seqs (fixture making only).
HELD_KEYS = ("key-000", "key-001", "key-002")
HELD_SEQS = (2, 3)
GATE_TIMEOUT_S = 600.0


def gate_name(tool: str, key: str, seq: int) -> str:
    """The file that opens the gate of ``tool``'s call in ``key``'s run at ``seq``."""
    return f"{tool}-{key}-{seq}"


def _wait_for_gate(gate_dir: str, tool: str, argument: str, counter: InvocationCounter) -> None:
    for key in HELD_KEYS:
        for seq in HELD_SEQS:
            if tool == "writer" and f"{key}|{seq}|" in argument:
                counter.increment(f"waiting:{tool}:{key}:{seq}")
                deadline = time.monotonic() + GATE_TIMEOUT_S
                while not (Path(gate_dir) / gate_name(tool, key, seq)).exists():
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"gate {gate_name(tool, key, seq)} never opened")
                    time.sleep(0.05)


def _tool(name: str, counter: InvocationCounter, gate_dir: str | None):
    def invoke(argument: str) -> str:
        if gate_dir is not None:
            _wait_for_gate(gate_dir, name, argument, counter)
        counter.increment(f"call:{name}:{argument}")
        counter.increment(f"done:{name}:{argument}")
        return f"{name}({argument})"

    invoke.__qualname__ = name
    return invoke


class CompatChain(Agent):
    """The fixtures' agent: the user code the fixture jobs ran. A frozen copy of ``testing.agents.chain_agent``'s
    actions on purpose: the fixtures' journals must keep meeting the code that wrote them, whatever becomes of
    the testing agent."""

    @action(InputEvent)
    def classify(event, ctx):
        label = ctx.call("classifier", f"{ctx.key}|{ctx.seq}|{event.input}")
        detail = ctx.call("lookup", label)
        ctx.memory.set("history", [*ctx.memory.get("history", []), event.input["n"]])
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


def compat_agent(counter: InvocationCounter, gate_dir: str | None = None) -> Agent:
    """The fixture's agent; ``gate_dir`` holds held keys' ``writer`` calls until their gate files exist."""
    return CompatChain(name=AGENT_NAME, resources={
        t: Tool(_tool(t, counter, gate_dir), side_effects="external" if t == "sender" else "none") for t in TOOLS})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--input-topic", required=True)
    parser.add_argument("--output-topic", default=None, help="exactly-once Kafka sink of the outputs (else none)")
    parser.add_argument("--journal-topic", required=True)
    parser.add_argument("--capture-topic", required=True)
    parser.add_argument("--counter-path", required=True, help="SQLite file of the InvocationCounter")
    parser.add_argument("--gate-dir", default=None, help="hold the held keys' writer calls (fixture making)")
    parser.add_argument("--savepoint", default=None, help="restore this savepoint")
    parser.add_argument("--accept-moved-journal-from", default=None)
    parser.add_argument("--source-uid", default="compat-inputs",
                        help="uid of the Kafka source (a new one after the restore: the inputs of a new topic)")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--checkpoint-interval-ms", type=int, default=None)
    return parser.parse_args(argv)


def build(args: argparse.Namespace):
    """The job's environment, with the pipeline defined on it."""
    from pyflink.common import Types, WatermarkStrategy
    from pyflink.common.serialization import SimpleStringSchema
    from pyflink.datastream.connectors.kafka import KafkaOffsetsInitializer, KafkaSource

    from flink_agents_replay.flink_env import create_environment
    from flink_agents_replay.local.jars import kafka_connector_jar
    from flink_agents_replay.pipeline import connect_to_agent
    from flink_agents_replay.testing.jobs import canonical_output, exactly_once_string_sink

    flink_config = {"execution.savepoint.ignore-unclaimed-state": "true"}  # the old source's state is not read
    if args.savepoint:
        flink_config["execution.savepoint.path"] = args.savepoint
    env = create_environment(parallelism=args.parallelism, checkpoint_interval_ms=args.checkpoint_interval_ms,
                             jars=[kafka_connector_jar()], config=flink_config)
    counter = InvocationCounter(args.counter_path)
    source = (KafkaSource.builder().set_bootstrap_servers(args.bootstrap_servers).set_topics(args.input_topic)
              .set_group_id(f"compat-{args.source_uid}").set_starting_offsets(KafkaOffsetsInitializer.earliest())
              .set_value_only_deserializer(SimpleStringSchema()).build())

    def parse(line: str) -> dict:
        record = json.loads(line)
        counter.increment(f"seen:{record['key']}:{record['n']}")
        return record

    records = env.from_source(source, WatermarkStrategy.no_watermarks(), "inputs").uid(args.source_uid)
    keyed = (records.set_parallelism(1).map(parse, output_type=Types.PICKLED_BYTE_ARRAY()).uid("compat-parse")
             .set_parallelism(1).key_by(lambda record: record["key"], key_type=Types.STRING()))
    config = {"kafka": {"bootstrap.servers": args.bootstrap_servers}, "journal_topic": args.journal_topic,
              "capture": True, "capture_topic": args.capture_topic, "signing_key": SIGNING_KEY,
              "close_timeout_s": 2.0, "accept_moved_journal_from": args.accept_moved_journal_from}
    outputs = connect_to_agent(keyed, compat_agent(counter, args.gate_dir), config)

    def serialize(output) -> str:
        counter.increment(f"output:{output.key}:{output.seq}")
        return json.dumps(canonical_output(output))

    rows = outputs.map(serialize, output_type=Types.STRING()).uid("compat-serialize")
    if args.output_topic:
        rows.sink_to(exactly_once_string_sink(args.bootstrap_servers, args.output_topic,
                                              f"compat-{args.source_uid}")).uid("compat-sink")
    else:
        rows.filter(lambda _: False).uid("compat-discard").print()
    return env


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    client = build(args).execute_async("compat fixture job")
    cancelled = threading.Event()

    def cancel_when_stdin_closes() -> None:
        sys.stdin.read()
        cancelled.set()
        try:
            client.cancel().result()
        except Exception:  # noqa: BLE001 - the job already ended
            pass

    threading.Thread(target=cancel_when_stdin_closes, daemon=True).start()
    try:
        client.get_job_execution_result().result()
    except Exception as exc:  # noqa: BLE001 - a cancelled job ends with an exception too
        if cancelled.is_set():
            return 0
        print(f"JOB FAILED: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
