"""What the parts of one run share: its input, its counters, and where an action or a sub-agent sits in it.

A run is one input of one key (:class:`RunInput`). Every action of the run sees the same
:class:`RunContext` (the key's recovered history, the journal to write to, the call gate, the operator's
"closing" flag). An agent's part of the run is a :class:`Scope`: the top-level agent, or a sub-agent
called by one of its actions, whose records belong to that action's step. Each executed action gets an
:class:`ActionSite`: which handler, for which event, at which step, under which journal key.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from flink_agents_replay.api.agent import ActionSpec, Agent, Event
from flink_agents_replay.core.errors import SubAgentTimeoutError
from flink_agents_replay.engine.child_pool import ChildCallPool
from flink_agents_replay.engine.gate import CallGate
from flink_agents_replay.engine.trace import RunTrace
from flink_agents_replay.storage.journal.history import KeyHistory
from flink_agents_replay.storage.records.journal import CallRecord, CompletionRecord, RecordKind
from flink_agents_replay.storage.records.waits import Decision, WaitOpened


class RunJournal(Protocol):
    """Where a run writes its records: what the engine needs of the journal (the journal's
    ``journal.writer.RunJournal`` is one; tests use the in-memory store behind the same writer)."""

    def write(self, record_key: bytes, kind: RecordKind, payload: Any, *, fingerprint: str = "",
              what: str = "journal record", must_ack: bool = False, ack_before_next_call: bool = False) -> None:
        """Append one record; wait for its acknowledgement when ``must_ack`` (or the durability mode) asks, or
        at the next :meth:`before_call` with ``ack_before_next_call``."""

    def before_call(self) -> None:
        """Before the run makes a call: wait for the records ``ack_before_next_call`` asked for, if any."""

    def acknowledge(self) -> None:
        """Wait until every record written so far is acknowledged."""

__all__ = ["ActionSite", "FingerprintPolicy", "RunCancelled", "RunContext", "RunInput", "RunJournal", "RunStats",
           "Scope", "WaitPending"]


class RunCancelled(Exception):
    """The operator is closing, or its task is being cancelled or failed, or a newer attempt of it started: the run
    stops at the next action or call boundary (and is not applied)."""


class WaitPending(BaseException):
    """``ctx.wait_for`` found no decision for its wait: the run stops there and waits, holding no thread.

    A ``BaseException``, so an action's ``except Exception:`` does not take it for a failure of its own (and an
    action that catches it anyway still waits: :func:`~flink_agents_replay.engine.action.execute_action` raises
    it again). :func:`~flink_agents_replay.engine.run.execute_run` turns it into a waiting result.
    """

    def __init__(self, wait: WaitOpened, site: ActionSite, retried: dict[int, int]) -> None:
        super().__init__(f"action {site.action} waits for {wait.name!r} ({wait.wait_id})")
        self.wait = wait
        self.site = site
        self.retried = retried


class FingerprintPolicy(str, enum.Enum):
    """What to do with a journaled action written by other action code than the code running now."""

    REUSE = "reuse"  # reuse it, with a warning and a count (default: a redeploy must not re-run effects)
    RE_EXECUTE = "re-execute"
    FAIL = "fail"


@dataclass
class RunStats:
    """What one run (or many, summed) did."""

    actions_executed: int = 0
    actions_reused: int = 0
    calls_executed: int = 0
    calls_reused: int = 0
    calls_reused_out_of_order: int = 0  # reused calls the action made in another order than journaled
    calls_in_doubt: int = 0
    calls_reconciled: int = 0  # calls in doubt a reconciler found done or failed (its answer journaled)
    calls_reconciled_unknown: int = 0  # calls in doubt whose reconciler could not tell (left in doubt)
    divergences: int = 0
    fingerprint_mismatches: int = 0
    child_calls_executed: int = 0
    child_calls_reused: int = 0
    calls_retried_after_failure: int = 0  # calls that raised, failed their action, and were made again
    calls_recorded: int = 0  # served a recorded result by the call gate (a replay's policy 'recorded')
    calls_blocked: int = 0  # not made: the call gate blocked them (a replay's 'blocked', 'recorded' without a record)

    def add(self, other: RunStats) -> None:
        """Add ``other``'s counts to these."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, int]:
        """The counts by name."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class RunInput:
    """One accepted input: the key, its key group, its seq, the record itself, its event time (ms) and the
    epoch of its run (:attr:`flink_agents_replay.api.call_site.CallSite.epoch`)."""

    key: Any
    key_group: int
    seq: int
    input: Any
    event_time: int | None = None
    epoch: int = 0
    #: Decisions for this run's waits, by wait id (a resumed run's; a timeout is a decision that timed out).
    decisions: Mapping[str, Decision] = field(default_factory=dict)
    #: The run waited before and resumes now: its input was accepted then (no second accepted record).
    resuming: bool = False
    #: A resumed run whose key's later inputs ran while it waited: the seq of the key's last accepted input now
    #: (journaled in a resumed record, so a restore resumes it at the same place in the key's order).
    resumed_after: int | None = None
    resumed_wait: str | None = None  # the wait it resumes from (with ``resumed_after``)
    #: The W3C ``traceparent`` the input arrived with (a Kafka record header), if any: its run's trace links to it.
    traceparent: str | None = None


#: The event loop, as sub-agents need it: ``(context, scope, first event, memory, stats) -> outputs``.
RunEvents = Callable[["RunContext", "Scope", Event, Any, RunStats], list]


@dataclass(frozen=True, kw_only=True)
class RunContext:
    """What every action of one run shares."""

    run: RunInput
    history: KeyHistory | None
    journal: RunJournal | None
    fingerprint_policy: FingerprintPolicy
    cancelled: Callable[[], bool]
    digest_of_key: str
    input_digest: str
    child_pool: ChildCallPool | None
    gate: CallGate
    #: The event loop (:func:`flink_agents_replay.engine.run.run_events`), handed down rather than imported: a
    #: sub-agent runs the same loop as its caller, and the loop is what calls the action that calls it.
    run_events: RunEvents
    calls: list[CallRecord] = field(default_factory=list)  # appended from child threads: list.append is atomic
    completions: list[CompletionRecord] = field(default_factory=list)  # written or reused, top level and children
    blocked: list[object] = field(default_factory=list)  # the gate's reports of the calls it blocked
    trace: RunTrace | None = None  # what this execution did, when the run is traced


@dataclass(frozen=True)
class Scope:
    """One agent's part of a run: the top-level agent, or a sub-agent called by an action.

    A sub-agent's records carry the order of the parent action that called it (they belong to that
    action's step in the key's history) and its actions are journaled as ``<path>/<action>``.
    """

    agent: Agent
    path: tuple[str, ...]  # agent names from the top-level agent down to this one
    parent_order: int | None = None
    deadline: float | None = None
    timeout_s: float | None = None

    @property
    def is_child(self) -> bool:
        return self.parent_order is not None

    def action_name(self, spec: ActionSpec) -> str:
        return "/".join((*self.path[1:], spec.name)) if self.is_child else spec.name

    def check(self, context: RunContext, before: str) -> None:
        """Stop at this boundary if the run must stop (the operator closing, its task stopping, a newer attempt)
        or the sub-agent call ran out of time."""
        if context.cancelled():
            raise RunCancelled(f"run of key {context.run.key!r} seq {context.run.seq} stopped before {before}: "
                               "the operator is closing or its task is stopping")
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise SubAgentTimeoutError(f"sub-agent call {' -> '.join(self.path)} did not finish within "
                                       f"{self.timeout_s} s (stopped before {before})")


@dataclass(frozen=True, kw_only=True)
class ActionSite:
    """One execution of an action: its handler, the event it handles, its name in the journal, its step
    (``order``: the top-level action's place in the run, shared by a sub-agent's actions) and its record key."""

    spec: ActionSpec
    action: str
    event: Event
    order: int
    record_key: bytes
