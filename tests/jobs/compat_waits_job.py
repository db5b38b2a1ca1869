"""The job of the compatibility fixtures with runs parked at a wait (``tests/fixtures/compat/v0_7_0/waits/``): made
by one version, restored by every later one.

JSON inputs ``{"key": ..., "n": ...}`` and JSON decisions ``{"key": ..., "wait_id": ..., "approved": ...}`` from two
Kafka topics. Keys ``h-*`` go to the agent ``compat-waits-hold`` (``later_inputs_while_waiting="hold"``, the
default: a key's later inputs wait behind its parked run), keys ``r-*`` to ``compat-waits-run``
(``later_inputs_while_waiting="run"``: a parked run is kept aside and the key's later inputs run). Both agents run
the same action: ``lookup`` the input, note the inputs of its key it finds done in memory (``seen``), and for an
even ``n`` wait for ``refund-approval``, then ``pay`` (``side_effects="external"``) or answer that it was denied;
odd inputs are free. Each run writes ``done.<n>`` and outputs ``[outcome, reference, seen]``.

Every real tool invocation is counted in an :class:`~flink_agents_replay.testing.counter.InvocationCounter`
(``call:<tool>:<arg>``, and ``done:<tool>:<arg>`` once it returns), outside the Flink worker, and so are the
outputs (``output:<key>:<seq>``) and the wait events (``event:<kind>:<key>:<wait id>``).

``tests/fixtures/compat/make_waits_fixtures.py`` builds the job in its own process (it needs the job client to take
a savepoint); ``tests/integration/test_compat_fixtures.py`` runs this script in a fresh Python process to restore
the fixture's savepoint::

    python tests/jobs/compat_waits_job.py --bootstrap-servers HOST:PORT --input-topic IN --signals-topic S \\
        --output-topic OUT --hold-journal-topic JH --run-journal-topic JR --counter-path calls.db --savepoint DIR \\
        --accept-moved-hold-journal-from OLD_ID --accept-moved-run-journal-from OLD_ID

It runs until its standard input closes, then cancels the job; a job that fails (a refused restore) makes it
print ``JOB FAILED: <reason>`` on stderr and exit 1.

Keep stable across versions: the agents' names, their action, tools, wait name and payload, the settings below and
the operators' uids. Waits and early decisions are kept for ``10**9`` s (31 years) so that a fixture restored
years later has its waits still open and its early decision still kept.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading

from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, action
from flink_agents_replay.api.resources import Tool
from flink_agents_replay.testing.counter import InvocationCounter

AGENTS = {"hold": "compat-waits-hold", "run": "compat-waits-run"}
#: Key prefix of each agent's keys.
PREFIXES = {"hold": "h-", "run": "r-"}
TOOLS = ("lookup", "pay")
#: A test key, checked in with the fixtures: never use it for anything else.
SIGNING_KEY = "compat-waits-fixtures-TEST-ONLY-signing-key"
WAIT_NAME = "refund-approval"
#: How long a wait stays open and an early or closed decision is kept: the longest the package allows.
KEEP_S = 10**9


def mode_of(key: str) -> str:
    """``"hold"`` or ``"run"``: the agent of ``key``."""
    return next(mode for mode, prefix in PREFIXES.items() if key.startswith(prefix))


def _tool(name: str, counter: InvocationCounter):
    def invoke(argument: str) -> str:
        counter.increment(f"call:{name}:{argument}")
        counter.increment(f"done:{name}:{argument}")
        return f"order {argument}" if name == "lookup" else f"paid {argument}"

    invoke.__qualname__ = name
    return invoke


class CompatRefunds(Agent):
    """The fixtures' agent: the user code the fixture jobs ran."""

    @action(InputEvent)
    def refund(event, ctx):
        n = event.input["n"]
        reference = ctx.call("lookup", f"{ctx.key}|{n}")
        seen = sorted(int(m) for m in ctx.memory.get("done", {}))
        outcome = "free"
        if n % 2 == 0:
            decision = ctx.wait_for(WAIT_NAME, {"reference": reference, "n": n}, timeout_s=KEEP_S)
            outcome = ctx.call("pay", reference) if decision.approved else f"denied: {decision.reason}"
        ctx.memory.set(f"done.{n}", outcome)
        ctx.send_event(OutputEvent(output=[outcome, reference, seen]))


def compat_agent(mode: str, counter: InvocationCounter) -> Agent:
    """The agent of ``mode`` (``"hold"`` or ``"run"``)."""
    return CompatRefunds(name=AGENTS[mode], resources={
        t: Tool(_tool(t, counter), side_effects="external" if t == "pay" else "none") for t in TOOLS})


def agent_config(mode: str, bootstrap_servers: str, journal_topic: str, accept_moved_journal_from: str | None) -> dict:
    return {"kafka": {"bootstrap.servers": bootstrap_servers}, "journal_topic": journal_topic,
            "signing_key": SIGNING_KEY, "close_timeout_s": 2.0, "accept_moved_journal_from": accept_moved_journal_from,
            "later_inputs_while_waiting": mode, "early_decision_ttl_s": float(KEEP_S)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--input-topic", required=True)
    parser.add_argument("--signals-topic", required=True)
    parser.add_argument("--output-topic", default=None, help="exactly-once Kafka sink of the outputs (else none)")
    for mode in AGENTS:
        parser.add_argument(f"--{mode}-journal-topic", required=True)
        parser.add_argument(f"--accept-moved-{mode}-journal-from", default=None)
    parser.add_argument("--counter-path", required=True, help="SQLite file of the InvocationCounter")
    parser.add_argument("--savepoint", default=None, help="restore this savepoint")
    parser.add_argument("--source-uid", default="compat-waits",
                        help="uid prefix of the Kafka sources (a new one after the restore: the records of new topics)")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--checkpoint-interval-ms", type=int, default=None)
    return parser.parse_args(argv)


def build(args: argparse.Namespace):
    """The job's environment, with the pipeline defined on it."""
    from pyflink.common import Types, WatermarkStrategy
    from pyflink.common.serialization import SimpleStringSchema
    from pyflink.datastream.connectors.kafka import KafkaOffsetsInitializer, KafkaSource

    from flink_agents_replay.flink.env import create_environment
    from flink_agents_replay.flink.pipeline import connect_to_agent, wait_events
    from flink_agents_replay.local.jars import kafka_connector_jar
    from flink_agents_replay.testing.jobs import canonical_output, exactly_once_string_sink

    flink_config = {"execution.savepoint.ignore-unclaimed-state": "true"}  # the old sources' state is not read
    if args.savepoint:
        flink_config["execution.savepoint.path"] = args.savepoint
    env = create_environment(parallelism=args.parallelism, checkpoint_interval_ms=args.checkpoint_interval_ms,
                             jars=[kafka_connector_jar()], config=flink_config)
    counter = InvocationCounter(args.counter_path)

    def read(topic: str, role: str):
        source = (KafkaSource.builder().set_bootstrap_servers(args.bootstrap_servers).set_topics(topic)
                  .set_group_id(f"{args.source_uid}-{role}").set_starting_offsets(KafkaOffsetsInitializer.earliest())
                  .set_value_only_deserializer(SimpleStringSchema()).build())
        records = env.from_source(source, WatermarkStrategy.no_watermarks(), role).uid(f"{args.source_uid}-{role}")
        return (records.set_parallelism(1).map(json.loads, output_type=Types.PICKLED_BYTE_ARRAY())
                .uid(f"compat-waits/parse-{role}").set_parallelism(1))

    def keyed(records, mode: str, role: str):
        prefix = PREFIXES[mode]
        return (records.filter(lambda record: record["key"].startswith(prefix)).uid(f"compat-waits/{mode}-{role}")
                .set_parallelism(1).key_by(lambda record: record["key"], key_type=Types.STRING()))

    inputs, signals = read(args.input_topic, "inputs"), read(args.signals_topic, "signals")

    def note_event(event) -> str:
        counter.increment(f"event:{event.kind}:{event.key}:{event.wait_id}")
        return ""

    def serialize(output) -> str:
        counter.increment(f"output:{output.key}:{output.seq}")
        return json.dumps(canonical_output(output))

    rows = None
    for mode in AGENTS:
        config = agent_config(mode, args.bootstrap_servers, getattr(args, f"{mode}_journal_topic"),
                              getattr(args, f"accept_moved_{mode}_journal_from"))
        outputs = connect_to_agent(keyed(inputs, mode, "inputs"), compat_agent(mode, counter), config,
                                   signals=keyed(signals, mode, "signals"))
        (wait_events(outputs).map(note_event, output_type=Types.STRING()).uid(f"compat-waits/{mode}-events")
         .filter(lambda _: False).uid(f"compat-waits/{mode}-events-discard").print())
        mapped = outputs.map(serialize, output_type=Types.STRING()).uid(f"compat-waits/{mode}-serialize")
        rows = mapped if rows is None else rows.union(mapped)
    if args.output_topic:
        rows.sink_to(exactly_once_string_sink(args.bootstrap_servers, args.output_topic,
                                              f"{args.source_uid}-out")).uid("compat-waits/sink")
    else:
        rows.filter(lambda _: False).uid("compat-waits/discard").print()
    return env


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    client = build(args).execute_async("compat waits fixture job")
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
