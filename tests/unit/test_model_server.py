"""The stub model and order-lookup service: deterministic replies, counts, idempotency, its process and CLI."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from enum import Enum
from typing import Literal, Optional

import openai
import pytest
from pydantic import BaseModel, Field

from flink_agents_replay.api.chat_model import ChatModel
from flink_agents_replay.cli import main as cli_main
from flink_agents_replay.local.errors import LocalServiceError
from flink_agents_replay.local.model_server import (
    VERBOSE_MODEL_NAME,
    VERBOSE_SENTENCE,
    LocalModelServer,
    ServerStats,
    StubModelServer,
    draft_reply,
    fetch_stats,
    reset_stats,
)
from flink_agents_replay.local.processes import pid_alive


@pytest.fixture
def server():
    with StubModelServer() as running:
        yield running


def _request(url: str, body: bytes | dict | None = None, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _chat(server: StubModelServer, text: str, headers: dict[str, str] | None = None, **extra) -> tuple[int, bytes]:
    body = {"model": "stub-model", "messages": [{"role": "user", "content": text}], **extra}
    return _request(server.base_url + "/chat/completions", body, headers)


def _wait_until(condition, what: str, timeout_s: float = 10.0) -> None:
    """Poll ``condition`` until it holds (a condition wait, not a guessed sleep)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.002)


def _counts(stats: ServerStats) -> ServerStats:
    """The counters without the token totals (which tests of counting executions do not care about)."""
    return replace(stats, prompt_tokens=0, completion_tokens=0, tool_call_replies=0)


def _reply(server: StubModelServer, text: str) -> str:
    status, body = _chat(server, text)
    assert status == 200, body
    return json.loads(body)["choices"][0]["message"]["content"]


# --- replies ------------------------------------------------------------------------------------------------


def test_same_request_gives_byte_equal_reply_in_openai_format(server):
    first = _chat(server, "My order 1234 has not arrived.", temperature=0.2)
    second = _chat(server, "My order 1234 has not arrived.", temperature=0.2)
    assert first == second and first[0] == 200
    reply = json.loads(first[1])
    assert reply["object"] == "chat.completion" and reply["id"].startswith("chatcmpl-")
    assert reply["model"] == "stub-model" and isinstance(reply["created"], int)
    assert reply["choices"][0]["message"]["role"] == "assistant"
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert reply["usage"]["prompt_tokens"] == 6
    assert reply["usage"]["total_tokens"] == 6 + reply["usage"]["completion_tokens"]
    assert _chat(server, "My order 1235 has not arrived.", temperature=0.2)[1] != first[1]


def test_category_is_the_first_listed_name_found_as_a_whole_word(server):
    ask = "Classify the ticket.\nCategories: billing, shipping, technical\nTicket: {}"
    assert _reply(server, ask.format("My parcel is late, what about SHIPPING?")) == "shipping"
    # Listed order decides, not the order in the text.
    assert _reply(server, ask.format("technical trouble with my billing page")) == "billing"
    # Whole words only: "rebilling" and "technicalities" do not count.
    assert _reply(server, ask.format("rebilling technicalities; technical")) == "technical"
    # The Categories line itself names every category, and must not count.
    text = ask.format("nothing relevant here")
    names = ["billing", "shipping", "technical"]
    assert _reply(server, text) == names[int(hashlib.sha256(text.encode()).hexdigest(), 16) % 3]


def test_category_fallback_only_picks_listed_names_and_spreads(server):
    replies = {_reply(server, f"categories:  Alpha , Beta,Gamma.\nticket number {i}") for i in range(40)}
    assert replies == {"Alpha", "Beta", "Gamma"}


def test_category_comes_from_the_last_user_message(server):
    messages = [
        {"role": "system", "content": "Categories: system-only"},
        {"role": "user", "content": "Categories: a, b\nabout a"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": [{"type": "text", "text": "Categories: x, y\nthis is about y"}]},
    ]
    status, body = _request(server.base_url + "/chat/completions", {"model": "m", "messages": messages})
    assert status == 200
    assert json.loads(body)["choices"][0]["message"]["content"] == "y"
    assert json.loads(body)["model"] == "m"


def test_drafts_are_deterministic_and_differ_across_inputs(server):
    drafts = [_reply(server, f"Please help with ticket {i}: the app crashes.") for i in range(20)]
    assert all(d.startswith("Thank you for reaching out. ") and "(ref " in d for d in drafts)
    assert len(set(drafts)) == 20
    assert _reply(server, "Please help with ticket 3: the app crashes.") == drafts[3]


def test_chat_model_resource_works_against_it(server):
    model = ChatModel("stub-model", base_url=server.base_url)
    assert model.invoke(prompt="Categories: refund, other\nI want a refund") == "refund"
    assert model.invoke(prompt="Write a reply").startswith("Thank you for reaching out.")
    assert server.stats().chat == 2


def test_bad_requests_are_400_in_openai_format_and_not_executed(server):
    url = server.base_url + "/chat/completions"
    for body in (b"{not json", b"[]", b'{"model": "m"}', b'{"model": "m", "messages": []}',
                 b'{"model": "m", "messages": [{"content": "no role"}]}'):
        status, reply = _request(url, body)
        assert status == 400, body
        assert json.loads(reply)["error"]["type"] == "invalid_request_error"
    assert _chat(server, "hi", headers={"X-Stub-Delay-Ms": "soon"})[0] == 400
    assert server.stats() == ServerStats()


def test_models_lists_the_stub_model(server):
    status, body = _request(server.base_url + "/models")
    assert status == 200
    assert [m["id"] for m in json.loads(body)["data"]] == ["stub-model"]


def test_orders_are_deterministic_and_empty_id_is_404(server):
    first = _request(server.url + "/orders/A-1001")
    assert first == _request(server.url + "/orders/A-1001") and first[0] == 200
    order = json.loads(first[1])
    assert order["order_id"] == "A-1001"
    assert order["status"] in ("processing", "shipped", "delivered", "returned")
    assert 1 <= order["items"] <= 5 and isinstance(order["total"], float) and order["carrier"]
    others = [json.loads(_request(server.url + f"/orders/A-{i}")[1]) for i in range(30)]
    assert len({o["status"] for o in others}) > 1
    assert _request(server.url + "/orders/")[0] == 404
    assert _request(server.url + "/orders")[0] == 404
    assert server.stats().orders == 32


# --- tool calls -----------------------------------------------------------------------------------------------

_GET_ORDER = {"type": "function", "function": {
    "name": "get_order", "description": "Look an order up",
    "parameters": {"type": "object", "required": ["order_id"], "properties": {
        "order_id": {"type": "string", "pattern": r"[A-Z]-\d{4}"},
        "quantity": {"type": "integer", "minimum": 1},
        "carrier": {"type": "string", "enum": ["UPS", "DHL"]},
        "express": {"type": "boolean"}}}}}
_SEND_EMAIL = {"type": "function", "function": {
    "name": "send-email",
    "parameters": {"type": "object", "required": ["body"], "properties": {
        "body": {"type": "string"}, "urgent": {"type": "boolean"}}}}}
_TOOLS = [_GET_ORDER, _SEND_EMAIL]


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)


def _ask(client, text: str | list, **extra):
    messages = [{"role": "user", "content": text}] if isinstance(text, str) else text
    return client.chat.completions.create(model="stub-model", messages=messages, **extra)


def _calls(completion) -> list[tuple[str, dict]]:
    return [(call.function.name, json.loads(call.function.arguments))
            for call in completion.choices[0].message.tool_calls or []]


def test_a_tool_mentioned_by_name_is_called_with_the_text(client):
    text = "Please Send Email to the customer"  # '-' in the name matches a space, any case
    completion = _ask(client, text, tools=_TOOLS)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert _calls(completion) == [("send-email", {"body": text, "urgent": False})]
    assert choice.message.tool_calls[0].id.startswith("call_") and choice.message.tool_calls[0].type == "function"
    # A required plain string is the text; the pattern does not match, so the text is the order id.
    assert _calls(_ask(client, "what does GET ORDER say", tools=_TOOLS)) == [
        ("get_order", {"order_id": "what does GET ORDER say", "express": False})]
    # The name as a whole word only: "get_order_status" is not "get_order".
    assert _calls(_ask(client, "get_order_status please", tools=_TOOLS)) == []


def test_a_tool_whose_required_parameters_the_text_fills_is_called(client):
    completion = _ask(client, "I ordered 3 parcels (order A-1001), shipped by dhl.", tools=_TOOLS)
    assert _calls(completion) == [
        ("get_order", {"order_id": "A-1001", "quantity": 3, "carrier": "DHL", "express": False})]
    # The first number is the quantity, clamped to the minimum; digits in a word ("B-2002", "2nd") are no number.
    assert _calls(_ask(client, "2nd try: 0 items in B-2002", tools=_TOOLS))[0][1]["quantity"] == 1
    assert _calls(_ask(client, "order A-1001", tools=_TOOLS))[0][1] == {"order_id": "A-1001", "express": False}
    usage = completion.usage  # the function name and the arguments' JSON, in words
    assert usage.completion_tokens == 2 and usage.prompt_tokens == 9


def test_no_wanted_tool_answers_with_text(server, client):
    completion = _ask(client, "Hello there", tools=_TOOLS)
    assert completion.choices[0].finish_reason == "stop" and completion.choices[0].message.tool_calls is None
    assert completion.choices[0].message.content == _reply(server, "Hello there")


def test_tool_choice_required_none_and_named(server, client):
    assert _calls(_ask(client, "Hello there", tools=_TOOLS, tool_choice="required")) == [
        ("get_order", {"order_id": "Hello there", "express": False})]
    named = {"type": "function", "function": {"name": "send-email"}}
    assert _calls(_ask(client, "order A-1001", tools=_TOOLS, tool_choice=named)) == [
        ("send-email", {"body": "order A-1001", "urgent": False})]
    off = _ask(client, "order A-1001", tools=_TOOLS, tool_choice="none")
    assert _calls(off) == [] and off.choices[0].message.content == _reply(server, "order A-1001")


def test_several_wanted_tools_are_parallel_calls_in_declared_order(client):
    text = "Order A-1001 is late: send email to the customer"
    completion = _ask(client, text, tools=list(reversed(_TOOLS)))
    assert _calls(completion) == [("send-email", {"body": text, "urgent": False}),
                                  ("get_order", {"order_id": "A-1001", "express": False})]
    ids = [call.id for call in completion.choices[0].message.tool_calls]
    assert len(set(ids)) == 2 and all(i.startswith("call_") and len(i) == 29 for i in ids)
    assert _calls(_ask(client, text, tools=_TOOLS, parallel_tool_calls=False)) == [
        ("get_order", {"order_id": "A-1001", "express": False})]


def test_after_tool_results_the_reply_is_text_that_depends_on_them(client):
    first = _ask(client, "Where is order A-1001?", tools=_TOOLS)
    call = first.choices[0].message.tool_calls[0]

    def answer(result, then=()):
        messages = [{"role": "user", "content": "Where is order A-1001?"},
                    {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                    {"role": "tool", "tool_call_id": call.id, "content": result}, *then]
        return _ask(client, messages, tools=_TOOLS), messages

    shipped, messages = answer('{"status": "shipped"}')
    assert shipped.choices[0].finish_reason == "stop"
    assert shipped.choices[0].message.content == draft_reply(messages)
    assert shipped.choices[0].message.content.startswith("Thank you for reaching out. ")
    assert shipped.usage.prompt_tokens == 4 + 2
    assert answer('{"status": "delivered"}')[0].choices[0].message.content != shipped.choices[0].message.content
    # A list of text parts is the same text.
    listed = answer([{"type": "text", "text": '{"status": "shipped"}'}])[0]
    assert listed.choices[0].message.content == shipped.choices[0].message.content
    # A new user message after the results: a tool call again.
    again = answer('{"status": "shipped"}', [{"role": "user", "content": "And B-2002?"}])[0]
    assert _calls(again) == [("get_order", {"order_id": "B-2002", "express": False})]


class GetOrder(BaseModel):
    order_id: str = Field(pattern=r"[A-Z]-\d{4}")
    express: bool
    note: Optional[str] = None  # noqa: UP045 -- strict tools make it required: null, not made up


def test_pydantic_function_tools_parse(client):
    completion = client.chat.completions.parse(
        model="stub-model", messages=[{"role": "user", "content": "where is B-2002?"}],
        tools=[openai.pydantic_function_tool(GetOrder)])
    call = completion.choices[0].message.tool_calls[0]
    assert call.function.name == "GetOrder"
    assert call.function.parsed_arguments == GetOrder(order_id="B-2002", express=False, note=None)
    assert json.loads(call.function.arguments) == {"order_id": "B-2002", "express": False, "note": None}


def test_tool_replies_are_deterministic(server):
    url = server.base_url + "/chat/completions"
    body = {"model": "stub-model", "messages": [{"role": "user", "content": "order A-1001"}], "tools": _TOOLS}
    first = _request(url, body)
    assert first[0] == 200 and first == _request(url, body)
    other = json.loads(_request(url, {**body, "messages": [{"role": "user", "content": "order A-1002"}]})[1])
    assert other["choices"][0]["message"]["tool_calls"][0]["id"] != \
        json.loads(first[1])["choices"][0]["message"]["tool_calls"][0]["id"]


def test_bad_tools_are_400_and_not_executed(server):
    url = server.base_url + "/chat/completions"
    params = _GET_ORDER["function"]["parameters"]
    bad = {
        "'tools' must be a non-empty list": {"tools": []},
        "tools[0] must be an object with \"type\": \"function\"": {"tools": [{"type": "retrieval"}]},
        "tools[0].function must be an object": {"tools": [{"type": "function"}]},
        "tools[1].function.name must be 1 to 64": {"tools": [_GET_ORDER, {"type": "function", "function": {
            "name": "has space"}}]},
        "declares 'get_order' more than once": {"tools": [_GET_ORDER, _GET_ORDER]},
        "parameters must be a JSON schema of \"type\": \"object\"": {"tools": [{"type": "function", "function": {
            "name": "f", "parameters": {"type": "string"}}}]},
        "required names 'nope', not among its properties": {"tools": [{"type": "function", "function": {
            "name": "f", "parameters": {**params, "required": ["nope"]}}}]},
        "tool 'f': its parameters: '$ref' '#/$defs/Gone' points at nothing": {"tools": [{
            "type": "function", "function": {"name": "f", "parameters": {
                "type": "object", "properties": {"x": {"$ref": "#/$defs/Gone"}}}}}]},
        "'tool_choice' is only allowed when 'tools' are declared": {"tool_choice": "auto"},
        "'tool_choice' must be 'auto', 'none', 'required' or": {"tools": _TOOLS, "tool_choice": "always"},
        "names the function 'lookup', which 'tools' does not declare": {
            "tools": _TOOLS, "tool_choice": {"type": "function", "function": {"name": "lookup"}}},
        "'parallel_tool_calls' must be a boolean": {"tools": _TOOLS, "parallel_tool_calls": "yes"},
    }
    for message, extra in bad.items():
        status, body = _request(url, {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra})
        assert status == 400, (message, body)
        assert message in json.loads(body)["error"]["message"], body
    assert server.stats() == ServerStats()


# --- structured output ------------------------------------------------------------------------------------------


class Priority(str, Enum):
    LOW = "low"
    HIGH = "high"


class Customer(BaseModel):
    name: str
    orders: int = Field(ge=0, le=5)


class Ticket(BaseModel):
    priority: Priority
    kind: Literal["billing", "shipping"]
    customer: Customer
    note: Optional[str]  # noqa: UP045 -- the Optional spelling pydantic users write
    tags: list[str]
    confidence: float = Field(ge=0, le=1)
    escalate: bool


class Node(BaseModel):
    name: str
    children: list[Node]
    parent: Node | None = None


def test_pydantic_structured_output_parses(client):
    completion = client.chat.completions.parse(
        model="stub-model", messages=[{"role": "user", "content": "My SHIPPING is late, priority high!"}],
        response_format=Ticket)
    ticket = completion.choices[0].message.parsed
    assert (ticket.priority, ticket.kind) == (Priority.HIGH, "shipping")
    assert ticket.customer.orders == 5  # six words, clamped to the maximum
    assert ticket.customer.name.endswith(")") and "(ref " in ticket.customer.name
    assert isinstance(ticket.note, str) and len(ticket.tags) == 1 and ticket.tags[0] != ticket.note
    assert ticket.confidence == 1.0 and isinstance(ticket.escalate, bool)
    assert Ticket.model_validate_json(completion.choices[0].message.content) == ticket
    assert completion.usage.completion_tokens == len(completion.choices[0].message.content.split())
    other = client.chat.completions.parse(
        model="stub-model", messages=[{"role": "user", "content": "billing question"}], response_format=Ticket)
    assert other.choices[0].message.parsed.kind == "billing" and other.choices[0].message.parsed.customer.orders == 2


def test_recursive_pydantic_models_end(client):
    node = client.chat.completions.parse(model="stub-model", messages=[{"role": "user", "content": "a tree"}],
                                         response_format=Node).choices[0].message.parsed
    assert [child.children for child in node.children] == [[]]
    assert node.parent is not None and node.parent.parent is None and node.parent.children == []


_SCHEMA = {
    "$defs": {"Money": {"type": "object", "properties": {
        "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 10}, "currency": {"const": "EUR"}}}},
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "pattern": r"[A-Z]-\d{4}"},
        "when": {"type": "string", "format": "date-time"},
        "words": {"type": "integer", "minimum": 0},
        "capped": {"type": "integer", "maximum": 2},
        "code": {"type": "string", "maxLength": 5},
        "refund": {"$ref": "#/$defs/Money"},
        "either": {"oneOf": [{"type": "null"}, {"type": "integer", "minimum": 100}]},
        "both": {"allOf": [{"type": "object", "properties": {"a": {"type": "boolean"}}},
                           {"properties": {"b": {"type": ["null", "string"], "enum": ["x", "y"]}}}]},
        "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"enum": ["late", "lost"]}], "items": False},
        "many": {"type": "array", "items": {"type": "null"}, "minItems": 3},
    },
}


def _structured(server: StubModelServer, text: str, schema: dict) -> tuple[int, bytes]:
    return _chat(server, text, response_format={"type": "json_schema",
                                                "json_schema": {"name": "answer", "schema": schema, "strict": True}})


def test_json_schema_content_validates(server):
    first = _structured(server, "Order A-1001 is lost, please refund it", _SCHEMA)
    assert first[0] == 200 and first == _structured(server, "Order A-1001 is lost, please refund it", _SCHEMA)
    reply = json.loads(first[1])
    assert reply["choices"][0]["finish_reason"] == "stop"
    value = json.loads(reply["choices"][0]["message"]["content"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", value.pop("when"))
    assert len(value.pop("code")) == 5
    assert 7 < value["refund"].pop("amount") < 8  # seven words and a fraction
    assert value.pop("both")["b"] in ("x", "y")
    assert value == {"order_id": "A-1001", "words": 7, "capped": 2, "refund": {"currency": "EUR"}, "either": 100,
                     "pair": [7, "lost"], "many": [None, None, None]}
    assert _structured(server, "Order A-1002 is late", _SCHEMA)[1] != first[1]


def test_json_object_is_the_text_reply_as_json(server):
    status, body = _chat(server, "Write a reply", response_format={"type": "json_object"})
    assert status == 200
    content = json.loads(body)["choices"][0]["message"]["content"]
    assert json.loads(content) == {"reply": _reply(server, "Write a reply")}
    assert json.loads(body)["usage"]["completion_tokens"] == len(content.split())
    as_text = json.loads(_chat(server, "Write a reply", response_format={"type": "text"})[1])
    assert as_text["choices"][0]["message"]["content"] == _reply(server, "Write a reply")


def test_bad_response_formats_are_400_and_not_executed(server):
    bad = {
        "'response_format' must be": {"type": "xml"},
        "json_schema must be an object with 'name' and 'schema'": {"type": "json_schema"},
        "json_schema.name must be 1 to 64": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}},
        "json_schema.schema must be a JSON schema object": {"type": "json_schema", "json_schema": {"name": "a"}},
    }
    for message, response_format in bad.items():
        status, body = _chat(server, "hi", response_format=response_format)
        assert status == 400 and message in json.loads(body)["error"]["message"], body
    schemas = {
        "root must be an object schema": {"type": "string"},
        "unknown type 'text'": {"type": "object", "properties": {"a": {"type": "text"}}},
        "'$ref' '#/$defs/Gone' points at nothing": {"type": "object", "properties": {"a": {"$ref": "#/$defs/Gone"}}},
        "only '$ref's into the same schema": {"type": "object", "properties": {"a": {"$ref": "other.json#/a"}}},
        "'enum' must be a non-empty list": {"type": "object", "properties": {"a": {"enum": []}}},
        "is not a regular expression": {"type": "object", "properties": {"a": {"type": "string", "pattern": "("}}},
        "recursive without an end": {"$defs": {"A": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}}},
                                     "$ref": "#/$defs/A"},
    }
    for message, schema in schemas.items():
        status, body = _structured(server, "hi", schema)
        assert status == 400 and message in json.loads(body)["error"]["message"], body
    assert server.stats() == ServerStats()


# --- usage and the verbose model -----------------------------------------------------------------------------


def test_token_totals_count_executed_completions_only(server):
    usages = [json.loads(_chat(server, "one two three")[1])["usage"],
              json.loads(_chat(server, "order A-1001", tools=_TOOLS)[1])["usage"],
              json.loads(_chat(server, "keyed", {"Idempotency-Key": "k"})[1])["usage"]]
    assert _chat(server, "keyed", {"Idempotency-Key": "k"})[0] == 200  # a replay: not counted
    server.schedule_outage(after_chat=3, seconds=60)
    assert _chat(server, "refused")[0] == 503  # not counted
    stats = server.stats()
    assert stats.prompt_tokens == 3 + 2 + 1 == sum(u["prompt_tokens"] for u in usages)
    assert stats.completion_tokens == sum(u["completion_tokens"] for u in usages)
    assert usages[1]["completion_tokens"] == 2 and stats.tool_call_replies == 1
    assert (stats.chat, stats.idempotent_replays, stats.unavailable) == (3, 1, 1)
    status, body = _request(server.url + "/stats")
    assert status == 200 and json.loads(body)["completion_tokens"] == stats.completion_tokens
    assert ServerStats.from_dict(json.loads(body)) == stats == fetch_stats(server.url)
    assert reset_stats(server.url) == ServerStats()


def test_a_verbose_model_appends_a_sentence(server):
    plain = json.loads(_chat(server, "Write a reply")[1])
    verbose = json.loads(_chat(server, "Write a reply", model=VERBOSE_MODEL_NAME)[1])
    text = plain["choices"][0]["message"]["content"]
    assert verbose["choices"][0]["message"]["content"] == f"{text} {VERBOSE_SENTENCE}"
    assert verbose["model"] == "stub-model-verbose"
    assert verbose["usage"]["completion_tokens"] == plain["usage"]["completion_tokens"] + 14
    shouting = json.loads(_chat(server, "Categories: refund, other\nrefund", model="Big-VERBOSE-2")[1])
    assert shouting["choices"][0]["message"]["content"] == f"refund {VERBOSE_SENTENCE}"
    assert _reply(server, "Categories: refund, other\nrefund") == "refund"


# --- counts and idempotency --------------------------------------------------------------------------------


def test_counts_executions_repeats_and_distinct(server):
    _chat(server, "one")
    _chat(server, "two")
    _chat(server, "one")
    _request(server.url + "/orders/7")
    _request(server.url + "/orders/7")
    # The same text with a different parameter is a different question.
    _chat(server, "one", temperature=1.0)
    stats = server.stats()
    assert _counts(stats) == ServerStats(chat=4, orders=2, in_flight=0, repeated=2, idempotent_replays=0, distinct=4)
    assert stats.executions == 6
    assert fetch_stats(server.base_url) == stats
    assert reset_stats(server.url) == ServerStats()
    _chat(server, "one")
    assert _counts(server.stats()) == ServerStats(chat=1, distinct=1)


def test_same_idempotency_key_is_replayed_not_executed(server):
    headers = {"Idempotency-Key": "ticket-1/draft"}
    first = _chat(server, "Draft a reply", headers)
    second = _chat(server, "Draft a reply", headers)
    assert first == second
    assert _counts(server.stats()) == ServerStats(chat=1, idempotent_replays=1, distinct=1)
    # The key is per endpoint; without a key a request always executes (and counts as repeated).
    _request(server.url + "/orders/ticket-1", headers=headers)
    _chat(server, "Draft a reply")
    assert _counts(server.stats()) == ServerStats(chat=2, orders=1, repeated=1, idempotent_replays=1, distinct=2)


def test_concurrent_requests_with_one_key_execute_once(server):
    headers = {"Idempotency-Key": "k-1", "X-Stub-Delay-Ms": "1500"}
    results: list[tuple[int, bytes]] = []
    first_done: list[float] = []

    def first() -> None:
        results.append(_chat(server, "slow question", headers))
        first_done.append(time.monotonic())

    leader = threading.Thread(target=first)
    leader.start()
    _wait_until(lambda: server.stats().in_flight == 1, "the first request is executing")
    followers_sent = time.monotonic()
    followers = [threading.Thread(target=lambda: results.append(_chat(server, "slow question", headers)))
                 for _ in range(4)]
    for thread in followers:
        thread.start()
    for thread in [leader, *followers]:
        thread.join(timeout=30)
    assert followers_sent < first_done[0], "the followers must arrive while the first request is under way"
    assert len(results) == 5 and len(set(results)) == 1 and results[0][0] == 200
    assert _counts(server.stats()) == ServerStats(chat=1, idempotent_replays=4, distinct=1)


def test_in_flight_counts_executions_under_way(server):
    thread = threading.Thread(target=_chat, args=(server, "slow", {"X-Stub-Delay-Ms": "1000"}))
    thread.start()
    _wait_until(lambda: server.stats().in_flight == 1, "the request is executing")
    assert server.stats().chat == 1
    thread.join(timeout=30)
    assert server.stats().in_flight == 0



def test_a_caller_gone_before_its_reply_is_one_log_line_not_a_traceback(server, capsys, caplog):
    """A killed TaskManager leaves its request behind: the reply's write fails, and the demo's terminal shows
    one line of it, not the socket server's traceback."""
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "gone"}]}).encode()
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"X-Stub-Delay-Ms: 300\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    caplog.set_level(logging.INFO, logger="flink_agents_replay.local.model_server")
    client = socket.create_connection(("127.0.0.1", server.port))
    client.sendall(request)
    _wait_until(lambda: server.stats().in_flight == 1, "the request is executing")
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
    client.close()
    _wait_until(lambda: any("went away" in r.getMessage() for r in caplog.records), "the reply's failed write")
    assert [r.getMessage() for r in caplog.records if "went away" in r.getMessage()] == [
        "the client of POST /v1/chat/completions went away before its reply"]
    assert "Traceback" not in capsys.readouterr().err
    assert _chat(server, "still serving")  # the server goes on

# --- delay --------------------------------------------------------------------------------------------------


def test_delay_header_is_honoured(server):
    fast = _chat(server, "hi")
    started = time.monotonic()
    slow = _chat(server, "hi", {"X-Stub-Delay-Ms": "1100"})
    assert time.monotonic() - started >= 1.1
    # Neither the delay nor the clock (a second later now) is part of the reply.
    assert slow == fast
    started = time.monotonic()
    assert _request(server.url + "/orders/9", headers={"X-Stub-Delay-Ms": "200"})[0] == 200
    assert time.monotonic() - started >= 0.2


def test_constructor_delay_applies_and_the_header_overrides_it():
    with StubModelServer(delay_ms=600) as slow:
        started = time.monotonic()
        _chat(slow, "hi")
        assert time.monotonic() - started >= 0.6
        started = time.monotonic()
        _chat(slow, "hi", {"X-Stub-Delay-Ms": "0"})
        assert time.monotonic() - started < 0.6


def test_taken_port_is_a_local_service_error(server):
    with pytest.raises(LocalServiceError, match="another port"):
        StubModelServer(port=server.port).start()


# --- as a process and from the CLI -------------------------------------------------------------------------


def test_local_model_server_lifecycle(tmp_path):
    service = LocalModelServer(tmp_path / "model", port=0)
    assert not service.status().running and service.status().base_url is None
    status = service.start()
    try:
        assert status.running and status.base_url == f"http://127.0.0.1:{status.port}/v1"
        assert status.base_url in status.describe()
        assert service.start() == status  # already running: the same one
        model = ChatModel("stub-model", base_url=status.base_url)
        assert model.invoke(prompt="hello") == model.invoke(prompt="hello")
        assert _counts(fetch_stats(status.base_url)) == ServerStats(chat=2, repeated=1, distinct=1)
        assert (tmp_path / "model" / "model-server.log").is_file()
    finally:
        assert service.stop()
    assert not pid_alive(status.pid)
    assert not service.status().running
    assert not service.stop()


def test_local_model_server_on_a_taken_port(server, tmp_path):
    with pytest.raises(LocalServiceError, match=f"port {server.port} .* already in use"):
        LocalModelServer(tmp_path, port=server.port).start()
    assert not LocalModelServer(tmp_path).status().running


def test_cli_model_status_stop_and_start(tmp_path, capsys):
    work_dir = str(tmp_path / "model")
    assert cli_main(["local", "model", "status", "--work-dir", work_dir]) == 3
    assert "not running" in capsys.readouterr().out
    assert cli_main(["local", "model", "start", "--port", "0", "--delay-ms", "5", "--work-dir", work_dir]) == 0
    try:
        out = capsys.readouterr().out
        assert out.startswith("running: pid ")
        export = [line for line in out.splitlines() if line.startswith("export OPENAI_BASE_URL=")]
        base_url = export[0].split("=", 1)[1]
        assert ChatModel("stub-model", base_url=base_url).invoke(prompt="Categories: a, b\nb") == "b"
        assert cli_main(["local", "model", "status", "--work-dir", work_dir]) == 0
    finally:
        assert cli_main(["local", "model", "stop", "--work-dir", work_dir]) == 0
    assert "stopped" in capsys.readouterr().out
    assert cli_main(["local", "model", "status", "--work-dir", work_dir]) == 3


def test_chat_model_retries_a_transient_failure_with_the_sdk_and_raises_the_sdks_error():
    import openai

    from flink_agents_replay.local.processes import free_port

    nobody = f"http://127.0.0.1:{free_port()}/v1"
    begun = time.monotonic()
    with pytest.raises(openai.APIConnectionError):
        ChatModel("stub-model", base_url=nobody, retries=2).invoke(prompt="hello")
    # The SDK's backoff: 0.5 s then 1 s, each shortened by up to a quarter (jitter): it did try again twice.
    assert time.monotonic() - begun >= 0.75 * (0.5 + 1.0)


def test_without_the_dev_extra_the_service_names_the_extra_not_a_traceback():
    script = ("import sys; sys.modules['starlette'] = None\n"  # as if the dev extra were not installed
              "from flink_agents_replay.cli import main\n"
              "sys.exit(main(['local', 'model', 'start', '--port', '0']))\n")
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert shown.returncode != 0
    assert "pip install 'flink-agents-replay[dev]'" in shown.stderr and "Traceback" not in shown.stderr, shown.stderr


def test_a_request_under_way_when_the_server_stops_is_cut_off_not_answered_500(capsys, caplog):
    caplog.set_level(logging.INFO, logger="flink_agents_replay.local.model_server")
    server = StubModelServer(delay_ms=5000).start()
    outcome: dict[str, object] = {}
    caller = threading.Thread(target=lambda: outcome.update(reply=_safe_chat(server, "stopping")))
    caller.start()
    _wait_until(lambda: server.stats().in_flight == 1, "the request is executing")
    server.stop()
    caller.join(timeout=30)
    assert "Remote end closed connection" in str(outcome["reply"])  # no 500, no late reply
    assert "POST /v1/chat/completions abandoned: the server stopped" in caplog.messages
    assert "Traceback" not in capsys.readouterr().err


def _safe_chat(server: StubModelServer, text: str) -> object:
    try:
        return _chat(server, text)
    except Exception as exc:  # noqa: BLE001 - the caller's view of the stop
        return exc


def test_a_method_a_route_does_not_take_is_405_with_its_allow_header(server):
    request = urllib.request.Request(server.url + "/stats", method="DELETE")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 405 and "GET" in refused.value.headers["Allow"]
    assert json.loads(refused.value.read())["error"]["message"] == "no route DELETE /stats"


def test_a_caller_gone_while_sending_its_body_is_one_log_line_not_a_traceback(server, caplog):
    caplog.set_level(logging.INFO)
    head = (b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{\"input\": ")  # the body is cut short: a TaskManager killed mid-send
    client = socket.create_connection(("127.0.0.1", server.port))
    client.sendall(head)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
    client.close()
    _wait_until(lambda: any("went away" in r.getMessage() for r in caplog.records), "the cut-short request is seen")
    assert [r.getMessage() for r in caplog.records if "went away" in r.getMessage()] == [
        "the client of POST /v1/embeddings went away before its request arrived"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "no ASGI traceback"
    assert _chat(server, "still serving")


def test_a_delay_beyond_ten_minutes_is_refused_when_the_server_is_made():
    with pytest.raises(ValueError, match="delay_ms must be a number of milliseconds from 0 to 600000"):
        StubModelServer(delay_ms=700_000)


def test_a_refund_is_paid_once_per_idempotency_key_and_a_second_one_without_counts_as_repeated(server):
    key = {"Idempotency-Key": "support:draft_reply:3:2:abc"}
    first = _request(server.url + "/refunds", {"order_id": "O-10037", "amount": 199.5}, key)
    again = _request(server.url + "/refunds", {"order_id": "O-10037", "amount": 199.5}, key)
    assert first == again and first[0] == 200
    assert json.loads(first[1]) == {"refund_id": "R-O-10037", "order_id": "O-10037", "amount": 199.5,
                                    "status": "refunded"}
    assert (server.stats().refunds, server.stats().idempotent_replays, server.stats().repeated) == (1, 1, 0)
    _request(server.url + "/refunds", {"order_id": "O-10037", "amount": 199.5})  # no key: paid again
    assert (server.stats().refunds, server.stats().repeated) == (2, 1)
    assert _request(server.url + "/refunds", {"order": "O-1"})[0] == 400
