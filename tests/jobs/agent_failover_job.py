"""Test job for ``flink run -py``: Kafka inputs -> chain agent -> exactly-once Kafka outputs.

Reads JSON inputs ``{"key": ..., "n": ...}`` from a Kafka topic (unbounded by default: a job on a session
cluster runs until cancelled, with runs in flight across ordinary checkpoints), keys them by ``key``
(``Types.STRING()``), runs :func:`flink_agents_replay.testing.agents.chain_agent` with an
:class:`~flink_agents_replay.testing.counter.InvocationCounter` file that outlives killed TaskManagers,
and writes every output as ``json.dumps(canonical_output(output))`` with Flink's exactly-once
``KafkaSink`` (committed at checkpoints: read it with ``isolation.level=read_committed``).

The source and the JSON parsing run with parallelism 1, so the agent has one upstream instance and every
key's inputs arrive in topic order, also after a restore. Used by ``tests/integration/test_local_flink.py``
and ``tests/integration/test_kill_before_first_checkpoint.py``::

    flink run -d -py tests/jobs/agent_failover_job.py --bootstrap-servers 127.0.0.1:9092 \\
        --input-topic in --output-topic out --journal-topic journal --counter-path /tmp/calls.db
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid

from pyflink.common import Types

from flink_agents_replay.flink.env import create_environment
from flink_agents_replay.flink.pipeline import connect_to_agent
from flink_agents_replay.local.jars import kafka_connector_jar
from flink_agents_replay.testing.agents import chain_agent
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import canonical_output, exactly_once_string_sink, keyed_json_inputs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--input-topic", required=True)
    parser.add_argument("--output-topic", required=True)
    parser.add_argument("--journal-topic", required=True)
    parser.add_argument("--counter-path", required=True, help="SQLite file of the InvocationCounter")
    parser.add_argument("--signing-key", required=True, help="journal signing key (16+ characters)")
    parser.add_argument("--parallelism", type=int, default=2, help="parallelism of the agent and the sink")
    parser.add_argument("--checkpoint-interval-ms", type=int, default=500)
    parser.add_argument("--min-pause-ms", type=int, default=None,
                        help="execution.checkpointing.min-pause; equal to the interval, the first checkpoint comes "
                             "exactly one interval after the start (Flink picks a random delay between the two)")
    parser.add_argument("--transaction-timeout-ms", type=int, default=120_000, help="of the exactly-once sink")
    parser.add_argument("--traced", action="store_true", help="chain_agent(traced=True): calls' returns counted")
    parser.add_argument("--restart-attempts", type=int, default=3, help="fixed-delay restarts after a failure")
    parser.add_argument("--restart-delay-ms", type=int, default=500)
    parser.add_argument("--call-delay-s", type=float, default=0.0, help="how long each tool call takes")
    parser.add_argument("--max-concurrent-runs", type=int, default=16, help="agent runs in flight per subtask")
    parser.add_argument("--bounded", action="store_true", help="end the job at the input topic's current end")
    parser.add_argument("--job-name", default="flink-agents-replay agent failover job")
    return parser.parse_args(argv)


def build(args: argparse.Namespace):
    """The job's environment, with the pipeline defined on it."""
    min_pause = {} if args.min_pause_ms is None else {"execution.checkpointing.min-pause": f"{args.min_pause_ms} ms"}
    env = create_environment(parallelism=args.parallelism, checkpoint_interval_ms=args.checkpoint_interval_ms,
                             restart_attempts=args.restart_attempts, restart_delay_ms=args.restart_delay_ms,
                             jars=[kafka_connector_jar()], config=min_pause)
    keyed = keyed_json_inputs(env, args.bootstrap_servers, args.input_topic, bounded=args.bounded)
    agent = chain_agent(InvocationCounter(args.counter_path), call_delay_s=args.call_delay_s, traced=args.traced)
    config = {"kafka": {"bootstrap.servers": args.bootstrap_servers}, "journal_topic": args.journal_topic,
              "signing_key": args.signing_key, "max_concurrent_runs": args.max_concurrent_runs}
    outputs = connect_to_agent(keyed, agent, config)
    sink = exactly_once_string_sink(args.bootstrap_servers, args.output_topic,
                                    f"agent-failover-{uuid.uuid4().hex[:8]}",
                                    transaction_timeout_ms=args.transaction_timeout_ms)
    (outputs.map(lambda output: json.dumps(canonical_output(output)), output_type=Types.STRING())
     .uid("agent-failover/serialize").sink_to(sink).uid("agent-failover/sink"))
    return env


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    build(args).execute(args.job_name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
