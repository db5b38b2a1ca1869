"""This package's objects inside a user's values (a ChatResult kept in memory, a ToolLoopResult sent as output, a
caught ChatModelError...) persist under their public name and fields, never under a module path of the package:
a later version that moves a module still reads the user's savepoints and journals."""

from __future__ import annotations

import subprocess
import sys
from typing import Annotated

import pydantic
import pytest

from flink_agents_replay import ChatResult, InputEvent, OutputEvent, SideEffects, ToolCall, ToolLoopResult
from flink_agents_replay.core.errors import ChatModelError, NotPicklableError, ToolLoopLimitError
from flink_agents_replay.storage.formats.plain import dump_user, load_user
from flink_agents_replay.storage.records.chat import Usage

PACKAGE_PATH = b"flink_agents_replay"


class Note:
    """A user's class holding a package object (the pickle path through cloudpickle, not the builtin fast path)."""

    def __init__(self, reply):
        self.reply = reply

    def __eq__(self, other):
        return type(other) is Note and other.reply == self.reply


def _result() -> ChatResult:
    call = ToolCall("call-1", "lookup_order", {"order_id": "A-1"}, '{"order_id": "A-1"}')
    return ChatResult(content="On its way.", tool_calls=(call,), usage=Usage(12, 5), model="stub-model",
                      latency_ms=3.5, finish_reason="stop")


def _loop_result() -> ToolLoopResult:
    final = _result()
    return ToolLoopResult("On its way.", final, [{"role": "user", "content": "where?"}, final.message()], 2,
                          [(final.tool_calls[0], {"status": "in transit", "tags": {"b", "a"}})])


VALUES = {
    "chat result": _result,
    "tool loop result": _loop_result,
    "events": lambda: [InputEvent({"ticket": 1}), OutputEvent("done")],
    "an enum member": lambda: {"effects": SideEffects.EXTERNAL},
    "a caught package error": lambda: ChatModelError("the model answered without text"),
    "inside a user's object": lambda: Note(_result()),
    "inside a large list": lambda: [_result()] + list(range(1000)),
}


@pytest.mark.parametrize("make", VALUES.values(), ids=VALUES.keys())
def test_package_objects_in_user_values_persist_without_a_module_path_and_read_back_equal(make):
    value = make()
    data = dump_user(value)
    assert PACKAGE_PATH not in data
    again = load_user(data)
    if isinstance(value, BaseException):
        assert type(again) is type(value) and again.args == value.args
    else:
        assert again == value and type(again) is type(value)


def test_an_event_read_back_keeps_its_id():
    from flink_agents_replay.core.events import with_event_id

    event = with_event_id(OutputEvent("done"), "ev-7")
    assert load_user(dump_user(event)).id == "ev-7"


def test_a_package_object_without_a_public_name_is_refused_clearly():
    from flink_agents_replay.integrations.vector_store import Where

    with pytest.raises(NotPicklableError, match=r"memory path 'filter' holds an object of Where, an internal"):
        dump_user({"filter": Where()}, what="memory path 'filter'")


def test_a_process_that_never_imported_the_class_reads_it_back():
    data = dump_user({"final": _loop_result()})
    code = ("import sys; from flink_agents_replay.storage.formats.plain import load_user\n"
            "value = load_user(sys.stdin.buffer.read())\n"
            "print(type(value['final']).__name__, value['final'].final.usage.prompt_tokens)")
    done = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True, check=True)
    assert done.stdout.decode().split() == ["ToolLoopResult", "12"]


def test_values_pickled_by_an_earlier_version_by_reference_still_read():
    import cloudpickle

    old = cloudpickle.dumps({"reply": _result()})  # 0.5.0 wrote package objects by their module path
    assert PACKAGE_PATH in old and load_user(old) == {"reply": _result()}


def test_a_tool_loop_result_kept_in_memory_and_sent_survives_the_journal_and_the_state_by_name():
    """An action keeps the loop's result in memory and sends it: the journal's records and the operator's memory
    state name no module of the package, and a recovered run reuses both equal."""
    from flink_agents_replay import Agent, ChatModel, OutputEvent, action, run_tool_loop, tool
    from flink_agents_replay.engine import RunInput, execute_run
    from flink_agents_replay.local.model_server import StubModelServer
    from flink_agents_replay.storage.formats.state import decode_memory, encode_memory
    from flink_agents_replay.storage.journal.memory_store import MemoryJournalStore
    from flink_agents_replay.storage.journal.recovery import read_recovery_index
    from flink_agents_replay.storage.journal.writer import Durability, JournalWriter
    from flink_agents_replay.storage.records.codec import RecordCodec
    from flink_agents_replay.storage.records.journal import key_digest

    def find_order(order_id: Annotated[str, pydantic.Field(pattern=r"O-\d{5}")]) -> dict:
        """Find an order by its id."""
        return {"order_id": order_id, "status": "in transit"}

    class Support(Agent):
        @action(InputEvent)
        def answer(event, ctx):
            done = run_tool_loop(ctx, "llm", messages=[{"role": "user", "content": event.input}],
                                 tools=["find_order"])
            ctx.memory.set("last", done)
            ctx.send_event(OutputEvent(output=done))

    codec, store = RecordCodec(b"package-values-signing-key", "op"), MemoryJournalStore(4)
    with StubModelServer() as server:
        agent = Support(name="support", resources={
            "llm": ChatModel("stub-model", base_url=server.base_url, api_key="unused"),
            "find_order": tool(find_order, side_effects="none")})
        journal = JournalWriter(store, codec, Durability.PER_ACTION).run_journal(1)
        first = execute_run(agent, RunInput("k", 1, 1, "Where is my order O-12345?"), {}, journal=journal)
        index = read_recovery_index(store, codec, {1: 0}, store.end_offsets([1]))
        made = server.stats().chat
        again = execute_run(agent, RunInput("k", 1, 1, "Where is my order O-12345?"), {},
                            history=index.history(key_digest("k")),
                            journal=JournalWriter(store, codec, Durability.PER_ACTION).run_journal(1))
        assert server.stats().chat == made == 2  # the recovered run reused both turns
    assert isinstance(first.memory["last"], ToolLoopResult) and first.memory["last"].turns == 2
    assert again.memory == first.memory and again.outputs[0].output == first.outputs[0].output
    assert all(PACKAGE_PATH not in value for _, value in store.records(1))
    state = encode_memory(first.memory)
    assert PACKAGE_PATH not in state and decode_memory(state) == first.memory


def test_classes_of_the_testing_api_and_the_demo_pickle_like_user_code():
    from flink_agents_replay.storage.formats.package_values import holds_package_code
    from flink_agents_replay.testing.agents import Classified

    assert not holds_package_code(Classified) and holds_package_code(ChatResult)
    assert load_user(dump_user([Classified.__new__(Classified)]))[0].__class__ is Classified


def test_package_objects_that_refer_to_each_other_or_are_shared_keep_their_shape():
    first, second = InputEvent(None), InputEvent(None)
    first.input, second.input = second, first  # a cycle through two package objects
    failure = ToolLoopLimitError("still calling tools")
    failure.me = failure
    reply = _result()
    again = load_user(dump_user({"events": [first], "failure": failure, "shared": [reply] * 100}))
    assert again["events"][0].input.input is again["events"][0]
    assert again["failure"].me is again["failure"]
    assert all(r is again["shared"][0] for r in again["shared"]) and again["shared"][0] == reply
    assert len(dump_user([reply] * 100)) < len(dump_user([reply])) + 400  # the memo, not 100 copies


class Ticket(OutputEvent):
    """A user's event class on a package base (in a ``flink run -py`` script it is pickled by value)."""


def test_a_class_pickled_by_value_names_its_package_base_by_its_persisted_name():
    # tests/conftest.py registers every test module for pickling by value, as a job script is.
    data = dump_user({"ticket": Ticket("late parcel"), "format": ChatResult, "effects": [SideEffects.NONE]})
    assert b"on a package base" in data and PACKAGE_PATH not in data  # Ticket by value (its docstring), no path
    again = load_user(data)
    assert again["ticket"].output == "late parcel" and OutputEvent in type(again["ticket"]).__mro__
    assert again["format"] is ChatResult and again["effects"][0] is SideEffects.NONE


def test_resources_keep_their_own_pickled_state():
    """A tool and a chat model that made a call (its SDK client and locks stay out of its pickle)."""
    from flink_agents_replay import ChatModel, tool

    @tool
    def lookup(order_id: str) -> str:
        """Look it up."""
        return order_id

    model = ChatModel("m", base_url="http://127.0.0.1:9/v1")
    model._sdk()  # its client, with a lock, exists now
    again = load_user(dump_user({"tool": lookup, "model": model}))
    assert again["tool"].schema == lookup.schema and again["model"].model == "m"


def test_a_function_of_the_package_in_a_value_is_refused_clearly():
    from flink_agents_replay import run_tool_loop

    with pytest.raises(NotPicklableError, match="memory path 'f' holds run_tool_loop, a function of"):
        dump_user({"f": run_tool_loop, "n": object()}, what="memory path 'f'")


def test_every_class_the_package_exports_has_a_persisted_name_that_resolves():
    import flink_agents_replay
    from flink_agents_replay.storage.formats.package_values import PERSISTED_CLASSES, package_class_from_id

    exported = {name for name in flink_agents_replay.__all__ if isinstance(getattr(flink_agents_replay, name), type)
                and not issubclass(getattr(flink_agents_replay, name), BaseException)}
    assert exported <= set(PERSISTED_CLASSES)
    for name in PERSISTED_CLASSES:
        kind = package_class_from_id(["flink-agents-replay", "class", name])
        assert kind.__name__ == name
