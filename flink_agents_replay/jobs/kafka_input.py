"""JSON records from Kafka, with the ones a job cannot take sent to a dead-letter topic instead of failing it.

A record that fails a job is read back after every restart: one bad record (a *poison pill*) stops the job for
good. Here each record is checked before it reaches the agent: it must be UTF-8 JSON, an object, no larger
than ``max_record_bytes``, and carry the key field as a string. A record that is not goes to the dead-letter
topic as JSON with the reason and where it came from, and the job goes on::

    {"v": 1, "reason": "not JSON: Expecting value: line 1 column 1 (char 0)", "topic": "tickets", "partition": 0,
     "offset": 41, "timestamp": 1733390000000, "bytes": 9, "value": "not json!", "truncated": false}

Dead letters leave through Flink's exactly-once ``KafkaSink`` (a ``read_committed`` consumer sees each once,
also across restarts) and are counted in the parse operator's ``deadLetters`` metric. The source keeps each
record's partition and offset through a small deserializer shipped in the package's jar
(``PositionedKafkaRecords``): PyFlink's own Kafka source hands over values only.

The same deserializer reads a record's W3C ``traceparent`` header (its last one, as UTF-8 text). A record taken with
one travels to the agent's operator as a :func:`~flink_agents_replay.core.events.traced_input`, which the stream
returned here hides from every function of the job (:mod:`flink_agents_replay.flink.traced_input`): the key selector
and the agent see the record, the run's trace links to the upstream span and the capture keeps the header.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyflink.datastream import ProcessFunction

from flink_agents_replay.core.events import traced_input
from flink_agents_replay.flink.traced_input import TracedRecords
from flink_agents_replay.jobs.kafka_output import exactly_once_string_sink
from flink_agents_replay.traces.ids import well_formed_traceparent

__all__ = ["DEAD_LETTER_METRIC", "DEAD_LETTER_VERSION", "DeadLetter", "DeadLetters", "JsonRecords", "KafkaInput",
           "RecordParser", "check_json_record", "records_from_kafka"]

DEAD_LETTER_METRIC = "deadLetters"
#: The dead-letter record's format (its ``"v"``): consumers of the topic can tell a later one.
DEAD_LETTER_VERSION = 1
#: How much of a dead record's value its dead letter keeps (the rest is counted in ``bytes``), and of its reason.
_VALUE_KEPT = 16 * 1024
_REASON_KEPT = 1024


@dataclass(frozen=True)
class KafkaInput:
    """Where records come from. ``start_offsets`` (partition -> offset) replaces the earliest offsets of a fresh
    start; a restore always continues from the checkpoint's offsets."""

    bootstrap_servers: str
    topic: str
    group_id: str
    bounded: bool = False
    start_offsets: Mapping[int, int] | None = None
    kafka_properties: Mapping[str, str] | None = None


@dataclass(frozen=True)
class DeadLetters:
    """Where records the job does not take go: a topic, written exactly once by its own transactional ids."""

    bootstrap_servers: str
    topic: str
    transactional_id_prefix: str
    kafka_properties: Mapping[str, str] | None = None


@dataclass(frozen=True)
class DeadLetter:
    """A record the job did not take: why, and where it was."""

    reason: str
    topic: str
    partition: int
    offset: int
    timestamp: int
    value: bytes | None

    def to_json(self) -> str:
        value = self.value or b""
        return json.dumps({
            "v": DEAD_LETTER_VERSION, "reason": self.reason[:_REASON_KEPT], "topic": self.topic,
            "partition": self.partition, "offset": self.offset, "timestamp": self.timestamp, "bytes": len(value),
            "value": value[:_VALUE_KEPT].decode("utf-8", errors="replace") if self.value is not None else None,
            "truncated": len(value) > _VALUE_KEPT,
        }, sort_keys=True)


#: A parse: ``(value, None)`` takes the record, ``(None, reason)`` sends it to the dead letters,
#: ``(None, None)`` skips it (a record of another kind). Called with the value's bytes and its partition.
RecordParser = Callable[[bytes | None, int], tuple[Any, str | None]]


#: The default size limit of a record: well below the journal's (Kafka's 1 MB message), since an action's journal
#: record holds what it sends on, which may be the whole input.
DEFAULT_MAX_RECORD_BYTES = 256 * 1024
#: How deep a record may nest. The journal digests inputs to recognise them after a restore, and refuses values
#: nested deeper than 64 levels: a deeper record would fail the agent's operator on every restart.
MAX_NESTING = 32


class JsonRecords:
    """A parse for JSON objects: at most ``max_record_bytes``, a string ``key_field`` and every ``required`` field
    (the ones the agent reads; a record without one would fail its action on every restart)."""

    def __init__(self, key_field: str, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
                 required: tuple[str, ...] = ()):
        self.key_field = key_field
        self.max_record_bytes = max_record_bytes
        self.required = required

    def __call__(self, value: bytes | None, partition: int) -> tuple[dict | None, str | None]:
        record, reason = check_json_record(value, self.key_field, self.max_record_bytes)
        missing = [name for name in self.required if record is not None and name not in record]
        if missing:
            return None, f"no field {missing[0]!r} (the agent reads it)"
        return record, reason


def _shape(value: Any) -> tuple[int, str | None]:
    """How many levels of lists and objects ``value`` has, and a string in it that is not valid Unicode (a lone
    surrogate, which JSON's ``\\ud800`` escapes can make), if any. Iterative: a deep value must not overflow."""
    deepest, invalid, stack = 0, None, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                invalid = item
            continue
        children = [*item, *item.values()] if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in children)
    return deepest, invalid


def check_json_record(value: bytes | None, key_field: str, max_record_bytes: int) -> tuple[dict | None, str | None]:
    """``(record, None)`` for an acceptable value, else ``(None, reason)``."""
    if value is None:
        return None, "no value (a tombstone)"
    if len(value) > max_record_bytes:
        return None, f"larger than the limit: {len(value)} bytes > {max_record_bytes}"
    try:
        record = json.loads(value.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8: {exc}"
    except ValueError as exc:
        return None, f"not JSON: {exc}"
    except RecursionError:
        return None, f"nested deeper than {MAX_NESTING} levels"
    depth, invalid = _shape(record)
    if depth > MAX_NESTING:
        return None, f"nested deeper than {MAX_NESTING} levels"
    if invalid is not None:
        return None, f"a string is not valid Unicode (a lone surrogate): {invalid!r:.60}"
    if not isinstance(record, dict):
        return None, f"not a JSON object: a {type(record).__name__}"
    if key_field not in record:
        return None, f"no key field {key_field!r}"
    if not isinstance(record[key_field], str):
        return None, f"key field {key_field!r} is not a string: {record[key_field]!r}"
    return record, None


class _ParseRecords(ProcessFunction):
    """The parse operator's function: taken records on, dead letters to the side output, counted."""

    def __init__(self, parse: RecordParser, dead_letters):
        super().__init__()
        self.parse = parse
        self.dead_letters = dead_letters
        self.counter = None

    def open(self, runtime_context) -> None:
        self.counter = runtime_context.get_metrics_group().counter(DEAD_LETTER_METRIC)

    def process_element(self, row, ctx) -> Iterator[Any]:
        try:
            record, reason = self.parse(row.value, row.partition)
        except Exception as exc:  # a parse that breaks on a record must not fail the job on every restart
            record, reason = None, f"the parse failed: {type(exc).__name__}: {exc}"
        if reason is None:
            if record is not None:
                traceparent = well_formed_traceparent(row.traceparent)
                yield traced_input(record, traceparent) if traceparent is not None else record
            return
        self.counter.inc()
        letter = DeadLetter(reason, row.topic, row.partition, row.offset, row.timestamp, row.value)
        yield self.dead_letters, letter.to_json()


def _positioned_source(source: KafkaInput):
    from pyflink.datastream.connectors.kafka import KafkaOffsetsInitializer, KafkaSource, KafkaTopicPartition
    from pyflink.java_gateway import get_gateway

    if source.start_offsets is not None:
        starting = KafkaOffsetsInitializer.offsets(
            {KafkaTopicPartition(source.topic, p): offset for p, offset in source.start_offsets.items()})
    else:
        starting = KafkaOffsetsInitializer.earliest()
    builder = (
        KafkaSource.builder().set_bootstrap_servers(source.bootstrap_servers).set_topics(source.topic)
        .set_group_id(source.group_id)
        .set_starting_offsets(starting)  # a fresh start only: a restore continues from the checkpoint's offsets
    )
    for setting, value in (source.kafka_properties or {}).items():
        builder = builder.set_property(setting, str(value))
    if source.bounded:
        builder = builder.set_bounded(KafkaOffsetsInitializer.latest())
    records = get_gateway().jvm.io.github.flinkagentsreplay.bridge.PositionedKafkaRecords
    builder._j_builder.setDeserializer(records.deserializer())
    return builder.build()


def records_from_kafka(env, source: KafkaInput, parse: RecordParser, dead_letters: DeadLetters, *, uid: str,
                       parallelism: int = 1):
    """The records ``parse`` takes; the others (and any that ``parse`` raises on), as :class:`DeadLetter` JSON, to
    the dead-letter topic. Operator uids: ``<uid>-source``, ``parse-<uid>``, ``<uid>-dead-letters-sink``.

    A record's ``traceparent`` header reaches the agent's run when the stream is keyed (``key_by``) straight into
    ``connect_to_agent``; every function of the job sees the record itself (:class:`TracedRecords`).

    Source and parse run at ``parallelism`` (default 1: one upstream instance, in each partition's order); key the
    result right after, or keep whatever follows at the same parallelism, so a key's records keep their order.

    Flink's Kafka connector must be on the class path (:mod:`flink_agents_replay.jobs.connector`), and the job must
    checkpoint: the dead letters' exactly-once sink commits at checkpoints.
    """
    from pyflink.common import Types, WatermarkStrategy
    from pyflink.datastream import OutputTag

    from flink_agents_replay.flink.checkpoint_bridge.wiring import ship_bridge_jar

    ship_bridge_jar(env._j_stream_execution_environment)  # holds PositionedKafkaRecords
    tag = OutputTag("dead-letters", Types.STRING())
    row_type = Types.ROW_NAMED(["topic", "partition", "offset", "timestamp", "value", "traceparent"],
                               [Types.STRING(), Types.INT(), Types.LONG(), Types.LONG(),
                                Types.PRIMITIVE_ARRAY(Types.BYTE()), Types.STRING()])
    records = (
        env.from_source(_positioned_source(source), WatermarkStrategy.no_watermarks(), f"{source.topic} source",
                        type_info=row_type)
        .uid(f"{uid}-source").set_parallelism(parallelism)
        .process(_ParseRecords(parse, tag), output_type=Types.PICKLED_BYTE_ARRAY())
        .name(f"parse {source.topic}").uid(f"parse-{uid}").set_parallelism(parallelism)
    )
    sink = exactly_once_string_sink(dead_letters.bootstrap_servers, dead_letters.topic,
                                    dead_letters.transactional_id_prefix, properties=dead_letters.kafka_properties)
    records.get_side_output(tag).sink_to(sink).name("dead letters sink").uid(f"{uid}-dead-letters-sink") \
        .set_parallelism(1)
    return TracedRecords(records, uid)
