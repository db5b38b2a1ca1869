"""Agent and sub-agent names: the characters the journal uses as separators are refused when the agent is defined.

A journal record key is ``<key group>:<seq>:<event id>:<action>:<key digest>`` (split on ``:`` when read
back) and a sub-agent's actions are named ``<sub-agent>/<action>``, so a name holding ``:`` or ``/`` would be
written fine and make every restore fail.
"""

from __future__ import annotations

import pytest

from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, action
from flink_agents_replay.core.errors import AgentDefinitionError
from flink_agents_replay.engine import RunInput, execute_run
from flink_agents_replay.storage.records.journal import journal_key, parse_journal_key


class Echo(Agent):
    @action(InputEvent)
    def echo(event, ctx):
        ctx.send_event(OutputEvent(output=event.input))


class Caller(Agent):
    @action(InputEvent)
    def ask(event, ctx):
        ctx.send_event(OutputEvent(output=ctx.call_agent("helper", event.input)))


def assert_names(error: Exception, character: str, name: str) -> None:
    """The error names the bad character, the name, and why (the journal)."""
    message = str(error)
    assert repr(character) in message and repr(name) in message and "journal" in message, message


@pytest.mark.parametrize(("name", "character"), [("billing:v2", ":"), ("team/billing", "/"), (":", ":"),
                                                 ("a/b:c", "/")])
def test_a_name_with_a_journal_separator_is_refused_when_the_agent_is_defined(name, character):
    with pytest.raises(AgentDefinitionError) as raised:
        Echo(name=name)
    assert_names(raised.value, character, name)


@pytest.mark.parametrize(("name", "character"), [("helper:v2", ":"), ("tools/helper", "/")])
def test_a_sub_agent_name_with_a_journal_separator_is_refused(name, character):
    with pytest.raises(AgentDefinitionError) as raised:
        Caller(sub_agents=[Echo(name=name)])
    assert_names(raised.value, character, name)
    # A name changed after the agent was defined is checked too, before it can be registered or journaled.
    helper = Echo(name="helper")
    with pytest.raises(AgentDefinitionError) as raised:
        helper.name = name
    assert_names(raised.value, character, name)
    assert helper.name == "helper"


def test_accepted_names_still_work_and_round_trip_through_journal_keys():
    helper = Echo(name="helper-v2.1_x")
    assert helper.name == "helper-v2.1_x"
    helper.name = "helper"
    caller = Caller(name="caller-1", sub_agents=[helper])
    result = execute_run(caller, RunInput("k", 0, 1, "hi"), {})
    assert [output.output for output in result.outputs] == [["hi"]]
    assert Echo().name == "Echo"
    key = journal_key(3, 7, "e1", "helper/echo", "digest")
    assert parse_journal_key(key)[:4] == (3, 7, "e1", "helper/echo")


@pytest.mark.parametrize("name", ["with space", "tab\there"])
def test_names_with_spaces_are_still_refused(name):
    with pytest.raises(AgentDefinitionError, match="non-empty without spaces"):
        Echo(name=name)


@pytest.mark.parametrize("reserved", ["_accepted", "_attempt", "_private"])
def test_action_names_with_a_leading_underscore_are_reserved(reserved):
    namespace = {reserved: action(InputEvent)(lambda event, ctx: None)}
    with pytest.raises(AgentDefinitionError, match=f"{reserved}: action names may not start with '_'"):
        type("Reserved", (Agent,), namespace)()
