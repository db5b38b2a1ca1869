"""RunPool.close (flink/runs.py): a run handed to the executor but not yet picked up by a worker is cancelled by the
close, not waited for. A slot is released before its worker is free again, so a submission can land there."""

import threading
import time

from flink_agents_replay.flink.runs import RunPool, _Running
from flink_agents_replay.journal.checkpoints import RunInFlight


class _Counter:
    def __init__(self) -> None:
        self.count = 0

    def inc(self, n: int = 1) -> None:
        self.count += n


def test_close_does_not_wait_for_a_run_the_shutdown_cancelled():
    """CPython's wait() does not count a cancelled, not yet notified future as done: close waited
    close_timeout_s for it and called it abandoned."""
    counter = _Counter()
    pool = RunPool(max_runs=1, max_child_calls=1, slot_wait_timeout_s=5, close_timeout_s=3, subtask=0,
                   counters={"runs_abandoned": counter})
    cancelled = threading.Event()
    pool.submit("k1", RunInFlight(0, "k1", 1, None), lambda: cancelled.wait(10) and None)
    # k2 as if its slot had just been released by k1's run: in the executor's queue, its one worker busy.
    k2 = _Running(RunInFlight(0, "k2", 1, None), pool.pool.submit(lambda: None))
    pool._runs["k2"] = k2
    k2.future.add_done_callback(lambda future: cancelled.set())  # the shutdown's cancel lets k1 end
    began = time.monotonic()
    pool.close()
    assert k2.future.cancelled()
    assert time.monotonic() - began < 2.0 and counter.count == 0
