"""Tools as a model sees them, the openai-SDK ChatModel against the local model service, chat results in the
journal, and the SDK's exceptions through the journal; the tool loop on the run engine with an in-memory journal."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from enum import Enum
from typing import Literal

import httpx
import openai
import pydantic
import pytest

from flink_agents_replay import ChatModel, Tool, tool
from flink_agents_replay.api.tools import function_schema
from flink_agents_replay.local.model_server import StubModelServer
from flink_agents_replay.storage.records.chat import ChatResult, ToolCall, Usage
from flink_agents_replay.storage.records.journal import CallOutcome, CallRecord
from flink_agents_replay.storage.records.raised import decode_exception, encode_exception
from flink_agents_replay.storage.records.schemas import call_from_plain, call_to_plain

KEY_GROUP = 2
SIGNING_KEY = b"tools-and-chat-model-signing-key"


class Priority(str, Enum):
    LOW = "low"
    HIGH = "high"


@tool(side_effects="none")
def lookup_order(order_id: str, include_items: bool = False, priority: Priority = Priority.LOW) -> dict:
    """Look up an order: its status and carrier.

    Args:
        order_id: the order's id, like A-1234.
        include_items: also list the
            items of the order.
        priority: how urgent.

    Returns:
        the order.
    """
    return {"order_id": order_id, "status": "shipped"}


def test_a_tool_schema_comes_from_type_hints_and_the_docstring():
    schema = lookup_order.openai_schema()
    assert schema["type"] == "function" and schema["function"]["name"] == "lookup_order"
    assert schema["function"]["description"] == "Look up an order: its status and carrier."
    parameters = schema["function"]["parameters"]
    assert parameters["required"] == ["order_id"]
    assert parameters["properties"]["order_id"] == {"type": "string", "description": "the order's id, like A-1234."}
    assert parameters["properties"]["include_items"]["description"] == "also list the items of the order."
    assert parameters["properties"]["include_items"]["default"] is False
    priority = parameters["properties"]["priority"]
    assert priority["default"] == "low" and parameters["$defs"]["Priority"]["enum"] == ["low", "high"]
    assert isinstance(lookup_order, Tool) and lookup_order.side_effects.value == "none"


def test_a_tool_takes_a_schema_by_hand_and_a_function_without_hints_takes_anything():
    by_hand = Tool(lambda **kw: kw, name="echo", description="Echo.", schema={"type": "object", "properties": {}})
    assert by_hand.openai_schema()["function"] == {"name": "echo", "description": "Echo.",
                                                   "parameters": {"type": "object", "properties": {}}}

    def untyped(a, b=2):
        return a

    assert function_schema(untyped)["required"] == ["a"] and function_schema(untyped)["properties"]["b"] == {
        "default": 2}
    assert tool(untyped).side_effects.value == "external"  # the safe default


@pytest.fixture(scope="module")
def server():
    with StubModelServer() as running:
        yield running


def test_a_prompt_returns_text_and_messages_return_a_chat_result_with_usage(server):
    model = ChatModel("stub-model", base_url=server.base_url, api_key="unused")
    assert model.invoke(prompt="Categories: billing, shipping\nmy parcel shipping is late") == "shipping"
    result = model.invoke(messages=[{"role": "user", "content": "Categories: billing, shipping\nrefund billing"}])
    assert isinstance(result, ChatResult) and result.content == "billing"
    assert result.usage == Usage(prompt_tokens=5, completion_tokens=1) and result.model == "stub-model"
    assert result.latency_ms > 0 and result.finish_reason == "stop" and result.tool_calls == ()


def test_every_attempt_carries_the_call_id_as_idempotency_key(server):
    from flink_agents_replay.api.call_site import _CALL_SITE, CallSite

    model = ChatModel("stub-model", base_url=server.base_url, api_key="unused")
    before = server.stats()
    site = CallSite(call_id="agent:act:1:0:abc", stable_id="s", agent="agent", resource="llm", key_digest="k",
                    seq=1, event_time_ms=None, epoch=1)
    token = _CALL_SITE.set(site)
    try:
        first = model.invoke(prompt="tell me about my refund")
        second = model.invoke(prompt="tell me about my refund")  # the same call made again after a crash
    finally:
        _CALL_SITE.reset(token)
    after = server.stats()
    assert first == second
    assert (after.chat - before.chat, after.idempotent_replays - before.idempotent_replays) == (1, 1)


def test_a_chat_result_is_journaled_as_plain_data_and_read_back_equal():
    class Answer(pydantic.BaseModel):
        label: Literal["billing", "shipping"]
        score: float

    result = ChatResult(content='{"label": "billing", "score": 0.5}', parsed=Answer(label="billing", score=0.5),
                        tool_calls=(ToolCall.from_json("call_1", "lookup_order", '{"order_id": "A-1"}'),),
                        usage=Usage(12, 3), model="m", latency_ms=4.5, finish_reason="stop")
    record = CallRecord(1, 0, "ev", "act", 0, "llm", "d", CallOutcome.RETURNED, result, "in",
                        meta={"latency_ms": 4.6, "model": "m", "prompt_tokens": 12, "completion_tokens": 3})
    plain = call_to_plain(record)
    assert plain["result"]["chat"]["usage"] == [12, 3] and b"flink_agents_replay" not in json.dumps(
        {k: v for k, v in plain["result"]["chat"].items() if k != "parsed"}).encode()
    back = call_from_plain(plain)
    assert back.result.parsed == {"label": "billing", "score": 0.5}  # its JSON: no class in the journal
    model = ChatModel("m", base_url="http://unused/v1")
    restored = model.restore_result(back.result, (), {"response_format": Answer})
    assert restored == result and type(restored.parsed) is Answer
    assert back.result.tool_calls[0].arguments == {"order_id": "A-1"}
    assert back.result.message()["tool_calls"][0]["function"] == {"name": "lookup_order",
                                                                   "arguments": '{"order_id": "A-1"}'}


def test_the_sdks_exceptions_keep_their_type_and_status_through_the_journal():
    request = httpx.Request("POST", "http://model/v1/chat/completions")
    response = httpx.Response(429, request=request, json={"error": {"message": "slow down"}})
    limited = openai.RateLimitError("slow down", response=response, body={"message": "slow down"})
    unreachable = openai.APIConnectionError(request=request)
    for error in (limited, unreachable):
        record = CallRecord(1, 0, "ev", "act", 0, "llm", "d", CallOutcome.RAISED, encode_exception(error), "in")
        raised = decode_exception(call_from_plain(call_to_plain(record)).result)
        assert type(raised) is type(error) and str(raised) == str(error)
    assert decode_exception(call_from_plain(call_to_plain(CallRecord(
        1, 0, "ev", "act", 0, "llm", "d", CallOutcome.RAISED, encode_exception(limited), "in"))).result
    ).status_code == 429


# -- the tool loop on the run engine, journaled in memory ---------------------------------------------------------
from typing import Annotated  # noqa: E402

from flink_agents_replay import run_tool_loop  # noqa: E402
from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, action  # noqa: E402
from flink_agents_replay.core.errors import ToolLoopLimitError  # noqa: E402
from flink_agents_replay.engine import RunInput, execute_run  # noqa: E402
from flink_agents_replay.storage.journal.memory_store import MemoryJournalStore  # noqa: E402
from flink_agents_replay.storage.journal.recovery import read_recovery_index  # noqa: E402
from flink_agents_replay.storage.journal.writer import Durability, JournalWriter  # noqa: E402
from flink_agents_replay.storage.records.codec import RecordCodec  # noqa: E402
from flink_agents_replay.storage.records.journal import key_digest  # noqa: E402

KEY_GROUP = 2
SIGNING_KEY = b"tools-and-chat-model-signing-key"


class Crash(Exception):
    pass


class FlakyModel(ChatModel):
    """Crashes once before its turn ``crash_at`` (the earlier turns and tool calls are journaled by then)."""

    def __init__(self, *args, crash_at: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.crash_at, self.turns = crash_at, 0

    def invoke(self, *args, **kwargs):
        self.turns += 1
        if self.turns == self.crash_at:
            self.crash_at = None
            raise Crash("the process died before this model turn")
        return super().invoke(*args, **kwargs)


def loop_agent(server, looked_up: Counter, *, crash_at=None, max_turns=4) -> Agent:
    def find_order(order_id: Annotated[str, pydantic.Field(pattern=r"O-\d{5}")]) -> dict:
        """Find an order by its id."""
        looked_up[order_id] += 1
        return {"order_id": order_id, "status": "in transit"}

    class Support(Agent):
        @action(InputEvent)
        def answer(event, ctx):
            done = run_tool_loop(ctx, "llm", messages=[{"role": "user", "content": event.input}],
                                 tools=["find_order"], max_turns=max_turns)
            ctx.send_event(OutputEvent(output={"reply": done.content, "turns": done.turns,
                                               "tools": [c.name for c, _ in done.tool_calls]}))

    model = FlakyModel("stub-model", base_url=server.base_url, api_key="unused", crash_at=crash_at)
    return Support(name="support", resources={"llm": model, "find_order": tool(find_order, side_effects="none")})


def _run(agent, store, text, *, recover=False, key="c1"):
    codec = RecordCodec(SIGNING_KEY, "op")
    index = read_recovery_index(store, codec, {KEY_GROUP: 0}, store.end_offsets([KEY_GROUP])) if recover else None
    history = index.history(key_digest(key)) if index else None
    return execute_run(agent, RunInput(key, KEY_GROUP, 1, text), {}, history=history,
                       journal=JournalWriter(store, codec, Durability.PER_ACTION).run_journal(KEY_GROUP))


def test_the_tool_loop_calls_the_tool_the_model_chose_then_answers(server):
    looked_up, before = Counter(), server.stats()
    result = _run(loop_agent(server, looked_up), MemoryJournalStore(8), "Where is my order O-12345?")
    (output,) = [o.output for o in result.outputs]
    assert output["turns"] == 2 and output["tools"] == ["find_order"] and looked_up == Counter({"O-12345": 1})
    assert output["reply"].startswith("Thank you for reaching out.")
    assert server.stats().chat - before.chat == 2 and server.stats().tool_call_replies - before.tool_call_replies == 1
    calls = [c for c in result.calls if c.resource == "llm"]
    assert [c.meta["model"] for c in calls] == ["stub-model", "stub-model"]
    assert all(c.meta["prompt_tokens"] > 0 and c.meta["latency_ms"] > 0 for c in calls)


def test_a_loop_cut_between_a_tool_call_and_the_next_turn_resumes_there_repeating_nothing(server):
    # Another key: other call ids (the service would answer the same ids from its idempotency store).
    reference = _run(loop_agent(server, Counter()), MemoryJournalStore(8), "Where is my order O-12345?", key="c0")
    looked_up, store = Counter(), MemoryJournalStore(8)
    agent = loop_agent(server, looked_up, crash_at=2)
    before = server.stats()
    with pytest.raises(Crash):
        _run(agent, store, "Where is my order O-12345?", key="c2")
    assert (server.stats().chat - before.chat, sum(looked_up.values())) == (1, 1)  # the fault hit after the tool
    resumed = _run(agent, store, "Where is my order O-12345?", recover=True, key="c2")
    assert server.stats().chat - before.chat == 2 and looked_up == Counter({"O-12345": 1})  # turn 1 and tool reused
    assert [o.output for o in resumed.outputs] == [o.output for o in reference.outputs]


def test_a_model_that_keeps_calling_tools_stops_at_max_turns(server):
    agent = loop_agent(server, Counter(), max_turns=1)
    with pytest.raises(ToolLoopLimitError, match="after 1 turns"):
        _run(agent, MemoryJournalStore(8), "Where is my order O-12345?")


class Triage(pydantic.BaseModel):
    """At module level: pydantic keeps a local class's enclosing namespace, which need not pickle."""

    category: Literal["refund", "shipping", "account"]
    urgent: bool
    summary: str


def test_structured_output_is_reused_as_the_same_object(server):
    made = []

    class Structured(Agent):
        @action(InputEvent)
        def triage(event, ctx):
            result = ctx.call("llm", messages=[{"role": "user", "content": event.input}], response_format=Triage)
            made.append(result.parsed)
            ctx.send_event(OutputEvent(output=result.parsed))

    agent = Structured(name="structured", resources={"llm": ChatModel("stub-model", base_url=server.base_url,
                                                                      api_key="unused")})
    store, before = MemoryJournalStore(8), server.stats()
    first = _run(agent, store, "My parcel shipping is late", key="c3")
    again = _run(agent, store, "My parcel shipping is late", recover=True, key="c3")
    assert server.stats().chat - before.chat == 1  # reused, not asked again
    assert isinstance(made[0], Triage) and made[0].category == "shipping"
    assert type(again.outputs[0].output) is Triage and again.outputs[0].output == first.outputs[0].output


def test_a_tool_schema_is_derived_where_the_tool_is_made_and_travels_with_it():
    """A job script's function reaches the workers pickled by value, without the names its string annotations
    use: the schema must be derived in the client, and a tool whose hints do not resolve says so when shown."""
    import cloudpickle

    def lookup(order_id: Annotated[str, pydantic.Field(pattern=r"O-\d{5}")]) -> dict:
        return {}

    shipped = cloudpickle.loads(cloudpickle.dumps(tool(lookup)))
    assert shipped.openai_schema()["function"]["parameters"]["properties"]["order_id"]["pattern"] == r"O-\d{5}"

    def unresolvable(order_id: NoSuchType) -> dict:  # noqa: F821 - resolved only when asked for (future import)
        return {}

    broken = Tool(unresolvable)  # any callable still makes a tool
    with pytest.raises(TypeError, match="has no schema a model could be shown.*NoSuchType.*give Tool"):
        broken.openai_schema()


class Carrier(str, Enum):
    UPS = "ups"
    DHL = "dhl"


class Verdict(pydantic.BaseModel):
    category: Literal["refund", "shipping", "account"]
    urgent: bool


def test_a_loop_converts_the_models_arguments_to_the_tools_types_and_answers_in_a_pydantic_format(server):
    seen, answers = [], []

    def track(carrier: Carrier, order_id: Annotated[str, pydantic.Field(pattern=r"O-\d{5}")]) -> set:
        """Track a parcel."""
        seen.append((type(carrier), carrier, order_id))
        return {"b-scan", "a-scan", "c-scan"}  # a set: sent sorted, the same text in every attempt

    class Tracking(Agent):
        @action(InputEvent)
        def answer(event, ctx):
            done = run_tool_loop(ctx, "llm", messages=[{"role": "user", "content": event.input}], tools=["track"],
                                 response_format=Verdict)
            answers.append(done)
            ctx.send_event(OutputEvent(output=done.final.parsed))

    agent = Tracking(name="tracking", resources={
        "llm": ChatModel("stub-model", base_url=server.base_url, api_key="unused"),
        "track": tool(track, side_effects="none")})
    result = _run(agent, MemoryJournalStore(8), "my dhl parcel O-54321 shipping is late", key="c4")
    assert seen == [(Carrier, Carrier.DHL, "O-54321")]  # an enum member, not the string 'dhl'
    (done,) = answers
    assert done.messages[2]["content"] == '["a-scan", "b-scan", "c-scan"]'
    assert type(result.outputs[0].output) is Verdict and result.outputs[0].output.category == "shipping"


def test_arguments_that_do_not_fit_make_no_call_and_tell_the_model():
    def track(carrier: Carrier) -> str:
        raise AssertionError("not to be called")

    tracked = tool(track)
    with pytest.raises(ValueError, match="carrier"):
        tracked.model_arguments({"carrier": "fedex"})
    assert tracked.model_arguments({"carrier": "ups"}) == {"carrier": Carrier.UPS}


def test_tools_are_shown_under_names_a_model_can_call():
    from flink_agents_replay.api.agent import RunnerContext
    from flink_agents_replay.core.errors import AgentDefinitionError

    ctx = RunnerContext(key="k", seq=1, memory=None, send=None, call=None,
                        resources={"crm.lookup": tool(lambda q: q), "lookup-v2": Tool(lambda: 1, name="x")})
    assert ctx.tool_schemas("lookup-v2")[0]["function"]["name"] == "lookup-v2"  # the resource name
    with pytest.raises(AgentDefinitionError, match="'crm.lookup' is not one it can use"):
        ctx.tool_schemas("crm.lookup")


class Aliased(pydantic.BaseModel):
    """An alias and a validator with a side effect: the reused answer must go through the same code as the live one."""

    order_id: str = pydantic.Field(alias="orderId")
    notes: list[str] = []

    @pydantic.field_validator("notes")
    @classmethod
    def mark(cls, notes: list[str]) -> list[str]:
        return [*notes, "seen"]


def test_a_structured_answer_is_validated_the_same_way_live_and_reused():
    model = ChatModel("m", base_url="http://unused/v1")
    journaled = ChatResult(content='{"orderId": "O-1", "notes": ["x"]}', parsed={"orderId": "O-1", "notes": ["x"]})
    record = CallRecord(1, 0, "ev", "act", 0, "llm", "d", CallOutcome.RETURNED, journaled, "in")
    reused = call_from_plain(call_to_plain(record)).result
    live = model.restore_result(journaled, (), {"response_format": Aliased, "messages": []})
    again = model.restore_result(reused, (), {"response_format": Aliased, "messages": []})
    assert live.parsed == again.parsed == Aliased(orderId="O-1", notes=["x"]) and live.parsed.notes == ["x", "seen"]
    from flink_agents_replay.core.errors import ChatModelError

    with pytest.raises(ChatModelError, match="does not fit Aliased"):
        model.restore_result(ChatResult(parsed={"notes": 3}), (), {"response_format": Aliased})
    # A messages= call journaled by 0.4 holds its text: it comes back as a ChatResult.
    assert model.restore_result("hello", (), {"messages": []}) == ChatResult(content="hello")


def test_tools_given_as_objects_digest_by_their_schema_whatever_the_process_did_before():
    import cloudpickle

    from flink_agents_replay.engine.digest import digest_value

    shipped = cloudpickle.loads(cloudpickle.dumps(lookup_order))
    before = digest_value({"tools": [shipped]})
    shipped.model_arguments({"order_id": "A-1"})  # builds its per-process validator
    assert digest_value({"tools": [shipped]}) == before == digest_value({"tools": [lookup_order]})


def test_tool_answers_reach_the_model_as_the_same_text_in_every_process_or_are_refused():
    from dataclasses import dataclass as plain_dataclass

    from flink_agents_replay.api.tool_loop import _as_text

    @plain_dataclass
    class Parcel:
        tags: frozenset
        carrier: Carrier

    assert _as_text(Parcel(frozenset({"b", "a"}), Carrier.UPS)) == '{"carrier": "ups", "tags": ["a", "b"]}'
    assert _as_text({1: "one", "b": {2, 1}}) == '{"1": "one", "b": [1, 2]}'

    class Opaque:
        pass

    with pytest.raises(TypeError, match="must be JSON-like data"):
        _as_text({"order": Opaque()})


def test_the_sdk_client_loads_its_lazy_resources_while_made_so_run_threads_never_import_them_at_once():
    # Two run threads importing openai.resources.chat and .embeddings at once can deadlock on module locks
    # (a _DeadlockError raised into a call, seen after a TaskManager restore in the demo).
    script = ("import sys\nfrom flink_agents_replay.api.chat_model import ChatModel\n"
              "ChatModel('m', base_url='http://127.0.0.1:9/v1', api_key='k')._sdk()\n"
              "print(all(m in sys.modules for m in ('openai.resources.chat', 'openai.resources.embeddings')))\n")
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert shown.stdout.strip() == "True", shown.stderr


def test_a_services_odd_token_counts_count_as_none_and_fail_no_call():
    """A count the journal cannot keep (over 64 bits) failed the call after it took effect; a negative or
    non-numeric one is no count either."""
    from types import SimpleNamespace

    from flink_agents_replay.api.chat_model import _chat_result

    def completion(prompt_tokens):
        message = SimpleNamespace(content="hi", tool_calls=None, refusal=None)
        return SimpleNamespace(choices=[SimpleNamespace(message=message, finish_reason="stop")], model="m",
                               usage=SimpleNamespace(prompt_tokens=prompt_tokens, completion_tokens=1))

    for reported, kept in ((10**30, 0), (-5, 0), ("x", 0), (True, 0), (None, 0), (7, 7)):
        assert _chat_result(completion(reported), 1.0, parse_json=False).usage == Usage(kept, 1), reported


def test_report_call_leaves_out_a_number_the_journal_cannot_keep():
    from flink_agents_replay import Agent, InputEvent, OutputEvent, action
    from flink_agents_replay.api.call_site import report_call
    from flink_agents_replay.core.keygroups import key_group
    from flink_agents_replay.engine import RunInput, execute_run
    from flink_agents_replay.storage.journal.memory_store import MemoryJournalStore
    from flink_agents_replay.storage.journal.writer import Durability, JournalWriter
    from flink_agents_replay.storage.records.codec import RecordCodec

    def counted(prompt):
        report_call(model="m", prompt_tokens=10**30, completion_tokens=3)
        return "ok"

    class Asks(Agent):
        @action(InputEvent)
        def ask(event, ctx):
            ctx.send_event(OutputEvent(ctx.call("model", event.input)))

    agent = Asks(name="asks", resources={"model": Tool(counted, side_effects="none")})
    store = MemoryJournalStore(8)
    writer = JournalWriter(store, RecordCodec(b"0123456789abcdef0123", "asks"), Durability.PER_ACTION)
    group = key_group("k", "STRING", 8)
    result = execute_run(agent, RunInput("k", group, 1, "hello"), {}, journal=writer.run_journal(group),
                         trace=True, report_failures=True)
    writer.close()
    assert result.error is None and [o.output for o in result.outputs] == ["ok"]
    [call] = result.trace.calls
    assert "prompt_tokens" not in call.record.meta and call.record.meta["completion_tokens"] == 3
