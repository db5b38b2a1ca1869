"""Runs start no new call, action or run once Flink is cancelling or failing their task (issue 36, "Fenced
attempts do not act"), not only once the operator closes.

The Java half of the signal (the bridge's ``TaskStopSignal``, which reads the StreamTask's ``canceled`` and
``failing`` flags) is stood in for by :class:`_JavaSignal`: it opens the pipe's write end the way Java does
(``/proc/self/fd/<n>``) and writes the byte when the test says the task is being failed. The operator is the real
one (``tests/harness/operator_sim.py``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, action
from flink_agents_replay.api.resources import Tool
from flink_agents_replay.engine.context import RunCancelled
from flink_agents_replay.flink.checkpoint_bridge.task_stop import STOPPING, TaskStop
from tests.harness.operator_sim import SimWorld


class _JavaSignal:
    """What ``TaskStopSignal.listen`` does: its own descriptor of the pipe's write end."""

    def __init__(self):
        self.fd: int | None = None

    def listen(self, fd: int) -> None:
        self.fd = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY)

    def task_failing(self) -> None:
        os.write(self.fd, STOPPING)

    def end(self) -> None:
        os.close(self.fd)


def test_the_signal_says_stopping_once_the_byte_came_and_not_before():
    java = _JavaSignal()
    stop = TaskStop(java)
    assert not stop.stopping() and not stop.stopping()
    java.task_failing()
    assert stop.stopping() and stop.stopping()
    java.end()
    stop.close()


def test_the_end_of_the_pipe_without_the_byte_is_not_a_stop():
    java = _JavaSignal()
    stop = TaskStop(java)
    java.end()  # the Java side stopped watching (the operator closes): no stop
    assert not stop.stopping() and not stop.stopping()
    stop.close()


class _Calls:
    def __init__(self):
        self.made: list[str] = []
        self.first_under_way = threading.Event()
        self.release_first = threading.Event()


def _agent(calls: _Calls) -> Agent:
    def pay(what):
        calls.made.append(what)
        if what == "first":
            calls.first_under_way.set()
            assert calls.release_first.wait(30)
        return what

    class Pays(Agent):
        @action(InputEvent)
        def pay_twice(event, ctx):
            ctx.call("pay", "first")
            ctx.send_event(OutputEvent(output=ctx.call("pay", "second")))

    return Pays(resources={"pay": Tool(pay, side_effects="external")})


@pytest.fixture
def world() -> Iterator[SimWorld]:
    with SimWorld() as simulated:
        yield simulated


def test_a_run_makes_no_new_call_and_a_waiting_run_does_not_start_once_the_task_is_being_failed(world):
    calls = _Calls()
    sim = world.operator(_agent(calls), world.config(max_concurrent_runs=1))
    java = _JavaSignal()
    sim.op.attach_task_stop(java)
    sim.send("a", "input a")
    assert calls.first_under_way.wait(30)
    sim.send("b", "input b")  # waits for the only slot
    java.task_failing()  # Flink fails the task; the operator has not closed yet
    calls.release_first.set()
    sim.op.runs.pool.submit(lambda: None).result(30)  # the slot's thread has gone past both runs
    assert not sim.op.runs.closing.is_set()
    assert calls.made == ["first"], "the call under way finished; no new call, and b's run never started"
    with pytest.raises(RunCancelled):
        sim.op.runs.finished("a")
    with pytest.raises(RunCancelled, match="not started"):
        sim.op.runs.finished("b")
    java.end()
