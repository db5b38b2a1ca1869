"""Closing the operator releases every client, also when stopping the runs fails first."""

from __future__ import annotations

import pytest

from flink_agents_replay.flink.operator import ActionExecutionOperator


class _Part:
    def __init__(self, name: str, closed: list[str], error: Exception | None = None):
        self.name, self.closed, self.error = name, closed, error

    def close(self) -> None:
        self.closed.append(self.name)
        if self.error is not None:
            raise self.error


def _operator(closed: list[str], *, runs_error=None, journal_error=None) -> ActionExecutionOperator:
    operator = ActionExecutionOperator.__new__(ActionExecutionOperator)  # no Flink: only what close touches
    operator.runs = _Part("runs", closed, runs_error)
    operator.journal = _Part("journal", closed, journal_error)
    operator.observers = [_Part("capture", closed)]
    operator.mode = _Part("mode", closed)
    return operator


def test_a_failure_stopping_the_runs_still_closes_the_journal_and_the_other_clients():
    closed: list[str] = []
    with pytest.raises(RuntimeError, match="runs broke"):
        _operator(closed, runs_error=RuntimeError("runs broke")).close()
    assert closed == ["runs", "journal", "capture", "mode"]


def test_a_client_failing_to_close_does_not_leave_the_later_ones_open():
    closed: list[str] = []
    with pytest.raises(OSError, match="journal broke"):
        _operator(closed, journal_error=OSError("journal broke")).close()
    assert closed == ["runs", "journal", "capture", "mode"]


def test_closing_the_operator_closes_the_resources_of_the_agent_and_its_sub_agents_each_once():
    from flink_agents_replay import Agent, InputEvent, Tool, action
    from flink_agents_replay.integrations.chroma import ChromaVectorStore
    from flink_agents_replay.longterm.embeddings import OpenAIEmbeddings
    from flink_agents_replay.longterm.resource import LongTermMemory

    class _Session:
        closed = 0

        def close(self) -> None:
            _Session.closed += 1

    class _Client:  # chromadb 1.5.9's HttpClient: close() leaves its server API's HTTP session open
        def __init__(self):
            self._server = type("ServerAPI", (), {"_session": _Session()})()
            self.closed = 0

        def close(self) -> None:
            self.closed += 1

    store = ChromaVectorStore(url="http://127.0.0.1:1")
    client = store._client = _Client()
    memory = LongTermMemory(store, OpenAIEmbeddings("embed", base_url="http://127.0.0.1:1", api_key="unused"))
    class Noop(Agent):
        @action(InputEvent)
        def act(event, ctx):  # never run: only what close touches
            pass

    child = Noop(name="child", resources={"memory": memory})
    parent = Noop(name="parent", resources={"memory": memory, "tool": Tool(len, side_effects="none")},
                  sub_agents=[child])
    closed: list[str] = []
    operator = _operator(closed)
    operator.runs, operator.agent = None, parent  # no runs started: close goes straight to the clients
    operator.close()
    assert closed == ["journal", "capture", "mode"]
    assert client.closed == 1 and _Session.closed == 1, "the store's client and its HTTP session, each once"
    assert store._client is None
