"""RunPool (flink/runs.py): a submission never blocks, a run waiting for a slot is counted until a slot takes it,
and close cancels a run handed to the executor but not yet picked up by a worker, without waiting for it."""

import threading
import time

import pytest

from flink_agents_replay.core.errors import RunSlotTimeoutError
from flink_agents_replay.flink.runs import RunPool, _Running
from flink_agents_replay.storage.journal.checkpoints import RunInFlight


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


def _pool(slot_wait_timeout_s: float = 5) -> RunPool:
    return RunPool(max_runs=1, max_child_calls=1, slot_wait_timeout_s=slot_wait_timeout_s, close_timeout_s=3,
                   subtask=0, counters={"runs_abandoned": _Counter()})


def test_a_run_submitted_to_a_free_slot_never_counts_as_waiting():
    """Read at once on the task thread, before any worker took the run: a free slot is not a wait (a hold
    then would stop the input until the next wake-up or check, one run at a time)."""
    pool = RunPool(max_runs=4, max_child_calls=1, slot_wait_timeout_s=5, close_timeout_s=3, subtask=0,
                   counters={"runs_abandoned": _Counter()})
    release = threading.Event()
    try:
        for n in range(4):  # idle workers, as in a running job (a new worker takes its first run as it starts)
            pool.submit(f"warm{n}", RunInFlight(0, f"warm{n}", 1, None), lambda: None)
        pool.await_slot()
        for n in range(4):
            pool.finished(f"warm{n}")
        seen = []
        for n in range(4):
            pool.submit(f"k{n}", RunInFlight(0, f"k{n}", 1, None), lambda: release.wait(10) and None)
            seen.append(pool.waiting_for_slot())
        pool.submit("k4", RunInFlight(0, "k4", 1, None), lambda: None)
        assert seen == [0, 0, 0, 0] and pool.waiting_for_slot() == 1
    finally:
        release.set()
        pool.close()


def test_a_submission_with_every_slot_taken_returns_at_once_and_its_run_starts_when_one_frees():
    pool = _pool()
    first_may_end, first_began, second_ran = threading.Event(), threading.Event(), threading.Event()
    try:
        pool.submit("k1", RunInFlight(0, "k1", 1, None), lambda: first_began.set() or first_may_end.wait(10) and None)
        assert first_began.wait(5)
        began = time.monotonic()
        pool.submit("k2", RunInFlight(0, "k2", 1, None), lambda: second_ran.set())
        assert time.monotonic() - began < 0.5 and pool.waiting_for_slot() == 1
        first_may_end.set()
        pool.await_slot()
        assert pool.waiting_for_slot() == 0 and second_ran.wait(5)
    finally:
        first_may_end.set()
        pool.close()


def test_waiting_for_a_slot_longer_than_its_timeout_fails_the_task():
    pool = _pool(slot_wait_timeout_s=0.3)
    hung = threading.Event()
    try:
        pool.submit("k1", RunInFlight(0, "k1", 1, None), lambda: hung.wait(10) and None)
        pool.submit("k2", RunInFlight(0, "k2", 1, None), lambda: None)
        with pytest.raises(RunSlotTimeoutError, match=r"no agent run finished within 0.3 s \(max_concurrent_runs=1\)"):
            pool.await_slot()
    finally:
        hung.set()
        pool.close()
