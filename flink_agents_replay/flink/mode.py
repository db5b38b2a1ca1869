"""The job mode: what differs between a production job and a replay, asked at a few named points.

The operator does not know whether it runs production or a replay. It asks its :class:`JobMode`:

* ``resumable``: is this job resumed from its own checkpoints (journal markers, pruning, attempt records,
  a capture manifest)? A replay is run again from the production savepoint instead.
* ``restores_input_order``: may a restore reorder a key's inputs as the journal recorded them? A
  replay's order is its capture's.
* ``report_failures``: does a failed run end up in the results (``RunResult.error``) instead of failing
  the job?
* ``waits_time_out``: do waits' deadlines fire? (A replay runs long after production: its waits take
  production's recorded decisions, timeouts included, from its call gate.)
* ``open(owned, subtask, counters)`` / ``close()``: the mode's own clients and state.
* ``journal_to_restore(own)``: which journal a restore reads (a replay reads production's, read only).
* ``admit(value, event_time, accepted_seq)``: the input adapter: an arriving record as a waiting input,
  or ``None`` when the restored state already holds it; ``drop_held(waiting, accepted_seq)`` does the
  same for inputs already waiting. ``accepted_seq`` reads the key's ``seq`` state, only when needed.
* ``seq_for(key, waiting, next_seq)``: the seq an input runs as.
* ``gate_for(key_digest, seq)``: the call gate of one run (``None``: every call is live).

:data:`PRODUCTION` is production's mode; :class:`flink_agents_replay.replay.mode.ReplayMode` is the
replay's. The interface is structural, so the replay package does not import the Flink layer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from flink_agents_replay.engine import CallGate
from flink_agents_replay.storage.formats.state import WaitingInput
from flink_agents_replay.storage.journal.store import JournalStore

__all__ = ["PRODUCTION", "JobMode", "ProductionMode"]


class JobMode(Protocol):
    """The operator's questions to the job's mode (see the module docstring)."""

    resumable: bool
    restores_input_order: bool
    report_failures: bool
    waits_time_out: bool
    #: At the end of a bounded input, resume the runs still parked (the call gate decides every wait: a replay's
    #: approve-all or deny-all).
    decides_parked_at_end: bool

    def open(self, *, owned: range, subtask: int, counters: Mapping[str, Any]) -> None: ...

    def journal_to_restore(self, own: JournalStore | None) -> JournalStore | None: ...

    def restored(self, *, checkpoint_id: int, checkpoint_time_ms: int | None) -> None: ...

    def admit(self, value: Any, event_time: int | None, accepted_seq: Callable[[], int]) -> WaitingInput | None: ...

    def drop_held(self, waiting: list[bytes], accepted_seq: Callable[[], int]) -> list[bytes]: ...

    def seq_for(self, key: Any, waiting: WaitingInput, next_seq: int) -> int: ...

    def gate_for(self, key_digest: str, seq: int) -> CallGate | None: ...

    def close(self) -> None: ...


class ProductionMode:
    """Production: resumed from its checkpoints, every input taken as it comes, every call live."""

    resumable = True
    restores_input_order = True
    report_failures = False
    waits_time_out = True
    decides_parked_at_end = False

    def open(self, *, owned: range, subtask: int, counters: Mapping[str, Any]) -> None:
        return None

    def journal_to_restore(self, own: JournalStore | None) -> JournalStore | None:
        return own

    def restored(self, *, checkpoint_id: int, checkpoint_time_ms: int | None) -> None:
        return None

    def admit(self, value: Any, event_time: int | None, accepted_seq: Callable[[], int]) -> WaitingInput | None:
        return WaitingInput(value, event_time)

    def drop_held(self, waiting: list[bytes], accepted_seq: Callable[[], int]) -> list[bytes]:
        return waiting

    def seq_for(self, key: Any, waiting: WaitingInput, next_seq: int) -> int:
        return next_seq

    def gate_for(self, key_digest: str, seq: int) -> CallGate | None:
        return None

    def close(self) -> None:
        return None


PRODUCTION = ProductionMode()
