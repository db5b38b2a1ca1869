"""The invocation counter counts what ran inside Flink's Python worker, from outside it."""

import pytest
from pyflink.common import Types
from pyflink.datastream import MapFunction

from flink_agents_replay.flink.env import create_environment

pytestmark = pytest.mark.integration


class CountingMap(MapFunction):
    def __init__(self, counter):
        self.counter = counter

    def map(self, value):
        self.counter.increment("map")
        return value


def test_increments_from_parallel_workers_are_all_seen(invocation_counter):
    env = create_environment(parallelism=2)
    stream = env.from_collection(list(range(300)), type_info=Types.INT())
    with stream.map(CountingMap(invocation_counter), output_type=Types.INT()).execute_and_collect() as results:
        assert sorted(results) == list(range(300))
    assert invocation_counter.count("map") == 300
