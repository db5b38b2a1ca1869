"""Strings to a Kafka topic, exactly once: Flink's ``KafkaSink`` in transactions committed at checkpoints.

A consumer with ``isolation.level=read_committed`` sees each record once, also across restores. Each sink of a
job needs a transactional id prefix of its own that is no other sink's prefix extended (Flink finds and aborts
its lingering transactions by that prefix).

:func:`exactly_once_string_sink` writes values without a key; :func:`exactly_once_keyed_string_sink` writes
``Row(key, value)`` elements (:func:`keyed_string_type`) as keyed records, which a compacted topic needs (it
refuses records without a key) and which put all records of one key into one partition, in order.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["exactly_once_keyed_string_sink", "exactly_once_string_sink", "keyed_string_type"]

#: Above the longest outage a restore must bridge, below the broker's ``transaction.max.timeout.ms``.
TRANSACTION_TIMEOUT_MS = 600_000
#: The key and the value columns of the elements :func:`exactly_once_keyed_string_sink` takes.
KEYED_STRING_FIELDS = ("key", "value")


def exactly_once_string_sink(bootstrap_servers: str, topic: str, transactional_id_prefix: str, *,
                             transaction_timeout_ms: int = TRANSACTION_TIMEOUT_MS,
                             properties: Mapping[str, str] | None = None):
    """Flink's ``KafkaSink`` writing strings to ``topic`` exactly once; ``properties`` are Kafka client settings."""
    from pyflink.common.serialization import SimpleStringSchema
    from pyflink.datastream.connectors.kafka import KafkaRecordSerializationSchema

    serializer = (KafkaRecordSerializationSchema.builder().set_topic(topic)
                  .set_value_serialization_schema(SimpleStringSchema()).build())
    return _exactly_once_sink(bootstrap_servers, serializer, transactional_id_prefix, transaction_timeout_ms,
                              properties)


def exactly_once_keyed_string_sink(env, bootstrap_servers: str, topic: str, transactional_id_prefix: str, *,
                                   transaction_timeout_ms: int = TRANSACTION_TIMEOUT_MS,
                                   properties: Mapping[str, str] | None = None):
    """Flink's ``KafkaSink`` writing ``Row(key, value)`` elements of strings (:func:`keyed_string_type`) to
    ``topic`` exactly once, each as a record with that key and value (UTF-8; a ``None`` key is no key).

    The two columns are serialized by the bridge jar's ``RowFieldString`` (PyFlink's own schemas all take the
    whole element), so the jar is shipped with the job of ``env``.
    """
    from pyflink.common.serialization import SerializationSchema
    from pyflink.datastream.connectors.kafka import KafkaRecordSerializationSchema
    from pyflink.java_gateway import get_gateway

    from flink_agents_replay.flink.checkpoint_bridge.wiring import ship_bridge_jar

    ship_bridge_jar(env._j_stream_execution_environment)  # holds RowFieldString
    field = get_gateway().jvm.io.github.flinkagentsreplay.bridge.RowFieldString
    serializer = (KafkaRecordSerializationSchema.builder().set_topic(topic)
                  .set_key_serialization_schema(SerializationSchema(field(0)))
                  .set_value_serialization_schema(SerializationSchema(field(1))).build())
    return _exactly_once_sink(bootstrap_servers, serializer, transactional_id_prefix, transaction_timeout_ms,
                              properties)


def keyed_string_type():
    """The type of the elements :func:`exactly_once_keyed_string_sink` takes: ``Row(key, value)``, both strings."""
    from pyflink.common import Types

    return Types.ROW_NAMED(list(KEYED_STRING_FIELDS), [Types.STRING(), Types.STRING()])


def _exactly_once_sink(bootstrap_servers: str, serializer, transactional_id_prefix: str, transaction_timeout_ms: int,
                       properties: Mapping[str, str] | None):
    from pyflink.datastream.connectors.base import DeliveryGuarantee
    from pyflink.datastream.connectors.kafka import KafkaSink

    builder = (
        KafkaSink.builder().set_bootstrap_servers(bootstrap_servers)
        .set_record_serializer(serializer)
        .set_delivery_guarantee(DeliveryGuarantee.EXACTLY_ONCE)
        .set_transactional_id_prefix(transactional_id_prefix)
        .set_property("transaction.timeout.ms", str(transaction_timeout_ms))
    )
    for setting, value in (properties or {}).items():
        builder = builder.set_property(setting, str(value))
    return builder.build()
