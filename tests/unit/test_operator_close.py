"""Closing the operator releases every client, also when stopping the runs fails first."""

from __future__ import annotations

import pytest

from flink_agents_replay.operator import ActionExecutionOperator


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
