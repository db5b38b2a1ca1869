"""A key's run check (operator.py): registered once and reused while pending, registered anew once it fired or
passed, deleted when the key is left without a run."""

from __future__ import annotations

import time
from types import SimpleNamespace

from flink_agents_replay.flink.operator import ActionExecutionOperator


class _Timers:
    def __init__(self) -> None:
        self.registered: list[int] = []
        self.deleted: list[int] = []

    def register_processing_time_timer(self, when: int) -> None:
        self.registered.append(when)

    def delete_processing_time_timer(self, when: int) -> None:
        self.deleted.append(when)


def _operator() -> tuple[ActionExecutionOperator, SimpleNamespace, _Timers]:
    operator = ActionExecutionOperator.__new__(ActionExecutionOperator)  # no Flink: only the checks
    operator._checks = {}
    operator.wakeups = object()
    operator.run_later_inputs = False
    operator.waits = SimpleNamespace(kept_aside_seen=False)
    operator.config = SimpleNamespace(fallback_check_ms=60_000, poll_interval_ms=5)
    timers = _Timers()
    return operator, SimpleNamespace(timer_service=lambda: timers), timers


def test_a_pending_check_serves_the_keys_next_run():
    operator, ctx, timers = _operator()
    before = int(time.time() * 1000)
    operator._schedule_check("k", ctx)
    operator._schedule_check("k", ctx)  # the key's next run, the first check still pending
    assert len(timers.registered) == 1 and timers.registered[0] >= before + 60_000
    assert operator._checks == {"k": timers.registered[0]}


def test_a_check_that_passed_is_registered_anew_and_other_keys_have_their_own():
    operator, ctx, timers = _operator()
    operator._checks["k"] = int(time.time() * 1000) - 1  # due already (firing, or about to)
    operator._schedule_check("k", ctx)
    operator._schedule_check("other", ctx)
    assert len(timers.registered) == 2 and operator._checks["k"] == timers.registered[0]


def test_a_key_left_without_a_run_deletes_its_pending_check():
    operator, ctx, timers = _operator()
    operator._schedule_check("k", ctx)
    operator._drop_check("k", ctx)
    operator._drop_check("k", ctx)  # nothing pending: nothing deleted twice
    assert timers.deleted == timers.registered and operator._checks == {}
