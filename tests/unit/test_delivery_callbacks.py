"""A Kafka delivery's callbacks (kafka/store.py TopicDelivery): each runs exactly once, whether it was added
before the answer, after it, or while the producer's thread was delivering it; a waiter is one of them."""

import threading

import pytest

from flink_agents_replay.core.errors import JournalError
from flink_agents_replay.integrations.kafka.store import TopicDelivery
from flink_agents_replay.integrations.kafka.topics import JOURNAL

ROLE = JOURNAL


class _Message:
    def offset(self) -> int:
        return 41


def test_callbacks_added_while_the_answer_arrives_each_run_once():
    def add_twenty(delivery: TopicDelivery, calls: list) -> None:
        for i in range(20):
            delivery.add_done_callback(lambda i=i: calls.append(i))

    for _ in range(300):
        delivery, calls = TopicDelivery(ROLE), []
        adding = threading.Thread(target=add_twenty, args=(delivery, calls))
        adding.start()
        delivery._complete(None, _Message())
        adding.join()
        assert sorted(calls) == list(range(20))


def test_a_waiter_gets_the_offset_or_the_failure():
    delivery = TopicDelivery(ROLE)
    threading.Timer(0.05, delivery._complete, (None, _Message())).start()
    assert delivery.wait(5) == 41 and delivery.done()
    failed = TopicDelivery(ROLE)
    failed._complete("broker gone", None)
    with pytest.raises(JournalError, match="broker gone"):
        failed.wait(0)


def test_a_wait_that_times_out_says_so():
    with pytest.raises(JournalError, match="not acknowledged by Kafka within"):
        TopicDelivery(ROLE).wait(0.01)


def test_a_failing_callback_does_not_stop_the_others():
    delivery, calls = TopicDelivery(ROLE), []
    delivery.add_done_callback(lambda: 1 / 0)
    delivery.add_done_callback(lambda: calls.append("ran"))
    delivery._complete(None, _Message())
    assert calls == ["ran"]
