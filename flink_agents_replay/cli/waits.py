"""``flink-agents-replay waits list|decide``: the people's side of runs that wait for a decision.

``waits list`` reads a job's waits topic (the wait events of :mod:`flink_agents_replay.jobs.waits_topic`) from
its first stored record to its committed end (``read_committed``: what the job committed, each once), folds the
events by wait id and prints the pending waits: opened, and neither resumed nor closed. ``waits decide`` sends
one decision (:mod:`flink_agents_replay.flink.signals`) for a wait to the job's signals topic, keyed by the key
of the run that waits, and returns once Kafka acknowledged it.

The waits topic is written at the job's checkpoints: a wait shows here a checkpoint interval after it opened,
and a decision shows as ``resumed`` a checkpoint interval after the job applied it.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import asdict
from datetime import datetime, timezone
from typing import Any

from flink_agents_replay.core.errors import ConfigError, FlinkAgentsReplayError
from flink_agents_replay.flink.signals import SIGNAL_VERSION
from flink_agents_replay.integrations.kafka.settings import KafkaSettings
from flink_agents_replay.jobs.waits_topic import Folded, WaitState, fold_wait_events

__all__ = ["Folded", "WaitState", "decision_record", "fold_wait_events", "format_waits", "key_of_wait", "parse_value",
           "read_wait_events", "selected", "send_decision", "wait_json"]

#: How much of a payload the table shows.
PAYLOAD_SHOWN = 48


def selected(folded: Folded, *, key: str | None = None, everything: bool = False) -> list[WaitState]:
    """The pending waits (every wait with ``everything``), of ``key`` if given, oldest first."""
    waits = [w for w in folded.waits.values() if (everything or w.pending) and (key is None or str(w.key) == key)]
    return sorted(waits, key=lambda w: (w.opened_at_ms is None, w.opened_at_ms or 0, w.wait_id))


def format_time(epoch_ms: int | None) -> str:
    """``2026-05-01T08:00:00Z`` (UTC), or ``-``."""
    if epoch_ms is None:
        return "-"
    return datetime.fromtimestamp(epoch_ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def shorten(text: str, width: int = PAYLOAD_SHOWN) -> str:
    """``text`` on one line, cut to ``width`` characters with ``...`` if longer."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 3] + "..."


def format_waits(waits: list[WaitState], *, everything: bool = False) -> str:
    """The waits as a table: wait id, key, name, payload (shortened), opened at, deadline (and with
    ``everything`` the last event's kind)."""
    header = ["WAIT ID", "KEY", "NAME", "PAYLOAD", "OPENED AT", "DEADLINE"] + (["LAST KIND"] if everything else [])
    rows = [[w.wait_id, str(w.key), w.name or "-", shorten(json.dumps(w.payload, sort_keys=True)),
             format_time(w.opened_at_ms), format_time(w.deadline_ms)] + ([w.last_kind or "-"] if everything else [])
            for w in waits]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                     for row in [header, *rows])


def key_of_wait(folded: Folded, wait_id: str, topic: str) -> Any:
    """The key of the run waiting at ``wait_id``; an error for a wait with no event in ``folded`` (read from
    ``topic``), or one resumed or closed already (a second decision would be ignored)."""
    wait = folded.waits.get(wait_id)
    if wait is None:
        raise FlinkAgentsReplayError(f"unknown wait id {wait_id!r}: no event of it in waits topic {topic!r} "
                                     f"({folded.events} events read); `waits list` shows the pending ones (a wait "
                                     "shows there once the job's next checkpoint completed)")
    if wait.state in ("resumed", "closed"):
        decided = "" if wait.decision is None else f" with decision {json.dumps(wait.decision, sort_keys=True)}"
        raise FlinkAgentsReplayError(f"wait {wait_id} is {wait.state} already{decided}: the job would ignore a "
                                     "second decision")
    return wait.key


def wait_json(wait: WaitState) -> dict[str, Any]:
    """A wait as ``waits list --json`` prints it."""
    return {**asdict(wait), "pending": wait.pending}


def decision_record(key: Any, wait_id: str, *, approved: bool, reason: str | None = None, value: Any = None,
                    with_value: bool = False, by: str | None = None) -> dict[str, Any]:
    """The decision a signals topic takes (:mod:`flink_agents_replay.flink.signals`), with a fresh ``signal_id``
    and ``sent_at_ms`` now. ``value`` goes in when ``with_value`` (``null`` is a value too)."""
    record: dict[str, Any] = {"v": SIGNAL_VERSION, "key": key, "wait_id": wait_id, "approved": approved,
                              "signal_id": uuid.uuid4().hex, "sent_at_ms": int(time.time() * 1000)}
    if reason is not None:
        record["reason"] = reason
    if by is not None:
        record["by"] = by
    if with_value:
        record["value"] = value
    return record


def parse_value(text: str) -> Any:
    """``--value``: a JSON value (``ConfigError`` saying so when it is not one)."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:
        raise ConfigError(f"--value {text!r} is not JSON ({exc}); give a JSON value, e.g. --value '{{\"amount\": "
                          "120}' or --value '\"text\"'") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value the job takes")


# -- Kafka ----------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _kafka_errors(kafka: KafkaSettings) -> Iterator[None]:
    """A Kafka client's error (a bad -X setting, a broken connection) as one line saying where."""
    from confluent_kafka import KafkaException

    try:
        yield
    except KafkaException as exc:
        raise FlinkAgentsReplayError(f"Kafka at {kafka.bootstrap_servers}: {exc.args[0]}") from None


def read_wait_events(kafka: KafkaSettings, topic: str, *, timeout_s: float = 15.0) -> list[bytes]:
    """The values of every record of the waits topic ``topic``, from the first stored one to the committed end
    (``read_committed``), partition by partition (a wait's events are in one partition, in order)."""
    from confluent_kafka import Consumer, TopicPartition

    from flink_agents_replay.integrations.kafka.admin import KafkaAdmin

    with _kafka_errors(kafka):
        admin = KafkaAdmin(kafka, timeout_s=timeout_s)
        count = admin.partition_count(topic)  # an unreachable broker: a JournalError saying what to check
        if count is None:
            raise FlinkAgentsReplayError(f"waits topic {topic!r} does not exist on {kafka.bootstrap_servers} (the "
                                         "job creates it when started with --waits-topic)")
        starts = admin.start_offsets(topic, range(count))
        ends = admin.end_offsets(topic, range(count), committed_only=True)
        todo = {p for p in range(count) if ends[p] > starts[p]}
        values: dict[int, list[bytes]] = {p: [] for p in todo}
        if not todo:
            return []
        consumer = Consumer({**kafka.reader_config(purpose="waits", committed_only=True),
                             "enable.partition.eof": True})
        try:
            consumer.assign([TopicPartition(topic, p, starts[p]) for p in sorted(todo)])
            deadline = time.monotonic() + timeout_s
            while todo:
                if time.monotonic() > deadline:
                    raise FlinkAgentsReplayError(f"could not read waits topic {topic!r} to its end within "
                                                 f"{timeout_s:g} s (partitions {sorted(todo)} not done)")
                _poll_into(consumer, values, todo, ends)
        finally:
            consumer.close()
    return [value for p in sorted(values) for value in values[p]]


def _poll_into(consumer, values: dict[int, list[bytes]], todo: set[int], ends: Mapping[int, int]) -> None:
    """One poll: a record into ``values``; a partition read to its end (or whose end came: an EOF) out of ``todo``."""
    from confluent_kafka import KafkaError, KafkaException

    message = consumer.poll(0.2)
    if message is None:
        return
    partition = message.partition()
    if message.error() is not None:
        if message.error().code() != KafkaError._PARTITION_EOF:
            raise KafkaException(message.error())
        todo.discard(partition)
        return
    if partition in todo:
        if message.value() is not None:  # a tombstone: nothing to fold
            values[partition].append(message.value())
        if message.offset() + 1 >= ends[partition]:
            todo.discard(partition)


def send_decision(kafka: KafkaSettings, topic: str, record: Mapping[str, Any], *,
                  timeout_s: float = 15.0) -> tuple[int, int]:
    """Produce ``record`` to the signals topic ``topic``, keyed by its ``key``; wait for Kafka's acknowledgement.
    Returns its partition and offset."""
    from confluent_kafka import Producer

    from flink_agents_replay.integrations.kafka.admin import KafkaAdmin

    delivered: list = []
    with _kafka_errors(kafka):
        if KafkaAdmin(kafka, timeout_s=timeout_s).partition_count(topic) is None:
            raise FlinkAgentsReplayError(f"signals topic {topic!r} does not exist on {kafka.bootstrap_servers} (the "
                                         "job creates it when started with --signals-topic)")
        producer = Producer(kafka.producer_config(durable=True, what="waits decide", ack_timeout_s=timeout_s))
        producer.produce(topic, json.dumps(record, sort_keys=True).encode(), key=str(record["key"]).encode(),
                         on_delivery=lambda error, message: delivered.append((error, message)))
        producer.flush(timeout_s)
    if not delivered:
        raise FlinkAgentsReplayError(f"Kafka at {kafka.bootstrap_servers} did not acknowledge the decision within "
                                     f"{timeout_s:g} s; it may still arrive (the job ignores a second one)")
    error, message = delivered[0]
    if error is not None:
        raise FlinkAgentsReplayError(f"the decision was not written to {topic!r}: {error}")
    return message.partition(), message.offset()
