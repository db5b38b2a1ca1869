"""Tools and chat models at their edges: a model's arguments that are not JSON, tools made of partials and callable
objects, and a chat model for OpenAI's API without a key."""

from __future__ import annotations

import functools
import re

import pytest

from flink_agents_replay import (
    Agent,
    ChatModel,
    InputEvent,
    OutputEvent,
    Tool,
    ToolCall,
    action,
    run_tool_loop,
    tool,
)
from flink_agents_replay.engine import RunInput, execute_run
from tests.harness.scripted_model import ScriptedModel


def _loop(model, tools):
    seen = []

    class Loop(Agent):
        @action(InputEvent)
        def answer(event, ctx):
            done = run_tool_loop(ctx, "llm", messages=[{"role": "user", "content": event.input}],
                                 tools=list(tools))
            seen.append(done)
            ctx.send_event(OutputEvent(output=done.content))

    execute_run(Loop(name="loop", resources={"llm": model, **tools}), RunInput("k", 1, 1, "hi"), {})
    return seen[0]


def test_arguments_that_are_not_a_json_object_make_no_call_and_tell_the_model():
    called = []
    truncated = ToolCall.from_json("c1", "find", '{"order_id": "O-1"')  # cut off by max_tokens
    listed = ToolCall.from_json("c2", "find", '["O-1"]')
    done = _loop(ScriptedModel([[truncated, listed]]), {"find": tool(lambda order_id: called.append(order_id))})
    assert called == []
    answers = [m["content"] for m in done.messages if m["role"] == "tool"]
    assert answers[0].startswith("error: the arguments of 'find' are not JSON") and "char 18" in answers[0]
    assert answers[1] == "error: the arguments of 'find' must be a JSON object, not a list"
    assert truncated.arguments == {} and done.content == "done"


def _send(to: str, body: str, account: str = "support") -> str:
    """Send an e-mail.

    Args:
        to: the recipient's address.
        body: the text.
        account: the account it is sent from.
    """
    return f"{account} -> {to}"


def test_a_partial_tool_shows_its_functions_name_doc_and_types_and_keeps_its_bound_arguments():
    sent = Tool(functools.partial(_send, account="billing"))
    assert sent.name == "_send" and sent.description == "Send an e-mail."
    assert sent.schema["properties"] == {"to": {"type": "string", "description": "the recipient's address."},
                                         "body": {"type": "string", "description": "the text."}}
    # A model that names a bound argument anyway gets an error message, not the account it asked for.
    with pytest.raises(ValueError, match="account: is set by the tool"):
        sent.model_arguments({"to": "a@b.c", "body": "hi", "account": "ceo"})
    assert sent.invoke(**sent.model_arguments({"to": "a@b.c", "body": "hi"})) == "billing -> a@b.c"
    positional = Tool(functools.partial(_send, "ops@b.c"))
    assert sorted(positional.schema["properties"]) == ["account", "body"]


class Lookup:
    """Look up an order in the shop's database."""

    def __call__(self, order_id: str) -> dict:
        return {"order_id": order_id}


class Documented:
    def __call__(self, order_id: str) -> dict:
        """Find an order."""
        return {"order_id": order_id}


def test_a_callable_object_tool_is_named_and_described_after_its_class():
    lookup = Tool(Lookup())
    assert (lookup.name, lookup.description) == ("Lookup", "Look up an order in the shop's database.")
    assert Tool(Documented()).description == "Find an order."
    assert lookup.schema["properties"] == {"order_id": {"type": "string"}}


def test_a_chat_model_for_openais_api_without_a_key_is_told_where_it_is_made_and_refused_at_its_first_call(
        monkeypatch, caplog):
    from flink_agents_replay.core.errors import ConfigError

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    model = ChatModel("gpt-4o-mini")  # the key may be set for the TaskManagers only
    assert "has no key in this process" in caplog.text
    with pytest.raises(ConfigError, match=r"OPENAI_API_KEY.*base_url"):
        model._sdk()
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        ChatModel("gpt-4o-mini", base_url="https://API.openai.com/v1")._sdk()
    caplog.clear()
    assert ChatModel("llama3.2", base_url="http://localhost:11434/v1")._sdk()  # a local server needs none
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # set where the worker runs
    assert model._sdk().api_key == "sk-test" and not caplog.text


def test_a_response_formats_schema_is_made_once_per_class_for_digests_and_requests():
    import pydantic

    from flink_agents_replay.api.chat_model import _json_schema_format
    from flink_agents_replay.engine.digest import digest_value

    made = []

    class Answer(pydantic.BaseModel):
        text: str

        @classmethod
        def model_json_schema(cls, *args, **kwargs):
            made.append(cls)
            return super().model_json_schema(*args, **kwargs)

    digests = {digest_value({"response_format": Answer}) for _ in range(3)}
    requests = [_json_schema_format(Answer) for _ in range(3)]
    requests[0]["json_schema"]["schema"]["properties"].clear()  # a request's copy: the cache keeps its own
    assert len(made) == 1 and len(digests) == 1
    assert requests[1]["json_schema"]["schema"]["properties"] == {"text": {"title": "Text", "type": "string"}}


class Refund:
    """Refund an order."""

    def __init__(self, order_id: str, cents: int):
        self.order_id, self.cents = order_id, cents


def test_a_class_and_a_partial_of_a_callable_object_are_named_after_their_class():
    refund = Tool(Refund)
    assert (refund.name, refund.description) == ("Refund", "Refund an order.")
    assert refund.schema["properties"] == {"order_id": {"type": "string"}, "cents": {"type": "integer"}}
    bound = Tool(functools.partial(Lookup()))
    assert (bound.name, bound.description) == ("Lookup", "Look up an order in the shop's database.")


def test_an_argument_the_function_does_not_take_makes_no_call_and_tells_the_model():
    """A misspelt name (``colour``) would leave ``color`` at its default and make the call anyway: it is refused,
    naming the parameters; a function with ``**kwargs`` takes any name, passed on as given."""
    def paint(wall: str, color: str = "white") -> str:
        return f"{wall} {color}"

    def note(text: str, **tags) -> dict:
        return {"text": text, **tags}

    with pytest.raises(ValueError, match=r"colour: not a parameter of the tool \(it takes wall, color\)"):
        Tool(paint).model_arguments({"wall": "north", "colour": "blue"})
    assert Tool(note).model_arguments({"text": "hi", "mood": "calm"}) == {"text": "hi", "mood": "calm"}
    painted = []
    done = _loop(ScriptedModel([[ToolCall.from_json("c1", "paint", '{"wall": "north", "colour": "blue"}')]]),
                 {"paint": tool(lambda wall, color="white": painted.append((wall, color)))})
    answers = [m["content"] for m in done.messages if m["role"] == "tool"]
    assert painted == [] and answers[0].startswith("error: the arguments of 'paint' do not fit its parameters: "
                                                    "colour: not a parameter"), answers


@pytest.mark.parametrize(("setting", "needle"), [
    ({"base_url": "127.0.0.1:8000/v1"}, "base_url='127.0.0.1:8000/v1': expected an http:// or https:// URL"),
    ({"base_url": "http:///v1"}, "with a host"),
    ({"base_url": "http://[::1"}, "with a host"),
    ({"timeout_s": "fast"}, "timeout_s='fast': expected a number of seconds"),
    ({"timeout_s": 0}, "timeout_s=0"),
    ({"max_retries": -1}, "max_retries=-1: expected a whole number, 0 or more"),
    ({"max_retries": 2.5}, "max_retries=2.5"),
    ({"default_headers": {"X-Team": 7}}, "default_headers: expected a mapping of header names to string values"),
    ({"timeout_s": float("nan")}, "timeout_s=nan"),
])
def test_chat_model_settings_the_sdk_would_fail_on_obscurely_are_refused_where_the_model_is_made(setting, needle):
    """Taken by the SDK, these fail at the first request as 'Connection error.' or an internal assertion."""
    from flink_agents_replay.core.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(needle)):
        ChatModel("m", **{"base_url": "http://127.0.0.1:8000/v1", "api_key": "k", **setting})
    assert ChatModel("m", base_url="https://models.example/v1", api_key="k", timeout_s=None, max_retries=0)


def test_chat_model_takes_the_sdks_own_timeout_and_header_markers():
    import httpx
    import openai

    model = ChatModel("m", base_url="http://127.0.0.1:8000/v1", api_key="k", timeout_s=httpx.Timeout(5.0, read=60),
                      default_headers={"X-Team": "support", "User-Agent": openai.Omit()})
    assert model.timeout_s.read == 60
