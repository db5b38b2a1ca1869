"""The chaos soak's job: tickets -> an agent with an external ledger call and per-customer memory -> replies.

``bench/chaos_soak.py`` submits this script to its local cluster with ``flink run -d -py`` (and again with
``-s <savepoint>`` at another parallelism). It is ``flink_agents_replay/jobs/agent_job.py``'s pipeline (Kafka source at
parallelism 1, ``key_by`` customer, the agent, Flink's exactly-once ``KafkaSink``) around an agent made to
make every invariant observable from outside the worker:

1. ``classify`` (on the input): one chat-model call to the local stub service (which counts every request
   and flags a request executed twice);
2. ``book`` (on ``Classified``): one *external* call to the soak's ledger service (``side_effects="external"``:
   a call in doubt is detected and re-sent with the same ``Idempotency-Key``; the service answers a repeat
   from its store and counts real executions per ticket in a SQLite file), then a call of the *fault gate*,
   then the memory update and the output.

The fault gate is how the soak injects "an exception in an action": when the file ``<fault dir>/raise-next``
exists, the first gate call that renames it away raises. The exception leaves ``book`` after its ledger
call returned, so the next attempt must reuse that call (not book twice) and make the gate call again
(a trailing failed call gets a new call id), which then passes.

Each output carries a summary of the customer's memory after the input (tickets seen, running total, a digest
of the ticket history): the last output of a customer is its final memory, compared with a failure-free
reference. Everything here is a pure function of the input, so outputs of a failure-free run in the soak's
process are the reference.

The agent lives in this script (not in an importable module) so the Flink worker gets it by value; the soak
imports this file by path to compute the reference.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from flink_agents_replay.api.agent import Agent, Event, InputEvent, OutputEvent, action
from flink_agents_replay.api.chat_model import ChatModel
from flink_agents_replay.api.resources import Tool, current_call_id

CATEGORIES = ("refund", "shipping", "account", "other")
#: The file whose presence makes the next fault-gate call raise (renamed to ``fired-<ticket>-<ns>`` when it does).
FAULT_TRIGGER = "raise-next"


class Classified(Event):
    """The ticket and its category."""


class LedgerClient:
    """The external tool: ``POST <base_url>/ledger`` books a ticket's amount, with the call id as idempotency key."""

    def __init__(self, base_url: str, timeout_s: float = 60.0):
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def __call__(self, ticket_id: str, customer: str, amount: int) -> dict[str, Any]:
        body = json.dumps({"ticket_id": ticket_id, "customer": customer, "amount": amount}).encode()
        headers = {"Content-Type": "application/json"}
        call_id = current_call_id()
        if call_id is not None:
            headers["Idempotency-Key"] = call_id
        request = urllib.request.Request(f"{self.base_url}/ledger", data=body, headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310 - loopback
            return json.loads(response.read())


class FaultGate:
    """Raises once per trigger file the soak drops into ``fault_dir`` (``None``: never raises)."""

    def __init__(self, fault_dir: str | None):
        self.fault_dir = fault_dir

    def __call__(self, ticket_id: str) -> None:
        if not self.fault_dir:
            return
        trigger = Path(self.fault_dir, FAULT_TRIGGER)
        fired = Path(self.fault_dir, f"fired-{ticket_id}-{time.time_ns()}")
        try:
            os.rename(trigger, fired)  # atomic: one call of one worker wins
        except FileNotFoundError:
            return
        raise RuntimeError(f"chaos soak: injected fault in action book at {ticket_id}")


def ticket_amount(ticket: dict[str, Any]) -> int:
    """The amount a ticket books (deterministic)."""
    return 1 + int(hashlib.sha256(ticket["ticket_id"].encode()).hexdigest()[:4], 16) % 97


def memory_summary(memory_count: int, total: int, history: list[str]) -> dict[str, Any]:
    """What an output says about the customer's memory after its input."""
    digest = hashlib.sha256("\n".join(history).encode()).hexdigest()[:16]
    return {"count": memory_count, "total": total, "history_digest": digest}


class SoakAgent(Agent):
    """Classify with the model, book on the ledger, remember the customer's tickets and total."""

    @action(InputEvent)
    def classify(event, ctx):
        ticket = event.input
        category = ctx.call("llm", prompt=(
            "Classify this customer support ticket into exactly one category.\n"
            f"Categories: {', '.join(CATEGORIES)}\n"
            f"Ticket {ticket['ticket_id']}: {ticket['text']}"
        )).strip().lower()
        ctx.send_event(Classified(ticket=ticket, category=category if category in CATEGORIES else "other"))

    @action(Classified)
    def book(event, ctx):
        ticket = event.ticket
        receipt = ctx.call("ledger", ticket["ticket_id"], ticket["customer"], ticket_amount(ticket))
        ctx.call("fault_gate", ticket["ticket_id"])
        total = ctx.memory.get("total", 0) + ticket_amount(ticket)
        history = [*ctx.memory.get("history", []), ticket["ticket_id"]]
        ctx.memory.set("total", total)
        ctx.memory.set("history", history)
        ctx.send_event(OutputEvent(output={
            "ticket_id": ticket["ticket_id"], "customer": ticket["customer"], "category": event.category,
            "receipt": receipt["receipt"], "memory": memory_summary(len(history), total, history),
        }))


def soak_agent(*, name: str, model_base_url: str, ledger_base_url: str, fault_dir: str | None) -> SoakAgent:
    """The agent with its resources: chat model ``llm``, external tool ``ledger``, ``fault_gate``."""
    return SoakAgent(name=name, resources={
        "llm": ChatModel("stub-model", base_url=model_base_url),
        "ledger": Tool(LedgerClient(ledger_base_url), side_effects="external"),
        "fault_gate": Tool(FaultGate(fault_dir), side_effects="none"),
    })


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--input-topic", required=True)
    parser.add_argument("--output-topic", required=True)
    parser.add_argument("--agent-id", required=True, help="keep it across restores (operator uid, journal topic)")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--checkpoint-interval-ms", type=int, default=2000)
    parser.add_argument("--model-base-url", required=True)
    parser.add_argument("--ledger-base-url", required=True)
    parser.add_argument("--fault-dir", required=True)
    parser.add_argument("--signing-key-file", required=True, help="file holding the journal signing key")
    parser.add_argument("--restart-attempts", type=int, default=100_000)
    parser.add_argument("--restart-delay-ms", type=int, default=1000)
    return parser.parse_args(argv)


def build(args: argparse.Namespace):
    """The job's environment with the pipeline defined on it (``flink_agents_replay.jobs.agent_job`` says why)."""
    from pyflink.common import Types, WatermarkStrategy
    from pyflink.common.serialization import SimpleStringSchema
    from pyflink.datastream.connectors.base import DeliveryGuarantee
    from pyflink.datastream.connectors.kafka import (
        KafkaOffsetsInitializer,
        KafkaRecordSerializationSchema,
        KafkaSink,
        KafkaSource,
    )

    from flink_agents_replay.flink.env import create_environment
    from flink_agents_replay.flink.pipeline import connect_to_agent
    from flink_agents_replay.local.jars import kafka_connector_jar

    env = create_environment(parallelism=args.parallelism, checkpoint_interval_ms=args.checkpoint_interval_ms,
                             restart_attempts=args.restart_attempts, restart_delay_ms=args.restart_delay_ms,
                             jars=[kafka_connector_jar()])
    source = (
        KafkaSource.builder().set_bootstrap_servers(args.bootstrap_servers).set_topics(args.input_topic)
        .set_group_id(f"soak-{args.agent_id}").set_starting_offsets(KafkaOffsetsInitializer.earliest())
        .set_value_only_deserializer(SimpleStringSchema()).build()
    )
    tickets = (
        env.from_source(source, WatermarkStrategy.no_watermarks(), "tickets").uid("tickets-source")
        .set_parallelism(1)
        .map(json.loads, output_type=Types.PICKLED_BYTE_ARRAY()).name("parse tickets").uid("parse-tickets")
        .set_parallelism(1)
    )
    keyed = tickets.key_by(lambda ticket: ticket["customer"], key_type=Types.STRING())
    agent = soak_agent(name=args.agent_id, model_base_url=args.model_base_url,
                       ledger_base_url=args.ledger_base_url, fault_dir=args.fault_dir)
    signing_key = Path(args.signing_key_file).read_text().strip()
    replies = connect_to_agent(keyed, agent, {"kafka": {"bootstrap.servers": args.bootstrap_servers},
                                              "signing_key": signing_key, "max_concurrent_runs": 16})
    sink = (
        KafkaSink.builder().set_bootstrap_servers(args.bootstrap_servers)
        .set_record_serializer(KafkaRecordSerializationSchema.builder().set_topic(args.output_topic)
                               .set_value_serialization_schema(SimpleStringSchema()).build())
        .set_delivery_guarantee(DeliveryGuarantee.EXACTLY_ONCE)
        .set_transactional_id_prefix(f"soak-{args.agent_id}")
        .set_property("transaction.timeout.ms", "600000")
        .build()
    )
    (
        replies.map(lambda reply: json.dumps({"seq": reply.seq, **reply.output}, sort_keys=True),
                    output_type=Types.STRING()).name("format replies").uid("format-replies")
        .sink_to(sink).name("replies sink").uid("replies-sink")
    )
    return env


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    build(args).execute(f"chaos soak {args.agent_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
