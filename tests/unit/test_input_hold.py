"""The input hold (flink/input_hold.py): at max_waiting_inputs inputs waiting behind runs under way the input is
held once, and released as soon as fewer wait; inputs a key no longer holds (started, or dropped) stop counting."""

import pytest

from flink_agents_replay.core.errors import ConfigError
from flink_agents_replay.flink.config import AgentConfig
from flink_agents_replay.flink.input_hold import InputHold


class _Java:
    def __init__(self):
        self.calls: list[str] = []

    def hold_input(self, timeout_ms: int) -> None:
        self.calls.append(f"hold {timeout_ms}")

    def release_input(self) -> None:
        self.calls.append("release")


def test_the_input_is_held_at_the_bound_and_released_below_it():
    java = _Java()
    hold = InputHold(bound=3, wakeups=java, timeout_s=2)
    hold.queued("a")
    hold.queued("a")
    hold.queued("b")
    hold.queued("b")  # held already: no second hold
    assert java.calls == ["hold 2000"] and hold.held and hold.total == 4
    hold.left("a", 1)  # a's next input started: 3 wait, still at the bound
    assert java.calls == ["hold 2000"]
    hold.left("b", 0)  # b's two were dropped (a replay) or started: 1 waits
    assert java.calls == ["hold 2000", "release"] and not hold.held and hold.total == 1


def test_inputs_never_counted_do_not_release_or_go_negative():
    java = _Java()
    hold = InputHold(bound=2, wakeups=java, timeout_s=1)
    hold.left("restored", 5)  # restored pending, or held back by order restoration: never counted
    hold.left("restored", 0)
    assert hold.total == 0 and java.calls == []
    hold.queued("k")
    hold.left("k", 3)  # more waiting than counted (restored ones among them): the count stays
    assert hold.total == 1


def test_a_run_waiting_for_a_slot_holds_the_input_until_it_started():
    """The task thread must not block on a slot (a finished run's wake-up would wait behind it): it holds."""
    java = _Java()
    hold = InputHold(bound=3, wakeups=java, timeout_s=2)
    hold.runs_waiting_for_slot(1)
    hold.runs_waiting_for_slot(1)
    assert java.calls == ["hold 2000"] and hold.held
    hold.queued("a")
    hold.queued("a")
    hold.queued("a")  # at the bound as well
    hold.runs_waiting_for_slot(0)  # the run started, but three inputs still wait
    assert java.calls == ["hold 2000"]
    hold.left("a", 0)
    assert java.calls == ["hold 2000", "release"] and hold.holds == 1


def test_the_input_is_held_once_a_wave_of_runs_waits_for_slots():
    java = _Java()
    hold = InputHold(bound=100, wakeups=java, timeout_s=1, queued_runs_bound=8)
    hold.runs_waiting_for_slot(7)
    assert java.calls == []
    hold.runs_waiting_for_slot(8)
    hold.runs_waiting_for_slot(7)
    assert java.calls == ["hold 1000", "release"]


def test_without_wake_ups_nothing_is_held():
    hold = InputHold(bound=1, wakeups=None, timeout_s=1)
    hold.queued("k")
    hold.queued("k")
    assert not hold.held and hold.holds == 0


def test_a_bound_below_one_is_refused_by_its_own_name():
    with pytest.raises(ConfigError, match=r"^max_waiting_inputs must be at least 1, got 0$"):
        AgentConfig(journal_enabled=False, max_waiting_inputs=0).resolved("agent")
    assert AgentConfig(journal_enabled=False, max_concurrent_runs=3).resolved("agent").waiting_inputs_bound == 12
