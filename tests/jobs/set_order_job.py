"""Test job: an action that makes one external call per element of a ``set`` of strings, savepointed mid-action.

The order in which a process iterates a set of strings depends on its ``PYTHONHASHSEED``, so a restore in a
new process makes the same calls in another order. ``tests/integration/test_call_order.py`` runs this script
twice, each time in a fresh process with its own seed:

* ``--phase first``: the job runs until every key's action has made two calls and is inside its third, which
  waits for a gate file that never comes; it takes a savepoint (runs in flight) and is cancelled.
* ``--phase restore --savepoint DIR``: the job restores that savepoint, without a gate; every run finishes;
  it is cancelled once every key's output is committed.

Every invocation of the tool is counted outside the Flink worker (``call:<key>:<tag>`` when it begins,
``done:<key>:<tag>`` when it returns), with the order the process iterated each key's tags
(``order:<phase>:<key>:<tags>``). The script prints the savepoint's path on stdout (phase ``first``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, action
from flink_agents_replay.api.resources import Tool
from flink_agents_replay.testing.counter import InvocationCounter

SIGNING_KEY = "call-order-test-signing-key"
CALLS_BEFORE_SAVEPOINT = 2


def tags_of(key: str) -> list[str]:
    """The tags of ``key``'s one input: enough that two seeds almost surely iterate them differently."""
    return [f"tag{n}-{key}" for n in range(6)]


class Notifier(Agent):
    @action(InputEvent)
    def notify_all(event, ctx):
        # Iterating a set: the habit under test. Its order depends on the process's hash seed.
        sent = [ctx.call("notify", ctx.key, tag) for tag in set(event.input["tags"])]
        ctx.send_event(OutputEvent(output=sorted(sent)))


def notifier(counter: InvocationCounter, phase: str) -> Agent:
    """The agent; in phase ``first`` each key's third call waits (forever) inside the tool."""

    def notify(key: str, tag: str) -> str:
        made = counter.increment(f"calls-of:{phase}:{key}")
        counter.increment(f"call:{key}:{tag}")
        if phase == "first" and made > CALLS_BEFORE_SAVEPOINT:
            while True:  # the savepoint is taken while this call is under way; the job is then cancelled
                time.sleep(0.05)
        counter.increment(f"done:{key}:{tag}")
        return f"sent {tag}"

    return Notifier(name="notifier", resources={"notify": Tool(notify, side_effects="external")})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--phase", choices=("first", "restore"), required=True)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--input-topic", required=True)
    parser.add_argument("--output-topic", required=True)
    parser.add_argument("--journal-topic", required=True)
    parser.add_argument("--counter-path", required=True)
    parser.add_argument("--keys", required=True, help="comma-separated keys (one input each)")
    parser.add_argument("--savepoint-dir", required=True)
    parser.add_argument("--savepoint", default=None, help="restore this savepoint")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from pyflink.common import Types

    from flink_agents_replay.flink.env import create_environment
    from flink_agents_replay.flink.pipeline import connect_to_agent
    from flink_agents_replay.local.jars import kafka_connector_jar
    from flink_agents_replay.testing.committed import CommittedReader
    from flink_agents_replay.testing.jobs import (
        exactly_once_string_sink,
        keyed_json_inputs,
        running_job,
        trigger_savepoint,
        wait_until,
    )

    args = parse_args(argv)
    keys = args.keys.split(",")
    counter = InvocationCounter(args.counter_path)
    for key in keys:
        counter.increment(f"order:{args.phase}:{key}:{','.join(set(tags_of(key)))}")
    config = {"execution.savepoint.path": args.savepoint} if args.savepoint else {}
    env = create_environment(parallelism=1, checkpoint_interval_ms=500, jars=[kafka_connector_jar()], config=config)
    keyed = keyed_json_inputs(env, args.bootstrap_servers, args.input_topic)
    outputs = connect_to_agent(keyed, notifier(counter, args.phase), {
        "kafka": {"bootstrap.servers": args.bootstrap_servers}, "journal_topic": args.journal_topic,
        "signing_key": SIGNING_KEY, "close_timeout_s": 2.0})
    rows = outputs.map(lambda o: json.dumps([o.key, o.seq, o.output]), output_type=Types.STRING()).uid("rows")
    rows.sink_to(exactly_once_string_sink(args.bootstrap_servers, args.output_topic, f"order-{args.phase}"))
    with running_job(env, f"call order {args.phase}") as client:
        if args.phase == "first":
            wait_until(client, lambda: all(counter.count(f"calls-of:first:{k}") > CALLS_BEFORE_SAVEPOINT
                                           for k in keys), "every key's third call", timeout_s=120)
            print(trigger_savepoint(client, args.savepoint_dir), flush=True)
            client.cancel().result()
            os._exit(0)  # the waiting calls' threads never end; the savepoint is all this phase leaves
        reader = CommittedReader(args.bootstrap_servers, args.output_topic)
        try:
            committed: list = []
            wait_until(client, lambda: len(committed) >= len(keys), "every key's output committed",
                       timeout_s=120, between=lambda: committed.extend(reader.poll(0.5)))
        finally:
            reader.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
