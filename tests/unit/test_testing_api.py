"""The public testing API's typed pieces, without Flink: arguments, result helpers, what ships by value."""

from __future__ import annotations

import json
import types

import pytest

import flink_agents_replay.testing as testing
from flink_agents_replay.examples import support_triage
from flink_agents_replay.testing import AgentRunResult, CommittedOutput, FailOver
from flink_agents_replay.testing._environment import (
    OpenWait,
    _decode_output,
    _FailOnce,
    _open_waits,
    _worker_cannot_import,
)


def _result(*outputs: CommittedOutput) -> AgentRunResult:
    return AgentRunResult(outputs=outputs, call_counts={}, failed_over=False, failure=None, input_topic="i",
                          output_topic="o", journal_topic="j")


def test_the_public_surface_is_small_and_typed():
    assert set(testing.__all__) == {"AgentRunResult", "AgentTestEnvironment", "CommittedOutput", "CommittedReader",
                                    "FailOver", "InjectedFailover", "InvocationCounter", "OpenWait"}
    with pytest.raises(TypeError):
        FailOver(3)  # keyword-only
    with pytest.raises(ValueError, match="at least 1"):
        FailOver(after_outputs=0)


def test_outputs_by_key_follow_seq_and_duplicates_are_found_by_event_id():
    late, early = CommittedOutput("a", 2, "e2", "second"), CommittedOutput("a", 1, "e1", "first")
    again = CommittedOutput("a", 1, "e1", "first")
    assert _result(late, early, CommittedOutput("b", 1, "e3", "x")).outputs_by_key() == {
        "a": ["first", "second"], "b": ["x"]}
    assert _result(late, early).duplicate_outputs() == []
    assert _result(early, late, again).duplicate_outputs() == [early, again]


def test_open_waits_are_those_opened_and_not_closed_or_resumed():
    def event(kind, wait_id, n=1):
        return json.dumps({"kind": kind, "key": "k", "seq": n, "wait_id": wait_id, "name": "ok?",
                           "payload": {"n": n}}).encode()

    events = [event("opened", "w1"), event("opened", "w2", 2), event("resumed", "w1"), event("closed", "w1"),
              event("decision_early", "w3")]
    assert _open_waits(events) == (OpenWait("k", 2, "w2", "ok?", {"n": 2}),)


def test_committed_outputs_decode_from_the_topic_format():
    value = json.dumps({"key": "k", "seq": 3, "event_id": "e", "output": {"a": 1}}).encode()
    assert _decode_output(value) == CommittedOutput("k", 3, "e", {"a": 1})


def test_the_fail_over_fires_once_at_the_nth_output(tmp_path):
    fail = _FailOnce(testing.InvocationCounter(tmp_path / "claims.sqlite"), after_outputs=2)
    assert fail("first") == "first"
    with pytest.raises(testing.InjectedFailover):
        fail("second")
    assert [fail(n) for n in range(3)] == [0, 1, 2]  # the restarted job passes everything


def test_modules_the_worker_cannot_import_ship_by_value():
    assert _worker_cannot_import(types.ModuleType("test_my_agent"))  # a user's test module
    assert not _worker_cannot_import(support_triage)  # installed with the package
    assert not _worker_cannot_import(json)


def test_a_runs_result_names_the_journal_topic_the_job_wrote():
    """Found by an adversarial user: with its own journal_topic, the result named the environment's fresh one."""
    from flink_agents_replay import Agent, InputEvent, action
    from flink_agents_replay.testing._environment import _journal_topic

    class Triage(Agent):
        @action(InputEvent)
        def act(event, ctx):
            pass

    agent = Triage(name="triage")
    base = {"kafka": {"bootstrap.servers": "127.0.0.1:9092"}, "signing_key": "0123456789abcdef0123"}
    assert _journal_topic(agent, {**base, "journal_topic": "testenv-journal-1"}) == "testenv-journal-1"
    assert _journal_topic(agent, {**base, "journal_topic": "mine"}) == "mine"
    assert _journal_topic(agent, {**base, "journal_topic": None}) == "flink-agents-replay.triage.journal"
    assert _journal_topic(agent, {**base, "journal_topic": None, "uid": "shop/triage"}) == "shop.triage.journal"
