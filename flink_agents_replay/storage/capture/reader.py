"""Reading a capture topic back: its inputs (the replay's source), its runs and parked runs (recorded calls, the
diff).

A record of a kind this version does not know (one a later version added) is skipped, not refused: readers of
0.6 skip 0.7's parked runs so.

Every record is verified as one of the operator's (its uid, the job's keys) *for the topic it is read
from*: a capture record copied into another capture topic (a replay's capture into production's) fails
its signature (envelope version 3). Where the partition is known (:func:`read_capture`), the key group the
record carries must be that partition; Flink's ``KafkaSource`` hands a replay the value only, so there the
topic is what is checked, with the key and seq inside the signed payload.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from flink_agents_replay.core.errors import ReplayConfigError, SignatureError
from flink_agents_replay.core.keygroups import key_group
from flink_agents_replay.integrations.kafka.admin import KafkaAdmin
from flink_agents_replay.integrations.kafka.settings import KafkaSettings, KafkaSettingsLike
from flink_agents_replay.integrations.kafka.store import KafkaTopicStore
from flink_agents_replay.integrations.kafka.topics import CAPTURE
from flink_agents_replay.storage.capture.records import SIGNED_KEY, CapturedInput, CapturedParked, CapturedRun
from flink_agents_replay.storage.capture.schemas import CAPTURED_INPUT, CAPTURED_PARKED, CAPTURED_RUN, capture_codec
from flink_agents_replay.storage.records.codec import RecordCodec

__all__ = ["CaptureDecoder", "read_capture"]

_KINDS = {CAPTURED_INPUT: CapturedInput, CAPTURED_RUN: CapturedRun, CAPTURED_PARKED: CapturedParked}

CaptureRecord = CapturedInput | CapturedRun | CapturedParked


class CaptureDecoder:
    """Verifies and decodes capture records of one operator (its uid, signing key and older verification keys).

    With ``key_type`` and ``max_parallelism`` (a replay's source, which knows no partition), the key group a
    record carries must also be its key's.
    """

    def __init__(self, signing_key: bytes, uid: str, *, verification_keys: Iterable[bytes] = (),
                 key_type: str | None = None, max_parallelism: int | None = None):
        self.codec = capture_codec(signing_key, uid, verification_keys=verification_keys)
        self.key_type = key_type
        self.max_parallelism = max_parallelism

    def decode(self, value: bytes, where: str = "", *, topic: str,
               partition: int | None = None) -> CaptureRecord | None:
        """The record read from ``topic`` (and ``partition``, when known), verified; ``None`` for a record of
        another kind."""
        header = RecordCodec.peek_header(value)
        if header is None:
            raise SignatureError(f"capture record ({where}) is not a flink-agents-replay record")
        kind = header.get("kind")
        if not isinstance(kind, str):
            raise SignatureError(f"capture record ({where}) has no kind")
        expected = _KINDS.get(kind)
        if expected is None:
            return None
        header, payload = self.codec.verify(SIGNED_KEY, value, topic=topic, partition=None, where=where)
        record = self.codec.load(header, payload, where=where)
        if not isinstance(record, expected):
            raise SignatureError(f"capture record ({where}) holds a {type(record).__name__}, not a {expected.__name__}")
        if record.key_group is not None:
            self._check_key_group(record, partition, where)
        return record

    def _check_key_group(self, record: CaptureRecord, partition: int | None, where: str) -> None:
        if partition is not None and record.key_group != partition:
            raise SignatureError(f"capture record ({where}) was written to partition {record.key_group} (its key "
                                 f"group) and copied to partition {partition}")
        if self.key_type is not None and self.max_parallelism is not None:
            expected = key_group(record.key, self.key_type, self.max_parallelism)
            if record.key_group != expected:
                raise SignatureError(f"capture record ({where}) of key {record.key!r:.60} names key group "
                                     f"{record.key_group}, not its key's ({expected} of {self.max_parallelism}): "
                                     "it was written by a job with another key type or max parallelism")


def read_capture(kafka_config: KafkaSettingsLike, topic: str, partitions: int | None, decoder: CaptureDecoder, *,
                 start: Mapping[int, int] | None = None, partitions_to_read: Iterable[int] | None = None,
                 timeout_s: float = 30.0, skip_invalid: Callable[[SignatureError], None] | None = None,
                 ) -> Iterator[CaptureRecord]:
    """Every input, run and parked run record of ``topic`` (of ``partitions_to_read``, default all) from ``start``
    (default: the earliest kept) to its end now, in each partition's order.

    ``partitions``: the partition count the topic must have (the max parallelism), or ``None`` for whatever
    it has. A record that does not verify raises :class:`SignatureError`, or, with ``skip_invalid``, is handed to
    it and skipped (a replay goes on: its source sends such records to the dead letters).
    """
    settings = KafkaSettings.of(kafka_config)
    if partitions is None:
        partitions = KafkaAdmin(settings, timeout_s=timeout_s).partition_count(topic)
        if partitions is None:
            raise ReplayConfigError(f"capture topic {topic!r} does not exist on {settings.bootstrap_servers}")
    store = KafkaTopicStore(settings=settings, topic=topic, partitions=partitions, role=CAPTURE, create_topic=False,
                            timeout_s=timeout_s)
    try:
        everything = sorted(partitions_to_read) if partitions_to_read is not None else range(partitions)
        first = store.start_offsets(everything)
        begin = {p: max(first[p], (start or {}).get(p, 0)) for p in everything}
        end = store.end_offsets(everything)
        for stored in store.read(begin, end):
            try:
                record = decoder.decode(stored.value, f"{topic} partition {stored.partition} offset {stored.offset}",
                                        topic=topic, partition=stored.partition)
            except SignatureError as exc:
                if skip_invalid is None:
                    raise
                skip_invalid(exc)
                continue
            if record is not None:
                yield record
    finally:
        store.close()
