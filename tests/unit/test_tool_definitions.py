"""Tool definitions kept with checkpoints: which tools a restore finds changed, and how."""

from __future__ import annotations

from flink_agents_replay.api.mcp_tools import McpServer, McpTool
from flink_agents_replay.api.resources import Tool
from flink_agents_replay.api.tool_definitions import tool_changes, tool_digests
from flink_agents_replay.api.tools import tool

SERVER = McpServer(url="http://orders.internal:8765/mcp")
LOOKUP = {"name": "lookup_order", "description": "Look up an order.", "annotations": {"readOnlyHint": True},
          "inputSchema": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}


def lookup(order_id: str) -> dict:
    """Look up an order."""
    return {}


def lookup_by_number(order_number: int) -> dict:
    """Look up an order."""
    return {}


def resources(**tools):
    return {"llm": object(), **tools}


def test_the_same_tools_built_again_have_the_same_digests_and_no_change():
    first = tool_digests(resources(orders=McpTool(SERVER, LOOKUP, name="orders"), find=tool(lookup)))
    again = tool_digests(resources(orders=McpTool(SERVER, dict(LOOKUP), name="orders"), find=tool(lookup)))
    assert first == again and set(first) == {"orders", "find"}  # only tools: not the model
    assert tool_changes(first, again) == []


def test_each_change_names_the_tool_and_the_parts_that_changed():
    before = tool_digests(resources(orders=McpTool(SERVER, LOOKUP, name="orders"), find=tool(lookup),
                                    gone=tool(lookup)))
    renamed_argument = {**LOOKUP, "inputSchema": {"type": "object", "properties": {"id": {"type": "string"}}},
                        "annotations": {}}
    now = tool_digests(resources(orders=McpTool(SERVER, renamed_argument, name="orders"),
                                 find=Tool(lookup_by_number, side_effects="none"), new=tool(lookup)))
    assert tool_changes(before, now) == [
        "gone: removed",
        "new: added",
        "find: input_schema, side_effects changed",
        "orders: input_schema, annotations changed",
    ]


def test_a_tool_moved_to_another_server_is_a_change():
    before = tool_digests(resources(orders=McpTool(SERVER, LOOKUP, name="orders")))
    moved = tool_digests(resources(orders=McpTool(McpServer(url="http://staging:8765/mcp"), LOOKUP, name="orders")))
    assert tool_changes(before, moved) == ["orders: server changed"]


# -- across a restore: the real operator on simulated state ----------------------------------------------------
import json  # noqa: E402
import logging  # noqa: E402

import pytest  # noqa: E402

from flink_agents_replay import Agent, InputEvent, OutputEvent, action  # noqa: E402
from flink_agents_replay.core.errors import FingerprintMismatchError  # noqa: E402
from tests.harness.operator_sim import SimWorld  # noqa: E402


class Lookup(Agent):
    @action(InputEvent)
    def answer(event, ctx):
        ctx.send_event(OutputEvent(output=ctx.call("orders", order_id=event.input)))


def orders_agent(listing) -> Lookup:
    return Lookup(name="lookup", resources={"orders": McpTool(SERVER, listing, name="orders", side_effects="none")})


class _Said(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def checkpoint_of(world, listing):
    sim = world.operator(orders_agent(listing), world.config())
    taken = sim.checkpoint(1)
    sim.crash()
    return taken


def test_a_restore_names_the_tools_that_changed_and_goes_on_under_reuse():
    with SimWorld() as world:
        taken = checkpoint_of(world, LOOKUP)
        kept = [json.loads(marker)["tools"] for marker in taken.markers if b'"tools"' in marker]
        assert kept and set(kept[0]) == {"orders"}  # subtask 0 keeps the tools' digests
        changed = {**LOOKUP, "inputSchema": {"type": "object", "properties": {"id": {"type": "string"}}}}
        said = _Said()
        logging.getLogger("flink_agents_replay.operator").addHandler(said)  # the package's logger propagates not
        try:
            sim = world.operator(orders_agent(changed), world.config(), restore=taken)
        finally:
            logging.getLogger("flink_agents_replay.operator").removeHandler(said)
        [line] = [line for line in said.lines if "tools changed" in line]
        assert "the agent's tools changed since checkpoint 1: orders: input_schema changed;" in line
        assert sim.count("tools_changed") == 1
        sim.crash()
        unchanged = world.operator(orders_agent(LOOKUP), world.config(), restore=taken)
        assert unchanged.count("tools_changed") == 0


def test_a_restore_with_changed_tools_is_refused_under_fingerprint_policy_fail():
    with SimWorld() as world:
        taken = checkpoint_of(world, LOOKUP)
        with pytest.raises(FingerprintMismatchError, match=r"orders: removed; lookup_order: added"):
            world.operator(Lookup(name="lookup", resources={
                "lookup_order": McpTool(SERVER, LOOKUP, side_effects="none")}),
                world.config(fingerprint_policy="fail"), restore=taken)
