"""What the operator tells its observers: the interface features such as capture plug into.

The operator holds a list of observers and calls each at five points, without knowing what they do with
it: an input was accepted (it has its seq now), a run was applied (its memory written, its outputs about
to leave), a run was parked at a wait, a checkpoint is being taken (its barrier reached the operator), and
the operator closes.
Production with ``capture=True`` has one, :class:`flink_agents_replay.flink.capture_observer.CaptureObserver`;
without capture, none. An observer runs on the task thread and must not block for long, except at a
checkpoint, where it may flush what it wrote before the barrier.

The interface is structural (a ``Protocol``): an observer need not import this module, so capture does
not depend on the Flink layer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from flink_agents_replay.engine import RunResult

__all__ = ["OperatorObserver"]


class OperatorObserver(Protocol):
    """Hooks the operator calls on the task thread."""

    def input_accepted(self, *, key: Any, group: int, seq: int, value: Any, event_time: int | None,
                       traceparent: str | None = None) -> None:
        """``value`` became input ``seq`` of ``key`` (key group ``group``), about to run; ``traceparent``: the W3C
        traceparent header its Kafka record carried, if any."""
        ...

    def run_applied(self, *, key: Any, group: int, result: RunResult) -> None:
        """The run of ``result.seq`` finished and was applied to the key's state."""
        ...

    def run_parked(self, *, key: Any, group: int, result: RunResult) -> None:
        """The run of ``result.seq`` stopped at a wait (``result.waiting``) and was parked; nothing of it was
        applied. Called each time a run parks (a resumed run that waits again parks again)."""
        ...

    def checkpoint(self, *, checkpoint_id: int, checkpoint_time_ms: int, subtask: int,
                   partitions: Iterable[int]) -> None:
        """Checkpoint ``checkpoint_id`` (triggered at ``checkpoint_time_ms``) reached this subtask (owning
        ``partitions``)."""
        ...

    def close(self) -> None:
        """The operator closes: release clients."""
        ...
