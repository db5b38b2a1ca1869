"""Sub-agent calls on an in-memory journal: journaling under the parent run, reuse after a crash at every
point of a child call, divergence confined to the subtree, errors, fan-out on a small pool."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from flink_agents_replay.api.agent import Agent, Event, InputEvent, OutputEvent, action
from flink_agents_replay.api.resources import Tool
from flink_agents_replay.core.errors import (
    NoSubAgentOutputError,
    SubAgentCycleError,
    SubAgentTimeoutError,
    UnknownSubAgentError,
)
from flink_agents_replay.engine import RunInput, execute_run
from flink_agents_replay.engine.child_pool import ChildCallPool
from flink_agents_replay.storage.journal.memory_store import MemoryJournalStore
from flink_agents_replay.storage.journal.recovery import read_recovery_index
from flink_agents_replay.storage.journal.writer import Durability, JournalWriter
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import key_digest

KEY_GROUP = 5
SIGNING_KEY = b"0123456789abcdef0123"


class Checked(Event):
    pass


class Decided(Event):
    pass


class Triaged(Event):
    pass


class RefundError(Exception):
    pass


def refund_agent(calls: Counter, *, fail_on: str | None = None) -> Agent:
    """Three chained actions with one journaled call each; keeps a count in its own memory scope."""

    def tool(name):
        def invoke(text):
            calls[name] += 1
            if fail_on is not None and fail_on in text:
                raise RefundError(f"refund refused for {text}")
            return f"{name}({text})"
        return invoke

    class Refund(Agent):
        @action(InputEvent)
        def check(event, ctx):
            ctx.send_event(Checked(text=ctx.call("c1", event.input)))

        @action(Checked)
        def decide(event, ctx):
            ctx.send_event(Decided(text=ctx.call("c2", event.text)))

        @action(Decided)
        def execute(event, ctx):
            ctx.memory.set("refunds", ctx.memory.get("refunds", 0) + 1)
            ctx.send_event(OutputEvent(output={"refund": ctx.call("c3", event.text),
                                               "refunds": ctx.memory.get("refunds")}))

    return Refund(name="refund", resources={f"c{i}": Tool(tool(f"c{i}"), side_effects="none") for i in (1, 2, 3)})


def parent_agent(calls: Counter, child: Agent) -> Agent:
    """Two actions: the first calls the child, the second makes a call of its own."""

    class Triage(Agent):
        @action(InputEvent)
        def triage(event, ctx):
            try:
                [refund] = ctx.call_agent("refund", event.input)
            except RefundError as exc:
                refund = {"refused": str(exc)}
            ctx.memory.set("last", refund)
            ctx.send_event(Triaged(refund=refund))

        @action(Triaged)
        def answer(event, ctx):
            ctx.send_event(OutputEvent(output={"answer": ctx.call("p2", repr(event.refund))}))

    def p2(text):
        calls["p2"] += 1
        return f"p2({text})"

    return Triage(name="triage", resources={"p2": Tool(p2, side_effects="none")}, sub_agents=[child])


def writer(store):
    return JournalWriter(store, RecordCodec(SIGNING_KEY, "op"), Durability.PER_ACTION)


def recover(store):
    return read_recovery_index(store, RecordCodec(SIGNING_KEY, "op"), {KEY_GROUP: 0},
                               store.end_offsets([KEY_GROUP]))


def run(agent, store, seq=1, value="order-1", memory=None, history=None, pool=None):
    return execute_run(agent, RunInput("k", KEY_GROUP, seq, value), dict(memory or {}), history=history,
                       journal=writer(store).run_journal(KEY_GROUP), child_pool=pool)


def prefix(store: MemoryJournalStore, records: int) -> MemoryJournalStore:
    """The journal as a crash after its first ``records`` records would leave it."""
    cut = MemoryJournalStore(8)
    for record in store.records(KEY_GROUP)[:records]:
        cut.append(KEY_GROUP, *record)
    return cut


def summary(result):
    return [(o.id, o.output) for o in result.outputs], result.memory


def test_child_work_is_journaled_under_the_parent_run_and_the_child_has_its_own_memory_scope():
    calls, store = Counter(), MemoryJournalStore(8)
    result = run(parent_agent(calls, refund_agent(calls)), store)
    assert calls == Counter({"c1": 1, "c2": 1, "c3": 1, "p2": 1})
    assert result.memory["_sub_agents"]["refund"] == {"refunds": 1}
    assert result.memory["last"] == {"refund": "c3(c2(c1(order-1)))", "refunds": 1}
    assert result.stats.child_calls_executed == 1 and result.stats.actions_executed == 5
    # accepted; child: 3 calls + 3 completions; parent: the child-call record, 2 completions, 1 call
    assert len(store.records(KEY_GROUP)) == 11
    second = run(parent_agent(calls, refund_agent(calls)), store, seq=2, value="order-2",
                 memory=result.memory)
    assert second.memory["_sub_agents"]["refund"] == {"refunds": 2}  # the scope persists across inputs


# Journal order of one input: accepted, c1, check, c2, decide, c3, execute, agent:refund, triage, p2, answer.
@pytest.mark.parametrize(("crash_after", "expected_calls", "child_actions_run", "child_call_reused"), [
    (1, {"c1": 1, "c2": 1, "c3": 1, "p2": 1}, 3, False),   # (a) before the child started
    (5, {"c3": 1, "p2": 1}, 1, False),                      # (b) after the child's second action
    (8, {"p2": 1}, 0, True),                                # (c) child finished, parent action not
    (9, {"p2": 1}, 0, False),                               #     the parent action finished too
])
def test_after_a_crash_only_unfinished_child_work_runs(crash_after, expected_calls, child_actions_run,
                                                       child_call_reused):
    calls, store = Counter(), MemoryJournalStore(8)
    reference = run(parent_agent(calls, refund_agent(calls)), store)
    crashed = prefix(store, crash_after)
    calls.clear()
    replayed = run(parent_agent(calls, refund_agent(calls)), crashed,
                   history=recover(crashed).history(key_digest("k")) if crash_after else None)
    assert calls == Counter(expected_calls)
    assert summary(replayed) == summary(reference)
    assert replayed.stats.child_calls_reused == int(child_call_reused)
    parent_actions_run = 2 if crash_after < 9 else 1
    assert replayed.stats.actions_executed == child_actions_run + parent_actions_run


def test_a_child_call_with_another_input_runs_a_fresh_subtree():
    calls, store = Counter(), MemoryJournalStore(8)
    run(parent_agent(calls, refund_agent(calls)), store, value="order-1")
    crashed = prefix(store, 5)  # the child's first two actions for "order-1" are journaled
    calls.clear()
    replayed = run(parent_agent(calls, refund_agent(calls)), crashed, value="order-1-changed",
                   history=recover(crashed).history(key_digest("k")))
    assert calls == Counter({"c1": 1, "c2": 1, "c3": 1, "p2": 1})  # nothing of the old subtree reused
    assert replayed.outputs[0].output["answer"].startswith("p2({'refund': 'c3(c2(c1(order-1-changed)))'")


def test_a_child_exception_reaches_the_parent_with_its_type_also_when_reused():
    calls, store = Counter(), MemoryJournalStore(8)
    parent = parent_agent(calls, refund_agent(calls, fail_on="order-9"))
    first = run(parent, store, value="order-9")
    assert first.memory["last"] == {"refused": "refund refused for order-9"}
    calls.clear()
    again = run(parent, store, value="order-9", history=recover(store).history(key_digest("k")))
    assert calls == Counter() and summary(again) == summary(first)
    # accepted, c1's RAISED record, the child action's failure (c1 raised out of it), the child call's RAISED record
    crashed = prefix(store, 4)
    calls.clear()
    replayed = run(parent, crashed, value="order-9", history=recover(crashed).history(key_digest("k")))
    assert calls["c1"] == 0 and summary(replayed) == summary(first)


def test_unregistered_child_cycle_and_missing_output_are_clear_errors():
    calls = Counter()

    class Caller(Agent):
        @action(InputEvent)
        def go(event, ctx):
            ctx.send_event(OutputEvent(output=ctx.call_agent(event.input, "x")))

    class Silent(Agent):
        @action(InputEvent)
        def nothing(event, ctx):
            ctx.memory.set("seen", True)

    class Back(Agent):
        @action(InputEvent)
        def back(event, ctx):
            ctx.send_event(OutputEvent(output=ctx.call_agent("Caller", "y")))

    caller = Caller(sub_agents=[Silent(), Back()])
    caller.sub_agent("Back").add_sub_agent(caller)
    with pytest.raises(UnknownSubAgentError, match=r"agent Caller has no sub-agent 'refund' \(registered: Back, "
                                                    r"Silent\)"):
        run(caller, MemoryJournalStore(8), value="refund")
    with pytest.raises(NoSubAgentOutputError, match="Caller -> Silent .* finished without an OutputEvent"):
        run(caller, MemoryJournalStore(8), value="Silent")
    with pytest.raises(SubAgentCycleError, match="cycle: Caller -> Back -> Caller"):
        run(caller, MemoryJournalStore(8), value="Back")
    assert calls == Counter()


def test_a_child_beyond_its_timeout_raises_a_timeout_in_the_parent():
    class Slow(Agent):
        @action(InputEvent)
        def first(event, ctx):
            ctx.send_event(Checked(text=ctx.call("sleep", event.input)))

        @action(Checked)
        def second(event, ctx):
            ctx.send_event(OutputEvent(output=ctx.call("sleep", event.text)))

    class Impatient(Agent):
        @action(InputEvent)
        def go(event, ctx):
            try:
                ctx.call_agent("Slow", event.input, timeout=0.05)
                outcome = "finished"
            except SubAgentTimeoutError as exc:
                outcome = str(exc)
            ctx.send_event(OutputEvent(output=outcome))

    slow = Slow(resources={"sleep": Tool(lambda text: time.sleep(0.1) or text, side_effects="none")})
    result = run(Impatient(sub_agents=[slow]), MemoryJournalStore(8))
    assert "Impatient -> Slow did not finish within 0.05 s" in result.outputs[0].output


def fan_out_agents(calls: Counter, children: int, nested: int = 0):
    class Leaf(Agent):
        @action(InputEvent)
        def leaf(event, ctx):
            ctx.send_event(OutputEvent(output=ctx.call("work", event.input)))

    class Middle(Agent):
        @action(InputEvent)
        def middle(event, ctx):
            outputs = ctx.call_agents([("Leaf", f"{event.input}.{i}") for i in range(nested)]) if nested else []
            ctx.send_event(OutputEvent(output=[o for [o] in outputs] or event.input))

    class Parent(Agent):
        @action(InputEvent)
        def fan_out(event, ctx):
            outputs = ctx.call_agents([("Middle", f"{event.input}-{i}") for i in range(children)])
            ctx.send_event(OutputEvent(output=[o for [o] in outputs]))

    def work(text):
        calls[text] += 1
        time.sleep(0.01)
        return text.upper()

    leaf = Leaf(resources={"work": Tool(work, side_effects="none")})
    return Parent(sub_agents=[Middle(sub_agents=[leaf])])


def test_nested_fan_out_on_a_pool_smaller_than_the_fan_out_finishes_and_reuses_everything_after_a_crash():
    calls, store = Counter(), MemoryJournalStore(8)
    pool = ChildCallPool(2)
    parent = fan_out_agents(calls, children=8, nested=4)
    finished: list = []
    worker = threading.Thread(target=lambda: finished.append(run(parent, store, value="in", pool=pool)))
    worker.start()
    worker.join(timeout=30)
    assert finished, "the fan-out did not finish: a pool smaller than the fan-out deadlocked"
    [result] = finished
    assert result.outputs[0].output == [[f"IN-{i}.{j}" for j in range(4)] for i in range(8)]
    assert sum(calls.values()) == 32 and set(calls.values()) == {1}
    assert result.stats.child_calls_executed == 8 + 32
    records = len(store.records(KEY_GROUP))
    crashed = prefix(store, records // 2)  # a crash half-way through the fan-out
    calls.clear()
    replayed = run(parent, crashed, value="in", pool=pool, history=recover(crashed).history(key_digest("k")))
    assert summary(replayed) == summary(result)
    assert 0 < sum(calls.values()) < 32 and set(calls.values()) == {1}
    pool.shutdown()


def test_a_fan_out_after_the_pool_shut_down_runs_in_the_calling_thread():
    """A closing operator shuts the sub-agent pool while parent runs still finish their calls under way: a
    fan-out then must not fail the parent's action (a failure would be journaled and retried under new ids),
    its callers run the children themselves."""
    pool = ChildCallPool(2)
    pool.shutdown()
    caller = threading.current_thread()
    ran_on = []
    outcomes = pool.run_all([lambda n=n: ran_on.append(threading.current_thread()) or n for n in range(3)])
    assert [outcome.error for outcome in outcomes] == [None, None, None]
    assert [outcome.value for outcome in outcomes] == [0, 1, 2]
    assert ran_on == [caller] * 3
