"""Waiting for outside decisions in the run engine (issue 35): ``ctx.wait_for`` stops the run, a resumed run
reuses everything before the wait, the decision is journaled and reused after a failure, timeouts, errors.

The engine on the in-memory journal; the operator's parking, signals and timers are tested at Flink level.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from flink_agents_replay import ToolCall, run_tool_loop
from flink_agents_replay.api.agent import Agent, Event, InputEvent, OutputEvent, action
from flink_agents_replay.api.resources import Tool
from flink_agents_replay.core.errors import AgentDefinitionError, WaitNotSupportedError, WaitTimedOutError
from flink_agents_replay.engine import RunInput, execute_run
from flink_agents_replay.engine.run import WaitingRun, resume_history
from flink_agents_replay.replay.gate import ReplayCalls
from flink_agents_replay.replay.policy import CallPolicy, WaitPolicy
from flink_agents_replay.storage.journal.memory_store import MemoryJournalStore
from flink_agents_replay.storage.journal.recovery import read_recovery_index
from flink_agents_replay.storage.journal.writer import Durability, JournalWriter
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import key_digest
from flink_agents_replay.storage.records.waits import Decision
from tests.harness.scripted_model import ScriptedModel

KEY_GROUP = 5
SIGNING_KEY = b"waits-signing-key-0123456789"


class Reviewed(Event):
    pass


def refund_agent(calls: Counter, *, on_timeout=None, payload_extra=None) -> Agent:
    """``assess`` looks the order up (a call), counts in memory and sends ``Reviewed``; ``refund`` asks for
    approval of the amount, then refunds (an external call) or answers that it was denied."""

    def tool(name):
        def invoke(*args):
            calls[name] += 1
            return f"{name}{args}"
        return invoke

    class Refunds(Agent):
        @action(InputEvent)
        def assess(event, ctx):
            order = ctx.call("lookup", event.input["order"])
            ctx.memory.set("assessed", ctx.memory.get("assessed", 0) + 1)
            ctx.send_event(Reviewed(order=order, amount=event.input["amount"]))

        @action(Reviewed)
        def refund(event, ctx):
            risk = ctx.call("risk", event.order)
            payload = {"order": event.order, "amount": event.amount, "risk": risk, **(payload_extra or {})}
            options = {} if on_timeout is None else {"on_timeout": on_timeout}
            decision = ctx.wait_for("refund-approval", payload, timeout_s=3600, **options)
            if isinstance(decision, Decision) and decision.approved:
                ctx.send_event(OutputEvent(output=("refunded", ctx.call("payments", event.order, event.amount))))
            else:
                reason = decision.reason if isinstance(decision, Decision) else decision
                ctx.send_event(OutputEvent(output=("denied", reason)))

    resources = {name: Tool(tool(name), side_effects="external" if name == "payments" else "none")
                 for name in ("lookup", "risk", "payments")}
    return Refunds(name="refunds", resources=resources)


def journal(store):
    return JournalWriter(store, RecordCodec(SIGNING_KEY, "op"), Durability.PER_ACTION).run_journal(KEY_GROUP)


def recover(store):
    end = store.end_offsets([KEY_GROUP])
    return read_recovery_index(store, RecordCodec(SIGNING_KEY, "op"), {KEY_GROUP: 0}, end).history(key_digest("k"))


RUN = RunInput("k", KEY_GROUP, 1, {"order": "o-7", "amount": 120})


def first_run(agent, store, memory=None) -> WaitingRun:
    result = execute_run(agent, RUN, memory if memory is not None else {}, journal=journal(store))
    assert result.waiting is not None and result.outputs == []
    return result.waiting


def resume(agent, store, waiting, decision, memory=None, recovered=None):
    run = RunInput(RUN.key, RUN.key_group, RUN.seq, RUN.input, decisions={waiting.wait.wait_id: decision},
                   resuming=True)
    return execute_run(agent, run, memory if memory is not None else {}, journal=journal(store),
                       history=resume_history(waiting, recovered))


def test_a_run_waits_at_wait_for_and_resumes_reusing_every_call_and_action_before_it():
    calls, store = Counter(), MemoryJournalStore(8)
    agent = refund_agent(calls)
    waiting = first_run(agent, store)
    assert calls == Counter({"lookup": 1, "risk": 1})
    assert (waiting.action, waiting.wait.name) == ("refund", "refund-approval")
    assert waiting.wait.payload == {"order": "lookup('o-7',)", "amount": 120, "risk": "risk(\"lookup('o-7',)\",)"}
    assert waiting.wait.wait_id.startswith("refunds:refund:1:")
    assert waiting.wait.deadline_ms - waiting.wait.opened_at_ms == 3_600_000

    result = resume(agent, store, waiting, Decision.approve("fine", by="ana"))
    assert result.waiting is None
    assert [o.output for o in result.outputs] == [("refunded", "payments(\"lookup('o-7',)\", 120)")]
    assert calls == Counter({"lookup": 1, "risk": 1, "payments": 1})  # nothing before the wait made again
    assert result.memory == {"assessed": 1}  # the reused action's update applied once
    assert (result.stats.actions_reused, result.stats.actions_executed) == (1, 1)


def test_a_denied_wait_makes_no_call_after_it():
    calls, store = Counter(), MemoryJournalStore(8)
    agent = refund_agent(calls)
    result = resume(agent, store, first_run(agent, store), Decision.deny("too much"))
    assert [o.output for o in result.outputs] == [("denied", "too much")]
    assert calls == Counter({"lookup": 1, "risk": 1})


def test_the_wait_and_its_decision_are_journaled_and_a_failure_after_the_decision_reuses_it():
    """The resumed run fails in its refund call; the next attempt resumes from the parked records and the
    journal, with no decision handed in: it reuses the journaled one (and the wait's id and deadline)."""
    calls, store = Counter(), MemoryJournalStore(8)
    agent = refund_agent(calls)
    waiting = first_run(agent, store)

    failing = refund_agent(calls)
    failing.resource("payments").invoke = lambda *args: (_ for _ in ()).throw(ConnectionError("payments down"))
    with pytest.raises(ConnectionError):
        resume(failing, store, waiting, Decision.approve())

    run = RunInput(RUN.key, RUN.key_group, RUN.seq, RUN.input, resuming=True)  # no decision handed in
    result = execute_run(agent, run, {}, journal=journal(store), history=resume_history(waiting, recover(store)))
    assert result.waiting is None and [o.output[0] for o in result.outputs] == ["refunded"]
    assert calls == Counter({"lookup": 1, "risk": 1, "payments": 1})


def test_a_run_restored_from_the_journal_alone_reuses_the_journaled_wait_with_its_id_and_deadline():
    """The journal's own records (call schema 3 through the signed envelope) hold the wait: an attempt that
    starts the input again finds the same wait, and resumes with the same id."""
    calls, store = Counter(), MemoryJournalStore(8)
    agent = refund_agent(calls)
    waiting = first_run(agent, store)
    again = execute_run(agent, RUN, {}, journal=journal(store), history=recover(store))
    assert again.waiting is not None and again.waiting.wait == waiting.wait
    assert calls == Counter({"lookup": 1, "risk": 1})


def test_a_timeout_returns_on_timeout_or_raises_into_the_action():
    calls, store = Counter(), MemoryJournalStore(8)
    agent = refund_agent(calls, on_timeout="no answer in time")
    result = resume(agent, store, first_run(agent, store), Decision(timed_out=True, by="timeout"))
    assert [o.output for o in result.outputs] == [("denied", "no answer in time")]

    strict = refund_agent(calls)  # no on_timeout: raised into the action (which may handle it)
    with pytest.raises(WaitTimedOutError, match="no decision for wait 'refund-approval'"):
        execute_run(strict, RunInput(RUN.key, RUN.key_group, RUN.seq, RUN.input,
                                     decisions={first_run(strict, MemoryJournalStore(8)).wait.wait_id:
                                                Decision(timed_out=True)}), {})


def test_an_action_that_catches_the_suspension_still_waits():
    class Swallows(Agent):
        @action(InputEvent)
        def ask(event, ctx):
            try:
                ctx.wait_for("ok?")
            except BaseException:  # noqa: BLE001 - what a careless action does
                pass
            ctx.send_event(OutputEvent(output="went on"))

    result = execute_run(Swallows(name="swallows"), RUN, {})
    assert result.waiting is not None and result.outputs == []


def test_a_sub_agent_cannot_wait():
    class Child(Agent):
        @action(InputEvent)
        def ask(event, ctx):
            ctx.wait_for("ok?")

    class Parent(Agent):
        @action(InputEvent)
        def delegate(event, ctx):
            ctx.call_agent("child", event.input)

    with pytest.raises(WaitNotSupportedError, match="only a top-level agent's actions can wait"):
        execute_run(Parent(name="parent", sub_agents=[Child(name="child")]), RUN, {})


@pytest.mark.parametrize("name", ["", "line\nbreak", "\ud800", 7])
def test_a_wait_name_that_is_empty_unprintable_or_not_unicode_is_a_clear_error(name):
    class Asks(Agent):
        @action(InputEvent)
        def ask(event, ctx):
            ctx.wait_for(name)

    with pytest.raises(TypeError, match="wait_for"):
        execute_run(Asks(name="asks"), RUN, {})


@pytest.mark.parametrize(("payload", "timeout_s", "error"), [
    ({"when": object()}, None, "not JSON data"),
    ({"x": float("nan")}, None, "not JSON data"),
    ({}, 0, "timeout_s must be a positive number"),
    ({}, float("inf"), "timeout_s must be a positive number"),
    ({}, "soon", "timeout_s must be a positive number"),
])
def test_a_payload_that_is_not_json_or_a_bad_timeout_is_a_clear_error(payload, timeout_s, error):
    class Asks(Agent):
        @action(InputEvent)
        def ask(event, ctx):
            ctx.wait_for("ok?", payload, timeout_s=timeout_s)

    with pytest.raises((TypeError, ValueError), match=error):
        execute_run(Asks(name="asks"), RUN, {})


def test_a_redeploy_during_the_wait_resumes_the_same_wait_and_a_changed_question_asks_again():
    """The parked run holds records, never code: the new code resumes. The same question (name and payload)
    is the same wait and takes its decision; another question is another wait, asked anew."""
    calls, store = Counter(), MemoryJournalStore(8)
    waiting = first_run(refund_agent(calls), store)
    decision = Decision.approve()

    redeployed = refund_agent(calls, on_timeout="changed code after the wait")  # code after the wait changed
    result = resume(redeployed, store, waiting, decision)
    assert [o.output[0] for o in result.outputs] == ["refunded"] and calls["risk"] == 1

    asks_more = refund_agent(calls, payload_extra={"currency": "EUR"})
    again = resume(asks_more, MemoryJournalStore(8), waiting, decision)
    assert again.waiting is not None and again.waiting.wait.wait_id != waiting.wait.wait_id
    assert again.waiting.wait.payload["currency"] == "EUR"


_WAIT_ID = """
import json, sys
sys.path.insert(0, sys.argv[1])
from collections import Counter
from test_waits import RUN, refund_agent
from flink_agents_replay.engine import execute_run
print(execute_run(refund_agent(Counter(), payload_extra={k: k for k in "abcdefghij"}), RUN, {}).waiting.wait.wait_id)
"""


def test_the_wait_id_is_the_same_in_every_process_and_hash_seed():
    here = os.path.dirname(__file__)
    ids = {seed: subprocess.run([sys.executable, "-c", _WAIT_ID, here], capture_output=True, text=True, timeout=120,
                                env={**os.environ, "PYTHONHASHSEED": seed}) for seed in ("1", "2", "3")}
    assert all(shown.returncode == 0 for shown in ids.values()), {s: r.stderr[-500:] for s, r in ids.items()}
    assert len({shown.stdout for shown in ids.values()}) == 1, {s: r.stdout for s, r in ids.items()}
    assert json.dumps(ids["1"].stdout.strip()).startswith('"refunds:refund:1:')


# -- tools that need approval ----------------------------------------------------------------------------
def support_agent(refunds: list, amount: int, needs_approval=True) -> Agent:
    def refund(order_id: str, amount: int) -> str:
        refunds.append((order_id, amount))
        return f"refunded {amount} on {order_id}"

    asked = ToolCall.from_json("c1", "refund", json.dumps({"order_id": "O-1", "amount": amount}))

    class Support(Agent):
        @action(InputEvent)
        def answer(event, ctx):
            done = run_tool_loop(ctx, "llm", messages=[{"role": "user", "content": event.input}], tools=["refund"])
            ctx.send_event(OutputEvent(output=[m["content"] for m in done.messages if m["role"] == "tool"]))

    return Support(name="support", resources={
        "llm": ScriptedModel([[asked]]),
        "refund": Tool(refund, needs_approval=needs_approval, approval_timeout_s=600)})


SUPPORT_RUN = RunInput("k", KEY_GROUP, 1, "refund my order")


def _tool_loop_waits_then(decision: Decision, amount: int = 120):
    refunds: list = []
    agent, store = support_agent(refunds, amount), MemoryJournalStore(8)
    waiting = execute_run(agent, SUPPORT_RUN, {}, journal=journal(store)).waiting
    assert waiting is not None and refunds == []
    assert (waiting.wait.name, waiting.wait.payload) == (
        "approve:refund", {"tool": "refund", "arguments": {"order_id": "O-1", "amount": amount}})
    assert waiting.wait.deadline_ms - waiting.wait.opened_at_ms == 600_000
    run = RunInput("k", KEY_GROUP, 1, SUPPORT_RUN.input, decisions={waiting.wait.wait_id: decision}, resuming=True)
    result = execute_run(agent, run, {}, journal=journal(store), history=resume_history(waiting))
    return refunds, result.outputs[0].output


def test_a_tool_that_needs_approval_runs_once_approved():
    refunds, answers = _tool_loop_waits_then(Decision.approve())
    assert refunds == [("O-1", 120)] and answers == ["refunded 120 on O-1"]


def test_a_denied_tool_call_is_not_made_and_the_model_is_told_why():
    refunds, answers = _tool_loop_waits_then(Decision.deny("over the limit"))
    assert refunds == [] and answers == ["error: the call to 'refund' was denied by a reviewer: over the limit"]


def test_an_approval_that_times_out_is_a_denial():
    refunds, answers = _tool_loop_waits_then(Decision(timed_out=True))
    assert refunds == [] and answers == ["error: the call to 'refund' was denied by a reviewer: no decision in time"]


def test_a_predicate_decides_which_calls_need_approval():
    refunds: list = []
    agent = support_agent(refunds, 20, needs_approval=lambda arguments: arguments["amount"] > 100)
    result = execute_run(agent, SUPPORT_RUN, {})
    assert result.waiting is None and refunds == [("O-1", 20)]


def test_resource_names_of_waits_are_reserved():
    with pytest.raises(AgentDefinitionError, match="reserved for waits"):
        support_agent([], 1).add_resource("@wait", lambda: None)


def test_needs_approval_takes_a_bool_or_a_function_and_a_positive_timeout():
    with pytest.raises(TypeError, match="needs_approval takes True, False or a function"):
        Tool(len, needs_approval="yes")
    with pytest.raises(ValueError, match="approval_timeout_s must be a positive number"):
        Tool(len, needs_approval=True, approval_timeout_s=0)


# -- waits in a replay ------------------------------------------------------------------------------------
def _production_calls(agent, decision: Decision) -> dict:
    """The calls production's run made, as the capture keeps them (by event id, action, position)."""
    store = MemoryJournalStore(8)
    waiting = first_run(agent, store)
    result = resume(agent, store, waiting, decision)
    return {(call.event_id, call.action, call.position): call for call in result.calls}


@pytest.mark.parametrize(("wait_policy", "expected"), [
    (WaitPolicy.RECORDED, "refunded"), (WaitPolicy.APPROVE, "refunded"), (WaitPolicy.DENY, "denied")])
def test_a_replay_gives_each_wait_the_recorded_decision_or_its_wait_policys(wait_policy, expected):
    calls = Counter()
    recorded = _production_calls(refund_agent(calls), Decision.approve("fine", by="ana"))
    gate = ReplayCalls({"*": CallPolicy.RECORDED}, recorded, wait_policy=wait_policy)
    result = execute_run(refund_agent(calls), RUN, {}, gate=gate, report_failures=True)
    assert result.waiting is None and result.error is None
    assert [o.output[0] for o in result.outputs] == [expected]
    decision = next(call.result for call in result.calls if call.resource == "@decision")
    assert decision.by == ("ana" if wait_policy is WaitPolicy.RECORDED else "replay")


def test_a_wait_production_recorded_no_decision_for_is_blocked_and_reported_in_a_replay():
    gate = ReplayCalls({"*": CallPolicy.LIVE}, {})  # production recorded nothing of this run: it still waited
    result = execute_run(refund_agent(Counter()), RUN, {}, gate=gate, report_failures=True)
    assert result.waiting is None and "got no decision: production recorded none" in result.error
    assert [(b.resource, b.arguments) for b in result.blocked] == [("@decision", f"wait 'refund-approval' "
                                                                    f"({result.calls[-1].result.wait_id})")]


def test_an_unhandled_timeout_ends_the_resumed_run_with_no_output_and_memory_as_before():
    """The journaled timeout would raise again in every attempt: failing the task would restart the job forever."""
    calls, store = Counter(), MemoryJournalStore(8)
    agent = refund_agent(calls)  # no on_timeout: WaitTimedOutError
    waiting = first_run(agent, store, memory={"assessed": 4})
    result = resume(agent, store, waiting, Decision(timed_out=True), memory={"assessed": 4})
    assert result.error.startswith("WaitTimedOutError: no decision for wait 'refund-approval'")
    assert result.outputs == [] and result.memory == {"assessed": 4} and calls["payments"] == 0


def test_a_run_restored_from_before_its_park_ends_on_its_journaled_timeout_instead_of_failing_every_attempt():
    """Found in review: the checkpoint restored was taken before the run parked; the run parked, timed out and
    journaled the timeout after it. Re-run from its input (not resuming), it reuses the journaled timeout: the run
    ends with memory as before, or the job would restart forever."""
    calls, store = Counter(), MemoryJournalStore(8)
    agent = refund_agent(calls)  # no on_timeout
    waiting = first_run(agent, store, memory={"assessed": 4})
    resume(agent, store, waiting, Decision(timed_out=True), memory={"assessed": 4})
    result = execute_run(agent, RUN, {"assessed": 4}, journal=journal(store), history=recover(store))
    assert result.error.startswith("WaitTimedOutError") and result.memory == {"assessed": 4}
    assert result.outputs == [] and calls == Counter({"lookup": 1, "risk": 1})


def test_resuming_takes_the_seq_out_of_the_recovered_history():
    """Found in review: the key's recovered history kept the resumed seq, so it never counted as replayed and held
    its partition's pruning back."""
    calls, store = Counter(), MemoryJournalStore(8)
    agent = refund_agent(calls)
    waiting = first_run(agent, store)
    recovered = recover(store)
    assert len(recovered) > 0
    resume_history(waiting, recovered)
    assert len(recovered) == 0


def test_a_call_already_journaled_is_not_held_for_an_approval_added_by_a_later_deploy():
    """Found in review: the refund was paid; the code redeployed while the run recovers now asks approval for it."""
    refunds, store = [], MemoryJournalStore(8)
    paid = support_agent(refunds, 120, needs_approval=False)
    execute_run(paid, SUPPORT_RUN, {}, journal=journal(store))
    asks_now = support_agent(refunds, 120, needs_approval=True)
    result = execute_run(asks_now, SUPPORT_RUN, {}, journal=journal(store), history=recover(store))
    assert result.waiting is None and refunds == [("O-1", 120)]  # reused, not asked for, not paid twice


def test_a_sub_agent_whose_tools_need_approval_is_refused_where_it_is_defined():
    class Child(Agent):
        @action(InputEvent)
        def act(event, ctx):
            ctx.call("pay", 1)

    class Parent(Agent):
        @action(InputEvent)
        def act(event, ctx):
            ctx.call_agent("child", event.input)

    child = Child(name="child", resources={"pay": Tool(lambda amount: amount, needs_approval=True)})
    with pytest.raises(AgentDefinitionError, match="only a top-level agent's actions can wait"):
        Parent(name="parent", sub_agents=[child])
