"""Reconcilers: a call in doubt is settled by asking the service, and never made again under a new call id.

The engine's calls on the in-memory journal: a first attempt dies inside an external call (its started record
journaled, no outcome), the next attempt finds it in doubt and asks the resource's reconciler.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field

import pytest

from flink_agents_replay.api.agent import Agent, InputEvent, action
from flink_agents_replay.api.resources import NOT_DONE, InDoubtCall, Reconciler, Tool
from flink_agents_replay.core.errors import ReconcileError
from flink_agents_replay.engine.failures import journal_action_failed
from flink_agents_replay.storage.journal.memory_store import MemoryJournalStore
from flink_agents_replay.storage.records.journal import ActionFailedRecord, CallOutcome
from tests.unit.test_engine_calls import KEY, SEQ, ProcessDied, Service, action_calls, journaled_outcomes


class Refused(Exception):
    """The service took the call and refused it: the call's own outcome."""


@dataclass
class Ledger:
    """A reconciler's view of the service: which call ids took effect, and how."""

    done: dict = field(default_factory=dict)
    asked: list = field(default_factory=list)
    down_for: int = 0  # questions answered with a connection error before it answers

    def __call__(self, call: InDoubtCall):
        self.asked.append(call)
        if self.down_for:
            self.down_for -= 1
            raise ConnectionRefusedError("ledger unreachable")
        outcome = self.done.get(call.call_id, NOT_DONE)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


def agent_with(service: Service, in_doubt) -> Agent:
    class Caller(Agent):
        @action(InputEvent)
        def act(event, ctx):  # never run here: the tests drive its calls directly
            pass

    return Caller(resources={"svc": Tool(service, in_doubt=in_doubt)})


def in_doubt_after_a_crash(ledger) -> tuple[Service, MemoryJournalStore]:
    """The first attempt dies inside ``svc("a")``: started, never reported back."""
    service, store = Service(fail_with=ProcessDied()), MemoryJournalStore(4)
    with pytest.raises(ProcessDied):
        action_calls(agent_with(service, ledger), store).call("svc", "a")
    assert journaled_outcomes(store) == [CallOutcome.STARTED]
    service.fail_with = None
    return service, store


def fail_the_action(calls, error: str) -> None:
    """What the engine does when an exception leaves the action: journal which calls to make again."""
    site = calls.site
    journal_action_failed(calls.context.journal, site.record_key, site.spec, ActionFailedRecord(
        SEQ, site.order, site.event.id, site.action, error, calls.context.input_digest, calls.calls_to_retry()))


def fast(ledger, **options) -> Reconciler:
    return Reconciler(ledger, backoff_s=0.0, max_backoff_s=0.0, **options)


def test_a_call_the_reconciler_finds_done_is_not_made_again_and_its_answer_is_reused():
    ledger = Ledger()
    service, store = in_doubt_after_a_crash(ledger)
    first_id = service.call_ids[0]
    ledger.done[first_id] = {"refund": "R-1"}
    again = action_calls(agent_with(service, ledger), store, restored=True)
    assert again.call("svc", "a") == {"refund": "R-1"}
    assert service.invocations == ["a"]  # made once, by the attempt that died
    [question] = ledger.asked
    assert (question.call_id, question.key, question.seq, question.action) == (first_id, KEY, SEQ, "act")
    assert (question.args, question.arguments) == (("a",), {"text": "a"})
    assert (again.stats.calls_in_doubt, again.stats.calls_reconciled, again.stats.calls_executed) == (1, 1, 0)
    assert journaled_outcomes(store) == [CallOutcome.STARTED, CallOutcome.RETURNED]
    third = action_calls(agent_with(service, ledger), store, restored=True)
    assert third.call("svc", "a") == {"refund": "R-1"} and len(ledger.asked) == 1  # reused, not asked again


def test_a_call_the_reconciler_finds_not_done_is_made_under_the_same_call_id():
    ledger = Ledger()
    service, store = in_doubt_after_a_crash(ledger)
    again = action_calls(agent_with(service, ledger), store, restored=True)
    assert again.call("svc", "a") == "done(a)"
    assert service.invocations == ["a", "a"]
    assert service.call_ids[0] == service.call_ids[1]


def test_the_failure_the_reconciler_finds_is_the_calls_exception_and_a_handled_one_is_reused():
    ledger = Ledger()
    service, store = in_doubt_after_a_crash(ledger)
    ledger.done[service.call_ids[0]] = Refused("card declined")
    again = action_calls(agent_with(service, ledger), store, restored=True)
    with pytest.raises(Refused, match="card declined"):
        again.call("svc", "a")
    again.call("svc", "b")  # the action handled it and went on
    third = action_calls(agent_with(service, ledger), store, restored=True)
    with pytest.raises(Refused, match="card declined"):
        third.call("svc", "a")
    assert len(ledger.asked) == 1 and service.invocations == ["a", "b"]


def test_a_reconciler_that_cannot_tell_is_asked_again_then_the_call_stays_in_doubt_under_its_id():
    ledger = Ledger(down_for=5)
    service, store = in_doubt_after_a_crash(ledger)
    first_id = service.call_ids[0]
    again = action_calls(agent_with(service, fast(ledger, attempts=3)), store, restored=True)
    with pytest.raises(ReconcileError, match="could not tell whether it took effect") as raised:
        again.call("svc", "a")
    assert isinstance(raised.value.__cause__, ConnectionRefusedError)
    assert len(ledger.asked) == 3 and service.invocations == ["a"]  # asked 3 times, never made
    assert again.stats.calls_reconciled_unknown == 1
    fail_the_action(again, "ReconcileError")  # the error left the action
    assert journaled_outcomes(store) == [CallOutcome.STARTED]  # nothing journaled for the call
    ledger.down_for = 1
    ledger.done[first_id] = "refunded"
    third = action_calls(agent_with(service, fast(ledger)), store, restored=True)
    assert third.call("svc", "a") == "refunded"  # reconciled again: the same call id, not a new one
    assert [q.call_id for q in ledger.asked] == [first_id] * 5 and service.invocations == ["a"]


def test_a_call_made_again_after_doubt_whose_failure_ends_the_action_is_in_doubt_again_not_a_new_id():
    """Before 0.7.0 its retry got a new call id: a service deduplicating by key took the effect twice."""
    service, store = in_doubt_after_a_crash("rerun")
    first_id = service.call_ids[0]
    service.fail_with = TimeoutError("gateway timeout")
    again = action_calls(agent_with(service, "rerun"), store, restored=True)
    with pytest.raises(TimeoutError):
        again.call("svc", "a")
    fail_the_action(again, "TimeoutError: gateway timeout")
    service.fail_with = None
    third = action_calls(agent_with(service, "rerun"), store, restored=True)
    assert third.call("svc", "a") == "done(a)"
    assert service.call_ids == [first_id] * 3
    assert third.stats.calls_in_doubt == 1 and third.stats.calls_retried_after_failure == 0


def test_a_failure_the_reconciler_found_that_ends_the_action_is_reconciled_again_next_attempt():
    ledger = Ledger()
    service, store = in_doubt_after_a_crash(ledger)
    first_id = service.call_ids[0]
    ledger.done[first_id] = Refused("try later")
    again = action_calls(agent_with(service, ledger), store, restored=True)
    with pytest.raises(Refused):
        again.call("svc", "a")
    fail_the_action(again, "Refused: try later")
    ledger.done[first_id] = "refunded"  # the service settled it meanwhile
    third = action_calls(agent_with(service, ledger), store, restored=True)
    assert third.call("svc", "a") == "refunded"
    assert [q.call_id for q in ledger.asked] == [first_id, first_id] and service.invocations == ["a"]


def test_a_call_that_failed_without_doubt_is_still_retried_under_a_new_id():
    service, store = Service(fail_with=ConnectionError("down")), MemoryJournalStore(4)
    first = action_calls(agent_with(service, Ledger()), store)
    with pytest.raises(ConnectionError):
        first.call("svc", "a")
    fail_the_action(first, "ConnectionError: down")
    service.fail_with = None
    again = action_calls(agent_with(service, Ledger()), store, restored=True)
    assert again.call("svc", "a") == "done(a)"
    assert service.call_ids[0] != service.call_ids[1]  # it reported back: never in doubt


@pytest.mark.parametrize("bad, error", [
    ("sometimes", ValueError), (42, TypeError),
])
def test_in_doubt_takes_a_policy_or_a_function_with_a_clear_error(bad, error):
    with pytest.raises(error, match="in_doubt takes 'rerun', 'fail', 'assume_done' or a reconciler function"):
        Tool(print, in_doubt=bad)


@pytest.mark.parametrize("options, message", [
    ({"attempts": 0}, "attempts must be a whole number"),
    ({"backoff_s": 2.0, "max_backoff_s": 1.0}, "backoff_s <= max_backoff_s"),
    ({"retry_on": (str,)}, "retry_on takes exception classes"),
])
def test_reconciler_options_are_checked(options, message):
    with pytest.raises((ValueError, TypeError), match=message):
        Reconciler(Ledger(), **options)


def test_a_reconciler_that_cannot_take_the_call_or_on_a_tool_without_effects_is_refused_where_it_is_made():
    with pytest.raises(TypeError, match="called with one argument, the call in doubt"):
        Tool(print, in_doubt=lambda: "paid")
    with pytest.raises(ValueError, match="only an 'external' tool's calls can be"):
        Tool(print, side_effects="none", in_doubt=Ledger())
    assert Reconciler(Ledger(), retry_on=ConnectionError).retry_on == (ConnectionError,)  # one class will do


def test_a_plain_function_becomes_a_reconciler_and_not_done_survives_pickling():
    tool = Tool(print, in_doubt=Ledger())
    assert isinstance(tool.in_doubt, Reconciler) and tool.in_doubt.attempts == 3
    assert pickle.loads(pickle.dumps(NOT_DONE)) is NOT_DONE
