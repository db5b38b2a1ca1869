"""The operator's runs under way: a thread pool, run slots, a bounded queue, and what closing does with runs that hang.

Runs of different keys execute concurrently, at most ``max_runs`` at once per subtask: a run holds a slot
from its start until it ends. A submission that finds no slot free joins a FIFO queue and returns, so the task
thread goes on (applying finished runs, letting a checkpoint barrier through) instead of blocking on a slot.
The backpressure to the source is :meth:`RunPool.hold_back`: once more than ``max_waiting_inputs`` (default
``QUEUE_FACTOR * max_runs``) inputs wait (queued runs, and inputs held behind their key's run), inputs come in
no faster than runs end; when none ends for ``slot_wait_timeout_s`` the task fails
(:class:`~flink_agents_replay.errors.RunSlotTimeoutError`: a call probably hangs).

Queued runs are started on the task thread only (:meth:`RunPool.submit`, :meth:`RunPool.done`,
:meth:`RunPool.hold_back`), never by a worker whose run just ended: once the task thread fails or closes,
nothing starts a new run, so no call of this attempt runs after the next attempt has begun. Sub-agent calls
never wait for a run slot: they have a pool of their own (:mod:`flink_agents_replay.child_pool`).

Closing (cancellation, failover, stop-with-savepoint) drops the queued runs unstarted, stops every run at its
next action or call boundary and waits up to ``close_timeout_s`` for the calls under way; runs still calling
then are abandoned, counted (``runs_abandoned``) and logged as in doubt: waiting longer would outlast Flink's
``task.cancellation.timeout``, which kills the TaskManager.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from flink_agents_replay.child_pool import ChildCallPool
from flink_agents_replay.engine import RunResult
from flink_agents_replay.errors import RunSlotTimeoutError
from flink_agents_replay.journal.checkpoints import RunInFlight

__all__ = ["QUEUE_FACTOR", "RunPool"]

log = logging.getLogger("flink_agents_replay.operator")

#: Default inputs that may wait, per slot (``max_waiting_inputs``): enough to cover a burst of idle keys.
QUEUE_FACTOR = 4


@dataclass
class _Running:
    """A run submitted to the pool: which input it is and where it journals; its future once it has started."""

    run: RunInFlight
    execute: Callable[[], RunResult]
    future: Future | None = None


class RunPool:
    """One subtask's runs under way, by key (one run per key at a time).

    Args:
        max_runs: runs at once (``max_concurrent_runs``).
        max_child_calls: sub-agent calls at once (``max_concurrent_child_calls``).
        slot_wait_timeout_s: how long :meth:`hold_back` waits for a run to end.
        close_timeout_s: how long closing waits for calls under way.
        subtask: this subtask's index (thread names, log lines).
        counters: the operator's counters (``runs_abandoned``).
        max_waiting: inputs that may wait before the next one is held back (``max_waiting_inputs``; default
            ``QUEUE_FACTOR * max_runs``).
        poll_interval_s: how often the operator's timers check a key's run (``poll_interval_ms``).
    """

    def __init__(self, *, max_runs: int, max_child_calls: int, slot_wait_timeout_s: float, close_timeout_s: float,
                 subtask: int, counters: Mapping[str, Any], max_waiting: int | None = None,
                 poll_interval_s: float = 0.005):
        self.pool = ThreadPoolExecutor(max_runs, thread_name_prefix=f"agent-{subtask}")
        self.child_pool = ChildCallPool(max_child_calls, thread_name_prefix=f"sub-agent-{subtask}")
        self.slots = threading.BoundedSemaphore(max_runs)
        self.closing = threading.Event()
        self.max_runs = max_runs
        self.max_waiting = QUEUE_FACTOR * max_runs if max_waiting is None else max_waiting
        self.poll_interval_s = poll_interval_s
        self.slot_wait_timeout_s = slot_wait_timeout_s
        self.close_timeout_s = close_timeout_s
        self.subtask = subtask
        self.counters = counters
        self._runs: dict[Any, _Running] = {}
        self._queued: deque[Any] = deque()
        # Inputs taken over the bound and runs ended since it was reached (hold_back), under _run_ended.
        self._run_ended = threading.Condition()
        self._taken_over_bound = self._ended_over_bound = 0

    def submit(self, key: Any, run: RunInFlight, execute: Callable[[], RunResult]) -> None:
        """Queue ``execute`` for ``key`` and start what free slots allow (never blocks: see :meth:`hold_back`)."""
        self._runs[key] = _Running(run, execute)
        self._queued.append(key)
        self.start_queued()

    def hold_back(self, inputs_waiting: int) -> None:
        """Backpressure: while more than ``max_waiting`` inputs wait (queued runs plus ``inputs_waiting``, the
        operator's inputs held behind their key's run), each input taken over that bound needs a run to have
        ended since the bound was reached, so inputs come in no faster than runs end.

        A run that has ended frees what waits behind it only once its key's timer applies it, and timers run
        only after this returns: while one may be applied (its outputs may leave), this waits at most
        ``poll_interval_s`` (the input then still owes its run end to the next one), so no slot idles behind a
        blocked task thread. A run whose records are still being acknowledged is not such a run: counting it
        would take inputs in at any rate while a slow broker acknowledges.

        Raises:
            RunSlotTimeoutError: no run ended within ``slot_wait_timeout_s`` (a call probably hangs).
        """
        self.start_queued()
        with self._run_ended:
            if len(self._queued) + inputs_waiting <= self.max_waiting:
                self._taken_over_bound = self._ended_over_bound = 0
                return
            self._taken_over_bound += 1
            deadline = time.monotonic() + self.slot_wait_timeout_s
            while self._ended_over_bound < self._taken_over_bound:
                if any(self._may_apply(r) for r in self._runs.values()):
                    self._run_ended.wait(self.poll_interval_s)  # let the timers apply it
                    break
                if not any(r.future is not None for r in self._runs.values()):
                    break  # nothing under way that could end
                if time.monotonic() >= deadline:
                    raise RunSlotTimeoutError(f"no agent run finished within {self.slot_wait_timeout_s:.0f} s "
                                              f"(max_concurrent_runs={self.max_runs}); a call may hang")
                # woken by a run's end; the poll interval also sees acknowledgements arrive
                self._run_ended.wait(min(self.poll_interval_s, max(0.0, deadline - time.monotonic())))
        self.start_queued()

    @staticmethod
    def _may_apply(running: _Running) -> bool:
        """Whether the run has ended and its outputs may leave (the durability mode's check, without waiting)."""
        future = running.future
        if future is None or not future.done():
            return False
        journal = running.run.journal
        return journal is None or future.exception() is not None or journal.outputs_may_leave()

    def start_queued(self, *, wait_s: float = 0.0) -> int:
        """Start queued runs, oldest first, while a slot is free (waiting up to ``wait_s`` for the first); the count.

        Call it on the task thread only (see the module docstring).
        """
        started = 0
        while self._queued and not self.closing.is_set():
            if not self.slots.acquire(timeout=wait_s if started == 0 else 0):  # timeout 0: do not block
                break
            self._start(self._runs[self._queued.popleft()])
            started += 1
        return started

    def _start(self, running: _Running) -> None:
        execute = running.execute

        def in_slot() -> RunResult:
            try:
                return execute()
            finally:
                self.slots.release()
                with self._run_ended:
                    self._ended_over_bound += 1
                    self._run_ended.notify_all()

        running.future = self.pool.submit(in_slot)

    def has(self, key: Any) -> bool:
        """Whether ``key`` has a run queued or under way in this attempt (after a restore: none until resubmitted)."""
        return key in self._runs

    def done(self, key: Any, *, wait_for_it: bool = False) -> bool:
        """Whether ``key``'s run has ended and its outputs may leave (``wait_for_it``: wait until then).

        Starts queued runs first. A run frees its slot when it returns; its outputs may leave once the
        durability mode says so (:meth:`~flink_agents_replay.journal.writer.RunJournal.outputs_may_leave`, asked
        without waiting). A run that raised is done at once: :meth:`finished` raises its exception.
        """
        self.start_queued()
        running = self._runs[key]
        if running.future is None:
            if not wait_for_it:
                return False
            self._start_through(key)
        if wait_for_it and running.future.exception() is None and running.run.journal is not None:
            running.run.journal.acknowledge()
        return self._may_apply(running)

    def _start_through(self, key: Any) -> None:
        """Start queued runs in order, waiting for slots, until ``key``'s has started (draining a bounded input)."""
        while self._runs[key].future is None:
            if not self.start_queued(wait_s=self.slot_wait_timeout_s):
                raise RunSlotTimeoutError(f"no agent run finished within {self.slot_wait_timeout_s:.0f} s "
                                          f"(max_concurrent_runs={self.max_runs}); a call may hang")

    def finished(self, key: Any) -> RunResult:
        """The key's ended run, taken out of the runs under way (an action's exception fails the task here)."""
        try:
            return self._runs.pop(key).future.result()
        except Exception:
            raise
        except BaseException as exc:  # SystemExit and the like inside an action: fail the task as any error would
            raise RuntimeError(f"the run of key {key!r} ended with {type(exc).__name__}: {exc}") from exc

    def in_flight(self) -> list[RunInFlight]:
        """The runs queued or under way (what a checkpoint marker must keep readable)."""
        return [running.run for running in self._runs.values()]

    def close(self) -> None:
        """Drop queued runs; stop every run at its next boundary; wait a bounded time for calls under way."""
        self.closing.set()
        self._queued.clear()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.child_pool.shutdown()
        # A future the shutdown cancelled never started, and wait() would not count it as done (CPython).
        futures = {running.future: key for key, running in self._runs.items()
                   if running.future is not None and not running.future.cancelled()}
        _, hung = wait(futures, timeout=self.close_timeout_s)
        if hung:
            self.counters["runs_abandoned"].inc(len(hung))
            log.warning("subtask %d closing: %d runs still had a call under way after %.0f s (close_timeout_s) and "
                        "were abandoned; their calls are in doubt and the next attempt makes them again "
                        "(keys %s)", self.subtask, len(hung), self.close_timeout_s,
                        ", ".join(repr(futures[f]) for f in list(hung)[:10]))
