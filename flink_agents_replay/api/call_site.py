"""Where the ``ctx.call`` being made now sits: what a resource may know about the call it is serving.

The run engine sets a :class:`CallSite` around each call it makes for real (not around a reused one) and
resources read it with :func:`current_call_site`. Most need only the call id (:func:`current_call_id`, an
idempotency key). Resources that keep state outside the job, long-term memory, also need the call's place in
the job's history: the key, the input's seq and event time, and the *epoch* of the run, which checkpoint its
writes belong to (:mod:`flink_agents_replay.flink.epochs`). A replay's live calls carry a :class:`Fork`: read
that outside state as of the savepoint, write into the replay's own copy.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

__all__ = ["CallSite", "Fork", "current_call_id", "current_call_site", "journal_attempt", "report_call"]


@dataclass(frozen=True)
class Fork:
    """How a replay's live calls treat state kept outside the job (a store other jobs share).

    Attributes:
        as_of: the savepoint's epoch (its trigger time in epoch ms; its checkpoint id if taken before 0.5): read
            production's state as it was at that checkpoint.
        name: the replay's name: write into a copy of its own (an overlay), never into production's.
    """

    as_of: int
    name: str


@dataclass(frozen=True)
class CallSite:
    """The call being made now.

    Attributes:
        call_id: the call's id, an idempotency key (see :func:`current_call_id`).
        stable_id: the same for every attempt of this logical call: also a retry after the call failed its
            action (which gets a new ``call_id``) and the same call in a replay (whose ``call_id`` has the
            replay's prefix). Derive ids of things the call creates from it.
        agent: the top-level agent's name. resource: the resource's name in the agent.
        key_digest: the stable digest of the run's key. seq: the input's number within its key.
        event_time_ms: the input's event time (epoch milliseconds), ``None`` without one.
        epoch: which checkpoint the run's effects belong to: the trigger time (epoch ms) of the last checkpoint
            before the run started, + 1. Kept with the run in Flink state, so a run in flight at checkpoint ``C``
            has an epoch ``<= time(C)`` in every attempt.
        step: the call's place in its run: a later call of the run has a larger step.
        fork: in a replay, how to treat outside state (:class:`Fork`); ``None`` in production.
        in_doubt: for a call made again because it was in doubt, what its last *started* record noted
            (:func:`journal_attempt`; ``{}`` if nothing); ``None`` for a call made for the first time.
    """

    call_id: str
    stable_id: str
    agent: str
    resource: str
    key_digest: str
    seq: int
    event_time_ms: int | None
    epoch: int
    step: int = 0
    fork: Fork | None = None
    in_doubt: dict[str, Any] | None = None


log = logging.getLogger("flink_agents_replay.resources")

_CALL_SITE: ContextVar[CallSite | None] = ContextVar("flink_agents_replay_call_site", default=None)
#: What the resource reported about the call under way (:func:`report_call`); set by the engine around it.
_CALL_REPORT: ContextVar[dict[str, Any] | None] = ContextVar("flink_agents_replay_call_report", default=None)
#: Journals a started record for the call under way (:func:`journal_attempt`); set by the engine around it.
_CALL_ATTEMPT: ContextVar[Callable[[dict[str, Any]], None] | None] = ContextVar(
    "flink_agents_replay_call_attempt", default=None)


def report_call(**fields: str | int | float | None) -> None:
    """Record facts about the ``ctx.call`` being made now with the call (journal and capture), e.g. a model's
    ``model``, ``prompt_tokens`` and ``completion_tokens``: the replay report compares them. Plain strings and
    numbers only (anything else is left out, with a warning, and so is a whole number outside 64 bits: the journal
    keeps them as msgpack). Outside a call made for real (a reused call, a test calling ``invoke`` directly) it does
    nothing."""
    report = _CALL_REPORT.get()
    if report is None:
        return
    for name, value in fields.items():
        # Not raised: the call has taken effect by now, and a raise would have it made again.
        if value is not None and not isinstance(value, (str, int, float)):
            log.warning("report_call(%s=...) takes a string or a number, not %s: left out", name,
                        type(value).__name__)
            continue
        if isinstance(value, int) and not -(2**63) <= value < 2**63:
            log.warning("report_call(%s=%d) is outside 64 bits (a service's bad count?): left out", name, value)
            continue
        report[name] = value


def journal_attempt(**fields: str | int | float) -> None:
    """Journal, acknowledged, that the ``ctx.call`` under way now tries something that may take effect (which
    model of several it asks, say): a *started* record noting ``fields`` (plain strings and numbers). If the process
    dies before the call reports back, the call is in doubt: its resource's ``in_doubt`` policy decides, and a call
    made again is told what the last such record noted (``current_call_site().in_doubt``), so it can ask the same
    again. One broker round trip each. Outside a call made for real (a test calling ``invoke``) it does nothing."""
    for name, value in fields.items():
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise TypeError(f"journal_attempt({name}=...) takes a string or a number, not {type(value).__name__}")
    journal = _CALL_ATTEMPT.get()
    if journal is not None:
        journal(dict(fields))


def current_call_site() -> CallSite | None:
    """The call being made now (:class:`CallSite`), or ``None`` outside ``ctx.call``."""
    return _CALL_SITE.get()


def current_call_id() -> str | None:
    """The id of the ``ctx.call`` being made now, or ``None`` outside one.

    It names the *logical* call (agent, key, seq, event, action, position in the action), so it is the same
    when a call is made again after a failure — a call that was in doubt. Pass it to a service as an
    idempotency key (``ChatModel`` sends it as the ``Idempotency-Key`` header) and a service that honours
    such keys performs the effect once even then.
    """
    site = _CALL_SITE.get()
    return None if site is None else site.call_id
