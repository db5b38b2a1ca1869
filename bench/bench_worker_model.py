"""Threads, threads taking Python turns, or an asyncio loop for the runs under way: what each costs per run.

The operator runs each agent run on a worker thread of a pool (:mod:`flink_agents_replay.flink.runs`); a
run blocks its thread while it calls a model or a tool. The alternative the issue names is one asyncio loop
running ``async def`` resources, every run a task on it. This script measures the two mechanisms alone, so
the choice rests on numbers rather than taste:

* ``N`` runs are kept in flight by a feeder (the task thread's role): it takes a slot, submits a run, and a
  completion callback frees the slot (the wake-up).
* A run *calls* for ``call_ms`` (a blocking sleep on its thread; ``await asyncio.sleep`` on the loop) and
  then spends ``work_us`` of Python CPU: the engine's share of a run. ``bench_concurrency.py`` measured
  1.4 ms of Flink CPU per run with the journal off and 2.6 ms with it, so 0 (the mechanism alone), 1,400 and
  2,600 us are measured.

Reported: runs/s as % of the ideal ``min(N / (call + work), 1 / work)`` (one GIL runs the work of every run)
and the process CPU per run above the work itself: what the mechanism costs (thread wake-ups, GIL
hand-offs, the loop's scheduling). Min CPU / max throughput over interleaved rounds.

    .venv/bin/python bench/bench_worker_model.py          # ~4 min
    .venv/bin/python bench/bench_worker_model.py --quick  # ~40 s
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import _harness as h


def _spin(seconds: float) -> None:
    """Python CPU for ``seconds`` of this thread's own CPU time (time waiting for the GIL does not count)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


@dataclass(frozen=True)
class Case:
    """One measured setting: runs in flight, call time and Python work per run."""

    concurrency: int
    call_s: float
    work_s: float

    def ideal_per_s(self) -> float:
        bound = self.concurrency / (self.call_s + self.work_s)
        return min(bound, 1 / self.work_s) if self.work_s else bound


@dataclass(frozen=True)
class Outcome:
    runs_per_s: float
    cpu_per_run_s: float


def _feed(case: Case, runs: int, submit: Callable[[float], Future]) -> Outcome:
    """Keep ``case.concurrency`` runs in flight until ``runs`` have ended.

    The first wave's calls are spread over one call time (``submit`` gets the call's length), so that runs
    do not end in lockstep and queue for the GIL all at once; the measured window starts when that first wave
    has ended and closes at the last run's end.
    """
    slots = threading.Semaphore(case.concurrency)
    ended = threading.Semaphore(0)
    window_start: list[tuple[float, float]] = []
    count = itertools.count(1)

    def on_end(_: Future) -> None:
        if next(count) == case.concurrency:
            window_start.append((time.perf_counter(), time.process_time()))
        slots.release()
        ended.release()

    for i in range(runs):
        slots.acquire()
        first_wave = i < case.concurrency
        submit(case.call_s * (i + 1) / case.concurrency if first_wave else case.call_s).add_done_callback(on_end)
    for _ in range(runs):
        ended.acquire()
    (start, cpu_start), measured = window_start[0], runs - case.concurrency
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return Outcome(measured / elapsed, cpu / measured - case.work_s)


def measure_threads(case: Case, runs: int) -> Outcome:
    def run(call_s: float) -> None:
        time.sleep(call_s)
        _spin(case.work_s)

    with ThreadPoolExecutor(case.concurrency, thread_name_prefix="run") as pool:
        return _feed(case, runs, lambda call_s: pool.submit(run, call_s))


def measure_asyncio(case: Case, runs: int) -> Outcome:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="run-loop", daemon=True)
    thread.start()

    async def run(call_s: float) -> None:
        await asyncio.sleep(call_s)
        _spin(case.work_s)

    try:
        return _feed(case, runs, lambda call_s: asyncio.run_coroutine_threadsafe(run(call_s), loop))
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def measure_turns(case: Case, runs: int) -> Outcome:
    """Threads taking one turn (a lock) for their Python work: the others wait on the lock, not for the GIL."""
    turn = threading.Lock()

    def run(call_s: float) -> None:
        time.sleep(call_s)
        with turn:
            _spin(case.work_s)

    with ThreadPoolExecutor(case.concurrency, thread_name_prefix="run") as pool:
        return _feed(case, runs, lambda call_s: pool.submit(run, call_s))


MODELS = {"threads": measure_threads, "threads, one turn": measure_turns, "asyncio": measure_asyncio}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 ms calls, 128 runs, one round")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 2, --quick 1)")
    parser.add_argument("--waves", type=int, default=8,
                        help="runs per case = waves x concurrency, the first wave not measured (default 8)")
    parser.add_argument("--concurrency", type=int, nargs="+", help="runs in flight (default 32 128 256)")
    parser.add_argument("--call-ms", type=float, nargs="+", help="call times (default 200 1000)")
    parser.add_argument("--work-us", type=float, nargs="+", default=[0, 1400, 2600],
                        help="Python CPU per run (default 0 1400 2600)")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 2)
    concurrency = args.concurrency or ([128] if args.quick else [32, 128, 256])
    calls_ms = args.call_ms or ([200] if args.quick else [200, 1000])
    cases = [Case(n, ms / 1000, us / 1e6) for ms in calls_ms for n in concurrency for us in args.work_us]

    print(h.machine_note())
    best: dict[tuple[Case, str], Outcome] = {}
    for _ in range(rounds):
        for case in cases:
            for name, measure in MODELS.items():
                got = measure(case, args.waves * case.concurrency)
                kept = best.get((case, name))
                best[case, name] = got if kept is None else Outcome(max(kept.runs_per_s, got.runs_per_s),
                                                                    min(kept.cpu_per_run_s, got.cpu_per_run_s))
    rows = []
    for case in cases:
        ideal = case.ideal_per_s()
        got = [best[case, name] for name in MODELS]
        rows.append((f"{case.call_s * 1000:.0f}", case.concurrency, f"{case.work_s * 1e6:.0f}", f"{ideal:.0f}",
                     *(f"{o.runs_per_s / ideal * 100:.1f}" for o in got),
                     *(f"{o.cpu_per_run_s * 1e6:.0f}" for o in got)))
    h.print_table(f"Runs under way: threads, threads taking one Python turn, one asyncio loop ({rounds} round(s), "
                  f"{args.waves} waves per case)",
                  ("call ms", "in flight", "work us/run", "ideal runs/s", *(f"{name} % of ideal" for name in MODELS),
                   *(f"{name} CPU us/run" for name in MODELS)), rows)


if __name__ == "__main__":
    main()
