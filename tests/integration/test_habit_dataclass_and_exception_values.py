"""A job script's dataclass as a tool's parameter, and a caught exception with a keyword-only constructor kept in
memory, across a fail-over (found by an adversarial user's tests).

Both are ordinary Python, and both broke only in the Flink worker, a process the classes reach pickled by
value: the dataclass had no fields there (cloudpickle 2.2 wrote the ``dataclasses`` sentinels as new objects),
so pydantic refused it and no tool call could be made; the exception pickled but did not load
(``RefundError(*args)``), so the action's memory could not be journaled. The fault cuts one input's action
short after the tool loop; the next attempt reuses the loop. Outputs must equal the failure-free run's, each
tool call made once.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest

from flink_agents_replay import Agent, ChatResult, InputEvent, OutputEvent, Tool, ToolCall, action, run_tool_loop
from flink_agents_replay.api.resources import Resource, SideEffects
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import make_inputs
from tests.harness.reference_runs import reference_then_faulty_run

pytestmark = pytest.mark.integration

KEYS, PER_KEY = 3, 6
FAULT_AFTER_LOOP = {"key": "key-001", "n": 3}


@dataclasses.dataclass
class Parcel:
    order: str
    weight_kg: float = 1.0
    labels: list = dataclasses.field(default_factory=list)


class RefundError(Exception):
    def __init__(self, *, order: str, amount: int):
        super().__init__(f"refund of {amount} for {order} refused")
        self.order, self.amount = order, amount


class OneToolTurn(Resource):
    """A model that asks for ``ship`` once with a parcel for the ticket's order, then answers."""

    def __init__(self):
        super().__init__(side_effects=SideEffects.NONE)

    def invoke(self, *, messages, **_):
        if messages[-1]["role"] == "tool":
            return ChatResult(content=f"shipped: {messages[-1]['content']}")
        order = messages[0]["content"]
        parcel = {"order": order, "weight_kg": 2.5, "labels": ["fragile"]}
        return ChatResult(tool_calls=(ToolCall.from_json(f"c-{order}", "ship", json.dumps({"parcel": parcel})),),
                          finish_reason="tool_calls")


def make_agent(counter: InvocationCounter, fault: bool, name: str) -> Agent:
    def ship(parcel: Parcel) -> dict:
        """Ship a parcel."""
        counter.increment(f"ship:{parcel.order}")
        if parcel.order.endswith("-2"):
            raise RefundError(order=parcel.order, amount=3)
        return {"fields": [f.name for f in dataclasses.fields(parcel)], **dataclasses.asdict(parcel)}

    class Shipping(Agent):
        @action(InputEvent)
        def handle(event, ctx):
            order = f"{ctx.key}-{event.input['n']}"
            try:
                done = run_tool_loop(ctx, "llm", messages=[{"role": "user", "content": order}], tools=["ship"])
                reply = done.content
            except RefundError as exc:
                ctx.memory.set("last_error", exc)
                reply = None
            if fault and event.input == FAULT_AFTER_LOOP and counter.increment("fault:after-loop") == 1:
                raise RuntimeError("injected fault after the tool loop")
            error = ctx.memory.get("last_error")
            ctx.send_event(OutputEvent(output={"reply": reply, "error": None if error is None else [
                type(error).__name__, error.order, error.amount, str(error)]}))

    return Shipping(name=name, resources={"llm": OneToolTurn(), "ship": Tool(ship, side_effects="external")})


def test_a_dataclass_tool_parameter_and_a_kw_only_exception_in_memory_survive_a_fail_over(kafka_bootstrap,
                                                                                           tmp_path):
    inputs = make_inputs(KEYS, PER_KEY)
    run = reference_then_faulty_run(kafka_bootstrap, tmp_path, make_agent, inputs, name_prefix="habit-dc",
                                    checkpoint_interval_ms=600_000, restart_attempts=3)
    counts = run.counter.counts()
    assert counts.get("fault:after-loop", 0) >= 2, counts  # the fault fired, and the next attempt went past it
    assert Counter(run.outputs) == run.expected
    replies = [json.loads(output) for _, _, output in run.outputs]
    assert sum('"fields": ["order", "weight_kg", "labels"]' in (r["reply"] or "") for r in replies) == \
        KEYS * (PER_KEY - 1), replies[:3]
    assert ["RefundError", "key-000-2", 3, "refund of 3 for key-000-2 refused"] in [r["error"] for r in replies]
    ships = {name: n for name, n in counts.items() if name.startswith("ship:")}
    assert len(ships) == len(inputs) and set(ships.values()) == {1}, ships
