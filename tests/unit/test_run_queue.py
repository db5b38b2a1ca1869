"""The run pool's bounded queue (flink/runs.py): a submission that finds every slot taken does not block the task
thread; queued runs start in order, on the task thread only; over the bound of waiting inputs the next input waits
for a run to end (and times out); close drops queued runs."""

import threading
import time
from concurrent.futures import wait

import pytest

from flink_agents_replay.errors import RunSlotTimeoutError
from flink_agents_replay.flink.runs import QUEUE_FACTOR, RunPool
from flink_agents_replay.journal.checkpoints import RunInFlight


class _Counter:
    def __init__(self) -> None:
        self.count = 0

    def inc(self, n: int = 1) -> None:
        self.count += n


def _pool(*, slot_wait_timeout_s: float = 5.0) -> RunPool:
    return RunPool(max_runs=1, max_child_calls=1, slot_wait_timeout_s=slot_wait_timeout_s, close_timeout_s=5.0,
                   subtask=0, counters={"runs_abandoned": _Counter()})


class _Runs:
    """Runs that record their start and, when ``hold`` is set for them, wait for ``release``."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.release = threading.Event()

    def submit(self, pool: RunPool, key: str, *, hold: bool = False) -> None:
        def execute():
            self.started.append(key)
            if hold:
                assert self.release.wait(10), "the test never released the run"
            return None

        pool.submit(key, RunInFlight(0, key, 1, None), execute)


def _k1_held_then_k2_k3_queued(pool: RunPool, runs: _Runs) -> None:
    runs.submit(pool, "k1", hold=True)  # takes the only slot until runs.release
    runs.submit(pool, "k2")
    runs.submit(pool, "k3")


def test_a_submission_without_a_free_slot_queues_and_returns():
    pool, runs = _pool(), _Runs()
    try:
        _k1_held_then_k2_k3_queued(pool, runs)  # returns at once: a blocking slot waited 5 s and failed
        assert pool.has("k2") and not pool.done("k2") and runs.started == ["k1"]
        assert [r.seq for r in pool.in_flight()] == [1, 1, 1]  # queued runs are in the checkpoint's runs in flight
    finally:
        runs.release.set()
        pool.close()


def test_queued_runs_start_in_order_on_the_task_thread_only():
    pool, runs = _pool(), _Runs()
    try:
        _k1_held_then_k2_k3_queued(pool, runs)
        runs.release.set()
        wait([pool._runs["k1"].future], timeout=5)  # k1 has ended and freed its slot
        assert runs.started == ["k1"]  # the worker that ran k1 started nothing
        assert pool.start_queued(wait_s=5) == 1
        wait([pool._runs["k2"].future], timeout=5)
        assert pool.start_queued(wait_s=5) == 1
        wait([pool._runs["k3"].future], timeout=5)
        assert runs.started == ["k1", "k2", "k3"]
        assert all(pool.done(key) for key in ("k1", "k2", "k3"))
    finally:
        pool.close()


def test_over_the_bound_of_waiting_inputs_the_next_input_waits_for_a_run_to_end():
    pool, runs = _pool(), _Runs()
    try:
        runs.submit(pool, "k1", hold=True)
        runs.submit(pool, "k2")
        pool.hold_back(inputs_waiting=QUEUE_FACTOR - 1)  # 1 queued + 3 held: at the bound, returns at once
        assert runs.started == ["k1"]
        releaser = threading.Timer(0.2, runs.release.set)
        releaser.start()
        pool.hold_back(inputs_waiting=QUEUE_FACTOR)  # over it: returns once k1 has ended, and starts k2
        assert runs.release.is_set() and pool._runs["k1"].future.done()
        wait([pool._runs["k2"].future], timeout=5)
        assert runs.started == ["k1", "k2"]
    finally:
        runs.release.set()
        pool.close()


def test_a_hold_back_times_out_when_no_run_ends():
    pool, runs = _pool(slot_wait_timeout_s=0.2), _Runs()
    try:
        runs.submit(pool, "k0", hold=True)
        for index in range(QUEUE_FACTOR + 1):
            runs.submit(pool, f"q{index}")  # never blocks
        with pytest.raises(RunSlotTimeoutError, match="max_concurrent_runs=1"):
            pool.hold_back(inputs_waiting=0)
        assert runs.started == ["k0"]
    finally:
        runs.release.set()
        pool.close()


def test_a_hold_back_does_not_wait_when_every_run_has_ended():
    """Ended runs free what waits only once the task thread applies them: waiting for them would deadlock."""
    pool, runs = _pool(slot_wait_timeout_s=30), _Runs()
    try:
        runs.submit(pool, "k1")
        wait([pool._runs["k1"].future], timeout=5)
        pool.hold_back(inputs_waiting=10 * QUEUE_FACTOR)  # returns at once (the timeout is 30 s)
        assert not pool.closing.is_set() and pool.done("k1")
    finally:
        pool.close()


def test_draining_starts_the_queue_through_the_waited_key():
    pool, runs = _pool(), _Runs()
    try:
        _k1_held_then_k2_k3_queued(pool, runs)
        runs.release.set()
        assert pool.done("k3", wait_for_it=True)
        assert runs.started == ["k1", "k2", "k3"]  # in order, not k3 first
    finally:
        pool.close()


def test_close_drops_queued_runs_unstarted():
    pool, runs = _pool(), _Runs()
    runs.submit(pool, "k1", hold=True)
    runs.submit(pool, "k2")
    runs.release.set()
    pool.close()
    assert runs.started == ["k1"]
    assert pool.start_queued(wait_s=1) == 0 and runs.started == ["k1"]  # nothing starts after the close
    assert pool.counters["runs_abandoned"].count == 0


def test_close_does_not_wait_for_a_run_the_shutdown_cancelled():
    """A run handed to the executor but not yet picked up by its worker is cancelled by the close, not awaited
    (CPython's wait() does not count such a future as done: it waited close_timeout_s and called it abandoned)."""
    pool = _pool()
    pool.close_timeout_s = 3.0
    cancelled = threading.Event()
    pool.submit("k1", RunInFlight(0, "k1", 1, None), lambda: cancelled.wait(10) and None)
    pool.submit("k2", RunInFlight(0, "k2", 1, None), lambda: None)  # queued behind k1's slot
    k2 = pool._runs["k2"]
    pool._queued.remove("k2")
    pool._start(k2)  # in the executor's queue: its one worker is busy with k1
    k2.future.add_done_callback(lambda future: cancelled.set())  # the shutdown's cancel lets k1 end
    began = time.monotonic()
    pool.close()
    assert k2.future.cancelled()
    assert time.monotonic() - began < 2.0 and pool.counters["runs_abandoned"].count == 0


def test_max_waiting_inputs_is_checked_and_reaches_the_pool():
    from flink_agents_replay.config import AgentConfig
    from flink_agents_replay.errors import ConfigError

    for bad in (-1, 1.5, True, "4"):
        with pytest.raises(ConfigError, match="max_waiting_inputs"):
            AgentConfig(max_waiting_inputs=bad, journal_enabled=False).resolved("agent")
    pool = RunPool(max_runs=2, max_child_calls=1, slot_wait_timeout_s=1, close_timeout_s=1, subtask=0,
                   counters={}, max_waiting=0)
    try:
        assert pool.max_waiting == 0
        assert _pool().max_waiting == QUEUE_FACTOR
    finally:
        pool.close()


def test_a_run_that_ended_while_the_task_thread_was_elsewhere_lets_one_input_in_over_the_bound():
    pool, first, second = _pool(slot_wait_timeout_s=30), _Runs(), _Runs()
    try:
        first.submit(pool, "k1", hold=True)
        second.submit(pool, "k2", hold=True)  # queued, and runs once k1 has ended
        pool.hold_back(inputs_waiting=QUEUE_FACTOR - 1)  # at the bound: nothing owed
        first.release.set()
        wait([pool._runs["k1"].future], timeout=5)
        assert pool.done("k1") and pool.finished("k1") is None  # applied by its timer; k2 now runs
        began = time.monotonic()
        pool.hold_back(inputs_waiting=QUEUE_FACTOR + 1)  # over it: k1's end pays for this input
        assert time.monotonic() - began < 1.0 and pool._taken_over_bound == pool._ended_over_bound == 1
    finally:
        first.release.set()
        second.release.set()
        pool.close()


def test_over_the_bound_an_ended_run_awaiting_its_timer_does_not_block_the_task_thread():
    """Its key's timer (which applies it and starts what waits behind it) runs only once the input returns."""
    pool, runs = _pool(slot_wait_timeout_s=30), _Runs()
    try:
        runs.submit(pool, "k1")
        runs.submit(pool, "k2", hold=True)
        wait([pool._runs["k1"].future], timeout=5)
        pool._ended_over_bound = 0  # as if k1 ended before the bound was reached: no credit
        began = time.monotonic()
        pool.hold_back(inputs_waiting=10 * QUEUE_FACTOR)  # k1 ended, not applied: back within poll_interval_s
        assert time.monotonic() - began < 1.0 and pool._taken_over_bound == 1 and pool._ended_over_bound == 0
    finally:
        runs.release.set()
        pool.close()


class _Acknowledgements:
    """A run journal whose records are acknowledged when the test says so."""

    def __init__(self) -> None:
        self.arrived = False

    def outputs_may_leave(self) -> bool:
        return self.arrived

    def acknowledge(self) -> None:
        self.arrived = True


def test_over_the_bound_a_run_awaiting_its_acknowledgements_lets_no_input_in():
    """A slow broker: runs end, their records are still travelling; taking inputs in then would end backpressure
    (tests/integration/test_broker_faults.py's slow broker read every input at once)."""
    pool, acks = _pool(slot_wait_timeout_s=30), _Acknowledgements()
    try:
        pool.submit("k1", RunInFlight(0, "k1", 1, acks), lambda: None)
        wait([pool._runs["k1"].future], timeout=5)
        pool._ended_over_bound = 0  # k1 ended before the bound was reached: no credit
        threading.Timer(0.3, lambda: setattr(acks, "arrived", True)).start()
        began = time.monotonic()
        pool.hold_back(inputs_waiting=10 * QUEUE_FACTOR)
        assert time.monotonic() - began >= 0.25 and acks.arrived  # it waited for them, not poll_interval_s
        assert pool.done("k1")
    finally:
        pool.close()
