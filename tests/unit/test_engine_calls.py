"""Call handling alone (``engine.calls.ActionCalls``), on the in-memory journal: no run, no event loop, no Flink.

Each test makes calls through one ``ActionCalls`` (one action execution) that journals them, reads the journal
back as a restore does, and gives the recorded calls to a second ``ActionCalls``: the next attempt of the
same action execution.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest

from flink_agents_replay.api.agent import Agent, InputEvent, action, with_event_id
from flink_agents_replay.api.resources import Tool, current_call_id
from flink_agents_replay.core.errors import CallBlocked, CallInDoubtError
from flink_agents_replay.engine.calls import ActionCalls
from flink_agents_replay.engine.context import ActionSite, FingerprintPolicy, RunContext, RunInput, RunStats, Scope
from flink_agents_replay.engine.digest import digest_value
from flink_agents_replay.engine.failures import journal_action_failed
from flink_agents_replay.engine.gate import ALWAYS_LIVE, Blocked, CallGate, GatedCall, GateDecision, Live, Recorded
from flink_agents_replay.storage.journal.memory_store import MemoryJournalStore
from flink_agents_replay.storage.journal.recovery import read_recovery_index
from flink_agents_replay.storage.journal.writer import Durability, JournalWriter
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import (
    ActionFailedRecord,
    CallOutcome,
    input_event_id,
    journal_key,
    key_digest,
)

KEY_GROUP = 1
SIGNING_KEY = b"0123456789abcdef0123"
KEY, SEQ, INPUT = "k", 1, "the input"


class ProcessDied(BaseException):
    """Stands for the process dying inside a call: not an ``Exception``, so no outcome is journaled."""


@dataclass
class Service:
    """A tool's far side: counts invocations, records call ids, and fails or dies when told to."""

    invocations: list = field(default_factory=list)
    call_ids: list = field(default_factory=list)
    fail_with: BaseException | None = None

    def __call__(self, text):
        self.invocations.append(text)
        self.call_ids.append(current_call_id())
        if self.fail_with is not None:
            raise self.fail_with
        return f"done({text})"


def make_agent(service: Service, *, side_effects: str = "external", in_doubt: str = "rerun") -> Agent:
    class Caller(Agent):
        @action(InputEvent)
        def act(event, ctx):  # never run here: the tests drive its calls directly
            pass

    return Caller(resources={"svc": Tool(service, side_effects=side_effects, in_doubt=in_doubt)})


def journal_of(store: MemoryJournalStore):
    return JournalWriter(store, RecordCodec(SIGNING_KEY, "op"), Durability.PER_ACTION).run_journal(KEY_GROUP)


def history_of(store: MemoryJournalStore):
    end = store.end_offsets([KEY_GROUP])
    return read_recovery_index(store, RecordCodec(SIGNING_KEY, "op"), {KEY_GROUP: 0}, end).history(key_digest(KEY))


def _no_event_loop(*_args):
    raise AssertionError("call handling alone never runs an event loop")


def action_calls(agent: Agent, store: MemoryJournalStore | None, *, restored: bool = False,
                 gate: CallGate = ALWAYS_LIVE, epoch: int = 0) -> ActionCalls:
    """One execution of the agent's action; ``restored``: with what ``store`` holds for it (the next attempt);
    ``epoch``: the run's."""
    digest = key_digest(KEY)
    history = history_of(store) if restored else None
    context = RunContext(run=RunInput(KEY, KEY_GROUP, SEQ, INPUT, event_time=5000, epoch=epoch), history=history,
                         journal=journal_of(store) if store else None, fingerprint_policy=FingerprintPolicy.REUSE,
                         cancelled=lambda: False, digest_of_key=digest, input_digest=digest_value(INPUT),
                         child_pool=None, gate=gate, run_events=_no_event_loop)
    event = with_event_id(InputEvent(INPUT), input_event_id(digest, SEQ))
    [spec] = agent.actions_for(event)
    site = ActionSite(spec=spec, action=spec.name, event=event, order=0,
                      record_key=journal_key(KEY_GROUP, SEQ, event.id, spec.name, digest))
    recorded = history.recorded_calls(SEQ, event.id, spec.name) if history is not None else []
    retried = history.retried_positions(SEQ, event.id, spec.name) if history is not None else {}
    return ActionCalls(context=context, scope=Scope(agent, (agent.name,)), site=site, stats=RunStats(),
                       recorded=recorded, retried=retried)


def journaled_outcomes(store: MemoryJournalStore) -> list[CallOutcome]:
    codec = RecordCodec(SIGNING_KEY, "op")
    return [codec.decode(key, value, topic=store.topic, partition=KEY_GROUP).payload.outcome
            for key, value in store.records(KEY_GROUP)
            if RecordCodec.peek_header(value)["kind"] == "call"]


def test_a_returned_call_is_journaled_and_reused_without_calling_again():
    service, store = Service(), MemoryJournalStore(4)
    first = action_calls(make_agent(service), store)
    assert first.call("svc", "a") == "done(a)"
    assert journaled_outcomes(store) == [CallOutcome.STARTED, CallOutcome.RETURNED]  # external: started first

    again = action_calls(make_agent(service), store, restored=True)
    assert again.call("svc", "a") == "done(a)"
    assert service.invocations == ["a"]
    assert (again.stats.calls_reused, again.stats.calls_executed) == (1, 0)
    assert [c.result for c in again.context.calls] == ["done(a)"]  # listed for the run's capture too
    assert again.calls_made == 1


def test_a_raised_call_is_reused_as_the_same_exception():
    service, store = Service(fail_with=LookupError("no such order")), MemoryJournalStore(4)
    with pytest.raises(LookupError, match="no such order"):
        action_calls(make_agent(service), store).call("svc", "a")
    assert journaled_outcomes(store) == [CallOutcome.STARTED, CallOutcome.RAISED]

    service.fail_with = None  # would now succeed: reuse must not ask (the action saw, and may have handled, it)
    again = action_calls(make_agent(service), store, restored=True)
    with pytest.raises(LookupError, match="no such order"):
        again.call("svc", "a")
    assert service.invocations == ["a"] and again.stats.calls_reused == 1


def test_a_call_with_other_arguments_is_made_and_the_journaled_calls_it_does_not_replace_are_reused():
    service, store = Service(), MemoryJournalStore(4)
    first = action_calls(make_agent(service), store)
    first.call("svc", "a")
    first.call("svc", "b")
    again = action_calls(make_agent(service), store, restored=True)
    assert again.call("svc", "other") == "done(other)"  # another path: made
    assert again.call("svc", "b") == "done(b)"  # the same request as journaled: reused, not made again
    assert service.invocations == ["a", "b", "other"]
    assert (again.stats.calls_reused, again.stats.calls_executed) == (1, 1)


def test_calls_made_in_another_order_are_each_reused():
    # A set iterated under another PYTHONHASHSEED: the same calls, in another order.
    service, store = Service(), MemoryJournalStore(4)
    first = action_calls(make_agent(service), store)
    for text in ("a", "b", "c"):
        first.call("svc", text)
    again = action_calls(make_agent(service), store, restored=True)
    assert [again.call("svc", text) for text in ("c", "a", "b")] == ["done(c)", "done(a)", "done(b)"]
    assert service.invocations == ["a", "b", "c"]
    assert (again.stats.calls_reused, again.stats.calls_executed) == (3, 0)
    assert again.stats.calls_reused_out_of_order == 3
    assert again.calls_made == 3


def test_a_call_new_in_a_later_attempt_takes_no_journaled_calls_place():
    service, store = Service(), MemoryJournalStore(4)
    first = action_calls(make_agent(service), store)
    first.call("svc", "a")
    first.call("svc", "b")  # then the process dies: no completion
    second = action_calls(make_agent(service), store, restored=True)
    second.call("svc", "c")  # new, journaled at a place of its own ...
    second.call("svc", "a")  # ... and then this attempt dies too
    third = action_calls(make_agent(service), store, restored=True)
    assert [third.call("svc", text) for text in ("b", "c", "a")] == ["done(b)", "done(c)", "done(a)"]
    assert service.invocations == ["a", "b", "c"]
    assert third.stats.calls_reused == 3


def test_the_same_request_twice_is_reused_once_per_journaled_call():
    service, store = Service(), MemoryJournalStore(4)
    first = action_calls(make_agent(service), store)
    first.call("svc", "tick")
    first.call("svc", "tick")
    again = action_calls(make_agent(service), store, restored=True)
    for _ in range(3):
        again.call("svc", "tick")
    assert service.invocations == ["tick"] * 3  # two reused, the third made
    assert (again.stats.calls_reused, again.stats.calls_executed) == (2, 1)


def _die_during_the_call(in_doubt: str) -> tuple[Service, MemoryJournalStore]:
    service, store = Service(fail_with=ProcessDied()), MemoryJournalStore(4)
    with pytest.raises(ProcessDied):
        action_calls(make_agent(service, in_doubt=in_doubt), store).call("svc", "a")
    assert journaled_outcomes(store) == [CallOutcome.STARTED]  # started, never reported back
    service.fail_with = None
    return service, store


def test_an_external_call_in_doubt_is_made_again_under_the_same_call_id(caplog):
    service, store = _die_during_the_call("rerun")
    again = action_calls(make_agent(service), store, restored=True)
    assert again.call("svc", "a") == "done(a)"
    # The warning says which run it was, so an operator can find the call the service may have seen twice.
    assert re.search(r"key '\w+' seq 1 action act: call 0 to 'svc' in doubt: made again", caplog.text), caplog.text
    assert service.invocations == ["a", "a"]
    first_id, second_id = service.call_ids
    assert first_id == second_id and first_id.startswith("Caller:act:1:0:")  # the service can answer it once
    assert (again.stats.calls_in_doubt, again.stats.calls_executed) == (1, 1)


def test_a_call_in_doubt_reached_in_another_order_is_made_again_under_its_own_call_id():
    service, store = Service(), MemoryJournalStore(4)
    first = action_calls(make_agent(service), store)
    first.call("svc", "a")
    service.fail_with = ProcessDied()
    with pytest.raises(ProcessDied):
        first.call("svc", "b")  # started, never reported back
    service.fail_with = None
    again = action_calls(make_agent(service), store, restored=True)
    assert again.call("svc", "b") == "done(b)"  # now first: in doubt, made again
    assert again.call("svc", "a") == "done(a)"  # reused
    assert service.invocations == ["a", "b", "b"]
    assert service.call_ids[1] == service.call_ids[2]  # the service can tell the rerun from a new request


def test_an_external_call_in_doubt_with_policy_fail_raises_without_calling():
    service, store = _die_during_the_call("fail")
    again = action_calls(make_agent(service, in_doubt="fail"), store, restored=True)
    with pytest.raises(CallInDoubtError, match="call 0 to 'svc' started before a failure and never reported back"):
        again.call("svc", "a")
    assert service.invocations == ["a"] and again.stats.calls_in_doubt == 1


def test_an_external_call_in_doubt_assumed_done_returns_none_and_is_journaled_as_returned(caplog):
    service, store = _die_during_the_call("assume_done")
    again = action_calls(make_agent(service, in_doubt="assume_done"), store, restored=True)
    assert again.call("svc", "a") is None
    assert re.search(r"key '\w+' seq 1 action act: call 0 to 'svc' in doubt: assumed done", caplog.text), caplog.text
    assert service.invocations == ["a"]
    assert journaled_outcomes(store) == [CallOutcome.STARTED, CallOutcome.RETURNED]


def test_a_call_that_failed_its_action_is_made_again_under_a_new_call_id():
    service, store = Service(fail_with=ConnectionError("model down")), MemoryJournalStore(4)
    first = action_calls(make_agent(service, side_effects="none"), store)
    with pytest.raises(ConnectionError):
        first.call("svc", "a")
    assert first.calls_to_retry() == [0]
    # The exception left the action: the engine journals which calls the next attempt makes again.
    site = first.site
    journal_action_failed(first.context.journal, site.record_key, site.spec, ActionFailedRecord(
        SEQ, site.order, site.event.id, site.action, "ConnectionError: model down", first.context.input_digest,
        first.calls_to_retry()))

    service.fail_with = None
    again = action_calls(make_agent(service, side_effects="none"), store, restored=True)
    assert again.call("svc", "a") == "done(a)"
    assert service.invocations == ["a", "a"]
    assert again.stats.calls_retried_after_failure == 1 and again.stats.calls_reused == 0
    first_id, retry_id = service.call_ids
    assert first_id != retry_id  # a service may have stored the failure under the first id


def test_only_the_failures_after_the_last_returned_call_are_retried():
    service, store = Service(), MemoryJournalStore(4)
    calls = action_calls(make_agent(service, side_effects="none"), store)
    service.fail_with = KeyError("handled")
    with pytest.raises(KeyError):
        calls.call("svc", "a")  # a failure the action handled and got past: reused as it was
    service.fail_with = None
    calls.call("svc", "b")
    service.fail_with = TimeoutError("gave up")
    for text in ("c", "c"):
        with pytest.raises(TimeoutError):
            calls.call("svc", text)
    assert calls.calls_to_retry() == [2, 3]


@dataclass
class ScriptedGate:
    """A gate that answers every call with the same decision and remembers what it was asked."""

    decision: GateDecision
    asked: list[GatedCall] = field(default_factory=list)

    def admit(self, call: GatedCall) -> GateDecision:
        self.asked.append(call)
        return self.decision


def test_a_blocked_call_raises_into_the_action_is_reported_and_leaves_no_journal_record():
    service, store = Service(), MemoryJournalStore(4)
    gate = ScriptedGate(Blocked(error=CallBlocked("not in a test", "svc", "'a'"), report="svc was blocked"))
    calls = action_calls(make_agent(service), store, gate=gate)
    with pytest.raises(CallBlocked, match="not in a test"):
        calls.call("svc", "a", urgent=True)
    assert service.invocations == [] and journaled_outcomes(store) == []  # not even 'started'
    assert calls.context.blocked == ["svc was blocked"] and calls.stats.calls_blocked == 1
    [asked] = gate.asked
    assert (asked.key, asked.seq, asked.action, asked.position, asked.resource_name) == (KEY, SEQ, "act", 0, "svc")
    assert (asked.args, asked.kwargs) == (("a",), {"urgent": True})
    assert calls.calls_to_retry() == [0]  # like any call that raised


def test_a_gate_serves_a_recorded_outcome_journaled_as_the_calls_own():
    service, production = Service(), MemoryJournalStore(4)
    action_calls(make_agent(service), production).call("svc", "a")
    event_id = input_event_id(key_digest(KEY), SEQ)
    [record] = history_of(production).recorded_calls(SEQ, event_id, "act")
    store = MemoryJournalStore(4)
    calls = action_calls(make_agent(service), store, gate=ScriptedGate(Recorded(record=record)))
    assert calls.call("svc", "a") == "done(a)"
    assert service.invocations == ["a"]  # production's only
    assert calls.stats.calls_recorded == 1 and journaled_outcomes(store) == [CallOutcome.RETURNED]


def test_the_gate_is_not_asked_for_a_reused_call_and_its_prefix_marks_live_call_ids():
    service, store = Service(), MemoryJournalStore(4)
    action_calls(make_agent(service), store).call("svc", "a")
    gate = ScriptedGate(Live(call_id_prefix="trial:"))
    again = action_calls(make_agent(service), store, restored=True, gate=gate)
    again.call("svc", "a")  # reused
    again.call("svc", "b")  # new: through the gate, live
    assert [call.position for call in gate.asked] == [1]
    assert service.call_ids[1].startswith("trial:Caller:act:1:1:")
    assert current_call_id() is None
