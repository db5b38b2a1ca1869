"""The diff of two captures read from Kafka: production's, and a replay's (:mod:`.diff` compares)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka.admin import AdminClient

from flink_agents_replay.capture.reader import CaptureDecoder, read_capture
from flink_agents_replay.capture.records import CapturedInput, CapturedRun
from flink_agents_replay.errors import ReplayConfigError
from flink_agents_replay.replay.diff import DiffReport, compare

__all__ = ["diff_captures"]


def _partitions(kafka: Mapping[str, Any], topic: str, timeout_s: float) -> int:
    metadata = AdminClient(dict(kafka)).list_topics(topic, timeout=timeout_s).topics.get(topic)
    if metadata is None or metadata.error is not None or not metadata.partitions:
        raise ReplayConfigError(f"capture topic {topic!r} does not exist on {kafka.get('bootstrap.servers')}")
    return len(metadata.partitions)


def diff_captures(kafka: Mapping[str, Any], production_capture: str, replay_capture: str, *, signing_key: bytes,
                  uid: str, timeout_s: float = 30.0) -> DiffReport:
    """Compare every run the replay captured with production's run of the same (key, seq).

    Reads the replay's capture whole and production's from its earliest kept record (its retention bounds
    it); both are verified with ``signing_key`` as records of operator ``uid``.
    """
    decoder = CaptureDecoder(signing_key, uid)
    replayed = list(read_capture(kafka, replay_capture, _partitions(kafka, replay_capture, timeout_s), decoder,
                                 timeout_s=timeout_s))
    production = (record for record in read_capture(kafka, production_capture,
                                                     _partitions(kafka, production_capture, timeout_s), decoder,
                                                     timeout_s=timeout_s)
                  if isinstance(record, CapturedRun))
    return compare(production, [r for r in replayed if isinstance(r, CapturedRun)],
                   [r for r in replayed if isinstance(r, CapturedInput)])
