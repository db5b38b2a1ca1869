"""The capture manifest: where in the capture topic each checkpoint stands.

At every checkpoint each subtask of a capturing operator writes one entry to the manifest topic
(``<capture topic>.manifest``, one partition, compacted): the checkpoint id and, for each capture
partition it owns, the offset of the first record written after the checkpoint's barrier. A replay
restored from that checkpoint's savepoint reads the capture from there. The entry also describes the
capture (operator uid, key type, max parallelism, record format version, the production journal and
output topics), so a replay can refuse a capture that does not fit its job, and refuse to write to
production topics.

Entries are written while the checkpoint is taken, flushed before the subtask acknowledges it: every
completed checkpoint has its entries (those of a checkpoint that is later aborted are never looked up).
The Kafka key is ``"<checkpoint id>:<first>-<last partition>"``. Since 0.5 an entry also holds the
checkpoint's trigger time (``checkpoint_time_ms``, optional within version 1): the moment a replay from that
savepoint reads long-term memory as of (:mod:`flink_agents_replay.flink.epochs`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from flink_agents_replay.core.errors import ReplayConfigError
from flink_agents_replay.integrations.kafka.admin import KafkaAdmin
from flink_agents_replay.integrations.kafka.settings import KafkaSettingsLike
from flink_agents_replay.integrations.kafka.store import KafkaTopicStore
from flink_agents_replay.integrations.kafka.topics import MANIFEST

__all__ = ["CaptureDescription", "CaptureStart", "ManifestEntry", "ManifestWriter", "manifest_topic",
           "read_capture_start"]


#: Version of a manifest entry's JSON (0.1.0's entries, without a version field, are version 1).
MANIFEST_VERSION = 1


def manifest_topic(capture_topic: str) -> str:
    """The manifest topic of a capture topic."""
    return f"{capture_topic}.manifest"


@dataclass(frozen=True)
class CaptureDescription:
    """What a capture is: written into every manifest entry."""

    uid: str
    capture_topic: str
    key_type: str
    max_parallelism: int
    codec_version: int
    journal_topic: str | None = None
    output_topics: Sequence[str] = ()

    @property
    def production_topics(self) -> set[str]:
        """The topics a replay must never write to."""
        topics = {self.capture_topic, manifest_topic(self.capture_topic), *self.output_topics}
        return topics | ({self.journal_topic} if self.journal_topic else set())


@dataclass(frozen=True)
class ManifestEntry:
    """One subtask's capture offsets at one checkpoint."""

    checkpoint_id: int
    offsets: Mapping[int, int]
    description: CaptureDescription
    subtask: int = 0
    checkpoint_time_ms: int | None = None  # the checkpoint's trigger time (None: written before 0.5)

    def encode(self) -> tuple[bytes, bytes]:
        """Kafka key and JSON value."""
        partitions = sorted(self.offsets)
        key = f"{self.checkpoint_id}:{partitions[0]}-{partitions[-1]}" if partitions else f"{self.checkpoint_id}:-"
        value = {"version": MANIFEST_VERSION, "checkpoint_id": self.checkpoint_id, "subtask": self.subtask,
                 "offsets": {str(p): o for p, o in sorted(self.offsets.items())},
                 **asdict(self.description), "output_topics": list(self.description.output_topics)}
        if self.checkpoint_time_ms is not None:
            value["checkpoint_time_ms"] = self.checkpoint_time_ms
        return key.encode(), json.dumps(value, sort_keys=True).encode()

    @classmethod
    def decode(cls, value: bytes) -> ManifestEntry:
        """Parse a manifest value (raises ``ValueError``/``KeyError`` on one that is not an entry)."""
        data = json.loads(value)
        if int(data.get("version", 1)) > MANIFEST_VERSION:  # 0.1.0 wrote no version: it is version 1
            raise ValueError(f"manifest entry of version {data['version']}; this version reads up to "
                             f"{MANIFEST_VERSION}: upgrade flink-agents-replay")
        description = CaptureDescription(
            uid=data["uid"], capture_topic=data["capture_topic"], key_type=data["key_type"],
            max_parallelism=int(data["max_parallelism"]), codec_version=int(data["codec_version"]),
            journal_topic=data.get("journal_topic"), output_topics=tuple(data.get("output_topics") or ()))
        time_ms = data.get("checkpoint_time_ms")
        return cls(int(data["checkpoint_id"]), {int(p): int(o) for p, o in data["offsets"].items()}, description,
                   int(data.get("subtask", 0)), None if time_ms is None else int(time_ms))


class ManifestWriter:
    """Writes a subtask's manifest entries (creates the compacted manifest topic if missing).

    A :class:`~flink_agents_replay.integrations.kafka.store.KafkaTopicStore` of role "capture manifest topic" on one
    partition: the user's Kafka settings passed through, an idempotent producer with ``acks=all``, and the
    usual topic checks except the one refusing compaction (only the latest entry per key matters here).
    """

    def __init__(self, kafka_config: KafkaSettingsLike, topic: str, *, create_topic: bool = True,
                 replication_factor: int | None = None, timeout_s: float = 30.0):
        self.timeout_s = timeout_s
        self._store = KafkaTopicStore(settings=kafka_config, topic=topic, partitions=1, role=MANIFEST,
                                      create_topic=create_topic, replication_factor=replication_factor,
                                      topic_config={"cleanup.policy": "compact"}, timeout_s=timeout_s)

    def write(self, entry: ManifestEntry) -> None:
        """Write ``entry`` and wait for Kafka's acknowledgement."""
        key, value = entry.encode()
        self._store.append(0, key, value).wait(self.timeout_s)

    def close(self) -> None:
        self._store.close()


def read_entries(kafka_config: KafkaSettingsLike, topic: str, timeout_s: float = 30.0) -> list[ManifestEntry]:
    """Every entry of the manifest topic, in write order."""
    if KafkaAdmin(kafka_config, timeout_s=timeout_s).partition_count(topic) is None:
        raise ReplayConfigError(f"capture manifest topic {topic!r} does not exist: was the production job run "
                                "with capture on (AgentConfig(capture=True)) and this capture topic?")
    store = KafkaTopicStore(settings=kafka_config, topic=topic, partitions=1, role=MANIFEST, create_topic=False,
                            timeout_s=timeout_s)
    try:
        records = store.read(store.start_offsets([0]), store.end_offsets([0]))
        return [ManifestEntry.decode(record.value) for record in records if record.value is not None]
    finally:
        store.close()


@dataclass(frozen=True)
class CaptureStart:
    """Where a replay from a checkpoint starts in the capture, and what the capture is.

    Attributes:
        offsets: per capture partition (every one), the first record after the checkpoint's barrier.
        description: the capture's description.
        checkpoint_time_ms: the checkpoint's trigger time; ``None`` when it was taken before 0.5.
    """

    offsets: dict[int, int]
    description: CaptureDescription
    checkpoint_time_ms: int | None = None


def read_capture_start(kafka_config: KafkaSettingsLike, capture_topic: str, checkpoint_id: int,
                       timeout_s: float = 30.0) -> CaptureStart:
    """The capture offsets (every partition) at ``checkpoint_id``, the capture's description and the checkpoint's
    trigger time.

    Raises :class:`ReplayConfigError` when the manifest has no entry for the checkpoint, or entries that do
    not cover every partition of the capture.
    """
    topic = manifest_topic(capture_topic)
    entries = [e for e in read_entries(kafka_config, topic, timeout_s) if e.checkpoint_id == checkpoint_id]
    return capture_start(entries, checkpoint_id, topic=topic, capture_topic=capture_topic)


def capture_start(entries: Sequence[ManifestEntry], checkpoint_id: int, *, topic: str,
                  capture_topic: str) -> CaptureStart:
    """Combine the manifest entries of ``checkpoint_id`` (every subtask's) into where a replay starts."""
    if not entries:
        raise ReplayConfigError(
            f"the capture manifest {topic!r} has no entry for checkpoint {checkpoint_id}, the savepoint's: the "
            "savepoint was taken by a job that did not capture to this topic (or before capture was turned on)")
    description = entries[-1].description
    offsets: dict[int, int] = {}
    for entry in entries:
        offsets.update(entry.offsets)  # a subtask's entry written twice (a retried checkpoint): the last wins
    missing = sorted(set(range(description.max_parallelism)) - set(offsets))
    if missing:
        raise ReplayConfigError(f"the capture manifest's entries for checkpoint {checkpoint_id} miss partitions "
                                f"{missing[:10]}{'...' if len(missing) > 10 else ''} of {capture_topic!r}")
    times = {e.checkpoint_time_ms for e in entries if e.checkpoint_time_ms is not None}
    if len(times) > 1:  # checkpoint ids restart with every job started without a savepoint
        raise ReplayConfigError(
            f"the capture manifest {topic!r} holds checkpoint {checkpoint_id} of {len(times)} different jobs (taken "
            "at different times): jobs started without a savepoint share this capture topic, so the savepoint's "
            "entries cannot be told apart; give each new job its own capture topic")
    return CaptureStart(offsets, description, next(iter(times), None))
