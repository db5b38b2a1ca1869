"""What a topic is to this package (its role), and the topic settings rules that follow from it.

Errors and log lines name a topic by its role: "journal topic 'x' has 4 partitions...", "capture topic 'y'
does not exist...". The Kafka code is shared by every role, so the role is passed in, never assumed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from flink_agents_replay.core.errors import ConfigError

__all__ = ["CAPTURE", "FENCES", "JOURNAL", "MANIFEST", "TOPIC", "TopicRole", "compacts", "created_topic_config"]


@dataclass(frozen=True)
class TopicRole:
    """A kind of topic, as errors name it.

    Attributes:
        label: how messages name such a topic (``"journal topic"``).
        keyed_by_key_group: one partition per Flink key group, so its partition count must be the job's max
            parallelism (the journal and the capture); otherwise the count is fixed by the caller.
        compacted: compacted on purpose (only the latest record per Kafka key matters, the manifest); every
            other role refuses compaction, which would drop earlier records without an error.
    """

    label: str
    keyed_by_key_group: bool = False
    compacted: bool = False

    def partition_rule(self, partitions: int) -> str:
        """Why a topic of this role must have ``partitions`` partitions (for a mismatch error)."""
        if self.keyed_by_key_group:
            return f"the job's max parallelism is {partitions} (one partition per key group)"
        return f"it must have {partitions}"


JOURNAL = TopicRole("journal topic", keyed_by_key_group=True)
CAPTURE = TopicRole("capture topic", keyed_by_key_group=True)
MANIFEST = TopicRole("capture manifest topic", compacted=True)
#: A journal's fence topic (``<journal>.fences``, one partition): every start of a subtask names the partitions it
#: now owns there, so an older attempt still alive stops making external calls (storage/journal/fence_watch.py).
FENCES = TopicRole("fence topic")
#: A job's input or output topic.
#: Also a topic dumped or loaded by :mod:`flink_agents_replay.storage.journal.transfer`, which may hold any of
#: the roles above.
TOPIC = TopicRole("topic")


def compacts(policy: str | None) -> bool:
    """Whether a ``cleanup.policy`` value (``delete``, ``compact``, ``compact,delete``) compacts."""
    return policy is not None and "compact" in {part.strip().lower() for part in policy.split(",")}


def created_topic_config(topic: str, role: TopicRole, topic_config: Mapping[str, str] | None,
                         allow_compaction: bool) -> dict[str, str]:
    """The settings a topic of ``role`` is created with: the user's, checked.

    Without ``allow_compaction`` a compacting ``cleanup.policy`` is refused (:class:`ConfigError`) and
    ``cleanup.policy=delete`` is set explicitly, so a broker whose default compacts does not compact it.
    """
    config = dict(topic_config or {})
    if allow_compaction:
        return config
    if compacts(config.get("cleanup.policy")):
        raise ConfigError(
            f"topic_config for {role.label} {topic!r} sets cleanup.policy={config['cleanup.policy']}: compaction "
            "keeps only the last record per Kafka key, so earlier records would be dropped without an error; "
            "remove cleanup.policy from topic_config (pruning and retention delete records)")
    config.setdefault("cleanup.policy", "delete")
    return config
