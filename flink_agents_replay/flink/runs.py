"""The operator's runs under way: a thread pool, run slots, and what closing does with runs that hang.

Runs of different keys execute concurrently, at most ``max_runs`` at once per subtask: a run holds a slot
(a worker thread) from its start until it ends. A submission never blocks the task thread: with every slot
taken, the run waits in the pool's queue (:meth:`RunPool.waiting_for_slot` counts them) and starts the moment a
slot frees. With ``max_runs`` runs queued the operator holds its input
(:class:`~flink_agents_replay.flink.input_hold.InputHold`), so the task thread keeps running its mails, the
wake-ups of finished runs among them, and their outputs leave as soon as they may. Blocking the task thread in
the submission instead kept a run's output waiting in the mailbox until the next slot freed: a whole run's
latency added to every run (issue 33). Without wake-ups there is no hold, and :meth:`RunPool.await_slot` blocks
until the run has a slot, as before. Either way ``slot_wait_timeout_s`` without a run ending fails the task (a
call probably hangs). Sub-agent calls never wait for a run slot: they have a pool of
their own (:mod:`flink_agents_replay.engine.child_pool`).

Closing (cancellation, failover, stop-with-savepoint) stops every run at its next action or call boundary
and waits up to ``close_timeout_s`` for the calls under way; runs still calling then are abandoned, counted
(``runs_abandoned``) and logged as in doubt: waiting longer would outlast Flink's
``task.cancellation.timeout``, which kills the TaskManager.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from flink_agents_replay.core.errors import RunSlotTimeoutError
from flink_agents_replay.engine import RunResult
from flink_agents_replay.engine.child_pool import ChildCallPool
from flink_agents_replay.engine.context import RunCancelled
from flink_agents_replay.storage.journal.checkpoints import RunInFlight

__all__ = ["RunPool"]

log = logging.getLogger("flink_agents_replay.operator")


@dataclass
class _Running:
    """A run submitted to the pool: which input it is and where it journals, and its future result."""

    run: RunInFlight
    future: Future


class RunPool:
    """One subtask's runs under way, by key (one run per key at a time).

    Args:
        max_runs: runs at once (``max_concurrent_runs``).
        max_child_calls: sub-agent calls at once (``max_concurrent_child_calls``).
        slot_wait_timeout_s: how long a submission waits for a free slot.
        close_timeout_s: how long closing waits for calls under way.
        subtask: this subtask's index (thread names, log lines).
        counters: the operator's counters (``runs_abandoned``).
        stopping: asked when a run gets its slot, which it then does not start if yes (default: closing). The
            operator's also says yes once the task is being cancelled or failed, or a newer attempt started.
    """

    def __init__(self, *, max_runs: int, max_child_calls: int, slot_wait_timeout_s: float, close_timeout_s: float,
                 subtask: int, counters: Mapping[str, Any], stopping: Callable[[], bool] | None = None):
        # max_runs worker threads are the slots: a run submitted while all are busy waits in the pool's queue.
        self.pool = ThreadPoolExecutor(max_runs, thread_name_prefix=f"agent-{subtask}")
        self.child_pool = ChildCallPool(max_child_calls, thread_name_prefix=f"sub-agent-{subtask}")
        self._slot_freed = threading.Condition()
        # Runs submitted and not ended: counted up on the task thread at submission and down by the worker as
        # soon as the run's code returns, so "waiting for a slot" is exact whenever the task thread reads it (a
        # count of runs not yet picked up by a worker would lag behind the thread hand-over).
        self._unfinished = 0
        self.closing = threading.Event()
        #: Whether a run must not start (asked when it gets its slot): closing, or the task is being cancelled.
        self.stopping = stopping or self.closing.is_set
        self.max_runs = max_runs
        self.slot_wait_timeout_s = slot_wait_timeout_s
        self.close_timeout_s = close_timeout_s
        self.subtask = subtask
        self.counters = counters
        self._runs: dict[Any, _Running] = {}

    def submit(self, key: Any, run: RunInFlight, execute: Callable[[], RunResult], *,
               on_ready: Callable[[], None] | None = None) -> None:
        """Run ``execute`` for ``key`` in the next free slot; never blocks (see :meth:`waiting_for_slot`).

        ``on_ready()`` is called once :meth:`done` would say yes (the run failed, or ended and its outputs may
        leave), from the worker or from the thread receiving the journal's last acknowledgement; never for a
        run the closing cancelled. It must not block.
        """

        def in_slot() -> RunResult:
            try:
                if self.stopping():  # it waited for a slot while the task began to stop: it never starts
                    raise RunCancelled(f"run of key {key!r} not started: the task is stopping")
                return execute()
            finally:  # before the future's callbacks: a wake-up finds the slot free
                with self._slot_freed:
                    self._unfinished -= 1
                    self._slot_freed.notify_all()

        with self._slot_freed:
            self._unfinished += 1
        future = self.pool.submit(in_slot)
        self._runs[key] = _Running(run, future)
        if on_ready is not None:
            future.add_done_callback(lambda ended: _when_ready(ended, run, on_ready))

    def waiting_for_slot(self) -> int:
        """Runs submitted that wait for a slot (every slot was taken); read on any thread."""
        return max(0, self._unfinished - self.max_runs)

    def await_slot(self) -> None:
        """Block until no submitted run waits for a slot (for a task thread that cannot hold its input);
        :class:`~flink_agents_replay.core.errors.RunSlotTimeoutError` after ``slot_wait_timeout_s``."""
        with self._slot_freed:
            if not self._slot_freed.wait_for(lambda: self._unfinished <= self.max_runs, self.slot_wait_timeout_s):
                raise RunSlotTimeoutError(f"no agent run finished within {self.slot_wait_timeout_s:g} s "
                                          f"(max_concurrent_runs={self.max_runs}); a call may hang")

    def has(self, key: Any) -> bool:
        """Whether ``key`` has a run under way in this attempt (after a restore it has none until resubmitted)."""
        return key in self._runs

    def done(self, key: Any, *, wait_for_it: bool = False) -> bool:
        """Whether ``key``'s run has ended and its outputs may leave (``wait_for_it``: wait until then).

        A run frees its slot when it returns; its outputs may leave once the durability mode says so
        (:meth:`~flink_agents_replay.storage.journal.writer.RunJournal.outputs_may_leave`, asked without waiting). A
        run that raised is done at once: :meth:`finished` raises its exception.
        """
        running = self._runs[key]
        if wait_for_it and running.future.exception() is None and running.run.journal is not None:
            running.run.journal.acknowledge()
        if not running.future.done():
            return False
        journal = running.run.journal
        return journal is None or running.future.exception() is not None or journal.outputs_may_leave()

    def finished(self, key: Any) -> RunResult:
        """The key's ended run, taken out of the runs under way (an action's exception fails the task here)."""
        try:
            return self._runs.pop(key).future.result()
        except Exception:
            raise
        except BaseException as exc:  # SystemExit and the like inside an action: fail the task as any error would
            raise RuntimeError(f"the run of key {key!r} ended with {type(exc).__name__}: {exc}") from exc

    def in_flight(self) -> list[RunInFlight]:
        """The runs under way (what a checkpoint marker must keep readable)."""
        return [running.run for running in self._runs.values()]

    def close(self) -> None:
        """Stop every run at its next boundary; wait a bounded time for calls under way; abandon the rest."""
        self.closing.set()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.child_pool.shutdown()
        # A future the shutdown cancelled never started, and wait() would not count it as done (CPython).
        futures = {running.future: key for key, running in self._runs.items() if not running.future.cancelled()}
        _, hung = wait(futures, timeout=self.close_timeout_s)
        if hung:
            self.counters["runs_abandoned"].inc(len(hung))
            log.warning("subtask %d closing: %d runs still had a call under way after %.0f s (close_timeout_s) and "
                        "were abandoned; their calls are in doubt and the next attempt makes them again "
                        "(keys %s)", self.subtask, len(hung), self.close_timeout_s,
                        ", ".join(repr(futures[f]) for f in list(hung)[:10]))


def _when_ready(future: Future, run: RunInFlight, on_ready: Callable[[], None]) -> None:
    """``on_ready`` now if the run failed or journaled nothing, else once its outputs may leave."""
    if future.cancelled():
        return
    if future.exception() is not None or run.journal is None:
        on_ready()
    else:
        run.journal.when_outputs_may_leave(on_ready)
