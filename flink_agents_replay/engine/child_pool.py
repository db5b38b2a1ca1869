"""The bounded pool sub-agent calls run on, built so that a fan-out can never deadlock it.

Runs of inputs occupy the operator's run pool (``max_concurrent_runs``). A parent action that calls
sub-agents must not wait for a slot of that pool — with every slot held by a waiting parent, nothing would
move. Sub-agent calls therefore run on a pool of their own (``max_concurrent_child_calls``), and the
caller *helps*: it offers every child call to the pool, then runs itself each one no pool thread has taken
yet, and only then waits for the ones under way elsewhere. A thread only ever waits for calls that some
thread is executing, so nested fan-outs (a child calling children) and a saturated pool make the work
slower, never stuck. A single ``call_agent`` simply runs in the calling thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = ["ChildCallPool", "Outcome", "run_inline"]


class Outcome:
    """What one call did: its value, or the exception it raised."""

    __slots__ = ("error", "value")

    def __init__(self, value: Any = None, error: BaseException | None = None):
        self.value = value
        self.error = error


class _Task:
    """One call that either a pool thread or the caller runs, whichever claims it first."""

    def __init__(self, function: Callable[[], Any]):
        self._function = function
        self._claim = threading.Lock()
        self._claimed = False
        self.done = threading.Event()
        self.outcome = Outcome()

    def run_if_unclaimed(self) -> None:
        with self._claim:
            if self._claimed:
                return
            self._claimed = True
        try:
            self.outcome = Outcome(self._function())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, which decides
            self.outcome = Outcome(error=exc)
        finally:
            self.done.set()


class ChildCallPool:
    """A bounded pool for sub-agent calls (see the module docstring); thread-safe.

    Args:
        max_workers: threads running child calls besides the callers themselves.
        thread_name_prefix: names of the pool's threads (they show up in thread dumps and logs).
    """

    def __init__(self, max_workers: int, thread_name_prefix: str = "sub-agent"):
        if max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, got {max_workers}")
        self.max_workers = max_workers
        self._executor = ThreadPoolExecutor(max_workers, thread_name_prefix=thread_name_prefix)

    def run_all(self, functions: Sequence[Callable[[], Any]]) -> list[Outcome]:
        """Run every function, concurrently where threads are free; their outcomes in order."""
        tasks = [_Task(function) for function in functions]
        for task in tasks[1:]:  # the caller starts with the first one itself
            try:
                self._executor.submit(task.run_if_unclaimed)
            except RuntimeError:  # shut down (the operator is closing): the caller runs the rest itself
                break
        for task in tasks:
            task.run_if_unclaimed()
        for task in tasks:
            task.done.wait()
        return [task.outcome for task in tasks]

    def shutdown(self) -> None:
        """Stop accepting calls; queued offers are dropped and later ones refused (their callers run them)."""
        self._executor.shutdown(wait=False, cancel_futures=True)


def run_inline(functions: Sequence[Callable[[], Any]]) -> list[Outcome]:
    """Run the functions one after another in this thread (no pool: tests, single calls)."""
    outcomes = []
    for function in functions:
        try:
            outcomes.append(Outcome(function()))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, which decides
            outcomes.append(Outcome(error=exc))
    return outcomes
