"""The public testing API (``flink_agents_replay.testing``) used as a user would use it on their own agent.

One MiniCluster run: a stateful agent defined here, with a tool that counts its real invocations in the
environment's counter, fails over once after some outputs. The result must show the fail-over happened, every
output committed exactly once with the failure-free values, and every logical call made once.
"""

from __future__ import annotations

import pytest

from flink_agents_replay import Agent, Event, InputEvent, OutputEvent, Tool, action
from flink_agents_replay.testing import AgentTestEnvironment, FailOver, InvocationCounter

pytestmark = pytest.mark.integration


class Looked(Event):
    """The input with what the lookup returned."""


def counted_lookup(counter: InvocationCounter):
    def lookup(key: str, n: int) -> str:
        counter.increment(f"lookup:{key}:{n}")
        return f"found {key}/{n}"
    return lookup


class HistoryAgent(Agent):
    """Looks each input up (a journaled tool call) and answers with the key's history so far (memory)."""

    @action(InputEvent)
    def look_up(event, ctx):
        ctx.send_event(Looked(n=event.input["n"], found=ctx.call("lookup", ctx.key, event.input["n"])))

    @action(Looked)
    def answer(event, ctx):
        history = [*ctx.memory.get("history", []), event.n]
        ctx.memory.set("history", history)
        ctx.send_event(OutputEvent(output={"n": event.n, "found": event.found, "history": history}))


def test_a_user_agent_fails_over_once_and_every_effect_happens_once(kafka_bootstrap):
    inputs = [{"customer": f"c{k}", "n": n} for n in range(4) for k in range(3)]
    with AgentTestEnvironment.from_bootstrap(kafka_bootstrap) as env:
        agent = HistoryAgent(name="user-history", resources={"lookup": Tool(counted_lookup(env.counter))})
        result = env.run(agent, inputs=inputs, key=lambda record: record["customer"],
                         fail_over=FailOver(after_outputs=6))

    assert result.failure is None, result.failure
    assert result.failed_over
    assert result.duplicate_outputs() == []
    assert result.outputs_by_key() == {
        f"c{k}": [{"n": n, "found": f"found c{k}/{n}", "history": list(range(n + 1))} for n in range(4)]
        for k in range(3)}
    assert result.call_counts == {f"lookup:c{k}:{n}": 1 for n in range(4) for k in range(3)}


class RefusingAgent(Agent):
    @action(InputEvent)
    def refuse(event, ctx):
        raise ValueError(f"refund of {event.input['n']} over the limit")


def test_an_action_that_raises_ends_the_run_with_its_python_exception_readable(kafka_bootstrap):
    with AgentTestEnvironment.from_bootstrap(kafka_bootstrap) as env:
        result = env.run(RefusingAgent(name="refusing", resources={}), inputs=[{"customer": "c0", "n": 7}],
                         key=lambda record: record["customer"])
    assert result.failure is not None and result.outputs == ()
    assert result.failure_message == "ValueError: refund of 7 over the limit", result.failure_message


class AskingAgent(Agent):
    @action(InputEvent)
    def ask(event, ctx):
        if event.input["n"] > 1:
            ctx.wait_for("refund-approval", {"n": event.input["n"]})
        ctx.send_event(OutputEvent(output=event.input["n"]))


def test_runs_left_waiting_are_reported_not_lost(kafka_bootstrap):
    with AgentTestEnvironment.from_bootstrap(kafka_bootstrap) as env:
        result = env.run(AskingAgent(name="asking", resources={}), key=lambda record: record["customer"],
                         inputs=[{"customer": "c0", "n": 1}, {"customer": "c0", "n": 2}, {"customer": "c1", "n": 3}])
    assert result.failure is None and result.outputs_by_key() == {"c0": [1]}
    assert sorted((w.key, w.seq, w.name, w.payload["n"]) for w in result.open_waits) == [
        ("c0", 2, "refund-approval", 2), ("c1", 1, "refund-approval", 3)]
