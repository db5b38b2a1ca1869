"""Short-term memory by dotted path, and the agent definition rules."""

import pytest

from flink_agents_replay.api.agent import Agent, Event, InputEvent, OutputEvent, action
from flink_agents_replay.api.memory import DELETED, Memory, MemoryUpdate
from flink_agents_replay.api.resources import SideEffects, Tool
from flink_agents_replay.core.errors import AgentDefinitionError, UnknownResourceError


def test_memory_paths_and_recorded_updates():
    memory = Memory()
    memory.set("a.b.c", 1)
    memory.set("a.x", [1])
    assert memory.get("a.b.c") == 1 and memory.get("a.b") == {"c": 1} and memory.get("nope", 5) == 5
    assert "a.b.c" in memory and "a.b.d" not in memory
    memory.delete("a.b.c")
    memory.delete("never.there")
    assert memory.get("a.b") == {}
    assert memory.take_updates() == [
        MemoryUpdate("a.b.c", 1), MemoryUpdate("a.x", [1]), MemoryUpdate("a.b.c", DELETED),
        MemoryUpdate("never.there", DELETED)]
    assert memory.take_updates() == []


def test_reapplied_updates_rebuild_the_same_memory():
    original = Memory({"keep": 1})
    original.set("a.b", 2)
    original.delete("keep")
    replayed = Memory({"keep": 1})
    replayed.apply(original.take_updates())
    assert replayed.data == original.data == {"a": {"b": 2}}


@pytest.mark.parametrize("path", ["", "a..b", ".a", 3])
def test_bad_paths_are_refused(path):
    with pytest.raises(ValueError, match="dotted"):
        Memory().set(path, 1)


def test_actions_in_definition_order_and_by_event_type():
    class Special(Event):
        pass

    class A(Agent):
        @action(InputEvent)
        def second(event, ctx):
            pass

        @action(InputEvent, Special)
        def first(event, ctx):
            pass

    agent = A()
    assert [s.name for s in agent.actions_for(InputEvent(input=1))] == ["second", "first"]
    assert [s.name for s in agent.actions_for(Special())] == ["first"]
    assert agent.name == "A"


def test_fingerprint_ignores_line_numbers_but_not_code():
    def make(body_constant):
        class B(Agent):
            @action(InputEvent)
            def act(event, ctx):
                ctx.send_event(OutputEvent(output=body_constant))
        return B()

    assert make(1).actions[0].fingerprint == make(1).actions[0].fingerprint

    class C(Agent):
        @action(InputEvent)
        def act(event, ctx):
            ctx.send_event(OutputEvent(output="changed"))

    assert C().actions[0].fingerprint != make(1).actions[0].fingerprint


def test_definition_errors():
    with pytest.raises(AgentDefinitionError, match="at least one event type"):
        action()
    with pytest.raises(AgentDefinitionError, match="Event subclasses"):
        action(str)

    class Empty(Agent):
        pass

    with pytest.raises(AgentDefinitionError, match="defines no action"):
        Empty()

    class Other(Event):
        pass

    class NoInput(Agent):
        @action(Other)
        def act(event, ctx):
            pass

    with pytest.raises(AgentDefinitionError, match="no action for InputEvent"):
        NoInput()


def test_resources_plain_callables_become_external_tools_and_unknown_names_are_explained():
    class A(Agent):
        @action(InputEvent)
        def act(event, ctx):
            pass

    agent = A(resources={"lookup": len})
    assert isinstance(agent.resource("lookup"), Tool)
    assert agent.resource("lookup").side_effects is SideEffects.EXTERNAL
    with pytest.raises(UnknownResourceError, match=r"no resource 'llm' \(registered: lookup\)"):
        agent.resource("llm")
    with pytest.raises(AgentDefinitionError):
        agent.add_resource("bad", 42)


def test_events_compare_by_type_and_fields():
    class E(Event):
        pass

    assert E(a=1) == E(a=1) and E(a=1) != E(a=2)
    assert InputEvent(1) != OutputEvent(1)
    assert repr(E(a=1)) == "E(a=1)"
