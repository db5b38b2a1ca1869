"""Embedding an agent in an existing PyFlink job: one call, ``connect_to_agent``.

This is a job you might already have: it reads support tickets (JSON) from Kafka, parses and filters them
with its own Python functions, and writes replies to Kafka. Embedding the agent means putting it between
two of your operators, on a stream keyed with a declared key type::

    keyed = tickets.key_by(lambda ticket: ticket["customer"], key_type=Types.STRING())
    replies = connect_to_agent(keyed, SupportAgent(...), {"kafka": {...}, "signing_key": ...})

Nothing else in the job changes. Your functions keep PyFlink's default ``python.execution-mode: process``
(they run in Python worker processes); the agent's operator always runs in thread mode, inside the
TaskManager's JVM, whatever the job's mode: that is where its checkpoint hooks live. The one extra setting
such a job needs is ``python.pythonpath`` naming the directories of this package and its dependencies
(here: this virtualenv), because the agent's embedded interpreter does not see a virtualenv by itself.

Run it on a local MiniCluster, with 20 sample tickets written to a new topic first::

    FLINK_AGENTS_REPLAY_SIGNING_KEY=... python tests/jobs/embedded_agent_job.py --bootstrap-servers HOST:PORT \\
        --inputs 20

or with ``flink run -py tests/jobs/embedded_agent_job.py --bootstrap-servers HOST:PORT --input-topic T
--output-topic O`` on a cluster (``--output-topic`` writes with Flink's exactly-once ``KafkaSink``; without it
replies are printed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid

from pyflink.common import Configuration, Types, WatermarkStrategy
from pyflink.common.serialization import SimpleStringSchema
from pyflink.datastream import DataStream, StreamExecutionEnvironment
from pyflink.datastream.connectors.base import DeliveryGuarantee
from pyflink.datastream.connectors.kafka import (
    KafkaOffsetsInitializer,
    KafkaRecordSerializationSchema,
    KafkaSink,
    KafkaSource,
)

from flink_agents_replay import Agent, AgentOutput, Event, InputEvent, OutputEvent, Tool, action, connect_to_agent
from flink_agents_replay.core.errors import ConfigError
from flink_agents_replay.flink.config import job_signing_key
from flink_agents_replay.flink.env import python_path
from flink_agents_replay.local.jars import kafka_connector_jar

# --- the agent -------------------------------------------------------------------------------------------


def lookup_customer(customer: str) -> dict:
    """Stands in for a CRM request."""
    return {"customer": customer, "tier": "gold" if customer[-1] in "14" else "standard"}


def draft_reply(text: str, tier: str) -> str:
    """Stands in for a model call (a ``ChatModel`` resource is called through ``ctx.call`` the same way)."""
    opening = "Thank you for being a gold customer." if tier == "gold" else "Thank you for writing."
    return f"{opening} About '{text}': we are on it."


class Triaged(Event):
    """A ticket and its customer's tier."""


class SupportAgent(Agent):
    @action(InputEvent)
    def triage(event, ctx):
        ticket = event.input
        customer = ctx.call("crm", ticket["customer"])  # journaled: after a failure it is reused, not repeated
        ctx.memory.set("tickets", ctx.memory.get("tickets", 0) + 1)
        ctx.send_event(Triaged(ticket=ticket, tier=customer["tier"]))

    @action(Triaged)
    def answer(event, ctx):
        reply = ctx.call("writer", event.ticket["text"], event.tier)
        ctx.send_event(OutputEvent(output={"ticket": event.ticket["id"], "tier": event.tier, "reply": reply,
                                           "customer_tickets": ctx.memory.get("tickets")}))


def support_agent() -> SupportAgent:
    return SupportAgent(name="support", resources={
        "crm": Tool(lookup_customer, side_effects="none"),
        "writer": Tool(draft_reply, side_effects="none"),
    })


# --- the job's own functions (process mode) -------------------------------------------------------------


def parse_ticket(line: str) -> dict:
    ticket = json.loads(line)
    return {**ticket, "text": ticket["text"].strip()}


def is_open(ticket: dict) -> bool:
    return ticket["status"] == "open"


def format_reply(output: AgentOutput) -> str:
    return json.dumps({"customer": output.key, "seq": output.seq, **output.output}, sort_keys=True)


# --- the job ---------------------------------------------------------------------------------------------


def create_environment(*, parallelism: int = 2, checkpoint_interval_ms: int = 2000,
                       restart_attempts: int = 3) -> StreamExecutionEnvironment:
    """A process-mode environment, as an existing job has it."""
    config = Configuration()
    config.set_string("python.execution-mode", "process")  # the job's own Python functions: worker processes
    config.set_string("python.executable", sys.executable)
    config.set_string("python.client.executable", sys.executable)
    config.set_string("python.pythonpath", os.pathsep.join(python_path()))  # for the agent's embedded interpreter
    config.set_string("pipeline.jars", kafka_connector_jar().resolve().as_uri())
    config.set_string("restart-strategy.type", "fixed-delay")
    config.set_string("restart-strategy.fixed-delay.attempts", str(restart_attempts))
    config.set_string("restart-strategy.fixed-delay.delay", "500 ms")
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.set_parallelism(parallelism)
    env.enable_checkpointing(checkpoint_interval_ms)  # the agent prunes its journal at completed checkpoints
    return env


def read_tickets(env, bootstrap_servers: str, topic: str, *, bounded: bool = False) -> DataStream:
    """The topic's JSON lines. One source instance, so each customer's tickets keep their order."""
    builder = (
        KafkaSource.builder().set_bootstrap_servers(bootstrap_servers).set_topics(topic)
        .set_group_id("embedded-agent-job").set_starting_offsets(KafkaOffsetsInitializer.earliest())
        .set_value_only_deserializer(SimpleStringSchema())
    )
    if bounded:
        builder = builder.set_bounded(KafkaOffsetsInitializer.latest())
    return (env.from_source(builder.build(), WatermarkStrategy.no_watermarks(), "tickets")
            .uid("tickets").set_parallelism(1))


def build(lines: DataStream, agent: Agent, agent_config: dict) -> DataStream:
    """Parse and filter -> the agent -> format: the DataStream of replies (JSON lines)."""
    tickets = (lines.map(parse_ticket, output_type=Types.PICKLED_BYTE_ARRAY()).uid("parse").set_parallelism(1)
               .filter(is_open).uid("open-tickets").set_parallelism(1))
    keyed = tickets.key_by(lambda ticket: ticket["customer"], key_type=Types.STRING())
    outputs = connect_to_agent(keyed, agent, agent_config)  # <- the one call
    return outputs.map(format_reply, output_type=Types.STRING()).uid("format")


def sample_tickets(count: int) -> list[dict]:
    texts = ["My invoice is wrong", "  Cannot log in ", "Please cancel my order", "Where is my parcel?"]
    return [{"id": i, "customer": f"customer-{i % 6}", "text": texts[i % len(texts)],
             "status": "closed" if i % 5 == 4 else "open"} for i in range(count)]


def write_tickets(bootstrap_servers: str, topic: str, tickets: list[dict]) -> None:
    """Create ``topic`` (one partition) and write ``tickets`` to it as JSON lines."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    for future in admin.create_topics([NewTopic(topic, 1, 1)], request_timeout=30).values():
        future.result(timeout=60)
    producer = Producer({"bootstrap.servers": bootstrap_servers, "enable.idempotence": True})
    for ticket in tickets:
        producer.produce(topic, json.dumps(ticket).encode(), key=ticket["customer"].encode())
    if producer.flush(60):
        raise RuntimeError("the sample tickets were not acknowledged")


def kafka_sink(bootstrap_servers: str, topic: str) -> KafkaSink:
    return (
        KafkaSink.builder().set_bootstrap_servers(bootstrap_servers)
        .set_record_serializer(KafkaRecordSerializationSchema.builder().set_topic(topic)
                               .set_value_serialization_schema(SimpleStringSchema()).build())
        .set_delivery_guarantee(DeliveryGuarantee.EXACTLY_ONCE)
        .set_transactional_id_prefix(f"embedded-agent-job-{topic}")
        .build()
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap-servers", required=True)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--input-topic", help="read tickets from this topic (runs until cancelled)")
    source.add_argument("--inputs", type=int, help="write this many sample tickets to a new topic and process them")
    parser.add_argument("--output-topic", help="write replies here (exactly once); default: print them")
    parser.add_argument("--signing-key-file", default=None,
                        help="file whose first line is the journal signing key (else $FLINK_AGENTS_REPLAY_SIGNING_KEY)")
    parser.add_argument("--signing-key", default=None,
                        help="the signing key itself: shows in `ps`; prefer --signing-key-file or the environment")
    parser.add_argument("--parallelism", type=int, default=2)
    args = parser.parse_args(argv)
    try:  # a bad key file is a usage error, reported without a traceback and without the key
        args.signing_key = job_signing_key(key_file=args.signing_key_file, key=args.signing_key)
    except ConfigError as exc:
        parser.error(str(exc))

    topic = args.input_topic
    if args.inputs is not None:
        topic = f"tickets-{uuid.uuid4().hex[:8]}"
        write_tickets(args.bootstrap_servers, topic, sample_tickets(args.inputs))
    env = create_environment(parallelism=args.parallelism)
    lines = read_tickets(env, args.bootstrap_servers, topic, bounded=args.inputs is not None)
    replies = build(lines, support_agent(), {"kafka": {"bootstrap.servers": args.bootstrap_servers},
                                             "signing_key": args.signing_key})
    if args.output_topic:
        replies.sink_to(kafka_sink(args.bootstrap_servers, args.output_topic)).uid("replies")
    else:
        replies.print().uid("replies")
    env.execute("embedded agent job")
    return 0


if __name__ == "__main__":
    sys.exit(main())
