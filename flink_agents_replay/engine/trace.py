"""What one execution of a run did, for its trace: each action and each call, how it went and when.

A run's trace (:mod:`flink_agents_replay.traces`) is made from this record after the run is applied, off the run's
thread. The engine notes only what the journal cannot tell afterwards: which calls this execution made and which it
took from the journal (reused after a failure, or served a recorded outcome by a replay), which actions it ran and
which it reused whole, and the wall-clock times of each. A call's own facts (model, tokens, latency, its outcome)
are in its :class:`~flink_agents_replay.storage.records.journal.CallRecord`, which every entry holds.

Noting costs a clock read and a small object per action and call, so the operator asks for it only when tracing is
on (``execute_run(trace=True)``); without it the engine notes nothing.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from flink_agents_replay.storage.records.journal import CallRecord

__all__ = ["ActionHow", "CallHow", "RunTrace", "TracedAction", "TracedCall"]


class CallHow(str, enum.Enum):
    """How this execution of the run got a call's outcome."""

    EXECUTED = "executed"  # made now (returned, or raised)
    REUSED = "reused"  # its journaled outcome, from an earlier attempt (or a parked run's own, on resuming)
    RECORDED = "recorded"  # a replay's gate served production's recorded outcome
    SETTLED = "settled"  # a call in doubt settled without making it: assumed done, or a reconciler's answer
    #: made by a sub-agent whose call this execution reused whole (the sub-agent did not run now): only the
    #: original execution's span is made again
    INSIDE_REUSED = "inside_reused"


class ActionHow(str, enum.Enum):
    """How this execution of the run got an action's result."""

    EXECUTED = "executed"
    REUSED = "reused"  # its journaled completion applied, the function not run
    FAILED = "failed"  # an exception left it


@dataclass(frozen=True)
class TracedCall:
    """One call of an action: its record, how this execution got it, its call id, the (sub-)agent path of the
    action that made it, and this execution's wall-clock interval (ns since the epoch)."""

    record: CallRecord
    how: CallHow
    call_id: str
    agent_path: tuple[str, ...]
    start_ns: int
    end_ns: int
    arguments: tuple[tuple, dict] | None = None  # (args, kwargs) as the action passed them, kept with content only
    #: The action whose span it hangs under, if not its own (event id, action): a reused sub-agent's calls hang
    #: under the action that called the sub-agent (the sub-agent's actions did not run in this execution).
    parent: tuple[str, str] | None = None


@dataclass(frozen=True)
class TracedAction:
    """One action of the run: which event it handled, its journal name, step and (sub-)agent path, how it went,
    and this execution's interval."""

    event_id: str
    action: str
    order: int
    agent_path: tuple[str, ...]
    how: ActionHow
    start_ns: int
    end_ns: int
    error: str | None = None


@dataclass
class RunTrace:
    """Every action and call of one execution of a run, in the order they ended. Appended to from a sub-agent's
    threads too (``list.append`` is atomic)."""

    content: bool = False  # keep the calls' arguments (prompts), for a trace that shows them
    traceparent: str | None = None  # the W3C traceparent the run's input came with (its upstream), if any
    start_ns: int = field(default_factory=time.time_ns)
    end_ns: int = 0
    actions: list[TracedAction] = field(default_factory=list)
    calls: list[TracedCall] = field(default_factory=list)

    def call(self, record: CallRecord, how: CallHow, call_id: str, agent_path: tuple[str, ...], start_ns: int,
             arguments: tuple[tuple, dict] | None = None, parent: tuple[str, str] | None = None) -> None:
        """Note a call that ended now."""
        kept = arguments if self.content else None
        self.calls.append(TracedCall(record, how, call_id, agent_path, start_ns, time.time_ns(), kept, parent))

    def action(self, event_id: str, action: str, order: int, agent_path: tuple[str, ...], how: ActionHow,
               start_ns: int, error: str | None = None) -> None:
        """Note an action that ended now."""
        self.actions.append(TracedAction(event_id, action, order, agent_path, how, start_ns, time.time_ns(), error))

    def ended(self) -> RunTrace:
        """This trace, its run ended now."""
        self.end_ns = time.time_ns()
        return self
