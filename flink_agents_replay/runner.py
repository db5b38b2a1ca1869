"""The run engine's names as they were before it became :mod:`flink_agents_replay.engine` (kept for imports).

New code imports from :mod:`flink_agents_replay.engine` (the engine) and
:mod:`flink_agents_replay.replay.gate` (a replay's call gate). :func:`execute_run` here still takes the
``replay=`` argument of before: a replay's :class:`ReplayCalls` as the engine's call gate, with failed runs
reported in the result rather than raised.
"""

from __future__ import annotations

from typing import Any

from flink_agents_replay import engine
from flink_agents_replay.agent import Agent
from flink_agents_replay.engine import (
    SUB_AGENT_MEMORY,
    FingerprintPolicy,
    RunCancelled,
    RunInput,
    RunResult,
    RunStats,
    call_id,
    explain_unpicklable,
)
from flink_agents_replay.replay.gate import ReplayCalls

__all__ = ["SUB_AGENT_MEMORY", "FingerprintPolicy", "ReplayCalls", "RunCancelled", "RunInput", "RunResult",
           "RunStats", "call_id", "execute_run", "explain_unpicklable"]


def execute_run(agent: Agent, run: RunInput, memory: dict, *, replay: ReplayCalls | None = None,
                **options: Any) -> RunResult:
    """:func:`flink_agents_replay.engine.execute_run`; ``replay`` applies a replay's side-effect policy to
    every ``ctx.call`` and reports a failed run in ``RunResult.error`` instead of raising."""
    return engine.execute_run(agent, run, memory, gate=replay, report_failures=replay is not None, **options)
