"""A chat model with fallbacks against two real model services: which model answered is journaled, a call
cut short is asked again of the model it was asking, and an answered call asks no model again."""

from __future__ import annotations

import httpx
import openai
import pytest

from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, action
from flink_agents_replay.api.chat_model import ChatModel
from flink_agents_replay.api.fallback_model import FallbackChatModel, falls_back
from flink_agents_replay.engine import RunInput, execute_run
from flink_agents_replay.local.model_server import StubModelServer
from flink_agents_replay.replay.usage import usage_of
from flink_agents_replay.storage.journal.memory_store import MemoryJournalStore
from flink_agents_replay.storage.journal.recovery import read_recovery_index
from flink_agents_replay.storage.journal.writer import Durability, JournalWriter
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import CallOutcome, key_digest

KEY_GROUP = 3
SIGNING_KEY = b"fallback-model-test-signing-key!"
QUESTION = "Categories: billing, shipping\nmy parcel shipping is late"


class ProcessDied(BaseException):
    """The process dying while a model is asked: no outcome journaled."""


class DiesOnce(ChatModel):
    """A model whose first ask dies (the process is killed while it is being asked)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.die = True

    def ask(self, *args, **kwargs):
        if self.die:
            self.die = False
            raise ProcessDied()
        return super().ask(*args, **kwargs)


@pytest.fixture(scope="module")
def servers():
    with StubModelServer() as primary, StubModelServer() as fallback:
        yield primary, fallback


def two_models(servers, *, fallback_class=ChatModel) -> FallbackChatModel:
    primary, fallback = servers
    return FallbackChatModel([
        ChatModel("model-a", base_url=primary.base_url, api_key="unused", max_retries=0),
        fallback_class("model-b", base_url=fallback.base_url, api_key="unused", max_retries=0)])


def triage_agent(llm: FallbackChatModel) -> Agent:
    class Triage(Agent):
        @action(InputEvent)
        def triage(event, ctx):
            answer = ctx.call("llm", messages=[{"role": "user", "content": event.input}])
            ctx.send_event(OutputEvent(output={"category": answer.content, "model": answer.model}))

    return Triage(name="triage", resources={"llm": llm})


def run(agent, store, *, key, recover=False):
    codec = RecordCodec(SIGNING_KEY, "op")
    index = read_recovery_index(store, codec, {KEY_GROUP: 0}, store.end_offsets([KEY_GROUP])) if recover else None
    return execute_run(agent, RunInput(key, KEY_GROUP, 1, QUESTION), {},
                       history=index.history(key_digest(key)) if index else None,
                       journal=JournalWriter(store, codec, Durability.PER_ACTION).run_journal(KEY_GROUP))


def llm_records(store):
    codec = RecordCodec(SIGNING_KEY, "op")
    records = [codec.decode(key, value, topic=store.topic, partition=KEY_GROUP).payload
               for key, value in store.records(KEY_GROUP) if RecordCodec.peek_header(value)["kind"] == "call"]
    return [(r.outcome, r.meta.get("fallback_index")) for r in records]


def counts(servers):
    return tuple((s.stats().chat, s.stats().unavailable) for s in servers)


def test_the_fallback_answers_while_the_primary_is_down_and_is_journaled_as_the_answering_model(servers):
    primary, fallback = servers
    primary.schedule_outage(after_chat=primary.stats().chat, seconds=30)
    before, store = counts(servers), MemoryJournalStore(8)
    result = run(triage_agent(two_models(servers)), store, key="down")
    assert [o.output for o in result.outputs] == [{"category": "shipping", "model": "model-b"}]
    (before_a, before_b), (after_a, after_b) = before, counts(servers)
    assert (after_a[1] - before_a[1], after_b[0] - before_b[0]) == (1, 1)  # a: one 503; b: one answer
    # A started record per model asked, then the answer, with the model that gave it.
    assert llm_records(store) == [(CallOutcome.STARTED, 0), (CallOutcome.STARTED, 1), (CallOutcome.RETURNED, 1)]
    [call] = [c for c in result.calls if c.resource == "llm"]
    assert (call.meta["model"], call.meta["models_asked"]) == ("model-b", 2)
    assert usage_of(result.calls).calls == 1
    again = run(triage_agent(two_models(servers)), store, key="down", recover=True)
    assert [o.output for o in again.outputs] == [o.output for o in result.outputs]
    assert counts(servers) == (after_a, after_b)  # reused: neither model asked again
    primary.schedule_outage(after_chat=0, seconds=0)


def test_a_call_cut_short_while_the_fallback_was_asked_is_asked_of_the_fallback_again_not_the_primary(servers):
    primary, fallback = servers
    primary.schedule_outage(after_chat=primary.stats().chat, seconds=30)
    store = MemoryJournalStore(8)
    dying = two_models(servers, fallback_class=DiesOnce)
    with pytest.raises(ProcessDied):
        run(triage_agent(dying), store, key="cut")
    assert llm_records(store) == [(CallOutcome.STARTED, 0), (CallOutcome.STARTED, 1)]  # the fault hit at model-b
    before = counts(servers)
    recovered = run(triage_agent(dying), store, key="cut", recover=True)
    assert [o.output for o in recovered.outputs] == [{"category": "shipping", "model": "model-b"}]
    (before_a, before_b), (after_a, after_b) = before, counts(servers)
    assert after_a == before_a  # the primary, which had failed this call, is not asked again
    assert after_b[0] - before_b[0] == 1
    [call] = [c for c in recovered.calls if c.resource == "llm"]
    assert call.meta["models_asked"] == 1 and recovered.stats.calls_in_doubt == 1
    primary.schedule_outage(after_chat=0, seconds=0)


def _status_error(status: int) -> openai.APIStatusError:
    response = httpx.Response(status, request=httpx.Request("POST", "http://model/v1/chat/completions"))
    return openai.APIStatusError(f"status {status}", response=response, body=None)


@pytest.mark.parametrize("status, expected", [
    (408, True), (429, True), (500, True), (503, True), (400, False), (401, False), (404, False), (422, False)])
def test_only_a_service_in_trouble_falls_back(status, expected):
    assert falls_back(_status_error(status)) is expected


def test_timeouts_and_connection_errors_fall_back_other_errors_do_not():
    request = httpx.Request("POST", "http://model/v1/chat/completions")
    assert falls_back(openai.APITimeoutError(request)) and falls_back(openai.APIConnectionError(request=request))
    assert not falls_back(ValueError("a bug"))


def test_a_bad_request_is_raised_at_once_without_asking_the_fallback(servers):
    primary, fallback = servers
    before = counts(servers)
    with pytest.raises(TypeError, match="exactly one of prompt"):
        two_models(servers).invoke()
    assert counts(servers) == before


def test_fallbacks_take_two_or_more_chat_models():
    with pytest.raises(TypeError, match="two or more ChatModel"):
        FallbackChatModel([ChatModel("only", base_url="http://127.0.0.1:9/v1", api_key="x")])


class RefusesOnce(ChatModel):
    """A model whose first ask dies (the process is killed), whose second answers 400, and which answers after."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.asked = 0

    def ask(self, *args, **kwargs):
        self.asked += 1
        if self.asked == 1:
            raise ProcessDied()
        if self.asked == 2:
            raise openai.BadRequestError("bad request", response=httpx.Response(
                400, request=httpx.Request("POST", "http://model/v1/chat/completions")), body=None)
        return super().ask(*args, **kwargs)


def fail_the_action(store, result_error: str):
    """What the engine journals when the exception leaves the action: its failed calls to make again."""
    from flink_agents_replay.engine.digest import digest_value
    from flink_agents_replay.storage.records.journal import ActionFailedRecord, RecordKind, input_event_id, journal_key

    digest = key_digest("again")
    event = input_event_id(digest, 1)
    codec = RecordCodec(SIGNING_KEY, "op")
    journal = JournalWriter(store, codec, Durability.PER_ACTION).run_journal(KEY_GROUP)
    journal.write(journal_key(KEY_GROUP, 1, event, "triage", digest), RecordKind.ACTION_FAILED,
                  ActionFailedRecord(1, 0, event, "triage", result_error, digest_value(QUESTION), [0]),
                  fingerprint="", must_ack=True, what="the failure")


def test_a_call_in_doubt_at_the_fallback_that_then_fails_is_in_doubt_again_at_the_fallback(servers):
    """Found by review: the call's revert to in doubt lost which model it was asking, and the third attempt asked
    the primary, which had already failed it."""
    primary, fallback = servers
    primary.schedule_outage(after_chat=primary.stats().chat, seconds=30)
    store, llm = MemoryJournalStore(8), two_models(servers, fallback_class=RefusesOnce)
    with pytest.raises(ProcessDied):  # attempt 1: the primary 503s, the process dies while the fallback is asked
        run(triage_agent(llm), store, key="again")
    with pytest.raises(openai.BadRequestError):  # attempt 2: asked again of the fallback, which answers 400
        run(triage_agent(llm), store, key="again", recover=True)
    fail_the_action(store, "BadRequestError: bad request")
    before_a = counts(servers)[0]
    third = run(triage_agent(llm), store, key="again", recover=True)
    assert [o.output for o in third.outputs] == [{"category": "shipping", "model": "model-b"}]
    assert counts(servers)[0] == before_a  # the primary is not asked again
    primary.schedule_outage(after_chat=0, seconds=0)


def test_a_run_stopped_between_two_models_journals_no_outcome_for_the_call(servers):
    """Found by review: the stop check inside journal_attempt raised RunCancelled through the call, which was
    journaled as the call's failure and reused by the next attempt."""
    from flink_agents_replay.engine.context import RunCancelled

    primary, _ = servers
    primary.schedule_outage(after_chat=primary.stats().chat, seconds=30)
    store, llm, stopping = MemoryJournalStore(8), two_models(servers), {"now": False}

    class StopsAfterThePrimary(ChatModel):
        def ask(self, *args, **kwargs):
            try:
                return super().ask(*args, **kwargs)
            finally:
                stopping["now"] = True  # the task starts stopping once the primary failed

    llm.models[0].__class__ = StopsAfterThePrimary
    codec = RecordCodec(SIGNING_KEY, "op")
    with pytest.raises(RunCancelled):
        execute_run(triage_agent(llm), RunInput("stop", KEY_GROUP, 1, QUESTION), {}, cancelled=lambda: stopping["now"],
                    journal=JournalWriter(store, codec, Durability.PER_ACTION).run_journal(KEY_GROUP))
    assert [outcome for outcome, _ in llm_records(store)] == [CallOutcome.STARTED]  # no RAISED outcome
    primary.schedule_outage(after_chat=0, seconds=0)
