"""The external invocation counter: shared by processes and threads, survives pickling."""

import multiprocessing
import pickle
from concurrent.futures import ThreadPoolExecutor

import cloudpickle

from flink_agents_replay.testing.counter import InvocationCounter


def _hammer(path, name, times):
    counter = InvocationCounter(path)
    for _ in range(times):
        counter.increment(name)


def test_counts_and_reset(tmp_path):
    counter = InvocationCounter(tmp_path / "c.db")
    assert counter.count("llm") == 0
    assert counter.increment("llm") == 1
    assert counter.increment("llm", by=4) == 5
    counter.increment("tool")
    assert counter.counts() == {"llm": 5, "tool": 1}
    counter.reset()
    assert counter.counts() == {}


def test_processes_and_threads_add_up(tmp_path):
    path = tmp_path / "c.db"
    InvocationCounter(path)
    ctx = multiprocessing.get_context("spawn")
    processes = [ctx.Process(target=_hammer, args=(str(path), "x", 50)) for _ in range(3)]
    for p in processes:
        p.start()
    counter = InvocationCounter(path)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: counter.increment("x"), range(100)))
    for p in processes:
        p.join(60)
        assert p.exitcode == 0
    assert counter.count("x") == 3 * 50 + 100


def test_pickled_counter_writes_the_same_file(tmp_path):
    counter = InvocationCounter(tmp_path / "c.db")
    counter.increment("a")
    for copy in (pickle.loads(pickle.dumps(counter)), cloudpickle.loads(cloudpickle.dumps(counter))):
        copy.increment("a")
    assert counter.count("a") == 3
