"""Building a replay job: check the savepoint and the capture, read the capture as the job's input.

A replay job is the production job's agent (same uid, same max parallelism, same key type) restored from a
production savepoint, fed from the capture instead of live traffic::

    settings = prepare_replay(kafka, capture_topic, savepoint, uid=..., key_type="STRING", max_parallelism=128,
                              policies={"llm": "live"})
    inputs = captured_inputs(env, kafka, settings, signing_key, uid=..., key_type="STRING")
    outputs = connect_to_agent(inputs, changed_agent, replay_config(production_config, settings, ...))

Everything that can be wrong is checked before the job is submitted (:func:`prepare_replay`), each with
an error that says what to fix: a savepoint without this operator's state, a manifest without the
savepoint's checkpoint, a capture of another operator, key type or max parallelism; writing to a
production topic is refused when the agent's config is resolved.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pyflink.common.watermark_strategy import TimestampAssigner

from flink_agents_replay.core.errors import FlinkAgentsReplayError, ReplayConfigError, SignatureError
from flink_agents_replay.core.keygroups import SUPPORTED_KEY_TYPES, flink_key_type
from flink_agents_replay.integrations.kafka.settings import KafkaSettings, KafkaSettingsLike
from flink_agents_replay.replay.policy import CallPolicy, WaitPolicy, parse_policies
from flink_agents_replay.replay.savepoint import read_savepoint
from flink_agents_replay.replay.settings import ReplaySettings
from flink_agents_replay.storage.capture.manifest import read_capture_start
from flink_agents_replay.storage.records.codec import READABLE_VERSIONS

__all__ = ["CapturedInputParser", "captured_inputs", "keyed_captured_inputs", "prepare_replay", "replay_config",
           "savepoint_of"]



def prepare_replay(kafka: KafkaSettingsLike, capture_topic: str, savepoint: str | Path, *, uid: str, key_type: str,
                   max_parallelism: int, policies: Mapping[str, str | CallPolicy] | str | None = None,
                   wait_policy: str | WaitPolicy = WaitPolicy.RECORDED, timeout_s: float = 30.0) -> ReplaySettings:
    """Check that ``savepoint`` and ``capture_topic`` fit a replay of operator ``uid``; return its settings.

    Reads the savepoint's checkpoint id from its ``_metadata``, and the capture offsets at that checkpoint and its
    trigger time (what long-term memory is read as of) from the capture manifest. Raises
    :class:`~flink_agents_replay.core.errors.ReplayConfigError` otherwise.
    """
    if key_type not in SUPPORTED_KEY_TYPES:
        raise ReplayConfigError(f"key_type must be one of {list(SUPPORTED_KEY_TYPES)}, got {key_type!r}")
    parsed_policies = parse_policies(policies)
    try:
        wait_policy = WaitPolicy(wait_policy)
    except ValueError:
        raise ReplayConfigError(f"wait policy {wait_policy!r}: one of {[p.value for p in WaitPolicy]}") from None
    info = read_savepoint(savepoint)
    if not info.holds_operator(uid):
        raise ReplayConfigError(
            f"the savepoint {info.path} holds no state of operator {uid!r}: it was taken from another agent or job "
            "(the replay must use the production agent's name / uid)")
    start = read_capture_start(kafka, capture_topic, info.checkpoint_id, timeout_s)
    description = start.description
    problems = []
    if description.uid != uid:
        problems.append(f"it was written by operator {description.uid!r}, not {uid!r}")
    if description.key_type != key_type:
        problems.append(f"its keys are {description.key_type}, the replay keys by {key_type}")
    if description.max_parallelism != max_parallelism:
        problems.append(f"its max parallelism is {description.max_parallelism}, the replay's {max_parallelism}")
    if description.codec_version not in READABLE_VERSIONS:
        problems.append(f"its record format is version {description.codec_version}, this version reads "
                        f"{READABLE_VERSIONS}")
    if problems:
        raise ReplayConfigError(f"the capture {capture_topic!r} does not fit this replay: " + "; ".join(problems))
    return ReplaySettings(capture_topic, start.offsets, description.journal_topic,
                          frozenset(description.production_topics), parsed_policies, info.checkpoint_id,
                          start.checkpoint_time_ms, wait_policy)


def savepoint_of(env) -> str | None:
    """The savepoint a job is being restored from (``flink run -s``, or ``execution.savepoint.path``)."""
    settings = env._j_stream_execution_environment.getConfiguration().toMap()
    return settings.get("execution.state-recovery.path") or settings.get("execution.savepoint.path") or None


class CapturedInputParser:
    """A capture record's value -> ``(CapturedInput, None)``; ``(CapturedRunEnd, None)`` for a run (production
    finished it: a run the savepoint holds parked resumes); ``(None, None)`` for a record of another kind (a run
    parked at a wait: production had not finished it then, so nothing resumes); ``(None, reason)`` for one that
    does not verify.

    Each record is verified for production's capture ``topic`` (a record copied from another capture topic
    fails), its key and seq inside the signed payload, and the key group it carries must be its key's
    (``key_type``, ``max_parallelism``) and, where the source knows it, the partition it was read from."""

    def __init__(self, signing_key: bytes, uid: str, *, topic: str, key_type: str, max_parallelism: int,
                 verification_keys: tuple[bytes, ...] = ()):
        self.signing_key = signing_key
        self.verification_keys = verification_keys
        self.uid = uid
        self.topic = topic
        self.key_type = key_type
        self.max_parallelism = max_parallelism
        self._decoder = None

    def __call__(self, value: bytes | None, partition: int | None) -> tuple[Any, str | None]:
        from flink_agents_replay.storage.capture.reader import CaptureDecoder
        from flink_agents_replay.storage.capture.records import CapturedInput, CapturedRun, CapturedRunEnd

        if value is None:
            return None, "no value (a tombstone)"
        if self._decoder is None:
            self._decoder = CaptureDecoder(self.signing_key, self.uid, verification_keys=self.verification_keys,
                                           key_type=self.key_type, max_parallelism=self.max_parallelism)
        try:
            record = self._decoder.decode(value, "capture record read by the replay's source", topic=self.topic,
                                          partition=partition)
        except FlinkAgentsReplayError as exc:
            return None, str(exc)
        if isinstance(record, CapturedRun):  # only its end: it resumes a run the savepoint holds parked at a wait
            return CapturedRunEnd(record.key, record.seq), None
        return (record, None) if isinstance(record, CapturedInput) else (None, None)


class _CapturedInputs:
    """Flat-map from a capture record's value (Latin-1 text) to its :class:`CapturedInput`: fails on a record
    that does not verify (:func:`captured_inputs`; the packaged replay job sends those to dead letters)."""

    def __init__(self, parse: CapturedInputParser):
        self.parse = parse

    def __call__(self, text: str) -> Iterator[Any]:
        record, reason = self.parse(text.encode("latin-1"), None)
        if reason is not None:
            raise SignatureError(reason)
        if record is not None:
            yield record


class _EventTime(TimestampAssigner):
    """Production's event time of a captured input as its Flink timestamp (the capture time if it had none)."""

    def extract_timestamp(self, captured, record_timestamp: int) -> int:
        return captured.event_time if captured.event_time is not None else record_timestamp


def captured_inputs(env, kafka: KafkaSettingsLike, settings: ReplaySettings, signing_key: bytes, *, uid: str,
                    key_type: str, name: str = "captured inputs", source_uid: str = "replay-captured-inputs",
                    verification_keys: Sequence[bytes] = ()):
    """The capture's inputs after the savepoint, keyed as in production: a bounded ``KafkaSource`` read from the
    manifest's offsets to the capture's end at submission, each with production's event time as its
    timestamp, with watermarks following them.

    ``kafka`` is passed to the source as Kafka client properties, as given. Records are verified with
    ``signing_key`` or one of ``verification_keys`` (older keys, after a rotation), for the capture topic.
    """
    from pyflink.common import Types, WatermarkStrategy
    from pyflink.common.serialization import SimpleStringSchema
    from pyflink.datastream.connectors.kafka import KafkaOffsetsInitializer, KafkaSource, KafkaTopicPartition

    kafka_settings = KafkaSettings.of(kafka)
    topic = settings.production_capture_topic
    start = {KafkaTopicPartition(topic, p): offset for p, offset in settings.start_offsets.items()}
    builder = (
        KafkaSource.builder().set_bootstrap_servers(kafka_settings.bootstrap_servers).set_topics(topic)
        .set_starting_offsets(KafkaOffsetsInitializer.offsets(start))
        .set_bounded(KafkaOffsetsInitializer.latest())
        # Latin-1 maps every byte to one character: the binary record survives Flink's string schema.
        .set_value_only_deserializer(SimpleStringSchema("ISO-8859-1"))
    )
    for setting, value in kafka_settings.pairs:  # the user's settings (SASL, SSL...) reach the source too
        if setting != "bootstrap.servers":
            builder = builder.set_property(setting, str(value))
    inputs = (
        env.from_source(builder.build(), WatermarkStrategy.no_watermarks(), name).uid(source_uid)
        # The manifest's offsets cover every partition of the capture: one per key group (read_capture_start).
        .flat_map(_CapturedInputs(CapturedInputParser(signing_key, uid, topic=topic, key_type=key_type,
                                                      max_parallelism=len(settings.start_offsets),
                                                      verification_keys=tuple(verification_keys))),
                  output_type=Types.PICKLED_BYTE_ARRAY())
        .name("decode captured inputs").uid(f"{source_uid}-decode")
    )
    return keyed_captured_inputs(inputs, key_type)


def keyed_captured_inputs(inputs, key_type: str, *, parallelism: int | None = None):
    """A stream of :class:`CapturedInput` keyed as in production, each with production's event time as its
    timestamp (the capture time if it had none), with watermarks following them.

    ``parallelism``: the timestamps' operator's, which must be the parallelism of ``inputs`` so that it is fed
    one to one: a rebalance in between would send a key's inputs down two paths, out of their order.
    """
    from pyflink.common import WatermarkStrategy

    timed = inputs.assign_timestamps_and_watermarks(
        WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(_EventTime()))
    if parallelism is not None:
        timed = timed.set_parallelism(parallelism)
    return timed.key_by(lambda captured: captured.key, key_type=flink_key_type(key_type))


def replay_config(production: Mapping[str, Any], settings: ReplaySettings, *, journal_topic: str, capture_topic: str,
                  output_topics: Sequence[str] = (), **overrides: Any) -> dict[str, Any]:
    """The agent config of the replay: production's, with the replay's own journal and capture topics.

    A topic of production's as a target is refused when the config is resolved (``ReplayIsolationError``).
    """
    return {**production, "journal_topic": journal_topic, "capture": True, "capture_topic": capture_topic,
            "output_topics": tuple(output_topics), "replay": settings, **overrides}
