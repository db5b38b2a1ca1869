"""flink-agents-replay: durable, exactly-once-effect agent actions and safe replay on Apache Flink.

An agent running in a PyFlink job calls models and tools. When the job fails, Flink restores its last
checkpoint and replays the inputs that came after it — and without help every model and tool call since
that checkpoint runs again: a second e-mail, a second charge, a model that decides differently.

This package runs an agent's actions inside an operator that *journals* each of them to Kafka (the
request and response of every call through ``ctx.call``, then the action's memory updates and sent
events), one partition per Flink key group. After a restore, a replayed input finds its records: a
journaled action is skipped and its recorded effects re-applied, a journaled call returns its recorded
result, and only what never completed runs again. When Flink completes a checkpoint, the records it
covers are deleted, so the journal holds roughly what was written since the last checkpoint.

Using it:

1. Write an agent: a subclass of :class:`Agent` whose actions (``@action(EventType)``) call resources
   through ``ctx.call(name, ...)``.
2. Key your stream with a declared key type and connect the agent::

       keyed = stream.key_by(lambda r: r["customer"], key_type=Types.STRING())
       outputs = connect_to_agent(keyed, MyAgent(resources={...}),
                                  {"kafka": {"bootstrap.servers": "kafka:9092"}, "signing_key": "..."})

3. Enable checkpointing, give the job a restart strategy, and keep the agent's name (its uid), the max
   parallelism and the signing key unchanged across savepoints.
4. To try a changed agent before shipping it, turn on ``capture`` and replay production's traffic and
   state from a savepoint with side effects contained (:mod:`flink_agents_replay.replay`).

Limits of the guarantee (each detected, counted and logged, never silent):

* A call made outside ``ctx.call`` is invisible to the journal and runs again after a failure.
* A call that started and never reported back (the process died during it) is *in doubt*: resources
  with external side effects journal a "started" record first, and their ``in_doubt`` policy decides
  (run again by default, or fail, or assume done). ``current_call_id()`` gives the call's stable id, to
  pass to a service as an idempotency key so that a call made again still takes effect once.
* Reuse follows each key's accepted input order, which the journal records; after a restore, inputs
  arriving in another interleaving (several upstream instances per key) wait for their recorded
  predecessors. If a recorded input does not come back within ``order_restore_timeout_s``, that key's
  later records are dropped and its actions run again (divergence); other keys are not affected.
* Records written by other action code are reused by default, with a warning and a metric
  (``fingerprint_policy``).
* Restoring a savepoint older than the journal's pruning point cannot reuse deleted records: the job
  refuses to start unless ``accept_reexecution_after_gap`` is set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flink_agents_replay.core.moved import install_old_paths
from flink_agents_replay.storage.formats import dataclass_sentinels

install_old_paths()  # the module paths of 0.5.1 keep working until 0.8.0
dataclass_sentinels.install()  # before anything is pickled: a job script's dataclasses keep their fields

__version__ = "0.7.0"

__all__ = [
    "Agent",
    "AgentConfig",
    "AgentOutput",
    "CallBlocked",
    "ChatModel",
    "ChatResult",
    "Decision",
    "Event",
    "FallbackChatModel",
    "InDoubtCall",
    "InDoubtPolicy",
    "InputEvent",
    "McpServer",
    "McpTool",
    "NOT_DONE",
    "OutputEvent",
    "ReconcileError",
    "Reconciler",
    "RunnerContext",
    "SideEffects",
    "Tool",
    "ToolCall",
    "ToolCallDeniedError",
    "ToolLoopLimitError",
    "ToolLoopResult",
    "TracingConfig",
    "Usage",
    "WaitTimedOutError",
    "action",
    "connect_to_agent",
    "current_call_id",
    "mcp_tools",
    "run_tool_loop",
    "tool",
    "wait_events",
]

_EXPORTS = {
    "Agent": "flink_agents_replay.api.agent",
    "Event": "flink_agents_replay.api.agent",
    "InputEvent": "flink_agents_replay.api.agent",
    "OutputEvent": "flink_agents_replay.api.agent",
    "RunnerContext": "flink_agents_replay.api.agent",
    "action": "flink_agents_replay.api.agent",
    "AgentConfig": "flink_agents_replay.flink.config",
    "CallBlocked": "flink_agents_replay.core.errors",
    "ChatModel": "flink_agents_replay.api.chat_model",
    "ChatResult": "flink_agents_replay.storage.records.chat",
    "ToolCall": "flink_agents_replay.storage.records.chat",
    "Usage": "flink_agents_replay.storage.records.chat",
    "ToolLoopLimitError": "flink_agents_replay.core.errors",
    "ToolCallDeniedError": "flink_agents_replay.core.errors",
    "WaitTimedOutError": "flink_agents_replay.core.errors",
    "Decision": "flink_agents_replay.storage.records.waits",
    "wait_events": "flink_agents_replay.flink.pipeline",
    "ToolLoopResult": "flink_agents_replay.api.tool_loop",
    "run_tool_loop": "flink_agents_replay.api.tool_loop",
    "tool": "flink_agents_replay.api.tools",
    "FallbackChatModel": "flink_agents_replay.api.fallback_model",
    "InDoubtCall": "flink_agents_replay.api.resources",
    "InDoubtPolicy": "flink_agents_replay.api.resources",
    "NOT_DONE": "flink_agents_replay.api.resources",
    "McpServer": "flink_agents_replay.api.mcp_tools",
    "McpTool": "flink_agents_replay.api.mcp_tools",
    "mcp_tools": "flink_agents_replay.api.mcp_tools",
    "Reconciler": "flink_agents_replay.api.resources",
    "ReconcileError": "flink_agents_replay.core.errors",
    "SideEffects": "flink_agents_replay.api.resources",
    "Tool": "flink_agents_replay.api.resources",
    "AgentOutput": "flink_agents_replay.flink.operator",
    "connect_to_agent": "flink_agents_replay.flink.pipeline",
    "current_call_id": "flink_agents_replay.api.resources",
    "TracingConfig": "flink_agents_replay.traces.export",
}

if TYPE_CHECKING:
    from flink_agents_replay.api.agent import Agent, Event, InputEvent, OutputEvent, RunnerContext, action
    from flink_agents_replay.api.chat_model import ChatModel
    from flink_agents_replay.api.fallback_model import FallbackChatModel
    from flink_agents_replay.api.mcp_tools import McpServer, McpTool, mcp_tools
    from flink_agents_replay.api.resources import (
        NOT_DONE,
        InDoubtCall,
        InDoubtPolicy,
        Reconciler,
        SideEffects,
        Tool,
        current_call_id,
    )
    from flink_agents_replay.api.tool_loop import ToolLoopResult, run_tool_loop
    from flink_agents_replay.api.tools import tool
    from flink_agents_replay.core.errors import (
        CallBlocked,
        ReconcileError,
        ToolCallDeniedError,
        ToolLoopLimitError,
        WaitTimedOutError,
    )
    from flink_agents_replay.flink.config import AgentConfig
    from flink_agents_replay.flink.operator import AgentOutput
    from flink_agents_replay.flink.pipeline import connect_to_agent, wait_events
    from flink_agents_replay.storage.records.chat import ChatResult, ToolCall, Usage
    from flink_agents_replay.storage.records.waits import Decision
    from flink_agents_replay.traces.export import TracingConfig


def __getattr__(name: str):
    # Lazy: importing the package (e.g. for key groups or the CLI) does not start PyFlink.
    import importlib

    from flink_agents_replay.core.moved import MOVED_IN_0_6_0, warn_moved

    if name in MOVED_IN_0_6_0:  # a 0.5.1 module as an attribute (flink_agents_replay.agent): its old path
        import warnings

        with warnings.catch_warnings():  # said once, below, at the caller's line
            warnings.simplefilter("ignore", DeprecationWarning)
            module = importlib.import_module(f"flink_agents_replay.{name}")
        warn_moved(f"flink_agents_replay.{name}", f"flink_agents_replay.{MOVED_IN_0_6_0[name]}", stacklevel=3)
        return module
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'flink_agents_replay' has no attribute {name!r}")
    return getattr(importlib.import_module(module_name), name)
