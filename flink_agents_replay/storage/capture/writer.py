"""The operator's side of capture: writing accepted inputs, run results and manifest entries.

Capture records travel asynchronously (a run never waits for them); at a checkpoint the operator flushes
them and records, in the manifest, the offsets the checkpoint stands at. So everything accepted before a
checkpoint's barrier is in the capture before that checkpoint completes.

The writer keeps the delivery of every record appended since the last checkpoint and checks them all after
the flush: a record Kafka refused (too large for the topic, the topic deleted, not authorised...) fails the
checkpoint with a :class:`~flink_agents_replay.core.errors.JournalError` before its manifest entry is written. A
flush alone would not tell: it waits for deliveries, failed or not. Without the check a manifest entry could
name offsets past records that were never written, and a replay from that checkpoint would silently lack them.
Failing the checkpoint fails the task; Flink restores the previous checkpoint and the inputs since are
captured again as they are replayed.

Each record is signed for the capture topic (not for a partition or Kafka key, which Flink's ``KafkaSource``
does not hand a replay) and carries its key group in its payload (:mod:`.records`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import replace

from flink_agents_replay.core.errors import JournalError
from flink_agents_replay.integrations.kafka.settings import KafkaSettingsLike
from flink_agents_replay.integrations.kafka.store import KafkaTopicStore
from flink_agents_replay.integrations.kafka.topics import CAPTURE
from flink_agents_replay.storage.capture.manifest import (
    CaptureDescription,
    ManifestEntry,
    ManifestWriter,
    manifest_topic,
)
from flink_agents_replay.storage.capture.records import (
    SIGNED_KEY,
    CapturedInput,
    CapturedParked,
    CapturedRun,
    capture_key,
)
from flink_agents_replay.storage.capture.schemas import CAPTURED_INPUT, CAPTURED_PARKED, CAPTURED_RUN
from flink_agents_replay.storage.journal.store import Delivery, JournalStore
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import key_digest

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
        self._pending: list[Delivery] = []  # appended since the last checkpoint, checked at the next one
        self._lock = threading.Lock()

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
        self._append(key_group, CAPTURED_INPUT, replace(captured, key_group=key_group), key_digest(captured.key),
                     f"the captured input {captured.seq} of key {captured.key!r}")

    def write_run(self, key_group: int, run: CapturedRun) -> None:
        """Append what a run produced."""
        self._append(key_group, CAPTURED_RUN, replace(run, key_group=key_group), key_digest(run.key),
                     f"the captured run of input {run.seq} of key {run.key!r}")

    def write_parked(self, key_group: int, parked: CapturedParked) -> None:
        """Append a run parked at a wait."""
        self._append(key_group, CAPTURED_PARKED, replace(parked, key_group=key_group), key_digest(parked.key),
                     f"the captured parked run of input {parked.seq} of key {parked.key!r}")

    def _append(self, key_group: int, kind: str, record: CapturedInput | CapturedRun | CapturedParked,
                digest_of_key: str, what: str) -> None:
        value = self.codec.encode(SIGNED_KEY, kind, record, topic=self.store.topic, partition=None, what=what)
        delivery = self.store.append(key_group, capture_key(key_group, record.seq, kind, digest_of_key), value)
        with self._lock:
            self._pending.append(delivery)

    def checkpoint(self, checkpoint_id: int, subtask: int, partitions: Iterable[int], *,
                   checkpoint_time_ms: int | None = None) -> None:
        """Flush, check that every record since the last checkpoint was written, then write the manifest entry
        of ``checkpoint_id`` (triggered at ``checkpoint_time_ms``) for ``partitions`` (no manifest entry without a
        manifest).

        Raises :class:`JournalError` when Kafka refused any of those records: the checkpoint must fail.
        """
        self.store.flush(self.timeout_s)
        self._check_deliveries(checkpoint_id)
        if self.manifest is None:
            return
        offsets = self.store.end_offsets(partitions)
        self.manifest.write(ManifestEntry(checkpoint_id, offsets, self.description, subtask, checkpoint_time_ms))

    def _check_deliveries(self, checkpoint_id: int) -> None:
        """Raise :class:`JournalError` naming the first refusals if any pending delivery failed."""
        with self._lock:
            pending, self._pending = self._pending, []
        failures = []
        for delivery in pending:
            try:
                delivery.wait(self.timeout_s)  # after the flush: returns at once
            except JournalError as exc:
                failures.append(str(exc))
        if failures:
            raise JournalError(
                f"{len(failures)} of the {len(pending)} capture records written since the last checkpoint did not "
                f"reach the capture topic {self.store.topic!r} (first: {'; '.join(failures[:3])}): checkpoint "
                f"{checkpoint_id} fails, so that no manifest entry names records that were never written")

    def close(self) -> None:
        """Flush and release the clients."""
        self.store.close()
        if self.manifest is not None:
            self.manifest.close()
