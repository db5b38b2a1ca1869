"""Replay job: a (changed) agent restored from a production savepoint, fed from production's capture.

Run it with Flink's own client, from a savepoint of ``flink_agents_replay.jobs.agent_job --capture``::

    flink run -s /tmp/savepoints/savepoint-... -pym flink_agents_replay.jobs.replay_job --replay-name try-voucher \\
        --agent flink_agents_replay.examples.support_triage:support_triage_agent_v2 --side-effects llm=live

then compare: ``flink-agents-replay diff --replay flink-agents-replay.support-triage.capture.replay-try-voucher``.

The job graph is the production agent's (same ``--agent-id``, so the same uid; same max parallelism and
key type) behind a bounded source reading the capture from the savepoint's checkpoint to its current end.
Before anything is submitted it checks the savepoint (this agent's state in it), the capture manifest
(an entry for the savepoint's checkpoint, the same key type and max parallelism) and the targets (the
replay's journal, capture and output topics must not be production's). The replay writes to topics
named after ``--replay-name``; the production job's source and sink state in the savepoint is not used
(a replay reads the capture), so the job is submitted with unclaimed state allowed. A replay that fails
is run again from the savepoint with a new ``--replay-name``: it is never resumed, so it has no restarts.

A capture record that does not verify (not this operator's, signed with another key, copied from another topic
or partition) goes to the dead-letter topic (default ``<output topic>.replay-<name>.dead-letters``) with the
reason, its partition and offset, and the replay goes on; its run is then missing from the diff.

``--trace`` / ``--otlp-endpoint`` / ``--trace-content`` are the main job's: the replay's runs are traced under the
service ``<service>-replay`` (each run a trace of its own, whose id the replay's capture records next to production's),
and ``diff --trace-url-template`` links the runs that differ to both traces.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

from pyflink.common import Types

from flink_agents_replay.core.errors import ConfigError, ReplayError
from flink_agents_replay.flink.config import (
    SIGNING_KEY_ENV,
    default_capture_topic,
    default_journal_topic,
    default_uid,
    job_signing_key,
)
from flink_agents_replay.flink.env import create_environment
from flink_agents_replay.flink.pipeline import connect_to_agent
from flink_agents_replay.integrations.kafka.admin import ensure_topics
from flink_agents_replay.jobs.connector import CONNECTOR_ENV, require_kafka_connector
from flink_agents_replay.jobs.kafka_input import DeadLetters, KafkaInput, records_from_kafka
from flink_agents_replay.jobs.kafka_output import exactly_once_string_sink
from flink_agents_replay.jobs.trace_flags import add_trace_arguments, tracing
from flink_agents_replay.replay.job import (
    CapturedInputParser,
    keyed_captured_inputs,
    prepare_replay,
    replay_config,
    savepoint_of,
)

DEFAULT_AGENT = "flink_agents_replay.examples.support_triage:support_triage_agent"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    parser.add_argument("--replay-name", required=True,
                        help="names this replay's topics: <production topic>.replay-<name> (journal, capture, outputs)")
    parser.add_argument("--agent-id", default="support-triage", help="the production agent's name (its uid)")
    parser.add_argument("--agent", default=DEFAULT_AGENT,
                        help="MODULE:FACTORY building the agent to replay, called with name=, model=, model_base_url=, "
                             f"orders_base_url= (and memory_url= with --memory-url) (default {DEFAULT_AGENT})")
    parser.add_argument("--capture-topic", default=None, help="production's capture topic (default the agent's)")
    parser.add_argument("--output-topic", default="replies",
                        help="production's output topic: the replay writes to <it>.replay-<name> (default replies)")
    parser.add_argument("--dead-letter-topic", default=None,
                        help="where capture records that do not verify go (default <output topic>.replay-<name>"
                             ".dead-letters)")
    parser.add_argument("--connector-jar", action="append", default=[],
                        help=f"Flink's Kafka connector jar, if not in Flink's lib/ or given with --jarfile "
                             f"(else ${CONNECTOR_ENV})")
    parser.add_argument("--savepoint", default=None, help="the savepoint (default: the one `flink run -s` gives)")
    parser.add_argument("--side-effects", default="",
                        help="policies per resource, e.g. llm=live,orders=recorded ('*' for all others); unnamed "
                             "resources: none/idempotent live, external blocked")
    parser.add_argument("--waits", default="recorded", choices=["recorded", "approve", "deny"],
                        help="what waits (ctx.wait_for) get: production's recorded decisions (a wait production "
                             "never decided stays open if production never finished the run either, and is "
                             "blocked if it did), or approve all, or deny all (default recorded)")
    parser.add_argument("--key-type", default="STRING", choices=["STRING", "LONG", "INT"])
    parser.add_argument("--max-parallelism", type=int, default=128, help="the production job's (default 128)")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--model-base-url", default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"))
    parser.add_argument("--model", default=os.environ.get("OPENAI_MODEL", "stub-model"))
    parser.add_argument("--orders-base-url", default=None)
    parser.add_argument("--memory-url", default=os.environ.get("CHROMA_URL") or None,
                        help="the Chroma server of production's long-term memory (default $CHROMA_URL): read as of "
                             "the savepoint, written into this replay's overlay only")
    parser.add_argument("--signing-key-file", default=None,
                        help="file whose first line is the journal signing key (else $FLINK_AGENTS_REPLAY_SIGNING_KEY)")
    parser.add_argument("--signing-key", default=None,
                        help="the signing key itself: shows in `ps`; prefer --signing-key-file or the environment")
    add_trace_arguments(parser)  # the replay's runs are traced under <service>-replay, production's service name
    args = parser.parse_args(argv)
    try:  # a bad key file is a usage error, reported without a traceback and without the key
        args.signing_key = job_signing_key(key_file=args.signing_key_file, key=args.signing_key)
    except ConfigError as exc:
        parser.error(str(exc))
    if not args.signing_key:
        parser.error(f"the capture is signed: give --signing-key or set ${SIGNING_KEY_ENV}")
    return args


def load_agent(args: argparse.Namespace):
    """The agent ``--agent`` names, built with the job's model settings."""
    module_name, _, factory_name = args.agent.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), factory_name)
    except (ImportError, AttributeError) as exc:
        raise ReplayError(f"--agent {args.agent!r}: {exc}; give MODULE:FACTORY") from None
    memory = {"memory_url": args.memory_url} if args.memory_url else {}
    return factory(name=args.agent_id, model=args.model, model_base_url=args.model_base_url,
                   orders_base_url=args.orders_base_url, **memory)


def _replay_id(args: argparse.Namespace, what: str) -> str:
    """A Kafka id (consumer group, transactional id prefix) of this replay's ``what``: the agent and the replay
    name in it, so two replays (of two agents, or two names) never share one, and no prefix extends another."""
    return f"flink-agents-replay.{args.agent_id}.replay-{args.replay_name}.{what}"


def _captured_records(env, args: argparse.Namespace, settings, uid: str, dead_letter_topic: str):
    """Production's captured inputs after the savepoint; records that do not verify go to dead letters."""
    capture = settings.production_capture_topic
    parse = CapturedInputParser(args.signing_key.encode(), uid, topic=capture, key_type=args.key_type,
                                max_parallelism=len(settings.start_offsets))
    source = KafkaInput(args.bootstrap_servers, capture, _replay_id(args, "capture-reader"),
                        bounded=True, start_offsets=settings.start_offsets)
    dead_letters = DeadLetters(args.bootstrap_servers, dead_letter_topic,
                               _replay_id(args, "dead-letters"))
    return records_from_kafka(env, source, parse, dead_letters, uid="replay-captured-inputs",
                              parallelism=args.parallelism)


def build(args: argparse.Namespace):
    """The replay job's environment with its pipeline, after every check."""
    kafka = {"bootstrap.servers": args.bootstrap_servers}
    uid = default_uid(args.agent_id)
    capture_topic = args.capture_topic or default_capture_topic(uid)
    restore = {"execution.state-recovery.ignore-unclaimed-state": "true"}  # production's source and sink state
    if args.savepoint:
        restore["execution.state-recovery.path"] = args.savepoint
    env = create_environment(parallelism=args.parallelism, checkpoint_interval_ms=2000, restart_attempts=0,
                             config=restore)
    require_kafka_connector(env, args.connector_jar)
    savepoint = savepoint_of(env)
    if not savepoint:
        raise ReplayError("a replay starts from a production savepoint: flink run -s <savepoint> -pym "
                          "flink_agents_replay.jobs.replay_job ... (or --savepoint)")
    settings = prepare_replay(kafka, capture_topic, savepoint, uid=uid, key_type=args.key_type,
                              max_parallelism=args.max_parallelism, policies=args.side_effects,
                              wait_policy=args.waits)
    suffix = f"replay-{args.replay_name}"
    production_journal = settings.production_journal_topic or default_journal_topic(uid)
    topics = {"journal": f"{production_journal}.{suffix}", "capture": f"{capture_topic}.{suffix}",
              "outputs": f"{args.output_topic}.{suffix}"}
    topics["dead_letters"] = args.dead_letter_topic or f"{topics['outputs']}.dead-letters"
    config = replay_config({"kafka": kafka, "signing_key": args.signing_key, "max_parallelism": args.max_parallelism,
                            "tracing": tracing(args)},
                           settings, journal_topic=topics["journal"], capture_topic=topics["capture"],
                           output_topics=[topics["outputs"], topics["dead_letters"]])
    # Read, parsed and timestamped at the job's parallelism, one to one, as the value-only source was (design §15).
    records = _captured_records(env, args, settings, uid, topics["dead_letters"])
    inputs = keyed_captured_inputs(records, args.key_type, parallelism=args.parallelism)
    outputs = connect_to_agent(inputs, load_agent(args), config)  # refuses production topics as targets
    ensure_topics(args.bootstrap_servers, [topics["outputs"], topics["dead_letters"]], 1)
    (
        outputs.map(lambda reply: json.dumps({"seq": reply.seq, **reply.output}, sort_keys=True),
                    output_type=Types.STRING()).name("format replies").uid("replay-format-replies")
        .sink_to(exactly_once_string_sink(args.bootstrap_servers, topics["outputs"],
                                          _replay_id(args, "replies")))
        .name("replay replies sink").uid("replay-replies-sink")
    )
    print(f"replay {args.replay_name} from checkpoint {settings.checkpoint_id} of {savepoint}: capture "
          f"{capture_topic} -> journal {topics['journal']}, capture {topics['capture']}, outputs {topics['outputs']}",
          flush=True)
    return env, topics, settings.memory_as_of


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        env, topics, memory_as_of = build(args)
    except ReplayError as exc:  # ConfigError too: a clear message, not a traceback from the Flink client
        print(f"flink_agents_replay.jobs.replay_job: {exc}", file=sys.stderr)
        return 2
    detached = env._j_stream_execution_environment.getConfiguration().toMap().get("execution.attached") == "false"
    result = env.execute(f"flink-agents-replay replay {args.replay_name}")
    memory = (f" --memory-store {args.memory_url} --memory-namespace {args.agent_id}/memory --as-of {memory_as_of}"
              if args.memory_url else "")
    compare = f"flink-agents-replay diff --replay {topics['capture']} --agent-id {args.agent_id}{memory}"
    if detached:  # flink run -d: the job has only been submitted, and may still fail
        print(f"replay submitted as job {result.get_job_id()}; once it has FINISHED, compare it: {compare}")
        return 0
    print(f"replay done; compare it: {compare}")
    if _holds_records(args.bootstrap_servers, topics["dead_letters"]):
        print(f"warning: capture records that do not verify went to {topics['dead_letters']}: their runs are not "
              "in the replay, and the diff does not count them", file=sys.stderr)
    return 0


def _holds_records(bootstrap_servers: str, topic: str) -> bool:
    """Whether anything was written to ``topic`` (one partition) at all."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "flink-agents-replay.watermarks"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    except KafkaException:
        return False
    finally:
        consumer.close()
    return high > low


if __name__ == "__main__":
    sys.exit(main())
