"""Strings to a Kafka topic, exactly once: Flink's ``KafkaSink`` in transactions committed at checkpoints.

A consumer with ``isolation.level=read_committed`` sees each record once, also across restores. Each sink of a
job needs a transactional id prefix of its own that is no other sink's prefix extended (Flink finds and aborts
its lingering transactions by that prefix).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["exactly_once_string_sink"]

#: Above the longest outage a restore must bridge, below the broker's ``transaction.max.timeout.ms``.
TRANSACTION_TIMEOUT_MS = 600_000


def exactly_once_string_sink(bootstrap_servers: str, topic: str, transactional_id_prefix: str, *,
                             transaction_timeout_ms: int = TRANSACTION_TIMEOUT_MS,
                             properties: Mapping[str, str] | None = None):
    """Flink's ``KafkaSink`` writing strings to ``topic`` exactly once; ``properties`` are Kafka client settings."""
    from pyflink.common.serialization import SimpleStringSchema
    from pyflink.datastream.connectors.base import DeliveryGuarantee
    from pyflink.datastream.connectors.kafka import KafkaRecordSerializationSchema, KafkaSink

    builder = (
        KafkaSink.builder().set_bootstrap_servers(bootstrap_servers)
        .set_record_serializer(KafkaRecordSerializationSchema.builder().set_topic(topic)
                               .set_value_serialization_schema(SimpleStringSchema()).build())
        .set_delivery_guarantee(DeliveryGuarantee.EXACTLY_ONCE)
        .set_transactional_id_prefix(transactional_id_prefix)
        .set_property("transaction.timeout.ms", str(transaction_timeout_ms))
    )
    for setting, value in (properties or {}).items():
        builder = builder.set_property(setting, str(value))
    return builder.build()
