"""Run epochs: which checkpoint a run's effects belong to, on one clock for every job lineage.

Long-term memory is read *as of* a savepoint (docs/design.md §13): a replay must see what production wrote
before the savepoint, including the writes of runs in flight in it, and nothing written after it, whichever job
wrote it. Memory outlives jobs, and a job started without a savepoint numbers its checkpoints from 1 again, so
checkpoint ids cannot order writes of different jobs. Checkpoint *times* can: a run's epoch is the trigger time
of the last checkpoint before it started (epoch milliseconds, the JobManager's clock), + 1, and a savepoint's
as-of point is its own trigger time. Then:

* a run in flight at checkpoint ``C`` started before ``C``'s barrier, so its epoch is ``<= time(C)``: it counts as
  part of ``C`` (it keeps its epoch in Flink state across restores);
* a run started after the barrier has epoch ``time(C) + 1``: after ``C``;
* on a start without a checkpoint, runs count from the TaskManager's clock: after every savepoint of earlier
  jobs, and before this job's first checkpoint (the JobManager triggers it once every task runs). Clocks
  skewed between machines by more than that delay would misplace those first writes.

Where the time comes from: Flink hands each snapshot its checkpoint's trigger time (the checkpoint bridge's
``snapshot_state``); the recovery marker keeps it, so a restore continues from the restored checkpoint's
time. A marker without it (0.4.0 and earlier, or a job without a journal) restarts from the TaskManager's
clock. Epochs of 0.4.0 were checkpoint ids: small numbers, before every time, as they should be.
"""

from __future__ import annotations

import time

__all__ = ["RunEpochs"]


class RunEpochs:
    """The epoch of the runs a subtask starts now, moved on by each checkpoint and set by a restore."""

    def __init__(self, now_ms: int | None = None):
        self._last = int(time.time() * 1000) if now_ms is None else now_ms  # a fresh start: this clock
        self.restored_id: int | None = None
        self.restored_time: int | None = None

    @property
    def current(self) -> int:
        """The epoch of a run starting now."""
        return self._last + 1

    def restored(self, checkpoint_id: int, checkpoint_time_ms: int | None) -> None:
        """This attempt restored checkpoint ``checkpoint_id``; its trigger time, if the marker kept it."""
        self.restored_id, self.restored_time = checkpoint_id, checkpoint_time_ms
        if checkpoint_time_ms is not None:
            self._last = checkpoint_time_ms

    def checkpoint(self, checkpoint_time_ms: int) -> None:
        """A checkpoint's barrier passed: runs started from now on belong after it."""
        self._last = max(self._last, checkpoint_time_ms)

    def of_restored_run(self) -> int:
        """The epoch of a restored run in flight saved without one (0.3 and earlier): the restored checkpoint's."""
        if self.restored_time is not None:
            return self.restored_time
        return self.restored_id if self.restored_id is not None else self._last
