"""What turns an agent operator into a replay: where production's capture is, what it must not touch, and
the side-effect policy. Built by :func:`flink_agents_replay.replay.job.prepare_replay` from the savepoint
and the capture manifest; checked by :meth:`flink_agents_replay.flink.config.AgentConfig.resolved`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from flink_agents_replay.replay.policy import CallPolicy, WaitPolicy

__all__ = ["ReplaySettings"]


@dataclass(frozen=True)
class ReplaySettings:
    """Replay mode of an agent operator.

    Attributes:
        production_capture_topic: the capture the replay reads (its inputs, and production's calls for the
            ``recorded`` policy).
        start_offsets: per capture partition, where the savepoint's checkpoint stands (from the manifest).
        production_journal_topic: production's journal, read (never written) to finish the runs that were
            in flight in the savepoint.
        production_topics: topics the replay must never write (journal, capture, manifest, outputs).
        policies: side-effect policy per resource name (``*``: every other); unnamed resources follow
            their declared side effects (:mod:`flink_agents_replay.replay.policy`).
        checkpoint_id: the savepoint's checkpoint id (for logs and the report).
        checkpoint_time_ms: the savepoint's trigger time (from the capture manifest; ``None`` before 0.5).
        wait_policy: what waits get (:class:`~flink_agents_replay.replay.policy.WaitPolicy`): production's
            recorded decisions, or approve all, or deny all.
    """

    production_capture_topic: str
    start_offsets: Mapping[int, int]
    production_journal_topic: str | None
    production_topics: frozenset[str] = frozenset()
    policies: Mapping[str, CallPolicy] = field(default_factory=dict)
    checkpoint_id: int | None = None
    checkpoint_time_ms: int | None = None
    wait_policy: WaitPolicy = WaitPolicy.RECORDED

    @property
    def memory_as_of(self) -> int:
        """The epoch long-term memory is read as of: the savepoint's trigger time, or its checkpoint id when it
        was taken before 0.5 (whose epochs were checkpoint ids); 0 without either (settings built by hand)."""
        if self.checkpoint_time_ms is not None:
            return self.checkpoint_time_ms
        return self.checkpoint_id or 0
