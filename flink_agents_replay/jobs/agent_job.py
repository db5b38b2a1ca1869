"""The main job: support tickets from Kafka -> triage agent (durable actions) -> replies to Kafka, exactly once.

Submit it from the installed package with Flink's own client (Flink's Kafka connector in its ``lib/``, or
given with ``--jarfile`` or ``--connector-jar``; see :mod:`flink_agents_replay.jobs.connector`)::

    flink run -d -pym flink_agents_replay.jobs.agent_job --bootstrap-servers 127.0.0.1:9092 \\
        --input-topic tickets --output-topic replies --model-base-url http://127.0.0.1:8000/v1

stop it with a savepoint and restore it, at the same or another parallelism::

    flink stop --savepointPath /tmp/savepoints <job id>
    flink run -d -s /tmp/savepoints/savepoint-... -pym flink_agents_replay.jobs.agent_job ... --parallelism 3

or run it on a local MiniCluster with ``python -m flink_agents_replay.jobs.agent_job ... --bounded`` (ends at
the topic's end).

The pipeline: a ``KafkaSource`` reads JSON tickets ``{"ticket_id", "customer", "order_id", "text"}``; the
source and the parsing run at parallelism 1, so every customer's tickets reach the agent from one
upstream instance and in the same order after a restore (docs/design.md §8). A record that is not a JSON
object with a string ``customer``, a ``ticket_id`` and a ``text``, or is larger than ``--max-record-bytes``,
goes to the dead-letter topic
with the reason, its partition and offset, and the job goes on (:mod:`flink_agents_replay.jobs.kafka_input`).
``key_by`` customer; :func:`~flink_agents_replay.flink.pipeline.connect_to_agent` runs
:mod:`flink_agents_replay.examples.support_triage` with its actions journaled to Kafka; each reply
leaves through Flink's exactly-once ``KafkaSink`` (a consumer with ``isolation.level=read_committed``
sees each one once).

Runs that wait for a person (``ctx.wait_for``, a tool that needs approval) take their decisions from
``--signals-topic``: JSON ``{"key", "wait_id", "approved", "reason", "by", "value", "signal_id", "sent_at_ms"}``
(:mod:`flink_agents_replay.flink.signals`), read and checked like the tickets (a record that is not a JSON object
with a string ``key`` goes to the dead-letter topic) and keyed by ``key``, the customer of the run that waits.
What happens to waits goes to ``--waits-topic`` as JSON keyed by wait id, exactly once
(:mod:`flink_agents_replay.jobs.waits_topic`); the job creates it compacted. ``flink-agents-replay waits list``
and ``waits decide`` read the one and write the other.

Keep ``--agent-id`` the same across a savepoint and its restore: it derives the agent operator's uid and
its journal topic. Every operator has a uid, so a restore maps all state at any parallelism.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from pyflink.common import Types

from flink_agents_replay.api.mcp_tools import McpServer
from flink_agents_replay.core.errors import ConfigError, McpConnectionError, McpProtocolError
from flink_agents_replay.examples.support_triage import support_triage_agent
from flink_agents_replay.flink.config import SIGNING_KEY_ENV, job_signing_key
from flink_agents_replay.flink.env import create_environment
from flink_agents_replay.flink.pipeline import connect_to_agent, wait_events
from flink_agents_replay.integrations.kafka.admin import ensure_topics
from flink_agents_replay.jobs.connector import CONNECTOR_ENV, require_kafka_connector
from flink_agents_replay.jobs.kafka_input import (
    DEFAULT_MAX_RECORD_BYTES,
    DeadLetters,
    JsonRecords,
    KafkaInput,
    records_from_kafka,
)
from flink_agents_replay.jobs.kafka_output import (
    exactly_once_keyed_string_sink,
    exactly_once_string_sink,
    keyed_string_type,
)
from flink_agents_replay.jobs.trace_flags import add_trace_arguments, tracing
from flink_agents_replay.jobs.waits_topic import wait_event_record

#: The settings a waits topic is created with: a pending wait's ``opened`` event may be days old, and compaction
#: keeps the last event of every wait (its Kafka key) where time-based retention would delete it.
WAITS_TOPIC_CONFIG = {"cleanup.policy": "compact"}


def _add_approval_arguments(parser: argparse.ArgumentParser) -> None:
    """Decisions in, wait events out, and the refunds that wait for them."""
    parser.add_argument("--signals-topic", default=None,
                        help="topic of JSON decisions for runs that wait ({\"key\", \"wait_id\", \"approved\", "
                             "...}, keyed by the customer); none: a run that waits can only time out")
    parser.add_argument("--waits-topic", default=None,
                        help="topic the wait events go to (JSON keyed by wait id, exactly once; created compacted); "
                             "none: not written")
    parser.add_argument("--refund-approval-above", type=float, default=None,
                        help="refund refund tickets' orders (the order service's /refunds), a refund above this "
                             "amount only once a person approved it (--signals-topic); default: no refunds")
    parser.add_argument("--approval-timeout-s", type=float, default=60.0,
                        help="how long a refund waits for its approval before it is declined (default 60)")
    parser.add_argument("--later-inputs-while-waiting", choices=("hold", "run"), default="hold",
                        help="what a customer's later tickets do while one waits for an approval: wait behind it "
                             "(hold, the default) or run meanwhile (run)")


def _add_order_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the agent looks orders up (and refunds them)."""
    parser.add_argument("--orders-base-url", default=None,
                        help="order service root (default: the model URL without /v1, i.e. the stub service)")
    parser.add_argument("--orders-mcp-url", default=None,
                        help="an MCP server (streamable HTTP, like http://127.0.0.1:8765/mcp) whose lookup_order tool "
                             "looks the orders up, its read-only annotation trusted (listed when the job is built); "
                             "default: GET <orders base URL>/orders/<id>. Refunds stay at the order service")


def _check_orders_mcp_url(parser: argparse.ArgumentParser, url: str | None) -> None:
    """A usage error unless ``url`` is an MCP endpoint's URL; whether a server answers there is known when the job
    is built (it lists the tools)."""
    if url is not None:
        try:
            McpServer(url=url)
        except ConfigError as exc:
            parser.error(f"--orders-mcp-url: {exc}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
                        help="Kafka for tickets, replies and the journal (default $KAFKA_BOOTSTRAP_SERVERS)")
    parser.add_argument("--input-topic", default="tickets", help="topic of JSON tickets (default tickets)")
    parser.add_argument("--output-topic", default="replies", help="topic the replies go to (default replies)")
    parser.add_argument("--dead-letter-topic", default=None,
                        help="where records the job cannot take go, with the reason, partition and offset "
                             "(default <input topic>.dead-letters)")
    _add_approval_arguments(parser)
    parser.add_argument("--max-record-bytes", type=int, default=DEFAULT_MAX_RECORD_BYTES,
                        help="larger input records go to the dead-letter topic (default 256 KiB; keep it well below "
                             "the journal's limit, Kafka's 1 MB message: an action's record may hold the whole input)")
    parser.add_argument("--connector-jar", action="append", default=[],
                        help=f"Flink's Kafka connector jar, if not in Flink's lib/ or given with --jarfile "
                             f"(else ${CONNECTOR_ENV})")
    parser.add_argument("--agent-id", default="support-triage",
                        help="agent name: derives the operator uid and the journal topic; keep it across restores")
    parser.add_argument("--journal-topic", default=None,
                        help="journal topic (default flink-agents-replay.<agent id>.journal)")
    parser.add_argument("--parallelism", type=int, default=2, help="parallelism of the agent and the sink")
    parser.add_argument("--checkpoint-interval-ms", type=int, default=2000)
    parser.add_argument("--model-base-url", default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"),
                        help="OpenAI-compatible API root (default $OPENAI_BASE_URL, else the local stub service)")
    parser.add_argument("--model", default=os.environ.get("OPENAI_MODEL", "stub-model"))
    parser.add_argument("--memory-url", default=os.environ.get("CHROMA_URL") or None,
                        help="a Chroma server for the agent's long-term memory (default $CHROMA_URL; none: the "
                             "agent remembers nothing beyond Flink state)")
    _add_order_arguments(parser)
    parser.add_argument("--signing-key-file", default=None,
                        help="file whose first line is the journal signing key (else $FLINK_AGENTS_REPLAY_SIGNING_KEY)")
    parser.add_argument("--signing-key", default=None,
                        help="the signing key itself: shows in `ps`; prefer --signing-key-file or the environment")
    parser.add_argument("--max-concurrent-runs", type=int, default=16, help="agent runs in flight per subtask")
    parser.add_argument("--durability", default="per_run",
                        choices=["per_run", "at_checkpoint", "per_action", "per_call"],
                        type=lambda mode: "per_run" if mode == "per_bundle" else mode,  # its old name, still taken
                        help="when a run's outputs may leave (docs/settings.md, durability)")
    parser.add_argument("--restart-attempts", type=int, default=10, help="fixed-delay restarts after a failure")
    parser.add_argument("--restart-delay-ms", type=int, default=1000)
    parser.add_argument("--transactional-id-prefix", default=None,
                        help="KafkaSink transactional id prefix (default flink-agents-replay-<agent id>)")
    parser.add_argument("--bounded", action="store_true", help="end at the input topic's current end")
    parser.add_argument("--capture", action="store_true",
                        help="capture the traffic (inputs, outputs, calls) for replays: flink-agents-replay.<agent id>"
                             ".capture, with a manifest entry per checkpoint (see flink_agents_replay.jobs.replay_job)")
    parser.add_argument("--topic-partitions", type=int, default=2,
                        help="partitions of the input and output topics if this job creates them (default 2)")
    add_trace_arguments(parser)
    args = parser.parse_args(argv)
    try:  # a bad key file is a usage error, reported without a traceback and without the key
        args.signing_key = job_signing_key(key_file=args.signing_key_file, key=args.signing_key)
    except ConfigError as exc:
        parser.error(str(exc))
    if not args.signing_key:
        parser.error(f"a journal signing key is needed: --signing-key or ${SIGNING_KEY_ENV} (16+ characters)")
    if args.parallelism < 1:
        parser.error("--parallelism must be at least 1")
    if args.max_record_bytes < 1:
        parser.error("--max-record-bytes must be at least 1")
    _check_orders_mcp_url(parser, args.orders_mcp_url)
    args.dead_letter_topic = args.dead_letter_topic or f"{args.input_topic}.dead-letters"
    return args


def build(args: argparse.Namespace):
    """The job's environment with the pipeline defined on it."""
    # The agent first: with --orders-mcp-url it lists the MCP server's tools, and a server out of reach fails the
    # submission before anything is created.
    agent = support_triage_agent(name=args.agent_id, model=args.model, model_base_url=args.model_base_url,
                                 orders_base_url=args.orders_base_url, memory_url=args.memory_url,
                                 refund_approval_above=args.refund_approval_above,
                                 approval_timeout_s=args.approval_timeout_s, orders_mcp_url=args.orders_mcp_url)
    env = create_environment(parallelism=args.parallelism, checkpoint_interval_ms=args.checkpoint_interval_ms,
                             restart_attempts=args.restart_attempts, restart_delay_ms=args.restart_delay_ms)
    require_kafka_connector(env, args.connector_jar)
    ensure_topics(args.bootstrap_servers, [args.input_topic, args.output_topic], args.topic_partitions)
    ensure_topics(args.bootstrap_servers, [args.dead_letter_topic], 1)
    prefix = args.transactional_id_prefix or f"flink-agents-replay-{args.agent_id}"
    tickets = records_from_kafka(
        env, KafkaInput(args.bootstrap_servers, args.input_topic, f"flink-agents-replay-{args.agent_id}",
                        bounded=args.bounded),
        JsonRecords("customer", args.max_record_bytes, required=("ticket_id", "text")),
        DeadLetters(args.bootstrap_servers, args.dead_letter_topic, f"dead-letters-{prefix}"), uid="tickets")
    keyed = tickets.key_by(lambda ticket: ticket["customer"], key_type=Types.STRING())
    signals = _signals(env, args, prefix)

    config = {
        "kafka": {"bootstrap.servers": args.bootstrap_servers},
        "signing_key": args.signing_key,
        "max_concurrent_runs": args.max_concurrent_runs,
        "durability": args.durability,
        "capture": args.capture,
        "later_inputs_while_waiting": args.later_inputs_while_waiting,
        # In the capture manifest: a replay refuses to write there.
        "output_topics": [args.output_topic, args.dead_letter_topic, *([args.waits_topic] if args.waits_topic else [])],
    }
    if args.journal_topic:
        config["journal_topic"] = args.journal_topic
    config["tracing"] = tracing(args)
    replies = connect_to_agent(keyed, agent, config, signals=signals)

    sink = exactly_once_string_sink(args.bootstrap_servers, args.output_topic, prefix)
    (
        replies.map(lambda reply: json.dumps({"seq": reply.seq, **reply.output}, sort_keys=True),
                    output_type=Types.STRING()).name("format replies").uid("format-replies")
        .sink_to(sink).name("replies sink").uid("replies-sink")
    )
    if args.waits_topic:
        _wait_events_to_kafka(env, args, replies, prefix)
    return env


def _signals(env, args: argparse.Namespace, prefix: str):
    """The decisions of ``--signals-topic`` keyed by their ``key`` (the customer), or ``None`` without one. A record
    that is not a JSON object with a string ``key`` goes to the dead-letter topic; one with a key but no valid
    decision reaches the agent's operator, which reports it as a ``decision_rejected`` wait event."""
    if not args.signals_topic:
        return None
    ensure_topics(args.bootstrap_servers, [args.signals_topic], args.topic_partitions)
    # The dead letters' own transactional ids: no other sink's prefix extended (kafka_output).
    decisions = records_from_kafka(
        env, KafkaInput(args.bootstrap_servers, args.signals_topic, f"flink-agents-replay-{args.agent_id}-signals",
                        bounded=args.bounded),
        JsonRecords("key", args.max_record_bytes),
        DeadLetters(args.bootstrap_servers, args.dead_letter_topic, f"signal-dead-letters-{prefix}"), uid="signals")
    return decisions.key_by(lambda decision: decision["key"], key_type=Types.STRING())


def _wait_events_to_kafka(env, args: argparse.Namespace, replies, prefix: str) -> None:
    """The agent's wait events to ``--waits-topic`` (created compacted), keyed by wait id, exactly once."""
    ensure_topics(args.bootstrap_servers, [args.waits_topic], args.topic_partitions, topic_config=WAITS_TOPIC_CONFIG)
    sink = exactly_once_keyed_string_sink(env, args.bootstrap_servers, args.waits_topic, f"waits-{prefix}")
    (
        wait_events(replies).map(wait_event_record, output_type=keyed_string_type())
        .name("format wait events").uid("format-wait-events")
        .sink_to(sink).name("wait events sink").uid("wait-events-sink")
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        env = build(args)
    # A clear message, not a traceback from the Flink client; the MCP errors: --orders-mcp-url's server is listed here.
    except (ConfigError, McpConnectionError, McpProtocolError) as exc:
        print(f"flink_agents_replay.jobs.agent_job: {exc}", file=sys.stderr)
        return 2
    env.execute(f"flink-agents-replay {args.agent_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
