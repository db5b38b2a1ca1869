"""Kafka access: the one place this package builds Kafka clients, always from the user's settings.

One small module per concern, in the spirit of Bytewax's ``connectors/kafka``:

* :mod:`.settings`: :class:`KafkaSettings`, the user's confluent-kafka settings held once, and the
  producer, consumer and admin configurations derived from them (SASL/SSL and every other setting pass
  through everywhere; a durable producer adds idempotence and ``acks=all``);
* :mod:`.topics`: what a topic is to the package (:class:`TopicRole`: journal, capture, manifest, an
  input or output topic), so errors name it right, and the rules for the settings a topic is created with;
* :mod:`.admin`: :class:`KafkaAdmin`, topic creation and checks, partition counts, topic ids, offsets,
  record deletion;
* :mod:`.store`: :class:`KafkaTopicStore`, a partitioned topic written durably and read back between
  offsets (the journal, the capture and the manifest are such topics).

Nothing here knows what the records mean: the journal (:mod:`flink_agents_replay.storage.journal.kafka_store`)
and capture (:mod:`flink_agents_replay.storage.capture`) build on it.
"""

from flink_agents_replay.integrations.kafka.admin import KafkaAdmin, TopicInfo
from flink_agents_replay.integrations.kafka.settings import KafkaSettings, KafkaSettingsLike
from flink_agents_replay.integrations.kafka.store import KafkaTopicStore, TopicDelivery, TopicRecord
from flink_agents_replay.integrations.kafka.topics import CAPTURE, JOURNAL, MANIFEST, TOPIC, TopicRole

__all__ = ["CAPTURE", "JOURNAL", "MANIFEST", "TOPIC", "KafkaAdmin", "KafkaSettings", "KafkaSettingsLike",
           "KafkaTopicStore", "TopicDelivery", "TopicInfo", "TopicRecord", "TopicRole"]
