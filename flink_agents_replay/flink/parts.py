"""Building the operator's parts from its :class:`~flink_agents_replay.flink.config.AgentConfig`.

The parts take plain values, not the config: this module is where the config is read. Each part builds
the Kafka clients it owns through :mod:`flink_agents_replay.integrations.kafka` (the journal store here, the capture
writer for the capture observer, production's journal inside the replay mode).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flink_agents_replay.api.agent import Agent
from flink_agents_replay.flink.capture_observer import CaptureObserver
from flink_agents_replay.flink.config import AgentConfig
from flink_agents_replay.flink.mode import PRODUCTION, JobMode
from flink_agents_replay.flink.observer import OperatorObserver
from flink_agents_replay.flink.runtime_info import SubtaskInfo
from flink_agents_replay.flink.trace_observer import TraceObserver
from flink_agents_replay.replay.mode import ReplayMode
from flink_agents_replay.storage.capture.manifest import CaptureDescription
from flink_agents_replay.storage.capture.schemas import capture_codec
from flink_agents_replay.storage.capture.writer import CaptureWriter
from flink_agents_replay.storage.journal.checkpoints import JournalCheckpoints
from flink_agents_replay.storage.journal.fence_watch import FenceWatch
from flink_agents_replay.storage.journal.kafka_store import KafkaJournalStore
from flink_agents_replay.storage.journal.writer import JournalWriter, max_record_bytes
from flink_agents_replay.storage.records.codec import FORMAT_VERSION, RecordCodec
from flink_agents_replay.traces.process_sink import ProcessSpanSink
from flink_agents_replay.traces.spans import resource_kinds

__all__ = ["job_mode", "journal_checkpoints", "observers"]


def job_mode(config: AgentConfig, *, max_parallelism: int) -> JobMode:
    """The replay's mode when ``config.replay`` is set, else production's."""
    if config.replay is None:
        return PRODUCTION
    return ReplayMode(settings=config.replay, kafka=config.kafka_settings(), signing_key=config.signing_key_bytes,
                      verification_keys=config.verification_keys_bytes, uid=config.uid,
                      journal_topic=config.journal_topic, max_parallelism=max_parallelism,
                      read_production_journal=config.journal_enabled, kafka_timeout_s=config.kafka_timeout_s,
                      name=config.capture_topic)


def observers(config: AgentConfig, agent: Agent, *, key_type: str, max_parallelism: int, mode: JobMode,
              info: SubtaskInfo, counters: Mapping[str, Any]) -> list[OperatorObserver]:
    """The operator's observers: the capture's when ``config.capture`` is on, the tracer's when ``config.tracing``
    is."""
    found: list[OperatorObserver] = []
    if config.capture:
        found.append(_capture(config, agent, key_type=key_type, max_parallelism=max_parallelism, mode=mode))
    if config.tracing is not None:
        found.append(_tracer(config, agent, info=info, counters=counters))
    return found


def _tracer(config: AgentConfig, agent: Agent, *, info: SubtaskInfo, counters: Mapping[str, Any]) -> TraceObserver:
    replay = config.replay is not None
    settings = config.tracing
    if replay and settings.service_name is None:  # a replay's spans go to a service (a Phoenix project) of their own
        settings = settings.model_copy(update={"service_name": settings.service(agent.name) + "-replay"})
    sink = ProcessSpanSink(settings, agent=agent.name, kinds=resource_kinds(agent))
    sink.start()
    return TraceObserver(sink=sink, agent=agent.name, job_id=info.job_id or "", attempt=info.attempt,
                         subtask=info.index, replay=replay, counters=counters)


def _capture(config: AgentConfig, agent: Agent, *, key_type: str, max_parallelism: int,
             mode: JobMode) -> CaptureObserver:
    description = CaptureDescription(config.uid, config.capture_topic, key_type, max_parallelism, FORMAT_VERSION,
                                     config.journal_topic if config.journal_enabled else None,
                                     tuple(config.output_topics))
    # A capture that is never replayed itself (a replay's, which feeds the diff) needs no manifest.
    writer = CaptureWriter.to_kafka(
        config.kafka_settings(), description=description,
        codec=capture_codec(config.signing_key_bytes, config.uid, verification_keys=config.verification_keys_bytes),
        with_manifest=mode.resumable, create_topic=config.create_topic,
        replication_factor=config.replication_factor, topic_config=config.capture_topic_config,
        kafka_timeout_s=config.kafka_timeout_s, ack_timeout_s=config.ack_timeout_s)
    return CaptureObserver(writer=writer, agent=agent.name)


def journal_checkpoints(config: AgentConfig, agent: Agent, *, owned: range, subtask: int, max_parallelism: int,
                        mode: JobMode) -> JournalCheckpoints:
    """The subtask's journal (store and writer, when the journal is enabled) across checkpoints."""
    store = writer = None
    if config.journal_enabled:
        store = KafkaJournalStore(
            config.kafka_settings(), config.journal_topic, max_parallelism, create_topic=config.create_topic,
            replication_factor=config.replication_factor, topic_config=config.topic_config,
            timeout_s=config.kafka_timeout_s, ack_timeout_s=config.ack_timeout_s)
        codec = RecordCodec(config.signing_key_bytes, config.uid, verification_keys=config.verification_keys_bytes,
                            event_types=agent.event_types())
        # A resumed job's starts fence its older attempts, whose external calls then stop (docs/design.md §5.3);
        # the fence topic is created with the journal topic.
        fence_watch = FenceWatch(
            config.kafka_settings(), config.journal_topic, create_topic=config.create_topic,
            replication_factor=config.replication_factor, timeout_s=config.kafka_timeout_s,
            ack_timeout_s=config.ack_timeout_s, journal_store=store) if mode.resumable else None
        writer = JournalWriter(store, codec, config.durability, config.ack_timeout_s,
                               max_record_bytes(config.kafka, store.max_message_bytes), fence_watch=fence_watch)
    # A job that is not resumed (a replay) reads what is left of another journal: a gap is expected there.
    return JournalCheckpoints(store=store, writer=writer, restore_from=mode.journal_to_restore(store), owned=owned,
                              subtask=subtask, resumable=mode.resumable,
                              accept_gap=config.accept_reexecution_after_gap or not mode.resumable,
                              accept_moved_from=config.accept_moved_journal_from, continue_job=config.continue_job,
                              ack_timeout_s=config.ack_timeout_s, history_expiry_s=config.recovered_history_expiry_s)
