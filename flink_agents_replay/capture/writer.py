"""The operator's side of capture: writing accepted inputs, run results and manifest entries.

Capture records travel asynchronously (a run never waits for them); at a checkpoint the operator flushes
them and records, in the manifest, the offsets the checkpoint stands at. So everything accepted before a
checkpoint's barrier is in the capture before that checkpoint completes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from flink_agents_replay.capture.manifest import CaptureDescription, ManifestEntry, ManifestWriter, manifest_topic
from flink_agents_replay.capture.records import SIGNED_KEY, CapturedInput, CapturedRun, capture_key
from flink_agents_replay.capture.schemas import CAPTURED_INPUT, CAPTURED_RUN
from flink_agents_replay.journal.store import JournalStore
from flink_agents_replay.kafka.settings import KafkaSettingsLike
from flink_agents_replay.kafka.store import KafkaTopicStore
from flink_agents_replay.kafka.topics import CAPTURE
from flink_agents_replay.records.codec import RecordCodec
from flink_agents_replay.records.journal import key_digest

__all__ = ["CaptureWriter"]


class CaptureWriter:
    """Appends capture records to ``store`` (the capture topic) and manifest entries through ``manifest``.

    ``manifest`` may be ``None``: a replay captures what it did for the diff but needs no manifest.
    """

    def __init__(self, store: JournalStore | KafkaTopicStore, codec: RecordCodec, description: CaptureDescription,
                 manifest: ManifestWriter | None, timeout_s: float):
        self.store = store
        self.codec = codec
        self.description = description
        self.manifest = manifest
        self.timeout_s = timeout_s

    @classmethod
    def to_kafka(cls, settings: KafkaSettingsLike, *, description: CaptureDescription, codec: RecordCodec,
                 with_manifest: bool, create_topic: bool, replication_factor: int | None,
                 topic_config: Mapping[str, str], kafka_timeout_s: float, ack_timeout_s: float) -> CaptureWriter:
        """A writer to the capture topic ``description.capture_topic`` (one partition per key group) and, with
        ``with_manifest``, to its manifest; both created if missing, with the user's Kafka ``settings``."""
        store = KafkaTopicStore(settings=settings, topic=description.capture_topic,
                                partitions=description.max_parallelism, role=CAPTURE, create_topic=create_topic,
                                replication_factor=replication_factor, topic_config=topic_config,
                                timeout_s=kafka_timeout_s)
        manifest = None
        if with_manifest:
            manifest = ManifestWriter(settings, manifest_topic(description.capture_topic), create_topic=create_topic,
                                      replication_factor=replication_factor, timeout_s=kafka_timeout_s)
        return cls(store, codec, description, manifest, ack_timeout_s)

    def write_input(self, key_group: int, captured: CapturedInput) -> None:
        """Append an accepted input."""
        record_key = capture_key(key_group, captured.seq, CAPTURED_INPUT, key_digest(captured.key))
        value = self.codec.encode(SIGNED_KEY, CAPTURED_INPUT, captured,
                                  what=f"the captured input {captured.seq} of key {captured.key!r}")
        self.store.append(key_group, record_key, value)

    def write_run(self, key_group: int, run: CapturedRun) -> None:
        """Append what a run produced."""
        record_key = capture_key(key_group, run.seq, CAPTURED_RUN, key_digest(run.key))
        value = self.codec.encode(SIGNED_KEY, CAPTURED_RUN, run,
                                  what=f"the captured run of input {run.seq} of key {run.key!r}")
        self.store.append(key_group, record_key, value)

    def checkpoint(self, checkpoint_id: int, subtask: int, partitions: Iterable[int]) -> None:
        """Flush, then write the manifest entry of ``checkpoint_id`` for ``partitions`` (no-op without one)."""
        self.store.flush(self.timeout_s)
        if self.manifest is None:
            return
        offsets = self.store.end_offsets(partitions)
        self.manifest.write(ManifestEntry(checkpoint_id, offsets, self.description, subtask))

    def close(self) -> None:
        """Flush and release the clients."""
        self.store.close()
        if self.manifest is not None:
            self.manifest.close()
