"""What a wait for an outside decision leaves in the journal: the wait as opened, and the decision it got.

An action that calls ``ctx.wait_for(...)`` journals two records of its own, as call records of two reserved
resource names, so they are matched, reused, captured and pruned like any call:

- ``@wait``: the wait as it was first opened (:class:`WaitOpened`): its id, name, payload and deadline. Every
  later attempt of the action reuses it, so the id and the deadline never move.
- ``@decision``: the :class:`Decision` the wait got (or its timeout), once the run resumed with it. An attempt
  after a failure reuses it instead of asking again.

Both are kept as plain data (:func:`wait_to_plain`, :func:`decision_to_plain`), never as a class of this
package; the payload and a decision's value are JSON, as they travel through Kafka topics to people and back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["DECISION_RESOURCE", "RAISE", "WAIT_RESOURCE", "Decision", "WaitOpened", "decision_from_plain",
           "decision_to_plain", "wait_from_plain", "wait_to_plain"]

_SCHEMA = 1

#: The call records' resource names of a wait and its decision (an agent's resource may not start with '@').
WAIT_RESOURCE = "@wait"
DECISION_RESOURCE = "@decision"


class _RaiseOnTimeout:
    def __repr__(self) -> str:
        return "RAISE"

    def __reduce__(self) -> str:
        return "RAISE"  # the one instance, by its name here


#: ``on_timeout`` of a wait that raises :class:`~flink_agents_replay.core.errors.WaitTimedOutError` when its
#: deadline passes with no decision (the default).
RAISE = _RaiseOnTimeout()


@dataclass(frozen=True)
class Decision:
    """An outside decision for a wait: what ``ctx.wait_for`` returns.

    Attributes:
        approved: ``True`` or ``False`` for an approval; ``None`` for a decision that is only a ``value``.
        value: any JSON value the decider sent (a corrected amount, a chosen option).
        reason: why, in words (shown to a model when a tool call is denied).
        by: who decided (free text: a user name, a system, ``"timeout"``).
        decided_at_ms: when the decider sent it (epoch milliseconds), if known.
        timed_out: the wait's deadline passed before any decision came (``ctx.wait_for`` then returns its
            ``on_timeout`` or raises :class:`~flink_agents_replay.core.errors.WaitTimedOutError`).
    """

    approved: bool | None = None
    value: Any = None
    reason: str | None = None
    by: str | None = None
    decided_at_ms: int | None = None
    timed_out: bool = False

    @classmethod
    def approve(cls, reason: str | None = None, *, value: Any = None, by: str | None = None) -> Decision:
        """An approval."""
        return cls(approved=True, value=value, reason=reason, by=by)

    @classmethod
    def deny(cls, reason: str | None = None, *, value: Any = None, by: str | None = None) -> Decision:
        """A denial."""
        return cls(approved=False, value=value, reason=reason, by=by)


@dataclass(frozen=True)
class WaitOpened:
    """A wait as its action first opened it: its id (derived from the action's call ids: the same after a
    failover, in every process), its name and JSON payload, its deadline and when it opened (epoch ms)."""

    wait_id: str
    name: str
    payload: Any
    deadline_ms: int | None
    opened_at_ms: int


def wait_to_plain(wait: WaitOpened) -> dict[str, Any]:
    """The plain form of an opened wait (the payload as JSON text)."""
    return {"schema": _SCHEMA, "wait_id": wait.wait_id, "name": wait.name, "payload": json.dumps(wait.payload),
            "deadline_ms": wait.deadline_ms, "opened_at_ms": wait.opened_at_ms}


def wait_from_plain(plain: dict[str, Any]) -> WaitOpened:
    """The :class:`WaitOpened` :func:`wait_to_plain` wrote."""
    _check_schema(plain, "wait")
    return WaitOpened(plain["wait_id"], plain["name"], json.loads(plain["payload"]), plain["deadline_ms"],
                      plain["opened_at_ms"])


def decision_to_plain(decision: Decision) -> dict[str, Any]:
    """The plain form of a decision (its value as JSON text)."""
    return {"schema": _SCHEMA, "approved": decision.approved, "value": json.dumps(decision.value),
            "reason": decision.reason, "by": decision.by, "decided_at_ms": decision.decided_at_ms,
            "timed_out": decision.timed_out}


def decision_from_plain(plain: dict[str, Any]) -> Decision:
    """The :class:`Decision` :func:`decision_to_plain` wrote."""
    _check_schema(plain, "decision")
    return Decision(approved=plain["approved"], value=json.loads(plain["value"]), reason=plain["reason"],
                    by=plain["by"], decided_at_ms=plain["decided_at_ms"], timed_out=plain["timed_out"])


def _check_schema(plain: dict[str, Any], what: str) -> None:
    if plain.get("schema", 1) > _SCHEMA:
        raise ValueError(f"{what} record of schema {plain['schema']}; this version reads up to {_SCHEMA}: upgrade "
                         "flink-agents-replay")
