"""Topic administration: the one admin client wrapper of this package.

:class:`KafkaAdmin` is built from the user's :class:`~flink_agents_replay.integrations.kafka.settings.KafkaSettings`,
so SASL/SSL and every other setting reach the requests it makes. It does what the package needs of
Kafka's admin API, with errors that name the topic by its role (journal, capture, manifest, input/output):

* :meth:`~KafkaAdmin.prepare_topic`: create a topic if missing, or check one that exists (partition
  count, a compacting cleanup policy); return its id and record size limit;
* :meth:`~KafkaAdmin.create_missing`: create a job's input and output topics if missing;
* :meth:`~KafkaAdmin.create_empty_topic`: create a topic that must start empty, with given settings (a topic
  loaded from a dump, whose records must land at the offsets they had);
* :meth:`~KafkaAdmin.check_reachable`, :meth:`~KafkaAdmin.describe_topic` (id and partition count),
  :meth:`~KafkaAdmin.partition_count`, :meth:`~KafkaAdmin.topic_settings`, :meth:`~KafkaAdmin.topic_overrides`
  (the settings set on the topic itself, what a copy of it needs), :meth:`~KafkaAdmin.start_offsets`,
  :meth:`~KafkaAdmin.end_offsets`;
* :meth:`~KafkaAdmin.delete_records`: pruning, asynchronous, or waited for.

:func:`ensure_topics` and :func:`partition_count` are the two things jobs and tools ask before they start: many
brokers refuse to create topics on first use (``auto.create.topics.enable=false``), and a Flink ``KafkaSink``
writing to a missing topic fails only after a minute of retries. (The journal, capture and manifest topics are
created and checked by their stores.) Both take the user's Kafka settings: the confluent-kafka mapping the
agent's config holds (``AgentConfig.kafka``), a :class:`~.settings.KafkaSettings`, or a bare bootstrap
string for a broker that needs no other setting.

Requests a new topic's metadata can make fail for a moment (no leader yet) are retried until ``timeout_s``.
An unreachable broker fails each request within ``timeout_s`` with a :class:`JournalError` that says what to
check. librdkafka's log lines (reconnect attempts...) wait in the client's queue until it is polled: every
request polls it afterwards, so they reach Python logging (:mod:`.settings`) and do not pile up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import confluent_kafka.admin
import tenacity
from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import ConfigResource, NewTopic, OffsetSpec

from flink_agents_replay.core.errors import JournalError, TopicMismatchError
from flink_agents_replay.integrations.kafka.settings import KafkaSettings, KafkaSettingsLike
from flink_agents_replay.integrations.kafka.topics import TOPIC, TopicRole, compacts, created_topic_config

__all__ = ["KafkaAdmin", "TopicDescription", "TopicInfo", "ensure_topics", "partition_count"]

log = logging.getLogger("flink_agents_replay.kafka.admin")  # below .kafka, whose level users set

# _NOENT: "Failed to query partition leaders: No leaders found", while a restarted broker loads its partitions.
_TRANSIENT = (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART,
              KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.FENCED_LEADER_EPOCH, KafkaError._NOENT)
_NOT_ALLOWED = (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED)
T = TypeVar("T")


def _retriable(exc: BaseException) -> bool:
    """Whether a Kafka request that failed with ``exc`` may succeed if made again soon."""
    return isinstance(exc, KafkaException) and (exc.args[0].retriable() or exc.args[0].code() in _TRANSIENT)


@dataclass(frozen=True)
class TopicInfo:
    """A topic ready for use: its id (changes when the topic is deleted and created again) and its
    ``max.message.bytes`` (``None`` when the broker does not let this client read topic settings)."""

    topic_id: str
    max_message_bytes: int | None


@dataclass(frozen=True)
class TopicDescription:
    """What the cluster says a topic is: its id and its partition count."""

    topic_id: str
    partitions: int


class KafkaAdmin:
    """Admin requests with the user's settings; ``timeout_s`` bounds each one."""

    def __init__(self, settings: KafkaSettingsLike, *, timeout_s: float = 30.0):
        self.settings = KafkaSettings.of(settings)
        self.timeout_s = timeout_s
        # Looked up at call time, not import time: tests can stand in for the client class.
        self._client = confluent_kafka.admin.AdminClient(self.settings.admin_config())

    # -- topics ------------------------------------------------------------------------------------
    def prepare_topic(self, topic: str, partitions: int, *, role: TopicRole, create: bool = True,
                      replication_factor: int | None = None, topic_config: Mapping[str, str] | None = None,
                      allow_compaction: bool = False) -> TopicInfo:
        """Create ``topic`` with ``partitions`` if missing (``create``), or check the one that exists.

        Raises :class:`~flink_agents_replay.core.errors.TopicMismatchError` for another partition count or a
        compacting cleanup policy (unless ``allow_compaction``), ``JournalError`` when Kafka cannot be
        reached or the topic is missing with ``create=False``.
        """
        created_config = created_topic_config(topic, role, topic_config, allow_compaction)
        found = self._metadata(topic)
        missing = found is None or (found.error is not None and found.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART)
        if missing:
            if not create:
                raise JournalError(f"{role.label} {topic!r} does not exist and topic creation is off")
            created = self._create(topic, partitions, role, replication_factor, created_config)
            if created != partitions:  # another client created it meanwhile, with another count
                raise _partition_mismatch(topic, role, created, partitions)
        elif found.error is not None:
            raise JournalError(f"{role.label} {topic!r} cannot be used: {found.error}")
        elif len(found.partitions) != partitions:
            raise _partition_mismatch(topic, role, len(found.partitions), partitions)
        settings = self.topic_settings(topic, role)
        if not missing and not allow_compaction and settings is not None:
            self._refuse_compaction(topic, role, settings.get("cleanup.policy"))
        limit = settings.get("max.message.bytes") if settings is not None else None
        return TopicInfo(self.topic_id(topic, role), int(limit) if limit is not None else None)

    def create_missing(self, topics: Iterable[str], partitions: int, *, replication_factor: int = -1,
                       topic_config: Mapping[str, str] | None = None) -> list[str]:
        """Create those of ``topics`` that do not exist (left as they are otherwise), with the topic settings
        ``topic_config`` (``{"cleanup.policy": "compact"}``...; none: the broker's defaults); return the names
        created."""
        existing = self._list(None).topics
        missing = [topic for topic in dict.fromkeys(topics) if topic not in existing]
        if missing:
            config = dict(topic_config or {})
            futures = self._client.create_topics([NewTopic(t, partitions, replication_factor, config=config)
                                                  for t in missing], request_timeout=self.timeout_s)
            for topic, future in futures.items():
                try:
                    future.result(timeout=self.timeout_s)
                except KafkaException as exc:
                    if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # created meanwhile: fine
                        raise JournalError(f"could not create {TOPIC.label} {topic!r}: {exc.args[0]}") from None
        return missing

    def create_empty_topic(self, topic: str, partitions: int, *, role: TopicRole = TOPIC,
                           replication_factor: int | None = None,
                           topic_config: Mapping[str, str] | None = None) -> None:
        """Create ``topic`` with ``partitions`` and exactly the settings ``topic_config`` (none checked or added:
        the caller copies them from a topic that had them), for records that must land at known offsets.

        A topic that exists already is accepted only when empty (every partition's end offset is 0) and with
        ``partitions``: otherwise :class:`~flink_agents_replay.core.errors.TopicMismatchError`, since the first
        record written would not land at offset 0.
        """
        found = self._create(topic, partitions, role, replication_factor, dict(topic_config or {}))
        if found != partitions:
            raise TopicMismatchError(f"{role.label} {topic!r} already exists with {found} partitions, not "
                                     f"{partitions}: delete it or use a new topic name")
        if any(self.end_offsets(topic, range(partitions), role).values()):
            raise TopicMismatchError(f"{role.label} {topic!r} already exists and is not empty: records written to "
                                     "it would not land at the offsets wanted; delete it or use a new topic name")

    def check_reachable(self) -> None:
        """Raise a :class:`JournalError` saying what to check unless the cluster answers a metadata request."""
        self._list(None)

    def describe_topic(self, topic: str, *, role: TopicRole = TOPIC) -> TopicDescription:
        """The topic's id and partition count (a :class:`JournalError` naming the topic when it is missing)."""
        futures = self._client.describe_topics(TopicCollection([topic]), request_timeout=self.timeout_s)
        try:
            description = futures[topic].result(timeout=self.timeout_s)
        except KafkaException as exc:
            raise JournalError(f"could not describe {role.label} {topic!r} on {self.settings.bootstrap_servers}: "
                               f"{exc.args[0]}") from None
        return TopicDescription(str(description.topic_id), len(description.partitions))

    def partition_count(self, topic: str) -> int | None:
        """How many partitions ``topic`` has, or ``None`` if it does not exist."""
        found = self._metadata(topic)
        if found is None or found.error is not None or not found.partitions:
            return None
        return len(found.partitions)

    def topic_settings(self, topic: str, role: TopicRole = TOPIC) -> dict[str, str] | None:
        """The topic's settings; ``None`` when the broker does not let this client read them."""
        entries = self._config_entries(topic, role, denied_ok=True)
        return None if entries is None else {name: entry.value for name, entry in entries.items()}

    def topic_overrides(self, topic: str, names: Iterable[str], *, role: TopicRole = TOPIC) -> dict[str, str]:
        """Those of the settings ``names`` set on the topic itself, not inherited from the broker's defaults:
        what a copy of the topic on another cluster must be created with. Raises :class:`JournalError` when the
        broker does not let this client read them (a copy would silently lose them)."""
        entries = self._config_entries(topic, role, denied_ok=False) or {}
        return {name: entries[name].value for name in names
                if name in entries and not entries[name].is_default and entries[name].value is not None}

    def topic_id(self, topic: str, role: TopicRole = TOPIC) -> str:
        """The topic's id (a new one after the topic is deleted and created again)."""
        return self.describe_topic(topic, role=role).topic_id

    # -- offsets and pruning -----------------------------------------------------------------------
    def start_offsets(self, topic: str, partitions: Iterable[int], role: TopicRole = TOPIC) -> dict[int, int]:
        """First offset still stored in each partition (the low watermark)."""
        return self._list_offsets(topic, partitions, OffsetSpec.earliest(), role)

    def end_offsets(self, topic: str, partitions: Iterable[int], role: TopicRole = TOPIC, *,
                    committed_only: bool = False) -> dict[int, int]:
        """Next offset to be written in each partition (the high watermark); with ``committed_only`` the last
        stable offset instead: where a ``read_committed`` consumer stops (before any open transaction)."""
        return self._list_offsets(topic, partitions, OffsetSpec.latest(), role, committed_only=committed_only)

    def delete_records(self, topic: str, offsets: Mapping[int, int], role: TopicRole = TOPIC, *,
                       wait: bool = False) -> None:
        """Delete records below ``offsets[p]`` in each partition.

        Asynchronous by default (pruning: a failure is logged, the next prune tries again). With ``wait`` the
        deletion is done on return, retried on retriable errors, and a failure is a :class:`JournalError`.
        """
        request = [TopicPartition(topic, p, o) for p, o in offsets.items() if o > 0]
        if not request:
            return
        if wait:
            def delete() -> None:
                for future in self._client.delete_records(request, request_timeout=self.timeout_s).values():
                    future.result(timeout=self.timeout_s)

            self.with_retries(f"delete the records of {role.label} {topic!r} below offsets {dict(offsets)}", delete)
            return
        self._forward_logs()  # pruning runs at every checkpoint: the lines queued since the last one
        for tp, future in self._client.delete_records(request, request_timeout=self.timeout_s).items():
            future.add_done_callback(lambda f, tp=tp: f.exception() and log.warning(
                "pruning %s %s partition %d below offset %d failed: %s", role.label, topic, tp.partition, tp.offset,
                f.exception()))

    def with_retries(self, what: str, request: Callable[[], T]) -> T:
        """``request()``, tried again on retriable errors (a new topic's leaders, a leader moving) for ``timeout_s``,
        after 0.05 s, then twice as long each time up to 1 s; ``JournalError`` saying ``what`` when it gives up."""
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(_retriable), wait=tenacity.wait_exponential(multiplier=0.05, max=1.0),
            stop=tenacity.stop_before_delay(self.timeout_s), before_sleep=lambda _: self._forward_logs(), reraise=True)
        try:
            return retrying(request)
        except KafkaException as exc:
            self._forward_logs()
            raise JournalError(f"could not {what}: {exc.args[0]}") from None

    # -- internals ---------------------------------------------------------------------------------
    def _list(self, topic: str | None) -> Any:
        try:
            return self._client.list_topics(topic=topic, timeout=self.timeout_s)
        except KafkaException as exc:
            raise JournalError(
                f"could not reach Kafka at {self.settings.bootstrap_servers} within {self.timeout_s:.0f} s "
                f"({exc.args[0]}): check bootstrap.servers, that the broker runs, and the security settings"
            ) from None
        finally:
            self._forward_logs()

    def _forward_logs(self) -> None:
        """Hand librdkafka's queued log lines to Python logging (an admin client has no thread polling it)."""
        self._client.poll(0)

    def _metadata(self, topic: str) -> Any:
        return self._list(topic).topics.get(topic)

    def _list_offsets(self, topic: str, partitions: Iterable[int], spec: OffsetSpec, role: TopicRole, *,
                      committed_only: bool = False) -> dict[int, int]:
        request = {TopicPartition(topic, p): spec for p in partitions}
        if not request:
            return {}
        isolation = {"isolation_level": IsolationLevel.READ_COMMITTED} if committed_only else {}

        def list_offsets() -> dict[int, int]:
            futures = self._client.list_offsets(request, request_timeout=self.timeout_s, **isolation)
            offsets = {tp.partition: future.result(timeout=self.timeout_s).offset for tp, future in futures.items()}
            return _checked_offsets(offsets)

        return self.with_retries(f"list offsets of {role.label} {topic!r}", list_offsets)

    def _config_entries(self, topic: str, role: TopicRole, *, denied_ok: bool) -> dict[str, Any] | None:
        """The topic's config entries (value, ``is_default``...); ``None`` if denied and ``denied_ok``."""
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)

        def describe() -> dict[str, Any] | None:
            future = self._client.describe_configs([resource], request_timeout=self.timeout_s)[resource]
            try:
                return dict(future.result(timeout=self.timeout_s))
            except KafkaException as exc:
                # A start-up check must not need more rights than producing does: it warns and goes on.
                if denied_ok and exc.args[0].code() in _NOT_ALLOWED:
                    log.warning("cannot read the settings of %s %s (%s): grant DescribeConfigs on it to have its "
                                "cleanup policy and record size limit checked", role.label, topic, exc.args[0])
                    return None
                raise

        return self.with_retries(f"describe the configuration of {role.label} {topic!r}", describe)

    def _create(self, topic: str, partitions: int, role: TopicRole, replication_factor: int | None,
                topic_config: dict[str, str]) -> int:
        """Create ``topic`` (one that exists already is fine: another subtask won the race); return its
        partition count once its metadata is visible."""
        new_topic = NewTopic(topic, partitions, replication_factor or -1, config=topic_config)
        future = self._client.create_topics([new_topic], request_timeout=self.timeout_s)[topic]
        try:
            future.result(timeout=self.timeout_s)
            log.info("created %s %s with %d partitions", role.label, topic, partitions)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # another subtask won the race
                raise JournalError(f"could not create {role.label} {topic!r}: {exc.args[0]}") from None
        visible = tenacity.Retrying(  # metadata of a new topic spreads asynchronously
            retry=tenacity.retry_if_result(lambda got: got is None or got.error is not None or not got.partitions),
            wait=tenacity.wait_fixed(0.1), stop=tenacity.stop_after_delay(self.timeout_s),
            retry_error_callback=lambda _: None)
        found = visible(self._metadata, topic)
        if found is None:
            raise JournalError(f"{role.label} {topic!r} was created but did not become visible")
        return len(found.partitions)

    def _refuse_compaction(self, topic: str, role: TopicRole, policy: str | None) -> None:
        if compacts(policy):
            raise TopicMismatchError(
                f"{role.label} {topic!r} has cleanup.policy={policy}: compaction keeps only the last record per Kafka "
                "key, so earlier records of a key would be dropped without an error and a restore or a replay would "
                "miss them. Fix: use a new topic name (this package creates it with cleanup.policy=delete), or "
                f"change this topic: kafka-configs.sh --bootstrap-server {self.settings.bootstrap_servers} --alter "
                f"--entity-type topics --entity-name {topic} --add-config cleanup.policy=delete"
            )


def _partition_mismatch(topic: str, role: TopicRole, found: int, wanted: int) -> TopicMismatchError:
    fix = f"Fix: use a new {role.label} name"
    if role.keyed_by_key_group:
        fix += f", or set max parallelism to {found} if that is what the job's savepoints were taken with"
    return TopicMismatchError(f"{role.label} {topic!r} has {found} partitions but {role.partition_rule(wanted)}. {fix}")


def _checked_offsets(offsets: dict[int, int]) -> dict[int, int]:
    """``offsets``, or a retriable error when one is not an offset: while a restarted broker loads its partitions,
    librdkafka can answer -1001 (no offset) without an error, and a marker or a restore taking it for an offset
    would read nothing, or refuse every later restore."""
    missing = sorted(p for p, offset in offsets.items() if offset < 0)
    if missing:
        raise KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE,
                                        f"no offset for partitions {missing} (answered {offsets[missing[0]]})"))
    return offsets


def ensure_topics(kafka: KafkaSettingsLike, topics: Iterable[str], partitions: int,
                  replication_factor: int = -1, timeout_s: float = 60.0, *,
                  topic_config: Mapping[str, str] | None = None) -> list[str]:
    """Create those of ``topics`` that do not exist; return the names created.

    ``kafka``: the user's Kafka settings (a mapping with ``bootstrap.servers`` and any security settings,
    passed to the admin client as given), or a bare bootstrap servers string. ``replication_factor=-1``
    takes the broker's default. ``topic_config``: settings the created topics get (``{"cleanup.policy":
    "compact"}``...; none: the broker's defaults). Existing topics are left as they are, settings included.
    """
    return KafkaAdmin(kafka, timeout_s=timeout_s).create_missing(topics, partitions,
                                                                 replication_factor=replication_factor,
                                                                 topic_config=topic_config)


def partition_count(kafka: KafkaSettingsLike, topic: str, timeout_s: float = 30.0) -> int | None:
    """How many partitions ``topic`` has, or ``None`` if it does not exist (``kafka`` passed through as given)."""
    return KafkaAdmin(kafka, timeout_s=timeout_s).partition_count(topic)
